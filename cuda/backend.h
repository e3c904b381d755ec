// cuda/backend.h - CUDA-backend entry points beyond gptoss-internal.h's create_cuda_backend,
// for gptoss-bench and the tests: a model of random weights built directly in GPU memory (a
// 120b-shaped file does not fit the GPU machine's disk), per-op timing of one forward, and the
// hardware ceilings (copy bandwidth, streaming read, bf16 tensor-core rate) measured in-run.
// Plain C++ (no CUDA headers), so tools compiled by the host compiler can include it.
#pragma once

#include "gptoss-internal.h"

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

// Waits for all work queued on the session's stream.
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
