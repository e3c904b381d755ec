// cuda/attention_mma.cuh - the tensor-core building blocks of the attention kernels
// (attention_prefill.cu, and attention.cu's tensor-core decode split; cp.async is common.cuh's):
// ldmatrix, mma.sync m16n8k16 (bf16 in, fp32 accumulate; PTX ISA "Matrix Fragments for
// mma.m16n8k16"), the swizzled layout of a K/V tile (rows of 64 bf16 = 8 chunks of 16 bytes), and
// exp2 on the SFU. Device code only.
#pragma once

#include "cuda/common.cuh"
#include "cuda/kernels.h"

#include <cstdint>

namespace gptoss {
namespace cuda {
namespace attn_mma {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}


__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                              uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of 16-byte chunk c (0..7) of key row r in a swizzled 64×64 bf16 tile: conflict-free
// for ldmatrix (8 consecutive rows of one logical chunk land in 8 distinct bank groups).
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

// Issues the cp.async of 16-byte chunk c of key kp of kv head g: K to k_dst, V to v_dst (shared
// addresses); zeros when kp is outside [lo, hi]. Keys at or after pos0 come from k_new / v_new
// when those are set (the chunk's own keys), the others from the cache ring (slot kp % slots).
__device__ __forceinline__ void cp_async_kv_chunk(const AttentionArgs& a, int kp, int lo, int hi, int pos0, int g,
                                                  int c, uint32_t k_dst, uint32_t v_dst) {
    constexpr int kHeadDim = 64;
    const size_t GD = size_t(a.G) * kHeadDim;
    const bool valid = kp >= lo && kp <= hi;
    const uint16_t *ks = a.k_cache, *vs = a.v_cache;
    size_t off = 0;
    if (valid) {
        if (kp >= pos0 && a.k_new) {
            off = size_t(kp - pos0) * GD;
            ks = a.k_new;
            vs = a.v_new;
        } else {
            off = size_t(uint32_t(kp) < a.slots ? uint32_t(kp) : uint32_t(kp) % a.slots) * GD;
        }
        off += size_t(g) * kHeadDim + c * 8;
    }
    cp_async16_zfill(k_dst, ks + off, valid);
    cp_async16_zfill(v_dst, vs + off, valid);
}

}  // namespace attn_mma
}  // namespace cuda
}  // namespace gptoss
