// tests/test-kernels-moe-stream.cu - the streaming routed MXFP4 decode GEMV (cuda/moe_stream.cu)
// against gemm_decode's 4-warp MXFP4 variant, which it must equal bit for bit, and against the CPU
// reference ops (cpu::matmul_mxfp4, cpu::swiglu): down (kStore, input row = pair) and gate_up
// (kSwiglu, every pair reads row 0) at 20b's shapes and at small ones (K of 3 chunks: warps with
// no chunk), fewer tiles in use than max_tiles, route_ready or not, every plan of 1-4 groups × 1-3
// stages (items per group from 0 to dozens, so stages are refilled and barrier phases flip), a
// second launch reproducing the first; and the argument errors. Without a CUDA device the tests
// are skipped (exit 77).
#include "tests/kernel-test-util.cuh"

#include "cuda/moe_stream.h"

namespace {

// A T = 1 route over `experts` (distinct): tile i = (experts[i], i, 1), pairs = 0..n-1, with
// max_tiles >= experts.size() (the rest unused).
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

struct Case {
    uint32_t E, N, K;
    bool gate_up;
    std::vector<int32_t> experts;
    uint32_t max_tiles;
};

// Random experts, the reference outputs (CPU), gemm_decode's outputs (4 warps), then the stream
// kernel under every plan: equal to gemm_decode bit for bit, close to the CPU.
void check_case(const Case& c, Rand& r) {
    const uint32_t n = uint32_t(c.experts.size());
    const uint32_t x_rows = c.gate_up ? 1 : n;
    const auto blocks = r.bytes(size_t(c.E) * c.N * c.K / 2);
    std::vector<uint8_t> scales(size_t(c.E) * c.N * c.K / 32);
    for (uint8_t& s : scales) s = uint8_t((c.gate_up ? 118 : 115) + r.below(c.gate_up ? 6 : 14));
    const auto bias = r.bf16s(size_t(c.E) * c.N, c.gate_up ? 0.5f : 0.1f);
    const auto x = r.floats_bf16(size_t(x_rows) * c.K, 1.0f);
    ExpertsW ew(blocks, scales, bias, c.E, c.N, c.K, c.gate_up);
    Dev<uint16_t> xd(permuted_rows(x, x_rows, c.K));
    const uint32_t out_n = c.gate_up ? c.N / 2 : c.N;  // per pair
    std::vector<float> ref(size_t(n) * out_n), g(c.N);
    for (uint32_t p = 0; p < n; ++p) {
        const size_t e = size_t(c.experts[p]);
        const float* xr = x.data() + size_t(c.gate_up ? 0 : p) * c.K;
        cpu::matmul_mxfp4(xr, blocks.data() + e * c.N * c.K / 2, scales.data() + e * c.N * c.K / 32,
                          bias.data() + e * c.N, 1, c.K, c.N, c.gate_up ? g.data() : ref.data() + size_t(p) * out_n);
        if (c.gate_up) cpu::swiglu(g.data(), 1, out_n, 7.0f, ref.data() + size_t(p) * out_n);
    }
    Route route(c.experts, c.gate_up ? 4 : 1, c.max_tiles);
    const cuda::Epilogue epi = c.gate_up ? cuda::Epilogue::kSwiglu : cuda::Epilogue::kStore;
    const cuda::DecodeGemv four{4, 8, true};
    const size_t words = size_t(n) * out_n;  // fp32 or bf16 elements
    // Returns the raw output bits (fp32 words, or bf16 widened) of one launch.
    auto run = [&](bool stream, bool ready) {
        std::vector<uint32_t> bits(words);
        if (c.gate_up) {
            Dev<uint16_t> act(words);
            OK(stream ? cuda::moe_stream_decode(ew.w, xd.p, x_rows, route.r, ready, epi, nullptr, act.p, out_n, 7.0f, nullptr)
                      : cuda::gemm_decode(ew.w, xd.p, &route.r, ready, epi, nullptr, act.p, out_n, 7.0f, four, nullptr));
            const auto got = act.get();
            for (size_t i = 0; i < words; ++i) bits[i] = got[i];
        } else {
            Dev<float> out(words);
            OK(stream ? cuda::moe_stream_decode(ew.w, xd.p, x_rows, route.r, ready, epi, out.p, nullptr, out_n, 0, nullptr)
                      : cuda::gemm_decode(ew.w, xd.p, &route.r, ready, epi, out.p, nullptr, out_n, 0, four, nullptr));
            const auto got = out.get();
            std::memcpy(bits.data(), got.data(), words * 4);
        }
        return bits;
    };
    auto as_floats = [&](const std::vector<uint32_t>& bits) {
        std::vector<float> v(words);
        for (uint32_t p = 0; p < n; ++p)
            for (uint32_t k = 0; k < out_n; ++k) {
                const size_t i = size_t(p) * out_n + k;
                if (c.gate_up) v[i] = bf16_to_f32(uint16_t(bits[size_t(p) * out_n + cuda::permuted_k(k)]));
                else std::memcpy(&v[i], &bits[i], 4);
            }
        return v;
    };
    const std::string shape = std::string(c.gate_up ? "gate_up" : "down") + " N=" + std::to_string(c.N) +
                              " K=" + std::to_string(c.K) + " tiles " + std::to_string(n) + "/" +
                              std::to_string(c.max_tiles);
    const auto base = run(false, false);
    expect_close(as_floats(base), ref, c.gate_up ? 1e-3f : 1e-4f, c.gate_up ? 8e-3f : 1e-4f, shape + " gemm_decode");
    for (uint32_t groups = 0; groups <= 4; ++groups)
        for (uint32_t stages = 1; stages <= (groups == 0 ? 1u : 3u); ++stages) {
            cuda::set_moe_stream_plan(groups, stages);
            for (bool ready : {false, true}) {
                const std::string what = shape + " plan " + (groups ? std::to_string(groups) + "x" +
                                                                          std::to_string(stages)
                                                                    : std::string("default")) +
                                         (ready ? " route_ready" : "");
                const auto got = run(true, ready), again = run(true, ready);
                size_t differ = 0;
                for (size_t i = 0; i < words; ++i) differ += got[i] != base[i];
                INFO(what << ": " << differ << " of " << words << " outputs differ from gemm_decode's");
                CHECK(differ == 0);
                CHECK(got == again);
            }
        }
    cuda::set_moe_stream_plan(0, 1);
}

}  // namespace

TEST_CASE("moe_stream_decode equals gemm_decode's 4-warp MXFP4 GEMV bit for bit and matches the CPU") {
    Rand r(731);
    // 20b's shapes: 360 / 180 slabs × 4 tiles, several items per group on every SM.
    check_case({8, 5760, 2880, true, {6, 1, 3, 0}, 4}, r);
    check_case({8, 2880, 2880, false, {2, 7, 5, 4}, 4}, r);
    // Small: 3 of 4 tiles, K of 3 chunks (warp 3 of each group has none), fewer items than SMs.
    check_case({6, 2880, 192, false, {4, 0, 5}, 4}, r);
    check_case({6, 384, 2880, true, {4, 0, 5}, 4}, r);
    // One tile of one slab: one item on one CTA.
    check_case({2, 16, 64, false, {1}, 1}, r);
}

TEST_CASE("moe_stream_decode rejects what it does not run, naming it") {
    Rand r(732);
    const uint32_t E = 2, N = 32, K = 128;
    std::vector<uint8_t> scales(size_t(E) * N * K / 32, 127);
    ExpertsW ew(r.bytes(size_t(E) * N * K / 2), scales, r.bf16s(size_t(E) * N, 0.1f), E, N, K, false);
    Route route({0, 1}, 1, 2);
    Dev<uint16_t> xd(size_t(2) * K);
    Dev<float> out(size_t(2) * N);
    auto expect_error = [&](gptoss_status s, const char* needle) {
        CHECK(s == GPTOSS_ERR_INTERNAL);
        const std::string msg = gptoss_last_error();
        INFO(msg);
        CHECK(msg.find(needle) != std::string::npos);
    };
    cuda::GemmWeights dense = ew.w;
    dense.mxfp4 = false;
    expect_error(cuda::moe_stream_decode(dense, xd.p, 2, route.r, false, cuda::Epilogue::kStore, out.p, nullptr, N, 0,
                                         nullptr),
                 "MXFP4");
    expect_error(cuda::moe_stream_decode(ew.w, xd.p, 2, route.r, false, cuda::Epilogue::kAdd, out.p, nullptr, N, 0,
                                         nullptr),
                 "epilogue");
    expect_error(cuda::moe_stream_decode(ew.w, xd.p, 2, route.r, false, cuda::Epilogue::kSwiglu, out.p, nullptr, N,
                                         7.0f, nullptr),
                 "bf16 output");
    cuda::GemmRoute many = route.r;
    many.max_tiles = 65;
    expect_error(cuda::moe_stream_decode(ew.w, xd.p, 2, many, false, cuda::Epilogue::kStore, out.p, nullptr, N, 0,
                                         nullptr),
                 "64 tiles");
    CHECK(!cuda::moe_stream_fits(ew.w, 2, many));
    CHECK(cuda::moe_stream_fits(ew.w, 2, route.r));
    // 4 096 rows of K = 128 (1 MB) do not fit any shared-memory plan.
    CHECK(!cuda::moe_stream_fits(ew.w, 4096, route.r));
}

int main(int argc, char** argv) { return run_kernel_tests(argc, argv, "test-kernels-moe-stream"); }
