// cpu/reference.cpp - the gpt-oss ops as plain fp32 loops (see cpu/reference.h and MODEL.md).
// Mirrors transformers' modeling_gpt_oss.py (eager attention, dequantized MXFP4 experts) and
// gpt_oss/torch/model.py. Dot products use eight fixed partial sums combined in a fixed order,
// so the compiler can vectorise them without -ffast-math and every output element is the same
// whatever T, the chunking of a prompt, or the number of threads.
#include "cpu/reference.h"

#include "gptoss-internal.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace gptoss {
namespace cpu {

// ---------------------------------------------------------------------------
// Worker pool. One process-wide pool, alive while any PoolHold exists (the CPU backend holds
// one), so no thread outlives the last model (API.md §8). Without a hold, parallel_for runs
// on the calling thread.

namespace {

// Spins up to spin_micros() for ready() before the caller blocks on a condition variable
// (GPTOSS_SPIN_US, default 0 = never spin). Measured on the H200 machine's 16-core Xeon
// (bench/NOTES.md, "Int8 activations for the host experts"): 200 µs made the standalone host
// experts ~8 % faster at T = 1 but the engine's offloaded 120b decode ~25 % slower (26 vs 34
// tok/s: 15 spinning workers starve the threads that drive the GPU), so it is off by default.
int spin_micros(size_t pool_threads) {
    static const int env = [] {
        const char* v = std::getenv("GPTOSS_SPIN_US");
        return v && *v ? std::max(0, std::min(100000, std::atoi(v))) : 0;
    }();
    return pool_threads > 1 ? env : 0;
}
// Spins until ready(), or until `until`, or until give_up() (checked with the clock every 64 turns).
template <typename Ready, typename GiveUp>
void spin(std::chrono::steady_clock::time_point until, const Ready& ready, const GiveUp& give_up) {
    for (int i = 0; !ready(); i++) {
        cpu_relax();
        if ((i & 63) == 63 && (give_up() || std::chrono::steady_clock::now() > until)) return;
    }
}
template <typename Ready>
void spin_until(int micros, const Ready& ready) {
    if (micros <= 0) return;
    spin(std::chrono::steady_clock::now() + std::chrono::microseconds(micros), ready, [] { return false; });
}

std::atomic<bool> g_spin_hint{false};  // pool_spin_hint
std::atomic<int> g_caller_spin{[] {    // pool_set_caller_spin
    const char* v = std::getenv("GPTOSS_POOL_CALLER_SPIN_US");
    return v && *v ? std::max(0, std::min(100000, std::atoi(v))) : 0;
}()};

// Spins for ready() while pool_spin_hint is on, at most 50 ms.
template <typename Ready>
void spin_while_hinted(const Ready& ready) {
    if (!g_spin_hint.load(std::memory_order_relaxed)) return;
    spin(std::chrono::steady_clock::now() + std::chrono::milliseconds(50), ready,
         [] { return !g_spin_hint.load(std::memory_order_relaxed); });
}

struct Pool {
    std::vector<std::thread> workers;
    std::mutex mutex;
    std::condition_variable wake;
    std::condition_variable done;
    uint64_t generation = 0;
    bool stop = false;
    // The current job.
    void (*fn)(void*, size_t) = nullptr;
    void* ctx = nullptr;
    size_t n = 0;
    size_t chunk = 1;
    std::atomic<size_t> next{0};
    int busy = 0;
    // Spin before sleeping (see spin_until): the generation of the job last published, and the
    // workers still running it. Both also change under `mutex` as the condition variables need.
    std::atomic<uint64_t> published{0};
    std::atomic<int> running{0};
    size_t n_threads = 1;  // workers + the caller; set before the workers start

    void run_chunks() {
        for (;;) {
            const size_t begin = next.fetch_add(chunk, std::memory_order_relaxed);
            if (begin >= n) return;
            const size_t end = std::min(n, begin + chunk);
            for (size_t i = begin; i < end; i++) fn(ctx, i);
        }
    }

    void worker_loop() {
        uint64_t seen = 0;
        std::unique_lock<std::mutex> lock(mutex);
        for (;;) {
            lock.unlock();
            const auto ready = [&] { return published.load(std::memory_order_acquire) != seen; };
            spin_while_hinted(ready);
            spin_until(spin_micros(n_threads), ready);
            lock.lock();
            wake.wait(lock, [&] { return stop || generation != seen; });
            if (stop) return;
            seen = generation;
            lock.unlock();
            run_chunks();
            running.fetch_sub(1, std::memory_order_release);
            lock.lock();
            if (--busy == 0) done.notify_one();
        }
    }
};

std::mutex g_pool_mutex;      // guards g_pool and g_pool_holds
Pool* g_pool = nullptr;
int g_pool_holds = 0;
std::mutex g_call_mutex;      // one parallel_for at a time (sessions on several threads)

unsigned pool_threads() {
    if (const char* env = std::getenv("GPTOSS_THREADS")) {
        const int n = std::atoi(env);
        if (n >= 1 && n <= 1024) return unsigned(n);
    }
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : hw;
}

}  // namespace

PoolHold::PoolHold() {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    if (g_pool_holds++ == 0) {
        g_pool = new Pool();
        const unsigned n = pool_threads();
        g_pool->n_threads = n;
        for (unsigned i = 1; i < n; i++) g_pool->workers.emplace_back([] { g_pool->worker_loop(); });
    }
}

PoolHold::~PoolHold() {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    if (--g_pool_holds == 0) {
        {
            std::lock_guard<std::mutex> pool_lock(g_pool->mutex);
            g_pool->stop = true;
        }
        g_pool->wake.notify_all();
        for (std::thread& t : g_pool->workers) t.join();
        delete g_pool;
        g_pool = nullptr;
    }
}

void parallel_for(size_t n, void (*fn)(void* ctx, size_t i), void* ctx, int caller_spin_us) {
    if (n == 0) return;
    std::lock_guard<std::mutex> call_lock(g_call_mutex);
    Pool* pool = g_pool;
    if (pool == nullptr || pool->workers.empty() || n == 1) {
        for (size_t i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(pool->mutex);
        pool->fn = fn;
        pool->ctx = ctx;
        pool->n = n;
        const size_t parts = (pool->workers.size() + 1) * 8;
        pool->chunk = std::max<size_t>(1, (n + parts - 1) / parts);
        pool->next.store(0, std::memory_order_relaxed);
        pool->busy = int(pool->workers.size());
        pool->running.store(int(pool->workers.size()), std::memory_order_relaxed);
        pool->generation++;
        pool->published.store(pool->generation, std::memory_order_release);
    }
    pool->wake.notify_all();
    pool->run_chunks();
    const auto all_done = [&] { return pool->running.load(std::memory_order_acquire) == 0; };
    spin_while_hinted(all_done);
    spin_until(std::max({spin_micros(pool->n_threads), g_caller_spin.load(std::memory_order_relaxed), caller_spin_us}),
               all_done);
    std::unique_lock<std::mutex> lock(pool->mutex);
    pool->done.wait(lock, [&] { return pool->busy == 0; });
}

void pool_spin_hint(bool on) { g_spin_hint.store(on, std::memory_order_relaxed); }
void pool_set_caller_spin(int micros) { g_caller_spin.store(std::max(0, micros), std::memory_order_relaxed); }

size_t parallel_threads() {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    return g_pool == nullptr ? 1 : g_pool->workers.size() + 1;
}

// Calls body(i) for i in [0, n) on the pool; body is any callable.
template <typename Body>
static void parallel(size_t n, const Body& body) {
    parallel_for(
        n, [](void* ctx, size_t i) { (*static_cast<const Body*>(ctx))(i); },
        const_cast<void*>(static_cast<const void*>(&body)));
}

// ---------------------------------------------------------------------------
// Scalars

float e2m1_to_f32(uint8_t code) {
    static const float kValues[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    return kValues[code & 15];
}

float e8m0_to_f32(uint8_t scale) { return std::ldexp(1.0f, int(scale) - 127); }

// sum_k a[k] * b[k] with eight interleaved partial sums, combined pairwise in a fixed order.
static float dot(const float* a, const float* b, uint32_t n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++) s[j] += a[k + j] * b[k + j];
    for (; k < n; k++) s[k & 7] += a[k] * b[k];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static void widen_bf16(const uint16_t* in, uint32_t n, float* out) {
    for (uint32_t i = 0; i < n; i++) out[i] = bf16_to_f32(in[i]);
}

// ---------------------------------------------------------------------------
// Ops

void embed(const uint16_t* table, const int32_t* tokens, uint32_t T, uint32_t H, float* out) {
    for (uint32_t t = 0; t < T; t++) widen_bf16(table + size_t(tokens[t]) * H, H, out + size_t(t) * H);
}

void rmsnorm(const float* x, const uint16_t* weight, uint32_t T, uint32_t H, float eps, float* out) {
    for (uint32_t t = 0; t < T; t++) {
        const float* row = x + size_t(t) * H;
        const float mean_square = dot(row, row, H) / float(H);
        const float inv_rms = 1.0f / std::sqrt(mean_square + eps);
        float* dst = out + size_t(t) * H;
        for (uint32_t i = 0; i < H; i++) dst[i] = bf16_to_f32(weight[i]) * (row[i] * inv_rms);
    }
}

void matmul_bf16(const float* x, const uint16_t* w, const uint16_t* bias, uint32_t T, uint32_t K,
                 uint32_t N, float* out) {
    parallel(N, [&](size_t n) {
        thread_local std::vector<float> row;
        row.resize(K);
        widen_bf16(w + n * K, K, row.data());
        const float b = bias ? bf16_to_f32(bias[n]) : 0.0f;
        for (uint32_t t = 0; t < T; t++) out[size_t(t) * N + n] = dot(x + size_t(t) * K, row.data(), K) + b;
    });
}

Rope rope_init(const Config& config) {
    Rope r{};
    const uint32_t D = config.head_dim;
    r.half_dim = D / 2;
    const double base = config.rope_theta;
    const double factor = config.rope_factor;
    float low = 0, high = 0;
    if (factor > 1.0) {
        // transformers _compute_yarn_parameters: correction range from beta_fast/beta_slow
        // rotations over the original context, not rounded when truncate is false.
        auto correction_dim = [&](double rotations) {
            return (D * std::log(config.rope_original_max_context / (rotations * 2 * M_PI))) /
                   (2 * std::log(base));
        };
        double lo = correction_dim(config.rope_beta_fast);
        double hi = correction_dim(config.rope_beta_slow);
        if (config.rope_truncate) {
            lo = std::floor(lo);
            hi = std::ceil(hi);
        }
        low = float(std::max(lo, 0.0));
        high = float(std::min(hi, double(D - 1)));
        if (low == high) high += 0.001f;
        r.scale = float(0.1 * std::log(factor) + 1.0);
    } else {
        r.scale = 1.0f;
    }
    for (uint32_t i = 0; i < r.half_dim; i++) {
        const float pos_freq = std::pow(float(base), float(2 * i) / float(D));
        const float extrapolation = 1.0f / pos_freq;
        if (factor > 1.0) {
            const float interpolation = 1.0f / (float(factor) * pos_freq);
            const float ramp = std::min(1.0f, std::max(0.0f, (float(i) - low) / (high - low)));
            // inv_freq = interpolation * ramp + extrapolation * (1 - ramp)
            r.inv_freq[i] = interpolation * ramp + extrapolation * (1.0f - ramp);
        } else {
            r.inv_freq[i] = extrapolation;
        }
    }
    return r;
}

void rope(float* x, uint32_t T, uint32_t n_heads, uint32_t D, uint32_t pos0, const Rope& r) {
    const uint32_t half = D / 2;
    for (uint32_t t = 0; t < T; t++) {
        const float position = float(pos0 + t);
        float cos_v[128], sin_v[128];
        for (uint32_t i = 0; i < half; i++) {
            const float angle = position * r.inv_freq[i];
            cos_v[i] = std::cos(angle) * r.scale;
            sin_v[i] = std::sin(angle) * r.scale;
        }
        for (uint32_t h = 0; h < n_heads; h++) {
            float* v = x + (size_t(t) * n_heads + h) * D;
            for (uint32_t i = 0; i < half; i++) {
                const float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * cos_v[i] - x2 * sin_v[i];
                v[i + half] = x2 * cos_v[i] + x1 * sin_v[i];
            }
        }
    }
}

void attention(const float* q, uint32_t T, uint32_t pos0, uint32_t Q, uint32_t G, uint32_t D,
               const float* k, const float* v, uint32_t S, uint32_t kv_pos0, uint32_t window,
               const float* sinks, float* out) {
    const uint32_t group = Q / G;
    const float scale = 1.0f / std::sqrt(float(D));
    parallel(size_t(T) * Q, [&](size_t job) {
        const uint32_t t = uint32_t(job / Q), j = uint32_t(job % Q), g = j / group;
        const uint32_t p = pos0 + t;
        uint32_t lo = (window != 0 && p + 1 > window) ? p + 1 - window : 0;
        lo = std::max(lo, kv_pos0);
        const uint32_t hi = std::min(p, kv_pos0 + S - 1);  // inclusive
        const float* qv = q + (size_t(t) * Q + j) * D;
        thread_local std::vector<float> scores;
        scores.assign(hi + 1 - lo, 0.0f);
        float m = sinks[j];
        for (uint32_t i = lo; i <= hi; i++) {
            const float s = dot(qv, k + (size_t(i - kv_pos0) * G + g) * D, D) * scale;
            scores[i - lo] = s;
            m = std::max(m, s);
        }
        float denominator = std::exp(sinks[j] - m);
        for (float& s : scores) {
            s = std::exp(s - m);
            denominator += s;
        }
        float* o = out + (size_t(t) * Q + j) * D;
        for (uint32_t d = 0; d < D; d++) o[d] = 0.0f;
        for (uint32_t i = lo; i <= hi; i++) {
            const float p_i = scores[i - lo] / denominator;
            const float* vv = v + (size_t(i - kv_pos0) * G + g) * D;
            for (uint32_t d = 0; d < D; d++) o[d] += p_i * vv[d];
        }
    });
}

void router_topk(const float* logits, uint32_t T, uint32_t E, uint32_t K, int32_t* experts,
                 float* weights) {
    for (uint32_t t = 0; t < T; t++) {
        const float* row = logits + size_t(t) * E;
        int32_t* ids = experts + size_t(t) * K;
        float* w = weights + size_t(t) * K;
        // Selection: repeatedly take the largest remaining, the lower index on ties.
        std::vector<bool> taken(E, false);
        for (uint32_t k = 0; k < K; k++) {
            int32_t best = -1;
            for (uint32_t e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || row[e] > row[best])) best = int32_t(e);
            taken[best] = true;
            ids[k] = best;
        }
        const float m = row[ids[0]];
        float sum = 0.0f;
        for (uint32_t k = 0; k < K; k++) sum += (w[k] = std::exp(row[ids[k]] - m));
        for (uint32_t k = 0; k < K; k++) w[k] /= sum;
    }
}

void mxfp4_dequant_row(const uint8_t* blocks, const uint8_t* scales, uint32_t K, uint32_t n, float* out) {
    const uint32_t n_blocks = K / 32;
    const uint8_t* b = blocks + size_t(n) * n_blocks * 16;
    const uint8_t* s = scales + size_t(n) * n_blocks;
    for (uint32_t blk = 0; blk < n_blocks; blk++) {
        const float scale = e8m0_to_f32(s[blk]);
        for (uint32_t i = 0; i < 16; i++) {
            const uint8_t byte = b[blk * 16 + i];
            out[blk * 32 + 2 * i] = e2m1_to_f32(byte & 15) * scale;      // low nibble: even element
            out[blk * 32 + 2 * i + 1] = e2m1_to_f32(byte >> 4) * scale;  // high nibble: odd element
        }
    }
}

void matmul_mxfp4(const float* x, const uint8_t* blocks, const uint8_t* scales, const uint16_t* bias,
                  uint32_t T, uint32_t K, uint32_t N, float* out) {
    parallel(N, [&](size_t n) {
        thread_local std::vector<float> row;
        row.resize(K);
        mxfp4_dequant_row(blocks, scales, K, uint32_t(n), row.data());
        const float b = bias ? bf16_to_f32(bias[n]) : 0.0f;
        for (uint32_t t = 0; t < T; t++) out[size_t(t) * N + n] = dot(x + size_t(t) * K, row.data(), K) + b;
    });
}

void swiglu(const float* g, uint32_t T, uint32_t I, float limit, float* y) {
    for (uint32_t t = 0; t < T; t++) {
        for (uint32_t i = 0; i < I; i++) {
            float gate = g[size_t(t) * 2 * I + 2 * i];
            float up = g[size_t(t) * 2 * I + 2 * i + 1];
            gate = std::min(gate, limit);
            up = std::min(std::max(up, -limit), limit);
            const float glu = gate / (1.0f + std::exp(-1.702f * gate));  // gate * sigmoid(1.702 gate)
            y[size_t(t) * I + i] = (up + 1.0f) * glu;
        }
    }
}

void moe(const float* x, uint32_t T, uint32_t H, uint32_t I, const MoeWeights& w,
         const int32_t* experts, const float* weights, uint32_t K, float swiglu_limit, float* out) {
    // Group the (token, slot) pairs by expert so each expert's weights are dequantized once.
    std::vector<std::vector<uint32_t>> by_expert;
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t k = 0; k < K; k++) {
            const uint32_t e = uint32_t(experts[size_t(t) * K + k]);
            if (e >= by_expert.size()) by_expert.resize(e + 1);
            by_expert[e].push_back(t * K + k);
        }
    std::vector<float> expert_out(size_t(T) * K * H);  // [T, K, H]: expert k's output for token t
    std::vector<float> xs, g, y, d;
    for (uint32_t e = 0; e < by_expert.size(); e++) {
        const std::vector<uint32_t>& slots = by_expert[e];
        if (slots.empty()) continue;
        const uint32_t n = uint32_t(slots.size());
        xs.resize(size_t(n) * H);
        for (uint32_t r = 0; r < n; r++)
            std::memcpy(&xs[size_t(r) * H], x + size_t(slots[r] / K) * H, H * sizeof(float));
        g.resize(size_t(n) * 2 * I);
        matmul_mxfp4(xs.data(), w.gate_up_blocks + size_t(e) * 2 * I * (H / 32) * 16,
                     w.gate_up_scales + size_t(e) * 2 * I * (H / 32), w.gate_up_bias + size_t(e) * 2 * I,
                     n, H, 2 * I, g.data());
        y.resize(size_t(n) * I);
        swiglu(g.data(), n, I, swiglu_limit, y.data());
        d.resize(size_t(n) * H);
        matmul_mxfp4(y.data(), w.down_blocks + size_t(e) * H * (I / 32) * 16,
                     w.down_scales + size_t(e) * H * (I / 32), w.down_bias + size_t(e) * H, n, I, H,
                     d.data());
        for (uint32_t r = 0; r < n; r++)
            std::memcpy(&expert_out[size_t(slots[r]) * H], &d[size_t(r) * H], H * sizeof(float));
    }
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < H; h++) {
            float sum = 0.0f;
            for (uint32_t k = 0; k < K; k++)
                sum += weights[size_t(t) * K + k] * expert_out[(size_t(t) * K + k) * H + h];
            out[size_t(t) * H + h] = sum;
        }
}

}  // namespace cpu
}  // namespace gptoss
