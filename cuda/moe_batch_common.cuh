// cuda/moe_batch_common.cuh - the device helpers the batched step's two routed MXFP4 kernels share
// (moe_decode_batch.cu's moe_batch_kernel: one warp per (tile, slab) item; moe_spread_batch.cu's
// kernel for steps of a few tokens: a slab's K parts split between warps): the ring's first
// requests, one chunk's mma for 1-2 groups of 8 columns, a slab's chunk chain (optionally summed
// per K part), the route tile, the activation-row staging and the epilogue. Keeping them in one
// place keeps the two kernels' arithmetic, and so their bits, the same.
#pragma once

#include "cuda/common.cuh"
#include "cuda/gemm.cuh"

namespace gptoss {
namespace cuda {
namespace moe_batch_detail {
using namespace gemm_detail;

// Points this lane at slab `slab` of `expert` and requests its first D chunks into the ring.
template <int D>
__device__ __forceinline__ void ring_begin(const KernelArgs& a, int expert, uint32_t slab, uint32_t n_chunks,
                                           Chunk (&ring)[D], const uint4** wp, const uint2** sp) {
    slab_pointers<true>(a.w, expert, slab, n_chunks, int(threadIdx.x & 31), wp, sp);
#pragma unroll
    for (int i = 0; i < D; ++i)
        if (uint32_t(i) < n_chunks) load_chunk<true>(ring[i], *wp, *sp, uint32_t(i));
}

// One chunk for G 8-column groups: this lane's B fragments of chunk c from shared memory, the
// 4 k16 steps (even steps into chain 0, odd into chain 1) on the dequantized fragments of `ch`.
template <int G>
__device__ __forceinline__ void chunk_mma(const Chunk& ch, const uint4* xl, uint32_t xg8, uint32_t c,
                                          float (&a2)[G][2][4]) {
    uint4 b[G][2];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        b[g][0] = xl[g * xg8 + c * 8];
        b[g][1] = xl[g * xg8 + c * 8 + 1];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        uint32_t af[4];
        fragment<true>(ch, j, af);
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const uint4 bb = b[g][j >> 1];
            mma(a2[g][j & 1], af, (j & 1) ? bb.z : bb.x, (j & 1) ? bb.w : bb.y);
        }
    }
}

// The n_chunks chunks of one slab for G 8-column groups: ring[i] holds chunk i on entry; xl: this
// lane's activation fragments in shared memory (column g of group 0; group 1 is 8 rows below, xg8
// uint4 further). acc[g] = the slab's sum: chunks in order, k16 steps 0, 2 into one chain and 1, 3
// into another, the two added at the end (even + odd). While every chunk of a round of D has its
// successor (c + D) in the slab, the round runs without bound tests, its loads at immediate offsets
// from one pointer per round (SASS, sm_90a: ~5-8 fewer instructions per chunk, bench/NOTES.md
// "v37"); the last rounds test each chunk. The order of the chunks and of the mma is the same.
// kParts (part_len > 0 chunks per part, moe_batch_part_len): the sum per part (its chunks from
// zero, even + odd at the part's end), the parts added left to right — the order
// moe_spread_batch.cu's kernel keeps when it splits a slab's parts between warps. The running sum
// lives in shared memory (tot: this lane's 4·G floats at a stride of 32, kTotFloatsPerWarp per
// warp), not in registers: at 24 warps per SM every register is taken.
template <int D, int G, bool kParts = false>
__device__ __forceinline__ void chain(Chunk (&ring)[D], const uint4* wp, const uint2* sp, uint32_t n_chunks,
                                      const uint4* xl, uint32_t xg8, float (&acc)[2][4], uint32_t part_len = 0,
                                      float* tot = nullptr) {
    float a2[G][2][4];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int h = 0; h < 2; ++h) a2[g][h][0] = a2[g][h][1] = a2[g][h][2] = a2[g][h][3] = 0.0f;
    uint32_t part_end = kParts ? min(part_len, n_chunks) : n_chunks;  // the current part's end
    // kParts: the part's sum into tot after its last chunk (the first part: part_end <= part_len).
    // tot as a 32-bit shared-memory address: one register fewer than the pointer.
    const uint32_t tot_s = kParts ? uint32_t(__cvta_generic_to_shared(tot)) : 0u;
    const auto fold = [&] {
        const bool first = part_end <= part_len;
        part_end = min(part_end + part_len, n_chunks);
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float s = __fadd_rn(a2[g][0][e], a2[g][1][e]);
                const uint32_t at = tot_s + 128u * uint32_t(4 * g + e);
                float v = s;
                if (!first) {
                    float old;
                    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(old) : "r"(at));
                    v = __fadd_rn(old, s);
                }
                asm volatile("st.shared.f32 [%0], %1;" ::"r"(at), "f"(v) : "memory");
                a2[g][0][e] = a2[g][1][e] = 0.0f;
            }
    };
    for (uint32_t base = 0; base < n_chunks; base += D) {
        if (base + 2 * D <= n_chunks) {  // every chunk's successor exists: no tests
            const uint4* w = wp + size_t(base + D) * 32;
            const uint2* s = sp + size_t(base + D) * 8;
            if (!kParts || part_end > base + D) {  // no part ends in this round
#pragma unroll
                for (int i = 0; i < D; ++i) {
                    chunk_mma<G>(ring[i], xl, xg8, base + i, a2);
                    load_chunk<true>(ring[i], w, s, uint32_t(i));
                }
            } else {
#pragma unroll
                for (int i = 0; i < D; ++i) {
                    chunk_mma<G>(ring[i], xl, xg8, base + i, a2);
                    load_chunk<true>(ring[i], w, s, uint32_t(i));
                    if (base + i + 1 == part_end) fold();
                }
            }
            continue;
        }
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const uint32_t c = base + i;
            if (c >= n_chunks) break;
            chunk_mma<G>(ring[i], xl, xg8, c, a2);
            if (c + D < n_chunks) load_chunk<true>(ring[i], wp, sp, c + D);
            if (kParts && c + 1 == part_end) fold();
        }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        if constexpr (kParts) {
            asm volatile("ld.shared.f32 %0, [%1];" : "=f"(acc[0][e]) : "r"(tot_s + 128u * uint32_t(e)));
            if (G > 1)
                asm volatile("ld.shared.f32 %0, [%1];" : "=f"(acc[1][e]) : "r"(tot_s + 128u * uint32_t(4 * (G - 1) + e)));
            else
                acc[1][e] = 0.0f;
        } else {
            acc[0][e] = __fadd_rn(a2[0][0][e], a2[0][1][e]);
            acc[1][e] = G > 1 ? __fadd_rn(a2[G - 1][0][e], a2[G - 1][1][e]) : 0.0f;  // G == 1: never stored
        }
    }
}

// The epilogue of one (tile, slab) from this lane's sums: lane (g, t) holds rows slab·16 + g and
// + 8 of columns 8·gi + 2t and + 1 (mma C layout). SwiGLU: row g is the gate, row g + 8 the up
// projection of intermediate slab·8 + g (repack.cu's interleave, as gemm.cu's epilogue).
__device__ __forceinline__ void store_tile(const KernelArgs& a, int expert, uint32_t slab, const int32_t* pairs,
                                           uint32_t n_cols, const float (&acc)[2][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float* bias = a.w.bias ? a.w.bias + size_t(expert) * a.w.bias_expert_stride : nullptr;
    const uint32_t r_lo = slab * 16 + g, r_hi = r_lo + 8;
    const float b_lo = bias && r_lo < a.w.N ? bias[r_lo] : 0.0f, b_hi = bias && r_hi < a.w.N ? bias[r_hi] : 0.0f;
#pragma unroll
    for (int gi = 0; gi < 2; ++gi)
#pragma unroll
        for (int ci = 0; ci < 2; ++ci) {
            const uint32_t col = uint32_t(gi * 8 + 2 * t + ci);
            if (col >= n_cols) continue;
            const uint32_t out_row = uint32_t(pairs[col]);
            if (a.epilogue == int(Epilogue::kSwiglu)) {
                float gate = acc[gi][ci] + b_lo;
                float up = acc[gi][2 + ci] + b_hi;
                const float y = swiglu_clamped(gate, up, a.limit);
                a.out_bf16[size_t(out_row) * a.ldo + permuted_k(slab * 8 + g)] = f32_to_bf16_bits(y);
            } else {
                float* o = a.out_f32 + size_t(out_row) * a.ldo;
                if (r_lo < a.w.N) o[r_lo] = acc[gi][ci] + b_lo;
                if (r_hi < a.w.N) o[r_hi] = acc[gi][2 + ci] + b_hi;
            }
        }
}

// Route tile `tile`: its expert, its pairs and how many (<= 16).
struct TileRef {
    int expert;
    const int32_t* pairs;
    uint32_t n_cols;
};
__device__ __forceinline__ TileRef tile_ref(const KernelArgs& a, uint32_t tile) {
    const int32_t* ti = a.route.tiles + 1 + 3 * tile;
    return TileRef{ti[0], a.route.pairs + ti[1], uint32_t(ti[2])};
}

// The whole CTA requests tile `tr`'s activation rows into buf ([16][xstride] uint4: 8 rows for a
// tile of <= 8 pairs, 16 above; rows past n_cols zeroed); the caller waits and meets the barrier.
__device__ __forceinline__ void stage_rows(const KernelArgs& a, const TileRef& tr, uint4* buf, uint32_t xstride) {
    const uint32_t kq = a.w.K / 8, rows = tr.n_cols > 8 ? 16u : 8u;
    const uint4* x = reinterpret_cast<const uint4*>(a.x);
    for (uint32_t u = threadIdx.x; u < rows * kq; u += blockDim.x) {
        const uint32_t c = u / kq, q = u - c * kq;
        uint4* dst = buf + size_t(c) * xstride + q;
        if (c < tr.n_cols) cp_async16(dst, x + size_t(uint32_t(tr.pairs[c]) / a.route.in_div) * kq + q);
        else *dst = make_uint4(0, 0, 0, 0);
    }
}

// Shared-memory floats per warp for chain's kParts running sums (4 values × 2 groups × 32 lanes).
constexpr uint32_t kTotFloatsPerWarp = 4 * 2 * 32;

}  // namespace moe_batch_detail
}  // namespace cuda
}  // namespace gptoss
