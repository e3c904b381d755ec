// cuda/router_batch.cu - the batched step's MLP RMSNorm + router GEMM + top-K in one launch (steps
// of 2+ tokens; a lone token has router.cu's router_decode). It replaces residual_rmsnorm (kNone) +
// gemm + router_route's top-K, three of the four launches (with the work list) that cost ~10 µs
// per layer together inside the step's graph (bench/NOTES.md "v34"), and gives their bits: each
// CTA stages its tokens' rows, normalizes them with rmsnorm_inv (128 threads playing rmsnorm.cu's
// 1024), and warp w runs gemm.cu's chunk sequence
// (chunks w, w + 4, ... of its 16-expert slab, the same mma order) with token j in mma column j;
// the four warps' partial tiles are summed in warp order and the bias added, as gemm() does. The
// slab CTAs of one token group form a thread-block cluster: each stores its 16 logits per token
// into CTA 0's shared memory (DSMEM), and CTA 0 picks each token's top-K with router.cuh's
// warp_topk_softmax, as router_route does. router_group then builds the tiles (a second launch).
// Mapping: grid (E / 16 slabs, T tokens), clusters of the slabs, 128 threads, one token per CTA
// (~29 KB of shared memory); sm_90 only (router_batch_usable), other devices keep the three
// launches. Floor: latency (the router's 184 KB of weights are read while the O projection runs:
// PDL). Standalone under Nsight Compute (weights from DRAM) one 64-token launch took 17 µs.
#include "cuda/common.cuh"
#include "cuda/gemm.cuh"
#include "cuda/kernels.h"
#include "cuda/router.cuh"

#include <algorithm>

namespace gptoss {
namespace cuda {
namespace {

using namespace router_detail;

// Tokens per CTA: 1. The code takes up to 8 (mma columns 0 .. kTok - 1), but 2, 4 and 8 tokens
// per CTA measured slower (H200 per-step profile at 64 tokens: 0.349 ms for the layers' router at 1,
// 0.406 at 2, 0.526 at 4; at 8 ~0.8): each CTA normalizes its tokens one after another.
constexpr uint32_t kTok = 1;
constexpr uint32_t kDepth = 12;           // weight chunks per warp in registers (router_decode's ring)
constexpr uint32_t kMaxClusterSlabs = 8;  // the portable cluster size: E <= 128
constexpr uint32_t kMaxH = kNormThreads * kNormPer;

// Dynamic shared memory: xf fp32 [tok][H] (the rows), wf fp32 [H] (the norm weight), xs bf16
// [tok][H + 8] (the normed rows, permuted; 16 bytes of padding per row so the tokens' B fragment
// loads fall in different banks).
size_t smem_bytes(uint32_t tok, uint32_t H) { return (size_t(tok) * H + H) * 4 + size_t(tok) * (H + 8) * 2; }

__global__ __launch_bounds__(128) void f32_router_batch_kernel(const RouterBatchArgs a) {
    using namespace gemm_detail;
    extern __shared__ __align__(16) float smem[];
    __shared__ float logits[kTok * kMaxClusterSlabs * 16];  // CTA 0's: every slab's logits of the group
    __shared__ float partial[kTok][kNormThreads / 32];
    __shared__ float red[4][32 * 4];
    cluster_arrive_relaxed();  // first half of the barrier that makes CTA 0's logits safe to store into
    const uint32_t lane = threadIdx.x & 31, kw = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t E = a.router.N, H = a.router.K, n_chunks = H >> 6, slab = blockIdx.x;
    const uint32_t t0 = blockIdx.y * kTok, cnt = min(kTok, a.T - t0), xs_stride = H + 8;
    float* xf = smem;
    float* wf = xf + kTok * H;
    uint16_t* xs = reinterpret_cast<uint16_t*>(wf + H);

    // Before the dependency wait: the weight chain, the norm weight and the bias (read only).
    const uint4* wp = reinterpret_cast<const uint4*>(a.router.w) + size_t(slab) * n_chunks * 128 + lane;
    Chunk ring[kDepth];
#pragma unroll
    for (uint32_t i = 0; i < kDepth; ++i) {
        const uint32_t cc = kw + 4u * i;
        if (cc < n_chunks) load_chunk<false>(ring[i], wp, nullptr, cc);
    }
    for (uint32_t i = threadIdx.x; i < H / 4; i += blockDim.x) cp_async16(wf + 4 * i, a.norm_w + 4 * i);
    const uint32_t e_lo = slab * 16 + g, e_hi = e_lo + 8;  // the experts this lane's outputs belong to
    float b_lo = 0.0f, b_hi = 0.0f;
    if (a.router.bias && threadIdx.x < 32) {
        if (e_lo < E) b_lo = __ldg(a.router.bias + e_lo);
        if (e_hi < E) b_hi = __ldg(a.router.bias + e_hi);
    }
    pdl_wait();
    pdl_launch_dependents();
    const float* xg = a.x + size_t(t0) * H;
    for (uint32_t i = threadIdx.x; i < cnt * H / 4; i += blockDim.x) cp_async16(xf + 4 * i, xg + 4 * i);
    cp_async_wait_all();
    __syncthreads();
    // The norm, token by token (rmsnorm_inv's order; a partial array per token, so no barrier
    // between them), into xs and, from slab 0's CTA, into xn.
    for (uint32_t j = 0; j < cnt; ++j) {
        const float* row = xf + j * H;
        const float inv = rmsnorm_inv<128>(
            [&](uint32_t q, uint32_t p) {
                const uint32_t i = threadIdx.x + 128 * q + kNormThreads * p;
                return i < H ? row[i] : 0.0f;
            },
            H, a.eps, partial[j]);
        uint16_t* xr = xs + j * xs_stride;
        uint16_t* xn = a.xn + size_t(t0 + j) * H;
        for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) {
            const uint16_t b = f32_to_bf16_bits(row[i] * inv * wf[i]);
            xr[permuted_k(i)] = b;
            if (slab == 0) xn[permuted_k(i)] = b;
        }
    }
    __syncthreads();

    // gemm.cu's chain for this warp's chunks, token g in column g (columns past cnt read zeros).
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint4* xrow = reinterpret_cast<const uint4*>(xs + g * xs_stride + t * 16);
    const bool col = g < cnt;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (uint32_t base = kw; base < n_chunks; base += 4u * kDepth) {
#pragma unroll
        for (uint32_t i = 0; i < kDepth; ++i) {
            const uint32_t c = base + 4u * i;
            if (c >= n_chunks) break;
            const uint4 xb0 = col ? xrow[size_t(c) * 8] : zero;
            const uint4 xb1 = col ? xrow[size_t(c) * 8 + 1] : zero;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                uint32_t af[4];
                fragment<false>(ring[i], j, af);
                const uint4 b = (j >> 1) ? xb1 : xb0;
                mma(acc, af, (j & 1) ? b.z : b.x, (j & 1) ? b.w : b.y);
            }
            const uint32_t cn = c + 4u * kDepth;
            if (cn < n_chunks) load_chunk<false>(ring[i], wp, nullptr, cn);
        }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) red[kw][lane * 4 + e] = acc[e];
    __syncthreads();
    // Warp 0 sums the parts in warp order: lane (g, t) holds experts e_lo / e_hi of tokens 2t, 2t + 1
    // (the mma accumulator layout), stores them to logits and into CTA 0's shared copy.
    cluster_wait_acquire();  // every CTA of the cluster has started
    if (threadIdx.x < 32) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const uint32_t i = lane * 4 + e, tok = 2 * t + (e & 1), ex = (e & 2) ? e_hi : e_lo;
            const float s = __fadd_rn(__fadd_rn(__fadd_rn(red[0][i], red[1][i]), red[2][i]), red[3][i]);
            const float v = s + ((e & 2) ? b_hi : b_lo);
            if (tok < cnt && ex < E) {
                a.logits[size_t(t0 + tok) * E + ex] = v;
                st_cluster_f32(&logits[tok * E + ex], 0, v);
            }
        }
    }
    cluster_arrive_release();
    cluster_wait_acquire();
    if (slab != 0) return;
    // CTA 0: warp w routes tokens w and w + 4 (router_route's top-K, the same function).
    for (uint32_t j = kw; j < cnt; j += 4) {
        int32_t idx[kMaxK];
        float wt[kMaxK];
        warp_topk_softmax(logits + j * E, E, a.K, lane, idx, wt);
        if (lane == 0) {
            for (uint32_t k = 0; k < a.K; ++k) {
                a.experts[(t0 + j) * a.K + k] = idx[k];
                a.weights[(t0 + j) * a.K + k] = wt[k];
            }
        }
    }
}

bool usable_uncached(uint32_t E, uint32_t K, uint32_t H) {
    if (E == 0 || E > 16 * kMaxClusterSlabs || K == 0 || K > kMaxK || K > E || H == 0 || H % 64 != 0 ||
        H > kMaxH || !pdl_supported())
        return false;
    DeviceProps dp;
    if (current_device_props(&dp) != cudaSuccess || smem_bytes(kTok, H) > size_t(dp.max_smem_optin)) {
        cudaGetLastError();
        return false;
    }
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, f32_router_batch_kernel) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return fa.binaryVersion >= 90;
}

// The shared-memory opt-in (the most any H asks, capped by the device; once per thread and
// device), then the clusters of slab CTAs with PDL.
gptoss_status launch(const RouterBatchArgs& a, cudaStream_t stream) {
    thread_local int opted_for = -1;
    DeviceProps dp;
    GPTOSS_CUDA_TRY(current_device_props(&dp));
    if (opted_for != dp.dev) {
        const size_t most = std::min(smem_bytes(kTok, kMaxH), size_t(dp.max_smem_optin));
        GPTOSS_CUDA_TRY(
            cudaFuncSetAttribute(f32_router_batch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most)));
        opted_for = dp.dev;
    }
    const uint32_t slabs = ceil_div(a.router.N, 16);
    return cuda_status(launch_pdl_cluster(f32_router_batch_kernel, dim3(slabs, ceil_div(a.T, kTok)), dim3(128),
                                          smem_bytes(kTok, a.router.K), stream, dim3(slabs, 1, 1), a),
                       "f32_router_batch_kernel", __FILE__, __LINE__);
}
}  // namespace

bool router_batch_usable(uint32_t E, uint32_t K, uint32_t H) {
    // Asked per layer and step: the answer for the last (device, E, K, H) is kept per thread.
    thread_local int dev = -1;
    thread_local uint32_t key[3] = {0, 0, 0};
    thread_local bool ok = false;
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    if (d != dev || key[0] != E || key[1] != K || key[2] != H) {
        ok = usable_uncached(E, K, H);
        dev = d;
        key[0] = E, key[1] = K, key[2] = H;
    }
    return ok;
}

gptoss_status router_batch(const RouterBatchArgs& a, cudaStream_t stream) {
    const uint32_t E = a.router.N, H = a.router.K;
    if (a.router.mxfp4 || !router_batch_usable(E, a.K, H))
        return fail(GPTOSS_ERR_UNSUPPORTED,
                    "CUDA router_batch: %u experts / top-%u / hidden %u on this device (needs sm_90 clusters, bf16, "
                    "E <= %u, K <= %u, H %% 64 == 0, H <= %u)",
                    E, a.K, H, 16 * kMaxClusterSlabs, kMaxK, kMaxH);
    if (!a.x || !a.norm_w || !a.xn || !a.logits || !a.experts || !a.weights)
        return fail(GPTOSS_ERR_INTERNAL, "CUDA router_batch: x, norm_w, xn, logits, experts and weights are required");
    if (a.T == 0) return GPTOSS_OK;
    return launch(a, stream);
}

}  // namespace cuda
}  // namespace gptoss
