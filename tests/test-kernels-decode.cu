// tests/test-kernels-decode.cu - the decode GEMVs of cuda/gemm_decode.cu, every compiled variant
// (warps × ring depth × shfl activations), against the CPU reference ops (cpu::matmul_bf16,
// cpu::matmul_mxfp4, cpu::swiglu): dense kStore and kAdd with N not a multiple of 16 and K not
// a multiple of warps × depth chunks; routed MXFP4 (a T = 1 route with one pair per tile, fewer
// tiles than max_tiles, input rows by in_div) with and without route_ready, plain and with the
// fused SwiGLU; each result reproduced bit for bit by a second launch (deterministic); MXFP4
// activations over 29 octaves with scales 0 and 128, and a row of 1e6 (finite results); the
// fixed-K instances (K = 2880, 4096) bit for bit against the any-K kernel of their variant.
// Without a CUDA device the tests are skipped (exit 77). Tolerance |got − ref| <= atol + rtol·|ref|.
#include "tests/kernel-test-util.cuh"

#include <memory>

namespace {

std::string name(bool fp4, const cuda::DecodeGemv& v) {
    return std::string(fp4 ? "mxfp4" : "bf16") + " warps " + std::to_string(v.warps) + " depth " +
           std::to_string(v.depth) + (v.shfl_x ? " shfl" : " frag");
}

std::vector<cuda::DecodeGemv> variants(bool fp4) {
    std::vector<cuda::DecodeGemv> out;
    for (const auto& [f, v] : cuda::decode_gemv_variants())
        if (f == fp4) out.push_back(v);
    return out;
}

// A T = 1 route over `experts` (distinct): tile i = (experts[i], i, 1), pairs = 0..n-1;
// max_tiles may exceed the tiles in use (the rest exit early).
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

// E experts' MXFP4 weights [E][N][K] (random nibbles, e8m0 scales in [s_lo, s_lo + s_span), bf16
// biases × bias_scale) on the host; repack(swiglu) puts them on the GPU (kernel-test-util's
// ExpertsW; swiglu: gate_up's interleaved rows) and returns their GemmWeights.
struct Mxfp4Experts {
    uint32_t E, N, K;
    std::vector<uint8_t> blocks, scales;
    std::vector<uint16_t> bias;
    std::unique_ptr<ExpertsW> dev;
    Mxfp4Experts(Rand& r, uint32_t e, uint32_t n, uint32_t k, uint32_t s_lo, uint32_t s_span, float bias_scale)
        : E(e), N(n), K(k), blocks(r.bytes(size_t(e) * n * k / 2)), scales(size_t(e) * n * k / 32) {
        for (uint8_t& s : scales) s = uint8_t(s_lo + r.below(s_span));
        bias = r.bf16s(size_t(e) * n, bias_scale);
    }
    const cuda::GemmWeights& repack(bool swiglu) {
        dev = std::make_unique<ExpertsW>(blocks, scales, bias, E, N, K, swiglu);
        return dev->w;
    }
    // out[p·N ..] = the CPU's row x + p·x_stride through expert experts[p] (N outputs, bias added).
    std::vector<float> reference(const std::vector<float>& x, size_t x_stride, const std::vector<int32_t>& experts) const {
        std::vector<float> out(experts.size() * N);
        for (size_t p = 0; p < experts.size(); ++p) {
            const size_t e = size_t(experts[p]);
            cpu::matmul_mxfp4(x.data() + p * x_stride, blocks.data() + e * N * K / 2, scales.data() + e * N * K / 32,
                              bias.data() + e * N, 1, K, N, out.data() + p * N);
        }
        return out;
    }
};

}  // namespace

TEST_CASE("decode GEMV (bf16, every variant) matches cpu::matmul_bf16; kAdd adds; reproducible bit for bit") {
    Rand r(71);
    for (const auto& [N, K] : {std::pair<uint32_t, uint32_t>{200, 2880}, {37, 64}, {64, 4096}}) {
        const auto W = r.bf16s(size_t(N) * K, 0.05f);
        const auto b = r.bf16s(N, 0.1f);
        const auto x = r.floats_bf16(K, 1.0f);
        Dev<uint16_t> raw(W), rawb(b), xd(permuted_rows(x, 1, K));
        Dev<uint8_t> frag(cuda::bf16_fragment_bytes(N, K));
        Dev<float> bias(N);
        OK(cuda::repack_bf16(raw.p, N, K, frag.p, nullptr));
        OK(cuda::bf16_to_f32(rawb.p, N, false, bias.p, nullptr));
        cuda::GemmWeights w;
        w.w = frag.p; w.bias = bias.p; w.N = N; w.K = K;
        std::vector<float> ref(N);
        cpu::matmul_bf16(x.data(), W.data(), b.data(), 1, K, N, ref.data());
        const auto base = r.floats_bf16(N, 2.0f);
        for (const cuda::DecodeGemv& v : variants(false)) {
            const std::string what = name(false, v) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
            Dev<float> out(N), out2(N), acc(base);
            OK(cuda::gemm_decode(w, xd.p, nullptr, false, cuda::Epilogue::kStore, out.p, nullptr, N, 0, v, nullptr));
            OK(cuda::gemm_decode(w, xd.p, nullptr, false, cuda::Epilogue::kStore, out2.p, nullptr, N, 0, v, nullptr));
            OK(cuda::gemm_decode(w, xd.p, nullptr, false, cuda::Epilogue::kAdd, acc.p, nullptr, N, 0, v, nullptr));
            const auto got = out.get(), got2 = out2.get(), added = acc.get();
            expect_close(got, ref, 1e-4f, 1e-4f, what);
            CHECK(std::memcmp(got.data(), got2.data(), N * sizeof(float)) == 0);
            std::vector<float> ref_add(N);
            for (uint32_t i = 0; i < N; ++i) ref_add[i] = base[i] + got[i];
            expect_close(added, ref_add, 0.0f, 0.0f, what + " kAdd");
        }
    }
}

TEST_CASE("decode GEMV (MXFP4 routed, every variant, route_ready or not) matches cpu::matmul_mxfp4 and SwiGLU") {
    Rand r(72);
    const uint32_t E = 6, H = 2880, I = 192;  // down: N = H, K = I; gate_up: N = 2I, K = H
    const std::vector<int32_t> experts{4, 0, 5};  // 3 of max_tiles = 4 tiles in use
    // down: input row of pair p is p (in_div 1); output row p.
    {
        const uint32_t N = H, K = I;
        Mxfp4Experts m(r, E, N, K, 115, 14, 0.1f);
        const cuda::GemmWeights& w = m.repack(false);
        const auto x = r.floats_bf16(experts.size() * K, 1.0f);
        Dev<uint16_t> xd(permuted_rows(x, uint32_t(experts.size()), K));
        const std::vector<float> ref = m.reference(x, K, experts);
        Route route(experts, 1, 4);
        for (const cuda::DecodeGemv& v : variants(true)) {
            for (bool ready : {false, true}) {
                const std::string what = name(true, v) + " down" + (ready ? " route_ready" : "");
                Dev<float> out(ref.size()), out2(ref.size());
                OK(cuda::gemm_decode(w, xd.p, &route.r, ready, cuda::Epilogue::kStore, out.p, nullptr, N, 0, v,
                                     nullptr));
                OK(cuda::gemm_decode(w, xd.p, &route.r, ready, cuda::Epilogue::kStore, out2.p, nullptr, N, 0, v,
                                     nullptr));
                const auto got = out.get(), got2 = out2.get();
                expect_close(got, ref, 1e-4f, 1e-4f, what);
                CHECK(std::memcmp(got.data(), got2.data(), got.size() * sizeof(float)) == 0);
            }
        }
    }
    // gate_up + SwiGLU: every pair reads row 0 (in_div = K slots); output row p, [I] permuted.
    {
        const uint32_t N = 2 * I, K = H;
        Mxfp4Experts m(r, E, N, K, 118, 6, 0.5f);  // scales large enough to hit the ±7 clamps
        const cuda::GemmWeights& w = m.repack(true);
        const auto x = r.floats_bf16(K, 1.0f);
        Dev<uint16_t> xd(permuted_rows(x, 1, K));
        const std::vector<float> g = m.reference(x, 0, experts);
        std::vector<float> ref(experts.size() * I);
        for (size_t p = 0; p < experts.size(); ++p) cpu::swiglu(g.data() + p * N, 1, I, 7.0f, ref.data() + p * I);
        Route route(experts, 4, 4);
        for (const cuda::DecodeGemv& v : variants(true)) {
            for (bool ready : {false, true}) {
                const std::string what = name(true, v) + " gate_up" + (ready ? " route_ready" : "");
                Dev<uint16_t> act(experts.size() * I), act2(experts.size() * I);
                OK(cuda::gemm_decode(w, xd.p, &route.r, ready, cuda::Epilogue::kSwiglu, nullptr, act.p, I, 7.0f, v,
                                     nullptr));
                OK(cuda::gemm_decode(w, xd.p, &route.r, ready, cuda::Epilogue::kSwiglu, nullptr, act2.p, I, 7.0f, v,
                                     nullptr));
                const auto got = act.get(), got2 = act2.get();
                std::vector<float> unperm(got.size());
                for (size_t p = 0; p < experts.size(); ++p)
                    for (uint32_t k = 0; k < I; ++k)
                        unperm[p * I + k] = bf16_to_f32(got[p * I + cuda::permuted_k(k)]);
                expect_close(unperm, ref, 1e-3f, 8e-3f, what);
                CHECK(got == got2);
            }
        }
    }
}

// Rows spread over many octaves (every octave from 2^-13 to 2^15, both signs) with the extreme
// scales 0 and 128 match the CPU reference; a row of 1e6 gives finite results. (v17-v18 ran the
// row in fp16, exact only in [2^-14, 65504]: this case held them to that range; the bf16 row of
// gemm.cuh mxfp4_chunk_bf16 keeps it as a range check.)
TEST_CASE("decode GEMV (MXFP4): activations over 2^-13..2^15 and scales 0 / 128 match the CPU; 1e6 stays finite") {
    Rand r(73);
    const uint32_t N = 64, K = 192;
    const auto blocks = r.bytes(size_t(N) * K / 2);
    std::vector<uint8_t> scales(size_t(N) * K / 32);
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = i == 0 ? 0 : i == 1 ? 128 : uint8_t(112 + r.below(12));
    std::vector<float> x(K);
    for (uint32_t k = 0; k < K; ++k)
        x[k] = std::ldexp(1.0f + 0.5f * float(k % 2), int(k % 29) - 13) * (k % 3 ? 1.f : -1.f);
    const std::vector<uint16_t> no_bias(N, 0);
    Dev<uint8_t> rb(blocks), rs(scales), frag(cuda::mxfp4_fragment_bytes(N, K)), sc(cuda::mxfp4_scale_bytes(N, K));
    Dev<int> bad(1);
    REQUIRE(cudaMemset(bad.p, 0, sizeof(int)) == cudaSuccess);
    OK(cuda::repack_mxfp4(rb.p, rs.p, N, K, false, frag.p, sc.p, bad.p, nullptr));
    cuda::GemmWeights w;
    w.w = frag.p; w.scales = reinterpret_cast<uint16_t*>(sc.p); w.mxfp4 = true; w.N = N; w.K = K;
    w.w_expert_stride = cuda::mxfp4_fragment_bytes(N, K); w.s_expert_stride = cuda::mxfp4_scale_bytes(N, K) / 2;
    Route route({0}, 1, 1);
    // ref and, for the error bound, Σ_k |W_nk x_k| (sign bits cleared: |W| · |x|).
    std::vector<float> ref(N), mag(N), xabs(K);
    std::vector<uint8_t> wabs(blocks);
    for (uint8_t& b : wabs) b &= 0x77;
    for (uint32_t k = 0; k < K; ++k) xabs[k] = std::fabs(x[k]);
    cpu::matmul_mxfp4(x.data(), blocks.data(), scales.data(), no_bias.data(), 1, K, N, ref.data());
    cpu::matmul_mxfp4(xabs.data(), wabs.data(), scales.data(), no_bias.data(), 1, K, N, mag.data());
    const std::vector<float> big(K, 1.0e6f);
    Dev<uint16_t> xd(permuted_rows(x, 1, K)), xb(permuted_rows(big, 1, K));
    for (const cuda::DecodeGemv& v : variants(true)) {
        Dev<float> out(N), outb(N);
        OK(cuda::gemm_decode(w, xd.p, &route.r, false, cuda::Epilogue::kStore, out.p, nullptr, N, 0, v, nullptr));
        OK(cuda::gemm_decode(w, xb.p, &route.r, false, cuda::Epilogue::kStore, outb.p, nullptr, N, 0, v, nullptr));
        const auto got = out.get();
        for (uint32_t n = 0; n < N; ++n) {
            INFO(name(true, v) << " wide range, row " << n << ": got " << got[n] << ", ref " << ref[n]);
            CHECK(std::fabs(got[n] - ref[n]) <= 4e-5f * mag[n] + 1e-30f);
        }
        for (float y : outb.get()) CHECK(std::isfinite(y));
    }
}

// The fixed-K instances (gpt-oss's K = 2880 / 4096, the warp's chunks unrolled) sum the same chunks
// in the same order as the any-K kernel of their variant: the same bits, dense (kStore, kAdd) and
// routed MXFP4 (kStore and SwiGLU, route_ready or not), and the CPU's values.
TEST_CASE("decode GEMV fixed-K instances equal the any-K kernel bit for bit and match the CPU") {
    Rand r(74);
    const auto fixed = cuda::decode_gemv_fixed_k();
    REQUIRE(!fixed.empty());
    for (const cuda::DecodeFixedK& f : fixed) {
        cuda::DecodeGemv any = f.v;
        any.fixed_k = false;
        const std::string what = name(f.fp4, f.v) + " fixed-K, K=" + std::to_string(f.K);
        INFO(what);
        const uint32_t K = f.K;
        if (!f.fp4) {
            const uint32_t N = 200;
            const auto W = r.bf16s(size_t(N) * K, 0.05f);
            const auto x = r.floats_bf16(K, 1.0f);
            Dev<uint16_t> raw(W), xd(permuted_rows(x, 1, K));
            Dev<uint8_t> frag(cuda::bf16_fragment_bytes(N, K));
            OK(cuda::repack_bf16(raw.p, N, K, frag.p, nullptr));
            cuda::GemmWeights w;
            w.w = frag.p; w.N = N; w.K = K;
            std::vector<float> ref(N);
            const std::vector<uint16_t> no_bias(N, 0);
            cpu::matmul_bf16(x.data(), W.data(), no_bias.data(), 1, K, N, ref.data());
            const auto base = r.floats_bf16(N, 2.0f);
            Dev<float> a(N), b(N), aa(base), ba(base);
            OK(cuda::gemm_decode(w, xd.p, nullptr, false, cuda::Epilogue::kStore, a.p, nullptr, N, 0, f.v, nullptr));
            OK(cuda::gemm_decode(w, xd.p, nullptr, false, cuda::Epilogue::kStore, b.p, nullptr, N, 0, any, nullptr));
            OK(cuda::gemm_decode(w, xd.p, nullptr, false, cuda::Epilogue::kAdd, aa.p, nullptr, N, 0, f.v, nullptr));
            OK(cuda::gemm_decode(w, xd.p, nullptr, false, cuda::Epilogue::kAdd, ba.p, nullptr, N, 0, any, nullptr));
            const auto got = a.get();
            expect_close(got, ref, 1e-4f, 1e-4f, what);
            CHECK(got == b.get());
            CHECK(aa.get() == ba.get());
            continue;
        }
        // Routed MXFP4: E = 3 experts, 2 tiles in use of max_tiles 3; N = 128 rows (SwiGLU: I = 64, a
        // whole 64-k chunk, as permuted_k's permutation within chunks needs).
        const uint32_t E = 3, N = 128, I = N / 2;
        const std::vector<int32_t> experts{2, 0};
        Mxfp4Experts m(r, E, N, K, 114, 8, 0.5f);
        const auto x = r.floats_bf16(experts.size() * K, 1.0f);
        Dev<uint16_t> xd(permuted_rows(x, uint32_t(experts.size()), K));
        const std::vector<float> ref = m.reference(x, K, experts);
        for (bool swiglu : {false, true}) {
            const cuda::GemmWeights& w = m.repack(swiglu);
            Route route(experts, 1, 3);
            for (bool ready : {false, true}) {
                const std::string how = what + (swiglu ? " SwiGLU" : " store") + (ready ? " route_ready" : "");
                if (swiglu) {
                    Dev<uint16_t> a(experts.size() * I), b(experts.size() * I);
                    OK(cuda::gemm_decode(w, xd.p, &route.r, ready, cuda::Epilogue::kSwiglu, nullptr, a.p, I, 7.0f,
                                         f.v, nullptr));
                    OK(cuda::gemm_decode(w, xd.p, &route.r, ready, cuda::Epilogue::kSwiglu, nullptr, b.p, I, 7.0f,
                                         any, nullptr));
                    const auto got = a.get();
                    std::vector<float> want(experts.size() * I), unperm(want.size());
                    for (size_t p = 0; p < experts.size(); ++p) {
                        cpu::swiglu(ref.data() + p * N, 1, I, 7.0f, want.data() + p * I);
                        for (uint32_t k = 0; k < I; ++k)
                            unperm[p * I + k] = bf16_to_f32(got[p * I + cuda::permuted_k(k)]);
                    }
                    expect_close(unperm, want, 1e-3f, 8e-3f, how);
                    CHECK(got == b.get());
                } else {
                    Dev<float> a(ref.size()), b(ref.size());
                    OK(cuda::gemm_decode(w, xd.p, &route.r, ready, cuda::Epilogue::kStore, a.p, nullptr, N, 0, f.v,
                                         nullptr));
                    OK(cuda::gemm_decode(w, xd.p, &route.r, ready, cuda::Epilogue::kStore, b.p, nullptr, N, 0, any,
                                         nullptr));
                    const auto got = a.get();
                    expect_close(got, ref, 1e-4f, 1e-4f, how);
                    CHECK(got == b.get());
                }
            }
        }
    }
}

TEST_CASE("gemm_decode rejects a variant that is not compiled in, naming it") {
    cuda::GemmWeights w;
    w.N = 16; w.K = 64;
    Dev<float> out(16);
    const gptoss_status s = cuda::gemm_decode(w, nullptr, nullptr, false, cuda::Epilogue::kStore, out.p, nullptr, 16,
                                              0, cuda::DecodeGemv{3, 5, false}, nullptr);
    CHECK(s == GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("3 warps") != std::string::npos);
}

int main(int argc, char** argv) { return run_kernel_tests(argc, argv, "the decode GEMV tests (test-kernels-decode)"); }
