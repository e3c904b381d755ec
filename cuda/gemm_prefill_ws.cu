// cuda/gemm_prefill_ws.cu - the warp-specialized sm_90a prefill GEMM: the same product, tile
// (128 weight rows × TN = 64 or 128 tokens), tile scheduler, operand layouts and epilogues as
// gemm_prefill_sm90.cu's kernel, with its lock-step warps split into roles (32·kP + 256 threads).
// The kP producer warps (4 or 8): warp p loads, for every 64-k chunk, the weights and MXFP4
// scales of its own 8/kP fragment slabs and a share of the TN token rows (16-byte cp.async,
// 128B-swizzled K-major) into an R-deep raw ring; when chunk c has landed it turns its slabs
// into the bf16 A tile of chunk c (an SA-deep ring of 128 rows × 64 k in the activations'
// permuted k order, exactly as gemm_prefill_sm90.cu does), fences the async proxy and arrives on
// full[c % SA]; it refills the raw stage of chunk c - kLag with chunk c + R - kLag once empty[]
// says the consumers are done with it. The 2 consumer warpgroups (A rows 0..63 and 64..127)
// wait on full, issue 4 wgmma m64nTNk16 (A and B by descriptor), keep two groups in flight
// (wait_group 1) and arrive on the empty barriers of the chunk before. No CTA barrier in the
// main loop. Chunk invariance: every output accumulates chunk by chunk, k16 step by step in one
// accumulator, in the same order as gemm_prefill_sm90.cu's kernel (same operands, same bits),
// whatever the tile width, chunk or pair order. The default on sm_90a (gemm_prefill.cu;
// GPTOSS_SM90_WS=0 selects the lock-step kernel) or PrefillKernel::kSm90Ws; variants below
// (the default: 256-token MXFP4 route tiles with one wgmma m64n256 per k16 step, bench/NOTES.md
// v16; opt-in: a persistent form, 256-token tiles as two n128 halves, setmaxnreg; slower, v14).
#include "cuda/gemm_prefill.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace gptoss {
namespace cuda {
namespace gemm_detail {
namespace {

// kP producer warps (4 or 8) + 2 consumer warpgroups.
template <int kP> constexpr int ws_threads() { return 32 * kP + 256; }
// Registers per thread of a full-occupancy launch (kC CTAs per SM; allocation units of 8).
template <int kP, int kC> constexpr int ws_launch_regs() {
    return (65536 / (kC * ws_threads<kP>()) / 8 * 8) > 255 ? 248 : 65536 / (kC * ws_threads<kP>()) / 8 * 8;
}
constexpr uint32_t kABytes = 128 * 128;   // bf16 A tile of one chunk: 128 rows × 64 k
template <bool kFp4, int TN> constexpr uint32_t ws_raw_bytes() {  // token rows, weights, scales; 1 KB-padded
    return (TN * 128 + a_bytes<kFp4>() + s_bytes<kFp4>() + 1023u) & ~1023u;
}
// Shared memory one CTA may use (alignment slack, out_rows and barriers counted separately).
template <bool kFp4, int TN, int kC> constexpr uint32_t ws_budget() {
    return (kC == 2 ? 233472u / 2 - 1024u : 232448u) - 1024u - TN * 4 - 256;
}
// kSA: depth of the bf16 A ring; the raw ring takes the rest (at most 8).
template <bool kFp4, int TN, int kC, int kSA> constexpr int ws_raw_stages() {
    constexpr int fit = int((ws_budget<kFp4, TN, kC>() - kSA * kABytes) / ws_raw_bytes<kFp4, TN>());
    return fit < 8 ? fit : 8;
}
template <bool kFp4, int TN, int kC, int kSA> constexpr uint32_t ws_smem_bytes() {
    return 1024 + kSA * kABytes + ws_raw_stages<kFp4, TN, kC, kSA>() * ws_raw_bytes<kFp4, TN>() + TN * 4 + 256;
}
static_assert(ws_raw_stages<true, 128, 1, 4>() >= 5 && ws_raw_stages<true, 256, 1, 2>() >= 5 &&
                  ws_raw_stages<true, 64, 2, 2>() >= 3 &&
                  ws_raw_stages<false, 128, 1, 2>() >= 3 && ws_raw_stages<false, 64, 2, 2>() >= 3,
              "shared memory");

// mbar_init / mbar_arrive / mbar_wait: common.cuh.

// The 4 k16 steps of one 64-k chunk for the first kN of a consumer's accumulator halves (A rows
// at ad, token rows h·TW.. at bd + h·TW·128); acc_in false: the first step overwrites. A
// 256-token tile runs one of two whole main loops (kN = 2 or 1): a branch between the wgmmas
// makes ptxas inject warpgroup.arrive (C7519) or serialize them (C7520), as the v14 call measured.
// kN256 (variant 12): both halves as one wgmma m64n256k16 (A read once per k16 step instead of
// twice; the same products per output element, so the same bits).
template <int kN, int TW, int kH, bool kN256 = false>
__device__ __forceinline__ void wgmma_chunk(float (&acc)[kH][TW / 2], uint32_t ad, uint32_t bd, bool acc_in) {
#ifdef GPTOSS_SM90A
    const uint32_t a_lo = uint32_t(sw128_desc(ad)), b_lo = uint32_t(sw128_desc(bd));  // + 2 per k16 step
    if constexpr (kN256 && kN == 2 && TW == 128) {
        float(&flat)[128] = *reinterpret_cast<float(*)[128]>(&acc[0][0]);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            wgmma_ss_m64n256k16(flat, desc_of_lo(a_lo + 2u * j), desc_of_lo(b_lo + 2u * j), acc_in || j > 0);
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < kN; ++h)
                wgmma_ss<TW>(acc[h], desc_of_lo(a_lo + 2u * j), desc_of_lo(b_lo + uint32_t(h * TW * 8) + 2u * j),
                             acc_in || j > 0);
    }
#endif
}

// The 4 k16 steps of one 64-k chunk for the tile_extra columns (32 token rows at bd).
template <int N> __device__ __forceinline__ void wgmma_chunk_extra(float (&acc)[N], uint32_t ad, uint32_t bd, bool acc_in) {
#ifdef GPTOSS_SM90A
    if constexpr (N == 16) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
            wgmma_ss_m64n32k16(acc, sw128_desc(ad + 32u * j), sw128_desc(bd + 32u * j), acc_in || j > 0);
    }
#endif
}

// kLag 1: chunk c + R - 1 is issued (into chunk c - 1's raw stage) after chunk c is dequantized;
// kLag >= 2: chunk c + R - kLag (into chunk c - kLag's stage) before, so the producer does not
// wait for the consumers' latest groups. kC CTAs per SM, kSA-deep A ring.
// kX (GemmRoute::tile_extra, 0 or 32 with TN = 256 and kN256): a tile may hold TN + kX pairs;
// columns TN.. go through one more wgmma m64nkXk16 per k16 step on the same A chunk (their own
// accumulator, the same k order), so an expert of up to TN + kX pairs dequantizes its weights once.
template <bool kFp4, int TN, int kP, int kLag, int kC, int kSA, bool kHint, int kProdRegs, bool kN256 = false,
          int kX = 0>
__global__ __launch_bounds__(ws_threads<kP>(), kC) void gemm_prefill_ws_kernel(const KernelArgs args) {
#ifdef GPTOSS_SM90A
    extern __shared__ unsigned char smem_raw[];
    constexpr int TNB = TN + kX;  // token rows per stage
    static_assert(kX == 0 || (kX == 32 && TN == 256 && kN256), "tile_extra: 32 on m64n256 tiles only");
    constexpr int R = ws_raw_stages<kFp4, TNB, kC, kSA>(), SA = kSA, L = R - kLag;
    constexpr bool kEarly = kLag >= 2;
    static_assert(L >= 1, "raw ring too shallow");
    constexpr int kSpw = kSlabs / kP;  // slabs per producer warp
    constexpr int kH = TN == 256 ? 2 : 1, TW = TN / kH;  // 256-token tiles: two halves of wgmma n128
    // kProdRegs: the producers give registers to the consumers (setmaxnreg). The pool is what the
    // CTA was launched with: ws_launch_regs per thread (launch_ws checks it), 168 for 384 threads
    // (not 65536 / 384: an inc beyond the pool waits forever).
    constexpr int kConsRegs =
        kProdRegs ? ((ws_launch_regs<kP, kC>() * ws_threads<kP>() - kProdRegs * 32 * kP) / 256 / 8) * 8 : 0;
    static_assert(!kProdRegs || (kConsRegs >= 24 && kConsRegs <= 256 && kP % 4 == 0), "setmaxnreg");
    constexpr uint32_t kRaw = ws_raw_bytes<kFp4, TNB>(), kBst = TNB * 128, kA = a_bytes<kFp4>();
    const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t K = args.w.K, N = args.w.N, n_chunks = K >> 6;
    const uint32_t n_slabs = (N + 15) >> 4, slab0 = blockIdx.y * kSlabs;
    const uint32_t raw_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw_base + 1023u) & ~1023u;  // the swizzle atoms are 1 KB aligned
    unsigned char* smem = smem_raw + (base - raw_base);
    const uint32_t ring = base + SA * kABytes;  // raw stage s at ring + s·kRaw: token rows, weights, scales
    int32_t* out_rows = reinterpret_cast<int32_t*>(smem + SA * kABytes + R * kRaw);
    const uint32_t bars = base + SA * kABytes + R * kRaw + TNB * 4;  // full[SA], empty_a[SA], empty_r[R]
    auto full = [&](uint32_t s) { return bars + 8 * s; };
    auto empty_a = [&](uint32_t s) { return bars + 8 * (SA + s); };
    auto empty_r = [&](uint32_t s) { return bars + 8 * (2 * SA + s); };
    if (tid == 0) {
        for (int s = 0; s < SA; ++s) {
            mbar_init(full(s), 32 * kP);
            mbar_init(empty_a(s), 256);
        }
        for (int s = 0; s < R; ++s) mbar_init(empty_r(s), 256);
    }

    if (args.routed) pdl_wait();
    PrefillTile tile;
    if (!prefill_tile<TN, TNB>(args, &tile)) return;
    const int expert = tile.expert;
    const uint32_t n_cols = tile.n_cols;

    const char *wsrc, *ssrc;
    expert_weights<kFp4>(args, expert, &wsrc, &ssrc);
    // Producer warp `warp` (0..kP-1): slabs kSpw·warp .. + kSpw - 1 of the CTA.
    const WarpSlabCopies<kFp4, kSpw> wcopy(wsrc, ssrc, slab0, n_slabs, n_chunks, warp, lane);
    auto load_a = [&](uint32_t stage, uint32_t c) { wcopy.issue(ring + stage * kRaw + kBst, c, warp, lane); };
    const bool producer = warp < kP;
    if (producer && !args.routed) {
        for (int s = 0; s < L; ++s)
            if (uint32_t(s) < n_chunks) load_a(uint32_t(s), uint32_t(s));
    }
    if (!args.routed) pdl_wait();
    if (tid < TNB) out_rows[tid] = tile_out_row(args, tile, uint32_t(tid));
    __syncthreads();  // barriers initialized, out_rows written
    pdl_launch_dependents();

    if (producer) {
        if constexpr (kProdRegs != 0) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProdRegs));
        // Token rows: this thread copies unit (tid & 7) of rows tid / 8 + 4·kP·i; columns past
        // n_cols are zero-filled.
        constexpr int kBUnits = TNB / (4 * kP);
        static_assert(TNB % (4 * kP) == 0, "token rows per producer thread");
        // (row & 7 is the same for all of a thread's rows, so unit i lands 4·kP rows after unit 0.)
        // kX: 32-bit element offsets from args.x instead of pointers (the producers' registers;
        // gemm_prefill checked that the input has fewer than 2^31 elements).
        // Else pointers with a step of 128 bytes a chunk (0 for zero-filled columns: the source
        // stays at args.x), one multiply-add per copy.
        using BSrc = std::conditional_t<kX != 0, uint32_t, const char*>;
        BSrc bsrc[kBUnits];
        uint32_t bstep[kX != 0 ? 1 : kBUnits];
        uint32_t bdst0 = 0;
        uint32_t bvalid = 0;
#pragma unroll
        for (int i = 0; i < kBUnits; ++i) {
            const TokenUnit tu = token_unit(args, tile, uint32_t(tid >> 3) + uint32_t(4 * kP * i), uint32_t(tid & 7));
            if constexpr (kX != 0) {
                bsrc[i] = uint32_t(tu.src - args.x);
            } else {
                bsrc[i] = reinterpret_cast<const char*>(tu.src);
                bstep[i] = tu.valid ? 128u : 0u;
            }
            if (i == 0) bdst0 = tu.dst;
            bvalid |= tu.valid ? 1u << i : 0u;
        }
        auto load_b = [&](uint32_t stage, uint32_t c) {
            const uint32_t sb = ring + stage * kRaw + bdst0;
#pragma unroll
            for (int i = 0; i < kBUnits; ++i) {
                const bool v = (bvalid >> i) & 1u;
                const void* src;
                if constexpr (kX != 0) src = args.x + (v ? bsrc[i] + c * 64u : 0u);
                else src = bsrc[i] + size_t(c) * bstep[i];
                cp_async16_zfill(sb + uint32_t(i * 4 * kP * 128), src, v);
            }
        };
        if (args.routed) {
            for (int s = 0; s < L; ++s)
                if (uint32_t(s) < n_chunks) load_a(uint32_t(s), uint32_t(s));
        }
        for (int s = 0; s < L; ++s) {
            if (uint32_t(s) < n_chunks) load_b(uint32_t(s), uint32_t(s));
            cp_async_commit();
        }
        uint32_t st = 0, sa_i = 0;  // raw stage and A stage of chunk c
        // Chunk c + L goes into the raw stage of chunk c + L - R once the consumers are done with it.
        auto refill = [&](uint32_t c, uint32_t st) {
            const uint32_t cn = c + L;
            if (cn < n_chunks) {
                const uint32_t sn = st + L >= uint32_t(R) ? st + L - R : st + L;
                if (cn >= uint32_t(R)) mbar_wait<kHint>(empty_r(sn), ((cn / R) & 1u) ^ 1u);
                load_a(sn, cn);
                load_b(sn, cn);
            }
            cp_async_commit();
        };
        for (uint32_t c = 0; c < n_chunks; ++c) {
            if constexpr (kEarly) refill(c, st);
            cp_async_wait<kEarly ? L : L - 1>();  // this thread's copies of chunk c landed
            __syncwarp();            // and its warp's (the scales of a slab come from 4 lanes)
            if (c >= uint32_t(SA)) mbar_wait<kHint>(empty_a(sa_i), ((c / SA) & 1u) ^ 1u);
            const unsigned char* sa = smem + SA * kABytes + st * kRaw + kBst;
            unsigned char* ab = smem + sa_i * kABytes;
#pragma unroll
            for (int m = 0; m < kSpw; ++m) store_a_slab<kFp4, kA>(ab, sa, kSpw * warp + m, lane);
            fence_proxy_async();  // this thread's A stores and token copies → visible to wgmma
            mbar_arrive(full(sa_i));
            if constexpr (!kEarly) refill(c, st);
            st = st + 1 == R ? 0 : st + 1;
            sa_i = sa_i + 1 == SA ? 0 : sa_i + 1;
        }
        cp_async_wait<0>();
        return;
    }

    // Consumers: warpgroup cw owns A rows 64·cw .. 64·cw + 63.
    if constexpr (kProdRegs != 0) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsRegs));
    const int cw = (warp - kP) >> 2;
    const bool two = kH == 2 && n_cols > uint32_t(TW);  // 256-token tiles: tokens 128.. only if any
    const bool extra = kX != 0 && n_cols > uint32_t(TN);  // tile_extra: tokens 256.. only if any
    float acc[kH][TW / 2];  // the first wgmma overwrites it
    float acc_x[kX ? kX / 2 : 1];
    // The main loop over the first N accumulator halves (a 256-token tile takes one of two whole
    // loops: no branch between the wgmmas, which ptxas would answer with warpgroup.arrive);
    // kE: and the tile_extra columns (a third loop).
    auto main_loop = [&](auto halves, auto with_extra) {
        constexpr int kN = decltype(halves)::value;
        constexpr bool kE = decltype(with_extra)::value;
        uint32_t st = 0, sa_i = 0, st_prev = 0, sa_prev = 0;
        for (uint32_t c = 0; c < n_chunks; ++c) {
            mbar_wait<kHint>(full(sa_i), (c / SA) & 1u);
#pragma unroll
            for (int h = 0; h < kN; ++h) acc_fence(acc[h]);
            if constexpr (kE) acc_fence(acc_x);
            wgmma_fence();
            const uint32_t ad = base + sa_i * kABytes + uint32_t(cw) * (kABytes / 2), bd = ring + st * kRaw;
            wgmma_chunk<kN, TW, kH, kN256>(acc, ad, bd, c > 0);
            if constexpr (kE) wgmma_chunk_extra(acc_x, ad, bd + uint32_t(TN * 128), c > 0);
            wgmma_commit();
            wgmma_wait<1>();  // chunk c - 1's group is complete: its stages are free
#pragma unroll
            for (int h = 0; h < kN; ++h) acc_fence(acc[h]);
            if constexpr (kE) acc_fence(acc_x);
            if (c > 0) {
                mbar_arrive(empty_a(sa_prev));
                mbar_arrive(empty_r(st_prev));
            }
            st_prev = st;
            sa_prev = sa_i;
            st = st + 1 == R ? 0 : st + 1;
            sa_i = sa_i + 1 == SA ? 0 : sa_i + 1;
        }
    };
    using no = std::false_type;
    if constexpr (kX != 0) {
        if (extra) main_loop(std::integral_constant<int, kH>{}, std::true_type{});
        else if (two) main_loop(std::integral_constant<int, kH>{}, no{});
        else main_loop(std::integral_constant<int, 1>{}, no{});
    } else {
        if (two) main_loop(std::integral_constant<int, kH>{}, no{});
        else main_loop(std::integral_constant<int, 1>{}, no{});
    }
    wgmma_wait<0>();
#pragma unroll
    for (int h = 0; h < kH; ++h) acc_fence(acc[h]);
    acc_fence(acc_x);
    const uint32_t slab = slab0 + uint32_t(4 * cw + (warp & 3));
    if (slab < n_slabs) {
        // (the last columns first: their registers are free for the rest of the epilogue)
        if constexpr (kX != 0)
            if (extra) store_wg_tile<kX ? kX : 2, !kFp4>(args, expert, slab, acc_x, n_cols - TN, out_rows + TN, g, t);
        if (two) store_wg_tile<TW, !kFp4>(args, expert, slab, acc[kH - 1], min(n_cols, uint32_t(TN)) - TW, out_rows + TW, g, t);
        store_wg_tile<TW, !kFp4>(args, expert, slab, acc[0], min(n_cols, uint32_t(TW)), out_rows, g, t);
    }
#endif
}

// The persistent form of gemm_prefill_ws_kernel (GPTOSS_SM90_WS_VARIANT 9, 10): about kC CTAs per
// SM, CTA b computing tiles b, b + gridDim.x, ... of the tok_tiles × row_tiles tiles (token tile
// fastest; a static schedule, no atomics). Producers and consumers walk one flat sequence of
// items q = (tile i, chunk c) through the same rings, so the producers fill the next tile's
// first stages while the consumers run the previous tile's epilogue. Per tile the same operands
// and wgmma sequence as gemm_prefill_ws_kernel (the first wgmma of chunk 0 overwrites the
// accumulator), so the same bits. The consumers keep their own out_rows (two named barriers of
// the 256 consumer threads per tile).
template <bool kFp4, int TN, int kP, int kLag, int kC, int kSA, bool kHint, bool kTrigger, int kProdRegs>
__global__ __launch_bounds__(ws_threads<kP>(), kC) void gemm_prefill_wsp_kernel(const KernelArgs args) {
#ifdef GPTOSS_SM90A
    extern __shared__ unsigned char smem_raw[];
    constexpr int R = ws_raw_stages<kFp4, TN, kC, kSA>(), SA = kSA, L = R - kLag;
    constexpr bool kEarly = kLag >= 2;
    static_assert(L >= 1, "raw ring too shallow");
    constexpr int kSpw = kSlabs / kP;  // slabs per producer warp
    constexpr int kH = TN == 256 ? 2 : 1, TW = TN / kH;  // 256-token tiles: two halves of wgmma n128
    constexpr uint32_t kRaw = ws_raw_bytes<kFp4, TN>(), kBst = TN * 128, kA = a_bytes<kFp4>();
    const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t K = args.w.K, N = args.w.N, n_chunks = K >> 6;
    const uint32_t n_slabs = (N + 15) >> 4, row_tiles = (n_slabs + kSlabs - 1) / kSlabs;
    const uint32_t raw_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw_base + 1023u) & ~1023u;  // the swizzle atoms are 1 KB aligned
    unsigned char* smem = smem_raw + (base - raw_base);
    const uint32_t ring = base + SA * kABytes;  // raw stage s at ring + s·kRaw: token rows, weights, scales
    int32_t* out_rows = reinterpret_cast<int32_t*>(smem + SA * kABytes + R * kRaw);
    const uint32_t bars = base + SA * kABytes + R * kRaw + TN * 4;  // full[SA], empty_a[SA], empty_r[R]
    auto full = [&](uint32_t s) { return bars + 8 * s; };
    auto empty_a = [&](uint32_t s) { return bars + 8 * (SA + s); };
    auto empty_r = [&](uint32_t s) { return bars + 8 * (2 * SA + s); };
    if (tid == 0) {
        for (int s = 0; s < SA; ++s) {
            mbar_init(full(s), 32 * kP);
            mbar_init(empty_a(s), 256);
        }
        for (int s = 0; s < R; ++s) mbar_init(empty_r(s), 256);
    }
    pdl_wait();
    const uint32_t tok_tiles = args.routed ? uint32_t(args.route.tiles[0]) : (args.n_rows + TN - 1) / TN;
    const uint32_t n_tiles = tok_tiles * row_tiles;
    const uint32_t n_mine = blockIdx.x < n_tiles ? (n_tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    __syncthreads();  // barriers initialized
    if constexpr (kTrigger) pdl_launch_dependents();
    if (n_mine == 0) return;
    // Tile i of this CTA: its token tile and first slab.
    auto tile_of = [&](uint32_t i, PrefillTile* tl) {
        const uint32_t id = blockIdx.x + i * gridDim.x;
        prefill_tile_at<TN>(args, id % tok_tiles, tl);
        return (id / tok_tiles) * uint32_t(kSlabs);
    };
    const uint32_t n_items = n_mine * n_chunks;
    // kProdRegs: the producers give registers to the consumers (setmaxnreg; all of the SM's).
    constexpr int kConsRegs = kProdRegs ? ((65536 / (kC * 256) - kProdRegs * kP / 8) / 8) * 8 : 0;
    static_assert(!kProdRegs || (kConsRegs >= 24 && kConsRegs <= 256 && kP % 4 == 0), "setmaxnreg");

    if (warp < kP) {
        if constexpr (kProdRegs != 0) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProdRegs));
        // The load cursor (tile li, chunk lc): weights of this warp's slabs and a share of the
        // token rows (unit (tid & 7) of rows tid / 8 + 4·kP·i; columns past n_cols zero-filled).
        constexpr int kBUnits = TN / (4 * kP);
        const char* wsrc = nullptr;
        const char* ssrc = nullptr;
        uint32_t lslab0 = 0, bvalid = 0, li = 0, lc = 0;
        const uint16_t* bsrc[kBUnits];
        uint32_t bdst[kBUnits];
#pragma unroll
        for (int i = 0; i < kBUnits; ++i) {
            const uint32_t row = uint32_t(tid >> 3) + uint32_t(4 * kP * i), u = uint32_t(tid & 7);
            bdst[i] = row * 128 + ((u ^ (row & 7)) * 16);
        }
        auto set_tile = [&](uint32_t i) {
            PrefillTile tl;
            lslab0 = tile_of(i, &tl);
            expert_weights<kFp4>(args, tl.expert, &wsrc, &ssrc);
            bvalid = 0;
#pragma unroll
            for (int j = 0; j < kBUnits; ++j) {
                const TokenUnit tu = token_unit(args, tl, uint32_t(tid >> 3) + uint32_t(4 * kP * j), uint32_t(tid & 7));
                bsrc[j] = tu.src;
                bvalid |= tu.valid ? 1u << j : 0u;
            }
        };
        // Loads the item at the cursor into raw stage `stage` and advances the cursor.
        auto load = [&](uint32_t stage) {
            const uint32_t sb = ring + stage * kRaw;
            load_warp_slabs<kFp4, kSpw>(sb + kBst, wsrc, ssrc, lslab0, n_slabs, n_chunks, lc, warp, lane);
#pragma unroll
            for (int i = 0; i < kBUnits; ++i) {
                const bool v = (bvalid >> i) & 1u;
                cp_async16_zfill(sb + bdst[i], v ? bsrc[i] + size_t(lc) * 64 : bsrc[i], v);
            }
            if (++lc == n_chunks) {
                lc = 0;
                if (++li < n_mine) set_tile(li);
            }
        };
        set_tile(0);
        for (int s = 0; s < L; ++s) {
            if (uint32_t(s) < n_items) load(uint32_t(s));
            cp_async_commit();
        }
        uint32_t st = 0, sa_i = 0;  // raw stage and A stage of item q
        // Item q + L goes into the raw stage of item q + L - R once the consumers are done with it.
        auto refill = [&](uint32_t q, uint32_t st) {
            const uint32_t qn = q + L;
            if (qn < n_items) {
                const uint32_t sn = st + L >= uint32_t(R) ? st + L - R : st + L;
                if (qn >= uint32_t(R)) mbar_wait<kHint>(empty_r(sn), ((qn / R) & 1u) ^ 1u);
                load(sn);
            }
            cp_async_commit();
        };
        for (uint32_t q = 0; q < n_items; ++q) {
            if constexpr (kEarly) refill(q, st);
            cp_async_wait<kEarly ? L : L - 1>();  // this thread's copies of item q landed
            __syncwarp();            // and its warp's (the scales of a slab come from 4 lanes)
            if (q >= uint32_t(SA)) mbar_wait<kHint>(empty_a(sa_i), ((q / SA) & 1u) ^ 1u);
            const unsigned char* sa = smem + SA * kABytes + st * kRaw + kBst;
            unsigned char* ab = smem + sa_i * kABytes;
#pragma unroll
            for (int m = 0; m < kSpw; ++m) store_a_slab<kFp4, kA>(ab, sa, kSpw * warp + m, lane);
            fence_proxy_async();  // this thread's A stores and token copies → visible to wgmma
            mbar_arrive(full(sa_i));
            if constexpr (!kEarly) refill(q, st);
            st = st + 1 == R ? 0 : st + 1;
            sa_i = sa_i + 1 == SA ? 0 : sa_i + 1;
        }
        cp_async_wait<0>();
        return;
    }

    // Consumers: warpgroup cw owns A rows 64·cw .. 64·cw + 63.
    // 256-token tiles: tokens 128..255 (accumulator 1) only when the tile has more than 128.
    if constexpr (kProdRegs != 0) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsRegs));
    const int cw = (warp - kP) >> 2, ctid = tid - 32 * kP;
    float acc[kH][TW / 2];  // the first wgmma of a tile overwrites it
    uint32_t st = 0, sa_i = 0, st_prev = 0, sa_prev = 0, q = 0;
    for (uint32_t i = 0; i < n_mine; ++i) {
        PrefillTile tl;
        const uint32_t slab0 = tile_of(i, &tl);
        const bool two = kH == 2 && tl.n_cols > uint32_t(TW);
        asm volatile("bar.sync 1, 256;" ::: "memory");  // the previous tile's epilogue read out_rows
        for (int r = ctid; r < TN; r += 256)
            out_rows[r] = tile_out_row(args, tl, uint32_t(r));
        // One whole loop per half count (no branch between the wgmmas; see gemm_prefill_ws_kernel).
        auto main_loop = [&](auto halves) {
            constexpr int kN = decltype(halves)::value;
            for (uint32_t c = 0; c < n_chunks; ++c, ++q) {
                mbar_wait<kHint>(full(sa_i), (q / SA) & 1u);
#pragma unroll
                for (int h = 0; h < kN; ++h) acc_fence(acc[h]);
                wgmma_fence();
                const uint32_t ad = base + sa_i * kABytes + uint32_t(cw) * (kABytes / 2), bd = ring + st * kRaw;
                wgmma_chunk<kN, TW>(acc, ad, bd, c > 0);
                wgmma_commit();
                wgmma_wait<1>();  // item q - 1's group is complete: its stages are free
#pragma unroll
                for (int h = 0; h < kN; ++h) acc_fence(acc[h]);
                if (c > 0) {
                    mbar_arrive(empty_a(sa_prev));
                    mbar_arrive(empty_r(st_prev));
                }
                st_prev = st;
                sa_prev = sa_i;
                st = st + 1 == R ? 0 : st + 1;
                sa_i = sa_i + 1 == SA ? 0 : sa_i + 1;
            }
        };
        if (two) main_loop(std::integral_constant<int, kH>{});
        else main_loop(std::integral_constant<int, 1>{});
        wgmma_wait<0>();
#pragma unroll
        for (int h = 0; h < kH; ++h) acc_fence(acc[h]);
        mbar_arrive(empty_a(sa_prev));
        mbar_arrive(empty_r(st_prev));
        asm volatile("bar.sync 1, 256;" ::: "memory");  // out_rows written
        const uint32_t slab = slab0 + uint32_t(4 * cw + (warp & 3));
        if (slab < n_slabs) {
            store_wg_tile<TW, !kFp4>(args, tl.expert, slab, acc[0], min(tl.n_cols, uint32_t(TW)), out_rows, g, t);
            if (two) store_wg_tile<TW, !kFp4>(args, tl.expert, slab, acc[kH - 1], tl.n_cols - TW, out_rows + TW, g, t);
        }
    }
#endif
}

// Multiprocessors of the current device `dev` (asked once per device).
uint32_t sm_count(int dev) {
    static std::atomic<int> known[64];
    if (dev < 0 || dev >= 64) return 1;
    if (known[dev].load() == 0) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
            cudaGetLastError();
            n = 1;
        }
        known[dev].store(n);
    }
    return uint32_t(known[dev].load());
}

// kPersist: gemm_prefill_wsp_kernel over min(all tiles, kC CTAs per SM); else
// gemm_prefill_ws_kernel, one CTA per tile.
template <bool kFp4, int TN, int kP, int kLag, int kC, int kSA, bool kHint = false, bool kPersist = false,
          bool kTrigger = true, int kProdRegs = 0, bool kN256 = false, int kX = 0>
cudaError_t launch_ws(const KernelArgs& a, uint32_t token_tiles, cudaStream_t stream) {
    static std::atomic<uint64_t> configured{0};
    void (*kernel)(const KernelArgs);
    if constexpr (kPersist) kernel = gemm_prefill_wsp_kernel<kFp4, TN, kP, kLag, kC, kSA, kHint, kTrigger, kProdRegs>;
    else kernel = gemm_prefill_ws_kernel<kFp4, TN, kP, kLag, kC, kSA, kHint, kProdRegs, kN256, kX>;
    constexpr uint32_t bytes = ws_smem_bytes<kFp4, TN + kX, kC, kSA>();
    cudaError_t err = set_smem_once(kernel, bytes, configured);
    if (err != cudaSuccess) return err;
    if constexpr (!kPersist && kProdRegs != 0) {  // setmaxnreg's pool: the registers it was compiled with
        static const int regs = [&] {
            cudaFuncAttributes fa{};
            return cudaFuncGetAttributes(&fa, kernel) == cudaSuccess ? fa.numRegs : 0;
        }();
        if (regs < ws_launch_regs<kP, kC>()) return cudaErrorInvalidConfiguration;
    }
    int dev = 0;
    err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const uint32_t row_tiles = ceil_div(ceil_div(a.w.N, 16), uint32_t(kSlabs));
    if constexpr (kPersist) {
        const uint32_t ctas = std::min(token_tiles * row_tiles, sm_count(dev) * uint32_t(kC));
        return launch_pdl(kernel, dim3(ctas), ws_threads<kP>(), bytes, stream, a);
    }
    return launch_pdl(kernel, dim3(token_tiles, row_tiles), ws_threads<kP>(), bytes, stream, a);
}

// Variant (GPTOSS_SM90_WS_VARIANT = 1..12, one per process; measured in bench/NOTES.md v13b and
// v14). 128-token tiles: 1 = 4 producer warps, refill after the dequantization (kLag 1); 2 =
// refill first (kLag 2); 3, 5 = as 2 with 8 producer warps; 6, 7 = 8 producer warps, MXFP4 A ring
// 4 deep, kLag 3; 8 (the default in v14: +0.5 % on the 20b) = 7 with the mbarrier
// suspend-time hint; 9 = 8 as the persistent kernel;
// 10 = 8 and 11 = 9, with 256-token MXFP4 route tiles where gemm_prefill_tile_tokens chose 128
// (two wgmma n128 halves; 4 producer warps, or 8 with setmaxnreg: GPTOSS_SM90_WS_256=8);
// 12 (the default since v16: 20b +1 %) = 10 with one wgmma m64n256 per k16 step for tiles of
// more than 128 pairs (A read once; 4 producer warps whatever GPTOSS_SM90_WS_256 says).
// 64-token tiles: 2 CTAs per SM with 4 producer warps (kLag 1 for variant 1, else 2); 5, 6: 1 CTA,
// 8 warps; 7 to 12: gemm_prefill_sm90.cu's kernel (2 CTAs per SM of 8
// lock-step warps, faster there; same operands and wgmma sequence, so the same bits as this
// kernel), or with 9, 11 and GPTOSS_SM90_WS_64 = 4 / 8: the persistent kernel, 2 CTAs per SM
// with 4 / 8 producer warps.
// (128-token tiles at 2 CTAs per SM do not compile: wgmma m64n128 needs >= 90 registers.)
int ws_variant() {
    static const int v = [] {
        const char* e = std::getenv("GPTOSS_SM90_WS_VARIANT");
        const int x = e ? std::atoi(e) : 0;
        return x >= 1 && x <= 12 && x != 4 ? x : 12;
    }();
    return v;
}
int ws_64() {
    static const int v = [] {
        const char* e = std::getenv("GPTOSS_SM90_WS_64");
        const int x = e ? std::atoi(e) : 0;
        return x == 4 || x == 8 ? x : 0;
    }();
    return v;
}
// GPTOSS_SM90_WS_PDL=0: the persistent kernel lets the next kernel launch only when it exits
// (else as soon as it started). GPTOSS_SM90_WS_HINT=0: its 128-token tiles wait without the
// suspend-time hint (not yet run on a GPU; bench/NOTES.md v14). GPTOSS_SM90_WS_256=8:
// 256-token tiles with 8 producer warps (setmaxnreg: 56 registers, the consumers 200), else 4.
bool ws_trigger() {
    static const bool v = [] {
        const char* e = std::getenv("GPTOSS_SM90_WS_PDL");
        return !(e && std::strcmp(e, "0") == 0);
    }();
    return v;
}
bool ws_hint() {
    static const bool v = [] {
        const char* e = std::getenv("GPTOSS_SM90_WS_HINT");
        return !(e && std::strcmp(e, "0") == 0);
    }();
    return v;
}
int ws_256() {
    static const int v = [] {
        const char* e = std::getenv("GPTOSS_SM90_WS_256");
        return e && std::strcmp(e, "8") == 0 ? 8 : 4;
    }();
    return v;
}
template <bool kFp4, int TN, int kP, int kLag, int kC, int kSA, int kProdRegs = 0>
cudaError_t launch_wsp(const KernelArgs& a, uint32_t token_tiles, cudaStream_t stream) {
    return ws_trigger() ? launch_ws<kFp4, TN, kP, kLag, kC, kSA, true, true, true, kProdRegs>(a, token_tiles, stream)
                        : launch_ws<kFp4, TN, kP, kLag, kC, kSA, true, true, false, kProdRegs>(a, token_tiles, stream);
}
template <bool kFp4>
cudaError_t launch_ws_v(const KernelArgs& a, uint32_t tn, uint32_t token_tiles, cudaStream_t stream) {
    const int v = ws_variant();
    constexpr int kSA128 = kFp4 ? 3 : 2, kSA6 = kFp4 ? 4 : 2;
    if (tn == 256) {  // MXFP4 routes only (gemm_prefill checked)
        if constexpr (kFp4) {
            if (v == 11) {
                if (ws_256() == 8) return launch_wsp<true, 256, 8, 2, 1, 2, 56>(a, token_tiles, stream);
                return launch_wsp<true, 256, 4, 2, 1, 2>(a, token_tiles, stream);
            }
            // (8 producer warps cap every thread at 128 registers: too few for m64n256's 128 accumulators)
            if (v == 12 && a.route.tile_extra != 0) {  // gemm_prefill checked: 32 and ws_tile_extra()
                if (ws_tile_extra() == 1)
                    return launch_ws<true, 256, 4, 1, 1, 2, true, false, true, 64, true, 32>(a, token_tiles, stream);
                return launch_ws<true, 256, 4, 2, 1, 2, true, false, true, 64, true, 32>(a, token_tiles, stream);
            }
            if (v == 12) return launch_ws<true, 256, 4, 2, 1, 2, true, false, true, 0, true>(a, token_tiles, stream);
            if (ws_256() == 8) return launch_ws<true, 256, 8, 2, 1, 2, true, false, true, 56>(a, token_tiles, stream);
            return launch_ws<true, 256, 4, 2, 1, 2, true>(a, token_tiles, stream);
        }
        return cudaErrorInvalidValue;
    }
    if (tn == 128) {
        if ((v == 9 || v == 11) && !ws_hint())
            return launch_ws<kFp4, 128, 8, 3, 1, kSA6, false, true>(a, token_tiles, stream);
        if (v == 9 || v == 11) return launch_wsp<kFp4, 128, 8, 3, 1, kSA6>(a, token_tiles, stream);
        if (v == 8 || v == 10 || v == 12) return launch_ws<kFp4, 128, 8, 3, 1, kSA6, true>(a, token_tiles, stream);
        if (v >= 6) return launch_ws<kFp4, 128, 8, 3, 1, kSA6>(a, token_tiles, stream);
        return v == 1   ? launch_ws<kFp4, 128, 4, 1, 1, kSA128>(a, token_tiles, stream)
               : v == 2 ? launch_ws<kFp4, 128, 4, 2, 1, kSA128>(a, token_tiles, stream)
                        : launch_ws<kFp4, 128, 8, 2, 1, kSA128>(a, token_tiles, stream);
    }
    if ((v == 9 || v == 11) && ws_64() == 4) return launch_ws<kFp4, 64, 4, 2, 2, 2, true, true>(a, token_tiles, stream);
    if ((v == 9 || v == 11) && ws_64() == 8) return launch_ws<kFp4, 64, 8, 2, 2, 2, true, true>(a, token_tiles, stream);
    if (v >= 7) return launch_prefill_sm90(a, kFp4, 64, token_tiles, stream);
    if (v == 5) return launch_ws<kFp4, 64, 8, 2, 1, 2>(a, token_tiles, stream);
    if (v == 6) return launch_ws<kFp4, 64, 8, 3, 1, 4>(a, token_tiles, stream);
    return v == 1 ? launch_ws<kFp4, 64, 4, 1, 2, 2>(a, token_tiles, stream)
                  : launch_ws<kFp4, 64, 4, 2, 2, 2>(a, token_tiles, stream);
}

}  // namespace

bool ws_wide_tiles() { return ws_variant() >= 10; }
bool ws_64_uses_sm90() {
    const int v = ws_variant();
    return v >= 7 && !((v == 9 || v == 11) && ws_64() != 0);
}
int ws_tile_extra() {
    static const int v = [] {
        const char* e = std::getenv("GPTOSS_PREFILL_TILE_EXTRA");
        const int x = e ? std::atoi(e) : 0;
        return x == 32 ? 2 : x == 33 ? 1 : 0;
    }();
    return ws_variant() == 12 ? v : 0;
}

cudaError_t launch_prefill_ws(const KernelArgs& a, bool fp4, uint32_t tn, uint32_t token_tiles, cudaStream_t stream) {
    return fp4 ? launch_ws_v<true>(a, tn, token_tiles, stream) : launch_ws_v<false>(a, tn, token_tiles, stream);
}

}  // namespace gemm_detail
}  // namespace cuda
}  // namespace gptoss
