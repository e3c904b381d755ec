// cuda/decode_feed.h - the device side of the pipelined decode loop (gptoss-decode-pipeline.cpp;
// issue 12). After a session's sampler has written its token (greedy: cuda::argmax's 64-bit key;
// else cuda::sample's int32), feed() enqueues one 1-thread kernel that writes the token into the
// next decode step's input (the session's token buffer and its StepInfo: that position, one
// token) and into a pinned, mapped host slot, and records an event after it; fetch() waits on that
// event only when the host reads the token. So the next step's graph can be launched before the
// host knows the token, and no copy sits between two steps on the stream. One slot is enough: the
// engine reads token k (fetch) before it enqueues the sampling of token k + 1
// (BackendSession::sample_ahead's contract).
#pragma once

#include "gptoss-internal.h"
#include "cuda/kernels.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss {
namespace cuda {

class DecodeFeed {
public:
    DecodeFeed() = default;
    DecodeFeed(const DecodeFeed&) = delete;
    DecodeFeed& operator=(const DecodeFeed&) = delete;
    ~DecodeFeed() { release(); }
    // Frees the slot and the event (on the owner's device; idempotent).
    void release();
    // Enqueues on `stream`: token = argmax_key ? ~(uint32_t)*(uint64_t*)sampled : *sampled (device
    // memory the sampler wrote earlier on `stream`); *next_token = token; *step = {next_pos, 1};
    // the host slot = token; then the event. Allocates the slot and the event on first use (the
    // current device must be the stream's). Errors: GPTOSS_ERR_DEVICE (CUDA), OUT_OF_MEMORY.
    [[nodiscard]] gptoss_status feed(const int32_t* sampled, bool argmax_key, int32_t* next_token, StepInfo* step,
                                     int32_t next_pos, cudaStream_t stream);
    // Waits for the latest feed() and returns its token. INTERNAL if no feed() is pending.
    [[nodiscard]] gptoss_status fetch(int32_t* token_out);

private:
    int32_t* host_ = nullptr;       // the pinned slot (cudaHostAllocMapped)
    int32_t* host_dev_ = nullptr;   // its device address
    cudaEvent_t event_ = nullptr;
    bool pending_ = false;
};

}  // namespace cuda
}  // namespace gptoss
