// cuda/router.cuh - device pieces shared by the routers (router.cu: the T = 1 fused decode
// router and the generic top-K / grouping; router_batch.cu: the batched step's fused router):
// the warp top-K + softmax that defines the routing's bits, and the thread-block cluster
// barrier halves and DSMEM store the fused routers use to gather a token's logits from their
// 16-expert slab CTAs (sm_90; below that they compile to nothing and the callers do not launch
// the cluster forms).
#pragma once

#include "cuda/common.cuh"

#include <cmath>

namespace gptoss {
namespace cuda {
namespace router_detail {

constexpr uint32_t kMaxExperts = 256;
constexpr uint32_t kMaxK = 8;

// One warp: the K largest of l[0..E) in descending order (ties: lower expert first) and the
// softmax of those K logits. Lane l holds logits l, l+32, ...; K rounds of a warp argmax
// (larger value, then lower expert, wins). Results are valid in every lane.
__device__ __forceinline__ void warp_topk_softmax(const float* l, uint32_t E, uint32_t K, uint32_t lane,
                                                  int32_t (&idx)[kMaxK], float (&wt)[kMaxK]) {
    float v[kMaxExperts / 32];
#pragma unroll
    for (uint32_t i = 0; i < kMaxExperts / 32; ++i) {
        const uint32_t e = lane + 32 * i;
        v[i] = e < E ? l[e] : -INFINITY;
    }
    uint32_t taken = 0;
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
    float sum = 0.0f;
    float ex[kMaxK];
    for (uint32_t k = 0; k < K; ++k) { ex[k] = expf(val[k] - val[0]); sum += ex[k]; }
    for (uint32_t k = 0; k < K; ++k) wt[k] = ex[k] / sum;
}

// Thread-block cluster barrier halves and a store into another CTA's shared memory (sm_90).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_arrive_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait_acquire() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// *p (a shared-memory address of this CTA) = v in CTA `rank` of the cluster.
__device__ __forceinline__ void st_cluster_f32(float* p, uint32_t rank, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
#else
    (void)p, (void)rank, (void)v;
#endif
}

}  // namespace router_detail
}  // namespace cuda
}  // namespace gptoss
