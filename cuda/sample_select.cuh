// cuda/sample_select.cuh - the device arithmetic the GPU samplers share (cuda/sample.cu's
// cooperative one-row sampler and cuda/sample_batch.cu's one-CTA-per-row sampler): orderable
// logit bits and argmax keys, exact fixed-point masses (limbs of p·2^92), the CTA tile scan in id
// order and the one-warp pick of the tile that holds the sample. Both samplers must make the same
// decisions bit for bit (same token for the same logits, config and u), so everything that decides
// a token lives here once.
#pragma once

#include <cstdint>

namespace gptoss {
namespace cuda {
namespace sample_detail {

// Orderable bits of a logit: unsigned order = float order, −0 canonicalized to +0 so that
// they tie (the host compares with > and ==).
__device__ __forceinline__ uint32_t orderable(float v) {
    uint32_t b = __float_as_uint(v);
    if (b == 0x80000000u) b = 0;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ unsigned long long argmax_key(float v, uint32_t i) {
    const uint32_t b = orderable(v);
    return (static_cast<unsigned long long>(b) << 32) | static_cast<unsigned long long>(~i);
}

// Inverse of the value half of argmax_key.
__device__ __forceinline__ float argmax_value(unsigned long long key) {
    const uint32_t b = uint32_t(key >> 32);
    return __uint_as_float((b & 0x80000000u) ? (b & 0x7fffffffu) : ~b);
}

constexpr int kSelThreads = 512;
constexpr int kSelItems = 4;
constexpr uint32_t kSelTile = kSelThreads * kSelItems;
constexpr int kRadixBits = 10;
constexpr uint32_t kBins = 1u << kRadixBits;
constexpr uint32_t kMaxSelCtas = 256;  // the walk's chunk-sum scan holds 8 per lane of one warp

// A bin's count and mass limbs (mass = m2·2^-28 + m1·2^-60 + m0·2^-92).
struct Mass {
    unsigned long long c, m0, m1, m2;
};
struct MassSum {
    __device__ __forceinline__ Mass operator()(const Mass& a, const Mass& b) const {
        return Mass{a.c + b.c, a.m0 + b.m0, a.m1 + b.m1, a.m2 + b.m2};
    }
};

// p ∈ [0, 1] as limbs of p·2^92 truncated (each < 2^32; m2 <= 2^28). x − floor(x) and the
// power-of-two scalings are exact in double, so the limbs are exact bits of p.
__device__ __forceinline__ void mass_limbs(double p, unsigned long long (&m)[3]) {
    if (!(p > 0.0)) p = 0.0;  // NaN logits give no mass (and never a crash)
    if (p > 1.0) p = 1.0;
    double x = p * 0x1p28;
    const double f2 = floor(x);
    x = (x - f2) * 0x1p32;
    const double f1 = floor(x);
    x = (x - f1) * 0x1p32;
    m[2] = (unsigned long long)f2;
    m[1] = (unsigned long long)f1;
    m[0] = (unsigned long long)floor(x);
}

// The mass as a double: the limbs normalized to one 128-bit integer hi·2^64 + lo, then
// double(hi)·2^-28 + double(lo)·2^-92 (hi < 2^53 is exact): monotone in the integer, so
// comparing cumulative masses against a threshold is consistent along the bins.
__device__ __forceinline__ double mass_value(const Mass& s) {
    const unsigned long long a = s.m1 << 32;
    const unsigned long long lo = s.m0 + a;
    const unsigned long long hi = s.m2 + (s.m1 >> 32) + (lo < a ? 1ull : 0ull);
    return double(hi) * 0x1p-28 + double(lo) * 0x1p-92;
}

// Inclusive scan of the CTA's weights in id order (sequential inside a thread, Kogge-Stone over
// the lanes, warp totals added in warp order); returns the thread's exclusive base.
__device__ __forceinline__ double tile_scan(double (&v)[kSelItems], double* warp_sums) {
    for (int k = 1; k < kSelItems; ++k) v[k] = v[k - 1] + v[k];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double incl = v[kSelItems - 1];
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl = y + incl;
    }
    double excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = 0.0;
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    double base = 0.0;
    for (int w = 0; w < warp; ++w) base += warp_sums[w];
    base += excl;
    for (int k = 0; k < kSelItems; ++k) v[k] = base + v[k];
    return base;
}

// The one-warp pick of the tile holding u · total (call from warp 0, every lane): G <= 8 · 32
// tiles, lane l holding tiles l·per .. l·per + per − 1 (per = ceil(G / 32) <= 8) with sum_at(c),
// the tile's weight sum (double), and last_at(c), its last candidate id (int, −1: none). In-lane
// exclusive prefixes, a Kogge-Stone scan of the lane totals, total = E_{G−1} + s_{G−1} from the lane
// holding tile G − 1, target = u · total; the owner is the first tile with E_c + s_c > target. Lane 0
// writes *owner (−1: none), *owner_base (E_owner; only with an owner), *last (the largest last
// candidate, −1: none) and *target, in that order. cuda/sample.cu's cooperative sampler and
// cuda/sample_batch.cu's pick both call it, so they pick the same tile.
template <typename SumAt, typename LastAt>
__device__ __forceinline__ void pick_tile(uint32_t G, double u, const SumAt& sum_at, const LastAt& last_at,
                                          int* owner, double* owner_base, int* last, double* target) {
    const uint32_t lane = threadIdx.x & 31, per = (G + 31) / 32;
    double s[8], x[8];
    double run = 0.0;
    for (uint32_t i = 0; i < 8; ++i) {
        const uint32_t c = lane * per + i;
        s[i] = i < per && c < G ? sum_at(c) : 0.0;
        x[i] = run;  // in-lane exclusive
        run = run + s[i];
    }
    double incl = run;
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, incl, o);
        if (int(lane) >= o) incl = y + incl;
    }
    double lane_base = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) lane_base = 0.0;
    double total_w = 0.0;
    int hit = -1;
    double hit_base = 0.0;
    for (uint32_t i = 0; i < 8; ++i) {
        const uint32_t c = lane * per + i;
        if (i < per && c == G - 1) total_w = (lane_base + x[i]) + s[i];
    }
    const uint32_t last_lane = (G - 1) / per;
    total_w = __shfl_sync(0xffffffffu, total_w, int(last_lane));
    const double t = u * total_w;
    for (uint32_t i = 0; i < 8; ++i) {
        const uint32_t c = lane * per + i;
        if (hit < 0 && i < per && c < G) {
            const double X = lane_base + x[i];
            if (X + s[i] > t) {
                hit = int(c);
                hit_base = X;
            }
        }
    }
    const unsigned int ballot = __ballot_sync(0xffffffffu, hit >= 0);
    if (lane == 0) *owner = -1;
    if (ballot) {
        const int src = __ffs(ballot) - 1;
        const int o = __shfl_sync(0xffffffffu, hit, src);
        const double base = __shfl_sync(0xffffffffu, hit_base, src);
        if (lane == 0) {
            *owner = o;
            *owner_base = base;
        }
    }
    int gl = -1;
    for (uint32_t c = lane; c < G; c += 32) gl = max(gl, last_at(c));
    for (int o = 16; o > 0; o >>= 1) gl = max(gl, __shfl_xor_sync(0xffffffffu, gl, o));
    if (lane == 0) {
        *last = gl;
        *target = t;
    }
}

}  // namespace sample_detail
}  // namespace cuda
}  // namespace gptoss
