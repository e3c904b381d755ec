// cuda/router.cu - MoE routing: top-K of the router logits (ties: lower expert first), softmax
// over the K chosen logits (gpt_oss/torch/model.py), and the grouped-GEMM work list: pairs
// (token·K + slot) grouped by expert and cut into tiles of `tile_tokens` columns.
// Mirrors cpu::router_topk. Mapping: one CTA; a warp per token for the top-K, then threads
// stride over the pairs.
// The order of pairs inside an expert's group comes from atomics and may vary between runs:
// that is harmless, because gemm.cu computes each column independently of its neighbours.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

#include <algorithm>
#include <cmath>

namespace gptoss {
namespace cuda {
namespace {

constexpr uint32_t kMaxExperts = 256;
constexpr uint32_t kMaxK = 8;

__global__ __launch_bounds__(1024) void f32_router_route_kernel(const float* __restrict__ logits, uint32_t T,
                                                               uint32_t E, uint32_t K, int32_t* experts,
                                                               float* weights, int32_t* tiles, int32_t* pairs,
                                                               uint32_t tile_tokens) {
    __shared__ int32_t count[kMaxExperts], offset[kMaxExperts], cursor[kMaxExperts];
    pdl_wait();
    pdl_launch_dependents();
    for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) { count[e] = 0; cursor[e] = 0; }
    __syncthreads();
    // One warp per token: lane l holds logits l, l+32, ...; K rounds of a warp argmax
    // (larger value, then lower expert, wins).
    const uint32_t lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
    for (uint32_t t = threadIdx.x >> 5; t < T; t += n_warps) {
        const float* l = logits + size_t(t) * E;
        float v[kMaxExperts / 32];
#pragma unroll
        for (uint32_t i = 0; i < kMaxExperts / 32; ++i) {
            const uint32_t e = lane + 32 * i;
            v[i] = e < E ? l[e] : -INFINITY;
        }
        uint32_t taken = 0;
        int32_t idx[kMaxK];
        float val[kMaxK];
        for (uint32_t k = 0; k < K; ++k) {
            float best_v = -INFINITY;
            int32_t best = int32_t(kMaxExperts);
#pragma unroll
            for (uint32_t i = 0; i < kMaxExperts / 32; ++i) {
                const uint32_t e = lane + 32 * i;
                if (e < E && !(taken >> i & 1u) && (best == int32_t(kMaxExperts) || v[i] > best_v)) {
                    best_v = v[i];
                    best = int32_t(e);
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, best_v, o);
                const int32_t oi = __shfl_xor_sync(0xffffffffu, best, o);
                if (oi != int32_t(kMaxExperts) &&
                    (best == int32_t(kMaxExperts) || ov > best_v || (ov == best_v && oi < best))) {
                    best_v = ov;
                    best = oi;
                }
            }
            idx[k] = best;
            val[k] = best_v;
            if (uint32_t(best) % 32 == lane) taken |= 1u << (uint32_t(best) / 32);
        }
        if (lane == 0) {
            float sum = 0.0f;
            float ex[kMaxK];
            for (uint32_t k = 0; k < K; ++k) { ex[k] = expf(val[k] - val[0]); sum += ex[k]; }
            for (uint32_t k = 0; k < K; ++k) {
                experts[t * K + k] = idx[k];
                weights[t * K + k] = ex[k] / sum;
                atomicAdd(&count[idx[k]], 1);
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t off = 0, n_tiles = 0;
        for (uint32_t e = 0; e < E; ++e) {
            offset[e] = off;
            for (int32_t s = 0; s < count[e]; s += int32_t(tile_tokens)) {
                int32_t* ti = tiles + 1 + 3 * n_tiles;
                ti[0] = int32_t(e);
                ti[1] = off + s;
                ti[2] = min(int32_t(tile_tokens), count[e] - s);
                ++n_tiles;
            }
            off += count[e];
        }
        tiles[0] = n_tiles;
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < T * K; i += blockDim.x) {
        const int32_t e = experts[i];
        pairs[offset[e] + atomicAdd(&cursor[e], 1)] = int32_t(i);
    }
}

}  // namespace

uint32_t route_max_tiles(uint32_t T, uint32_t E, uint32_t K, uint32_t tile_tokens) {
    // Each non-empty expert adds at most one partial tile, and a tile holds at least one pair.
    return std::min(ceil_div(T * K, tile_tokens) + std::min(E, T * K), T * K);
}

gptoss_status router_route(const float* logits, uint32_t T, uint32_t E, uint32_t K, int32_t* experts,
                           float* weights, int32_t* tiles, int32_t* pairs, uint32_t tile_tokens,
                           cudaStream_t stream) {
    if (E > kMaxExperts || K > kMaxK || K == 0 || K > E)
        return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA router: %u experts / top-%u, supported up to %u / %u", E, K,
                    kMaxExperts, kMaxK);
    if (T == 0) return GPTOSS_OK;
    const uint32_t threads = std::min(1024u, std::max(64u, 32u * T));
    GPTOSS_LAUNCH(f32_router_route_kernel, 1, threads, 0, stream, logits, T, E, K, experts, weights, tiles, pairs, tile_tokens);
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
