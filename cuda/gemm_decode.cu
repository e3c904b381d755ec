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
// Normed (QKV at decode, layers after the first): the previous layer's MoE combine + residual
// add + this layer's attention RMSNorm run in every CTA's prologue (bit-identical to
// residual_rmsnorm kMoeAdd; the residual goes to a second buffer), so the separate combine
// launch and its kernel boundary disappear; the B fragments then come from shared memory.
// Folded (MoE down at decode, decode_fold.h): the combine + residual + next RMSNorm run in the
// tail of the last down CTA to finish (a global counter), so the combine launch disappears.
// MXFP4: the CTA copies the activation row to shared memory once (after the dependency wait),
// and each chunk runs gemm.cuh's mxfp4_chunk_bf16 (gemm.cu's bf16 dequantization, its own
// summation order: decode-vs-prefill is a tolerance comparison); shfl is ignored for MXFP4 and
// K is limited to kNormMaxK.
// Floor: bytes of W read once (the activation row is an L2 hit); the variants (warps, ring
// depth, shfl) are picked by decode_tuning(), overridable by environment variables for A/B
// runs (bench/NOTES.md, "v12 decode").
#include "cuda/common.cuh"
#include "cuda/decode_fold.h"
#include "cuda/gemm.cuh"
#include "cuda/kernels.h"

#include <cstdio>
#include <cstdlib>

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
    DecodeNorm norm;  // kNorm only
    DecodeFold fold;  // kFold only
};

constexpr uint32_t kNormMaxK = 4096;  // the normed row lives in shared memory
constexpr uint32_t kNormSlots = 4;    // MoE slots combined in the prologue (gpt-oss: 4)

// The MoE combine + RMSNorm of residual_rmsnorm(kMoeAdd) (same per-element arithmetic, same
// reduction order through rmsnorm_inv: bit-identical), computed by every CTA of the next QKV
// GEMV for itself: v = x + Σ_s w_s · part_s, xsm = bf16(v · inv · norm_w) permuted; CTA 0 also
// stores v to x_out (another buffer than x: the other CTAs still read x). Contains a
// __syncthreads; every thread of the CTA calls it.
template <uint32_t R, uint32_t Q>
__device__ __forceinline__ void normed_row(const DecodeNorm& nm, uint32_t H, const float (&wn)[Q][kNormPer],
                                           float* npart, uint16_t* xsm) {
    float wt[kNormSlots];
#pragma unroll
    for (uint32_t s = 0; s < kNormSlots; ++s) wt[s] = s < nm.K ? __ldg(nm.weights + s) : 0.0f;
    float v[Q][kNormPer];
#pragma unroll
    for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
        for (uint32_t j = 0; j < kNormPer; ++j) {
            const uint32_t i = threadIdx.x + R * q + kNormThreads * j;
            float p[kNormSlots];
#pragma unroll
            for (uint32_t s = 0; s < kNormSlots; ++s)
                p[s] = (s < nm.K && i < H) ? __ldg(nm.part + size_t(s) * H + i) : 0.0f;
            v[q][j] = i < H ? nm.x[i] : 0.0f;
            float sum = 0.0f;
#pragma unroll
            for (uint32_t s = 0; s < kNormSlots; ++s)
                if (s < nm.K) sum = __fmaf_rn(wt[s], p[s], sum);
            v[q][j] += sum;
        }
    const float inv = rmsnorm_inv<R>([&](uint32_t q, uint32_t j) { return v[q][j]; }, H, nm.eps, npart);
#pragma unroll
    for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
        for (uint32_t j = 0; j < kNormPer; ++j) {
            const uint32_t i = threadIdx.x + R * q + kNormThreads * j;
            if (i >= H) continue;
            xsm[permuted_k(i)] = f32_to_bf16_bits(v[q][j] * inv * wn[q][j]);
            if (blockIdx.x == 0) nm.x_out[i] = v[q][j];
        }
    __syncthreads();
}

constexpr uint32_t kFoldSlots = 4;  // MoE slots the fold combines (gpt-oss: 4)
constexpr uint32_t kFoldBatch = 2;  // float4 groups per thread with their loads in flight at once

// The fold (decode_fold.h), run by every thread of a down CTA after its output rows are
// stored: count this CTA; the last of `target` CTAs combines the K partial rows of `part`
// ([K, H], written by the CTAs of this grid, so read from L2) into x, normalizes, writes xn.
// Per element the arithmetic is residual_rmsnorm kMoeAdd's (sum = fma chain over the slots in
// order, v = x + sum, bf16(v · inv · w)); the sum of squares goes through rmsnorm_inv<R> (the
// 1024-thread reduction order), so the bits are the same. kSmem: v and the norm weight are
// staged in dynamic shared memory (2·H floats); else none is used (the CTA re-reads x, which
// it wrote, and the norm weight), so the kernel's shared-memory footprint stays the plain one's.
template <uint32_t R, bool kSmem>
__device__ __forceinline__ void fold_tail(const DecodeFold& f, uint32_t H, const float* part, int target) {
    __shared__ int s_last;
    __shared__ float npart[kNormThreads / 32];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const bool last = atomicAdd(f.counter, 1) == target - 1;
        if (last) *f.counter = 0;
        s_last = last;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    extern __shared__ float4 fold_smem[];
    const uint32_t H4 = H / 4;
    float4* vs = fold_smem;       // kSmem: v = x + Σ w·part, [H]
    float4* ws = fold_smem + H4;  // kSmem: the norm weight, [H]
    float4* x4 = reinterpret_cast<float4*>(f.x);
    const float4* p4 = reinterpret_cast<const float4*>(part);
    const float4* n4 = reinterpret_cast<const float4*>(f.norm_w);
    float wt[kFoldSlots];
#pragma unroll
    for (uint32_t s = 0; s < kFoldSlots; ++s) wt[s] = s < f.K ? __ldg(f.weights + s) : 0.0f;
    constexpr uint32_t kB = kSmem ? kFoldBatch : kFoldBatch + 1;
    for (uint32_t base = threadIdx.x; base < H4; base += kB * R) {
        float4 xv[kB], wv[kSmem ? kB : 1], pv[kB][kFoldSlots];
#pragma unroll
        for (uint32_t b = 0; b < kB; ++b) {
            const uint32_t i4 = base + b * R;
            const bool in = i4 < H4;
            xv[b] = in ? __ldcg(x4 + i4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if constexpr (kSmem) wv[b] = in ? __ldg(n4 + i4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (uint32_t s = 0; s < kFoldSlots; ++s)
                pv[b][s] = (in && s < f.K) ? __ldcg(p4 + size_t(s) * H4 + i4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (uint32_t b = 0; b < kB; ++b) {
            const uint32_t i4 = base + b * R;
            if (i4 >= H4) continue;
            float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (uint32_t s = 0; s < kFoldSlots; ++s) {
                if (s >= f.K) continue;
                sum.x = __fmaf_rn(wt[s], pv[b][s].x, sum.x);
                sum.y = __fmaf_rn(wt[s], pv[b][s].y, sum.y);
                sum.z = __fmaf_rn(wt[s], pv[b][s].z, sum.z);
                sum.w = __fmaf_rn(wt[s], pv[b][s].w, sum.w);
            }
            const float4 v = make_float4(xv[b].x + sum.x, xv[b].y + sum.y, xv[b].z + sum.z, xv[b].w + sum.w);
            if constexpr (kSmem) {
                vs[i4] = v;
                ws[i4] = wv[b];
            }
            x4[i4] = v;
        }
    }
    __syncthreads();  // kSmem: vs / ws complete; else this CTA's x stores are visible to it
    const float* vf = kSmem ? reinterpret_cast<const float*>(vs) : f.x;
    const float inv = rmsnorm_inv<R>(
        [&](uint32_t q, uint32_t j) {
            const uint32_t i = threadIdx.x + R * q + kNormThreads * j;
            return i < H ? vf[i] : 0.0f;
        },
        H, f.eps, npart);
    const float2* v2 = reinterpret_cast<const float2*>(vf);
    const float2* w2 = kSmem ? reinterpret_cast<const float2*>(ws) : reinterpret_cast<const float2*>(f.norm_w);
#pragma unroll 4
    for (uint32_t i2 = threadIdx.x; i2 < H / 2; i2 += R) {
        const float2 v = v2[i2], w = w2[i2];
        *reinterpret_cast<uint32_t*>(f.xn + permuted_k(2 * i2)) = pack_bf16x2(v.x * inv * w.x, v.y * inv * w.y);
    }
}

template <bool kFp4, int NW, int kDepth, bool kShfl, bool kNorm, int kFold>
__device__ __forceinline__ void gemv_decode_body(const DecodeArgs& args) {
    constexpr uint32_t R = NW * 32, Q = kNorm ? kNormThreads / R : 1;
    __shared__ float red[NW][16];
    // The staged activation row, permuted: kNorm the normed bf16 row, MXFP4 the row as it is.
    __shared__ __align__(16) uint16_t xsm[(kNorm || kFp4) ? kNormMaxK : 8];
    __shared__ float npart[kNorm ? kNormThreads / 32 : 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t slab = blockIdx.x;
    const uint32_t K = args.w.K, N = args.w.N, n_chunks = K >> 6;

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

    Chunk ring[kDepth];
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
        const uint32_t cc = uint32_t(warp) + uint32_t(NW) * i;
        if (cc < n_chunks) load_chunk<kFp4>(ring[i], wp, sp, cc);
    }
    if (args.routed && args.route_early) read_pair();
    // kNorm: the norm weight of the elements this thread owns in rmsnorm_inv's mapping (read
    // only, so before the wait).
    float wn[Q][kNormPer];
    if constexpr (kNorm) {
#pragma unroll
        for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
            for (uint32_t j = 0; j < kNormPer; ++j) {
                const uint32_t i = threadIdx.x + R * q + kNormThreads * j;
                wn[q][j] = i < K ? __ldg(args.norm.norm_w + i) : 0.0f;
            }
    }
    if (!args.routed || args.route_ready) pdl_wait();
    pdl_launch_dependents();
    if constexpr (kNorm) normed_row<R, Q>(args.norm, K, wn, npart, xsm);

    // Activation ring: shfl = word `lane` of each chunk's 128-byte slice of the row; else the
    // two 16-byte B fragments of lanes g == 0 (zero elsewhere).
    const uint16_t* xrow = args.x + size_t(in_row) * K;
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
    if constexpr (kFp4) {
        // The whole row, once per CTA (every chunk of the slab is some warp's).
        const uint4* src = reinterpret_cast<const uint4*>(xrow);
        for (uint32_t i = threadIdx.x; i < K / 8; i += R) *reinterpret_cast<uint4*>(xsm + 8 * i) = __ldcg(src + i);
        __syncthreads();
    } else if constexpr (!kNorm) {
#pragma unroll
        for (int i = 0; i < kDepth; ++i) {
            const uint32_t cc = uint32_t(warp) + uint32_t(NW) * i;
            if (cc < n_chunks) load_x(i, cc);
        }
    }

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (uint32_t base = uint32_t(warp); base < n_chunks; base += uint32_t(NW * kDepth)) {
#pragma unroll
        for (int i = 0; i < kDepth; ++i) {
            const uint32_t c = base + uint32_t(NW) * i;
            if (c >= n_chunks) break;
            if constexpr (kFp4) {
                // words c·32 + 8t .. + 7 of the row (sub-tile j: 8t + 2j, + 1).
                const uint4* xq = reinterpret_cast<const uint4*>(xsm) + size_t(c) * 8 + 2 * t;
                const uint4 lo = xq[0], hi = xq[1];
                const uint32_t xw8[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                mxfp4_chunk_bf16(acc, ring[i], xw8);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    uint32_t a[4];
                    fragment<false>(ring[i], j, a);
                    uint32_t b0, b1;
                    if constexpr (kNorm) {
                        // words c·32 + 8t + 2j and + 1 of the row (the shfl variant's lanes).
                        const uint2 bb = *reinterpret_cast<const uint2*>(xsm + size_t(c) * 64 + 16 * t + 4 * j);
                        b0 = bb.x;
                        b1 = bb.y;
                    } else if constexpr (kShfl) {
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
            const uint32_t cn = c + uint32_t(NW * kDepth);
            if (cn < n_chunks) {
                load_chunk<kFp4>(ring[i], wp, sp, cn);
                if constexpr (!kNorm && !kFp4) load_x(i, cn);
            }
        }
    }

    // Column 0: rows g (acc[0]) and g + 8 (acc[2]) of lanes t == 0.
    if (t == 0) {
        red[warp][g] = acc[0];
        red[warp][g + 8] = acc[2];
    }
    __syncthreads();
    const float* bias = args.w.bias ? args.w.bias + size_t(expert) * args.w.bias_expert_stride : nullptr;
    if (args.epilogue == int(Epilogue::kSwiglu)) {
        if (threadIdx.x >= 8) return;
        const int r = threadIdx.x;
        float gate = red[0][r], up = red[0][r + 8];
#pragma unroll
        for (int w = 1; w < NW; ++w) {
            gate = __fadd_rn(gate, red[w][r]);
            up = __fadd_rn(up, red[w][r + 8]);
        }
        const uint32_t r_lo = slab * 16 + r;
        gate += bias ? bias[r_lo] : 0.0f;
        up += bias ? bias[r_lo + 8] : 0.0f;
        const float y = swiglu_clamped(gate, up, args.limit);
        args.out_bf16[size_t(out_row) * args.ldo + permuted_k(slab * 8 + r)] = f32_to_bf16_bits(y);
    } else {
        const int r = threadIdx.x;
        const uint32_t row = slab * 16 + r;
        if (r < 16 && row < N) {
            float s = red[0][r];
#pragma unroll
            for (int w = 1; w < NW; ++w) s = __fadd_rn(s, red[w][r]);
            const float v = s + (bias ? bias[row] : 0.0f);
            float* o = args.out_f32 + size_t(out_row) * args.ldo + row;
            if (args.epilogue == int(Epilogue::kAdd)) *o += v; else *o = v;
        }
        if constexpr (kFold != 0) fold_tail<NW * 32, kFold == 1>(args.fold, N, args.out_f32, int(gridDim.x) * n_tiles);
    }
}

template <bool kFp4, int NW, int kDepth, bool kShfl, bool kNorm>
__global__ __launch_bounds__(NW * 32) void gemv_decode_kernel(const DecodeArgs args) {
    gemv_decode_body<kFp4, NW, kDepth, kShfl, kNorm, 0>(args);
}
// The folded MXFP4 down GEMV: registers held to what the plain variants use (79 / 63: 6 / 8
// CTAs per SM), so the fold's tail costs no occupancy.
// kTail: 1 = the tail stages the row in shared memory, 2 = it uses none (DecodeFold::tail).
template <int NW, int kDepth, bool kShfl, int kTail>
__global__ __launch_bounds__(NW * 32, kShfl ? 8 : 6) void gemv_decode_fold_kernel(const DecodeArgs args) {
    gemv_decode_body<true, NW, kDepth, kShfl, false, kTail>(args);
}

using KernelFn = void (*)(const DecodeArgs);

struct Instance {
    bool fp4;
    DecodeGemv v;
    KernelFn fn;
    KernelFn normed;  // bf16 with the combine + RMSNorm prologue (the activation comes from it)
    KernelFn folded[2];  // MXFP4 down with the combine + RMSNorm tail (decode_fold.h; tail 1, 2), where compiled
};

#define GPTOSS_GEMV(FP4, NW, D, SH)                                                                 \
    Instance{FP4, DecodeGemv{NW, D, SH}, gemv_decode_kernel<FP4, NW, D, SH, false>,                 \
             FP4 ? nullptr : gemv_decode_kernel<false, NW, D, false, true>, {nullptr, nullptr}}
#define GPTOSS_GEMV_FOLD(NW, D, SH)                                                                 \
    Instance{true, DecodeGemv{NW, D, SH}, gemv_decode_kernel<true, NW, D, SH, false>, nullptr,      \
             {gemv_decode_fold_kernel<NW, D, SH, 1>, gemv_decode_fold_kernel<NW, D, SH, 2>}}
// The variants compiled in (decode_gemv_variants lists them; the tests run every one).
const Instance kInstances[] = {
    GPTOSS_GEMV(false, 4, 4, false), GPTOSS_GEMV(false, 8, 4, false), GPTOSS_GEMV(false, 16, 4, false),
    GPTOSS_GEMV(false, 8, 4, true),  GPTOSS_GEMV(false, 16, 4, true), GPTOSS_GEMV_FOLD(4, 4, false),
    GPTOSS_GEMV_FOLD(4, 4, true),    GPTOSS_GEMV(true, 4, 6, true),   GPTOSS_GEMV(true, 4, 8, true),
    GPTOSS_GEMV(true, 8, 4, true),   GPTOSS_GEMV(true, 8, 4, false),
};
#undef GPTOSS_GEMV
#undef GPTOSS_GEMV_FOLD

const Instance* find_instance(bool fp4, const DecodeGemv& v) {
    for (const Instance& in : kInstances)
        if (in.fp4 == fp4 && in.v.warps == v.warps && in.v.depth == v.depth && in.v.shfl_x == v.shfl_x) return &in;
    return nullptr;
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
    return DecodeGemv{nw, d, sh != 0};
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
    for (const Instance& in : kInstances) out.emplace_back(in.fp4, in.v);
    return out;
}

bool decode_norm_supported(uint32_t H, uint32_t K) { return H <= kNormMaxK && H % 64 == 0 && K <= kNormSlots; }

const DecodeTuning& decode_tuning() {
    static const DecodeTuning tuning = [] {
        DecodeTuning d;
        d.legacy = env_flag("GPTOSS_DECODE_LEGACY", d.legacy);
        d.bf16 = env_variant("GPTOSS_DECODE_BF16", d.bf16);
        d.fp4 = env_variant("GPTOSS_DECODE_FP4", d.fp4);
        d.route_ready = env_flag("GPTOSS_DECODE_ROUTE_READY", d.route_ready);
        d.fuse_norm = env_flag("GPTOSS_DECODE_FUSE_NORM", d.fuse_norm);
        return d;
    }();
    return tuning;
}

gptoss_status gemm_decode(const GemmWeights& w, const uint16_t* x, const GemmRoute* route, bool route_ready,
                          Epilogue epilogue, float* out_f32, uint16_t* out_bf16, uint32_t ldo, float swiglu_limit,
                          const DecodeGemv& variant, cudaStream_t stream) {
    if (w.K == 0 || w.K % 64 != 0 || w.N == 0)
        return fail(GPTOSS_ERR_INTERNAL, "gemm_decode: K=%u must be a positive multiple of 64, N=%u > 0", w.K, w.N);
    if (w.mxfp4 && w.K > kNormMaxK)
        return fail(GPTOSS_ERR_INTERNAL, "gemm_decode: MXFP4 K=%u exceeds the %u of the fp16 row in shared memory",
                    w.K, kNormMaxK);
    if (epilogue == Epilogue::kSwiglu && (w.N % 16 != 0 || !out_bf16 || !route))
        return fail(GPTOSS_ERR_INTERNAL, "gemm_decode: SwiGLU needs a route, N %% 16 == 0 (N=%u) and a bf16 output",
                    w.N);
    if (epilogue != Epilogue::kSwiglu && !out_f32) return fail(GPTOSS_ERR_INTERNAL, "gemm_decode: fp32 output missing");
    const Instance* in = find_instance(w.mxfp4, variant);
    if (!in)
        return fail(GPTOSS_ERR_INTERNAL, "gemm_decode: no %s variant with %u warps, ring depth %u, shfl %d",
                    w.mxfp4 ? "MXFP4" : "bf16", variant.warps, variant.depth, int(variant.shfl_x));
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
    const uint32_t tiles = route ? route->max_tiles : 1;
    if (tiles == 0) return GPTOSS_OK;
    if (tiles > 65535) return fail(GPTOSS_ERR_INTERNAL, "gemm_decode: %u tiles exceed the grid limit", tiles);
    const dim3 grid(ceil_div(w.N, 16), tiles);
    GPTOSS_TRY(cuda_status(launch_pdl(in->fn, grid, dim3(variant.warps * 32), 0, stream, a), "gemv_decode_kernel",
                           __FILE__, __LINE__));
    return GPTOSS_OK;
}

gptoss_status gemm_decode_normed(const GemmWeights& w, const DecodeNorm& norm, float* out_f32, uint32_t ldo,
                                 const DecodeGemv& variant, cudaStream_t stream) {
    if (w.mxfp4 || w.K == 0 || w.N == 0 || !decode_norm_supported(w.K, norm.K) || !out_f32 || !norm.x_out ||
        norm.x_out == norm.x)
        return fail(GPTOSS_ERR_INTERNAL,
                    "gemm_decode_normed: needs bf16 weights, K=%u a multiple of 64 up to %u, at most %u MoE slots "
                    "(%u), an fp32 output and x_out distinct from x",
                    w.K, kNormMaxK, kNormSlots, norm.K);
    const Instance* in = find_instance(false, DecodeGemv{variant.warps, variant.depth, false});
    if (!in)
        return fail(GPTOSS_ERR_INTERNAL, "gemm_decode_normed: no bf16 variant with %u warps, ring depth %u",
                    variant.warps, variant.depth);
    DecodeArgs a{};
    a.w = w;
    a.epilogue = int(Epilogue::kStore);
    a.out_f32 = out_f32;
    a.ldo = ldo;
    a.norm = norm;
    GPTOSS_TRY(cuda_status(launch_pdl(in->normed, dim3(ceil_div(w.N, 16)), dim3(variant.warps * 32), 0, stream, a),
                           "gemv_decode_kernel (normed)", __FILE__, __LINE__));
    return GPTOSS_OK;
}

int decode_fold_mode() {
    static const int mode = [] {
        const char* s = std::getenv("GPTOSS_DECODE_FOLD_NORM");
        const int m = (s && *s) ? std::atoi(s) : 0;
        return m == 1 || m == 2 ? m : 0;
    }();
    return mode;
}

bool decode_fold_supported(uint32_t H, uint32_t K, const DecodeGemv& variant) {
    const Instance* in = find_instance(true, variant);
    return H % 64 == 0 && H <= kNormMaxK && K <= kFoldSlots && in && in->folded[0];
}

gptoss_status gemm_decode_folded(const GemmWeights& w, const uint16_t* act, const GemmRoute& route, bool route_ready,
                                 float* part, const DecodeFold& fold, const DecodeGemv& variant, cudaStream_t stream) {
    if (!w.mxfp4 || !decode_fold_supported(w.N, fold.K, variant) || w.K == 0 || w.K % 64 != 0 || w.K > kNormMaxK ||
        !act || !part || !fold.x || !fold.weights || !fold.norm_w || !fold.xn || !fold.counter || route.in_div != 1 ||
        (fold.tail != 1 && fold.tail != 2))
        return fail(GPTOSS_ERR_INTERNAL,
                    "gemm_decode_folded: needs MXFP4 weights with N=%u a multiple of 64 up to %u, K=%u a multiple "
                    "of 64 up to %u, at most %u MoE slots (%u), a route with in_div 1, every operand, tail 1 or 2 "
                    "(%d) and an MXFP4 variant with the fold (%u warps, ring depth %u, shfl %d)",
                    w.N, kNormMaxK, w.K, kNormMaxK, kFoldSlots, fold.K, fold.tail, variant.warps, variant.depth,
                    int(variant.shfl_x));
    const Instance* in = find_instance(true, variant);
    DecodeArgs a{};
    a.w = w;
    a.x = act;
    a.routed = 1;
    a.route_ready = route_ready;
    a.route_early = route_early();
    a.route = route;
    a.epilogue = int(Epilogue::kStore);
    a.out_f32 = part;
    a.ldo = w.N;
    a.fold = fold;
    if (route.max_tiles == 0) return GPTOSS_OK;
    if (route.max_tiles > 65535)
        return fail(GPTOSS_ERR_INTERNAL, "gemm_decode_folded: %u tiles exceed the grid limit", route.max_tiles);
    const dim3 grid(ceil_div(w.N, 16), route.max_tiles);
    const size_t smem = fold.tail == 1 ? size_t(w.N) * 2 * sizeof(float) : 0;
    GPTOSS_TRY(cuda_status(launch_pdl(in->folded[fold.tail - 1], grid, dim3(variant.warps * 32), smem, stream, a),
                           "gemv_decode_kernel (folded)", __FILE__, __LINE__));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
