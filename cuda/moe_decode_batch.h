// cuda/moe_decode_batch.h - the routed MXFP4 GEMM of the batched decode step (moe_decode_batch.cu;
// issue 13): one launch per expert GEMM (gate_up + SwiGLU, or down) over (route tile of <= 16
// pairs, 16-row slab) work items. One CTA per SM takes a contiguous range of items (a static
// schedule: no counters, no atomics), stages up to two tiles' activation rows in shared memory at
// a time, and each warp sums whole slabs alone, so an expert slab's weights are read and
// dequantized once for up to 16 of its pairs. A pair's output depends only on its own row, expert
// and K (batch invariance); the summation order is this kernel's own, not gemm()'s.
#pragma once

#include "cuda/kernels.h"

namespace gptoss {
namespace cuda {

// w: MXFP4 experts [N, K] (K % 64 == 0; SwiGLU: N % 16 == 0; 16 x K bf16 rows must fit a CTA's
// shared memory). x: bf16 permuted rows; pair p reads row p / route.in_div. route: router_route's
// tiles with route.tile_tokens <= 16 (tiles[0] read on the device), route.max_tiles >= the tiles in
// use. epilogue kSwiglu (out_bf16 permuted [pairs, N/2], ldo = N/2) or kStore (out_f32 [pairs,
// ldo]); kAdd is refused. ctas: CTAs of the grid, 0 = as many as fit on the device at once (one
// per SM; two of 8 warps each with GPTOSS_DECODE_BATCH_MOE_WARPS=8). GPTOSS_DECODE_BATCH_MOE_WARPS
// = 8, 16, 20 or 24 and GPTOSS_DECODE_BATCH_MOE_DEPTH = 4, 6, 8 or 12 force the CTA size and the
// weight chunks in flight per warp (default 16 warps of 12 for up to 16 route tiles, 20 of 6 up to
// 36, else 24 of 4; the same bits). Errors: INTERNAL naming the unsupported shape, tile size, epilogue or missing
// buffer.
[[nodiscard]] gptoss_status moe_batch_gemm(const GemmWeights& w, const uint16_t* x, const GemmRoute& route,
                                           Epilogue epilogue, float* out_f32, uint16_t* out_bf16, uint32_t ldo,
                                           float swiglu_limit, uint32_t ctas, cudaStream_t stream);

// Tests and tuning: the ring depth (4, 6, 8 or 12) and the warps per CTA (8, 16, 20 or 24; 8 = two
// CTAs per SM, more = one CTA per SM) that moe_batch_gemm uses, 0 = automatic (or
// GPTOSS_DECODE_BATCH_MOE_DEPTH / _WARPS). The bits do not depend on either. Set it only while no
// batched step runs.
void set_moe_batch_shape(int depth, int warps = 0);

// Whether the batched step runs its MoE through moe_batch_gemm (default) or gemm() (one CTA per
// route tile of 8 pairs and slab): GPTOSS_DECODE_BATCH_MOE_WIDE=0 (read once). H200, 20b, v20's
// form against gemm() with the same attention: +5.8 % decode tok/s at 64 streams, equal at 8, -14 %
// for one stream alone; v22's CTA change then gave +9 % at 64 streams and +10 % alone
// (bench/NOTES.md "v20 batched decode", "v22 batched MoE"). The two give different bits: a
// process keeps one.
bool moe_batch_enabled();

}  // namespace cuda
}  // namespace gptoss
