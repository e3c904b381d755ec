// tests/test-kernels-fold.cu - the decode router folded into the O projection (cuda/router_fold.cuh,
// cuda/router_fold.cu; issue 12): router_fold_pack's layout against the router's row-major weights;
// gemm_decode of O with the fold (the default bf16 variant, fixed-K and any-K) stores the same
// residual rows as without it, bit for bit, and routes as the oracle says: the logits against a
// double-precision CPU computation of inv · W_r · (x ⊙ γ) + b from the stored row (tight: the fold
// sums fp32 products of exact values), the experts and weights against cpu::router_topk of those
// logits and against router_decode on the same row (random logits: far from near-ties), xn within
// one bf16 step of router_decode's (inv may differ in its last bit: another order of Σ x²); exact
// ties (three equal router rows) pick the lower experts; four launches (the CTAs' arrival by fences,
// then by acquire-release atomics) give the same bits and the counter is re-armed; bad arguments get GPTOSS_ERR_INTERNAL naming the fold. Without a CUDA device
// the tests are skipped (exit 77).
#include "tests/kernel-test-util.cuh"

#include <functional>

TEST_CASE("router_fold_pack lays the router's fragments out slab by slab as [H/16][E][16]") {
    for (const auto& shape : {std::pair<uint32_t, uint32_t>{32, 2880}, {128, 2880}, {40, 128}, {8, 64}}) {
        const uint32_t E = shape.first, H = shape.second;
        Rand r(11 + E + H);
        const auto W = r.bf16s(size_t(E) * H, 1.0f);
        const std::vector<uint16_t> b(E, 0);
        DenseW dw(W, b, E, H);
        Dev<uint16_t> out(cuda::router_fold_bytes(E, H) / 2);
        OK(cuda::router_fold_pack(dw.w.w, E, H, out.p, nullptr));
        const auto got = out.get();
        REQUIRE(got.size() == size_t(H / 16) * E * 16);
        size_t bad = 0;
        for (uint32_t s = 0; s < H / 16; ++s)
            for (uint32_t e = 0; e < E; ++e)
                for (uint32_t q = 0; q < 16; ++q)
                    bad += got[(size_t(s) * E + e) * 16 + q] != W[size_t(e) * H + 16 * s + q];
        INFO("E " << E << " H " << H);
        CHECK(bad == 0);
    }
    CHECK(cuda::router_fold_pack(nullptr, 32, 100, nullptr, nullptr) == GPTOSS_ERR_INTERNAL);
}

TEST_CASE("gemm_decode with the router fold: O's rows unchanged, the route of inv · W_r · (x ⊙ γ) + b") {
    struct S { uint32_t E, K, H, QD; bool ties; };
    Dev<int> counter(1), counter_ref(1);
    REQUIRE(cudaMemset(counter.p, 0, sizeof(int)) == cudaSuccess);
    REQUIRE(cudaMemset(counter_ref.p, 0, sizeof(int)) == cudaSuccess);
    const float eps = 1e-5f;
    for (S sh : {S{32, 4, 2880, 4096, false}, S{128, 4, 2880, 4096, false}, S{8, 2, 64, 128, false},
                 S{40, 4, 128, 256, false}, S{32, 4, 2880, 4096, true}}) {
        const uint32_t E = sh.E, K = sh.K, H = sh.H, QD = sh.QD;
        INFO("E " << E << " top-" << K << " H " << H << (sh.ties ? " with ties" : ""));
        REQUIRE(cuda::router_fold_supported(E, K, H));
        Rand r(300 + E + H + sh.ties);
        // O: [H, QD] bf16 + bias; the attention row; the residual before O; γ; the router.
        DenseW ow(r.bf16s(size_t(H) * QD, 0.03f), r.bf16s(H, 0.1f), H, QD);
        Dev<uint16_t> attn(permuted_rows(r.floats_bf16(QD, 1.0f), 1, QD));
        const auto x0 = r.floats(H, 2.0f);
        const auto gamma = widen(r.bf16s(H, 1.5f));
        const auto [W, b] = router_weights(r, E, H, sh.ties);
        DenseW rw(W, b, E, H);
        Dev<uint16_t> fold_w(cuda::router_fold_bytes(E, H) / 2);
        OK(cuda::router_fold_pack(rw.w.w, E, H, fold_w.p, nullptr));
        Dev<float> gd(gamma);
        const uint32_t max_tiles = cuda::route_max_tiles(1, E, K, 8);

        // Without the fold: O, then router_decode (4 warps, counter) on the stored row.
        Dev<float> x_ref(x0);
        const cuda::DecodeGemv v = cuda::decode_tuning().bf16;
        OK(cuda::gemm_decode(ow.w, attn.p, nullptr, false, cuda::Epilogue::kAdd, x_ref.p, nullptr, H, 0, v, nullptr));
        Dev<uint16_t> xn_ref(H);
        Dev<float> logits_ref(E), w_ref(K);
        Dev<int32_t> e_ref(K), t_ref(1 + 3 * size_t(max_tiles)), p_ref(K);
        cuda::RouterDecodeArgs ra;
        ra.x = x_ref.p; ra.norm_w = gd.p; ra.eps = eps; ra.router = rw.w; ra.K = K; ra.xn = xn_ref.p;
        ra.logits = logits_ref.p; ra.counter = counter_ref.p; ra.experts = e_ref.p; ra.weights = w_ref.p;
        ra.tiles = t_ref.p; ra.pairs = p_ref.p; ra.cluster = 0; ra.warps = 4;
        OK(cuda::router_decode(ra, nullptr));
        const auto xr = x_ref.get();

        // The oracle: double precision from the stored row.
        double ss = 0;
        for (float xv : xr) ss += double(xv) * xv;
        const double inv = 1.0 / std::sqrt(ss / H + eps);
        std::vector<float> oracle(E);
        for (uint32_t e = 0; e < E; ++e) {
            double u = 0;
            for (uint32_t k = 0; k < H; ++k) u += double(bf16_to_f32(W[size_t(e) * H + k])) * xr[k] * gamma[k];
            oracle[e] = float(u * inv + bf16_to_f32(b[e]));
        }
        // router_decode's logits come from the bf16 xn (~1e-2 apart at most here): its experts are
        // the fold's only where the K-th and (K+1)-th logits are further apart than that.
        std::vector<float> sorted(oracle);
        std::sort(sorted.begin(), sorted.end(), std::greater<float>());
        const bool clear_margin = sorted[K - 1] - sorted[K] > 0.05f;

        for (bool fixed_k : {true, false}) {
            cuda::DecodeGemv fv = v;
            fv.fixed_k = fixed_k;
            INFO("fixed_k " << fixed_k);
            REQUIRE(cuda::decode_gemv_fold_usable(fv, QD));
            std::vector<float> first_logits;
            for (int round = 0; round < 4; ++round) {  // the arrival by fences, then by acq_rel atomics
                Dev<float> x(x0), logits(E), wt(K), partial(size_t(H / 16) * (E + 1));
                Dev<uint16_t> xn(H);
                Dev<int32_t> ex(K), ti(1 + 3 * size_t(max_tiles)), pr(K);
                cuda::RouterFoldArgs f;
                f.w = fold_w.p; f.bias = rw.bias.p; f.norm_w = gd.p; f.eps = eps; f.E = E; f.K = K;
                f.partial = partial.p; f.counter = counter.p; f.xn = xn.p; f.logits = logits.p; f.experts = ex.p;
                f.weights = wt.p; f.tiles = ti.p; f.pairs = pr.p;
                f.acq_rel = round / 2;
                OK(cuda::gemm_decode(ow.w, attn.p, nullptr, false, cuda::Epilogue::kAdd, x.p, nullptr, H, 0, fv, nullptr,
                                     &f));
                CHECK(x.get() == xr);  // the fold only reads the rows O stores
                const auto gl = logits.get();
                float worst = 0.0f;
                for (uint32_t e = 0; e < E; ++e)
                    worst = std::max(worst, std::fabs(gl[e] - oracle[e]) / (1.0f + std::fabs(oracle[e])));
                CHECK(worst < 1e-5f);
                // The route: cpu::router_topk of these logits, and router_decode's (no near-ties here).
                std::vector<int32_t> ce(K);
                std::vector<float> cw(K);
                cpu::router_topk(gl.data(), 1, E, K, ce.data(), cw.data());
                const auto ge = ex.get();
                const auto gw = wt.get();
                CHECK(ge == ce);
                const auto rw_ref = w_ref.get();
                for (uint32_t k = 0; k < K; ++k) CHECK(std::fabs(gw[k] - cw[k]) < 1e-5f);
                // The one-token route of these experts: K single-pair tiles in increasing expert order.
                std::vector<int32_t> order(ge);
                std::sort(order.begin(), order.end());
                const auto gt = ti.get(), gp = pr.get();
                CHECK(gt[0] == int32_t(K));
                for (uint32_t k = 0; k < K; ++k) {
                    CHECK(gt[1 + 3 * k] == order[k]);
                    CHECK(gt[2 + 3 * k] == int32_t(k));
                    CHECK(gt[3 + 3 * k] == 1);
                    CHECK(ge[size_t(gp[k])] == order[k]);
                }
                if (clear_margin) {
                    CHECK(ge == e_ref.get());
                    for (uint32_t k = 0; k < K; ++k)
                        CHECK(std::fabs(gw[k] - rw_ref[k]) < 2e-2f);  // router_decode rounds xn to bf16 first
                    const auto rt = t_ref.get();
                    CHECK(std::equal(gt.begin(), gt.begin() + 1 + 3 * K, rt.begin()));
                    CHECK(pr.get() == p_ref.get());
                }
                // xn: router_decode's expression with an inv of another Σ x² order.
                const auto gx = xn.get(), rx = xn_ref.get();
                size_t off = 0, same = 0;
                for (uint32_t i = 0; i < H; ++i) {
                    const int d = int(gx[i]) - int(rx[i]);
                    off += d < -1 || d > 1;
                    same += d == 0;
                }
                CHECK(off == 0);
                CHECK(same * 10 >= size_t(H) * 9);
                int armed = -1;
                REQUIRE(cudaMemcpy(&armed, counter.p, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
                CHECK(armed == 0);
                if (round == 0) first_logits = gl;
                else CHECK(std::memcmp(first_logits.data(), gl.data(), E * 4) == 0);  // deterministic
                if (sh.ties) {
                    CHECK(gl[3] == gl[9]);
                    CHECK(gl[9] == gl[20]);
                    CHECK(ge[0] == 3);
                    CHECK(ge[1] == 9);
                    CHECK(ge[2] == 20);
                }
            }
        }
    }
}

TEST_CASE("gemm_decode rejects the router fold where it does not apply, naming it") {
    cuda::GemmWeights w;
    w.N = 64; w.K = 64;
    Dev<float> out(64);
    Dev<int> counter(1);
    cuda::RouterFoldArgs f;  // no buffers
    f.E = 32; f.K = 4;
    const cuda::DecodeGemv v = cuda::decode_tuning().bf16;
    CHECK(cuda::gemm_decode(w, nullptr, nullptr, false, cuda::Epilogue::kAdd, out.p, nullptr, 64, 0, v, nullptr, &f) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("router fold") != std::string::npos);
    CHECK(cuda::gemm_decode(w, nullptr, nullptr, false, cuda::Epilogue::kStore, out.p, nullptr, 64, 0, v, nullptr, &f) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(!cuda::router_fold_supported(129, 4, 2880));
    CHECK(!cuda::router_fold_supported(32, 9, 2880));
    CHECK(!cuda::router_fold_supported(32, 4, 2000));
    CHECK(cuda::router_fold_supported(128, 4, 2880));
    CHECK(!cuda::decode_gemv_fold_usable(cuda::DecodeGemv{4, 4, false}, 4096));
}

int main(int argc, char** argv) { return run_kernel_tests(argc, argv, "the router fold tests (test-kernels-fold)"); }
