// cuda/attention_prefill.cu - prefill attention with sinks on tensor cores, FlashAttention-2
// style: mma.sync m16n8k16 (bf16 in, fp32 accumulate), online softmax, no T×T matrix. One CTA
// owns 16 query tokens × the (≤ 8) query heads of one kv head; warp w is query head w of the
// group, its 16 MMA rows the 16 tokens, so the 8 heads share every K/V tile (GQA). Keys are
// visited in 64-key blocks aligned to absolute positions (cp.async double-buffered into
// XOR-swizzled shared memory, read with ldmatrix), from the block of the CTA's first visible
// key (sliding layers: its first token's window start) to the block of its last token; blocks
// entirely visible to every row skip the mask. The sink enters as the initial state of each
// row: running max m = S, denominator l = exp(S − m) = 1, output 0 (MODEL.md §Attention with
// sinks). A row's result depends only on its own q and the keys' values in absolute block
// order (a block masked for a row leaves its state bit-identical), never on which tokens
// share its CTA: a prompt prefilled at once or in chunks gives the same bits.
// Numerics: q is scaled by 1/8 (exact) and rounded to bf16, scores and P·V accumulate in fp32,
// P is rounded to bf16 for the P·V MMA while l sums the fp32 p; exp is ex2.approx.
#include "cuda/attention_mma.cuh"
#include "cuda/common.cuh"
#include "cuda/kernels.h"

#include <cmath>
#include <atomic>

namespace gptoss {
namespace cuda {
namespace {

using namespace attn_mma;

constexpr int kD = 64;                 // head dim
constexpr int kTok = 16;               // query tokens per CTA (the MMA's M)
constexpr int kMaxHeads = 8;           // query heads per kv head = warps per CTA
constexpr int kKeys = 64;              // keys per block
constexpr int kThreads = 32 * kMaxHeads;
constexpr int kTileBytes = kKeys * kD * 2;      // one K or V block: 8 KB
constexpr int kStageBytes = 2 * kTileBytes;     // K + V: 16 KB per pipeline stage
// Pipeline depth: the next block loads while this one is computed. 3 and 4 stages measured the
// same as 2 (H100, 20b pp2048 @ 8192: 26.1k, 26.1k, 26.3k tok/s), so 32 KB of shared memory.
constexpr int kStages = 2;
constexpr int kSmemBytes = kStages * kStageBytes;

// Issues the cp.async of keys [kb, kb + 64) of kv head g into one stage; keys outside [lo, hi]
// (seen by no row of the CTA) are zero-filled. Thread i copies chunk i % 8 of key rows i / 8 and
// i / 8 + 32, of K and of V.
__device__ __forceinline__ void load_block(const AttentionArgs& a, uint32_t stage, int kb, int lo, int hi,
                                           int pos0, int g) {
    const int c = threadIdx.x & 7;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = (threadIdx.x >> 3) + 32 * half;
        cp_async_kv_chunk(a, kb + r, lo, hi, pos0, g, c, stage + swz(r, c), stage + kTileBytes + swz(r, c));
    }
}

// One barrier per key block. Registers capped for 2 CTAs per SM (128; one CTA per SM with ~146
// registers was 3 % slower, H100).
__global__ __launch_bounds__(kThreads, 2) void attention_prefill_mma_kernel(const AttentionArgs a) {
    extern __shared__ __align__(128) uint8_t smem[];
    pdl_wait();
    pdl_launch_dependents();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gq = lane >> 2, tq = lane & 3;  // MMA fragment row group / column pair
    const int g = blockIdx.x;
    const int hpg = int(a.Q / a.G);
    const int T = int(a.T);
    const int t0 = (int(gridDim.y) - 1 - int(blockIdx.y)) * kTok;  // the latest (longest) tokens first
    const int pos0 = a.step->pos0;
    const int W = int(a.window);
    const int p_first = pos0 + t0, p_last = pos0 + min(t0 + kTok, T) - 1;
    const int lo_first = W ? max(0, p_first - W + 1) : 0;  // the CTA's first visible key
    const int lo_last = W ? max(0, p_last - W + 1) : 0;    // its last token's first visible key
    const int kb_begin = lo_first & ~(kKeys - 1), kb_end = p_last & ~(kKeys - 1);
    const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

    const int n_blocks = (kb_end - kb_begin) / kKeys + 1;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < n_blocks) load_block(a, smem0 + uint32_t(s) * kStageBytes, kb_begin + s * kKeys, lo_first, p_last, pos0, g);
        cp_async_commit();
    }

    const bool active = warp < hpg;
    const int head = g * hpg + warp;
    // Rows gq and gq + 8 of this lane: tokens t0 + gq, t0 + gq + 8.
    const int pr[2] = {p_first + gq, p_first + gq + 8};
    const int lr[2] = {W ? max(0, pr[0] - W + 1) : 0, W ? max(0, pr[1] - W + 1) : 0};
    uint32_t qf[4][4];  // A fragments of q/8, k-steps of 16 dims
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int t = t0 + gq + 8 * i;
        const bool ok = active && t < T;
        const float* qr = a.q + (size_t(t) * a.Q + head) * kD;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const int d = 16 * ks + 8 * hi + 2 * tq;
                const float2 v = ok ? *reinterpret_cast<const float2*>(qr + d) : make_float2(0.0f, 0.0f);
                qf[ks][2 * hi + i] = pack_bf16x2(v.x * 0.125f, v.y * 0.125f);
            }
        }
    }
    // Per row: running max m (natural-log units), this lane's partial denominator l (the sink's
    // exp(S − m) = 1 sits in lane tq = 0's share) and the output accumulator o.
    const float sink = active ? a.sinks[head] : 0.0f;
    float m[2] = {sink, sink};
    float l[2] = {tq == 0 ? 1.0f : 0.0f, tq == 0 ? 1.0f : 0.0f};
    float o[8][4];
#pragma unroll
    for (int nd = 0; nd < 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;

    int stage = 0;  // = ib % kStages
    for (int ib = 0; ib < n_blocks; ++ib) {
        const int kb = kb_begin + ib * kKeys;
        cp_async_wait<kStages - 2>();  // block ib has landed (this thread's part)
        __syncthreads();               // ... everyone's part; and block ib - 1 is no longer read
        {
            const int ahead = ib + kStages - 1, st = stage == 0 ? kStages - 1 : stage - 1;  // = ahead % kStages
            if (ahead < n_blocks)
                load_block(a, smem0 + uint32_t(st) * kStageBytes, kb_begin + ahead * kKeys, lo_first, p_last, pos0, g);
            cp_async_commit();
        }
        if (active) {
            const uint32_t kbase = smem0 + uint32_t(stage) * kStageBytes, vbase = kbase + kTileBytes;
            float s[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
                for (int np = 0; np < 4; ++np) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(kbase + swz((2 * np + (lane >> 4)) * 8 + (lane & 7), 2 * ks + ((lane >> 3) & 1)), b0, b1,
                            b2, b3);
                    mma(s[2 * np], qf[ks], b0, b1);
                    mma(s[2 * np + 1], qf[ks], b2, b3);
                }
            }
            const bool full = kb + kKeys - 1 <= p_first && kb >= lo_last;  // visible to every row
            if (!full) {
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = kb + nt * 8 + 2 * tq + (e & 1), i = e >> 1;
                        if (key > pr[i] || key < lr[i]) s[nt][e] = -INFINITY;
                    }
                }
            }
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
            }
            float ml[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                const float alpha = ex2(__fmul_rn(__fsub_rn(m[i], mx[i]), kLog2e));
                m[i] = mx[i];
                ml[i] = __fmul_rn(mx[i], kLog2e);
                l[i] = __fmul_rn(l[i], alpha);
#pragma unroll
                for (int nd = 0; nd < 8; ++nd) {
                    o[nd][2 * i] = __fmul_rn(o[nd][2 * i], alpha);
                    o[nd][2 * i + 1] = __fmul_rn(o[nd][2 * i + 1], alpha);
                }
            }
            uint32_t pa[4][4];  // P as A fragments, k-steps of 16 keys
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                float p[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) p[e] = ex2(__fmaf_rn(s[nt][e], kLog2e, -ml[e >> 1]));
                l[0] = __fadd_rn(l[0], __fadd_rn(p[0], p[1]));
                l[1] = __fadd_rn(l[1], __fadd_rn(p[2], p[3]));
                pa[nt >> 1][2 * (nt & 1)] = pack_bf16x2(p[0], p[1]);
                pa[nt >> 1][2 * (nt & 1) + 1] = pack_bf16x2(p[2], p[3]);
            }
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
                for (int dp = 0; dp < 4; ++dp) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4_trans(vbase + swz(16 * kk + ((lane >> 3) & 1) * 8 + (lane & 7), 2 * dp + (lane >> 4)), b0,
                                  b1, b2, b3);
                    mma(o[2 * dp], pa[kk], b0, b1);
                    mma(o[2 * dp + 1], pa[kk], b2, b3);
                }
            }
        }
        stage = stage + 1 == kStages ? 0 : stage + 1;
    }
    if (!active) return;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int t = t0 + gq + 8 * i;
        float li = __fadd_rn(l[i], __shfl_xor_sync(0xffffffffu, l[i], 1));
        li = __fadd_rn(li, __shfl_xor_sync(0xffffffffu, li, 2));
        if (t >= T) continue;
        const float inv = __frcp_rn(li);
        uint16_t* out = a.out + size_t(t) * a.Q * kD;
#pragma unroll
        for (int nd = 0; nd < 8; ++nd) {
            const uint32_t k = uint32_t(head * kD + nd * 8 + 2 * tq);  // even: k, k + 1 stay adjacent
            *reinterpret_cast<uint32_t*>(out + permuted_k(k)) =
                pack_bf16x2(__fmul_rn(o[nd][2 * i], inv), __fmul_rn(o[nd][2 * i + 1], inv));
        }
    }
}

}  // namespace

gptoss_status attention_prefill(const AttentionArgs& a, cudaStream_t stream) {
    if (a.D != kD) return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA attention: head_dim %u, only 64 is supported", a.D);
    if (a.G == 0 || a.Q % a.G != 0 || a.Q / a.G > kMaxHeads)
        return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA attention: %u query heads per kv head, at most %d supported",
                    a.G ? a.Q / a.G : 0, kMaxHeads);
    if (a.slots == 0) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "attention_prefill: the KV cache has 0 slots");
    if (!a.k_new || !a.v_new) return fail(GPTOSS_ERR_INTERNAL, "attention_prefill: k_new/v_new not set");
    if (a.T == 0) return GPTOSS_OK;
    const uint32_t tiles = ceil_div(a.T, kTok);
    if (tiles > 65535u) return fail(GPTOSS_ERR_UNSUPPORTED, "attention_prefill: %u tokens in one chunk", a.T);
    // The attribute is per device (a model split over GPUs launches on several); benign race:
    // the attribute call is idempotent.
    static std::atomic<uint64_t> configured{0};
    int dev = 0;
    GPTOSS_CUDA_TRY(cudaGetDevice(&dev));
    const uint64_t bit = dev >= 0 && dev < 64 ? (uint64_t(1) << dev) : 0;
    if (!bit || !(configured.load() & bit)) {
        GPTOSS_CUDA_TRY(cudaFuncSetAttribute(attention_prefill_mma_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
        configured.fetch_or(bit);
    }
    // x = kv head, y = token tile: consecutive CTAs share the token tile (same K/V range in L2).
    GPTOSS_LAUNCH(attention_prefill_mma_kernel, dim3(a.G, tiles), kThreads, kSmemBytes, stream, a);
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
