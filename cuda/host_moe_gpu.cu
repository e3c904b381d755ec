// cuda/host_moe_gpu.cu - the GPU's share of a host layer's decode experts (cuda/host_moe_gpu.h):
// two kernels reading MXFP4 weights over PCIe from the mapped host store. Speed is the PCIe read
// rate, so the kernels keep many bytes in flight (each lane issues all its 16-byte block loads of
// a row pair before any arithmetic, every warp of the grid resident at once) and otherwise stay
// simple: one warp per output (a gate/up row pair, or a down row), the activation row in shared
// memory beside a 16-entry E2M1 table.
#include "cuda/host_moe_gpu.h"

#include "cuda/common.cuh"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>

namespace gptoss {
namespace cuda {

namespace {

constexpr int kWarps = 8;     // per block
constexpr int kPerLane = 8;   // 16-byte blocks a lane loads before computing (a 2880-wide row pair: 6)

// E2M1 codes: 0, 0.5, 1, 1.5, 2, 3, 4, 6, then the same negated (bit 3 the sign).
__constant__ float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// The block's shared memory: the E2M1 table, then the activation row (natural order).
struct Smem {
    float lut[16];
    float x[1];  // [H] or [I]
};
__device__ __forceinline__ void load_lut(float* lut) {
    if (threadIdx.x < 16) lut[threadIdx.x] = kE2m1[threadIdx.x];
}

// Σ over the 32 elements of one block: bytes j hold elements 2j (low nibble) and 2j+1 (high).
__device__ __forceinline__ float block_dot(uint4 w, const float* x, const float* lut) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const uint32_t byte = (words[i] >> (8 * b)) & 0xffu;
            const int e = (i * 4 + b) * 2;
            s = fmaf(lut[byte & 0xfu], x[e], s);
            s = fmaf(lut[byte >> 4], x[e + 1], s);
        }
    }
    return s;
}

// 2^(s-127), exact for every byte (s = 0 gives the fp32 subnormal 2^-127).
__device__ __forceinline__ float e8m0(uint32_t s) { return s == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(s << 23); }

// Σ_k W[row(b)] x over `n_blocks` consecutive blocks of one or more rows (nb blocks per row), the
// lane's share (blocks lane, lane + 32, ...), into acc[row - first row]; R rows at most.
template <int R>
__device__ __forceinline__ void rows_dot(const uint8_t* blocks, const uint8_t* scales, uint32_t n_blocks, uint32_t nb,
                                         const float* xs, const float* lut, float (&acc)[R]) {
    const uint32_t lane = threadIdx.x % 32;
    for (uint32_t base = 0; base < n_blocks; base += 32 * kPerLane) {
        uint4 w[kPerLane];
        uint32_t s[kPerLane];
#pragma unroll
        for (int j = 0; j < kPerLane; j++) {  // all loads first: bytes in flight over PCIe
            const uint32_t b = base + lane + 32 * j;
            if (b < n_blocks) {
                w[j] = __ldcs(reinterpret_cast<const uint4*>(blocks) + b);  // read once: evict first
                s[j] = __ldcs(scales + b);
            }
        }
#pragma unroll
        for (int j = 0; j < kPerLane; j++) {
            const uint32_t b = base + lane + 32 * j;
            if (b < n_blocks) {
                const uint32_t r = b / nb, kb = b % nb;
                const float d = block_dot(w[j], xs + kb * 32, lut) * e8m0(s[j]);
#pragma unroll
                for (int q = 0; q < R; q++)
                    if (r == uint32_t(q)) acc[q] += d;
            }
        }
    }
#pragma unroll
    for (int q = 0; q < R; q++) acc[q] = warp_sum(acc[q]);
}

// Grid (⌈I / kWarps⌉, slots): warp i of slot s computes h[s][i] from gate/up rows 2i, 2i + 1.
__global__ void __launch_bounds__(kWarps * 32) host_gpu_gate_up_kernel(HostExpertsView w, const uint16_t* xn,
                                                                       const int32_t* experts, uint32_t slot0,
                                                                       uint32_t H, uint32_t I, float limit, float* h) {
    extern __shared__ float smem_raw[];
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
    float* xs = sm.x;  // [H]
    load_lut(sm.lut);
    for (uint32_t k = threadIdx.x; k < H; k += blockDim.x) xs[k] = bf16_bits_to_f32(xn[permuted_k(k)]);
    __syncthreads();
    const uint32_t s = blockIdx.y, i = blockIdx.x * kWarps + threadIdx.x / 32;
    if (i >= I) return;
    const size_t e = size_t(experts[slot0 + s]), nb = H / 32;
    const size_t row = e * 2 * I + 2 * size_t(i);
    float acc[2] = {0.0f, 0.0f};
    rows_dot<2>(w.gu_blocks + row * nb * 16, w.gu_scales + row * nb, uint32_t(2 * nb), uint32_t(nb), xs, sm.lut, acc);
    if (threadIdx.x % 32 != 0) return;
    float gate = acc[0] + bf16_bits_to_f32(__ldcs(w.gu_bias + row));
    float up = acc[1] + bf16_bits_to_f32(__ldcs(w.gu_bias + row + 1));
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    const float glu = gate / (1.0f + expf(-1.702f * gate));
    h[size_t(s) * I + i] = bf16_bits_to_f32(f32_to_bf16_bits((up + 1.0f) * glu));
}

// Grid (⌈H / kWarps⌉, slots): warp r of slot s computes part[slot0 + s][r].
__global__ void __launch_bounds__(kWarps * 32) host_gpu_down_kernel(HostExpertsView w, const int32_t* experts,
                                                                    uint32_t slot0, uint32_t H, uint32_t I,
                                                                    const float* h, float* part) {
    extern __shared__ float smem_raw[];
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
    float* xs = sm.x;  // [I]: this slot's swiglu output
    load_lut(sm.lut);
    const uint32_t s = blockIdx.y;
    for (uint32_t k = threadIdx.x; k < I; k += blockDim.x) xs[k] = h[size_t(s) * I + k];
    __syncthreads();
    const uint32_t r = blockIdx.x * kWarps + threadIdx.x / 32;
    if (r >= H) return;
    const size_t e = size_t(experts[slot0 + s]), nb = I / 32;
    const size_t row = e * H + r;
    float acc[1] = {0.0f};
    rows_dot<1>(w.dn_blocks + row * nb * 16, w.dn_scales + row * nb, uint32_t(nb), uint32_t(nb), xs, sm.lut, acc);
    if (threadIdx.x % 32 == 0)
        part[size_t(slot0 + s) * H + r] = acc[0] + bf16_bits_to_f32(__ldcs(w.dn_bias + row));
}

}  // namespace

cudaError_t launch_host_gpu_experts(const HostExpertsView& w, const uint16_t* xn, const int32_t* experts,
                                    uint32_t slot0, uint32_t slots, uint32_t H, uint32_t I, float swiglu_limit,
                                    float* h, float* part, cudaStream_t stream) {
    if (slots == 0 || H == 0 || I == 0 || H % 64 != 0 || I % 32 != 0 || H > kHostGpuMaxH || I > kHostGpuMaxH)
        return cudaErrorInvalidValue;
    const dim3 block(kWarps * 32);
    host_gpu_gate_up_kernel<<<dim3(ceil_div(I, kWarps), slots), block, (16 + H) * sizeof(float), stream>>>(
        w, xn, experts, slot0, H, I, swiglu_limit, h);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    host_gpu_down_kernel<<<dim3(ceil_div(H, kWarps), slots), block, (16 + I) * sizeof(float), stream>>>(w, experts, slot0, H,
                                                                                                 I, h, part);
    return cudaGetLastError();
}

namespace {

// The GPU's maximum PCIe link through NVML, opened at run time (no build dependency: the driver
// ships libnvidia-ml.so.1). NVML's C ABI: nvmlReturn_t is an int (0 = success), nvmlDevice_t an
// opaque pointer. False where the library, the device or the query is missing.
bool pcie_max_link(int device, unsigned* gen, unsigned* width) {
    char bus_id[32] = {0};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (lib == nullptr) return false;
    using InitFn = int (*)();
    using HandleFn = int (*)(const char*, void**);
    using LinkFn = int (*)(void*, unsigned*);
    auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
    auto shutdown = reinterpret_cast<InitFn>(dlsym(lib, "nvmlShutdown"));
    auto handle = reinterpret_cast<HandleFn>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    auto get_gen = reinterpret_cast<LinkFn>(dlsym(lib, "nvmlDeviceGetMaxPcieLinkGeneration"));
    auto get_width = reinterpret_cast<LinkFn>(dlsym(lib, "nvmlDeviceGetMaxPcieLinkWidth"));
    bool ok = false;
    if (init && shutdown && handle && get_gen && get_width && init() == 0) {
        void* dev = nullptr;
        ok = handle(bus_id, &dev) == 0 && get_gen(dev, gen) == 0 && get_width(dev, width) == 0;
        shutdown();
    }
    dlclose(lib);
    return ok;
}

}  // namespace

uint32_t host_gpu_slots_default(int device, uint32_t K, char* link, size_t link_len) {
    unsigned gen = 0, width = 0;
    const bool known = pcie_max_link(device, &gen, &width);
    if (link != nullptr && link_len > 0) {
        if (known) std::snprintf(link, link_len, "PCIe %u x%u", gen, width);
        else std::snprintf(link, link_len, "PCIe link unknown");
    }
    const bool fast = known && gen >= 5 && width >= 16;
    return std::max(1u, fast ? K / 2 : K / 4);
}

}  // namespace cuda
}  // namespace gptoss
