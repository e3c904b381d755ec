// cuda/moe_decode_batch.cu - the batched decode step's routed MXFP4 GEMM (issue 13;
// moe_decode_batch.h): one dequantization per weight chunk and few instructions around it. At 64
// tokens gemm()'s structure spent the SMs' issue slots on more than the dequantization
// (bench/NOTES.md "v16 batched decode", round 4): tiles of 8 pairs dequantize an expert's chunk
// once per tile (1.4 tiles per expert at 64 tokens), the four warps of a CTA hold ~11 chunks of a
// slab each and meet at a barrier, a shared-memory reduction and a one-warp epilogue, and the
// activation fragments come from L1/L2 beside each chunk. Here a CTA of 8 warps takes one
// contiguous range of (route tile of <= 16 pairs, 16-row slab) items (a static schedule: no
// counters, no atomics); per tile in its range it stages the tile's activation rows in shared
// memory once (cp.async), and each warp walks its own slabs of the tile (slab s0 + warp, + 8,
// ...): all of a slab's 64-k chunks in order, the k16 steps alternating between two accumulator
// chains (even and odd steps, added at the end: half the mma dependency chain), the epilogue from
// the warp's registers. The summation order is a function of K alone, never of the batch, the
// tile or the grid, so a pair's output is the same whichever pairs share the step (batch
// invariance); it is not gemm()'s order (the bits differ from gemm()'s in the last places).
// H200, 20b, 64 streams: MoE 5.10 -> 4.10 ms per step, +5.8 % decode tok/s (with v20's batched
// attention; +12 % before it); equal at 8 streams; alone (one stream with batching on) -14 % (one
// warp's 45-chunk chain per slab is longer than gemm()'s 11).
// Three earlier designs that kept gemm()'s bits (a persistent register ring, bulk copies of whole
// slabs into shared memory, staged activations with gemm()'s 4-warp K split; bench/NOTES.md "v16
// batched decode") were no faster than gemm() and are gone (v20).
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

constexpr int kWarps = 8;  // per CTA; two CTAs per SM (the staged rows: 16 x K bf16)

// Points this lane at slab `slab` of `expert` and requests its first D chunks into the ring.
template <int D>
__device__ __forceinline__ void ring_begin(const KernelArgs& a, int expert, uint32_t slab, uint32_t n_chunks,
                                           Chunk (&ring)[D], const uint4** wp, const uint2** sp) {
    slab_pointers<true>(a.w, expert, slab, n_chunks, int(threadIdx.x & 31), wp, sp);
#pragma unroll
    for (int i = 0; i < D; ++i)
        if (uint32_t(i) < n_chunks) load_chunk<true>(ring[i], *wp, *sp, uint32_t(i));
}

// The n_chunks chunks of one slab for G 8-column groups: ring[i] holds chunk i on entry; xl: this
// lane's activation fragments in shared memory (column g of group 0; group 1 is 8 rows below, xg8
// uint4 further). acc[g] = the slab's sum: chunks in order, k16 steps 0, 2 into one chain and 1, 3
// into another, the two added at the end (even + odd).
template <int D, int G>
__device__ __forceinline__ void chain(Chunk (&ring)[D], const uint4* wp, const uint2* sp, uint32_t n_chunks,
                                      const uint4* xl, uint32_t xg8, float (&acc)[2][4]) {
    float a2[G][2][4];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int h = 0; h < 2; ++h) a2[g][h][0] = a2[g][h][1] = a2[g][h][2] = a2[g][h][3] = 0.0f;
    for (uint32_t base = 0; base < n_chunks; base += D) {
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const uint32_t c = base + i;
            if (c >= n_chunks) break;
            uint4 b[G][2];
#pragma unroll
            for (int g = 0; g < G; ++g) {
                b[g][0] = xl[g * xg8 + c * 8];
                b[g][1] = xl[g * xg8 + c * 8 + 1];
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                uint32_t af[4];
                fragment<true>(ring[i], j, af);
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    const uint4 bb = b[g][j >> 1];
                    mma(a2[g][j & 1], af, (j & 1) ? bb.z : bb.x, (j & 1) ? bb.w : bb.y);
                }
            }
            if (c + D < n_chunks) load_chunk<true>(ring[i], wp, sp, c + D);
        }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        acc[0][e] = __fadd_rn(a2[0][0][e], a2[0][1][e]);
        acc[1][e] = G > 1 ? __fadd_rn(a2[G - 1][0][e], a2[G - 1][1][e]) : 0.0f;  // G == 1: never stored
    }
}

// The epilogue of one (tile, slab) from this lane's sums: lane (g, t) holds rows slab·16 + g and
// + 8 of columns 8·gi + 2t and + 1 (mma C layout). SwiGLU: row g is the gate, row g + 8 the up
// projection of intermediate slab·8 + g (repack.cu's interleave, as gemm.cu's epilogue).
__device__ __forceinline__ void store_tile(const KernelArgs& a, int expert, uint32_t slab, const int32_t* pairs,
                                           uint32_t n_cols, const float (&acc)[2][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float* bias = a.w.bias ? a.w.bias + size_t(expert) * a.w.bias_expert_stride : nullptr;
    const uint32_t r_lo = slab * 16 + g, r_hi = r_lo + 8;
    const float b_lo = bias && r_lo < a.w.N ? bias[r_lo] : 0.0f, b_hi = bias && r_hi < a.w.N ? bias[r_hi] : 0.0f;
#pragma unroll
    for (int gi = 0; gi < 2; ++gi)
#pragma unroll
        for (int ci = 0; ci < 2; ++ci) {
            const uint32_t col = uint32_t(gi * 8 + 2 * t + ci);
            if (col >= n_cols) continue;
            const uint32_t out_row = uint32_t(pairs[col]);
            if (a.epilogue == int(Epilogue::kSwiglu)) {
                float gate = acc[gi][ci] + b_lo;
                float up = acc[gi][2 + ci] + b_hi;
                const float y = swiglu_clamped(gate, up, a.limit);
                a.out_bf16[size_t(out_row) * a.ldo + permuted_k(slab * 8 + g)] = f32_to_bf16_bits(y);
            } else {
                float* o = a.out_f32 + size_t(out_row) * a.ldo;
                if (r_lo < a.w.N) o[r_lo] = acc[gi][ci] + b_lo;
                if (r_hi < a.w.N) o[r_hi] = acc[gi][2 + ci] + b_hi;
            }
        }
}

template <int D>
__global__ __launch_bounds__(32 * kWarps, 2) void moe_batch_kernel(const KernelArgs a, uint32_t xstride) {
    extern __shared__ __align__(16) uint4 xs[];  // [16][xstride]: the current tile's activation rows
    const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
    pdl_wait();  // the route and the activations are the previous kernels'
    const uint32_t n_tiles = min(uint32_t(a.route.tiles[0]), a.route.max_tiles);
    const uint32_t slabs = (a.w.N + 15) / 16, total = n_tiles * slabs, n_chunks = a.w.K >> 6;
    const uint32_t per = (total + gridDim.x - 1) / gridDim.x, kq = a.w.K / 8;
    const uint32_t begin = min(total, blockIdx.x * per), end = min(total, begin + per);
    pdl_launch_dependents();
    const uint4* x = reinterpret_cast<const uint4*>(a.x);
    const uint4* xl = xs + size_t(g) * xstride + t * 2;
    for (uint32_t seg = begin; seg < end;) {
        const uint32_t tile = seg / slabs, s0 = seg - tile * slabs, s1 = min(end - tile * slabs, slabs);
        const int32_t* ti = a.route.tiles + 1 + 3 * tile;
        const int expert = ti[0];
        const uint32_t col_base = uint32_t(ti[1]), n_cols = uint32_t(ti[2]);
        const int32_t* pairs = a.route.pairs + col_base;
        Chunk ring[D];
        const uint4* wp = nullptr;
        const uint2* sp = nullptr;
        uint32_t s = s0 + uint32_t(warp);
        if (s < s1) ring_begin<D>(a, expert, s, n_chunks, ring, &wp, &sp);  // weights in flight during the copy
        __syncthreads();  // the previous segment is done with xs
        const uint32_t rows = n_cols > 8 ? 16u : 8u;
        for (uint32_t u = threadIdx.x; u < rows * kq; u += blockDim.x) {
            const uint32_t c = u / kq, q = u - c * kq;
            uint4* dst = xs + size_t(c) * xstride + q;
            if (c < n_cols) cp_async16(dst, x + size_t(uint32_t(pairs[c]) / a.route.in_div) * kq + q);
            else *dst = make_uint4(0, 0, 0, 0);
        }
        cp_async_wait_all();
        __syncthreads();
        for (; s < s1; s += kWarps) {
            float acc[2][4];
            if (n_cols > 8) chain<D, 2>(ring, wp, sp, n_chunks, xl, 8 * xstride, acc);
            else chain<D, 1>(ring, wp, sp, n_chunks, xl, 8 * xstride, acc);
            // The ring is empty: the warp's next slab starts streaming before this one's epilogue.
            if (s + kWarps < s1) ring_begin<D>(a, expert, s + kWarps, n_chunks, ring, &wp, &sp);
            store_tile(a, expert, s, pairs, n_cols, acc);
        }
        seg = tile * slabs + s1;
    }
}

// How many CTAs of moe_batch_kernel<D> with `xbytes` of staged rows fit on the current device at
// once, its shared-memory opt-in set: queried once per thread, device and size (direct launches,
// above 64 tokens, would otherwise repeat it twice per layer and step).
template <int D>
gptoss_status resident_ctas(size_t xbytes, uint32_t* fit) {
    thread_local int dev_cached = -1;
    thread_local size_t bytes_cached = 0;
    thread_local uint32_t fit_cached = 0;
    int dev = 0;
    GPTOSS_CUDA_TRY(cudaGetDevice(&dev));
    if (dev != dev_cached || xbytes != bytes_cached) {
        const auto kernel = moe_batch_kernel<D>;
        int sms = 0, per_sm = 0;
        GPTOSS_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(xbytes)));
        GPTOSS_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        GPTOSS_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * kWarps, xbytes));
        fit_cached = uint32_t(std::max(1, per_sm) * std::max(1, sms));
        dev_cached = dev;
        bytes_cached = xbytes;
    }
    *fit = fit_cached;
    return GPTOSS_OK;
}

template <int D>
gptoss_status launch(const KernelArgs& a, uint32_t total, uint32_t ctas, uint32_t xstride, size_t xbytes,
                     cudaStream_t stream) {
    uint32_t fit = 0;
    GPTOSS_TRY(resident_ctas<D>(xbytes, &fit));  // also the shared-memory opt-in
    // Every CTA gets at least one item per warp.
    if (ctas == 0) ctas = std::min(fit, std::max(1u, (total + kWarps - 1) / kWarps));
    ctas = std::min(ctas, std::max(total, 1u));
    GPTOSS_TRY(cuda_status(launch_pdl(moe_batch_kernel<D>, dim3(ctas), dim3(32 * kWarps), xbytes, stream, a, xstride),
                           "moe_batch_kernel", __FILE__, __LINE__));
    return GPTOSS_OK;
}

int g_depth = 0;  // set_moe_batch_depth

}  // namespace

void set_moe_batch_depth(int depth) { g_depth = depth; }

bool moe_batch_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("GPTOSS_DECODE_BATCH_MOE_WIDE");
        return !(e && *e && std::strcmp(e, "0") == 0);
    }();
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
    const KernelArgs a = kernel_args(w, x, 0, &route, epilogue, out_f32, out_bf16, ldo, swiglu_limit);
    int dev = 0, max_smem = 0;
    GPTOSS_CUDA_TRY(cudaGetDevice(&dev));
    GPTOSS_CUDA_TRY(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const uint32_t xstride = a.w.K / 8 + 1;  // one uint4 of padding: the 8 columns' fragments in different banks
    const size_t xbytes = size_t(16) * xstride * 16;
    if (xbytes > size_t(max_smem))
        return fail(GPTOSS_ERR_INTERNAL, "moe_batch_gemm: 16 activation rows of K=%u need %zu bytes of shared "
                    "memory, the device gives a CTA %d", a.w.K, xbytes, max_smem);
    const uint32_t total = a.route.max_tiles * ((a.w.N + 15) / 16);
    // Weight chunks in flight per warp (the same bits at any depth): 12 for steps of up to ~8 tokens
    // (route tiles <= 32), whose warps hold one slab each, 8 above (two CTAs per SM either way).
    // H200, 20b (bench/NOTES.md "v20 batched decode"): 1 stream +2 %, 64 streams -2 % at 12.
    static const int env = env_int("GPTOSS_DECODE_BATCH_MOE_DEPTH", 0);
    const int forced = g_depth != 0 ? g_depth : env;
    const int depth = forced == 4 || forced == 8 || forced == 12 ? forced : a.route.max_tiles <= 32 ? 12 : 8;
    return depth == 12 ? launch<12>(a, total, ctas, xstride, xbytes, stream)
         : depth == 8  ? launch<8>(a, total, ctas, xstride, xbytes, stream)
                       : launch<4>(a, total, ctas, xstride, xbytes, stream);
}

}  // namespace cuda
}  // namespace gptoss
