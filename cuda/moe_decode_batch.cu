// cuda/moe_decode_batch.cu - the persistent routed MXFP4 GEMM of the batched decode step (issue
// 13): at 64 decode tokens the step's MoE touches all 32 experts of a layer, and gemm()'s one CTA
// per (route tile, 16-row slab) made that ~18 000 short CTAs per GEMM (23 KB of weights each:
// a 4-deep ring filled from cold, then drained, per CTA; bench/NOTES.md "v14 batched decode").
// Here a grid of as many CTAs as fit at once walks the (tile, slab) items in a static order —
// CTA b takes items b, b + gridDim.x, ... (tile-major, so the items running at one time are
// neighbouring slabs of one or two experts) — and each item, like one CTA of gemm.cu at nb = 2,
// streams its slab's weights once for the tile's up to 16 pairs (each chunk dequantized once for
// both 8-column groups; an empty second group costs nothing). The next item's first weight chunks
// and activations are requested as soon as the current item's mma chain ends, before its
// reduction and epilogue, so the weights keep streaming across items. Arithmetic per item is
// gemm.cu's (warp w sums chunks w, w + 4, ... in order; the four warps' tiles are added in warp
// order; the same epilogue), so every output is bit-identical to gemm() with the same route and
// any nb, and depends only on its own pair (batch invariance). No atomics, no counters.
// Floor: the routed weight bytes of the experts in use at the copy bandwidth.
#include "cuda/moe_decode_batch.h"

#include "cuda/common.cuh"
#include "cuda/gemm.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace gptoss {
namespace cuda {

// Mode 4 (cuda/moe_batch_wide.cu): the arguments checked, the route's tiles of <= 16 pairs.
gptoss_status moe_batch_wide(const gemm_detail::KernelArgs& a, uint32_t ctas, cudaStream_t stream);

namespace {
using namespace gemm_detail;

constexpr int NB = 2;        // 8-column groups per item (route tiles of at most 16 pairs)
constexpr int kDepth = 4;    // weight chunks (and their activations) in flight per warp
constexpr int kMinCtas = 4;  // resident CTAs per SM the register budget is held to

// One work item: its expert, slab, columns, and where this lane's weights / activations start.
struct Item {
    int expert;
    uint32_t slab, col_base, n_cols;
    const uint4* wp;
    const uint2* sp;
    const uint4* xrow[NB];
};

// Reads item `item`'s tile and points this lane at its activations, requesting the first kDepth
// chunks of them (gemm.cu's prologue for one CTA, without the weights).
__device__ __forceinline__ void begin_x(const KernelArgs& a, uint32_t item, uint32_t slabs, uint32_t n_chunks, Item& it,
                                        uint4 (&xring)[kDepth][NB][2]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t tile = item / slabs;
    it.slab = item - tile * slabs;
    const int32_t* ti = a.route.tiles + 1 + 3 * tile;
    it.expert = ti[0];
    it.col_base = uint32_t(ti[1]);
    it.n_cols = uint32_t(ti[2]);
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        const uint32_t c = uint32_t(nb * 8 + g);
        it.xrow[nb] = nullptr;
        if (c < it.n_cols) {
            const uint32_t row = uint32_t(a.route.pairs[it.col_base + c]) / a.route.in_div;
            it.xrow[nb] = reinterpret_cast<const uint4*>(a.x + size_t(row) * a.w.K + t * 16);
        }
    }
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
        const uint32_t cc = uint32_t(warp) + 4u * i;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
            xring[i][nb][0] = xring[i][nb][1] = make_uint4(0, 0, 0, 0);
            if (cc < n_chunks && it.xrow[nb]) {
                xring[i][nb][0] = __ldg(it.xrow[nb] + size_t(cc) * 8);
                xring[i][nb][1] = __ldg(it.xrow[nb] + size_t(cc) * 8 + 1);
            }
        }
    }
}

// begin_x, then this lane's weight pointers and the first kDepth weight chunks from global memory.
__device__ __forceinline__ void begin_item(const KernelArgs& a, uint32_t item, uint32_t slabs, uint32_t n_chunks,
                                           Item& it, Chunk (&ring)[kDepth], uint4 (&xring)[kDepth][NB][2]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t tile = item / slabs;
    const int expert = a.route.tiles[1 + 3 * tile];
    slab_pointers<true>(a.w, expert, item - tile * slabs, n_chunks, lane, &it.wp, &it.sp);
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
        const uint32_t cc = uint32_t(warp) + 4u * i;
        if (cc < n_chunks) load_chunk<true>(ring[i], it.wp, it.sp, cc);
    }
    begin_x(a, item, slabs, n_chunks, it, xring);
}

// gemm.cu's epilogue for one item from the four warps' tiles in red (threads 0..63).
// tid / nthr: this thread's index among the nthr threads that share the item (default: the CTA).
__device__ __forceinline__ void finish_item(const KernelArgs& a, const Item& it, const float (&red)[4][NB * 32 * 4],
                                            int tid = -1, int nthr = 0) {
    const float* bias = a.w.bias ? a.w.bias + size_t(it.expert) * a.w.bias_expert_stride : nullptr;
    const int32_t* pairs = a.route.pairs + it.col_base;
    if (tid < 0) {
        tid = int(threadIdx.x);
        nthr = int(blockDim.x);
    }
    for (int u = tid; u < NB * 32; u += nthr) {
        const int nb = u >> 5, l = u & 31, gg = l >> 2, tt = l & 3;
        if (uint32_t(nb) * 8u >= it.n_cols) continue;
        float s[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = u * 4 + e;
            s[e] = __fadd_rn(__fadd_rn(__fadd_rn(red[0][i], red[1][i]), red[2][i]), red[3][i]);
        }
        const uint32_t r_lo = it.slab * 16 + gg, r_hi = r_lo + 8;
#pragma unroll
        for (int ci = 0; ci < 2; ++ci) {
            const uint32_t col = uint32_t(nb * 8 + 2 * tt + ci);
            if (col >= it.n_cols) continue;
            const uint32_t out_row = uint32_t(pairs[col]);
            if (a.epilogue == int(Epilogue::kSwiglu)) {
                float gate = s[ci] + (bias ? bias[r_lo] : 0.0f);
                float up = s[2 + ci] + (bias ? bias[r_hi] : 0.0f);
                gate = fminf(gate, a.limit);
                up = fminf(fmaxf(up, -a.limit), a.limit);
                const float sig = 1.0f / (1.0f + expf(-1.702f * gate));
                const float y = (up + 1.0f) * (gate * sig);
                const uint32_t j = it.slab * 8 + gg;
                a.out_bf16[size_t(out_row) * a.ldo + permuted_k(j)] = f32_to_bf16_bits(y);
            } else {
                float* o = a.out_f32 + size_t(out_row) * a.ldo;
                if (r_lo < a.w.N) o[r_lo] = s[ci] + (bias ? bias[r_lo] : 0.0f);
                if (r_hi < a.w.N) o[r_hi] = s[2 + ci] + (bias ? bias[r_hi] : 0.0f);
            }
        }
    }
}

// One item's mma chain (gemm.cu's main loop at nb = 2): warp w sums chunks w, w + 4, ... in order;
// ring[i] / xring[i] hold chunk w + 4i on entry; load_w(chunk, c) refills a weight chunk.
// Leaves the warp's tile in red[warp].
template <typename LoadW>
__device__ __forceinline__ void mma_chain(const Item& cur, uint32_t n_chunks, Chunk (&ring)[kDepth],
                                          uint4 (&xring)[kDepth][NB][2], float (&red)[4][NB * 32 * 4], LoadW load_w) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float acc[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.0f;
    for (uint32_t base = uint32_t(warp); base < n_chunks; base += 4u * kDepth) {
#pragma unroll
        for (int i = 0; i < kDepth; ++i) {
            const uint32_t c = base + 4u * i;
            if (c >= n_chunks) break;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                uint32_t af[4];
                fragment<true>(ring[i], j, af);
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    if (nb > 0 && uint32_t(nb) * 8u >= cur.n_cols) break;  // uniform over the CTA
                    const uint4 b = xring[i][nb][j >> 1];
                    mma(acc[nb], af, (j & 1) ? b.z : b.x, (j & 1) ? b.w : b.y);
                }
            }
            const uint32_t cn = c + 4u * kDepth;
            if (cn < n_chunks) {
                load_w(ring[i], cn);
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    if (cur.xrow[nb]) {
                        xring[i][nb][0] = __ldg(cur.xrow[nb] + size_t(cn) * 8);
                        xring[i][nb][1] = __ldg(cur.xrow[nb] + size_t(cn) * 8 + 1);
                    }
                }
            }
        }
    }
    float* mine = red[warp];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(nb * 32 + lane) * 4 + e] = acc[nb][e];
}

// Mode 1: every lane streams its weight chunks from global memory through its register ring.
__global__ __launch_bounds__(128, kMinCtas) void moe_batch_kernel(const KernelArgs a) {
    __shared__ float red[4][NB * 32 * 4];
    pdl_wait();  // the route and the activations are the previous kernels'
    const uint32_t n_tiles = min(uint32_t(a.route.tiles[0]), a.route.max_tiles);
    const uint32_t slabs = (a.w.N + 15) / 16, total = n_tiles * slabs, n_chunks = a.w.K >> 6;
    uint32_t item = blockIdx.x;
    Chunk ring[kDepth];
    uint4 xring[kDepth][NB][2];
    Item cur{};
    if (item < total) begin_item(a, item, slabs, n_chunks, cur, ring, xring);
    pdl_launch_dependents();
    while (item < total) {
        mma_chain(cur, n_chunks, ring, xring, red,
                  [&](Chunk& ch, uint32_t c) { load_chunk<true>(ch, cur.wp, cur.sp, c); });
        __syncthreads();
        // The ring is empty: request the next item's first chunks before this item's epilogue.
        const Item done = cur;
        const uint32_t next = item + gridDim.x;
        if (next < total) begin_item(a, next, slabs, n_chunks, cur, ring, xring);
        finish_item(a, done, red);
        __syncthreads();  // red is free again
        item = next;
    }
}

// Mode 2: each item's whole weight slab (n_chunks × 512 bytes of nibbles, then n_chunks × 64
// bytes of scales: contiguous in repack.cu's layout) arrives in shared memory by two bulk copies
// (cp.async.bulk, completion on an mbarrier) issued kStages items ahead by thread 0, so the bytes
// in flight per SM no longer depend on registers; the lanes read their chunks from the stage.
constexpr int kStages = 2;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void bulk_slab(const KernelArgs& a, uint32_t item, uint32_t slabs, uint32_t wbytes,
                                          uint32_t sbytes, uint32_t dst, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t tile = item / slabs, slab = item - tile * slabs;
    const size_t expert = size_t(a.route.tiles[1 + 3 * tile]);
    const char* gw = static_cast<const char*>(a.w.w) + expert * a.w.w_expert_stride + size_t(slab) * wbytes;
    const char* gs = reinterpret_cast<const char*>(a.w.scales + expert * a.w.s_expert_stride) + size_t(slab) * sbytes;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(wbytes + sbytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(gw), "r"(wbytes), "r"(bar)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     dst + wbytes),
                 "l"(gs), "r"(sbytes), "r"(bar)
                 : "memory");
#endif
}

__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n.reg .pred p;\nLAB_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra LAB_WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
#endif
}

__global__ __launch_bounds__(128, kMinCtas) void moe_batch_bulk_kernel(const KernelArgs a, uint32_t stage_bytes) {
    extern __shared__ __align__(128) unsigned char stage[];
    __shared__ float red[4][NB * 32 * 4];
    __shared__ __align__(8) uint64_t bars[kStages];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    pdl_wait();  // the route and the activations are the previous kernels'
    const uint32_t n_tiles = min(uint32_t(a.route.tiles[0]), a.route.max_tiles);
    const uint32_t slabs = (a.w.N + 15) / 16, total = n_tiles * slabs, n_chunks = a.w.K >> 6;
    const uint32_t wbytes = n_chunks * 512u, sbytes = n_chunks * 64u;
    const uint32_t stage0 = smem_u32(stage), bar0 = smem_u32(bars);
    uint32_t item = blockIdx.x;
    if (threadIdx.x == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        for (int s = 0; s < kStages; ++s)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar0 + 8u * s) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
        for (int s = 0; s < kStages; ++s) {
            const uint32_t it = item + uint32_t(s) * gridDim.x;
            if (it < total) bulk_slab(a, it, slabs, wbytes, sbytes, stage0 + uint32_t(s) * stage_bytes, bar0 + 8u * s);
        }
    }
    __syncthreads();
    Chunk ring[kDepth];
    uint4 xring[kDepth][NB][2];
    Item cur{};
    if (item < total) begin_x(a, item, slabs, n_chunks, cur, xring);
    pdl_launch_dependents();
    for (uint32_t k = 0; item < total; ++k) {
        const uint32_t s = k % kStages;
        bar_wait(bar0 + 8u * s, (k / kStages) & 1u);
        const uint4* sw = reinterpret_cast<const uint4*>(stage + s * stage_bytes) + lane;
        const uint2* ss = reinterpret_cast<const uint2*>(stage + s * stage_bytes + wbytes) + (lane >> 2);
        auto load_w = [&](Chunk& ch, uint32_t c) {
            ch.v[0] = sw[size_t(c) * 32];
            const uint2 sc = ss[size_t(c) * 8];
            ch.v[1].x = sc.x;
            ch.v[1].y = sc.y;
        };
#pragma unroll
        for (int i = 0; i < kDepth; ++i) {
            const uint32_t cc = uint32_t(warp) + 4u * i;
            if (cc < n_chunks) load_w(ring[i], cc);
        }
        mma_chain(cur, n_chunks, ring, xring, red, load_w);
        __syncthreads();  // every lane is done with stage s: refill it kStages items ahead
        if (threadIdx.x == 0) {
            const uint32_t it = item + uint32_t(kStages) * gridDim.x;
            if (it < total) bulk_slab(a, it, slabs, wbytes, sbytes, stage0 + s * stage_bytes, bar0 + 8u * s);
        }
        const Item done = cur;
        const uint32_t next = item + gridDim.x;
        if (next < total) begin_x(a, next, slabs, n_chunks, cur, xring);
        finish_item(a, done, red);
        __syncthreads();  // red is free again
        item = next;
    }
}


// Mode 3: the activations staged once per CTA. The (tile, slab) items, tile-major, are cut into
// gridDim.x contiguous ranges (CTA b takes the b-th: a static schedule); a range is one or a few
// segments of one tile each. Per segment the CTA copies its tile's up to 16 activation rows into
// shared memory once (rows beyond the tile's pairs zero, as gemm.cu's fragments are), and its
// kGroups groups of four warps walk the segment's slabs (group g: slabs g, g + kGroups, ...), each
// group computing exactly one gemm.cu CTA's item (same chunk order per warp, same reduction and
// epilogue) with its B fragments read from shared memory instead of L1/L2. So the activation bytes
// per weight byte drop by the slabs per segment (~50 at 64 tokens) and the bits stay gemm()'s.
constexpr int kGroups = 2;  // group_sync has a barrier for each

__device__ __forceinline__ void group_sync(int grp) {
    if (grp == 0)  // immediate barrier ids: a register id would reserve all 16 barriers
        asm volatile("bar.sync 1, 128;" ::: "memory");
    else
        asm volatile("bar.sync 2, 128;" ::: "memory");
}

// One item's mma chain for the group's four warps: weights through the register ring (ring[i]
// holds chunk warp + 4i on entry), activations from xs ([16][xstride] uint4, row = column of the
// tile). Leaves the warp's tile in red[warp]. kDepth3: weight chunks in flight per warp (4 or 8;
// the chunk order, hence the bits, is the same at any depth).
template <int kDepth3>
__device__ __forceinline__ void mma_chain_smem(uint32_t n_cols, uint32_t n_chunks, const uint4* wp, const uint2* sp,
                                               Chunk (&ring)[kDepth3], const uint4* xs, uint32_t xstride,
                                               float (&red)[4][NB * 32 * 4]) {
    const int tid = threadIdx.x & 127, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    float acc[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.0f;
    const uint4* xl = xs + size_t(g) * xstride + t * 2;
    for (uint32_t base = uint32_t(warp); base < n_chunks; base += 4u * kDepth3) {
#pragma unroll
        for (int i = 0; i < kDepth3; ++i) {
            const uint32_t c = base + 4u * i;
            if (c >= n_chunks) break;
            uint4 b[NB][2];
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                b[nb][0] = xl[size_t(nb * 8) * xstride + c * 8];
                b[nb][1] = xl[size_t(nb * 8) * xstride + c * 8 + 1];
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                uint32_t af[4];
                fragment<true>(ring[i], j, af);
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    if (nb > 0 && uint32_t(nb) * 8u >= n_cols) break;  // uniform over the CTA
                    const uint4 bb = b[nb][j >> 1];
                    mma(acc[nb], af, (j & 1) ? bb.z : bb.x, (j & 1) ? bb.w : bb.y);
                }
            }
            const uint32_t cn = c + 4u * kDepth3;
            if (cn < n_chunks) load_chunk<true>(ring[i], wp, sp, cn);
        }
    }
    float* mine = red[warp];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(nb * 32 + lane) * 4 + e] = acc[nb][e];
}

// Points the group's lanes at slab `slab` of `expert` and requests its first kDepth3 weight chunks.
template <int kDepth3>
__device__ __forceinline__ void begin_slab(const KernelArgs& a, int expert, uint32_t slab, uint32_t n_chunks,
                                           const uint4** wp, const uint2** sp, Chunk (&ring)[kDepth3]) {
    const int tid = threadIdx.x & 127, lane = tid & 31, warp = tid >> 5;
    slab_pointers<true>(a.w, expert, slab, n_chunks, lane, wp, sp);
#pragma unroll
    for (int i = 0; i < kDepth3; ++i) {
        const uint32_t cc = uint32_t(warp) + 4u * i;
        if (cc < n_chunks) load_chunk<true>(ring[i], *wp, *sp, cc);
    }
}

template <int kDepth3>
__global__ __launch_bounds__(128 * kGroups, 2) void moe_batch_smem_kernel(const KernelArgs a, uint32_t xstride) {
    extern __shared__ __align__(16) uint4 xs[];  // [16][xstride]: the segment's tile's activation rows
    __shared__ float red[kGroups][4][NB * 32 * 4];
    const int grp = int(threadIdx.x >> 7), tid = int(threadIdx.x & 127);
    pdl_wait();  // the route and the activations are the previous kernels'
    const uint32_t n_tiles = min(uint32_t(a.route.tiles[0]), a.route.max_tiles);
    const uint32_t slabs = (a.w.N + 15) / 16, total = n_tiles * slabs, n_chunks = a.w.K >> 6;
    const uint32_t per = (total + gridDim.x - 1) / gridDim.x, kq = a.w.K / 8;
    const uint32_t begin = min(total, blockIdx.x * per), end = min(total, begin + per);
    pdl_launch_dependents();
    const uint4* x = reinterpret_cast<const uint4*>(a.x);
    for (uint32_t seg = begin; seg < end;) {
        const uint32_t tile = seg / slabs, s0 = seg - tile * slabs, s1 = min(end - tile * slabs, slabs);
        const int32_t* ti = a.route.tiles + 1 + 3 * tile;
        Item it{};
        it.expert = ti[0];
        it.col_base = uint32_t(ti[1]);
        it.n_cols = uint32_t(ti[2]);
        Chunk ring[kDepth3];
        const uint4* wp = nullptr;
        const uint2* sp = nullptr;
        uint32_t s = s0 + uint32_t(grp);
        if (s < s1) begin_slab<kDepth3>(a, it.expert, s, n_chunks, &wp, &sp, ring);  // weights in flight during the copy
        __syncthreads();  // the previous segment is done with xs
        for (uint32_t u = threadIdx.x; u < 16 * kq; u += blockDim.x) {
            const uint32_t c = u / kq, q = u - c * kq;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (c < it.n_cols) v = __ldg(x + size_t(uint32_t(a.route.pairs[it.col_base + c]) / a.route.in_div) * kq + q);
            xs[size_t(c) * xstride + q] = v;
        }
        __syncthreads();
        while (s < s1) {
            mma_chain_smem<kDepth3>(it.n_cols, n_chunks, wp, sp, ring, xs, xstride, red[grp]);
            group_sync(grp);
            it.slab = s;
            s += kGroups;
            if (s < s1) begin_slab<kDepth3>(a, it.expert, s, n_chunks, &wp, &sp, ring);  // before this item's epilogue
            finish_item(a, it, red[grp], tid, 128);
            group_sync(grp);  // red[grp] is free again
        }
        seg = tile * slabs + s1;
    }
}

// Mode 3's row stride of xs in uint4 (one uint4 of padding: the eight columns' fragments fall in
// different banks) and its bytes, 0 where they do not fit two CTAs per SM.
uint32_t smem_x_stride(const GemmWeights& w, size_t* bytes) {
    int dev = 0, max_smem = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    const uint32_t stride = w.K / 8 + 1;
    *bytes = size_t(16) * stride * 16;
    const size_t per_cta = *bytes + sizeof(float) * kGroups * 4 * NB * 32 * 4 + 1024;
    return 2 * per_cta <= size_t(max_smem) ? stride : 0;
}

int env_int(const char* name, int def) {
    const char* s = std::getenv(name);
    return (s && *s) ? std::atoi(s) : def;
}

// As many CTAs of `fn` with `smem` dynamic bytes as fit on the device at once
// (GPTOSS_DECODE_BATCH_MOE_CTAS = per SM caps it).
template <typename Fn>
gptoss_status grid_ctas(Fn fn, size_t smem, uint32_t* out, int threads = 128) {
    int dev = 0, sms = 0, per_sm = 0;
    GPTOSS_CUDA_TRY(cudaGetDevice(&dev));
    GPTOSS_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    GPTOSS_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, smem));
    static const int want = env_int("GPTOSS_DECODE_BATCH_MOE_CTAS", 0);
    if (want > 0) per_sm = std::min(per_sm, want);
    *out = uint32_t(std::max(1, per_sm) * std::max(1, sms));
    return GPTOSS_OK;
}

// Mode 2's stage bytes for these weights, 0 where it cannot run here (compute capability below
// 9.0, a slab not 16-byte aligned, stages beyond the shared memory of a CTA).
uint32_t bulk_stage_bytes(const GemmWeights& w) {
    int dev = 0, major = 0, max_smem = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    const uint64_t n_chunks = w.K / 64, bytes = n_chunks * 576;
    const bool aligned = reinterpret_cast<uintptr_t>(w.w) % 16 == 0 && reinterpret_cast<uintptr_t>(w.scales) % 16 == 0 &&
                         w.w_expert_stride % 16 == 0 && (w.s_expert_stride * 2) % 16 == 0;
    const uint64_t stage = (bytes + 127) / 128 * 128;
    if (major < 9 || !aligned || stage * kStages + 8192 > uint64_t(max_smem) || bytes >= (1u << 20)) return 0;
    return uint32_t(stage);
}

// Mode 2's shared-memory carveout: just the stages of the CTAs per SM the grid will hold (all
// that fit, or GPTOSS_DECODE_BATCH_MOE_CTAS), so the rest of the SM's 256 KB stays L1 for the
// activation rows (every item reads its tile's rows: ~2x the weight bytes at 64 tokens).
gptoss_status bulk_carveout(size_t smem) {
    int dev = 0, per_sm_max = 0;
    GPTOSS_CUDA_TRY(cudaGetDevice(&dev));
    GPTOSS_CUDA_TRY(cudaDeviceGetAttribute(&per_sm_max, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    int fit = 0;
    GPTOSS_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, moe_batch_bulk_kernel, 128, smem));
    static const int want = env_int("GPTOSS_DECODE_BATCH_MOE_CTAS", 0);
    const int ctas = want > 0 ? std::min(std::max(fit, 1), want) : std::max(fit, 1);
    const size_t need = size_t(ctas) * (smem + sizeof(float) * 4 * NB * 32 * 4 + 1024);
    const size_t max_b = size_t(std::max(per_sm_max, 1));
    const int percent = int(std::min<size_t>(100, (need * 100 + max_b - 1) / max_b));
    GPTOSS_CUDA_TRY(cudaFuncSetAttribute(moe_batch_bulk_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent));
    return GPTOSS_OK;
}

}  // namespace

bool moe_batch_bulk_ok(const GemmWeights& w) { return w.mxfp4 && w.K % 64 == 0 && bulk_stage_bytes(w) != 0; }

int moe_batch_mode() {
    static const int mode = [] {
        const char* e = std::getenv("GPTOSS_DECODE_BATCH_MOE_PERSIST");
        const int v = e && *e ? std::atoi(e) : 4;
        return v >= 0 && v <= 4 ? v : 4;
    }();
    return mode;
}

uint32_t moe_batch_min_items() {
    static const uint32_t n = uint32_t(std::max(1, env_int("GPTOSS_DECODE_BATCH_MOE_MIN", 1)));
    return n;
}

gptoss_status moe_batch_gemm(const GemmWeights& w, const uint16_t* x, const GemmRoute& route, Epilogue epilogue,
                             float* out_f32, uint16_t* out_bf16, uint32_t ldo, float swiglu_limit, int mode,
                             uint32_t ctas, cudaStream_t stream) {
    if (!w.mxfp4 || w.K == 0 || w.K % 64 != 0 || w.N == 0)
        return fail(GPTOSS_ERR_INTERNAL, "moe_batch_gemm: needs MXFP4 experts with K %% 64 == 0 and N > 0 (%s %ux%u)",
                    w.mxfp4 ? "MXFP4" : "bf16", w.N, w.K);
    if (route.tile_tokens == 0 || route.tile_tokens > 16)
        return fail(GPTOSS_ERR_INTERNAL, "moe_batch_gemm: route tiles of %u pairs, expected 1..16", route.tile_tokens);
    if (epilogue == Epilogue::kAdd) return fail(GPTOSS_ERR_INTERNAL, "moe_batch_gemm: the kAdd epilogue is not supported");
    if (epilogue == Epilogue::kSwiglu && (w.N % 16 != 0 || !out_bf16))
        return fail(GPTOSS_ERR_INTERNAL, "moe_batch_gemm: SwiGLU needs N %% 16 == 0 (N=%u) and a bf16 output", w.N);
    if (epilogue == Epilogue::kStore && !out_f32) return fail(GPTOSS_ERR_INTERNAL, "moe_batch_gemm: fp32 output missing");
    if (!x || !route.tiles || !route.pairs || route.in_div == 0)
        return fail(GPTOSS_ERR_INTERNAL, "moe_batch_gemm: x and a route (tiles, pairs, in_div > 0) are required");
    if (mode < 1 || mode > 4) return fail(GPTOSS_ERR_INTERNAL, "moe_batch_gemm: mode %d, expected 1, 2, 3 or 4", mode);
    if (route.max_tiles == 0) return GPTOSS_OK;
    const KernelArgs a = kernel_args(w, x, 0, &route, epilogue, out_f32, out_bf16, ldo, swiglu_limit);
    if (mode == 4) return moe_batch_wide(a, ctas, stream);
    const uint64_t items = uint64_t(route.max_tiles) * ((w.N + 15) / 16);
    size_t xbytes = 0;
    const uint32_t xstride = mode == 3 ? smem_x_stride(w, &xbytes) : 0;
    if (xstride != 0) {
        static const bool deep = env_int("GPTOSS_DECODE_BATCH_MOE_DEPTH", 4) >= 8;
        const auto kernel = deep ? moe_batch_smem_kernel<8> : moe_batch_smem_kernel<4>;
        GPTOSS_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(xbytes)));
        if (ctas == 0) GPTOSS_TRY(grid_ctas(kernel, xbytes, &ctas, 128 * kGroups));
        ctas = uint32_t(std::min<uint64_t>(ctas, items));
        GPTOSS_TRY(cuda_status(launch_pdl(kernel, dim3(ctas), dim3(128 * kGroups), xbytes, stream, a, xstride),
                               "moe_batch_smem_kernel", __FILE__, __LINE__));
        return GPTOSS_OK;
    }
    const uint32_t stage = mode == 2 ? bulk_stage_bytes(w) : 0;
    if (stage != 0) {
        const size_t smem = size_t(stage) * kStages;
        GPTOSS_CUDA_TRY(cudaFuncSetAttribute(moe_batch_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        GPTOSS_TRY(bulk_carveout(smem));
        if (ctas == 0) GPTOSS_TRY(grid_ctas(moe_batch_bulk_kernel, smem, &ctas));
        ctas = uint32_t(std::min<uint64_t>(ctas, items));
        GPTOSS_TRY(cuda_status(launch_pdl(moe_batch_bulk_kernel, dim3(ctas), dim3(128), smem, stream, a, stage),
                               "moe_batch_bulk_kernel", __FILE__, __LINE__));
        return GPTOSS_OK;
    }
    if (ctas == 0) GPTOSS_TRY(grid_ctas(moe_batch_kernel, 0, &ctas));
    ctas = uint32_t(std::min<uint64_t>(ctas, items));
    GPTOSS_TRY(cuda_status(launch_pdl(moe_batch_kernel, dim3(ctas), dim3(128), 0, stream, a), "moe_batch_kernel",
                           __FILE__, __LINE__));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
