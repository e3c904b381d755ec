// cuda/decode_feed.cu - DecodeFeed (cuda/decode_feed.h): the sampled token handed to the next
// decode step on the device, and to the host through a pinned slot and an event.
#include "cuda/decode_feed.h"

#include "cuda/common.cuh"

namespace gptoss {
namespace cuda {
namespace {

__global__ void decode_feed_kernel(const int32_t* sampled, int argmax_key, int32_t* next_token, StepInfo* step,
                                   int32_t next_pos, volatile int32_t* host) {
    const int32_t token = argmax_key ? int32_t(~uint32_t(*reinterpret_cast<const unsigned long long*>(sampled)))
                                     : *sampled;
    *next_token = token;
    step->pos0 = next_pos;
    step->n_tokens = 1;
    *host = token;
}

}  // namespace

void DecodeFeed::release() {
    if (event_) cudaEventDestroy(event_);
    if (host_) cudaFreeHost(host_);
    event_ = nullptr;
    host_ = host_dev_ = nullptr;
    pending_ = false;
}

gptoss_status DecodeFeed::feed(const int32_t* sampled, bool argmax_key, int32_t* next_token, StepInfo* step,
                               int32_t next_pos, cudaStream_t stream) {
    pending_ = false;
    if (host_ == nullptr) {
        void* p = nullptr;
        if (cudaHostAlloc(&p, sizeof(int32_t), cudaHostAllocMapped) != cudaSuccess) {
            cudaGetLastError();
            return fail(GPTOSS_ERR_OUT_OF_MEMORY, "CUDA decode feed: cannot allocate 4 bytes of pinned host memory");
        }
        host_ = static_cast<int32_t*>(p);
        *host_ = -1;
        // Its device address; with unified addressing (every 64-bit process) the host address
        // itself, should the runtime not map it explicitly.
        void* d = nullptr;
        if (cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess) {
            cudaGetLastError();
            d = p;
        }
        host_dev_ = static_cast<int32_t*>(d);
    }
    if (event_ == nullptr) GPTOSS_CUDA_TRY(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    decode_feed_kernel<<<1, 1, 0, stream>>>(sampled, argmax_key ? 1 : 0, next_token, step, next_pos, host_dev_);
    GPTOSS_CUDA_LAUNCH_CHECK();
    GPTOSS_CUDA_TRY(cudaEventRecord(event_, stream));
    pending_ = true;
    return GPTOSS_OK;
}

gptoss_status DecodeFeed::fetch(int32_t* token_out) {
    if (!pending_) return fail(GPTOSS_ERR_INTERNAL, "CUDA decode feed: fetch without a pending feed");
    pending_ = false;
    GPTOSS_CUDA_TRY(cudaEventSynchronize(event_));
    *token_out = *static_cast<volatile int32_t*>(host_);
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
