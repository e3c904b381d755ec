// cuda/moe_spread_batch.cu - the batched decode step's routed MXFP4 GEMM for steps of a few tokens
// (issue 13; moe_decode_batch.h: moe_spread_batch_gemm), with moe_batch_gemm's bits in its K-parts
// mode. Why: moe_batch_kernel gives each (route tile, 16-row slab) item to one warp, which sums the
// slab's 45 chunks alone; a lone token has 1 440 gate_up items for ~2 100 warps, each a serial
// chain, so a lone stream on a batching model (batch invariance on) decoded at 568 tok/s against
// the decode graph's 733 (bench/NOTES.md "v46", "v47"). With the K parts of moe_batch_part_len
// (each part summed from zero, even + odd k16 chains added at its end, the parts added left to
// right), a part's sum no longer needs the rest of its slab, so here the parts are the unit of
// work. Mapping: the items (tile-major) split over one CTA per SM in balanced contiguous ranges;
// the CTA's (item, part) units split over its NW warps in balanced contiguous ranges; each warp
// streams its chunks through one ring of D across part and item boundaries (a tile's slabs are
// contiguous in repack.cu's layout; one pointer switch at the CTA's second tile). A warp that
// holds an item from part 0 keeps the left fold in registers and, if it holds the whole item,
// stores it itself (moe_batch_detail::store_tile, the same epilogue); it leaves a partial fold (a
// prefix) in shared memory when its range ends inside the item; a warp that starts inside an item
// leaves each of its parts there. After one barrier, the lowest warp starting inside each such
// item folds the prefix and the parts in part order and stores. Per chunk the arithmetic is
// chunk_mma<1>'s, on the same staged activation rows (8 per tile: steps of <= 8 tokens put at most
// 8 pairs in a tile). So every output is moe_batch_gemm's (parts on) bit for bit, whatever the
// step, the grid and the warps. Floor: the routed weight bytes at the copy bandwidth.
#include "cuda/moe_decode_batch.h"

#include "cuda/common.cuh"
#include "cuda/gemm.cuh"
#include "cuda/moe_batch_common.cuh"

#include <algorithm>
#include <cstdlib>

namespace gptoss {
namespace cuda {
namespace {
using namespace gemm_detail;
using namespace moe_batch_detail;

constexpr uint32_t kMaxParts = 4;  // moe_batch_parts() <= 4
constexpr uint32_t kSlots = 8;     // sums one warp may leave (moe_spread_batch_applies checks)

struct SpreadBatchArgs {
    KernelArgs a;
    uint32_t xstride;    // uint4 per staged row (K / 8 + 1)
    uint32_t n_items;    // max_tiles · S
    uint32_t part_len;   // chunks per part
    uint32_t n_parts;    // ceil(C / part_len)
    uint32_t max_local;  // most items of one CTA: ceil(n_items / grid)
};

// Dynamic shared memory: the rows [2][8][xstride] uint4, the sums [NW][kSlots][4][32] floats, each
// sum's last part [NW][kSlots] bytes, where each (item, first part) sum lies [max_local][n_parts]
// (warp << 4 | slot, 16 bits).
inline size_t spread_batch_smem(uint32_t K, int warps, uint32_t max_local, uint32_t n_parts) {
    return size_t(2) * 8 * (K / 8 + 1) * 16 + size_t(warps) * kSlots * 128 * sizeof(float) + size_t(warps) * kSlots +
           size_t(max_local) * n_parts * sizeof(uint16_t);
}

template <int NW, int D>
__global__ __launch_bounds__(NW * 32) void moe_spread_batch_kernel(const SpreadBatchArgs sa) {
    const KernelArgs& a = sa.a;
    extern __shared__ __align__(16) uint4 smem[];
    float* const red = reinterpret_cast<float*>(smem + 2 * 8 * size_t(sa.xstride));
    uint8_t* const last_part = reinterpret_cast<uint8_t*>(red + size_t(NW) * kSlots * 128);
    uint16_t* const where = reinterpret_cast<uint16_t*>(last_part + size_t(NW) * kSlots);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t S = (a.w.N + 15) / 16, C = a.w.K >> 6, NP = sa.n_parts, PL = sa.part_len;
    const uint32_t i0 = uint32_t(uint64_t(blockIdx.x) * sa.n_items / gridDim.x);
    const uint32_t i1 = uint32_t(uint64_t(blockIdx.x + 1) * sa.n_items / gridDim.x);
    const uint32_t n_local = i1 - i0, U = n_local * NP;
    pdl_wait();  // the route and the activations are the previous kernels'
    pdl_launch_dependents();
    if (n_local == 0) return;
    const uint32_t t_first = i0 / S;
    const uint32_t n_tiles = min(uint32_t(a.route.tiles[0]), a.route.max_tiles), n_act = n_tiles * S;
    // The CTA's (at most two) route tiles; tref(q) picks one without indexing a local array.
    const auto ref_of = [&](uint32_t tt) {
        return tt * S < i1 && tt < n_tiles ? tile_ref(a, tt) : TileRef{0, nullptr, 0};
    };
    const TileRef tr0 = ref_of(t_first), tr1 = ref_of(t_first + 1);
    const auto tref = [&](uint32_t q) { return q == 0 ? tr0 : tr1; };
    const uint32_t u0 = uint32_t(uint64_t(warp) * U / NW), u1 = uint32_t(uint64_t(warp + 1) * U / NW);
    // This warp's chunks: units [u0, min(u1, active units)) as CTA-local chunk positions.
    const uint32_t act_items = n_act > i0 ? min(n_act - i0, n_local) : 0u;
    const uint32_t ua1 = min(u1, act_items * NP);
    const auto chunk_of = [&](uint32_t u) { return (u / NP) * C + min((u % NP) * PL, C); };
    const uint32_t cs = chunk_of(u0), L = ua1 > u0 ? chunk_of(ua1) - cs : 0u;
    const uint32_t u_sw = ((t_first + 1) * S - i0) * C;  // local chunk where the second tile starts
    const uint32_t k_sw = u_sw > cs ? u_sw - cs : 0xFFFFFFFFu;
    ChunkStream stream;
    if (L > 0) {
        const uint32_t item = i0 + cs / C;
        stream.begin(a.w, tref(item / S - t_first).expert, item % S, cs % C, C, lane, tr1.expert, k_sw, L);
    }
    Chunk ring[D];
#pragma unroll
    for (int i = 0; i < D; ++i)
        if (uint32_t(i) < L) stream.next(ring[i], uint32_t(i));
    // The tiles' activation rows (8 per tile), as moe_batch_kernel stages them.
    const uint32_t buf = 8 * sa.xstride;
    if (tr0.pairs != nullptr) stage_rows(a, tr0, smem, sa.xstride);
    if (tr1.pairs != nullptr) stage_rows(a, tr1, smem + buf, sa.xstride);
    cp_async_wait_all();
    __syncthreads();

    // Compute cursor: local item j, chunk cc in it, part p and its end pe; own0: this warp holds
    // item j from part 0, its left fold in tot (left in shared memory at the item's or the range's
    // end); else each part is left on its own.
    uint32_t j = cs / C, cc = cs % C, p = cc / PL, pe = min((p + 1) * PL, C), slot = 0;
    bool own0 = p == 0, first = true;
    const uint32_t lane_off = uint32_t(g) * sa.xstride + uint32_t(t) * 2;
    const uint4* xl = smem + ((i0 + j) / S - t_first) * buf + lane_off;
    float a2[1][2][4] = {};
    float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const auto leave = [&](const float (&v)[4], uint32_t p_first, uint32_t p_last) {
        float* r = red + (size_t(warp) * kSlots + slot) * 128 + lane;
#pragma unroll
        for (int e = 0; e < 4; ++e) r[32 * e] = v[e];
        if (lane == 0) {
            last_part[warp * kSlots + slot] = uint8_t(p_last);
            where[j * NP + p_first] = uint16_t(uint32_t(warp) << 4 | slot);
        }
        ++slot;
    };
    // After warp-relative chunk k: a part's end (rare: every part_len chunks).
    const auto finish = [&](uint32_t k) {
        if (++cc != pe) return;
        float s[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[e] = __fadd_rn(a2[0][0][e], a2[0][1][e]);
            a2[0][0][e] = a2[0][1][e] = 0.0f;
        }
        const bool range_end = k + 1 == L, item_end = cc == C;
        if (own0) {
#pragma unroll
            for (int e = 0; e < 4; ++e) tot[e] = first ? s[e] : __fadd_rn(tot[e], s[e]);
            first = false;
            if (item_end || range_end) leave(tot, 0, p);
        } else {
            leave(s, p, p);
        }
        ++p;
        pe = min(pe + PL, C);
        if (item_end && !range_end) {
            ++j;
            cc = 0;
            p = 0;
            pe = min(PL, C);
            own0 = true;
            first = true;
            xl = smem + ((i0 + j) / S - t_first) * buf + lane_off;
        }
    };
    for (uint32_t base = 0; base < L; base += D) {
        if (base + 2 * D <= L && stream.no_switch(base + D, D)) {
            // A full round whose refills all lie in the range on one tile: loads at immediate
            // offsets from the round's pointers, no bound tests.
#pragma unroll
            for (int i = 0; i < D; ++i) {
                chunk_mma<1>(ring[i], xl, 0, cc, a2);
                stream.round_load(ring[i], uint32_t(i));
                finish(base + uint32_t(i));
            }
            stream.round_end(D);
            continue;
        }
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const uint32_t k = base + uint32_t(i);
            if (k >= L) break;
            chunk_mma<1>(ring[i], xl, 0, cc, a2);
            if (k + D < L) stream.next(ring[i], k + D);
            finish(k);
        }
    }
    __syncthreads();

    // Each active item: its sums in part order (a whole-item or prefix fold first, then single
    // parts), folded left to right, then moe_batch_gemm's epilogue.
    for (uint32_t jj = uint32_t(warp); jj < act_items; jj += NW) {
        float v[4];
        for (uint32_t next = 0; next < NP;) {
            const uint32_t at = where[jj * NP + next], w = at >> 4, sl = at & 15;
            const float* r = red + (size_t(w) * kSlots + sl) * 128 + lane;
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = next == 0 ? r[32 * e] : __fadd_rn(v[e], r[32 * e]);
            next = uint32_t(last_part[w * kSlots + sl]) + 1;
        }
        const uint32_t item = i0 + jj;
        const TileRef r = tref(item / S - t_first);
        const float acc[2][4] = {{v[0], v[1], v[2], v[3]}, {0.0f, 0.0f, 0.0f, 0.0f}};
        store_tile(a, r.expert, item % S, r.pairs, r.n_cols, acc);
    }
}

using SpreadBatchFn = void (*)(const SpreadBatchArgs);
struct SpreadBatchInstance {
    int warps, depth;
    SpreadBatchFn fn;
};
const SpreadBatchInstance kInstances[] = {
    {16, 4, moe_spread_batch_kernel<16, 4>}, {22, 4, moe_spread_batch_kernel<22, 4>},
    {24, 4, moe_spread_batch_kernel<24, 4>}, {16, 6, moe_spread_batch_kernel<16, 6>},
};

int g_warps = 0, g_depth = 0;  // set_moe_spread_batch_shape

// The CTA shape in use: set_moe_spread_batch_shape, else GPTOSS_DECODE_BATCH_SPREAD_WARPS / _DEPTH,
// else 22 warps (the 20b's gate_up at one token: 43.6 parts per CTA, ~2 per warp) and a ring of 4.
void spread_batch_shape(int* warps, int* depth) {
    static const int env_warps = env_choice("GPTOSS_DECODE_BATCH_SPREAD_WARPS", {0, 16, 22, 24}, 0);
    static const int env_depth = env_choice("GPTOSS_DECODE_BATCH_SPREAD_DEPTH", {0, 4, 6}, 0);
    *warps = g_warps ? g_warps : env_warps ? env_warps : 22;
    *depth = g_depth ? g_depth : env_depth ? env_depth : 4;
}

// Whether `grid` CTAs of `warps` warps can run these weights and route: every CTA's items within two
// tiles, every warp's sums within kSlots (a range of r units touches at most ceil((r - 1) / parts) + 1
// items, each leaving one sum from part 0, plus up to parts - 1 single parts of its first item), the
// item table's 16-bit entries and the shared memory.
bool spread_batch_fits(const GemmWeights& w, const GemmRoute& route, uint32_t grid, int warps, int smem_optin) {
    const uint32_t part_len = moe_batch_part_len(w.K), C = w.K / 64;
    if (part_len == 0 || grid == 0) return false;
    const uint32_t S = (w.N + 15) / 16, n = route.max_tiles * S, g = std::min(grid, n);
    const uint32_t parts = (C + part_len - 1) / part_len, per_cta = (n + g - 1) / g;
    const uint32_t range = (per_cta * parts + uint32_t(warps) - 1) / uint32_t(warps);
    const uint32_t sums = (range > 0 ? (range - 1 + parts - 1) / parts + 1 : 0) + parts - 1;
    return per_cta <= S && sums <= kSlots && parts <= kMaxParts &&
           spread_batch_smem(w.K, warps, per_cta, parts) <= size_t(smem_optin);
}

}  // namespace

void set_moe_spread_batch_shape(int warps, int depth) {
    g_warps = warps;
    g_depth = depth;
}

uint32_t moe_spread_batch_max_tokens() {
    static const int n = env_choice("GPTOSS_DECODE_BATCH_SPREAD_MAX_T", {0, 1, 2, 4, 8}, 8);
    return uint32_t(n);
}

bool moe_spread_batch_applies(const GemmWeights& w, const GemmRoute& route, uint32_t n_tokens) {
    if (moe_batch_part_len(w.K) == 0 || n_tokens == 0 || n_tokens > moe_spread_batch_max_tokens()) return false;
    if (!w.mxfp4 || w.K == 0 || w.K % 64 != 0 || w.N == 0 || route.max_tiles == 0) return false;
    DeviceProps dp;
    if (current_device_props(&dp) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    int warps = 0, depth = 0;
    spread_batch_shape(&warps, &depth);
    return spread_batch_fits(w, route, uint32_t(dp.sms), warps, dp.max_smem_optin);
}

gptoss_status moe_spread_batch_gemm(const GemmWeights& w, const uint16_t* x, const GemmRoute& route, uint32_t n_tokens,
                                    Epilogue epilogue, float* out_f32, uint16_t* out_bf16, uint32_t ldo,
                                    float swiglu_limit, uint32_t ctas, cudaStream_t stream) {
    if (!moe_spread_batch_applies(w, route, n_tokens))
        return fail(GPTOSS_ERR_INTERNAL,
                    "moe_spread_batch_gemm: not applicable (MXFP4 %d, N=%u, K=%u, %u tiles, %u tokens, parts %u)",
                    int(w.mxfp4), w.N, w.K, route.max_tiles, n_tokens, moe_batch_parts());
    if (epilogue == Epilogue::kAdd) return fail(GPTOSS_ERR_INTERNAL, "moe_spread_batch_gemm: kAdd is not supported");
    if (epilogue == Epilogue::kSwiglu ? (w.N % 16 != 0 || !out_bf16) : !out_f32)
        return fail(GPTOSS_ERR_INTERNAL, "moe_spread_batch_gemm: the %s output is missing or N=%u is not a multiple of 16",
                    epilogue == Epilogue::kSwiglu ? "bf16" : "fp32", w.N);
    if (!x || !route.tiles || !route.pairs || route.in_div == 0)
        return fail(GPTOSS_ERR_INTERNAL, "moe_spread_batch_gemm: x and a route (tiles, pairs, in_div > 0) are required");
    int warps = 0, depth = 0;
    spread_batch_shape(&warps, &depth);
    const SpreadBatchInstance* in = nullptr;
    for (const SpreadBatchInstance& i : kInstances)
        if (i.warps == warps && i.depth == depth) in = &i;
    if (!in) return fail(GPTOSS_ERR_INTERNAL, "moe_spread_batch_gemm: no kernel of %d warps, ring %d", warps, depth);
    DeviceProps dp;
    GPTOSS_CUDA_TRY(current_device_props(&dp));
    SpreadBatchArgs sa;
    sa.a = kernel_args(w, x, 0, &route, epilogue, out_f32, out_bf16, ldo, swiglu_limit);
    sa.xstride = w.K / 8 + 1;
    sa.n_items = route.max_tiles * ((w.N + 15) / 16);
    sa.part_len = moe_batch_part_len(w.K);
    sa.n_parts = (w.K / 64 + sa.part_len - 1) / sa.part_len;
    const uint32_t grid = std::min(ctas ? ctas : uint32_t(dp.sms), sa.n_items);
    if (!spread_batch_fits(w, route, grid, warps, dp.max_smem_optin))
        return fail(GPTOSS_ERR_INTERNAL, "moe_spread_batch_gemm: %u CTAs of %d warps do not fit N=%u, K=%u, %u tiles",
                    grid, warps, w.N, w.K, route.max_tiles);
    sa.max_local = (sa.n_items + grid - 1) / grid;
    const size_t smem = spread_batch_smem(w.K, warps, sa.max_local, sa.n_parts);
    GPTOSS_CUDA_TRY(cudaFuncSetAttribute(in->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    GPTOSS_TRY(cuda_status(launch_pdl(in->fn, dim3(grid), dim3(32 * warps), smem, stream, sa),
                           "moe_spread_batch_kernel", __FILE__, __LINE__));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
