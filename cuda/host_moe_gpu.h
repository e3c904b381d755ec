// cuda/host_moe_gpu.h - the GPU's share of a host layer's decode experts (issue 16; bench/NOTES.md
// "v18 host experts: the GPU's share"). In a host layer's decode step (one token) the CPU streams
// the K chosen experts' MXFP4 weights from host memory, and each core reads them at only 4-8 GB/s
// while it computes (v16: 16 cores ~55-90 GB/s against a streaming read of 130-160 GB/s); the GPU
// meanwhile waits. Here the GPU computes the last `slots` of the K chosen experts itself, reading
// their weights in the checkpoint layout straight from the pinned store, mapped into its address
// space (zero-copy over PCIe), while the CPU computes the others: the two read the same host
// memory by different paths, and the layer takes max(CPU on K - slots experts, GPU on slots)
// instead of the CPU on all K. Arithmetic (fp32; cpu::moe's composition, as the CPU path): per
// 32-element block Σ E2M1(nibble) · x, times the block's 2^(s-127), summed over blocks; + the bf16
// bias; gate/up = even/odd rows; swiglu as cpu::swiglu (gate ≤ limit, |up| ≤ limit, gate ·
// σ(1.702 gate) · (up + 1)) rounded to bf16 as the GPU kernels store it; then the down projection
// and its bias. Equal to the reference up to fp32 summation order (tests/test-kernels-hostmoe-gpu.cu).
// How many experts the GPU takes is fixed per process (results depend on it at the bf16 tolerance:
// the CPU path quantizes activations to int8), from the GPU's PCIe link, not from a timing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss {
namespace cuda {

// One host layer's experts in the checkpoint layout, as device-accessible (mapped) pointers:
// gate_up blocks u8 [E, 2I, H/32, 16], scales u8 [E, 2I, H/32], bias bf16 [E, 2I]; down blocks
// u8 [E, H, I/32, 16], scales u8 [E, H, I/32], bias bf16 [E, H]. Scale bytes ≤ 128 (copy_layer
// checks it), so every block factor is finite.
struct HostExpertsView {
    const uint8_t* gu_blocks;
    const uint8_t* gu_scales;
    const uint16_t* gu_bias;
    const uint8_t* dn_blocks;
    const uint8_t* dn_scales;
    const uint16_t* dn_bias;
};

// Experts of slots [slot0, slot0 + slots) of one token: xn bf16 [H] in the GEMMs' permuted_k
// order (device), experts int32 [K] (device; ids < E, as the router writes them) → part fp32
// [K, H] (device), rows slot0 .. slot0 + slots - 1 only, UNWEIGHTED (as cpu::host_moe_experts's
// output: the combine applies the router weights). h: device scratch fp32 [slots, I]. H a
// multiple of 64 (the permuted layout), I of 32, both ≤ kHostGpuMaxH. Two kernels on `stream` (capturable).
// cudaErrorInvalidValue for shapes outside those limits or slots == 0.
constexpr uint32_t kHostGpuMaxH = 8192;  // the activation row lives in shared memory (32 KB)
[[nodiscard]] cudaError_t launch_host_gpu_experts(const HostExpertsView& w, const uint16_t* xn,
                                                  const int32_t* experts, uint32_t slot0, uint32_t slots,
                                                  uint32_t H, uint32_t I, float swiglu_limit, float* h,
                                                  float* part, cudaStream_t stream);

// The default share of a one-token step's K experts for `device`: the GPU reads ~47 GB/s over a
// PCIe 5.0 x16 link (bench/NOTES.md v18) and a 16-core server computes the CPU path at 45-90 GB/s,
// so there the GPU takes K / 2; over slower or narrower links (PCIe 4.0 x16: ~25 GB/s, against a
// desktop's ~50 GB/s of CPU) K / 4, and at least 1. The link is the maximum NVML reports
// (libnvidia-ml.so.1, opened at run time: the driver's library); where NVML cannot tell, K / 4.
// `link` receives e.g. "PCIe 5 x16" or "PCIe link unknown".
uint32_t host_gpu_slots_default(int device, uint32_t K, char* link, size_t link_len);

}  // namespace cuda
}  // namespace gptoss
