// tests/test-kernels-fold.cu - the decode MoE down GEMV with the MoE combine + residual add +
// next RMSNorm folded into its last CTA (cuda/decode_fold.h): for every variant compiled with
// the fold, random shapes (H = 2880, 64, 4096, 1024; K = 4, 1, 2, 3 slots; expert width 192 or
// 64; one more route tile than in use), route_ready or not, the folded launch must equal the
// unfolded pair — gemm_decode (kStore into the partial rows) then residual_rmsnorm(kMoeAdd) —
// with either tail (shared-memory staging or none), bit for bit in the partial rows, the
// residual x and the normed row xn; x must also equal the combine computed on the CPU in the
// kernels' fma order exactly, and xn cpu::rmsnorm within bf16 rounding. Three folded launches back to back on one stream share one counter (the last
// CTA re-arms it; it reads 0 afterwards). Unsupported arguments are refused, naming them.
// Without a CUDA device the tests are skipped (exit 77).
#include "cuda/decode_fold.h"
#include "tests/kernel-test-util.cuh"

#include <cmath>
#include <memory>

namespace {

// A T = 1 route over `experts` (distinct): tile i = (experts[i], i, 1), pairs = 0..n-1, with
// max_tiles = n + 1 (the extra tile's CTAs exit early and must not be counted).
struct Route {
    Dev<int32_t> tiles, pairs;
    cuda::GemmRoute r;
    explicit Route(const std::vector<int32_t>& experts)
        : tiles(1 + 3 * (experts.size() + 1)), pairs(experts.size()) {
        std::vector<int32_t> t(1 + 3 * (experts.size() + 1), -1), p(experts.size());
        t[0] = int32_t(experts.size());
        for (size_t i = 0; i < experts.size(); ++i) {
            t[1 + 3 * i] = experts[i];
            t[2 + 3 * i] = int32_t(i);
            t[3 + 3 * i] = 1;
            p[i] = int32_t(i);
        }
        tiles.set(t);
        pairs.set(p);
        r.tiles = tiles.p; r.pairs = pairs.p; r.in_div = 1; r.max_tiles = uint32_t(experts.size() + 1);
    }
};

std::vector<cuda::DecodeGemv> fold_variants(uint32_t H, uint32_t K) {
    std::vector<cuda::DecodeGemv> out;
    for (const auto& [fp4, v] : cuda::decode_gemv_variants())
        if (fp4 && cuda::decode_fold_supported(H, K, v)) out.push_back(v);
    return out;
}

}  // namespace

TEST_CASE("gemm_decode_folded == gemm_decode + residual_rmsnorm(kMoeAdd) bit for bit; x exact vs the CPU") {
    Rand r(91);
    const uint32_t E = 6;
    struct Shape { uint32_t H, K, I; };
    for (const Shape& sh : {Shape{2880, 4, 192}, Shape{64, 1, 64}, Shape{4096, 2, 192}, Shape{1024, 3, 64}}) {
        const uint32_t H = sh.H, K = sh.K, I = sh.I;  // down: N = H, K_in = I
        const auto blocks = r.bytes(size_t(E) * H * I / 2);
        std::vector<uint8_t> scales(size_t(E) * H * I / 32);
        for (uint8_t& s : scales) s = uint8_t(115 + r.below(14));
        const auto bias = r.bf16s(size_t(E) * H, 0.1f);
        const auto act = r.floats_bf16(size_t(K) * I, 1.0f);
        Dev<uint8_t> rb(blocks), rs(scales), frag(E * cuda::mxfp4_fragment_bytes(H, I)),
            sc(E * cuda::mxfp4_scale_bytes(H, I));
        Dev<uint16_t> rbias(bias), actd(permuted_rows(act, K, I));
        Dev<float> fbias(size_t(E) * H);
        Dev<int> bad(1);
        REQUIRE(cudaMemset(bad.p, 0, sizeof(int)) == cudaSuccess);
        for (uint32_t e = 0; e < E; ++e) {
            OK(cuda::repack_mxfp4(rb.p + size_t(e) * H * I / 2, rs.p + size_t(e) * H * I / 32, H, I, false,
                                  frag.p + e * cuda::mxfp4_fragment_bytes(H, I),
                                  sc.p + e * cuda::mxfp4_scale_bytes(H, I), bad.p, nullptr));
            OK(cuda::bf16_to_f32(rbias.p + size_t(e) * H, H, false, fbias.p + size_t(e) * H, nullptr));
        }
        cuda::GemmWeights w;
        w.w = frag.p; w.scales = reinterpret_cast<uint16_t*>(sc.p); w.bias = fbias.p; w.mxfp4 = true;
        w.N = H; w.K = I; w.w_expert_stride = cuda::mxfp4_fragment_bytes(H, I);
        w.s_expert_stride = cuda::mxfp4_scale_bytes(H, I) / 2; w.bias_expert_stride = H;
        std::vector<int32_t> experts;
        for (uint32_t k = 0; k < K; ++k) experts.push_back(int32_t((5 * k + 2) % E));
        Route route(experts);

        const auto x0 = r.floats_bf16(H, 3.0f);
        std::vector<float> wts(K);
        for (float& e : wts) e = 0.1f + std::fabs(r.uniform(0.4f));
        std::vector<float> nw(H);
        for (float& e : nw) e = bf16_to_f32(f32_to_bf16(1.0f + r.uniform(0.1f)));
        const float eps = 1e-5f;
        Dev<float> wd(wts), nwd(nw);
        Dev<int> counter(1);
        REQUIRE(cudaMemset(counter.p, 0, sizeof(int)) == cudaSuccess);

        const auto vars = fold_variants(H, K);
        REQUIRE(!vars.empty());
        for (const cuda::DecodeGemv& var : vars) {
            for (const auto& [tail, ready] : {std::pair<int, bool>{1, false}, {1, true}, {2, false}, {2, true}}) {
                const std::string what = "tail " + std::to_string(tail) + " warps " + std::to_string(var.warps) +
                                         " depth " + std::to_string(var.depth) + (var.shfl_x ? " shfl" : " frag") +
                                         (ready ? " route_ready" : "") +
                                         " H=" + std::to_string(H) + " K=" + std::to_string(K);
                INFO(what);
                // The unfolded pair (the oracle on the GPU).
                Dev<float> part_ref(size_t(K) * H), x_ref(x0);
                Dev<uint16_t> xn_ref(H);
                OK(cuda::gemm_decode(w, actd.p, &route.r, ready, cuda::Epilogue::kStore, part_ref.p, nullptr, H, 0, var,
                                     nullptr));
                cuda::ResidualArgs ra;
                ra.mode = cuda::ResidualMode::kMoeAdd; ra.part = part_ref.p; ra.weights = wd.p; ra.K = K;
                OK(cuda::residual_rmsnorm(ra, x_ref.p, nwd.p, eps, xn_ref.p, 1, H, nullptr));
                // Three folded launches back to back sharing the counter.
                std::vector<std::unique_ptr<Dev<float>>> parts, xs;
                std::vector<std::unique_ptr<Dev<uint16_t>>> xns;
                for (int rep = 0; rep < 3; ++rep) {
                    parts.push_back(std::make_unique<Dev<float>>(size_t(K) * H));
                    xs.push_back(std::make_unique<Dev<float>>(x0));
                    xns.push_back(std::make_unique<Dev<uint16_t>>(H));
                    const cuda::DecodeFold f{xs.back()->p, wd.p, K, nwd.p, eps, xns.back()->p, counter.p, tail};
                    OK(cuda::gemm_decode_folded(w, actd.p, route.r, ready, parts.back()->p, f, var, nullptr));
                }
                const auto pr = part_ref.get(), xr = x_ref.get();
                const auto nr = xn_ref.get();
                for (int rep = 0; rep < 3; ++rep) {
                    const auto pg = parts[size_t(rep)]->get(), xg = xs[size_t(rep)]->get();
                    const auto ng = xns[size_t(rep)]->get();
                    CHECK(std::memcmp(pg.data(), pr.data(), pr.size() * sizeof(float)) == 0);
                    CHECK(std::memcmp(xg.data(), xr.data(), xr.size() * sizeof(float)) == 0);
                    CHECK(ng == nr);
                }
                std::vector<int> c(1, -1);
                REQUIRE(cudaMemcpy(c.data(), counter.p, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
                CHECK(c[0] == 0);

                // Independent oracle: the combine on the CPU in the kernels' order (exact), the
                // RMSNorm by cpu::rmsnorm (bf16 rounding apart).
                std::vector<float> v(H), xn(H);
                for (uint32_t i = 0; i < H; ++i) {
                    float sum = 0.0f;
                    for (uint32_t s = 0; s < K; ++s) sum = std::fma(wts[s], pr[size_t(s) * H + i], sum);
                    v[i] = x0[i] + sum;
                }
                expect_close(xr, v, 0.0f, 0.0f, what + " residual");
                std::vector<uint16_t> nw16(H);
                for (uint32_t i = 0; i < H; ++i) nw16[i] = f32_to_bf16(nw[i]);
                cpu::rmsnorm(v.data(), nw16.data(), 1, H, eps, xn.data());
                std::vector<float> got(H);
                for (uint32_t i = 0; i < H; ++i) got[i] = bf16_to_f32(nr[cuda::permuted_k(i)]);
                expect_close(got, xn, 1e-3f, 8e-3f, what + " xn");
            }
        }
    }
}

TEST_CASE("gemm_decode_folded refuses what it does not support, naming it") {
    cuda::GemmWeights w;
    w.mxfp4 = true; w.N = 2880; w.K = 192;
    Dev<float> buf(2880 * 8);
    Dev<uint16_t> xn(2880);
    Dev<int> counter(1);
    Dev<int32_t> tiles(4);
    cuda::GemmRoute route;
    route.tiles = tiles.p; route.pairs = tiles.p; route.max_tiles = 1;
    cuda::DecodeFold f{buf.p, buf.p, 5, buf.p, 1e-5f, xn.p, counter.p};
    CHECK(cuda::gemm_decode_folded(w, xn.p, route, true, buf.p, f, cuda::DecodeGemv{4, 4, false}, nullptr) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("(5)") != std::string::npos);
    f.K = 4;
    CHECK(cuda::gemm_decode_folded(w, xn.p, route, true, buf.p, f, cuda::DecodeGemv{8, 4, true}, nullptr) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("8 warps") != std::string::npos);
    f.tail = 3;
    CHECK(cuda::gemm_decode_folded(w, xn.p, route, true, buf.p, f, cuda::DecodeGemv{4, 4, false}, nullptr) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("(3)") != std::string::npos);
    CHECK(!cuda::decode_fold_supported(8192, 4, cuda::DecodeGemv{4, 4, false}));
    CHECK(cuda::decode_fold_supported(2880, 4, cuda::DecodeGemv{4, 4, false}));
}

int main(int argc, char** argv) { return run_kernel_tests(argc, argv, "the folded MoE down tests (test-kernels-fold)"); }
