// cuda/rmsnorm.cu - the residual stream update fused with the next RMSNorm: embedding lookup
// (first layer), MoE combine + residual add (end of each layer), then
// xn = bf16(x / sqrt(mean(x²) + eps) · w) in the permuted GEMM-input layout.
// Mirrors rmsnorm / the MoE sum of cpu/reference.h (MODEL.md §Forward pass); x stays fp32.
// Mapping: one CTA of 1024 threads per token; thread i owns elements i + 1024·j (j < 4, so
// H <= 4096), all loaded before any arithmetic (decode runs this at T = 1, where it is pure
// latency); the sum of squares is reduced warp-then-CTA in a fixed order (rmsnorm_inv in
// common.cuh, shared with the fused decode router; bit-identical for any T). Floor: memory-bound, (4 + 4 + 2)·H bytes per token (+16·H for the MoE combine).
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace gptoss {
namespace cuda {
namespace {

constexpr uint32_t kThreads = kNormThreads;
constexpr uint32_t kPer = kNormPer;
constexpr uint32_t kMaxSlots = 8;

__global__ __launch_bounds__(kThreads) void f32_residual_rmsnorm_kernel(ResidualArgs a, float* __restrict__ x,
                                                                       const float* __restrict__ w, float eps,
                                                                       uint16_t* __restrict__ xn, uint32_t H) {
    __shared__ float partial[kThreads / 32];
    float wn[kPer];  // the norm weight: read only, so loaded before the dependency wait
#pragma unroll
    for (uint32_t j = 0; j < kPer; ++j) {
        const uint32_t i = threadIdx.x + j * kThreads;
        wn[j] = i < H ? __ldg(w + i) : 0.0f;
    }
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t t = blockIdx.x;
    float* xr = x + size_t(t) * H;
    float v[kPer];
    if (a.mode == ResidualMode::kEmbed) {
        const uint16_t* row = a.embed + size_t(__ldg(a.tokens + t)) * H;
#pragma unroll
        for (uint32_t j = 0; j < kPer; ++j) {
            const uint32_t i = threadIdx.x + j * kThreads;
            v[j] = i < H ? bf16_bits_to_f32(row[i]) : 0.0f;
        }
    } else if (a.mode == ResidualMode::kMoeAdd) {
        float wt[kMaxSlots];  // unrolled: one memory round trip, not K
#pragma unroll
        for (uint32_t s = 0; s < kMaxSlots; ++s) wt[s] = s < a.K ? __ldg(a.weights + t * a.K + s) : 0.0f;
        float p[kPer][kMaxSlots];
#pragma unroll
        for (uint32_t j = 0; j < kPer; ++j) {
            const uint32_t i = threadIdx.x + j * kThreads;
            v[j] = i < H ? xr[i] : 0.0f;
#pragma unroll
            for (uint32_t s = 0; s < kMaxSlots; ++s)
                p[j][s] = (s < a.K && i < H) ? __ldg(a.part + (size_t(t) * a.K + s) * H + i) : 0.0f;
        }
#pragma unroll
        for (uint32_t j = 0; j < kPer; ++j) {
            float sum = 0.0f;
#pragma unroll
            for (uint32_t s = 0; s < kMaxSlots; ++s)
                if (s < a.K) sum = __fmaf_rn(wt[s], p[j][s], sum);
            v[j] += sum;
        }
    } else {
#pragma unroll
        for (uint32_t j = 0; j < kPer; ++j) {
            const uint32_t i = threadIdx.x + j * kThreads;
            v[j] = i < H ? xr[i] : 0.0f;
        }
    }
    const float inv = rmsnorm_inv<kThreads>([&](uint32_t, uint32_t j) { return v[j]; }, H, eps, partial);
    uint16_t* out = xn + size_t(t) * H;
#pragma unroll
    for (uint32_t j = 0; j < kPer; ++j) {
        const uint32_t i = threadIdx.x + j * kThreads;
        if (i >= H) continue;
        if (a.mode != ResidualMode::kNone) xr[i] = v[j];
        out[permuted_k(i)] = f32_to_bf16_bits(v[j] * inv * wn[j]);
    }
}

}  // namespace

gptoss_status residual_rmsnorm(const ResidualArgs& args, float* x, const float* norm_w, float eps,
                               uint16_t* xn, uint32_t T, uint32_t H, cudaStream_t stream) {
    if (T == 0) return GPTOSS_OK;
    if (H % 64 != 0 || H > kThreads * kPer)
        return fail(GPTOSS_ERR_UNSUPPORTED, "rmsnorm: H=%u must be a multiple of 64 and at most %u", H,
                    kThreads * kPer);
    if (args.mode == ResidualMode::kMoeAdd && args.K > kMaxSlots)
        return fail(GPTOSS_ERR_UNSUPPORTED, "rmsnorm: %u experts per token, at most %u", args.K, kMaxSlots);
    GPTOSS_LAUNCH(f32_residual_rmsnorm_kernel, T, kThreads, 0, stream, args, x, norm_w, eps, xn, H);
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
