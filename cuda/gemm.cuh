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

// a · (h, h) for the bf16 h in the low (hi = false) or high half of s: ptxas folds the
// replication into HMUL2's operand selector (.H0_H0 / .H1_H1), where replicating h with
// __byte_perm first cost one PRMT per scale word and k16 step (same product, same bits).
__device__ __forceinline__ uint32_t bf16x2_mul_half(uint32_t a, uint32_t s, bool hi) {
    __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a);
    __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162*>(&s);
    __nv_bfloat162 r = __hmul2(x, hi ? __high2bfloat162(y) : __low2bfloat162(y));
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

// Where repack.cu puts the 8 e2m1 values of a fragment word (sub-tile j of a lane; value L_p is
// the low half of A register p, H_p its high half; p = 0, 2: row g, p = 1, 3: row g+8) so that
// few instructions rebuild the registers. The bf16 bit pattern of e2m1 · 2^-126 has the sign at
// bit 15 and e1 e0 m at bits 8 7 6 (the high half: +16); let M = those 8 bits of a pair
// (0x81C081C0). Pair p is stored rotated right by d_p, so rotl(word, d_p) & M is its bits:
// d = 0, 4, 10 for p = 0, 1, 2. The remaining 8 bits cannot hold a fourth rotation of M (no such
// tiling of 32 bits exists), so pair 3 is stored in two rotations: its e1 bits by 14, the rest
// by 6. Per word: 4 masks, 2 rotates, 2 shifts, one OR (9 instructions; the v18 layout needed ~15).
// Bit positions, per value: {sign, e1, e0, m}.
struct E2m1Bits {
    uint8_t s, e1, e0, m;
};
__host__ __device__ constexpr E2m1Bits e2m1_word_bits(int p, bool hi) {
    // value bits at target t stored at (t - d) mod 32
    return p == 0 ? (hi ? E2m1Bits{31, 24, 23, 22} : E2m1Bits{15, 8, 7, 6})
         : p == 1 ? (hi ? E2m1Bits{27, 20, 19, 18} : E2m1Bits{11, 4, 3, 2})
         : p == 2 ? (hi ? E2m1Bits{21, 14, 13, 12} : E2m1Bits{5, 30, 29, 28})
                  : (hi ? E2m1Bits{25, 10, 17, 16} : E2m1Bits{9, 26, 1, 0});
}

__device__ __forceinline__ uint32_t rotl(uint32_t w, int d) { return __funnelshift_l(w, w, d); }

// The 4 bf16 pairs e2m1 · 2^-126 of one fragment word (e2m1_word_bits). The rotations by 4 and 6
// are written as left shifts: no bit of their masks comes from the bits a rotation wraps around
// (pair 1's sources are bits 2-4, 11, 18-20, 27; those of pair 3's first mask 0-1, 9, 16-17, 25;
// every 2^32 word checked by a throwaway host program; the kernel tests compare every MXFP4
// kernel with the CPU reference), so the values are the rotations', and ptxas issues a constant
// shift as IMAD.SHL on the FMA pipe instead of SHF on the integer pipe that the masks load (H200:
// 64 streams +1.0 %, bench/NOTES.md v31; the other two rotations as shift | umulhi lost 6 %).
__device__ __forceinline__ void e2m1_pairs_bf16(uint32_t word, uint32_t (&a)[4]) {
    constexpr uint32_t M = 0x81C081C0u;
    a[0] = word & M;
    a[1] = (word << 4) & M;
    a[2] = rotl(word, 10) & M;
    a[3] = ((word << 6) & 0x80C080C0u) | (rotl(word, 14) & 0x01000100u);
}

// A fragment of sub-tile j. MXFP4: the 4 pairs of word j (e2m1_word_bits: the e2m1 value times
// 2^-126 in bf16), then one multiply by bf16 2^(s-1) restores the scale; pairs 0, 2 are row g,
// pairs 1, 3 row g+8.
template <bool kFp4>
__device__ __forceinline__ void fragment(const Chunk& ch, int j, uint32_t (&a)[4]) {
    if constexpr (kFp4) {
        const uint32_t word = j == 0 ? ch.v[0].x : j == 1 ? ch.v[0].y : j == 2 ? ch.v[0].z : ch.v[0].w;
        // The bf16 scales of rows g / g + 8: the low halves of v[1].x / .y for sub-tiles 0, 1
        // (the chunk's first 32-k block), the high halves for 2, 3.
        uint32_t bits[4];
        e2m1_pairs_bf16(word, bits);
#pragma unroll
        for (int p = 0; p < 4; ++p) a[p] = bf16x2_mul_half(bits[p], (p & 1) ? ch.v[1].y : ch.v[1].x, j >= 2);
    } else {
        const uint4 v = ch.v[j];
        a[0] = v.x; a[1] = v.y; a[2] = v.z; a[3] = v.w;
    }
}

// ---- Decode MXFP4 arithmetic (gemm_decode.cu; issue 12) ----
// Decode K/V is never reused by a later call, so the T = 1 GEMVs need not match gemm.cu's bits
// (they split K over warps in an order of their own). v17-v18 ran them in fp16 (the nibbles placed
// as e2m1 · 2^-14, the scale on the fp32 block sum); with the v19 word layout the fp16 placement
// cost 17 integer instructions per word against 9 for bf16, and decode lost 8 % (bench/NOTES.md
// "v19 MXFP4 word layout"). Until v32 they used gemm.cu's per-element bf16 values (fragment<true>:
// one bf16 multiply by the block scale per pair). Now (bench/NOTES.md "v32", "v33": 20b tg128
// +0.8-3.1 % at depths 0 and 8 192, 120b +1.2 %; the batched MoE in this form lost 1.6 % at 64
// streams and keeps fragment<true>) the fragment words go to the tensor cores unscaled, as
// e2m1 · 2^-126 bf16 (subnormal for e = 0: mma.sync takes bf16 subnormal inputs exactly, H200
// probe in v32), against the activation row staged × 2^32 (kXScaleBf16x2), so a 32-k block's two
// k16 mma sum 2^-94 · Σ q·x from zero, well inside fp32's normal range; then acc += that sum ·
// 2^(s-1) (the block's bf16 scale word as fp32 bits), which the caller scales back by 2^-32
// (kXUnscale). Only column 0 is read (every column carries the same row), so rows g and g + 8 take
// one FMA each per block: 4 FMAs and 4 scale extractions a chunk instead of 16 bf16 multiplies and
// 8 PRMTs. x: this lane's bf16 B words of the chunk, x[2j], x[2j + 1] for sub-tile j (the words
// 8t + 2j, + 1 of the chunk's permuted 64-element slice, t = lane & 3), already × 2^32. Column 0
// (acc[0]: row g, acc[2]: row g + 8) is read.
constexpr uint32_t kXScaleBf16x2 = 0x4F804F80u;  // bf16 2^32 in both halves
constexpr float kXUnscale = 0x1p-32f;
__device__ __forceinline__ void mxfp4_chunk_blockscale(float (&acc)[4], const Chunk& ch, const uint32_t (&x)[8]) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
        uint32_t a0[4], a1[4];
        e2m1_pairs_bf16(b == 0 ? ch.v[0].x : ch.v[0].z, a0);
        e2m1_pairs_bf16(b == 0 ? ch.v[0].y : ch.v[0].w, a1);
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma(sum, a0, x[4 * b], x[4 * b + 1]);
        mma(sum, a1, x[4 * b + 2], x[4 * b + 3]);
        const float sg = __uint_as_float(b == 0 ? ch.v[1].x << 16 : ch.v[1].x & 0xFFFF0000u);
        const float sg8 = __uint_as_float(b == 0 ? ch.v[1].y << 16 : ch.v[1].y & 0xFFFF0000u);
        acc[0] = __fmaf_rn(sum[0], sg, acc[0]);
        acc[2] = __fmaf_rn(sum[2], sg8, acc[2]);
    }
}

}  // namespace gemm_detail
}  // namespace cuda
}  // namespace gptoss
