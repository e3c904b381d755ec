// cuda/rmsnorm.cu - the residual stream update fused with the next RMSNorm: embedding lookup
// (first layer), MoE combine + residual add (end of each layer), then
// xn = bf16(x / sqrt(mean(x²) + eps) · w) in the permuted GEMM-input layout.
// Mirrors rmsnorm / the MoE sum of cpu/reference.h (MODEL.md §Forward pass); x stays fp32.
// Mapping: one CTA of 256 threads per token; thread i owns elements i, i+256, ...; the sum of
// squares is reduced warp-then-CTA in a fixed order (bit-identical for any T).
// Floor: memory-bound, (4 + 4 + 2)·H bytes per token (+16·H for the MoE combine).
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace gptoss {
namespace cuda {
namespace {

__global__ __launch_bounds__(256) void f32_residual_rmsnorm_kernel(ResidualArgs a, float* __restrict__ x,
                                                                  const float* __restrict__ w, float eps,
                                                                  uint16_t* __restrict__ xn, uint32_t H) {
    __shared__ float partial[8];
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t t = blockIdx.x;
    float* xr = x + size_t(t) * H;
    float ss = 0.0f;
    for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) {
        float v;
        if (a.mode == ResidualMode::kEmbed) {
            v = bf16_bits_to_f32(a.embed[size_t(a.tokens[t]) * H + i]);
            xr[i] = v;
        } else if (a.mode == ResidualMode::kMoeAdd) {
            float sum = 0.0f;
            for (uint32_t s = 0; s < a.K; ++s)
                sum = __fmaf_rn(a.weights[t * a.K + s], a.part[(size_t(t) * a.K + s) * H + i], sum);
            v = xr[i] + sum;
            xr[i] = v;
        } else {
            v = xr[i];
        }
        ss = __fmaf_rn(v, v, ss);
    }
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    float total = 0.0f;
    for (int i = 0; i < int(blockDim.x >> 5); ++i) total += partial[i];
    const float inv = 1.0f / sqrtf(total / float(H) + eps);
    uint16_t* out = xn + size_t(t) * H;
    for (uint32_t i = threadIdx.x; i < H; i += blockDim.x)
        out[permuted_k(i)] = f32_to_bf16_bits(xr[i] * inv * w[i]);
}

}  // namespace

gptoss_status residual_rmsnorm(const ResidualArgs& args, float* x, const float* norm_w, float eps,
                               uint16_t* xn, uint32_t T, uint32_t H, cudaStream_t stream) {
    if (T == 0) return GPTOSS_OK;
    if (H % 64 != 0) return fail(GPTOSS_ERR_UNSUPPORTED, "rmsnorm: H=%u is not a multiple of 64", H);
    GPTOSS_LAUNCH(f32_residual_rmsnorm_kernel, T, 256, 0, stream, args, x, norm_w, eps, xn, H);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
