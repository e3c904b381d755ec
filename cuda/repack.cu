// cuda/repack.cu - load-time weight repacking into the layouts gemm.cu streams (see
// kernels.h), bias/norm conversion to fp32, and the deterministic random fills that build
// synthetic 20b/120b-shaped models directly in GPU memory for gptoss-bench.
// MXFP4 follows MODEL.md: blocks [N, K/32, 16], low nibble = even element, scale 2^(s-127).
// One thread per 16-byte output word; these run once per load and are bandwidth-trivial.
#include "cuda/common.cuh"
#include "cuda/gemm.cuh"
#include "cuda/kernels.h"

namespace gptoss {
namespace cuda {
namespace {

// Slab row r (0..15) of slab s → source row. gate_up: rows 0..7 = gate 8s..8s+7 (source rows
// 2j), rows 8..15 = up 8s..8s+7 (source rows 2j+1).
__device__ __forceinline__ uint32_t source_row(uint32_t slab, uint32_t r, bool gate_up) {
    if (!gate_up) return slab * 16 + r;
    return r < 8 ? 2 * (slab * 8 + r) : 2 * (slab * 8 + r - 8) + 1;
}

__global__ void repack_bf16_kernel(const uint16_t* __restrict__ raw, uint32_t N, uint32_t K,
                                   uint4* __restrict__ out, size_t n_out) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_out) return;
    const uint32_t n_chunks = K / 64;
    const uint32_t lane = uint32_t(i & 31), j = uint32_t((i >> 5) & 3);
    const size_t sc = i >> 7;
    const uint32_t slab = uint32_t(sc / n_chunks), c = uint32_t(sc % n_chunks);
    const uint32_t g = lane >> 2, t = lane & 3;
    const uint32_t r0 = slab * 16 + g, r1 = r0 + 8;
    const uint32_t k0 = c * 64 + 16 * j + 2 * t;
    auto at = [&](uint32_t r, uint32_t k) -> uint32_t {
        return r < N ? uint32_t(raw[size_t(r) * K + k]) : 0u;
    };
    uint4 v;
    v.x = at(r0, k0) | (at(r0, k0 + 1) << 16);
    v.y = at(r1, k0) | (at(r1, k0 + 1) << 16);
    v.z = at(r0, k0 + 8) | (at(r0, k0 + 9) << 16);
    v.w = at(r1, k0 + 8) | (at(r1, k0 + 9) << 16);
    out[i] = v;
}

// The 4 bits of e2m1 value n (sign, e1, e0, m = bits 3..0) at the word positions `b`.
__device__ __forceinline__ uint32_t place_e2m1(uint32_t n, gemm_detail::E2m1Bits b) {
    return ((n >> 3) & 1u) << b.s | ((n >> 2) & 1u) << b.e1 | ((n >> 1) & 1u) << b.e0 | (n & 1u) << b.m;
}

__global__ void repack_mxfp4_kernel(const uint8_t* __restrict__ blocks, uint32_t N, uint32_t K,
                                    bool gate_up, uint4* __restrict__ out, size_t n_out) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_out) return;
    const uint32_t n_chunks = K / 64;
    const uint32_t lane = uint32_t(i & 31);
    const size_t sc = i >> 5;
    const uint32_t slab = uint32_t(sc / n_chunks), c = uint32_t(sc % n_chunks);
    const uint32_t g = lane >> 2, t = lane & 3;
    const uint32_t rg = source_row(slab, g, gate_up), rg8 = source_row(slab, g + 8, gate_up);
    auto nib = [&](uint32_t r, uint32_t k) -> uint32_t {
        if (r >= N) return 0u;
        const uint8_t b = blocks[size_t(r) * (K / 2) + k / 2];
        return (k & 1) ? uint32_t(b >> 4) : uint32_t(b & 15);
    };
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint32_t k0 = c * 64 + 16 * j + 2 * t;
        // Value L_p / H_p of A register p (p = 0, 2: row g; 1, 3: row g+8; k and k+1), its bits
        // where gemm.cuh e2m1_word_bits puts them.
        const uint32_t lo[4] = {nib(rg, k0), nib(rg8, k0), nib(rg, k0 + 8), nib(rg8, k0 + 8)};
        const uint32_t hi[4] = {nib(rg, k0 + 1), nib(rg8, k0 + 1), nib(rg, k0 + 9), nib(rg8, k0 + 9)};
        uint32_t word = 0;
#pragma unroll
        for (int p = 0; p < 4; ++p) word |= place_e2m1(lo[p], gemm_detail::e2m1_word_bits(p, false)) |
                                            place_e2m1(hi[p], gemm_detail::e2m1_word_bits(p, true));
        w[j] = word;
    }
    out[i] = make_uint4(w[0], w[1], w[2], w[3]);
}

__global__ void repack_scales_kernel(const uint8_t* __restrict__ scales, uint32_t N, uint32_t K,
                                     bool gate_up, uint16_t* __restrict__ out, size_t n_out,
                                     int* bad_scale) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_out) return;
    const uint32_t n_chunks = K / 64;
    const uint32_t e = uint32_t(i & 3), g = uint32_t((i >> 2) & 7);
    const size_t sc = i >> 5;
    const uint32_t slab = uint32_t(sc / n_chunks), c = uint32_t(sc % n_chunks);
    const uint32_t r = source_row(slab, g + (e >= 2 ? 8 : 0), gate_up);
    const uint32_t blk = c * 2 + (e & 1);
    uint16_t v = 0;
    if (r < N) {
        const uint32_t s = scales[size_t(r) * (K / 32) + blk];
        if (s > 128) atomicMax(bad_scale, int(s));
        else v = uint16_t((s + 126) << 7);  // bf16 2^(s-1)
    }
    out[i] = v;
}

__global__ void bf16_to_f32_kernel(const uint16_t* __restrict__ raw, uint32_t n, bool gate_up,
                                   float* __restrict__ out) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint32_t src = gate_up ? source_row(i / 16, i % 16, true) : i;
    out[i] = bf16_bits_to_f32(raw[src]);
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void fill_random_kernel(uint32_t* out, size_t n, uint64_t seed, bool bf16, float amp) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const uint64_t r = mix64(seed * 0x100000001b3ull + i);
        if (bf16) {
            const float a = (float(uint32_t(r) >> 8) * (1.0f / 8388608.0f) - 1.0f) * amp;
            const float b = (float(uint32_t(r >> 32) >> 8) * (1.0f / 8388608.0f) - 1.0f) * amp;
            out[i] = pack_bf16x2(a, b);
        } else {
            out[i] = uint32_t(r);
        }
    }
}

__global__ void fill_random_f32_kernel(float* out, size_t n, uint64_t seed, float center, float amp) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const uint64_t r = mix64(seed * 0x100000001b3ull + i);
        out[i] = center + (float(uint32_t(r) >> 8) * (1.0f / 8388608.0f) - 1.0f) * amp;
    }
}

__global__ void fill_scales_kernel(uint16_t* out, size_t n, uint64_t seed, int lo, int hi) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const uint64_t r = mix64(seed * 0x100000001b3ull + i);
        const int s = lo + int(r % uint64_t(hi - lo + 1));
        out[i] = uint16_t((s + 126) << 7);
    }
}

uint32_t blocks_for(size_t n, uint32_t threads) { return uint32_t((n + threads - 1) / threads); }

}  // namespace

size_t bf16_fragment_bytes(uint32_t N, uint32_t K) { return size_t(ceil_div(N, 16)) * (K / 64) * 2048; }
size_t mxfp4_fragment_bytes(uint32_t N, uint32_t K) { return size_t(ceil_div(N, 16)) * (K / 64) * 512; }
size_t mxfp4_scale_bytes(uint32_t N, uint32_t K) { return size_t(ceil_div(N, 16)) * (K / 64) * 64; }

gptoss_status repack_bf16(const uint16_t* raw, uint32_t N, uint32_t K, void* out, cudaStream_t stream) {
    if (K % 64 != 0) return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA backend: K=%u is not a multiple of 64", K);
    const size_t n = bf16_fragment_bytes(N, K) / 16;
    repack_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(raw, N, K, static_cast<uint4*>(out), n);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

gptoss_status repack_mxfp4(const uint8_t* blocks, const uint8_t* scales, uint32_t N, uint32_t K,
                           bool gate_up, void* out, void* out_scales, int* bad_scale,
                           cudaStream_t stream) {
    if (K % 64 != 0) return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA backend: K=%u is not a multiple of 64", K);
    if (gate_up && N % 16 != 0)
        return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA backend: gate_up rows %u not a multiple of 16", N);
    const size_t n = mxfp4_fragment_bytes(N, K) / 16;
    repack_mxfp4_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(blocks, N, K, gate_up,
                                                                 static_cast<uint4*>(out), n);
    GPTOSS_CUDA_LAUNCH_CHECK();
    const size_t ns = mxfp4_scale_bytes(N, K) / 2;
    repack_scales_kernel<<<blocks_for(ns, 256), 256, 0, stream>>>(
        scales, N, K, gate_up, static_cast<uint16_t*>(out_scales), ns, bad_scale);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

gptoss_status bf16_to_f32(const void* raw, uint32_t n, bool gate_up, float* out, cudaStream_t stream) {
    if (n == 0) return GPTOSS_OK;
    bf16_to_f32_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(static_cast<const uint16_t*>(raw), n,
                                                                gate_up, out);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

gptoss_status fill_random(void* out, size_t n_words, uint64_t seed, bool bf16, float amplitude,
                          cudaStream_t stream) {
    if (n_words == 0) return GPTOSS_OK;
    fill_random_kernel<<<4096, 256, 0, stream>>>(static_cast<uint32_t*>(out), n_words, seed, bf16, amplitude);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

gptoss_status fill_random_f32(float* out, size_t n, uint64_t seed, float center, float amplitude,
                              cudaStream_t stream) {
    if (n == 0) return GPTOSS_OK;
    fill_random_f32_kernel<<<1024, 256, 0, stream>>>(out, n, seed, center, amplitude);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

gptoss_status fill_random_scales(uint16_t* out, size_t n_scales, uint64_t seed, int lo, int hi,
                                 cudaStream_t stream) {
    if (n_scales == 0) return GPTOSS_OK;
    fill_scales_kernel<<<1024, 256, 0, stream>>>(out, n_scales, seed, lo, hi);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
