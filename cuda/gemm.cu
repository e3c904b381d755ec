// cuda/gemm.cu - every matrix product of the forward pass: dense bf16 projections (QKV, O,
// router, lm_head) and the MXFP4 expert GEMMs (grouped by expert, SwiGLU fused), in one
// tensor-core kernel with the weights as the mma A operand ("swap-AB", KERNELS.md §0.2).
//
// Math: out[row, n] = Σ_k x[row, k] · W[n, k] + bias[n]; bf16 inputs, fp32 accumulation.
// Mapping: one CTA = one 16-row weight slab × 8·NB activation columns; its 4 warps split K
// (warp w takes 64-k chunks w, w+4, ...) and their partial tiles are summed in warp order
// through shared memory. Each lane streams its A fragments with 16-byte loads (the weights
// were repacked at load into that order), dequantizes MXFP4 in registers (shift/mask + one
// bf16x2 multiply by 2^(s-1) per pair) and reads its B fragments with two 16-byte loads per
// row and chunk from the permuted activation rows; at decode (NB = 1, or 2 for the batched
// step's expert tiles) those ride in the same 4-deep ring as the weight chunks, so no mma
// waits on an activation load.
// Why this shape: an output's summation order depends only on (row, n), never on how many
// columns a CTA carries, so decode (NB = 1), prefill (NB = 8) and any expert grouping give
// bit-identical results.
// Floor (decode): bytes of W once per step, e.g. 20b QKV 29.5 MB → 8.8 µs at 3.35 TB/s
// (measured: 11.2 µs alone on the H200, bench/NOTES.md).
#include "cuda/common.cuh"
#include "cuda/gemm.cuh"
#include "cuda/kernels.h"

// Weight chunks in flight per warp at decode (NB = 1); -D overrides are for tuning runs only.
#ifndef GPTOSS_DECODE_DEPTH_FP4
#define GPTOSS_DECODE_DEPTH_FP4 4
#endif
#ifndef GPTOSS_DECODE_DEPTH_BF16
#define GPTOSS_DECODE_DEPTH_BF16 4
#endif

namespace gptoss {
namespace cuda {
namespace {
using namespace gemm_detail;

template <bool kFp4, int NB>
__global__ __launch_bounds__(128) void bf16_gemm_kernel(const KernelArgs args) {
    __shared__ float red[4][NB * 32 * 4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t slab = blockIdx.x;
    const uint32_t K = args.w.K, N = args.w.N, n_chunks = K >> 6;

    // Dense: stream the first chunks of weights before waiting for the previous kernel
    // (weights are never written). Routed: the expert comes from the router, so wait first.
    if (args.routed) pdl_wait();
    int expert = 0;
    uint32_t col_base, n_cols;
    const int32_t* pairs = nullptr;
    if (args.routed) {
        const int32_t n_tiles = args.route.tiles[0];
        if (int(blockIdx.y) >= n_tiles) return;
        const int32_t* ti = args.route.tiles + 1 + 3 * blockIdx.y;
        expert = ti[0];
        col_base = uint32_t(ti[1]);
        n_cols = uint32_t(ti[2]);
        pairs = args.route.pairs + col_base;
    } else {
        col_base = blockIdx.y * 8u * NB;
        n_cols = min(8u * NB, args.n_rows - col_base);
    }

    const uint4* wp;
    const uint2* sp;
    slab_pointers<kFp4>(args.w, expert, slab, n_chunks, lane, &wp, &sp);

    // Ring of kDepth weight chunks in flight per warp (decode is otherwise a chain of
    // dependent round trips).
    constexpr int kDepth = NB <= 2 ? (kFp4 ? GPTOSS_DECODE_DEPTH_FP4 : GPTOSS_DECODE_DEPTH_BF16) : 2;
    Chunk ring[kDepth];
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
        const uint32_t cc = uint32_t(warp) + 4u * i;
        if (cc < n_chunks) load_chunk<kFp4>(ring[i], wp, sp, cc);
    }
    if (!args.routed) pdl_wait();
    pdl_launch_dependents();

    // Column g of each 8-column tile: this lane's B fragments come from that row.
    const uint4* xrow[NB];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        const uint32_t c = uint32_t(nb * 8 + g);
        if (c < n_cols) {
            const uint32_t row = args.routed ? uint32_t(pairs[c]) / args.route.in_div : col_base + c;
            xrow[nb] = reinterpret_cast<const uint4*>(args.x + size_t(row) * K + t * 16);
        } else {
            xrow[nb] = nullptr;
        }
    }
    float acc[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.0f;

    // Decode (NB = 1; NB = 2 for the batched step's expert tiles of 16 pairs): the activation
    // fragments ride in the ring with their weight chunk, so the mma never waits on an L1/L2
    // round trip for them (ncu: the ring depth did not matter, the per-chunk activation loads did).
    constexpr bool kRing = NB <= 2;
    constexpr int kXDepth = kRing ? kDepth : 1;
    uint4 xring[kXDepth][kRing ? NB : 1][2];
    if constexpr (kRing) {
#pragma unroll
        for (int i = 0; i < kDepth; ++i) {
            const uint32_t cc = uint32_t(warp) + 4u * i;
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                xring[i][nb][0] = xring[i][nb][1] = make_uint4(0, 0, 0, 0);
                if (cc < n_chunks && xrow[nb]) {
                    xring[i][nb][0] = __ldg(xrow[nb] + size_t(cc) * 8);
                    xring[i][nb][1] = __ldg(xrow[nb] + size_t(cc) * 8 + 1);
                }
            }
        }
    }

    for (uint32_t base = uint32_t(warp); base < n_chunks; base += 4u * kDepth) {
#pragma unroll
        for (int i = 0; i < kDepth; ++i) {
            const uint32_t c = base + 4u * i;
            if (c >= n_chunks) break;
            // Activations: shared by every warp of the GPU, so L1/L2 hits after the first touch.
            uint4 xb[NB][2];
            if constexpr (kRing) {
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    xb[nb][0] = xring[i][nb][0];
                    xb[nb][1] = xring[i][nb][1];
                }
            } else {
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    if (xrow[nb]) {
                        xb[nb][0] = __ldg(xrow[nb] + size_t(c) * 8);
                        xb[nb][1] = __ldg(xrow[nb] + size_t(c) * 8 + 1);
                    } else {
                        xb[nb][0] = xb[nb][1] = make_uint4(0, 0, 0, 0);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                uint32_t a[4];
                fragment<kFp4>(ring[i], j, a);
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    // Column tiles past the CTA's columns are skipped (uniform over the CTA;
                    // each column's sum is its own, so the bits do not change).
                    if (nb > 0 && uint32_t(nb) * 8u >= n_cols) break;
                    const uint4 b = xb[nb][j >> 1];
                    const uint32_t b0 = (j & 1) ? b.z : b.x;
                    const uint32_t b1 = (j & 1) ? b.w : b.y;
                    mma(acc[nb], a, b0, b1);
                }
            }
            const uint32_t cn = c + 4u * kDepth;
            if (cn < n_chunks) {
                load_chunk<kFp4>(ring[i], wp, sp, cn);
                if constexpr (kRing) {
#pragma unroll
                    for (int nb = 0; nb < NB; ++nb) {
                        if (xrow[nb]) {
                            xring[i][nb][0] = __ldg(xrow[nb] + size_t(cn) * 8);
                            xring[i][nb][1] = __ldg(xrow[nb] + size_t(cn) * 8 + 1);
                        }
                    }
                }
            }
        }
    }

    float* mine = red[warp];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(nb * 32 + lane) * 4 + e] = acc[nb][e];
    __syncthreads();

    const float* bias = args.w.bias ? args.w.bias + size_t(expert) * args.w.bias_expert_stride : nullptr;
    for (int u = threadIdx.x; u < NB * 32; u += 128) {
        const int nb = u >> 5, l = u & 31, gg = l >> 2, tt = l & 3;
        float s[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = u * 4 + e;
            s[e] = __fadd_rn(__fadd_rn(__fadd_rn(red[0][i], red[1][i]), red[2][i]), red[3][i]);
        }
        const uint32_t r_lo = slab * 16 + gg, r_hi = r_lo + 8;
        // kAdd: both columns' residuals loaded before either is stored (a load after a store to a
        // row that might alias waits for it: one round trip per column otherwise). Rows are
        // distinct, so the bits are the same.
        uint32_t out_rows[2] = {0, 0};
        float old[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
        for (int ci = 0; ci < 2; ++ci) {
            const uint32_t col = uint32_t(nb * 8 + 2 * tt + ci);
            if (col >= n_cols) continue;
            out_rows[ci] = args.routed ? uint32_t(pairs[col]) : col_base + col;
            if (args.epilogue != int(Epilogue::kAdd)) continue;
            const float* o = args.out_f32 + size_t(out_rows[ci]) * args.ldo;
            old[ci][0] = r_lo < N ? o[r_lo] : 0.0f;
            old[ci][1] = r_hi < N ? o[r_hi] : 0.0f;
        }
#pragma unroll
        for (int ci = 0; ci < 2; ++ci) {
            const uint32_t col = uint32_t(nb * 8 + 2 * tt + ci);
            if (col >= n_cols) continue;
            const uint32_t out_row = out_rows[ci];
            if (args.epilogue == int(Epilogue::kSwiglu)) {
                float gate = s[ci] + (bias ? bias[r_lo] : 0.0f);
                float up = s[2 + ci] + (bias ? bias[r_hi] : 0.0f);
                const float y = swiglu_clamped(gate, up, args.limit);
                const uint32_t j = slab * 8 + gg;
                args.out_bf16[size_t(out_row) * args.ldo + permuted_k(j)] = f32_to_bf16_bits(y);
            } else {
                float* o = args.out_f32 + size_t(out_row) * args.ldo;
                const bool add = args.epilogue == int(Epilogue::kAdd);
                if (r_lo < N) {
                    const float v = s[ci] + (bias ? bias[r_lo] : 0.0f);
                    o[r_lo] = add ? old[ci][0] + v : v;
                }
                if (r_hi < N) {
                    const float v = s[2 + ci] + (bias ? bias[r_hi] : 0.0f);
                    o[r_hi] = add ? old[ci][1] + v : v;
                }
            }
        }
    }
}

template <bool kFp4, int NB>
cudaError_t launch(const KernelArgs& a, dim3 grid, cudaStream_t stream) {
    return launch_pdl(bf16_gemm_kernel<kFp4, NB>, grid, 128, 0, stream, a);
}

}  // namespace

gptoss_status gemm(const GemmWeights& w, const uint16_t* x, uint32_t n_rows, const GemmRoute* route,
                   Epilogue epilogue, float* out_f32, uint16_t* out_bf16, uint32_t ldo,
                   float swiglu_limit, int nb, cudaStream_t stream) {
    if (w.K == 0 || w.K % 64 != 0 || w.N == 0)
        return fail(GPTOSS_ERR_INTERNAL, "gemm: K=%u must be a positive multiple of 64, N=%u > 0", w.K, w.N);
    if (nb != 1 && nb != 2 && nb != 8) return fail(GPTOSS_ERR_INTERNAL, "gemm: nb=%d, expected 1, 2 or 8", nb);
    if (epilogue == Epilogue::kSwiglu && (w.N % 16 != 0 || !out_bf16))
        return fail(GPTOSS_ERR_INTERNAL, "gemm: SwiGLU needs N %% 16 == 0 (N=%u) and a bf16 output", w.N);
    if (epilogue != Epilogue::kSwiglu && !out_f32)
        return fail(GPTOSS_ERR_INTERNAL, "gemm: fp32 output missing");
    const KernelArgs a = kernel_args(w, x, n_rows, route, epilogue, out_f32, out_bf16, ldo, swiglu_limit);
    const uint32_t slabs = ceil_div(w.N, 16);
    const uint32_t tiles = route ? route->max_tiles : ceil_div(n_rows, 8u * uint32_t(nb));
    if (tiles == 0) return GPTOSS_OK;
    if (tiles > 65535) return fail(GPTOSS_ERR_INTERNAL, "gemm: %u column tiles exceed the grid limit", tiles);
    const dim3 grid(slabs, tiles);
    cudaError_t err;
    if (w.mxfp4)
        err = nb == 1 ? launch<true, 1>(a, grid, stream) : nb == 2 ? launch<true, 2>(a, grid, stream)
                                                                   : launch<true, 8>(a, grid, stream);
    else
        err = nb == 1 ? launch<false, 1>(a, grid, stream) : nb == 2 ? launch<false, 2>(a, grid, stream)
                                                                     : launch<false, 8>(a, grid, stream);
    GPTOSS_TRY(cuda_status(err, "bf16_gemm_kernel", __FILE__, __LINE__));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
