// cuda/host_moe_trip.h - the round trip of one host layer's decode step (issue 16; bench/NOTES.md
// "v15 host experts: the round trip"): how the GPU hands a host layer's normed activations and
// chosen experts to the CPU and gets the experts' outputs back. Two ways, chosen once per process:
// "callback" (cudaLaunchHostFunc: the CUDA driver's thread runs the experts; the inputs reach
// pinned memory by three D2H copies or, with staging, by one kernel writing them straight into
// mapped pinned memory in natural k order, and the outputs go back by one H2D copy) and "poll"
// (a session thread spins on a mailbox in pinned memory while a decode step is in flight: the
// staging kernel writes the inputs and then a sequence number, the thread runs the experts and
// answers with the same number, and a GPU kernel that spun on it copies the outputs from mapped
// memory into `part`; no driver callback and no CUDA call on the CPU side). Also here: the
// blocking wait for a step's end (the thread driving the GPU sleeps instead of spinning on a core
// the experts need), and an optional timer (GPU globaltimer stamps around each host layer, host
// steady_clock stamps in the CPU side, one clock offset measured at start) that prints where the
// round trip's µs go when the session ends.
#pragma once

#include "cuda/kernels.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace gptoss {
namespace cuda {

// Read once from the environment; the defaults (first named) were the fastest measured on the
// H200 machine's 16-core Xeon VM (bench/NOTES.md v15). v14's way: GPTOSS_HOST_MOE_TRIP=callback
// GPTOSS_HOST_MOE_STAGE=0 GPTOSS_HOST_MOE_BLOCKING=0.
struct HostTripOptions {
    bool poll;         // GPTOSS_HOST_MOE_TRIP=poll|callback
    bool stage;        // GPTOSS_HOST_MOE_STAGE=1|0 (callback way; the poll way always stages)
    bool blocking;     // GPTOSS_HOST_MOE_BLOCKING=1|0: sessions with host layers wait on a blocking event
    bool worker_spin;  // GPTOSS_HOST_MOE_WORKER_SPIN=0|1 (poll way): pool workers spin while a step is in flight
                       // (16 spinning threads on 16 cores made the experts ~6x slower: a preempted range)
    bool timing;       // GPTOSS_HOST_MOE_TIMING=1: the timer below, summary on stderr at session end
    int gpu_slots;     // GPTOSS_HOST_MOE_GPU_SLOTS=n (poll way): the GPU computes n of a decode token's
                       // K experts from mapped host memory (cuda/host_moe_gpu.h); -1 = the default
};
const HostTripOptions& host_trip_options();

// In pinned (mapped) host memory: the GPU writes req (after the staged inputs and layer), the CPU
// writes done = req after the outputs. Sequence numbers count up from 1 per session.
struct HostMailbox {
    volatile uint32_t req;
    volatile uint32_t layer;
    volatile uint32_t done;
    uint32_t pad;
};

// One block: step (device StepInfo) → *step_host; xn bf16 [n, H] in permuted_k order → xn_host in
// natural order; experts int32 [n, K] → experts_host (all three pinned host memory, written through
// the mapping). With a mailbox: then ++*seq_dev, mb->layer = layer, mb->req = that number (after a
// system fence, so the CPU sees the inputs first). H a multiple of 64.
[[nodiscard]] cudaError_t launch_host_stage(const StepInfo* step, const uint16_t* xn, const int32_t* experts, uint32_t n,
                                            uint32_t H, uint32_t K, StepInfo* step_host, uint16_t* xn_host,
                                            int32_t* experts_host, HostMailbox* mb, uint32_t* seq_dev, uint32_t layer,
                                            cudaStream_t stream);
// Spins until mb->done equals *seq_dev, then copies count floats (a multiple of 4; 0: none) of
// part_host (pinned, mapped) into part (device).
[[nodiscard]] cudaError_t launch_host_wait(const HostMailbox* mb, const uint32_t* seq_dev, const float* part_host,
                                           float* part, size_t count, cudaStream_t stream);

// Timer of the round trips (GPTOSS_HOST_MOE_TIMING=1). Per host layer l of a decode step
// (n = 1): g0 = GPU before the inputs leave, h0 = CPU side starts, h1 = inputs ready (un-permuted),
// h2 = experts done, g1 = GPU after the outputs are back. Accumulates pre = h0 - g0, prep = h1 -
// h0, experts = h2 - h1, post = g1 - h2 (the CPU clock and globaltimer related by an offset measured
// at init, ± ~1 µs), round = g1 - g0 and gpu = g0(l) - g1(l-1) (the GPU's work between two host
// layers), and prints their means at destruction.
class HostTripTimer {
public:
    ~HostTripTimer();
    [[nodiscard]] cudaError_t init(uint32_t n_host);
    bool on() const { return g_ != nullptr; }
    // Enqueues a stamp kernel writing globaltimer into g0 (which 0) or g1 (1) of layer l.
    [[nodiscard]] cudaError_t stamp(uint32_t l, int which, cudaStream_t stream);
    // From the CPU side of layer l (n tokens): h0/h1/h2 as steady_clock ns; accumulates when n = 1.
    void host(uint32_t l, uint32_t n, int64_t h0, int64_t h1, int64_t h2);
    static int64_t now_ns();

private:
    uint64_t* g_ = nullptr;  // pinned [n_host][2]
    std::vector<int64_t> h2_;  // per layer, the last h2
    int64_t offset_ = 0;  // host ns = globaltimer + offset_
    double sum_[6] = {0, 0, 0, 0, 0, 0};  // pre, prep, experts, post, round, gpu
    uint64_t count_[2] = {0, 0};  // layers seen; pairs (l-1, l) seen
};

}  // namespace cuda
}  // namespace gptoss
