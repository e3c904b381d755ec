// cuda/mask.cu - constrained decoding on the GPU: apply_token_mask sets the fp32 logits [V] of
// every token the grammar forbids to -inf, in place, before the sampler runs (the allowed-token
// bitmask [ceil(V/32)] u32 comes from the host, tokenizer/grammar-mask.h), so the logits never
// leave the device. -inf logits get p = exp(-inf) = 0 in sample.cu exactly as in sample_logits,
// so the masked sampler keeps the host definition. Mapping: one thread per logit, 256 per CTA;
// thread t reads word t/32 (a warp shares one word). Floor: 4·V + V/8 bytes (~0.8 MB) — a few µs
// of latency, dwarfed by the mask's 25 KB upload.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

#include <cmath>

namespace gptoss {
namespace cuda {
namespace {

__global__ __launch_bounds__(256) void f32_apply_token_mask_kernel(float* __restrict__ logits,
                                                                  const uint32_t* __restrict__ allowed, uint32_t V) {
    const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= V) return;
    if (!((__ldg(allowed + (t >> 5)) >> (t & 31)) & 1u)) logits[t] = -INFINITY;
}

}  // namespace

gptoss_status apply_token_mask(float* logits, const uint32_t* allowed, uint32_t V, cudaStream_t stream) {
    if (logits == nullptr || allowed == nullptr || V == 0)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "apply_token_mask: null buffer or V = 0");
    f32_apply_token_mask_kernel<<<(V + 255) / 256, 256, 0, stream>>>(logits, allowed, V);
    return cuda_status(cudaGetLastError(), "apply_token_mask", __FILE__, __LINE__);
}

}  // namespace cuda
}  // namespace gptoss
