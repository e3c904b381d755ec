// tests/test-kernels-moe-batch.cu - the routed GEMM of the batched decode step
// (cuda/moe_decode_batch.cu): gate_up + SwiGLU and down over router_route's tiles of 16 pairs for
// n = 1, 3, 17, 64 tokens (K = 4 of E = 8 experts, one expert in every token's top-4, so experts
// hold 0..64 pairs: several tiles each at n = 64) against (a) the CPU reference ops
// (cpu::matmul_mxfp4 + cpu::swiglu for gate_up; cpu::matmul_mxfp4 on the kernel's own bf16
// activations for down); (b) batch invariance: every pair's output rows at n tokens == the same
// pair's at n = 64, bit for bit, on grids of auto / 1 / 7 CTAs (a static schedule: one CTA runs
// every item) and at every ring depth; and gemm()'s own tile widths (8 and 16 pairs) against each
// other, bit for bit. H = 1600 (100 slabs of down, not a multiple of the 7-CTA grid). Bad arguments fail
// with messages naming them. Without a CUDA device the tests are skipped (exit 77).
#include "cuda/moe_decode_batch.h"
#include "tests/kernel-test-util.cuh"

namespace {

// H = 1600: gate_up's 25 chunks of 64 k put whole rounds of every ring depth (4, 6, 8, 12) in the
// chain's steady state (rounds whose successors all lie in the slab: no bound tests) and the rest in
// its tested drain; down (K = I = 320, 5 chunks) runs the drain alone.
constexpr uint32_t kE = 8, kK = 4, kH = 1600, kI = 320, kMaxN = 64;
constexpr float kLimit = 7.0f;

std::vector<uint8_t> scales(Rand& r, size_t n, int lo, int span) {
    std::vector<uint8_t> s(n);
    for (uint8_t& e : s) e = uint8_t(lo + int(r.below(uint32_t(span))));
    return s;
}

// router_route over the first n rows of `logits` [kMaxN, kE] with tiles of `tile` pairs.
struct Route {
    Dev<int32_t> experts, tiles, pairs;
    Dev<float> weights;
    cuda::GemmRoute r1, r2;
    Route(const Dev<float>& logits, uint32_t n, uint32_t tile)
        : experts(size_t(n) * kK), tiles(1 + 3 * size_t(cuda::route_max_tiles(n, kE, kK, tile))),
          pairs(size_t(n) * kK), weights(size_t(n) * kK) {
        OK(cuda::router_route(logits.p, n, kE, kK, experts.p, weights.p, tiles.p, pairs.p, tile, nullptr));
        sync_ok();
        r1.tiles = tiles.p; r1.pairs = pairs.p; r1.in_div = kK; r1.tile_tokens = tile;
        r1.max_tiles = cuda::route_max_tiles(n, kE, kK, tile);
        r2 = r1;
        r2.in_div = 1;
    }
};

struct Out {
    std::vector<uint16_t> act;
    std::vector<float> part;
};

// gate_up + SwiGLU then down for n tokens: moe_batch_gemm with `ctas` (wide), or gemm(nb).
Out run(const ExpertsW& gu, const ExpertsW& dn, const Dev<uint16_t>& x, const Route& rt, uint32_t n, bool wide,
        uint32_t ctas, int nb) {
    Dev<uint16_t> act(size_t(n) * kK * kI);
    Dev<float> part(size_t(n) * kK * kH);
    if (wide) {
        OK(cuda::moe_batch_gemm(gu.w, x.p, rt.r1, cuda::Epilogue::kSwiglu, nullptr, act.p, kI, kLimit, ctas, nullptr));
        OK(cuda::moe_batch_gemm(dn.w, act.p, rt.r2, cuda::Epilogue::kStore, part.p, nullptr, kH, 0, ctas, nullptr));
    } else {
        OK(cuda::gemm(gu.w, x.p, n, &rt.r1, cuda::Epilogue::kSwiglu, nullptr, act.p, kI, kLimit, nb, nullptr));
        OK(cuda::gemm(dn.w, act.p, n * kK, &rt.r2, cuda::Epilogue::kStore, part.p, nullptr, kH, 0, nb, nullptr));
    }
    sync_ok();
    return Out{act.get(), part.get()};
}

// The test's weights and tokens (host copies for the CPU reference).
struct TestWeights {
    Rand r{113};
    std::vector<uint8_t> gu_blocks = r.bytes(size_t(kE) * 2 * kI * kH / 2), dn_blocks = r.bytes(size_t(kE) * kH * kI / 2);
    std::vector<uint8_t> gu_scales = scales(r, size_t(kE) * 2 * kI * kH / 32, 118, 6);
    std::vector<uint8_t> dn_scales = scales(r, size_t(kE) * kH * kI / 32, 115, 14);
    std::vector<uint16_t> gu_bias = r.bf16s(size_t(kE) * 2 * kI, 0.5f), dn_bias = r.bf16s(size_t(kE) * kH, 0.1f);
};

// CPU reference: gate_up + SwiGLU from x; down from the GPU's own bf16 activations.
void cpu_check(const TestWeights& w, const std::vector<float>& xf, const std::vector<int32_t>& experts, const Out& got,
               uint32_t n, const std::string& what) {
    const size_t pairs = size_t(n) * kK;
    const auto got_act = unpermuted_rows(got.act, uint32_t(pairs), kI);
    std::vector<float> ref_act(pairs * kI), g(2 * kI), ref_part(pairs * kH);
    for (size_t p = 0; p < pairs; ++p) {
        const size_t e = size_t(experts[p]), t = p / kK;
        cpu::matmul_mxfp4(xf.data() + t * kH, w.gu_blocks.data() + e * 2 * kI * kH / 2,
                          w.gu_scales.data() + e * 2 * kI * kH / 32, w.gu_bias.data() + e * 2 * kI, 1, kH, 2 * kI,
                          g.data());
        cpu::swiglu(g.data(), 1, kI, kLimit, ref_act.data() + p * kI);
        cpu::matmul_mxfp4(got_act.data() + p * kI, w.dn_blocks.data() + e * kH * kI / 2,
                          w.dn_scales.data() + e * kH * kI / 32, w.dn_bias.data() + e * kH, 1, kI, kH,
                          ref_part.data() + p * kH);
    }
    expect_close(got_act, ref_act, 1e-3f, 8e-3f, what + " gate_up + SwiGLU vs CPU");
    expect_close(std::vector<float>(got.part.begin(), got.part.begin() + pairs * kH), ref_part, 1e-4f, 1e-4f,
                 what + " down vs CPU");
}

// Skewed router logits: expert 2 is in every token's top-4, so it holds n pairs (4 tiles at 64).
std::vector<float> skewed_logits(Rand& r) {
    auto logits = r.floats(size_t(kMaxN) * kE, 2.0f);
    for (uint32_t t = 0; t < kMaxN; ++t) logits[size_t(t) * kE + 2] = 5.0f;
    return logits;
}

}  // namespace

// moe_batch_gemm sums in its own order (one warp per slab, even and odd k16 steps in two chains), so
// it is checked against the CPU reference, and for batch invariance against itself: every pair's
// rows at n tokens == the same pair's at n = 64, on any grid, at every ring depth and CTA size.
TEST_CASE("moe_batch_gemm matches the CPU reference and is batch-invariant") {
    const TestWeights w{};
    Rand r(7);
    ExpertsW gu(w.gu_blocks, w.gu_scales, w.gu_bias, kE, 2 * kI, kH, true),
        dn(w.dn_blocks, w.dn_scales, w.dn_bias, kE, kH, kI, false);
    const auto xf = r.floats_bf16(size_t(kMaxN) * kH, 1.0f);
    const Dev<uint16_t> x(permuted_rows(xf, kMaxN, kH));
    const Dev<float> ld(skewed_logits(r));
    const Route full(ld, kMaxN, 16);
    const Out ref64 = run(gu, dn, x, full, kMaxN, true, 0, 0);
    const auto experts64 = full.experts.get();
    cpu_check(w, xf, experts64, ref64, kMaxN, "n 64");
    // The bits differ from gemm()'s somewhere (else this would not be a different order).
    const Out gemm64 = run(gu, dn, x, full, kMaxN, false, 0, 2);
    CHECK(!same_bits(gemm64.part, 0, ref64.part, 0, size_t(kMaxN) * kK * kH));
    for (uint32_t n : {1u, 3u, 17u, 64u}) {
        const Route rt(ld, n, 16), rt8(ld, n, 8);
        const size_t pairs = size_t(n) * kK;
        const int shapes[][2] = {{0, 0}, {4, 0}, {6, 0}, {8, 0}, {12, 0}, {12, 16}, {6, 20}, {8, 20}, {4, 24}, {6, 24}};
        for (const auto& shape : shapes) {
            const int depth = shape[0], warps = shape[1];  // ring depth, warps per CTA (0: automatic)
            cuda::set_moe_batch_shape(depth, warps);
            for (uint32_t ctas : {0u, 1u, 7u}) {
                INFO("n " << n << " depth " << depth << " warps " << warps << " ctas " << ctas);
                const Out got = run(gu, dn, x, rt, n, true, ctas, 0);
                CHECK(same_bits(got.act, 0, ref64.act, 0, pairs * kI));
                CHECK(same_bits(got.part, 0, ref64.part, 0, pairs * kH));
                if (ctas == 0 && depth == 0) cpu_check(w, xf, experts64, got, n, "n " + std::to_string(n));
            }
        }
        cuda::set_moe_batch_shape(0);
        // gemm() (GPTOSS_DECODE_BATCH_MOE_WIDE=0): tiles of 8 (nb 1) and 16 (nb 2) give the same bits.
        const Out want2 = run(gu, dn, x, rt, n, false, 0, 2), want1 = run(gu, dn, x, rt8, n, false, 0, 1);
        CHECK(want1.act == want2.act);
        CHECK(same_bits(want1.part, 0, want2.part, 0, pairs * kH));
        cpu_check(w, xf, experts64, want2, n, "gemm(), n " + std::to_string(n));
    }
    // Expert 2 really spans several tiles at n = 64 (the multi-tile path is exercised).
    const auto ti = full.tiles.get();
    uint32_t tiles_of_2 = 0;
    for (int32_t i = 0; i < ti[0]; ++i) tiles_of_2 += ti[1 + 3 * size_t(i)] == 2;
    CHECK(tiles_of_2 == 4);
}

TEST_CASE("moe_batch_gemm refuses what it does not run, naming it") {
    Dev<uint16_t> buf(64);
    Dev<float> out(64);
    Dev<int32_t> tiles(16);
    cuda::GemmRoute rt;
    rt.tiles = tiles.p; rt.pairs = tiles.p; rt.in_div = 1; rt.max_tiles = 2; rt.tile_tokens = 16;
    cuda::GemmWeights w;
    w.mxfp4 = true; w.N = 64; w.K = 96;
    CHECK(cuda::moe_batch_gemm(w, buf.p, rt, cuda::Epilogue::kStore, out.p, nullptr, 64, 0, 0, nullptr) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("64x96") != std::string::npos);
    w.K = 128;
    rt.tile_tokens = 64;
    CHECK(cuda::moe_batch_gemm(w, buf.p, rt, cuda::Epilogue::kStore, out.p, nullptr, 64, 0, 0, nullptr) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("tiles of 64 pairs") != std::string::npos);
    rt.tile_tokens = 16;
    CHECK(cuda::moe_batch_gemm(w, buf.p, rt, cuda::Epilogue::kAdd, out.p, nullptr, 64, 0, 0, nullptr) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("kAdd") != std::string::npos);
    CHECK(cuda::moe_batch_gemm(w, buf.p, rt, cuda::Epilogue::kSwiglu, nullptr, nullptr, 32, 7, 0, nullptr) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("bf16 output") != std::string::npos);
    w.mxfp4 = false;
    CHECK(cuda::moe_batch_gemm(w, buf.p, rt, cuda::Epilogue::kStore, out.p, nullptr, 64, 0, 0, nullptr) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("bf16 64x128") != std::string::npos);
}

int main(int argc, char** argv) {
    return run_kernel_tests(argc, argv, "the persistent batched MoE tests (test-kernels-moe-batch)");
}
