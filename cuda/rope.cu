// cuda/rope.cu - YaRN rotary embedding (rotate-half, MODEL.md §YaRN RoPE) applied to the fused
// QKV projection output, splitting it into q (fp32, for attention) and the chunk's k/v (bf16,
// the cache's precision). Mirrors cpu::rope: angle = fp32(position · inv_freq[i]); cos and sin
// are multiplied by the YaRN attention factor; out = [x1·cos − x2·sin | x2·cos + x1·sin].
// The arithmetic is rope_cos_sin/rope_rotate (common.cuh), shared with the decode attention
// kernel, which rotates q and the new key itself (one launch fewer per layer).
// Mapping: one CTA of kRopeThreads threads per token: cos/sin once per frequency in shared
// memory, then threads stride over (head, i < D/2) pairs (loads batched), then over v.
// Floor: memory-bound, ~(Q + 2G)·D·(4 + 4) bytes per token; negligible next to the GEMMs.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace gptoss {
namespace cuda {
namespace {

// 256 threads per token (was 1024): 8 tokens per SM in flight instead of 2 (bench/NOTES.md "v19
// prefill rope").
constexpr uint32_t kRopeThreads = 256;

__global__ __launch_bounds__(kRopeThreads) void f32_rope_qkv_kernel(const float* __restrict__ qkv,
                                                          const StepInfo* __restrict__ step,
                                                          const float* __restrict__ inv_freq, float scale,
                                                          float* __restrict__ q, uint16_t* __restrict__ k,
                                                          uint16_t* __restrict__ v, uint16_t* __restrict__ k_cache,
                                                          uint16_t* __restrict__ v_cache, uint32_t slots,
                                                          uint32_t Q, uint32_t G, uint32_t D) {
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t t = blockIdx.x;
    if (k_cache) {  // decode: straight into the cache slot of this position
        const size_t slot = size_t(uint32_t(step->pos0) + t) % slots;
        k = k_cache + slot * G * D - size_t(t) * G * D;
        v = v_cache + slot * G * D - size_t(t) * G * D;
    }
    const uint32_t half = D / 2;
    const float pos = float(step->pos0 + int32_t(t));
    const float* row = qkv + size_t(t) * (Q + 2 * G) * D;
    // cos/sin once per frequency (sincosf is accurate, hence slow, for large angles).
    __shared__ float cs[128], sn[128];
    for (uint32_t i = threadIdx.x; i < half; i += blockDim.x) {
        rope_cos_sin(pos, inv_freq[i], scale, cs[i], sn[i]);
    }
    __syncthreads();
    // Each thread's pairs in batches of kU: all loads, then the rotations and stores (a strided
    // loop would pay one memory round trip per pair).
    constexpr uint32_t kU = 4;
    const uint32_t n_rot = (Q + G) * half;
    for (uint32_t base = threadIdx.x; base < n_rot; base += kU * blockDim.x) {
        float x1[kU], x2[kU];
        uint32_t heads[kU], is[kU];
#pragma unroll
        for (uint32_t u = 0; u < kU; ++u) {
            const uint32_t idx = base + u * blockDim.x;
            heads[u] = idx / half;
            is[u] = idx % half;
            x1[u] = idx < n_rot ? row[heads[u] * D + is[u]] : 0.0f;
            x2[u] = idx < n_rot ? row[heads[u] * D + is[u] + half] : 0.0f;
        }
#pragma unroll
        for (uint32_t u = 0; u < kU; ++u) {
            if (base + u * blockDim.x >= n_rot) break;
            const uint32_t head = heads[u], i = is[u];
            float o1, o2;
            rope_rotate(x1[u], x2[u], cs[i], sn[i], o1, o2);
            if (head < Q) {
                float* out = q + (size_t(t) * Q + head) * D;
                out[i] = o1;
                out[i + half] = o2;
            } else {
                uint16_t* out = k + (size_t(t) * G + (head - Q)) * D;
                out[i] = f32_to_bf16_bits(o1);
                out[i + half] = f32_to_bf16_bits(o2);
            }
        }
    }
    const float* vrow = row + (Q + G) * D;
    for (uint32_t idx = threadIdx.x; idx < G * D; idx += blockDim.x)
        v[size_t(t) * G * D + idx] = f32_to_bf16_bits(vrow[idx]);
}

}  // namespace

gptoss_status rope_qkv(const float* qkv, const StepInfo* step, const float* inv_freq, float scale,
                       float* q, uint16_t* k, uint16_t* v, uint16_t* k_cache, uint16_t* v_cache,
                       uint32_t slots, uint32_t T, uint32_t Q, uint32_t G, uint32_t D, cudaStream_t stream) {
    if (T == 0) return GPTOSS_OK;
    if (D > 256) return fail(GPTOSS_ERR_UNSUPPORTED, "rope: head_dim %u, at most 256", D);
    GPTOSS_LAUNCH(f32_rope_qkv_kernel, T, kRopeThreads, 0, stream, qkv, step, inv_freq, scale, q, k, v, k_cache, v_cache, slots, Q, G, D);
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
