// tests/kernel-test-util.cuh - what every CUDA kernel test (tests/test-kernels*.cu) shares:
// Dev<T> (a device buffer poisoned with 0xff so every output element must be written by the
// kernel under test), OK(status) with gptoss_last_error() in the failure, seeded random inputs
// (Rand), bf16 rounding and the GEMM's permuted activation layout (cuda::permuted_k), the
// tolerance check |got − ref| <= atol + rtol·|ref| with the first mismatches printed, the
// repacked dense/MXFP4 weights the GEMM launchers take, and the main() that skips the whole
// executable with exit 77 (ctest's SKIP_RETURN_CODE) and a visible message when there is no
// CUDA device. Test-only: each test includes it once, so it may define functions.
#pragma once
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "cpu/reference.h"
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "gptoss-internal.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using namespace gptoss;

namespace {

template <typename T>
struct Dev {
    T* p = nullptr;
    size_t n = 0;
    explicit Dev(size_t count) : n(count) {
        REQUIRE(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)) == cudaSuccess);
        // Poison: every output element must be written by the kernel under test.
        REQUIRE(cudaMemset(p, 0xff, std::max<size_t>(count, 1) * sizeof(T)) == cudaSuccess);
    }
    explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
        REQUIRE(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    ~Dev() { cudaFree(p); }
    void set(const std::vector<T>& v) {
        REQUIRE(v.size() == n);
        REQUIRE(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    std::vector<T> get() const {
        std::vector<T> v(n);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
        return v;
    }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
};

#define OK(expr)                                                   \
    do {                                                           \
        const gptoss_status s_ = (expr);                           \
        INFO(std::string(gptoss_last_error()));                    \
        REQUIRE(s_ == GPTOSS_OK);                                  \
    } while (0)

inline void sync_ok() { REQUIRE(cudaDeviceSynchronize() == cudaSuccess); }

// --- random inputs ---------------------------------------------------------------------------

struct Rand {
    Rng rng;
    explicit Rand(uint64_t seed) : rng(seed) {}
    float uniform(float a) { return float((rng.next_double() * 2.0 - 1.0) * a); }
    uint32_t below(uint32_t n) { return uint32_t(rng.next_u64() % n); }
    std::vector<float> floats(size_t n, float a) {
        std::vector<float> v(n);
        for (float& x : v) x = uniform(a);
        return v;
    }
    // Values exactly representable in bf16 (so a bf16 input and its fp32 reference agree).
    std::vector<float> floats_bf16(size_t n, float a) {
        std::vector<float> v(n);
        for (float& x : v) x = bf16_to_f32(f32_to_bf16(uniform(a)));
        return v;
    }
    std::vector<uint16_t> bf16s(size_t n, float a) {
        std::vector<uint16_t> v(n);
        for (uint16_t& x : v) x = f32_to_bf16(uniform(a));
        return v;
    }
    std::vector<uint8_t> bytes(size_t n) {
        std::vector<uint8_t> v(n);
        for (uint8_t& x : v) x = uint8_t(rng.next_u64());
        return v;
    }
};

inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }
inline std::vector<float> rounded(std::vector<float> v) {
    for (float& x : v) x = round_bf16(x);
    return v;
}
inline std::vector<float> widen(const std::vector<uint16_t>& v) {
    std::vector<float> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(v[i]);
    return o;
}
// [T, K] fp32 → bf16 rows in the GEMM's permuted layout.
inline std::vector<uint16_t> permuted_rows(const std::vector<float>& x, uint32_t T, uint32_t K) {
    std::vector<uint16_t> o(size_t(T) * K);
    for (uint32_t t = 0; t < T; ++t)
        for (uint32_t k = 0; k < K; ++k) o[size_t(t) * K + cuda::permuted_k(k)] = f32_to_bf16(x[size_t(t) * K + k]);
    return o;
}
inline std::vector<float> unpermuted_rows(const std::vector<uint16_t>& x, uint32_t T, uint32_t K) {
    std::vector<float> o(size_t(T) * K);
    for (uint32_t t = 0; t < T; ++t)
        for (uint32_t k = 0; k < K; ++k) o[size_t(t) * K + k] = bf16_to_f32(x[size_t(t) * K + cuda::permuted_k(k)]);
    return o;
}

// Checks |got − ref| <= atol + rtol·|ref| everywhere; prints the first mismatches and the max error.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& ref, float atol, float rtol,
                  const std::string& what) {
    REQUIRE(got.size() == ref.size());
    size_t bad = 0;
    double max_err = 0;
    std::string first;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double err = std::fabs(double(got[i]) - double(ref[i]));
        if (!(err <= atol + rtol * std::fabs(ref[i]))) {
            if (bad < 5) {
                char buf[160];
                std::snprintf(buf, sizeof buf, "  [%zu] got %.7g ref %.7g\n", i, got[i], ref[i]);
                first += buf;
            }
            ++bad;
        }
        if (std::isnan(got[i]) || err > max_err) max_err = std::isnan(got[i]) ? INFINITY : err;
    }
    INFO(what << ": " << bad << " of " << ref.size() << " mismatches, max |err| " << max_err << "\n" << first);
    CHECK(bad == 0);
}

template <typename T>
inline bool same_bits(const std::vector<T>& a, size_t a0, const std::vector<T>& b, size_t b0, size_t n) {
    return std::memcmp(a.data() + a0, b.data() + b0, n * sizeof(T)) == 0;
}

// A router's bf16 weights [E, H] and bias [E] for the fused-router cases (test-kernels,
// test-kernels-fold); ties: experts 3, 9 and 20 get the same row and a bias far above the rest
// (exact ties).
inline std::pair<std::vector<uint16_t>, std::vector<uint16_t>> router_weights(Rand& r, uint32_t E, uint32_t H,
                                                                              bool ties) {
    auto W = r.bf16s(size_t(E) * H, 0.05f);
    auto b = r.bf16s(E, 0.5f);
    if (ties) {
        for (uint32_t k = 0; k < H; ++k) W[size_t(9) * H + k] = W[size_t(20) * H + k] = W[size_t(3) * H + k];
        b[9] = b[20] = b[3] = f32_to_bf16(30.0f);
    }
    return {W, b};
}

// --- repacked weights for the GEMM launchers -------------------------------------------------

struct DenseW {
    Dev<uint8_t> frag;
    Dev<float> bias;
    cuda::GemmWeights w;
    DenseW(const std::vector<uint16_t>& W, const std::vector<uint16_t>& b, uint32_t N, uint32_t K)
        : frag(cuda::bf16_fragment_bytes(N, K)), bias(N) {
        Dev<uint16_t> raw(W), rawb(b);
        OK(cuda::repack_bf16(raw.p, N, K, frag.p, nullptr));
        OK(cuda::bf16_to_f32(rawb.p, N, false, bias.p, nullptr));
        sync_ok();
        w.w = frag.p; w.bias = bias.p; w.N = N; w.K = K;
    }
};

struct ExpertsW {
    Dev<uint8_t> frag, scales;
    Dev<float> bias;
    Dev<int> bad;
    cuda::GemmWeights w;
    ExpertsW(const std::vector<uint8_t>& blocks, const std::vector<uint8_t>& sc, const std::vector<uint16_t>& b,
             uint32_t E, uint32_t N, uint32_t K, bool gate_up)
        : frag(E * cuda::mxfp4_fragment_bytes(N, K)), scales(E * cuda::mxfp4_scale_bytes(N, K)), bias(size_t(E) * N),
          bad(1) {
        Dev<uint8_t> rb(blocks), rs(sc);
        Dev<uint16_t> rbias(b);
        REQUIRE(cudaMemset(bad.p, 0, sizeof(int)) == cudaSuccess);
        for (uint32_t e = 0; e < E; ++e) {
            OK(cuda::repack_mxfp4(rb.p + size_t(e) * N * K / 2, rs.p + size_t(e) * N * K / 32, N, K, gate_up,
                                  frag.p + e * cuda::mxfp4_fragment_bytes(N, K),
                                  scales.p + e * cuda::mxfp4_scale_bytes(N, K), bad.p, nullptr));
            OK(cuda::bf16_to_f32(rbias.p + size_t(e) * N, N, gate_up, bias.p + size_t(e) * N, nullptr));
        }
        sync_ok();
        w.w = frag.p; w.scales = reinterpret_cast<uint16_t*>(scales.p); w.bias = bias.p; w.mxfp4 = true;
        w.N = N; w.K = K;
        w.w_expert_stride = cuda::mxfp4_fragment_bytes(N, K);
        w.s_expert_stride = cuda::mxfp4_scale_bytes(N, K) / 2;
        w.bias_expert_stride = N;
    }
};

// --- whole-backend comparisons (test-kernels, test-kernels-offload) ---

// The tiny synthetic checkpoint's directory ($GPTOSS_TINY_MODEL, which ctest sets), and the
// checkpoint loaded from it.
inline const char* tiny_dir() {
    const char* dir = std::getenv("GPTOSS_TINY_MODEL");
    REQUIRE_MESSAGE(dir != nullptr, "GPTOSS_TINY_MODEL is not set (run through ctest)");
    return dir;
}
inline std::unique_ptr<Checkpoint> load_tiny() {
    std::unique_ptr<Checkpoint> ck;
    OK(load_checkpoint(tiny_dir(), {}, &ck));
    return ck;
}

// A checkpoint from `dir` whose router biases put experts 0..3 far ahead for every token (top-4 =
// experts 0..3, their weights still token-dependent). Random routers put many tokens within a
// rounding error of another top-4, and one flipped expert moves a position's logits by percents,
// so comparing two implementations on them would measure coin flips. `biases` backs the
// checkpoint's router_bias pointers: keep it alive as long as ck (or a backend reading ck).
struct BiasedCheckpoint {
    std::unique_ptr<Checkpoint> ck;
    std::vector<std::vector<uint16_t>> biases;
};
inline BiasedCheckpoint load_biased_checkpoint(const char* dir) {
    BiasedCheckpoint m;
    OK(load_checkpoint(dir, {}, &m.ck));
    const uint32_t E = m.ck->config.n_experts;
    m.biases.assign(m.ck->config.n_layers, std::vector<uint16_t>(E));
    for (uint32_t l = 0; l < m.ck->config.n_layers; ++l) {
        for (uint32_t e = 0; e < E; ++e) m.biases[l][e] = f32_to_bf16(e < 4 ? 12.0f - 3.0f * float(e) : -20.0f);
        m.ck->weights.layers[l].router_bias.data = m.biases[l].data();
    }
    return m;
}

// n ordinary-text token ids (below the special range), the same for the same seed.
inline std::vector<int32_t> prompt(size_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = int32_t(rng.next_u64() % 199998);
    return p;
}

inline std::vector<float> logits_of(BackendSession* s) {
    const float* l = nullptr;
    OK(s->get_logits(&l));
    return std::vector<float>(l, l + 201088);
}

// Compares GPU and CPU logits of one position: relative L2 error and the top token where the
// CPU's top-2 gap is well above the error.
inline void expect_logits_close(const std::vector<float>& gpu, const std::vector<float>& cpu_l, const std::string& what) {
    double num = 0, den = 0, max_err = 0;
    for (size_t i = 0; i < cpu_l.size(); ++i) {
        const double d = double(gpu[i]) - cpu_l[i];
        num += d * d;
        den += double(cpu_l[i]) * cpu_l[i];
        max_err = std::max(max_err, std::fabs(d));
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    const size_t top = size_t(std::max_element(cpu_l.begin(), cpu_l.end()) - cpu_l.begin());
    float second = -INFINITY;
    for (size_t i = 0; i < cpu_l.size(); ++i)
        if (i != top) second = std::max(second, cpu_l[i]);
    INFO(what << ": relative L2 error " << rel << ", max |err| " << max_err << ", top-2 gap " << cpu_l[top] - second);
    CHECK(rel < 2e-2);
    if (cpu_l[top] - second > 4 * max_err) {
        const size_t gtop = size_t(std::max_element(gpu.begin(), gpu.end()) - gpu.begin());
        CHECK(gtop == top);
    }
}

// The whole executable's main(): without a CUDA device, say so and exit 77 (ctest: Skipped).
inline int run_kernel_tests(int argc, char** argv, const char* what) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        std::printf("no CUDA device: skipping %s\n", what);
        return 77;
    }
    doctest::Context ctx;
    ctx.applyCommandLine(argc, argv);
    return ctx.run();
}

}  // namespace
