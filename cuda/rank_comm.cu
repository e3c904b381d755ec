// cuda/rank_comm.cu - a split model's collectives on one rank: ncclAllReduce / ncclAllGather,
// NCCL symmetric windows, and the one-shot LSA all-reduce and all-gather kernels built on NCCL's
// device API (cuda/rank_comm.h says when each runs and why one barrier per all-reduce is safe).
// The device API needs nccl_device.h from NCCL >= 2.28 and a library of the same version as the
// header (ncclDevComm is passed by value); without them lsa mode falls back to nccl.
#include "cuda/rank_comm.h"
#include "cuda/common.cuh"

#ifdef GPTOSS_HAVE_NCCL

#if defined(__has_include)
#if __has_include(<nccl_device.h>) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
// NCCL 2.28's device headers have unused parameters (-Wextra -Werror); they are NCCL's.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <nccl_device.h>
#pragma GCC diagnostic pop
#define GPTOSS_HAVE_NCCL_DEVICE 1
#endif
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace gptoss {
namespace cuda {

extern std::atomic<bool> g_skip_collectives;  // multi_gpu.cu (gptoss-bench --no-collectives)

namespace {

constexpr int kLsaCtas = 32;        // LSA barriers per communicator = most CTAs of one kernel
constexpr int kReduceThreads = 256; // one float4 per thread per pass
constexpr int kGatherThreads = 512;

gptoss_status nccl_check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return GPTOSS_OK;
    return fail(GPTOSS_ERR_DEVICE, "NCCL: %s failed: %s", what, ncclGetErrorString(r));
}

}  // namespace

#ifdef GPTOSS_HAVE_NCCL_DEVICE
struct LsaState {
    ncclDevComm dev;
};

namespace {

// In place: x[0, count) = Σ_r (rank r's x), r = 0..n-1 in order. CTA b owns the b-th contiguous
// chunk on every rank and meets the peers' CTA b at LSA barrier b. Push: the rank stores its
// chunk into region `rank` of every peer's slot (NVLink stores, posted), the barrier (release /
// acquire) orders those stores before the peers' reads, and each rank then reads the peers'
// partials from its own window (local memory) and its own from x: one barrier and no remote
// load round trip (v17's pull version loaded every peer's slot over NVLink after the barrier).
// Launched with programmatic stream serialization: x is read only after pdl_wait().
// Region r of a slot holds count floats; count % 4 == 0 and n · count <= kLsaMaxFloats.
__global__ void __launch_bounds__(kReduceThreads) lsa_all_reduce_kernel(ncclDevComm dev, ncclWindow_t win,
                                                                         size_t slot_off, float* x, uint32_t count) {
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t chunk = (count / 4 + gridDim.x - 1) / gridDim.x * 4;
    const uint32_t beg = blockIdx.x * chunk;
    const uint32_t end = min(count, beg + chunk);
    const int me = dev.lsaRank, n = dev.lsaSize;
    const size_t region = size_t(count) * sizeof(float);
    for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        float* peer = static_cast<float*>(ncclGetLsaPointer(win, slot_off + size_t(me) * region, p));
        for (uint32_t i = beg + threadIdx.x * 4; i < end; i += blockDim.x * 4)
            *reinterpret_cast<float4*>(peer + i) = *reinterpret_cast<const float4*>(x + i);
    }
    ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), dev, ncclTeamTagLsa(), blockIdx.x);
    bar.sync(ncclCoopCta(), ::cuda::memory_order_acq_rel);
    const float* local = static_cast<const float*>(ncclGetLsaPointer(win, slot_off, me));
    for (uint32_t i = beg + threadIdx.x * 4; i < end; i += blockDim.x * 4) {
        const float4 own = *reinterpret_cast<const float4*>(x + i);
        float4 s = me == 0 ? own : __ldcg(reinterpret_cast<const float4*>(local + i));
        for (int p = 1; p < n; ++p) {
            const float4 v =
                p == me ? own : __ldcg(reinterpret_cast<const float4*>(local + size_t(p) * count + i));
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        }
        *reinterpret_cast<float4*>(x + i) = s;
    }
}

// buf [n · count]: slice r comes from rank r's buf, through rank r's gather region (at
// gather_off in its window). count % 4 == 0. The region is rewritten only by the next gather,
// after at least one collective that every peer entered after finishing this one.
__global__ void __launch_bounds__(kGatherThreads) lsa_all_gather_kernel(ncclDevComm dev, ncclWindow_t win,
                                                                         size_t gather_off, float* buf, uint32_t count) {
    {
        float4* mine = static_cast<float4*>(ncclGetLsaPointer(win, gather_off, dev.lsaRank));
        const float4* own = reinterpret_cast<const float4*>(buf + size_t(dev.lsaRank) * count);
        for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count / 4; i += gridDim.x * blockDim.x)
            mine[i] = own[i];
    }
    // CTA b copied the same indices on every rank that CTA b reads below, so one barrier per CTA.
    ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), dev, ncclTeamTagLsa(), blockIdx.x);
    bar.sync(ncclCoopCta(), ::cuda::memory_order_acq_rel);
    for (int p = 0; p < dev.lsaSize; ++p) {
        if (p == dev.lsaRank) continue;
        const float4* src = static_cast<const float4*>(ncclGetLsaPointer(win, gather_off, p));
        float4* dst = reinterpret_cast<float4*>(buf + size_t(p) * count);
        for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count / 4; i += gridDim.x * blockDim.x)
            dst[i] = __ldcg(src + i);
    }
}

}  // namespace
#else
struct LsaState {};
#endif  // GPTOSS_HAVE_NCCL_DEVICE

gptoss_status collective_mode_from_env(CollectiveMode* out) {
    const char* e = std::getenv("GPTOSS_MULTI_AR");
    if (!e || !*e || std::strcmp(e, "lsa") == 0) *out = CollectiveMode::kLsa;  // falls back to nccl if unavailable
    else if (std::strcmp(e, "nccl") == 0) *out = CollectiveMode::kNccl;
    else if (std::strcmp(e, "sym") == 0) *out = CollectiveMode::kSymmetric;
    else return fail(GPTOSS_ERR_INVALID_ARGUMENT, "GPTOSS_MULTI_AR is '%s': expected nccl, sym or lsa", e);
    return GPTOSS_OK;
}

const char* collective_mode_name(CollectiveMode mode) {
    switch (mode) {
    case CollectiveMode::kNccl: return "nccl";
    case CollectiveMode::kSymmetric: return "sym (NCCL symmetric memory)";
    case CollectiveMode::kLsa: return "lsa (NCCL device API, one-shot kernels)";
    }
    return "?";
}

gptoss_status rank_comm_alloc(RankComm* rc, BackendSession* session, size_t gather_floats) {
    const size_t coll = session_collective_bytes(session);
    if (coll == 0) return fail(GPTOSS_ERR_INTERNAL, "rank_comm_alloc: not a CUDA session");
    // lsa mode keeps the session's buffers out of the window: its large all-reduces then take
    // NCCL's ordinary kernels (in-place symmetric ones gave wrong sums on NCCL 2.28.3).
    rc->stage_off = rc->mode == CollectiveMode::kSymmetric ? (coll + 4095) / 4096 * 4096 : 0;
    rc->gather_off = rc->stage_off + 2 * kLsaMaxFloats * sizeof(float);
    rc->gather_floats = (gather_floats + 3) / 4 * 4;
    rc->sym_bytes = rc->gather_off + rc->gather_floats * sizeof(float);
    void* p = nullptr;
    GPTOSS_TRY(nccl_check(ncclMemAlloc(&p, rc->sym_bytes), "ncclMemAlloc"));
    rc->sym = static_cast<char*>(p);
    return GPTOSS_OK;
}

void rank_comm_free_unregistered(RankComm* rc) {
    if (rc->sym) ncclMemFree(rc->sym);
    rc->sym = nullptr;
    rc->mode = CollectiveMode::kNccl;
}

gptoss_status rank_comm_register(RankComm* rc, BackendSession* session) {
    GPTOSS_TRY(nccl_check(ncclCommWindowRegister(rc->comm, rc->sym, rc->sym_bytes, &rc->win, NCCL_WIN_COLL_SYMMETRIC),
                          "ncclCommWindowRegister"));
#ifdef GPTOSS_HAVE_NCCL_DEVICE
    if (rc->mode == CollectiveMode::kLsa) {
#ifdef NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER  // NCCL >= 2.29 checks its size, magic and version
        ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
        ncclDevCommRequirements reqs;
        std::memset(&reqs, 0, sizeof(reqs));
#endif
        reqs.lsaBarrierCount = kLsaCtas;  // lsaMultimem stays false: no NVLink multicast
        auto* st = new LsaState();
        const gptoss_status s = nccl_check(ncclDevCommCreate(rc->comm, &reqs, &st->dev), "ncclDevCommCreate");
        if (s != GPTOSS_OK) {
            delete st;
            return s;
        }
        rc->lsa = st;
    }
#endif
    if (rc->mode == CollectiveMode::kSymmetric) GPTOSS_TRY(place_session_collectives(session, rc->sym));
    GPTOSS_CUDA_TRY(cudaMemset(rc->sym + rc->stage_off, 0, rc->sym_bytes - rc->stage_off));
    return GPTOSS_OK;
}

void rank_comm_release(RankComm* rc) {
    if (rc->comm) {  // else aborted: the communicator took its registrations with it
#ifdef GPTOSS_HAVE_NCCL_DEVICE
        if (rc->lsa) ncclDevCommDestroy(rc->comm, &rc->lsa->dev);
#endif
        if (rc->win) ncclCommWindowDeregister(rc->comm, rc->win);
    }
    delete rc->lsa;
    rc->lsa = nullptr;
    rc->win = nullptr;
    if (rc->sym) ncclMemFree(rc->sym);
    rc->sym = nullptr;
}

gptoss_status rank_all_reduce(void* comm, float* x, size_t count, cudaStream_t stream) {
    if (g_skip_collectives) return GPTOSS_OK;
    auto* rc = static_cast<RankComm*>(comm);
#ifdef GPTOSS_HAVE_NCCL_DEVICE
    if (rc->lsa && count * size_t(rc->n_ranks) <= kLsaMaxFloats && count % 4 == 0) {
        const size_t slot = rc->stage_off + (rc->lsa_reduces++ % 2) * kLsaMaxFloats * sizeof(float);
        const int ctas = int(std::min<size_t>(kLsaCtas, (count + 4 * kReduceThreads - 1) / (4 * kReduceThreads)));
        return cuda_status(launch_pdl(lsa_all_reduce_kernel, dim3(ctas), dim3(kReduceThreads), 0, stream, rc->lsa->dev,
                                      rc->win, slot, x, uint32_t(count)),
                           "lsa_all_reduce_kernel", __FILE__, __LINE__);
    }
#endif
    return nccl_check(ncclAllReduce(x, x, count, ncclFloat, ncclSum, rc->comm, stream), "ncclAllReduce");
}

gptoss_status rank_all_gather(void* comm, float* buf, size_t count, cudaStream_t stream) {
    if (g_skip_collectives) return GPTOSS_OK;
    auto* rc = static_cast<RankComm*>(comm);
    if (rc->lsa_reduces % 2 != 0)
        return fail(GPTOSS_ERR_INTERNAL, "split model: an odd number of LSA all-reduces in one forward (%llu)",
                    (unsigned long long)rc->lsa_reduces);
#ifdef GPTOSS_HAVE_NCCL_DEVICE
    if (rc->lsa && count % 4 == 0 && count <= rc->gather_floats) {
        const int ctas = int(std::min<size_t>(kLsaCtas, (count / 4 + kGatherThreads - 1) / kGatherThreads));
        lsa_all_gather_kernel<<<ctas, kGatherThreads, 0, stream>>>(rc->lsa->dev, rc->win, rc->gather_off, buf,
                                                                   uint32_t(count));
        return cuda_status(cudaGetLastError(), "lsa_all_gather_kernel", __FILE__, __LINE__);
    }
#endif
    return nccl_check(ncclAllGather(buf + size_t(rc->rank) * count, buf, count, ncclFloat, rc->comm, stream),
                      "ncclAllGather");
}

bool lsa_available() {
#ifdef GPTOSS_HAVE_NCCL_DEVICE
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess && v == NCCL_VERSION_CODE;
#else
    return false;
#endif
}

}  // namespace cuda
}  // namespace gptoss
#endif  // GPTOSS_HAVE_NCCL
