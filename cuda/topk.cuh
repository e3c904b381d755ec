// cuda/topk.cuh - the routers' top-K for one token (router.cu's router_route / router_decode /
// router_batch and gemm_decode.cu's router fold share it): one warp picks the K largest of E
// logits (ties: lower expert first), the softmax over those K (gpt_oss/torch/model.py), and the
// one-token route (experts, weights, one single-pair tile per expert) a T = 1 step's MoE reads.
// Mirrors cpu::router_topk.
#pragma once

#include "cuda/common.cuh"

#include <cmath>
#include <cstdint>

namespace gptoss {
namespace cuda {
namespace topk_detail {

constexpr uint32_t kMaxExperts = 256;
constexpr uint32_t kMaxK = 8;

// The unsigned key whose order is the float order of v for every non-NaN v (-0 as +0, so that the
// two tie as the float comparison has them; -inf maps to 0x007FFFFF, so 0 is below every key).
__device__ __forceinline__ uint32_t order_key(float v) {
    const uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// One warp: the K largest of l[0..E) in descending order (ties: lower expert first) and the
// softmax of those K logits. Lane l holds logits l, l+32, ...; K rounds of a warp argmax
// (larger value, then lower expert, wins). Results are valid in every lane. kSlots: logits per
// lane the loops cover (E <= 32·kSlots); fewer slots only drop slots that hold no expert, so
// every kSlots gives the same result.
template <uint32_t kSlots = kMaxExperts / 32>
__device__ __forceinline__ void warp_topk_softmax(const float* l, uint32_t E, uint32_t K, uint32_t lane,
                                                  int32_t (&idx)[kMaxK], float (&wt)[kMaxK], bool redux) {
    static_assert(kSlots >= 1 && kSlots <= kMaxExperts / 32, "warp_topk_softmax: 1..8 slots");
    float v[kSlots];
#pragma unroll
    for (uint32_t i = 0; i < kSlots; ++i) {
        const uint32_t e = lane + 32 * i;
        v[i] = e < E ? l[e] : -INFINITY;
    }
    float val[kMaxK];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // Without NaNs the order is total (value, then lower expert), so each round is one max
    // reduction of the lanes' best keys and one ballot per slot for the lowest expert holding it:
    // the same experts and values as the butterfly below, in ~4 dependent steps instead of 10
    // shuffles. The winner's key is cleared (0: below every key).
    bool nan = false;
#pragma unroll
    for (uint32_t i = 0; i < kSlots; ++i) nan |= lane + 32 * i < E && isnan(v[i]);
    if (redux && !__any_sync(0xffffffffu, nan)) {
        uint32_t key[kSlots];
#pragma unroll
        for (uint32_t i = 0; i < kSlots; ++i) key[i] = lane + 32 * i < E ? order_key(v[i]) : 0u;
        for (uint32_t k = 0; k < K; ++k) {
            uint32_t m = key[0];
#pragma unroll
            for (uint32_t i = 1; i < kSlots; ++i) m = max(m, key[i]);
            m = __reduce_max_sync(0xffffffffu, m);
            uint32_t slot = 0, owner = 0;
#pragma unroll
            for (uint32_t i = kSlots; i-- > 0;) {  // the lowest slot with a match wins
                const uint32_t b = __ballot_sync(0xffffffffu, key[i] == m);
                if (b) {
                    slot = i;
                    owner = uint32_t(__ffs(int(b)) - 1);
                }
            }
            float mine = v[0];
#pragma unroll
            for (uint32_t i = 1; i < kSlots; ++i)
                if (i == slot) mine = v[i];
            idx[k] = int32_t(owner + 32 * slot);
            val[k] = __shfl_sync(0xffffffffu, mine, int(owner));
            if (lane == owner) {
#pragma unroll
                for (uint32_t i = 0; i < kSlots; ++i)
                    if (i == slot) key[i] = 0u;
            }
        }
    } else
#endif
    {
    uint32_t taken = 0;
    for (uint32_t k = 0; k < K; ++k) {
        float best_v = -INFINITY;
        int32_t best = int32_t(kMaxExperts);
#pragma unroll
        for (uint32_t i = 0; i < kSlots; ++i) {
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
    }
    float sum = 0.0f;
    float ex[kMaxK];
    for (uint32_t k = 0; k < K; ++k) { ex[k] = expf(val[k] - val[0]); sum += ex[k]; }
    for (uint32_t k = 0; k < K; ++k) wt[k] = ex[k] / sum;
}

// router_route's output for one token from a warp's top-K (lane 0 calls it): experts / weights
// [K] in top-K order, tiles = {K, then one single-pair tile (expert, pair offset, 1) per chosen
// expert in increasing expert order}, pairs[rank] = the slot k of the expert of that rank.
__device__ __forceinline__ void write_decode_route(const int32_t (&idx)[kMaxK], const float (&wt)[kMaxK], uint32_t K,
                                                   int32_t* experts, float* weights, int32_t* tiles,
                                                   int32_t* pairs) {
    tiles[0] = int32_t(K);
    for (uint32_t k = 0; k < K; ++k) {
        experts[k] = idx[k];
        weights[k] = wt[k];
        uint32_t rank = 0;
        for (uint32_t k2 = 0; k2 < K; ++k2) rank += idx[k2] < idx[k];
        int32_t* ti = tiles + 1 + 3 * rank;
        ti[0] = idx[k];
        ti[1] = int32_t(rank);
        ti[2] = 1;
        pairs[rank] = int32_t(k);
    }
}

}  // namespace topk_detail
}  // namespace cuda
}  // namespace gptoss
