// cuda/router_fold.cuh - the decode graph's MoE router folded into the O projection's epilogue
// (issue 12; bench/NOTES.md "v49"). The router's logits are linear in the normed row:
// logits = W_r · (x · inv · γ) + b = inv · (W_r · (x ⊙ γ)) + b, inv = 1 / sqrt(mean(x²) + eps)
// (MODEL.md: RMSNorm, then the router linear; gpt_oss/torch/model.py). Each O CTA owns 16 rows
// of the new residual row x, so it writes, beside those rows, E partial dot products
// Σ_r W_r[e, r] · x[r] · γ[r] over its rows and its partial Σ x[r]²; the last CTA to finish (a
// counter, the attention kernel's pattern) adds the partials in slab order, scales by inv, adds
// the bias, takes the top-K (topk.cuh) and writes the route and the normed bf16 row xn for
// gate_up. That replaces router_decode's launch (a norm, a GEMV chain and a cross-CTA step
// after O's grid boundary) with one reduction at the end of O. Not router_decode's bits: the
// logits come from the fp32 row, not from the bf16 xn (decode need not equal prefill; near-ties
// may pick other experts than the prefill router, within the decode-vs-prefill tolerance
// tests). Deterministic: fixed summation orders, no floating-point atomics. Measured slower than
// router_decode's launch on an H100 (20b −4.3 %, 120b −13.6 %: the tail at O's end grows with E, the
// last CTA's sums of the 180 partials issuing their L2 loads a few at a time), so it is off by default
// (router_fold_default) until that tail is one round trip (bench/NOTES.md "v49", what would make it win).
// Used by gemm_decode.cu's kFold instances; the layout of the weights (one slab's [E][16] bf16
// contiguous) is router_fold_pack's (router_fold.cu).
#pragma once

#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/topk.cuh"

#include <cstdint>

namespace gptoss {
namespace cuda {
namespace fold_detail {

constexpr uint32_t kFoldMaxExperts = 128;
constexpr uint32_t kFoldMaxH = 4096;

// Shared memory of a kFold CTA of NW warps.
template <int NW>
struct FoldSmem {
    __align__(16) uint16_t w[kFoldMaxExperts * 16];  // this slab's router weights [E][16]
    float hg[16];                                    // x[r] · γ[r] of the slab's rows
    float red[NW][kFoldMaxExperts];                  // the last CTA: each warp's slab sums
    float logits[kFoldMaxExperts];
    float inv;
    int is_last;
};

// atomicAdd with acquire-release semantics at GPU scope.
__device__ __forceinline__ int atomic_add_acq_rel(int* p, int v) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// Before the kernel's dependency wait (the weights and γ are read only): the slab's router
// weights into shared memory (cp.async, waited for in fold_epilogue), γ of row slab·16 + tid for
// threads tid < 16.
template <int NW>
__device__ __forceinline__ float fold_prefetch(const RouterFoldArgs& f, FoldSmem<NW>& s, uint32_t slab, uint32_t N) {
    const uint4* src = reinterpret_cast<const uint4*>(f.w + size_t(slab) * f.E * 16);
    for (uint32_t i = threadIdx.x; i < 2 * f.E; i += NW * 32) cp_async16(s.w + 8 * i, src + i);
    const uint32_t row = slab * 16 + threadIdx.x;
    return threadIdx.x < 16 && row < N ? __ldg(f.norm_w + row) : 0.0f;
}

// The last CTA: sums the partials (warp w: slabs w, w + NW, ... in order; then the NW warp sums
// in warp order; Σ x² by warp 0: lane l's slabs l, l + 32, ..., then warp_sum), inv as
// rmsnorm_inv computes it, logits = u · inv + b, xn = bf16(x · inv · γ) (router_decode's
// expression), then warp 0's top-K and the route.
template <int NW>
__device__ __forceinline__ void fold_finish(const RouterFoldArgs& f, FoldSmem<NW>& s, const float* x, uint32_t N) {
    constexpr uint32_t R = NW * 32, kPer = (kFoldMaxH + R - 1) / R;
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, E = f.E, stride = E + 1;
    const uint32_t n_slabs = gridDim.x;
    // The row and γ for xn, requested first (independent of the sums).
    float xv[kPer], gv[kPer];
#pragma unroll
    for (uint32_t j = 0; j < kPer; ++j) {
        const uint32_t i = threadIdx.x + R * j;
        xv[j] = i < N ? __ldcg(x + i) : 0.0f;
        gv[j] = i < N ? __ldg(f.norm_w + i) : 0.0f;
    }
    for (uint32_t e = lane; e < E; e += 32) {
        float u = 0.0f;
        for (uint32_t sl = warp; sl < n_slabs; sl += NW) u += __ldcg(f.partial + size_t(sl) * stride + e);
        s.red[warp][e] = u;
    }
    float ss = 0.0f;
    if (warp == 0) {
        for (uint32_t sl = lane; sl < n_slabs; sl += 32) ss += __ldcg(f.partial + size_t(sl) * stride + E);
        ss = warp_sum(ss);
    }
    __syncthreads();
    if (warp == 0) {
        const float inv = 1.0f / sqrtf(ss / float(N) + f.eps);
        for (uint32_t e = lane; e < E; e += 32) {
            float u = s.red[0][e];
#pragma unroll
            for (int w = 1; w < NW; ++w) u += s.red[w][e];
            const float l = u * inv + (f.bias ? __ldg(f.bias + e) : 0.0f);
            s.logits[e] = l;
            f.logits[e] = l;
        }
        if (lane == 0) s.inv = inv;
    }
    __syncthreads();
    const float inv = s.inv;
#pragma unroll
    for (uint32_t j = 0; j < kPer; ++j) {
        const uint32_t i = threadIdx.x + R * j;
        if (i < N) f.xn[permuted_k(i)] = f32_to_bf16_bits(xv[j] * inv * gv[j]);
    }
    if (warp != 0) return;
    using namespace topk_detail;
    int32_t idx[kMaxK];
    float wt[kMaxK];
    if (E <= 32) warp_topk_softmax<1>(s.logits, E, f.K, lane, idx, wt, f.topk_redux != 0);
    else warp_topk_softmax<4>(s.logits, E, f.K, lane, idx, wt, f.topk_redux != 0);
    if (lane == 0) write_decode_route(idx, wt, f.K, f.experts, f.weights, f.tiles, f.pairs);
}

// Every thread of an O CTA, after its rows are stored: xr = the stored row value x[slab·16 +
// tid] for tid < 16 (0 past N or for other threads), g = fold_prefetch's γ. Writes the slab's
// partials, counts the CTA in, and the last CTA finishes the route (fold_finish). x: the
// residual row (the O kernel's output), N = H.
template <int NW>
__device__ __forceinline__ void fold_epilogue(const RouterFoldArgs& f, FoldSmem<NW>& s, uint32_t slab, float xr,
                                              float g, const float* x, uint32_t N) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, E = f.E;
    if (threadIdx.x < 16) s.hg[threadIdx.x] = xr * g;
    float ss = 0.0f;
    if (warp == 0) ss = warp_sum(xr * xr);  // lanes >= 16 hold 0
    cp_async_wait_all();
    __syncthreads();
    float* part = f.partial + size_t(slab) * (E + 1);
    if (warp == 0) {
        for (uint32_t e = lane; e < E; e += 32) {
            const uint4 lo = *reinterpret_cast<const uint4*>(s.w + e * 16);
            const uint4 hi = *reinterpret_cast<const uint4*>(s.w + e * 16 + 8);
            const uint32_t wv[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            float u = 0.0f;
#pragma unroll
            for (int r = 0; r < 8; ++r) {
                u = __fmaf_rn(__uint_as_float(wv[r] << 16), s.hg[2 * r], u);
                u = __fmaf_rn(__uint_as_float(wv[r] & 0xFFFF0000u), s.hg[2 * r + 1], u);
            }
            part[e] = u;
        }
        if (lane == 0) part[E] = ss;
    }
    // The arrival: every thread fences its stores, then a relaxed atomic (the attention kernel's
    // pattern), or (acq_rel) one acquire-release atomic by thread 0 after the CTA barrier (CUTLASS's
    // semaphore pattern: the barrier orders the CTA's stores before thread 0's release, its acquire
    // before the barrier that lets the CTA read the others' partials).
    if (!f.acq_rel) __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        s.is_last = (f.acq_rel ? atomic_add_acq_rel(f.counter, 1) : atomicAdd(f.counter, 1)) == int(gridDim.x) - 1;
        if (s.is_last) *f.counter = 0;
    }
    __syncthreads();
    if (!s.is_last) return;
    if (!f.acq_rel) __threadfence();
    fold_finish<NW>(f, s, x, N);
}

}  // namespace fold_detail
}  // namespace cuda
}  // namespace gptoss
