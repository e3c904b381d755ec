// cuda/multi_gpu.h - the collectives a rank of a split model runs inside its forward pass
// (cuda/backend.cu calls them where gptoss-shard.h says), and the sharded backend's entry
// points beyond cuda/backend.h. Implemented with NCCL in cuda/multi_gpu.cu; built without NCCL, every
// function fails with UNSUPPORTED.
#pragma once

#include "cuda/backend.h"
#include "cuda/kernels.h"

#include <cuda_runtime.h>

namespace gptoss {
namespace cuda {

// In place on `stream`: x (fp32 [count], device memory of this rank) = the sum of every rank's
// x. `comm` is the rank's ncclComm_t. Capturable in a CUDA graph.
[[nodiscard]] gptoss_status rank_all_reduce(void* comm, float* x, size_t count, cudaStream_t stream);

// Decode's all-reduce of `count` floats folded into the kernel that needs it (kernels.h
// LlReduce): true with *out set to the next staging slot (rank_all_reduce's slot sequence) when
// the rank runs lsa mode (cuda/rank_comm.h), collectives are not skipped (gptoss-bench
// --no-collectives) and 2 · n_ranks · count <= kLsaMaxFloats; else false: use rank_all_reduce.
bool rank_ll_reduce(void* comm, size_t count, LlReduce* out);

// In place on `stream`: buf (fp32 [n_ranks · count]) receives every rank's slice
// [rank·count, (rank+1)·count), this rank's own slice being its input.
[[nodiscard]] gptoss_status rank_all_gather(void* comm, float* buf, size_t count, cudaStream_t stream);

// True when a CUDA session's decode at `pos` only replays its captured graph.
bool decode_replays(const BackendSession* session, uint32_t pos);

// cuda::profile_forward() for a sharded session: every rank runs it; the ops of rank 0 are
// reported (a collective's time includes waiting for the other ranks).
[[nodiscard]] gptoss_status sharded_profile(BackendSession* session, const int32_t* tokens, uint32_t n, uint32_t pos,
                                            bool decode, std::vector<std::pair<std::string, double>>* ms_by_op);

// cuda::synchronize() for a sharded session: waits for every rank's stream.
[[nodiscard]] gptoss_status sharded_synchronize(BackendSession* session);

}  // namespace cuda
}  // namespace gptoss
