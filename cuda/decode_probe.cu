// cuda/decode_probe.cu - the timing-only decode probe of decode_probe.h: the parsed
// GPTOSS_DECODE_PROBE list and the empty kernel that stands in for a skipped op.
#include "cuda/decode_probe.h"

#include "cuda/common.cuh"

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <string>

namespace gptoss {
namespace cuda {
namespace {

__global__ void decode_probe_empty_kernel() {
    pdl_wait();
    pdl_launch_dependents();
}

unsigned parse_probe(const char* s) {
    static const struct { const char* name; unsigned bit; } kOps[] = {
        {"qkv", unsigned(DecodeOp::kQkv)},         {"attn", unsigned(DecodeOp::kAttn)},
        {"o", unsigned(DecodeOp::kO)},             {"router", unsigned(DecodeOp::kRouter)},
        {"gate_up", unsigned(DecodeOp::kGateUp)},  {"down", unsigned(DecodeOp::kDown)},
        {"combine", unsigned(DecodeOp::kCombine)}, {"all", 127u},
        {"lm_head", unsigned(DecodeOp::kLmHead)},
    };
    unsigned mask = 0;
    std::string list = s ? s : "";
    size_t at = 0;
    while (at <= list.size() && !list.empty()) {
        const size_t end = std::min(list.find(',', at), list.size());
        const std::string name = list.substr(at, end - at);
        bool known = name.empty();
        for (const auto& op : kOps)
            if (name == op.name) { mask |= op.bit; known = true; }
        if (!known) std::fprintf(stderr, "gptoss: GPTOSS_DECODE_PROBE: unknown op \"%s\" ignored\n", name.c_str());
        at = end + 1;
    }
    if (mask) std::fprintf(stderr, "gptoss: GPTOSS_DECODE_PROBE=%s: decode ops emptied, timing only\n", s);
    return mask;
}

}  // namespace

bool decode_probe_skips(DecodeOp op) {
    static const unsigned mask = parse_probe(std::getenv("GPTOSS_DECODE_PROBE"));
    return (mask & unsigned(op)) != 0;
}

gptoss_status decode_probe_empty(cudaStream_t stream) {
    GPTOSS_TRY(cuda_status(launch_pdl(decode_probe_empty_kernel, dim3(1), dim3(32), 0, stream), "decode_probe_empty_kernel",
                           __FILE__, __LINE__));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
