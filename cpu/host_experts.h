// cpu/host_experts.h - decode-sized MoE experts computed by the CPU from host-resident MXFP4
// weights (issue 16: the experts of the first N layers stay in host memory when the GPU is too
// small, and the CPU computes the chosen experts of each decode step). The weights stay in the
// checkpoint's layout; MXFP4 is dequantized in SIMD registers (AVX-512F, AVX2+FMA, or a portable
// scalar loop, chosen at run time), each chosen expert's weight bytes are read once per call, and
// all threads of cpu::parallel_for's pool stream the weights of all chosen experts at once. The
// results match cpu::moe's composition of cpu::matmul_mxfp4 + cpu::swiglu (cpu/reference.h, the
// oracle) up to fp32 summation order, and are bit-identical whatever the thread count. By
// default (where the CPU has AVX2) the activations are first quantized to int8 per 32-element
// block (cpu/host_experts_q8.h), which adds that rounding; GPTOSS_HOST_MOE_Q8=0 turns it off.
#pragma once

#include "cpu/reference.h"

#include <cstddef>
#include <cstdint>

namespace gptoss {
namespace cpu {

// Decode-sized MoE on host-resident MXFP4 experts in the checkpoint's layout (cpu::MoeWeights
// from cpu/reference.h: blocks u8 [E, N, K/32, 16], scales u8 [E, N, K/32], biases bf16).
// x: bf16 [T, H] — the GPU's normed activations (RMSNorm output, bf16 as the GPU stores them);
// experts: [T, K] chosen expert ids (all < E, validated by the caller); out: fp32 [T, K, H] =
// for each (token t, slot k): Wd[e] · bf16(swiglu(Wgu[e] · x[t] + bgu[e])) + bd[e], UNWEIGHTED
// (the GPU's combine applies the router weights). The swiglu output is rounded to bf16 before
// the down projection, as the GPU kernels store it. Threaded on cpu::parallel_for's pool (the
// caller holds a cpu::PoolHold); deterministic: each output element is summed in one fixed
// order whatever the thread count. Meant for T ≤ ~64 (decode, small chunks).
// Preconditions (not checked beyond an assert): H and I multiples of 32, T ≥ 1, K ≥ 1, pointers
// valid for those shapes. A weight row holding a block scale ≥ 253 (where the reference's fp32
// dequantization overflows to inf; 255 is 2^128 = inf as in cpu::e8m0_to_f32) is computed in
// cpu::matmul_mxfp4's exact order, so inf/NaN results match the reference's; with finite weights
// and inputs no NaN is produced (inputs of any magnitude: the avx2 path hands |x| ≥ 2^90, or a
// swiglu_limit ≥ 1e12, to the scalar loop).
// Scratch: one process-wide buffer set under a mutex, grown when T·K, H or I outgrow it
// (std::bad_alloc possible then); host_moe_reserve beforehand makes the calls allocation-free.
// From a cudaLaunchHostFunc callback (a CUDA driver thread): it blocks that stream for its
// duration and calls no CUDA API; cpu::parallel_for serializes callers process-wide, so a
// concurrent parallel_for elsewhere (the CPU backend) delays it; the PoolHold must outlive every
// queued callback (synchronize the stream before releasing it: parallel_for reads the pool
// without the hold's lock); without a live PoolHold it runs on the callback thread alone.
void host_moe_experts(const uint16_t* x_bf16, uint32_t T, uint32_t H, uint32_t I, const MoeWeights& w,
                      const int32_t* experts, uint32_t K, float swiglu_limit, float* out);

// Grows the scratch for calls up to T tokens × K slots of H, I (any thread, e.g. at load).
void host_moe_reserve(uint32_t T, uint32_t K, uint32_t H, uint32_t I);

// Streaming-read bandwidth of host memory (GB/s = 1e9 bytes/s) with the pool's threads, reading
// `bytes` (≥ 1 GiB recommended, larger than the last-level cache) a few times; the floor that
// host_moe_experts is measured against (issue 16: "measure a streaming read of host memory with
// the same threads in the same run"). Allocates and first-touches `bytes` (in parallel, so pages
// spread like the threads' work), reads it 5 times with the selected SIMD width, and returns the
// best pass. Returns 0 when the allocation fails.
double measure_host_read_gbps(size_t bytes);

// The SIMD code paths. host_moe_experts and measure_host_read_gbps use host_simd_selected().
enum class HostSimd { scalar = 0, avx2 = 1, avx512 = 2 };
const char* host_simd_name(HostSimd simd);
// Whether this CPU (and build) can run `simd`: scalar always; avx2 needs AVX2+FMA, avx512
// needs AVX-512F (x86-64 builds only).
bool host_simd_supported(HostSimd simd);
// The best supported path, or GPTOSS_HOST_SIMD=scalar|avx2|avx512 if set (read once; a path
// this CPU lacks falls back to the best supported one below it, said once on stderr).
HostSimd host_simd_selected();
// host_moe_experts on a chosen path (tests compare every supported path against the
// reference). `simd` must be supported (else the best supported path runs).
void host_moe_experts_simd(HostSimd simd, const uint16_t* x_bf16, uint32_t T, uint32_t H, uint32_t I,
                           const MoeWeights& w, const int32_t* experts, uint32_t K, float swiglu_limit,
                           float* out);

// The int8-activation path (cpu/host_experts_q8.h: activations quantized per 32-element block,
// error ≤ half a quantization step per element) with kernel "avx512-vnni" or "avx2"; otherwise
// as host_moe_experts. Returns false, computing nothing, when this CPU or build lacks the kernel.
bool host_moe_experts_q8(const char* kernel, const uint16_t* x_bf16, uint32_t T, uint32_t H, uint32_t I,
                         const MoeWeights& w, const int32_t* experts, uint32_t K, float swiglu_limit, float* out);

// How host_moe_experts splits a call's work over the pool (bench/NOTES.md "v14 host experts").
// Every setting gives bit-identical results: only which thread computes a row changes, never
// the order of operations inside it. The defaults below were the fastest at T = 1 on the H200
// machine's 16-core Xeon (v14: 0.42 ms per 120b layer against v13's 0.60, the prefetch most of
// it; v16 below); the environment overrides them, read once: GPTOSS_HOST_MOE_RANGES,
// GPTOSS_HOST_MOE_PREFETCH, GPTOSS_HOST_MOE_ONE_PASS (0|1), GPTOSS_HOST_MOE_PREFETCH_HINT,
// GPTOSS_HOST_MOE_PREFETCH_SCALES, GPTOSS_HOST_MOE_CALLER_SPIN_US; v15's are 2 2048 1 3 0 0, and
// 0 0 0 (first three) is v13's split.
struct HostMoeTuning {
    // v16's defaults (ranges 4, prefetchnta, the caller spinning 2 ms for its workers) against
    // v14/v15's (2, prefetcht0, no spin): bench/NOTES.md "v16 host experts".
    // 0: fixed work items of 64 (int8 gate_up) or 32 rows, handed out in small interleaved
    // chunks (the v13 split). n ≥ 1: each projection's rows of each chosen expert are split into
    // contiguous ranges, about n per pool thread over the whole call (at least one per expert),
    // so that a thread streams a few long runs of one expert's weights.
    uint32_t ranges_per_thread = 4;
    // Software prefetch (int8 kernels) this many bytes ahead in a weight row's block stream,
    // and 1/16 of it in the scale stream; 0 = none (the hardware prefetchers only).
    uint32_t prefetch_bytes = 2048;
    // One parallel_for per call: an expert's down ranges spin-wait for its gate_up ranges
    // (all of which were handed out before any down range) instead of a second fork/join.
    bool one_pass = true;
    // The prefetches' locality hint (GPTOSS_HOST_MOE_PREFETCH_HINT): 3 = prefetcht0 (v14), 2 =
    // t1, 1 = t2, 0 = prefetchnta (the weights are read once per step).
    uint32_t prefetch_locality = 0;
    // Scale stream (GPTOSS_HOST_MOE_PREFETCH_SCALES): 0 = one line prefetch_bytes / 16 ahead per
    // row (v14: a row's 90 scale bytes can span a line it never asks for); n = both lines of
    // the scales n bytes ahead.
    uint32_t scale_prefetch_bytes = 0;
    // µs the pool's caller (the engine's poll thread), its own items done, spins for the workers
    // still running before it sleeps (GPTOSS_HOST_MOE_CALLER_SPIN_US; 0 = sleep at once, v15):
    // it answers the GPU as soon as the last worker ends instead of after a wake-up.
    uint32_t caller_spin_us = 2000;
};
HostMoeTuning host_moe_tuning();
// Sets the tuning of later calls (the bench's sweeps, tests); not during a call.
void host_moe_set_tuning(const HostMoeTuning& tuning);

// Host memory for MXFP4 expert weights (the CUDA backend's host store, the bench's layer):
// `bytes` rounded up to 2 MiB, 2 MiB-aligned; with `huge`, madvise(MADV_HUGEPAGE) (transparent
// huge pages where the kernel allows them: streaming 50 MB per decode step touches ~25 pages
// instead of ~13 000, so far fewer TLB misses), without it MADV_NOHUGEPAGE; either advice
// failing is ignored (4 KiB pages). Not touched: the caller's first touch places the pages.
// nullptr when the allocation fails. Release with host_weights_free.
void* host_weights_alloc(size_t bytes, bool huge);
void host_weights_free(void* p);
// Whether host stores ask for huge pages: yes unless GPTOSS_HOST_HUGEPAGE=0.
bool host_weights_huge_default();

// What host_moe_experts runs: "avx512-vnni int8" or "avx2 int8" (the default where the CPU has
// AVX-512 VNNI / AVX2), else the float path's host_simd_name — with GPTOSS_HOST_MOE_Q8=0, with
// GPTOSS_HOST_SIMD=scalar, or without AVX2. Decided once per process.
const char* host_moe_path_name();

}  // namespace cpu
}  // namespace gptoss
