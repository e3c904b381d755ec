// tests/test-offload.cpp - the host-expert split arithmetic (gptoss-offload.h) and the public
// fields that drive it (gptoss_model_params.n_cpu_moe, gpu_memory_budget, fit_context) on the
// CPU backend. The GPU side (the backend's host layers) is tests/test-kernels-offload.cu.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "gptoss-offload.h"
#include "tests/test-util.h"

#include <string>

using namespace gptoss;

namespace {

std::string last_error() { return gptoss_last_error(); }

OffloadRequest request(int32_t n, uint64_t budget = 0) {
    OffloadRequest r;
    r.n_cpu_moe = n;
    r.gpu_memory_budget = budget;
    return r;
}

// Round numbers worked by hand: fixed 10, a layer's experts 5, streaming 3, a session 2.
OffloadSizes small() {
    OffloadSizes z;
    z.n_layers = 4;
    z.fixed = 10;
    z.expert_layer = 5;
    z.streaming = 3;
    z.session = 2;
    return z;
}

}  // namespace

TEST_CASE("offload_weight_bytes: fixed + device layers' experts + streaming once any layer is on the host") {
    const OffloadSizes z = small();
    CHECK(offload_weight_bytes(z, 0) == 10 + 4 * 5);
    CHECK(offload_weight_bytes(z, 1) == 10 + 3 * 5 + 3);
    CHECK(offload_weight_bytes(z, 4) == 10 + 3);
    CHECK(offload_weight_bytes(z, 9) == 10 + 3);  // clamped to n_layers
}

TEST_CASE("plan_offload: auto takes the fewest host layers that fit, a fixed count must fit, nothing fits → OOM") {
    const OffloadSizes z = small();
    uint32_t n = 99;
    // Totals with a session: 0 → 32, 1 → 30, 2 → 25, 3 → 20, 4 → 15.
    REQUIRE(plan_offload(z, request(GPTOSS_CPU_MOE_AUTO), 25, "m", &n) == GPTOSS_OK);
    CHECK(n == 2);
    REQUIRE(plan_offload(z, request(GPTOSS_CPU_MOE_AUTO), 32, "m", &n) == GPTOSS_OK);
    CHECK(n == 0);
    REQUIRE(plan_offload(z, request(GPTOSS_CPU_MOE_AUTO), 15, "m", &n) == GPTOSS_OK);
    CHECK(n == 4);
    CHECK(plan_offload(z, request(GPTOSS_CPU_MOE_AUTO), 14, "gpt-oss-120b", &n) == GPTOSS_ERR_OUT_OF_MEMORY);
    const std::string oom = last_error();
    INFO(oom);
    CHECK(oom.find("gpt-oss-120b needs at least 0.00 GB") != std::string::npos);
    CHECK(oom.find("all 4 layers") != std::string::npos);
    CHECK(oom.find("params.gpu_memory_budget") != std::string::npos);

    // A fixed count is taken as given when it fits...
    REQUIRE(plan_offload(z, request(3, 25), 25, "m", &n) == GPTOSS_OK);
    CHECK(n == 3);
    // ... and fails naming the budget and the auto alternative when it does not.
    CHECK(plan_offload(z, request(1, 25), 25, "m", &n) == GPTOSS_ERR_OUT_OF_MEMORY);
    CHECK(last_error().find("1 of 4 layers") != std::string::npos);
    CHECK(last_error().find("GPTOSS_CPU_MOE_AUTO finds a split that fits") != std::string::npos);
    // No host layers and no budget of the caller's: today's path (the allocations decide).
    REQUIRE(plan_offload(z, request(0), 1, "m", &n) == GPTOSS_OK);
    CHECK(n == 0);
}

TEST_CASE("plan_offload with gpt-oss-120b's sizes: a 24 GB budget keeps the fewest host layers that fit") {
    // Sizes from MODEL.md's shapes (H 2880, I 2880, E 128, 36 layers, V 201088, 64 heads, 8 kv
    // heads of 64): bf16 embeddings + lm_head 2·V·H·2; per layer q/k/v/o (5120 + 4096)·H·2, router
    // E·H·2; experts E·(2I·H + H·I)·(1/2 + 1/32) bytes of MXFP4 blocks and scales.
    const uint64_t H = 2880, I = 2880, E = 128, V = 201088;
    OffloadSizes z;
    z.n_layers = 36;
    z.fixed = 2 * V * H * 2 + z.n_layers * ((5120 + 4096) * H * 2 + E * H * 2);
    z.expert_layer = E * (2 * I * H + H * I) * 17 / 32;
    z.streaming = 2 * z.expert_layer;
    z.session = 1500000000ull;  // 32k tokens of KV cache plus scratch, about
    uint32_t n = 0;
    const uint64_t budget = 24000000000ull;
    REQUIRE(plan_offload(z, request(GPTOSS_CPU_MOE_AUTO), budget, "gpt-oss-120b", &n) == GPTOSS_OK);
    CHECK(offload_weight_bytes(z, n) + z.session <= budget);
    CHECK(offload_weight_bytes(z, n - 1) + z.session > budget);  // the fewest
    MESSAGE("gpt-oss-120b in 24 GB: experts of " << n << " of 36 layers in host memory");
}

TEST_CASE("offload_budget and check_offload_request") {
    CHECK(offload_budget(request(0, 123), 1ull << 40) == 123);
    CHECK(offload_budget(request(0, 0), 10ull << 30) == (10ull << 30) - kCudaContextReserve);
    CHECK(offload_budget(request(0, 0), 1000) == 0);
    CHECK(check_offload_request(request(GPTOSS_CPU_MOE_AUTO), 24) == GPTOSS_OK);
    CHECK(check_offload_request(request(24), 24) == GPTOSS_OK);
    CHECK(check_offload_request(request(25), 24) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(last_error().find("params.n_cpu_moe: 25") != std::string::npos);
    CHECK(check_offload_request(request(-2), 24) == GPTOSS_ERR_INVALID_ARGUMENT);
}

TEST_CASE("gptoss_load on the CPU: n_cpu_moe is checked against the model, then ignored; info reports none") {
    const char* dir = std::getenv("GPTOSS_TINY_MODEL");
    REQUIRE_MESSAGE(dir != nullptr, "GPTOSS_TINY_MODEL is not set (run through ctest)");
    gptoss_model_params p = gptoss_model_default_params();
    CHECK(p.n_cpu_moe == 0);
    CHECK(p.gpu_memory_budget == 0);
    CHECK(p.fit_context == 0);
    p.device = GPTOSS_DEVICE_CPU;
    gptoss_model* m = nullptr;
    p.n_cpu_moe = 5;  // the tiny model has 4 layers
    CHECK(gptoss_load(dir, &p, &m) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(last_error().find("params.n_cpu_moe: 5") != std::string::npos);
    CHECK(m == nullptr);
    p.n_cpu_moe = -7;
    CHECK(gptoss_load(dir, &p, &m) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(last_error().find("params.n_cpu_moe: -7") != std::string::npos);
    p.n_cpu_moe = 2;
    REQUIRE(gptoss_load(dir, &p, &m) == GPTOSS_OK);
    gptoss_model_info info;
    info.struct_size = sizeof info;
    REQUIRE(gptoss_model_get_info(m, &info) == GPTOSS_OK);
    CHECK(info.n_cpu_moe == 0);
    CHECK(info.host_weight_bytes == 0);
    gptoss_model_free(m);
}
