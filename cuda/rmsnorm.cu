// cuda/rmsnorm.cu - the residual stream update fused with the next RMSNorm: embedding lookup
// (first layer), MoE combine + residual add (end of each layer), then
// xn = bf16(x / sqrt(mean(x²) + eps) · w) in the permuted GEMM-input layout.
// Mirrors rmsnorm / the MoE sum of cpu/reference.h (MODEL.md §Forward pass); x stays fp32.
// Mapping: one CTA per token; virtual thread i of 1024 owns elements i + 1024·j (j < 4, so
// H <= 4096), all loaded before any arithmetic (decode runs this at T = 1, where it is pure
// latency); chunks of 64 tokens or more run 512 real threads of 2 virtual ones each (2 CTAs per
// SM). The sum of squares is reduced warp-then-CTA in a fixed order (rmsnorm_inv in common.cuh,
// shared with the fused decode router), so the bits do not depend on T or the CTA size.
// Floor: memory-bound, (4 + 4 + 2)·H bytes per token (+16·H for the MoE combine).
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/ll.cuh"


namespace gptoss {
namespace cuda {
namespace {

constexpr uint32_t kThreads = kNormThreads;
constexpr uint32_t kPer = kNormPer;
constexpr uint32_t kMaxSlots = 8;

// A split model's decode combine (ResidualArgs::ll, T = 1): v (element at(q, j) of this rank's
// contribution) becomes the sum over ranks in rank order. The peers' pairs are all requested
// before any is waited for (one round trip, not Q · P).
template <uint32_t Q, uint32_t P>
__device__ __forceinline__ void all_reduce_ll(const LlReduce& ll, float (&v)[Q][P], uint32_t H, uint32_t seq) {
    constexpr uint32_t R = kThreads / Q;
    const auto at = [](uint32_t q, uint32_t j) { return threadIdx.x + R * q + kThreads * j; };
#pragma unroll
    for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
        for (uint32_t j = 0; j < P; ++j)
            if (at(q, j) < H) ll_push(ll, at(q, j), v[q][j], seq);
    float s[Q][P];
#pragma unroll
    for (uint32_t r = 0; r < kLlMaxRanks; ++r) {
        if (r >= ll.n) break;
        const uint2* src = ll.src + size_t(r) * ll.count;
        uint2 w[Q][P];
        if (r != ll.rank) {
#pragma unroll
            for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
                for (uint32_t j = 0; j < P; ++j) w[q][j] = at(q, j) < H ? ld_ll_pair(src + at(q, j)) : make_uint2(0, seq);
        }
#pragma unroll
        for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
            for (uint32_t j = 0; j < P; ++j) {
                const float x = r == ll.rank ? v[q][j] : at(q, j) < H ? ll_value(src + at(q, j), w[q][j], seq) : 0.0f;
                s[q][j] = r == 0 ? x : s[q][j] + x;
            }
    }
#pragma unroll
    for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
        for (uint32_t j = 0; j < P; ++j) v[q][j] = s[q][j];
}

// R threads per token, each playing kThreads / R virtual threads of rmsnorm_inv's order (so the
// bits do not depend on R); P = elements per virtual thread in use (H <= kThreads · P, the
// rest are zeros to rmsnorm_inv), S = MoE slots loaded (K <= S).
template <uint32_t R, uint32_t P, uint32_t S>
__global__ __launch_bounds__(R) void f32_residual_rmsnorm_kernel(ResidualArgs a, float* __restrict__ x,
                                                                const float* __restrict__ w, float eps,
                                                                uint16_t* __restrict__ xn, uint32_t H) {
    constexpr uint32_t Q = kThreads / R;
    __shared__ float partial[kThreads / 32];
    const auto at = [](uint32_t q, uint32_t j) { return threadIdx.x + R * q + kThreads * j; };
    float wn[Q][P];  // the norm weight: read only, so loaded before the dependency wait
#pragma unroll
    for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
        for (uint32_t j = 0; j < P; ++j) wn[q][j] = at(q, j) < H ? __ldg(w + at(q, j)) : 0.0f;
    __shared__ uint32_t ll_seq;
    if (a.ll.n > 0) {  // a split model's folded all-reduce: its sequence number, before the wait
        if (threadIdx.x == 0) ll_seq = ll_take_seq(a.ll.ctl);
        __syncthreads();
    }
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t t = blockIdx.x;
    float* xr = x + size_t(t) * H;
    float v[Q][P];
    if (a.mode == ResidualMode::kEmbed) {
        const uint16_t* row = a.embed + size_t(__ldg(a.tokens + t)) * H;
#pragma unroll
        for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
            for (uint32_t j = 0; j < P; ++j) v[q][j] = at(q, j) < H ? bf16_bits_to_f32(row[at(q, j)]) : 0.0f;
    } else if (a.mode == ResidualMode::kMoeAdd) {
        float wt[S];  // unrolled: one memory round trip, not K
#pragma unroll
        for (uint32_t s = 0; s < S; ++s) wt[s] = s < a.K ? __ldg(a.weights + t * a.K + s) : 0.0f;
        float p[Q][P][S];
#pragma unroll
        for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
            for (uint32_t j = 0; j < P; ++j) {
                const uint32_t i = at(q, j);
                v[q][j] = i < H ? xr[i] : 0.0f;
#pragma unroll
                for (uint32_t s = 0; s < S; ++s)
                    p[q][j][s] = (s < a.K && i < H) ? __ldg(a.part + (size_t(t) * a.K + s) * H + i) : 0.0f;
            }
#pragma unroll
        for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
            for (uint32_t j = 0; j < P; ++j) {
                float sum = 0.0f;
#pragma unroll
                for (uint32_t s = 0; s < S; ++s)
                    if (s < a.K) sum = __fmaf_rn(wt[s], p[q][j][s], sum);
                // A split model's rank r != 0 contributes its experts' sum alone (x is rank 0's).
                v[q][j] = (a.ll.n > 0 && a.ll.rank != 0 ? 0.0f : v[q][j]) + sum;
            }
        if (a.ll.n > 0) all_reduce_ll<Q, P>(a.ll, v, H, ll_seq);
    } else {
#pragma unroll
        for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
            for (uint32_t j = 0; j < P; ++j) v[q][j] = at(q, j) < H ? xr[at(q, j)] : 0.0f;
    }
    const float inv =
        rmsnorm_inv<R>([&](uint32_t q, uint32_t j) { return j < P ? v[q][j] : 0.0f; }, H, eps, partial);
    uint16_t* out = xn + size_t(t) * H;
#pragma unroll
    for (uint32_t q = 0; q < Q; ++q)
#pragma unroll
        for (uint32_t j = 0; j < P; ++j) {
            const uint32_t i = at(q, j);
            if (i >= H) continue;
            if (a.mode != ResidualMode::kNone) xr[i] = v[q][j];
            out[permuted_k(i)] = f32_to_bf16_bits(v[q][j] * inv * wn[q][j]);
        }
}

// Chunks of kWideT tokens or more run 512 threads per token (2 CTAs per SM, so one token's loads
// overlap another's reduction and stores; bench/NOTES.md "v19 prefill RMSNorm"); fewer tokens
// (decode) keep 1024 threads per token, the least latency for one row. Same bits either way.
// (256 threads measured 0.3 % slower on the 20b prefill, 512 at T = 1 1.4 % slower decode.)
constexpr uint32_t kWideT = 64;

template <uint32_t R, uint32_t P>
gptoss_status launch_norm(const ResidualArgs& args, float* x, const float* norm_w, float eps, uint16_t* xn, uint32_t T,
                          uint32_t H, cudaStream_t stream) {
    if (args.mode == ResidualMode::kMoeAdd && args.K > 4)
        GPTOSS_LAUNCH((f32_residual_rmsnorm_kernel<R, P, kMaxSlots>), T, R, 0, stream, args, x, norm_w, eps, xn, H);
    else
        GPTOSS_LAUNCH((f32_residual_rmsnorm_kernel<R, P, 4>), T, R, 0, stream, args, x, norm_w, eps, xn, H);
    return GPTOSS_OK;
}

}  // namespace

gptoss_status residual_rmsnorm(const ResidualArgs& args, float* x, const float* norm_w, float eps,
                               uint16_t* xn, uint32_t T, uint32_t H, cudaStream_t stream) {
    if (T == 0) return GPTOSS_OK;
    if (H % 64 != 0 || H > kThreads * kPer)
        return fail(GPTOSS_ERR_UNSUPPORTED, "rmsnorm: H=%u must be a multiple of 64 and at most %u", H,
                    kThreads * kPer);
    if (args.mode == ResidualMode::kMoeAdd && args.K > kMaxSlots)
        return fail(GPTOSS_ERR_UNSUPPORTED, "rmsnorm: %u experts per token, at most %u", args.K, kMaxSlots);
    if (args.ll.n > 0 && (args.mode != ResidualMode::kMoeAdd || T != 1 || args.ll.count != H))
        return fail(GPTOSS_ERR_INTERNAL, "rmsnorm: the folded all-reduce takes one token's MoE combine (T=%u, %u floats)",
                    T, args.ll.count);
    const bool p3 = H <= kThreads * 3;
    if (T >= kWideT)
        return p3 ? launch_norm<512, 3>(args, x, norm_w, eps, xn, T, H, stream)
                  : launch_norm<512, kPer>(args, x, norm_w, eps, xn, T, H, stream);
    return p3 ? launch_norm<kThreads, 3>(args, x, norm_w, eps, xn, T, H, stream)
              : launch_norm<kThreads, kPer>(args, x, norm_w, eps, xn, T, H, stream);
}

}  // namespace cuda
}  // namespace gptoss
