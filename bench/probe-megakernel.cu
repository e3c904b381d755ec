// bench/probe-megakernel.cu - a skeleton of the persistent decode kernel that bench/NOTES.md v30 plans
// for issue 12, timed against the same work as today's seven PDL-chained launches per layer. It
// answers one question before anyone writes the real kernel: with the 20b's real byte counts and
// dependency chain, how many µs per layer does a grid of one CTA per SM with flags between phases
// take, against the same phases as separate launches (and against v25's 53.5 µs of the real graph)?
//
// Per layer (24 layers, each with its own weights, so nothing is served from L2): QKV (bf16 5 120 x
// 2 880), attention at depth 0 (one key: q.k, a sink, p.v per head), O + residual (bf16 2 880 x
// 4 096), RMSNorm + router (bf16 32 x 2 880) + top-4, gate_up (4 of 32 experts' MXFP4 rows, 5 760 x
// 2 880 each) and down (2 880 x 2 880 each), the weighted combine + RMSNorm. The GEMVs do the real
// bf16 arithmetic; the MXFP4 ones emulate the dequantization (~9 integer instructions per 32-bit
// word, then bf16x2 FMAs), about the instruction count of cuda/gemm_decode.cu's MXFP4 path. Values
// are random and the results unchecked: this is a timing skeleton, not a kernel.
//
// "persistent": one cooperative launch per step, one CTA of PK_THREADS threads per SM (512 by
// default; every GEMV thread keeps a register ring of KJ 16-byte loads, 8). Every CTA owns fixed row
// ranges of every weight (and the expert-slot rows of gate_up / down); phases wait on release /
// acquire counters (QKV done -> attention -> O done -> 32 router logits -> each expert's gate_up
// rows -> down done -> the next layer's combine). Each CTA computes the combine and the RMSNorm for
// itself (all 2 880 rows, double-buffered residual), so no phase waits on a one-CTA tail. Before
// each wait a CTA fills its register ring with the first bytes of the weights it will stream next
// when they are known (QKV, O, the router row, down), as PDL lets today's kernels do.
// "persistent, no prefetch": the same with the rings filled after the waits. "persistent, no waits":
// the waits skipped (wrong values, same bytes): the streaming bound of this structure.
// "launches": the same phase code as 7 kernels per layer, PDL-chained in a CUDA graph (NTL_MIN x SMs
// CTAs of NTL threads for the GEMVs, 6 x 128 by default; attention 64 CTAs; router and combine one
// 1 024-thread CTA each).
//
// Build and run on the GPU machine (not part of the CMake build):
//   nvcc -arch=sm_90a -O3 -std=c++17 bench/probe-megakernel.cu -o /tmp/probe-mk && /tmp/probe-mk
// (-DPK_THREADS=1024 -DKJ=4 -DNTL=256 -DNTL_MIN=4: 32 warps per SM in both forms; NOTES v36)
// Prints, per variant, the median step of 20 (ms), µs per layer and the layer's weight bytes over
// that time; then the persistent kernel's phase times per layer as CTA 0 saw them (globaltimer).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <vector>

#define CHECK_CUDA(call)                                                                              \
    do {                                                                                              \
        const cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                      \
            std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
            std::exit(1);                                                                             \
        }                                                                                             \
    } while (0)

namespace {

constexpr uint32_t kLayers = 24, kH = 2880, kQKV = 5120, kQD = 4096, kE = 32, kTop = 4, kGU = 5760;
constexpr uint32_t kHeads = 64, kHd = 64;
constexpr uint32_t kCprH = kH / 8;     // uint4 per bf16 row of K = 2 880
constexpr uint32_t kCprQD = kQD / 8;   // uint4 per bf16 row of K = 4 096
constexpr uint32_t kCprFp4 = 96;       // uint4 per MXFP4 row of K = 2 880: 90 of e2m1 words, 6 of scales
constexpr uint32_t kMaxRows = 192;     // rows per CTA of any phase (gate_up at 132 CTAs: 175)
#ifndef KJ
#define KJ 8
#endif
#ifndef PK_THREADS
#define PK_THREADS 512
#endif
constexpr int kJ = KJ;                 // register ring depth per thread (uint4); -DKJ=
constexpr uint32_t kPk = PK_THREADS;   // threads of the persistent kernel's CTA; -DPK_THREADS=
constexpr size_t kQkvW = size_t(kQKV) * kCprH, kOW = size_t(kH) * kCprQD, kRW = size_t(kE) * kCprH;
constexpr size_t kGuE = size_t(kGU) * kCprFp4, kDnE = size_t(kH) * kCprFp4;  // per expert
// Counters per layer: 0 QKV done, 1 attention done, 2 O done, 3 logits done, 4..7 expert slot k's
// gate_up rows done, 8 down done.
constexpr uint32_t kCtr = 16;

struct Args {
    const uint4 *qkv_w, *o_w, *r_w, *gu_w, *dn_w;  // all layers, layer-major
    const float* norm_w;                           // [kH]
    float* x[2];                                   // residual, double-buffered (persistent) / x[0] (launches)
    float* qkv;                                    // [kQKV]
    __nv_bfloat16* attn;                           // [kQD]
    __nv_bfloat16* xn;                             // [kH] (launches)
    float* logits;                                 // [kLayers][kE]
    int* route;                                    // [kLayers][kTop] (launches)
    float* route_w;                                // [kLayers][kTop] (launches)
    float* gu_out;                                 // [kTop][kGU]
    float* part;                                   // [kTop][kH]
    unsigned* ctr;                                 // [kLayers][kCtr]
    unsigned gu_target[kTop];                      // CTAs whose gate_up rows touch expert slot k
    unsigned long long* stamps;                    // [kLayers][8]
    int prefetch, waits;
};

__device__ __forceinline__ uint4 ld_nc(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void arrive(unsigned* p) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
    }
}
__device__ __forceinline__ void wait_ge(const unsigned* p, unsigned target, bool on) {
    if (on && threadIdx.x == 0)
        while (ld_acquire(p) < target) {
        }
    __syncthreads();
}
__device__ __forceinline__ void stamp(const Args& a, uint32_t l, int i) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && a.stamps) a.stamps[l * 8 + i] = now_ns();
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ uint32_t part_begin(uint32_t c, uint32_t g, uint32_t n) {
    return uint32_t(uint64_t(c) * n / g);
}

struct __align__(16) Smem {
    __nv_bfloat16 xs[kQD];     // the activation row of the phase (xn, attn)
    __nv_bfloat16 act[kH];     // down's SwiGLU row of one expert slot
    float rowsum[kMaxRows];
    float red[32];
    int sel[kTop];
    float selw[kTop];
    float prev_w[kTop];        // the previous layer's route weights (the combine's)
};

// A phase's rows [r0, r1) of a weight with kCpr uint4 per row, cut into kS units per row (kCpr / kS
// uint4 each); warp w of a CTA takes units w, w + warps, ..., its lanes reading 32 consecutive uint4
// per step. Step k of a warp is (unit k / kSteps, lanes' chunk (k % kSteps) * 32 + lane).
template <uint32_t kCpr, uint32_t kS>
struct Units {
    static constexpr uint32_t kLen = kCpr / kS, kSteps = (kLen + 31) / 32;
    uint32_t r0, nunits, warp, nw, lane;
    __device__ Units(uint32_t r0_, uint32_t r1_, uint32_t tid, uint32_t nt)
        : r0(r0_), nunits((r1_ - r0_) * kS), warp(tid >> 5), nw(nt >> 5), lane(tid & 31) {}
    __device__ uint32_t steps() const { return warp < nunits ? (nunits - warp + nw - 1) / nw * kSteps : 0; }
    // The row (relative to r0) and the chunk within it of step k; false for a lane past the unit's end.
    __device__ bool at(uint32_t k, uint32_t& row, uint32_t& c) const {
        const uint32_t t = warp + (k / kSteps) * nw, off = (k % kSteps) * 32 + lane;
        row = t / kS;
        c = (t % kS) * kLen + off;
        return off < kLen;
    }
};

// One thread's register ring: slot k % kJ holds the thread's step k of a Units walk.
struct Ring {
    uint4 v[kJ];
    template <uint32_t kCpr, uint32_t kS>
    __device__ void fill(const uint4* w, const Units<kCpr, kS>& u) {
        const uint32_t n = u.steps();
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
            uint32_t row, c;
            v[j] = uint32_t(j) < n && u.at(j, row, c) ? ld_nc(w + size_t(u.r0 + row) * kCpr + c) : make_uint4(0, 0, 0, 0);
        }
    }
};

__device__ __forceinline__ float dot_bf16(uint4 w, const __nv_bfloat16* x) {
    const uint4 xv = *reinterpret_cast<const uint4*>(x);
    const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
    const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 a = __bfloat1622float2(wp[i]), b = __bfloat1622float2(xp[i]);
        s = fmaf(a.x, b.x, s);
        s = fmaf(a.y, b.y, s);
    }
    return s;
}

// ~9 integer instructions per word to 4 bf16x2, then 4 bf16x2 FMAs against 8 activations.
__device__ __forceinline__ float dot_fp4(uint4 w, const __nv_bfloat16* x, uint32_t c) {
    if (c >= 90) return __uint_as_float(((w.x ^ w.y ^ w.z ^ w.w) & 0x007FFFFFu) | 0x30000000u);  // scales
    __nv_bfloat162 acc0 = __float2bfloat162_rn(0.f), acc1 = acc0;
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t q = ws[i];
        const uint32_t t0 = ((q << 6) & 0x01C001C0u) | 0x3F003F00u;
        const uint32_t t1 = ((q << 2) & 0x01C001C0u) | 0x3F003F00u;
        const uint32_t t2 = ((q >> 2) & 0x01C001C0u) | 0x3F003F00u;
        const uint32_t t3 = (((q >> 6) & 0x01C001C0u) | 0x3F003F00u) ^ (q & 0x80008000u);
        const uint4 xv = *reinterpret_cast<const uint4*>(x + (i * 90 + c) * 8);  // lanes: consecutive 16 B
        const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
        acc0 = __hfma2(*reinterpret_cast<const __nv_bfloat162*>(&t0), xp[0], acc0);
        acc1 = __hfma2(*reinterpret_cast<const __nv_bfloat162*>(&t1), xp[1], acc1);
        acc0 = __hfma2(*reinterpret_cast<const __nv_bfloat162*>(&t2), xp[2], acc0);
        acc1 = __hfma2(*reinterpret_cast<const __nv_bfloat162*>(&t3), xp[3], acc1);
    }
    const float2 a = __bfloat1622float2(__hadd2(acc0, acc1));
    return a.x + a.y;
}

// Streams a Units walk of W through the ring (filled with its first steps by Ring::fill), each
// unit's dot product with x reduced over the warp and added into s.rowsum[row] (shared atomics: the
// order, and so the bits, may vary; this is a timing skeleton).
template <bool kFp4, uint32_t kCpr, uint32_t kS>
__device__ void ring_run(Ring& R, const uint4* w, const Units<kCpr, kS>& u, const __nv_bfloat16* x, Smem& s) {
    const uint32_t kmax = u.steps();
    float acc = 0.f;
    for (uint32_t k0 = 0; k0 < kmax; k0 += kJ) {
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
            const uint32_t k = k0 + j;
            if (k < kmax) {
                const uint4 v = R.v[j];
                uint32_t row, c;
                if (k + kJ < kmax && u.at(k + kJ, row, c)) R.v[j] = ld_nc(w + size_t(u.r0 + row) * kCpr + c);
                if (u.at(k, row, c)) acc += kFp4 ? dot_fp4(v, x, c) : dot_bf16(v, x + c * 8);
                if (k % Units<kCpr, kS>::kSteps == Units<kCpr, kS>::kSteps - 1) {
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
                    if (u.lane == 0) atomicAdd(&s.rowsum[row], acc);
                    acc = 0.f;
                }
            }
        }
    }
}

using UQ = Units<kCprH, 2>;    // QKV: half rows of 180 uint4
using UO = Units<kCprQD, 8>;   // O: eighth rows of 64 uint4
using UF = Units<kCprFp4, 1>;  // MXFP4 rows of 96 uint4

__device__ void zero_rowsum(Smem& s, uint32_t tid, uint32_t nt) {
    for (uint32_t i = tid; i < kMaxRows; i += nt) s.rowsum[i] = 0.f;
}

__device__ float block_sum(float v, Smem& s, uint32_t tid, uint32_t nt) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((tid & 31) == 0) s.red[tid >> 5] = v;
    __syncthreads();
    float t = 0.f;
    for (uint32_t i = 0; i < nt / 32; ++i) t += s.red[i];
    __syncthreads();
    return t;
}

// x_out = x_in + sum_k w_k part[k] over all rows (rows of [o0, o1) stored), xn = RMSNorm(x_out) into
// s.xs (and into a.xn when `store_xn`).
__device__ void combine_norm(const Args& a, const float* x_in, float* x_out, uint32_t o0, uint32_t o1,
                             const float* w, Smem& s, uint32_t tid, uint32_t nt, bool store_xn) {
    float v[6];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 6; ++i) {
        const uint32_t r = tid + i * nt;
        if (r < kH) {
            float t = x_in[r];
#pragma unroll
            for (uint32_t k = 0; k < kTop; ++k) t = fmaf(w[k], a.part[k * kH + r], t);
            v[i] = t;
            ss = fmaf(t, t, ss);
        }
    }
    const float inv = rsqrtf(block_sum(ss, s, tid, nt) / kH + 1e-5f);
#pragma unroll
    for (int i = 0; i < 6; ++i) {
        const uint32_t r = tid + i * nt;
        if (r < kH) {
            if (r >= o0 && r < o1) x_out[r] = v[i];
            const __nv_bfloat16 q = __float2bfloat16(v[i] * inv * a.norm_w[r]);
            s.xs[r] = q;
            if (store_xn) a.xn[r] = q;
        }
    }
    __syncthreads();
}

// Attention at depth 0 for head h: one key, a sink; q, k, v from qkv (threads 0..63).
__device__ void attention_head(const Args& a, uint32_t h, Smem& s, uint32_t tid) {
    const uint32_t g = h / 8;
    float q = 0.f, k = 0.f, v = 0.f;
    if (tid < kHd) {
        q = a.qkv[h * kHd + tid];
        k = a.qkv[kQD + g * kHd + tid];
        v = a.qkv[kQD + 512 + g * kHd + tid];
    }
    float d = q * k;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (tid < kHd && (tid & 31) == 0) s.red[tid >> 5] = d;
    __syncthreads();
    const float sc = (s.red[0] + s.red[1]) * 0.125f;
    const float p = 1.f / (1.f + __expf(0.5f - sc));
    if (tid < kHd) a.attn[h * kHd + tid] = __float2bfloat16(p * v);
}

// Top-4 of 32 logits and their softmax weights, by thread 0, into s.sel / s.selw.
__device__ void top4(const float* logits, Smem& s, uint32_t tid) {
    if (tid == 0) {
        float l[kE];
        for (uint32_t e = 0; e < kE; ++e) l[e] = logits[e] == logits[e] ? logits[e] : -1e29f - float(e);  // NaN: distinct, last
        float mx = -1e30f, sum = 0.f, sv[kTop];
        for (uint32_t k = 0; k < kTop; ++k) {
            uint32_t best = 0;
            for (uint32_t e = 1; e < kE; ++e)
                if (l[e] > l[best]) best = e;
            s.sel[k] = int(best);
            sv[k] = l[best];
            l[best] = -3e38f;
            mx = fmaxf(mx, sv[k]);
        }
        for (uint32_t k = 0; k < kTop; ++k) sum += (sv[k] = __expf(sv[k] - mx));
        for (uint32_t k = 0; k < kTop; ++k) s.selw[k] = sv[k] / sum;
    }
    __syncthreads();
}

// The rows [g0, g1) of the flattened (expert slot, row) space of n rows per slot, as at most two
// (slot, first row, last row) segments.
struct Seg {
    uint32_t k, r0, r1;
};
__device__ uint32_t segments(uint32_t g0, uint32_t g1, uint32_t n, Seg* out) {
    uint32_t m = 0;
    while (g0 < g1) {
        const uint32_t k = g0 / n, end = min(g1, (k + 1) * n);
        out[m++] = {k, g0 - k * n, end - k * n};
        g0 = end;
    }
    return m;
}

__device__ void load_act(const Args& a, uint32_t k, Smem& s, uint32_t tid, uint32_t nt) {
    for (uint32_t i = tid; i < kH; i += nt) {
        const float g = a.gu_out[k * kGU + 2 * i], u = a.gu_out[k * kGU + 2 * i + 1];
        s.act[i] = __float2bfloat16(g / (1.f + __expf(-g)) * (u + 1.f));
    }
    __syncthreads();
}

__device__ __forceinline__ const uint4* expert_ptr(const uint4* base, uint32_t l, int e, size_t per) {
    return base + (size_t(l) * kE + uint32_t(e)) * per;
}

// ---- the persistent kernel --------------------------------------------------------------------

__global__ __launch_bounds__(kPk, 1) void persistent_kernel(Args a) {
    __shared__ Smem s;
    const uint32_t tid = threadIdx.x, nt = blockDim.x, c = blockIdx.x, G = gridDim.x;
    const bool W = a.waits != 0, P = a.prefetch != 0;
    const uint32_t x0 = part_begin(c, G, kH), x1 = part_begin(c + 1, G, kH);  // residual / O rows
    const uint32_t q0 = part_begin(c, G, kQKV), q1 = part_begin(c + 1, G, kQKV);
    const uint32_t u0 = part_begin(c, G, kTop * kGU), u1 = part_begin(c + 1, G, kTop * kGU);
    const uint32_t d0 = part_begin(c, G, kTop * kH), d1 = part_begin(c + 1, G, kTop * kH);
    Ring R;
    if (tid < kTop) s.prev_w[tid] = 0.f;
    zero_rowsum(s, tid, nt);
    __syncthreads();
    for (uint32_t l = 0; l <= kLayers; ++l) {
        unsigned* ctr = a.ctr + l * kCtr;
        const uint4* qkv_w = a.qkv_w + size_t(l) * kQkvW;
        // Combine the previous layer's experts and norm (every CTA, all rows); the QKV ring first.
        const UQ uq(q0, q1, tid, nt);
        if (P && l < kLayers) R.fill(qkv_w, uq);
        if (l > 0) wait_ge(ctr - kCtr + 8, G, W);
        if (l < kLayers) stamp(a, l, 0);
        combine_norm(a, a.x[l & 1], a.x[(l + 1) & 1], x0, x1, s.prev_w, s, tid, nt, false);
        if (l == kLayers) break;
        // QKV.
        if (!P) R.fill(qkv_w, uq);
        ring_run<false>(R, qkv_w, uq, s.xs, s);
        __syncthreads();
        for (uint32_t r = q0 + tid; r < q1; r += nt) a.qkv[r] = s.rowsum[r - q0];
        zero_rowsum(s, tid, nt);
        arrive(ctr + 0);
        stamp(a, l, 1);
        // Attention (CTAs 0..63), the O ring filled first.
        const uint4* o_w = a.o_w + size_t(l) * kOW;
        const UO uo(x0, x1, tid, nt);
        if (P) R.fill(o_w, uo);
        if (c < kHeads) {
            wait_ge(ctr + 0, G, W);
            attention_head(a, c, s, tid);
            arrive(ctr + 1);
        }
        // O + residual (own rows of x[(l + 1) & 1], written by this CTA's combine).
        wait_ge(ctr + 1, kHeads, W);
        stamp(a, l, 2);
        for (uint32_t i = tid; i < kQD / 8; i += nt)
            reinterpret_cast<uint4*>(s.xs)[i] = reinterpret_cast<const uint4*>(a.attn)[i];
        __syncthreads();
        if (!P) R.fill(o_w, uo);
        ring_run<false>(R, o_w, uo, s.xs, s);
        __syncthreads();
        float* xo = a.x[(l + 1) & 1];
        for (uint32_t r = x0 + tid; r < x1; r += nt) xo[r] += s.rowsum[r - x0];
        zero_rowsum(s, tid, nt);
        arrive(ctr + 2);
        // RMSNorm (every CTA: gate_up's input) + router logit c (CTAs 0..31), then top-4 everywhere.
        const uint4* r_w = a.r_w + size_t(l) * kRW;
        uint4 rv = make_uint4(0, 0, 0, 0);
        if (c < kE && tid < kCprH) rv = ld_nc(r_w + c * kCprH + tid);
        wait_ge(ctr + 2, G, W);
        stamp(a, l, 3);
        {
            float ss = 0.f;
            float v[6];
#pragma unroll
            for (int i = 0; i < 6; ++i) {
                const uint32_t r = tid + i * nt;
                v[i] = r < kH ? xo[r] : 0.f;
                ss = fmaf(v[i], v[i], ss);
            }
            const float inv = rsqrtf(block_sum(ss, s, tid, nt) / kH + 1e-5f);
#pragma unroll
            for (int i = 0; i < 6; ++i) {
                const uint32_t r = tid + i * nt;
                if (r < kH) s.xs[r] = __float2bfloat16(v[i] * inv * a.norm_w[r]);
            }
            __syncthreads();
        }
        if (c < kE) {
            const float d = block_sum(tid < kCprH ? dot_bf16(rv, s.xs + tid * 8) : 0.f, s, tid, nt);
            if (tid == 0) a.logits[l * kE + c] = d;
            arrive(ctr + 3);
        }
        wait_ge(ctr + 3, kE, W);
        stamp(a, l, 4);
        top4(a.logits + l * kE, s, tid);
        // gate_up over this CTA's rows of the 4 x 5 760 (slot, row) space.
        Seg seg[2];
        uint32_t m = segments(u0, u1, kGU, seg);
        for (uint32_t i = 0; i < m; ++i) {
            const uint4* w = expert_ptr(a.gu_w, l, s.sel[seg[i].k], kGuE);
            const UF uf(seg[i].r0, seg[i].r1, tid, nt);
            R.fill(w, uf);
            ring_run<true>(R, w, uf, s.xs, s);
            __syncthreads();
            for (uint32_t r = seg[i].r0 + tid; r < seg[i].r1; r += nt)
                a.gu_out[seg[i].k * kGU + r] = s.rowsum[r - seg[i].r0];
            zero_rowsum(s, tid, nt);
            arrive(ctr + 4 + seg[i].k);
        }
        stamp(a, l, 5);
        // down over this CTA's rows of the 4 x 2 880 space, each segment after its slot's gate_up.
        m = segments(d0, d1, kH, seg);
        for (uint32_t i = 0; i < m; ++i) {
            const uint4* w = expert_ptr(a.dn_w, l, s.sel[seg[i].k], kDnE);
            const UF uf(seg[i].r0, seg[i].r1, tid, nt);
            if (P) R.fill(w, uf);
            wait_ge(ctr + 4 + seg[i].k, a.gu_target[seg[i].k], W);
            load_act(a, seg[i].k, s, tid, nt);
            if (!P) R.fill(w, uf);
            ring_run<true>(R, w, uf, s.act, s);
            __syncthreads();
            for (uint32_t r = seg[i].r0 + tid; r < seg[i].r1; r += nt)
                a.part[seg[i].k * kH + r] = s.rowsum[r - seg[i].r0];
            zero_rowsum(s, tid, nt);
        }
        if (tid < kTop) s.prev_w[tid] = s.selw[tid];
        arrive(ctr + 8);
        stamp(a, l, 6);
    }
}

// ---- the same phases as launches ----------------------------------------------------------------

#ifndef NTL
#define NTL 128
#endif
#ifndef NTL_MIN
#define NTL_MIN 6
#endif
constexpr uint32_t kNtL = NTL;  // threads per CTA of the launches' GEMV kernels; -DNTL=, -DNTL_MIN= CTAs per SM

// QKV (kO false: xn in, qkv stored) or O (kO true: attn in, added into the residual x[0]).
template <bool kO>
__global__ __launch_bounds__(kNtL, NTL_MIN) void dense_kernel(Args a, uint32_t l) {
    using U = std::conditional_t<kO, UO, UQ>;
    constexpr uint32_t kRows = kO ? kH : kQKV, kIn = kO ? kQD : kH;
    __shared__ Smem s;
    const uint32_t tid = threadIdx.x, c = blockIdx.x, G = gridDim.x;
    const uint32_t r0 = part_begin(c, G, kRows), r1 = part_begin(c + 1, G, kRows);
    const uint4* w = kO ? a.o_w + size_t(l) * kOW : a.qkv_w + size_t(l) * kQkvW;
    const uint4* in = reinterpret_cast<const uint4*>(kO ? a.attn : a.xn);
    zero_rowsum(s, tid, kNtL);
    Ring R;
    const U u(r0, r1, tid, kNtL);
    R.fill(w, u);
    pdl_trigger();
    pdl_wait();
    for (uint32_t i = tid; i < kIn / 8; i += kNtL) reinterpret_cast<uint4*>(s.xs)[i] = in[i];
    __syncthreads();
    ring_run<false>(R, w, u, s.xs, s);
    __syncthreads();
    for (uint32_t r = r0 + tid; r < r1; r += kNtL) {
        if constexpr (kO) a.x[0][r] += s.rowsum[r - r0];
        else a.qkv[r] = s.rowsum[r - r0];
    }
}

__global__ __launch_bounds__(kNtL) void attn_kernel(Args a) {
    __shared__ Smem s;
    pdl_trigger();
    pdl_wait();
    attention_head(a, blockIdx.x, s, threadIdx.x);
}

// RMSNorm + 32 logits (one warp each) + top-4, one CTA of 1 024 threads.
__global__ __launch_bounds__(1024) void router_kernel(Args a, uint32_t l) {
    __shared__ Smem s;
    const uint32_t tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint4* rw = a.r_w + size_t(l) * kRW + size_t(warp) * kCprH;
    uint4 w[12];
#pragma unroll
    for (int i = 0; i < 12; ++i) {
        const uint32_t ch = lane + 32 * i;
        w[i] = ch < kCprH ? ld_nc(rw + ch) : make_uint4(0, 0, 0, 0);
    }
    pdl_trigger();
    pdl_wait();
    float v[3], ss = 0.f;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        const uint32_t r = tid + i * 1024;
        v[i] = r < kH ? a.x[0][r] : 0.f;
        ss = fmaf(v[i], v[i], ss);
    }
    const float inv = rsqrtf(block_sum(ss, s, tid, 1024) / kH + 1e-5f);
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        const uint32_t r = tid + i * 1024;
        if (r < kH) a.xn[r] = s.xs[r] = __float2bfloat16(v[i] * inv * a.norm_w[r]);
    }
    __syncthreads();
    float d = 0.f;
#pragma unroll
    for (int i = 0; i < 12; ++i) {
        const uint32_t ch = lane + 32 * i;
        if (ch < kCprH) d += dot_bf16(w[i], s.xs + ch * 8);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (lane == 0) a.logits[l * kE + warp] = d;
    __syncthreads();
    top4(a.logits + l * kE, s, tid);
    if (tid < kTop) {
        a.route[l * kTop + tid] = s.sel[tid];
        a.route_w[l * kTop + tid] = s.selw[tid];
    }
}

__global__ __launch_bounds__(kNtL, NTL_MIN) void gu_kernel(Args a, uint32_t l) {
    __shared__ Smem s;
    const uint32_t tid = threadIdx.x, c = blockIdx.x, G = gridDim.x;
    zero_rowsum(s, tid, kNtL);
    pdl_wait();
    pdl_trigger();  // after the wait: down reads the route before its own wait
    for (uint32_t i = tid; i < kH / 8; i += kNtL)
        reinterpret_cast<uint4*>(s.xs)[i] = reinterpret_cast<const uint4*>(a.xn)[i];
    Seg seg[2];
    const uint32_t m = segments(part_begin(c, G, kTop * kGU), part_begin(c + 1, G, kTop * kGU), kGU, seg);
    __syncthreads();
    Ring R;
    for (uint32_t i = 0; i < m; ++i) {
        const uint4* w = expert_ptr(a.gu_w, l, a.route[l * kTop + seg[i].k], kGuE);
        const UF uf(seg[i].r0, seg[i].r1, tid, kNtL);
        R.fill(w, uf);
        ring_run<true>(R, w, uf, s.xs, s);
        __syncthreads();
        for (uint32_t r = seg[i].r0 + tid; r < seg[i].r1; r += kNtL) a.gu_out[seg[i].k * kGU + r] = s.rowsum[r - seg[i].r0];
        zero_rowsum(s, tid, kNtL);
        __syncthreads();
    }
}

__global__ __launch_bounds__(kNtL, NTL_MIN) void dn_kernel(Args a, uint32_t l) {
    __shared__ Smem s;
    const uint32_t tid = threadIdx.x, c = blockIdx.x, G = gridDim.x;
    zero_rowsum(s, tid, kNtL);
    Seg seg[2];
    const uint32_t m = segments(part_begin(c, G, kTop * kH), part_begin(c + 1, G, kTop * kH), kH, seg);
    Ring R;
    const uint4* w0 = m ? expert_ptr(a.dn_w, l, a.route[l * kTop + seg[0].k], kDnE) : nullptr;
    if (m) R.fill(w0, UF(seg[0].r0, seg[0].r1, tid, kNtL));
    pdl_trigger();
    pdl_wait();
    for (uint32_t i = 0; i < m; ++i) {
        const uint4* w = expert_ptr(a.dn_w, l, a.route[l * kTop + seg[i].k], kDnE);
        const UF uf(seg[i].r0, seg[i].r1, tid, kNtL);
        if (i > 0) R.fill(w, uf);
        load_act(a, seg[i].k, s, tid, kNtL);
        ring_run<true>(R, w, uf, s.act, s);
        __syncthreads();
        for (uint32_t r = seg[i].r0 + tid; r < seg[i].r1; r += kNtL) a.part[seg[i].k * kH + r] = s.rowsum[r - seg[i].r0];
        zero_rowsum(s, tid, kNtL);
        __syncthreads();
    }
}

__global__ __launch_bounds__(1024) void combine_kernel(Args a, int l) {
    __shared__ Smem s;
    pdl_trigger();
    pdl_wait();
    float w[kTop];
    for (uint32_t k = 0; k < kTop; ++k) w[k] = l >= 0 ? a.route_w[l * kTop + k] : 0.f;
    combine_norm(a, a.x[0], a.x[0], 0, kH, w, s, threadIdx.x, 1024, true);
}

// ---- host ----------------------------------------------------------------------------------------

__global__ void fill_kernel(uint4* p, size_t n, uint32_t seed, bool bf16) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        uint32_t h[4];
        for (int j = 0; j < 4; ++j) {
            uint32_t v = uint32_t(i * 4 + j) * 0x9E3779B1u ^ seed;
            v ^= v >> 15; v *= 0x2C1B3C6Du; v ^= v >> 12; v *= 0x297A2D39u; v ^= v >> 15;
            h[j] = bf16 ? (v & 0x807F807Fu) | 0x3C003C00u : v;
        }
        p[i] = make_uint4(h[0], h[1], h[2], h[3]);
    }
}

template <typename T>
T* dalloc(size_t n) {
    T* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
    CHECK_CUDA(cudaMemset(p, 0, n * sizeof(T)));
    return p;
}

template <typename K, typename... Ts>
void launch(K kernel, uint32_t grid, uint32_t block, cudaStream_t st, bool pdl, Ts... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CHECK_CUDA(cudaLaunchKernelEx(&cfg, kernel, args...));
}

template <typename F>
float median_ms(F&& step, cudaStream_t st, int reps = 20) {
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    step();
    step();
    CHECK_CUDA(cudaStreamSynchronize(st));
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
        CHECK_CUDA(cudaEventRecord(e0, st));
        step();
        CHECK_CUDA(cudaEventRecord(e1, st));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace

int main() {
    int dev = 0, sms = 0;
    CHECK_CUDA(cudaSetDevice(dev));
    CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const uint32_t G = uint32_t(sms);
    int per_sm = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, kPk, 0));
    cudaFuncAttributes fa{};
    CHECK_CUDA(cudaFuncGetAttributes(&fa, persistent_kernel));
    std::printf("SMs %d, ring depth %d, persistent kernel: %d CTA(s) of %u per SM, %d registers, %zu B static shared, %zu B local\n",
                sms, kJ, per_sm, kPk, fa.numRegs, fa.sharedSizeBytes, fa.localSizeBytes);
    if (per_sm < 1) return 1;
    for (auto k : {(const void*)dense_kernel<false>, (const void*)dense_kernel<true>, (const void*)gu_kernel, (const void*)dn_kernel}) {
        CHECK_CUDA(cudaFuncGetAttributes(&fa, k));
        std::printf("  launch kernel: %d registers, %zu B local\n", fa.numRegs, fa.localSizeBytes);
    }

    Args a{};
    uint4* qkv_w = dalloc<uint4>(kQkvW * kLayers);
    uint4* o_w = dalloc<uint4>(kOW * kLayers);
    uint4* r_w = dalloc<uint4>(kRW * kLayers);
    uint4* gu_w = dalloc<uint4>(kGuE * kE * kLayers);
    uint4* dn_w = dalloc<uint4>(kDnE * kE * kLayers);
    fill_kernel<<<4096, 256>>>(qkv_w, kQkvW * kLayers, 1, true);
    fill_kernel<<<4096, 256>>>(o_w, kOW * kLayers, 2, true);
    fill_kernel<<<4096, 256>>>(r_w, kRW * kLayers, 3, true);
    fill_kernel<<<4096, 256>>>(gu_w, kGuE * kE * kLayers, 4, false);
    fill_kernel<<<4096, 256>>>(dn_w, kDnE * kE * kLayers, 5, false);
    a.qkv_w = qkv_w; a.o_w = o_w; a.r_w = r_w; a.gu_w = gu_w; a.dn_w = dn_w;
    float* norm = dalloc<float>(kH);
    std::vector<float> ones(kH, 1.f), x0(kH);
    for (uint32_t i = 0; i < kH; ++i) x0[i] = 0.5f + float(i % 7) * 0.1f;
    CHECK_CUDA(cudaMemcpy(norm, ones.data(), kH * 4, cudaMemcpyHostToDevice));
    a.norm_w = norm;
    a.x[0] = dalloc<float>(kH);
    a.x[1] = dalloc<float>(kH);
    a.qkv = dalloc<float>(kQKV);
    a.attn = dalloc<__nv_bfloat16>(kQD);
    a.xn = dalloc<__nv_bfloat16>(kH);
    a.logits = dalloc<float>(kLayers * kE);
    a.route = dalloc<int>(kLayers * kTop);
    a.route_w = dalloc<float>(kLayers * kTop);
    a.gu_out = dalloc<float>(kTop * kGU);
    a.part = dalloc<float>(kTop * kH);
    a.ctr = dalloc<unsigned>((kLayers + 1) * kCtr);
    unsigned long long* stamps = dalloc<unsigned long long>(kLayers * 8);
    for (uint32_t k = 0; k < kTop; ++k) {
        unsigned n = 0;
        for (uint32_t c = 0; c < G; ++c) {
            const uint32_t b = uint32_t(uint64_t(c) * kTop * kGU / G), e = uint32_t(uint64_t(c + 1) * kTop * kGU / G);
            if (b < (k + 1) * kGU && e > k * kGU) ++n;
        }
        a.gu_target[k] = n;
    }
    CHECK_CUDA(cudaDeviceSynchronize());

    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t ctr_bytes = (kLayers + 1) * kCtr * sizeof(unsigned);
    auto reset_x = [&]() {
        CHECK_CUDA(cudaMemcpyAsync(a.x[0], x0.data(), kH * 4, cudaMemcpyHostToDevice, st));
        CHECK_CUDA(cudaMemsetAsync(a.part, 0, kTop * kH * 4, st));
    };
    auto persistent = [&](int prefetch, int waits, unsigned long long* sp) {
        Args b = a;
        b.prefetch = prefetch;
        b.waits = waits;
        b.stamps = sp;
        return [b, &st, ctr_bytes, G]() mutable {
            CHECK_CUDA(cudaMemsetAsync(b.ctr, 0, ctr_bytes, st));
            void* args[] = {&b};
            CHECK_CUDA(cudaLaunchCooperativeKernel((const void*)persistent_kernel, dim3(G), dim3(kPk), args, 0, st));
        };
    };
    const double layer_mb = (kQkvW + kOW + kRW + kTop * (kGuE + kDnE)) * 16.0 / 1e6;
    auto report = [&](const char* name, float ms) {
        const double us = ms * 1e3 / kLayers;
        std::printf("%-44s step %.3f ms, %.2f us per layer, %.0f GB/s of the layer's %.1f MB\n", name, ms, us,
                    layer_mb * 1e-3 / (us * 1e-6), layer_mb);
    };

    // The launches' graph: 7 kernels per layer (+ the first combine), PDL-chained.
    const uint32_t GL = NTL_MIN * G;
    auto enqueue_launches = [&](bool pdl) {
        launch(combine_kernel, 1, 1024, st, false, a, -1);
        for (uint32_t l = 0; l < kLayers; ++l) {
            launch(dense_kernel<false>, GL, kNtL, st, pdl, a, l);
            launch(attn_kernel, kHeads, kNtL, st, pdl, a);
            launch(dense_kernel<true>, GL, kNtL, st, pdl, a, l);
            launch(router_kernel, 1, 1024, st, pdl, a, l);
            launch(gu_kernel, GL, kNtL, st, pdl, a, l);
            launch(dn_kernel, GL, kNtL, st, pdl, a, l);
            launch(combine_kernel, 1, 1024, st, pdl, a, int(l));
        }
    };
    cudaGraphExec_t graphs[2] = {};
    for (int pdl = 0; pdl < 2; ++pdl) {
        cudaGraph_t g;
        CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        enqueue_launches(pdl != 0);
        CHECK_CUDA(cudaStreamEndCapture(st, &g));
        CHECK_CUDA(cudaGraphInstantiate(&graphs[pdl], g, 0));
        CHECK_CUDA(cudaGraphDestroy(g));
    }

    for (int round = 0; round < 2; ++round) {
        std::printf("-- round %d\n", round + 1);
        reset_x();
        report("persistent (prefetch before waits)", median_ms(persistent(1, 1, nullptr), st));
        reset_x();
        report("persistent, no prefetch", median_ms(persistent(0, 1, nullptr), st));
        reset_x();
        report("persistent, no waits (streaming bound)", median_ms(persistent(1, 0, nullptr), st));
        reset_x();
        report("launches, PDL graph", median_ms([&]() { CHECK_CUDA(cudaGraphLaunch(graphs[1], st)); }, st));
        reset_x();
        report("launches, graph without PDL", median_ms([&]() { CHECK_CUDA(cudaGraphLaunch(graphs[0], st)); }, st));
    }
    // Phase times of the persistent kernel, as CTA 0 saw them, averaged over layers 1..23.
    reset_x();
    persistent(1, 1, stamps)();
    CHECK_CUDA(cudaStreamSynchronize(st));
    std::vector<unsigned long long> sv(kLayers * 8);
    CHECK_CUDA(cudaMemcpy(sv.data(), stamps, sv.size() * 8, cudaMemcpyDeviceToHost));
    const char* names[7] = {"down done seen -> combine + norm + QKV end", "-> attention done seen",
                            "-> O rows + O done seen", "-> norm + router: logits seen", "-> gate_up rows end",
                            "-> down rows end", "-> all down done seen (next layer)"};
    double acc[7] = {};
    for (uint32_t l = 1; l + 1 < kLayers; ++l) {
        const unsigned long long* t = &sv[l * 8];
        acc[0] += double(t[1] - t[0]);
        acc[1] += double(t[2] - t[1]);
        acc[2] += double(t[3] - t[2]);
        acc[3] += double(t[4] - t[3]);
        acc[4] += double(t[5] - t[4]);
        acc[5] += double(t[6] - t[5]);
        acc[6] += double(sv[(l + 1) * 8] - t[6]);
    }
    std::printf("persistent phases, CTA 0, us per layer (mean of layers 1..%u):\n", kLayers - 2);
    for (int i = 0; i < 7; ++i) std::printf("  %-44s %.2f\n", names[i], acc[i] / (kLayers - 2) / 1e3);
    CHECK_CUDA(cudaGetLastError());
    return 0;
}
