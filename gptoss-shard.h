// gptoss-shard.h - how a model is split over several GPUs, in plain C++ (no CUDA, so CI tests
// it): the device-list checks behind gptoss_model_params.devices, the split of the attention
// heads, the expert width and the vocabulary over the ranks, and the per-rank checkpoint view
// that the unchanged single-GPU loader uploads.
//
// The split (n ranks, rank r):
//   attention  tensor parallel by kv head: rank r holds kv heads [r·G/n, (r+1)·G/n) and their
//              query heads (QKV rows split, "column parallel"), and the matching Q·D/n columns
//              of o_proj ("row parallel"); o_proj's bias lives on rank 0 only. The sum over
//              ranks of each rank's o_proj output is the full o_proj output.
//   MoE        every rank holds every expert, but only a slice [i0, i1) of its intermediate
//              width I (gate_up rows 2·i0..2·i1, down_proj columns i0..i1; down_proj's bias on
//              rank 0 only). SwiGLU is elementwise over I, so the sum over ranks of each rank's
//              MoE output is the full output. This is tensor-parallel MoE rather than expert
//              parallel: at batch 1 each token's 4 experts split evenly over the GPUs (expert
//              parallel would leave e.g. 3 on one GPU and 1 on the other), and the router's
//              choices need no exchange. The slices are multiples of 64 (the kernels' tile).
//   lm_head    rank r holds vocabulary rows [r·R, (r+1)·R), R = V/n rounded up to 64; rows past
//              V are zero (their logits are never sampled).
//   replicated the embedding, the norms and the router (small), so every rank keeps the
//              residual stream x itself after each all-reduce (two per layer: after o_proj and
//              after the MoE; cuda/backend.cu).
#pragma once

#include "gptoss-internal.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace gptoss {

// Checks a device list as given in gptoss_model_params: n >= 1, devices != NULL, every entry a
// CUDA ordinal in [0, device_count), no device twice. Fails with INVALID_ARGUMENT naming the
// entry ("params.devices[1] is 0, the same GPU as params.devices[0]...") or UNSUPPORTED when
// device_count is 0.
[[nodiscard]] gptoss_status validate_devices(const int32_t* devices, size_t n, int device_count);

// One rank's part of the model. Ranges are half-open, in units of the full model's indices.
struct ShardRange {
    uint32_t q_head0 = 0, n_q_heads = 0;   // query heads
    uint32_t kv_head0 = 0, n_kv_heads = 0; // kv heads
    uint32_t i0 = 0, n_i = 0;              // expert intermediate columns
    uint32_t vocab0 = 0, n_vocab = 0;      // lm_head rows held (the last rank's may pass V: zeros)
};

struct ShardPlan {
    uint32_t n_ranks = 1;
    uint32_t lm_rows = 0;                  // lm_head rows per rank (a multiple of 64), n·lm_rows >= V
    std::vector<ShardRange> ranks;
};

// Splits `config` over n ranks. Fails with UNSUPPORTED naming the dimension that does not split
// (kv heads not divisible by n, fewer than n 64-wide slices of the expert width).
[[nodiscard]] gptoss_status plan_shards(const Config& config, uint32_t n, ShardPlan* out);

// The config rank `rank` runs as if it were the whole model: n_heads, n_kv_heads and
// intermediate of its slice; everything else (vocab, hidden, experts) unchanged.
Config shard_config(const Config& config, const ShardRange& range);

// A checkpoint view of one rank's weights: tensors with the shard's shapes, pointing into the
// full checkpoint's mapping where the slice is contiguous, else into host buffers owned here
// (o_proj columns, down_proj columns, zero biases on ranks > 0, the zero-padded lm_head tail).
// The lm_head tensor has plan.lm_rows rows. Lives as long as both itself and `full`.
struct ShardCheckpoint {
    Checkpoint checkpoint;                 // config = shard_config(); files empty
    std::vector<std::vector<uint8_t>> owned;
};

// Builds rank `rank`'s view of `full`. Host memory: for 120b about 9.6 GB per rank (the down
// projections' column slices), so build, upload and drop one rank at a time.
[[nodiscard]] gptoss_status make_shard_checkpoint(const Checkpoint& full, const ShardPlan& plan, uint32_t rank,
                                                  std::unique_ptr<ShardCheckpoint>* out);

#ifdef GPTOSS_HAVE_CUDA
// cuda/multi_gpu.cu: a backend over devices[0..n) (n >= 2, validated), NCCL between them.
// Fails with UNSUPPORTED when the library was built without NCCL.
[[nodiscard]] gptoss_status create_sharded_cuda_backend(const Checkpoint& checkpoint, const int32_t* devices,
                                                        size_t n, const ProgressFn& progress,
                                                        std::unique_ptr<Backend>* out);
#endif

}  // namespace gptoss
