// cpu/host_experts_q8.cpp - the int8-activation kernels of the host experts (see
// cpu/host_experts_q8.h for the math and the layout). A group is 8 blocks of a weight row (128
// bytes of nibbles, 8 scale bytes). Its 32 dwords (block b, unit u = 4 bytes) are transposed so
// that a vector holds one unit of all 8 blocks (lane j = block kBlockOrder[j]): AVX-512 with two
// vpermt2d (units 0|1 and 2|3 in one zmm each), AVX2 with four unpacklo/hi_epi32 and four
// unpacklo/hi_epi64 (no lane crossing). The low and high nibbles of a unit are the even and odd
// elements of its 8 weights; pshufb maps each nibble to 2·E2M1 + 12 (an unsigned byte), and
// vpdpbusd / vpmaddubsw+vpmaddwd dot them with the signed q of the same elements, so each lane
// sums whole bytes of one block. Per group and input: the 8 block sums (int32, exact), less
// 12·Σq, converted to fp32, times d/2 (rounded), times the block's 2^(s-127) (exact), added to 8
// per-lane row sums that are reduced once per row. The order of operations is fixed by the shape,
// so results do not depend on T, the grouping or the thread count.
#include "cpu/host_experts_q8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(GPTOSS_HOST_SIMDE)
#include "tests/simde-x86.h"
#define GPTOSS_Q8_X86 1
#define GPTOSS_TARGET(features)
#define GPTOSS_CPU_HAS(feature) true
#elif defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GPTOSS_Q8_X86 1
#define GPTOSS_TARGET(features) __attribute__((target(features)))
#define GPTOSS_CPU_HAS(feature) __builtin_cpu_supports(feature)
#endif

namespace gptoss {
namespace cpu {
namespace host_q8 {

namespace {

// Natural index e (0..31) of a block → its place in the permuted fp32 layout.
inline uint32_t perm_in_block(uint32_t e) { return ((e & 1u) << 4) | (e >> 1); }

// Lane of block b (0..7) in a group: the inverse of kBlockOrder.
inline uint32_t lane_of(uint32_t b) { return (b & 1) ? 4 + b / 2 : b / 2; }

// Whether a scale byte sends the row to the exact path: 0 (2^-127, which the integer path's
// 2^(s-127) bit trick cannot form) or ≥ 253 (the reference dequantizes to ±inf or overflows).
inline bool exact_scale(uint8_t s) { return s == 0 || s >= 253; }

bool row_needs_exact_scalar(const uint8_t* sc, uint32_t nb) {
    for (uint32_t b = 0; b < nb; b++)
        if (exact_scale(sc[b])) return true;
    return false;
}

// std::nearbyint(v) for |v| < 2^22 in the default rounding mode (to nearest, ties to even),
// without the library call (glibc's saves and restores the floating-point environment: ~10 ns
// per element, 30 µs per 2880-element row, bench/NOTES.md v16): adding and subtracting 1.5 · 2^23
// rounds v to an integer in that mode, exactly (the sum's ulp is 1). The sign of a zero result
// may differ from nearbyint's (-0 vs 0); callers convert to an integer, where it does not matter.
#if defined(__FAST_MATH__)
#error "cpu/host_experts_q8.cpp: round_to_int needs IEEE addition order (no -ffast-math)"
#endif
inline float round_to_int(float v) {
    constexpr float kMagic = 12582912.0f;  // 1.5 · 2^23
    return (v + kMagic) - kMagic;
}

}  // namespace

bool quantize_block_scalar(const float* xp, uint32_t block, uint8_t* dst) {
    const float* x = xp + size_t(block) * 32;
    float amax = 0.0f;
    for (uint32_t i = 0; i < 32; i++) {
        if (!std::isfinite(x[i])) return false;
        amax = std::max(amax, std::fabs(x[i]));
    }
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    uint8_t* g = dst + size_t(block / kGroupBlocks) * kGroupBytes;
    const uint32_t lane = lane_of(block % kGroupBlocks);
    int32_t sum = 0;
    for (uint32_t e = 0; e < 32; e++) {
        const float v = round_to_int(x[perm_in_block(e)] * inv);  // |x · inv| ≤ 127 (+ rounding)
        const int32_t q = int32_t(std::min(127.0f, std::max(-127.0f, v)));
        g[layout_offset(lane, e)] = uint8_t(int8_t(q));
        sum += q;
    }
    const int32_t corr = 12 * sum;
    const float half_d = amax / 127.0f * 0.5f;
    std::memcpy(g + 256 + lane * 4, &corr, 4);
    std::memcpy(g + 288 + lane * 4, &half_d, 4);
    return true;
}

#ifdef GPTOSS_Q8_X86
namespace {

// quantize_block_scalar's bytes with AVX2 (no "fma" target: the product and the rounding's
// addition stay two roundings, as in the scalar loop). The 32 values in the permuted order
// (16 even elements, 16 odd) become 8 runs of 4 bytes: run k holds elements of unit k % 4,
// low (even) or high (odd) nibbles by k / 4, at layout_offset's place for the block's lane.
GPTOSS_TARGET("avx2") bool quantize_block_avx2(const float* xp, uint32_t block, uint8_t* dst) {
    const float* x = xp + size_t(block) * 32;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v[i], v[i]), _mm256_setzero_ps(), _CMP_NEQ_UQ));
        amax = _mm256_max_ps(amax, _mm256_and_ps(v[i], abs_mask));
    }
    if (_mm256_movemask_ps(bad) != 0) return false;  // x - x is NaN for ±inf and NaN
    alignas(32) float m8[8];
    _mm256_store_ps(m8, amax);
    float am = 0.0f;
    for (float m : m8) am = std::max(am, m);
    const float inv = am > 0.0f ? 127.0f / am : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv), magic = _mm256_set1_ps(12582912.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i q[4], sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        const __m256 r = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v[i], vinv), magic), magic);
        // std::min(127, std::max(-127, r)) including its NaN case (0 · inf when 127 / amax
        // overflows): maxps returns its second operand when unordered, so r goes first.
        q[i] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
        sum = _mm256_add_epi32(sum, q[i]);
    }
    // int32 → int8 (exact: |q| ≤ 127), back in order: dword k = values 4k .. 4k + 3.
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    alignas(32) uint32_t runs[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(runs),
                       _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    alignas(32) int32_t s8[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(s8), sum);
    int32_t total = 0;
    for (int32_t t : s8) total += t;
    uint8_t* g = dst + size_t(block / kGroupBlocks) * kGroupBytes;
    const uint32_t lane = lane_of(block % kGroupBlocks);
    static constexpr uint32_t kRunAt[8] = {0, 32, 128, 160, 64, 96, 192, 224};
    for (int k = 0; k < 8; k++) std::memcpy(g + kRunAt[k] + lane * 4, &runs[k], 4);
    const int32_t corr = 12 * total;
    const float half_d = am / 127.0f * 0.5f;
    std::memcpy(g + 256 + lane * 4, &corr, 4);
    std::memcpy(g + 288 + lane * 4, &half_d, 4);
    return true;
}

}  // namespace
#endif

bool quantize_block(const float* xp, uint32_t block, uint8_t* dst) {
#ifdef GPTOSS_Q8_X86
    static const bool avx2 = GPTOSS_CPU_HAS("avx2");
    if (avx2) return quantize_block_avx2(xp, block, dst);
#endif
    return quantize_block_scalar(xp, block, dst);
}

bool quantize_group(const float* xp, uint32_t k, uint32_t group, uint8_t* dst) {
    const uint32_t nb = k / 32, b0 = group * kGroupBlocks, b1 = std::min(nb, b0 + kGroupBlocks);
    std::memset(dst + size_t(group) * kGroupBytes, 0, kGroupBytes);
    bool ok = true;
    for (uint32_t b = b0; b < b1; b++) ok = quantize_block(xp, b, dst) && ok;
    return ok;
}

bool quantize_row(const float* xp, uint32_t k, uint8_t* dst) {
    bool ok = true;
    for (uint32_t g = 0; g < (k / 32 + kGroupBlocks - 1) / kGroupBlocks; g++) ok = quantize_group(xp, k, g, dst) && ok;
    return ok;
}

#ifdef GPTOSS_Q8_X86
namespace {

#define GPTOSS_Q8_UNROLL _Pragma("GCC unroll 4")

// A group's bytes and scales: the row's own, or a zero-padded copy for the last, partial group
// (nibble 0 maps to 12, times q = 0 of the padding; scale 0 gives 2^(0-127) → 0 here, times 0).
struct GroupSrc {
    alignas(64) uint8_t blocks[128];
    uint8_t scales[16];
    const uint8_t* b;
    const uint8_t* s;
    void at(const Mat& m, uint32_t r, uint32_t g) {
        const uint8_t* rb = m.blocks + (size_t(r) * m.nb + size_t(g) * kGroupBlocks) * 16;
        const uint8_t* rs = m.scales + size_t(r) * m.nb + size_t(g) * kGroupBlocks;
        const uint32_t n = std::min(kGroupBlocks, m.nb - g * kGroupBlocks);
        if (n == kGroupBlocks) {
            b = rb, s = rs;
            return;
        }
        std::memset(blocks, 0, sizeof blocks);
        std::memset(scales, 0, sizeof scales);
        std::memcpy(blocks, rb, size_t(n) * 16);
        std::memcpy(scales, rs, n);
        b = blocks, s = scales;
    }
};

// Software prefetch (Mat::prefetch.bytes ahead): the two cache lines of group g of row r's
// blocks, and at the row's start its scales as far ahead in the scale stream (v14: one line at
// bytes / 16, a row's scales being 1/16 of its blocks; with scale_bytes, both lines a row's
// 90 scale bytes may span, scale_bytes ahead). Hints only: an address past the matrix is harmless.
template <int L>
inline void prefetch_group_l(const Mat& m, uint32_t r, uint32_t g) {
    const uint8_t* p = m.blocks + (size_t(r) * m.nb + size_t(g) * kGroupBlocks) * 16 + m.prefetch.bytes;
    __builtin_prefetch(p, 0, L);
    __builtin_prefetch(p + 64, 0, L);
    if (g != 0) return;
    const uint8_t* s = m.scales + size_t(r) * m.nb;
    if (m.prefetch.scale_bytes == 0) {
        __builtin_prefetch(s + m.prefetch.bytes / 16, 0, L);
    } else {
        __builtin_prefetch(s + m.prefetch.scale_bytes, 0, L);
        __builtin_prefetch(s + m.prefetch.scale_bytes + m.nb - 1, 0, L);
    }
}
inline void prefetch_group(const Mat& m, uint32_t r, uint32_t g) {
    switch (m.prefetch.locality) {
        case 0: return prefetch_group_l<0>(m, r, g);
        case 1: return prefetch_group_l<1>(m, r, g);
        case 2: return prefetch_group_l<2>(m, r, g);
        default: return prefetch_group_l<3>(m, r, g);
    }
}

// ----- AVX2 -----------------------------------------------------------------------------------

GPTOSS_TARGET("avx2,fma") inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// The 8 scale bytes at s in lane order, as fp32 2^(s-127) (0 for s = 0).
GPTOSS_TARGET("avx2,fma") inline __m256 lane_scales(const uint8_t* s) {
    const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i v = _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)), order);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(v), 23));
}

GPTOSS_TARGET("avx2,fma") bool row_needs_exact_avx2(const uint8_t* sc, uint32_t nb) {
    if (nb < 32) return row_needs_exact_scalar(sc, nb);
    const __m256i zero = _mm256_setzero_si256(), hi = _mm256_set1_epi8(char(253));
    int bad = 0;
    for (uint32_t i = 0;; i += 32) {
        const uint32_t at = std::min(i, nb - 32);  // the last load overlaps the one before
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + at));
        bad |= _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, zero)) |
               _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_max_epu8(v, hi), v));
        if (at + 32 >= nb) break;
    }
    return bad != 0;
}

template <uint32_t NT>
GPTOSS_TARGET("avx2,fma") void rows_avx2_t(const Mat& m, uint32_t r0, uint32_t r1, const uint8_t* const* xq,
                                           float* const* outs, uint32_t* exact_rows, uint32_t* n_exact) {
    const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    const __m256i nib = _mm256_set1_epi8(0x0f);
    const __m256i ones = _mm256_set1_epi16(1);
    const uint32_t ng = (m.nb + kGroupBlocks - 1) / kGroupBlocks;
    GroupSrc src;
    for (uint32_t r = r0; r < r1; r++) {
        if (row_needs_exact_avx2(m.scales + size_t(r) * m.nb, m.nb)) {
            exact_rows[(*n_exact)++] = r;
            continue;
        }
        __m256 acc[NT];
        GPTOSS_Q8_UNROLL
        for (uint32_t j = 0; j < NT; j++) acc[j] = _mm256_setzero_ps();
        for (uint32_t g = 0; g < ng; g++) {
            if (m.prefetch.bytes) prefetch_group(m, r, g);
            src.at(m, r, g);
            const __m256i y0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src.b));
            const __m256i y1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src.b + 32));
            const __m256i y2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src.b + 64));
            const __m256i y3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src.b + 96));
            const __m256i t0 = _mm256_unpacklo_epi32(y0, y1), t1 = _mm256_unpackhi_epi32(y0, y1);
            const __m256i t2 = _mm256_unpacklo_epi32(y2, y3), t3 = _mm256_unpackhi_epi32(y2, y3);
            __m256i sum[NT];
            GPTOSS_Q8_UNROLL
            for (uint32_t j = 0; j < NT; j++) sum[j] = _mm256_setzero_si256();
            // Units (0, 1) then (2, 3), one unit's weights live at a time (16 ymm registers): the
            // int16 pair sums of 4 maddubs stay ≤ 4 · 6096, then one vpmaddwd widens them.
            for (int half = 0; half < 2; half++) {
                const __m256i ua = half == 0 ? _mm256_unpacklo_epi64(t0, t2) : _mm256_unpacklo_epi64(t1, t3);
                const __m256i ub = half == 0 ? _mm256_unpackhi_epi64(t0, t2) : _mm256_unpackhi_epi64(t1, t3);
                __m256i p[NT];
                const __m256i wal = _mm256_shuffle_epi8(lut, _mm256_and_si256(ua, nib));
                const __m256i wah = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(ua, 4), nib));
                GPTOSS_Q8_UNROLL
                for (uint32_t j = 0; j < NT; j++) {
                    const uint8_t* qh = xq[j] + size_t(g) * kGroupBytes + half * 128;
                    p[j] = _mm256_add_epi16(
                        _mm256_maddubs_epi16(wal, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh))),
                        _mm256_maddubs_epi16(wah, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 64))));
                }
                const __m256i wbl = _mm256_shuffle_epi8(lut, _mm256_and_si256(ub, nib));
                const __m256i wbh = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(ub, 4), nib));
                GPTOSS_Q8_UNROLL
                for (uint32_t j = 0; j < NT; j++) {
                    const uint8_t* qh = xq[j] + size_t(g) * kGroupBytes + half * 128;
                    p[j] = _mm256_add_epi16(p[j], _mm256_maddubs_epi16(wbl, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32))));
                    p[j] = _mm256_add_epi16(p[j], _mm256_maddubs_epi16(wbh, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 96))));
                    const __m256i wide = _mm256_madd_epi16(p[j], ones);
                    sum[j] = _mm256_add_epi32(sum[j], wide);
                }
            }
            const __m256 ws = lane_scales(src.s);
            GPTOSS_Q8_UNROLL
            for (uint32_t j = 0; j < NT; j++) {
                const uint8_t* q = xq[j] + size_t(g) * kGroupBytes;
                const __m256i s8 = _mm256_sub_epi32(sum[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 256)));
                const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(s8), _mm256_loadu_ps(reinterpret_cast<const float*>(q + 288)));
                acc[j] = _mm256_fmadd_ps(t, ws, acc[j]);
            }
        }
        GPTOSS_Q8_UNROLL
        for (uint32_t j = 0; j < NT; j++) outs[j][r - r0] = hsum8(acc[j]);
    }
}

void rows_avx2(const Mat& m, uint32_t r0, uint32_t r1, const uint8_t* const* xq, uint32_t n, float* const* outs,
               uint32_t* exact_rows, uint32_t* n_exact) {
    switch (n) {
    case 1: rows_avx2_t<1>(m, r0, r1, xq, outs, exact_rows, n_exact); break;
    case 2: rows_avx2_t<2>(m, r0, r1, xq, outs, exact_rows, n_exact); break;
    case 3: rows_avx2_t<3>(m, r0, r1, xq, outs, exact_rows, n_exact); break;
    default: rows_avx2_t<4>(m, r0, r1, xq, outs, exact_rows, n_exact); break;
    }
}

// ----- AVX-512 (BW + VNNI) --------------------------------------------------------------------

#define GPTOSS_Q8_AVX512 "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni"

GPTOSS_TARGET(GPTOSS_Q8_AVX512) bool row_needs_exact_avx512(const uint8_t* sc, uint32_t nb) {
    if (nb < 64) return row_needs_exact_avx2(sc, nb);
    const __m512i hi = _mm512_set1_epi8(char(253));
    uint64_t bad = 0;
    for (uint32_t i = 0;; i += 64) {
        const uint32_t at = std::min(i, nb - 64);  // the last load overlaps the one before
        const __m512i v = _mm512_loadu_si512(sc + at);
        bad |= uint64_t(_mm512_cmpeq_epi8_mask(v, _mm512_setzero_si512())) | uint64_t(_mm512_cmpge_epu8_mask(v, hi));
        if (at + 64 >= nb) break;
    }
    return bad != 0;
}

template <uint32_t NT>
GPTOSS_TARGET(GPTOSS_Q8_AVX512) void rows_avx512_t(const Mat& m, uint32_t r0, uint32_t r1, const uint8_t* const* xq,
                                                   float* const* outs, uint32_t* exact_rows, uint32_t* n_exact) {
    // (maskz forms with all lanes on, and a table load: GCC 12 warns on the plain forms' undefined source.)
    alignas(64) static const uint8_t kLut[64] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                                 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                                 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                                 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
    const __m512i lut = _mm512_load_si512(kLut);
    const __m512i nib = _mm512_set1_epi8(0x0f);
    // Lane L of units (2p, 2p + 1): block kBlockOrder[L % 8], unit 2p + L / 8, i.e. dword
    // 4 · block + unit of the group's 128 bytes (blocks 0-3 in a, 4-7 in b).
    const __m512i idx0 = _mm512_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28, 1, 9, 17, 25, 5, 13, 21, 29);
    const __m512i idx1 = _mm512_setr_epi32(2, 10, 18, 26, 6, 14, 22, 30, 3, 11, 19, 27, 7, 15, 23, 31);
    const uint32_t ng = (m.nb + kGroupBlocks - 1) / kGroupBlocks;
    GroupSrc src;
    for (uint32_t r = r0; r < r1; r++) {
        if (row_needs_exact_avx512(m.scales + size_t(r) * m.nb, m.nb)) {
            exact_rows[(*n_exact)++] = r;
            continue;
        }
        __m256 acc[NT];
        GPTOSS_Q8_UNROLL
        for (uint32_t j = 0; j < NT; j++) acc[j] = _mm256_setzero_ps();
        for (uint32_t g = 0; g < ng; g++) {
            if (m.prefetch.bytes) prefetch_group(m, r, g);
            src.at(m, r, g);
            const __m512i a = _mm512_loadu_si512(src.b), b = _mm512_loadu_si512(src.b + 64);
            const __m512i p0 = _mm512_permutex2var_epi32(a, idx0, b), p1 = _mm512_permutex2var_epi32(a, idx1, b);
            const __m512i w0 = _mm512_shuffle_epi8(lut, _mm512_and_si512(p0, nib));
            const __m512i w1 = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(p0, 4), nib));
            const __m512i w2 = _mm512_shuffle_epi8(lut, _mm512_and_si512(p1, nib));
            const __m512i w3 = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(p1, 4), nib));
            const __m256 ws = lane_scales(src.s);
            GPTOSS_Q8_UNROLL
            for (uint32_t j = 0; j < NT; j++) {
                const uint8_t* q = xq[j] + size_t(g) * kGroupBytes;
                __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, _mm512_loadu_si512(q));
                d = _mm512_dpbusd_epi32(d, w1, _mm512_loadu_si512(q + 64));
                d = _mm512_dpbusd_epi32(d, w2, _mm512_loadu_si512(q + 128));
                d = _mm512_dpbusd_epi32(d, w3, _mm512_loadu_si512(q + 192));
                __m256i sum = _mm256_add_epi32(_mm512_maskz_extracti64x4_epi64(0xff, d, 0),
                                               _mm512_maskz_extracti64x4_epi64(0xff, d, 1));
                sum = _mm256_sub_epi32(sum, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 256)));
                const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_loadu_ps(reinterpret_cast<const float*>(q + 288)));
                acc[j] = _mm256_fmadd_ps(t, ws, acc[j]);
            }
        }
        GPTOSS_Q8_UNROLL
        for (uint32_t j = 0; j < NT; j++) outs[j][r - r0] = hsum8(acc[j]);
    }
}

void rows_avx512(const Mat& m, uint32_t r0, uint32_t r1, const uint8_t* const* xq, uint32_t n, float* const* outs,
                 uint32_t* exact_rows, uint32_t* n_exact) {
    switch (n) {
    case 1: rows_avx512_t<1>(m, r0, r1, xq, outs, exact_rows, n_exact); break;
    case 2: rows_avx512_t<2>(m, r0, r1, xq, outs, exact_rows, n_exact); break;
    case 3: rows_avx512_t<3>(m, r0, r1, xq, outs, exact_rows, n_exact); break;
    default: rows_avx512_t<4>(m, r0, r1, xq, outs, exact_rows, n_exact); break;
    }
}

bool has_avx2() { return GPTOSS_CPU_HAS("avx2") && GPTOSS_CPU_HAS("fma"); }
bool has_avx512_vnni() {
    return has_avx2() && GPTOSS_CPU_HAS("avx512f") && GPTOSS_CPU_HAS("avx512bw") && GPTOSS_CPU_HAS("avx512vl") &&
           GPTOSS_CPU_HAS("avx512vnni");
}

}  // namespace
#endif  // GPTOSS_Q8_X86

RowsFn rows_fn_named(const char* name) {
#ifdef GPTOSS_Q8_X86
#ifndef GPTOSS_HOST_SIMDE
    __builtin_cpu_init();
#endif
    if (std::strcmp(name, "avx512-vnni") == 0) return has_avx512_vnni() ? rows_avx512 : nullptr;
    if (std::strcmp(name, "avx2") == 0) return has_avx2() ? rows_avx2 : nullptr;
#endif
    (void)name;
    return nullptr;
}

RowsFn rows_fn(bool want_avx512) {
    RowsFn f = want_avx512 ? rows_fn_named("avx512-vnni") : nullptr;
    return f ? f : rows_fn_named("avx2");
}

}  // namespace host_q8
}  // namespace cpu
}  // namespace gptoss
