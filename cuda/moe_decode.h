// cuda/moe_decode.h - the persistent MoE decode kernel (moe_decode.cu): the routed MXFP4 expert
// projections of one token (gate_up + SwiGLU, then down) in ONE launch over (tile, slab) work
// items, with per-tile ready counters in global memory instead of the kernel boundary between
// gate_up and down. Bit-identical to gemm_decode(gate_up, kSwiglu) followed by
// gemm_decode(down, kStore) with the same DecodeGemv variant (same per-item arithmetic, same
// fixed summation order; every output written by exactly one item; no floating-point atomics).
#pragma once

#include "cuda/kernels.h"

namespace gptoss {
namespace cuda {

// Device ints moe_decode needs in `counters` (zero before the first call; the kernel re-arms
// them when it finishes).
constexpr uint32_t kMoeDecodeCounters = 16;
constexpr uint32_t kMoeDecodeMaxTiles = kMoeDecodeCounters - 2;

// gate_up: MXFP4 experts, N = 2I (regrouped gate/up rows, N % 16 == 0), K = H. down: MXFP4
// experts, N = H, K = I. x: bf16 permuted [H] (the MLP-normed row). route: a T = 1 route (one
// pair per tile: router_decode's), route.in_div = the slots K (gate_up's input row is pair /
// in_div; down's input row and the output row are the pair). act: bf16 permuted [K, I] scratch
// (the SwiGLU output, written and read inside the launch). part: fp32 [K, H] (the expert outputs,
// as gemm_decode kStore with ldo = H). counters: kMoeDecodeCounters device ints (see above), used
// by one launch at a time. ctas: CTAs of the grid, 0 = as many as fit on the device at once; a
// given value must fit at once too (each CTA's first item is its blockIdx.x, later items come in
// order from a global counter, every gate_up item before any down item, so a waiting down item
// only waits on items that running CTAs hold).
struct MoeDecodeArgs {
    GemmWeights gate_up, down;
    const uint16_t* x = nullptr;
    GemmRoute route;
    uint16_t* act = nullptr;
    float* part = nullptr;
    float swiglu_limit = 0.0f;
    int* counters = nullptr;
    uint32_t ctas = 0;
};

// Whether moe_decode runs for these shapes and this variant (the shapes moe_decode accepts, route.max_tiles
// <= kMoeDecodeMaxTiles, a compiled variant). Honours GPTOSS_DECODE_MOE (0 = off; default below).
bool moe_decode_enabled(const MoeDecodeArgs& args, const DecodeGemv& variant);
// Errors: INTERNAL for unsupported shapes / variants / missing buffers (naming them).
[[nodiscard]] gptoss_status moe_decode(const MoeDecodeArgs& args, const DecodeGemv& variant, cudaStream_t stream);

}  // namespace cuda
}  // namespace gptoss
