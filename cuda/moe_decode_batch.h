// cuda/moe_decode_batch.h - the persistent routed MXFP4 GEMM of the batched decode step
// (moe_decode_batch.cu; issue 13): one launch per expert GEMM (gate_up + SwiGLU, or down) over
// (route tile, 16-row slab) work items, a grid of as many CTAs as fit at once, each CTA taking
// items blockIdx.x, blockIdx.x + gridDim.x, ... (a static schedule: no counters, no atomics).
// An item streams its expert slab's weights once for the tile's pairs (up to 16: route tiles of
// tile_tokens <= 16), dequantizing each chunk once for both 8-column groups, and requests the
// next item's first weight chunks before its own epilogue. Each item computes exactly what one
// CTA of gemm.cu computes for its (tile, slab) (same per-warp chunk order, same warp order in
// the reduction, same epilogue), so the outputs are bit-identical to gemm() with the same route
// and any nb — and a pair's output never depends on which other pairs share the step.
#pragma once

#include "cuda/kernels.h"

namespace gptoss {
namespace cuda {

// w: MXFP4 experts [N, K] (K % 64 == 0; SwiGLU: N % 16 == 0). x: bf16 permuted rows; pair p reads
// row p / route.in_div. route: router_route's tiles with route.tile_tokens <= 16 (tiles[0] read on
// the device), route.max_tiles >= the tiles in use. epilogue kSwiglu (out_bf16 permuted [pairs,
// N/2], ldo = N/2) or kStore (out_f32 [pairs, ldo]); kAdd is refused. mode 1: each lane streams
// its weight chunks through a 4-deep register ring; mode 2: each item's slab arrives in shared
// memory by bulk copies (cp.async.bulk + mbarrier, two stages: the next item's slab is in flight
// while this one computes); where mode 2 cannot run (compute capability < 9.0, unaligned weights,
// a slab too large for the stages) mode 1 runs instead. mode 3: the items cut into one contiguous
// range per CTA; per tile in its range a CTA stages the tile's activation rows in shared memory
// once and two groups of four warps walk its slabs (weights by register ring); where the rows do
// not fit two CTAs per SM, mode 1 runs instead (GPTOSS_DECODE_BATCH_MOE_DEPTH = 8: eight weight
// chunks in flight per warp instead of four, read once). Modes 1-3 give gemm()'s bits. mode 4
// (cuda/moe_batch_wide.cu, the batched step's default): mode 3's staging and schedule with 8 warps
// per CTA, each warp summing whole slabs alone (one dequantization per chunk for the whole tile,
// the epilogue from registers); its own summation order, batch-invariant but not gemm()'s bits
// (GPTOSS_DECODE_BATCH_MOE_DEPTH = 4, 8 or 12 forces its ring depth; same bits). ctas: CTAs of
// the grid, 0 = as many as fit on the device at once (GPTOSS_DECODE_BATCH_MOE_CTAS = CTAs per SM
// caps it). Errors: INTERNAL naming the unsupported shape, tile size, epilogue, mode or missing
// buffer.
[[nodiscard]] gptoss_status moe_batch_gemm(const GemmWeights& w, const uint16_t* x, const GemmRoute& route,
                                           Epilogue epilogue, float* out_f32, uint16_t* out_bf16, uint32_t ldo,
                                           float swiglu_limit, int mode, uint32_t ctas, cudaStream_t stream);

// Mode 4's ring depth for tests: 4, 8 or 12 forces it (the bits do not depend on it), 0 = automatic
// (GPTOSS_DECODE_BATCH_MOE_DEPTH, else 12 for route tiles <= 32, 8 above). Set it only while no
// batched step runs.
void set_moe_batch_wide_depth(int depth);

// Whether mode 2 runs for these weights on the current device (else moe_batch_gemm runs mode 1).
bool moe_batch_bulk_ok(const GemmWeights& w);

// How the batched step runs its MoE: 0 = gemm()'s one CTA per (route tile of 8 pairs, slab), 1, 2,
// 3 or 4 = moe_batch_gemm in that mode (route tiles of 16 pairs). GPTOSS_DECODE_BATCH_MOE_PERSIST (read
// once), default 4: H200, 20b, +12 % decode tok/s at 64 streams, +4 % at 8, -12 % for one stream
// alone against 0 (bench/NOTES.md "v20 batched MoE"); modes 1-3 were no faster than 0 (v16).
// Modes 0-3 give one set of bits, mode 4 another: a process keeps one mode (batch invariance).
int moe_batch_mode();
// From how many decode tokens a step uses moe_batch_mode() (fewer: gemm()):
// GPTOSS_DECODE_BATCH_MOE_MIN (read once), default 1.
uint32_t moe_batch_min_items();

}  // namespace cuda
}  // namespace gptoss
