// tests/test-kernels-dense-batch.cu - the batched decode step's dense projections
// (cuda/dense_batch.cu): dense_batch_gemm against (a) gemm() on the same inputs, bit for bit (it
// promises gemm()'s bits, which is what lets the batched step choose either kernel per step size
// without breaking batch invariance), for n = 1, 5, 8, 9, 64, 70 tokens (70: two 64-token column
// blocks), kStore and kAdd, every CTA shape (4 or 8 warps of 1 or 2 slabs, 32 or 64 token columns,
// 4-warp CTAs also with 2 warps per slab) with 2, 3 and 4 pipeline stages filled by cp.async and by
// tensor-map / bulk copies (TMA); (b) the CPU reference cpu::matmul_bf16 (+ the old output for
// kAdd) within fp32 tolerance. Shapes: N = 320, K = 2880 (the 20b's K; 20 slabs: groups cut by N at
// 16 slabs per CTA), N = 200, K = 4096 (the O projection's K; rows past N in the last slab), N =
// 72, K = 128 (2 chunks: parts 2 and 3 have none), and the tiny model's shapes (K = 64: one chunk).
// Bad arguments fail with messages naming them. Without a CUDA device, or on one without clusters
// (before sm_90), the tests are skipped (exit 77).
#include "cuda/dense_batch.h"
#include "tests/kernel-test-util.cuh"

namespace {

constexpr uint32_t kMaxN = 70;

struct Shape {
    uint32_t N, K;
};

// dense_batch_gemm (or gemm() at nb 8) over the first n rows of x; kAdd adds into `base` ([n, N]).
std::vector<float> run(const DenseW& d, const Dev<uint16_t>& x, uint32_t n, cuda::Epilogue e,
                       const std::vector<float>* base, bool reference_gemm) {
    Dev<float> out(size_t(n) * d.w.N);
    if (base) out.set(std::vector<float>(base->begin(), base->begin() + size_t(n) * d.w.N));
    if (reference_gemm) OK(cuda::gemm(d.w, x.p, n, nullptr, e, out.p, nullptr, d.w.N, 0, 8, nullptr));
    else OK(cuda::dense_batch_gemm(d.w, x.p, n, e, out.p, d.w.N, nullptr));
    sync_ok();
    return out.get();
}

void check_shape(const Shape& sh) {
    Rand r(sh.N * 7 + sh.K);
    const auto W = r.bf16s(size_t(sh.N) * sh.K, 0.1f);
    const auto b = r.bf16s(sh.N, 0.1f);
    DenseW d(W, b, sh.N, sh.K);
    const auto xf = r.floats_bf16(size_t(kMaxN) * sh.K, 1.0f);
    const Dev<uint16_t> x(permuted_rows(xf, kMaxN, sh.K));
    const auto base = r.floats(size_t(kMaxN) * sh.N, 5.0f);
    std::vector<float> ref(size_t(kMaxN) * sh.N);
    cpu::matmul_bf16(xf.data(), W.data(), b.data(), kMaxN, sh.K, sh.N, ref.data());
    std::vector<float> ref_add = ref;
    for (size_t i = 0; i < ref.size(); ++i) ref_add[i] += base[i];
    for (uint32_t n : {1u, 5u, 8u, 9u, 64u, 70u}) {
        const auto want = run(d, x, n, cuda::Epilogue::kStore, nullptr, true);
        const auto want_add = run(d, x, n, cuda::Epilogue::kAdd, &base, true);
        for (uint32_t shape = 0; shape < 96; ++shape) {
            const uint32_t warps = shape & 1 ? 8 : 4, spw = shape & 2 ? 2 : 1, cols = shape & 4 ? 32 : 64;
            const uint32_t split = shape & 16 ? 2 : 1;
            const int tma = shape & 8 ? 2 : 0, stages = 2 + int(shape / 32);
            if (split == 2 && warps == 8) continue;  // the column split runs on 4-warp CTAs only
            cuda::set_dense_batch_shape(warps, spw, cols);
            cuda::set_dense_batch_tma(tma);
            cuda::set_dense_batch_stages(stages);
            cuda::set_dense_batch_split(split);
            INFO("N " << sh.N << " K " << sh.K << " n " << n << " warps " << warps << " slabs/warp " << spw
                      << " columns " << cols << (tma ? " TMA" : " cp.async") << " stages " << stages
                      << " warps per slab " << split);
            const auto got = run(d, x, n, cuda::Epilogue::kStore, nullptr, false);
            const auto got_add = run(d, x, n, cuda::Epilogue::kAdd, &base, false);
            CHECK(same_bits(got, 0, want, 0, want.size()));
            CHECK(same_bits(got_add, 0, want_add, 0, want_add.size()));
            if (n == kMaxN) {
                expect_close(got, ref, 2e-4f, 1e-4f, "kStore vs CPU");
                expect_close(got_add, ref_add, 2e-4f, 1e-4f, "kAdd vs CPU");
            }
        }
        cuda::set_dense_batch_shape(0, 0);
        cuda::set_dense_batch_tma(-1);
        cuda::set_dense_batch_stages(0);
        cuda::set_dense_batch_split(0);
    }
}

}  // namespace

TEST_CASE("dense_batch_gemm gives gemm()'s bits at every token count and CTA shape, and matches the CPU") {
    for (const Shape& sh : {Shape{320, 2880}, Shape{200, 4096}, Shape{72, 128}}) check_shape(sh);
}

// The tiny synthetic model's projections (tools/gptoss-synth --preset tiny: H = 64, 4 query and
// 2 kv heads of 64): QKV 512 x 64 and lm_head-like 4096 x 64 have one 64-k chunk, so three of
// each cluster's four K-part CTAs only join the barriers and the distributed-shared-memory sum;
// O is 64 x 256. A case of its own so that compute-sanitizer can run it alone (-tc='*tiny*'):
// racecheck of test-kernels-batch's batched steps on the tiny model stops in dense_batch_kernel
// with an internal sanitizer error (bench/NOTES.md v31).
TEST_CASE("dense_batch_gemm at the tiny model's shapes (K = 64: one chunk, three empty K parts)") {
    for (const Shape& sh : {Shape{512, 64}, Shape{64, 256}, Shape{4096, 64}}) check_shape(sh);
}

TEST_CASE("dense_batch_plan: groups of warps x slabs per warp slabs, two per warp for lm_head-sized weights") {
    cuda::set_dense_batch_shape(4, 2);
    CHECK(cuda::dense_batch_plan(5120).groups == 40);
    CHECK(cuda::dense_batch_plan(201088).groups == 1571);
    cuda::set_dense_batch_shape(8, 1);
    CHECK(cuda::dense_batch_plan(2880).groups == 23);
    CHECK(cuda::dense_batch_plan(2880).slabs_per_cta == 8);
    cuda::set_dense_batch_shape(4, 1);
    CHECK(cuda::dense_batch_plan(72).groups == 2);
    CHECK(cuda::dense_batch_plan(5120).split == 1);
    cuda::set_dense_batch_split(2);  // two warps per slab: 4-warp CTAs only, the same groups
    CHECK(cuda::dense_batch_plan(5120).split == 2);
    CHECK(cuda::dense_batch_plan(5120).groups == 80);
    cuda::set_dense_batch_shape(8, 1);
    CHECK(cuda::dense_batch_plan(5120).split == 1);
    cuda::set_dense_batch_split(0);
    cuda::set_dense_batch_shape(0, 0);
    // Defaults: one slab per warp below 4096 slabs (QKV, O), two from there (lm_head).
    CHECK(cuda::dense_batch_plan(5120).slabs_per_cta == 4);
    CHECK(cuda::dense_batch_plan(65520).slabs_per_cta == 4);
    CHECK(cuda::dense_batch_plan(65536).slabs_per_cta == 8);
    CHECK(cuda::dense_batch_plan(201088).slabs_per_cta == 8);
    // 32-token columns where 4 K parts of the slab groups leave SMs without two CTAs (20b's O on
    // 132 SMs: 45 groups), else 64 (QKV: 80 groups; lm_head).
    CHECK(cuda::dense_batch_plan(2880, 132).cols == 32);
    CHECK(cuda::dense_batch_plan(5120, 132).cols == 64);
    CHECK(cuda::dense_batch_plan(201088, 132).cols == 64);
    CHECK(cuda::dense_batch_plan(2880, 0).cols == 64);
    cuda::set_dense_batch_shape(0, 0, 64);
    CHECK(cuda::dense_batch_plan(2880, 132).cols == 64);
    cuda::set_dense_batch_shape(0, 0);
}

TEST_CASE("dense_batch_gemm refuses what it does not run, naming it") {
    Dev<uint16_t> x(64 * 128);
    Dev<float> out(64 * 64);
    cuda::GemmWeights w;
    w.w = x.p; w.N = 64; w.K = 128;
    w.mxfp4 = true;
    CHECK(cuda::dense_batch_gemm(w, x.p, 64, cuda::Epilogue::kStore, out.p, 64, nullptr) == GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("MXFP4 64x128") != std::string::npos);
    w.mxfp4 = false;
    w.K = 96;
    CHECK(cuda::dense_batch_gemm(w, x.p, 64, cuda::Epilogue::kStore, out.p, 64, nullptr) == GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("bf16 64x96") != std::string::npos);
    w.K = 128;
    CHECK(cuda::dense_batch_gemm(w, x.p, 64, cuda::Epilogue::kSwiglu, out.p, 64, nullptr) == GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("epilogue 2") != std::string::npos);
    CHECK(cuda::dense_batch_gemm(w, x.p, 64, cuda::Epilogue::kStore, out.p, 32, nullptr) == GPTOSS_ERR_INTERNAL);
    CHECK(std::string(gptoss_last_error()).find("ldo (32)") != std::string::npos);
    CHECK(cuda::dense_batch_gemm(w, nullptr, 64, cuda::Epilogue::kStore, out.p, 64, nullptr) == GPTOSS_ERR_INTERNAL);
}

int main(int argc, char** argv) {
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0 && !cuda::dense_batch_supported()) {
        std::printf("no thread-block clusters on this GPU (before sm_90): skipping test-kernels-dense-batch\n");
        return 77;
    }
    return run_kernel_tests(argc, argv, "the batched dense projection tests (test-kernels-dense-batch)");
}
