// cuda/dense_batch.cu - the batched decode step's dense bf16 projections (issue 13; the design and
// its reason are in dense_batch.h). A CTA: W = 4 or 8 warps, W·SPW 16-row weight slabs (warp w owns
// slabs w·SPW ..; with a column split of 2, warps w and W + w share them, each taking half of the
// 8-token column groups), one 64-token column block, one of 4 K parts; the 4 parts of a slab group
// form a thread-block cluster. Per 64-k chunk of its part (chunks p, p + 4, p + 8, ...) the CTA
// copies its slabs' 2 KB fragment chunks and the chunk of its token rows (128 B each, padded to 144
// B so the 8 rows of an mma column group fall in different banks) into one pipeline stage
// (cp.async, S stages); each warp then reads its A fragments (16 bytes per lane and sub-tile, the
// fragment layout of repack.cu) and the B fragments of every 8-token group from shared memory and
// issues the m16n8k16 mma into one accumulator chain per (slab, token group): chunks in order, the
// four k16 sub-tiles of a chunk in order, from zero. That is exactly what warp p of gemm.cu's
// kernel computes for the slab. Each CTA then leaves its fp32 partial tile in its shared memory,
// and CTA p sums slice p of the tile over the cluster (distributed shared memory) as gemm() reduces
// its warps, ((p0 + p1) + p2) + p3, and applies gemm()'s epilogue. So every output has gemm()'s
// bits, whatever the batch: the step may take either kernel at any token count. Floor: the weight
// bytes at the copy bandwidth (20b QKV 29.5 MB, O 23.6 MB, lm_head 1.16 GB).
#include "cuda/dense_batch.h"

#include "cuda/common.cuh"
#include "cuda/gemm.cuh"

#include <cooperative_groups.h>
#include <cuda.h>  // CUtensorMap (the kTma form's token-row map)
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdlib>

namespace gptoss {
namespace cuda {
namespace {
using namespace gemm_detail;
namespace cg = cooperative_groups;

constexpr uint32_t kCols = 64;         // token columns per CTA at most: 8 mma column groups
constexpr uint32_t kRowU4 = 9;         // a staged token row: the chunk's 8 uint4 + 1 of padding
constexpr uint32_t kSlabU4 = 128;      // one slab's 64-k chunk: 2 KB
// K parts: gemm()'s 4 warps. Part p sums chunks p, p + 4, p + 8, ... in that order, as gemm()'s
// warp p does, and the parts are added in gemm()'s order, so the outputs are gemm()'s bits.
constexpr uint32_t kParts = 4;

struct DenseArgs {
    CUtensorMap rows;  // kTma: x as [n, K] bf16, box 64 k x rows_box(n, cols) tokens, 128-byte swizzle
    const uint4* w;
    const float* bias;
    const uint4* x;
    float* out;
    uint32_t N, K, n, ldo;
    int add;  // Epilogue::kAdd
    uint32_t groups;
    uint32_t cols;  // token columns per CTA: 64, or 32 (twice the CTAs, each weight chunk read twice)
    uint32_t rows_box;  // kTma: rows_box(n, cols), a kernel argument so that it costs no register
};

// kTma: token rows per staged chunk (the tensor map's box height; the same for every column block).
inline uint32_t rows_box(uint32_t n, uint32_t cols) { return (std::min(n, cols) + 7) & ~7u; }

// The epilogue of one output: out = acc + bias, or out = old + (acc + bias) for kAdd, old being the
// output's value before the kernel (gemm.cu's order).
__device__ __forceinline__ void store_out(const DenseArgs& a, uint32_t token, uint32_t row, float acc, float old) {
    const float v = acc + (a.bias ? a.bias[row] : 0.0f);
    a.out[size_t(token) * a.ldo + row] = a.add ? old + v : v;
}

// The cluster's barrier and rank q's copy of the shared address p (thread-block clusters: sm_90+;
// the kernel is never launched below, dense_batch_supported).
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::this_cluster().sync();
#else
    __trap();
#endif
}
// The same barrier without memory ordering: for the exit guard, after every read of a peer's
// shared memory has returned (its value is consumed before the arrive in program order).
__device__ __forceinline__ void cluster_sync_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __cluster_barrier_arrive_relaxed();
    __cluster_barrier_wait();
#else
    __trap();
#endif
}
__device__ __forceinline__ const float* cluster_peer(float* p, uint32_t q) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cg::this_cluster().map_shared_rank(p, q);
#else
    __trap();
    return p + 0 * q;
#endif
}

// kTma (tma_mode: QKV and O by default): thread 0 fills each stage with one 2-D tensor-map copy of
// the chunk's token rows (128-byte rows, 128-byte swizzle: piece q of row r sits at q ^ (r & 7), so
// the B-fragment loads stay conflict-free) and warp 0's lanes with one 2 KB bulk copy per slab; they
// complete on the stage's mbarrier, which every warp waits on instead of its own cp.async groups.
// H200, 64 x 1 024: +0.9 % with every projection in this form, QKV 0.505 -> 0.484 ms per 64-token
// step, O level, lm_head 0.391 -> 0.424 (bench/NOTES.md "v35"). v33's form with one bulk copy per
// token row was twice as slow (68 copies per chunk, "v34"); this one asks 5-9. Same data, so
// gemm()'s bits.
// kSplit (1 or 2): warps per slab, each taking 8 / kSplit of the 8-token column groups (the same
// chunks and k16 steps for every column, so the same bits): kSplit x the warps per CTA on the same
// stages (set_dense_batch_split).
template <int kWarps, int SPW, int S, bool kTma, int kSplit = 1>
__global__ __launch_bounds__(32 * kWarps * kSplit) void dense_batch_kernel(const __grid_constant__ DenseArgs a) {
    extern __shared__ __align__(16) uint4 sm_raw[];
    __shared__ __align__(8) uint64_t full_bar[kTma ? S : 1];
    uint4* sm = sm_raw;
    if constexpr (kTma) {  // stages on 1024-byte boundaries: the swizzle pattern's period
        const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sm_raw));
        sm = sm_raw + (((base + 1023u) & ~1023u) - base) / 16;
    }
    constexpr uint32_t kThreads = 32 * kWarps * kSplit, kGroups = 8 / kSplit;  // column groups per warp
    // warp: the slab warp (its slabs), half: which kGroups column groups it takes.
    const uint32_t wid = threadIdx.x >> 5, warp = kSplit == 1 ? wid : wid % kWarps, half = kSplit == 1 ? 0u : wid / kWarps;
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t group = blockIdx.x, part = blockIdx.y, col_base = blockIdx.z * a.cols;
    const uint32_t n_chunks = a.K >> 6, slabs = (a.N + 15) / 16, kq = a.K / 8;
    const uint32_t n_local = part < n_chunks ? (n_chunks - part + kParts - 1) / kParts : 0;  // chunks part + 4i
    const uint32_t n_cols = min(a.cols, a.n - col_base), rows = (n_cols + 7) & ~7u, ng = rows / 8;
    constexpr uint32_t kSlabsCta = kWarps * SPW;
    const uint32_t stage_u4 = kSlabsCta * kSlabU4 + (kTma ? a.rows_box * 8 : rows * kRowU4);
    const uint32_t slab0 = group * kSlabsCta + warp * SPW;  // this warp's first slab
    const uint32_t bar0 = static_cast<uint32_t>(__cvta_generic_to_shared(&full_bar[0]));
    if constexpr (kTma) {
        if (threadIdx.x == 0) {
            for (uint32_t s = 0; s < S; ++s) mbar_init(bar0 + 8 * s, 1);
            fence_mbar_init();
        }
        __syncthreads();
    }
    // kTma: stage s's copies of chunk c. Lane 0 of warp 0 arms the barrier with the stage's bytes
    // (the weights are issued before the dependency wait in the prologue, the rows after it).
    const uint32_t slabs_here = min(kSlabsCta, slabs - group * kSlabsCta);
    auto tma_weights = [&](uint32_t s, uint32_t c) {
        if (wid != 0) return;
        if (lane == 0) mbar_arrive_expect_tx(bar0 + 8 * s, slabs_here * kSlabU4 * 16 + a.rows_box * 128);
        __syncwarp();
        if (lane < slabs_here)
            bulk_copy_g2s(sm + s * stage_u4 + lane * kSlabU4,
                          a.w + (size_t(group * kSlabsCta + lane) * n_chunks + c) * kSlabU4, kSlabU4 * 16, bar0 + 8 * s);
    };
    auto tma_rows = [&](uint32_t s, uint32_t c) {
        if (threadIdx.x == 0)
            tma_load_2d(sm + s * stage_u4 + kSlabsCta * kSlabU4, &a.rows, int32_t(c * 64), int32_t(col_base), bar0 + 8 * s);
    };

    // Stage s gets chunk c: this warp's slabs (4 copies per lane and slab), then the token rows.
    auto load_weights = [&](uint32_t s, uint32_t c) {
        uint4* dst = sm + s * stage_u4 + warp * SPW * kSlabU4 + lane;
#pragma unroll
        for (int sp = 0; sp < SPW; ++sp) {
            if (slab0 + sp >= slabs) break;
            const uint4* src = a.w + (size_t(slab0 + sp) * n_chunks + c) * kSlabU4 + lane;
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if (kSplit == 1 || uint32_t(i) % kSplit == half) cp_async16(dst + sp * kSlabU4 + i * 32, src + i * 32);
        }
    };
    // Token rows: thread (r0 = tid / 8, q = tid % 8) copies piece q (16 bytes) of rows r0, r0 + R,
    // r0 + 2R, ... (R = kThreads / 8 rows per pass) that are below n_cols, so per chunk its copies are
    // one base address and a fixed stride (the per-copy index arithmetic was ~20 % of the loop's
    // stall samples, bench/NOTES.md "v33"). Staged rows from n_cols up to the 8-row group's end are
    // left as they are: a B column only reaches its own output column, and those are never stored.
    constexpr uint32_t kRowsPerPass = kThreads / 8, kRowCopies = kCols / kRowsPerPass;
    const uint32_t r0 = threadIdx.x >> 3;
    const uint4* const row_src = a.x + size_t(col_base + min(r0, n_cols - 1)) * kq + (threadIdx.x & 7);
    const size_t row_step = size_t(kRowsPerPass) * kq;
    const uint32_t row_copies = r0 < n_cols ? (n_cols - r0 + kRowsPerPass - 1) / kRowsPerPass : 0;
    const uint32_t row_dst = kSlabsCta * kSlabU4 + r0 * kRowU4 + (threadIdx.x & 7);
    auto load_rows = [&](uint32_t s, uint32_t c) {
        uint4* dst = sm + s * stage_u4 + row_dst;
        const uint4* src = row_src + c * 8;
#pragma unroll
        for (uint32_t i = 0; i < kRowCopies; ++i)
            if (i < row_copies) cp_async16(dst + i * kRowsPerPass * kRowU4, src + i * row_step);
    };

    // Stage s gets chunk i of this part (chunk part + 4i) in either form.
    auto stage_weights = [&](uint32_t s, uint32_t i) {
        if constexpr (kTma) tma_weights(s, part + kParts * i);
        else load_weights(s, part + kParts * i);
    };
    auto stage_rows = [&](uint32_t s, uint32_t i) {
        if constexpr (kTma) tma_rows(s, part + kParts * i);
        else load_rows(s, part + kParts * i);
    };

    // Weights are never written: the first stages' weights stream before the previous kernel ends.
#pragma unroll
    for (uint32_t s = 0; s + 1 < S; ++s)
        if (s < n_local) stage_weights(s, s);
    pdl_wait();
#pragma unroll
    for (uint32_t s = 0; s + 1 < S; ++s) {
        if (s < n_local) stage_rows(s, s);
        if constexpr (!kTma) cp_async_commit();
    }
    pdl_launch_dependents();

    float acc[SPW][kGroups][4];
#pragma unroll
    for (int sp = 0; sp < SPW; ++sp)
#pragma unroll
        for (int nb = 0; nb < int(kGroups); ++nb) acc[sp][nb][0] = acc[sp][nb][1] = acc[sp][nb][2] = acc[sp][nb][3] = 0.0f;
    const uint32_t gb0 = half * kGroups;  // this warp's first column group

    for (uint32_t i = 0; i < n_local; ++i) {
        if constexpr (!kTma) cp_async_wait<S - 2>();  // chunk i has landed (this thread's copies) ...
        __syncthreads();  // ... everyone's (kTma: the barrier below), and stage (i - 1) % S is free again
        const uint32_t next = i + S - 1;
        if (next < n_local) {
            stage_weights(next % S, next);
            stage_rows(next % S, next);
        }
        if constexpr (kTma) mbar_wait(bar0 + 8 * (i % S), (i / S) & 1);
        else cp_async_commit();
        const uint4* st = sm + (i % S) * stage_u4;
        const uint4* wa = st + warp * SPW * kSlabU4 + lane;
        const uint4* xb = st + kSlabsCta * kSlabU4 + g * kRowU4 + t * 2;
        const uint4* xt = st + kSlabsCta * kSlabU4 + g * 8;  // kTma: row g's pieces, swizzled
#pragma unroll
        for (int jh = 0; jh < 2; ++jh) {
            uint4 b[kGroups];
#pragma unroll
            for (int nb = 0; nb < int(kGroups); ++nb)
                if (gb0 + nb < ng) b[nb] = kTma ? xt[(gb0 + nb) * 64 + ((2 * t + jh) ^ g)] : xb[(gb0 + nb) * 8 * kRowU4 + jh];
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
                for (int sp = 0; sp < SPW; ++sp) {
                    const uint4 v = wa[sp * kSlabU4 + (2 * jh + jj) * 32];
                    const uint32_t af[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                    for (int nb = 0; nb < int(kGroups); ++nb)
                        if (gb0 + nb < ng) mma(acc[sp][nb], af, jj ? b[nb].z : b[nb].x, jj ? b[nb].w : b[nb].y);
                }
            }
        }
    }
    // The cluster's 4 CTAs (one per part) each leave their partial tile in their own shared memory;
    // CTA `part` sums slice `part` of the tile over the cluster in part order, ((p0 + p1) + p2) + p3,
    // gemm()'s reduction of its warps' tiles. Lane (g, t) holds rows slab·16 + g (e = 0, 1) and + 8
    // (e = 2, 3) of columns 8·nb + 2t + (e & 1).
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages
    constexpr uint32_t R = kSlabsCta * 16, TS = R + 4;  // tile [col][TS]: lanes' (2t, g) in distinct banks
    float* tile = reinterpret_cast<float*>(sm);
#pragma unroll
    for (int sp = 0; sp < SPW; ++sp)
#pragma unroll
        for (int nb = 0; nb < int(kGroups); ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (gb0 + nb < ng)
                    tile[((gb0 + nb) * 8 + 2 * t + (e & 1)) * TS + (warp * SPW + sp) * 16 + g + (e >> 1) * 8] =
                        acc[sp][nb][e];
    cluster_sync();
    const float* src[kParts];
#pragma unroll
    for (uint32_t q = 0; q < kParts; ++q) src[q] = cluster_peer(tile, q);
    // kUnroll elements per thread at a time, all their loads (the 4 parts, and the output for kAdd)
    // issued before any sum: one distributed-shared-memory round trip per kUnroll elements rather
    // than per element (the tail was ~25 % of the kernel's stall samples, v33).
    constexpr uint32_t kUnroll = 8;
    const uint32_t elems = n_cols * R, per = (elems + kParts - 1) / kParts;
    const uint32_t u1 = min(elems, (part + 1) * per);
    for (uint32_t u = part * per + threadIdx.x; u < u1; u += kUnroll * kThreads) {
        float v[kUnroll][kParts], old[kUnroll];
#pragma unroll
        for (uint32_t j = 0; j < kUnroll; ++j) {
            const uint32_t uj = u + j * kThreads, col = uj / R, rl = uj - col * R, row = group * R + rl;
            if (uj >= u1) break;
#pragma unroll
            for (uint32_t q = 0; q < kParts; ++q) v[j][q] = src[q][col * TS + rl];
            old[j] = a.add && row < a.N ? a.out[size_t(col_base + col) * a.ldo + row] : 0.0f;
        }
#pragma unroll
        for (uint32_t j = 0; j < kUnroll; ++j) {
            const uint32_t uj = u + j * kThreads, col = uj / R, rl = uj - col * R, row = group * R + rl;
            if (uj >= u1) break;
            const float sum = __fadd_rn(__fadd_rn(__fadd_rn(v[j][0], v[j][1]), v[j][2]), v[j][3]);
            if (row < a.N) store_out(a, col_base + col, row, sum, old[j]);
        }
    }
    cluster_sync_relaxed();  // no CTA leaves while another still reads its shared memory
}

uint32_t g_spw = 0, g_warps = 0;  // set_dense_batch_shape

// Slabs per warp: 2 for a weight of at least kWideSlabs slabs (lm_head: 0.466 -> 0.398 ms per
// 64-token step), else 1 (QKV 0.536 -> 0.514, O 0.596 -> 0.531; H200, bench/NOTES.md "v21").
constexpr uint32_t kWideSlabs = 4096;
uint32_t slabs_per_warp(uint32_t slabs) {
    static const uint32_t env = uint32_t(env_choice("GPTOSS_DECODE_BATCH_DENSE_SPW", {1, 2}, 0));
    if (g_spw == 1 || g_spw == 2) return g_spw;
    if (env != 0) return env;
    return slabs >= kWideSlabs ? 2u : 1u;
}
uint32_t g_cols = 0;  // set_dense_batch_shape
// Token columns per CTA: 32 or 64 when forced (set_dense_batch_shape, GPTOSS_DECODE_BATCH_DENSE_COLS),
// else 0: dense_batch_plan's choice.
uint32_t forced_cols() {
    static const uint32_t env = uint32_t(env_choice("GPTOSS_DECODE_BATCH_DENSE_COLS", {32, 64}, 0));
    return g_cols == 32 || g_cols == 64 ? g_cols : env;
}
uint32_t g_split = 0;  // set_dense_batch_split
// Warps per slab (column split): 1, or 2 where forced (set_dense_batch_split,
// GPTOSS_DECODE_BATCH_DENSE_SPLIT); CTAs of 4 slab warps only.
uint32_t col_split(uint32_t warps) {
    static const uint32_t env = uint32_t(env_choice("GPTOSS_DECODE_BATCH_DENSE_SPLIT", {1, 2}, 1));
    const uint32_t s = g_split == 1 || g_split == 2 ? g_split : env;
    return warps == 4 ? s : 1u;
}
uint32_t cta_warps() {
    static const uint32_t env = uint32_t(env_choice("GPTOSS_DECODE_BATCH_DENSE_WARPS", {4, 8}, 4));
    return g_warps == 4 || g_warps == 8 ? g_warps : env;
}

// Dynamic shared memory of a CTA for n tokens: S pipeline stages, and the partial tile (reusing
// the stages).
template <int kWarps, int SPW, int S, bool kTma = false>
size_t smem_bytes(uint32_t n, uint32_t cols = kCols) {
    const uint32_t rows = rows_box(n, cols);
    const size_t stages = size_t(S) * (kWarps * SPW * kSlabU4 + rows * (kTma ? 8 : kRowU4)) * 16;
    const size_t tile = size_t(rows) * (kWarps * SPW * 16 + 4) * 4;
    return std::max(stages, tile) + (kTma ? 1024 : 0);  // kTma: room to align the stages to 1024 bytes
}

// Sets the kernel's shared-memory opt-in to the most any call asks (once per thread and device).
template <int kWarps, int SPW, int S, bool kTma, int kSplit>
gptoss_status opt_in(int dev) {
    thread_local int done_for = -1;
    if (done_for == dev) return GPTOSS_OK;
    GPTOSS_CUDA_TRY(cudaFuncSetAttribute(dense_batch_kernel<kWarps, SPW, S, kTma, kSplit>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(smem_bytes<kWarps, SPW, S, kTma>(kCols))));
    done_for = dev;
    return GPTOSS_OK;
}

// One launch: clusters of the 4 part CTAs along y, programmatic dependent launch where supported.
template <int kWarps, int SPW, int S, bool kTma, int kSplit>
gptoss_status launch_kernel(const DenseArgs& a, dim3 grid, int dev, cudaStream_t stream) {
    GPTOSS_TRY((opt_in<kWarps, SPW, S, kTma, kSplit>(dev)));
    return cuda_status(launch_pdl_cluster(dense_batch_kernel<kWarps, SPW, S, kTma, kSplit>, grid, dim3(32 * kWarps * kSplit),
                                          smem_bytes<kWarps, SPW, S, kTma>(a.n, a.cols), stream, dim3(1, kParts, 1), a),
                       "dense_batch_kernel", __FILE__, __LINE__);
}

// kTma's map of the token rows x [n, K] (bf16, row stride K): boxes of 64 k x box_rows tokens,
// 128-byte swizzle, rows past n read as zeros. cuTensorMapEncodeTiled comes from the driver
// through the runtime (no libcuda link). False where the driver lacks it or refuses the shape.
bool encode_rows_map(CUtensorMap* map, const uint4* x, uint32_t n, uint32_t K, uint32_t box_rows) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            fn = nullptr;
        }
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }();
    if (!encode) return false;
    const cuuint64_t dims[2] = {K, n};
    const cuuint64_t strides[1] = {cuuint64_t(K) * 2};
    const cuuint32_t box[2] = {64, box_rows};
    const cuuint32_t elem_strides[2] = {1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint4*>(x), dims, strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int g_tma = -1;  // set_dense_batch_tma
// Which plans take the kTma form: 0 none, 1 those of one slab per warp (QKV, O), 2 all (lm_head too).
int tma_mode() {
    static const int env = env_choice("GPTOSS_DECODE_BATCH_DENSE_TMA", {0, 1, 2}, 1);
    return g_tma >= 0 ? g_tma : env;
}

// Pipeline stages of a plan (the same bits at any depth: a warp's chunk order does not depend on
// it): 4 for one slab per warp (QKV, O), 3 for two (lm_head: 25 KB per stage, so 3 CTAs per SM
// instead of 2). H200, 20b, ms per 64-token step (bench/NOTES.md "v38"): lm_head 0.394 at 4 stages,
// 0.323 at 3; QKV / O 0.48 / 0.48 at 4, 0.53 / 0.55 at 3. GPTOSS_DECODE_BATCH_DENSE_STAGES = 2, 3
// or 4 forces a depth for every plan (tuning); fewer where the device's shared memory is short.
int g_stages = 0;  // set_dense_batch_stages
template <int kWarps, int SPW, int S>
bool stages_fit(bool tma, const DeviceProps& dp) {
    const size_t bytes = tma ? smem_bytes<kWarps, SPW, S, true>(kCols) : smem_bytes<kWarps, SPW, S, false>(kCols);
    return bytes <= size_t(dp.max_smem_optin);
}
template <int kWarps, int SPW>
int stages(bool tma, const DeviceProps& dp) {
    static const int env = env_choice("GPTOSS_DECODE_BATCH_DENSE_STAGES", {2, 3, 4}, 0);
    int s = g_stages != 0 ? g_stages : env != 0 ? env : SPW == 2 ? 3 : 4;
    if (s == 4 && !stages_fit<kWarps, SPW, 4>(tma, dp)) s = 3;
    if (s == 3 && !stages_fit<kWarps, SPW, 3>(tma, dp)) s = 2;
    return s;
}

template <int kWarps, int SPW, int kSplit>
gptoss_status launch(DenseArgs& a, dim3 grid, cudaStream_t stream) {
    DeviceProps dp;
    GPTOSS_CUDA_TRY(current_device_props(&dp));
    const int mode = tma_mode();
    a.rows_box = rows_box(a.n, a.cols);
    const bool tma = (mode == 2 || (mode == 1 && SPW == 1)) && encode_rows_map(&a.rows, a.x, a.n, a.K, a.rows_box);
    switch (stages<kWarps, SPW>(tma, dp)) {
    case 4: return tma ? launch_kernel<kWarps, SPW, 4, true, kSplit>(a, grid, dp.dev, stream)
                       : launch_kernel<kWarps, SPW, 4, false, kSplit>(a, grid, dp.dev, stream);
    case 3: return tma ? launch_kernel<kWarps, SPW, 3, true, kSplit>(a, grid, dp.dev, stream)
                       : launch_kernel<kWarps, SPW, 3, false, kSplit>(a, grid, dp.dev, stream);
    default: return tma ? launch_kernel<kWarps, SPW, 2, true, kSplit>(a, grid, dp.dev, stream)
                        : launch_kernel<kWarps, SPW, 2, false, kSplit>(a, grid, dp.dev, stream);
    }
}

}  // namespace

DenseBatchPlan dense_batch_plan(uint32_t N, uint32_t sms) {
    DenseBatchPlan p;
    p.warps = cta_warps();
    p.slabs_per_cta = p.warps * slabs_per_warp(ceil_div(N, 16));
    p.groups = ceil_div(ceil_div(N, 16), p.slabs_per_cta);
    const uint32_t forced = forced_cols();
    p.cols = forced != 0 ? forced : p.groups * kParts < 2 * sms ? 32u : kCols;
    p.split = col_split(p.warps);
    return p;
}

bool dense_batch_supported() {
    DeviceProps dp;
    if (current_device_props(&dp) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return dp.major >= 9;
}

gptoss_status dense_batch_gemm(const GemmWeights& w, const uint16_t* x, uint32_t n, Epilogue epilogue, float* out_f32,
                               uint32_t ldo, cudaStream_t stream) {
    if (w.mxfp4 || !w.w || w.K == 0 || w.K % 64 != 0 || w.N == 0)
        return fail(GPTOSS_ERR_INTERNAL, "dense_batch_gemm: needs a dense bf16 weight with K %% 64 == 0 and N > 0 (%s %ux%u)",
                    w.mxfp4 ? "MXFP4" : "bf16", w.N, w.K);
    if (epilogue != Epilogue::kStore && epilogue != Epilogue::kAdd)
        return fail(GPTOSS_ERR_INTERNAL, "dense_batch_gemm: epilogue %d, only kStore and kAdd are supported", int(epilogue));
    if (!x || !out_f32 || ldo < w.N)
        return fail(GPTOSS_ERR_INTERNAL, "dense_batch_gemm: x and out_f32 are required and ldo (%u) >= N (%u)", ldo, w.N);
    if (!dense_batch_supported())
        return fail(GPTOSS_ERR_INTERNAL, "dense_batch_gemm: needs thread-block clusters (compute capability 9.0+)");
    if (n == 0) return GPTOSS_OK;
    DeviceProps dp;
    GPTOSS_CUDA_TRY(current_device_props(&dp));
    const DenseBatchPlan p = dense_batch_plan(w.N, uint32_t(std::max(dp.sms, 0)));
    const uint32_t col_blocks = ceil_div(n, p.cols);
    if (col_blocks > 65535) return fail(GPTOSS_ERR_INTERNAL, "dense_batch_gemm: %u tokens exceed the grid", n);
    DenseArgs a{};
    a.w = static_cast<const uint4*>(w.w);
    a.bias = w.bias;
    a.x = reinterpret_cast<const uint4*>(x);
    a.out = out_f32;
    a.N = w.N; a.K = w.K; a.n = n; a.ldo = ldo;
    a.add = epilogue == Epilogue::kAdd;
    a.groups = p.groups;
    a.cols = p.cols;
    const dim3 grid(p.groups, kParts, col_blocks);
    const uint32_t spw = p.slabs_per_cta / p.warps;
    if (p.warps == 8) return spw == 1 ? launch<8, 1, 1>(a, grid, stream) : launch<8, 2, 1>(a, grid, stream);
    if (p.split == 2) return spw == 1 ? launch<4, 1, 2>(a, grid, stream) : launch<4, 2, 2>(a, grid, stream);
    return spw == 1 ? launch<4, 1, 1>(a, grid, stream) : launch<4, 2, 1>(a, grid, stream);
}

bool dense_batch_use(uint32_t which, uint32_t n) {
    static const uint32_t mask = uint32_t(env_int("GPTOSS_DECODE_BATCH_DENSE", int(kDenseBatchMask))) & kDenseAll;
    static const int env_min = env_int("GPTOSS_DECODE_BATCH_DENSE_MIN", 0);
    const uint32_t min_tokens = env_min > 0 ? uint32_t(env_min)
                                : which == kDenseLmHead ? kDenseBatchMinTokensLmHead : kDenseBatchMinTokens;
    return (mask & which) && n >= min_tokens && dense_batch_supported();
}

void set_dense_batch_split(uint32_t split) { g_split = split == 1 || split == 2 ? split : 0; }

void set_dense_batch_stages(int stages) { g_stages = stages >= 2 && stages <= 4 ? stages : 0; }

void set_dense_batch_tma(int mode) { g_tma = mode >= 0 && mode <= 2 ? mode : -1; }

void set_dense_batch_shape(uint32_t warps, uint32_t spw, uint32_t cols) {
    g_warps = warps;
    g_spw = spw;
    g_cols = cols;
}

}  // namespace cuda
}  // namespace gptoss
