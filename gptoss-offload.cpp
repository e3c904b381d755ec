// gptoss-offload.cpp - the host-expert split arithmetic of gptoss-offload.h: validation of
// gptoss_model_params' n_cpu_moe / gpu_memory_budget / fit_context, the budget, and the number
// of layers whose experts stay in host memory.
#include "gptoss-offload.h"

#include "gptoss-internal.h"

#include <cstdio>

namespace gptoss {

std::string gigabytes(uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GB", double(bytes) / 1e9);
    return buf;
}

uint64_t offload_weight_bytes(const OffloadSizes& sizes, uint32_t n_host) {
    const uint32_t n = n_host < sizes.n_layers ? n_host : sizes.n_layers;
    return sizes.fixed + uint64_t(sizes.n_layers - n) * sizes.expert_layer + (n > 0 ? sizes.streaming : 0);
}

gptoss_status check_offload_request(const OffloadRequest& request, uint32_t n_layers) {
    if (request.n_cpu_moe != GPTOSS_CPU_MOE_AUTO && (request.n_cpu_moe < 0 || uint32_t(request.n_cpu_moe) > n_layers))
        return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                    "params.n_cpu_moe: %d; expected 0 (all experts on the GPU), 1..%u (the first N layers' experts "
                    "in host memory) or GPTOSS_CPU_MOE_AUTO (-1)",
                    request.n_cpu_moe, n_layers);
    return GPTOSS_OK;
}

uint64_t offload_budget(const OffloadRequest& request, uint64_t free_bytes) {
    if (request.gpu_memory_budget != 0) return request.gpu_memory_budget;
    return free_bytes > kCudaContextReserve ? free_bytes - kCudaContextReserve : 0;
}

gptoss_status plan_offload(const OffloadSizes& sizes, const OffloadRequest& request, uint64_t budget,
                           const std::string& model, uint32_t* n_host) {
    GPTOSS_TRY(check_offload_request(request, sizes.n_layers));
    const uint32_t context = request.fit_context ? request.fit_context : kDefaultFitContext;
    auto total = [&](uint32_t n) { return offload_weight_bytes(sizes, n) + sizes.session; };
    if (request.n_cpu_moe != GPTOSS_CPU_MOE_AUTO) {
        const uint32_t n = uint32_t(request.n_cpu_moe);
        // No host layers and no budget of the caller's: today's behaviour, the allocations
        // themselves report what does not fit.
        if ((n > 0 || request.gpu_memory_budget != 0) && total(n) > budget)
            return fail(GPTOSS_ERR_OUT_OF_MEMORY,
                        "%s with the experts of %u of %u layers in host memory needs %s of GPU memory (%s weights "
                        "and streaming buffers + %s for a session of %u tokens); the budget "
                        "(params.gpu_memory_budget) is %s%s",
                        model.c_str(), n, sizes.n_layers, gigabytes(total(n)).c_str(),
                        gigabytes(offload_weight_bytes(sizes, n)).c_str(), gigabytes(sizes.session).c_str(), context,
                        gigabytes(budget).c_str(),
                        total(sizes.n_layers) <= budget ? "; params.n_cpu_moe = GPTOSS_CPU_MOE_AUTO finds a split that fits"
                                                        : "");
        *n_host = n;
        return GPTOSS_OK;
    }
    for (uint32_t n = 0; n <= sizes.n_layers; ++n)
        if (total(n) <= budget) {
            *n_host = n;
            return GPTOSS_OK;
        }
    return fail(GPTOSS_ERR_OUT_OF_MEMORY,
                "%s needs at least %s of GPU memory even with the experts of all %u layers in host memory (%s "
                "embeddings, attention and norms + %s streaming buffers + %s for a session of %u tokens "
                "(params.fit_context)); the budget (params.gpu_memory_budget) is %s",
                model.c_str(), gigabytes(total(sizes.n_layers)).c_str(), sizes.n_layers, gigabytes(sizes.fixed).c_str(),
                gigabytes(sizes.streaming).c_str(), gigabytes(sizes.session).c_str(), context,
                gigabytes(budget).c_str());
}

}  // namespace gptoss
