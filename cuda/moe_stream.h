// cuda/moe_stream.h - the decode step's routed MXFP4 GEMVs (gate_up + SwiGLU, down) as a
// streaming kernel (issue 12): one CTA per SM, each with a fixed contiguous range of the step's
// (route tile, 16-row slab) items, whose weights arrive by bulk asynchronous copies (cp.async.bulk
// + mbarrier) into a shared-memory stage per 4-warp group. Same arithmetic and summation order
// as gemm_decode's 4-warp MXFP4 variant (kernels.h DecodeTuning::fp4), so the same bits. Design,
// floor and measurements: moe_stream.cu's header, bench/NOTES.md "v31".
#pragma once

#include "cuda/kernels.h"

namespace gptoss {
namespace cuda {

// Groups of 4 warps per CTA (each with `stages` shared-memory stages of one item) and the
// shared-memory budget they are fitted into: `budget_kb` 0 = half of what a CTA may opt in to,
// so the next routed GEMV's CTA fits beside this one's (down's copies start during gate_up).
struct MoeStreamPlan {
    uint32_t groups = 0;  // 1..4; 0 = the stream kernel cannot run this call
    uint32_t stages = 1;
    size_t smem = 0;  // dynamic shared memory per CTA, bytes
};
MoeStreamPlan moe_stream_plan(uint32_t K, uint32_t x_rows, uint32_t stages, uint32_t budget_bytes);

// Whether decode takes the stream kernel for the routed MXFP4 GEMV with this epilogue (kSwiglu:
// gate_up, else down): on sm_90+, as GPTOSS_DECODE_MOE_STREAM's bits say (1 gate_up, 2 down;
// A/B runs); set_moe_stream(mask) overrides (tests), -1 restores.
bool moe_stream_enabled(Epilogue epilogue);
void set_moe_stream(int mask);
// Tests: every call takes `groups` (1-4) groups of `stages` (1-3) stages where they fit the
// opt-in maximum (else the default plan); 0 restores the default plan.
void set_moe_stream_plan(uint32_t groups, uint32_t stages);

// Whether moe_stream_decode runs this call's shapes on this device (MXFP4, N % 16 == 0, at most
// 64 route tiles, the rows and stages within the shared-memory budget, sm_90+).
bool moe_stream_fits(const GemmWeights& w, uint32_t x_rows, const GemmRoute& route);

// out = the routed GEMV of one token's K pairs, as gemm_decode(w, x, route, route_ready, ...)
// with the 4-warp MXFP4 variant, bit for bit. w: MXFP4 experts (K % 64 == 0, K <= 4096,
// N % 16 == 0); x: bf16 permuted [x_rows, K], row pair / route.in_div; route: a T = 1 route (at
// most 64 tiles of one pair each; tiles / pairs device memory, written before this launch or,
// with route_ready, final before the previous kernel's dependency wait); epilogue kSwiglu (bf16
// out_bf16[pair, permuted row / 2], ldo elements per row) or kStore (fp32 out_f32[pair, row]).
// Errors: INTERNAL for shapes or epilogues outside those, UNSUPPORTED below compute
// capability 9.0.
[[nodiscard]] gptoss_status moe_stream_decode(const GemmWeights& w, const uint16_t* x, uint32_t x_rows,
                                              const GemmRoute& route, bool route_ready, Epilogue epilogue,
                                              float* out_f32, uint16_t* out_bf16, uint32_t ldo, float swiglu_limit,
                                              cudaStream_t stream);

}  // namespace cuda
}  // namespace gptoss
