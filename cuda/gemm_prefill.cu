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
// A second kernel, same tile and epilogues, issues wgmma on sm_90a with A from registers (opt-in,
// see its comment); on sm_90a the default is gemm_prefill_sm90.cu's (A and B in shared memory).
#include "cuda/gemm_prefill.cuh"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace gptoss {
namespace cuda {
namespace {
using namespace gemm_detail;

constexpr int kStages = 4;     // cp.async ring depth (64-k chunks in flight)
template <bool kFp4, int TN> constexpr uint32_t stage_bytes() { return a_bytes<kFp4>() + s_bytes<kFp4>() + TN * 128; }
template <bool kFp4, int TN> constexpr uint32_t smem_bytes() { return kStages * stage_bytes<kFp4, TN>(); }

template <bool kFp4, int TN>
__global__ __launch_bounds__(kThreads, TN == 64 ? 2 : 1) void gemm_prefill_kernel(const KernelArgs args) {
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
    PrefillTile tile;
    if (!prefill_tile<TN>(args, &tile)) return;
    const int expert = tile.expert;
    const uint32_t n_cols = tile.n_cols;

    const char *wsrc, *ssrc;
    expert_weights<kFp4>(args, expert, &wsrc, &ssrc);
    const WeightCopies<kFp4, 1> wcopy(wsrc, ssrc, slab0, n_slabs, n_chunks, tid);
    auto load_a = [&](uint32_t stage, uint32_t c) { wcopy.issue(smem_base + stage * kStage, c, tid); };

    if (!args.routed) {
#pragma unroll
        for (int s = 0; s < kStages - 1; ++s)
            if (uint32_t(s) < n_chunks) load_a(uint32_t(s), uint32_t(s));
        pdl_wait();
    }

    // Token rows: this thread copies unit (tid & 7) of rows tid / 8 + 32 i; columns past n_cols
    // are zero-filled.
    if (tid < TN) out_rows[tid] = tile_out_row(args, tile, uint32_t(tid));
    const uint16_t* bsrc[kBUnits];
    bool bvalid[kBUnits];
    uint32_t bdst[kBUnits];
#pragma unroll
    for (int i = 0; i < kBUnits; ++i) {
        const TokenUnit tu = token_unit(args, tile, uint32_t(tid >> 3) + 32u * i, uint32_t(tid & 7));
        bsrc[i] = tu.src;
        bvalid[i] = tu.valid;
        bdst[i] = kA + kS + tu.dst;
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
            for (int mt = 0; mt < 2; ++mt) ch[mt] = staged_chunk<kA>(sa, wm * 2 + mt, lane);
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
        if (!kFp4 && args.epilogue == int(Epilogue::kAdd)) {
            add_residual_columns<NT, 8>(args, uint32_t(wn * (TN / 2)), t, n_cols, out_rows, r_lo, r_hi, b_lo, b_hi,
                                        [&](int nt, int e) { return acc[mt][nt][e]; });
            continue;
        }
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
                    const float y = swiglu_clamped(gate, up, args.limit);
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

// ---------------------------------------------------------------------------
// sm_90a: the same tile through wgmma (warpgroup MMA). Warpgroup w of the CTA multiplies rows
// 64w..64w+63 by all TN tokens, one m64nTNk16 instruction per k16 step: A (the weights) from
// registers — warp i's A fragment is its slab's mma fragment, exactly as in the mma.sync kernel
// (bf16 loaded, MXFP4 dequantized from shared memory) — and B (the tokens) from shared memory
// through a descriptor: rows of 64 k in natural order, 128-byte swizzle, 8-row atoms of 1 KB.
// The activations arrive in the permuted layout, so each 4-byte k pair is copied to its natural
// place by its own cp.async (one warp instruction per 128-byte token row, conflict-free). The
// ring keeps kWStages chunks: one wgmma group stays in flight while the next chunk's A fragments
// are prepared (two register buffers), so a stage is refilled two chunks after its last use.
// Accumulation order per output: chunk by chunk, k16 step by step, one accumulator — the same
// order for TN = 64 and 128, hence chunk-invariant like the mma.sync kernel (whose bits differ).
// Opt-in (GPTOSS_GEMM_SM90=0 GPTOSS_GEMM_WGMMA=1): measured on an H100 it is slower than the mma.sync kernel (dense
// 156 vs 281 TFLOP/s, MoE 201 vs 208; bench/NOTES.md v12) — per 64-k chunk each warpgroup issues
// only 4 wgmmas between two CTA barriers, and the 4-byte B copies cost 16 LSU ops per thread.

constexpr int kWStages = 5;
template <bool kFp4, int TN> constexpr uint32_t wg_smem_bytes() {
    return 1024 + kWStages * (TN * 128 + a_bytes<kFp4>() + s_bytes<kFp4>()) + 2 * TN * 4;
}

#ifdef GPTOSS_SM90A
__device__ __forceinline__ void cp_async4_zfill(uint32_t saddr, const void* gmem, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(saddr), "l"(gmem), "r"(valid ? 4 : 0)
                 : "memory");
}
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <int TN> __device__ __forceinline__ void wgmma_tile(float (&d)[TN / 2], const uint32_t (&a)[4], uint64_t desc) {
    if constexpr (TN == 128) wgmma_m64n128k16(d, a, desc);
    else wgmma_m64n64k16(d, a, desc);
}
#endif

template <bool kFp4, int TN>
__global__ __launch_bounds__(kThreads, TN == 64 ? 2 : 1) void gemm_prefill_wgmma_kernel(const KernelArgs args) {
#ifdef GPTOSS_SM90A
    extern __shared__ unsigned char smem_raw[];
    constexpr uint32_t kA = a_bytes<kFp4>(), kS = s_bytes<kFp4>(), kBst = TN * 128, kAst = kA + kS;
    constexpr int kAcc = TN / 2;
    const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t K = args.w.K, N = args.w.N, n_chunks = K >> 6;
    const uint32_t n_slabs = (N + 15) >> 4, slab0 = blockIdx.y * kSlabs;
    const uint32_t raw_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw_base + 1023u) & ~1023u;  // the swizzle atoms are 1 KB aligned
    unsigned char* smem = smem_raw + (base - raw_base);
    const uint32_t b_base = base, a_base = base + kWStages * kBst;
    const unsigned char* a_ptr = smem + kWStages * kBst;
    int32_t* src_rows = reinterpret_cast<int32_t*>(smem + kWStages * (kBst + kAst));
    int32_t* out_rows = src_rows + TN;

    if (args.routed) pdl_wait();
    PrefillTile tile;
    if (!prefill_tile<TN>(args, &tile)) return;
    const int expert = tile.expert;
    const uint32_t n_cols = tile.n_cols;

    const char *wsrc, *ssrc;
    expert_weights<kFp4>(args, expert, &wsrc, &ssrc);
    const WeightCopies<kFp4, 1> wcopy(wsrc, ssrc, slab0, n_slabs, n_chunks, tid);
    auto load_a = [&](uint32_t stage, uint32_t c) { wcopy.issue(a_base + stage * kAst, c, tid); };
    if (!args.routed) {
#pragma unroll
        for (int s = 0; s < kWStages - 2; ++s)
            if (uint32_t(s) < n_chunks) load_a(uint32_t(s), uint32_t(s));
        pdl_wait();
    }
    if (tid < TN) {
        int32_t src = -1, dst = 0;
        if (uint32_t(tid) < n_cols) {
            dst = tile_out_row(args, tile, uint32_t(tid));
            src = args.routed ? int32_t(uint32_t(dst) / args.route.in_div) : dst;
        }
        src_rows[tid] = src;
        out_rows[tid] = dst;
    }
    __syncthreads();

    // Lane l copies k pair l of the permuted row (k = 16·((l >> 1) & 3) + 2·(l >> 3) + 8·(l & 1))
    // to natural pair position: 16-byte unit 2·((l >> 1) & 3) + (l & 1), byte 4·(l >> 3), unit
    // XOR (row & 7) = warp (rows warp + 8i).
    const uint32_t b_off = ((((uint32_t(lane >> 1) & 3u) * 2u + uint32_t(lane & 1)) ^ uint32_t(warp)) << 4) +
                           4u * uint32_t(lane >> 3);
    auto load_b = [&](uint32_t stage, uint32_t c) {
        const uint32_t sb = b_base + stage * kBst;
#pragma unroll
        for (int i = 0; i < TN / 8; ++i) {
            const int r = warp + 8 * i;
            const int32_t src = src_rows[r];
            const uint16_t* gp = src >= 0 ? args.x + size_t(src) * K + size_t(c) * 64 + 2 * lane : args.x;
            cp_async4_zfill(sb + uint32_t(r) * 128 + b_off, gp, src >= 0);
        }
    };
    if (args.routed) {
#pragma unroll
        for (int s = 0; s < kWStages - 2; ++s)
            if (uint32_t(s) < n_chunks) load_a(uint32_t(s), uint32_t(s));
    }
#pragma unroll
    for (int s = 0; s < kWStages - 2; ++s) {
        if (uint32_t(s) < n_chunks) load_b(uint32_t(s), uint32_t(s));
        cp_async_commit();
    }
    pdl_launch_dependents();

    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    uint32_t af0[4][4], af1[4][4];
    auto step = [&](uint32_t c, uint32_t (&a)[4][4]) {
        cp_async_wait<kWStages - 3>();
        fence_proxy_async();  // this thread's cp.async writes → visible to the async proxy (wgmma)
        __syncthreads();      // everyone's chunk c landed; chunk c-1's wgmma groups are complete
        const uint32_t cn = c + kWStages - 2;
        if (cn < n_chunks) {
            load_a(cn % kWStages, cn);
            load_b(cn % kWStages, cn);
        }
        cp_async_commit();
        const uint32_t st = c % kWStages;
        const unsigned char* sa = a_ptr + st * kAst;
        // gemm_prefill.cuh's staged_a_fragments written out: through the helper ptxas schedules
        // the <true, 64> instance 8 instructions longer (tools/sass-count.py).
        if constexpr (kFp4) {
            Chunk ch;
            ch.v[0] = *reinterpret_cast<const uint4*>(sa + warp * 512 + lane * 16);
            const uint2 s = *reinterpret_cast<const uint2*>(sa + kA + warp * 64 + g * 8);
            ch.v[1].x = s.x;
            ch.v[1].y = s.y;
#pragma unroll
            for (int j = 0; j < 4; ++j) fragment<true>(ch, j, a[j]);
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint4 v = *reinterpret_cast<const uint4*>(sa + warp * 2048 + j * 512 + lane * 16);
                a[j][0] = v.x; a[j][1] = v.y; a[j][2] = v.z; a[j][3] = v.w;
            }
        }
        acc_fence(acc);
        wgmma_fence();
        const uint32_t sb = b_base + st * kBst;
#pragma unroll
        for (int j = 0; j < 4; ++j) wgmma_tile<TN>(acc, a[j], sw128_desc(sb + 32u * uint32_t(j)));
        wgmma_commit();
        acc_fence(acc);
        wgmma_wait<1>();
    };
    uint32_t c = 0;
    for (; c + 1 < n_chunks; c += 2) {
        step(c, af0);
        step(c + 1, af1);
    }
    if (c < n_chunks) step(c, af0);
    wgmma_wait<0>();
    acc_fence(acc);
    cp_async_wait<0>();

    // Epilogue: warp i holds slab i.
    const uint32_t slab = slab0 + uint32_t(warp);
    if (slab < n_slabs) store_wg_tile<TN, !kFp4>(args, expert, slab, acc, n_cols, out_rows, g, t);
#endif
}

__device__ int g_wgmma_probe;
__global__ void wgmma_probe_kernel() {
#ifdef GPTOSS_SM90A
    g_wgmma_probe = 1;
#else
    g_wgmma_probe = 0;
#endif
}

// Launches one kernel instance, raising its dynamic shared memory limit once per device.
template <bool kWgmma, bool kFp4, int TN>
cudaError_t launch(const KernelArgs& a, dim3 grid, cudaStream_t stream) {
    static std::atomic<uint64_t> configured{0};
    auto* kernel = kWgmma ? gemm_prefill_wgmma_kernel<kFp4, TN> : gemm_prefill_kernel<kFp4, TN>;
    constexpr uint32_t bytes = kWgmma ? wg_smem_bytes<kFp4, TN>() : smem_bytes<kFp4, TN>();
    const cudaError_t err = set_smem_once(kernel, bytes, configured);
    if (err != cudaSuccess) return err;
    return launch_pdl(kernel, grid, kThreads, bytes, stream, a);
}

template <bool kWgmma>
cudaError_t launch_any(const KernelArgs& a, bool fp4, uint32_t tn, dim3 grid, cudaStream_t stream) {
    if (fp4) return tn == 128 ? launch<kWgmma, true, 128>(a, grid, stream) : launch<kWgmma, true, 64>(a, grid, stream);
    return tn == 128 ? launch<kWgmma, false, 128>(a, grid, stream) : launch<kWgmma, false, 64>(a, grid, stream);
}

}  // namespace

namespace {
// Whether device `dev` runs the sm_90a kernels: compute capability 9.0 and, since the binary may
// hold sm_90 code without the 90a features, the loaded code says so (a probe kernel).
bool probe_wgmma(int dev) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    if (major != 9 || minor != 0) return false;
    int yes = 0;
    wgmma_probe_kernel<<<1, 1>>>();
    if (cudaGetLastError() != cudaSuccess || cudaMemcpyFromSymbol(&yes, g_wgmma_probe, sizeof(int)) != cudaSuccess) {
        cudaGetLastError();
        yes = 0;
    }
    return yes != 0;
}
}  // namespace

// Decided once per device (it is asked before every prefill GEMM).
bool gemm_prefill_wgmma_supported() {
    static std::atomic<int> known[64];  // 0 unknown, 1 no, 2 yes
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        cudaGetLastError();
        return false;
    }
    if (known[dev].load() == 0) known[dev].store(probe_wgmma(dev) ? 2 : 1);
    return known[dev].load() == 2;
}

namespace {
// kAuto's kernel for a weight type: the same for every chunk, tile and route (chunk invariance).
// GPTOSS_GEMM_SM90 = 0 / 1 / 2: the sm_90a shared-memory wgmma kernel for no / the MXFP4 / all
// GEMMs (default kSm90Default: all, faster on the H200, bench/NOTES.md v13); else
// GPTOSS_GEMM_WGMMA=1: the register-A wgmma kernel; else mma.sync (and on every other device).
constexpr int kSm90Default = 2;
PrefillKernel auto_kernel(bool mxfp4) {
    static const int sm90 = [] {
        const char* e = std::getenv("GPTOSS_GEMM_SM90");
        return e && e[0] >= '0' && e[0] <= '2' && !e[1] ? e[0] - '0' : kSm90Default;
    }();
    static const bool wgmma_env = [] {
        const char* e = std::getenv("GPTOSS_GEMM_WGMMA");
        return e && std::strcmp(e, "1") == 0;
    }();
    // The warp-specialized kernel (same bits), default since the H200 A/B of 2026-11-26 (variant
    // 7: 20b pp2048 38.8k → 40.5k, 120b 19.9k both; bench/NOTES.md v13b; variant 8 since v14);
    // GPTOSS_SM90_WS=0: the lock-step kernel of gemm_prefill_sm90.cu.
    static const bool ws = [] {
        const char* e = std::getenv("GPTOSS_SM90_WS");
        return !(e && std::strcmp(e, "0") == 0);
    }();
    if (sm90 >= (mxfp4 ? 1 : 2) && gemm_prefill_wgmma_supported()) return ws ? PrefillKernel::kSm90Ws : PrefillKernel::kSm90;
    return wgmma_env && gemm_prefill_wgmma_supported() ? PrefillKernel::kWgmma : PrefillKernel::kMmaSync;
}
}  // namespace

namespace {
// GPTOSS_PREFILL_TILE_MIN=128 (off; not yet run on a GPU, bench/NOTES.md v16 "Next"): 128-token
// route tiles on the warp-specialized kernel from 32 pairs per expert on average (the 120b's 64
// at 2048 tokens): about half the tiles, so half the weight dequantization, for padded MMA work.
bool tile_min_128() {
    static const bool v = [] {
        const char* e = std::getenv("GPTOSS_PREFILL_TILE_MIN");
        return e && std::strcmp(e, "128") == 0;
    }();
    return v;
}
}  // namespace

uint32_t gemm_prefill_tile_tokens(uint32_t n_pairs, uint32_t n_experts) {
    if (n_experts == 0) return 64u;
    const uint32_t avg = n_pairs / n_experts;
    if (avg < 128) return avg >= 32 && tile_min_128() && auto_kernel(true) == PrefillKernel::kSm90Ws ? 128u : 64u;
    return ws_wide_tiles() && auto_kernel(true) == PrefillKernel::kSm90Ws ? 256u : 128u;
}

namespace {
// Whether `kernel` runs 64-token MXFP4 tiles of up to 96 pairs (default; GPTOSS_PREFILL_TILE_EXTRA64=0: no).
bool extra64_kernel(PrefillKernel kernel) {
    return sm90_fp4_64_extra() && (kernel == PrefillKernel::kSm90 || (kernel == PrefillKernel::kSm90Ws && ws_64_uses_sm90()));
}
}  // namespace

uint32_t gemm_prefill_tile_extra(uint32_t tile_tokens) {
    if (tile_tokens == 64) return extra64_kernel(auto_kernel(true)) ? 32u : 0u;
    return tile_tokens == 256 && ws_tile_extra() != 0 ? 32u : 0u;
}

gptoss_status gemm_prefill(const GemmWeights& w, const uint16_t* x, uint32_t n_rows, const GemmRoute* route,
                           Epilogue epilogue, float* out_f32, uint16_t* out_bf16, uint32_t ldo, float swiglu_limit,
                           cudaStream_t stream, PrefillKernel kernel) {
    if (w.K == 0 || w.K % 64 != 0 || w.N == 0)
        return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: K=%u must be a positive multiple of 64, N=%u > 0", w.K, w.N);
    if (epilogue == Epilogue::kSwiglu && (w.N % 128 != 0 || !out_bf16))
        return fail(GPTOSS_ERR_INTERNAL,
                    "gemm_prefill: SwiGLU needs N %% 128 == 0 (N=%u: whole 64-element chunks of the permuted output) "
                    "and a bf16 output", w.N);
    if (epilogue != Epilogue::kSwiglu && !out_f32) return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: fp32 output missing");
    if (w.mxfp4 && !w.scales) return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: MXFP4 weights without scales");
    if (route && route->tile_tokens != 64 && route->tile_tokens != 128 && route->tile_tokens != 256)
        return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: route tiles of %u pairs, expected 64, 128 or 256",
                    route->tile_tokens);
    if (kernel == PrefillKernel::kAuto) kernel = auto_kernel(w.mxfp4);
    if (route && route->tile_extra != 0 &&
        (route->tile_extra != 32 ||
         !((route->tile_tokens == 256 && ws_tile_extra()) || (route->tile_tokens == 64 && w.mxfp4 && extra64_kernel(kernel)))))
        return fail(GPTOSS_ERR_INTERNAL,
                    "gemm_prefill: route tile_extra %u with %u-pair tiles (expected 0, or 32 with 256 and "
                    "GPTOSS_PREFILL_TILE_EXTRA set, or with 64 on the sm_90a kernels)",
                    route->tile_extra, route->tile_tokens);
    // The warp-specialized kernel's extra rows of 256-pair tiles use 32-bit element offsets.
    if (route && route->tile_extra != 0 && route->tile_tokens == 256 && uint64_t(n_rows) * w.K >= (uint64_t(1) << 31))
        return fail(GPTOSS_ERR_INTERNAL,
                    "gemm_prefill: tile_extra routes of 256-pair tiles need fewer than 2^31 input elements (%u x %u)",
                    n_rows, w.K);
    if (route && route->in_div == 0) return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: route in_div is 0");
    if ((kernel == PrefillKernel::kWgmma || kernel == PrefillKernel::kSm90 || kernel == PrefillKernel::kSm90Ws) &&
        !gemm_prefill_wgmma_supported())
        return fail(GPTOSS_ERR_UNSUPPORTED, "gemm_prefill: the wgmma kernels need an sm_90 device and sm_90a code");
    if (route && route->tile_tokens == 256 && (kernel != PrefillKernel::kSm90Ws || !w.mxfp4))
        return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: route tiles of 256 pairs need the warp-specialized MXFP4 kernel");
    const KernelArgs a = kernel_args(w, x, n_rows, route, epilogue, out_f32, out_bf16, ldo, swiglu_limit);
    const uint32_t tn = route ? route->tile_tokens : (n_rows >= 1024 ? 128u : 64u);
    const uint32_t tiles = route ? route->max_tiles : ceil_div(n_rows, tn);
    if (tiles == 0 || n_rows == 0) return GPTOSS_OK;
    const uint32_t row_tiles = ceil_div(ceil_div(w.N, 16), kSlabs);
    if (row_tiles > 65535) return fail(GPTOSS_ERR_INTERNAL, "gemm_prefill: %u row tiles exceed the grid limit", row_tiles);
    const dim3 grid(tiles, row_tiles);
    const cudaError_t err = kernel == PrefillKernel::kSm90     ? launch_prefill_sm90(a, w.mxfp4, tn, tiles, stream)
                            : kernel == PrefillKernel::kSm90Ws ? launch_prefill_ws(a, w.mxfp4, tn, tiles, stream)
                            : kernel == PrefillKernel::kWgmma  ? launch_any<true>(a, w.mxfp4, tn, grid, stream)
                                                               : launch_any<false>(a, w.mxfp4, tn, grid, stream);
    GPTOSS_TRY(cuda_status(err,
                           kernel == PrefillKernel::kSm90      ? "gemm_prefill_sm90_kernel"
                           : kernel == PrefillKernel::kSm90Ws  ? "gemm_prefill_ws_kernel"
                           : kernel == PrefillKernel::kWgmma ? "gemm_prefill_wgmma_kernel"
                                                             : "gemm_prefill_kernel",
                           __FILE__, __LINE__));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
