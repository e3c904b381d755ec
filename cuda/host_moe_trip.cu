// cuda/host_moe_trip.cu - the staging and waiting kernels, the options and the timer of a host
// layer's round trip (cuda/host_moe_trip.h).
#include "cuda/host_moe_trip.h"

#include "cpu/host_experts_profile.h"
#include "cuda/common.cuh"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace gptoss {
namespace cuda {

namespace {

bool env_flag(const char* name, bool fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == 0) return fallback;
    return std::strcmp(v, "0") != 0;
}

__device__ __forceinline__ uint64_t globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

constexpr int kStageThreads = 512;

__global__ void host_stage_kernel(const StepInfo* step, const uint32_t* xn, const int32_t* experts, uint32_t n,
                                  uint32_t H, uint32_t K, StepInfo* step_host, uint32_t* xn_host,
                                  int32_t* experts_host, HostMailbox* mb, uint32_t* seq_dev, uint32_t layer) {
    // xn as bf16 pairs: natural (k, k+1), k even, sit at permuted_k(k), permuted_k(k) + 1.
    const uint32_t pairs = H / 2, total = n * pairs;
    for (uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
        const uint32_t t = i / pairs, k = (i % pairs) * 2;
        xn_host[i] = xn[t * pairs + permuted_k(k) / 2];
    }
    for (uint32_t i = threadIdx.x; i < n * K; i += blockDim.x) experts_host[i] = experts[i];
    if (threadIdx.x == 0) *step_host = *step;
    if (mb == nullptr) return;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();  // the inputs before the request
        const uint32_t seq = *seq_dev + 1;
        *seq_dev = seq;
        mb->layer = layer;
        __threadfence_system();
        mb->req = seq;
    }
}

__global__ void host_wait_kernel(const HostMailbox* mb, const uint32_t* seq_dev, const float4* part_host, float4* part,
                                 uint32_t count4) {
    if (threadIdx.x == 0) {
        const uint32_t seq = *seq_dev;
        while (mb->done != seq) __nanosleep(64);
        __threadfence_system();
    }
    __syncthreads();
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count4) part[i] = __ldcv(part_host + i);  // not cached: the CPU wrote it
}

__global__ void stamp_kernel(uint64_t* dst) { *dst = globaltimer(); }

__global__ void calibrate_kernel(const volatile uint32_t* go, volatile uint64_t* out) {
    while (*go == 0) {
    }
    *out = globaltimer();
}

}  // namespace

const HostTripOptions& host_trip_options() {
    static const HostTripOptions options = [] {
        HostTripOptions o;
        const char* trip = std::getenv("GPTOSS_HOST_MOE_TRIP");
        o.poll = !(trip != nullptr && std::strcmp(trip, "callback") == 0);
        o.stage = env_flag("GPTOSS_HOST_MOE_STAGE", true);
        o.blocking = env_flag("GPTOSS_HOST_MOE_BLOCKING", true);
        o.worker_spin = env_flag("GPTOSS_HOST_MOE_WORKER_SPIN", false);
        o.timing = env_flag("GPTOSS_HOST_MOE_TIMING", false);
        o.gpu_slots = -1;
        if (const char* v = std::getenv("GPTOSS_HOST_MOE_GPU_SLOTS"); v != nullptr && *v != 0) {
            char* end = nullptr;
            const long n = std::strtol(v, &end, 10);
            if (end != v && *end == 0 && n >= 0 && n <= 64) o.gpu_slots = int(n);
            else log(GPTOSS_LOG_WARN, "GPTOSS_HOST_MOE_GPU_SLOTS=%s is not a number in 0..64; using the default", v);
        }
        return o;
    }();
    return options;
}

cudaError_t launch_host_stage(const StepInfo* step, const uint16_t* xn, const int32_t* experts, uint32_t n, uint32_t H,
                              uint32_t K, StepInfo* step_host, uint16_t* xn_host, int32_t* experts_host, HostMailbox* mb,
                              uint32_t* seq_dev, uint32_t layer, cudaStream_t stream) {
    host_stage_kernel<<<1, kStageThreads, 0, stream>>>(step, reinterpret_cast<const uint32_t*>(xn), experts, n, H, K,
                                                       step_host, reinterpret_cast<uint32_t*>(xn_host), experts_host,
                                                       mb, seq_dev, layer);
    return cudaGetLastError();
}

cudaError_t launch_host_wait(const HostMailbox* mb, const uint32_t* seq_dev, const float* part_host, float* part,
                             size_t count, cudaStream_t stream) {
    const uint32_t count4 = uint32_t(count / 4), threads = 256;
    host_wait_kernel<<<std::max(1u, (count4 + threads - 1) / threads), threads, 0, stream>>>(
        mb, seq_dev, reinterpret_cast<const float4*>(part_host), reinterpret_cast<float4*>(part), count4);
    return cudaGetLastError();
}

// ---------------------------------------------------------------------------
// HostTripTimer

int64_t HostTripTimer::now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

HostTripTimer::~HostTripTimer() {
    if (g_ == nullptr) return;
    if (count_[0] > 0) {
        const double a = 1e-3 / double(count_[0]), b = count_[1] > 0 ? 1e-3 / double(count_[1]) : 0;
        std::fprintf(stderr,
                     "host-moe timing (%llu host layers at n = 1, µs per layer): pre %.1f (GPU before the inputs "
                     "leave -> CPU side starts), prep %.1f, experts %.1f, post %.1f (experts done -> GPU has the "
                     "outputs), round %.1f (GPU-side, g1 - g0), gpu between host layers %.1f\n",
                     static_cast<unsigned long long>(count_[0]), sum_[0] * a, sum_[1] * a, sum_[2] * a, sum_[3] * b,
                     sum_[4] * b, sum_[5] * b);
    }
    const std::string pass = cpu::host_profile::report();  // the experts pass's pieces (same switch)
    if (!pass.empty()) std::fprintf(stderr, "%s\n", pass.c_str());
    cpu::host_profile::reset();
    cudaFreeHost(g_);
}

// The offset of globaltimer to steady_clock: a kernel waits for a flag the host sets at h0 and
// answers with globaltimer; the host sees it at h1; offset = (h0 + h1) / 2 - g, best of 5.
cudaError_t HostTripTimer::init(uint32_t n_host) {
    cudaError_t err = cudaMallocHost(&g_, sizeof(uint64_t) * 2 * (n_host + 1));
    if (err != cudaSuccess) return err;
    h2_.assign(n_host, 0);
    std::memset(g_, 0, sizeof(uint64_t) * 2 * (n_host + 1));
    volatile uint32_t* go = reinterpret_cast<volatile uint32_t*>(g_ + 2 * n_host);
    volatile uint64_t* out = g_ + 2 * n_host + 1;
    int64_t best = INT64_MAX;
    for (int rep = 0; rep < 5; rep++) {
        *go = 0;
        *out = 0;
        calibrate_kernel<<<1, 1>>>(go, out);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        const int64_t h0 = now_ns();
        *go = 1;
        while (*out == 0) {
        }
        const int64_t h1 = now_ns();
        if (h1 - h0 < best) {
            best = h1 - h0;
            offset_ = (h0 + h1) / 2 - int64_t(*out);
        }
        if ((err = cudaDeviceSynchronize()) != cudaSuccess) return err;
    }
    std::fprintf(stderr, "host-moe timing: globaltimer offset measured with a %.1f µs round trip\n", best * 1e-3);
    return cudaSuccess;
}

cudaError_t HostTripTimer::stamp(uint32_t l, int which, cudaStream_t stream) {
    stamp_kernel<<<1, 1, 0, stream>>>(g_ + 2 * l + which);
    return cudaGetLastError();
}

void HostTripTimer::host(uint32_t l, uint32_t n, int64_t h0, int64_t h1, int64_t h2) {
    if (g_ == nullptr || l >= h2_.size()) return;
    const int64_t g0 = int64_t(g_[2 * l]) + offset_;
    if (n == 1) {
        sum_[0] += double(h0 - g0);
        sum_[1] += double(h1 - h0);
        sum_[2] += double(h2 - h1);
        count_[0]++;
        if (l > 0 && h2_[l - 1] != 0) {
            const int64_t p0 = int64_t(g_[2 * (l - 1)]) + offset_, p1 = int64_t(g_[2 * (l - 1) + 1]) + offset_;
            sum_[3] += double(p1 - h2_[l - 1]);
            sum_[4] += double(p1 - p0);
            sum_[5] += double(g0 - p1);
            count_[1]++;
        }
    }
    h2_[l] = n == 1 ? h2 : 0;
}

}  // namespace cuda
}  // namespace gptoss
