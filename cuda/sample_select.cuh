// cuda/sample_select.cuh - the device arithmetic the GPU samplers share (cuda/sample.cu's
// cooperative one-row sampler and cuda/sample_batch.cu's one-CTA-per-row sampler): orderable logit
// bits and argmax keys, exact fixed-point masses (limbs of p·2^92), the radix select of the top_k /
// top_p boundary key, the CTA tile scan in id order and the one-warp pick of the tile that holds
// the sample. Both samplers must make the same decisions bit for bit (same token for the same
// logits, config and u), so everything that decides a token lives here once.
#pragma once

#include <cub/block/block_scan.cuh>

#include <climits>
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

// The radix select both samplers run (cuda/sample.cu's radix_select over a grid, cuda/sample_batch.cu's
// row_select in one CTA), over the keys >= floor_key; every thread of the CTA calls it, and with
// the grid form every CTA reaches the same K. Passes of kRadixBits from the top of nbits: each
// builds the shared histogram of the keys that share the prefix chosen so far (count, mass limbs
// when with_mass, largest key), `publish(nbins)` makes it the whole row's (the grid form: flush to
// global and grid sync; one CTA: nothing), then a block scan from the highest digit down finds
// the first digit whose cumulative count reaches k or, by_mass, whose cumulative mass reaches
// thr = top_p · total (*total = the first pass's aggregate unless have_total). A bin of one key or
// the last pass ends it. `visit(add)` calls add(key, p) for each of this thread's candidate keys,
// p() giving its probability (called only with_mass); `bin_at(d)` / `key_at(d)` read digit d's
// whole-row Mass and largest key after publish. On return *above = the count/mass of the keys > K
// and *bin = K's own. Smem: the sampler's shared struct (c, m, key, scan, prefix, result, above,
// bin, pos, done).
template <typename Smem, typename Visit, typename Publish, typename BinAt, typename KeyAt>
__device__ __forceinline__ unsigned long long radix_select_core(Smem& sm, uint32_t nbits, unsigned long long floor_key,
                                                                bool by_mass, bool with_mass, unsigned long long k,
                                                                double top_p, bool have_total, Mass* total,
                                                                Mass* above_out, Mass* bin_out, const Visit& visit,
                                                                const Publish& publish, const BinAt& bin_at,
                                                                const KeyAt& key_at) {
    const uint32_t tid = threadIdx.x;
    if (tid == 0) {
        sm.prefix = 0;
        sm.above = Mass{0, 0, 0, 0};
        sm.done = 0;
    }
    double thr = have_total ? top_p * mass_value(*total) : 0.0;
    uint32_t prev_shift = nbits;
    for (;;) {
        const uint32_t bits = min(uint32_t(kRadixBits), prev_shift);
        const uint32_t shift = prev_shift - bits;
        const uint32_t nbins = 1u << bits;
        for (uint32_t b = tid; b < nbins; b += kSelThreads) {
            sm.c[b] = 0;
            sm.m[0][b] = sm.m[1][b] = sm.m[2][b] = 0;
            sm.key[b] = 0;
        }
        if (tid == 0) sm.pos = INT_MAX;
        __syncthreads();
        const unsigned long long prefix = sm.prefix;
        const Mass above = sm.above;
        visit([&](unsigned long long key, const auto& p) {
            // prev_shift <= 63: (key >> nbits) == 0 == (prefix >> nbits) on the first pass.
            if (key < floor_key || (key >> prev_shift) != (prefix >> prev_shift)) return;
            const uint32_t d = uint32_t(key >> shift) & (nbins - 1);
            atomicAdd(&sm.c[d], 1u);
            if (with_mass) {
                unsigned long long m[3];
                mass_limbs(p(), m);
                for (int l = 0; l < 3; ++l)
                    if (m[l]) atomicAdd(&sm.m[l][d], m[l]);
            }
            atomicMax(&sm.key[d], key);
        });
        __syncthreads();
        publish(nbins);
        // Cumulative count/mass from the highest digit down: position q holds digit nbins−1−q.
        Mass raw[2], cum[2];
        for (int j = 0; j < 2; ++j) {
            const uint32_t q = 2 * tid + j;
            raw[j] = Mass{0, 0, 0, 0};
            if (q < nbins) raw[j] = bin_at(nbins - 1 - q);
        }
        Mass aggregate;
        cub::BlockScan<Mass, kSelThreads, cub::BLOCK_SCAN_WARP_SCANS>(sm.scan).InclusiveScan(raw, cum, MassSum(),
                                                                                             aggregate);
        if (by_mass && !have_total) {  // first pass of a top_p without top_k: every key counts
            *total = aggregate;
            thr = top_p * mass_value(aggregate);
            have_total = true;
        }
        for (int j = 0; j < 2; ++j) {
            const uint32_t q = 2 * tid + j;
            if (q >= nbins) continue;
            const Mass s = MassSum()(above, cum[j]);
            // By mass, also a key of this pass at or above q (thr may be 0: top_p <= 0 keeps one).
            const bool crossed = by_mass ? cum[j].c > 0 && mass_value(s) >= thr : s.c >= k;
            if (crossed) atomicMin(&sm.pos, int(q));
        }
        __syncthreads();
        // Unreachable guard (the last position's sum is the previous pass's crossing one): the
        // lowest digit, so that the loop still ends.
        const int pos = sm.pos == INT_MAX ? int(nbins - 1) : sm.pos;
        if (uint32_t(pos) / 2 == tid) {
            const bool odd = pos % 2;  // selects without a dynamic index (no local memory)
            const uint32_t d = nbins - 1 - uint32_t(pos);
            const Mass r = odd ? raw[1] : raw[0];
            const Mass cu = odd ? cum[1] : cum[0];
            sm.above = Mass{above.c + cu.c - r.c, above.m0 + cu.m0 - r.m0, above.m1 + cu.m1 - r.m1,
                            above.m2 + cu.m2 - r.m2};
            sm.bin = r;
            sm.prefix = prefix | ((unsigned long long)d << shift);
            if (r.c == 1 || shift == 0) {
                sm.done = 1;
                sm.result = r.c == 1 ? key_at(d) : sm.prefix;
            }
        }
        __syncthreads();
        if (sm.done) break;
        prev_shift = shift;
    }
    const unsigned long long result = sm.result;
    *above_out = sm.above;
    *bin_out = sm.bin;
    __syncthreads();  // before a next select resets the state
    return result;
}

}  // namespace sample_detail
}  // namespace cuda
}  // namespace gptoss
