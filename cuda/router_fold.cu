// cuda/router_fold.cu - host side of the decode router folded into the O projection (the
// kernel side is router_fold.cuh, run by gemm_decode.cu's kFold instances): which shapes it
// supports, its switch (GPTOSS_DECODE_ROUTER_FOLD), and the load-time layout of the router's
// weights it reads. Each O CTA (16 rows of the residual row, one slab) reads the router's
// columns for its rows, W_r[e, 16s .. 16s + 15] for every expert e, so they are stored slab by
// slab as bf16 [ceil(H / 16)][E][16]: one contiguous E × 32-byte block per CTA (1 KB for the
// 20b's 32 experts, 4 KB for the 120b's 128), copied to shared memory before the CTA's
// dependency wait. Built from the router's fragment layout (repack_bf16's, the one copy of the
// weights both the loader and the synthetic fill write), once per load.
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/router_fold.cuh"

namespace gptoss {
namespace cuda {
namespace {

// Off: on an H100 the fold lost 4.3 % (20b) and 13.6 % (120b) of tg128 against router_decode's launch,
// its last CTA's partial sums being slower than the launch they replace (bench/NOTES.md "v49").
constexpr bool kRouterFoldDefault = false;  // GPTOSS_DECODE_ROUTER_FOLD=0|1 overrides
constexpr bool kRouterFoldAcqRelDefault = false;  // GPTOSS_DECODE_ROUTER_FOLD_ACQREL=0|1 overrides

// out[(s·E + e)·16 + r] = W[e, 16s + r] (0 past H), W in repack_bf16's fragment layout: chunk c
// of 16-row slab e / 16 is 128 words of 16 bytes, word j·32 + lane = {row g: k0, k0 + 1; row g +
// 8: k0, k0 + 1; row g: k0 + 8, k0 + 9; row g + 8: k0 + 8, k0 + 9}, lane = 4g + t, k0 = 64c + 16j + 2t.
__global__ void router_fold_pack_kernel(const uint16_t* __restrict__ frag, uint32_t E, uint32_t H,
                                        uint16_t* __restrict__ out, size_t n) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint32_t r = uint32_t(i % 16), e = uint32_t((i / 16) % E), s = uint32_t(i / (16 * size_t(E)));
    const uint32_t k = 16 * s + r;
    if (k >= H) {
        out[i] = 0;
        return;
    }
    const uint32_t slab = e / 16, row = e % 16, g = row % 8, hi_row = row / 8;
    const uint32_t c = k / 64, kk = k % 64, j = kk / 16, q = kk % 16, t = (q % 8) / 2, odd = q % 2;
    const uint32_t lane = 4 * g + t;
    // The 32-bit component: x (row g, k0), y (row g + 8, k0), z (row g, k0 + 8), w (row g + 8, k0 + 8).
    const uint32_t comp = (q >= 8 ? 2u : 0u) + hi_row;
    const size_t word = (size_t(slab) * (H / 64) + c) * 128 + j * 32 + lane;
    out[i] = frag[word * 8 + comp * 2 + odd];
}

}  // namespace

bool router_fold_supported(uint32_t E, uint32_t K, uint32_t H) {
    return E >= 1 && E <= fold_detail::kFoldMaxExperts && K >= 1 && K <= topk_detail::kMaxK && K <= E &&
           H % 64 == 0 && H >= 64 && H <= fold_detail::kFoldMaxH;
}

size_t router_fold_bytes(uint32_t E, uint32_t H) { return size_t(ceil_div(H, 16)) * E * 16 * 2; }

gptoss_status router_fold_pack(const void* router_fragments, uint32_t E, uint32_t H, uint16_t* out,
                               cudaStream_t stream) {
    if (E == 0 || H % 64 != 0)
        return fail(GPTOSS_ERR_INTERNAL, "router_fold_pack: E=%u must be positive and H=%u a multiple of 64", E, H);
    const size_t n = router_fold_bytes(E, H) / 2;
    router_fold_pack_kernel<<<uint32_t((n + 255) / 256), 256, 0, stream>>>(static_cast<const uint16_t*>(router_fragments),
                                                                     E, H, out, n);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

bool router_fold_default() {
    static const bool on = env_int("GPTOSS_DECODE_ROUTER_FOLD", kRouterFoldDefault) != 0;
    return on;
}

bool router_fold_acq_rel() {
    static const bool on = env_int("GPTOSS_DECODE_ROUTER_FOLD_ACQREL", kRouterFoldAcqRelDefault) != 0;
    return on;
}

}  // namespace cuda
}  // namespace gptoss
