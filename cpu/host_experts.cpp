// cpu/host_experts.cpp - the chosen MoE experts of a decode step computed by the CPU from
// host-resident MXFP4 weights (cpu/host_experts.h, issue 16). Per layer: gate_up (+ bias, swiglu,
// bf16 rounding) over (chosen expert, range of output rows), then the down projection (+ bias)
// over (chosen expert, range of output rows) — two parallel_for calls, or one where an expert's
// down ranges wait for its gate_up ranges (HostMoeTuning); the (token, slot) pairs routed to one
// expert share each dequantized block, so an expert's bytes are read once per call.
// The activations are widened bf16 → fp32 once per token into a per-block permuted layout
// [blocks][16 even elements | 16 odd elements], which matches where the low and high nibbles of
// a 16-byte MXFP4 block land after the register dequantization: AVX-512 maps each nibble to its
// fp32 E2M1 value with one vpermps of a 16-entry table; AVX2 maps nibbles to 2·E2M1 as int8 with
// pshufb and widens to fp32; the scalar path uses a table. Each block's 32 products are summed
// unscaled, then multiplied by the block's E8M0 scale (a power of two: exact) into per-lane row
// sums, reduced in a fixed order: the result depends on the SIMD path but never on T, the
// grouping or the thread count. Rows holding a scale ≥ 253 take the reference's exact order.
#include "cpu/host_experts.h"

#include "cpu/host_experts_profile.h"
#include "cpu/host_experts_q8.h"
#include "gptoss-internal.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(GPTOSS_HOST_SIMDE)
// Tests only (test-host-experts-simde): the x86 intrinsics emulated by SIMDe, so every path
// runs, slowly, on any CPU; no target attributes, every path "supported".
#include "tests/simde-x86.h"
#define GPTOSS_HOST_X86 1
#define GPTOSS_TARGET(features)
#define GPTOSS_CPU_HAS(feature) true
#elif defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GPTOSS_HOST_X86 1
#define GPTOSS_TARGET(features) __attribute__((target(features)))
#define GPTOSS_CPU_HAS(feature) __builtin_cpu_supports(feature)
#endif

namespace gptoss {
namespace cpu {

namespace {

// The loops over the NT inputs of a tile, unrolled so that their accumulators stay in registers
// (GCC -O2 leaves them in a stack array otherwise: 2x slower at NT = 4).
#define GPTOSS_UNROLL _Pragma("GCC unroll 4")

constexpr uint32_t kRowBlock = 32;       // output rows per work item (even: gate/up pairs stay together)
constexpr uint32_t kRowBlockQ8 = 64;     // gate_up rows per item on the int8 path: one block of 32 y
constexpr uint32_t kTile = 4;            // (token, slot) pairs sharing one dequantized block
constexpr uint8_t kExactScale = 253;     // from here on, e2m1 · 2^(s-127) can overflow fp32
constexpr float kAvx2MaxInput = 0x1p90f; // the avx2 path's inputs stay below (its weights carry 2^25)

// One expert's MXFP4 matrix: rows of nb blocks (16 bytes + 1 scale byte each).
using Mat = host_q8::Mat;

// Rows [r0, r1) of m times the n (1..kTile) permuted inputs xs[j] (nb·32 floats each):
// outs[j][r - r0] = dot (no bias).
using RowsFn = void (*)(const Mat& m, uint32_t r0, uint32_t r1, const float* const* xs, uint32_t n,
                        float* const* outs);

// Natural index k of a row → its position in the permuted layout.
inline uint32_t perm(uint32_t k) { return (k & ~31u) | ((k & 1u) << 4) | ((k & 31u) >> 1); }

// 2^(s-127) (full) and 2^(s-152) (avx2: its weights are E2M1 · 2^25; 0 for s < 3, which
// that path computes exactly instead), s < kExactScale.
struct ScaleTables {
    float full[256];
    float avx2[256];
    ScaleTables() {
        for (int s = 0; s < 256; s++) {
            full[s] = std::ldexp(1.0f, s - 127);
            avx2[s] = s < 3 ? 0.0f : std::ldexp(1.0f, s - 152);
        }
    }
};
const ScaleTables kScales;

const float kE2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Row r · x exactly as cpu::matmul_mxfp4 computes it (dequantize with e2m1_to_f32 ·
// e8m0_to_f32, eight partial sums by k mod 8, combined pairwise), reading x from the permuted
// layout. Out of line and compiled without FMA, so nothing is contracted differently.
__attribute__((noinline)) float exact_row(const Mat& m, uint32_t r, const float* xp) {
    const uint8_t* b = m.blocks + size_t(r) * m.nb * 16;
    const uint8_t* sc = m.scales + size_t(r) * m.nb;
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t blk = 0; blk < m.nb; blk++) {
        const float scale = e8m0_to_f32(sc[blk]);
        for (uint32_t i = 0; i < 16; i++) {
            const uint8_t byte = b[blk * 16 + i];
            const uint32_t k = blk * 32 + 2 * i;
            const float w0 = e2m1_to_f32(byte & 15) * scale;
            const float w1 = e2m1_to_f32(byte >> 4) * scale;
            s[k & 7] += xp[perm(k)] * w0;
            s[(k + 1) & 7] += xp[perm(k + 1)] * w1;
        }
    }
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

bool row_needs_exact(const Mat& m, uint32_t r) {
    const uint8_t* sc = m.scales + size_t(r) * m.nb;
    uint8_t hi = 0;
    for (uint32_t blk = 0; blk < m.nb; blk++) hi = std::max(hi, sc[blk]);
    return hi >= kExactScale;
}

// ---------------------------------------------------------------------------
// Scalar path: per block, eight partial sums by element index mod 8 over the 16 even then
// the 16 odd elements, combined pairwise, times the scale, added to the row sum.

void rows_scalar(const Mat& m, uint32_t r0, uint32_t r1, const float* const* xs, uint32_t n, float* const* outs) {
    for (uint32_t r = r0; r < r1; r++) {
        if (row_needs_exact(m, r)) {
            for (uint32_t j = 0; j < n; j++) outs[j][r - r0] = exact_row(m, r, xs[j]);
            continue;
        }
        const uint8_t* b = m.blocks + size_t(r) * m.nb * 16;
        const uint8_t* sc = m.scales + size_t(r) * m.nb;
        float acc[kTile] = {0, 0, 0, 0};
        for (uint32_t blk = 0; blk < m.nb; blk++) {
            float w[32];
            for (uint32_t i = 0; i < 16; i++) {
                w[i] = kE2m1[b[blk * 16 + i] & 15];
                w[16 + i] = kE2m1[b[blk * 16 + i] >> 4];
            }
            const float scale = kScales.full[sc[blk]];
            for (uint32_t j = 0; j < n; j++) {
                const float* x = xs[j] + size_t(blk) * 32;
                float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                for (uint32_t i = 0; i < 32; i++) p[i & 7] += w[i] * x[i];
                const float t = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
                acc[j] += t * scale;
            }
        }
        for (uint32_t j = 0; j < n; j++) outs[j][r - r0] = acc[j];
    }
}

uint64_t read_scalar(const uint8_t* p, size_t bytes) {
    const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= bytes / 8; i += 4) {
        a ^= q[i];
        b ^= q[i + 1];
        c ^= q[i + 2];
        d ^= q[i + 3];
    }
    return a ^ b ^ c ^ d;
}

#ifdef GPTOSS_HOST_X86
// ---------------------------------------------------------------------------
// AVX2 + FMA, in-lane shuffles only (Zen 3 runs the lane-crossing vpmovsxbd ymm at a third
// of the rate, and it set the pace): the 16-byte block broadcast to both 128-bit lanes; one
// pshufb per 8 bytes puts byte j in the top byte of dword j (others zero); the low nibble
// (and 0x0f000000) or the high nibble (a 4-bit right shift) indexes a second pshufb with the
// int8 table 2·E2M1, giving v·2^24 in each dword, converted exactly to fp32. So the weights
// are E2M1 · 2^25 and the block scale is 2^(s-152), a normal or subnormal fp32 for s ≥ 3;
// rows with a scale < 3 take the exact path. Inputs must stay below 2^90 (so that ·2^25 · 32
// terms stays finite); the caller checks (kAvx2MaxInput).

GPTOSS_TARGET("avx2,fma") inline float hsum_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

template <uint32_t NT>
GPTOSS_TARGET("avx2,fma") void rows_avx2_t(const Mat& m, uint32_t r0, uint32_t r1,
                                                    const float* const* xs, float* const* outs) {
    const __m256i lut = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const char z = char(0x80);  // pshufb: zero this byte
    // Dword j of lane 0 / lane 1 takes byte j / j + 4 (first 8 bytes) or j + 8 / j + 12.
    const __m256i spread0 = _mm256_setr_epi8(z, z, z, 0, z, z, z, 1, z, z, z, 2, z, z, z, 3,
                                             z, z, z, 4, z, z, z, 5, z, z, z, 6, z, z, z, 7);
    const __m256i spread1 = _mm256_setr_epi8(z, z, z, 8, z, z, z, 9, z, z, z, 10, z, z, z, 11,
                                             z, z, z, 12, z, z, z, 13, z, z, z, 14, z, z, z, 15);
    const __m256i low = _mm256_set1_epi32(0x0f000000);
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t* b = m.blocks + size_t(r) * m.nb * 16;
        const uint8_t* sc = m.scales + size_t(r) * m.nb;
        __m256 acc[NT];
        GPTOSS_UNROLL
        for (uint32_t j = 0; j < NT; j++) acc[j] = _mm256_setzero_ps();
        bool exact = false;
        for (uint32_t blk = 0; blk < m.nb; blk++) {
            const uint8_t s = sc[blk];
            if (s >= kExactScale || s < 3) {
                exact = true;
                break;
            }
            const __m256i q = _mm256_broadcastsi128_si256(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + size_t(blk) * 16)));
            const __m256i e0 = _mm256_shuffle_epi8(q, spread0);  // bytes 0..7, one per dword's top byte
            const __m256i e1 = _mm256_shuffle_epi8(q, spread1);  // bytes 8..15
            // Even elements of bytes 0..7, of bytes 8..15, odd of 0..7, odd of 8..15: the
            // permuted layout's x[0..8), x[8..16), x[16..24), x[24..32).
            const __m256 w0 = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(lut, _mm256_and_si256(e0, low)));
            const __m256 w1 = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(lut, _mm256_and_si256(e1, low)));
            const __m256 w2 = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(lut, _mm256_srli_epi32(e0, 4)));
            const __m256 w3 = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(lut, _mm256_srli_epi32(e1, 4)));
            const __m256 scale = _mm256_set1_ps(kScales.avx2[s]);
            GPTOSS_UNROLL
        for (uint32_t j = 0; j < NT; j++) {
                const float* x = xs[j] + size_t(blk) * 32;
                __m256 t = _mm256_mul_ps(w0, _mm256_loadu_ps(x));
                t = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), t);
                t = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + 16), t);
                t = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + 24), t);
                acc[j] = _mm256_fmadd_ps(t, scale, acc[j]);
            }
        }
        GPTOSS_UNROLL
        for (uint32_t j = 0; j < NT; j++) outs[j][r - r0] = exact ? exact_row(m, r, xs[j]) : hsum_avx2(acc[j]);
    }
}

void rows_avx2(const Mat& m, uint32_t r0, uint32_t r1, const float* const* xs, uint32_t n, float* const* outs) {
    switch (n) {
    case 1: rows_avx2_t<1>(m, r0, r1, xs, outs); break;
    case 2: rows_avx2_t<2>(m, r0, r1, xs, outs); break;
    case 3: rows_avx2_t<3>(m, r0, r1, xs, outs); break;
    default: rows_avx2_t<4>(m, r0, r1, xs, outs); break;
    }
}

GPTOSS_TARGET("avx2") uint64_t read_avx2(const uint8_t* p, size_t bytes) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 128 <= bytes; i += 128) {
        a = _mm256_xor_si256(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
    }
    const __m256i x = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return uint64_t(_mm256_extract_epi64(x, 0) ^ _mm256_extract_epi64(x, 1) ^ _mm256_extract_epi64(x, 2) ^
                    _mm256_extract_epi64(x, 3));
}

// ---------------------------------------------------------------------------
// AVX-512F: the 16 bytes of a block zero-extended to 16 dwords; vpermps with the 16-entry
// fp32 E2M1 table reads the low 4 bits of each dword (the low nibble: even elements), and
// again after a 4-bit shift (the high nibble: odd elements).

// Lanes l and l + 8, then l + 4, l + 2, l + 1 (through memory: GCC 12 warns on the
// extract intrinsics' undefined upper halves).
GPTOSS_TARGET("avx2,fma,avx512f") inline float hsum_avx512(__m512 v) {
    alignas(64) float l[16];
    _mm512_store_ps(l, v);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) l[i] += l[i + w];
    return l[0];
}

// One block (16 bytes at q, its scale) for the NT inputs at offset off, into acc[NT].
template <uint32_t NT>
GPTOSS_TARGET("avx2,fma,avx512f") __attribute__((always_inline)) inline void block_avx512(
    const uint8_t* q, float scale, const float* const* xs, size_t off, __m512 lut, __m512* acc) {
    // (maskz forms with all lanes on: GCC 12 warns on the plain forms' undefined source.)
    const __m512i d = _mm512_maskz_cvtepu8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    const __m512 w0 = _mm512_maskz_permutexvar_ps(0xffff, d, lut);
    const __m512 w1 = _mm512_maskz_permutexvar_ps(0xffff, _mm512_maskz_srli_epi32(0xffff, d, 4), lut);
    const __m512 sc = _mm512_set1_ps(scale);
    GPTOSS_UNROLL
    for (uint32_t j = 0; j < NT; j++) {
        const float* x = xs[j] + off;
        __m512 t = _mm512_mul_ps(w0, _mm512_loadu_ps(x));
        t = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), t);
        acc[j] = _mm512_fmadd_ps(t, sc, acc[j]);
    }
}

// Even blocks into acc0, odd blocks into acc1 (two chains: one FMA's latency per block would
// otherwise set the pace), acc0 + acc1 reduced at the end.
template <uint32_t NT>
GPTOSS_TARGET("avx2,fma,avx512f") void rows_avx512_t(const Mat& m, uint32_t r0, uint32_t r1,
                                                              const float* const* xs, float* const* outs) {
    const __m512 lut = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                      -2.0f, -3.0f, -4.0f, -6.0f);
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t* b = m.blocks + size_t(r) * m.nb * 16;
        const uint8_t* sc = m.scales + size_t(r) * m.nb;
        __m512 acc0[NT], acc1[NT];
        GPTOSS_UNROLL
        for (uint32_t j = 0; j < NT; j++) acc0[j] = acc1[j] = _mm512_setzero_ps();
        bool exact = false;
        uint32_t blk = 0;
        for (; blk + 2 <= m.nb; blk += 2) {
            if (sc[blk] >= kExactScale || sc[blk + 1] >= kExactScale) {
                exact = true;
                break;
            }
            block_avx512<NT>(b + size_t(blk) * 16, kScales.full[sc[blk]], xs, size_t(blk) * 32, lut, acc0);
            block_avx512<NT>(b + size_t(blk + 1) * 16, kScales.full[sc[blk + 1]], xs, size_t(blk + 1) * 32, lut, acc1);
        }
        if (!exact && blk < m.nb) {
            if (sc[blk] >= kExactScale) exact = true;
            else block_avx512<NT>(b + size_t(blk) * 16, kScales.full[sc[blk]], xs, size_t(blk) * 32, lut, acc0);
        }
        GPTOSS_UNROLL
        for (uint32_t j = 0; j < NT; j++)
            outs[j][r - r0] = exact ? exact_row(m, r, xs[j]) : hsum_avx512(_mm512_add_ps(acc0[j], acc1[j]));
    }
}

void rows_avx512(const Mat& m, uint32_t r0, uint32_t r1, const float* const* xs, uint32_t n, float* const* outs) {
    switch (n) {
    case 1: rows_avx512_t<1>(m, r0, r1, xs, outs); break;
    case 2: rows_avx512_t<2>(m, r0, r1, xs, outs); break;
    case 3: rows_avx512_t<3>(m, r0, r1, xs, outs); break;
    default: rows_avx512_t<4>(m, r0, r1, xs, outs); break;
    }
}

GPTOSS_TARGET("avx512f") uint64_t read_avx512(const uint8_t* p, size_t bytes) {
    __m512i a = _mm512_setzero_si512(), b = a;
    for (size_t i = 0; i + 128 <= bytes; i += 128) {
        a = _mm512_xor_si512(a, _mm512_load_si512(reinterpret_cast<const void*>(p + i)));
        b = _mm512_xor_si512(b, _mm512_load_si512(reinterpret_cast<const void*>(p + i + 64)));
    }
    alignas(64) uint64_t lanes[8];
    _mm512_store_si512(reinterpret_cast<void*>(lanes), _mm512_xor_si512(a, b));
    uint64_t x = 0;
    for (uint64_t l : lanes) x ^= l;
    return x;
}
#endif  // GPTOSS_HOST_X86

RowsFn rows_fn(HostSimd simd) {
#ifdef GPTOSS_HOST_X86
    if (simd == HostSimd::avx512) return rows_avx512;
    if (simd == HostSimd::avx2) return rows_avx2;
#endif
    (void)simd;
    return rows_scalar;
}

volatile uint64_t g_read_sink;

using ReadFn = uint64_t (*)(const uint8_t* p, size_t bytes);
ReadFn read_fn(HostSimd simd) {
#ifdef GPTOSS_HOST_X86
    if (simd == HostSimd::avx512) return read_avx512;
    if (simd == HostSimd::avx2) return read_avx2;
#endif
    (void)simd;
    return read_scalar;
}

HostSimd best_supported(HostSimd at_most) {
    for (int s = int(at_most); s > 0; s--)
        if (host_simd_supported(HostSimd(s))) return HostSimd(s);
    return HostSimd::scalar;
}

// Calls body(i) for i in [0, n) on the pool (the caller spinning up to caller_spin_us for it).
template <typename Body>
void parallel(size_t n, const Body& body, int caller_spin_us = 0) {
    parallel_for(
        n, [](void* ctx, size_t i) { (*static_cast<const Body*>(ctx))(i); },
        const_cast<void*>(static_cast<const void*>(&body)), caller_spin_us);
}

// The (token, slot) pairs routed to one expert: order[first, first + count).
struct Group {
    uint32_t expert;
    uint32_t first;
    uint32_t count;
};

// Per chosen expert (group) of a call: its gate_up ranges done (the one-pass split's down
// ranges wait for all), and whether all its swiglu outputs were finite (else its down
// projection takes the float kernels).
struct GroupSync {
    std::atomic<uint32_t> gu_done{0};
    std::atomic<int> y_ok{1};
};

// One process-wide scratch (the pool runs one parallel_for at a time anyway), so that
// host_moe_reserve on any thread spares the calls (e.g. from a CUDA driver thread) allocating.
struct Scratch {
    std::vector<float> xp;        // [T, H] permuted fp32 activations
    std::vector<float> yp;        // [T·K, I] permuted bf16-rounded swiglu outputs
    std::vector<uint8_t> xq, yq;  // the int8 path: xp and yp quantized (host_q8::row_bytes per row)
    std::vector<uint64_t> keys;   // (expert << 32 | pair), sorted: the pairs grouped by expert
    std::vector<uint32_t> order;  // pair ids grouped by expert
    std::vector<Group> groups;
    std::unique_ptr<GroupSync[]> sync;  // one per group (capacity sync_cap)
    size_t sync_cap = 0;
    void reserve_sync(size_t n) {
        if (n <= sync_cap) return;
        sync.reset(new GroupSync[n]);
        sync_cap = n;
    }
};
std::mutex g_scratch_mutex;
Scratch g_scratch;

// Pairs grouped by expert (ascending), each group's pairs in ascending order. No allocation
// when the vectors hold `pairs` already (std::sort, not the buffered std::stable_sort).
void group_pairs(const int32_t* experts, uint32_t pairs, Scratch& s) {
    s.keys.resize(pairs);
    for (uint32_t p = 0; p < pairs; p++) s.keys[p] = uint64_t(uint32_t(experts[p])) << 32 | p;
    std::sort(s.keys.begin(), s.keys.end());
    s.order.resize(pairs);
    s.groups.clear();
    for (uint32_t i = 0; i < pairs; i++) {
        s.order[i] = uint32_t(s.keys[i]);
        const uint32_t e = uint32_t(s.keys[i] >> 32);
        if (s.groups.empty() || s.groups.back().expert != e) s.groups.push_back({e, i, 0});
        s.groups.back().count++;
    }
}

// The kernels of one call: the float rows, or the int8 ones (q8 non-null, inputs quantized).
struct Kernels {
    RowsFn rows;
    host_q8::RowsFn q8;
    host_q8::Prefetch prefetch;  // host_q8::Mat::prefetch for the int8 kernels
};

// Rows [r0, r1) of m times the n inputs xs (float) / xq (int8, when k.q8): the int8 kernel sends
// the rows it cannot take to the reference-order exact_row.
void rows_any(const Kernels& k, const Mat& m, uint32_t r0, uint32_t r1, const float* const* xs, const uint8_t* const* xq,
              uint32_t n, float* const* outs) {
    if (!k.q8) return k.rows(m, r0, r1, xs, n, outs);
    uint32_t exact[kRowBlockQ8], n_exact = 0;
    k.q8(m, r0, r1, xq, n, outs, exact, &n_exact);
    for (uint32_t i = 0; i < n_exact; i++)
        for (uint32_t j = 0; j < n; j++) outs[j][exact[i] - r0] = exact_row(m, exact[i], xs[j]);
}

// Gate_up rows [r0, r1) of one group's expert for all its pairs: + bias, swiglu, bf16 rounding,
// into the permuted y of each pair.
// With yq (the int8 path; r0 a multiple of 64, r1 = r0 + 64) each pair's y block is quantized
// into yq too; a non-finite y clears *y_ok.
void gate_up_item(const Kernels& kern, const MoeWeights& w, const Scratch& s, const Group& g, uint32_t r0, uint32_t r1,
                  uint32_t K, uint32_t H, uint32_t I, float limit, float* yp, uint8_t* yq, std::atomic<int>* y_ok) {
    const size_t n_rows = 2 * size_t(I);
    const Mat m{w.gate_up_blocks + size_t(g.expert) * n_rows * (H / 32) * 16,
                w.gate_up_scales + size_t(g.expert) * n_rows * (H / 32), H / 32, kern.prefetch};
    const uint16_t* bias = w.gate_up_bias + size_t(g.expert) * n_rows;
    float gbuf[kTile][kRowBlockQ8];
    float ybuf[kRowBlockQ8 / 2];
    for (uint32_t j0 = 0; j0 < g.count; j0 += kTile) {
        const uint32_t n = std::min(kTile, g.count - j0);
        const float* xs[kTile];
        const uint8_t* xq[kTile];
        float* outs[kTile];
        for (uint32_t j = 0; j < n; j++) {
            const size_t t = s.order[g.first + j0 + j] / K;
            xs[j] = s.xp.data() + t * H;
            xq[j] = kern.q8 ? s.xq.data() + t * host_q8::row_bytes(H) : nullptr;
            outs[j] = gbuf[j];
        }
        rows_any(kern, m, r0, r1, xs, xq, n, outs);
        for (uint32_t j = 0; j < n; j++) {
            for (uint32_t r = r0; r < r1; r++) gbuf[j][r - r0] += bf16_to_f32(bias[r]);
            swiglu(gbuf[j], 1, (r1 - r0) / 2, limit, ybuf);
            const uint32_t pair = s.order[g.first + j0 + j];
            float* y = yp + size_t(pair) * I;
            for (uint32_t i = 0; i < (r1 - r0) / 2; i++) y[perm(r0 / 2 + i)] = bf16_to_f32(f32_to_bf16(ybuf[i]));
            // The int8 path's items are 64 rows: exactly block r0 / 64 of y, quantized here.
            if (yq && !host_q8::quantize_block(y, r0 / kRowBlockQ8, yq + size_t(pair) * host_q8::row_bytes(I)))
                *y_ok = 0;
        }
    }
}

// Down rows [r0, r1) of one group's expert for all its pairs, + bias, into out [pairs, H].
void down_item(const Kernels& kern, const MoeWeights& w, const Scratch& s, const Group& g, uint32_t r0, uint32_t r1,
               uint32_t H, uint32_t I, float* out) {
    const Mat m{w.down_blocks + size_t(g.expert) * H * (I / 32) * 16,
                w.down_scales + size_t(g.expert) * H * (I / 32), I / 32, kern.prefetch};
    const uint16_t* bias = w.down_bias + size_t(g.expert) * H;
    for (uint32_t j0 = 0; j0 < g.count; j0 += kTile) {
        const uint32_t n = std::min(kTile, g.count - j0);
        const float* xs[kTile];
        const uint8_t* xq[kTile];
        float* outs[kTile];
        for (uint32_t j = 0; j < n; j++) {
            const uint32_t pair = s.order[g.first + j0 + j];
            xs[j] = s.yp.data() + size_t(pair) * I;
            xq[j] = kern.q8 ? s.yq.data() + size_t(pair) * host_q8::row_bytes(I) : nullptr;
            outs[j] = out + size_t(pair) * H + r0;
        }
        rows_any(kern, m, r0, r1, xs, xq, n, outs);
        for (uint32_t j = 0; j < n; j++)
            for (uint32_t r = r0; r < r1; r++) outs[j][r - r0] += bf16_to_f32(bias[r]);
    }
}

}  // namespace

const char* host_simd_name(HostSimd simd) {
    switch (simd) {
    case HostSimd::avx512: return "avx512";
    case HostSimd::avx2: return "avx2";
    default: return "scalar";
    }
}

bool host_simd_supported(HostSimd simd) {
    if (simd == HostSimd::scalar) return true;
#ifdef GPTOSS_HOST_X86
#ifndef GPTOSS_HOST_SIMDE
    __builtin_cpu_init();
#endif
    if (simd == HostSimd::avx2) return GPTOSS_CPU_HAS("avx2") && GPTOSS_CPU_HAS("fma");
    if (simd == HostSimd::avx512) return GPTOSS_CPU_HAS("avx512f") && GPTOSS_CPU_HAS("avx2") && GPTOSS_CPU_HAS("fma");
#endif
    return false;
}

HostSimd host_simd_selected() {
    static const HostSimd selected = [] {
        const HostSimd best = best_supported(HostSimd::avx512);
        const char* env = std::getenv("GPTOSS_HOST_SIMD");
        if (env == nullptr || *env == 0) return best;
        HostSimd want;
        if (std::strcmp(env, "scalar") == 0) want = HostSimd::scalar;
        else if (std::strcmp(env, "avx2") == 0) want = HostSimd::avx2;
        else if (std::strcmp(env, "avx512") == 0) want = HostSimd::avx512;
        else {
            std::fprintf(stderr, "gptoss: GPTOSS_HOST_SIMD=%s is not scalar, avx2 or avx512; using %s\n", env,
                         host_simd_name(best));
            return best;
        }
        const HostSimd got = best_supported(want);
        if (got != want)
            std::fprintf(stderr, "gptoss: GPTOSS_HOST_SIMD=%s: this CPU lacks it; using %s\n", env,
                         host_simd_name(got));
        return got;
    }();
    return selected;
}

namespace {

// Quantizes n_rows rows of k permuted floats at src into dst (host_q8::row_bytes(k) each): a few
// rows on this thread (a parallel_for costs more than 4 · 2880 elements), else all (row, group)
// pieces on the pool. False when a value is not finite.
bool quantize_rows(const float* src, uint32_t n_rows, uint32_t k, std::vector<uint8_t>& dst) {
    const uint32_t ng = (k / 32 + host_q8::kGroupBlocks - 1) / host_q8::kGroupBlocks;
    const size_t rb = host_q8::row_bytes(k);
    dst.resize(size_t(n_rows) * rb);
    if (n_rows <= 4) {
        bool ok = true;
        for (uint32_t r = 0; r < n_rows && ok; r++) ok = host_q8::quantize_row(src + size_t(r) * k, k, dst.data() + r * rb);
        return ok;
    }
    std::vector<uint8_t> ok(size_t(n_rows) * ng, 1);
    parallel(ok.size(), [&](size_t item) {
        const size_t r = item / ng;
        ok[item] = host_q8::quantize_group(src + r * k, k, uint32_t(item % ng), dst.data() + r * rb) ? 1 : 0;
    });
    return std::all_of(ok.begin(), ok.end(), [](uint8_t v) { return v != 0; });
}

// How one projection's rows are split into work items: each chosen expert's `units` units of
// unit_rows rows (the kernels' item size: 64 int8 gate_up rows make one quantized y block)
// into `parts` contiguous ranges of whole units. ranges_per_thread 0: one unit per item (v13).
struct Split {
    uint32_t unit_rows, units, parts;
    uint32_t first_unit(uint32_t p) const { return uint32_t(uint64_t(p) * units / parts); }
};
Split make_split(uint32_t rows, uint32_t unit_rows, uint32_t groups, uint32_t ranges_per_thread, size_t threads) {
    const uint32_t units = (rows + unit_rows - 1) / unit_rows;
    uint32_t parts = units;
    if (ranges_per_thread > 0) {
        const size_t want = (size_t(ranges_per_thread) * threads + groups - 1) / groups;
        parts = uint32_t(std::max<size_t>(1, std::min<size_t>(units, want)));
    }
    return {unit_rows, units, parts};
}

// The weight bytes (blocks + scales) of units [u0, u1) of a split of `rows` rows of k inputs.
uint64_t range_bytes(uint32_t u0, uint32_t u1, const Split& split, uint32_t rows, uint32_t k) {
    const uint64_t r = std::min(rows, u1 * split.unit_rows) - std::min(rows, u0 * split.unit_rows);
    return r * (k / 32) * 17;
}

// Spins until `count` reaches `target` (acquire: the gate_up ranges' y writes are visible),
// yielding the core after a while (the thread it waits for may be descheduled).
void wait_until(const std::atomic<uint32_t>& count, uint32_t target) {
    for (uint32_t i = 0; count.load(std::memory_order_acquire) < target; i++) {
#if defined(__x86_64__) || defined(__i386__)
        if (i < 256) {
            __builtin_ia32_pause();
            continue;
        }
#endif
        std::this_thread::yield();
    }
}

uint32_t env_u32(const char* name, uint32_t fallback, uint32_t max) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == 0) return fallback;
    char* end = nullptr;
    const unsigned long n = std::strtoul(v, &end, 10);
    if (end == v || *end != 0 || n > max) {
        std::fprintf(stderr, "gptoss: %s=%s is not a number in 0..%u; using %u\n", name, v, max, fallback);
        return fallback;
    }
    return uint32_t(n);
}

HostMoeTuning tuning_from_env() {
    HostMoeTuning t;
    t.ranges_per_thread = env_u32("GPTOSS_HOST_MOE_RANGES", t.ranges_per_thread, 64);
    t.prefetch_bytes = env_u32("GPTOSS_HOST_MOE_PREFETCH", t.prefetch_bytes, 1u << 16);
    t.one_pass = env_u32("GPTOSS_HOST_MOE_ONE_PASS", t.one_pass ? 1 : 0, 1) != 0;
    t.prefetch_locality = env_u32("GPTOSS_HOST_MOE_PREFETCH_HINT", t.prefetch_locality, 3);
    t.scale_prefetch_bytes = env_u32("GPTOSS_HOST_MOE_PREFETCH_SCALES", t.scale_prefetch_bytes, 1u << 16);
    t.caller_spin_us = env_u32("GPTOSS_HOST_MOE_CALLER_SPIN_US", t.caller_spin_us, 100000);
    return t;
}
HostMoeTuning g_tuning = tuning_from_env();  // guarded by g_scratch_mutex after start-up

// A call's inputs and kernels: the activations permuted to fp32 in s.xp (and quantized to int8
// when the q8 kernel may run: q8 non-null, its y rows in yq), the pairs grouped by expert, the
// per-group sync reset; the gate_up (gu) and down (dn) kernels, the scalar loop where the avx2
// path's scaled range does not hold the inputs.
struct CallKernels {
    Kernels gu, dn;
    host_q8::RowsFn q8 = nullptr;
    uint8_t* yq = nullptr;
};
CallKernels prepare_call(Scratch& s, RowsFn rows, host_q8::RowsFn q8_kernel, const uint16_t* x_bf16, uint32_t T,
                         uint32_t H, uint32_t I, const int32_t* experts, uint32_t K, float swiglu_limit,
                         const HostMoeTuning& tuning, bool prof) {
    const uint32_t pairs = T * K;
    s.xp.resize(size_t(T) * H);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t k = 0; k < H; k++) s.xp[size_t(t) * H + perm(k)] = bf16_to_f32(x_bf16[size_t(t) * H + k]);
    s.yp.resize(size_t(pairs) * I);
    group_pairs(experts, pairs, s);
    // The avx2 path scales its weights by 2^25: inputs out of its range (|x| ≥ 2^90, inf, NaN;
    // |y| ≤ (|limit| + 1) · max(|limit|, 0.28), so a limit ≥ 10^12) go to the scalar loop.
    bool x_in_range = true;
    for (size_t i = 0; i < s.xp.size() && x_in_range; i++) x_in_range = std::fabs(s.xp[i]) < kAvx2MaxInput;
    const bool y_in_range = std::fabs(swiglu_limit) < 1e12f;
    const bool avx2 = rows == rows_fn(HostSimd::avx2) && rows != rows_fn(HostSimd::scalar);
    CallKernels c{Kernels{avx2 && !x_in_range ? rows_scalar : rows, nullptr, {}},
                  Kernels{avx2 && !y_in_range ? rows_scalar : rows, nullptr, {}}};
    // A non-finite activation sends the whole call to the float kernels.
    const int64_t q0 = prof ? host_profile::now_ns() : 0;
    c.q8 = q8_kernel && quantize_rows(s.xp.data(), T, H, s.xq) ? q8_kernel : nullptr;
    if (prof) host_profile::quantized(host_profile::now_ns() - q0);
    c.gu.q8 = c.q8;
    c.gu.prefetch = c.dn.prefetch =
        host_q8::Prefetch{tuning.prefetch_bytes, tuning.prefetch_locality, tuning.scale_prefetch_bytes};
    if (c.q8) {
        s.yq.assign(size_t(pairs) * host_q8::row_bytes(I), 0);
        c.yq = s.yq.data();
    }
    const uint32_t G = uint32_t(s.groups.size());
    s.reserve_sync(G);
    for (uint32_t g = 0; g < G; g++) {
        s.sync[g].gu_done.store(0, std::memory_order_relaxed);
        s.sync[g].y_ok.store(1, std::memory_order_relaxed);
    }
    return c;
}

// One call with the float kernel `rows` or, when q8_kernel is non-null and the activations x are
// finite, the int8 kernel (exact_row takes the rows it declines; a non-finite swiglu output
// sends the down projection back to `rows`).
void run_experts(RowsFn rows, host_q8::RowsFn q8_kernel, const uint16_t* x_bf16, uint32_t T, uint32_t H, uint32_t I,
                 const MoeWeights& w, const int32_t* experts, uint32_t K, float swiglu_limit, float* out) {
    assert(H % 32 == 0 && I % 32 == 0 && T >= 1 && K >= 1);
    std::lock_guard<std::mutex> lock(g_scratch_mutex);
    Scratch& s = g_scratch;
    const HostMoeTuning tuning = g_tuning;
    const bool prof = T == 1 && host_profile::on();  // cpu/host_experts_profile.h
    if (prof) host_profile::call_begin();
    const CallKernels c = prepare_call(s, rows, q8_kernel, x_bf16, T, H, I, experts, K, swiglu_limit, tuning, prof);
    const host_q8::RowsFn q8 = c.q8;
    const uint32_t G = uint32_t(s.groups.size());
    const size_t threads = parallel_threads();
    const Split gus = make_split(2 * I, q8 ? kRowBlockQ8 : kRowBlock, G, tuning.ranges_per_thread, threads);
    const Split dns = make_split(H, kRowBlock, G, tuning.ranges_per_thread, threads);
    float* yp = s.yp.data();
    auto gate_up_range = [&](size_t item) {
        const int64_t t0 = prof ? host_profile::now_ns() : 0;
        const uint32_t g = uint32_t(item / gus.parts), p = uint32_t(item % gus.parts);
        const uint32_t u0 = gus.first_unit(p), u1 = gus.first_unit(p + 1);
        for (uint32_t u = u0; u < u1; u++) {
            const uint32_t r0 = u * gus.unit_rows;
            gate_up_item(c.gu, w, s, s.groups[g], r0, std::min(2 * I, r0 + gus.unit_rows), K, H, I, swiglu_limit, yp,
                         c.yq, &s.sync[g].y_ok);
        }
        s.sync[g].gu_done.fetch_add(1, std::memory_order_release);
        if (prof) host_profile::item(t0, host_profile::now_ns(), range_bytes(u0, u1, gus, 2 * I, H), 0);
    };
    auto down_range = [&](size_t item, bool wait) {
        const int64_t t0 = prof ? host_profile::now_ns() : 0;
        const uint32_t g = uint32_t(item / dns.parts), p = uint32_t(item % dns.parts);
        if (wait) wait_until(s.sync[g].gu_done, gus.parts);
        const int64_t waited = prof ? host_profile::now_ns() - t0 : 0;
        Kernels k = c.dn;
        if (q8 && s.sync[g].y_ok.load(std::memory_order_relaxed)) k.q8 = q8;
        const uint32_t u0 = dns.first_unit(p), u1 = dns.first_unit(p + 1);
        for (uint32_t u = u0; u < u1; u++) {
            const uint32_t r0 = u * dns.unit_rows;
            down_item(k, w, s, s.groups[g], r0, std::min(H, r0 + dns.unit_rows), H, I, out);
        }
        if (prof) host_profile::item(t0, host_profile::now_ns(), range_bytes(u0, u1, dns, H, I), waited);
    };
    const size_t n_gu = size_t(G) * gus.parts, n_dn = size_t(G) * dns.parts;
    if (prof) host_profile::dispatch();
    if (tuning.one_pass) {
        // Every gate_up range is handed out before any down range, and a gate_up range waits
        // for nothing, so the waits end (on the calling thread alone too).
        parallel(
            n_gu + n_dn, [&](size_t item) { item < n_gu ? gate_up_range(item) : down_range(item - n_gu, true); },
            int(tuning.caller_spin_us));
    } else {
        parallel(n_gu, gate_up_range, int(tuning.caller_spin_us));
        parallel(n_dn, [&](size_t item) { down_range(item, false); }, int(tuning.caller_spin_us));
    }
    if (prof) host_profile::call_end();
}

// The int8 kernel host_moe_experts uses: on unless GPTOSS_HOST_MOE_Q8=0, the AVX-512 one when the
// float path selected is avx512, none when it is scalar (GPTOSS_HOST_SIMD=scalar, or no AVX2).
host_q8::RowsFn q8_selected() {
    static const host_q8::RowsFn selected = []() -> host_q8::RowsFn {
        const char* env = std::getenv("GPTOSS_HOST_MOE_Q8");
        if (env && std::strcmp(env, "0") == 0) return nullptr;
        const HostSimd simd = host_simd_selected();
        return simd == HostSimd::scalar ? nullptr : host_q8::rows_fn(simd == HostSimd::avx512);
    }();
    return selected;
}

}  // namespace

void host_moe_experts_simd(HostSimd simd, const uint16_t* x_bf16, uint32_t T, uint32_t H, uint32_t I,
                           const MoeWeights& w, const int32_t* experts, uint32_t K, float swiglu_limit,
                           float* out) {
    run_experts(rows_fn(best_supported(simd)), nullptr, x_bf16, T, H, I, w, experts, K, swiglu_limit, out);
}

bool host_moe_experts_q8(const char* kernel, const uint16_t* x_bf16, uint32_t T, uint32_t H, uint32_t I,
                         const MoeWeights& w, const int32_t* experts, uint32_t K, float swiglu_limit, float* out) {
    const host_q8::RowsFn q8 = host_q8::rows_fn_named(kernel);
    if (!q8) return false;
    run_experts(rows_fn(host_simd_selected()), q8, x_bf16, T, H, I, w, experts, K, swiglu_limit, out);
    return true;
}

const char* host_moe_path_name() {
    const host_q8::RowsFn q8 = q8_selected();
    if (q8 && q8 == host_q8::rows_fn_named("avx512-vnni")) return "avx512-vnni int8";
    if (q8) return "avx2 int8";
    return host_simd_name(host_simd_selected());
}

void host_moe_reserve(uint32_t T, uint32_t K, uint32_t H, uint32_t I) {
    std::lock_guard<std::mutex> lock(g_scratch_mutex);
    Scratch& s = g_scratch;
    const size_t pairs = size_t(T) * K;
    s.xp.reserve(size_t(T) * H);
    s.yp.reserve(pairs * I);
    s.xq.reserve(size_t(T) * host_q8::row_bytes(H));
    s.yq.reserve(pairs * host_q8::row_bytes(I));
    s.keys.reserve(pairs);
    s.order.reserve(pairs);
    s.groups.reserve(pairs);
    s.reserve_sync(pairs);
}

void host_moe_experts(const uint16_t* x_bf16, uint32_t T, uint32_t H, uint32_t I, const MoeWeights& w,
                      const int32_t* experts, uint32_t K, float swiglu_limit, float* out) {
    run_experts(rows_fn(host_simd_selected()), q8_selected(), x_bf16, T, H, I, w, experts, K, swiglu_limit, out);
}

HostMoeTuning host_moe_tuning() {
    std::lock_guard<std::mutex> lock(g_scratch_mutex);
    return g_tuning;
}

void host_moe_set_tuning(const HostMoeTuning& tuning) {
    std::lock_guard<std::mutex> lock(g_scratch_mutex);
    g_tuning = tuning;
}

bool host_weights_huge_default() {
    static const bool huge = env_u32("GPTOSS_HOST_HUGEPAGE", 1, 1) != 0;
    return huge;
}

void* host_weights_alloc(size_t bytes, bool huge) {
    constexpr size_t kHuge = size_t(2) << 20;
    const size_t n = (std::max<size_t>(bytes, 1) + kHuge - 1) & ~(kHuge - 1);
    void* p = nullptr;
    if (posix_memalign(&p, kHuge, n) != 0) return nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);  // advice only
#else
    (void)huge;
#endif
    return p;
}

void host_weights_free(void* p) { std::free(p); }

double measure_host_read_gbps(size_t bytes) {
    constexpr size_t kChunk = size_t(1) << 20;
    const size_t n_chunks = std::max<size_t>(1, bytes / kChunk);
    uint8_t* buf = static_cast<uint8_t*>(std::aligned_alloc(64, n_chunks * kChunk));
    if (buf == nullptr) return 0.0;
    parallel(n_chunks, [&](size_t c) { std::memset(buf + c * kChunk, int(c * 131 + 7) & 0xff, kChunk); });
    const ReadFn read = read_fn(host_simd_selected());
    std::vector<uint64_t> sink(n_chunks, 0);
    double best = 0.0;
    for (int pass = 0; pass < 5; pass++) {
        const auto t0 = std::chrono::steady_clock::now();
        parallel(n_chunks, [&](size_t c) { sink[c] ^= read(buf + c * kChunk, kChunk); });
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, double(n_chunks * kChunk) / s / 1e9);
    }
    uint64_t folded = 0;
    for (uint64_t v : sink) folded ^= v;
    std::free(buf);
    g_read_sink = folded;  // keeps the reads: the fold is observable
    return best;
}

}  // namespace cpu
}  // namespace gptoss
