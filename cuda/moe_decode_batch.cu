// cuda/moe_decode_batch.cu - the batched decode step's routed MXFP4 GEMM (issue 13;
// moe_decode_batch.h): one dequantization per weight chunk and few instructions around it. At 64
// tokens gemm()'s structure spent the SMs' issue slots on more than the dequantization
// (bench/NOTES.md "v16 batched decode", round 4): tiles of 8 pairs dequantize an expert's chunk
// once per tile (1.4 tiles per expert at 64 tokens), the four warps of a CTA hold ~11 chunks of a
// slab each and meet at a barrier, a shared-memory reduction and a one-warp epilogue, and the
// activation fragments come from L1/L2 beside each chunk. Here one CTA per SM (16 or 24 warps)
// takes one contiguous range of (route tile of <= 16 pairs, 16-row slab) items (a static
// schedule: no counters, no atomics); per phase of up to two tiles of its range it stages their
// activation rows in shared memory once (cp.async), and its warps take the phase's items
// round-robin: per item, all of the slab's 64-k chunks in order, the k16 steps alternating
// between two accumulator chains (even and odd steps, added at the end: half the mma dependency
// chain), the epilogue from the warp's registers. The summation order is a function of K alone,
// never of the batch, the tile, the CTA size or the grid, so a pair's output is the same whichever
// pairs share the step (batch invariance); it is not gemm()'s order (the bits differ from gemm()'s
// in the last places). H200, 20b: v20's form (two CTAs of 8 warps per SM, each walking its range
// tile by tile) took the 64-token MoE 5.10 -> 4.10 ms per step against gemm(); one CTA of 24
// warps (more warps at 80 registers; the warps of a phase within one item of each other) 4.11 ->
// 3.72, and a lone token 1.05 -> 0.86 ms with 16 warps of 12 chunks in flight (bench/NOTES.md "v20
// batched decode", "v22 batched MoE").
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

// Warps per CTA (W): 8 = two CTAs per SM (the staged rows, 16 x K bf16, and 123 registers allow
// two); 16, 20 or 24 = one CTA per SM sharing one staging (GPTOSS_DECODE_BATCH_MOE_WARPS; the
// same bits whichever: a slab's sum is one warp's).
template <int W>
constexpr int min_ctas_per_sm() { return W == 8 ? 2 : 1; }

// Points this lane at slab `slab` of `expert` and requests its first D chunks into the ring.
template <int D>
__device__ __forceinline__ void ring_begin(const KernelArgs& a, int expert, uint32_t slab, uint32_t n_chunks,
                                           Chunk (&ring)[D], const uint4** wp, const uint2** sp) {
    slab_pointers<true>(a.w, expert, slab, n_chunks, int(threadIdx.x & 31), wp, sp);
#pragma unroll
    for (int i = 0; i < D; ++i)
        if (uint32_t(i) < n_chunks) load_chunk<true>(ring[i], *wp, *sp, uint32_t(i));
}

// One chunk for G 8-column groups: this lane's B fragments of chunk c from shared memory, the
// 4 k16 steps (even steps into chain 0, odd into chain 1) on the dequantized fragments of `ch`.
template <int G>
__device__ __forceinline__ void chunk_mma(const Chunk& ch, const uint4* xl, uint32_t xg8, uint32_t c,
                                          float (&a2)[G][2][4]) {
    uint4 b[G][2];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        b[g][0] = xl[g * xg8 + c * 8];
        b[g][1] = xl[g * xg8 + c * 8 + 1];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        uint32_t af[4];
        fragment<true>(ch, j, af);
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const uint4 bb = b[g][j >> 1];
            mma(a2[g][j & 1], af, (j & 1) ? bb.z : bb.x, (j & 1) ? bb.w : bb.y);
        }
    }
}

// The n_chunks chunks of one slab for G 8-column groups: ring[i] holds chunk i on entry; xl: this
// lane's activation fragments in shared memory (column g of group 0; group 1 is 8 rows below, xg8
// uint4 further). acc[g] = the slab's sum: chunks in order, k16 steps 0, 2 into one chain and 1, 3
// into another, the two added at the end (even + odd). While every chunk of a round of D has its
// successor (c + D) in the slab, the round runs without bound tests, its loads at immediate offsets
// from one pointer per round (SASS, sm_90a: ~5-8 fewer instructions per chunk, bench/NOTES.md
// "v37"); the last rounds test each chunk. The order of the chunks and of the mma is the same.
template <int D, int G>
__device__ __forceinline__ void chain(Chunk (&ring)[D], const uint4* wp, const uint2* sp, uint32_t n_chunks,
                                      const uint4* xl, uint32_t xg8, float (&acc)[2][4]) {
    float a2[G][2][4];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int h = 0; h < 2; ++h) a2[g][h][0] = a2[g][h][1] = a2[g][h][2] = a2[g][h][3] = 0.0f;
    for (uint32_t base = 0; base < n_chunks; base += D) {
        if (base + 2 * D <= n_chunks) {  // every chunk's successor exists: no tests
            const uint4* w = wp + size_t(base + D) * 32;
            const uint2* s = sp + size_t(base + D) * 8;
#pragma unroll
            for (int i = 0; i < D; ++i) {
                chunk_mma<G>(ring[i], xl, xg8, base + i, a2);
                load_chunk<true>(ring[i], w, s, uint32_t(i));
            }
            continue;
        }
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const uint32_t c = base + i;
            if (c >= n_chunks) break;
            chunk_mma<G>(ring[i], xl, xg8, c, a2);
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

// Route tile `tile`: its expert, its pairs and how many (<= 16).
struct TileRef {
    int expert;
    const int32_t* pairs;
    uint32_t n_cols;
};
__device__ __forceinline__ TileRef tile_ref(const KernelArgs& a, uint32_t tile) {
    const int32_t* ti = a.route.tiles + 1 + 3 * tile;
    return TileRef{ti[0], a.route.pairs + ti[1], uint32_t(ti[2])};
}

// The whole CTA requests tile `tr`'s activation rows into buf ([16][xstride] uint4: 8 rows for a
// tile of <= 8 pairs, 16 above; rows past n_cols zeroed); the caller waits and meets the barrier.
__device__ __forceinline__ void stage_rows(const KernelArgs& a, const TileRef& tr, uint4* buf, uint32_t xstride) {
    const uint32_t kq = a.w.K / 8, rows = tr.n_cols > 8 ? 16u : 8u;
    const uint4* x = reinterpret_cast<const uint4*>(a.x);
    for (uint32_t u = threadIdx.x; u < rows * kq; u += blockDim.x) {
        const uint32_t c = u / kq, q = u - c * kq;
        uint4* dst = buf + size_t(c) * xstride + q;
        if (c < tr.n_cols) cp_async16(dst, x + size_t(uint32_t(tr.pairs[c]) / a.route.in_div) * kq + q);
        else *dst = make_uint4(0, 0, 0, 0);
    }
}

// One (tile, slab) item from a full ring: the chain, the warp's next item's ring (its weights
// stream during this epilogue), the epilogue. xl: this lane's fragments in the tile's staged rows.
template <int D>
__device__ __forceinline__ void run_item(const KernelArgs& a, const TileRef& tr, uint32_t slab, Chunk (&ring)[D],
                                         const uint4** wp, const uint2** sp, const uint4* xl, uint32_t xstride,
                                         int next_expert, uint32_t next_slab) {
    const uint32_t n_chunks = a.w.K >> 6;
    float acc[2][4];
    if (tr.n_cols > 8) chain<D, 2>(ring, *wp, *sp, n_chunks, xl, 8 * xstride, acc);
    else chain<D, 1>(ring, *wp, *sp, n_chunks, xl, 8 * xstride, acc);
    if (next_expert >= 0) ring_begin<D>(a, next_expert, next_slab, n_chunks, ring, wp, sp);
    store_tile(a, tr.expert, slab, tr.pairs, tr.n_cols, acc);
}

// A CTA takes the contiguous item range [begin, end) (a static schedule: no counters, no
// atomics) in phases of up to `buffers` route tiles (1, or 2 for CTAs of 16 warps or more, one
// per SM): per phase it stages those tiles' activation rows at once, meets one barrier, and its
// warps take the phase's items round-robin (warp w: the phase's first item + w, + W, ...), so they
// stay within one item of each other. The first item's weights stream during the staging.
template <int D, int W>
__global__ __launch_bounds__(32 * W, min_ctas_per_sm<W>()) void moe_batch_kernel(const KernelArgs a, uint32_t xstride,
                                                                                  uint32_t buffers) {
    extern __shared__ __align__(16) uint4 xs[];  // [buffers][16][xstride]: staged activation rows
    const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
    pdl_wait();  // the route and the activations are the previous kernels'
    const uint32_t n_tiles = min(uint32_t(a.route.tiles[0]), a.route.max_tiles);
    const uint32_t slabs = (a.w.N + 15) / 16, total = n_tiles * slabs, n_chunks = a.w.K >> 6;
    const uint32_t per = (total + gridDim.x - 1) / gridDim.x;
    const uint32_t begin = min(total, blockIdx.x * per), end = min(total, begin + per);
    pdl_launch_dependents();
    const uint32_t lane_off = uint32_t(g) * xstride + t * 2, buf_stride = 16 * xstride;
    Chunk ring[D];
    const uint4* wp = nullptr;
    const uint2* sp = nullptr;
    for (uint32_t phase = begin; phase < end;) {
        const uint32_t t0 = phase / slabs, phase_end = min(end, (t0 + buffers) * slabs);
        uint32_t i = phase + uint32_t(warp);
        if (i < phase_end) ring_begin<D>(a, tile_ref(a, i / slabs).expert, i % slabs, n_chunks, ring, &wp, &sp);
        __syncthreads();  // the previous phase is done with xs
        for (uint32_t tile = t0; tile * slabs < phase_end; ++tile)
            stage_rows(a, tile_ref(a, tile), xs + (tile - t0) * buf_stride, xstride);
        cp_async_wait_all();
        __syncthreads();
        for (; i < phase_end; i += W) {
            const uint32_t tile = i / slabs, next = i + W;
            const int next_expert = next < phase_end ? tile_ref(a, next / slabs).expert : -1;
            run_item<D>(a, tile_ref(a, tile), i - tile * slabs, ring, &wp, &sp,
                        xs + (tile - t0) * buf_stride + lane_off, xstride, next_expert, next % slabs);
        }
        phase = phase_end;
    }
}

// How many CTAs of moe_batch_kernel<D, W> with `xbytes` of staged rows fit on the current device at
// once, its shared-memory opt-in set: queried once per thread, device and size (direct launches,
// above 64 tokens, would otherwise repeat it twice per layer and step).
template <int D, int W>
gptoss_status resident_ctas(int dev, size_t xbytes, uint32_t* fit) {
    thread_local int dev_cached = -1;
    thread_local size_t bytes_cached = 0;
    thread_local uint32_t fit_cached = 0;
    if (dev != dev_cached || xbytes != bytes_cached) {
        const auto kernel = moe_batch_kernel<D, W>;
        int sms = 0, per_sm = 0;
        GPTOSS_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(xbytes)));
        GPTOSS_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        GPTOSS_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * W, xbytes));
        fit_cached = uint32_t(std::max(1, per_sm) * std::max(1, sms));
        dev_cached = dev;
        bytes_cached = xbytes;
    }
    *fit = fit_cached;
    return GPTOSS_OK;
}

// xbytes: one tile's staged rows; CTAs of 16 warps or more (one per SM) get two tiles' worth
// where the device allows.
template <int D, int W>
gptoss_status launch(const KernelArgs& a, uint32_t total, uint32_t ctas, uint32_t xstride, size_t xbytes,
                     const DeviceProps& dp, cudaStream_t stream) {
    const uint32_t buffers = W >= 16 && 2 * xbytes <= size_t(dp.max_smem_optin) ? 2u : 1u;
    xbytes *= buffers;
    uint32_t fit = 0;
    GPTOSS_TRY((resident_ctas<D, W>(dp.dev, xbytes, &fit)));  // also the shared-memory opt-in
    // 8 warps: every CTA gets at least one item per warp. 16 or more (one CTA per SM): every SM a CTA
    // where there are items enough (a lone token's 1 440 gate_up items would otherwise take 60 SMs).
    if (ctas == 0) ctas = std::min(fit, W >= 16 ? std::max(1u, total) : std::max(1u, (total + W - 1) / W));
    ctas = std::min(ctas, std::max(total, 1u));
    GPTOSS_TRY(cuda_status(launch_pdl(moe_batch_kernel<D, W>, dim3(ctas), dim3(32 * W), xbytes, stream, a, xstride, buffers),
                           "moe_batch_kernel", __FILE__, __LINE__));
    return GPTOSS_OK;
}

int g_depth = 0, g_warps = 0;  // set_moe_batch_shape

template <int D>
gptoss_status launch_warps(int warps, const KernelArgs& a, uint32_t total, uint32_t ctas, uint32_t xstride,
                           size_t xbytes, const DeviceProps& dp, cudaStream_t stream) {
    switch (warps) {
    case 16: return launch<D, 16>(a, total, ctas, xstride, xbytes, dp, stream);
    case 20: return launch<D, 20>(a, total, ctas, xstride, xbytes, dp, stream);
    case 24: return launch<D, 24>(a, total, ctas, xstride, xbytes, dp, stream);
    default: return launch<D, 8>(a, total, ctas, xstride, xbytes, dp, stream);
    }
}

}  // namespace

void set_moe_batch_shape(int depth, int warps) {
    g_depth = depth;
    g_warps = warps;
}

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
    DeviceProps dp;
    GPTOSS_CUDA_TRY(current_device_props(&dp));
    const uint32_t xstride = a.w.K / 8 + 1;  // one uint4 of padding: the 8 columns' fragments in different banks
    const size_t xbytes = size_t(16) * xstride * 16;
    if (xbytes > size_t(dp.max_smem_optin))
        return fail(GPTOSS_ERR_INTERNAL, "moe_batch_gemm: 16 activation rows of K=%u need %zu bytes of shared "
                    "memory, the device gives a CTA %d", a.w.K, xbytes, dp.max_smem_optin);
    const uint32_t total = a.route.max_tiles * ((a.w.N + 15) / 16);
    // The CTA size and the weight chunks in flight per warp (the same bits whichever): 16 warps of
    // 12 chunks for routes of up to 16 tiles (steps of up to 4 tokens), 20 of 6 up to 36 tiles
    // (16 tokens), 24 of 4 above (80 registers: deeper rings spill at 24 warps). H200, 20b, MoE
    // ms per step (bench/NOTES.md "v22 batched MoE"): 1 token 0.86 / 0.87 (16 / 20 warps), 8
    // tokens 2.48 / 2.38 / 2.45 (16 / 20 / 24), 16 tokens 3.16 / 3.01 / 3.01, 32 tokens 3.61 /
    // 3.57 / 3.39, 64 tokens 3.77 / 3.90 / 3.72 (v21's two CTAs of 8 warps: 1.05, 2.62, 4.11).
    static const int env_depth = env_choice("GPTOSS_DECODE_BATCH_MOE_DEPTH", {4, 6, 8, 12}, 0);
    static const int env_warps = env_choice("GPTOSS_DECODE_BATCH_MOE_WARPS", {8, 16, 20, 24}, 0);
    const uint32_t tiles = a.route.max_tiles;
    const int warps = g_warps != 0 ? g_warps : env_warps != 0 ? env_warps : tiles <= 16 ? 16 : tiles <= 36 ? 20 : 24;
    const int auto_depth = warps >= 24 ? 4 : warps >= 20 ? 6 : tiles <= 32 ? 12 : 8;
    const int depth = g_depth != 0 ? g_depth : env_depth != 0 ? env_depth : auto_depth;
    switch (depth) {
    case 12: return launch_warps<12>(warps, a, total, ctas, xstride, xbytes, dp, stream);
    case 8: return launch_warps<8>(warps, a, total, ctas, xstride, xbytes, dp, stream);
    case 6: return launch_warps<6>(warps, a, total, ctas, xstride, xbytes, dp, stream);
    default: return launch_warps<4>(warps, a, total, ctas, xstride, xbytes, dp, stream);
    }
}

}  // namespace cuda
}  // namespace gptoss
