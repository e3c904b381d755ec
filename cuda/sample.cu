// cuda/sample.cu - sampling on the GPU over the fp32 logits [V]: greedy argmax (lowest id on
// ties) and the full definition of sample_logits (gptoss-sampling.cpp: temperature, top_k,
// top_p, one host-drawn u walking the kept ids in increasing id order), plus the
// streaming-read probe gptoss-bench uses to measure the bandwidth ceiling.
// Mapping (argmax): a grid-stride pass; each CTA reduces its best (value, id) and publishes it
// with one 64-bit atomicMax on an orderable key (value bits, then ~id), so the result is
// deterministic whatever the scheduling. Floor: 4·V bytes (0.8 MB) — latency, not bandwidth.
// Mapping (sample, T > 0): one cooperative kernel, f32_sample_select_kernel (one CTA of 512
// threads per 2048 ids, all resident; keys and p = exp((l − max)/T) in double stay in registers):
// no sort. Each id's unique 64-bit key (orderable logit, then ~id; −0 canonicalized to +0 as the
// host's == does) orders the ids as sample_logits does, and the kept set is {key >= K}: top_k's K
// is the k-th key, found by a radix select on counts (10-bit digits, ≤ 5 passes, each a per-CTA
// shared histogram flushed with integer atomics and one grid sync); top_p's K is the first key
// where the mass of the keys above reaches top_p · total, the same select on masses held as exact
// fixed-point integers (limbs of p·2^92). Then the walk in id order over w = p of the kept ids: a
// fixed scan per CTA, one grid sync, a fixed scan of the CTA sums, and the owning CTA picks the id.
// Floor: the logits are read once (0.8 MB from L2); the cost is latency, ~2–3 µs per grid sync
// (2 + one per select pass: up to 5 for top_k, 5 for top_p, 10 for both).
// Fallback (V > 256 CTAs of 2048, or no cooperative launch): weights w[id] (double, dense [V]),
// then a chunked walk. Without top_k/top_p, w = exp((l − max)/T) in one pass after argmax. With
// them, CUB radix-sorts orderable keys of the logits descending (stable: equal logits keep id
// order), p is computed over the first n = top_k (or V) sorted ids, top_p keeps the first sorted
// positions whose cumulative p/total reaches top_p, and the kept p are scattered to w. Every sum
// is a fixed tree of 1024-element CTA chunks (block_scan) combined in chunk order
// (scan_chunk_sums); ~10 launches and the sort (~100 µs at V = 201088).
// Both paths use no float atomics, so the token is the same run to run.
// Agreement with the host: p is exp in double on both sides (CUDA's and glibc's exp are within
// 1 ulp), and only the summation order differs (tree or exact integer vs sequential); the tokens
// can differ only when u·total (or top_p) lies within double rounding (~1e-15 relative) of a
// cumulative boundary.
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/sample_select.cuh"

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <atomic>
#include <climits>
#include <cmath>

namespace gptoss {
namespace cuda {
namespace {

namespace cg = cooperative_groups;
using namespace sample_detail;


__global__ __launch_bounds__(256) void f32_argmax_kernel(const float* __restrict__ logits, uint32_t V,
                                                        unsigned long long* key) {
    __shared__ unsigned long long best_w[8];
    unsigned long long best = 0;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < V; i += gridDim.x * blockDim.x) {
        const unsigned long long k = argmax_key(logits[i], i);
        best = k > best ? k : best;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other > best ? other : best;
    }
    if ((threadIdx.x & 31) == 0) best_w[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; ++w) best = best_w[w] > best ? best_w[w] : best;
        atomicMax(key, best);
    }
}

__global__ void argmax_token_kernel(const unsigned long long* key, int32_t* token) { *token = int32_t(~uint32_t(*key)); }

// ---------------------------------------------------------------------------
// Sampling at T > 0. A "chunk" is kChunk = 1024 consecutive elements handled by one CTA of 256
// threads, thread t holding elements 4t .. 4t+3 of the chunk.

constexpr int kThreads = 256;
constexpr int kItems = 4;
constexpr uint32_t kChunk = kThreads * kItems;

struct ScanSmem {
    double warp[kThreads / 32];
    double total;
    double found_base;
    double found_total;
    int first;
    int last;
};

// Inclusive scan of one chunk in a fixed order (sequential inside a thread, Kogge-Stone over
// the lanes, warp totals summed in warp order): on return v[k] is the chunk prefix through
// element 4t + k, *thread_base the prefix before element 4t. Returns the prefix through element
// `last` (the chunk's last real element) as the chunk total: bit-equal to what a later scan of
// the same values gives there, which the walks rely on (the prefixes of the zero padding past
// `last` may differ from it by rounding, since they are associated differently). Every
// thread must call it.
__device__ double block_scan(double (&v)[kItems], ScanSmem& sm, double* thread_base, uint32_t last) {
    for (int k = 1; k < kItems; ++k) v[k] = v[k - 1] + v[k];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double incl = v[kItems - 1];
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl = y + incl;
    }
    double excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = 0.0;
    if (lane == 31) sm.warp[warp] = incl;
    __syncthreads();
    double base = 0.0;
    for (int w = 0; w < warp; ++w) base += sm.warp[w];
    base += excl;
    for (int k = 0; k < kItems; ++k) v[k] = base + v[k];
    *thread_base = base;
    if (threadIdx.x == last / kItems) sm.total = v[last % kItems];
    __syncthreads();
    const double total = sm.total;
    __syncthreads();  // sm may be reused by the caller
    return total;
}

template <bool kStrict> __device__ __forceinline__ bool crosses(double e, double threshold) {
    return kStrict ? e > threshold : e >= threshold;
}

// The cumulative sums over chunk sums s[0..C): X_c = (sum of the tiles before c's tile) + the
// exclusive block_scan prefix inside its tile; the running sum at the end of chunk c is defined
// as E_c = X_c + s_c, so that X_c + (chunk c's own scan) ends exactly at E_c. Returns E_{C-1}
// (the total). With `find`, also the first c with E_c > threshold (kStrict) or >= threshold,
// in *c_out (-1 if none) and X_c in *base_out. All threads get the same results.
template <bool kStrict>
__device__ double scan_chunk_sums(const double* __restrict__ s, uint32_t C, bool find, double threshold,
                                  ScanSmem& sm, int* c_out, double* base_out) {
    double carry = 0.0;
    *c_out = -1;
    *base_out = 0.0;
    for (uint32_t t0 = 0; t0 < C; t0 += kChunk) {
        const uint32_t i0 = t0 + threadIdx.x * kItems;
        double own[kItems], v[kItems];
        for (int k = 0; k < kItems; ++k) own[k] = v[k] = i0 + k < C ? s[i0 + k] : 0.0;
        double tb;
        const double tile_total = block_scan(v, sm, &tb, min(C - t0, kChunk) - 1);
        if (threadIdx.x == 0) sm.first = INT_MAX;
        __syncthreads();
        double x[kItems], e[kItems];
        for (int k = 0; k < kItems; ++k) {
            x[k] = carry + (k == 0 ? tb : v[k - 1]);
            e[k] = x[k] + own[k];
            if (i0 + k < C) {
                if (find && crosses<kStrict>(e[k], threshold)) atomicMin(&sm.first, int(i0 + k));
                if (i0 + k == C - 1) sm.found_total = e[k];
            }
        }
        __syncthreads();
        const int first = sm.first;
        if (find && first != INT_MAX) {
            for (int k = 0; k < kItems; ++k)
                if (int(i0 + k) == first) sm.found_base = x[k];
            __syncthreads();
            *c_out = first;
            *base_out = sm.found_base;
            __syncthreads();
            return 0.0;
        }
        carry = carry + tile_total;
    }
    const double total = sm.found_total;
    __syncthreads();
    return total;
}

// The number of real elements in chunk c of n (the last chunk may be partial).
__device__ __forceinline__ uint32_t chunk_count(uint32_t n, uint32_t c) { return min(n - c * kChunk, kChunk); }

// Inside one chunk whose values are v (per thread, kItems; `count` real) and whose running sum
// starts at `base`: the first index j < count with base + prefix_j crossing `threshold`, or -1.
template <bool kStrict>
__device__ int first_in_chunk(double (&v)[kItems], uint32_t count, double base, double threshold, ScanSmem& sm) {
    double tb;
    block_scan(v, sm, &tb, count - 1);
    if (threadIdx.x == 0) sm.first = INT_MAX;
    __syncthreads();
    for (int k = 0; k < kItems; ++k) {
        const uint32_t j = threadIdx.x * kItems + k;
        if (j < count && crosses<kStrict>(base + v[k], threshold)) atomicMin(&sm.first, int(j));
    }
    __syncthreads();
    const int first = sm.first;
    __syncthreads();
    return first == INT_MAX ? -1 : first;
}

// Without top_k/top_p: w[i] = exp((l_i − max)/T) in double, and each chunk's sum.
__global__ __launch_bounds__(kThreads) void f32_sample_dense_weights_kernel(const float* __restrict__ logits,
                                                                           uint32_t V,
                                                                           const unsigned long long* max_key,
                                                                           double inv_t, double* __restrict__ w,
                                                                           double* __restrict__ sums) {
    __shared__ ScanSmem sm;
    const float mx = argmax_value(*max_key);
    const uint32_t i0 = blockIdx.x * kChunk + threadIdx.x * kItems;
    double v[kItems];
    for (int k = 0; k < kItems; ++k) {
        v[k] = 0.0;
        if (i0 + k < V) w[i0 + k] = v[k] = exp((double(logits[i0 + k]) - double(mx)) * inv_t);
    }
    double tb;
    const double s = block_scan(v, sm, &tb, chunk_count(V, blockIdx.x) - 1);
    if (threadIdx.x == 0) sums[blockIdx.x] = s;
}

// Orderable keys (descending key = descending logit; −0 → +0) and the ids 0..V-1 for the sort.
__global__ void f32_sample_keys_kernel(const float* __restrict__ logits, uint32_t V, uint32_t* __restrict__ keys,
                                       int32_t* __restrict__ ids) {
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < V; i += gridDim.x * blockDim.x) {
        keys[i] = orderable(logits[i]);
        ids[i] = int32_t(i);
    }
}

// p[j] = exp((l[ids[j]] − l[ids[0]])/T) over the first n sorted positions, and each chunk's sum.
__global__ __launch_bounds__(kThreads) void f32_sample_sorted_weights_kernel(const float* __restrict__ logits,
                                                                            const int32_t* __restrict__ ids,
                                                                            uint32_t n, double inv_t,
                                                                            double* __restrict__ p,
                                                                            double* __restrict__ sums) {
    __shared__ ScanSmem sm;
    const float mx = logits[ids[0]];
    const uint32_t i0 = blockIdx.x * kChunk + threadIdx.x * kItems;
    double v[kItems];
    for (int k = 0; k < kItems; ++k) {
        v[k] = 0.0;
        if (i0 + k < n) p[i0 + k] = v[k] = exp((double(logits[ids[i0 + k]]) - double(mx)) * inv_t);
    }
    double tb;
    const double s = block_scan(v, sm, &tb, chunk_count(n, blockIdx.x) - 1);
    if (threadIdx.x == 0) sums[blockIdx.x] = s;
}

// Loads chunk c of q = p / total (0 past n): the top-p mass terms, as the host computes them.
__device__ void load_mass(const double* __restrict__ p, uint32_t n, double total, uint32_t c, double (&v)[kItems]) {
    const uint32_t i0 = c * kChunk + threadIdx.x * kItems;
    for (int k = 0; k < kItems; ++k) v[k] = i0 + k < n ? p[i0 + k] / total : 0.0;
}

// Top-p, pass 1: each chunk's sum of p/total (every CTA derives the same total from p_sums).
__global__ __launch_bounds__(kThreads) void sample_mass_kernel(const double* __restrict__ p, uint32_t n,
                                                              const double* __restrict__ p_sums, uint32_t C,
                                                              double* __restrict__ q_sums) {
    __shared__ ScanSmem sm;
    int c;
    double base;
    const double total = scan_chunk_sums<false>(p_sums, C, /*find=*/false, 0.0, sm, &c, &base);
    double v[kItems];
    load_mass(p, n, total, blockIdx.x, v);
    double tb;
    const double s = block_scan(v, sm, &tb, chunk_count(n, blockIdx.x) - 1);
    if (threadIdx.x == 0) q_sums[blockIdx.x] = s;
}

// Top-p, pass 2 (one CTA): keep = 1 + the first sorted position whose cumulative mass reaches
// top_p, n if none does.
__global__ __launch_bounds__(kThreads) void sample_top_p_kernel(const double* __restrict__ p, uint32_t n,
                                                               const double* __restrict__ p_sums,
                                                               const double* __restrict__ q_sums, uint32_t C,
                                                               double top_p, int32_t* keep) {
    __shared__ ScanSmem sm;
    int c;
    double base;
    const double total = scan_chunk_sums<false>(p_sums, C, /*find=*/false, 0.0, sm, &c, &base);
    scan_chunk_sums<false>(q_sums, C, /*find=*/true, top_p, sm, &c, &base);
    int32_t k = int32_t(n);
    if (c >= 0) {
        double v[kItems];
        load_mass(p, n, total, uint32_t(c), v);
        const int j = first_in_chunk<false>(v, chunk_count(n, uint32_t(c)), base, top_p, sm);
        // j >= 0 by construction (the chunk's last real prefix is E_c); the guard keeps k in range.
        if (j >= 0) k = int32_t(uint32_t(c) * kChunk + uint32_t(j) + 1);
    }
    if (threadIdx.x == 0) *keep = k;
}

// w[ids[j]] = p[j] for the kept sorted positions j < keep (= *keep, or n), 0 for every other id.
__global__ void sample_scatter_kernel(const int32_t* __restrict__ ids, const double* __restrict__ p, uint32_t n,
                                      const int32_t* keep_dev, uint32_t V, double* __restrict__ w) {
    const uint32_t keep = keep_dev ? uint32_t(*keep_dev) : n;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < V; i += gridDim.x * blockDim.x)
        w[ids[i]] = i < keep ? p[i] : 0.0;
}

__global__ __launch_bounds__(kThreads) void sample_chunk_sums_kernel(const double* __restrict__ w, uint32_t V,
                                                                    double* __restrict__ sums) {
    __shared__ ScanSmem sm;
    const uint32_t i0 = blockIdx.x * kChunk + threadIdx.x * kItems;
    double v[kItems];
    for (int k = 0; k < kItems; ++k) v[k] = i0 + k < V ? w[i0 + k] : 0.0;
    double tb;
    const double s = block_scan(v, sm, &tb, chunk_count(V, blockIdx.x) - 1);
    if (threadIdx.x == 0) sums[blockIdx.x] = s;
}

// The walk (one CTA): target = u · total; the first id whose running sum exceeds it. If none
// does (unreachable for u in [0, 1) and finite logits), the last id with w > 0, else 0.
__global__ __launch_bounds__(kThreads) void sample_pick_kernel(const double* __restrict__ w, uint32_t V,
                                                              const double* __restrict__ sums, uint32_t C,
                                                              double u, int32_t* token) {
    __shared__ ScanSmem sm;
    int c;
    double base;
    const double total = scan_chunk_sums<true>(sums, C, /*find=*/false, 0.0, sm, &c, &base);
    const double target = u * total;
    scan_chunk_sums<true>(sums, C, /*find=*/true, target, sm, &c, &base);
    if (c >= 0) {
        const uint32_t i0 = uint32_t(c) * kChunk + threadIdx.x * kItems;
        double v[kItems];
        for (int k = 0; k < kItems; ++k) v[k] = i0 + k < V ? w[i0 + k] : 0.0;
        const int j = first_in_chunk<true>(v, chunk_count(V, uint32_t(c)), base, target, sm);
        if (j >= 0) {
            if (threadIdx.x == 0) *token = int32_t(uint32_t(c) * kChunk + uint32_t(j));
            return;
        }
    }
    if (threadIdx.x == 0) sm.last = -1;
    __syncthreads();
    int last = -1;
    for (uint32_t i = threadIdx.x; i < V; i += kThreads)
        if (w[i] > 0.0) last = int(i);
    atomicMax(&sm.last, last);
    __syncthreads();
    if (threadIdx.x == 0) *token = sm.last >= 0 ? sm.last : 0;
}

// ---------------------------------------------------------------------------
// Sampling at T > 0, the fast path: one cooperative kernel (f32_sample_select_kernel) that
// never sorts. Ids are split into tiles of kSelTile = 2048, one CTA of 512 threads per tile,
// thread t holding ids 4t .. 4t+3 of its tile in registers for the whole call.
//
// Every id gets a unique 64-bit key, orderable(logit) << nb | (2^nb − 1 − id) (nb = bits of
// V − 1): keys descending = sample_logits' order (logit desc, id asc; −0 ties +0). The kept set
// is always {key >= K} for one key K, found by a radix select from the top (kRadixBits-wide
// digits, at most 5 passes for V = 201088, fewer when the selected bin holds one key):
//  - top_k: K = the k-th largest key (a count per bin);
//  - top_p: K = the first key, in key order, where the mass of the keys >= it reaches
//    top_p · total (a mass per bin), among the top_k keys if top_k is set;
// then the walk: w = p for kept ids, 0 elsewhere, scanned in id order.
// A bin's mass is an exact integer: p = exp((l − max)/T) ∈ [0, 1] in double, truncated to
// 2^-92 and split into three 32-bit limbs summed separately in 64-bit counters (integer
// atomics: the same result whatever the order). So every decision is deterministic and the
// cumulative masses are exact to V·2^-92; the host's sequential double sums differ from them
// by rounding only (see kernels.h for what that allows).


// The global histogram of one pass (scratch); three rotate so that each can be zeroed while
// nobody reads it (pass q zeroes the buffer of pass q + 1).
struct SelectBins {
    unsigned long long c[kBins], m0[kBins], m1[kBins], m2[kBins];
    unsigned long long key[kBins];  // the largest key in the bin: the key itself when c == 1
};


struct SelectSmem {
    unsigned int c[kBins];
    unsigned long long m[3][kBins];
    unsigned long long key[kBins];
    typename cub::BlockScan<Mass, kSelThreads, cub::BLOCK_SCAN_WARP_SCANS>::TempStorage scan;
    double warp[kSelThreads / 32];
    unsigned long long prefix;  // the selected high bits of K
    unsigned long long result;  // K, once done
    Mass above;                 // of the keys above the selected range
    Mass bin;                   // the selected bin's
    unsigned int max_ord;
    int pos;
    int done;
    int first;
    int last;
    int owner;
    double owner_base;
};

// The per-thread state of the kernel: 4 consecutive ids of the tile.
struct SelectItems {
    unsigned long long key[kSelItems];
    double p[kSelItems];
    bool valid[kSelItems];
};

// Radix select over the keys >= floor_key (all CTAs call it; every CTA reaches the same K):
// sample_select.cuh's radix_select_core over this thread's items, each pass's CTA histogram added
// into the global one (`bins`, three rotating so that pass q zeroes pass q + 1's while nobody reads
// it) before a grid sync. Arguments and results as radix_select_core's.
__device__ __forceinline__ unsigned long long radix_select(const SelectItems& it, uint32_t nbits, unsigned long long floor_key,
                                           bool by_mass, bool with_mass, unsigned long long k, double top_p,
                                           bool have_total, Mass* total, Mass* above_out, Mass* bin_out,
                                           SelectBins* bins, int* pass, SelectSmem& sm, cg::grid_group& grid) {
    const uint32_t tid = threadIdx.x;
    SelectBins* g = bins;
    const auto visit = [&](const auto& add) {
        for (int j = 0; j < kSelItems; ++j)
            if (it.valid[j]) add(it.key[j], [&] { return it.p[j]; });
    };
    const auto publish = [&](uint32_t nbins) {
        g = bins + (*pass % 3);
        SelectBins* next = bins + ((*pass + 1) % 3);
        for (uint32_t b = blockIdx.x * kSelThreads + tid; b < kBins; b += gridDim.x * kSelThreads)
            next->c[b] = next->m0[b] = next->m1[b] = next->m2[b] = next->key[b] = 0;
        for (uint32_t b = tid; b < nbins; b += kSelThreads) {
            if (sm.c[b] == 0) continue;
            atomicAdd(&g->c[b], (unsigned long long)sm.c[b]);
            if (with_mass) {
                if (sm.m[0][b]) atomicAdd(&g->m0[b], sm.m[0][b]);
                if (sm.m[1][b]) atomicAdd(&g->m1[b], sm.m[1][b]);
                if (sm.m[2][b]) atomicAdd(&g->m2[b], sm.m[2][b]);
            }
            atomicMax(&g->key[b], sm.key[b]);
        }
        grid.sync();
        ++*pass;
    };
    const auto bin_at = [&](uint32_t d) { return Mass{__ldcg(&g->c[d]), __ldcg(&g->m0[d]), __ldcg(&g->m1[d]), __ldcg(&g->m2[d])}; };
    const auto key_at = [&](uint32_t d) { return __ldcg(&g->key[d]); };
    return radix_select_core(sm, nbits, floor_key, by_mass, with_mass, k, top_p, have_total, total, above_out, bin_out,
                             visit, publish, bin_at, key_at);
}

// Launch: ceil(V / kSelTile) CTAs of kSelThreads, cooperatively (all resident). Pipeline:
// max logit (per-CTA max → grid sync → every CTA reduces them), p in registers, top_k select,
// top_p select, then the walk: each CTA's sum s_c in id order (tile_scan, s_c = the prefix at its
// last real id) → grid sync → every CTA scans s_0..s_{G−1} the same way (one warp, fixed
// order: X_c before c, E_c = X_c + s_c, total = E_{G−1}), target = u·total; the first c with
// E_c > target owns the token: its first candidate id with X_c + prefix > target (it exists up
// to rounding, since the prefix at its last id is s_c). Candidates are the kept ids (the dense
// case: ids with p > 0); if none crosses, the last candidate, else 0.
// Floor: the logits are read once (0.8 MB, L2-resident), so the cost is the grid syncs (1 + one
// per select pass + 1) and the per-pass histogram flush: latency, ~2–3 µs per pass.
__global__ __launch_bounds__(kSelThreads) void f32_sample_select_kernel(
    const float* __restrict__ logits, uint32_t V, uint32_t nb, double inv_t, uint32_t top_k, bool use_top_p,
    double top_p, double u, SelectBins* bins, unsigned int* cta_max, double* cta_sum, int* cta_last,
    int32_t* token) {
    cg::grid_group grid = cg::this_grid();
    __shared__ SelectSmem sm;
    const uint32_t tid = threadIdx.x, lane = tid & 31;
    const uint32_t id0 = blockIdx.x * kSelTile + tid * kSelItems;
    const unsigned long long id_mask = (1ull << nb) - 1;
    SelectItems it;
    float l[kSelItems];
    unsigned int best = 0;
    for (int j = 0; j < kSelItems; ++j) {
        const uint32_t id = id0 + j;
        it.valid[j] = id < V;
        l[j] = it.valid[j] ? logits[id] : 0.0f;
        const uint32_t o = orderable(l[j]);
        it.key[j] = it.valid[j] ? ((unsigned long long)o << nb) | (id_mask - id) : 0ull;
        if (it.valid[j]) best = max(best, o);
    }
    for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    if (tid == 0) sm.max_ord = 0;
    __syncthreads();
    if (lane == 0) atomicMax(&sm.max_ord, best);
    for (uint32_t b = blockIdx.x * kSelThreads + tid; b < kBins; b += gridDim.x * kSelThreads)
        bins[0].c[b] = bins[0].m0[b] = bins[0].m1[b] = bins[0].m2[b] = bins[0].key[b] = 0;
    __syncthreads();
    if (tid == 0) cta_max[blockIdx.x] = sm.max_ord;
    grid.sync();
    best = 0;
    for (uint32_t c = tid; c < gridDim.x; c += kSelThreads) best = max(best, __ldcg(&cta_max[c]));
    for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    if (lane == 0) atomicMax(&sm.max_ord, best);  // sm.max_ord already holds this CTA's part
    __syncthreads();
    const uint32_t mo = sm.max_ord;
    const float mx = __uint_as_float((mo & 0x80000000u) ? (mo & 0x7fffffffu) : ~mo);
    for (int j = 0; j < kSelItems; ++j)
        it.p[j] = it.valid[j] ? exp((double(l[j]) - double(mx)) * inv_t) : 0.0;

    const uint32_t nbits = 32 + nb;
    const bool use_top_k = top_k > 0;
    int pass = 0;
    unsigned long long K = 0;
    Mass total{0, 0, 0, 0}, above, bin;
    if (use_top_k) {
        K = radix_select(it, nbits, 0, /*by_mass=*/false, /*with_mass=*/use_top_p, top_k, 0.0, false, &total,
                         &above, &bin, bins, &pass, sm, grid);
        total = MassSum()(above, bin);
    }
    if (use_top_p)
        K = radix_select(it, nbits, K, /*by_mass=*/true, /*with_mass=*/true, 0, top_p, use_top_k, &total, &above,
                         &bin, bins, &pass, sm, grid);
    const bool filtered = use_top_k || use_top_p;

    // The walk.
    double w[kSelItems];
    bool cand[kSelItems];
    int last = -1;
    for (int j = 0; j < kSelItems; ++j) {
        const bool kept = it.valid[j] && it.key[j] >= K;
        w[j] = kept ? it.p[j] : 0.0;
        cand[j] = filtered ? kept : (it.valid[j] && it.p[j] > 0.0);
        if (cand[j]) last = int(id0 + j);
    }
    const uint32_t count = min(V - blockIdx.x * kSelTile, kSelTile);
    if (tid == 0) {
        sm.last = -1;
        sm.first = INT_MAX;
    }
    const double tb = tile_scan(w, sm.warp);  // contains a __syncthreads after the resets above
    (void)tb;
    if (tid == (count - 1) / kSelItems) cta_sum[blockIdx.x] = w[(count - 1) % kSelItems];
    atomicMax(&sm.last, last);
    __syncthreads();
    if (tid == 0) cta_last[blockIdx.x] = sm.last;
    grid.sync();
    if (tid < 32)  // the owner tile, and the last candidate of the whole vocabulary (the fallback)
        pick_tile(
            gridDim.x, u, [&](uint32_t c) { return __ldcg(&cta_sum[c]); },
            [&](uint32_t c) { return __ldcg(&cta_last[c]); }, &sm.owner, &sm.owner_base, &sm.last, &sm.warp[0]);
    __syncthreads();
    const int owner = sm.owner;
    const double target = sm.warp[0];
    if (owner == int(blockIdx.x)) {
        const double base = sm.owner_base;
        for (int j = 0; j < kSelItems; ++j)
            if (cand[j] && base + w[j] > target) atomicMin(&sm.first, int(id0 + j));
        __syncthreads();
        if (tid == 0) *token = sm.first != INT_MAX ? sm.first : (sm.last >= 0 ? sm.last : 0);
    } else if (owner < 0 && blockIdx.x == 0 && tid == 0) {
        *token = sm.last >= 0 ? sm.last : 0;
    }
}

__global__ void read_probe_kernel(const uint4* __restrict__ data, size_t n, float* sink) {
    uint32_t acc = 0;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const uint4 v = ldg_stream(data + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *sink = float(acc);  // practically never; keeps the loads alive
}

// The scratch of sample(), carved from one allocation (null base: sizes only). The CUB sort's
// temporary storage is whatever is left at the end.
struct SampleScratch {
    unsigned long long* key = nullptr;  // argmax key
    SelectBins* bins = nullptr;         // [3], the fast path's histograms
    unsigned int* cta_max = nullptr;    // [kMaxSelCtas]
    double* cta_sum = nullptr;          // [kMaxSelCtas]
    int* cta_last = nullptr;            // [kMaxSelCtas]
    int32_t* keep = nullptr;
    double* w = nullptr;                // [V]
    double* p = nullptr;                // [V]
    double* sums_w = nullptr;           // [C]
    double* sums_p = nullptr;           // [C]
    double* sums_q = nullptr;           // [C]
    uint32_t* keys_in = nullptr;        // [V]
    uint32_t* keys_out = nullptr;       // [V]
    int32_t* ids_in = nullptr;          // [V]
    int32_t* ids_out = nullptr;         // [V]
    char* sort_tmp = nullptr;
    size_t fixed_bytes = 0;

    SampleScratch(char* base, uint32_t V) {
        const size_t C = ceil_div(V, kChunk);
        size_t used = 0;
        auto take = [&](size_t bytes) {
            char* q = base ? base + used : nullptr;
            used += (bytes + 255) & ~size_t(255);
            return q;
        };
        key = reinterpret_cast<unsigned long long*>(take(8));
        bins = reinterpret_cast<SelectBins*>(take(3 * sizeof(SelectBins)));
        cta_max = reinterpret_cast<unsigned int*>(take(kMaxSelCtas * 4));
        cta_sum = reinterpret_cast<double*>(take(kMaxSelCtas * 8));
        cta_last = reinterpret_cast<int*>(take(kMaxSelCtas * 4));
        keep = reinterpret_cast<int32_t*>(take(4));
        w = reinterpret_cast<double*>(take(size_t(V) * 8));
        p = reinterpret_cast<double*>(take(size_t(V) * 8));
        sums_w = reinterpret_cast<double*>(take(C * 8));
        sums_p = reinterpret_cast<double*>(take(C * 8));
        sums_q = reinterpret_cast<double*>(take(C * 8));
        keys_in = reinterpret_cast<uint32_t*>(take(size_t(V) * 4));
        keys_out = reinterpret_cast<uint32_t*>(take(size_t(V) * 4));
        ids_in = reinterpret_cast<int32_t*>(take(size_t(V) * 4));
        ids_out = reinterpret_cast<int32_t*>(take(size_t(V) * 4));
        sort_tmp = base ? base + used : nullptr;
        fixed_bytes = used;
    }
};

// How many f32_sample_select_kernel CTAs can be resident at once on the current device (0 where
// it cannot launch cooperatively); cached per device.
gptoss_status select_capacity(uint32_t* out) {
    static std::atomic<int> cache[64];  // capacity + 1; 0: not yet known
    int dev = 0;
    GPTOSS_CUDA_TRY(cudaGetDevice(&dev));
    const bool cached = dev >= 0 && dev < 64;
    if (cached) {
        const int c = cache[dev].load(std::memory_order_relaxed);
        if (c > 0) {
            *out = uint32_t(c - 1);
            return GPTOSS_OK;
        }
    }
    int coop = 0, sms = 0, per_sm = 0;
    GPTOSS_CUDA_TRY(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
    GPTOSS_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    GPTOSS_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f32_sample_select_kernel, kSelThreads, 0));
    *out = coop ? uint32_t(sms * per_sm) : 0u;
    if (cached) cache[dev].store(int(*out) + 1, std::memory_order_relaxed);
    return GPTOSS_OK;
}

}  // namespace

gptoss_status argmax(const float* logits, uint32_t V, int32_t* out, cudaStream_t stream) {
    // `out` must have room for 8 bytes (one 64-bit key); the caller decodes ~low word.
    auto* key = reinterpret_cast<unsigned long long*>(out);
    GPTOSS_CUDA_TRY(cudaMemsetAsync(key, 0, sizeof(*key), stream));
    f32_argmax_kernel<<<132, 256, 0, stream>>>(logits, V, key);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

gptoss_status sample_fast_path(uint32_t V, bool* out) {
    uint32_t capacity = 0;
    GPTOSS_TRY(select_capacity(&capacity));
    const uint32_t G = ceil_div(V, kSelTile);
    *out = V > 0 && G <= capacity && G <= kMaxSelCtas && V <= (1u << 31);
    return GPTOSS_OK;
}

gptoss_status sample_scratch_bytes(uint32_t V, size_t* bytes_out) {
    *bytes_out = 0;
    if (V == 0) return fail(GPTOSS_ERR_INTERNAL, "cuda::sample_scratch_bytes: V is 0");
    const SampleScratch s(nullptr, V);
    size_t tmp = 0;
    GPTOSS_CUDA_TRY(cub::DeviceRadixSort::SortPairsDescending(nullptr, tmp, s.keys_in, s.keys_out, s.ids_in,
                                                              s.ids_out, V));
    *bytes_out = s.fixed_bytes + ((tmp + 255) & ~size_t(255));
    return GPTOSS_OK;
}

namespace {

// The fast path: one cooperative f32_sample_select_kernel grid of G CTAs (sample_fast_path).
gptoss_status sample_select(const float* logits, uint32_t V, uint32_t G, double inv_t, const SamplingConfig& config,
                            double u, const SampleScratch& s, int32_t* token, cudaStream_t stream) {
    const bool use_top_k = config.top_k > 0 && config.top_k < V;
    const bool use_top_p = config.top_p < 1.0f;
    const uint32_t nb = V > 1 ? 32u - uint32_t(__builtin_clz(V - 1)) : 0u;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(G);
    cfg.blockDim = dim3(kSelThreads);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    GPTOSS_CUDA_TRY(cudaLaunchKernelEx(&cfg, f32_sample_select_kernel, logits, V, nb, inv_t,
                                       use_top_k ? config.top_k : 0u, use_top_p, double(config.top_p), u, s.bins,
                                       s.cta_max, s.cta_sum, s.cta_last, token));
    return GPTOSS_OK;
}

// The fallback (V beyond what one cooperative grid holds): the weights w of every token (a
// radix sort of every key when top-k or top-p cut the distribution), then sample_pick_kernel.
gptoss_status sample_sorted(const float* logits, uint32_t V, double inv_t, const SamplingConfig& config, double u,
                            const SampleScratch& s, size_t scratch_bytes, int32_t* token, cudaStream_t stream) {
    const bool use_top_k = config.top_k > 0 && config.top_k < V;
    const bool use_top_p = config.top_p < 1.0f;
    const uint32_t C = ceil_div(V, kChunk);
    if (!use_top_k && !use_top_p) {
        GPTOSS_TRY(argmax(logits, V, reinterpret_cast<int32_t*>(s.key), stream));
        f32_sample_dense_weights_kernel<<<C, kThreads, 0, stream>>>(logits, V, s.key, inv_t, s.w, s.sums_w);
        GPTOSS_CUDA_LAUNCH_CHECK();
    } else {
        f32_sample_keys_kernel<<<ceil_div(V, 256), 256, 0, stream>>>(logits, V, s.keys_in, s.ids_in);
        GPTOSS_CUDA_LAUNCH_CHECK();
        size_t tmp = scratch_bytes - s.fixed_bytes;
        GPTOSS_CUDA_TRY(cub::DeviceRadixSort::SortPairsDescending(s.sort_tmp, tmp, s.keys_in, s.keys_out, s.ids_in,
                                                                  s.ids_out, V, 0, 32, stream));
        const uint32_t n = use_top_k ? config.top_k : V;
        const uint32_t Cn = ceil_div(n, kChunk);
        f32_sample_sorted_weights_kernel<<<Cn, kThreads, 0, stream>>>(logits, s.ids_out, n, inv_t, s.p, s.sums_p);
        GPTOSS_CUDA_LAUNCH_CHECK();
        if (use_top_p) {
            sample_mass_kernel<<<Cn, kThreads, 0, stream>>>(s.p, n, s.sums_p, Cn, s.sums_q);
            GPTOSS_CUDA_LAUNCH_CHECK();
            sample_top_p_kernel<<<1, kThreads, 0, stream>>>(s.p, n, s.sums_p, s.sums_q, Cn, double(config.top_p),
                                                            s.keep);
            GPTOSS_CUDA_LAUNCH_CHECK();
        }
        sample_scatter_kernel<<<ceil_div(V, 256), 256, 0, stream>>>(s.ids_out, s.p, n, use_top_p ? s.keep : nullptr,
                                                                    V, s.w);
        GPTOSS_CUDA_LAUNCH_CHECK();
        sample_chunk_sums_kernel<<<C, kThreads, 0, stream>>>(s.w, V, s.sums_w);
        GPTOSS_CUDA_LAUNCH_CHECK();
    }
    sample_pick_kernel<<<1, kThreads, 0, stream>>>(s.w, V, s.sums_w, C, u, token);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

}  // namespace

gptoss_status sample(const float* logits, uint32_t V, const SamplingConfig& config, double u, void* scratch,
                     size_t scratch_bytes, int32_t* token, cudaStream_t stream) {
    const SampleScratch s(static_cast<char*>(scratch), V);
    if (V == 0 || scratch == nullptr || scratch_bytes < s.fixed_bytes)
        return fail(GPTOSS_ERR_INTERNAL, "cuda::sample: V %u, scratch %p of %zu bytes, expected at least %zu", V,
                    scratch, scratch_bytes, s.fixed_bytes);
    if (!std::isfinite(config.temperature) || !(u >= 0.0 && u < 1.0))
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "cuda::sample: temperature %g and u %g, expected finite and [0, 1)",
                    double(config.temperature), u);
    if (config.temperature <= 0.0f) {
        GPTOSS_TRY(argmax(logits, V, reinterpret_cast<int32_t*>(s.key), stream));
        argmax_token_kernel<<<1, 1, 0, stream>>>(s.key, token);
        GPTOSS_CUDA_LAUNCH_CHECK();
        return GPTOSS_OK;
    }
    const double inv_t = 1.0 / double(config.temperature);  // as sample_logits computes it
    const uint32_t G = ceil_div(V, kSelTile);
    uint32_t capacity = 0;
    GPTOSS_TRY(select_capacity(&capacity));
    if (G <= capacity && G <= kMaxSelCtas && V <= (1u << 31))
        return sample_select(logits, V, G, inv_t, config, u, s, token, stream);
    return sample_sorted(logits, V, inv_t, config, u, s, scratch_bytes, token, stream);
}

gptoss_status read_probe(const void* data, size_t n_words16, float* sink, cudaStream_t stream) {
    read_probe_kernel<<<132 * 8, 512, 0, stream>>>(static_cast<const uint4*>(data), n_words16, sink);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
