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

// Thread 0 of each CTA of an all-reduce's kernel, before its dependency wait: the sequence number
// of the slot's current all-reduce, ctl[0] + 1; the grid's last CTA to take it writes it back and
// re-arms the count (ctl[1]), so every CTA reads the same number and the slot's next all-reduce
// the next one. Reading before the wait is safe: ctl[0] was last written by the all-reduce two
// before this one on the same slots, which has completed once the previous kernel started
// (every forward kernel waits for its predecessor before it lets its dependents start).
__device__ __forceinline__ uint32_t ll_take_seq(uint32_t* ctl) {
    const uint32_t seq = __ldcg(ctl) + 1u;
    __threadfence();  // the read above before the arrival below
    if (atomicAdd(&ctl[1], 1u) == gridDim.x * gridDim.y * gridDim.z - 1) {
        ctl[1] = 0;
        ctl[0] = seq;
    }
    return seq;
}

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

}  // namespace cuda
}  // namespace gptoss
