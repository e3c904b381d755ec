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
// The layer lives in cpu::host_weights_alloc memory (huge pages unless GPTOSS_HOST_HUGEPAGE=0),
// and the split follows cpu::host_moe_tuning (GPTOSS_HOST_MOE_RANGES / _PREFETCH / _ONE_PASS).
// gptoss-bench --host-moe-sweep 20b|120b: the int8 path at T = 1 under the default tuning and
// variants changing one knob each (split, prefetch distance / hint / scale stream, the pool
// caller's spin), in two interleaved rounds; then the knobs that won together against the default
// in two more rounds, with the pass's pieces (cpu/host_experts_profile.h), and the environment
// that gives the better one to the engine; then T = 4 and 16 with both. One process.
#pragma once

#include "cpu/host_experts.h"
#include "cpu/host_experts_profile.h"
#include "cpu/host_experts_q8.h"
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

// One layer's MXFP4 experts (blocks, scales, biases) in one cpu::host_weights_alloc block.
struct HostMoeLayer {
    uint32_t E, H, I;
    size_t gu_rows, d_rows, bytes;
    uint8_t* mem;
    gptoss::cpu::MoeWeights w;
    HostMoeLayer(uint32_t E_, uint32_t H_, uint32_t I_, bool huge) : E(E_), H(H_), I(I_) {
        gu_rows = size_t(E) * 2 * I, d_rows = size_t(E) * H;
        bytes = gu_rows * (H / 32) * 17 + d_rows * (I / 32) * 17 + 2 * (gu_rows + d_rows);
        mem = static_cast<uint8_t*>(gptoss::cpu::host_weights_alloc(bytes, huge));
        if (mem == nullptr) {
            std::fprintf(stderr, "gptoss-bench: %zu bytes for one layer's experts could not be allocated\n", bytes);
            std::exit(1);
        }
        uint8_t* at = mem;
        auto take = [&](size_t n) { uint8_t* p = at; at += n; return p; };
        w.gate_up_blocks = take(gu_rows * (H / 32) * 16);
        w.gate_up_scales = take(gu_rows * (H / 32));
        w.down_blocks = take(d_rows * (I / 32) * 16);
        w.down_scales = take(d_rows * (I / 32));
        w.gate_up_bias = reinterpret_cast<const uint16_t*>(take(2 * gu_rows));
        w.down_bias = reinterpret_cast<const uint16_t*>(take(2 * d_rows));
    }
    ~HostMoeLayer() { gptoss::cpu::host_weights_free(mem); }
    HostMoeLayer(const HostMoeLayer&) = delete;
    HostMoeLayer& operator=(const HostMoeLayer&) = delete;
    // Random bytes; scales 2^-9..2^3 as in real checkpoints; biases ~U(-0.1, 0.1).
    void fill_random(uint64_t seed) {
        std::mt19937_64 rng(seed);
        auto bytes_at = [&](const uint8_t* p, size_t n) {
            uint8_t* q = const_cast<uint8_t*>(p);
            for (size_t i = 0; i + 8 <= n; i += 8) {
                const uint64_t r = rng();
                std::memcpy(q + i, &r, 8);
            }
        };
        bytes_at(w.gate_up_blocks, gu_rows * (H / 32) * 16);
        bytes_at(w.down_blocks, d_rows * (I / 32) * 16);
        auto scales_at = [&](const uint8_t* p, size_t n) {
            for (size_t i = 0; i < n; i++) const_cast<uint8_t*>(p)[i] = uint8_t(118 + rng() % 13);
        };
        scales_at(w.gate_up_scales, gu_rows * (H / 32));
        scales_at(w.down_scales, d_rows * (I / 32));
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (size_t i = 0; i < gu_rows; i++) const_cast<uint16_t*>(w.gate_up_bias)[i] = gptoss::f32_to_bf16(0.1f * u(rng));
        for (size_t i = 0; i < d_rows; i++) const_cast<uint16_t*>(w.down_bias)[i] = gptoss::f32_to_bf16(0.1f * u(rng));
    }
    void copy_from(const HostMoeLayer& o) { std::memcpy(mem, o.mem, bytes); }
    // Bytes one expert's call reads: blocks + scales + biases of its gate_up and down.
    double expert_bytes() const { return double(2 * I) * (H / 32) * 17 + 2.0 * 2 * I + double(H) * (I / 32) * 17 + 2.0 * H; }
};

// For each token of a call, K distinct experts among the less recently used half (so the
// cache does not serve an expert again), as run_host_moe picks them.
struct HostMoePicker {
    std::vector<int32_t> lru;
    std::mt19937_64 rng;
    explicit HostMoePicker(uint32_t E, std::mt19937_64 state = std::mt19937_64{3}) : lru(E), rng(state) {
        for (uint32_t e = 0; e < E; e++) lru[e] = int32_t(e);
    }
    // Fills chosen [T, K]; returns the number of distinct experts.
    uint32_t pick(uint32_t T, uint32_t K, int32_t* chosen) {
        const uint32_t E = uint32_t(lru.size());
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
        return distinct;
    }
};

// Seconds of CPU time (user + system) this process has used so far.
inline double process_cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// One timed path of run_host_moe: calls, seconds, expert bytes read, threads busy on average.
struct HostMoeRun {
    uint32_t iters = 0;
    double s = 0, bytes = 0, busy = 0;
};

// step(T) (returns the bytes it read) three times to warm up, then until at least 100 calls
// (T = 1) or 10 calls and 2 seconds have passed.
template <typename Step>
HostMoeRun time_host_moe(Step& step, uint32_t T) {
    for (int i = 0; i < 3; i++) step(T);
    HostMoeRun r;
    const double cpu0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    while (r.iters < (T == 1 ? 100u : 10u) || r.s < 2.0) {
        r.bytes += step(T);
        r.iters++;
        r.s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    r.busy = (process_cpu_seconds() - cpu0) / r.s;
    return r;
}

struct HostMoeLine {
    std::string shape;
    uint32_t E, H, I, T, K;
    const char* simd;
    unsigned threads;
    double floor_gbps;
    HostMoeRun run;
};

inline void print_host_moe_line(const HostMoeLine& l, bool json) {
    const HostMoeRun& r = l.run;
    const double ms = r.s * 1e3 / r.iters, gbps = r.bytes / r.s / 1e9;
    if (json)
        std::printf("{\"host_moe\": \"%s\", \"E\": %u, \"H\": %u, \"I\": %u, \"T\": %u, \"K\": %u, \"simd\": \"%s\", "
                    "\"threads\": %u, \"iterations\": %u, \"ms_per_layer\": %.4f, \"weight_gbps\": %.2f, "
                    "\"read_floor_gbps\": %.2f, \"pct_of_floor\": %.1f, \"threads_busy\": %.2f}\n",
                    l.shape.c_str(), l.E, l.H, l.I, l.T, l.K, l.simd, l.threads, r.iters, ms, gbps, l.floor_gbps,
                    100 * gbps / l.floor_gbps, r.busy);
    else
        std::printf("host-moe %s (E=%u H=%u I=%u, T=%u K=4, %s, %u threads, %u calls): %.3f ms/layer, %.2f GB/s of "
                    "expert weights (%.1f MB/call), %.1f %% of the host read floor (%.2f GB/s: streaming read of "
                    "1 GiB, same threads); %.2f of %u threads busy\n",
                    l.shape.c_str(), l.E, l.H, l.I, l.T, l.simd, l.threads, r.iters, ms, gbps, r.bytes / r.iters / 1e6,
                    100 * gbps / l.floor_gbps, l.floor_gbps, r.busy, l.threads);
}

inline int run_host_moe(const std::string& shape, bool json) {
    using namespace gptoss;
    if (shape != "20b" && shape != "120b") {
        std::fprintf(stderr, "gptoss-bench: --host-moe is \"%s\", expected 20b or 120b\n", shape.c_str());
        return 2;
    }
    const uint32_t E = shape == "20b" ? 32 : 128, H = 2880, I = 2880, K = 4;
    HostMoeLayer layer(E, H, I, cpu::host_weights_huge_default());
    layer.fill_random(1);
    const cpu::MoeWeights w = layer.w;
    std::mt19937_64 rng(2);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> x(H);  // one token's activations (every token of a call gets them)
    for (uint16_t& v : x) v = f32_to_bf16(u(rng));
    const double expert_bytes = layer.expert_bytes();

    cpu::PoolHold pool;
    const char* env = std::getenv("GPTOSS_THREADS");  // the pool's size, as cpu/reference.cpp sets it
    const unsigned threads = env && std::atoi(env) >= 1 ? unsigned(std::atoi(env)) : std::thread::hardware_concurrency();
    const double floor_gbps = cpu::measure_host_read_gbps(size_t(1) << 30);

    HostMoePicker picker(E, rng);  // continues rng's sequence, as the picks always did
    std::vector<uint16_t> xs(size_t(16) * H);
    for (uint32_t t = 0; t < 16; t++) std::copy(x.begin(), x.end(), xs.begin() + long(t) * H);
    std::vector<int32_t> chosen(size_t(16) * K);
    std::vector<float> out(size_t(16) * K * H);
    cpu::host_moe_reserve(16, K, H, I);
    // The int8 line below runs the engine's kernel and split (cpu::host_moe_experts's choice).
    if (!json) std::printf("host-moe %s: the engine's host experts run %s\n", shape.c_str(), cpu::host_moe_path_name());
    // The paths timed: the float kernels, then the int8 one (cpu/host_experts_q8.h) where present.
    const cpu::HostSimd simd_sel = cpu::host_simd_selected();
    const char* q8_kernel = simd_sel == cpu::HostSimd::avx512 && std::strstr(cpu::host_moe_path_name(), "avx512")
                                ? "avx512-vnni"
                                : "avx2";
    bool use_q8 = false;
    // One call of T tokens, each with K distinct experts among the less recently used half;
    // returns the bytes of the distinct experts the call reads.
    auto step = [&](uint32_t T) {
        const uint32_t distinct = picker.pick(T, K, chosen.data());
        if (!use_q8 || !cpu::host_moe_experts_q8(q8_kernel, xs.data(), T, H, I, w, chosen.data(), K, 7.0f, out.data()))
            cpu::host_moe_experts_simd(simd_sel, xs.data(), T, H, I, w, chosen.data(), K, 7.0f, out.data());
        return distinct * expert_bytes;
    };
    const std::string q8_name = std::string(q8_kernel) + " int8";
    const bool have_q8 = simd_sel != cpu::HostSimd::scalar && std::strstr(cpu::host_moe_path_name(), "int8");
    // T = 1 is the decode step; 4 and 16 (batched decode, small chunks) show how the CPU path
    // scales against streaming the layer's weights to the GPU instead.
    for (int path = 0; path < (have_q8 ? 2 : 1); path++)
    for (uint32_t T : {1u, 4u, 16u}) {
        use_q8 = path == 1;
        HostMoeLine line{shape, E, H, I, T, K, use_q8 ? q8_name.c_str() : cpu::host_simd_name(simd_sel), threads,
                         floor_gbps, time_host_moe(step, T)};
        print_host_moe_line(line, json);
    }
    return 0;
}

struct HostMoeTime {
    double ms, gbps;
};

// The int8 path (`kernel`) at T tokens, K = 4, for about `seconds` (after 3 warm-up calls).
inline HostMoeTime time_host_moe(const char* kernel, const HostMoeLayer& layer, uint32_t T, double seconds,
                                 HostMoePicker& picker) {
    using namespace gptoss;
    const uint32_t K = 4, H = layer.H;
    std::vector<uint16_t> xs(size_t(T) * H);
    std::mt19937 rng(T);
    for (uint16_t& v : xs) v = f32_to_bf16(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng));
    std::vector<int32_t> chosen(size_t(T) * K);
    std::vector<float> out(size_t(T) * K * H);
    auto call = [&] {
        const uint32_t distinct = picker.pick(T, K, chosen.data());
        if (!cpu::host_moe_experts_q8(kernel, xs.data(), T, H, layer.I, layer.w, chosen.data(), K, 7.0f, out.data()))
            cpu::host_moe_experts(xs.data(), T, H, layer.I, layer.w, chosen.data(), K, 7.0f, out.data());
        return distinct * layer.expert_bytes();
    };
    for (int i = 0; i < 3; i++) call();
    double bytes = 0, s = 0;
    uint32_t iters = 0;
    const auto t0 = std::chrono::steady_clock::now();
    while (iters < 20 || s < seconds) {
        bytes += call();
        iters++;
        s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return {s * 1e3 / iters, bytes / s / 1e9};
}

struct HostMoeVariant {
    const char* name;
    gptoss::cpu::HostMoeTuning tuning;
    bool huge;
};

// The environment that gives v's tuning to the engine.
inline std::string host_moe_env(const HostMoeVariant& v) {
    const gptoss::cpu::HostMoeTuning& t = v.tuning;
    return "GPTOSS_HOST_MOE_RANGES=" + std::to_string(t.ranges_per_thread) +
           " GPTOSS_HOST_MOE_PREFETCH=" + std::to_string(t.prefetch_bytes) +
           " GPTOSS_HOST_MOE_ONE_PASS=" + std::to_string(t.one_pass ? 1 : 0) +
           " GPTOSS_HOST_MOE_PREFETCH_HINT=" + std::to_string(t.prefetch_locality) +
           " GPTOSS_HOST_MOE_PREFETCH_SCALES=" + std::to_string(t.scale_prefetch_bytes) +
           " GPTOSS_HOST_MOE_CALLER_SPIN_US=" + std::to_string(t.caller_spin_us);
}

inline void print_sweep_line(const char* what, const HostMoeVariant& v, unsigned threads, uint32_t T,
                             const HostMoeTime& t, double floor_gbps) {
    std::printf("sweep %-6s %-14s %s %s threads %2u T=%-2u: %.3f ms/layer, %6.2f GB/s, %5.1f %% of the read floor "
                "(%.2f GB/s)\n",
                what, v.name, host_moe_env(v).c_str(), v.huge ? "2M-pages" : "4K-pages", threads, T, t.ms, t.gbps,
                100 * t.gbps / floor_gbps, floor_gbps);
    std::fflush(stdout);
}

inline HostMoeTime time_variant(const HostMoeVariant& v, const char* kernel, const HostMoeLayer& layer, uint32_t T,
                                double seconds, HostMoePicker& picker) {
    gptoss::cpu::host_moe_set_tuning(v.tuning);
    return time_host_moe(kernel, layer, T, seconds, picker);
}

// Each knob's variants (one field changed from the default) that beat the default by ≥ 2 %
// over the rounds, applied together.
inline HostMoeVariant combine_winners(const std::vector<HostMoeVariant>& v, const std::vector<double>& sum) {
    HostMoeVariant c = v[0];
    c.name = "combined";
    auto better = [&](size_t i, size_t j) { return sum[i] > sum[j]; };
    size_t best[6] = {0, 0, 0, 0, 0, 0};  // per knob: ranges, prefetch, one_pass, hint, scales, caller spin
    for (size_t i = 1; i < v.size(); i++) {
        const gptoss::cpu::HostMoeTuning &a = v[i].tuning, &d = v[0].tuning;
        const int knob = a.ranges_per_thread != d.ranges_per_thread ? 0
                         : a.prefetch_bytes != d.prefetch_bytes     ? 1
                         : a.one_pass != d.one_pass                 ? 2
                         : a.prefetch_locality != d.prefetch_locality ? 3
                         : a.scale_prefetch_bytes != d.scale_prefetch_bytes ? 4
                         : a.caller_spin_us != d.caller_spin_us             ? 5
                                                                            : 6;
        if (knob == 6) continue;  // the default itself
        if (sum[i] > 1.02 * sum[0] && (best[knob] == 0 || better(i, best[knob]))) best[knob] = i;
    }
    if (best[0]) c.tuning.ranges_per_thread = v[best[0]].tuning.ranges_per_thread;
    if (best[1]) c.tuning.prefetch_bytes = v[best[1]].tuning.prefetch_bytes;
    if (best[2]) c.tuning.one_pass = v[best[2]].tuning.one_pass;
    if (best[3]) c.tuning.prefetch_locality = v[best[3]].tuning.prefetch_locality;
    if (best[4]) c.tuning.scale_prefetch_bytes = v[best[4]].tuning.scale_prefetch_bytes;
    if (best[5]) c.tuning.caller_spin_us = v[best[5]].tuning.caller_spin_us;
    return c;
}

// The sweep's variants: the default first, then one knob changed each (v16: the T = 1 pass's
// prefetch and split).
inline std::vector<HostMoeVariant> sweep_variants() {
    using T = gptoss::cpu::HostMoeTuning;
    auto knob = [](const char* name, uint32_t T::*field, uint32_t value) {
        HostMoeVariant v{name, T{}, true};
        v.tuning.*field = value;
        return v;
    };
    return {
        {"default", T{}, true},
        knob("ranges2", &T::ranges_per_thread, 2),
        knob("ranges8", &T::ranges_per_thread, 8),
        knob("pf4k", &T::prefetch_bytes, 4096),
        knob("hint-t0", &T::prefetch_locality, 3),
        knob("hint-t2", &T::prefetch_locality, 1),
        knob("scales256", &T::scale_prefetch_bytes, 256),
        knob("nocallerspin", &T::caller_spin_us, 0),
    };
}

// Whether the kernel granted the layer's huge pages (transparent huge pages are advice).
inline void print_huge_pages() {
    if (FILE* f = std::fopen("/proc/meminfo", "r")) {
        char line[256];
        while (std::fgets(line, sizeof line, f))
            if (std::strncmp(line, "AnonHugePages", 13) == 0) std::printf("sweep: layer allocated; %s", line);
        std::fclose(f);
    }
}

// Rounds 1-2 time every variant at T = 1; the winners together (appended to *variants) and the
// default then take rounds 3-4 with the pass's pieces profiled. Returns the better one's index.
inline size_t sweep_rounds(std::vector<HostMoeVariant>* variants, const char* kernel, HostMoeLayer& huge,
                           HostMoePicker& picker) {
    using namespace gptoss;
    std::vector<HostMoeVariant>& v = *variants;
    const double kSeconds = 0.3;  // per line (≥ 20 calls)
    std::vector<double> sum(v.size(), 0.0);
    double r34[2] = {0, 0};  // rounds 3 and 4: the default, the combined winners
    cpu::PoolHold pool;
    const unsigned threads = unsigned(cpu::parallel_threads());
    const double floor_gbps = cpu::measure_host_read_gbps(size_t(1) << 30);
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < v.size(); i++) {
            const HostMoeTime t = time_variant(v[i], kernel, huge, 1, kSeconds, picker);
            sum[i] += t.gbps;
            print_sweep_line(round == 0 ? "round1" : "round2", v[i], threads, 1, t, floor_gbps);
        }
    v.push_back(combine_winners(v, sum));
    for (int round = 0; round < 2; round++)
        for (size_t i : {size_t(0), v.size() - 1}) {
            cpu::host_profile::reset();
            cpu::host_profile::set_on(true);
            const HostMoeTime t = time_variant(v[i], kernel, huge, 1, kSeconds, picker);
            cpu::host_profile::set_on(false);
            r34[i == 0 ? 0 : 1] += t.gbps;
            print_sweep_line(round == 0 ? "round3" : "round4", v[i], threads, 1, t, floor_gbps);
            std::printf("sweep %s: %s\n", v[i].name, cpu::host_profile::report().c_str());
        }
    const size_t best = r34[1] > r34[0] ? v.size() - 1 : 0;
    std::printf("sweep: best: %s (%.2f vs default %.2f GB/s, rounds 3 and 4); engine env: %s\n", v[best].name,
                r34[1] / 2, r34[0] / 2, host_moe_env(v[best]).c_str());
    return best;
}

// gptoss-bench --host-moe-sweep 20b|120b (see the header comment).
inline int run_host_moe_sweep(const std::string& shape) {
    using namespace gptoss;
    if (shape != "20b" && shape != "120b") {
        std::fprintf(stderr, "gptoss-bench: --host-moe-sweep is \"%s\", expected 20b or 120b\n", shape.c_str());
        return 2;
    }
    const uint32_t E = shape == "20b" ? 32 : 128;
    HostMoeLayer huge(E, 2880, 2880, true);
    huge.fill_random(1);
    print_huge_pages();
    const char* kernel = cpu::host_q8::rows_fn_named("avx512-vnni") ? "avx512-vnni" : "avx2";
    std::printf("sweep: %s, int8 kernel %s, %s\n", shape.c_str(), kernel, cpu::host_moe_path_name());
    std::vector<HostMoeVariant> variants = sweep_variants();
    HostMoePicker picker(E);
    const size_t best = sweep_rounds(&variants, kernel, huge, picker);
    {  // batched (T = 4, 16): the default and the better one
        cpu::PoolHold pool;
        const double floor_gbps = cpu::measure_host_read_gbps(size_t(1) << 30);
        for (uint32_t T : {4u, 16u})
            for (size_t i : {size_t(0), best})
                print_sweep_line("batch", variants[i], unsigned(cpu::parallel_threads()), T,
                                 time_variant(variants[i], kernel, huge, T, 0.2, picker), floor_gbps);
    }
    return 0;
}
