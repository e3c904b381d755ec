// cuda/gemm_decode.cu - the decode GEMVs (one token): dense bf16 projections (QKV, O) and the
// routed MXFP4 expert projections (gate_up + SwiGLU, down) of a T = 1 step, with K split over
// more warps than the prefill kernel uses. Decode-written K/V is never reused by a later call
// (the engine re-prefills those positions), so these kernels need not match the prefill GEMM
// bit for bit: they sum in a fixed order of their own (per warp: its chunks w, w + NW, ... in
// order through the mma chain; then the NW warp partials in warp order), deterministic run to
// run, no atomics.
// Mapping: one CTA = one 16-row weight slab (× one routed tile: expert, one pair); NW warps
// split the slab's 64-k chunks, each with a ring of kDepth chunks in flight. The activation
// row rides in the ring too: either as each lane's two 16-byte B fragments (lanes of column 0
// only; the mma's other 7 columns are zero) or, "shfl", as one 4-byte word per lane per chunk
// (the whole 128-byte chunk slice of the row across the warp), whose B fragments come out with
// two shuffles per k16 sub-tile — 1 register per ring stage instead of 8, and then all 8 mma
// columns carry the same row (column 0 is read). Routed with route_ready: the route (written
// by a kernel that finished before the previous kernel's dependency wait, e.g. the router
// before gate_up) is read and the expert's first weight chunks are requested before this
// kernel's own griddepcontrol.wait (MoE down at decode). route_early (GPTOSS_DECODE_ROUTE_EARLY=1): one L2 round
// trip for the tile (count, expert, pair offset) before the weight requests, the pair read
// after them (it was three dependent round trips in front of gate_up's first weight load).
// MXFP4: the CTA copies the activation row to shared memory once (after the dependency wait),
// scaled by 2^32, and each chunk runs gemm.cuh's mxfp4_chunk_blockscale (the block scales on the
// fp32 sums of 32-k blocks; bench/NOTES.md "v32", "v33"); its own summation order: decode-vs-prefill
// is a tolerance comparison; shfl is ignored for MXFP4 and K is limited to kMaxRowK.
// Fixed-K instances (kChunks = 45 or 64: gpt-oss's K of 2880 and 4096) unroll each warp's chunks
// with the same order and bits; the defaults take them (bench/NOTES.md "v40").
// Floor: bytes of W read once (the activation row is an L2 hit); the variants (warps, ring
// depth, shfl, fixed_k) are picked by decode_tuning(), overridable by environment variables for
// A/B runs (bench/NOTES.md, "v12 decode").
#include "cuda/common.cuh"
#include "cuda/gemm.cuh"
#include "cuda/kernels.h"
#include "cuda/router_fold.cuh"

#include <cstdio>
#include <cstdlib>
#include <type_traits>

namespace gptoss {
namespace cuda {
namespace {
using namespace gemm_detail;

struct DecodeArgs {
    GemmWeights w;
    const uint16_t* x;
    GemmRoute route;
    int routed;
    int route_ready;
    int route_early;  // routed: request the weights before the pair read (route_early())
    int epilogue;
    float* out_f32;
    uint16_t* out_bf16;
    uint32_t ldo;
    float limit;
    RouterFoldArgs fold;  // kFold instances only (router_fold.cuh)
};

constexpr uint32_t kMaxRowK = 4096;  // the MXFP4 activation row lives in shared memory
struct NoFoldSmem {};                // the shared memory of the instances without the router fold

// kChunks: 0 = any K (a loop over rounds of kDepth chunks with a bound test per chunk), else the
// instance for K = 64·kChunks only: the warp's chunks unrolled, so the loads and shared-memory
// reads sit at immediate offsets from one pointer and the only test left is whether the warp has
// the slab's last, odd chunk. The same chunks in the same order through the same mma: the same bits.
// kFold (dense kAdd only): the router folded into the epilogue (router_fold.cuh).
template <bool kFp4, int NW, int kDepth, bool kShfl, int kChunks, bool kFold = false>
__global__ __launch_bounds__(NW * 32) void gemv_decode_kernel(const DecodeArgs args) {
    static_assert(!kFold || !kFp4, "the router fold runs in the dense O projection");
    constexpr uint32_t R = NW * 32;
    __shared__ float red[NW][16];
    __shared__ std::conditional_t<kFold, fold_detail::FoldSmem<NW>, NoFoldSmem> fsm;
    // MXFP4: the staged activation row, permuted as it is.
    __shared__ __align__(16) uint16_t xsm[kFp4 ? kMaxRowK : 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t slab = blockIdx.x;
    const uint32_t K = kChunks ? 64u * kChunks : args.w.K, N = args.w.N, n_chunks = K >> 6;
    // kChunks: the warp's chunks are warp + NW·i, i < kPer; the last only for warps < kOdd.
    constexpr int kOdd = kChunks % NW, kPer = kChunks / NW + (kOdd != 0);
    const auto has = [&](int i) { return i < kPer - 1 || (i == kPer - 1 && (kOdd == 0 || warp < kOdd)); };

    // The tile: expert and the one pair of a T = 1 route (dense: expert 0, row 0).
    int expert = 0, n_tiles = 1, pair_at = 0;
    uint32_t in_row = 0, out_row = 0;
    const auto read_pair = [&] {
        const uint32_t pair = uint32_t(__ldcg(args.route.pairs + pair_at));
        in_row = pair / args.route.in_div;
        out_row = pair;
    };
    if (args.routed) {
        if (!args.route_ready) pdl_wait();
        // L2 loads: the route may have been written while this grid was already resident.
        // route_early: the tile count and the tile's expert and pair offset in one round trip
        // (blockIdx.y < max_tiles, so the tile lies in the buffer even when unused), the pair
        // itself (only the activation row and the store need it) after the weight requests.
        const int32_t* ti = args.route.tiles + 1 + 3 * blockIdx.y;
        if (args.route_early) {
            n_tiles = __ldcg(args.route.tiles);
            expert = __ldcg(ti);
            pair_at = __ldcg(ti + 1);
            if (int(blockIdx.y) >= n_tiles) return;
        } else {
            n_tiles = __ldcg(args.route.tiles);
            if (int(blockIdx.y) >= n_tiles) return;
            expert = __ldcg(ti);
            pair_at = __ldcg(ti + 1);
            read_pair();
        }
    }

    const uint4* wp;
    const uint2* sp;
    slab_pointers<kFp4>(args.w, expert, slab, n_chunks, lane, &wp, &sp);
    // kChunks: every pointer starts at the warp's first chunk c0, so that a chunk's offset from it,
    // c − c0 = NW·i, is a constant of the unrolled code (any K: c0 = 0).
    const uint32_t c0 = kChunks ? uint32_t(warp) : 0u;
    wp += size_t(c0) * (kFp4 ? 32 : 128);
    if constexpr (kFp4) sp += size_t(c0) * 8;

    Chunk ring[kDepth];
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
        const uint32_t cc = uint32_t(warp) + uint32_t(NW) * i;
        if (kChunks ? has(i) : cc < n_chunks) load_chunk<kFp4>(ring[i], wp, sp, cc - c0);
    }
    if (args.routed && args.route_early) read_pair();
    // The epilogue's bias (a weight, known with the expert) and, for kAdd, the residual row it
    // adds to (final once the wait returns; only this CTA writes those rows) are loaded here,
    // ahead of the chunk chain: in the epilogue each was one more dependent round trip at the
    // end of every CTA, i.e. on the tail of the kernel.
    const uint32_t er = slab * 16 + threadIdx.x;  // the row thread threadIdx.x < 16 finishes
    const bool swiglu = args.epilogue == int(Epilogue::kSwiglu);
    const float* bias = args.w.bias ? args.w.bias + size_t(expert) * args.w.bias_expert_stride : nullptr;
    float bias_lo = 0.0f, bias_hi = 0.0f;  // swiglu: rows slab·16 + r and + 8 (r < 8); else row er
    if (bias && (swiglu ? threadIdx.x < 8 : threadIdx.x < 16 && er < N)) {
        bias_lo = __ldg(bias + er);
        if (swiglu) bias_hi = __ldg(bias + er + 8);
    }
    float fold_g = 0.0f;  // kFold: γ of the row this thread finishes
    if constexpr (kFold) fold_g = fold_detail::fold_prefetch<NW>(args.fold, fsm, slab, N);
    if (!args.routed || args.route_ready) pdl_wait();
    pdl_launch_dependents();
    float resid = 0.0f;
    if (args.epilogue == int(Epilogue::kAdd) && threadIdx.x < 16 && er < N)
        resid = __ldcg(args.out_f32 + size_t(out_row) * args.ldo + er);

    // Activation ring: shfl = word `lane` of each chunk's 128-byte slice of the row; else the
    // two 16-byte B fragments of lanes g == 0 (zero elsewhere).
    const uint16_t* xrow = args.x + size_t(in_row) * K;
    const uint32_t* xw = reinterpret_cast<const uint32_t*>(xrow) + lane + size_t(c0) * 32;
    const uint4* xf = reinterpret_cast<const uint4*>(xrow + t * 16) + size_t(c0) * 8;
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
    if constexpr (kFp4) {
        // The whole row, once per CTA (every chunk of the slab is some warp's).
        const uint4* src = reinterpret_cast<const uint4*>(xrow);
        for (uint32_t i = threadIdx.x; i < K / 8; i += R) {
            uint4 v = __ldcg(src + i);
            // × 2^32 (exact): mxfp4_chunk_blockscale's operand
            v.x = bf16x2_mul(v.x, kXScaleBf16x2);
            v.y = bf16x2_mul(v.y, kXScaleBf16x2);
            v.z = bf16x2_mul(v.z, kXScaleBf16x2);
            v.w = bf16x2_mul(v.w, kXScaleBf16x2);
            *reinterpret_cast<uint4*>(xsm + 8 * i) = v;
        }
        __syncthreads();
    } else {
#pragma unroll
        for (int i = 0; i < kDepth; ++i) {
            const uint32_t cc = uint32_t(warp) + uint32_t(NW) * i;
            if (kChunks ? has(i) : cc < n_chunks) load_x(i, cc - c0);
        }
    }

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // Chunk c from ring slot i, then slot i's refill with chunk cn.
    const auto compute = [&](int i, uint32_t c) {
        if constexpr (kFp4) {
            // words c·32 + 8t .. + 7 of the row (sub-tile j: 8t + 2j, + 1).
            const uint4* xq = reinterpret_cast<const uint4*>(xsm) + size_t(c0) * 8 + 2 * t + size_t(c - c0) * 8;
            const uint4 lo = xq[0], hi = xq[1];
            const uint32_t xw8[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            mxfp4_chunk_blockscale(acc, ring[i], xw8);
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                uint32_t a[4];
                fragment<false>(ring[i], j, a);
                uint32_t b0, b1;
                if constexpr (kShfl) {
                    b0 = __shfl_sync(0xffffffffu, xs[i], 8 * t + 2 * j);
                    b1 = __shfl_sync(0xffffffffu, xs[i], 8 * t + 2 * j + 1);
                } else {
                    const uint4 b = xb[i][j >> 1];
                    b0 = (j & 1) ? b.z : b.x;
                    b1 = (j & 1) ? b.w : b.y;
                }
                mma(acc, a, b0, b1);
            }
        }
    };
    const auto refill = [&](int i, uint32_t cn) {
        load_chunk<kFp4>(ring[i], wp, sp, cn - c0);
        if constexpr (!kFp4) load_x(i, cn - c0);
    };
    if constexpr (kChunks != 0) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            if (!has(i)) break;  // only the last chunk, only for warps >= kOdd
            const uint32_t c = uint32_t(warp) + uint32_t(NW) * i;
            compute(i % kDepth, c);
            if (i + kDepth < kPer && has(i + kDepth)) refill(i % kDepth, c + uint32_t(NW * kDepth));
        }
    } else {
        for (uint32_t base = uint32_t(warp); base < n_chunks; base += uint32_t(NW * kDepth)) {
#pragma unroll
            for (int i = 0; i < kDepth; ++i) {
                const uint32_t c = base + uint32_t(NW) * i;
                if (c >= n_chunks) break;
                compute(i, c);
                const uint32_t cn = c + uint32_t(NW * kDepth);
                if (cn < n_chunks) refill(i, cn);
            }
        }
    }

    // Column 0: rows g (acc[0]) and g + 8 (acc[2]) of lanes t == 0.
    if (t == 0) {
        const float unscale = kFp4 ? kXUnscale : 1.0f;  // exact: a power of two
        red[warp][g] = acc[0] * unscale;
        red[warp][g + 8] = acc[2] * unscale;
    }
    __syncthreads();
    if (swiglu) {
        if (threadIdx.x >= 8) return;
        const int r = threadIdx.x;
        float gate = red[0][r], up = red[0][r + 8];
#pragma unroll
        for (int w = 1; w < NW; ++w) {
            gate = __fadd_rn(gate, red[w][r]);
            up = __fadd_rn(up, red[w][r + 8]);
        }
        gate += bias_lo;
        up += bias_hi;
        const float y = swiglu_clamped(gate, up, args.limit);
        args.out_bf16[size_t(out_row) * args.ldo + permuted_k(slab * 8 + r)] = f32_to_bf16_bits(y);
    } else {
        const int r = threadIdx.x;
        const uint32_t row = slab * 16 + r;
        float stored = 0.0f;
        if (r < 16 && row < N) {
            float s = red[0][r];
#pragma unroll
            for (int w = 1; w < NW; ++w) s = __fadd_rn(s, red[w][r]);
            const float v = s + bias_lo;
            float* o = args.out_f32 + size_t(out_row) * args.ldo + row;
            stored = args.epilogue == int(Epilogue::kAdd) ? resid + v : v;
            *o = stored;
        }
        if constexpr (kFold) fold_detail::fold_epilogue<NW>(args.fold, fsm, slab, stored, fold_g, args.out_f32, N);
    }
}

using KernelFn = void (*)(const DecodeArgs);

struct Instance {
    bool fp4;
    DecodeGemv v;
    uint32_t chunks;  // 0: any K; else K = 64·chunks only
    KernelFn fn;
    bool fold = false;  // the router fold in the epilogue (router_fold.cuh)
};

#define GPTOSS_GEMV(FP4, NW, D, SH, C) \
    Instance{FP4, DecodeGemv{NW, D, SH}, C, gemv_decode_kernel<FP4, NW, D, SH, C>}
#define GPTOSS_GEMV_FOLD(NW, D, SH, C) \
    Instance{false, DecodeGemv{NW, D, SH}, C, gemv_decode_kernel<false, NW, D, SH, C, true>, true}
// The variants compiled in (decode_gemv_variants lists them; the tests run every one), and the
// fixed-K instances of the defaults for gpt-oss's K: 2880 (45 chunks: QKV, gate_up, down) and
// 4096 (64: O), which gemm_decode takes when the variant's fixed_k allows and K matches.
const Instance kInstances[] = {
    GPTOSS_GEMV(false, 4, 4, false, 0), GPTOSS_GEMV(false, 8, 4, false, 0), GPTOSS_GEMV(false, 16, 4, false, 0),
    GPTOSS_GEMV(false, 8, 4, true, 0),  GPTOSS_GEMV(false, 16, 4, true, 0), GPTOSS_GEMV(true, 4, 4, false, 0),
    GPTOSS_GEMV(true, 4, 4, true, 0),   GPTOSS_GEMV(true, 4, 6, true, 0),   GPTOSS_GEMV(true, 4, 8, true, 0),
    GPTOSS_GEMV(true, 8, 4, true, 0),   GPTOSS_GEMV(true, 8, 4, false, 0),
    GPTOSS_GEMV(true, 4, 4, true, 45),  GPTOSS_GEMV(false, 8, 4, false, 45), GPTOSS_GEMV(false, 8, 4, false, 64),
    // The router fold (O's default variant and its any-K kernel, the same bits apart from the fold).
    GPTOSS_GEMV_FOLD(8, 4, false, 0), GPTOSS_GEMV_FOLD(8, 4, false, 64),
};
// Measured and removed (bench/NOTES.md "v39", "v40"): MXFP4 rings holding a warp's whole share of a
// 45-chunk slab (4 warps × 12, 8 × 6, 16 × 3): 6-17 % slower than 4 × 6; a ring of 5 bounded to 8
// CTAs per SM (64 registers): −3.4 %; fixed-K MXFP4 rings of 5, 6 and 8 (92-114 registers), fixed-K
// rings bounded to 6-8 CTAs per SM (spills) and fixed-K MXFP4 CTAs of 2 or 8 warps: −4 to −10 %, and
// the fixed-K bf16 GEMVs at 4 warps: −1.5 %, against the defaults of the time.
#undef GPTOSS_GEMV
#undef GPTOSS_GEMV_FOLD

const Instance* find_instance(bool fp4, const DecodeGemv& v, uint32_t chunks, bool fold = false) {
    const Instance* any_k = nullptr;
    for (const Instance& in : kInstances)
        if (in.fp4 == fp4 && in.fold == fold && in.v.warps == v.warps && in.v.depth == v.depth &&
            in.v.shfl_x == v.shfl_x) {
            if (in.chunks == 0) any_k = &in;
            else if (v.fixed_k && in.chunks == chunks) return &in;
        }
    return any_k;
}

// "NW,DEPTH,SHFL" (e.g. "8,4,1") from the environment, else `def`.
DecodeGemv env_variant(const char* name, DecodeGemv def) {
    const char* s = std::getenv(name);
    if (!s || !*s) return def;
    unsigned nw = 0, d = 0, sh = 0;
    if (std::sscanf(s, "%u,%u,%u", &nw, &d, &sh) != 3) {
        std::fprintf(stderr, "gptoss: %s=\"%s\" is not NW,DEPTH,SHFL; using the default\n", name, s);
        return def;
    }
    return DecodeGemv{nw, d, sh != 0, def.fixed_k};
}

bool env_flag(const char* name, bool def) {
    const char* s = std::getenv(name);
    return (s && *s) ? std::atoi(s) != 0 : def;
}

// GPTOSS_DECODE_ROUTE_EARLY (default on; 0 = the v13 order): routed GEMVs request their weights
// before the pair read.
bool route_early() {
    static const bool on = env_flag("GPTOSS_DECODE_ROUTE_EARLY", true);
    return on;
}

}  // namespace

std::vector<std::pair<bool, DecodeGemv>> decode_gemv_variants() {
    std::vector<std::pair<bool, DecodeGemv>> out;
    for (const Instance& in : kInstances)
        if (in.chunks == 0 && !in.fold) out.emplace_back(in.fp4, in.v);
    return out;
}

bool decode_gemv_fold_usable(const DecodeGemv& v, uint32_t K) {
    return K % 64 == 0 && find_instance(false, v, K / 64, true) != nullptr;
}

std::vector<DecodeFixedK> decode_gemv_fixed_k() {
    std::vector<DecodeFixedK> out;
    for (const Instance& in : kInstances)
        if (in.chunks != 0 && !in.fold) {
            DecodeGemv v = in.v;
            v.fixed_k = true;
            out.push_back(DecodeFixedK{in.fp4, v, 64 * in.chunks});
        }
    return out;
}

const DecodeTuning& decode_tuning() {
    static const DecodeTuning tuning = [] {
        DecodeTuning d;
        d.bf16 = env_variant("GPTOSS_DECODE_BF16", d.bf16);
        d.fp4 = env_variant("GPTOSS_DECODE_FP4", d.fp4);
        d.route_ready = env_flag("GPTOSS_DECODE_ROUTE_READY", d.route_ready);
        d.bf16.fixed_k = env_flag("GPTOSS_DECODE_FIXED_K_BF16", d.bf16.fixed_k);
        d.fp4.fixed_k = env_flag("GPTOSS_DECODE_FIXED_K", d.fp4.fixed_k);
        return d;
    }();
    return tuning;
}

gptoss_status gemm_decode(const GemmWeights& w, const uint16_t* x, const GemmRoute* route, bool route_ready,
                          Epilogue epilogue, float* out_f32, uint16_t* out_bf16, uint32_t ldo, float swiglu_limit,
                          const DecodeGemv& variant, cudaStream_t stream, const RouterFoldArgs* fold) {
    if (w.K == 0 || w.K % 64 != 0 || w.N == 0)
        return fail(GPTOSS_ERR_INTERNAL, "gemm_decode: K=%u must be a positive multiple of 64, N=%u > 0", w.K, w.N);
    if (w.mxfp4 && w.K > kMaxRowK)
        return fail(GPTOSS_ERR_INTERNAL, "gemm_decode: MXFP4 K=%u exceeds the %u of the row in shared memory",
                    w.K, kMaxRowK);
    if (epilogue == Epilogue::kSwiglu && (w.N % 16 != 0 || !out_bf16 || !route))
        return fail(GPTOSS_ERR_INTERNAL, "gemm_decode: SwiGLU needs a route, N %% 16 == 0 (N=%u) and a bf16 output",
                    w.N);
    if (epilogue != Epilogue::kSwiglu && !out_f32) return fail(GPTOSS_ERR_INTERNAL, "gemm_decode: fp32 output missing");
    if (fold) {
        if (w.mxfp4 || route || epilogue != Epilogue::kAdd || !router_fold_supported(fold->E, fold->K, w.N) ||
            !fold->w || !fold->norm_w || !fold->partial || !fold->counter || !fold->xn || !fold->logits ||
            !fold->experts || !fold->weights || !fold->tiles || !fold->pairs)
            return fail(GPTOSS_ERR_INTERNAL,
                        "gemm_decode: the router fold needs dense weights, epilogue kAdd, every buffer, E <= 128 "
                        "and H %% 64 == 0 (E=%u, top-%u, H=%u)",
                        fold->E, fold->K, w.N);
    }
    const Instance* in = find_instance(w.mxfp4, variant, w.K / 64, fold != nullptr);
    if (!in)
        return fail(GPTOSS_ERR_INTERNAL, "gemm_decode: no %s variant with %u warps, ring depth %u, shfl %d%s",
                    w.mxfp4 ? "MXFP4" : "bf16", variant.warps, variant.depth, int(variant.shfl_x),
                    fold ? " and the router fold" : "");
    DecodeArgs a{};
    a.w = w;
    a.x = x;
    a.routed = route != nullptr;
    a.route_ready = route && route_ready;
    a.route_early = route_early();
    if (route) a.route = *route;
    a.epilogue = int(epilogue);
    a.out_f32 = out_f32;
    a.out_bf16 = out_bf16;
    a.ldo = ldo;
    a.limit = swiglu_limit;
    if (fold) {
        a.fold = *fold;
        a.fold.topk_redux = router_topk_redux() ? 1 : 0;
        if (a.fold.acq_rel < 0) a.fold.acq_rel = router_fold_acq_rel() ? 1 : 0;
    }
    const uint32_t tiles = route ? route->max_tiles : 1;
    if (tiles == 0) return GPTOSS_OK;
    if (tiles > 65535) return fail(GPTOSS_ERR_INTERNAL, "gemm_decode: %u tiles exceed the grid limit", tiles);
    const dim3 grid(ceil_div(w.N, 16), tiles);
    GPTOSS_TRY(cuda_status(launch_pdl(in->fn, grid, dim3(variant.warps * 32), 0, stream, a), "gemv_decode_kernel",
                           __FILE__, __LINE__));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
