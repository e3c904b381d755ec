// cuda/router.cu - MoE routing: top-K of the router logits (ties: lower expert first), softmax
// over the K chosen logits (gpt_oss/torch/model.py), and the grouped-GEMM work list: pairs
// (token·K + slot) grouped by expert and cut into tiles of `tile_tokens` columns.
// Mirrors cpu::router_topk. Mapping (router_route, any T): a warp per token for the top-K (8
// per CTA), then one CTA builds the tiles and scatters the pairs. The order of pairs inside an expert's group comes
// from atomics and may vary between runs: that is harmless, because gemm.cu computes each
// column independently of its neighbours. router_decode (T = 1) fuses the MLP RMSNorm, the
// router GEMV and this routing into one launch, bit-identical to the three it replaces (see the
// comment above its kernel); router_batch runs that kernel with a grid row per token of a
// batched step (its top-K only; router_group's work list follows). Floor: latency; the router
// weights (184 KB for 20b) are read while the O projection runs (PDL).
#include "cuda/common.cuh"
#include "cuda/gemm.cuh"
#include "cuda/kernels.h"
#include "cuda/topk.cuh"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace gptoss {
namespace cuda {
namespace {

using namespace topk_detail;

// Top-K + softmax: one warp per token, 8 tokens per CTA (all SMs; one CTA walking a 2048-token
// chunk took ~200 µs per layer).
__global__ __launch_bounds__(256) void f32_router_topk_kernel(const float* __restrict__ logits, uint32_t T,
                                                              uint32_t E, uint32_t K, int32_t* experts,
                                                              float* weights, int redux) {
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t lane = threadIdx.x & 31, t = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (t >= T) return;
    int32_t idx[kMaxK];
    float wt[kMaxK];
    warp_topk_softmax(logits + size_t(t) * E, E, K, lane, idx, wt, redux != 0);
    if (lane == 0) {
        for (uint32_t k = 0; k < K; ++k) {
            experts[t * K + k] = idx[k];
            weights[t * K + k] = wt[k];
        }
    }
}

// The grouped-GEMM work list from experts [T·K]: one CTA counts the pairs per expert, thread e
// finds its expert's first pair and tile (sums over the lower experts) and writes its tiles,
// then the threads scatter the pairs.
__global__ __launch_bounds__(1024) void f32_router_group_kernel(const int32_t* experts, uint32_t n_pairs, uint32_t E,
                                                               int32_t* tiles, int32_t* pairs,
                                                               uint32_t tile_tokens, uint32_t tile_extra) {
    __shared__ int32_t count[kMaxExperts], offset[kMaxExperts], cursor[kMaxExperts];
    pdl_wait();
    pdl_launch_dependents();
    for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) { count[e] = 0; cursor[e] = 0; }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n_pairs; i += blockDim.x) atomicAdd(&count[experts[i]], 1);
    __syncthreads();
    const int32_t tt = int32_t(tile_tokens), tx = int32_t(tile_extra);
    // Tiles of an expert with c pairs: ceil(c / tt), or with tile_extra ceil((c - tx) / tt) (at
    // least 1): the last one then holds c - (n - 1)·tt <= tt + tx pairs.
    auto n_tiles = [&](int32_t c) { return c <= tt + tx ? (c > 0 ? 1 : 0) : (c - tx + tt - 1) / tt; };
    for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t off = 0, first_tile = 0;
        for (uint32_t e2 = 0; e2 < e; ++e2) {
            off += count[e2];
            first_tile += n_tiles(count[e2]);
        }
        offset[e] = off;
        const int32_t nt = n_tiles(count[e]);
        for (int32_t i = 0; i < nt; ++i) {
            int32_t* ti = tiles + 1 + 3 * (first_tile + i);
            ti[0] = int32_t(e);
            ti[1] = off + i * tt;
            ti[2] = i + 1 < nt ? tt : count[e] - i * tt;
        }
        if (e == E - 1) tiles[0] = first_tile + nt;
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        const int32_t e = experts[i];
        pairs[offset[e] + atomicAdd(&cursor[e], 1)] = int32_t(i);
    }
}


// Decode (T = 1): RMSNorm + router GEMV + top-K + route, replacing residual_rmsnorm + gemm +
// router_route (three launches per layer). Every step mirrors the kernel it replaces, so the
// results are bit-identical: the norm is rmsnorm_inv (128 threads playing rmsnorm.cu's 1024);
// warp w of CTA s runs gemm.cu's NB = 1 chunk sequence (chunks w, w + 4, ... of 16-row slab s,
// the same mma order) on the normed row staged in shared memory, and the four warps' partial
// tiles are summed in warp order; top-K is warp_topk_softmax. Mapping: one CTA of 4 warps per
// 16-expert slab (2 for 20b, 8 for 120b: a single CTA cannot stream the router's 184-737 KB
// fast, one SM's share of the bandwidth being ~1/132); each warp's whole weight chain (12
// chunks for H = 2880) is loaded into registers before the dependency wait (PDL), i.e. while
// the O projection runs. The last CTA to finish (a counter, re-armed by that CTA) picks the
// top-K and writes the route. kCluster (sm_90, at most 8 slabs; GPTOSS_DECODE_ROUTER_CLUSTER):
// the slab CTAs form one thread-block cluster instead; each stores its 16 logits straight into
// CTA 0's shared memory (DSMEM) and one cluster barrier (release / acquire) replaces the
// fence + counter atomic + L2 re-read of the logits, i.e. two dependent L2 round trips on the
// layer's critical path. Same values in the same places: bit-identical either way.
// Chunks in registers per CTA: H <= 48·64 = 3072 in one pass, kRouterChunks / kWarps per warp.
constexpr uint32_t kRouterChunks = 48;
// The cluster's cross-CTA step by default (H200: +1 % tg, bench/NOTES.md "v14 decode").
constexpr bool kRouterClusterDefault = true;  // GPTOSS_DECODE_ROUTER_CLUSTER=0|1 overrides
// Warps per CTA of the decode graph's router (RouterDecodeArgs::warps 0); GPTOSS_DECODE_ROUTER_WARPS
// = 4 | 8 | 16 overrides. 16 (H200, bench/NOTES.md "v36"): each warp's chain is 3 chunks instead of
// 12 and the norm runs on 512 threads; 20b tg128 +1.3-3.5 %, 120b +3.1 % against 4.
constexpr uint32_t kRouterWarpsDefault = 16;

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

// kBatch (router_batch, kCluster only): grid row y is token y of a batched step (x, xn and logits
// offset by it), and the tail writes that token's experts / weights instead of a one-token route.
// kWarps (4, 8 or 16) warps per CTA split each slab's chunks (warp w: chunks w, w + kWarps, ...)
// and their partial tiles are summed in warp order: 4 is gemm()'s order (the bits above, which
// router_batch and a batched step of one token keep by default); 8 and 16 shorten the dependent
// chain of the decode graph's router (issue 12: decode need not equal prefill) with the same norm,
// xn and top-K, logits within fp32 rounding of gemm()'s. router_batch at 16 warps
// (RouterBatchArgs::warps) gives each token router_decode's 16-warp bits.
template <bool kCluster, bool kBatch = false, uint32_t kWarps = 4>
__global__ __launch_bounds__(32 * kWarps) void f32_router_decode_kernel(const RouterDecodeArgs a) {
    static_assert(kCluster || !kBatch, "the batched form gathers its logits through the cluster");
    static_assert(kWarps == 4 || kWarps == 8 || kWarps == 16, "router_decode: 4, 8 or 16 warps");
    constexpr uint32_t kDecodeDepth = kRouterChunks / kWarps;
    using namespace gemm_detail;
    __shared__ float logits[kMaxExperts];  // kCluster: CTA 0's copy is filled by every slab CTA
    // kCluster: the first half of the barrier that makes CTA 0's shared memory safe to store into
    // (every CTA of the cluster has started); its wait comes just before those stores.
    if constexpr (kCluster) cluster_arrive_relaxed();
    __shared__ float partial[kNormThreads / 32];
    __shared__ __align__(16) float xf[kNormThreads * kNormPer];
    __shared__ __align__(16) float wf[kNormThreads * kNormPer];
    __shared__ __align__(16) uint16_t xs[kNormThreads * kNormPer];
    __shared__ float red[kWarps][32];  // each warp's column-0 partials (lanes 4·gg hold them)
    __shared__ int is_last;
    const uint32_t lane = threadIdx.x & 31, kw = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t E = a.router.N, H = a.router.K, n_chunks = H >> 6, slab = blockIdx.x;
    const uint32_t tok = kBatch ? blockIdx.y : 0u;
    const float* x = a.x + size_t(tok) * H;
    uint16_t* xn = a.xn + size_t(tok) * H;
    float* logits_out = a.logits + size_t(tok) * E;
    const uint4* wp = reinterpret_cast<const uint4*>(a.router.w) + size_t(slab) * n_chunks * 128 + lane;
    Chunk ring[kDecodeDepth];
#pragma unroll
    for (uint32_t i = 0; i < kDecodeDepth; ++i) {
        const uint32_t cc = kw + kWarps * i;
        if (cc < n_chunks) load_chunk<false>(ring[i], wp, nullptr, cc);
    }
    // The norm weight (read only) before the wait, x after it: 16-byte cp.async copies, all in
    // flight at once (a load-then-store loop would pay one memory latency per iteration).
    for (uint32_t i = threadIdx.x; i < H / 4; i += blockDim.x) cp_async16(wf + 4 * i, a.norm_w + 4 * i);
    // The router bias of the logits this thread will hold (lanes 4·gg of warp 0: experts
    // slab·16 + gg and + 8), also before the wait: after it, it was one more dependent load.
    float b_lo = 0.0f, b_hi = 0.0f;
    if (a.router.bias && threadIdx.x < 32 && (threadIdx.x & 3) == 0) {
        const uint32_t e_lo = slab * 16 + (threadIdx.x >> 2), e_hi = e_lo + 8;
        if (e_lo < E) b_lo = __ldg(a.router.bias + e_lo);
        if (e_hi < E) b_hi = __ldg(a.router.bias + e_hi);
    }
    pdl_wait();
    pdl_launch_dependents();
    for (uint32_t i = threadIdx.x; i < H / 4; i += blockDim.x) cp_async16(xf + 4 * i, x + 4 * i);
    cp_async_wait_all();
    __syncthreads();
    const float inv = rmsnorm_inv<32 * kWarps>(
        [&](uint32_t q, uint32_t j) {
            const uint32_t i = threadIdx.x + 32 * kWarps * q + kNormThreads * j;
            return i < H ? xf[i] : 0.0f;
        },
        H, a.eps, partial);
    for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) {
        const uint16_t b = f32_to_bf16_bits(xf[i] * inv * wf[i]);
        xs[permuted_k(i)] = b;
        if (slab == 0) xn[permuted_k(i)] = b;
    }
    __syncthreads();

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint4* xrow = reinterpret_cast<const uint4*>(xs + t * 16);
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (uint32_t base = kw; base < n_chunks; base += kWarps * kDecodeDepth) {
#pragma unroll
        for (uint32_t i = 0; i < kDecodeDepth; ++i) {
            const uint32_t c = base + kWarps * i;
            if (c >= n_chunks) break;
            // Column g of the 8-column tile: only column 0 (this token) is non-zero.
            const uint4 xb0 = g == 0 ? xrow[size_t(c) * 8] : zero;
            const uint4 xb1 = g == 0 ? xrow[size_t(c) * 8 + 1] : zero;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                uint32_t af[4];
                fragment<false>(ring[i], j, af);
                const uint4 b = (j >> 1) ? xb1 : xb0;
                mma(acc, af, (j & 1) ? b.z : b.x, (j & 1) ? b.w : b.y);
            }
            const uint32_t cn = c + kWarps * kDecodeDepth;
            if (cn < n_chunks) load_chunk<false>(ring[i], wp, nullptr, cn);
        }
    }
    if (t == 0) {
#pragma unroll
        for (int e = 0; e < 4; ++e) red[kw][g * 4 + e] = acc[e];
    }
    __syncthreads();
    uint32_t r_lo = E, r_hi = E;  // the logits this thread holds (none: E)
    float l_lo = 0.0f, l_hi = 0.0f;
    if (threadIdx.x < 32 && (threadIdx.x & 3) == 0) {  // the lanes holding column 0
        const uint32_t l = threadIdx.x, gg = l >> 2;
        float s4[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const uint32_t i = gg * 4 + e;
            float v = red[0][i];
#pragma unroll
            for (uint32_t w = 1; w < kWarps; ++w) v = __fadd_rn(v, red[w][i]);
            s4[e] = v;
        }
        r_lo = min(slab * 16 + gg, E);
        r_hi = min(slab * 16 + gg + 8, E);
        if (r_lo < E) l_lo = s4[0] + b_lo;
        if (r_hi < E) l_hi = s4[2] + b_hi;
        if (r_lo < E) logits_out[r_lo] = l_lo;
        if (r_hi < E) logits_out[r_hi] = l_hi;
    }
    if constexpr (kCluster) {
        // Every thread: complete the start-up phase (CTA 0 is running), store into CTA 0's
        // logits, arrive (release: those stores), and CTA 0 waits (acquire) for the cluster.
        cluster_wait_acquire();
        if (r_lo < E) st_cluster_f32(&logits[r_lo], 0, l_lo);
        if (r_hi < E) st_cluster_f32(&logits[r_hi], 0, l_hi);
        cluster_arrive_release();
        cluster_wait_acquire();
        if (slab != 0 || kw != 0) return;
    } else {
        // The last slab CTA to finish routes (the attention kernel's counter pattern).
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            is_last = atomicAdd(a.counter, 1) == int(gridDim.x) - 1;
            if (is_last) *a.counter = 0;
        }
        __syncthreads();
        if (!is_last || kw != 0) return;
        __threadfence();
        for (uint32_t e = lane; e < E; e += 32) logits[e] = __ldcg(a.logits + e);
        __syncwarp();
    }
    int32_t idx[kMaxK];
    float wt[kMaxK];
    if (E <= 32) warp_topk_softmax<1>(logits, E, a.K, lane, idx, wt, a.topk_redux != 0);
    else if (E <= 128) warp_topk_softmax<4>(logits, E, a.K, lane, idx, wt, a.topk_redux != 0);
    else warp_topk_softmax(logits, E, a.K, lane, idx, wt, a.topk_redux != 0);
    if (lane != 0) return;
    if constexpr (kBatch) {  // router_route's top-K output for this token; router_route's work list follows
        for (uint32_t k = 0; k < a.K; ++k) {
            a.experts[tok * a.K + k] = idx[k];
            a.weights[tok * a.K + k] = wt[k];
        }
        return;
    }
    write_decode_route(idx, wt, a.K, a.experts, a.weights, a.tiles, a.pairs);
}

}  // namespace

uint32_t route_max_tiles(uint32_t T, uint32_t E, uint32_t K, uint32_t tile_tokens) {
    // Each non-empty expert adds at most one partial tile, and a tile holds at least one pair.
    return std::min(ceil_div(T * K, tile_tokens) + std::min(E, T * K), T * K);
}

namespace {
// router_route's and router_group's argument checks (the same errors either way).
gptoss_status check_route(uint32_t T, uint32_t E, uint32_t K, uint32_t tile_tokens) {
    if (E > kMaxExperts || K > kMaxK || K == 0 || K > E)
        return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA router: %u experts / top-%u, supported up to %u / %u", E, K,
                    kMaxExperts, kMaxK);
    if (T != 0 && tile_tokens == 0) return fail(GPTOSS_ERR_INTERNAL, "CUDA router: tile_tokens is 0");
    return GPTOSS_OK;
}
}  // namespace

gptoss_status router_route(const float* logits, uint32_t T, uint32_t E, uint32_t K, int32_t* experts,
                           float* weights, int32_t* tiles, int32_t* pairs, uint32_t tile_tokens,
                           cudaStream_t stream, uint32_t tile_extra) {
    GPTOSS_TRY(check_route(T, E, K, tile_tokens));
    if (T == 0) return GPTOSS_OK;
    GPTOSS_LAUNCH(f32_router_topk_kernel, ceil_div(T, 8), 256, 0, stream, logits, T, E, K, experts, weights,
                  router_topk_redux() ? 1 : 0);
    return router_group(experts, T, E, K, tiles, pairs, tile_tokens, stream, tile_extra);
}

gptoss_status router_group(const int32_t* experts, uint32_t T, uint32_t E, uint32_t K, int32_t* tiles,
                           int32_t* pairs, uint32_t tile_tokens, cudaStream_t stream, uint32_t tile_extra) {
    GPTOSS_TRY(check_route(T, E, K, tile_tokens));
    if (T == 0) return GPTOSS_OK;
    const uint32_t threads = std::min(1024u, std::max(256u, 32u * ceil_div(T * K, 32)));
    GPTOSS_LAUNCH(f32_router_group_kernel, 1, threads, 0, stream, experts, T * K, E, tiles, pairs, tile_tokens,
                  tile_extra);
    return GPTOSS_OK;
}

namespace {
OnSwitch g_router_topk_redux("GPTOSS_ROUTER_TOPK_REDUX");
}  // namespace
bool router_topk_redux() { return g_router_topk_redux.on(); }
void set_router_topk_redux(bool on) { g_router_topk_redux.set(on); }

bool router_decode_supported(uint32_t E, uint32_t K, uint32_t H) {
    return E >= 1 && E <= kMaxExperts && K >= 1 && K <= kMaxK && K <= E && H % 64 == 0 &&
           H <= kNormThreads * kNormPer;
}

bool router_decode_cluster_default() {
    static const bool on = [] {
        const char* s = std::getenv("GPTOSS_DECODE_ROUTER_CLUSTER");
        return (s && *s) ? std::atoi(s) != 0 : kRouterClusterDefault;
    }();
    return on;
}

bool router_decode_cluster_usable(uint32_t E) {
    const uint32_t slabs = ceil_div(E, 16);
    if (E == 0 || slabs > 8 || !pdl_supported()) return false;
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, f32_router_decode_kernel<true>) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return fa.binaryVersion >= 90;
}

uint32_t router_decode_warps_default() {
    static const uint32_t w = uint32_t(env_choice("GPTOSS_DECODE_ROUTER_WARPS", {4, 8, 16}, int(kRouterWarpsDefault)));
    return w;
}

namespace {
template <uint32_t kWarps>
gptoss_status router_decode_launch(const RouterDecodeArgs& args, bool cluster, cudaStream_t stream) {
    RouterDecodeArgs a = args;
    a.topk_redux = router_topk_redux() ? 1 : 0;
    const uint32_t slabs = ceil_div(a.router.N, 16);
    if (!cluster) {
        GPTOSS_LAUNCH((f32_router_decode_kernel<false, false, kWarps>), slabs, 32 * kWarps, 0, stream, a);
        return GPTOSS_OK;
    }
    return cuda_status(launch_pdl_cluster(f32_router_decode_kernel<true, false, kWarps>, dim3(slabs), dim3(32 * kWarps),
                                          0, stream, dim3(slabs, 1, 1), a),
                       "f32_router_decode_kernel (cluster)", __FILE__, __LINE__);
}
}  // namespace

gptoss_status router_decode(const RouterDecodeArgs& a, cudaStream_t stream) {
    const uint32_t E = a.router.N, H = a.router.K;
    if (!router_decode_supported(E, a.K, H) || a.router.mxfp4)
        return fail(GPTOSS_ERR_UNSUPPORTED,
                    "CUDA router_decode: %u experts / top-%u / hidden %u, supported up to %u / %u / %u (bf16)", E, a.K,
                    H, kMaxExperts, kMaxK, kNormThreads * kNormPer);
    const uint32_t warps = a.warps == 0 ? router_decode_warps_default() : a.warps;
    if (warps != 4 && warps != 8 && warps != 16)
        return fail(GPTOSS_ERR_INTERNAL, "CUDA router_decode: %u warps per CTA (4, 8 or 16)", warps);
    const bool cluster = (a.cluster < 0 ? router_decode_cluster_default() : a.cluster != 0) && router_decode_cluster_usable(E);
    if (!a.logits || (!cluster && !a.counter))
        return fail(GPTOSS_ERR_INTERNAL, "CUDA router_decode: logits and counter are required");
    if (warps == 8) return router_decode_launch<8>(a, cluster, stream);
    if (warps == 16) return router_decode_launch<16>(a, cluster, stream);
    return router_decode_launch<4>(a, cluster, stream);
}

// ---- router_batch (kernels.h): the batched step's norm + router + top-K, router_decode's cluster
// form with a grid row per token (kBatch). bench/NOTES.md "v34": the norm, gemm and top-K launches
// with the work list cost ~10 µs per layer in the step's graph; this form + the work list, one
// token per CTA, measured +1.2 % at 8 streams (20b), −0.6 % on the 120b at 64.
bool router_batch_usable(uint32_t E, uint32_t K, uint32_t H) {
    return router_decode_supported(E, K, H) && router_decode_cluster_usable(E);
}

gptoss_status router_batch(const RouterBatchArgs& b, cudaStream_t stream) {
    const uint32_t E = b.router.N, H = b.router.K;
    if (b.router.mxfp4 || !router_batch_usable(E, b.K, H))
        return fail(GPTOSS_ERR_UNSUPPORTED,
                    "CUDA router_batch: %u experts / top-%u / hidden %u on this device (needs sm_90 clusters, bf16, "
                    "E <= 128, K <= %u, H %% 64 == 0, H <= %u)",
                    E, b.K, H, kMaxK, kNormThreads * kNormPer);
    if (!b.x || !b.norm_w || !b.xn || !b.logits || !b.experts || !b.weights)
        return fail(GPTOSS_ERR_INTERNAL, "CUDA router_batch: x, norm_w, xn, logits, experts and weights are required");
    if (b.T == 0) return GPTOSS_OK;
    RouterDecodeArgs a;
    a.x = b.x; a.norm_w = b.norm_w; a.eps = b.eps; a.router = b.router; a.K = b.K;
    a.xn = b.xn; a.logits = b.logits; a.experts = b.experts; a.weights = b.weights;
    a.topk_redux = router_topk_redux() ? 1 : 0;
    if (b.warps != 4 && b.warps != 16)
        return fail(GPTOSS_ERR_INTERNAL, "CUDA router_batch: %u warps per CTA (4 or 16)", b.warps);
    const uint32_t slabs = ceil_div(E, 16);
    const auto kernel = b.warps == 16 ? f32_router_decode_kernel<true, true, 16> : f32_router_decode_kernel<true, true, 4>;
    return cuda_status(launch_pdl_cluster(kernel, dim3(slabs, b.T), dim3(32 * b.warps), 0, stream, dim3(slabs, 1, 1), a),
                       "f32_router_decode_kernel (batch)", __FILE__, __LINE__);
}

}  // namespace cuda
}  // namespace gptoss
