// cuda/moe_decode.cu - the persistent MoE decode kernel (issue 12): one launch per layer runs
// the routed MXFP4 gate_up + SwiGLU and down GEMVs of one token over work items (tile, 16-row
// slab): first every gate_up item of every tile (route order), then every down item. CTAs take
// items in that order from a global counter (the first item of each CTA is its blockIdx.x, the
// next one is requested while the current one runs, and its first weight chunks as soon as the
// current item's mma chain ends; the route is read once per CTA into shared memory), so no
// grid-wide co-residency is needed beyond the first items:
// gate_up items never wait, and by the time a down item is handed out every gate_up item is
// held by a running CTA. A down item of tile t requests its weight chunks at once and waits only
// for tile t's gate_up items (a per-tile ready counter: writers fence, then one atomicAdd per
// item; the reader spins on an acquire load), so the routed weights keep streaming without the
// drain + launch + dependency wait of a kernel boundary. The last CTA to leave re-arms the
// counters. Each item computes exactly what one CTA of gemm_decode.cu computes for it (same
// chunk order per warp, same per-chunk arithmetic: gemm.cuh mxfp4_chunk_bf16 on the row,
// same warp order in the reduction, same epilogue), so results are bit-identical to
// gemm_decode(gate_up, kSwiglu) + gemm_decode(down, kStore) with the same variant,
// deterministic, with no floating-point atomics. Switch: GPTOSS_DECODE_MOE (0/1),
// GPTOSS_DECODE_MOE_CTAS = CTAs per SM (default: as many as fit). Floor: the routed weight bytes
// (gate_up + down of K experts) at the copy bandwidth.
#include "cuda/moe_decode.h"

#include "cuda/common.cuh"
#include "cuda/gemm.cuh"

#include <algorithm>
#include <cstdlib>

namespace gptoss {
namespace cuda {
namespace {
using namespace gemm_detail;

struct MoeKernelArgs {
    GemmWeights gu, dn;
    const uint16_t* x;
    GemmRoute route;
    uint16_t* act;
    float* part;
    float limit;
    int* counters;  // [0] next item, [1] CTAs done, [2 + t] gate_up items of tile t done
};

__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The weights of item `item`: gate_up slab (item < n_gu) or down slab, its expert from the
// CTA's copy of the route. Sets where the item's weight chunks start for this lane.
struct ItemPtrs {
    const uint4* wp;
    const uint2* sp;
    uint32_t n_chunks;
};

template <int NW, int kDepth>
__device__ __forceinline__ ItemPtrs issue_item(const MoeKernelArgs& a, const int* s_expert, uint32_t item,
                                               uint32_t n_gu, uint32_t s_gu, uint32_t s_dn, Chunk (&ring)[kDepth]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool gu = item < n_gu;
    const uint32_t tile = gu ? item / s_gu : (item - n_gu) / s_dn;
    const uint32_t slab = gu ? item % s_gu : (item - n_gu) % s_dn;
    const GemmWeights w = gu ? a.gu : a.dn;
    ItemPtrs p;
    p.n_chunks = w.K >> 6;
    slab_pointers<true>(w, s_expert[tile], slab, p.n_chunks, lane, &p.wp, &p.sp);
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
        const uint32_t cc = uint32_t(warp) + uint32_t(NW) * i;
        if (cc < p.n_chunks) load_chunk<true>(ring[i], p.wp, p.sp, cc);
    }
    return p;
}

// Mapping: a CTA of NW warps runs items one after another; an item = gemm_decode.cu's per-CTA
// mma chain for one 16-row slab (warp w sums chunks w, w + NW, ... in order; column-0 results
// reduced over warps in warp order). The next item's first kDepth weight chunks are requested
// as soon as the current item's mma chain ends (before its epilogue, fence and counter atomics),
// and a down item requests its chunks before waiting on its tile's ready counter.
constexpr int kMinCtas = 6;  // resident CTAs per SM the register budget is held to (80 registers at 4 warps)

template <int NW, int kDepth, bool kShfl>
__global__ __launch_bounds__(NW * 32, kMinCtas) void moe_decode_kernel(const MoeKernelArgs a) {
    __shared__ float red[NW][16];
    __shared__ int next_item[2];
    __shared__ int s_expert[kMoeDecodeMaxTiles], s_pidx[kMoeDecodeMaxTiles];
    __shared__ uint32_t s_pair[kMoeDecodeMaxTiles];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    pdl_wait();  // the route (router_decode) and x are the previous kernel's
    pdl_launch_dependents();
    int* const next = a.counters;
    int* const done = a.counters + 2;
    // The route, once per CTA: tile count, experts and pair indices in one round trip.
    const uint32_t n_tiles = min(uint32_t(__ldcg(a.route.tiles)), a.route.max_tiles);
    if (threadIdx.x < a.route.max_tiles) {
        s_expert[threadIdx.x] = __ldcg(a.route.tiles + 1 + 3 * threadIdx.x);
        s_pidx[threadIdx.x] = __ldcg(a.route.tiles + 2 + 3 * threadIdx.x);
    }
    __syncthreads();
    const uint32_t s_gu = a.gu.N / 16, s_dn = (a.dn.N + 15) / 16;
    const uint32_t n_gu = n_tiles * s_gu, total = n_gu + n_tiles * s_dn;
    const uint32_t I = a.gu.N / 2, H = a.dn.N;
    uint32_t item = blockIdx.x;
    Chunk ring[kDepth];
    ItemPtrs ptr{};
    if (item < total) ptr = issue_item<NW, kDepth>(a, s_expert, item, n_gu, s_gu, s_dn, ring);
    if (threadIdx.x < n_tiles) s_pair[threadIdx.x] = uint32_t(__ldcg(a.route.pairs + s_pidx[threadIdx.x]));
    __syncthreads();
    int buf = 0;
    while (item < total) {
        int nxt = 0;
        if (threadIdx.x == 0) nxt = int(gridDim.x) + atomicAdd(next, 1);  // used at the end of the item
        const bool is_gu = item < n_gu;
        const uint32_t tile = is_gu ? item / s_gu : (item - n_gu) / s_dn;
        const uint32_t slab = is_gu ? item % s_gu : (item - n_gu) % s_dn;
        const int expert = s_expert[tile];
        const uint32_t pair = s_pair[tile];
        const uint16_t* xrow = is_gu ? a.x + size_t(pair / a.route.in_div) * a.gu.K : a.act + size_t(pair) * a.dn.K;
        if (!is_gu) {  // tile's gate_up items all published (writers fenced before counting)
            if (threadIdx.x == 0)
                while (ld_acquire(done + tile) < int(s_gu)) __nanosleep(20);
            __syncthreads();
        }
        const uint32_t* xw = reinterpret_cast<const uint32_t*>(xrow) + lane;
        const uint4* xf = reinterpret_cast<const uint4*>(xrow + t * 16);
        uint32_t xs[kShfl ? kDepth : 1];
        uint4 xb[kShfl ? 1 : kDepth][2];
        auto load_x = [&](int i, uint32_t c) {
            if constexpr (kShfl) {
                xs[i] = __ldcg(xw + size_t(c) * 32);
            } else if (g == 0) {
                xb[i][0] = __ldcg(xf + size_t(c) * 8);
                xb[i][1] = __ldcg(xf + size_t(c) * 8 + 1);
            } else {
                xb[i][0] = xb[i][1] = make_uint4(0, 0, 0, 0);
            }
        };
        const uint32_t n_chunks = ptr.n_chunks;
#pragma unroll
        for (int i = 0; i < kDepth; ++i) {
            const uint32_t cc = uint32_t(warp) + uint32_t(NW) * i;
            if (cc < n_chunks) load_x(i, cc);
        }
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (uint32_t base = uint32_t(warp); base < n_chunks; base += uint32_t(NW * kDepth)) {
#pragma unroll
            for (int i = 0; i < kDepth; ++i) {
                const uint32_t c = base + uint32_t(NW) * i;
                if (c >= n_chunks) break;
                // The chunk's B words (gemm_decode's row; column 0 carries the row).
                uint32_t xw8[8];
                if constexpr (kShfl) {
#pragma unroll
                    for (int k = 0; k < 8; ++k) xw8[k] = __shfl_sync(0xffffffffu, xs[i], 8 * t + k);
                } else {
                    const uint4 lo = xb[i][0], hi = xb[i][1];
                    const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
                    for (int k = 0; k < 8; ++k) xw8[k] = w[k];
                }
                mxfp4_chunk_bf16(acc, ring[i], xw8);
                const uint32_t cn = c + uint32_t(NW * kDepth);
                if (cn < n_chunks) {
                    load_chunk<true>(ring[i], ptr.wp, ptr.sp, cn);
                    load_x(i, cn);
                }
            }
        }
        if (t == 0) {
            red[warp][g] = acc[0];
            red[warp][g + 8] = acc[2];
        }
        if (threadIdx.x == 0) next_item[buf] = nxt;
        __syncthreads();
        const uint32_t nitem = uint32_t(next_item[buf]);
        if (nitem < total) ptr = issue_item<NW, kDepth>(a, s_expert, nitem, n_gu, s_gu, s_dn, ring);
        if (is_gu) {
            // SwiGLU epilogue (gemm_decode's kSwiglu, bit for bit), then publish: fence, count.
            if (threadIdx.x < 8) {
                const int r = threadIdx.x;
                float gate = red[0][r], up = red[0][r + 8];
#pragma unroll
                for (int w = 1; w < NW; ++w) {
                    gate = __fadd_rn(gate, red[w][r]);
                    up = __fadd_rn(up, red[w][r + 8]);
                }
                const float* bias = a.gu.bias ? a.gu.bias + size_t(expert) * a.gu.bias_expert_stride : nullptr;
                const uint32_t r_lo = slab * 16 + r;
                gate += bias ? bias[r_lo] : 0.0f;
                up += bias ? bias[r_lo + 8] : 0.0f;
                const float y = swiglu_clamped(gate, up, a.limit);
                a.act[size_t(pair) * I + permuted_k(slab * 8 + r)] = f32_to_bf16_bits(y);
                __threadfence();
            }
        } else if (threadIdx.x < 16) {
            const int r = threadIdx.x;
            const uint32_t row = slab * 16 + r;
            if (row < H) {
                float s = red[0][r];
#pragma unroll
                for (int w = 1; w < NW; ++w) s = __fadd_rn(s, red[w][r]);
                const float* bias = a.dn.bias ? a.dn.bias + size_t(expert) * a.dn.bias_expert_stride : nullptr;
                a.part[size_t(pair) * H + row] = s + (bias ? bias[row] : 0.0f);
            }
        }
        __syncthreads();  // the act writes are fenced; red is free again
        if (is_gu && threadIdx.x == 0) atomicAdd(done + tile, 1);
        item = nitem;
        buf ^= 1;
    }
    // The last CTA out re-arms the counters (every other CTA has taken its last item).
    if (threadIdx.x == 0 && atomicAdd(a.counters + 1, 1) == int(gridDim.x) - 1) {
        *next = 0;
        for (uint32_t i = 0; i < kMoeDecodeMaxTiles; ++i) done[i] = 0;
        __threadfence();
        a.counters[1] = 0;
    }
}

using KernelFn = void (*)(const MoeKernelArgs);
struct Instance {
    DecodeGemv v;
    KernelFn fn;
};
const Instance kInstances[] = {
    {DecodeGemv{4, 4, false}, moe_decode_kernel<4, 4, false>},
    {DecodeGemv{4, 4, true}, moe_decode_kernel<4, 4, true>},
};

const Instance* find_instance(const DecodeGemv& v) {
    for (const Instance& in : kInstances)
        if (in.v.warps == v.warps && in.v.depth == v.depth && in.v.shfl_x == v.shfl_x) return &in;
    return nullptr;
}

// CTAs of the grid: CTAs per SM (GPTOSS_DECODE_MOE_CTAS, else the occupancy limit; never more,
// so every CTA is resident at once and a CTA's first item, blockIdx.x, is always running) × SMs.
gptoss_status grid_ctas(KernelFn fn, uint32_t threads, uint32_t* out) {
    int dev = 0, sms = 0, per_sm = 0;
    GPTOSS_CUDA_TRY(cudaGetDevice(&dev));
    GPTOSS_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    GPTOSS_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, int(threads), 0));
    const int want = env_int("GPTOSS_DECODE_MOE_CTAS", 0);
    if (want > 0) per_sm = std::min(per_sm, want);
    *out = uint32_t(std::max(1, per_sm) * std::max(1, sms));
    return GPTOSS_OK;
}

bool shapes_ok(const GemmWeights& gu, const GemmWeights& dn) {
    return gu.mxfp4 && dn.mxfp4 && gu.N != 0 && gu.N % 16 == 0 && gu.K % 64 == 0 && dn.K == gu.N / 2 &&
           dn.K % 64 == 0 && dn.N == gu.K;
}

}  // namespace

bool moe_decode_enabled(const MoeDecodeArgs& args, const DecodeGemv& variant) {
    static const bool on = env_int("GPTOSS_DECODE_MOE", 0) != 0;
    return on && shapes_ok(args.gate_up, args.down) && args.route.max_tiles <= kMoeDecodeMaxTiles &&
           find_instance(variant) != nullptr;
}

gptoss_status moe_decode(const MoeDecodeArgs& args, const DecodeGemv& variant, cudaStream_t stream) {
    const GemmWeights &gu = args.gate_up, &dn = args.down;
    if (!shapes_ok(gu, dn))
        return fail(GPTOSS_ERR_INTERNAL,
                    "moe_decode: needs MXFP4 gate_up [2I, H] and down [H, I], H and I multiples of 64 (gate_up "
                    "%ux%u, down %ux%u)",
                    gu.N, gu.K, dn.N, dn.K);
    if (!args.x || !args.act || !args.part || !args.counters || !args.route.tiles || !args.route.pairs ||
        args.route.in_div == 0)
        return fail(GPTOSS_ERR_INTERNAL, "moe_decode: x, act, part, counters and a route are required");
    if (args.route.max_tiles > kMoeDecodeMaxTiles)
        return fail(GPTOSS_ERR_INTERNAL, "moe_decode: %u route tiles exceed %u", args.route.max_tiles,
                    kMoeDecodeMaxTiles);
    const Instance* in = find_instance(variant);
    if (!in)
        return fail(GPTOSS_ERR_INTERNAL, "moe_decode: no variant with %u warps, ring depth %u, shfl %d",
                    variant.warps, variant.depth, int(variant.shfl_x));
    if (args.route.max_tiles == 0) return GPTOSS_OK;
    const uint32_t threads = variant.warps * 32;
    uint32_t ctas = args.ctas;
    if (ctas == 0) GPTOSS_TRY(grid_ctas(in->fn, threads, &ctas));
    const uint32_t items = args.route.max_tiles * (gu.N / 16 + (dn.N + 15) / 16);
    ctas = std::min(ctas, items);
    MoeKernelArgs a{};
    a.gu = gu;
    a.dn = dn;
    a.x = args.x;
    a.route = args.route;
    a.act = args.act;
    a.part = args.part;
    a.limit = args.swiglu_limit;
    a.counters = args.counters;
    GPTOSS_TRY(cuda_status(launch_pdl(in->fn, dim3(ctas), dim3(threads), 0, stream, a), "moe_decode_kernel", __FILE__,
                           __LINE__));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
