// cuda/gemv_spread.cu - the routed MXFP4 decode GEMVs (MoE gate_up + SwiGLU, MoE down) of a T = 1
// step as a grid of a few large CTAs ("spread"), an alternative to gemm_decode.cu's one short
// 4-warp CTA per (route tile, 16-row slab) item (issue 12; bench/NOTES.md "v47").
// Why: gemm_decode's gate_up runs 1 440 CTAs of ~23 KB each in ~1.8 waves; every CTA pays the
// route read, the activation row's staging and a ring that fills and drains around ~12 chunks per
// warp, so gate_up streams at ~2.3 TB/s alone while the same per-chunk arithmetic streamed through
// register rings that never drain reaches ~3.7 TB/s (bench/probe-moe-stream.cu, "v35").
// Mapping: the items (tile-major: item = tile · S + slab, S = ceil(N / 16)) of max_tiles tiles are
// split over the grid in contiguous, balanced ranges (CTA b: items [b·n/G, (b+1)·n/G)); the CTA's
// 64-k chunks of those items, in item then chunk order, are split over its NW warps in contiguous,
// balanced ranges; each warp streams its range through one ring of kDepth chunks that runs across
// item boundaries, flushing its partial 16-row sums to shared memory at each item's end (or its
// range's). The tail sums each item's partials in warp order, adds the bias and stores (SwiGLU:
// the 8 outputs of the slab). A CTA's items span at most two tiles (the host checks), so it stages
// at most two activation rows, once. Arithmetic per chunk: gemm.cuh's mxfp4_chunk_blockscale.
// Summation order: fixed by (max_tiles, N, K, grid, NW): deterministic run to run, no atomics;
// not gemm_decode's bits (decode-vs-prefill and decode-vs-decode-variant are tolerance
// comparisons). Tiles >= the route's count are skipped (their items' chunks are not read).
#include "cuda/common.cuh"
#include "cuda/gemm.cuh"
#include "cuda/kernels.h"

#include <cstdio>
#include <cstdlib>

namespace gptoss {
namespace cuda {
namespace {
using namespace gemm_detail;

constexpr uint32_t kSpreadMaxK = 4096;   // one activation row in shared memory
constexpr uint32_t kSpreadSlots = 4;     // items one warp's chunk range may touch
constexpr uint32_t kSpreadMaxTiles = 64;

struct SpreadArgs {
    GemmWeights w;
    const uint16_t* x;
    GemmRoute route;
    int route_ready;
    int swiglu;
    float* out_f32;
    uint16_t* out_bf16;
    uint32_t ldo;
    float limit;
    uint32_t slabs;    // S
    uint32_t n_items;  // max_tiles · S
};

template <int NW, int kDepth>
__global__ __launch_bounds__(NW * 32) void gemv_spread_kernel(const SpreadArgs a) {
    constexpr uint32_t R = NW * 32;
    __shared__ __align__(16) uint16_t xsm[2][kSpreadMaxK];
    __shared__ float red[NW][kSpreadSlots][16];
    __shared__ uint32_t span[NW];  // the warp's first and last local item (16 bits each)
    __shared__ int s_expert[2], s_row[2], s_out[2], s_tiles;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t S = a.slabs, K = a.w.K, C = K >> 6, N = a.w.N;
    const uint32_t i0 = uint32_t(uint64_t(blockIdx.x) * a.n_items / gridDim.x);
    const uint32_t i1 = uint32_t(uint64_t(blockIdx.x + 1) * a.n_items / gridDim.x);
    const uint32_t n_local = i1 - i0;
    if (n_local == 0) {
        pdl_wait();
        pdl_launch_dependents();
        return;
    }
    const uint32_t t_first = i0 / S;
    const uint32_t U = n_local * C;
    const uint32_t u0 = uint32_t(uint64_t(warp) * U / NW), u1 = uint32_t(uint64_t(warp + 1) * U / NW);
    if (lane == 0) span[warp] = u1 > u0 ? (u0 / C) | (((u1 - 1) / C) << 16) : 0xFFFFu;

    // The route: tile count and the (at most two) tiles' experts, then their pairs.
    if (!a.route_ready) pdl_wait();
    const int32_t* tiles = a.route.tiles;
    if (threadIdx.x < 2) {
        const uint32_t tt = t_first + threadIdx.x;
        s_expert[threadIdx.x] = tt * S < i1 ? __ldcg(tiles + 1 + 3 * tt) : 0;
        s_out[threadIdx.x] = tt * S < i1 ? __ldcg(tiles + 2 + 3 * tt) : 0;  // pair offset, for now
    } else if (threadIdx.x == 32) {
        s_tiles = __ldcg(tiles);
    }
    __syncthreads();
    const uint32_t n_act = uint32_t(max(0, min(s_tiles, int(kSpreadMaxTiles)))) * S;  // active items
    // This warp's range, clipped to the active items (tile-major: they come first).
    const uint32_t act_units = n_act > i0 ? min(n_act - i0, n_local) * C : 0u;
    const uint32_t L = min(u1, act_units) > u0 ? min(u1, act_units) - u0 : 0u;

    // The warp's units k = 0 .. L - 1 are the CTA's local units u0 + k. Within a tile a slab's chunks
    // follow the previous slab's in memory (repack.cu's layout), so the weight pointers step one
    // chunk at a time across item boundaries; only at the CTA's second tile (local unit u_sw,
    // relative unit k_sw when inside the range) do they move to that tile's expert.
    const uint32_t u_sw = ((t_first + 1) * S - i0) * C;
    const uint32_t k_sw = u_sw > u0 ? u_sw - u0 : 0xFFFFFFFFu;
    ChunkStream cs;
    if (L > 0) {
        const uint32_t item = i0 + u0 / C;
        cs.begin(a.w, s_expert[item / S - t_first], item % S, u0 % C, C, lane, s_expert[1], k_sw, L);
    }
    Chunk ring[kDepth];
#pragma unroll
    for (int i = 0; i < kDepth; ++i)
        if (uint32_t(i) < L) cs.next(ring[i], uint32_t(i));

    // The pairs (input and output rows) of the CTA's tiles; the biases of the rows this thread
    // finishes first (idx = threadIdx.x: local item idx / 16, row idx % 16).
    if (threadIdx.x < 2) {
        const uint32_t tt = t_first + threadIdx.x;
        if (tt * S < i1 && int(tt) < s_tiles) {
            const uint32_t pair = uint32_t(__ldcg(a.route.pairs + s_out[threadIdx.x]));
            s_row[threadIdx.x] = int(pair / a.route.in_div);
            s_out[threadIdx.x] = int(pair);
        } else {
            s_row[threadIdx.x] = -1;
        }
    }
    float bias_lo = 0.0f, bias_hi = 0.0f;
    const auto load_bias = [&](uint32_t idx, float* lo, float* hi) {
        const uint32_t j = idx >> 4, r = idx & 15, item = i0 + j;
        if (!a.w.bias || item >= n_act) return;
        const float* b = a.w.bias + size_t(s_expert[item / S - t_first]) * a.w.bias_expert_stride;
        const uint32_t row = (item % S) * 16 + r;
        if (a.swiglu ? r < 8 : row < N) {
            *lo = __ldg(b + row);
            if (a.swiglu) *hi = __ldg(b + row + 8);
        }
    };
    if (threadIdx.x < n_local * 16) load_bias(threadIdx.x, &bias_lo, &bias_hi);
    if (a.route_ready) pdl_wait();
    pdl_launch_dependents();
    __syncthreads();  // s_row, s_out

    // The activation rows (× 2^32, mxfp4_chunk_blockscale's operand) of the CTA's tiles.
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        if (s_row[q] < 0 || (q == 1 && s_row[1] == s_row[0])) continue;
        stage_row_x2p32(xsm[q], a.x + size_t(s_row[q]) * K, K, threadIdx.x, R);
    }
    __syncthreads();

    // Compute cursor: chunk cc of the item, xo = the uint4 index of this lane's activation words of
    // that chunk (row slot 1 at offset x2 for the second tile when its row differs), the flush slot.
    const uint4* xbase = reinterpret_cast<const uint4*>(&xsm[0][0]);
    const uint32_t x2 = s_row[1] >= 0 && s_row[1] != s_row[0] ? kSpreadMaxK / 8 : 0u;
    uint32_t cc = u0 % C, slot = 0;
    uint32_t xo = (u0 >= u_sw ? x2 : 0u) + 2u * uint32_t(t) + cc * 8u;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const auto compute = [&](int i) {
        const uint4 lo = xbase[xo], hi = xbase[xo + 1];
        const uint32_t xw8[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        mxfp4_chunk_blockscale(acc, ring[i], xw8);
        xo += 8;
    };
    // After relative unit k: its item's partial to the next slot at the item's (or the range's) end.
    const auto finish = [&](uint32_t k, bool range_end) {
        if (++cc == C || range_end) {
            if (t == 0) {
                red[warp][slot][g] = acc[0] * kXUnscale;
                red[warp][slot][g + 8] = acc[2] * kXUnscale;
            }
            acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
            ++slot;
            if (cc == C) {
                cc = 0;
                xo = (u0 + k + 1 >= u_sw ? x2 : 0u) + 2u * uint32_t(t);
            }
        }
    };
    for (uint32_t base = 0; base < L; base += kDepth) {
        if (base + 2 * kDepth <= L && cs.no_switch(base + kDepth, kDepth)) {
            // A full round whose refills all lie in the range on one tile: the loads at immediate
            // offsets from the round's pointers, no bound tests.
#pragma unroll
            for (int i = 0; i < kDepth; ++i) {
                compute(i);
                cs.round_load(ring[i], uint32_t(i));
                finish(base + uint32_t(i), false);
            }
            cs.round_end(kDepth);
        } else {
#pragma unroll
            for (int i = 0; i < kDepth; ++i) {
                const uint32_t k = base + uint32_t(i);
                if (k >= L) break;
                compute(i);
                if (k + kDepth < L) cs.next(ring[i], k + kDepth);
                finish(k, k + 1 == L);
            }
        }
    }
    __syncthreads();

    // Each item's rows: the partials of the warps whose ranges hold it, in warp order.
    for (uint32_t idx = threadIdx.x; idx < n_local * 16; idx += R) {
        const uint32_t j = idx >> 4, r = idx & 15, item = i0 + j;
        if (item >= n_act) break;  // tile-major: every later item is inactive too
        if (a.swiglu && r >= 8) continue;
        float lo = bias_lo, hi = bias_hi;
        if (idx >= R) load_bias(idx, &lo, &hi);
        float s0 = 0.0f, s1 = 0.0f;
        bool first = true;
#pragma unroll 4
        for (int w = 0; w < NW; ++w) {
            const uint32_t sp = span[w], wf = sp & 0xFFFFu, wl = sp >> 16;
            if (sp == 0xFFFFu || j < wf || j > wl) continue;
            const float* p = red[w][j - wf];
            s0 = first ? p[r] : __fadd_rn(s0, p[r]);
            if (a.swiglu) s1 = first ? p[r + 8] : __fadd_rn(s1, p[r + 8]);
            first = false;
        }
        const uint32_t q = item / S - t_first, slab = item % S;
        const size_t out_row = size_t(s_out[q]);
        if (a.swiglu) {
            const float y = swiglu_clamped(s0 + lo, s1 + hi, a.limit);
            a.out_bf16[out_row * a.ldo + permuted_k(slab * 8 + r)] = f32_to_bf16_bits(y);
        } else {
            const uint32_t row = slab * 16 + r;
            if (row < N) a.out_f32[out_row * a.ldo + row] = s0 + lo;
        }
    }
}

using SpreadFn = void (*)(const SpreadArgs);
struct SpreadInstance {
    uint32_t warps, depth;
    SpreadFn fn;
};
#define GPTOSS_SPREAD(NW, D) SpreadInstance{NW, D, gemv_spread_kernel<NW, D>}
const SpreadInstance kSpreadInstances[] = {
    GPTOSS_SPREAD(8, 4), GPTOSS_SPREAD(12, 4), GPTOSS_SPREAD(16, 4), GPTOSS_SPREAD(24, 4),
    GPTOSS_SPREAD(16, 6), GPTOSS_SPREAD(8, 8),
};
#undef GPTOSS_SPREAD

const SpreadInstance* find_spread(uint32_t warps, uint32_t depth) {
    for (const SpreadInstance& in : kSpreadInstances)
        if (in.warps == warps && in.depth == depth) return &in;
    return nullptr;
}

uint32_t spread_grid(const DecodeSpread& v, uint32_t n_items) {
    uint32_t g = v.grid;
    if (g == 0) {
        int dev = 0, sms = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) {
            cudaGetLastError();
            sms = 132;
        }
        g = uint32_t(sms) * (v.ctas_per_sm ? v.ctas_per_sm : 1u);
    }
    return g < n_items ? g : n_items;
}

}  // namespace

std::vector<DecodeSpread> decode_spread_variants() {
    std::vector<DecodeSpread> out;
    for (const SpreadInstance& in : kSpreadInstances) out.push_back(DecodeSpread{in.warps, in.depth, 1, 0});
    return out;
}

bool decode_spread_applies(const GemmWeights& w, const GemmRoute& route, Epilogue epilogue, const DecodeSpread& v) {
    if (v.warps == 0 || !w.mxfp4 || w.K == 0 || w.K % 64 != 0 || w.K > kSpreadMaxK || w.N == 0) return false;
    if (epilogue != Epilogue::kStore && epilogue != Epilogue::kSwiglu) return false;
    if (epilogue == Epilogue::kSwiglu && w.N % 16 != 0) return false;
    if (route.max_tiles == 0 || route.max_tiles > kSpreadMaxTiles || !find_spread(v.warps, v.depth)) return false;
    const uint32_t S = ceil_div(w.N, 16u), n = route.max_tiles * S, g = spread_grid(v, n);
    if (S >= 0xFFFFu) return false;  // span[] packs local item numbers in 16 bits
    const uint32_t per_cta = ceil_div(n, g);
    // Two tiles per CTA at most (two staged rows); four items per warp range at most (red's slots):
    // a range of ceil(per_cta·C / NW) chunks touches at most that / C + 2 items.
    const uint32_t C = w.K / 64, range = ceil_div(per_cta * C, v.warps);
    return per_cta <= S && (range + C - 1) / C + 1 <= kSpreadSlots;
}

gptoss_status gemm_decode_spread(const GemmWeights& w, const uint16_t* x, const GemmRoute& route, bool route_ready,
                                 Epilogue epilogue, float* out_f32, uint16_t* out_bf16, uint32_t ldo,
                                 float swiglu_limit, const DecodeSpread& v, cudaStream_t stream) {
    if (!decode_spread_applies(w, route, epilogue, v))
        return fail(GPTOSS_ERR_INTERNAL,
                    "gemm_decode_spread: not applicable (MXFP4 %d, N=%u, K=%u, %u tiles, %u warps, ring %u, epilogue %d)",
                    int(w.mxfp4), w.N, w.K, route.max_tiles, v.warps, v.depth, int(epilogue));
    const bool swiglu = epilogue == Epilogue::kSwiglu;
    if (swiglu ? !out_bf16 : !out_f32) return fail(GPTOSS_ERR_INTERNAL, "gemm_decode_spread: output missing");
    const SpreadInstance* in = find_spread(v.warps, v.depth);
    SpreadArgs a{};
    a.w = w;
    a.x = x;
    a.route = route;
    a.route_ready = route_ready;
    a.swiglu = swiglu;
    a.out_f32 = out_f32;
    a.out_bf16 = out_bf16;
    a.ldo = ldo;
    a.limit = swiglu_limit;
    a.slabs = ceil_div(w.N, 16u);
    a.n_items = route.max_tiles * a.slabs;
    const uint32_t grid = spread_grid(v, a.n_items);
    GPTOSS_TRY(cuda_status(launch_pdl(in->fn, dim3(grid), dim3(v.warps * 32), 0, stream, a), "gemv_spread_kernel",
                           __FILE__, __LINE__));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
