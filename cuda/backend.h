// cuda/backend.h - CUDA-backend entry points beyond gptoss-internal.h's create_cuda_backend,
// for gptoss-bench and the tests: a model of random weights built directly in GPU memory (a
// 120b-shaped file does not fit the GPU machine's disk), per-op timing of one forward, and the
// hardware ceilings (copy bandwidth, streaming read, bf16 tensor-core rate) measured in-run.
// Plain C++ (no CUDA headers), so tools compiled by the host compiler can include it.
#pragma once

#include "gptoss-internal.h"
#include "gptoss-offload.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gptoss {
namespace cuda {

// Builds a backend for `config` with deterministic random weights (dense bf16 uniform with
// std ≈ 0.02, MXFP4 nibbles uniform with E8M0 scales 118..122, norms ≈ 1, small biases and
// sinks), directly in the device's memory. Fails with OUT_OF_MEMORY naming bytes needed/free.
[[nodiscard]] gptoss_status create_synthetic_backend(const Config& config, int32_t device, uint64_t seed,
                                                     std::unique_ptr<Backend>* out);

// Runs forward(tokens, n, pos) (or, with `decode`, decode(tokens[0], pos), n = 1) on `session`
// (a CUDA session) without the decode graph, timing every op with events; appends (op name,
// total ms over layers) in first-seen order.
[[nodiscard]] gptoss_status profile_forward(BackendSession* session, const int32_t* tokens, uint32_t n,
                                            uint32_t pos, bool decode,
                                            std::vector<std::pair<std::string, double>>* ms_by_op);

// create_synthetic_backend with the experts of some layers in host memory (issue 16,
// gptoss-offload.h): `request` as gptoss_model_params' n_cpu_moe / gpu_memory_budget /
// fit_context; the host layers' experts are random bytes in host memory.
[[nodiscard]] gptoss_status create_synthetic_backend(const Config& config, int32_t device, uint64_t seed,
                                                     const OffloadRequest& request, std::unique_ptr<Backend>* out);

// One rank of a model split over several GPUs (gptoss-shard.h says what each rank holds;
// cuda/multi_gpu.cu builds the ranks and owns their NCCL communicators).
struct RankInfo {
    uint32_t rank = 0, n_ranks = 1;
    uint32_t lm_rows = 0;  // lm_head rows held (this rank's logits start at rank·lm_rows); 0: all V
};

// create_cuda_backend / create_synthetic_backend for one rank: `checkpoint` / `config` are the
// rank's (make_shard_checkpoint / shard_config). Its sessions run as the single-GPU path until
// set_session_comm() gives them a communicator.
// `request` (single GPU only): experts in host memory, as create_cuda_backend's.
[[nodiscard]] gptoss_status create_rank_backend(const Checkpoint& checkpoint, int32_t device, const RankInfo& rank,
                                                const ProgressFn& progress, std::unique_ptr<Backend>* out,
                                                const OffloadRequest* request = nullptr);
[[nodiscard]] gptoss_status create_synthetic_rank_backend(const Config& config, int32_t device, uint64_t seed,
                                                          const RankInfo& rank, std::unique_ptr<Backend>* out);
// Gives a session of a rank backend its ncclComm_t (borrowed; it must outlive the session's
// work). From then on its forward passes all-reduce the residual stream after attention and
// after the MoE, and all-gather the logits. Fails with INVALID_ARGUMENT for a non-CUDA session.
[[nodiscard]] gptoss_status set_session_comm(BackendSession* session, void* comm);
// The buffers a rank's collectives read and write (the residual x and its decode alternate, the
// K expert outputs, the logits): session_collective_bytes() says how many bytes they take (the
// same on every rank of one model and max_batch), place_session_collectives() moves them to
// `base` (device memory of the session's GPU, that many bytes, 256-byte aligned, e.g. NCCL
// symmetric memory; borrowed, zeroed here on the session's stream). Call before the first forward.
size_t session_collective_bytes(BackendSession* session);
[[nodiscard]] gptoss_status place_session_collectives(BackendSession* session, char* base);

// A model split over devices[0..n) (n >= 2, gptoss-shard.h) with random weights per rank, as
// create_synthetic_backend builds them (speed only: the ranks' weights are not slices of one
// model). UNSUPPORTED when built without NCCL.
[[nodiscard]] gptoss_status create_sharded_synthetic_backend(const Config& config, const int32_t* devices, size_t n,
                                                             uint64_t seed, std::unique_ptr<Backend>* out);

// Timing only (gptoss-bench --no-collectives): the ranks of split models skip their collectives
// from now on, so they compute wrong results at the speed free communication would give.
void debug_skip_collectives(bool skip);

// Waits for all work queued on the session's stream (every rank's, for a split model).
[[nodiscard]] gptoss_status synchronize(BackendSession* session);

struct DeviceCeilings {
    std::string name;
    int sm_count = 0;
    double memory_gib = 0;
    double copy_gbps = 0;      // device-to-device copy, bytes read + written per second / 1e9
    double read_gbps = 0;      // streaming read kernel
    double bf16_tflops = 0;    // cuBLASLt bf16 GEMM, 8192³ (fp32 accumulate)
};
[[nodiscard]] gptoss_status measure_ceilings(int32_t device, bool with_gemm, DeviceCeilings* out);

}  // namespace cuda
}  // namespace gptoss
