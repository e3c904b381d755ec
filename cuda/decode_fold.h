// cuda/decode_fold.h - the decode MoE down GEMV with the MoE combine + residual add + the next
// RMSNorm folded into its tail (issue 12): every down CTA stores its 16 output rows, fences and
// counts itself in a global counter; the last CTA to arrive (the attention decode merge's
// pattern) computes x += Σ_s weights[s] · part[s] and xn = bf16(RMSNorm(x) · norm_w) for the
// token exactly as residual_rmsnorm(kMoeAdd) does (same per-element fma order, the same
// rmsnorm_inv reduction order: bit-identical), then re-arms the counter. The separate
// combine + RMSNorm launch disappears, so the next layer's QKV GEMV depends on the down kernel
// directly (PDL). Implemented in gemm_decode.cu (the down kernel with a kFold template flag).
// Switch: GPTOSS_DECODE_FOLD_NORM = 0|1|2 (bench/NOTES.md, "v13 decode").
#pragma once

#include "cuda/kernels.h"

namespace gptoss {
namespace cuda {

// The fold's operands, one token (T = 1). x: fp32 [H], updated in place (only the last CTA
// reads or writes it); weights: fp32 [K] (slot order, as the router wrote them); norm_w: fp32
// [H] (the next layer's attention norm, or the final norm); xn: bf16 permuted [H] (written;
// the next GEMV's input); counter: one device int, zero before the first call (the last CTA
// re-arms it, so one counter serves every layer of a stream).
struct DecodeFold {
    float* x = nullptr;
    const float* weights = nullptr;
    uint32_t K = 0;
    const float* norm_w = nullptr;
    float eps = 0.0f;
    uint16_t* xn = nullptr;
    int* counter = nullptr;
    // 1: the last CTA stages the row and the norm weight in dynamic shared memory (2·H floats
    // per CTA of the grid); 2: it uses none (re-reads x and the norm weight), so the kernel's
    // shared-memory footprint, and the SM's carve-out, stay those of the plain down GEMV.
    int tail = 1;
};

// GPTOSS_DECODE_FOLD_NORM = 0 (off, the default) | 1 | 2 (the DecodeFold::tail to use), read
// once per process.
int decode_fold_mode();
// H % 64 == 0, H <= 4096, K <= 4 and `variant` is an MXFP4 variant compiled with the fold.
bool decode_fold_supported(uint32_t H, uint32_t K, const DecodeGemv& variant);
// The routed MXFP4 down GEMV of gemm_decode (kStore into part: fp32 [K, H], ldo = H; route: a
// T = 1 route, in_div 1) followed by the fold. w.N = H. Errors: INTERNAL naming the shape or
// variant when !decode_fold_supported or an operand is missing.
[[nodiscard]] gptoss_status gemm_decode_folded(const GemmWeights& w, const uint16_t* act, const GemmRoute& route,
                                               bool route_ready, float* part, const DecodeFold& fold,
                                               const DecodeGemv& variant, cudaStream_t stream);

}  // namespace cuda
}  // namespace gptoss
