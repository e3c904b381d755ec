// cuda/host_moe.h - the CUDA backend's MoE experts in host memory (issue 16, gptoss-offload.h).
// HostExperts holds the MXFP4 experts of the first n_host layers in host RAM, in the
// checkpoint's layout (pinned when the system allows, so streaming copies run at full PCIe
// speed), and streams one layer at a time to the GPU for long prefill chunks (one H2D copy of
// the layer's blocks and scales into a raw buffer, then repack_mxfp4 into the GPU layout of a
// one-layer slot). HostMoeSession is a session's part: for decode and short chunks it enqueues,
// per host layer, the hand-over of the normed activations (bf16; the GEMMs keep them in
// permuted_k order, the CPU reads natural order) and the chosen experts to pinned host buffers,
// cpu::host_moe_experts on the worker pool, and the experts' outputs back into the GPU's `part`
// buffer, where the usual combine kernel weights and adds them. How (cuda/host_moe_trip.h): by
// default a staging kernel writes the inputs into mapped pinned memory and rings a mailbox that a
// session thread polls while a step is in flight, and a GPU kernel waits for its answer; or
// (GPTOSS_HOST_MOE_TRIP=callback) copies and a host callback (cudaLaunchHostFunc). Both are
// capturable into the decode graph.
#pragma once

#include "cpu/reference.h"
#include "cuda/host_moe_gpu.h"
#include "cuda/host_moe_trip.h"
#include "cuda/kernels.h"
#include "gptoss-internal.h"

#include <cuda_runtime.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace gptoss {
namespace cuda {

// Chunks of more tokens than this stream the host layers' experts to the GPU; decode and
// chunks up to it run them on the CPU: config.n_experts (the measured crossover, 32 for 20b and
// 128 for 120b), or GPTOSS_HOST_MOE_STREAM_MIN (1..4096).
uint32_t host_moe_stream_min(const Config& config);

class HostExperts {
public:
    HostExperts() = default;
    ~HostExperts();
    HostExperts(const HostExperts&) = delete;
    HostExperts& operator=(const HostExperts&) = delete;

    // Reserves host memory for the experts of layers [0, n_host) of `config`: on huge pages
    // (cpu::host_weights_alloc) pinned with cudaHostRegister, or with GPTOSS_HOST_HUGEPAGE=0 by
    // cudaHostAlloc; pageable, with a warning, where pinning fails. OUT_OF_MEMORY naming the bytes.
    [[nodiscard]] gptoss_status init(const Config& config, uint32_t n_host);
    // Copies layer l's expert tensors (blocks, scales, biases) from the checkpoint mapping.
    // UNSUPPORTED if a scale byte exceeds 128 (the GPU dequantizer's limit, as for GPU layers).
    [[nodiscard]] gptoss_status copy_layer(uint32_t l, const LayerWeights& w);
    // Synthetic weights (bench): random nibbles, scales 118..122, biases ~0.01, deterministic in seed.
    void fill_random(uint64_t seed);

    uint32_t n_host() const { return n_host_; }
    uint64_t bytes() const { return bytes_; }
    cpu::MoeWeights layer(uint32_t l) const;   // views into the host store, checkpoint layout
    // Layer l's experts as device pointers into the mapped store (cuda/host_moe_gpu.h), for the
    // GPU's share of a decode step; false when the store is not pinned and mapped.
    bool device_layer(uint32_t l, HostExpertsView* view) const;
    // Device bytes of the streaming buffers (raw layer + repacked slot), 0 when n_host is 0.
    static uint64_t streaming_bytes(const Config& config);

    // Streams layer l's experts into the device slot (gu_w/gu_s/dn_w/dn_s, each holding E
    // experts in the GPU layout of CudaBackend) through `raw` (streaming_raw_bytes()), on `stream`:
    // copy_raw (the H2D copy of the layer's four MXFP4 tensors) then repack (raw → slot).
    [[nodiscard]] gptoss_status stream_layer(uint32_t l, void* raw, void* gu_w, uint16_t* gu_s, void* dn_w,
                                             uint16_t* dn_s, int* bad_scale, cudaStream_t stream) const;
    [[nodiscard]] gptoss_status copy_raw(uint32_t l, void* raw, cudaStream_t stream) const;
    [[nodiscard]] gptoss_status repack(const void* raw, void* gu_w, uint16_t* gu_s, void* dn_w, uint16_t* dn_s,
                                       int* bad_scale, cudaStream_t stream) const;
    static uint64_t streaming_raw_bytes(const Config& config);
    // Held by a session for the whole of a streaming forward: the slot is the backend's.
    std::mutex& slot_mutex() { return slot_mutex_; }

private:
    struct Layout {  // byte offsets inside one layer's block of the store
        size_t gu_blocks, gu_scales, dn_blocks, dn_scales, gu_bias, dn_bias, mxfp4_bytes, layer_bytes;
    };
    static Layout layout_of(const Config& c);
    cpu::MoeWeights layer_at(const uint8_t* store, uint32_t l) const;
    bool alloc_huge();

    Config config_;
    uint32_t n_host_ = 0;
    Layout lay_{};
    uint8_t* store_ = nullptr;
    uint64_t bytes_ = 0;
    bool pinned_ = false;
    bool registered_ = false;  // pinned by cudaHostRegister (huge-page store), not cudaHostAlloc
    uint8_t* store_dev_ = nullptr;  // the store's device address (mapped), nullptr if not mapped
    void map_store();
    std::unique_ptr<cpu::PoolHold> pool_;  // the CPU threads live as long as the host experts
    std::mutex slot_mutex_;
};

class HostMoeSession {
public:
    HostMoeSession() = default;
    ~HostMoeSession();
    HostMoeSession(const HostMoeSession&) = delete;
    HostMoeSession& operator=(const HostMoeSession&) = delete;

    // Pinned buffers for chunks of up to host_moe_stream_min(config) tokens.
    [[nodiscard]] gptoss_status init(const HostExperts* experts, const Config& config);
    uint32_t max_tokens() const { return max_tokens_; }
    // True (once) if a callback failed (its host scratch could not grow): the step's results
    // are wrong, and the session reports OUT_OF_MEMORY after its next synchronization.
    bool take_failure() { return failed_.exchange(false); }
    // Enqueues on `stream` the CPU MoE of host layer l for the n tokens of this step (n also
    // in step->n_tokens, which the callback reads, so a captured graph needs nothing of the
    // host at replay): xn bf16 [n, H] and experts [n, K] (device) → part fp32 [n, K, H]
    // (device), unweighted. n ≤ max_tokens(). With n = 1 on the poll way, the last
    // gpu_slots() of the K experts run on the GPU instead (cuda/host_moe_gpu.h), beside the CPU.
    [[nodiscard]] gptoss_status enqueue(uint32_t l, uint32_t n, const StepInfo* step, const uint16_t* xn,
                                        const int32_t* experts, float* part, cudaStream_t stream);
    // Long chunks: HostExperts::stream_layer of host layer l on `stream`, except that the raw
    // copy of layer l + 1 is queued on this session's copy stream as soon as layer l's repack
    // has read `raw`, so it overlaps layer l's expert GEMMs and layer l + 1's attention (layer 0
    // queues its own copy; host layers are [0, n_host)). GPTOSS_HOST_MOE_OVERLAP=0: no overlap.
    // The caller holds the slot's mutex and calls finish_streaming() before releasing it.
    [[nodiscard]] gptoss_status stream_layer(uint32_t l, void* raw, void* gu_w, uint16_t* gu_s, void* dn_w,
                                             uint16_t* dn_s, int* bad_scale, cudaStream_t stream);
    // Waits for this session's queued raw copies (an error may have left one behind).
    void finish_streaming();

    // The round trip (cuda/host_moe_trip.h). polling(): enqueue() stages and signals a mailbox
    // instead of a host callback, and the session's poll thread must know how many requests a
    // launch brings: enqueue() counts its own outside stream capture; a captured graph's launch
    // calls arm(its host layers) first.
    bool polling() const { return poller_.joinable(); }
    // How many of a one-token step's K experts the GPU computes from the mapped store
    // (host_gpu_slots_default, or GPTOSS_HOST_MOE_GPU_SLOTS = 0..K; 0 on the callback way or
    // where the store is not mapped).
    uint32_t gpu_slots() const { return gpu_slots_; }
    void arm(uint32_t requests);
    // Waits for `stream`: a blocking event (GPTOSS_HOST_MOE_BLOCKING) or cudaStreamSynchronize.
    [[nodiscard]] cudaError_t synchronize(cudaStream_t stream);

private:
    struct Call {
        HostMoeSession* self;
        uint32_t layer;
    };
    static void CUDART_CB run(void* call);
    // The CPU side of host layer l: the staged inputs (un-permuted here unless staged) → part_host_.
    void compute(uint32_t layer);
    gptoss_status init_trip();
    gptoss_status init_gpu_share();
    void poll_loop();
    void serve_armed();
    bool take_armed();  // one request served: armed_ - 1 unless 0; true while more are due

    const HostExperts* experts_ = nullptr;
    uint32_t H_ = 0, I_ = 0, K_ = 0, max_tokens_ = 0;
    float swiglu_limit_ = 0;
    // Pinned: the step info, xn [max, H] bf16, experts [max, K], part [max, K, H] fp32.
    StepInfo* step_host_ = nullptr;
    uint16_t* xn_host_ = nullptr;
    int32_t* experts_host_ = nullptr;
    float* part_host_ = nullptr;
    uint32_t gpu_slots_ = 0;
    float* gpu_h_ = nullptr;  // device [gpu_slots_, I]: the GPU share's swiglu outputs
    // Experts the CPU computes per token of an n-token step: K, less the GPU's share at n = 1.
    uint32_t cpu_slots(uint32_t n) const { return n == 1 ? K_ - gpu_slots_ : K_; }
    gptoss_status queue_copy(uint32_t l, void* raw);
    std::vector<Call> calls_;  // one per host layer; their addresses go to the callbacks
    // Prefill streaming overlap: the copy stream, "raw holds the next layer" and "raw was read".
    cudaStream_t copy_stream_ = nullptr;
    cudaEvent_t raw_ready_ = nullptr, raw_free_ = nullptr;
    mutable std::vector<uint16_t> xn_natural_;  // xn in natural k order (the GPU's is permuted_k)
    mutable std::atomic<bool> failed_{false};
    // The round trip: staged inputs in natural order, the mailbox, the GPU's sequence counter,
    // the poll thread and its count of requests due, the blocking event, the timer.
    bool staged_ = false;
    HostMailbox* mailbox_ = nullptr;
    uint32_t* seq_dev_ = nullptr;
    uint32_t last_seq_ = 0;  // poll thread only
    std::thread poller_;
    std::mutex poll_mutex_;
    std::condition_variable poll_cv_;
    std::atomic<bool> stop_{false};  // set under poll_mutex_; serve_armed reads it without
    std::atomic<int> armed_{0};
    cudaEvent_t blocking_ = nullptr;
    HostTripTimer timer_;
};

}  // namespace cuda
}  // namespace gptoss
