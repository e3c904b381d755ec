// cuda/gemm.cuh - the device-side pieces of gemm.cu's tensor-core kernel that other kernels
// reuse to get the same bits: the weight-chunk loads (16 bytes per lane from the fragment
// layout of repack.cu), MXFP4 dequantization into mma A fragments, and the mma itself. The
// fused decode router (router.cu) runs the same per-warp chunk sequence as gemm.cu, so its
// router logits are bit-identical to the gemm's (decode == prefill, any chunking).
#pragma once

#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace gptoss {
namespace cuda {
namespace gemm_detail {

// The arguments of the chunk GEMM kernels (gemm.cu, gemm_prefill.cu), as their launchers take
// them (kernels.h gemm / gemm_prefill): routed = a route was given (MoE), epilogue = Epilogue.
struct KernelArgs {
    GemmWeights w;
    const uint16_t* x;
    uint32_t n_rows;
    GemmRoute route;
    int routed;
    int epilogue;
    float* out_f32;
    uint16_t* out_bf16;
    uint32_t ldo;
    float limit;
};

inline KernelArgs kernel_args(const GemmWeights& w, const uint16_t* x, uint32_t n_rows, const GemmRoute* route,
                              Epilogue epilogue, float* out_f32, uint16_t* out_bf16, uint32_t ldo,
                              float swiglu_limit) {
    KernelArgs a{};
    a.w = w;
    a.x = x;
    a.n_rows = n_rows;
    a.routed = route != nullptr;
    if (route) a.route = *route;
    a.epilogue = int(epilogue);
    a.out_f32 = out_f32;
    a.out_bf16 = out_bf16;
    a.ldo = ldo;
    a.limit = swiglu_limit;
    return a;
}

// Non-volatile so the compiler may hoist the next chunk's loads above this chunk's mma.
__device__ __forceinline__ uint4 ld_weights(const uint4* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a);
    __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162*>(&b);
    __nv_bfloat162 r = __hmul2(x, y);
    return *reinterpret_cast<uint32_t*>(&r);
}

// Where this lane's weight chunks of fragment slab `slab` start (repack.cu's layout: 16 bytes per
// lane per 64-k chunk), for `expert` (0 when dense); MXFP4 also its scale words (8 bytes per
// lane group g = lane / 4 per chunk), else *sp = nullptr.
template <bool kFp4>
__device__ __forceinline__ void slab_pointers(const GemmWeights& w, int expert, uint32_t slab, uint32_t n_chunks,
                                              int lane, const uint4** wp, const uint2** sp) {
    const char* wbase = static_cast<const char*>(w.w) + size_t(expert) * w.w_expert_stride;
    if constexpr (kFp4) {
        *wp = reinterpret_cast<const uint4*>(wbase) + size_t(slab) * n_chunks * 32 + lane;
        *sp = reinterpret_cast<const uint2*>(w.scales + size_t(expert) * w.s_expert_stride) +
              size_t(slab) * n_chunks * 8 + (lane >> 2);
    } else {
        *wp = reinterpret_cast<const uint4*>(wbase) + size_t(slab) * n_chunks * 128 + lane;
        *sp = nullptr;
    }
}

// Weights of one 64-k chunk for one lane, before dequantization.
struct Chunk {
    uint4 v[4];  // bf16: 4 sub-tiles; MXFP4: v[0] = 4 nibble words, v[1].x/.y = scale words
};

template <bool kFp4>
__device__ __forceinline__ void load_chunk(Chunk& ch, const uint4* wp, const uint2* sp, uint32_t c) {
    if constexpr (kFp4) {
        ch.v[0] = ld_weights(wp + size_t(c) * 32);
        const uint2 s = __ldg(sp + size_t(c) * 8);
        ch.v[1].x = s.x;
        ch.v[1].y = s.y;
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) ch.v[j] = ld_weights(wp + size_t(c) * 128 + j * 32);
    }
}

// A fragment of sub-tile j. MXFP4: nibble p and p+4 of word j become the bf16 pair p
// (sign to bit 15, exponent+mantissa to bits 6..8: the e2m1 value times 2^-126), then one
// multiply by bf16 2^(s-1) restores the scale; pairs 0, 2 are row g, pairs 1, 3 row g+8.
template <bool kFp4>
__device__ __forceinline__ void fragment(const Chunk& ch, int j, uint32_t (&a)[4]) {
    if constexpr (kFp4) {
        const uint32_t word = j == 0 ? ch.v[0].x : j == 1 ? ch.v[0].y : j == 2 ? ch.v[0].z : ch.v[0].w;
        const uint32_t sg = (j < 2) ? (ch.v[1].x & 0xffffu) : (ch.v[1].x >> 16);
        const uint32_t s8 = (j < 2) ? (ch.v[1].y & 0xffffu) : (ch.v[1].y >> 16);
        const uint32_t scale_g = sg | (sg << 16), scale_g8 = s8 | (s8 << 16);
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            const uint32_t q = word << (12 - 4 * p);
            const uint32_t bits = (q & 0x80008000u) | ((q >> 6) & 0x01C001C0u);
            a[p] = bf16x2_mul(bits, (p & 1) ? scale_g8 : scale_g);
        }
    } else {
        const uint4 v = ch.v[j];
        a[0] = v.x; a[1] = v.y; a[2] = v.z; a[3] = v.w;
    }
}

// ---- Decode-only MXFP4 arithmetic (gemm_decode.cu, moe_decode.cu; issue 12) ----
// Decode K/V is never reused by a later call, so the T = 1 GEMVs need not match gemm.cu's bits.
// They skip the per-pair bf16 scale multiply of fragment<true>() above: the nibbles become fp16
// by bit placement alone, the mma runs fp16 × fp16 → fp32 per 32-k scale block, and the e8m0
// scale multiplies the fp32 block sum once (an FFMA per output row and block).
// - e2m1 → fp16: sign to bit 15, exponent+mantissa (3 bits) to bits 9..11. The fp16 then holds
//   the e2m1 value times 2^-14 exactly (exponent e gives 2^(e-15)·(1 + m/2); e = 0 is the fp16
//   subnormal m · 2^-15): 3 integer instructions per fp16 pair, no multiply.
// - The activation row is fp16 (bf16x2_to_f16x2: exact for |x| in [2^-14, 65504]; smaller
//   magnitudes round to fp16 subnormals, larger saturate to ±65504 instead of becoming inf).
// - Block factor: 2^(s-127) · 2^14 = 2^(s-113) as fp32, from the repacked bf16 scale 2^(s-1)
//   (repack.cu, s <= 128): fp32 bits (b << 16) - (112 << 23), an exponent of s + 14 >= 14. A row
//   beyond N has b = 0 and all-zero nibbles: its block sum is 0, its factor a finite -2^17.
// A 16 × 64 chunk takes 4 mma, 4 FFMA and 16 fp16 pairs of shifts and masks: ncu counted 117
// warp instructions per chunk for gemm_decode's gate_up against 137 with fragment<true>
// (bench/NOTES.md "v16 final" and "v17 decode").

// bf16 pair → fp16 pair (round to nearest, saturating to ±65504).
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t w) {
    const float lo = __uint_as_float(w << 16), hi = __uint_as_float(w & 0xffff0000u);
    uint32_t r;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// d = A·B + c (m16n8k16, fp16 inputs, fp32 accumulation).
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                        const float (&c)[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
}

// The fp16 A fragment of one sub-tile's nibble word (pair p = nibbles p and p + 4, as in
// fragment<true>): values e2m1 · 2^-14.
__device__ __forceinline__ void fragment_e2m1_f16(uint32_t word, uint32_t (&a)[4]) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const uint32_t q = word << (12 - 4 * p);
        a[p] = (q & 0x80008000u) | ((q >> 3) & 0x0E000E00u);
    }
}

// The fp32 factor 2^(s-113) of the repacked bf16 scale 2^(s-1) in the low (hi = false) or high
// half of a scale word.
__device__ __forceinline__ float mxfp4_block_factor(uint32_t word, bool hi) {
    return __uint_as_float((hi ? (word & 0xffff0000u) : (word << 16)) - (112u << 23));
}

// One 64-k chunk of a decode MXFP4 GEMV: acc[0] (row g) and acc[2] (row g + 8) += for each
// 32-k block b (sub-tiles 2b, 2b + 1): factor · (the block's fp16 mma sum, from a zero
// accumulator). x: this lane's fp16 B words of the chunk, x[2j], x[2j + 1] for sub-tile j (the
// words 8t + 2j, + 1 of the chunk's permuted 64-element slice, t = lane & 3). acc[1], acc[3]
// (column 1) are not updated; only column 0 is read.
__device__ __forceinline__ void mxfp4_chunk_f16(float (&acc)[4], const Chunk& ch, const uint32_t (&x)[8]) {
    const uint32_t words[4] = {ch.v[0].x, ch.v[0].y, ch.v[0].z, ch.v[0].w};
    const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int b = 0; b < 2; ++b) {
        uint32_t a0[4], a1[4];
        fragment_e2m1_f16(words[2 * b], a0);
        fragment_e2m1_f16(words[2 * b + 1], a1);
        float p[4];
        mma_f16(p, a0, x[4 * b], x[4 * b + 1], zero);
        mma_f16(p, a1, x[4 * b + 2], x[4 * b + 3], p);
        acc[0] = __fmaf_rn(p[0], mxfp4_block_factor(ch.v[1].x, b == 1), acc[0]);
        acc[2] = __fmaf_rn(p[2], mxfp4_block_factor(ch.v[1].y, b == 1), acc[2]);
    }
}

}  // namespace gemm_detail
}  // namespace cuda
}  // namespace gptoss
