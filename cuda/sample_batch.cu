// cuda/sample_batch.cu - three launches sample every row of a batched decode step (design in
// cuda/sample_batch.h). A row's ids are cut into tiles of kSelTile = 2048, thread t of a
// 512-thread CTA holding ids 4t .. 4t+3 of a tile: exactly the cooperative sampler's layout
// (cuda/sample.cu, f32_sample_select_kernel: one CTA per tile, all tiles at once).
// 1. select, one CTA per row: greedy rows' argmax; else the row's max and the kept-key floor K
//    (top_k / top_p radix selects counting and summing exact integer masses in a shared
//    histogram of the whole row: integer sums do not depend on the order, so every bin and every
//    cut equals the cooperative sampler's). Keys and p are recomputed from the logits on each
//    pass; only ids still under the selected prefix pay for exp.
// 2. walk, one CTA per (tile, row): the tile's weights scanned in id order (tile_scan), its sum
//    and last candidate: the cooperative sampler's per-CTA values, bit for bit.
// 3. pick, one CTA per row: the one-warp scan of the tile sums (the same code as sample.cu) and
//    the owner tile's first candidate past u · total.
// Cost: the selects read the row once per pass from L2 (0.8 MB at V = 201088, one SM per row);
// the walk's double exp of every kept id is spread over tiles × rows CTAs.
#include "cuda/sample_batch.h"
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/sample_select.cuh"

#include <cub/block/block_scan.cuh>

#include <climits>
#include <cmath>

namespace gptoss {
namespace cuda {
namespace {
using namespace sample_detail;

struct RowSmem {
    unsigned int c[kBins];
    unsigned long long m[3][kBins];
    unsigned long long key[kBins];
    typename cub::BlockScan<Mass, kSelThreads, cub::BLOCK_SCAN_WARP_SCANS>::TempStorage scan;
    double warp[kSelThreads / 32];
    double tile_sum[kMaxSelCtas];  // the cooperative sampler's cta_sum
    unsigned long long prefix;
    unsigned long long result;
    unsigned long long best;
    Mass above;
    Mass bin;
    unsigned int max_ord;
    int pos;
    int done;
    int first;
    int last;
    int owner;
    double owner_base;
    double target;
};

// A row, and the key of its ids: orderable(logit) << nb | (2^nb − 1 − id), as sample.cu.
struct RowView {
    const float* l;
    uint32_t V, nb;
    unsigned long long id_mask;
    float mx;
    double inv_t;
    bool vec;  // 16-byte loads (row aligned, V % 4 == 0)
    __device__ __forceinline__ unsigned long long key(uint32_t id, float v) const {
        return ((unsigned long long)orderable(v) << nb) | (id_mask - id);
    }
    __device__ __forceinline__ double p(float v) const { return exp((double(v) - double(mx)) * inv_t); }
};

// Tiles handled per loop iteration (their loads are issued together).
constexpr uint32_t kUnroll = 4;

__device__ __forceinline__ uint32_t n_tiles(uint32_t V) { return (V + kSelTile - 1) / kSelTile; }

// The 4 logits of thread threadIdx.x in tile c (0 past V).
__device__ __forceinline__ void load_tile(const RowView& r, uint32_t c, float (&v)[kSelItems]) {
    const uint32_t id0 = c * kSelTile + threadIdx.x * kSelItems;
    if (r.vec && id0 + kSelItems <= r.V) {
        const float4 q = __ldcg(reinterpret_cast<const float4*>(r.l + id0));
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
        for (int j = 0; j < kSelItems; ++j) v[j] = id0 + j < r.V ? __ldcg(r.l + id0 + j) : 0.0f;
    }
}

// Calls f(id, logit) for every id of the row this thread owns (the tile layout).
template <typename F> __device__ __forceinline__ void for_row(const RowView& r, F&& f) {
    const uint32_t G = n_tiles(r.V);
    for (uint32_t c0 = 0; c0 < G; c0 += kUnroll) {
        float v[kUnroll][kSelItems];
#pragma unroll
        for (uint32_t t = 0; t < kUnroll; ++t)
            if (c0 + t < G) load_tile(r, c0 + t, v[t]);
#pragma unroll
        for (uint32_t t = 0; t < kUnroll; ++t) {
            if (c0 + t >= G) break;
            const uint32_t id0 = (c0 + t) * kSelTile + threadIdx.x * kSelItems;
#pragma unroll
            for (int j = 0; j < kSelItems; ++j)
                if (id0 + j < r.V) f(id0 + j, v[t][j]);
        }
    }
}

// sample_select.cuh's radix_select_core over a shared histogram of the whole row (the
// arguments and result of sample.cu's radix_select; every thread of the CTA calls it).
__device__ unsigned long long row_select(const RowView& r, uint32_t nbits, unsigned long long floor_key, bool by_mass,
                                         bool with_mass, unsigned long long k, double top_p, bool have_total,
                                         Mass* total, Mass* above_out, Mass* bin_out, RowSmem& sm) {
    const auto visit = [&](const auto& add) {
        for_row(r, [&](uint32_t id, float v) { add(r.key(id, v), [&] { return r.p(v); }); });
    };
    const auto publish = [](uint32_t) {};
    const auto bin_at = [&](uint32_t d) { return Mass{sm.c[d], sm.m[0][d], sm.m[1][d], sm.m[2][d]}; };
    const auto key_at = [&](uint32_t d) { return sm.key[d]; };
    return radix_select_core(sm, nbits, floor_key, by_mass, with_mass, k, top_p, have_total, total, above_out, bin_out,
                             visit, publish, bin_at, key_at);
}

// Tile c's walk weights (p of kept ids, else 0) and candidates, scanned in place (tile_scan).
__device__ __forceinline__ int walk_tile(const RowView& r, uint32_t c, unsigned long long K, bool filtered,
                                         double (&w)[kSelItems], bool (&cand)[kSelItems], double* warp_sums) {
    float v[kSelItems];
    load_tile(r, c, v);
    const uint32_t id0 = c * kSelTile + threadIdx.x * kSelItems;
    int last = -1;
    for (int j = 0; j < kSelItems; ++j) {
        const bool valid = id0 + j < r.V;
        const bool kept = valid && r.key(id0 + j, v[j]) >= K;
        const double p = kept ? r.p(v[j]) : 0.0;
        w[j] = p;
        cand[j] = filtered ? kept : (valid && p > 0.0);
        if (cand[j]) last = int(id0 + j);
    }
    tile_scan(w, warp_sums);
    return last;
}

// What the select kernel leaves for the walk of a kSample row.
struct RowState {
    unsigned long long K;  // kept: key >= K
    float mx;              // the row's largest logit
    int filtered;          // top_k or top_p cut the row (candidates = kept ids, else p > 0)
};

__device__ __forceinline__ RowView row_view(const float* logits, uint32_t V, size_t ld, uint32_t row,
                                            const SampleRow& r) {
    RowView v;
    v.l = logits + size_t(row) * ld;
    v.V = V;
    v.nb = V > 1 ? 32u - uint32_t(__clz(int(V - 1))) : 0u;
    v.id_mask = (1ull << v.nb) - 1;
    v.inv_t = r.inv_t;
    v.vec = (reinterpret_cast<uintptr_t>(v.l) & 15) == 0;
    v.mx = 0.0f;
    return v;
}

// Kernel 1 of 3, one CTA per row: greedy rows get their token (cuda::argmax's key), kSkip rows
// -1; kSample rows get the row's max and the kept-key floor K (top_k / top_p radix selects) in
// state[row] for the walk.
__global__ __launch_bounds__(kSelThreads) void f32_sample_rows_select_kernel(const float* __restrict__ logits,
                                                                             uint32_t V, size_t ld,
                                                                             const SampleRow* __restrict__ rows,
                                                                             RowState* __restrict__ state,
                                                                             int32_t* __restrict__ tokens) {
    __shared__ RowSmem sm;
    const SampleRow row = rows[blockIdx.x];
    const uint32_t tid = threadIdx.x, lane = tid & 31;
    if (row.mode != SampleRow::kGreedy && row.mode != SampleRow::kSample) {
        if (tid == 0) tokens[blockIdx.x] = -1;
        return;
    }
    RowView r = row_view(logits, V, ld, blockIdx.x, row);
    if (tid == 0) {
        sm.best = 0;
        sm.max_ord = 0;
    }
    __syncthreads();
    if (row.mode == SampleRow::kGreedy) {  // cuda::argmax: the largest (value, ~id) key
        unsigned long long best = 0;
        for_row(r, [&](uint32_t id, float v) {
            const unsigned long long k = argmax_key(v, id);
            best = k > best ? k : best;
        });
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
            best = other > best ? other : best;
        }
        if (lane == 0) atomicMax(&sm.best, best);
        __syncthreads();
        if (tid == 0) tokens[blockIdx.x] = int32_t(~uint32_t(sm.best));
        return;
    }
    unsigned int best = 0;
    for_row(r, [&](uint32_t, float v) { best = max(best, orderable(v)); });
    for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    if (lane == 0) atomicMax(&sm.max_ord, best);
    __syncthreads();
    const uint32_t mo = sm.max_ord;
    r.mx = __uint_as_float((mo & 0x80000000u) ? (mo & 0x7fffffffu) : ~mo);

    const uint32_t nbits = 32 + r.nb;
    const bool use_top_k = row.top_k > 0, use_top_p = row.use_top_p != 0;
    unsigned long long K = 0;
    Mass total{0, 0, 0, 0}, above, bin;
    if (use_top_k) {
        K = row_select(r, nbits, 0, false, use_top_p, row.top_k, 0.0, false, &total, &above, &bin, sm);
        total = MassSum()(above, bin);
    }
    if (use_top_p)
        K = row_select(r, nbits, K, true, true, 0, row.top_p, use_top_k, &total, &above, &bin, sm);
    if (tid == 0) state[blockIdx.x] = RowState{K, r.mx, (use_top_k || use_top_p) ? 1 : 0};
}

// Kernel 2 of 3, one CTA per (tile, row) of the kSample rows: the tile's walk weights scanned in
// id order (tile_scan), its sum = the prefix at its last real id and its last candidate, as the
// cooperative sampler's CTA c computes cta_sum[c] / cta_last[c].
__global__ __launch_bounds__(kSelThreads) void f32_sample_rows_walk_kernel(const float* __restrict__ logits,
                                                                           uint32_t V, size_t ld,
                                                                           const SampleRow* __restrict__ rows,
                                                                           const RowState* __restrict__ state,
                                                                           double* __restrict__ tile_sum,
                                                                           int* __restrict__ tile_last) {
    __shared__ double warp_sums[kSelThreads / 32];
    __shared__ int tile_last_id;
    const uint32_t c = blockIdx.x, row_i = blockIdx.y, tid = threadIdx.x;
    const SampleRow row = rows[row_i];
    if (row.mode != SampleRow::kSample) return;
    const RowState st = state[row_i];
    RowView r = row_view(logits, V, ld, row_i, row);
    r.mx = st.mx;
    double w[kSelItems];
    bool cand[kSelItems];
    if (tid == 0) tile_last_id = -1;
    const int last = walk_tile(r, c, st.K, st.filtered != 0, w, cand, warp_sums);  // syncs after the reset
    const uint32_t count = min(V - c * kSelTile, kSelTile);
    if (tid == (count - 1) / kSelItems) tile_sum[size_t(row_i) * kMaxSelCtas + c] = w[(count - 1) % kSelItems];
    atomicMax(&tile_last_id, last);
    __syncthreads();
    if (tid == 0) tile_last[size_t(row_i) * kMaxSelCtas + c] = tile_last_id;
}

// Kernel 3 of 3, one CTA per row: the one-warp pick of the tile sums (pick_tile, as sample.cu), then
// the owner tile's first candidate whose prefix exceeds u · total.
__global__ __launch_bounds__(kSelThreads) void f32_sample_rows_pick_kernel(const float* __restrict__ logits,
                                                                           uint32_t V, size_t ld,
                                                                           const SampleRow* __restrict__ rows,
                                                                           const RowState* __restrict__ state,
                                                                           const double* __restrict__ tile_sum,
                                                                           const int* __restrict__ tile_last,
                                                                           int32_t* __restrict__ tokens) {
    __shared__ RowSmem sm;
    const uint32_t row_i = blockIdx.x, tid = threadIdx.x;
    const SampleRow row = rows[row_i];
    if (row.mode != SampleRow::kSample) return;
    const RowState st = state[row_i];
    const double* sums = tile_sum + size_t(row_i) * kMaxSelCtas;
    const int* lasts = tile_last + size_t(row_i) * kMaxSelCtas;
    const uint32_t G = n_tiles(V);
    if (tid < 32)
        pick_tile(
            G, row.u, [&](uint32_t c) { return sums[c]; }, [&](uint32_t c) { return lasts[c]; }, &sm.owner,
            &sm.owner_base, &sm.last, &sm.target);
    __syncthreads();
    const int owner = sm.owner;
    if (owner < 0) {
        if (tid == 0) tokens[row_i] = sm.last >= 0 ? sm.last : 0;
        return;
    }
    // The owner tile again: its first candidate whose prefix exceeds the target.
    RowView r = row_view(logits, V, ld, row_i, row);
    r.mx = st.mx;
    if (tid == 0) sm.first = INT_MAX;
    double w[kSelItems];
    bool cand[kSelItems];
    walk_tile(r, uint32_t(owner), st.K, st.filtered != 0, w, cand, sm.warp);  // syncs before sm.first is read
    const double base = sm.owner_base, target = sm.target;
    const uint32_t id0 = uint32_t(owner) * kSelTile + tid * kSelItems;
    for (int j = 0; j < kSelItems; ++j)
        if (cand[j] && base + w[j] > target) atomicMin(&sm.first, int(id0 + j));
    __syncthreads();
    if (tid == 0) tokens[row_i] = sm.first != INT_MAX ? sm.first : (sm.last >= 0 ? sm.last : 0);
}

// The scratch of sample_rows for n rows: RowState [n], tile sums double [n, kMaxSelCtas], tile
// lasts int [n, kMaxSelCtas].
struct RowsScratch {
    RowState* state;
    double* sums;
    int* lasts;
    size_t bytes;
    RowsScratch(void* base, uint32_t n) {
        char* b = static_cast<char*>(base);
        const size_t s0 = (size_t(n) * sizeof(RowState) + 255) & ~size_t(255);
        const size_t s1 = size_t(n) * kMaxSelCtas * sizeof(double);
        state = reinterpret_cast<RowState*>(b);
        sums = reinterpret_cast<double*>(b ? b + s0 : nullptr);
        lasts = reinterpret_cast<int*>(b ? b + s0 + s1 : nullptr);
        bytes = s0 + s1 + size_t(n) * kMaxSelCtas * sizeof(int);
    }
};

}  // namespace

SampleRow make_sample_row(const SamplingConfig& config, double u, uint32_t V, bool fast_path) {
    SampleRow r;
    if (!std::isfinite(config.temperature) || !(u >= 0.0 && u < 1.0) || V == 0) return r;  // kSkip
    if (config.temperature <= 0.0f) {
        r.mode = SampleRow::kGreedy;
        return r;
    }
    if (!fast_path || ceil_div(V, kSelTile) > kMaxSelCtas) return r;
    r.mode = SampleRow::kSample;
    r.inv_t = 1.0 / double(config.temperature);
    r.top_k = config.top_k > 0 && config.top_k < V ? config.top_k : 0u;
    r.use_top_p = config.top_p < 1.0f ? 1u : 0u;
    r.top_p = double(config.top_p);
    r.u = u;
    return r;
}

size_t sample_rows_scratch_bytes(uint32_t n) { return RowsScratch(nullptr, n).bytes; }

gptoss_status sample_rows(const float* logits, uint32_t V, size_t ld, const SampleRow* rows, uint32_t n,
                          void* scratch, size_t scratch_bytes, int32_t* tokens, cudaStream_t stream) {
    if (n == 0) return GPTOSS_OK;
    const RowsScratch sc(scratch, n);
    if (n > 65535 || V == 0 || ld < V || logits == nullptr || rows == nullptr || tokens == nullptr ||
        scratch == nullptr || scratch_bytes < sc.bytes || ceil_div(V, kSelTile) > kMaxSelCtas)
        return fail(GPTOSS_ERR_INTERNAL, "cuda::sample_rows: %u rows of V %u (ld %zu), scratch %zu of %zu bytes", n, V,
                    ld, scratch_bytes, sc.bytes);
    f32_sample_rows_select_kernel<<<n, kSelThreads, 0, stream>>>(logits, V, ld, rows, sc.state, tokens);
    GPTOSS_CUDA_LAUNCH_CHECK();
    f32_sample_rows_walk_kernel<<<dim3(ceil_div(V, kSelTile), n), kSelThreads, 0, stream>>>(logits, V, ld, rows,
                                                                                           sc.state, sc.sums,
                                                                                           sc.lasts);
    GPTOSS_CUDA_LAUNCH_CHECK();
    f32_sample_rows_pick_kernel<<<n, kSelThreads, 0, stream>>>(logits, V, ld, rows, sc.state, sc.sums, sc.lasts,
                                                              tokens);
    GPTOSS_CUDA_LAUNCH_CHECK();
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
