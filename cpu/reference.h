// cpu/reference.h - every op of the gpt-oss forward pass as the obviously correct fp32 loop.
// The CPU backend (cpu/backend.cpp) is built from these, and every CUDA kernel is tested
// against them (tests/test-kernels.cu). Math: ../shared/MODEL.md; mirrors
// gpt_oss/torch/model.py and transformers' modeling_gpt_oss.py.
// Shapes are row-major, in MODEL.md's letters: T tokens, H hidden, I expert width, E experts,
// K active experts, Q query heads, G kv heads, D head dim, V vocab.
// Each op computes each output element with a fixed summation order that does not depend on T
// or on the thread count, so results are bit-identical however a prompt is chunked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <thread>

namespace gptoss {
struct Config;
namespace cpu {

// Runs fn(i) for i in [0, n) on the shared worker pool (std::thread; GPTOSS_THREADS or the
// hardware concurrency). Blocks until all are done. fn must not call parallel_for. Without a
// live PoolHold it runs on the calling thread (same results: nothing depends on the split).
// caller_spin_us: how long the caller, its share done, spins for the workers before it sleeps
// (at least pool_set_caller_spin's).
void parallel_for(size_t n, void (*fn)(void* ctx, size_t i), void* ctx, int caller_spin_us = 0);
// How many threads a parallel_for started now would run on (the pool's workers + the caller;
// 1 without a live PoolHold). For callers that size their work items by it.
size_t parallel_threads();
// One iteration of a spin-wait: the x86 pause hint, elsewhere a yield.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
}
// While on, the pool's workers spin between jobs instead of sleeping on a condition variable (at
// most 50 ms after their last job), and parallel_for's caller spins for its workers: for a caller
// that issues many short jobs in a burst and frees a core per worker meanwhile (the CUDA backend's
// host experts while a decode step is in flight, GPTOSS_HOST_MOE_WORKER_SPIN=1: off by default, as
// on a machine where every core runs a worker a preempted one stalls the job; bench/NOTES.md v15).
// Any thread.
void pool_spin_hint(bool on);
// How long parallel_for's caller, its own share done, spins for the workers still running
// before it sleeps on a condition variable (its core has nothing else to do meanwhile; a sleeping
// caller pays a wake-up when the last worker ends). µs; default GPTOSS_POOL_CALLER_SPIN_US, else
// 0 (bench/NOTES.md "v16 host experts"). Any thread.
void pool_set_caller_spin(int micros);

// Keeps the worker pool alive; the pool's threads exit when the last hold is destroyed, so no
// thread outlives the last CPU model (API.md §8). Tests may create one to run ops threaded.
class PoolHold {
public:
    PoolHold();
    ~PoolHold();
    PoolHold(const PoolHold&) = delete;
    PoolHold& operator=(const PoolHold&) = delete;
};

// E2M1 code (0..15) → value: 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives for 8..15.
float e2m1_to_f32(uint8_t code);
// E8M0 scale byte → 2^(s - 127) (s = 255 is NaN in OCP; treated as 2^128 = inf here).
float e8m0_to_f32(uint8_t scale);

// out[t, :] = table[tokens[t], :] widened to fp32. table: bf16 [V, H]; out: [T, H].
void embed(const uint16_t* table, const int32_t* tokens, uint32_t T, uint32_t H, float* out);

// out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight. x, out: [T, H] (may alias);
// weight: bf16 [H].
void rmsnorm(const float* x, const uint16_t* weight, uint32_t T, uint32_t H, float eps, float* out);

// out[t, n] = sum_k x[t, k] * w[n, k] + bias[n]. x: [T, K]; w: bf16 [N, K]; bias: bf16 [N] or
// NULL; out: [T, N]. Threaded over n.
void matmul_bf16(const float* x, const uint16_t* w, const uint16_t* bias, uint32_t T, uint32_t K,
                 uint32_t N, float* out);

// YaRN RoPE (MODEL.md): inv_freq [D/2] and the attention scaling factor ("mscale").
struct Rope {
    float inv_freq[256];
    float scale;       // cos and sin are multiplied by it
    uint32_t half_dim; // D / 2
};
Rope rope_init(const Config& config);
// Rotates x [T, n_heads, D] in place (rotate-half layout: x1 = x[:D/2], x2 = x[D/2:]) for
// positions pos0 .. pos0 + T - 1. The angle is computed in fp32 as position * inv_freq, as
// transformers does.
void rope(float* x, uint32_t T, uint32_t n_heads, uint32_t D, uint32_t pos0, const Rope& rope);

// Attention with sinks, causal, optional sliding window, GQA (query head j uses kv head
// j / (Q / G)). q: [T, Q, D] for positions pos0 .. pos0 + T - 1. k, v: [S, G, D] holding the
// positions kv_pos0 .. kv_pos0 + S - 1 contiguously (they must include every key a query may
// see). window: keys visible to a query at position p are max(0, p - window + 1) .. p; window 0
// means all of 0 .. p. sinks: [Q] fp32 logits. out: [T, Q, D].
// p_i = exp(s_i - m) / (sum_j exp(s_j - m) + exp(sink - m)), s_i = q.k_i / sqrt(D).
void attention(const float* q, uint32_t T, uint32_t pos0, uint32_t Q, uint32_t G, uint32_t D,
               const float* k, const float* v, uint32_t S, uint32_t kv_pos0, uint32_t window,
               const float* sinks, float* out);

// Router: logits [T, E] → for each token the K largest (ties: lower expert first), in
// descending order, and their softmax weights. experts, weights: [T, K].
void router_topk(const float* logits, uint32_t T, uint32_t E, uint32_t K, int32_t* experts,
                 float* weights);

// One MXFP4 matrix row block dequantized: w[n, k] for k in [0, K) into out [K]. blocks: u8
// [N, K/32, 16] of one expert; scales: u8 [N, K/32].
void mxfp4_dequant_row(const uint8_t* blocks, const uint8_t* scales, uint32_t K, uint32_t n, float* out);

// out[t, n] = sum_k x[t, k] * dequant(w)[n, k] + bias[n], one expert, for the rows of x
// listed (T rows). w: blocks u8 [N, K/32, 16] + scales u8 [N, K/32]; bias bf16 [N] or NULL.
void matmul_mxfp4(const float* x, const uint8_t* blocks, const uint8_t* scales, const uint16_t* bias,
                  uint32_t T, uint32_t K, uint32_t N, float* out);

// SwiGLU of gpt-oss on interleaved gate/up: g [T, 2I] with gate = g[:, 0::2], up = g[:, 1::2];
// gate = min(gate, limit); up = clamp(up, -limit, limit); y = (up + 1) * gate * sigmoid(1.702 gate).
// y: [T, I].
void swiglu(const float* g, uint32_t T, uint32_t I, float limit, float* y);

// The whole MoE block for T tokens: x [T, H] (already normed) → out [T, H] (overwritten) =
// sum over the K chosen experts e of weight * (Wd[e] swiglu(Wgu[e] x + bgu[e]) + bd[e]).
// Experts are summed in the order router_topk returns them.
struct MoeWeights {
    const uint8_t* gate_up_blocks;   // [E, 2I, H/32, 16]
    const uint8_t* gate_up_scales;   // [E, 2I, H/32]
    const uint16_t* gate_up_bias;    // bf16 [E, 2I]
    const uint8_t* down_blocks;      // [E, H, I/32, 16]
    const uint8_t* down_scales;      // [E, H, I/32]
    const uint16_t* down_bias;       // bf16 [E, H]
};
void moe(const float* x, uint32_t T, uint32_t H, uint32_t I, const MoeWeights& w,
         const int32_t* experts, const float* weights, uint32_t K, float swiglu_limit, float* out);

}  // namespace cpu
}  // namespace gptoss
