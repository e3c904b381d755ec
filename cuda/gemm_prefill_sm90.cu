// cuda/gemm_prefill_sm90.cu - the prefill GEMM on sm_90a with both wgmma operands in shared
// memory: the same product, tile (128 weight rows × TN = 64 or 128 tokens, 256 threads), tile
// scheduler and epilogues as gemm_prefill.cu's kernels, for the grouped MXFP4 expert GEMMs and
// the dense bf16 projections (the default prefill GEMM on sm_90a, GPTOSS_GEMM_SM90).
// Pipeline: an S-deep cp.async ring of 64-k chunks, each stage the TN token rows (128 bytes in
// the activations' permuted k order, 16-byte units XOR-swizzled by row = the 128-byte-swizzle
// K-major layout wgmma reads) and the CTA's 8 weight slabs in repack.cu's fragment layout. Per
// chunk, warp i turns slab i into bf16 ONCE (MXFP4 dequantized with gemm.cuh fragment(), bf16
// copied) and stores it into a double-buffered A tile of 128 rows × 64 k in the same permuted k
// order and the same swizzle: lane (g, t)'s four k16 fragments are exactly permuted positions
// 16t..16t+15 of rows g and g+8 (two 16-byte stores per row, conflict-free). Both operands then
// agree on the k order, so the sum over k is complete; only its order differs from the mma.sync
// kernel's. Warpgroup w (warps 4w..4w+3, which wrote rows 64w..64w+63) syncs on its own named
// barrier and issues 4 wgmma m64nTNk16 (A and B by descriptor), keeping one group in flight
// while the next chunk is dequantized; a stage is refilled two chunks after its use. kM = 2
// (GPTOSS_SM90_TALL=1, MXFP4 only): 256 rows per CTA, two m64 sub-tiles per warpgroup. 64-token
// MXFP4 route tiles may hold up to 96 pairs (tile_extra, the default): the 32 extra columns get
// one wgmma m64n32k16 more per k16 step, so an expert of 65..96 pairs is dequantized once.
// Chunk invariance: each output accumulates chunk by chunk, k16 step by step in one accumulator,
// for TN = 64 and 128 alike, so a token's bits do not depend on the chunk, tile or pair order —
// as long as every prefill GEMM of a kind uses this kernel (gemm_prefill's switch is global).
#include "cuda/gemm_prefill.cuh"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace gptoss {
namespace cuda {
namespace gemm_detail {
namespace {

// kM = m64 sub-tiles per warpgroup: the CTA covers 128·kM weight rows (8·kM fragment slabs).
template <int kM> constexpr uint32_t abuf_bytes() { return kM * kSlabs * 16 * 128; }  // bf16 A tile of a chunk
template <bool kFp4, int kM> constexpr uint32_t raw_bytes() { return kM * (a_bytes<kFp4>() + s_bytes<kFp4>()); }
// One stage: token rows first (1 KB-aligned swizzle atoms), then weights and scales; 1 KB-padded.
template <bool kFp4, int TN, int kM> constexpr uint32_t sm90_stage_bytes() {
    return (TN * 128 + raw_bytes<kFp4, kM>() + 1023u) & ~1023u;
}
// CTAs per SM: 1, or 2 for kM = 1, TN = 64 (3 with GPTOSS_SM90_64C=3: kC3).
template <bool kFp4, int TN, int kM, bool kC3 = false> constexpr int sm90_ctas() {
    return kM == 1 && TN == 64 ? (kC3 ? 3 : 2) : 1;
}
// Ring depth: as deep as 227 KB (1 CTA/SM) or half / a third of the SM (TN = 64) allow.
// kX (GemmRoute::tile_extra, 32 with TN = 64): 96 token rows a stage, 4 stages at 2 CTAs/SM.
template <bool kFp4, int TN, int kM, bool kC3 = false, int kX = 0> constexpr int sm90_stages() {
    if constexpr (kX != 0) return 4;
    if constexpr (kC3) return 3;
    if constexpr (kM == 1) return kFp4 ? (TN == 128 ? 8 : 6) : (TN == 128 ? 5 : 3);
    constexpr int fit = int((232448u - 1024u - 2 * abuf_bytes<kM>() - TN * 4) / sm90_stage_bytes<kFp4, TN, kM>());
    return fit < 8 ? fit : 8;
}
template <bool kFp4, int TN, int kM, bool kC3 = false, int kX = 0> constexpr uint32_t sm90_smem_bytes() {
    return 1024 + 2 * abuf_bytes<kM>() +
           sm90_stages<kFp4, TN, kM, kC3, kX>() * sm90_stage_bytes<kFp4, TN + kX, kM>() + (TN + kX) * 4;
}
template <bool kFp4, int TN, int kM, bool kC3 = false, int kX = 0> constexpr bool sm90_fits() {
    return sm90_stages<kFp4, TN, kM, kC3, kX>() >= 3 &&
           (sm90_smem_bytes<kFp4, TN, kM, kC3, kX>() + 1024) * sm90_ctas<kFp4, TN, kM, kC3>() <= 233472 &&
           sm90_smem_bytes<kFp4, TN, kM, kC3, kX>() <= 232448;
}
static_assert(sm90_fits<true, 128, 1>() && sm90_fits<true, 64, 1>() && sm90_fits<false, 128, 1>() &&
                  sm90_fits<false, 64, 1>() && sm90_fits<true, 128, 2>() && sm90_fits<true, 64, 2>() &&
                  sm90_fits<true, 64, 1, true>() && sm90_fits<true, 64, 1, false, 32>(),
              "shared memory");

// kX (GemmRoute::tile_extra: 0, or 32 with TN = 64, kM = 1): a tile may hold TN + kX pairs;
// columns TN.. go through one more wgmma m64n32k16 per k16 step on the same A chunk (their own
// accumulator, the same k order, so the same bits), so an expert of up to 96 pairs (the 120b's
// ~64 a 2048-token chunk) dequantizes its weights once instead of twice.
template <bool kFp4, int TN, int kM, bool kC3, int kX>
__global__ __launch_bounds__(kThreads, (sm90_ctas<kFp4, TN, kM, kC3>())) void gemm_prefill_sm90_kernel(const KernelArgs args) {
#ifdef GPTOSS_SM90A
    extern __shared__ unsigned char smem_raw[];
    static_assert(kX == 0 || (kX == 32 && TN == 64 && kM == 1 && kFp4), "tile_extra: 32 on 64-token MXFP4 tiles");
    constexpr int TNB = TN + kX;  // token rows a stage
    constexpr int S = sm90_stages<kFp4, TN, kM, kC3, kX>();
    constexpr uint32_t kA = kM * a_bytes<kFp4>(), kBst = TNB * 128, kStage = sm90_stage_bytes<kFp4, TNB, kM>();
    constexpr uint32_t kABuf = abuf_bytes<kM>();
    constexpr int kBUnits = TNB / 32;  // 16-byte token units per thread per chunk
    const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t K = args.w.K, N = args.w.N, n_chunks = K >> 6;
    const uint32_t n_slabs = (N + 15) >> 4, slab0 = blockIdx.y * (kSlabs * kM);
    const uint32_t raw_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw_base + 1023u) & ~1023u;  // the swizzle atoms are 1 KB aligned
    unsigned char* smem = smem_raw + (base - raw_base);
    const uint32_t st_base = base + 2 * kABuf;
    int32_t* out_rows = reinterpret_cast<int32_t*>(smem + 2 * kABuf + S * kStage);

    if (args.routed) pdl_wait();
    PrefillTile tile;
    if (!prefill_tile<TN, TNB>(args, &tile)) return;
    const int expert = tile.expert;
    const uint32_t n_cols = tile.n_cols;

    const char *wsrc, *ssrc;
    expert_weights<kFp4>(args, expert, &wsrc, &ssrc);
    const WeightCopies<kFp4, kM> wcopy(wsrc, ssrc, slab0, n_slabs, n_chunks, tid);
    auto load_a = [&](uint32_t stage, uint32_t c) { wcopy.issue(st_base + stage * kStage + kBst, c, tid); };
    if (!args.routed) {
#pragma unroll
        for (int s = 0; s < S - 2; ++s)
            if (uint32_t(s) < n_chunks) load_a(uint32_t(s), uint32_t(s));
        pdl_wait();
    }

    // Token rows: this thread copies unit (tid & 7) of rows tid / 8 + 32 i; columns past n_cols
    // are zero-filled (their source stays at args.x: a step of 0 bytes a chunk).
    if (tid < TNB) out_rows[tid] = tile_out_row(args, tile, uint32_t(tid));
    const char* bsrc[kBUnits];
    uint32_t bstep[kBUnits], bdst[kBUnits];  // bstep 0: an invalid row (zero-filled)
#pragma unroll
    for (int i = 0; i < kBUnits; ++i) {
        const TokenUnit tu = token_unit(args, tile, uint32_t(tid >> 3) + 32u * i, uint32_t(tid & 7));
        bsrc[i] = reinterpret_cast<const char*>(tu.src);
        bstep[i] = tu.valid ? 128u : 0u;
        bdst[i] = tu.dst;
    }
    auto load_b = [&](uint32_t stage, uint32_t c) {
        const uint32_t sb = st_base + stage * kStage;
#pragma unroll
        for (int i = 0; i < kBUnits; ++i) cp_async16_zfill(sb + bdst[i], bsrc[i] + size_t(c) * bstep[i], bstep[i] != 0);
    };
    if (args.routed) {
#pragma unroll
        for (int s = 0; s < S - 2; ++s)
            if (uint32_t(s) < n_chunks) load_a(uint32_t(s), uint32_t(s));
    }
#pragma unroll
    for (int s = 0; s < S - 2; ++s) {
        if (uint32_t(s) < n_chunks) load_b(uint32_t(s), uint32_t(s));
        cp_async_commit();
    }
    pdl_launch_dependents();

    float acc[kM][TN / 2];  // the first wgmma overwrites it
    float acc_x[16];  // tile_extra columns TN.. (kX = 32; unused, so not allocated, without)
    // Descriptor low words of this warpgroup's A rows in A buffer 0 and of stage 0's token rows.
    const uint32_t a_lo0 = uint32_t(sw128_desc(base + uint32_t(wg) * (kABuf / 2)));
    const uint32_t b_lo0 = uint32_t(sw128_desc(st_base));
    // The main loop, kE: with the tile_extra columns (a whole loop of its own: a branch between
    // the wgmmas makes ptxas serialize them).
    auto main_loop = [&](auto with_extra) {
        constexpr bool kE = decltype(with_extra)::value;
        uint32_t st = 0, st_fill = S - 2;  // ring stages of chunk c and of chunk c + S - 2
        for (uint32_t c = 0; c < n_chunks; ++c) {
            cp_async_wait<S - 3>();
            fence_proxy_async();  // the token rows this thread copied → visible to wgmma
            __syncthreads();      // chunk c landed for all; groups of chunk c - 2 are complete
            if (c + S - 2 < n_chunks) {
                load_a(st_fill, c + S - 2);
                load_b(st_fill, c + S - 2);
            }
            cp_async_commit();

            // Warp i: slabs i·kM .. i·kM + kM - 1 of chunk c → bf16 A rows, permuted k order.
            const unsigned char* sa = smem + 2 * kABuf + st * kStage + kBst;
            unsigned char* ab = smem + (c & 1) * kABuf;
#pragma unroll
            for (int m = 0; m < kM; ++m) store_a_slab<kFp4, kA>(ab, sa, warp * kM + m, lane);
            fence_proxy_async();
            asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");  // this warpgroup's 64 A rows written

#pragma unroll
            for (int m = 0; m < kM; ++m) acc_fence(acc[m]);
            if constexpr (kE) acc_fence(acc_x);
            wgmma_fence();
            // Warpgroup wg: A rows 64·kM·wg + 64m .. + 63 (sub-tile m), 8 KB each; k16 step j at +32
            // bytes; the tile_extra token rows TN.. at + TN·128 bytes.
            const uint32_t a_lo = a_lo0 + (c & 1) * (kABuf >> 4), b_lo = b_lo0 + st * (kStage >> 4);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
                for (int m = 0; m < kM; ++m)
                    wgmma_ss<TN>(acc[m], desc_of_lo(a_lo + 512u * m + 2u * j), desc_of_lo(b_lo + 2u * j), c > 0 || j > 0);
                if constexpr (kE)
                    wgmma_ss_m64n32k16(acc_x, desc_of_lo(a_lo + 2u * j), desc_of_lo(b_lo + uint32_t(TN * 8) + 2u * j),
                                       c > 0 || j > 0);
            }
            wgmma_commit();
            wgmma_wait<1>();
#pragma unroll
            for (int m = 0; m < kM; ++m) acc_fence(acc[m]);
            if constexpr (kE) acc_fence(acc_x);
            st = st + 1 == S ? 0 : st + 1;
            st_fill = st_fill + 1 == S ? 0 : st_fill + 1;
        }
    };
    const bool extra = kX != 0 && n_cols > uint32_t(TN);
    if constexpr (kX != 0) {
        if (extra) main_loop(std::true_type{});
        else main_loop(std::false_type{});
    } else {
        main_loop(std::false_type{});
    }
    wgmma_wait<0>();
#pragma unroll
    for (int m = 0; m < kM; ++m) acc_fence(acc[m]);
    if constexpr (kX != 0) acc_fence(acc_x);
    cp_async_wait<0>();

    // Sub-tile m of warpgroup wg: warp i (of the warpgroup) holds slab 4·kM·wg + 4m + i.
#pragma unroll
    for (int m = 0; m < kM; ++m) {
        const uint32_t slab = slab0 + uint32_t(4 * kM * wg + 4 * m + (warp & 3));
        if (slab >= n_slabs) continue;
        if constexpr (kX != 0)
            if (extra) store_wg_tile<kX ? kX : 2, !kFp4>(args, expert, slab, acc_x, n_cols - TN, out_rows + TN, g, t);
        store_wg_tile<TN, !kFp4>(args, expert, slab, acc[m], min(n_cols, uint32_t(TN)), out_rows, g, t);
    }
#endif
}

template <bool kFp4, int TN, int kM, bool kC3 = false, int kX = 0>
cudaError_t launch_sm90(const KernelArgs& a, uint32_t token_tiles, cudaStream_t stream) {
    static std::atomic<uint64_t> configured{0};
    auto* kernel = gemm_prefill_sm90_kernel<kFp4, TN, kM, kC3, kX>;
    constexpr uint32_t bytes = sm90_smem_bytes<kFp4, TN, kM, kC3, kX>();
    const cudaError_t err = set_smem_once(kernel, bytes, configured);
    if (err != cudaSuccess) return err;
    const dim3 grid(token_tiles, ceil_div(ceil_div(a.w.N, 16), uint32_t(kSlabs * kM)));
    return launch_pdl(kernel, grid, kThreads, bytes, stream, a);
}

// MXFP4 CTAs of 256 weight rows (kM = 2: half the token-row traffic per FLOP) with
// GPTOSS_SM90_TALL=1; measured on the H200 it gains 1 % on the 20b and loses 5 % on the 120b
// (tiles of 64 pairs at 1 CTA/SM), so 128 rows by default. One choice per process, so every
// chunk and tile width gets the same bits.
bool tall_fp4() {
    static const bool tall = [] {
        const char* e = std::getenv("GPTOSS_SM90_TALL");
        return e && std::strcmp(e, "1") == 0;
    }();
    return tall;
}
// GPTOSS_SM90_64C=3: MXFP4 tiles of 64 tokens (the 120b's) at 3 CTAs per SM with a 3-deep ring
// (more warps to hide the dequantization, a shallower prefetch); else 2 CTAs, 6 stages.
bool fp4_64_c3() {
    static const bool v = [] {
        const char* e = std::getenv("GPTOSS_SM90_64C");
        return e && std::strcmp(e, "3") == 0;
    }();
    return v;
}

}  // namespace

// On by default (H200: 120b pp2048 22.5k -> 25.9k, 20b pp512 28.7k -> 31.9k; bench/NOTES.md v24);
// GPTOSS_PREFILL_TILE_EXTRA64=0: tiles of 64 pairs at most (A/B runs).
bool sm90_fp4_64_extra() {
    static const bool v = [] {
        const char* e = std::getenv("GPTOSS_PREFILL_TILE_EXTRA64");
        return !(e && std::strcmp(e, "0") == 0);
    }();
    return v && !tall_fp4() && !fp4_64_c3();
}

cudaError_t launch_prefill_sm90(const KernelArgs& a, bool fp4, uint32_t tn, uint32_t token_tiles, cudaStream_t stream) {
    if (fp4 && tn == 64 && a.route.tile_extra == 32)  // gemm_prefill checked sm90_fp4_64_extra()
        return launch_sm90<true, 64, 1, false, 32>(a, token_tiles, stream);
    if (fp4 && tall_fp4())
        return tn == 128 ? launch_sm90<true, 128, 2>(a, token_tiles, stream) : launch_sm90<true, 64, 2>(a, token_tiles, stream);
    if (fp4 && tn == 64 && fp4_64_c3()) return launch_sm90<true, 64, 1, true>(a, token_tiles, stream);
    if (fp4) return tn == 128 ? launch_sm90<true, 128, 1>(a, token_tiles, stream) : launch_sm90<true, 64, 1>(a, token_tiles, stream);
    return tn == 128 ? launch_sm90<false, 128, 1>(a, token_tiles, stream) : launch_sm90<false, 64, 1>(a, token_tiles, stream);
}

}  // namespace gemm_detail
}  // namespace cuda
}  // namespace gptoss
