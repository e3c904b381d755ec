// cuda/moe_stream.cu - the decode step's routed MXFP4 GEMVs as one streaming CTA per SM (issue 12;
// moe_stream.h). gemm_decode launches one short CTA per (route tile, 16-row slab) item: at 20b's
// gate_up 1 440 CTAs of 4 warps, each requesting 8 chunks per warp into registers after two
// dependent round trips, 1.6 waves of them; v25's accounting measured it at 17.4 µs per layer in
// the decode graph against an 8.8 µs floor, the largest excess of a step (bench/NOTES.md "v25").
// Here the grid is one CTA per SM and CTA b owns the contiguous item range [b·I/G, (b+1)·I/G) of
// the I = tiles × slabs items (tile-major; a static schedule, no counters). Its 4-warp groups take
// the range's items round-robin; for each, the group's leader thread issues two bulk copies (the
// slab's n_chunks × 512 bytes of fragment words and n_chunks × 64 bytes of scales, contiguous in
// repack.cu's layout) into one of the group's shared-memory stages, completing on the stage's
// mbarrier, and refills the stage with the group's next item as soon as its four warps have read
// it. So from the moment the route is known each SM keeps ~100 KB of its own weight stream in
// flight until its range ends, with no per-CTA ramp. The CTA stages the token's activation rows
// (x_rows × K bf16) once. The arithmetic is gemm_decode's 4-warp MXFP4 kernel's: warp w of a
// group sums the slab's chunks w, w + 4, ... through one mma chain (mxfp4_chunk_bf16), the four
// warp partials are added in warp order, then the bias and the epilogue, so the outputs are
// gemm_decode's bits (tests/test-kernels-decode.cu compares them exactly). Shared memory is fitted
// to half of what a CTA may opt in to by default, so that down's CTA (whose route is final before
// gate_up's wait) becomes resident beside gate_up's and issues its copies during gate_up's tail.
// Floor: the routed weight bytes at the copy bandwidth (20b: 37.4 MB gate_up, 18.8 MB down).
#include "cuda/moe_stream.h"

#include "cuda/common.cuh"
#include "cuda/gemm.cuh"
#include "cuda/mbarrier.cuh"

#include <algorithm>

namespace gptoss {
namespace cuda {
namespace {
using namespace gemm_detail;

constexpr uint32_t kMaxGroups = 4;
constexpr uint32_t kMaxTiles = 64;
constexpr uint32_t kMaxK = 4096;
constexpr uint32_t kChunkBytes = 512 + 64;  // one 64-k chunk of a 16-row slab: fragment words + scales

struct StreamArgs {
    GemmWeights w;
    const uint16_t* x;
    uint32_t x_bytes;  // the staged activation rows: x_rows · K · 2
    GemmRoute route;
    int route_ready;
    int swiglu;  // else kStore
    float* out_f32;
    uint16_t* out_bf16;
    uint32_t ldo;
    float limit;
    uint32_t slabs, items, groups, stages;
    uint32_t copy, piece;  // issue_item's copy mode and bulk piece (chunks)
};

// The shared-memory layout: barriers (one per stage, one for x), the route's tiles, the warp
// partials (two items deep per group), the activation rows, then groups × stages stages.
struct Layout {
    uint32_t bars, tiles, red, x, stage0, stage_bytes;
    __host__ __device__ Layout(uint32_t groups, uint32_t stages, uint32_t x_bytes, uint32_t n_chunks) {
        bars = 0;
        tiles = 128;  // (kMaxGroups · stages + 1) barriers of 8 bytes fit below for stages <= 3
        red = tiles + (1 + 2 * kMaxTiles) * 4 + 12;
        x = (red + groups * 2 * 4 * 16 * 4 + 127) & ~127u;
        stage0 = (x + x_bytes + 127) & ~127u;
        stage_bytes = n_chunks * kChunkBytes;
        (void)stages;
    }
    __host__ __device__ uint32_t total(uint32_t groups, uint32_t stages) const {
        return stage0 + groups * stages * stage_bytes;
    }
};
constexpr uint32_t kMaxStages = 3;
static_assert((kMaxGroups * kMaxStages + 1) * 8 <= 128, "barriers");

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Requests item `item`'s weights and scales into stage `dst`, completing on barrier `bar`, by
// the group's thread `gt` (0..127). copy 0: thread 0 issues one bulk copy per region (the
// barrier counts 1 arrival); 1: bulk copies of `piece` chunks each; 2: every thread copies its
// 16-byte units with cp.async and arrives when they land (the barrier counts 128).
__device__ __forceinline__ void issue_item(const StreamArgs& a, const int32_t* tiles, uint32_t item, uint32_t dst,
                                           uint32_t bar, uint32_t n_chunks, uint32_t gt) {
    const uint32_t tile = item / a.slabs, slab = item % a.slabs;
    const int expert = tiles[1 + 2 * tile];
    const char* wsrc = static_cast<const char*>(a.w.w) + size_t(expert) * a.w.w_expert_stride +
                       size_t(slab) * n_chunks * 512;
    const char* ssrc = reinterpret_cast<const char*>(a.w.scales + size_t(expert) * a.w.s_expert_stride) +
                       size_t(slab) * n_chunks * 64;
    if (a.copy == 2) {
        const uint32_t wu = n_chunks * 32, units = n_chunks * 36;
        for (uint32_t u = gt; u < units; u += 128) {
            const char* src = u < wu ? wsrc + size_t(u) * 16 : ssrc + size_t(u - wu) * 16;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + u * 16), "l"(src) : "memory");
        }
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
        return;
    }
    if (gt != 0) return;
    mbar_arrive_expect_tx(bar, n_chunks * kChunkBytes);
    const uint32_t piece = a.copy == 1 ? a.piece : n_chunks;
    for (uint32_t c = 0; c < n_chunks; c += piece) {
        const uint32_t nc = min(piece, n_chunks - c);
        bulk_copy_g2s(dst + c * 512, wsrc + size_t(c) * 512, nc * 512, bar);
    }
    for (uint32_t c = 0; c < n_chunks; c += piece * 8) {
        const uint32_t nc = min(piece * 8, n_chunks - c);
        bulk_copy_g2s(dst + n_chunks * 512 + c * 64, ssrc + size_t(c) * 64, nc * 64, bar);
    }
}

// At most 64 registers: gate_up's CTA of 4 groups and down's beside it fit one SM's register file.
__global__ __launch_bounds__(kMaxGroups * 128, 2) void moe_stream_kernel(const StreamArgs a) {
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t K = a.w.K, N = a.w.N, n_chunks = K >> 6;
    const Layout L(a.groups, a.stages, a.x_bytes, n_chunks);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t grp = uint32_t(warp) >> 2, wq = uint32_t(warp) & 3u;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t sbase = smem_addr(smem);
    const uint32_t x_bar = sbase + 8 * a.groups * a.stages;
    auto full_bar = [&](uint32_t s) { return sbase + 8 * (grp * a.stages + s); };
    auto stage_addr = [&](uint32_t s) { return sbase + L.stage0 + (grp * a.stages + s) * L.stage_bytes; };
    // tiles[0] = count; tiles[1 + 2i] = expert, tiles[2 + 2i] = pair of tile i.
    int32_t* tiles = reinterpret_cast<int32_t*>(smem + L.tiles);
    float* red = reinterpret_cast<float*>(smem + L.red);  // [group][item parity][warp][16 rows]
    const uint16_t* xs = reinterpret_cast<const uint16_t*>(smem + L.x);

    const uint32_t i0 = uint32_t(uint64_t(blockIdx.x) * a.items / gridDim.x);
    const uint32_t i1 = uint32_t(uint64_t(blockIdx.x + 1) * a.items / gridDim.x);
    if (threadIdx.x == 0) {
        for (uint32_t i = 0; i < a.groups * a.stages; ++i) mbar_init(sbase + 8 * i, a.copy == 2 ? 128 : 1);
        mbar_init(sbase + 8 * a.groups * a.stages, 1);  // x: one bulk copy
        mbar_init_fence();
    }
    const uint32_t max_tiles = a.route.max_tiles;
    // The route: counts and experts first (the weight copies need only those), the pairs after.
    auto read_route = [&] {
        if (threadIdx.x == 0) tiles[0] = __ldcg(a.route.tiles);
        if (threadIdx.x < max_tiles) tiles[1 + 2 * threadIdx.x] = __ldcg(a.route.tiles + 1 + 3 * threadIdx.x);
        __syncthreads();
    };
    // The group's end: items of tiles past the count (a suffix of the range) are skipped.
    uint32_t i_end = 0;
    auto issue_first = [&] {
        i_end = min(i1, uint32_t(max(tiles[0], 0)) * a.slabs);
        for (uint32_t s = 0; s < a.stages; ++s) {
            const uint32_t item = i0 + grp + a.groups * s;
            if (item < i_end) issue_item(a, tiles, item, stage_addr(s), full_bar(s), n_chunks, threadIdx.x & 127u);
        }
    };
    if (a.route_ready) {
        __syncthreads();  // the barriers' initialization
        read_route();
        issue_first();
        pdl_wait();
    } else {
        pdl_wait();
        read_route();
        issue_first();
    }
    pdl_launch_dependents();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(x_bar, a.x_bytes);
        bulk_copy_g2s(sbase + L.x, a.x, a.x_bytes, x_bar);
    }
    if (threadIdx.x < max_tiles) {
        const int32_t at = __ldcg(a.route.tiles + 2 + 3 * threadIdx.x);
        tiles[2 + 2 * threadIdx.x] = threadIdx.x < uint32_t(max(tiles[0], 0)) ? __ldcg(a.route.pairs + at) : 0;
    }
    __syncthreads();  // the pairs
    mbar_wait(x_bar, 0);

    const bool epi = wq == 0;  // warp 0 of the group finishes each item
    for (uint32_t j = 0, item = i0 + grp; item < i_end; ++j, item += a.groups) {
        const uint32_t s = j % a.stages, tile = item / a.slabs, slab = item % a.slabs;
        const int expert = tiles[1 + 2 * tile];
        const uint32_t pair = uint32_t(tiles[2 + 2 * tile]);
        // The epilogue's bias, ahead of the chain (gemm_decode's rows: r and r + 8 for SwiGLU).
        const uint32_t er = slab * 16 + uint32_t(lane);
        float bias_lo = 0.0f, bias_hi = 0.0f;
        const float* bias = a.w.bias ? a.w.bias + size_t(expert) * a.w.bias_expert_stride : nullptr;
        if (epi && bias && (a.swiglu ? lane < 8 : lane < 16 && er < N)) {
            bias_lo = __ldg(bias + er);
            if (a.swiglu) bias_hi = __ldg(bias + er + 8);
        }
        mbar_wait(full_bar(s), (j / a.stages) & 1u);
        const unsigned char* st = smem + (stage_addr(s) - sbase);
        const uint4* wsm = reinterpret_cast<const uint4*>(st) + lane;
        const uint2* ssm = reinterpret_cast<const uint2*>(st + n_chunks * 512) + g;
        const uint4* xq = reinterpret_cast<const uint4*>(xs + size_t(pair / a.route.in_div) * K) + 2 * t;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 2
        for (uint32_t c = wq; c < n_chunks; c += 4) {
            Chunk ch;
            ch.v[0] = wsm[c * 32];
            const uint2 sc = ssm[c * 8];
            ch.v[1].x = sc.x;
            ch.v[1].y = sc.y;
            const uint4 lo = xq[c * 8], hi = xq[c * 8 + 1];
            const uint32_t xw8[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            mxfp4_chunk_bf16(acc, ch, xw8);
        }
        float* rp = red + ((grp * 2 + (j & 1)) * 4) * 16;
        if (t == 0) {
            rp[wq * 16 + g] = acc[0];
            rp[wq * 16 + g + 8] = acc[2];
        }
        named_barrier(1 + grp, 128);  // the stage is read and the partials are in
        const uint32_t next = item + a.groups * a.stages;
        if (next < i_end) {
            if (a.copy != 2) fence_proxy_async_smem();
            issue_item(a, tiles, next, stage_addr(s), full_bar(s), n_chunks, threadIdx.x & 127u);
        }
        if (!epi) continue;
        // gemm_decode's epilogue: the warp partials in warp order, then the bias.
        if (a.swiglu) {
            if (lane < 8) {
                float gate = rp[lane], up = rp[lane + 8];
#pragma unroll
                for (int w = 1; w < 4; ++w) {
                    gate = __fadd_rn(gate, rp[w * 16 + lane]);
                    up = __fadd_rn(up, rp[w * 16 + lane + 8]);
                }
                gate += bias_lo;
                up += bias_hi;
                const float y = swiglu_clamped(gate, up, a.limit);
                a.out_bf16[size_t(pair) * a.ldo + permuted_k(slab * 8 + uint32_t(lane))] = f32_to_bf16_bits(y);
            }
        } else if (lane < 16 && er < N) {
            float sum = rp[lane];
#pragma unroll
            for (int w = 1; w < 4; ++w) sum = __fadd_rn(sum, rp[w * 16 + lane]);
            a.out_f32[size_t(pair) * a.ldo + er] = sum + bias_lo;
        }
    }
}

int g_override = -1;
uint32_t g_groups = 0, g_stages = 1;

}  // namespace

namespace {
// The plan a call gets: GPTOSS_DECODE_MOE_STREAM_STAGES (1-3, default 1) stages per group and
// GPTOSS_DECODE_MOE_STREAM_KB (default: half the opt-in maximum) of shared memory (A/B knobs).
// set_moe_stream_plan's forced groups and stages win when they fit the opt-in maximum.
MoeStreamPlan plan_for(const DeviceProps& dp, uint32_t K, uint32_t x_rows) {
    static const uint32_t stages = uint32_t(env_choice("GPTOSS_DECODE_MOE_STREAM_STAGES", {1, 2, 3}, 1));
    static const int budget_kb = env_int("GPTOSS_DECODE_MOE_STREAM_KB", 0);
    const uint32_t optin = uint32_t(std::max(dp.max_smem_optin, 0));
    if (g_groups != 0) {
        MoeStreamPlan p = moe_stream_plan(K, x_rows, g_stages, optin);
        const Layout L(g_groups, g_stages, x_rows * K * 2, K / 64);
        if (p.groups >= g_groups) {
            p.groups = g_groups;
            p.smem = L.total(g_groups, g_stages);
        }
        return p;
    }
    const uint32_t budget = budget_kb > 0 ? std::min(uint32_t(budget_kb) * 1024u, optin) : optin / 2;
    return moe_stream_plan(K, x_rows, stages, budget);
}
}  // namespace

bool moe_stream_fits(const GemmWeights& w, uint32_t x_rows, const GemmRoute& route) {
    DeviceProps dp;
    if (current_device_props(&dp) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return w.mxfp4 && w.N % 16 == 0 && route.max_tiles <= kMaxTiles && dp.major >= 9 &&
           plan_for(dp, w.K, x_rows).groups != 0;
}

MoeStreamPlan moe_stream_plan(uint32_t K, uint32_t x_rows, uint32_t stages, uint32_t budget_bytes) {
    MoeStreamPlan p;
    if (K == 0 || K % 64 != 0 || K > kMaxK || stages == 0 || stages > kMaxStages) return p;
    const uint32_t x_bytes = x_rows * K * 2;
    for (uint32_t g = kMaxGroups; g >= 1; --g) {
        const Layout L(g, stages, x_bytes, K / 64);
        if (L.total(g, stages) <= budget_bytes) {
            p.groups = g;
            p.stages = stages;
            p.smem = L.total(g, stages);
            return p;
        }
    }
    return p;
}

bool moe_stream_enabled(Epilogue epilogue) {
    static const int mask = env_int("GPTOSS_DECODE_MOE_STREAM", 0);
    const int m = g_override >= 0 ? g_override : mask;
    const int bit = epilogue == Epilogue::kSwiglu ? 1 : 2;
    DeviceProps dp;
    if (current_device_props(&dp) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return (m & bit) != 0 && dp.major >= 9;
}

void set_moe_stream(int mask) { g_override = mask < 0 ? -1 : mask & 3; }

void set_moe_stream_plan(uint32_t groups, uint32_t stages) {
    const bool ok = groups >= 1 && groups <= kMaxGroups && stages >= 1 && stages <= kMaxStages;
    g_groups = ok ? groups : 0;
    g_stages = ok ? stages : 1;
}

gptoss_status moe_stream_decode(const GemmWeights& w, const uint16_t* x, uint32_t x_rows, const GemmRoute& route,
                                bool route_ready, Epilogue epilogue, float* out_f32, uint16_t* out_bf16, uint32_t ldo,
                                float swiglu_limit, cudaStream_t stream) {
    const bool swiglu = epilogue == Epilogue::kSwiglu;
    if (!w.mxfp4 || !w.w || !w.scales || w.K == 0 || w.K % 64 != 0 || w.K > kMaxK || w.N == 0 || w.N % 16 != 0)
        return fail(GPTOSS_ERR_INTERNAL, "moe_stream_decode: needs MXFP4 experts with K %% 64 == 0, K <= %u and "
                    "N %% 16 == 0 (N=%u K=%u)", kMaxK, w.N, w.K);
    if (!swiglu && epilogue != Epilogue::kStore)
        return fail(GPTOSS_ERR_INTERNAL, "moe_stream_decode: epilogue %d, only kSwiglu and kStore", int(epilogue));
    if (swiglu ? !out_bf16 : !out_f32)
        return fail(GPTOSS_ERR_INTERNAL, "moe_stream_decode: the %s output is missing", swiglu ? "bf16" : "fp32");
    if (!route.tiles || !route.pairs || route.max_tiles > kMaxTiles || route.in_div == 0 || !x || x_rows == 0)
        return fail(GPTOSS_ERR_INTERNAL, "moe_stream_decode: needs a route of at most %u tiles and x rows (%u tiles, "
                    "%u rows)", kMaxTiles, route.max_tiles, x_rows);
    const uintptr_t align = reinterpret_cast<uintptr_t>(w.w) | reinterpret_cast<uintptr_t>(w.scales) |
                            reinterpret_cast<uintptr_t>(x) | w.w_expert_stride | (w.s_expert_stride * 2);
    if (align % 16 != 0) return fail(GPTOSS_ERR_INTERNAL, "moe_stream_decode: weights, scales and x must be 16-byte aligned");
    DeviceProps dp;
    GPTOSS_CUDA_TRY(current_device_props(&dp));
    if (dp.major < 9) return fail(GPTOSS_ERR_UNSUPPORTED, "moe_stream_decode: needs compute capability 9.0+");
    if (route.max_tiles == 0) return GPTOSS_OK;
    const MoeStreamPlan p = plan_for(dp, w.K, x_rows);
    if (p.groups == 0)
        return fail(GPTOSS_ERR_INTERNAL, "moe_stream_decode: %u rows of K=%u do not fit the shared-memory budget",
                    x_rows, w.K);
    StreamArgs a{};
    a.w = w;
    a.x = x;
    a.x_bytes = x_rows * w.K * 2;
    a.route = route;
    a.route_ready = route_ready;
    a.swiglu = swiglu;
    a.out_f32 = out_f32;
    a.out_bf16 = out_bf16;
    a.ldo = ldo;
    a.limit = swiglu_limit;
    a.slabs = w.N / 16;
    a.items = route.max_tiles * a.slabs;
    a.groups = p.groups;
    a.stages = p.stages;
    // GPTOSS_DECODE_MOE_STREAM_COPY: 0 whole bulk copies, 1 bulk pieces of
    // GPTOSS_DECODE_MOE_STREAM_PIECE chunks (default 8), 2 cp.async (A/B knobs; issue_item).
    static const uint32_t copy = uint32_t(env_choice("GPTOSS_DECODE_MOE_STREAM_COPY", {0, 1, 2}, 0));
    static const uint32_t piece = uint32_t(std::max(env_int("GPTOSS_DECODE_MOE_STREAM_PIECE", 8), 1));
    a.copy = copy;
    a.piece = piece;
    thread_local int opted_dev = -1;
    if (opted_dev != dp.dev) {
        GPTOSS_CUDA_TRY(cudaFuncSetAttribute(moe_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             dp.max_smem_optin));
        opted_dev = dp.dev;
    }
    const uint32_t grid = std::min<uint32_t>(uint32_t(std::max(dp.sms, 1)), a.items);
    return cuda_status(launch_pdl(moe_stream_kernel, dim3(grid), dim3(p.groups * 128), p.smem, stream, a),
                       "moe_stream_kernel", __FILE__, __LINE__);
}

}  // namespace cuda
}  // namespace gptoss
