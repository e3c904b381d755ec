// cuda/mbarrier.cuh - shared-memory mbarriers and bulk asynchronous copies (sm_90+), the device
// side that the warp-specialized prefill GEMM (gemm_prefill_ws.cu) and the streaming MoE decode
// GEMV (moe_stream.cu) share. Barrier and shared addresses are 32-bit shared-window addresses
// (__cvta_generic_to_shared). On older architectures the bodies compile to nothing; their callers
// are never launched there (the host sides check the compute capability). PTX ISA 8.x:
// "mbarrier", "cp.async.bulk".
#pragma once

#include <cstdint>

namespace gptoss {
namespace cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GPTOSS_MBAR_ASM(...) asm volatile(__VA_ARGS__)
#else
#define GPTOSS_MBAR_ASM(...) (void)0
#endif

// count: arrivals that complete a phase.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    GPTOSS_MBAR_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes initialized barriers visible to the async proxy (bulk copies complete on them); a
// __syncthreads must follow before other threads use them.
__device__ __forceinline__ void mbar_init_fence() {
    GPTOSS_MBAR_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    GPTOSS_MBAR_ASM("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// One arrival that also expects `bytes` of bulk copies to complete on the barrier's phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    GPTOSS_MBAR_ASM("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar),
                    "r"(bytes)
                    : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed. kHint: each try_wait
// may suspend the thread for up to 1 ms (suspendTimeHint) instead of the system's default time
// limit, so a waiting warp spends fewer issue slots spinning.
template <bool kHint = false> __device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    if constexpr (kHint) {
        GPTOSS_MBAR_ASM(
            "{\n.reg .pred p;\nLAB_WAIT:\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1, %2;\n"
            "@!p bra LAB_WAIT;\n}\n" ::"r"(bar),
            "r"(parity), "r"(1000000u)
            : "memory");
    } else {
        GPTOSS_MBAR_ASM(
            "{\n.reg .pred p;\nLAB_WAIT:\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
            "@!p bra LAB_WAIT;\n}\n" ::"r"(bar),
            "r"(parity)
            : "memory");
    }
}
// Orders this thread's earlier shared-memory accesses (generic proxy) before later async-proxy
// operations on the same memory (a bulk copy refilling a buffer just read).
__device__ __forceinline__ void fence_proxy_async_smem() {
    GPTOSS_MBAR_ASM("fence.proxy.async.shared::cta;" ::: "memory");
}
// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory to shared
// address dst; the transfer completes on barrier `bar` (counted against its expect_tx).
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    GPTOSS_MBAR_ASM(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}
// Named barrier `id` (1..15; 0 is __syncthreads) for `threads` threads (a multiple of 32); the
// non-.aligned form, so the threads of a warp may arrive from diverged paths.
__device__ __forceinline__ void named_barrier(uint32_t id, uint32_t threads) {
    GPTOSS_MBAR_ASM("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

#undef GPTOSS_MBAR_ASM

}  // namespace cuda
}  // namespace gptoss
