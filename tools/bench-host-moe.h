// tools/bench-host-moe.h - gptoss-bench --host-moe 20b|120b: the CPU side of issue 16 (experts
// in host memory) on its own, no GPU needed. Allocates one layer's MXFP4 experts in the real
// shape (E = 32 or 128, H = I = 2880) filled with random bytes (scales drawn from 2^-9..2^3 as in
// real checkpoints, so no row takes the exact inf/NaN path), measures the streaming read of
// 1 GiB of host memory with the pool's threads (cpu::measure_host_read_gbps: the floor), then
// times the float kernels (cpu::host_moe_experts_simd, the selected SIMD path) and then the int8
// path host_moe_experts uses by default (cpu::host_moe_experts_q8), at T = 1, K = 4 (then T = 4 and 16): each token takes 4 distinct
// experts among the less recently used half (so an expert comes back only after ≥ E/8 tokens,
// E/8 · 53 MB of other weights in between: the cache does not serve it). Reports ms per layer,
// GB/s of the bytes of the distinct experts a call reads (blocks + scales + biases), % of the
// read floor, and how many of the threads were busy on average (process CPU time / wall time:
// well under the thread count means the machine was shared and the numbers are not the kernel's).
#pragma once

#include "cpu/host_experts.h"
#include "gptoss-internal.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <vector>

inline int run_host_moe(const std::string& shape, bool json) {
    using namespace gptoss;
    if (shape != "20b" && shape != "120b") {
        std::fprintf(stderr, "gptoss-bench: --host-moe is \"%s\", expected 20b or 120b\n", shape.c_str());
        return 2;
    }
    const uint32_t E = shape == "20b" ? 32 : 128, H = 2880, I = 2880, K = 4, nbH = H / 32, nbI = I / 32;
    const size_t gu_rows = size_t(E) * 2 * I, d_rows = size_t(E) * H;
    std::vector<uint8_t> gu_blocks(gu_rows * nbH * 16), gu_scales(gu_rows * nbH);
    std::vector<uint8_t> d_blocks(d_rows * nbI * 16), d_scales(d_rows * nbI);
    std::vector<uint16_t> gu_bias(gu_rows), d_bias(d_rows);
    std::mt19937_64 rng(1);
    auto fill_bytes = [&](std::vector<uint8_t>& v) {
        for (size_t i = 0; i + 8 <= v.size(); i += 8) {
            const uint64_t r = rng();
            std::memcpy(&v[i], &r, 8);
        }
    };
    fill_bytes(gu_blocks);
    fill_bytes(d_blocks);
    for (uint8_t& s : gu_scales) s = uint8_t(118 + rng() % 13);
    for (uint8_t& s : d_scales) s = uint8_t(118 + rng() % 13);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (uint16_t& b : gu_bias) b = f32_to_bf16(0.1f * u(rng));
    for (uint16_t& b : d_bias) b = f32_to_bf16(0.1f * u(rng));
    std::vector<uint16_t> x(H);  // one token's activations (every token of a call gets them)
    for (uint16_t& v : x) v = f32_to_bf16(u(rng));
    const cpu::MoeWeights w{gu_blocks.data(), gu_scales.data(), gu_bias.data(),
                            d_blocks.data(),  d_scales.data(),  d_bias.data()};
    const double expert_bytes = double(2 * I) * nbH * 17 + 2.0 * 2 * I + double(H) * nbI * 17 + 2.0 * H;

    cpu::PoolHold pool;
    const char* env = std::getenv("GPTOSS_THREADS");  // the pool's size, as cpu/reference.cpp sets it
    const unsigned threads = env && std::atoi(env) >= 1 ? unsigned(std::atoi(env)) : std::thread::hardware_concurrency();
    const double floor_gbps = cpu::measure_host_read_gbps(size_t(1) << 30);

    std::vector<int32_t> lru(E);
    for (uint32_t e = 0; e < E; e++) lru[e] = int32_t(e);
    std::vector<uint16_t> xs(size_t(16) * H);
    for (uint32_t t = 0; t < 16; t++) std::copy(x.begin(), x.end(), xs.begin() + long(t) * H);
    std::vector<int32_t> chosen(size_t(16) * K);
    std::vector<float> out(size_t(16) * K * H);
    cpu::host_moe_reserve(16, K, H, I);
    // The paths timed: the float kernels, then the int8 one (cpu/host_experts_q8.h) where present.
    const cpu::HostSimd simd_sel = cpu::host_simd_selected();
    const char* q8_kernel = simd_sel == cpu::HostSimd::avx512 && std::strstr(cpu::host_moe_path_name(), "avx512")
                                ? "avx512-vnni"
                                : "avx2";
    bool use_q8 = false;
    // One call of T tokens, each with K distinct experts among the less recently used half;
    // returns the bytes of the distinct experts the call reads.
    auto step = [&](uint32_t T) {
        std::vector<bool> used(E, false);
        uint32_t distinct = 0;
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t k = 0; k < K; k++) {
                const size_t at = rng() % (E / 2 - k);
                const int32_t e = lru[at];
                chosen[size_t(t) * K + k] = e;
                lru.erase(lru.begin() + long(at));
                lru.push_back(e);
                distinct += used[size_t(e)] ? 0 : 1;
                used[size_t(e)] = true;
            }
        if (!use_q8 || !cpu::host_moe_experts_q8(q8_kernel, xs.data(), T, H, I, w, chosen.data(), K, 7.0f, out.data()))
            cpu::host_moe_experts_simd(simd_sel, xs.data(), T, H, I, w, chosen.data(), K, 7.0f, out.data());
        return distinct * expert_bytes;
    };
    auto cpu_s = [] {
        rusage u{};
        getrusage(RUSAGE_SELF, &u);
        return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
    };
    const std::string q8_name = std::string(q8_kernel) + " int8";
    const bool have_q8 = simd_sel != cpu::HostSimd::scalar && std::strstr(cpu::host_moe_path_name(), "int8");
    // T = 1 is the decode step; 4 and 16 (batched decode, small chunks) show how the CPU path
    // scales against streaming the layer's weights to the GPU instead.
    for (int path = 0; path < (have_q8 ? 2 : 1); path++)
    for (uint32_t T : {1u, 4u, 16u}) {
        use_q8 = path == 1;
        const char* simd = use_q8 ? q8_name.c_str() : cpu::host_simd_name(simd_sel);
        for (int i = 0; i < 3; i++) step(T);
        uint32_t iters = 0;
        double bytes = 0, s = 0;
        const double cpu0 = cpu_s();
        const auto t0 = std::chrono::steady_clock::now();
        while (iters < (T == 1 ? 100u : 10u) || s < 2.0) {
            bytes += step(T);
            iters++;
            s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        const double busy = (cpu_s() - cpu0) / s;
        const double ms = s * 1e3 / iters, gbps = bytes / s / 1e9;
        if (json)
            std::printf("{\"host_moe\": \"%s\", \"E\": %u, \"H\": %u, \"I\": %u, \"T\": %u, \"K\": %u, \"simd\": \"%s\", "
                        "\"threads\": %u, \"iterations\": %u, \"ms_per_layer\": %.4f, \"weight_gbps\": %.2f, "
                        "\"read_floor_gbps\": %.2f, \"pct_of_floor\": %.1f, \"threads_busy\": %.2f}\n",
                        shape.c_str(), E, H, I, T, K, simd, threads, iters, ms, gbps, floor_gbps,
                        100 * gbps / floor_gbps, busy);
        else
            std::printf("host-moe %s (E=%u H=%u I=%u, T=%u K=4, %s, %u threads, %u calls): %.3f ms/layer, %.2f GB/s of "
                        "expert weights (%.1f MB/call), %.1f %% of the host read floor (%.2f GB/s: streaming read of "
                        "1 GiB, same threads); %.2f of %u threads busy\n",
                        shape.c_str(), E, H, I, T, simd, threads, iters, ms, gbps, bytes / iters / 1e6,
                        100 * gbps / floor_gbps, floor_gbps, busy, threads);
    }
    return 0;
}
