// bench/kv-pattern/kv-pattern-probe.cu - a throwaway probe (bench/NOTES.md "v43"): how fast can a
// decode attention's K/V reads arrive on this GPU, by access pattern, with nothing else in the CTA?
// Each variant is one launch per "layer" that copies a whole layer's K and V (slots x 8 kv heads x
// 64 bf16 each) into shared memory with cp.async, 16 bytes per request, the CTAs of
// bf16_attention_decode_mma_kernel's shape (256 threads, 66 KB of shared memory: 2 per SM), and
// exits. Layers rotate over 8 buffers (past the L2). Prints µs per launch and TB/s of K/V.
// Build: nvcc -arch=sm_90a -O3 -o probe kv-pattern-probe.cu; run: ./probe
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>

constexpr int G = 8, D = 64, kKeys = 256, kThreads = 256;
constexpr int kSmem = 66 * 1024;

__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// mode 0: cache [slot][G][64], CTA (split, head): 256 keys of one kv head (128 of every 1 024 bytes)
// mode 1: the same, the grid launched head-major (blockIdx.x = head)
// mode 2: cache [G][slot][64] (kv-head-major): a CTA's 256 keys are 32 KB contiguous per K / V
// mode 3: cache [slot][G][64], a CTA reads 32 whole slots (all 8 heads): 32 KB contiguous per K / V
__global__ __launch_bounds__(kThreads, 2) void probe(const uint4* k, const uint4* v, int slots, int mode, uint32_t* out) {
    extern __shared__ __align__(128) uint4 sm[];
    const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
    int split, head;
    if (mode == 1) { head = blockIdx.x; split = blockIdx.y; } else { split = blockIdx.x; head = blockIdx.y; }
    // 2 048 16-byte pieces of K and 2 048 of V per CTA: 8 + 8 per thread
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int piece = threadIdx.x + kThreads * i;  // 0 .. 2047
        size_t off;
        if (mode <= 1) {  // key split*256 + piece/8, head, chunk piece%8
            off = (size_t(split) * kKeys + piece / 8) * G * 8 + size_t(head) * 8 + piece % 8;
        } else if (mode == 2) {
            off = (size_t(head) * slots + size_t(split) * kKeys) * 8 + piece;
        } else {  // 32 slots x 8 heads x 8 pieces = 2048 pieces contiguous; CTA id = split*8+head
            const size_t cta = size_t(split) * G + head;
            off = cta * 2048 + piece;
        }
        cp16(s0 + 16u * piece, k + off);
        cp16(s0 + 16u * (2048 + piece), v + off);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0 && sm[blockIdx.x & 63].x == 0x12345678u) out[0] = 1;  // keeps the copies
}

__global__ void empty_kernel() {}

__global__ void stream_read(const uint4* p, size_t n, uint32_t* out) {  // the plain read ceiling
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const uint4 x = __ldcs(p + i);
        acc ^= x.x ^ x.y ^ x.z ^ x.w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

int main() {
    cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    uint32_t* out;
    cudaMalloc(&out, 4);
    const int kLayers = 8, kReps = 40;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    // launch overhead of a dependent chain of empty kernels
    cudaEventRecord(e0);
    for (int r = 0; r < kReps * kLayers; ++r) empty_kernel<<<264, 256>>>();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    const double empty_us = 1000.0 * ms / (kReps * kLayers);
    printf("empty kernel chain: %.2f us per launch\n", empty_us);
    for (int slots : {8192, 32768, 131072}) {
        const size_t n16 = size_t(slots) * G * D * 2 / 16;  // 16-byte pieces of K (or V) per layer
        std::vector<uint4*> ks(kLayers), vs(kLayers);
        for (int l = 0; l < kLayers; ++l) {
            cudaMalloc(&ks[l], n16 * 16);
            cudaMalloc(&vs[l], n16 * 16);
            cudaMemset(ks[l], 1, n16 * 16);
            cudaMemset(vs[l], 1, n16 * 16);
        }
        const double bytes = 2.0 * n16 * 16;
        const char* names[] = {"[slot][G][64], split-major grid", "[slot][G][64], head-major grid",
                               "[G][slot][64] (head contiguous)", "[slot][G][64], CTA = 32 whole slots"};
        for (int mode = 0; mode < 4; ++mode) {
            const dim3 grid = mode == 1 ? dim3(G, slots / kKeys) : dim3(slots / kKeys, G);
            for (int warm = 0; warm < 2; ++warm) {
                cudaEventRecord(e0);
                for (int r = 0; r < kReps; ++r)
                    for (int l = 0; l < kLayers; ++l) probe<<<grid, kThreads, kSmem>>>(ks[l], vs[l], slots, mode, out);
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
            }
            cudaEventElapsedTime(&ms, e0, e1);
            const double us = 1000.0 * ms / (kReps * kLayers);
            printf("slots %6d  %-38s %7.2f us per layer (%5.2f TB/s; less the empty launch %5.2f TB/s)\n", slots,
                   names[mode], us, bytes / us * 1e-6, bytes / (us - empty_us) * 1e-6);
        }
        for (int warm = 0; warm < 2; ++warm) {
            cudaEventRecord(e0);
            for (int r = 0; r < kReps; ++r)
                for (int l = 0; l < kLayers; ++l) {
                    stream_read<<<132 * 8, 256>>>(ks[l], n16, out);
                    stream_read<<<132 * 8, 256>>>(vs[l], n16, out);
                }
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
        }
        cudaEventElapsedTime(&ms, e0, e1);
        const double us = 1000.0 * ms / (kReps * kLayers);
        printf("slots %6d  %-38s %7.2f us per layer (%5.2f TB/s, two launches)\n", slots, "plain streaming read of K, V", us,
               bytes / us * 1e-6);
        for (int l = 0; l < kLayers; ++l) {
            cudaFree(ks[l]);
            cudaFree(vs[l]);
        }
    }
    const cudaError_t err = cudaGetLastError();
    printf("status: %s\n", cudaGetErrorString(err));
    return err == cudaSuccess ? 0 : 1;
}
