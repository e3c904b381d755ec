// cuda/rank_comm.cu - a split model's collectives on one rank: ncclAllReduce / ncclAllGather,
// NCCL symmetric windows, and the one-shot LSA all-reduce and all-gather kernels built on NCCL's
// device API (cuda/rank_comm.h says when each runs and why one barrier per all-reduce is safe).
// The device API needs nccl_device.h from NCCL >= 2.28 and a library of the same version as the
// header (ncclDevComm is passed by value); without them lsa mode falls back to nccl.
#include "cuda/rank_comm.h"
#include "cuda/common.cuh"
#include "cuda/ll.cuh"
#include "cuda/multi_gpu.h"

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
    uint32_t* seq = nullptr;  // device [2 slots][2]: the slot's last sequence number, and the CTAs of the
                              // current all-reduce on it that have finished (the last one bumps the number)
};

namespace {

// 16 bytes = two (value, sequence) pairs, NCCL's LL protocol: each 8-byte half is stored and loaded
// whole, so a reader that sees the sequence number in a half sees that half's value.
__device__ __forceinline__ void st_ll(uint4* p, float a, float b, uint32_t seq) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(__float_as_uint(a)), "r"(seq),
                 "r"(__float_as_uint(b)), "r"(seq)
                 : "memory");
}
__device__ __forceinline__ float2 ld_ll(const uint4* p, uint32_t seq) {
    uint4 v;
    do {
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p)
                     : "memory");
    } while (v.y != seq || v.w != seq);
    return make_float2(__uint_as_float(v.x), __uint_as_float(v.z));
}

// In place: x[0, count) = Σ_r (rank r's x), r = 0..n-1 in order. CTA b owns the b-th contiguous
// chunk on every rank. Push, LL: the rank stores its chunk as (value, sequence) pairs into its
// own region of every peer's slot over NVLink (posted stores, no fence), then waits in its own
// window (local memory) until every peer's pairs carry this all-reduce's sequence number, and
// sums in rank order, its own partial from x. No barrier, no remote load: one NVLink one-way
// latency (v17 pulled the peers' slots after an LSA barrier). The sequence number counts the
// all-reduces on this slot: ctl[0] holds the last one, every CTA takes it before pdl_wait, and
// the last CTA to take it (ctl[1] counts them) writes it back bumped (ll.cuh ll_take_seq), so no
// word left in the slot by any earlier all-reduce, of whatever length and layout, carries the
// number being waited for.
// It lives in device memory, so graph replays advance it; every rank runs the same all-reduces,
// so the numbers agree. Slot reuse: a rank writes slot s again two all-reduces later, after it
// has received every peer's pairs of the one in between, which each peer sends only after its
// kernel on slot s ended. Launched with programmatic stream serialization.
// Region r of a slot holds 2 · count words; count % 4 == 0 and 2 · n · count <= kLsaMaxFloats.
__global__ void __launch_bounds__(kReduceThreads) lsa_all_reduce_kernel(ncclDevComm dev, ncclWindow_t win,
                                                                         size_t slot_off, uint32_t* ctl, float* x,
                                                                         uint32_t count) {
    __shared__ uint32_t seq_s;
    if (threadIdx.x == 0) seq_s = ll_take_seq(ctl);  // before the wait: see ll_take_seq
    __syncthreads();
    const uint32_t seq = seq_s;
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t chunk = (count / 4 + gridDim.x - 1) / gridDim.x * 4;
    const uint32_t beg = blockIdx.x * chunk;
    const uint32_t end = min(count, beg + chunk);
    const int me = dev.lsaRank, n = dev.lsaSize;
    const size_t region = size_t(count) * 2 * sizeof(float);  // bytes: (value, sequence) per float
    for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        uint4* peer = static_cast<uint4*>(ncclGetLsaPointer(win, slot_off + size_t(me) * region, p));
        for (uint32_t i = beg + threadIdx.x * 4; i < end; i += blockDim.x * 4) {
            const float4 v = *reinterpret_cast<const float4*>(x + i);
            st_ll(peer + i / 2, v.x, v.y, seq);
            st_ll(peer + i / 2 + 1, v.z, v.w, seq);
        }
    }
    const char* local = static_cast<const char*>(ncclGetLsaPointer(win, slot_off, me));
    for (uint32_t i = beg + threadIdx.x * 4; i < end; i += blockDim.x * 4) {
        const float4 own = *reinterpret_cast<const float4*>(x + i);
        float4 s = own;
        for (int p = 0; p < n; ++p) {
            float4 v = own;
            if (p != me) {
                const uint4* src = reinterpret_cast<const uint4*>(local + size_t(p) * region) + i / 2;
                const float2 a = ld_ll(src, seq), b = ld_ll(src + 1, seq);
                v = make_float4(a.x, a.y, b.x, b.y);
            }
            if (p == 0) s = v;
            else s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
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

// out[k · kLlMaxRanks + r] = slot k's base in rank r's window (slot k at slot_off + k · slot_bytes).
__global__ void lsa_slot_pointers_kernel(ncclDevComm dev, ncclWindow_t win, size_t slot_off, size_t slot_bytes,
                                         char** out) {
    const int r = int(threadIdx.x);
    if (r >= dev.lsaSize || r >= int(kLlMaxRanks)) return;
    for (int k = 0; k < 2; ++k)
        out[k * kLlMaxRanks + r] = static_cast<char*>(ncclGetLsaPointer(win, slot_off + size_t(k) * slot_bytes, r));
}

// Resolves rc->slot_ptr (the window is registered, rc->lsa->dev created; current device: the rank's).
gptoss_status resolve_slot_pointers(RankComm* rc) {
    if (rc->n_ranks > int(kLlMaxRanks)) return GPTOSS_OK;  // rank_ll_reduce stays off
    char** d = nullptr;
    const size_t bytes = 2 * kLlMaxRanks * sizeof(char*);
    GPTOSS_CUDA_TRY(cudaMalloc(&d, bytes));
    lsa_slot_pointers_kernel<<<1, kLlMaxRanks>>>(rc->lsa->dev, rc->win, rc->stage_off, kLsaMaxFloats * sizeof(float), d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(rc->slot_ptr, d, bytes, cudaMemcpyDeviceToHost);
    cudaFree(d);
    return cuda_status(e, "lsa_slot_pointers_kernel", __FILE__, __LINE__);
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
        if (cudaMalloc(&st->seq, 4 * sizeof(uint32_t)) != cudaSuccess ||
            cudaMemset(st->seq, 0, 4 * sizeof(uint32_t)) != cudaSuccess) {
            cudaGetLastError();
            if (st->seq) cudaFree(st->seq);
            delete st;
            return fail(GPTOSS_ERR_OUT_OF_MEMORY, "split model: the LSA all-reduce's sequence counters (%d bytes)",
                        int(4 * sizeof(uint32_t)));
        }
        const gptoss_status s = nccl_check(ncclDevCommCreate(rc->comm, &reqs, &st->dev), "ncclDevCommCreate");
        if (s != GPTOSS_OK) {
            cudaFree(st->seq);
            delete st;
            return s;
        }
        rc->lsa = st;
        GPTOSS_TRY(resolve_slot_pointers(rc));
    }
#endif
    if (rc->mode == CollectiveMode::kSymmetric) GPTOSS_TRY(place_session_collectives(session, rc->sym));
    GPTOSS_CUDA_TRY(cudaMemset(rc->sym + rc->stage_off, 0, rc->sym_bytes - rc->stage_off));
    return GPTOSS_OK;
}

void rank_comm_release(RankComm* rc) {
    // Without rc->comm (aborted) the communicator took its registrations with it.
#ifdef GPTOSS_HAVE_NCCL_DEVICE
    if (rc->lsa) {
        if (rc->comm) ncclDevCommDestroy(rc->comm, &rc->lsa->dev);
        if (rc->lsa->seq) cudaFree(rc->lsa->seq);  // the caller made the rank's device current
    }
#endif
    if (rc->comm && rc->win) ncclCommWindowDeregister(rc->comm, rc->win);
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
    if (rc->lsa && 2 * count * size_t(rc->n_ranks) <= kLsaMaxFloats && count % 4 == 0) {
        const uint64_t k = rc->lsa_reduces++ % 2;
        const size_t slot = rc->stage_off + k * kLsaMaxFloats * sizeof(float);
        const int ctas = int(std::min<size_t>(kLsaCtas, (count + 4 * kReduceThreads - 1) / (4 * kReduceThreads)));
        return cuda_status(launch_pdl(lsa_all_reduce_kernel, dim3(ctas), dim3(kReduceThreads), 0, stream, rc->lsa->dev,
                                      rc->win, slot, rc->lsa->seq + 2 * k, x, uint32_t(count)),
                           "lsa_all_reduce_kernel", __FILE__, __LINE__);
    }
#endif
    return nccl_check(ncclAllReduce(x, x, count, ncclFloat, ncclSum, rc->comm, stream), "ncclAllReduce");
}

bool rank_ll_reduce(void* comm, size_t count, LlReduce* out) {
    auto* rc = static_cast<RankComm*>(comm);
    if (g_skip_collectives || !rc->lsa || rc->n_ranks > int(kLlMaxRanks) || !rc->slot_ptr[0][0] ||
        2 * count * size_t(rc->n_ranks) > kLsaMaxFloats)
        return false;
#ifdef GPTOSS_HAVE_NCCL_DEVICE
    const uint64_t k = rc->lsa_reduces++ % 2;
    const uint32_t me = uint32_t(rc->lsa->dev.lsaRank);
    *out = LlReduce{};
    out->n = uint32_t(rc->n_ranks);
    out->rank = me;
    out->count = uint32_t(count);
    out->ctl = rc->lsa->seq + 2 * k;
    out->src = reinterpret_cast<const uint2*>(rc->slot_ptr[k][me]);
    for (uint32_t r = 0; r < out->n; ++r)
        out->dst[r] = reinterpret_cast<uint2*>(rc->slot_ptr[k][r]) + size_t(me) * count;
    return true;
#else
    return false;
#endif
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
