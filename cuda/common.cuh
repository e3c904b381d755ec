// cuda/common.cuh - shared device helpers for the gptoss CUDA kernels: error mapping
// (GPTOSS_CUDA_TRY → gptoss_status), RAII device buffers, bf16 conversions, warp reductions and
// the one mma.sync wrapper every matrix kernel uses.
// Invariants: no function here prints, throws or aborts; every CUDA failure becomes a status
// with file:line and cudaGetErrorString in gptoss_last_error().
#pragma once

#include "gptoss-internal.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <utility>

namespace gptoss {
namespace cuda {

// Maps a CUDA error to a status: allocation failures are OUT_OF_MEMORY, the rest DEVICE.
[[nodiscard]] inline gptoss_status cuda_status(cudaError_t err, const char* what, const char* file,
                                               int line) {
    if (err == cudaSuccess) return GPTOSS_OK;
    const gptoss_status status =
        err == cudaErrorMemoryAllocation ? GPTOSS_ERR_OUT_OF_MEMORY : GPTOSS_ERR_DEVICE;
    return fail(status, "CUDA: %s failed at %s:%d: %s (%s)", what, file, line,
                cudaGetErrorString(err), cudaGetErrorName(err));
}

#define GPTOSS_CUDA_TRY(call) \
    GPTOSS_TRY(::gptoss::cuda::cuda_status((call), #call, __FILE__, __LINE__))

// After a kernel launch: launch-configuration errors surface here, faults at the next sync.
#define GPTOSS_CUDA_LAUNCH_CHECK() \
    GPTOSS_TRY(::gptoss::cuda::cuda_status(cudaGetLastError(), "kernel launch", __FILE__, __LINE__))

// Device memory owned by one object; freed on destruction (errors at free are ignored: the
// context may already be poisoned, and a destructor cannot report).
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) { reset(); ptr_ = o.ptr_; bytes_ = o.bytes_; o.ptr_ = nullptr; o.bytes_ = 0; }
        return *this;
    }
    ~DeviceBuffer() { reset(); }
    // Allocates `bytes` (rounded up to 256); fails with OUT_OF_MEMORY naming `what`, the bytes
    // asked for and the bytes free.
    [[nodiscard]] gptoss_status alloc(size_t bytes, const char* what) {
        reset();
        if (bytes == 0) bytes = 256;
        bytes = (bytes + 255) & ~size_t(255);
        const cudaError_t err = cudaMalloc(&ptr_, bytes);
        if (err != cudaSuccess) {
            ptr_ = nullptr;
            cudaGetLastError();  // clear the (non-sticky) allocation error
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            if (err == cudaErrorMemoryAllocation)
                return fail(GPTOSS_ERR_OUT_OF_MEMORY,
                            "CUDA: allocating %s: needed %zu bytes, %zu bytes free of %zu", what,
                            bytes, free_b, total_b);
            return cuda_status(err, what, __FILE__, __LINE__);
        }
        bytes_ = bytes;
        return GPTOSS_OK;
    }
    void reset() {
        if (ptr_) cudaFree(ptr_);
        ptr_ = nullptr;
        bytes_ = 0;
    }
    template <typename T> T* as() const { return static_cast<T*>(ptr_); }
    void* get() const { return ptr_; }
    size_t bytes() const { return bytes_; }
private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

// Restores the caller's current device when it goes out of scope (API.md §8).
class DeviceGuard {
public:
    explicit DeviceGuard(int device) {
        if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
        cudaGetLastError();
        if (device != previous_) cudaSetDevice(device);
    }
    ~DeviceGuard() {
        int now = -1;
        if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
    }
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;
private:
    int previous_ = -1;
};

inline uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// Tuning knobs read from the environment (A/B runs; read once by the caller, in a static):
// env_int gives the integer value of `name`, or `def` when it is unset or empty; env_choice gives
// it only when it is one of `allowed`, else `def`.
inline int env_int(const char* name, int def) {
    const char* s = std::getenv(name);
    return (s && *s) ? std::atoi(s) : def;
}
inline int env_choice(const char* name, std::initializer_list<int> allowed, int def) {
    const int v = env_int(name, def);
    for (const int a : allowed)
        if (v == a) return v;
    return def;
}
// A process setting held in v (-1: not chosen yet): its setter's value, else read() (its
// environment variable) on first use.
template <typename Read>
int setting(std::atomic<int>& v, Read read) {
    int x = v.load();
    if (x < 0) {
        int expected = -1;
        v.compare_exchange_strong(expected, read());
        x = v.load();
    }
    return x;
}
// An on/off process setting: on unless its environment variable is 0, or what set() chose (tests,
// benchmarks).
class OnSwitch {
public:
    constexpr explicit OnSwitch(const char* env) : env_(env) {}
    bool on() { return setting(v_, [this] { return env_choice(env_, {0, 1}, 1); }) != 0; }
    void set(bool on) { v_.store(on ? 1 : 0); }
private:
    const char* env_;
    std::atomic<int> v_{-1};
};

// ---------------------------------------------------------------------------
// Device helpers

#ifdef __CUDACC__

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
    return __uint_as_float(uint32_t(b) << 16);
}
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    return uint32_t(f32_to_bf16_bits(lo)) | (uint32_t(f32_to_bf16_bits(hi)) << 16);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Streaming 16-byte load that does not pollute L1 (weights are read once per step).
__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

// D += A·B for one m16n8k16 tile, bf16 inputs, fp32 accumulators (PTX fragment layout:
// lane = 4·g + t; a = rows g / g+8, k pairs 2t / 2t+8; b = k pairs 2t / 2t+8 of column g;
// c = rows g / g+8, columns 2t, 2t+1).
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// RMSNorm of one fp32 row with the reduction order of a CTA of kNormThreads threads, virtual
// thread i owning elements i + kNormThreads·j (j < kNormPer): returns 1 / sqrt(mean(x²) + eps).
// The sum of squares is reduced in one fixed order (per-thread FMA chain, warp butterfly, warps
// in index order), so rmsnorm.cu and the fused decode router (router.cu) compute the same bits.
// A CTA of R threads (R a multiple of 32 dividing kNormThreads) plays kNormThreads / R virtual
// threads each: value(q, j) returns element threadIdx.x + R·q + kNormThreads·j (0 past H).
// partial: shared float[kNormThreads / 32]. Contains a __syncthreads (all threads must call it).
constexpr uint32_t kNormThreads = 1024;
constexpr uint32_t kNormPer = 4;
template <uint32_t R, typename Value>
__device__ __forceinline__ float rmsnorm_inv(Value value, uint32_t H, float eps, float* partial) {
    static_assert(R % 32 == 0 && kNormThreads % R == 0, "rmsnorm_inv: R must be a multiple of 32 dividing 1024");
#pragma unroll
    for (uint32_t q = 0; q < kNormThreads / R; ++q) {
        float ss = 0.0f;
#pragma unroll
        for (uint32_t j = 0; j < kNormPer; ++j) {
            const float v = value(q, j);
            ss = __fmaf_rn(v, v, ss);
        }
        ss = warp_sum(ss);
        if ((threadIdx.x & 31) == 0) partial[(threadIdx.x >> 5) + q * (R / 32)] = ss;
    }
    __syncthreads();
    float total = 0.0f;
    for (uint32_t i = 0; i < kNormThreads / 32; ++i) total += partial[i];
    return 1.0f / sqrtf(total / float(H) + eps);
}

// YaRN RoPE (MODEL.md §YaRN RoPE), rotate-half: cos/sin of one frequency at one position,
// times the YaRN attention factor, and the rotation of one (x1, x2) = (x[i], x[i + D/2]) pair.
// Every operation is explicitly rounded (no FMA contraction), so rope.cu and the decode
// attention kernel, which rotates q and k itself, produce the same bits.
__device__ __forceinline__ void rope_cos_sin(float pos, float inv_freq, float scale, float& c, float& s) {
    float sn, cs;
    sincosf(__fmul_rn(pos, inv_freq), &sn, &cs);
    c = __fmul_rn(cs, scale);
    s = __fmul_rn(sn, scale);
}
__device__ __forceinline__ void rope_rotate(float x1, float x2, float c, float s, float& o1, float& o2) {
    o1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    o2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// Position of element k of an activation row in the "fragment-permuted" layout that the GEMM
// kernel reads with two 16-byte loads per lane and 64-k chunk: within each chunk of 64, lane
// quad t owns k = 16j + 2t + {0,1,8,9} for j = 0..3, stored contiguously (16 elements).
__host__ __device__ __forceinline__ uint32_t permuted_k(uint32_t k) {
    const uint32_t c = k >> 6, r = k & 63, j = r >> 4, rr = r & 15;
    const uint32_t half = rr >> 3, t = (rr & 7) >> 1, e = rr & 1;
    return (c << 6) + t * 16 + j * 4 + half * 2 + e;
}

// gpt-oss's clamped SwiGLU of one intermediate element from its gate and up projections (bias
// included; MODEL.md): gate clamped above at limit, up to [-limit, limit], then
// (up + 1) · gate · σ(1.702 · gate), in this order (the bits of every GPU epilogue).
// σ through the hardware approximations (ex2.approx and rcp.approx, relative error ~2^-21; the
// result is rounded to bf16, 2^-8): ~5 instructions instead of the ~25 of IEEE expf and
// division, which the MoE gate_up epilogue pays once per output (bench/NOTES.md v24).
// Large negative gates give exp → inf and σ → 0, as expf does.
__device__ __forceinline__ float swiglu_clamped(float gate, float up, float limit) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    const float sig = __fdividef(1.0f, 1.0f + __expf(-1.702f * gate));
    return (up + 1.0f) * (gate * sig);
}

// 16-byte asynchronous global → shared copy (sm_80+), L2 only; cp_async_wait_all() waits for
// this thread's copies (a __syncthreads must follow before other threads read them).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// The same copy writing zeros when !valid (src-size 0: nothing is read); dst is a shared address.
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
// Closes this thread's group of cp.async copies; cp_async_wait<N>() waits until at most N of its
// groups are still in flight.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Programmatic dependent launch (sm_90+): a forward kernel may start while its predecessor
// drains; it must call pdl_wait() before reading anything an earlier kernel wrote (or writing
// anything an earlier kernel reads). Only read-only weights may be touched before the wait.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The current device and what the launches here ask of it, queried once per thread and device
// (launch paths call this per launch).
struct DeviceProps {
    int dev = -1;
    int major = 0;           // compute capability major
    int max_smem_optin = 0;  // bytes of shared memory a CTA may opt in to
    int sms = 0;             // streaming multiprocessors
};
inline cudaError_t current_device_props(DeviceProps* out) {
    thread_local DeviceProps cached;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev != cached.dev) {
        DeviceProps p;
        p.dev = dev;
        if ((e = cudaDeviceGetAttribute(&p.major, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess) return e;
        if ((e = cudaDeviceGetAttribute(&p.max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) != cudaSuccess)
            return e;
        if ((e = cudaDeviceGetAttribute(&p.sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return e;
        cached = p;
    }
    *out = cached;
    return cudaSuccess;
}

// True when the current device supports programmatic dependent launch (compute capability 9+)
// and GPTOSS_PDL is not 0 (0: every forward kernel launches in plain stream order, for
// debugging tools such as compute-sanitizer; the kernels' griddepcontrol instructions are then
// no-ops).
inline bool pdl_supported() {
    static const bool off = env_int("GPTOSS_PDL", 1) == 0;
    if (off) return false;
    DeviceProps p;
    if (current_device_props(&p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return p.major >= 9;
}

// ---- mbarriers and bulk copies (sm_90: the prefill's warp-specialized GEMM, the dense batch
// kernel's bulk form). Barrier addresses are 32-bit shared addresses (__cvta_generic_to_shared). Below sm_90
// they compile to nothing (their callers run only on sm_90 devices).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GPTOSS_ASM_SM90(...) asm volatile(__VA_ARGS__)
#else
#define GPTOSS_ASM_SM90(...) ((void)0)
#endif
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    GPTOSS_ASM_SM90("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes barrier initializations visible to the async proxy (the bulk copies that complete them).
__device__ __forceinline__ void fence_mbar_init() { GPTOSS_ASM_SM90("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    GPTOSS_ASM_SM90("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// The phase's one arrival, announcing `bytes` of bulk copies that complete it.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    GPTOSS_ASM_SM90("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed. kHint: each try_wait
// may suspend the thread for up to 1 ms (suspendTimeHint) instead of the system's default time
// limit, so a waiting warp spends fewer issue slots spinning.
template <bool kHint = false> __device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    if constexpr (kHint) {
        GPTOSS_ASM_SM90(
            "{\n.reg .pred p;\nLAB_WAIT:\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1, %2;\n"
            "@!p bra LAB_WAIT;\n}\n" ::"r"(bar),
            "r"(parity), "r"(1000000u)
            : "memory");
    } else {
        GPTOSS_ASM_SM90(
            "{\n.reg .pred p;\nLAB_WAIT:\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
            "@!p bra LAB_WAIT;\n}\n" ::"r"(bar),
            "r"(parity)
            : "memory");
    }
}
// A bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory into
// this CTA's shared memory at smem, completing on the barrier at bar (as cp_async16 takes smem).
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* src, uint32_t bytes, uint32_t bar) {
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    GPTOSS_ASM_SM90("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                    "l"(src), "r"(bytes), "r"(bar)
                    : "memory");
}
// A 2-D tensor-map copy (TMA) of the box whose first element is (c0, c1) (the map's dims 0 and 1,
// in elements) into this CTA's shared memory at smem (aligned as the map's swizzle asks),
// completing on the barrier at bar. tmap: the address of a __grid_constant__ kernel parameter.
__device__ __forceinline__ void tma_load_2d(void* smem, const void* tmap, int32_t c0, int32_t c1, uint32_t bar) {
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    GPTOSS_ASM_SM90(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            dst),
        "l"(tmap), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
#undef GPTOSS_ASM_SM90

// Launches a forward kernel with programmatic stream serialization where supported (the kernel
// must start with pdl_wait(); see above) and, when `cluster` is not 1 x 1 x 1, as thread-block
// clusters of that shape (compute capability 9.0+; the caller checks).
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                               dim3 cluster, Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (cluster.x * cluster.y * cluster.z > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster.x;
        attr[n].val.clusterDim.y = cluster.y;
        attr[n].val.clusterDim.z = cluster.z;
        ++n;
    }
    if (pdl_supported()) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// launch_pdl_cluster without clusters.
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
    return launch_pdl_cluster(kernel, grid, block, smem, stream, dim3(1, 1, 1), std::forward<Args>(args)...);
}

#define GPTOSS_LAUNCH(kernel, grid, block, smem, stream, ...)                                          \
    GPTOSS_TRY(::gptoss::cuda::cuda_status(::gptoss::cuda::launch_pdl(kernel, grid, block, smem, stream, \
                                                                      __VA_ARGS__),                    \
                                           #kernel, __FILE__, __LINE__))

#endif  // __CUDACC__

}  // namespace cuda
}  // namespace gptoss
