// cuda/dense_batch.h - the dense bf16 projections of the batched decode step (QKV, O + residual,
// lm_head; dense_batch.cu; issue 13), with gemm()'s bits. gemm() at 64 tokens reads the whole
// activation block once per 16-row weight slab (4x the weight bytes from L2 for QKV and lm_head,
// 4.4x for O), and that L2 traffic set its time (bench/NOTES.md "v21 batched dense"). Here a CTA
// owns 4 or 8 slabs and one of gemm()'s 4 K parts (its warp split: chunks p, p + 4, ...); per
// 64-k chunk it stages the slabs' weights and the chunk of up to 64 token rows in shared memory
// (cp.async), so each activation byte leaves L2 once per 4-8 slabs. The 4 parts of a slab group
// are one thread-block cluster and add their fp32 partial tiles through distributed shared memory
// in gemm()'s order. Same bits as gemm() at any token count: the batched step picks the faster
// kernel per projection and step size without breaking batch invariance. On sm_90 QKV and O fill
// their stages with one 2-D tensor-map copy of the token rows and one bulk copy per slab instead
// (set_dense_batch_tma; bench/NOTES.md "v35").
#pragma once

#include "cuda/kernels.h"

namespace gptoss {
namespace cuda {

// How dense_batch_gemm tiles a weight of N rows: 4 warps of 1 slab, or of 2 slabs from 4096 slabs on
// (lm_head), unless set_dense_batch_shape or GPTOSS_DECODE_BATCH_DENSE_WARPS / _SPW force a shape.
struct DenseBatchPlan {
    uint32_t warps = 0;          // per CTA: 4 or 8
    uint32_t slabs_per_cta = 0;  // 16-row weight slabs per CTA: warps × slabs per warp (1 or 2)
    uint32_t groups = 0;         // ceil(ceil(N / 16) / slabs_per_cta); the grid is groups × 4 × ceil(n / cols)
    uint32_t cols = 0;           // token columns per CTA: 64, or 32 where groups × 4 CTAs would not give
                                 // each of the device's `sms` SMs two (O: twice the CTAs, each weight
                                 // chunk read by two), unless forced (GPTOSS_DECODE_BATCH_DENSE_COLS)
    uint32_t split = 1;          // warps per slab, each taking half the column groups (2: 4-warp CTAs
                                 // only, set_dense_batch_split / GPTOSS_DECODE_BATCH_DENSE_SPLIT)
};
DenseBatchPlan dense_batch_plan(uint32_t N, uint32_t sms = 0);

// out[t, r] (=, or += for kAdd) Σ_k x[t, k] · W[r, k] + bias[r] for t < n, bit-identical to
// gemm(w, x, n, nullptr, epilogue, out_f32, nullptr, ldo, 0, nb, stream) for any nb: w bf16 dense
// (not MXFP4, not routed) in repack.cu's fragment layout, K % 64 == 0; x bf16 permuted rows [n, K];
// out_f32 fp32 [n, ldo], ldo >= N; epilogue kStore or kAdd. Needs thread-block clusters (compute
// capability 9.0+; dense_batch_supported). Errors: INTERNAL naming the unsupported weight,
// epilogue, argument or device.
[[nodiscard]] gptoss_status dense_batch_gemm(const GemmWeights& w, const uint16_t* x, uint32_t n, Epilogue epilogue,
                                             float* out_f32, uint32_t ldo, cudaStream_t stream);

// Whether the current device runs dense_batch_gemm (compute capability 9.0+, for the clusters).
bool dense_batch_supported();

// The projections of the batched step, as bits of GPTOSS_DECODE_BATCH_DENSE and of dense_batch_use's
// `which`.
constexpr uint32_t kDenseQkv = 1;
constexpr uint32_t kDenseO = 2;
constexpr uint32_t kDenseLmHead = 4;
constexpr uint32_t kDenseAll = kDenseQkv | kDenseO | kDenseLmHead;

// Whether the batched step runs projection `which` (kDenseQkv, kDenseO or kDenseLmHead) of a step of
// n tokens through dense_batch_gemm rather than gemm() (the same bits either way): the projection's
// bit in GPTOSS_DECODE_BATCH_DENSE (read once; default kDenseBatchMask) and n >=
// GPTOSS_DECODE_BATCH_DENSE_MIN (default kDenseBatchMinTokens, kDenseBatchMinTokensLmHead for
// lm_head); never on a device without clusters. Below the threshold QKV and O take gemm() at 2
// column tiles per CTA from 9 tokens (cuda/batch_decode.cu proj_nb). H200, 20b, steps of 12
// tokens (bench/NOTES.md "v23"): lm_head 0.339 ms per step on gemm() at 8 column tiles, 0.281 on
// dense_batch_gemm; QKV / O 0.419 / 0.470 at 8 tiles, 0.419 / 0.380 on dense_batch_gemm, 0.343 /
// 0.320 at 2 tiles.
constexpr uint32_t kDenseBatchMask = kDenseAll;  // all three (bench/NOTES.md "v21 batched dense")
constexpr uint32_t kDenseBatchMinTokens = 16;
constexpr uint32_t kDenseBatchMinTokensLmHead = 9;
bool dense_batch_use(uint32_t which, uint32_t n);

// Tests and tuning: force the CTA shape, warps 4 or 8, slabs per warp 1 or 2, token columns 32 or
// 64 (0 = the defaults, GPTOSS_DECODE_BATCH_DENSE_WARPS / _SPW / _COLS). The bits do not depend on
// it. Set it only while no batched step runs.
void set_dense_batch_shape(uint32_t warps, uint32_t spw, uint32_t cols = 0);

// Tests and tuning: which CTA plans fill their stages with tensor-map and bulk copies (TMA) rather
// than per-thread cp.async: 0 none, 1 plans of one slab per warp (QKV, O; the default), 2 all
// (lm_head too), -1 = GPTOSS_DECODE_BATCH_DENSE_TMA (default 1). Where the driver cannot encode the
// tensor map the launch falls back to cp.async. The bits do not depend on it. Set it only while no
// batched step runs.
void set_dense_batch_tma(int mode);

// Tests and tuning: warps per 16-row slab, 1 or 2 (0 = GPTOSS_DECODE_BATCH_DENSE_SPLIT, default
// 1). At 2 a CTA of 4 slabs runs 8 warps, each slab's two taking 4 of the 8 column groups: twice
// the warps per SM on the same stages (v31-v36 saw QKV and O latency-bound at ~2.5 CTAs of 4 warps
// per SM). Each output is still one warp's chain over the same chunks: the bits do not depend on
// it. Not yet measured (bench/NOTES.md "v38"). Set it only while no batched step runs.
void set_dense_batch_split(uint32_t split);

// Tests and tuning: pipeline stages per CTA, 2, 3 or 4 (0 = the plan's default: 4 for one slab per
// warp, 3 for two; GPTOSS_DECODE_BATCH_DENSE_STAGES), fewer where the device's shared memory is
// short. The bits do not depend on it. Set it only while no batched step runs.
void set_dense_batch_stages(int stages);

}  // namespace cuda
}  // namespace gptoss
