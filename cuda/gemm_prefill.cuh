// cuda/gemm_prefill.cuh - the pieces the prefill GEMM kernels share (gemm_prefill.cu: the
// mma.sync and register-A wgmma kernels; gemm_prefill_sm90.cu: the shared-memory-A wgmma kernel;
// gemm_prefill_ws.cu: its warp-specialized form): the CTA tile geometry (256 threads, 8 fragment
// slabs = 128 weight rows), the cp.async helpers, the token tile a CTA owns (its output rows,
// the swizzled token-row units, the expert's weights), the cp.async of one 64-k weight chunk in
// repack.cu's fragment layout (by the CTA or by one warp), the dequantization of a weight slab
// into the bf16 A tile wgmma reads, the sm_90a wgmma helpers, the epilogue of a warpgroup
// accumulator tile (bias, residual add, SwiGLU with clamp into the permuted activations,
// per-pair output rows) and the once-per-device shared-memory limit of a kernel.
#pragma once

#include "cuda/common.cuh"
#include "cuda/gemm.cuh"
#include "cuda/kernels.h"

#include <atomic>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GPTOSS_SM90A 1
#endif

namespace gptoss {
namespace cuda {
namespace gemm_detail {

constexpr int kThreads = 256;  // 8 warps: 4 over rows × 2 over tokens
constexpr int kSlabs = 8;      // 16-row fragment slabs per CTA: 128 rows

// Bytes of one 64-k chunk of the CTA's weights (8 slabs) and of their MXFP4 scales.
template <bool kFp4> constexpr uint32_t a_bytes() { return kFp4 ? kSlabs * 512 : kSlabs * 2048; }
template <bool kFp4> constexpr uint32_t s_bytes() { return kFp4 ? kSlabs * 64 : 0; }


// The token tile a CTA owns. Routed: tile blockIdx.x of the route (its expert, its pairs);
// false when the route has fewer tiles (the CTA exits). Dense: token block blockIdx.x.
// Routed callers must have waited for the router (pdl_wait) first.
struct PrefillTile {
    int expert = 0;
    uint32_t col_base = 0, n_cols = 0;
    const int32_t* pairs = nullptr;
};
// prefill_tile_at: the same for token tile `idx` (the persistent kernels' tile loop).
// (kMax: most pairs a routed tile may hold; TN + 32 for GemmRoute::tile_extra tiles.)
template <int TN, int kMax = TN>
__device__ __forceinline__ bool prefill_tile_at(const KernelArgs& args, uint32_t idx, PrefillTile* t) {
    if (args.routed) {
        const int32_t n_tiles = args.route.tiles[0];
        if (int32_t(idx) >= n_tiles) return false;
        const int32_t* ti = args.route.tiles + 1 + 3 * idx;
        t->expert = ti[0];
        t->col_base = uint32_t(ti[1]);
        t->n_cols = min(uint32_t(ti[2]), uint32_t(kMax));
        t->pairs = args.route.pairs + t->col_base;
    } else {
        t->col_base = idx * uint32_t(TN);
        t->n_cols = min(uint32_t(TN), args.n_rows - t->col_base);
    }
    return true;
}
template <int TN, int kMax = TN> __device__ __forceinline__ bool prefill_tile(const KernelArgs& args, PrefillTile* t) {
    return prefill_tile_at<TN, kMax>(args, blockIdx.x, t);
}
// The output row of tile column col: its pair (routed) or token (dense); 0 past n_cols.
__device__ __forceinline__ int32_t tile_out_row(const KernelArgs& args, const PrefillTile& t, uint32_t col) {
    return col < t.n_cols ? (args.routed ? t.pairs[col] : int32_t(t.col_base + col)) : 0;
}
// The 16-byte unit u (0..7) of chunk 0 of tile column `row`'s token row (routed: the pair's
// token) and where it goes in a stage's 128B-swizzled token tile (unit u ^ (row & 7) of row
// `row`). Columns past n_cols: src = args.x, valid false (cp.async zero-fills them).
struct TokenUnit {
    const uint16_t* src;
    uint32_t dst;
    bool valid;
};
__device__ __forceinline__ TokenUnit token_unit(const KernelArgs& args, const PrefillTile& t, uint32_t row, uint32_t u) {
    TokenUnit r;
    r.valid = row < t.n_cols;
    uint32_t src_row = 0;
    if (r.valid) src_row = args.routed ? uint32_t(t.pairs[row]) / args.route.in_div : t.col_base + row;
    r.src = r.valid ? args.x + size_t(src_row) * args.w.K + u * 8 : args.x;
    r.dst = row * 128 + ((u ^ (row & 7)) * 16);
    return r;
}
// Expert `expert`'s weight bytes (*w) and MXFP4 scale bytes (*s; nullptr for bf16).
template <bool kFp4>
__device__ __forceinline__ void expert_weights(const KernelArgs& args, int expert, const char** w, const char** s) {
    *w = static_cast<const char*>(args.w.w) + size_t(expert) * args.w.w_expert_stride;
    *s = kFp4 ? reinterpret_cast<const char*>(args.w.scales + size_t(expert) * args.w.s_expert_stride) : nullptr;
}

// The cp.async copies of one 64-k weight chunk of slabs [slab0, slab0 + 8·kM) that thread tid
// of the CTA issues (slab i's 512 / 2048 bytes at i·512 / i·2048 of the stage's
// weight area, MXFP4 scales, 64 bytes a slab, after all slabs): the sources of chunk 0 are
// worked out once, so the copy of chunk c costs one multiply-add per 16-byte unit. Slabs past
// n_slabs are skipped (their rows are never stored).
template <bool kFp4, int kM>
struct WeightCopies {
    static constexpr int kW = kFp4 ? kM : 4 * kM;           // 16-byte weight units per thread
    static constexpr uint32_t kStep = kFp4 ? 512u : 2048u;  // bytes of one slab's chunk
    const char* w[kW];
    bool w_on[kW];
    const char* s = nullptr;  // MXFP4 scales: threads tid < 32·kM
    bool s_on = false;
    __device__ __forceinline__ WeightCopies(const char* wsrc, const char* ssrc, uint32_t slab0, uint32_t n_slabs,
                                            uint32_t n_chunks, int tid) {
#pragma unroll
        for (int r = 0; r < kW; ++r) {
            const uint32_t u = uint32_t(tid + kThreads * r), slab = slab0 + (kFp4 ? u >> 5 : u >> 7);
            w_on[r] = slab < n_slabs;
            w[r] = wsrc + size_t(w_on[r] ? slab : 0u) * n_chunks * kStep + (u & (kFp4 ? 31u : 127u)) * 16;
        }
        if constexpr (kFp4) {
            const uint32_t sslab = slab0 + uint32_t(tid >> 2);
            s_on = tid < 32 * kM && sslab < n_slabs;
            s = ssrc + size_t(s_on ? sslab : 0u) * n_chunks * 64 + uint32_t(tid & 3) * 16;
        }
    }
    __device__ __forceinline__ void issue(uint32_t sa, uint32_t c, int tid) const {
#pragma unroll
        for (int r = 0; r < kW; ++r)
            if (w_on[r]) cp_async16_zfill(sa + uint32_t(tid + kThreads * r) * 16, w[r] + size_t(c) * kStep, true);
        if constexpr (kFp4)
            if (s_on) cp_async16_zfill(sa + kM * a_bytes<kFp4>() + uint32_t(tid) * 16, s + size_t(c) * 64, true);
    }
};

// cp.async of weight chunk c of kSpw slabs (sl = kSpw·warp + m, global slab0 + sl) by one warp
// into sa (slab sl's 512 / 2048 bytes at sl·512 / sl·2048; MXFP4 scales, 64 bytes a slab, at
// sa + a_bytes by lanes 0..4·kSpw-1), so the lanes that dequantize a slab loaded it.
// The sources of chunk 0 are worked out once: the copy of chunk c costs one multiply-add per
// 16-byte unit.
template <bool kFp4, int kSpw>
struct WarpSlabCopies {
    static constexpr int kU = kFp4 ? 1 : 4;               // 16-byte units per slab per lane
    static constexpr uint32_t kStep = kFp4 ? 512u : 2048u;  // bytes of one slab's chunk
    const char* w[kSpw];
    uint32_t on = 0;  // bit m: slab kSpw·warp + m exists; bit kSpw: this lane copies scales
    const char* s = nullptr;
    __device__ __forceinline__ WarpSlabCopies(const char* wsrc, const char* ssrc, uint32_t slab0, uint32_t n_slabs,
                                              uint32_t n_chunks, int warp, int lane) {
#pragma unroll
        for (int m = 0; m < kSpw; ++m) {
            const uint32_t slab = slab0 + uint32_t(kSpw * warp + m);
            const bool v = slab < n_slabs;
            on |= v ? 1u << m : 0u;
            w[m] = wsrc + size_t(v ? slab : 0u) * n_chunks * kStep + uint32_t(lane) * 16;
        }
        if constexpr (kFp4) {
            const uint32_t slab = slab0 + uint32_t(kSpw * warp + (lane >> 2));
            const bool v = lane < 4 * kSpw && slab < n_slabs;
            on |= v ? 1u << kSpw : 0u;
            s = ssrc + size_t(v ? slab : 0u) * n_chunks * 64 + uint32_t(lane & 3) * 16;
        }
    }
    __device__ __forceinline__ void issue(uint32_t sa, uint32_t c, int warp, int lane) const {
#pragma unroll
        for (int m = 0; m < kSpw; ++m) {
            if (!(on >> m & 1u)) continue;
            const uint32_t sl = uint32_t(kSpw * warp + m);
#pragma unroll
            for (int j = 0; j < kU; ++j)
                cp_async16_zfill(sa + sl * kStep + uint32_t(j * 512 + lane * 16), w[m] + size_t(c) * kStep + j * 512, true);
        }
        if constexpr (kFp4)
            if (on >> kSpw & 1u)
                cp_async16_zfill(sa + a_bytes<kFp4>() + uint32_t(kSpw * warp + (lane >> 2)) * 64 + uint32_t(lane & 3) * 16,
                                 s + size_t(c) * 64, true);
    }
};

// One warp's WarpSlabCopies of chunk c, the sources worked out for this call only.
template <bool kFp4, int kSpw>
__device__ __forceinline__ void load_warp_slabs(uint32_t sa, const char* wsrc, const char* ssrc, uint32_t slab0,
                                                uint32_t n_slabs, uint32_t n_chunks, uint32_t c, int warp, int lane) {
    WarpSlabCopies<kFp4, kSpw>(wsrc, ssrc, slab0, n_slabs, n_chunks, warp, lane).issue(sa, c, warp, lane);
}

// This lane's MXFP4 words of slab sl of a landed 64-k chunk (at sa in WeightCopies' layout: 512
// bytes of fragment words per slab, then from kA on 64 bytes of scale words per slab): v[0], and
// rows g / g + 8's scale words in v[1].x / .y.
template <uint32_t kA>
__device__ __forceinline__ Chunk staged_chunk(const unsigned char* sa, int sl, int lane) {
    Chunk ch;
    ch.v[0] = *reinterpret_cast<const uint4*>(sa + sl * 512 + lane * 16);
    const uint2 s = *reinterpret_cast<const uint2*>(sa + kA + sl * 64 + (lane >> 2) * 8);
    ch.v[1].x = s.x;
    ch.v[1].y = s.y;
    return ch;
}

// The mma A fragments of the 4 k16 steps of slab sl of a landed chunk: fragment<true> of
// staged_chunk for MXFP4, the bf16 fragment words (2 KB a slab) as they are otherwise.
template <bool kFp4, uint32_t kA>
__device__ __forceinline__ void staged_a_fragments(const unsigned char* sa, int sl, int lane, uint32_t (&a)[4][4]) {
    if constexpr (kFp4) {
        const Chunk ch = staged_chunk<kA>(sa, sl, lane);
#pragma unroll
        for (int j = 0; j < 4; ++j) fragment<true>(ch, j, a[j]);
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint4 v = *reinterpret_cast<const uint4*>(sa + sl * 2048 + j * 512 + lane * 16);
            a[j][0] = v.x; a[j][1] = v.y; a[j][2] = v.z; a[j][3] = v.w;
        }
    }
}

// One warp turns slab sl of a landed 64-k weight chunk (at sa in WeightCopies' layout,
// scales at sa + kA) into bf16 rows 16·sl + g and + 8 of the A tile at ab (128 bytes a row, the
// activations' permuted k order, 16-byte units XOR-swizzled by row: wgmma's 128B-swizzle K-major
// layout). Fragment regs 0 / 2 are row g at k 2t.. / 2t+8.. of k16 step j: permuted positions
// 16t + 4j + {0,1} / {2,3}; regs 1 / 3 the same for row g + 8 (two 16-byte stores a row).
template <bool kFp4, uint32_t kA>
__device__ __forceinline__ void store_a_slab(unsigned char* ab, const unsigned char* sa, int sl, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const uint32_t u0 = (uint32_t(2 * t) ^ uint32_t(g)) * 16, u1 = (uint32_t(2 * t + 1) ^ uint32_t(g)) * 16;
    uint32_t a[4][4];
    staged_a_fragments<kFp4, kA>(sa, sl, lane, a);
    const uint32_t a_lo = uint32_t(sl * 16 + g) * 128, a_hi = a_lo + 8 * 128;
    *reinterpret_cast<uint4*>(ab + a_lo + u0) = make_uint4(a[0][0], a[0][2], a[1][0], a[1][2]);
    *reinterpret_cast<uint4*>(ab + a_lo + u1) = make_uint4(a[2][0], a[2][2], a[3][0], a[3][2]);
    *reinterpret_cast<uint4*>(ab + a_hi + u0) = make_uint4(a[0][1], a[0][3], a[1][1], a[1][3]);
    *reinterpret_cast<uint4*>(ab + a_hi + u1) = make_uint4(a[2][1], a[2][3], a[3][1], a[3][3]);
}

#ifdef GPTOSS_SM90A
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to the
// async proxy (wgmma operand reads); a barrier must follow before another thread's wgmma.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Keeps the compiler from moving accumulator reads/writes across an asynchronous wgmma.
template <int N> __device__ __forceinline__ void acc_fence(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Shared-memory matrix descriptor: K-major, 128-byte swizzle (16-byte unit u of row r at
// u XOR (r & 7), 1 KB-aligned atoms of 8 rows), 1024 bytes between 8-row groups; saddr advanced
// by 32 bytes per k16 step inside the 128-byte row.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr) {
    return uint64_t((saddr & 0x3FFFFu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
// For a shared address a (< 256 KB, 16-byte aligned) sw128_desc(a) is sw128_desc(0) + a / 16 and
// its high word is constant: the main loops keep a descriptor's low word and move it with its
// address by 32-bit adds (desc_of_lo(uint32_t(sw128_desc(a)) + off / 16) == sw128_desc(a + off)).
__device__ __forceinline__ uint64_t desc_of_lo(uint32_t lo) {
    return (sw128_desc(0u) & 0xFFFFFFFF00000000ull) | lo;
}
// wgmma m64nNk16, A and B by shared-memory descriptor, bf16 → fp32.
__device__ __forceinline__ void wgmma_ss_m64n128k16(float (&d)[64], uint64_t adesc, uint64_t bdesc, uint32_t acc_in) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(adesc), "l"(bdesc), "r"(acc_in));
}
__device__ __forceinline__ void wgmma_ss_m64n64k16(float (&d)[32], uint64_t adesc, uint64_t bdesc, uint32_t acc_in) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(adesc), "l"(bdesc), "r"(acc_in));
}
// wgmma m64n256k16 (A and B by descriptor, bf16 → fp32): d[4n + ..] is n8 block n of 32, so
// d[0..63] and d[64..127] are exactly the accumulators of two m64n128k16 on B rows 0..127 and
// 128..255 (B rows 128.. at bdesc + 16 KB in the sw128 layout).
__device__ __forceinline__ void wgmma_ss_m64n256k16(float (&d)[128], uint64_t adesc, uint64_t bdesc, uint32_t acc_in) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(adesc), "l"(bdesc), "r"(acc_in));
}
// wgmma m64n32k16 (as m64n64k16 on 32 B rows): the tile_extra columns 256..287.
__device__ __forceinline__ void wgmma_ss_m64n32k16(float (&d)[16], uint64_t adesc, uint64_t bdesc, uint32_t acc_in) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(adesc), "l"(bdesc), "r"(acc_in));
}
// d = A·B (+ d when acc_in != 0).
template <int TN>
__device__ __forceinline__ void wgmma_ss(float (&d)[TN / 2], uint64_t adesc, uint64_t bdesc, uint32_t acc_in) {
    if constexpr (TN == 128) wgmma_ss_m64n128k16(d, adesc, bdesc, acc_in);
    else wgmma_ss_m64n64k16(d, adesc, bdesc, acc_in);
}
#endif

// The residual add (the O projection's kAdd) of one warp's rows r_lo and r_hi over the columns
// col0 + 8·nt + 2t + ci (nt < kNT, ci < 2): o[row] += acc + bias, acc(nt, ci) for row r_lo and
// acc(nt, 2 + ci) for r_hi. The compiler cannot move a column's load above the previous column's
// store (their rows might alias), so a plain loop pays one L2/DRAM round trip per column (~36 µs
// per 128-token tile, half of the 20b's O GEMM: bench/NOTES.md "v19 prefill O epilogue"): columns
// in groups of kG, loads then stores. Output rows are distinct (one per token): the same bits.
template <int kNT, int kG, class Acc>
__device__ __forceinline__ void add_residual_columns(const KernelArgs& args, uint32_t col0, int t, uint32_t n_cols,
                                                     const int32_t* out_rows, uint32_t r_lo, uint32_t r_hi,
                                                     float b_lo, float b_hi, Acc acc) {
    static_assert((2 * kNT) % kG == 0, "whole column groups");
    const uint32_t N = args.w.N;
#pragma unroll
    for (int i0 = 0; i0 < 2 * kNT; i0 += kG) {
        float old_lo[kG], old_hi[kG];
#pragma unroll
        for (int i = 0; i < kG; ++i) {
            const uint32_t col = col0 + uint32_t(((i0 + i) >> 1) * 8 + 2 * t + ((i0 + i) & 1));
            const float* o = args.out_f32 + size_t(col < n_cols ? out_rows[col] : 0) * args.ldo;
            old_lo[i] = col < n_cols && r_lo < N ? o[r_lo] : 0.0f;
            old_hi[i] = col < n_cols && r_hi < N ? o[r_hi] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < kG; ++i) {
            const int nt = (i0 + i) >> 1, ci = (i0 + i) & 1;
            const uint32_t col = col0 + uint32_t(nt * 8 + 2 * t + ci);
            if (col >= n_cols) continue;
            float* o = args.out_f32 + size_t(out_rows[col]) * args.ldo;
            if (r_lo < N) o[r_lo] = old_lo[i] + (acc(nt, ci) + b_lo);
            if (r_hi < N) o[r_hi] = old_hi[i] + (acc(nt, 2 + ci) + b_hi);
        }
    }
}

// Epilogue of one warp's part of a wgmma accumulator tile m64nTN: the warp holds fragment slab
// `slab` (global index): rows slab·16 + g and + 8, columns 8n + 2t and + 1 of each n8 block n
// (acc[4n + ci] row g, acc[4n + 2 + ci] row g + 8). Columns >= n_cols are skipped; column col
// writes output row out_rows[col]. kAddPath: whether the kAdd epilogue (dense O only) is compiled
// in; the MXFP4 kernels pass false and keep its registers.
template <int TN, bool kAddPath = true>
__device__ __forceinline__ void store_wg_tile(const KernelArgs& args, int expert, uint32_t slab, const float (&acc)[TN / 2],
                                              uint32_t n_cols, const int32_t* out_rows, int g, int t) {
    const uint32_t N = args.w.N;
    const float* bias = args.w.bias ? args.w.bias + size_t(expert) * args.w.bias_expert_stride : nullptr;
    const uint32_t r_lo = slab * 16 + uint32_t(g), r_hi = r_lo + 8;
    const float b_lo = bias && r_lo < N ? bias[r_lo] : 0.0f;
    const float b_hi = bias && r_hi < N ? bias[r_hi] : 0.0f;
    if (kAddPath && args.epilogue == int(Epilogue::kAdd)) {
        // 4 keeps the 64-register persistent 64-token form unspilled
        add_residual_columns<TN / 8, TN >= 128 ? 8 : 4>(args, 0, t, n_cols, out_rows, r_lo, r_hi, b_lo, b_hi,
                                                        [&](int nt, int e) { return acc[4 * nt + e]; });
        return;
    }
#pragma unroll
    for (int nt = 0; nt < TN / 8; ++nt) {
#pragma unroll
        for (int ci = 0; ci < 2; ++ci) {
            const uint32_t col = uint32_t(nt * 8 + 2 * t + ci);
            if (col >= n_cols) continue;
            const uint32_t out_row = uint32_t(out_rows[col]);
            const float lo = acc[4 * nt + ci], hi = acc[4 * nt + 2 + ci];
            if (args.epilogue == int(Epilogue::kSwiglu)) {
                float gate = lo + b_lo;
                float up = hi + b_hi;
                const float y = swiglu_clamped(gate, up, args.limit);
                const uint32_t j = slab * 8 + uint32_t(g);
                args.out_bf16[size_t(out_row) * args.ldo + permuted_k(j)] = f32_to_bf16_bits(y);
            } else {
                float* o = args.out_f32 + size_t(out_row) * args.ldo;
                const bool add = args.epilogue == int(Epilogue::kAdd);  // only where !kAddPath
                if (r_lo < N) o[r_lo] = add ? o[r_lo] + (lo + b_lo) : lo + b_lo;
                if (r_hi < N) o[r_hi] = add ? o[r_hi] + (hi + b_hi) : hi + b_hi;
            }
        }
    }
}

// Raises `kernel`'s dynamic shared memory limit to `bytes` on the current device, once per device
// (`configured`: one bit per device, the caller's static).
template <class Kernel>
cudaError_t set_smem_once(Kernel kernel, uint32_t bytes, std::atomic<uint64_t>& configured) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const uint64_t bit = dev < 64 ? (uint64_t(1) << dev) : 0;
    if (!bit || !(configured.load() & bit)) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
        if (err != cudaSuccess) return err;
        configured.fetch_or(bit);
    }
    return cudaSuccess;
}

// Launches gemm_prefill_sm90.cu's kernel (MXFP4 when fp4, else bf16; tn = 64 or 128 tokens per
// tile) over token_tiles × its own row tiles; gemm_prefill() checked the arguments. Needs sm_90a.
cudaError_t launch_prefill_sm90(const KernelArgs& a, bool fp4, uint32_t tn, uint32_t token_tiles, cudaStream_t stream);
// Launches gemm_prefill_ws.cu's warp-specialized kernel (same arguments, same bits as
// launch_prefill_sm90). Needs sm_90a.
cudaError_t launch_prefill_ws(const KernelArgs& a, bool fp4, uint32_t tn, uint32_t token_tiles, cudaStream_t stream);
// gemm_prefill_tile_extra: 64-pair MXFP4 route tiles take up to 96 pairs on launch_prefill_sm90's
// kernel (default; not with GPTOSS_SM90_TALL=1 or GPTOSS_SM90_64C=3; GPTOSS_PREFILL_TILE_EXTRA64=0
// turns it off).
bool sm90_fp4_64_extra();
// Whether launch_prefill_ws sends 64-token tiles to launch_prefill_sm90 (its variants 7 to 12,
// unless GPTOSS_SM90_WS_64 picks the persistent kernel).
bool ws_64_uses_sm90();
// GPTOSS_PREFILL_TILE_EXTRA (gemm_prefill_tile_extra): 0 off; 2 = 32 (refill lag 2), 1 = 33 (lag 1).
// Only with variant 12 (the default); 256-pair MXFP4 tiles then take up to 288 pairs.
int ws_tile_extra();
// Whether launch_prefill_ws's variant (GPTOSS_SM90_WS_VARIANT 10, 11) wants 256-token MXFP4 route
// tiles (gemm_prefill_tile_tokens); tn = 256 is MXFP4 only.
bool ws_wide_tiles();

}  // namespace gemm_detail
}  // namespace cuda
}  // namespace gptoss
