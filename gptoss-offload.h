// gptoss-offload.h - MoE experts in host memory (issue 16): which layers keep their MXFP4
// experts in host RAM when the GPU is smaller than the model. The caller's request comes from
// gptoss_model_params (n_cpu_moe, gpu_memory_budget, fit_context); the CUDA backend measures
// the device bytes of each part of its own layout (OffloadSizes) and plan_offload() turns the
// two into a number of host layers (the first ones, as llama.cpp's --n-cpu-moe) or a clear
// OUT_OF_MEMORY / INVALID_ARGUMENT. Pure arithmetic, no CUDA: tests/test-offload.cpp checks it
// with the real 20b and 120b sizes. The compute side is cpu/host_experts.h (the CPU kernels)
// and cuda/host_moe.cu (the backend's host-expert storage, decode callbacks and streaming).
#pragma once

#include "gptoss.h"

#include <cstdint>
#include <string>

namespace gptoss {

struct OffloadRequest {
    int32_t n_cpu_moe = 0;           // 0 none, 1..n_layers the first N, GPTOSS_CPU_MOE_AUTO fit the budget
    uint64_t gpu_memory_budget = 0;  // bytes; 0: the device's free memory less kCudaContextReserve
    uint32_t fit_context = 0;        // tokens of KV cache the auto split keeps room for; 0: kDefaultFitContext
};

constexpr uint64_t kCudaContextReserve = 512ull << 20;  // left free for the context, cuBLASLt, graphs
constexpr uint32_t kDefaultFitContext = 32768;

// Device bytes of a model as a function of how many layers keep their experts in host memory.
struct OffloadSizes {
    uint32_t n_layers = 0;
    uint64_t fixed = 0;         // all but the experts' MXFP4 blocks and scales (embeddings, lm_head,
                                // attention, router, norms, every layer's expert biases)
    uint64_t expert_layer = 0;  // one layer's experts (MXFP4 blocks + scales) on the device
    uint64_t streaming = 0;     // buffers that stream one host layer's experts to the GPU for long
                                // prefill chunks; needed once any layer is on the host
    uint64_t session = 0;       // one session of fit_context tokens with the default max_batch
};

// Device bytes of the weights and streaming buffers with `n_host` host layers (no session).
uint64_t offload_weight_bytes(const OffloadSizes& sizes, uint32_t n_host);

// Checks the request against the model: n_cpu_moe in {GPTOSS_CPU_MOE_AUTO, 0..n_layers}.
// INVALID_ARGUMENT naming the field otherwise.
[[nodiscard]] gptoss_status check_offload_request(const OffloadRequest& request, uint32_t n_layers);

// The budget in bytes: the request's, or free_bytes less kCudaContextReserve (0 if less).
uint64_t offload_budget(const OffloadRequest& request, uint64_t free_bytes);

// Chooses *n_host for `request` against `budget` (offload_budget's): a fixed n_cpu_moe is
// taken as given but must fit (weights + streaming + one session ≤ budget) when the caller set
// a budget or asked for host layers; AUTO takes the fewest layers that fit. When nothing fits,
// OUT_OF_MEMORY saying what the model needs at the least (all experts in host memory), what
// each part takes, and the budget; `model` names it in the message ("gpt-oss-120b").
[[nodiscard]] gptoss_status plan_offload(const OffloadSizes& sizes, const OffloadRequest& request, uint64_t budget,
                                         const std::string& model, uint32_t* n_host);

// "%.2f GB" of bytes / 1e9, for the messages and the load report.
std::string gigabytes(uint64_t bytes);

}  // namespace gptoss
