// cuda/gemm_prefill.cu - the prefill GEMMs (a chunk of tokens): dense bf16 projections (QKV, O)
// and the MXFP4 expert GEMMs grouped by expert (one tile scheduler over all experts, tokens
// sorted by expert by router_route), with gemm()'s epilogues (bias, residual add, SwiGLU with
// clamp into the permuted bf16 activations, per-pair rows for the down projection).
// Math: out[row, n] = Σ_k x[row, k] · W[n, k] + bias[n]; bf16 inputs, fp32 accumulation.
// Mapping: one CTA (8 warps) = 128 weight rows (8 fragment slabs, kernels.h) × TN = 64 or 128
// tokens; blockIdx.x walks the token tiles (fastest, so the CTAs resident at once share weight
// rows and the activations stay in L2), blockIdx.y the row tiles. A kStages-deep cp.async ring
// brings each 64-k chunk of weights (bf16 2 KB, or MXFP4 512 B + 64 B of scales per slab, as
// repack.cu laid them out: every lane's A fragment is 16 contiguous bytes) and of the token rows
// (128 B each, 16-byte units XOR-swizzled by row so the fragment reads are conflict-free) into
// shared memory. Warp (wm, wn) computes rows 32·wm..+32 × tokens TN/2·wn..+TN/2 with mma.sync
// m16n8k16; MXFP4 is dequantized from shared memory into bf16 A fragments in registers
// (gemm.cuh fragment(), the bits gemm() uses).
// Chunk invariance: every output element accumulates its k in one fixed order (chunk 0, 1, ...,
// k16 step 0..3 within a chunk) in one accumulator, whatever TN, the tile or the chunk size, so
// a token's output is bit-identical however the prompt is chunked or the experts are tiled.
#include "cuda/common.cuh"
#include "cuda/gemm.cuh"
#include "cuda/kernels.h"

#include <atomic>

namespace gptoss {
namespace cuda {
namespace {
using namespace gemm_detail;

constexpr int kThreads = 256;  // 8 warps: 4 over rows × 2 over tokens
constexpr int kStages = 4;     // cp.async ring depth (64-k chunks in flight)
constexpr int kSlabs = 8;      // 16-row fragment slabs per CTA: 128 rows

struct PrefillArgs {
    GemmWeights w;
    const uint16_t* x;
    uint32_t n_rows;
    GemmRoute route;
    int routed;
    int epilogue;
    float* out_f32;
    uint16_t* out_bf16;
    uint32_t ldo;
    float limit;
};

// Bytes of one ring stage: weights (+ scales) then TN token rows of 128 bytes.
template <bool kFp4> constexpr uint32_t a_bytes() { return kFp4 ? kSlabs * 512 : kSlabs * 2048; }
template <bool kFp4> constexpr uint32_t s_bytes() { return kFp4 ? kSlabs * 64 : 0; }
template <bool kFp4, int TN> constexpr uint32_t stage_bytes() { return a_bytes<kFp4>() + s_bytes<kFp4>() + TN * 128; }
template <bool kFp4, int TN> constexpr uint32_t smem_bytes() { return kStages * stage_bytes<kFp4, TN>(); }

__device__ __forceinline__ void cp_async16_zfill(uint32_t saddr, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(saddr), "l"(gmem), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

template <bool kFp4, int TN>
__global__ __launch_bounds__(kThreads, TN == 64 ? 2 : 1) void gemm_prefill_kernel(const PrefillArgs args) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int32_t out_rows[TN];
    constexpr uint32_t kA = a_bytes<kFp4>(), kS = s_bytes<kFp4>(), kStage = stage_bytes<kFp4, TN>();
    constexpr int NT = TN / 16;       // n8 tiles per warp
    constexpr int kBUnits = TN / 32;  // 16-byte token units per thread per chunk
    const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
    const uint32_t K = args.w.K, N = args.w.N, n_chunks = K >> 6;
    const uint32_t n_slabs = (N + 15) >> 4, slab0 = blockIdx.y * kSlabs;
    const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

    // Dense: the weights (never written) stream before the wait for the previous kernel.
    // Routed: the expert comes from the router, so wait first.
    if (args.routed) pdl_wait();
    int expert = 0;
    uint32_t col_base, n_cols;
    const int32_t* pairs = nullptr;
    if (args.routed) {
        const int32_t n_tiles = args.route.tiles[0];
        if (int32_t(blockIdx.x) >= n_tiles) return;
        const int32_t* ti = args.route.tiles + 1 + 3 * blockIdx.x;
        expert = ti[0];
        col_base = uint32_t(ti[1]);
        n_cols = min(uint32_t(ti[2]), uint32_t(TN));
        pairs = args.route.pairs + col_base;
    } else {
        col_base = blockIdx.x * uint32_t(TN);
        n_cols = min(uint32_t(TN), args.n_rows - col_base);
    }

    // This thread's weight copies: bf16 4 units of 16 B (unit u = tid + 256 r: slab u / 128),
    // MXFP4 one unit (slab tid / 32) and, for tid < 32, one scale unit (slab tid / 4).
    const char* wsrc = static_cast<const char*>(args.w.w) + size_t(expert) * args.w.w_expert_stride;
    const char* ssrc = kFp4 ? reinterpret_cast<const char*>(args.w.scales + size_t(expert) * args.w.s_expert_stride)
                            : nullptr;
    auto load_a = [&](uint32_t stage, uint32_t c) {
        const uint32_t sa = smem_base + stage * kStage;
        if constexpr (kFp4) {
            const uint32_t slab = slab0 + uint32_t(tid >> 5);
            if (slab < n_slabs)
                cp_async16_zfill(sa + uint32_t(tid) * 16,
                                 wsrc + (size_t(slab) * n_chunks + c) * 512 + uint32_t(tid & 31) * 16, true);
            if (tid < 32) {
                const uint32_t sslab = slab0 + uint32_t(tid >> 2);
                if (sslab < n_slabs)
                    cp_async16_zfill(sa + kA + uint32_t(tid) * 16,
                                     ssrc + (size_t(sslab) * n_chunks + c) * 64 + uint32_t(tid & 3) * 16, true);
            }
        } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const uint32_t u = uint32_t(tid + kThreads * r);
                const uint32_t slab = slab0 + (u >> 7);
                if (slab < n_slabs)
                    cp_async16_zfill(sa + u * 16, wsrc + (size_t(slab) * n_chunks + c) * 2048 + (u & 127) * 16, true);
            }
        }
    };

    if (!args.routed) {
#pragma unroll
        for (int s = 0; s < kStages - 1; ++s)
            if (uint32_t(s) < n_chunks) load_a(uint32_t(s), uint32_t(s));
        pdl_wait();
    }

    // Token rows: this thread copies unit (tid & 7) of rows tid / 8 + 32 i; columns past n_cols
    // are zero-filled.
    if (tid < TN) out_rows[tid] = tid < int(n_cols) ? (args.routed ? pairs[tid] : int32_t(col_base) + tid) : 0;
    const uint16_t* bsrc[kBUnits];
    bool bvalid[kBUnits];
    uint32_t bdst[kBUnits];
#pragma unroll
    for (int i = 0; i < kBUnits; ++i) {
        const uint32_t row = uint32_t(tid >> 3) + 32u * i, u = uint32_t(tid & 7);
        bvalid[i] = row < n_cols;
        uint32_t src_row = 0;
        if (bvalid[i]) src_row = args.routed ? uint32_t(pairs[row]) / args.route.in_div : col_base + row;
        bsrc[i] = bvalid[i] ? args.x + size_t(src_row) * K + u * 8 : args.x;
        bdst[i] = kA + kS + row * 128 + ((u ^ (row & 7)) * 16);
    }
    auto load_b = [&](uint32_t stage, uint32_t c) {
        const uint32_t sb = smem_base + stage * kStage;
#pragma unroll
        for (int i = 0; i < kBUnits; ++i)
            cp_async16_zfill(sb + bdst[i], bvalid[i] ? bsrc[i] + size_t(c) * 64 : bsrc[i], bvalid[i]);
    };

    if (args.routed) {
#pragma unroll
        for (int s = 0; s < kStages - 1; ++s)
            if (uint32_t(s) < n_chunks) load_a(uint32_t(s), uint32_t(s));
    }
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (uint32_t(s) < n_chunks) load_b(uint32_t(s), uint32_t(s));
        cp_async_commit();
    }
    pdl_launch_dependents();

    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

    for (uint32_t c = 0; c < n_chunks; ++c) {
        cp_async_wait<kStages - 2>();
        __syncthreads();  // chunk c visible to all; everyone is done with the stage refilled below
        const uint32_t cn = c + kStages - 1;
        if (cn < n_chunks) {
            load_a(cn % kStages, cn);
            load_b(cn % kStages, cn);
        }
        cp_async_commit();

        const unsigned char* sa = smem + (c % kStages) * kStage;
        const unsigned char* sb = sa + kA + kS;
        [[maybe_unused]] Chunk ch[2];
        if constexpr (kFp4) {
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const int sl = wm * 2 + mt;
                ch[mt].v[0] = *reinterpret_cast<const uint4*>(sa + sl * 512 + lane * 16);
                const uint2 s = *reinterpret_cast<const uint2*>(sa + kA + sl * 64 + g * 8);
                ch[mt].v[1].x = s.x;
                ch[mt].v[1].y = s.y;
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // Unit 2t + h of token row (wn·TN/2 + 8 nt + g): the b fragments of k16 steps 2h, 2h+1.
            uint4 xb[NT];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int row = wn * (TN / 2) + nt * 8 + g;
                xb[nt] = *reinterpret_cast<const uint4*>(sb + row * 128 + (((2 * t + h) ^ g) * 16));
            }
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
                const int j = 2 * h + jj;
                uint32_t a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    if constexpr (kFp4) {
                        fragment<true>(ch[mt], j, a[mt]);
                    } else {
                        const uint4 v =
                            *reinterpret_cast<const uint4*>(sa + (wm * 2 + mt) * 2048 + j * 512 + lane * 16);
                        a[mt][0] = v.x; a[mt][1] = v.y; a[mt][2] = v.z; a[mt][3] = v.w;
                    }
                }
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                        mma(acc[mt][nt], a[mt], jj ? xb[nt].z : xb[nt].x, jj ? xb[nt].w : xb[nt].y);
            }
        }
    }
    cp_async_wait<0>();

    // Epilogue: lane (g, t) holds rows g / g+8 of each slab, columns 2t / 2t+1 of each n8 tile.
    const float* bias = args.w.bias ? args.w.bias + size_t(expert) * args.w.bias_expert_stride : nullptr;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
        const uint32_t slab = slab0 + uint32_t(wm * 2 + mt);
        if (slab >= n_slabs) continue;
        const uint32_t r_lo = slab * 16 + uint32_t(g), r_hi = r_lo + 8;
        const float b_lo = bias && r_lo < N ? bias[r_lo] : 0.0f;
        const float b_hi = bias && r_hi < N ? bias[r_hi] : 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int ci = 0; ci < 2; ++ci) {
                const uint32_t col = uint32_t(wn * (TN / 2) + nt * 8 + 2 * t + ci);
                if (col >= n_cols) continue;
                const uint32_t out_row = uint32_t(out_rows[col]);
                const float lo = acc[mt][nt][ci], hi = acc[mt][nt][2 + ci];
                if (args.epilogue == int(Epilogue::kSwiglu)) {
                    float gate = lo + b_lo;
                    float up = hi + b_hi;
                    gate = fminf(gate, args.limit);
                    up = fminf(fmaxf(up, -args.limit), args.limit);
                    const float sig = 1.0f / (1.0f + expf(-1.702f * gate));
                    const float y = (up + 1.0f) * (gate * sig);
                    const uint32_t j = slab * 8 + uint32_t(g);
                    args.out_bf16[size_t(out_row) * args.ldo + permuted_k(j)] = f32_to_bf16_bits(y);
                } else {
                    float* o = args.out_f32 + size_t(out_row) * args.ldo;
                    const bool add = args.epilogue == int(Epilogue::kAdd);
                    if (r_lo < N) o[r_lo] = add ? o[r_lo] + (lo + b_lo) : lo + b_lo;
                    if (r_hi < N) o[r_hi] = add ? o[r_hi] + (hi + b_hi) : hi + b_hi;
                }
            }
        }
    }
}

// Raises the dynamic shared memory limit of one kernel instance once per device.
template <bool kFp4, int TN>
cudaError_t launch(const PrefillArgs& a, dim3 grid, cudaStream_t stream) {
    static std::atomic<uint64_t> configured{0};
    constexpr uint32_t bytes = smem_bytes<kFp4, TN>();
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const uint64_t bit = dev < 64 ? (uint64_t(1) << dev) : 0;
    if (!bit || !(configured.load() & bit)) {
        err = cudaFuncSetAttribute(gemm_prefill_kernel<kFp4, TN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(bytes));
        if (err != cudaSuccess) return err;
        configured.fetch_or(bit);
    }
    return launch_pdl(gemm_prefill_kernel<kFp4, TN>, grid, kThreads, bytes, stream, a);
}

}  // namespace

uint32_t gemm_prefill_tile_tokens(uint32_t n_pairs, uint32_t n_experts) {
    return n_experts > 0 && n_pairs / n_experts >= 128 ? 128u : 64u;
}

gptoss_status gemm_prefill(const GemmWeights& w, const uint16_t* x, uint32_t n_rows, const GemmRoute* route,
                           Epilogue epilogue, float* out_f32, uint16_t* out_bf16, uint32_t ldo, float swiglu_limit,
                           cudaStream_t stream) {
    if (w.K == 0 || w.K % 64 != 0 || w.N == 0)
        return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: K=%u must be a positive multiple of 64, N=%u > 0", w.K, w.N);
    if (epilogue == Epilogue::kSwiglu && (w.N % 128 != 0 || !out_bf16))
        return fail(GPTOSS_ERR_INTERNAL,
                    "gemm_prefill: SwiGLU needs N %% 128 == 0 (N=%u: whole 64-element chunks of the permuted output) "
                    "and a bf16 output", w.N);
    if (epilogue != Epilogue::kSwiglu && !out_f32) return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: fp32 output missing");
    if (w.mxfp4 && !w.scales) return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: MXFP4 weights without scales");
    if (route && route->tile_tokens != 64 && route->tile_tokens != 128)
        return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: route tiles of %u pairs, expected 64 or 128",
                    route->tile_tokens);
    if (route && route->in_div == 0) return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: route in_div is 0");
    PrefillArgs a{};
    a.w = w;
    a.x = x;
    a.n_rows = n_rows;
    a.routed = route != nullptr;
    if (route) a.route = *route;
    a.epilogue = int(epilogue);
    a.out_f32 = out_f32;
    a.out_bf16 = out_bf16;
    a.ldo = ldo;
    a.limit = swiglu_limit;
    const uint32_t tn = route ? route->tile_tokens : (n_rows >= 1024 ? 128u : 64u);
    const uint32_t tiles = route ? route->max_tiles : ceil_div(n_rows, tn);
    if (tiles == 0 || n_rows == 0) return GPTOSS_OK;
    const uint32_t row_tiles = ceil_div(ceil_div(w.N, 16), kSlabs);
    if (row_tiles > 65535) return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: %u row tiles exceed the grid limit", row_tiles);
    const dim3 grid(tiles, row_tiles);
    cudaError_t err;
    if (w.mxfp4) err = tn == 128 ? launch<true, 128>(a, grid, stream) : launch<true, 64>(a, grid, stream);
    else err = tn == 128 ? launch<false, 128>(a, grid, stream) : launch<false, 64>(a, grid, stream);
    GPTOSS_TRY(cuda_status(err, "gemm_prefill_kernel", __FILE__, __LINE__));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
