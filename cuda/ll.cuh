// cuda/ll.cuh - the device side of an all-reduce folded into the kernel that needs it (kernels.h
// LlReduce; issue 15): NCCL's LL protocol, (value, sequence number) pairs stored and loaded 8
// bytes at a time, so a reader that sees the number in a pair sees that pair's value. Used by
// rmsnorm.cu (the split model's MoE combine); rank_comm.cu's LSA kernel stores the same pairs
// 16 bytes (two pairs) at a time into the same slots.
#pragma once

#include "cuda/kernels.h"

#include <cuda_runtime.h>

namespace gptoss {
namespace cuda {

// The sequence number of the slot's current all-reduce (read after pdl_wait).
__device__ __forceinline__ uint32_t ll_seq(const LlReduce& ll) { return __ldcg(ll.ctl) + 1u; }

__device__ __forceinline__ void st_ll_pair(uint2* p, float v, uint32_t seq) {
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(__float_as_uint(v)), "r"(seq) : "memory");
}
__device__ __forceinline__ uint2 ld_ll_pair(const uint2* p) {
    uint2 v;
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
    return v;
}

// Element i's contribution v into every other rank's slot.
__device__ __forceinline__ void ll_push(const LlReduce& ll, uint32_t i, float v, uint32_t seq) {
#pragma unroll
    for (uint32_t r = 0; r < kLlMaxRanks; ++r)
        if (r < ll.n && r != ll.rank) st_ll_pair(ll.dst[r] + i, v, seq);
}

// The value of the pair at p (first read: w) once it carries seq.
__device__ __forceinline__ float ll_value(const uint2* p, uint2 w, uint32_t seq) {
    while (w.y != seq) w = ld_ll_pair(p);
    return __uint_as_float(w.x);
}

// Thread 0 of each CTA, once every thread of it has read ctl (ll_seq): the grid's last CTA writes
// the number back and re-arms the count.
__device__ __forceinline__ void ll_done(const LlReduce& ll, uint32_t seq) {
    __threadfence();
    if (atomicAdd(&ll.ctl[1], 1u) == gridDim.x * gridDim.y * gridDim.z - 1) {
        ll.ctl[1] = 0;
        ll.ctl[0] = seq;
    }
}

}  // namespace cuda
}  // namespace gptoss
