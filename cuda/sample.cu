// cuda/sample.cu - greedy sampling on the GPU: argmax over the fp32 logits [V], lowest id on
// ties (the definition of sample_logits at temperature 0, gptoss-internal.h), and the
// streaming-read probe gptoss-bench uses to measure the bandwidth ceiling.
// Mapping (argmax): a grid-stride pass; each CTA reduces its best (value, id) and publishes it
// with one 64-bit atomicMax on an orderable key (value bits, then ~id), so the result is
// deterministic whatever the scheduling. Floor: 4·V bytes (0.8 MB) — latency, not bandwidth.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace gptoss {
namespace cuda {
namespace {

__device__ __forceinline__ unsigned long long argmax_key(float v, uint32_t i) {
    uint32_t b = __float_as_uint(v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return (static_cast<unsigned long long>(b) << 32) | static_cast<unsigned long long>(~i);
}

__global__ __launch_bounds__(256) void f32_argmax_kernel(const float* __restrict__ logits, uint32_t V,
                                                        unsigned long long* key) {
    __shared__ unsigned long long best_w[8];
    unsigned long long best = 0;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < V; i += gridDim.x * blockDim.x) {
        const unsigned long long k = argmax_key(logits[i], i);
        best = k > best ? k : best;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other > best ? other : best;
    }
    if ((threadIdx.x & 31) == 0) best_w[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; ++w) best = best_w[w] > best ? best_w[w] : best;
        atomicMax(key, best);
    }
}

__global__ void read_probe_kernel(const uint4* __restrict__ data, size_t n, float* sink) {
    uint32_t acc = 0;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const uint4 v = ldg_stream(data + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *sink = float(acc);  // practically never; keeps the loads alive
}

}  // namespace

gptoss_status argmax(const float* logits, uint32_t V, int32_t* out, cudaStream_t stream) {
    // `out` must have room for 8 bytes (one 64-bit key); the caller decodes ~low word.
    auto* key = reinterpret_cast<unsigned long long*>(out);
    GPTOSS_CUDA_TRY(cudaMemsetAsync(key, 0, sizeof(*key), stream));
    f32_argmax_kernel<<<132, 256, 0, stream>>>(logits, V, key);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

gptoss_status read_probe(const void* data, size_t n_words16, float* sink, cudaStream_t stream) {
    read_probe_kernel<<<132 * 8, 512, 0, stream>>>(static_cast<const uint4*>(data), n_words16, sink);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
