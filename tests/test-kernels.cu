// tests/test-kernels.cu - every CUDA launcher (cuda/kernels.h) against the CPU reference op
// (cpu/reference.h) on fresh seeded random inputs, the shape edges (1 token, 127/128/129
// positions, many tokens on one expert, all tokens on the same four experts), the fused decode
// kernels against the launches they replace (bit for bit), the bit-identity promises (prefill
// under any chunking), the CUDA backend against the CPU backend and the transformers goldens
// on the tiny checkpoint, and GPU sampling against sample_logits (equal tokens, except where a
// cumulative sum sits within 1e-12 of the draw: counted and reported). Tolerance
// |got − ref| <= atol + rtol·|ref|, sized to bf16 where a bf16 rounding sits between the two.
// Without a CUDA device every test is skipped with a visible message (exit 77).
// GPTOSS_TEST_QUICK=1 trims the sampling sweeps (for the compute-sanitizer runs).
#include "tests/kernel-test-util.cuh"

#include "cuda/backend.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <thread>
#include <tuple>

namespace {

// --- device memory --------------------------------------------------------------------------

// Routes every row of x to `expert` (tiles of up to tile_tokens columns).
struct SingleRoute {
    Dev<int32_t> tiles, pairs;
    cuda::GemmRoute r;
    SingleRoute(uint32_t T, int32_t expert, uint32_t tile_tokens)
        : tiles(1 + 3 * size_t(cuda::ceil_div(T, tile_tokens))), pairs(T) {
        std::vector<int32_t> t{int32_t(cuda::ceil_div(T, tile_tokens))}, p(T);
        for (uint32_t s = 0; s < T; s += tile_tokens) {
            t.push_back(expert);
            t.push_back(int32_t(s));
            t.push_back(int32_t(std::min(tile_tokens, T - s)));
        }
        std::iota(p.begin(), p.end(), 0);
        REQUIRE(cudaMemcpy(tiles.p, t.data(), t.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        REQUIRE(cudaMemcpy(pairs.p, p.data(), p.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        r.tiles = tiles.p; r.pairs = pairs.p; r.in_div = 1; r.max_tiles = uint32_t(t[0]);
    }
};

std::vector<float> run_dense(const DenseW& d, const std::vector<float>& x, uint32_t T, int nb) {
    Dev<uint16_t> xd(permuted_rows(x, T, d.w.K));
    Dev<float> out(size_t(T) * d.w.N);
    OK(cuda::gemm(d.w, xd.p, T, nullptr, cuda::Epilogue::kStore, out.p, nullptr, d.w.N, 0, nb, nullptr));
    return out.get();
}

// --- tests -----------------------------------------------------------------------------------

TEST_CASE("bf16 gemm matches cpu::matmul_bf16 for T = 1, 7, 8, 9, 64, 130 and N not a multiple of 16") {
    Rand r(11);
    const uint32_t N = 200, K = 320;
    const auto W = r.bf16s(size_t(N) * K, 0.1f);
    const auto b = r.bf16s(N, 0.1f);
    DenseW d(W, b, N, K);
    for (uint32_t T : {1u, 7u, 8u, 9u, 64u, 130u}) {
        const auto x = rounded(r.floats(size_t(T) * K, 1.0f));
        std::vector<float> ref(size_t(T) * N);
        cpu::matmul_bf16(x.data(), W.data(), b.data(), T, K, N, ref.data());
        expect_close(run_dense(d, x, T, T == 1 ? 1 : 8), ref, 1e-4f, 1e-4f, "T=" + std::to_string(T));
    }
}

TEST_CASE("gemm rows are bit-identical whatever T, the column tile and nb (chunking invariance)") {
    Rand r(12);
    const uint32_t N = 96, K = 448, T = 37;
    DenseW d(r.bf16s(size_t(N) * K, 0.1f), r.bf16s(N, 0.1f), N, K);
    const auto x = rounded(r.floats(size_t(T) * K, 1.0f));
    const auto all = run_dense(d, x, T, 8);
    const auto two = run_dense(d, x, T, 2);  // the batched step's expert tiles' width
    CHECK(std::memcmp(two.data(), all.data(), all.size() * 4) == 0);
    for (uint32_t t = 0; t < T; ++t) {
        const std::vector<float> row(x.begin() + size_t(t) * K, x.begin() + size_t(t + 1) * K);
        const auto one = run_dense(d, row, 1, 1);
        CHECK(std::memcmp(one.data(), all.data() + size_t(t) * N, N * 4) == 0);
    }
}

TEST_CASE("the kAdd epilogue adds the product and bias into the existing output") {
    Rand r(13);
    const uint32_t N = 64, K = 128, T = 3;
    const auto W = r.bf16s(size_t(N) * K, 0.1f);
    const auto b = r.bf16s(N, 0.1f);
    DenseW d(W, b, N, K);
    const auto x = rounded(r.floats(size_t(T) * K, 1.0f));
    const auto base = r.floats(size_t(T) * N, 5.0f);
    Dev<uint16_t> xd(permuted_rows(x, T, K));
    Dev<float> out(base);
    OK(cuda::gemm(d.w, xd.p, T, nullptr, cuda::Epilogue::kAdd, out.p, nullptr, N, 0, 8, nullptr));
    std::vector<float> ref(size_t(T) * N);
    cpu::matmul_bf16(x.data(), W.data(), b.data(), T, K, N, ref.data());
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += base[i];
    expect_close(out.get(), ref, 1e-4f, 1e-5f, "residual add");
}

TEST_CASE("MXFP4 expert gemm matches cpu::matmul_mxfp4 over all 16 codes and scale bytes 0..128") {
    Rand r(14);
    const uint32_t E = 3, N = 48, K = 256;
    const auto blocks = r.bytes(size_t(E) * N * K / 2);
    auto scales = r.bytes(size_t(E) * N * K / 32);
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = uint8_t(i % 9 == 0 ? r.below(129) : 115 + r.below(14));
    const auto bias = r.bf16s(size_t(E) * N, 0.1f);
    ExpertsW ew(blocks, scales, bias, E, N, K, false);
    CHECK(ew.bad.get()[0] == 0);
    for (uint32_t T : {1u, 5u, 70u}) {
        for (int32_t e = 0; e < int32_t(E); ++e) {
            const auto x = rounded(r.floats(size_t(T) * K, 1.0f));
            SingleRoute route(T, e, T == 1 ? 8 : 64);
            Dev<uint16_t> xd(permuted_rows(x, T, K));
            Dev<float> out(size_t(T) * N);
            OK(cuda::gemm(ew.w, xd.p, T, &route.r, cuda::Epilogue::kStore, out.p, nullptr, N, 0, T == 1 ? 1 : 8,
                          nullptr));
            std::vector<float> ref(size_t(T) * N);
            cpu::matmul_mxfp4(x.data(), blocks.data() + size_t(e) * N * K / 2, scales.data() + size_t(e) * N * K / 32,
                              bias.data() + size_t(e) * N, T, K, N, ref.data());
            expect_close(out.get(), ref, 1e-5f, 1e-4f, "T=" + std::to_string(T) + " expert " + std::to_string(e));
        }
    }
}

TEST_CASE("MXFP4 gate_up with fused SwiGLU matches cpu::matmul_mxfp4 + cpu::swiglu") {
    Rand r(15);
    const uint32_t E = 2, I = 64, K = 192, N = 2 * I, T = 9;
    const auto blocks = r.bytes(size_t(E) * N * K / 2);
    std::vector<uint8_t> scales(size_t(E) * N * K / 32);
    for (uint8_t& s : scales) s = uint8_t(122 + r.below(6));  // large enough to hit the ±7 clamps
    const auto bias = r.bf16s(size_t(E) * N, 0.5f);
    ExpertsW ew(blocks, scales, bias, E, N, K, true);
    const auto x = rounded(r.floats(size_t(T) * K, 1.0f));
    SingleRoute route(T, 1, 64);
    Dev<uint16_t> xd(permuted_rows(x, T, K));
    Dev<uint16_t> act(size_t(T) * I);
    OK(cuda::gemm(ew.w, xd.p, T, &route.r, cuda::Epilogue::kSwiglu, nullptr, act.p, I, 7.0f, 8, nullptr));
    std::vector<float> g(size_t(T) * N), ref(size_t(T) * I);
    cpu::matmul_mxfp4(x.data(), blocks.data() + size_t(N) * K / 2, scales.data() + size_t(N) * K / 32,
                      bias.data() + N, T, K, N, g.data());
    cpu::swiglu(g.data(), T, I, 7.0f, ref.data());
    expect_close(unpermuted_rows(act.get(), T, I), ref, 1e-3f, 8e-3f, "swiglu");
}

TEST_CASE("an MXFP4 scale byte above 128 is reported by the repack") {
    const uint32_t N = 16, K = 64;
    std::vector<uint8_t> blocks(N * K / 2, 0x11), scales(N * K / 32, 120);
    scales[5] = 200;
    ExpertsW ew(blocks, scales, std::vector<uint16_t>(N, 0), 1, N, K, false);
    CHECK(ew.bad.get()[0] == 200);
}

TEST_CASE("router_route matches cpu::router_topk (ties pick the lower expert) and covers every pair once") {
    Rand r(16);
    const uint32_t E = 32, K = 4, T = 100, tile = 8;
    auto logits = r.floats(size_t(T) * E, 2.0f);
    for (uint32_t t = 0; t < T; t += 3) {  // exact ties
        logits[size_t(t) * E + 7] = 9.0f;
        logits[size_t(t) * E + 3] = 9.0f;
        logits[size_t(t) * E + 20] = 9.0f;
    }
    Dev<float> ld(logits);
    const uint32_t max_tiles = cuda::route_max_tiles(T, E, K, tile);
    Dev<int32_t> experts(size_t(T) * K), tiles(1 + 3 * size_t(max_tiles)), pairs(size_t(T) * K);
    Dev<float> weights(size_t(T) * K);
    OK(cuda::router_route(ld.p, T, E, K, experts.p, weights.p, tiles.p, pairs.p, tile, nullptr));
    std::vector<int32_t> ref_e(size_t(T) * K);
    std::vector<float> ref_w(size_t(T) * K);
    cpu::router_topk(logits.data(), T, E, K, ref_e.data(), ref_w.data());
    const auto ge = experts.get();
    CHECK(ge == ref_e);
    expect_close(weights.get(), ref_w, 1e-6f, 1e-5f, "routing weights");
    const auto ti = tiles.get();
    const auto pr = pairs.get();
    std::vector<int> seen(size_t(T) * K, 0);
    REQUIRE(ti[0] > 0);
    REQUIRE(uint32_t(ti[0]) <= max_tiles);
    for (int i = 0; i < ti[0]; ++i) {
        const int32_t e = ti[1 + 3 * i], s = ti[2 + 3 * i], n = ti[3 + 3 * i];
        CHECK(n >= 1);
        CHECK(n <= int32_t(tile));
        for (int32_t j = s; j < s + n; ++j) {
            CHECK(ge[size_t(pr[j])] == e);
            seen[size_t(pr[j])]++;
        }
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
}

// The routers' top-K by the warp's max reduction (router_topk_redux, default on) against the argmax
// butterfly it replaces where no logit is NaN: the same experts and the same weight bits, with exact
// ties, +0 against -0, -inf logits, fewer experts than a lane's slots hold (E = 100), and a NaN in
// some tokens (those take the butterfly either way); the finite tokens also against cpu::router_topk.
TEST_CASE("router top-K: the max-reduction selection gives the argmax butterfly's experts and weights") {
    const bool was = cuda::router_topk_redux();
    CHECK(was);
    for (const uint32_t E : {32u, 100u, 128u, 256u}) {
        for (const uint32_t K : {4u, 8u}) {
            Rand r(900 + E + K);
            const uint32_t T = 60, tile = 8;
            auto logits = r.floats(size_t(T) * E, 2.0f);
            std::vector<bool> finite(T, true);
            for (uint32_t t = 0; t < T; ++t) {
                float* row = &logits[size_t(t) * E];
                switch (t % 5) {
                case 0: row[7 % E] = row[3] = row[E - 1] = row[E / 2] = 9.0f; break;  // exact ties
                case 1:
                    for (uint32_t e = 0; e < E; ++e) row[e] = (e % 3 == 0) ? -0.0f : 0.0f;  // every logit ties
                    break;
                case 2:
                    for (uint32_t e = 0; e < E; e += 2) row[e] = -INFINITY;
                    break;
                case 3:
                    row[t % E] = NAN;
                    finite[t] = false;
                    break;
                default: break;
                }
            }
            Dev<float> ld(logits);
            const uint32_t max_tiles = cuda::route_max_tiles(T, E, K, tile);
            auto run = [&](bool redux, std::vector<int32_t>* e, std::vector<float>* w) {
                cuda::set_router_topk_redux(redux);
                Dev<int32_t> experts(size_t(T) * K), tiles(1 + 3 * size_t(max_tiles)), pairs(size_t(T) * K);
                Dev<float> weights(size_t(T) * K);
                OK(cuda::router_route(ld.p, T, E, K, experts.p, weights.p, tiles.p, pairs.p, tile, nullptr));
                *e = experts.get();
                *w = weights.get();
            };
            std::vector<int32_t> e_new, e_old;
            std::vector<float> w_new, w_old;
            run(true, &e_new, &w_new);
            run(false, &e_old, &w_old);
            INFO("E " << E << " K " << K);
            CHECK(e_new == e_old);
            CHECK(std::memcmp(w_new.data(), w_old.data(), w_new.size() * sizeof(float)) == 0);
            std::vector<int32_t> ref_e(size_t(T) * K);
            std::vector<float> ref_w(size_t(T) * K);
            cpu::router_topk(logits.data(), T, E, K, ref_e.data(), ref_w.data());
            for (uint32_t t = 0; t < T; ++t) {
                if (!finite[t]) continue;
                INFO("token " << t);
                CHECK(std::equal(e_new.begin() + t * K, e_new.begin() + (t + 1) * K, ref_e.begin() + t * K));
            }
        }
    }
    cuda::set_router_topk_redux(was);
}

// The MoE block as the backend runs it: route → gate_up+SwiGLU → down → combine + residual.
void check_moe(const std::vector<float>& logits_override, uint32_t T, uint64_t seed, const char* what) {
    Rand r(seed);
    const uint32_t E = 8, K = 4, H = 128, I = 64;
    const auto gu_blocks = r.bytes(size_t(E) * 2 * I * H / 2);
    const auto dn_blocks = r.bytes(size_t(E) * H * I / 2);
    std::vector<uint8_t> gu_scales(size_t(E) * 2 * I * H / 32), dn_scales(size_t(E) * H * I / 32);
    for (uint8_t& s : gu_scales) s = uint8_t(119 + r.below(4));
    for (uint8_t& s : dn_scales) s = uint8_t(119 + r.below(4));
    const auto gu_bias = r.bf16s(size_t(E) * 2 * I, 0.1f);
    const auto dn_bias = r.bf16s(size_t(E) * H, 0.1f);
    ExpertsW gu(gu_blocks, gu_scales, gu_bias, E, 2 * I, H, true);
    ExpertsW dn(dn_blocks, dn_scales, dn_bias, E, H, I, false);
    const auto xn = rounded(r.floats(size_t(T) * H, 2.0f));
    const auto logits = logits_override.empty() ? r.floats(size_t(T) * E, 1.0f) : logits_override;
    const auto x0 = r.floats(size_t(T) * H, 1.0f);

    const int nb = T == 1 ? 1 : 8;
    const uint32_t tile = 8u * uint32_t(nb), max_tiles = cuda::route_max_tiles(T, E, K, tile);
    Dev<float> ld(logits), weights(size_t(T) * K), part(size_t(T) * K * H), x(x0);
    Dev<int32_t> experts(size_t(T) * K), tiles(1 + 3 * size_t(max_tiles)), pairs(size_t(T) * K);
    Dev<uint16_t> xd(permuted_rows(xn, T, H)), act(size_t(T) * K * I), xn_out(size_t(T) * H);
    std::vector<float> ones(H, 1.0f);
    Dev<float> norm_w(ones);
    OK(cuda::router_route(ld.p, T, E, K, experts.p, weights.p, tiles.p, pairs.p, tile, nullptr));
    cuda::GemmRoute r1;
    r1.tiles = tiles.p; r1.pairs = pairs.p; r1.in_div = K; r1.max_tiles = max_tiles;
    OK(cuda::gemm(gu.w, xd.p, T, &r1, cuda::Epilogue::kSwiglu, nullptr, act.p, I, 7.0f, nb, nullptr));
    cuda::GemmRoute r2 = r1;
    r2.in_div = 1;
    OK(cuda::gemm(dn.w, act.p, T * K, &r2, cuda::Epilogue::kStore, part.p, nullptr, H, 0, nb, nullptr));
    cuda::ResidualArgs ra;
    ra.mode = cuda::ResidualMode::kMoeAdd; ra.part = part.p; ra.weights = weights.p; ra.K = K;
    OK(cuda::residual_rmsnorm(ra, x.p, norm_w.p, 1e-5f, xn_out.p, T, H, nullptr));

    std::vector<int32_t> re(size_t(T) * K);
    std::vector<float> rw(size_t(T) * K), moe(size_t(T) * H);
    cpu::router_topk(logits.data(), T, E, K, re.data(), rw.data());
    const cpu::MoeWeights mw{gu_blocks.data(), gu_scales.data(), gu_bias.data(),
                             dn_blocks.data(), dn_scales.data(), dn_bias.data()};
    cpu::moe(xn.data(), T, H, I, mw, re.data(), rw.data(), K, 7.0f, moe.data());
    std::vector<float> ref(x0);
    float scale = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        ref[i] += moe[i];
        scale = std::max(scale, std::fabs(moe[i]));
    }
    // The SwiGLU output is rounded to bf16 before the down projection (the CPU keeps fp32).
    expect_close(x.get(), ref, 1e-2f * scale, 1e-2f, what);
}

// warps 4: bit-identical to residual_rmsnorm + gemm + router_route; 8 and 16 (the decode graph's
// shorter chain, issue 12): the same xn, logits within fp32 rounding of gemm()'s, the same route.
TEST_CASE("router_decode (fused norm + router + top-k; counter or cluster; 4, 8 or 16 warps) against residual_rmsnorm + gemm + router_route") {
    struct S { uint32_t E, K, H; bool ties; };
    Dev<int> counter(1);
    REQUIRE(cudaMemset(counter.p, 0, sizeof(int)) == cudaSuccess);
    for (S sh : {S{32, 4, 2880, false}, S{128, 4, 2880, false}, S{8, 4, 64, false}, S{40, 4, 128, false},
                 S{256, 8, 4096, false}, S{32, 4, 2880, true}}) {
        Rand r(90 + sh.E + sh.H + sh.ties);
        const uint32_t E = sh.E, K = sh.K, H = sh.H;
        const auto [W, b] = router_weights(r, E, H, sh.ties);
        DenseW dw(W, b, E, H);
        const auto x = r.floats(H, 3.0f);
        const auto nw = widen(r.bf16s(H, 1.5f));
        Dev<float> xd(x), nwd(nw);
        INFO("E " << E << " H " << H << (sh.ties ? " with ties" : ""));
        REQUIRE(cuda::router_decode_supported(E, K, H));
        // The three launches the decode path used to make.
        Dev<uint16_t> xn_ref(H);
        Dev<float> logits_ref(E), w_ref(K);
        const uint32_t max_tiles = cuda::route_max_tiles(1, E, K, 8);
        Dev<int32_t> e_ref(K), t_ref(1 + 3 * size_t(max_tiles)), p_ref(K);
        cuda::ResidualArgs none;
        OK(cuda::residual_rmsnorm(none, xd.p, nwd.p, 1e-5f, xn_ref.p, 1, H, nullptr));
        OK(cuda::gemm(dw.w, xn_ref.p, 1, nullptr, cuda::Epilogue::kStore, logits_ref.p, nullptr, E, 0, 1, nullptr));
        OK(cuda::router_route(logits_ref.p, 1, E, K, e_ref.p, w_ref.p, t_ref.p, p_ref.p, 8, nullptr));
        for (int cl : {0, 1})
        for (uint32_t warps : {4u, 8u, 16u}) {
            INFO("cluster " << cl << " warps " << warps);
            // The fused kernel: the counter's cross-CTA step, then the cluster's (where usable).
            Dev<uint16_t> xn(H);
            Dev<float> logits(E), w(K);
            Dev<int32_t> e(K), t(1 + 3 * size_t(max_tiles)), pr(K);
            cuda::RouterDecodeArgs ra;
            ra.x = xd.p; ra.norm_w = nwd.p; ra.eps = 1e-5f; ra.router = dw.w; ra.K = K; ra.xn = xn.p; ra.logits = logits.p;
            ra.counter = counter.p; ra.experts = e.p; ra.weights = w.p; ra.tiles = t.p; ra.pairs = pr.p;
            ra.cluster = cl;
            ra.warps = warps;
            if (cl == 1 && E <= 128) {  // an sm_90 build on an sm_90 device takes the cluster path
                int dev = 0, major = 0;
                REQUIRE(cudaGetDevice(&dev) == cudaSuccess);
                REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess);
                if (major == 9) CHECK(cuda::router_decode_cluster_usable(E));
            }
            OK(cuda::router_decode(ra, nullptr));
            CHECK(xn.get() == xn_ref.get());
            const auto gl = logits.get(), rl = logits_ref.get();
            if (warps == 4) {
                CHECK(std::memcmp(gl.data(), rl.data(), E * 4) == 0);
            } else {  // another fp32 summation order of the same products
                float worst = 0.0f;
                for (uint32_t i = 0; i < E; ++i) worst = std::max(worst, std::fabs(gl[i] - rl[i]) / (1.0f + std::fabs(rl[i])));
                CHECK(worst < 1e-5f);
                if (H / 64 > 4) CHECK(worst > 0.0f);  // more chunks than 4 warps: the order really differs
            }
            CHECK(e.get() == e_ref.get());  // random logits: the top-K is far from a near-tie
            const auto gw = w.get(), rw = w_ref.get();
            if (warps == 4) CHECK(std::memcmp(gw.data(), rw.data(), K * 4) == 0);
            for (uint32_t k = 0; k < K; ++k) CHECK(std::fabs(gw[k] - rw[k]) < 1e-4f);
            const auto gt = t.get(), rt = t_ref.get();
            CHECK(std::equal(gt.begin(), gt.begin() + 1 + 3 * K, rt.begin()));
            CHECK(pr.get() == p_ref.get());
            // The routing against the CPU oracle on the same logits.
            std::vector<int32_t> ce(K);
            std::vector<float> cw(K);
            cpu::router_topk(gl.data(), 1, E, K, ce.data(), cw.data());
            CHECK(e.get() == ce);
            int armed = -1;
            REQUIRE(cudaMemcpy(&armed, counter.p, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
            CHECK(armed == 0);  // re-armed for the next call
            if (sh.ties) {
                CHECK(gl[3] == gl[9]);
                CHECK(ce[0] == 3);
                CHECK(ce[1] == 9);
                CHECK(ce[2] == 20);
            }
        }
    }
    cuda::RouterDecodeArgs bad;
    bad.router.N = 257; bad.router.K = 64; bad.K = 4;
    CHECK(cuda::router_decode(bad, nullptr) == GPTOSS_ERR_UNSUPPORTED);
    CHECK(std::string(gptoss_last_error()).find("257 experts") != std::string::npos);
    bad.router.N = 32; bad.warps = 6;
    CHECK(cuda::router_decode(bad, nullptr) == GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("6 warps") != std::string::npos);
}

// The pairs of each expert's group as a sorted list (their order inside a group comes from atomics).
static std::vector<int32_t> pairs_by_expert(const std::vector<int32_t>& tiles, const std::vector<int32_t>& pairs) {
    std::vector<int32_t> out;
    std::map<int32_t, std::vector<int32_t>> group;
    for (int32_t i = 0; i < tiles[0]; ++i)
        for (int32_t j = 0; j < tiles[3 + 3 * i]; ++j)  // tile i: expert, first pair, pairs
            group[tiles[1 + 3 * i]].push_back(pairs[tiles[2 + 3 * i] + j]);
    for (auto& [e, v] : group) {
        std::sort(v.begin(), v.end());
        out.push_back(-1 - e);
        out.insert(out.end(), v.begin(), v.end());
    }
    return out;
}

TEST_CASE("router_batch (a batched step's fused norm + router + top-k) is bit-identical to residual_rmsnorm + gemm + router_route") {
    struct S { uint32_t E, K, H; bool ties; };
    int dev = 0, major = 0;
    REQUIRE(cudaGetDevice(&dev) == cudaSuccess);
    REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess);
    for (S sh : {S{32, 4, 2880, false}, S{128, 4, 2880, false}, S{8, 4, 64, false}, S{40, 4, 128, false},
                 S{128, 8, 4096, false}, S{32, 4, 2880, true}}) {
        const uint32_t E = sh.E, K = sh.K, H = sh.H;
        INFO("E " << E << " K " << K << " H " << H << (sh.ties ? " with ties" : ""));
        if (!cuda::router_batch_usable(E, K, H)) {
            CHECK(major != 9);  // every shape here is usable on an sm_90 device
            MESSAGE("router_batch is not usable on this device (sm_90 thread-block clusters): case skipped");
            continue;
        }
        for (uint32_t T : {1u, 2u, 7u, 8u, 9u, 64u, 70u}) {
            INFO("T " << T);
            Rand r(300 + E + H + T + sh.ties);
            const auto [W, b] = router_weights(r, E, H, sh.ties);
            DenseW dw(W, b, E, H);
            const auto x = r.floats(size_t(T) * H, 3.0f);
            const auto nw = widen(r.bf16s(H, 1.5f));
            Dev<float> xd(x), nwd(nw);
            // The launches of the three-launch path, and router_route's grouping into tiles of 16.
            const uint32_t max_tiles = cuda::route_max_tiles(T, E, K, 16);
            Dev<uint16_t> xn_ref(size_t(T) * H), xn(size_t(T) * H);
            Dev<float> l_ref(size_t(T) * E), l(size_t(T) * E), w_ref(size_t(T) * K), w(size_t(T) * K);
            Dev<int32_t> e_ref(size_t(T) * K), e(size_t(T) * K), t_ref(1 + 3 * size_t(max_tiles)),
                t(1 + 3 * size_t(max_tiles)), p_ref(size_t(T) * K), p(size_t(T) * K);
            cuda::ResidualArgs none;
            OK(cuda::residual_rmsnorm(none, xd.p, nwd.p, 1e-5f, xn_ref.p, T, H, nullptr));
            OK(cuda::gemm(dw.w, xn_ref.p, T, nullptr, cuda::Epilogue::kStore, l_ref.p, nullptr, E, 0, 2, nullptr));
            OK(cuda::router_route(l_ref.p, T, E, K, e_ref.p, w_ref.p, t_ref.p, p_ref.p, 16, nullptr));
            cuda::RouterBatchArgs rb;
            rb.x = xd.p; rb.norm_w = nwd.p; rb.eps = 1e-5f; rb.router = dw.w; rb.T = T; rb.K = K;
            rb.xn = xn.p; rb.logits = l.p; rb.experts = e.p; rb.weights = w.p;
            OK(cuda::router_batch(rb, nullptr));
            OK(cuda::router_group(e.p, T, E, K, t.p, p.p, 16, nullptr));
            CHECK(xn.get() == xn_ref.get());
            const auto gl = l.get(), rl = l_ref.get();
            CHECK(std::memcmp(gl.data(), rl.data(), gl.size() * 4) == 0);
            const auto ge = e.get();
            CHECK(ge == e_ref.get());
            const auto gw = w.get(), rw = w_ref.get();
            CHECK(std::memcmp(gw.data(), rw.data(), gw.size() * 4) == 0);
            const auto gt = t.get(), rt = t_ref.get();
            REQUIRE(gt[0] == rt[0]);
            CHECK(std::equal(gt.begin(), gt.begin() + 1 + 3 * gt[0], rt.begin()));
            CHECK(pairs_by_expert(gt, p.get()) == pairs_by_expert(rt, p_ref.get()));
            // The routing against the CPU oracle on the same logits.
            std::vector<int32_t> ce(size_t(T) * K);
            std::vector<float> cw(size_t(T) * K);
            cpu::router_topk(gl.data(), T, E, K, ce.data(), cw.data());
            CHECK(ge == ce);
            if (sh.ties) {
                CHECK(ce[0] == 3);
                CHECK(ce[1] == 9);
                CHECK(ce[2] == 20);
            }
        }
    }
    cuda::RouterBatchArgs bad;
    bad.router.N = 129; bad.router.K = 64; bad.K = 4; bad.T = 2;
    CHECK(cuda::router_batch(bad, nullptr) == GPTOSS_ERR_UNSUPPORTED);
    CHECK(std::string(gptoss_last_error()).find("129 experts") != std::string::npos);
}

// The batched step's router at 16 warps (GPTOSS_DECODE_BATCH_ROUTER_WARPS=16): each token's row of
// router_batch must be what router_decode at 16 warps gives that token alone (a batched step of
// one token takes router_decode), bit for bit, so a session's route does not depend on the batch.
TEST_CASE("router_batch at 16 warps gives each token router_decode's 16-warp bits") {
    struct S { uint32_t E, K, H; };
    Dev<int> counter(1);
    REQUIRE(cudaMemset(counter.p, 0, sizeof(int)) == cudaSuccess);
    for (S sh : {S{32, 4, 2880}, S{128, 4, 2880}, S{8, 4, 64}, S{40, 4, 128}}) {
        const uint32_t E = sh.E, K = sh.K, H = sh.H;
        INFO("E " << E << " K " << K << " H " << H);
        if (!cuda::router_batch_usable(E, K, H)) {
            MESSAGE("router_batch is not usable on this device (sm_90 thread-block clusters): case skipped");
            continue;
        }
        for (uint32_t T : {1u, 2u, 9u, 64u, 70u}) {
            INFO("T " << T);
            Rand r(700 + E + H + T);
            const auto [W, b] = router_weights(r, E, H, false);
            DenseW dw(W, b, E, H);
            const auto x = r.floats(size_t(T) * H, 3.0f);
            const auto nw = widen(r.bf16s(H, 1.5f));
            Dev<float> xd(x), nwd(nw);
            Dev<uint16_t> xn(size_t(T) * H);
            Dev<float> l(size_t(T) * E), w(size_t(T) * K);
            Dev<int32_t> e(size_t(T) * K);
            cuda::RouterBatchArgs rb;
            rb.x = xd.p; rb.norm_w = nwd.p; rb.eps = 1e-5f; rb.router = dw.w; rb.T = T; rb.K = K;
            rb.xn = xn.p; rb.logits = l.p; rb.experts = e.p; rb.weights = w.p; rb.warps = 16;
            OK(cuda::router_batch(rb, nullptr));
            const auto gxn = xn.get();
            const auto gl = l.get(), gw = w.get();
            const auto ge = e.get();
            const uint32_t max_tiles = cuda::route_max_tiles(1, E, K, 8);
            for (uint32_t tok = 0; tok < T; tok += (T > 9 ? 7 : 1)) {
                INFO("token " << tok);
                Dev<float> x1(std::vector<float>(x.begin() + size_t(tok) * H, x.begin() + size_t(tok + 1) * H));
                Dev<uint16_t> xn1(H);
                Dev<float> l1(E), w1(K);
                Dev<int32_t> e1(K), t1(1 + 3 * size_t(max_tiles)), p1(K);
                cuda::RouterDecodeArgs ra;
                ra.x = x1.p; ra.norm_w = nwd.p; ra.eps = 1e-5f; ra.router = dw.w; ra.K = K; ra.xn = xn1.p;
                ra.logits = l1.p; ra.counter = counter.p; ra.experts = e1.p; ra.weights = w1.p; ra.tiles = t1.p;
                ra.pairs = p1.p; ra.warps = 16;
                OK(cuda::router_decode(ra, nullptr));
                const auto rxn = xn1.get();
                CHECK(std::equal(rxn.begin(), rxn.end(), gxn.begin() + size_t(tok) * H));
                const auto rl = l1.get(), rw = w1.get();
                CHECK(std::memcmp(rl.data(), gl.data() + size_t(tok) * E, E * 4) == 0);
                const auto re = e1.get();
                CHECK(std::equal(re.begin(), re.end(), ge.begin() + size_t(tok) * K));
                CHECK(std::memcmp(rw.data(), gw.data() + size_t(tok) * K, K * 4) == 0);
            }
            // The routing against the CPU oracle on the kernel's own logits.
            std::vector<int32_t> ce(size_t(T) * K);
            std::vector<float> cw(size_t(T) * K);
            cpu::router_topk(gl.data(), T, E, K, ce.data(), cw.data());
            CHECK(ge == ce);
        }
    }
    cuda::RouterBatchArgs bad;
    bad.router.N = 32; bad.router.K = 2880; bad.K = 4; bad.T = 2; bad.warps = 8;
    bad.x = bad.norm_w = reinterpret_cast<const float*>(16);
    bad.xn = reinterpret_cast<uint16_t*>(16); bad.logits = bad.weights = reinterpret_cast<float*>(16);
    bad.experts = reinterpret_cast<int32_t*>(16);
    if (cuda::router_batch_usable(32, 4, 2880)) {
        CHECK(cuda::router_batch(bad, nullptr) == GPTOSS_ERR_INTERNAL);
        CHECK(std::string(gptoss_last_error()).find("8 warps") != std::string::npos);
    }
}

TEST_CASE("the grouped MoE matches cpu::moe for one token") { check_moe({}, 1, 21, "T=1"); }

TEST_CASE("the grouped MoE matches cpu::moe with 200 tokens, most on one expert") {
    Rand r(22);
    const uint32_t T = 200, E = 8;
    auto logits = r.floats(size_t(T) * E, 1.0f);
    for (uint32_t t = 0; t < T; ++t) logits[size_t(t) * E + 5] += 4.0f;
    check_moe(logits, T, 23, "many on expert 5");
}

TEST_CASE("the grouped MoE matches cpu::moe when every token picks the same four experts") {
    const uint32_t T = 77, E = 8;
    std::vector<float> logits(size_t(T) * E, 0.0f);
    for (uint32_t t = 0; t < T; ++t)
        for (uint32_t e = 0; e < 4; ++e) logits[size_t(t) * E + e] = 3.0f - 0.5f * float(e) + 0.001f * float(t % 7);
    check_moe(logits, T, 24, "same four experts");
}

TEST_CASE("embedding + rmsnorm match cpu::embed + cpu::rmsnorm") {
    Rand r(31);
    const uint32_t V = 300, H = 192, T = 5;
    const auto table = r.bf16s(size_t(V) * H, 1.0f);
    const auto w_bf16 = r.bf16s(H, 1.0f);
    std::vector<int32_t> tokens{0, 299, 17, 17, 150};
    Dev<uint16_t> td(table), xn(size_t(T) * H);
    Dev<int32_t> tok(tokens);
    Dev<float> w(widen(w_bf16)), x(size_t(T) * H);
    cuda::ResidualArgs ra;
    ra.mode = cuda::ResidualMode::kEmbed; ra.embed = td.p; ra.tokens = tok.p;
    OK(cuda::residual_rmsnorm(ra, x.p, w.p, 1e-5f, xn.p, T, H, nullptr));
    std::vector<float> rx(size_t(T) * H), rn(size_t(T) * H);
    cpu::embed(table.data(), tokens.data(), T, H, rx.data());
    cpu::rmsnorm(rx.data(), w_bf16.data(), T, H, 1e-5f, rn.data());
    expect_close(x.get(), rx, 0, 0, "embedding");
    expect_close(unpermuted_rows(xn.get(), T, H), rn, 1e-6f, 8e-3f, "rmsnorm (bf16 output)");
}

// residual_rmsnorm runs 512 threads per token from 64 tokens up and 1024 below, playing the same
// virtual threads: a chunk's rows must equal the same rows done one token at a time, bit for bit,
// in every mode, for H <= 3072 and above, K = 4 and 8 slots.
TEST_CASE("residual_rmsnorm: rows of a 70-token chunk equal the same rows one token at a time, every mode") {
    Rand r(37);
    const uint32_t V = 100, T = 70;
    for (const auto& hk : {std::pair<uint32_t, uint32_t>{2880, 4}, {4096, 4}, {2880, 8}, {192, 2}}) {
        const uint32_t H = hk.first, K = hk.second;
        const auto table = r.bf16s(size_t(V) * H, 1.0f);
        std::vector<int32_t> tokens(T);
        for (uint32_t t = 0; t < T; ++t) tokens[t] = int32_t(r.below(V));
        const auto w = r.floats(H, 1.0f), x0 = r.floats(size_t(T) * H, 2.0f);
        const auto part = r.floats(size_t(T) * K * H, 1.0f), weights = r.floats(size_t(T) * K, 1.0f);
        Dev<uint16_t> td(table);
        Dev<int32_t> tok(tokens);
        Dev<float> wd(w), pd(part), wtd(weights);
        for (const cuda::ResidualMode mode : {cuda::ResidualMode::kEmbed, cuda::ResidualMode::kMoeAdd,
                                              cuda::ResidualMode::kNone}) {
            CAPTURE(H); CAPTURE(K); CAPTURE(int(mode));
            Dev<float> xa(x0), xb(x0);
            Dev<uint16_t> na(size_t(T) * H), nb(size_t(T) * H);
            const auto args = [&](uint32_t t0) {
                cuda::ResidualArgs a;
                a.mode = mode; a.embed = td.p; a.tokens = tok.p + t0;
                a.part = pd.p + size_t(t0) * K * H; a.weights = wtd.p + size_t(t0) * K; a.K = K;
                return a;
            };
            OK(cuda::residual_rmsnorm(args(0), xa.p, wd.p, 1e-5f, na.p, T, H, nullptr));
            for (uint32_t t = 0; t < T; ++t)
                OK(cuda::residual_rmsnorm(args(t), xb.p + size_t(t) * H, wd.p, 1e-5f, nb.p + size_t(t) * H, 1, H, nullptr));
            CHECK(xa.get() == xb.get());
            CHECK(na.get() == nb.get());
        }
    }
}

Config test_config() {
    Config c;
    c.n_layers = 2; c.n_experts = 8; c.n_experts_per_token = 4; c.hidden = 64; c.intermediate = 64;
    c.n_heads = 16; c.n_kv_heads = 2; c.head_dim = 64; c.vocab = 1024; c.sliding_window = 128;
    c.max_context = 131072; c.rope_theta = 150000.0f; c.rope_factor = 32.0f; c.rope_beta_fast = 32.0f;
    c.rope_beta_slow = 1.0f; c.rope_original_max_context = 4096;
    c.layer_sliding = {true, false};
    return c;
}

TEST_CASE("rope_qkv matches cpu::rope at positions 0, 127, 128, 129, 4095 and 70000") {
    Rand r(41);
    const Config c = test_config();
    const uint32_t Q = c.n_heads, G = c.n_kv_heads, D = c.head_dim, W = (Q + 2 * G) * D;
    const cpu::Rope rope = cpu::rope_init(c);
    Dev<float> inv(std::vector<float>(rope.inv_freq, rope.inv_freq + D / 2));
    for (int32_t pos0 : {0, 127, 128, 129, 4095, 70000}) {
        const uint32_t T = 3;
        const auto qkv = r.floats(size_t(T) * W, 2.0f);
        cuda::StepInfo si{pos0, int32_t(T)};
        Dev<cuda::StepInfo> step(std::vector<cuda::StepInfo>{si});
        Dev<float> in(qkv), q(size_t(T) * Q * D);
        Dev<uint16_t> k(size_t(T) * G * D), v(size_t(T) * G * D);
        OK(cuda::rope_qkv(in.p, step.p, inv.p, rope.scale, q.p, k.p, v.p, nullptr, nullptr, 0, T, Q, G, D, nullptr));
        std::vector<float> rq(size_t(T) * Q * D), rk(size_t(T) * G * D), rv(size_t(T) * G * D);
        for (uint32_t t = 0; t < T; ++t) {
            std::copy_n(&qkv[size_t(t) * W], Q * D, &rq[size_t(t) * Q * D]);
            std::copy_n(&qkv[size_t(t) * W + Q * D], G * D, &rk[size_t(t) * G * D]);
            std::copy_n(&qkv[size_t(t) * W + (Q + G) * D], G * D, &rv[size_t(t) * G * D]);
        }
        cpu::rope(rq.data(), T, Q, D, uint32_t(pos0), rope);
        cpu::rope(rk.data(), T, G, D, uint32_t(pos0), rope);
        const std::string at = "pos " + std::to_string(pos0);
        expect_close(q.get(), rq, 2e-5f, 2e-5f, "q " + at);
        expect_close(widen(k.get()), rk, 1e-5f, 8e-3f, "k " + at);
        expect_close(widen(v.get()), rounded(rv), 0, 0, "v " + at);
    }
}

// Keys/values for positions [0, pos0 + T), bf16; the cache holds positions < pos0 (a ring of
// `slots`, later positions overwriting earlier ones), k_new/v_new the chunk.
struct AttnCase {
    uint32_t Q = 16, G = 2, D = 64;
    uint32_t pos0, T, window, slots;
    std::vector<uint16_t> k, v;  // [pos0 + T, G, D]
    std::vector<float> q, sinks;
    AttnCase(uint32_t pos0_, uint32_t T_, uint32_t window_, uint32_t slots_, uint64_t seed)
        : pos0(pos0_), T(T_), window(window_), slots(slots_) {
        Rand r(seed);
        const size_t n = size_t(pos0 + T) * G * D;
        k = r.bf16s(n, 1.0f);
        v = r.bf16s(n, 1.0f);
        q = r.floats(size_t(T) * Q * D, 1.5f);
        sinks = r.floats(Q, 5.0f);
    }
    // round_q: the reference takes q rounded to bf16.
    std::vector<float> reference(bool round_q) const {
        std::vector<float> out(size_t(T) * Q * D);
        const auto kf = widen(k), vf = widen(v);
        const auto qr = round_q ? rounded(q) : q;
        cpu::attention(qr.data(), T, pos0, Q, G, D, kf.data(), vf.data(), pos0 + T, 0, window, sinks.data(),
                       out.data());
        return out;
    }
    // Runs the prefill (decode = false) or decode kernel; returns bf16 outputs unpermuted.
    // grid_splits: the decode grid's splits (default: one 128-key split per visible block).
    std::vector<uint16_t> run(bool decode, uint32_t grid_splits = 0) const {
        const size_t row = size_t(G) * D;
        std::vector<uint16_t> kc(size_t(slots) * row, 0), vc(size_t(slots) * row, 0);
        for (uint32_t p = 0; p < pos0; ++p) {
            std::copy_n(&k[p * row], row, &kc[(p % slots) * row]);
            std::copy_n(&v[p * row], row, &vc[(p % slots) * row]);
        }
        Dev<uint16_t> kcd(kc), vcd(vc), kn(std::vector<uint16_t>(k.begin() + pos0 * row, k.end())),
            vn(std::vector<uint16_t>(v.begin() + pos0 * row, v.end())), out(size_t(T) * Q * D);
        Dev<float> qd(q), sd(sinks);
        cuda::StepInfo si{int32_t(pos0), int32_t(T)};
        Dev<cuda::StepInfo> step(std::vector<cuda::StepInfo>{si});
        cuda::AttentionArgs a;
        a.q = qd.p; a.k_new = kn.p; a.v_new = vn.p; a.k_cache = kcd.p; a.v_cache = vcd.p; a.slots = slots;
        a.window = window; a.sinks = sd.p; a.step = step.p; a.T = T; a.Q = Q; a.G = G; a.D = D; a.out = out.p;
        if (decode) {
            const uint32_t splits = grid_splits ? grid_splits : cuda::ceil_div(pos0 + 1, cuda::kAttentionSplit) + 1;
            Dev<float> partial(size_t(Q) * splits * cuda::attn_partial_floats(D));
            Dev<int> counters(G);
            REQUIRE(cudaMemset(counters.p, 0, G * sizeof(int)) == cudaSuccess);
            OK(cuda::attention_decode(a, partial.p, counters.p, splits, nullptr));
            sync_ok();
            return out.get();
        }
        OK(cuda::attention_prefill(a, nullptr));
        return out.get();
    }
};

// Selects the decode attention split (kernels.h decode_attention_mma) and, for the tensor-core
// split, its stages (decode_attention_stages) for a scope; restores the previous choice after.
struct DecodeSplit {
    const bool was = cuda::decode_attention_mma();
    const int was_stages = cuda::decode_attention_stages();
    const uint32_t was_min = cuda::decode_attention_split_min();
    explicit DecodeSplit(bool mma, int stages = 2, uint32_t split_min = cuda::kAttentionSplit) {
        cuda::set_decode_attention_mma(mma);
        cuda::set_decode_attention_stages(stages);
        cuda::set_decode_attention_split_min(split_min);
    }
    ~DecodeSplit() {
        cuda::set_decode_attention_mma(was);
        cuda::set_decode_attention_stages(was_stages);
        cuda::set_decode_attention_split_min(was_min);
    }
};

// Past 16 384 keys the decode splits grow (cuda::decode_split_len) so that at most
// kMaxDecodeSplits partials are merged: the edges where the length doubles, a 70k-key context,
// the sliding window there, and the grid the backend launches (kMaxDecodeSplits) against a
// larger one (early-exiting CTAs): the same bits.
TEST_CASE("decode attention past 16k keys (longer splits) matches cpu::attention; the grid does not change the bits") {
    CHECK(cuda::decode_split_len(16383) == 128);
    CHECK(cuda::decode_split_len(16384) == 256);
    CHECK(cuda::decode_splits_needed(16383) == 128);
    CHECK(cuda::decode_splits_needed(16384) == 65);
    CHECK(cuda::decode_split_len(32767) == 256);
    CHECK(cuda::decode_split_len(32768) == 512);
    CHECK(cuda::decode_splits_needed(131071) <= cuda::kMaxDecodeSplits);
    // The batched step's splits: 512 keys, twice the lone query's split past ~4 300 keys.
    CHECK(cuda::batch_split_len(0) == 512);
    CHECK(cuda::batch_splits_needed(511) == 1);
    CHECK(cuda::batch_splits_needed(512) == 2);
    CHECK(cuda::batch_split_len(4351) == 512);
    CHECK(cuda::batch_split_len(4352) == 768);
    CHECK(cuda::batch_split_len(8192) == 1024);
    CHECK(cuda::batch_split_len(32768) == 2048);
    CHECK(cuda::batch_splits_needed(65535) == 16);
    uint32_t bad = 0;
    for (uint32_t p = 0; p < 140000; ++p) {
        const uint32_t len = cuda::batch_split_len(p);
        if (len % 256 != 0 || len < 512 || cuda::batch_splits_needed(p) > 17) ++bad;
    }
    CHECK(bad == 0);
    // The shortest split as the tuning knob sets it (GPTOSS_DECODE_BATCH_ATTN_SPLIT): the rule
    // before v44, 512 keys until decode_split_len is longer.
    CHECK(cuda::batch_split_len(0, 512) == 512);
    CHECK(cuda::batch_splits_needed(65535, 512) == 128);
    CHECK(cuda::batch_split_len(65536, 512) == 1024);
    CHECK(cuda::batch_splits_needed(131071, 512) <= cuda::kMaxDecodeSplits);
    // Splits per CTA of the batched attention on 132 SMs (8 kv heads): the cases of bench/NOTES.md v29.
    static_assert(cuda::batch_attention_group_for(64 * 8, 2, 132) == 2, "64 sessions at ~600 keys: one CTA");
    static_assert(cuda::batch_attention_group_for(64 * 8, 4, 132) == 4, "64 sessions at ~1 500 keys: one CTA");
    static_assert(cuda::batch_attention_group_for(64 * 8, 8, 132) == 8, "64 sessions at ~2 500 keys: one CTA");
    static_assert(cuda::batch_attention_group_for(32 * 8, 2, 132) == 2, "32 sessions at ~600 keys: one CTA");
    static_assert(cuda::batch_attention_group_for(8 * 8, 16, 132) == 1, "8 sessions at ~4 300 keys: a CTA per split");
    static_assert(cuda::batch_attention_group_for(8 * 8, 2, 132) == 1, "8 sessions at ~600 keys: a CTA per split");
    static_assert(cuda::batch_attention_group_for(1 * 8, 32, 132) == 1, "a lone session at 8 192: a CTA per split");
    static_assert(cuda::batch_attention_group_for(8, 0, 132) == 1, "no splits counted: one");
    std::map<std::pair<uint32_t, uint32_t>, std::vector<uint16_t>> one_stage;  // (window, position) → mode 1's output
    for (const int mode : {0, 1, 2}) {  // the FMA split, the tensor-core split with 1 and 2 stages
        const bool mma = mode > 0;
        const DecodeSplit split(mma, mma ? mode : 2);
        for (uint32_t window : {0u, 128u}) {
            for (uint32_t p : {16383u, 16384u, 16511u, 32767u, 32768u, 70001u}) {
                const uint32_t slots = window ? 128 : p + 1;
                AttnCase dec(p, 1, window, slots, 991 + p);
                const auto d = dec.run(true, cuda::kMaxDecodeSplits);
                const auto wide = dec.run(true);
                INFO("decode split " << mode << " (0 FMA, 1/2 tensor-core stages) window " << window << " position " << p);
                CHECK(std::memcmp(d.data(), wide.data(), d.size() * 2) == 0);
                if (mode == 1) one_stage[{window, p}] = d;
                if (mode == 2) CHECK(d == one_stage[{window, p}]);  // stages move loads, not sums
                expect_close(unpermuted_rows(d, 1, dec.Q * dec.D), dec.reference(mma), 2e-3f, 8e-3f, "decode");
            }
        }
    }
}

// (Prefill attention against cpu::attention, chunking and the window edges: test-kernels-attn.cu.)
TEST_CASE("decode attention and a 1-token prefill match cpu::attention; the prefill equals its row of a whole prefill") {
    for (uint32_t window : {0u, 128u}) {
        for (uint32_t p : {0u, 5u, 127u, 128u, 129u, 255u, 256u, 700u}) {
            const uint32_t slots = window ? 128 : 1024;
            // The whole prompt in one prefill; its last row is position p.
            AttnCase whole(0, p + 1, window, slots, 77 + p);
            const auto pre = whole.run(false);
            // The same keys, position p alone on top of the cache: decoded, and prefilled.
            AttnCase dec(p, 1, window, slots, 77 + p);
            dec.k = whole.k;
            dec.v = whole.v;
            dec.q.assign(whole.q.end() - whole.Q * whole.D, whole.q.end());
            dec.sinks = whole.sinks;
            const auto d = [&] { const DecodeSplit split(false); return dec.run(true); }();
            const auto d_mma = [&] { const DecodeSplit split(true, 2); return dec.run(true); }();
            const auto d_mma1 = [&] { const DecodeSplit split(true, 1); return dec.run(true); }();
            const auto single = dec.run(false);
            const size_t n = size_t(whole.Q) * whole.D;
            INFO("window " << window << " position " << p);
            CHECK(std::memcmp(single.data(), pre.data() + size_t(p) * n, n * 2) == 0);
            CHECK(std::memcmp(d_mma.data(), d_mma1.data(), n * 2) == 0);  // stages move loads, not sums
            expect_close(unpermuted_rows(d, 1, whole.Q * whole.D), dec.reference(false), 2e-3f, 8e-3f, "decode");
            // The tensor-core split rounds q to bf16 like the prefill kernel.
            expect_close(unpermuted_rows(d_mma, 1, whole.Q * whole.D), dec.reference(true), 2e-3f, 8e-3f,
                         "decode, tensor-core split");
            // The prefill kernel rounds q to bf16 (kernels.h); the reference takes the same q.
            expect_close(unpermuted_rows(single, 1, whole.Q * whole.D), dec.reference(true), 2e-3f, 8e-3f, "prefill");
        }
    }
}

// Longer shortest splits (decode_attention_split_min, bench/NOTES.md "v26"): the split lengths,
// then each setting against cpu::attention around its split edges, past 16k keys and at 70k, both
// splits (FMA, tensor cores with 1 and 2 stages: the same bits), and the grid the backend
// launches (kMaxDecodeSplits) against a wider one: the same bits.
TEST_CASE("decode attention with longer shortest splits matches cpu::attention; stages and grid do not change the bits") {
    CHECK(cuda::decode_split_len(8191, 512) == 512);
    CHECK(cuda::decode_splits_needed(8191, 512) == 16);
    CHECK(cuda::decode_split_len(65535, 512) == 512);
    CHECK(cuda::decode_split_len(65536, 512) == 1024);
    CHECK(cuda::decode_splits_needed(131071, 256) <= cuda::kMaxDecodeSplits);
    for (uint32_t p = 0; p < 140000; p += 997) CHECK(cuda::decode_splits_needed(p, 1024) <= cuda::decode_splits_needed(p));
    {
        const DecodeSplit split(true, 2, 300);  // rounded down to a power of two
        CHECK(cuda::decode_attention_split_min() == 256);
        cuda::set_decode_attention_split_min(1u << 20);
        CHECK(cuda::decode_attention_split_min() == 4096);
        cuda::set_decode_attention_split_min(0);
        CHECK(cuda::decode_attention_split_min() == cuda::kAttentionSplit);
    }
    for (const uint32_t split_min : {256u, 512u, 2048u}) {
        for (uint32_t window : {0u, 128u}) {
            for (uint32_t p : {0u, 127u, split_min - 1, split_min, split_min + 129, 8191u, 16384u, 70001u}) {
                const uint32_t slots = window ? 128 : p + 1;
                AttnCase dec(p, 1, window, slots, 5077 + p + split_min);
                std::vector<uint16_t> outs[3];
                for (const int mode : {0, 1, 2}) {
                    const DecodeSplit split(mode > 0, mode > 0 ? mode : 2, split_min);
                    outs[mode] = dec.run(true, cuda::kMaxDecodeSplits);
                    const auto wide = dec.run(true);
                    INFO("split_min " << split_min << " mode " << mode << " window " << window << " position " << p);
                    CHECK(std::memcmp(outs[mode].data(), wide.data(), wide.size() * 2) == 0);
                    expect_close(unpermuted_rows(outs[mode], 1, dec.Q * dec.D), dec.reference(mode > 0), 2e-3f, 8e-3f,
                                 "decode, longer splits");
                }
                CHECK(outs[1] == outs[2]);
            }
        }
    }
}

// The sliding window as one split (cuda::decode_attention_window_whole, the default) and as the
// split grid: both against cpu::attention at positions whose window straddles a split edge (and
// past 16k / 70k keys), one and two stages the same bits, the backend's grid against a wider one
// the same bits; a window longer than 512 keys keeps the grid either way. The two settings sum in
// other orders, so some straddling position must give other bits (else the switch is dead).
TEST_CASE("decode attention takes a sliding window in one split or in the split grid, both matching cpu::attention") {
    const bool was = cuda::decode_attention_window_whole();
    CHECK(was);  // the default (no GPTOSS_DECODE_ATTN_WINDOW_WHOLE in the test environment)
    std::map<std::tuple<uint32_t, uint32_t, bool>, std::vector<uint16_t>> out;
    for (const bool whole : {true, false}) {
        cuda::set_decode_attention_window_whole(whole);
        for (const uint32_t window : {128u, 512u, 600u}) {
            for (const uint32_t p : {5u, 127u, 128u, 255u, 256u, 300u, 383u, 700u, 8256u, 16500u, 70001u}) {
                AttnCase dec(p, 1, window, window, 4242 + p + window);
                std::vector<uint16_t> stage_out[2];
                for (const int stages : {1, 2}) {
                    const DecodeSplit split(true, stages, 256);
                    stage_out[stages - 1] = dec.run(true, cuda::kMaxDecodeSplits);
                    const auto wide = dec.run(true);
                    INFO("whole " << whole << " window " << window << " position " << p << " stages " << stages);
                    CHECK(std::memcmp(stage_out[stages - 1].data(), wide.data(), wide.size() * 2) == 0);
                    expect_close(unpermuted_rows(wide, 1, dec.Q * dec.D), dec.reference(true), 2e-3f, 8e-3f,
                                 "decode, sliding window");
                }
                CHECK(stage_out[0] == stage_out[1]);
                out[{window, p, whole}] = stage_out[1];
            }
        }
    }
    cuda::set_decode_attention_window_whole(was);
    int differ = 0;
    for (const uint32_t p : {5u, 127u, 128u, 255u, 256u, 300u, 383u, 700u, 8256u, 16500u, 70001u}) {
        differ += out[{128u, p, true}] != out[{128u, p, false}];
        INFO("window 600 at " << p << ": the grid either way");
        CHECK(out[{600u, p, true}] == out[{600u, p, false}]);
        if (p < 128) CHECK(out[{128u, p, true}] == out[{128u, p, false}]);  // one split in the grid too
    }
    CHECK(differ > 0);
}

// The lone query's split lengths (kernels.h decode_split_len_target; the measured points of
// bench/NOTES.md "v43" and "v44"): multiples of 128 keys, at least the shortest split, ~17 splits
// below ~9 250 keys, ~sqrt(p / 32) up to 32 768 and ~33 from there (the ramp; v43's step: 17 below
// 16 384 and 33 from there), never more than the graph is sized for (decode_splits_needed).
TEST_CASE("decode attention's split lengths: ~17 splits below 9k keys, a ramp to ~33 at 32k, within the graph's bound") {
    const auto splits = [](uint32_t p, bool ramp = true) { return p / cuda::decode_split_len_target(p, 256, ramp) + 1; };
    CHECK(cuda::decode_split_len_target(2048, 256) == 256);
    CHECK(splits(4096) == 17);
    CHECK(cuda::decode_split_len_target(8192, 256) == 512);
    CHECK(splits(8192) == 17);
    CHECK(cuda::decode_split_target(12288) == 20);  // isqrt(384) + 1
    CHECK(cuda::decode_split_len_target(12288, 256) == 640);
    CHECK(splits(12288) == 20);
    CHECK(cuda::decode_split_target(16384) == 23);
    CHECK(cuda::decode_split_len_target(16384, 256) == 768);
    CHECK(splits(16384) == 22);
    CHECK(cuda::decode_split_target(32767) == 32);
    CHECK(cuda::decode_split_target(32768) == 33);
    CHECK(cuda::decode_split_len_target(32768, 256) == 1024);
    CHECK(cuda::decode_split_len_target(65536, 256) == 2048);
    CHECK(splits(131071) <= 33);
    // v43's step
    CHECK(cuda::decode_split_len_target(12288, 256, false) == 768);
    CHECK(splits(16384, false) == 33);
    CHECK(cuda::decode_split_len_target(32768, 256, false) == 1024);
    uint32_t bad = 0, shrink = 0;
    for (uint32_t p = 0; p < 140000; ++p) {
        for (const bool ramp : {true, false}) {
            const uint32_t len = cuda::decode_split_len_target(p, 256, ramp), n = splits(p, ramp);
            if (len % 128 != 0 || len < 256 || n > cuda::decode_split_target(p, ramp) || n > 33 ||
                n > cuda::decode_splits_needed(p) || n > cuda::kMaxDecodeSplits)
                ++bad;
        }
        if (p > 0 && cuda::decode_split_target(p) < cuda::decode_split_target(p - 1)) ++shrink;
    }
    CHECK(bad == 0);
    CHECK(shrink == 0);  // the ramp's target never falls as the position grows
    CHECK(cuda::decode_split_len_target(100, 1024) == 1024);  // the shortest split wins
}

// The head-major grid and the staged merge of the partials (both on by default) move CTAs and
// loads, not sums: all four settings give the same bits, at positions with 2 .. 128 splits (the
// staged merge's batches: 30 partials per warp with two stages, 15 with one), full and sliding.
// (The left fold: the two-pass merge, default on, is off here; its own case follows.)
TEST_CASE("decode attention: the head-major grid and the staged partial merge do not change the bits") {
    const bool was_major = cuda::decode_attention_head_major(), was_staged = cuda::decode_attention_merge_staged();
    const bool was_two = cuda::decode_attention_merge_two_pass();
    CHECK(was_major);
    CHECK(was_staged);
    cuda::set_decode_attention_merge_two_pass(false);
    for (const uint32_t window : {0u, 128u}) {
        for (const uint32_t p : {300u, 8256u, 16500u, 40000u, 70001u}) {
            const uint32_t slots = window ? 128 : p + 1;
            AttnCase dec(p, 1, window, slots, 1717 + p);
            for (const int stages : {1, 2}) {
                const DecodeSplit split(true, stages, 256);
                std::vector<uint16_t> ref;
                for (const int mode : {0, 1, 2, 3}) {
                    cuda::set_decode_attention_head_major(mode & 1);
                    cuda::set_decode_attention_merge_staged(mode & 2);
                    const auto d = dec.run(true, cuda::kMaxDecodeSplits);
                    INFO("window " << window << " position " << p << " stages " << stages << " mode " << mode);
                    if (mode == 0) {
                        ref = d;
                        expect_close(unpermuted_rows(d, 1, dec.Q * dec.D), dec.reference(true), 2e-3f, 8e-3f,
                                     "decode");
                    } else {
                        CHECK(std::memcmp(d.data(), ref.data(), d.size() * 2) == 0);
                    }
                }
            }
        }
    }
    cuda::set_decode_attention_head_major(was_major);
    cuda::set_decode_attention_merge_staged(was_staged);
    cuda::set_decode_attention_merge_two_pass(was_two);
}

// The two-pass merge of the partials (default on) sums in another order than the left fold (after
// the bf16 rounding of the outputs the two rarely differ): both within tolerance of cpu::attention
// and of each other, and the two-pass bits independent of
// the grid's order, the staged switch and the launched grid width, at 2 .. 128 splits (batches of
// 30 o rows with two stages, 14 with one), full and sliding.
TEST_CASE("decode attention: the two-pass partial merge matches cpu::attention and the left fold") {
    const bool was_major = cuda::decode_attention_head_major(), was_staged = cuda::decode_attention_merge_staged();
    const bool was_two = cuda::decode_attention_merge_two_pass();
    CHECK(was_two);
    for (const uint32_t window : {0u, 128u}) {
        for (const uint32_t p : {300u, 4100u, 8256u, 16500u, 40000u, 70001u, 131000u}) {
            const uint32_t slots = window ? 128 : p + 1;
            AttnCase dec(p, 1, window, slots, 2929 + p);
            const auto ref = dec.reference(true);
            for (const int stages : {1, 2}) {
                const DecodeSplit split(true, stages, 256);
                INFO("window " << window << " position " << p << " stages " << stages);
                cuda::set_decode_attention_merge_two_pass(false);
                const auto fold = dec.run(true, cuda::kMaxDecodeSplits);
                cuda::set_decode_attention_merge_two_pass(true);
                std::vector<uint16_t> two;
                for (const int mode : {0, 1, 2, 3}) {
                    cuda::set_decode_attention_head_major(mode & 1);
                    cuda::set_decode_attention_merge_staged(mode & 2);
                    const auto d = dec.run(true, mode == 3 ? cuda::kMaxDecodeSplits + 40 : cuda::kMaxDecodeSplits);
                    INFO("mode " << mode);
                    if (mode == 0) two = d;
                    else CHECK(std::memcmp(d.data(), two.data(), d.size() * 2) == 0);
                }
                expect_close(unpermuted_rows(two, 1, dec.Q * dec.D), ref, 2e-3f, 8e-3f, "two-pass");
                expect_close(widen(two), widen(fold), 1e-5f, 8e-3f, "two-pass vs fold");
            }
        }
    }
    cuda::set_decode_attention_head_major(was_major);
    cuda::set_decode_attention_merge_staged(was_staged);
    cuda::set_decode_attention_merge_two_pass(was_two);
}

TEST_CASE("decode attention with fused RoPE is bit-identical to rope_qkv + attention_decode, cache included") {
    const Config c = test_config();
    const uint32_t Q = c.n_heads, G = c.n_kv_heads, D = c.head_dim, W = (Q + 2 * G) * D;
    const cpu::Rope rope = cpu::rope_init(c);
    Dev<float> inv(std::vector<float>(rope.inv_freq, rope.inv_freq + D / 2));
    for (uint32_t window : {0u, 128u}) {
        for (uint32_t p : {0u, 5u, 63u, 64u, 127u, 128u, 129u, 300u, 70000u}) {
            const uint32_t slots = window ? 128 : 70001;
            Rand r(500 + p + window);
            const auto qkv = r.floats(W, 2.0f);
            const auto kc0 = r.bf16s(size_t(slots) * G * D, 1.0f), vc0 = r.bf16s(size_t(slots) * G * D, 1.0f);
            const auto sinks = r.floats(Q, 3.0f);
            cuda::StepInfo si{int32_t(p), 1};
            Dev<cuda::StepInfo> step(std::vector<cuda::StepInfo>{si});
            Dev<float> qkvd(qkv), sd(sinks), q(size_t(Q) * D);
            const uint32_t splits = cuda::ceil_div(p + 1, cuda::kAttentionSplit) + 1;
            auto run = [&](bool fused, std::vector<uint16_t>* kc, std::vector<uint16_t>* vc) {
                Dev<uint16_t> kd(kc0), vd(vc0), out(size_t(Q) * D);
                Dev<float> partial(size_t(Q) * splits * cuda::attn_partial_floats(D));
                Dev<int> counters(G);
                REQUIRE(cudaMemset(counters.p, 0, G * sizeof(int)) == cudaSuccess);
                cuda::AttentionArgs a;
                a.k_cache = kd.p; a.v_cache = vd.p; a.slots = slots; a.window = window; a.sinks = sd.p;
                a.step = step.p; a.T = 1; a.Q = Q; a.G = G; a.D = D; a.out = out.p;
                if (fused) {
                    a.qkv = qkvd.p; a.inv_freq = inv.p; a.rope_scale = rope.scale;
                } else {
                    OK(cuda::rope_qkv(qkvd.p, step.p, inv.p, rope.scale, q.p, nullptr, nullptr, kd.p, vd.p, slots, 1, Q,
                                      G, D, nullptr));
                    a.q = q.p;
                }
                OK(cuda::attention_decode(a, partial.p, counters.p, splits, nullptr));
                *kc = kd.get();
                *vc = vd.get();
                return out.get();
            };
            for (const bool mma : {false, true}) {  // both decode splits
                const DecodeSplit split(mma);
                std::vector<uint16_t> kf, vf, ku, vu;
                const auto fused = run(true, &kf, &vf);
                const auto unfused = run(false, &ku, &vu);
                INFO("tensor-core split " << mma << " window " << window << " position " << p);
                CHECK(fused == unfused);
                CHECK(kf == ku);
                CHECK(vf == vu);
                CHECK(kf != kc0);  // the new key was written
            }
        }
    }
}

TEST_CASE("kv_commit writes the chunk's last min(T, slots) positions at slot = position % slots") {
    const uint32_t GD = 128, slots = 128, T = 300, pos0 = 50;
    std::vector<uint16_t> kn(size_t(T) * GD), vn(size_t(T) * GD);
    for (size_t i = 0; i < kn.size(); ++i) { kn[i] = uint16_t(i / GD); vn[i] = uint16_t(1000 + i / GD); }
    Dev<uint16_t> k(kn), v(vn), kc(size_t(slots) * GD), vc(size_t(slots) * GD);
    cuda::StepInfo si{int32_t(pos0), int32_t(T)};
    Dev<cuda::StepInfo> step(std::vector<cuda::StepInfo>{si});
    OK(cuda::kv_commit(k.p, v.p, kc.p, vc.p, slots, step.p, T, GD, nullptr));
    const auto gk = kc.get(), gv = vc.get();
    for (uint32_t p = pos0 + T - slots; p < pos0 + T; ++p) {
        CHECK(gk[size_t(p % slots) * GD] == uint16_t(p - pos0));
        CHECK(gv[size_t(p % slots) * GD + GD - 1] == uint16_t(1000 + p - pos0));
    }
}

TEST_CASE("argmax returns the lowest id among equal maxima") {
    Rand r(61);
    const uint32_t V = 201088;
    auto logits = r.floats(V, 3.0f);
    logits[150000] = 7.5f;
    logits[9001] = 7.5f;
    logits[200000] = 7.5f;
    Dev<float> ld(logits);
    Dev<int32_t> key(2);
    OK(cuda::argmax(ld.p, V, key.p, nullptr));
    const auto k = key.get();
    unsigned long long kk;
    std::memcpy(&kk, k.data(), 8);
    CHECK(cuda::decode_argmax(kk) == 9001);
    CHECK(cuda::decode_argmax(kk) == sample_logits(logits.data(), V, SamplingConfig{0.0f, 1.0f, 0}, 0.5));
}

// --- the whole backend -----------------------------------------------------------------------

struct Pair {
    std::unique_ptr<Checkpoint> ck;
    std::unique_ptr<Backend> cpu_b, gpu_b;
};
Pair& tiny_pair() {
    static Pair p = [] {
        Pair q;
        q.ck = load_tiny();
        OK(create_cpu_backend(*q.ck, &q.cpu_b));
        OK(create_cuda_backend(*q.ck, 0, {}, &q.gpu_b));
        return q;
    }();
    return p;
}

TEST_CASE("the CUDA backend matches the CPU backend on the tiny checkpoint at positions 0, 127, 128, 129, 299, 300") {
    Pair& p = tiny_pair();
    std::unique_ptr<BackendSession> cs, gs;
    OK(p.cpu_b->create_session(1024, 256, &cs));
    OK(p.gpu_b->create_session(1024, 256, &gs));
    const auto toks = prompt(301, 5);
    const std::vector<std::pair<uint32_t, uint32_t>> chunks{{0, 1}, {1, 127}, {128, 1}, {129, 1}, {130, 170}, {300, 1}};
    for (auto [pos, n] : chunks) {
        OK(cs->forward(toks.data() + pos, n, pos));
        OK(gs->forward(toks.data() + pos, n, pos));
        expect_logits_close(logits_of(gs.get()), logits_of(cs.get()), "position " + std::to_string(pos + n - 1));
    }
}

TEST_CASE("CUDA logits are bit-identical however the prompt is chunked (reused == fresh)") {
    Pair& p = tiny_pair();
    std::unique_ptr<BackendSession> a, b;
    OK(p.gpu_b->create_session(1024, 512, &a));
    OK(p.gpu_b->create_session(1024, 512, &b));
    const auto toks = prompt(400, 6);
    OK(a->forward(toks.data(), 399, 0));
    const auto la = logits_of(a.get());
    uint32_t pos = 0;
    for (uint32_t n : {1u, 126u, 1u, 1u, 2u, 200u}) {
        OK(b->forward(toks.data() + pos, n, pos));
        pos += n;
    }
    while (pos < 399) {
        OK(b->forward(toks.data() + pos, 1, pos));
        ++pos;
    }
    const auto lb = logits_of(b.get());
    CHECK(std::memcmp(la.data(), lb.data(), la.size() * 4) == 0);
    OK(a->forward(toks.data() + 399, 1, 399));
    OK(b->forward(toks.data() + 399, 1, 399));
    CHECK(std::memcmp(logits_of(a.get()).data(), logits_of(b.get()).data(), la.size() * 4) == 0);
}

TEST_CASE("decode past 2048 positions re-captures the graph with more attention splits, logits within bf16 of prefill") {
    Pair& p = tiny_pair();
    std::unique_ptr<BackendSession> a, b, c;
    OK(p.gpu_b->create_session(4096, 2100, &a));
    OK(p.gpu_b->create_session(4096, 2100, &b));
    OK(p.gpu_b->create_session(4096, 2100, &c));
    const auto toks = prompt(2080, 12);
    OK(a->forward(toks.data(), 2080, 0));
    OK(b->forward(toks.data(), 2030, 0));
    OK(c->forward(toks.data(), 2030, 0));
    for (uint32_t pos = 2030; pos < 2080; ++pos) OK(b->decode(toks[pos], pos));  // crosses 2048
    for (uint32_t pos = 2030; pos < 2080; ++pos) OK(c->decode(toks[pos], pos));
    const auto lb = logits_of(b.get());
    expect_logits_close(lb, logits_of(a.get()), "decode vs prefill at position 2079");
    // Decode kernels sum in an order of their own, but deterministically: run to run, same bits.
    CHECK(std::memcmp(lb.data(), logits_of(c.get()).data(), 201088 * 4) == 0);
}

TEST_CASE("greedy sampling on the GPU equals sample_logits at temperature 0") {
    Pair& p = tiny_pair();
    std::unique_ptr<BackendSession> s;
    OK(p.gpu_b->create_session(256, 64, &s));
    const auto toks = prompt(40, 7);
    OK(s->forward(toks.data(), 40, 0));
    int32_t tok = -1;
    OK(s->sample(SamplingConfig{0.0f, 1.0f, 0}, 0.25, &tok));
    const auto l = logits_of(s.get());
    CHECK(tok == sample_logits(l.data(), uint32_t(l.size()), SamplingConfig{0.0f, 1.0f, 0}, 0.25));
}

TEST_CASE("restoring the sliding snapshot gives the logits of a fresh session") {
    Pair& p = tiny_pair();
    std::unique_ptr<BackendSession> a, b;
    OK(p.gpu_b->create_session(1024, 256, &a));
    OK(p.gpu_b->create_session(1024, 256, &b));
    const auto toks = prompt(400, 8);
    auto other = prompt(100, 9);
    OK(a->forward(toks.data(), 250, 0));
    OK(a->save_sliding_snapshot());
    OK(a->forward(other.data(), 100, 250));  // diverging continuation, then rewind
    OK(a->restore_sliding_snapshot());
    OK(a->forward(toks.data() + 250, 150, 250));
    OK(b->forward(toks.data(), 250, 0));
    OK(b->forward(toks.data() + 250, 150, 250));
    CHECK(std::memcmp(logits_of(a.get()).data(), logits_of(b.get()).data(), 201088 * 4) == 0);
}

TEST_CASE("a session whose KV cache cannot fit fails with OUT_OF_MEMORY naming the bytes") {
    Pair& p = tiny_pair();
    std::unique_ptr<BackendSession> s;
    const gptoss_status st = p.gpu_b->create_session(4000000000u, 64, &s);
    CHECK(st == GPTOSS_ERR_OUT_OF_MEMORY);
    CHECK(std::string(gptoss_last_error()).find("bytes") != std::string::npos);
    CHECK(s == nullptr);
    std::unique_ptr<BackendSession> ok;
    OK(p.gpu_b->create_session(256, 16, &ok));  // the model is still usable
}

TEST_CASE("the caller's current device is the same after backend calls") {
    int before = -1, after = -2;
    REQUIRE(cudaGetDevice(&before) == cudaSuccess);
    Pair& p = tiny_pair();
    std::unique_ptr<BackendSession> s;
    OK(p.gpu_b->create_session(64, 8, &s));
    const auto toks = prompt(8, 10);
    OK(s->forward(toks.data(), 8, 0));
    REQUIRE(cudaGetDevice(&after) == cudaSuccess);
    CHECK(before == after);
}

TEST_CASE("gptoss_load on the GPU reports strictly increasing progress ending with one 1.0") {
    const char* dir = tiny_dir();
    std::vector<float> seen;
    auto fn = [](void* ud, float f) {
        static_cast<std::vector<float>*>(ud)->push_back(f);
        return true;
    };
    gptoss_model_params params = gptoss_model_default_params();
    params.device = 0;
    params.progress = fn;
    params.progress_user_data = &seen;
    gptoss_model* model = nullptr;
    REQUIRE(gptoss_load(dir, &params, &model) == GPTOSS_OK);
    gptoss_model_free(model);
    REQUIRE(seen.size() >= 2);
    for (size_t i = 1; i < seen.size(); ++i) CHECK(seen[i] > seen[i - 1]);
    CHECK(seen.back() == 1.0f);
    CHECK(std::count(seen.begin(), seen.end(), 1.0f) == 1);
}

// The engine's promise on the GPU (gptoss.cpp header): the K/V a decode step wrote is never
// reused, so a session continuing its own generated turn gives a fresh session's tokens, bit
// for bit, although decode and prefill kernels round differently.
TEST_CASE("through gptoss_generate on the GPU, a reused session re-prefills decoded positions and matches a fresh one") {
    const char* dir = tiny_dir();
    gptoss_model_params params = gptoss_model_default_params();
    params.device = 0;
    gptoss_model* model = nullptr;
    REQUIRE(gptoss_load(dir, &params, &model) == GPTOSS_OK);
    auto session = [&]() {
        gptoss_session* s = nullptr;
        REQUIRE(gptoss_session_create(model, nullptr, &s) == GPTOSS_OK);
        return s;
    };
    auto generate = [](gptoss_session* s, const std::vector<int32_t>& p, uint64_t seed, uint32_t n,
                       const gptoss_generate_result** r) {
        gptoss_sampling_params sp;
        gptoss_sampling_params_init(&sp, sizeof sp);
        sp.temperature = 0.8f;
        sp.seed = seed;
        sp.max_tokens = n;
        sp.n_stop_tokens = 0;
        REQUIRE(gptoss_generate(s, p.data(), p.size(), &sp, nullptr, nullptr, r) == GPTOSS_OK);
        return std::vector<int32_t>((*r)->tokens, (*r)->tokens + (*r)->n_tokens);
    };
    gptoss_session* reused = session();
    const gptoss_generate_result* r = nullptr;
    std::vector<int32_t> turn = prompt(300, 21);  // > 128: the sliding rings wrap
    size_t prefilled = 0;  // the previous turn's prompt: what the reused session may reuse
    for (int k = 0; k < 3; ++k) {
        INFO("turn " << k);
        const std::vector<int32_t> got = generate(reused, turn, 30 + k, 40, &r);
        CHECK(r->n_cached_tokens == prefilled);
        prefilled = turn.size();
        gptoss_session* fresh = session();
        CHECK(got == generate(fresh, turn, 30 + k, 40, &r));
        gptoss_session_free(fresh);
        // Next turn: this prompt + all generated tokens but the last (decode wrote their K/V)
        // + new text.
        turn.insert(turn.end(), got.begin(), got.end() - 1);
        const auto extra = prompt(7, 22 + k);
        turn.insert(turn.end(), extra.begin(), extra.end());
    }
    gptoss_session_free(reused);
    gptoss_model_free(model);
}

// A minimal JSON reader for the golden files (simdjson's header does not compile under nvcc).
struct Json {
    enum Kind { kNull, kNumber, kString, kArray, kObject } kind = kNull;
    double number = 0;
    std::string string;
    std::vector<Json> items;
    std::map<std::string, Json> fields;
    const Json& operator[](const char* key) const {
        const auto it = fields.find(key);
        REQUIRE_MESSAGE(it != fields.end(), "golden: field " << key << " missing");
        return it->second;
    }
    std::vector<int32_t> ints() const {
        std::vector<int32_t> v;
        for (const Json& j : items) v.push_back(int32_t(j.number));
        return v;
    }
    std::vector<double> reals() const {
        std::vector<double> v;
        for (const Json& j : items) v.push_back(j.number);
        return v;
    }
};
struct JsonParser {
    const std::string& s;
    size_t i = 0;
    void ws() { while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i; }
    Json parse() {
        ws();
        REQUIRE(i < s.size());
        Json j;
        const char c = s[i];
        if (c == '{') {
            j.kind = Json::kObject;
            ++i;
            ws();
            if (s[i] == '}') { ++i; return j; }
            for (;;) {
                ws();
                const std::string key = parse().string;
                ws();
                REQUIRE(s[i] == ':');
                ++i;
                j.fields[key] = parse();
                ws();
                if (s[i] == ',') { ++i; continue; }
                REQUIRE(s[i] == '}');
                ++i;
                return j;
            }
        }
        if (c == '[') {
            j.kind = Json::kArray;
            ++i;
            ws();
            if (s[i] == ']') { ++i; return j; }
            for (;;) {
                j.items.push_back(parse());
                ws();
                if (s[i] == ',') { ++i; continue; }
                REQUIRE(s[i] == ']');
                ++i;
                return j;
            }
        }
        if (c == '"') {
            j.kind = Json::kString;
            for (++i; s[i] != '"'; ++i) {
                if (s[i] == '\\') ++i;  // escapes kept verbatim: only keys and plain strings are used
                j.string += s[i];
            }
            ++i;
            return j;
        }
        if (s.compare(i, 4, "true") == 0 || s.compare(i, 4, "null") == 0) { i += 4; return j; }
        if (s.compare(i, 5, "false") == 0) { i += 5; return j; }
        j.kind = Json::kNumber;
        char* end = nullptr;
        j.number = std::strtod(s.c_str() + i, &end);
        REQUIRE(end != s.c_str() + i);
        i = size_t(end - s.c_str());
        return j;
    }
};

// The transformers oracle (tests/data/golden/tiny-seed1.json, tools/golden.py): logits at the
// recorded positions within a bf16-sized tolerance, and the oracle's greedy continuation,
// teacher-forced through decode steps, wherever its top-2 gap exceeds twice that tolerance.
TEST_CASE("the tiny checkpoint on the GPU reproduces the transformers goldens (logits and decisive greedy tokens)") {
    constexpr double kTol = 1e-2;  // times max|logit| at that position (measured: 3.3e-3 on the H200)
    const char* src = std::getenv("GPTOSS_SOURCE_DIR");
    REQUIRE_MESSAGE(src != nullptr, "GPTOSS_SOURCE_DIR is not set (run through ctest)");
    const std::string path = std::string(src) + "/tests/data/golden/tiny-seed1.json";
    std::ifstream in(path);
    REQUIRE_MESSAGE(in.good(), "cannot read " << path);
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string text = buf.str();
    const Json root = JsonParser{text}.parse();
    Pair& pr = tiny_pair();
    size_t n_positions = 0, n_greedy = 0;
    double worst = 0;
    for (const Json& p : root["prompts"].items) {
        const std::vector<int32_t> tokens = p["tokens"].ints();
        std::unique_ptr<BackendSession> s;
        OK(pr.gpu_b->create_session(1024, 64, &s));
        uint32_t done = 0;
        for (const Json& q : p["positions"].items) {
            const uint32_t pos = uint32_t(q["pos"].number);
            const double max_abs = q["max_abs"].number;
            while (done <= pos) {
                const uint32_t n = std::min(64u, pos + 1 - done);
                OK(s->forward(tokens.data() + done, n, done));
                done += n;
            }
            const auto logits = logits_of(s.get());
            const auto ids = q["ids"].ints();
            const auto want = q["logits"].reals();
            REQUIRE(ids.size() == want.size());
            double err = 0;
            for (size_t i = 0; i < ids.size(); ++i) err = std::max(err, std::fabs(double(logits[size_t(ids[i])]) - want[i]));
            INFO("position " << pos << ": max |delta logit| " << err << ", max|logit| " << max_abs);
            CHECK(err <= kTol * max_abs);
            worst = std::max(worst, err / max_abs);
            ++n_positions;
        }
        // Teacher-forced greedy continuation from the end of the prompt, one decode step each.
        const Json& greedy = p["greedy"];
        const auto want = greedy["tokens"].ints();
        const auto gaps = greedy["top2_gap"].reals();
        const auto maxes = greedy["max_abs"].reals();
        REQUIRE(gaps.size() == want.size());
        if (done < tokens.size()) OK(s->forward(tokens.data() + done, uint32_t(tokens.size()) - done, done));
        uint32_t pos = uint32_t(tokens.size());
        for (size_t i = 0; i < want.size(); ++i) {
            if (gaps[i] > 2 * kTol * maxes[i]) {
                int32_t tok = -1;
                OK(s->sample(SamplingConfig{0.0f, 1.0f, 0}, 0.0, &tok));
                INFO("greedy step " << i << ": gap " << gaps[i] << ", max|logit| " << maxes[i]);
                CHECK(tok == want[i]);
                ++n_greedy;
            }
            OK(s->decode(want[i], pos++));
        }
    }
    MESSAGE("goldens: " << n_positions << " positions, worst max|delta| / max|logit| = " << worst << "; "
                        << n_greedy << " decisive greedy steps compared");
    CHECK(n_positions >= 15);
    CHECK(n_greedy >= 3);
}

TEST_CASE("a 20b-shaped checkpoint cut to 2 layers gives the CPU backend's logits ($GPTOSS_20B_2L_MODEL)") {
    const char* dir = std::getenv("GPTOSS_20B_2L_MODEL");
    if (!dir) {
        MESSAGE("GPTOSS_20B_2L_MODEL not set: skipping the 20b-shaped comparison (tools/device-check.sh sets it)");
        return;
    }
    // Router biases that keep the top-4 away from near-ties: the comparison measures the kernels.
    const BiasedCheckpoint biased = load_biased_checkpoint(dir);
    const std::unique_ptr<Checkpoint>& ck = biased.ck;
    std::unique_ptr<Backend> cb, gb;
    OK(create_cpu_backend(*ck, &cb));
    OK(create_cuda_backend(*ck, 0, {}, &gb));
    std::unique_ptr<BackendSession> cs, gs;
    OK(cb->create_session(512, 256, &cs));
    OK(gb->create_session(512, 256, &gs));
    const auto toks = prompt(200, 11);
    for (auto [pos, n] : std::vector<std::pair<uint32_t, uint32_t>>{{0, 130}, {130, 1}, {131, 69}}) {
        OK(cs->forward(toks.data() + pos, n, pos));
        OK(gs->forward(toks.data() + pos, n, pos));
        expect_logits_close(logits_of(gs.get()), logits_of(cs.get()), "20b-2L position " + std::to_string(pos + n - 1));
    }
}

// --- sampling on the GPU (cuda::sample) vs sample_logits -----------------------------------

// The tokens sample_logits could return if a decision within rounding of a boundary went the
// other way, recomputing the host's sums in the host's order. The host's sequential sum of k
// terms is within k·2^-53 (relative) of the exact sum, the GPU's tree sum far closer, and both
// exps within an ulp, so a decision is ambiguous when its cumulative sum is within
// eps(k) = 1e-12 + k·2^-52 (relative) of the threshold: the top_p cut where
// |Σ p/total − top_p| <= eps(k), the walk where |u·kept − running sum| <= eps(keep)·kept.
std::vector<int32_t> near_boundary_tokens(const std::vector<float>& l, const SamplingConfig& c, double u) {
    const uint32_t V = uint32_t(l.size());
    auto eps = [](uint32_t k) { return 1e-12 + double(k) * 0x1.0p-52; };
    const bool use_top_k = c.top_k > 0 && c.top_k < V, use_top_p = c.top_p < 1.0f;
    std::vector<uint32_t> ids(V);
    std::iota(ids.begin(), ids.end(), 0u);
    std::stable_sort(ids.begin(), ids.end(), [&](uint32_t a, uint32_t b) { return l[a] > l[b]; });
    const uint32_t n = use_top_k ? c.top_k : V;
    ids.resize(n);
    std::vector<double> p(n);
    double total = 0.0;
    const double inv_t = 1.0 / double(c.temperature);
    for (uint32_t i = 0; i < n; ++i) total += (p[i] = std::exp((double(l[ids[i]]) - l[ids[0]]) * inv_t));
    std::vector<uint32_t> keeps;
    if (use_top_p) {
        double mass = 0.0, prev = 0.0;
        for (uint32_t k = 1; k <= n; ++k) {
            prev = mass;
            mass += p[k - 1] / total;
            if (mass >= double(c.top_p) - eps(k) && (k == 1 || prev < double(c.top_p) + eps(k - 1))) keeps.push_back(k);
        }
        if (mass < double(c.top_p) + eps(n)) keeps.push_back(n);
    } else {
        keeps.push_back(n);
    }
    std::vector<int32_t> out;
    for (uint32_t keep : keeps) {
        std::vector<std::pair<uint32_t, double>> kept(keep);
        for (uint32_t i = 0; i < keep; ++i) kept[i] = {ids[i], p[i]};
        std::sort(kept.begin(), kept.end());
        double sum = 0.0;
        for (auto& [id, pi] : kept) sum += pi;
        const double target = u * sum;
        double acc = 0.0;
        for (auto& [id, pi] : kept) {
            const double before = acc;
            acc += pi;
            if (before <= target + eps(keep) * sum && acc > target - eps(keep) * sum) out.push_back(int32_t(id));
        }
    }
    return out;
}

// Runs sample_logits for every u on the host, in parallel (it is pure).
std::vector<int32_t> host_tokens(const std::vector<float>& l, const SamplingConfig& c, const std::vector<double>& us) {
    std::vector<int32_t> out(us.size());
    const size_t n_threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (size_t t = 0; t < n_threads; ++t)
        pool.emplace_back([&, t] {
            for (size_t i = t; i < us.size(); i += n_threads) out[i] = sample_logits(l.data(), uint32_t(l.size()), c, us[i]);
        });
    for (auto& th : pool) th.join();
    return out;
}

struct SampleStats {
    size_t calls = 0, exact = 0, boundary = 0, bad = 0;
    std::string first_bad;
};

// Compares GPU tokens with sample_logits; a mismatch counts as `boundary` only when
// near_boundary_tokens explains it.
void compare_tokens(const std::vector<float>& l, const SamplingConfig& c, const std::vector<double>& us,
                    const std::vector<int32_t>& gpu, const std::string& what, SampleStats* st) {
    const auto host = host_tokens(l, c, us);
    for (size_t i = 0; i < us.size(); ++i) {
        ++st->calls;
        if (gpu[i] == host[i]) {
            ++st->exact;
            continue;
        }
        const auto ok = near_boundary_tokens(l, c, us[i]);
        if (std::find(ok.begin(), ok.end(), gpu[i]) != ok.end()) {
            ++st->boundary;
            continue;
        }
        if (st->bad++ < 5) {
            char buf[256];
            std::snprintf(buf, sizeof buf, "  %s T=%g top_k=%u top_p=%g u=%.17g: gpu %d host %d\n", what.c_str(),
                          double(c.temperature), c.top_k, double(c.top_p), us[i], gpu[i], host[i]);
            st->first_bad += buf;
        }
    }
}

// GPTOSS_TEST_QUICK=1 (the compute-sanitizer runs, where every launch is ~100× slower) keeps
// one random u and a few configs that still reach every sampling path.
bool quick_mode() {
    const char* q = std::getenv("GPTOSS_TEST_QUICK");
    return q && *q && *q != '0';
}

std::vector<double> sample_us(uint64_t seed, size_t n_random) {
    std::vector<double> us = {0.0, 0.5, 0.999999};
    Rng rng(seed);
    if (quick_mode()) n_random = std::min<size_t>(n_random, 1);
    for (size_t i = 0; i < n_random; ++i) us.push_back(rng.next_double());
    return us;
}

std::vector<SamplingConfig> sample_configs(uint32_t V) {
    std::vector<SamplingConfig> cs;
    if (quick_mode()) {
        for (uint32_t k : {0u, 40u, V + 5})
            for (float p : {1.0f, 0.9f}) cs.push_back(SamplingConfig{1.0f, p, k});
        return cs;
    }
    for (float t : {0.3f, 1.0f, 2.5f})
        for (uint32_t k : {0u, 1u, 2u, 40u, V - 1, V, V + 5})
            for (float p : {1.0f, 0.999f, 0.9f, 0.5f, 1e-6f}) cs.push_back(SamplingConfig{t, p, k});
    return cs;
}

// Logit distributions: peaked (one far above), flat (all equal), signed zeros (+0 and −0 must
// tie), realistic (N(0, 3)-like, bf16-rounded so that many values repeat), very negative
// (a third at −1e30, some near −80).
std::vector<float> sample_logits_of(const std::string& kind, uint32_t V, uint64_t seed) {
    Rand r(seed);
    std::vector<float> l(V);
    if (kind == "peaked") {
        l = r.floats(V, 1.0f);
        l[r.below(V)] = 60.0f;
    } else if (kind == "flat") {
        std::fill(l.begin(), l.end(), 1.5f);
    } else if (kind == "zeros") {
        for (uint32_t i = 0; i < V; ++i) l[i] = r.below(2) ? 0.0f : -0.0f;
        if (V > 3) l[V / 3] = -1.0f;
    } else {
        for (float& x : l) {
            double g = 0;  // Irwin-Hall(12) − 6 ≈ N(0, 1)
            for (int k = 0; k < 12; ++k) g += r.rng.next_double();
            x = round_bf16(float((g - 6.0) * 3.0));
        }
        if (kind == "negative")
            for (uint32_t i = 0; i < V; ++i) {
                const uint32_t m = r.below(8);
                if (m < 3) l[i] = -1e30f;
                else if (m == 3) l[i] = -80.0f - float(r.below(4));
            }
    }
    return l;
}

struct GpuSampler {
    uint32_t V;
    size_t bytes = 0;
    std::unique_ptr<Dev<char>> scratch;
    Dev<int32_t> token{1};
    explicit GpuSampler(uint32_t v) : V(v) {
        OK(cuda::sample_scratch_bytes(V, &bytes));
        scratch = std::make_unique<Dev<char>>(bytes);
    }
    int32_t run(const float* logits_dev, const SamplingConfig& c, double u) {
        OK(cuda::sample(logits_dev, V, c, u, scratch->p, bytes, token.p, nullptr));
        return token.get()[0];
    }
};

TEST_CASE("cuda::sample equals sample_logits for every temperature, top_k and top_p on V = 1, 2, 1000, 201088") {
    SampleStats st;
    for (uint32_t V : {1u, 2u, 1000u, 201088u}) {
        GpuSampler gs(V);
        const auto us = sample_us(V, V == 201088 ? 8 : 20);
        const auto configs = sample_configs(V);
        for (const char* kind : {"peaked", "flat", "zeros", "realistic", "negative"}) {
            const auto l = sample_logits_of(kind, V, 71 + V);
            Dev<float> ld(l);
            for (const SamplingConfig& c : configs) {
                std::vector<int32_t> gpu(us.size());
                for (size_t i = 0; i < us.size(); ++i) gpu[i] = gs.run(ld.p, c, us[i]);
                compare_tokens(l, c, us, gpu, std::string(kind) + " V=" + std::to_string(V), &st);
            }
            // Greedy through the same launcher, and the same call twice gives the same token.
            CHECK(gs.run(ld.p, SamplingConfig{0.0f, 1.0f, 0}, 0.5) == sample_logits(l.data(), V, {0.0f, 1.0f, 0}, 0.5));
            CHECK(gs.run(ld.p, SamplingConfig{-1.0f, 0.5f, 3}, 0.5) == sample_logits(l.data(), V, {-1.0f, 0.5f, 3}, 0.5));
            const SamplingConfig c{0.7f, 0.9f, 40};
            CHECK(gs.run(ld.p, c, 0.123) == gs.run(ld.p, c, 0.123));
        }
    }
    MESSAGE("cuda::sample: " << st.calls << " calls, " << st.exact << " equal to sample_logits, " << st.boundary
                             << " explained by a cumulative sum within 1e-12 of the boundary, " << st.bad << " wrong");
    INFO(st.first_bad);
    CHECK(st.bad == 0);
}

TEST_CASE("cuda::sample rejects a non-finite temperature and u outside [0, 1)") {
    GpuSampler gs(1000);
    Dev<float> ld(sample_logits_of("realistic", 1000, 5));
    Dev<int32_t> tok(1);
    CHECK(cuda::sample(ld.p, 1000, SamplingConfig{NAN, 1.0f, 0}, 0.5, gs.scratch->p, gs.bytes, tok.p, nullptr) ==
          GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(cuda::sample(ld.p, 1000, SamplingConfig{INFINITY, 1.0f, 0}, 0.5, gs.scratch->p, gs.bytes, tok.p, nullptr) ==
          GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(cuda::sample(ld.p, 1000, SamplingConfig{1.0f, 1.0f, 0}, 1.0, gs.scratch->p, gs.bytes, tok.p, nullptr) ==
          GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(cuda::sample(ld.p, 1000, SamplingConfig{1.0f, 1.0f, 0}, 0.5, gs.scratch->p, 16, tok.p, nullptr) ==
          GPTOSS_ERR_INTERNAL);
}

TEST_CASE("the CUDA session samples on the GPU with sample_logits' definition, reproducibly") {
    Pair& p = tiny_pair();
    std::unique_ptr<BackendSession> s;
    OK(p.gpu_b->create_session(256, 64, &s));
    const auto toks = prompt(40, 13);
    OK(s->forward(toks.data(), 40, 0));
    const auto l = logits_of(s.get());
    const auto us = sample_us(17, 5);
    SampleStats st;
    for (const SamplingConfig& c : sample_configs(uint32_t(l.size()))) {
        std::vector<int32_t> gpu(us.size());
        for (size_t i = 0; i < us.size(); ++i) {
            OK(s->sample(c, us[i], &gpu[i]));
            int32_t again = -1;
            OK(s->sample(c, us[i], &again));
            CHECK(again == gpu[i]);
        }
        compare_tokens(l, c, us, gpu, "tiny session", &st);
    }
    // Outside the engine's domain (read_params rejects these) the session uses the host path.
    for (const SamplingConfig& c : {SamplingConfig{NAN, 1.0f, 0}, SamplingConfig{INFINITY, 0.9f, 40}}) {
        int32_t tok = -1;
        OK(s->sample(c, 0.5, &tok));
        CHECK(tok == sample_logits(l.data(), uint32_t(l.size()), c, 0.5));
    }
    MESSAGE("CUDA session sample: " << st.calls << " calls, " << st.exact << " equal to sample_logits, " << st.boundary
                                    << " explained by a boundary within 1e-12, " << st.bad << " wrong");
    INFO(st.first_bad);
    CHECK(st.bad == 0);
}

// Logits in a few integer values, so that the k-th logit and the top_p cut fall inside groups
// of equal logits (the zero group mixes +0 and −0, which must tie).
std::vector<float> tied_logits(uint32_t V, uint64_t seed) {
    Rand r(seed);
    std::vector<float> l(V);
    for (float& x : l) {
        x = float(int(r.below(7)) - 3);
        if (x == 0.0f && r.below(2)) x = -0.0f;
    }
    return l;
}

TEST_CASE("cuda::sample cuts ties at the k-th logit and at the top_p boundary by id, −0 tying +0") {
    SampleStats st;
    for (uint32_t V : {5000u, 201088u}) {
        if (quick_mode() && V != 5000u) continue;
        GpuSampler gs(V);
        const auto us = sample_us(V + 1, 12);
        const auto l = tied_logits(V, 3 + V);
        Dev<float> ld(l);
        uint32_t n_pos = 0;  // ids with logit > 0, then the zero group
        for (float x : l) n_pos += x > 0.0f;
        for (float t : {0.5f, 1.0f, 3.0f}) {
            if (quick_mode() && t != 1.0f) continue;
            for (uint32_t k : {0u, 1u, 17u, n_pos - 1, n_pos + 1, n_pos + 250, V / 2})
                for (float p : {1.0f, 0.7f, 0.0f, -1.0f}) {
                    const SamplingConfig c{t, p, k};
                    std::vector<int32_t> gpu(us.size());
                    for (size_t i = 0; i < us.size(); ++i) gpu[i] = gs.run(ld.p, c, us[i]);
                    compare_tokens(l, c, us, gpu, "tied V=" + std::to_string(V), &st);
                }
        }
    }
    MESSAGE("cuda::sample on ties: " << st.calls << " calls, " << st.exact << " equal to sample_logits, "
                                     << st.boundary << " explained by a boundary within 1e-12, " << st.bad << " wrong");
    INFO(st.first_bad);
    CHECK(st.bad == 0);
}

TEST_CASE("cuda::sample beyond one cooperative grid (V = 600000) takes the full sort, same definition") {
    const uint32_t V = 600000;
    GpuSampler gs(V);
    const auto us = sample_us(9, 4);
    SampleStats st;
    for (const char* kind : {"realistic", "flat"}) {
        const auto l = sample_logits_of(kind, V, 5);
        Dev<float> ld(l);
        for (const SamplingConfig& c : {SamplingConfig{1.0f, 1.0f, 0}, SamplingConfig{0.7f, 1.0f, 40},
                                        SamplingConfig{1.0f, 0.9f, 0}, SamplingConfig{2.5f, 0.5f, 1000}}) {
            std::vector<int32_t> gpu(us.size());
            for (size_t i = 0; i < us.size(); ++i) gpu[i] = gs.run(ld.p, c, us[i]);
            compare_tokens(l, c, us, gpu, std::string(kind) + " V=600000", &st);
        }
    }
    INFO(st.first_bad);
    CHECK(st.bad == 0);
}

}  // namespace

int main(int argc, char** argv) { return run_kernel_tests(argc, argv, "the CUDA kernel tests (test-kernels)"); }
