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

}  // namespace gemm_detail
}  // namespace cuda
}  // namespace gptoss
