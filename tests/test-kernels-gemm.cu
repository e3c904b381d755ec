// tests/test-kernels-gemm.cu - the prefill GEMM (cuda::gemm_prefill, cuda/gemm_prefill.cu)
// (all three kernels: mma.sync, and on sm_90a the register-A wgmma and gemm_prefill_sm90.cu's)
// against the CPU reference ops (cpu::matmul_bf16, cpu::matmul_mxfp4, cpu::swiglu) on seeded
// random inputs: dense bf16 with N not a multiple of the 128-row tile, 1 to 1030 tokens (both
// token tile widths), K of one chunk and of many; grouped MXFP4 experts with 0, 1, many and
// uneven pair counts, tiles of 64 and 128 pairs (and 256 on the warp-specialized kernel), every
// epilogue (store, residual add, SwiGLU with its clamps). Bit-identity promises: a token's output
// is the same bits whatever the chunk it is in, the tile width and the order of the pairs inside
// an expert's group. Tolerances as tests/test-kernels.cu (fp32 accumulation in another order
// than the CPU's). Without a CUDA device the tests are skipped with a message (exit 77).
#include "tests/kernel-test-util.cuh"

#include <cstdlib>
#include <numeric>
#include <string>

namespace {

// A route as router_route builds it, on the host: pairs grouped by expert (in increasing expert
// order; inside a group in the order given, or reversed), cut into tiles of tile_tokens
// (tile_tokens 288 / 96: tiles of 256 / 64 whose last one per expert takes up to 32 more, as
// router_route with tile_extra 32).
struct HostRoute {
    Dev<int32_t> tiles, pairs;
    cuda::GemmRoute r;
    HostRoute(const std::vector<int32_t>& expert_of_pair, uint32_t E, uint32_t in_div, uint32_t tile_tokens,
              bool reverse)
        : tiles(1 + 3 * size_t(expert_of_pair.size() + E)), pairs(std::max<size_t>(expert_of_pair.size(), 1)) {
        std::vector<int32_t> t{0}, p;
        const uint32_t tx = tile_tokens == 288 || tile_tokens == 96 ? 32 : 0;
        if (tx) tile_tokens -= tx;
        for (uint32_t e = 0; e < E; ++e) {
            std::vector<int32_t> group;
            for (size_t i = 0; i < expert_of_pair.size(); ++i)
                if (expert_of_pair[i] == int32_t(e)) group.push_back(int32_t(i));
            if (reverse) std::reverse(group.begin(), group.end());
            const size_t c = group.size();
            const size_t n = c <= tile_tokens + tx ? (c > 0) : (c - tx + tile_tokens - 1) / tile_tokens;
            for (size_t i = 0; i < n; ++i) {
                t.push_back(int32_t(e));
                t.push_back(int32_t(p.size() + i * tile_tokens));
                t.push_back(int32_t(i + 1 < n ? tile_tokens : c - i * tile_tokens));
                ++t[0];
            }
            p.insert(p.end(), group.begin(), group.end());
        }
        REQUIRE(cudaMemcpy(tiles.p, t.data(), t.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        if (!p.empty()) REQUIRE(cudaMemcpy(pairs.p, p.data(), p.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        r.tiles = tiles.p; r.pairs = pairs.p; r.in_div = in_div; r.tile_tokens = tile_tokens; r.tile_extra = tx;
        r.max_tiles = cuda::route_max_tiles(uint32_t(expert_of_pair.size()), E, 1, tile_tokens);
        REQUIRE(uint32_t(t[0]) <= r.max_tiles);
    }
};

// The kernel the bodies below run (each TEST_CASE runs its body once per available kernel).
cuda::PrefillKernel g_kern = cuda::PrefillKernel::kMmaSync;
void for_each_kernel(void (*body)()) {
    std::vector<cuda::PrefillKernel> ks{cuda::PrefillKernel::kMmaSync};
    if (cuda::gemm_prefill_wgmma_supported()) {
        ks.push_back(cuda::PrefillKernel::kWgmma);
        ks.push_back(cuda::PrefillKernel::kSm90);
        ks.push_back(cuda::PrefillKernel::kSm90Ws);
    } else {
        MESSAGE("no sm_90a device: the wgmma kernels are not tested");
    }
    for (cuda::PrefillKernel k : ks) {
        g_kern = k;
        INFO("kernel " << (k == cuda::PrefillKernel::kSm90Ws  ? "sm90 warp-specialized"
                           : k == cuda::PrefillKernel::kSm90  ? "sm90 (A and B in shared memory)"
                           : k == cuda::PrefillKernel::kWgmma ? "wgmma (A in registers)"
                                                              : "mma.sync"));
        body();
    }
}

// Route tile widths of the MXFP4 tests: 256 too on the warp-specialized kernel (its 256-token
// tiles: two wgmma n128 halves, the second only for tiles of more than 128 pairs), 288
// (256 + tile_extra 32) where GPTOSS_PREFILL_TILE_EXTRA turns those on, and 96 (64 + 32) on the
// sm_90a kernels where GPTOSS_PREFILL_TILE_EXTRA64 does.
std::vector<uint32_t> tile_widths() {
    std::vector<uint32_t> w{64u, 128u};
    if (g_kern == cuda::PrefillKernel::kSm90Ws) w.push_back(256u);
    if (g_kern == cuda::PrefillKernel::kSm90Ws && cuda::gemm_prefill_tile_extra(256) == 32) w.push_back(288u);
    if ((g_kern == cuda::PrefillKernel::kSm90Ws || g_kern == cuda::PrefillKernel::kSm90) &&
        cuda::gemm_prefill_tile_extra(64) == 32)
        w.push_back(96u);
    return w;
}

std::vector<float> run_dense(const DenseW& d, const std::vector<float>& x, uint32_t T, cuda::Epilogue ep,
                             const std::vector<float>* base = nullptr) {
    Dev<uint16_t> xd(permuted_rows(x, T, d.w.K));
    Dev<float> out(base ? *base : std::vector<float>(size_t(T) * d.w.N));
    if (!base) REQUIRE(cudaMemset(out.p, 0xff, out.n * 4) == cudaSuccess);
    OK(cuda::gemm_prefill(d.w, xd.p, T, nullptr, ep, out.p, nullptr, d.w.N, 0, nullptr, g_kern));
    return out.get();
}

// --- tests -----------------------------------------------------------------------------------

void dense_matches_cpu() {
    Rand r(101);
    struct S { uint32_t N, K; };
    for (S sh : {S{200, 640}, S{300, 64}}) {
        const auto W = r.bf16s(size_t(sh.N) * sh.K, 0.1f);
        const auto b = r.bf16s(sh.N, 0.1f);
        DenseW d(W, b, sh.N, sh.K);
        for (uint32_t T : {1u, 7u, 64u, 65u, 130u, 1030u}) {
            const auto x = rounded(r.floats(size_t(T) * sh.K, 1.0f));
            std::vector<float> ref(size_t(T) * sh.N);
            cpu::matmul_bf16(x.data(), W.data(), b.data(), T, sh.K, sh.N, ref.data());
            expect_close(run_dense(d, x, T, cuda::Epilogue::kStore), ref, 1e-4f, 1e-4f,
                         "N=" + std::to_string(sh.N) + " K=" + std::to_string(sh.K) + " T=" + std::to_string(T));
        }
    }
}

void dense_chunk_invariant() {
    Rand r(102);
    const uint32_t N = 144, K = 448, T = 1100;
    DenseW d(r.bf16s(size_t(N) * K, 0.1f), r.bf16s(N, 0.1f), N, K);
    const auto x = rounded(r.floats(size_t(T) * K, 1.0f));
    const auto all = run_dense(d, x, T, cuda::Epilogue::kStore);  // 128-token tiles
    uint32_t done = 0;
    for (uint32_t n : {37u, 1u, 1062u}) {  // 64-token tiles, then 64 again, then 128
        const std::vector<float> part(x.begin() + size_t(done) * K, x.begin() + size_t(done + n) * K);
        const auto got = run_dense(d, part, n, cuda::Epilogue::kStore);
        INFO("tokens " << done << ".." << done + n - 1);
        CHECK(same_bits(got, 0, all, size_t(done) * N, size_t(n) * N));
        done += n;
    }
    REQUIRE(done == T);
}

void dense_add() {
    Rand r(103);
    const uint32_t N = 176, K = 192;
    const auto W = r.bf16s(size_t(N) * K, 0.1f);
    const auto b = r.bf16s(N, 0.1f);
    DenseW d(W, b, N, K);
    for (uint32_t T : {3u, 1100u}) {
        const auto x = rounded(r.floats(size_t(T) * K, 1.0f));
        const auto base = r.floats(size_t(T) * N, 5.0f);
        std::vector<float> ref(size_t(T) * N);
        cpu::matmul_bf16(x.data(), W.data(), b.data(), T, K, N, ref.data());
        for (size_t i = 0; i < ref.size(); ++i) ref[i] += base[i];
        expect_close(run_dense(d, x, T, cuda::Epilogue::kAdd, &base), ref, 1e-4f, 1e-5f, "T=" + std::to_string(T));
    }
}

// Grouped MXFP4 experts, kStore (the down projection's per-pair rows): pair p reads input row
// p / in_div and writes output row p.
void grouped_mxfp4_matches_cpu() {
    Rand r(104);
    const uint32_t E = 7, N = 200, K = 384, in_div = 2;
    const auto blocks = r.bytes(size_t(E) * N * K / 2);
    auto scales = r.bytes(size_t(E) * N * K / 32);
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = uint8_t(i % 9 == 0 ? r.below(129) : 115 + r.below(14));
    const auto bias = r.bf16s(size_t(E) * N, 0.1f);
    ExpertsW ew(blocks, scales, bias, E, N, K, false);
    CHECK(ew.bad.get()[0] == 0);
    // Expert 0: none; 1: one pair; 2: 300 pairs; 3: 37; 4: 129 (one past a 128 tile); 5: 64;
    // 6: 270 (one tile of 256 + 14 with tile_extra).
    const uint32_t counts[E] = {0, 1, 300, 37, 129, 64, 270};
    std::vector<int32_t> expert_of;
    for (uint32_t e = 0; e < E; ++e)
        for (uint32_t i = 0; i < counts[e]; ++i) expert_of.push_back(int32_t(e));
    for (size_t i = expert_of.size(); i > 1; --i) std::swap(expert_of[i - 1], expert_of[r.below(uint32_t(i))]);
    const uint32_t P = uint32_t(expert_of.size()), T = (P + in_div - 1) / in_div;
    const auto x = rounded(r.floats(size_t(T) * K, 1.0f));
    Dev<uint16_t> xd(permuted_rows(x, T, K));
    // Reference: every expert on every input row, then pick the pair's expert.
    std::vector<float> per_e(size_t(E) * T * N), ref(size_t(P) * N);
    for (uint32_t e = 0; e < E; ++e)
        cpu::matmul_mxfp4(x.data(), blocks.data() + size_t(e) * N * K / 2, scales.data() + size_t(e) * N * K / 32,
                          bias.data() + size_t(e) * N, T, K, N, per_e.data() + size_t(e) * T * N);
    for (uint32_t p = 0; p < P; ++p)
        std::memcpy(ref.data() + size_t(p) * N, per_e.data() + (size_t(expert_of[p]) * T + p / in_div) * N, N * 4);
    std::vector<float> first;
    for (uint32_t tile : tile_widths()) {
        for (bool reverse : {false, true}) {
            HostRoute route(expert_of, E, in_div, tile, reverse);
            Dev<float> out(size_t(P) * N);
            OK(cuda::gemm_prefill(ew.w, xd.p, T, &route.r, cuda::Epilogue::kStore, out.p, nullptr, N, 0, nullptr,
                                  g_kern));
            const auto got = out.get();
            const std::string what = "tile " + std::to_string(tile) + (reverse ? " reversed" : "");
            // atol: terms reach 12 (scale 2^1 · 6), so partial sums of 384 terms round at ~1e-5.
            expect_close(got, ref, 1e-4f, 1e-4f, what);
            if (first.empty()) {
                first = got;
            } else {
                INFO(what << " against tile 64 in order");
                CHECK(same_bits(got, 0, first, 0, first.size()));
            }
        }
    }
    // One pair alone (a one-token chunk): the same bits as inside the big groups.
    for (uint32_t p : {0u, 5u, P - 1}) {
        std::vector<int32_t> one(P, -1);
        one[p] = expert_of[p];
        HostRoute route(one, E, in_div, 64, false);
        Dev<float> out(size_t(P) * N);
        OK(cuda::gemm_prefill(ew.w, xd.p, T, &route.r, cuda::Epilogue::kStore, out.p, nullptr, N, 0, nullptr,
                                  g_kern));
        const auto got = out.get();
        INFO("pair " << p << " alone");
        CHECK(same_bits(got, size_t(p) * N, first, size_t(p) * N, N));
    }
}

void grouped_swiglu_matches_cpu() {
    Rand r(105);
    const uint32_t E = 3, I = 192, K = 256, N = 2 * I;  // I % 64 == 0: the permuted activation layout
    const auto blocks = r.bytes(size_t(E) * N * K / 2);
    std::vector<uint8_t> scales(size_t(E) * N * K / 32);
    for (uint8_t& s : scales) s = uint8_t(122 + r.below(6));  // large enough to hit the ±7 clamps
    const auto bias = r.bf16s(size_t(E) * N, 0.5f);
    ExpertsW ew(blocks, scales, bias, E, N, K, true);
    const uint32_t T = 330;  // one pair per token (in_div 1); expert 2 gets most (264: 256 + 8)
    std::vector<int32_t> expert_of(T);
    for (uint32_t t = 0; t < T; ++t) expert_of[t] = t % 10 == 0 ? 0 : t % 10 == 1 ? 1 : 2;
    const auto x = rounded(r.floats(size_t(T) * K, 1.0f));
    Dev<uint16_t> xd(permuted_rows(x, T, K));
    std::vector<float> ref(size_t(T) * I);
    std::vector<float> g(size_t(T) * N), y(size_t(T) * I);
    for (uint32_t e = 0; e < E; ++e) {
        cpu::matmul_mxfp4(x.data(), blocks.data() + size_t(e) * N * K / 2, scales.data() + size_t(e) * N * K / 32,
                          bias.data() + size_t(e) * N, T, K, N, g.data());
        cpu::swiglu(g.data(), T, I, 7.0f, y.data());
        for (uint32_t t = 0; t < T; ++t)
            if (expert_of[t] == int32_t(e)) std::memcpy(ref.data() + size_t(t) * I, y.data() + size_t(t) * I, I * 4);
    }
    size_t clamped = 0;
    for (size_t i = 0; i < g.size(); ++i) clamped += std::fabs(g[i]) > 7.0f;
    CHECK(clamped > 0);
    std::vector<uint16_t> first;
    for (uint32_t tile : tile_widths()) {
        HostRoute route(expert_of, E, 1, tile, tile == 128);
        Dev<uint16_t> act(size_t(T) * I);
        OK(cuda::gemm_prefill(ew.w, xd.p, T, &route.r, cuda::Epilogue::kSwiglu, nullptr, act.p, I, 7.0f, nullptr,
                              g_kern));
        const auto got = act.get();
        expect_close(unpermuted_rows(got, T, I), ref, 1e-3f, 8e-3f, "swiglu, tile " + std::to_string(tile));
        if (first.empty()) first = got;
        else CHECK(got == first);
    }
}

TEST_CASE("gemm_prefill (bf16) matches cpu::matmul_bf16 for 1..1030 tokens, N = 200 and 300, K of 1 and 10 chunks") {
    for_each_kernel(dense_matches_cpu);
}
TEST_CASE("gemm_prefill rows are bit-identical whatever the chunk (37, 1, 1062 or 1100 tokens: both tile widths)") {
    for_each_kernel(dense_chunk_invariant);
}
TEST_CASE("gemm_prefill kAdd adds the product and bias into the existing output") {
    for_each_kernel(dense_add);
}
TEST_CASE("gemm_prefill (MXFP4, grouped) matches cpu::matmul_mxfp4 with 0, 1, many and uneven pairs per expert") {
    for_each_kernel(grouped_mxfp4_matches_cpu);
}
TEST_CASE("gemm_prefill MXFP4 gate_up with fused SwiGLU matches cpu::matmul_mxfp4 + cpu::swiglu, clamps included") {
    for_each_kernel(grouped_swiglu_matches_cpu);
}

TEST_CASE("router_route with tile_extra: an expert's last 256-pair tile takes up to 32 more pairs") {
    // 4 experts, top-1: 0 none, 1 270 pairs (one tile with tile_extra), 2 300 (256 + 44), 3 30.
    const uint32_t T = 600, E = 4;
    std::vector<float> logits(size_t(T) * E, 0.0f);
    for (uint32_t t = 0; t < T; ++t) logits[size_t(t) * E + (t < 270 ? 1 : t < 570 ? 2 : 3)] = 1.0f;
    Dev<float> ld(logits), weights(T);
    Dev<int32_t> experts(T), tiles(1 + 3 * size_t(cuda::route_max_tiles(T, E, 1, 256))), pairs(T);
    struct Case { uint32_t extra; std::vector<int32_t> want; };
    for (const Case& c : {Case{0, {5, 1, 0, 256, 1, 256, 14, 2, 270, 256, 2, 526, 44, 3, 570, 30}},
                          Case{32, {4, 1, 0, 270, 2, 270, 256, 2, 526, 44, 3, 570, 30}}}) {
        OK(cuda::router_route(ld.p, T, E, 1, experts.p, weights.p, tiles.p, pairs.p, 256, nullptr, c.extra));
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        auto got = tiles.get();
        got.resize(c.want.size());
        INFO("tile_extra " << c.extra);
        CHECK(got == c.want);
    }
}

TEST_CASE("gemm_prefill_tile_tokens and the argument checks") {
    // 20b, 2048 tokens: 256 pairs per expert (256-token tiles on kSm90Ws variants 10, 11 and 12,
    // the default; an unknown GPTOSS_SM90_WS_VARIANT means the default).
    auto env = [](const char* name) { const char* e = std::getenv(name); return std::string(e ? e : ""); };
    const int v = std::atoi(env("GPTOSS_SM90_WS_VARIANT").c_str());
    const bool wide_v = v >= 10 && v <= 12 ? true : !(v >= 1 && v <= 12 && v != 4);
    const bool ws = cuda::gemm_prefill_wgmma_supported() && env("GPTOSS_SM90_WS") != "0" && env("GPTOSS_GEMM_SM90") != "0";
    const bool wide = ws && wide_v;
    // 120b: 64 pairs per expert, 64-token tiles (128 with GPTOSS_PREFILL_TILE_MIN=128 on kSm90Ws).
    const uint32_t narrow = ws && env("GPTOSS_PREFILL_TILE_MIN") == "128" ? 128u : 64u;
    CHECK(cuda::gemm_prefill_tile_tokens(2048 * 4, 32) == (wide ? 256u : 128u));
    CHECK(cuda::gemm_prefill_tile_tokens(2048 * 4, 128) == narrow);
    CHECK(cuda::gemm_prefill_tile_tokens(512 * 4, 32) == narrow);
    CHECK(cuda::gemm_prefill_tile_tokens(127 * 4, 16) == 64);  // 31 pairs per expert
    CHECK(cuda::gemm_prefill_tile_tokens(0, 32) == 64);
    cuda::GemmWeights w;
    w.N = 16; w.K = 100;
    float out = 0;
    CHECK(cuda::gemm_prefill(w, nullptr, 1, nullptr, cuda::Epilogue::kStore, &out, nullptr, 16, 0, nullptr) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("K=100") != std::string::npos);
    w.K = 64;
    cuda::GemmRoute route;
    route.tile_tokens = 32;
    CHECK(cuda::gemm_prefill(w, nullptr, 1, &route, cuda::Epilogue::kStore, &out, nullptr, 16, 0, nullptr) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("32 pairs") != std::string::npos);
    route.tile_tokens = 256;  // only the warp-specialized MXFP4 kernel takes 256-pair tiles
    route.in_div = 1;
    CHECK(cuda::gemm_prefill(w, nullptr, 1, &route, cuda::Epilogue::kStore, &out, nullptr, 16, 0, nullptr,
                             cuda::PrefillKernel::kMmaSync) == GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("256 pairs") != std::string::npos);
    w.N = 160;  // SwiGLU output width 80: not a whole number of 64-element permuted chunks
    uint16_t act = 0;
    CHECK(cuda::gemm_prefill(w, nullptr, 1, nullptr, cuda::Epilogue::kSwiglu, nullptr, &act, 80, 7.0f, nullptr) ==
          GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("N=160") != std::string::npos);
    w.N = 16;
    CHECK(cuda::gemm_prefill(w, nullptr, 1, nullptr, cuda::Epilogue::kStore, nullptr, nullptr, 16, 0, nullptr) ==
          GPTOSS_ERR_INTERNAL);
    if (!cuda::gemm_prefill_wgmma_supported()) {
        CHECK(cuda::gemm_prefill(w, nullptr, 1, nullptr, cuda::Epilogue::kStore, &out, nullptr, 16, 0, nullptr,
                                 cuda::PrefillKernel::kWgmma) == GPTOSS_ERR_UNSUPPORTED);
        CHECK(cuda::gemm_prefill(w, nullptr, 1, nullptr, cuda::Epilogue::kStore, &out, nullptr, 16, 0, nullptr,
                                 cuda::PrefillKernel::kSm90) == GPTOSS_ERR_UNSUPPORTED);
        CHECK(cuda::gemm_prefill(w, nullptr, 1, nullptr, cuda::Epilogue::kStore, &out, nullptr, 16, 0, nullptr,
                                 cuda::PrefillKernel::kSm90Ws) == GPTOSS_ERR_UNSUPPORTED);
    }
}

}  // namespace

int main(int argc, char** argv) { return run_kernel_tests(argc, argv, "the prefill GEMM tests (test-kernels-gemm)"); }
