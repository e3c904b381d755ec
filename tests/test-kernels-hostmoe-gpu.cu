// tests/test-kernels-hostmoe-gpu.cu - the GPU's share of a host layer's decode experts
// (cuda/host_moe_gpu.h, issue 16) against the CPU reference ops: the weights in the checkpoint
// layout in pinned, mapped host memory (as the engine's host store), read by the kernels over the
// mapping. Stage 1 (gate_up + swiglu, rounded to bf16) against cpu::matmul_mxfp4 + cpu::swiglu
// within a bf16 step; stage 2 (down + bias) against cpu::matmul_mxfp4 on the kernel's own stage-1
// values, within fp32 summation-order error (4e-5 of Σ|w·h|); the other slots' rows of `part` stay untouched.
// Shapes: tiny, an odd block count (5 blocks a down row), the real 2880 × 2880, and a row pair longer
// than one round of a lane's loads (H = 8192); scale bytes 0 (2^-127) and up to 128. Needs the GPU.
#include "tests/kernel-test-util.cuh"

#include "cuda/host_moe_gpu.h"

namespace {

struct Pinned {
    uint8_t* host = nullptr;
    uint8_t* dev = nullptr;
    explicit Pinned(size_t bytes) {
        REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&host), std::max<size_t>(bytes, 1),
                              cudaHostAllocPortable | cudaHostAllocMapped) == cudaSuccess);
        REQUIRE(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), host, 0) == cudaSuccess);
    }
    ~Pinned() { cudaFreeHost(host); }
    Pinned(const Pinned&) = delete;
    Pinned& operator=(const Pinned&) = delete;
};

struct Case {
    uint32_t H, I, E, K, slot0, slots;
    std::vector<int32_t> experts;  // [K]
};

// Random MXFP4 bytes: nibbles uniform, scales in [lo, 128], every 7th row's first scale 0.
void fill_mxfp4(Rand& r, uint8_t* blocks, uint8_t* scales, size_t rows, uint32_t nb, uint32_t lo) {
    for (size_t i = 0; i < rows * nb * 16; ++i) blocks[i] = uint8_t(r.below(256));
    for (size_t row = 0; row < rows; ++row)
        for (uint32_t b = 0; b < nb; ++b) scales[row * nb + b] = (row % 7 == 3 && b == 0) ? 0 : uint8_t(lo + r.below(129 - lo));
}

void run_case(const Case& c, uint64_t seed) {
    INFO("H " << c.H << " I " << c.I << " E " << c.E << " K " << c.K << " slots " << c.slot0 << "+" << c.slots);
    const uint32_t H = c.H, I = c.I, E = c.E, K = c.K;
    const size_t gu_rows = size_t(E) * 2 * I, dn_rows = size_t(E) * H;
    const size_t gu_b = gu_rows * (H / 32) * 16, gu_s = gu_rows * (H / 32), dn_b = dn_rows * (I / 32) * 16,
                 dn_s = dn_rows * (I / 32);
    Pinned store(gu_b + gu_s + dn_b + dn_s + 2 * gu_rows + 2 * dn_rows);
    uint8_t* p = store.host;
    const size_t o_gus = gu_b, o_dnb = o_gus + gu_s, o_dns = o_dnb + dn_b, o_gub = o_dns + dn_s, o_dnbias = o_gub + 2 * gu_rows;
    Rand r(seed);
    fill_mxfp4(r, p, p + o_gus, gu_rows, H / 32, 118);
    fill_mxfp4(r, p + o_dnb, p + o_dns, dn_rows, I / 32, 118);
    auto* gu_bias = reinterpret_cast<uint16_t*>(p + o_gub);
    auto* dn_bias = reinterpret_cast<uint16_t*>(p + o_dnbias);
    for (size_t i = 0; i < gu_rows; ++i) gu_bias[i] = f32_to_bf16(r.uniform(2.0f));
    for (size_t i = 0; i < dn_rows; ++i) dn_bias[i] = f32_to_bf16(r.uniform(0.5f));
    const std::vector<float> x = r.floats_bf16(H, 3.0f);
    const float limit = 7.0f;

    cuda::HostExpertsView view{store.dev, store.dev + o_gus, reinterpret_cast<const uint16_t*>(store.dev + o_gub),
                               store.dev + o_dnb, store.dev + o_dns, reinterpret_cast<const uint16_t*>(store.dev + o_dnbias)};
    Dev<uint16_t> xn(permuted_rows(x, 1, H));
    Dev<int32_t> experts(c.experts);
    Dev<float> h(size_t(c.slots) * I), part(size_t(K) * H);
    REQUIRE(cuda::launch_host_gpu_experts(view, xn.p, experts.p, c.slot0, c.slots, H, I, limit, h.p, part.p, nullptr) ==
            cudaSuccess);
    sync_ok();
    const std::vector<float> got_h = h.get(), got = part.get();

    for (uint32_t s = 0; s < c.slots; ++s) {
        const uint32_t e = uint32_t(c.experts[c.slot0 + s]);
        // Stage 1: the reference's h, and the tolerance of one bf16 step plus fp32 order error.
        std::vector<float> g(2 * size_t(I)), ref_h(I);
        cpu::matmul_mxfp4(x.data(), p + size_t(e) * 2 * I * (H / 32) * 16, p + o_gus + size_t(e) * 2 * I * (H / 32),
                          gu_bias + size_t(e) * 2 * I, 1, H, 2 * I, g.data());
        cpu::swiglu(g.data(), 1, I, limit, ref_h.data());
        std::vector<float> hs(got_h.begin() + size_t(s) * I, got_h.begin() + size_t(s + 1) * I);
        // Σ|w·x| + |b| of each gate/up row: the scale of its fp32 summation-order error.
        const uint8_t* gb = p + size_t(e) * 2 * I * (H / 32) * 16;
        const uint8_t* gs = p + o_gus + size_t(e) * 2 * I * (H / 32);
        std::vector<float> row_g(H);
        size_t bad = 0;
        for (uint32_t i = 0; i < I; ++i) {
            double m = 0;
            for (uint32_t q = 0; q < 2; ++q) {
                cpu::mxfp4_dequant_row(gb, gs, H, 2 * i + q, row_g.data());
                m += std::fabs(bf16_to_f32(gu_bias[size_t(e) * 2 * I + 2 * i + q]));
                for (uint32_t k = 0; k < H; ++k) m += std::fabs(double(row_g[k]) * x[k]);
            }
            // One bf16 step of h, plus the order error through swiglu (slope ≤ ~1.1 · (limit + 1)).
            const float want = round_bf16(ref_h[i]);
            const float tol = std::fabs(want) / 64 + 2e-5f * 9.0f * float(m);
            if (!(std::fabs(hs[i] - want) <= tol)) {
                if (bad < 3) MESSAGE("h[" << i << "]: got " << hs[i] << " ref " << want << " tol " << tol);
                bad++;
            }
            CHECK(hs[i] == round_bf16(hs[i]));  // stored as bf16 values
        }
        INFO("slot " << c.slot0 + s << " expert " << e);
        CHECK(bad == 0);
        // Stage 2 on the kernel's own h: down + bias, within 4e-5 of Σ|w·h| per row.
        std::vector<float> ref(H), mag(H);
        const uint8_t* db = p + o_dnb + size_t(e) * H * (I / 32) * 16;
        const uint8_t* ds = p + o_dns + size_t(e) * H * (I / 32);
        cpu::matmul_mxfp4(hs.data(), db, ds, dn_bias + size_t(e) * H, 1, I, H, ref.data());
        std::vector<float> row(I);
        for (uint32_t n = 0; n < H; ++n) {
            cpu::mxfp4_dequant_row(db, ds, I, n, row.data());
            double m = std::fabs(bf16_to_f32(dn_bias[size_t(e) * H + n]));
            for (uint32_t i = 0; i < I; ++i) m += std::fabs(double(row[i]) * hs[i]);
            mag[n] = float(m);
        }
        size_t bad2 = 0;
        for (uint32_t n = 0; n < H; ++n) {
            const float v = got[size_t(c.slot0 + s) * H + n];
            if (!(std::fabs(v - ref[n]) <= 4e-5f * mag[n] + 1e-30f)) {
                if (bad2 < 3) MESSAGE("row " << n << ": got " << v << " ref " << ref[n] << " Σ|w·h| " << mag[n]);
                bad2++;
            }
        }
        CHECK(bad2 == 0);
    }
    // The CPU's rows (the other slots) are not the kernels' to write: still the 0xff poison.
    std::vector<uint32_t> bits(got.size());
    std::memcpy(bits.data(), got.data(), got.size() * 4);
    for (uint32_t k = 0; k < K; ++k) {
        if (k >= c.slot0 && k < c.slot0 + c.slots) continue;
        size_t touched = 0;
        for (uint32_t n = 0; n < H; ++n) touched += bits[size_t(k) * H + n] != 0xffffffffu;
        INFO("slot " << k << " (the CPU's)");
        CHECK(touched == 0);
    }
}

}  // namespace

TEST_CASE("host experts, the GPU's share: gate_up + swiglu + down from mapped host memory == the CPU reference") {
    run_case({64, 64, 3, 4, 1, 3, {2, 0, 2, 1}}, 1);          // a repeated expert
    run_case({192, 160, 2, 4, 3, 1, {0, 1, 1, 0}}, 2);         // 6 and 5 blocks a row
    run_case({2880, 2880, 2, 4, 3, 1, {1, 0, 1, 1}}, 3);       // the real expert shape, the engine's slot
    run_case({8192, 64, 2, 4, 0, 4, {1, 0, 0, 1}}, 4);         // 512 blocks a row pair: two load rounds
}

TEST_CASE("host experts, the GPU's share: shapes outside its limits are refused") {
    cuda::HostExpertsView view{};
    CHECK(cuda::launch_host_gpu_experts(view, nullptr, nullptr, 0, 0, 64, 64, 7.0f, nullptr, nullptr, nullptr) ==
          cudaErrorInvalidValue);  // no slots
    CHECK(cuda::launch_host_gpu_experts(view, nullptr, nullptr, 0, 1, 48, 64, 7.0f, nullptr, nullptr, nullptr) ==
          cudaErrorInvalidValue);  // H not a multiple of 32
    CHECK(cuda::launch_host_gpu_experts(view, nullptr, nullptr, 0, 1, 96, 64, 7.0f, nullptr, nullptr, nullptr) ==
          cudaErrorInvalidValue);  // H not a multiple of 64 (the permuted activation layout)
    CHECK(cuda::launch_host_gpu_experts(view, nullptr, nullptr, 0, 1, 64, 8224, 7.0f, nullptr, nullptr, nullptr) ==
          cudaErrorInvalidValue);  // I past kHostGpuMaxH
}

TEST_CASE("host experts, the GPU's share: the default follows the PCIe link (K / 2 on 5.0 x16, else K / 4, at least 1)") {
    char link[48] = {0};
    const uint32_t slots = cuda::host_gpu_slots_default(0, 4, link, sizeof link);
    MESSAGE("device 0: " << link << " -> " << slots << " of 4 experts on the GPU");
    unsigned gen = 0, width = 0;
    if (std::sscanf(link, "PCIe %u x%u", &gen, &width) == 2) CHECK(slots == ((gen >= 5 && width >= 16) ? 2u : 1u));
    else CHECK(slots == 1u);
    CHECK(cuda::host_gpu_slots_default(0, 1, nullptr, 0) == 1u);  // at least one
    CHECK(cuda::host_gpu_slots_default(0, 32, nullptr, 0) >= 8u);
}

int main(int argc, char** argv) {
    return run_kernel_tests(argc, argv, "the host experts' GPU share test (test-kernels-hostmoe-gpu)");
}
