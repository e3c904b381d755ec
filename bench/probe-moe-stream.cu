// bench/probe-moe-stream.cu - a diagnostic for the batched MoE (bench/NOTES.md "v35"): does the
// access pattern of moe_batch_kernel reach the copy bandwidth by itself, and how much per-chunk
// work can ride on it before it stops doing so? At 64 streams the 20b's batched MoE streams its
// routed weights at ~70 % of the copy bandwidth with ~45 % of the issue slots busy, and neither an
// L2 prefetch of whole slabs nor cost-balanced CTA ranges changed that (v35), so it is neither
// simply issue-bound nor short of bytes in flight in a way L2 could fix.
//
// The buffer is laid out as repack.cu's MXFP4 experts: E experts x S 16-row slabs x C 64-k chunks,
// 512 bytes of fragment words per chunk (one uint4 per lane) and 64 bytes of scale words (one uint2
// per 4-lane group). "ring": as moe_batch_kernel, one CTA of W warps per SM takes a contiguous range
// of (expert, slab) items, its warps take them round-robin, and a warp streams its item's C chunks
// through a register ring of D chunks (a chunk's slot is refilled right after the chunk is used);
// per chunk it runs `ops` rounds of integer work on the loaded words (each round a funnel shift and
// a masked xor per word: ~2 instructions x 4 words; moe_batch_kernel spends ~36 integer + ~20 other
// non-mma instructions per chunk, i.e. about 7 rounds). "ring-ilv": the same schedule over a layout
// with chunk c of 24 neighbouring items side by side (what the 24 warps of a CTA read at about the
// same time becomes 12 KB contiguous instead of 24 pieces 23 KB apart): the test of whether DRAM
// locality across a CTA's warps is what the repack layout costs. "flat": the same bytes read by a
// grid-stride loop of 16-byte loads, 4 in flight per thread (the ceiling for this buffer).
//
// Build and run on the GPU machine (not part of the CMake build):
//   nvcc -arch=sm_90a -O3 -std=c++17 bench/probe-moe-stream.cu -o /tmp/probe-moe && /tmp/probe-moe
// Prints one line per variant: GB/s of fragment + scale bytes read, median of 15 timed launches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CHECK_CUDA(call)                                                                              \
    do {                                                                                              \
        const cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                      \
            std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
            return 1;                                                                                 \
        }                                                                                             \
    } while (0)

namespace {

constexpr uint32_t kE = 32, kS = 360, kC = 45;  // the 20b's gate_up: 32 experts, 5 760 rows, K = 2 880
constexpr uint32_t kItems = kE * kS;

__device__ __forceinline__ uint4 ld_nc(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// `ops` rounds of integer work on one chunk's words, folded into acc (kept live through `sink`).
template <int kOps>
__device__ __forceinline__ uint32_t work(uint4 v, uint2 s) {
    uint32_t a0 = v.x, a1 = v.y, a2 = v.z, a3 = v.w;
#pragma unroll
    for (int k = 0; k < kOps; ++k) {
        a0 = __funnelshift_l(a0, a0, 3 + k) ^ (a0 & 0x81C081C0u);
        a1 = __funnelshift_l(a1, a1, 5 + k) ^ (a1 & 0x81C081C0u);
        a2 = __funnelshift_l(a2, a2, 7 + k) ^ (a2 & 0x81C081C0u);
        a3 = __funnelshift_l(a3, a3, 9 + k) ^ (a3 & 0x81C081C0u);
    }
    return a0 ^ a1 ^ a2 ^ a3 ^ s.x ^ s.y;
}

constexpr uint32_t kIlv = 24;  // ring-ilv: items per interleave group

// Chunk c of item `it`, in chunk units: repack.cu's layout (item-major), or kIlv items interleaved.
template <bool kInterleave>
__device__ __forceinline__ size_t chunk_index(uint32_t it, uint32_t c) {
    if constexpr (kInterleave) return (size_t(it / kIlv) * kC + c) * kIlv + it % kIlv;
    return size_t(it) * kC + c;
}

template <int D, int W, int kOps, bool kInterleave = false>
__global__ __launch_bounds__(32 * W, 1) void ring_kernel(const uint4* w, const uint2* sc, uint32_t* sink) {
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t per = (kItems + gridDim.x - 1) / gridDim.x;
    const uint32_t begin = min(kItems, blockIdx.x * per), end = min(kItems, begin + per);
    uint32_t acc = 0;
    for (uint32_t it = begin + warp; it < end; it += W) {
        const uint4* wp = w + lane;
        const uint2* sp = sc + (lane >> 2);
        uint4 rw[D];
        uint2 rs[D];
#pragma unroll
        for (int i = 0; i < D; ++i) {
            rw[i] = ld_nc(wp + chunk_index<kInterleave>(it, i) * 32);
            rs[i] = __ldg(sp + chunk_index<kInterleave>(it, i) * 8);
        }
        for (uint32_t base = 0; base < kC; base += D) {
#pragma unroll
            for (int i = 0; i < D; ++i) {
                const uint32_t c = base + i;
                if (c >= kC) break;
                acc += work<kOps>(rw[i], rs[i]);
                if (c + D < kC) {
                    rw[i] = ld_nc(wp + chunk_index<kInterleave>(it, c + D) * 32);
                    rs[i] = __ldg(sp + chunk_index<kInterleave>(it, c + D) * 8);
                }
            }
        }
    }
    if (acc == 0x9E3779B9u) sink[0] = acc;  // never true in practice; keeps the loads and work live
}

__global__ void flat_kernel(const uint4* w, size_t n16, uint32_t* sink) {
    uint32_t acc = 0;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = ld_nc(w + i), b = ld_nc(w + i + stride), c = ld_nc(w + i + 2 * stride), d = ld_nc(w + i + 3 * stride);
        acc += a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n16; i += stride) acc += ld_nc(w + i).x;
    if (acc == 0x9E3779B9u) sink[0] = acc;
}

template <typename F>
float median_ms(F&& launch) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    launch();  // warm-up
    std::vector<float> t;
    for (int r = 0; r < 15; ++r) {
        cudaEventRecord(a);
        launch();
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        t.push_back(ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

template <int D, int W, int kOps, bool kInterleave = false>
void ring(const uint4* w, const uint2* sc, uint32_t* sink, int sms, double bytes) {
    const float ms = median_ms([&] { ring_kernel<D, W, kOps, kInterleave><<<sms, 32 * W>>>(w, sc, sink); });
    std::printf("%s D=%-2d W=%-2d ops=%-2d  %8.1f GB/s  (%.1f us)\n", kInterleave ? "ring-ilv" : "ring    ", D, W,
                kOps, bytes / (ms * 1e6), ms * 1e3);
}

}  // namespace

int main() {
    int dev = 0, sms = 0;
    CHECK_CUDA(cudaGetDevice(&dev));
    CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const size_t wbytes = size_t(kItems) * kC * 512, sbytes = size_t(kItems) * kC * 64;
    uint4* w = nullptr;
    uint2* sc = nullptr;
    uint32_t* sink = nullptr;
    CHECK_CUDA(cudaMalloc(&w, wbytes));
    CHECK_CUDA(cudaMalloc(&sc, sbytes));
    CHECK_CUDA(cudaMalloc(&sink, 4));
    CHECK_CUDA(cudaMemset(w, 0x5A, wbytes));
    CHECK_CUDA(cudaMemset(sc, 0x3C, sbytes));
    const double bytes = double(wbytes + sbytes);
    std::printf("probe-moe-stream: %d SMs, %.1f MB of fragment + scale words (%u items of %u chunks)\n", sms,
                bytes / 1e6, kItems, kC);
    {
        const float ms = median_ms([&] { flat_kernel<<<sms * 4, 512>>>(w, wbytes / 16, sink); });
        std::printf("flat     (fragment words only)  %8.1f GB/s  (%.1f us)\n", double(wbytes) / (ms * 1e6), ms * 1e3);
    }
    ring<4, 24, 0>(w, sc, sink, sms, bytes);
    ring<4, 24, 4>(w, sc, sink, sms, bytes);
    ring<4, 24, 7>(w, sc, sink, sms, bytes);
    ring<4, 24, 10>(w, sc, sink, sms, bytes);
    ring<8, 16, 0>(w, sc, sink, sms, bytes);
    ring<8, 16, 7>(w, sc, sink, sms, bytes);
    ring<12, 16, 7>(w, sc, sink, sms, bytes);
    ring<4, 32, 7>(w, sc, sink, sms, bytes);
    ring<4, 24, 0, true>(w, sc, sink, sms, bytes);
    ring<4, 24, 7, true>(w, sc, sink, sms, bytes);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    cudaFree(w);
    cudaFree(sc);
    cudaFree(sink);
    return 0;
}
