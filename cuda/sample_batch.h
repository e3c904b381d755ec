// cuda/sample_batch.h - sampling every row of a batched decode step in one launch (issue 13,
// part 1): row i of fp32 logits [n, V] is sampled with its own session's SamplingConfig and u,
// and gets exactly the token cuda::sample() (the per-session sampler, cuda/sample.cu) gives for
// that row alone, so a session's tokens never depend on the batch. The row's tiles of 2048 ids
// are the cooperative sampler's CTA tiles: the same exact integer radix selects (one CTA per row)
// and the same fixed double scan tree (one CTA per tile, then one warp over the tile sums), so
// every decision is the same bit for bit. Rows it cannot do exactly are marked kSkip by make_sample_row and left to the
// per-session path (their token is -1).
#pragma once

#include "gptoss-internal.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss {
namespace cuda {

// One row's sampling parameters (device array, one per row).
struct SampleRow {
    enum Mode : int32_t { kSkip = 0, kGreedy = 1, kSample = 2 };
    double inv_t = 0.0;   // 1 / temperature, as cuda::sample computes it
    double top_p = 1.0;
    double u = 0.0;       // [0, 1)
    uint32_t top_k = 0;   // 0: no top_k (also for top_k >= V)
    uint32_t use_top_p = 0;
    int32_t mode = kSkip;
    int32_t pad = 0;
};

// The row for (config, u) over V logits: kGreedy for temperature <= 0, kSample where cuda::sample
// takes its cooperative path (fast_path: cuda::sample_fast_path(V)), else kSkip (non-finite
// temperature, u outside [0, 1), the sort fallback): the caller samples that row itself.
SampleRow make_sample_row(const SamplingConfig& config, double u, uint32_t V, bool fast_path);

// tokens[i] (device int32) = the token of row i (logits + i·ld, V fp32 values) with rows[i]
// (device array), or -1 for a kSkip row. Three launches on `stream` (the selects, one CTA per
// row; the walk, one CTA per (2048-id tile, row); the pick, one CTA per row); n <= 65535.
// scratch: device memory of sample_rows_scratch_bytes(n) bytes, 256-byte aligned, one call at a
// time. INTERNAL for bad arguments (V beyond 256 tiles included).
size_t sample_rows_scratch_bytes(uint32_t n);
[[nodiscard]] gptoss_status sample_rows(const float* logits, uint32_t V, size_t ld, const SampleRow* rows,
                                        uint32_t n, void* scratch, size_t scratch_bytes, int32_t* tokens,
                                        cudaStream_t stream);

}  // namespace cuda
}  // namespace gptoss
