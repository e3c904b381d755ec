// tests/test-kernels-moe-decode.cu - the persistent MoE decode kernel (cuda/moe_decode.cu):
// gate_up + SwiGLU + down of a T = 1 route in one launch against (a) the two gemm_decode
// launches it replaces, bit for bit (act and part), for every compiled variant, with the grid
// sized by the device and forced to 1, 7 and 333 CTAs (1 CTA runs every item itself: the down
// items then wait on counters that the same CTA filled); (b) the CPU reference ops
// (cpu::matmul_mxfp4 + cpu::swiglu for gate_up, cpu::matmul_mxfp4 on the kernel's own bf16
// activations for down); (c) itself, bit for bit, over repeated launches that share one counter
// block (the kernel re-arms it: the counters read zero after every launch). Shapes: 20b's H with a
// narrow I, 3 of max_tiles = 4 tiles in use, and a small H not a multiple of 16 rows per slab
// is refused. Without a CUDA device the tests are skipped (exit 77).
#include "cuda/moe_decode.h"
#include "tests/kernel-test-util.cuh"

namespace {

// A T = 1 route over `experts` (distinct): tile i = (experts[i], i, 1), pairs = 0..n-1.
struct Route {
    Dev<int32_t> tiles, pairs;
    cuda::GemmRoute r;
    Route(const std::vector<int32_t>& experts, uint32_t in_div, uint32_t max_tiles)
        : tiles(1 + 3 * size_t(max_tiles)), pairs(experts.size()) {
        std::vector<int32_t> t(1 + 3 * size_t(max_tiles), -1), p(experts.size());
        t[0] = int32_t(experts.size());
        for (size_t i = 0; i < experts.size(); ++i) {
            t[1 + 3 * i] = experts[i];
            t[2 + 3 * i] = int32_t(i);
            t[3 + 3 * i] = 1;
            p[i] = int32_t(i);
        }
        tiles.set(t);
        pairs.set(p);
        r.tiles = tiles.p; r.pairs = pairs.p; r.in_div = in_div; r.max_tiles = max_tiles;
    }
};

std::vector<uint8_t> scales(Rand& r, size_t n, int lo, int span) {
    std::vector<uint8_t> s(n);
    for (uint8_t& e : s) e = uint8_t(lo + int(r.below(uint32_t(span))));
    return s;
}

}  // namespace

TEST_CASE("moe_decode == gemm_decode gate_up + down bit for bit, matches the CPU reference, reproducible") {
    Rand r(91);
    const uint32_t E = 6, H = 2880, I = 256, slots = 3;  // gate_up [2I, H], down [H, I]
    const std::vector<int32_t> experts{4, 0, 5};
    const auto gu_blocks = r.bytes(size_t(E) * 2 * I * H / 2), dn_blocks = r.bytes(size_t(E) * H * I / 2);
    const auto gu_scales = scales(r, size_t(E) * 2 * I * H / 32, 118, 6), dn_scales = scales(r, size_t(E) * H * I / 32, 115, 14);
    const auto gu_bias = r.bf16s(size_t(E) * 2 * I, 0.5f), dn_bias = r.bf16s(size_t(E) * H, 0.1f);
    ExpertsW gu(gu_blocks, gu_scales, gu_bias, E, 2 * I, H, true), dn(dn_blocks, dn_scales, dn_bias, E, H, I, false);
    const auto x = r.floats_bf16(H, 1.0f);
    Dev<uint16_t> xd(permuted_rows(x, 1, H));
    Route r1(experts, slots, 4), r2(experts, 1, 4);
    const float limit = 7.0f;

    // GPU oracle: the two launches of the unfused decode path.
    cuda::MoeDecodeArgs ma;
    ma.gate_up = gu.w; ma.down = dn.w; ma.x = xd.p; ma.route = r1.r; ma.swiglu_limit = limit;
    Dev<int> counters(cuda::kMoeDecodeCounters);
    REQUIRE(cudaMemset(counters.p, 0, cuda::kMoeDecodeCounters * sizeof(int)) == cudaSuccess);
    ma.counters = counters.p;

    for (const auto& [fp4, v] : cuda::decode_gemv_variants()) {
        if (!fp4 || !(v.warps == 4 && v.depth == 4)) continue;  // the variants moe_decode compiles
        const std::string what = std::string("warps 4 depth 4 ") + (v.shfl_x ? "shfl" : "frag");
        Dev<uint16_t> act_ref(slots * I);
        Dev<float> part_ref(size_t(slots) * H);
        OK(cuda::gemm_decode(gu.w, xd.p, &r1.r, false, cuda::Epilogue::kSwiglu, nullptr, act_ref.p, I, limit, v,
                             nullptr));
        OK(cuda::gemm_decode(dn.w, act_ref.p, &r2.r, true, cuda::Epilogue::kStore, part_ref.p, nullptr, H, 0, v,
                             nullptr));
        const auto want_act = act_ref.get();
        const auto want_part = part_ref.get();

        // CPU reference: gate_up + SwiGLU from x; down from the GPU's bf16 activations.
        std::vector<float> ref_act(slots * I), g(2 * I), ref_part(size_t(slots) * H);
        const auto got_act_f = unpermuted_rows(want_act, slots, I);
        for (uint32_t p = 0; p < slots; ++p) {
            const size_t e = size_t(experts[p]);
            cpu::matmul_mxfp4(x.data(), gu_blocks.data() + e * 2 * I * H / 2, gu_scales.data() + e * 2 * I * H / 32,
                              gu_bias.data() + e * 2 * I, 1, H, 2 * I, g.data());
            cpu::swiglu(g.data(), 1, I, limit, ref_act.data() + size_t(p) * I);
            cpu::matmul_mxfp4(got_act_f.data() + size_t(p) * I, dn_blocks.data() + e * H * I / 2,
                              dn_scales.data() + e * H * I / 32, dn_bias.data() + e * H, 1, I, H,
                              ref_part.data() + size_t(p) * H);
        }
        expect_close(got_act_f, ref_act, 1e-3f, 8e-3f, what + " gate_up (gemm_decode oracle vs CPU)");

        for (uint32_t ctas : {0u, 1u, 7u, 333u}) {
            for (int rep = 0; rep < 2; ++rep) {
                const std::string w2 = what + " ctas " + std::to_string(ctas) + " rep " + std::to_string(rep);
                Dev<uint16_t> act(slots * I);
                Dev<float> part(size_t(slots) * H);
                ma.act = act.p; ma.part = part.p; ma.ctas = ctas;
                OK(cuda::moe_decode(ma, v, nullptr));
                sync_ok();
                const auto got_act = act.get();
                const auto got_part = part.get();
                INFO(w2);
                CHECK(got_act == want_act);
                CHECK(std::memcmp(got_part.data(), want_part.data(), got_part.size() * sizeof(float)) == 0);
                expect_close(got_part, ref_part, 1e-4f, 1e-4f, w2 + " down vs CPU");
                CHECK(counters.get() == std::vector<int>(cuda::kMoeDecodeCounters, 0));
            }
        }
    }
}

TEST_CASE("moe_decode refuses shapes and variants it does not run, naming them") {
    cuda::MoeDecodeArgs ma;
    Dev<int> counters(cuda::kMoeDecodeCounters);
    Dev<uint16_t> buf(64);
    Dev<float> part(64);
    Dev<int32_t> tiles(16);
    ma.x = buf.p; ma.act = buf.p; ma.part = part.p; ma.counters = counters.p;
    ma.route.tiles = tiles.p; ma.route.pairs = tiles.p; ma.route.max_tiles = 4;
    ma.gate_up.mxfp4 = ma.down.mxfp4 = true;
    ma.gate_up.N = 24; ma.gate_up.K = 128; ma.down.N = 128; ma.down.K = 12;  // 2I = 24 is not a multiple of 16
    CHECK(cuda::moe_decode(ma, cuda::DecodeGemv{4, 4, false}, nullptr) == GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("gate_up 24x128") != std::string::npos);
    ma.gate_up.N = 128; ma.down.K = 64;
    CHECK(cuda::moe_decode(ma, cuda::DecodeGemv{3, 5, false}, nullptr) == GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("3 warps") != std::string::npos);
    ma.route.max_tiles = 99;
    CHECK(cuda::moe_decode(ma, cuda::DecodeGemv{4, 4, false}, nullptr) == GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("99 route tiles") != std::string::npos);
    CHECK_FALSE(cuda::moe_decode_enabled(ma, cuda::DecodeGemv{4, 4, false}));
}

int main(int argc, char** argv) { return run_kernel_tests(argc, argv, "the persistent MoE decode tests (test-kernels-moe-decode)"); }
