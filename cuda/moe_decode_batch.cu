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

// Reads item `item`'s tile, points this lane at its weights and activations and requests the
// first kDepth chunks of both (gemm.cu's prologue for one CTA).
__device__ __forceinline__ void begin_item(const KernelArgs& a, uint32_t item, uint32_t slabs, uint32_t n_chunks,
                                           Item& it, Chunk (&ring)[kDepth], uint4 (&xring)[kDepth][NB][2]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t tile = item / slabs;
    it.slab = item - tile * slabs;
    const int32_t* ti = a.route.tiles + 1 + 3 * tile;
    it.expert = ti[0];
    it.col_base = uint32_t(ti[1]);
    it.n_cols = uint32_t(ti[2]);
    slab_pointers<true>(a.w, it.expert, it.slab, n_chunks, lane, &it.wp, &it.sp);
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
        const uint32_t cc = uint32_t(warp) + 4u * i;
        if (cc < n_chunks) load_chunk<true>(ring[i], it.wp, it.sp, cc);
    }
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

// gemm.cu's epilogue for one item from the four warps' tiles in red (threads 0..63).
__device__ __forceinline__ void finish_item(const KernelArgs& a, const Item& it, const float (&red)[4][NB * 32 * 4]) {
    const float* bias = a.w.bias ? a.w.bias + size_t(it.expert) * a.w.bias_expert_stride : nullptr;
    const int32_t* pairs = a.route.pairs + it.col_base;
    for (int u = threadIdx.x; u < NB * 32; u += blockDim.x) {
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

__global__ __launch_bounds__(128, kMinCtas) void moe_batch_kernel(const KernelArgs a) {
    __shared__ float red[4][NB * 32 * 4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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
                    load_chunk<true>(ring[i], cur.wp, cur.sp, cn);
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

int env_int(const char* name, int def) {
    const char* s = std::getenv(name);
    return (s && *s) ? std::atoi(s) : def;
}

// As many CTAs as fit on the device at once (GPTOSS_DECODE_BATCH_MOE_CTAS = per SM caps it), per
// device, queried once.
gptoss_status grid_ctas(uint32_t* out) {
    static int cached[64] = {};
    int dev = 0;
    GPTOSS_CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= 64 || cached[dev] == 0) {
        int sms = 0, per_sm = 0;
        GPTOSS_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        GPTOSS_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, moe_batch_kernel, 128, 0));
        const int want = env_int("GPTOSS_DECODE_BATCH_MOE_CTAS", 0);
        if (want > 0) per_sm = std::min(per_sm, want);
        const int n = std::max(1, per_sm) * std::max(1, sms);
        if (dev < 0 || dev >= 64) {
            *out = uint32_t(n);
            return GPTOSS_OK;
        }
        cached[dev] = n;
    }
    *out = uint32_t(cached[dev]);
    return GPTOSS_OK;
}

}  // namespace

bool moe_batch_enabled() {
    static const bool on = env_int("GPTOSS_DECODE_BATCH_MOE_PERSIST", 0) != 0;
    return on;
}

gptoss_status moe_batch_gemm(const GemmWeights& w, const uint16_t* x, const GemmRoute& route, Epilogue epilogue,
                             float* out_f32, uint16_t* out_bf16, uint32_t ldo, float swiglu_limit, uint32_t ctas,
                             cudaStream_t stream) {
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
    if (route.max_tiles == 0) return GPTOSS_OK;
    if (ctas == 0) GPTOSS_TRY(grid_ctas(&ctas));
    const uint64_t items = uint64_t(route.max_tiles) * ((w.N + 15) / 16);
    ctas = uint32_t(std::min<uint64_t>(ctas, items));
    const KernelArgs a = kernel_args(w, x, 0, &route, epilogue, out_f32, out_bf16, ldo, swiglu_limit);
    GPTOSS_TRY(cuda_status(launch_pdl(moe_batch_kernel, dim3(ctas), dim3(128), 0, stream, a), "moe_batch_kernel",
                           __FILE__, __LINE__));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
