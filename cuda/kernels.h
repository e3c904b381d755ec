// cuda/kernels.h - the CUDA kernels' internal C++ API: one launcher per op, shapes in MODEL.md's
// letters (T tokens, H hidden, I expert width, E experts, K active experts, Q query heads,
// G kv heads, D head dim, V vocab). Launchers check preconditions, pick grids, launch on
// `stream` and return a status; they never synchronize.
// Numerics: the residual stream is fp32; every GEMM input is bf16 in the "fragment-permuted"
// row layout (permuted_k in common.cuh); every output element is computed in an order that
// depends only on its own row and column, never on T or on how tokens are grouped, so a
// position's logits are bit-identical however a prompt is chunked.
#pragma once

#include "gptoss-internal.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace gptoss {
namespace cuda {

// Per-forward values the kernels read from device memory, so one CUDA graph serves every
// decode step: pos0 = position of the first token of the chunk.
struct StepInfo {
    int32_t pos0;
    int32_t n_tokens;
};

// ---------------------------------------------------------------------------
// Weight layouts (repack.cu). Done once at load, on the device.
//
// bf16 "fragment" layout of W [N, K]: 16-row slabs × 64-k chunks of 2048 bytes; inside a
// chunk, k16 sub-tile j (0..3) is 512 contiguous bytes, lane l's 16 bytes = its mma A fragment
// (rows g, g+8; k = 16j + 2t + {0,1,8,9}). N is padded to 16 with zero rows. K % 64 == 0.
size_t bf16_fragment_bytes(uint32_t N, uint32_t K);
[[nodiscard]] gptoss_status repack_bf16(const uint16_t* raw, uint32_t N, uint32_t K, void* out,
                                        cudaStream_t stream);

// MXFP4 fragment layout of one expert's W [N, K] (blocks u8 [N, K/32, 16], scales u8
// [N, K/32]): 16-row slabs × 64-k chunks of 512 bytes, lane l's 16 bytes = 4 words, word j =
// the 8 e2m1 values of its A fragment for sub-tile j, their bits placed (gemm.cuh
// e2m1_word_bits) so that rotates and masks alone give the 4 bf16 pairs (9 integer instructions
// per word). Scales become bf16 2^(s-1) (the 2^126 of the e2m1 → bf16 bit trick folded in), 64
// bytes per slab-chunk in a parallel stream:
// [g 0..7][(row g, blk 0), (row g, blk 1), (row g+8, blk 0), (row g+8, blk 1)]. gate_up = true
// regroups the interleaved rows so that slab s holds gate rows 8s..8s+7 then up rows 8s..8s+7
// (SwiGLU fuses in registers).
// A scale byte > 128 (2^(s-1) not a finite bf16) sets *bad_scale (device int) to that byte.
size_t mxfp4_fragment_bytes(uint32_t N, uint32_t K);
size_t mxfp4_scale_bytes(uint32_t N, uint32_t K);
[[nodiscard]] gptoss_status repack_mxfp4(const uint8_t* blocks, const uint8_t* scales, uint32_t N,
                                         uint32_t K, bool gate_up, void* out, void* out_scales,
                                         int* bad_scale, cudaStream_t stream);

// bf16 [n] → fp32 [n]. gate_up = true applies the gate/up regrouping of repack_mxfp4 to a
// [2I] bias (output index 16s + r, r < 8: gate 8s + r; r >= 8: up 8s + r - 8).
[[nodiscard]] gptoss_status bf16_to_f32(const void* raw, uint32_t n, bool gate_up, float* out,
                                        cudaStream_t stream);

// Synthetic weights (bench): fills `n_words` 32-bit words with a deterministic hash of
// (seed, index) — random bf16 pairs with |x| ≲ amplitude when `bf16`, otherwise random bytes.
[[nodiscard]] gptoss_status fill_random(void* out, size_t n_words, uint64_t seed, bool bf16,
                                        float amplitude, cudaStream_t stream);
// Fills n fp32 with center + amplitude·u, u uniform in [-1, 1).
[[nodiscard]] gptoss_status fill_random_f32(float* out, size_t n, uint64_t seed, float center,
                                            float amplitude, cudaStream_t stream);
// Fills the bf16 scale stream of n_scales entries with 2^(s-1) for s uniform in [lo, hi].
[[nodiscard]] gptoss_status fill_random_scales(uint16_t* out, size_t n_scales, uint64_t seed,
                                               int lo, int hi, cudaStream_t stream);

// ---------------------------------------------------------------------------
// GEMM (gemm.cu): out[row, n] = Σ_k x[row, k] · W[n, k] + bias[n], tensor cores (mma.sync
// m16n8k16, bf16 in, fp32 accumulate), weights as the MMA A operand.

enum class Epilogue : int {
    kStore = 0,   // out_f32[row, n] = acc + bias
    kAdd = 1,     // out_f32[row, n] += acc + bias          (residual add of O-proj)
    kSwiglu = 2,  // out_bf16 permuted [row, N/2]: SwiGLU-OAI of the gate/up regrouped rows
};

struct GemmWeights {
    const void* w = nullptr;           // fragment layout (bf16 or MXFP4), expert 0
    const uint16_t* scales = nullptr;  // MXFP4 only
    const float* bias = nullptr;       // fp32 [N] (expert 0), may be null
    bool mxfp4 = false;
    uint32_t N = 0, K = 0;
    size_t w_expert_stride = 0;        // bytes between experts
    size_t s_expert_stride = 0;        // scale elements between experts
    size_t bias_expert_stride = 0;     // floats between experts
};

// MoE routing for a grouped GEMM (built by router_route on the device): tiles[0] = number of
// tiles, then per tile (expert, start, count) into pairs; pairs = sorted (token·K + slot) ids.
// The input row of pair p is p / in_div; its output row is p.
struct GemmRoute {
    const int32_t* tiles = nullptr;
    const int32_t* pairs = nullptr;
    uint32_t in_div = 1;
    uint32_t max_tiles = 0;
    uint32_t tile_tokens = 64;  // most pairs per tile (router_route's tile_tokens)
    // router_route's tile_extra: an expert's last tile may hold up to tile_tokens + tile_extra
    // pairs (0, or 32 with 64- or 256-pair tiles: gemm_prefill_tile_extra).
    uint32_t tile_extra = 0;
};

// x: bf16 permuted [n_rows, K] (dense) or indexed through route. nb = 8-token column tiles per
// CTA: 1 (decode), 2 (the batched step's expert tiles of 16 pairs) or 8 (prefill); results do
// not depend on nb. ldo: output row stride in
// elements. swiglu_limit for kSwiglu.
[[nodiscard]] gptoss_status gemm(const GemmWeights& w, const uint16_t* x, uint32_t n_rows,
                                 const GemmRoute* route, Epilogue epilogue, float* out_f32,
                                 uint16_t* out_bf16, uint32_t ldo, float swiglu_limit, int nb,
                                 cudaStream_t stream);

// Prefill GEMM (gemm_prefill.cu): the same product and epilogues as gemm() for a chunk of
// tokens, CTA tiles of 128 weight rows × 64 or 128 tokens through a shared-memory pipeline.
// Every output sums its K in one fixed order (64-k chunks in order, k16 steps in order), so a
// token's result never depends on the chunk, the tile or its neighbours; it differs from gemm()
// in the last bits. route->tile_tokens must be 64 or 128 (tiles of at most that many pairs), or
// 256 for MXFP4 weights on the warp-specialized sm_90a kernel (kSm90Ws).
// kernel: kAuto = on sm_90a the shared-memory wgmma kernel (gemm_prefill_sm90.cu) as
// GPTOSS_GEMM_SM90 says (0 none, 1 MXFP4 GEMMs, 2 all = the default), else mma.sync, or the
// register-A wgmma kernel with GPTOSS_GEMM_WGMMA=1 (slower); kAuto's choice depends only on the
// weight type, never on the chunk. The kernels round differently. Errors: INTERNAL for
// K % 64 != 0, N == 0, a missing output, SwiGLU with N % 128 != 0; UNSUPPORTED for kWgmma /
// kSm90 / kSm90Ws where gemm_prefill_wgmma_supported() is false.
// kSm90Ws: gemm_prefill_ws.cu (warp-specialized, same bits as kSm90).
enum class PrefillKernel : int { kAuto = 0, kMmaSync = 1, kWgmma = 2, kSm90 = 3, kSm90Ws = 4 };
[[nodiscard]] gptoss_status gemm_prefill(const GemmWeights& w, const uint16_t* x, uint32_t n_rows,
                                         const GemmRoute* route, Epilogue epilogue, float* out_f32,
                                         uint16_t* out_bf16, uint32_t ldo, float swiglu_limit,
                                         cudaStream_t stream, PrefillKernel kernel = PrefillKernel::kAuto);
// True on a compute capability 9.0 device whose loaded code has the sm_90a features (wgmma).
// The first call per device runs a one-thread probe kernel and waits for it.
bool gemm_prefill_wgmma_supported();
// Route tile width for gemm_prefill: 128 when the average expert has >= 128 pairs (256 instead
// where kAuto's MXFP4 kernel is kSm90Ws and GPTOSS_SM90_WS_VARIANT is 10, 11 or 12, the
// default), else 64 (128 from 32 pairs with GPTOSS_PREFILL_TILE_MIN=128 on kSm90Ws).
uint32_t gemm_prefill_tile_tokens(uint32_t n_pairs, uint32_t n_experts);
// Extra pairs an expert's last route tile may take for gemm_prefill (GemmRoute::tile_extra), so
// an expert a little over a tile is one tile (one dequantization of its weights) instead of a
// tile + a remainder: 32 with 64-pair MXFP4 tiles on the sm_90a kernels (default: the 120b at
// 2048 tokens, ~64 pairs an expert, +15 %; GPTOSS_PREFILL_TILE_EXTRA64=0 turns it off;
// bench/NOTES.md v24); 32 with 256-pair tiles under GPTOSS_PREFILL_TILE_EXTRA=32 (or =33: the
// variant with a shallower refill lag; off: 12 % slower on the 20b at 2048 tokens, v16 round 5);
// else 0.
uint32_t gemm_prefill_tile_extra(uint32_t tile_tokens);

// Decode GEMV (gemm_decode.cu), one token: the same products as gemm(nb = 1) summed in an order
// of its own (K split over `warps` warps per 16-row slab, fixed warp order: deterministic, not
// bit-identical to gemm). x: bf16 permuted [1, K] dense, or indexed through a T = 1 route (one
// pair per tile: router_decode's route). route_ready: the route was complete before the
// previous kernel's dependency wait (MoE down after gate_up), so it and the first weight chunks
// are read before this kernel's own wait. Other arguments as gemm.
struct DecodeGemv {
    uint32_t warps = 4;   // warps splitting K per slab
    uint32_t depth = 4;   // weight chunks in flight per warp
    bool shfl_x = false;  // activation row as one word per lane, B fragments by shuffles
    // Take the instance compiled for this K (gpt-oss's 2880 or 4096) when there is one (the same
    // bits as the any-K kernel).
    bool fixed_k = false;
};
// The variants in use: defaults, overridden for A/B runs by GPTOSS_DECODE_BF16 / _FP4 =
// "WARPS,DEPTH,SHFL", GPTOSS_DECODE_ROUTE_READY = 0|1, GPTOSS_DECODE_FIXED_K / _FIXED_K_BF16 = 0|1 (the
// MXFP4 / bf16 variant's fixed_k). Read once per process.
struct DecodeTuning {
    // Both take the fixed-K instances at gpt-oss's K (2880, 4096; any other K takes the any-K
    // kernel of the same variant, with the same bits): H200 20b tg128 +5.1-5.4 % at depth 0, +4.5-4.9 %
    // at 8 192, 120b +4.5-5.2 % against the any-K kernels (bench/NOTES.md "v40").
    DecodeGemv bf16{8, 4, false, true};
    // MXFP4: the activation row is staged in shared memory (bf16), so shfl_x has no effect. The
    // fixed-K ring of 4 (80 registers: 6 CTAs of 4 warps per SM) beat the any-K ring of 6 (72
    // registers, 7 CTAs; "v39") by ~2.3 % alone; the fixed-K rings of 5, 6, 8 lost ("v40").
    DecodeGemv fp4{4, 4, true, true};
    bool route_ready = true;
};
const DecodeTuning& decode_tuning();
// Every compiled (mxfp4, variant) pair (tests run them all).
std::vector<std::pair<bool, DecodeGemv>> decode_gemv_variants();
// The fixed-K instances, v.fixed_k set (tests compare each with the any-K instance of its variant,
// bit for bit).
struct DecodeFixedK {
    bool fp4;
    DecodeGemv v;
    uint32_t K;
};
std::vector<DecodeFixedK> decode_gemv_fixed_k();
// The decode router folded into the O projection (router_fold.cu, router_fold.cuh; issue 12):
// gemm_decode of O with epilogue kAdd also computes the MoE router's route from the new residual
// row x [H]: xn = bf16(x · inv · norm_w) (bf16 permuted [H], as router_decode), logits = inv ·
// (W_r · (x ⊙ norm_w)) + b (fp32 [E]; within fp32 rounding of router_decode's from the fp32 row,
// not its bits), experts / weights / tiles / pairs as router_route(logits, T = 1). Replaces
// router_decode's launch in the decode graph when router_fold_default() (off: slower on an H100,
// bench/NOTES.md "v49"). Usable where router_fold_supported(E, K, H) and the bf16 variant has a fold
// instance (decode_gemv_fold_usable).
struct RouterFoldArgs {
    const uint16_t* w = nullptr;       // router weights in router_fold_pack's layout
    const float* bias = nullptr;       // fp32 [E] (nullptr: none)
    const float* norm_w = nullptr;     // the MLP RMSNorm weight, fp32 [H]
    float eps = 0.0f;
    uint32_t E = 0;                    // experts
    uint32_t K = 0;                    // top-K
    float* partial = nullptr;          // scratch, fp32 [ceil(H / 16)][E + 1]
    int* counter = nullptr;            // one device int, 0 before the first call (re-armed)
    uint16_t* xn = nullptr;
    float* logits = nullptr;
    int32_t* experts = nullptr;
    float* weights = nullptr;
    int32_t* tiles = nullptr;
    int32_t* pairs = nullptr;
    int topk_redux = 0;                // set by gemm_decode from router_topk_redux()
    // The CTAs' arrival: 0 = a fence per thread + a relaxed atomic, 1 = one acquire-release atomic
    // (the same bits), -1 = router_fold_acq_rel().
    int acq_rel = -1;
};
// E <= 128, 1 <= K <= min(E, 8), H % 64 == 0, H <= 4096.
bool router_fold_supported(uint32_t E, uint32_t K, uint32_t H);
// Bytes of the fold layout: bf16 [ceil(H / 16)][E][16] (slab s, expert e, row r = W_r[e, 16s + r]).
size_t router_fold_bytes(uint32_t E, uint32_t H);
// The fold layout from the router's bf16 fragment weights (repack_bf16's layout of [E, H]), on
// the device; out: router_fold_bytes(E, H).
[[nodiscard]] gptoss_status router_fold_pack(const void* router_fragments, uint32_t E, uint32_t H, uint16_t* out,
                                             cudaStream_t stream);
// GPTOSS_DECODE_ROUTER_FOLD (0 / 1), else the built-in default; read once.
bool router_fold_default();
// GPTOSS_DECODE_ROUTER_FOLD_ACQREL (0 / 1), else the built-in default; read once.
bool router_fold_acq_rel();
// Whether gemm_decode has a fold instance for this bf16 variant at K.
bool decode_gemv_fold_usable(const DecodeGemv& v, uint32_t K);
// fold: non-null = the router fold above (dense, epilogue kAdd, w.N = H; else GPTOSS_ERR_INTERNAL).
[[nodiscard]] gptoss_status gemm_decode(const GemmWeights& w, const uint16_t* x, const GemmRoute* route,
                                        bool route_ready, Epilogue epilogue, float* out_f32, uint16_t* out_bf16,
                                        uint32_t ldo, float swiglu_limit, const DecodeGemv& variant,
                                        cudaStream_t stream, const RouterFoldArgs* fold = nullptr);

// ---------------------------------------------------------------------------
// Residual stream + RMSNorm (rmsnorm.cu). One CTA per token:
//   mode kEmbed:    x[t] = embed[tokens[t]] (bf16 [V, H] table)
//   mode kMoeAdd:   x[t] += Σ_s weights[t, s] · part[t·K + s]   (slots in router order)
//   mode kNone:     x unchanged
// then xn[t] = bf16(x[t] / sqrt(mean(x[t]²) + eps) · norm_w), permuted layout. x: fp32 [T, H].
enum class ResidualMode : int { kNone = 0, kEmbed = 1, kMoeAdd = 2 };
// A split model's all-reduce folded into the kernel that needs it (issue 15; cuda/multi_gpu.h
// rank_ll_reduce picks the slot, cuda/ll.cuh is the device side): each rank stores its
// contribution to element i as a (value, sequence number) pair, NCCL's LL protocol, at pair i of
// region `rank` of the slot in every other rank's window (dst[r], over NVLink), then waits in its
// own slot (src, region r at r · count pairs) until each peer's pair carries the number and sums
// the values in rank order 0..n-1, its own from registers: rank_all_reduce's bits without its
// kernel (decode's MoE combine, residual_rmsnorm). ctl: the slot's [last sequence number, CTAs
// done]; the kernel reads ctl[0] + 1 after its dependency wait and its last CTA writes the number
// back (the rule of rank_comm.cu's LSA kernel, which uses the same slots).
constexpr uint32_t kLlMaxRanks = 8;
struct LlReduce {
    uint2* dst[kLlMaxRanks] = {};  // region `rank` of the slot in rank r's window (r != rank)
    const uint2* src = nullptr;    // this rank's slot
    uint32_t* ctl = nullptr;
    uint32_t n = 0;                // ranks; 0: no all-reduce
    uint32_t rank = 0;
    uint32_t count = 0;            // floats all-reduced (pairs per region)
};
struct ResidualArgs {
    ResidualMode mode = ResidualMode::kNone;
    const uint16_t* embed = nullptr;   // kEmbed
    const int32_t* tokens = nullptr;   // kEmbed, device [T]
    const float* part = nullptr;       // kMoeAdd: fp32 [T·K, H]
    // kMoeAdd of a split model at T = 1 (ll.n > 0, ll.count = H): x[0] becomes the all-reduce of
    // each rank's (rank 0: x[0], others: 0) + Σ_s weights · part, then the norm (one kernel for
    // memset + combine + rank_all_reduce + residual_rmsnorm(kNone), the same bits).
    LlReduce ll;
    const float* weights = nullptr;    // kMoeAdd: fp32 [T, K]
    uint32_t K = 0;
};
[[nodiscard]] gptoss_status residual_rmsnorm(const ResidualArgs& args, float* x, const float* norm_w,
                                             float eps, uint16_t* xn, uint32_t T, uint32_t H,
                                             cudaStream_t stream);

// ---------------------------------------------------------------------------
// RoPE (rope.cu): qkv fp32 [T, (Q + 2G)·D] (q | k | v) → q fp32 [T, Q, D] rotated, k bf16
// [T, G, D] rotated, v bf16 [T, G, D]. YaRN inv_freq fp32 [D/2] on the device; cos and sin
// are multiplied by `scale`. Position of token t = step->pos0 + t. With k_cache/v_cache
// (decode, T = 1) k and v go straight to cache slot position % slots instead of k/v (the
// slot's old key, position − slots, is never visible to this query).
[[nodiscard]] gptoss_status rope_qkv(const float* qkv, const StepInfo* step, const float* inv_freq,
                                     float scale, float* q, uint16_t* k, uint16_t* v, uint16_t* k_cache,
                                     uint16_t* v_cache, uint32_t slots, uint32_t T, uint32_t Q, uint32_t G,
                                     uint32_t D, cudaStream_t stream);

// ---------------------------------------------------------------------------
// Attention with sinks (attention.cu), D = 64. Keys at positions >= pos0 come from the chunk's
// k_new/v_new [T, G, D] (or from the cache too when k_new is null: decode wrote them there);
// earlier keys from the cache [slots, G, D] at slot = position % slots.
// window: 0 = causal over all, else keys p-window+1 .. p. sinks fp32 [Q]. out bf16 permuted
// [T, Q·D]. Keys are processed in absolute 64-key blocks (decode: grouped into 128-key splits
// merged in order), so each kernel is deterministic and prefill is chunk-invariant.
struct AttentionArgs {
    const float* q = nullptr;
    const uint16_t* k_new = nullptr;
    const uint16_t* v_new = nullptr;
    uint16_t* k_cache = nullptr;  // written by the decode kernel with RoPE fused (qkv set)
    uint16_t* v_cache = nullptr;
    uint32_t slots = 0;
    uint32_t window = 0;
    const float* sinks = nullptr;
    const StepInfo* step = nullptr;
    uint32_t T = 0, Q = 0, G = 0, D = 0;
    uint16_t* out = nullptr;
    // Decode only, RoPE fused: when qkv (fp32 [(Q + 2G)·D], the QKV projection of the token) is
    // set, q is ignored; the kernel rotates q and the new key with rope_qkv's arithmetic
    // (inv_freq fp32 [D/2], rope_scale) and writes the new k/v to cache slot pos0 % slots itself,
    // so decode needs no rope_qkv launch. Results are bit-identical to rope_qkv + attention.
    const float* qkv = nullptr;
    const float* inv_freq = nullptr;
    float rope_scale = 1.0f;
    // attention_decode's shortest split (decode_split_len's min_len); attention_decode sets it
    // from decode_attention_split_min(), whatever the caller put here.
    uint32_t split_min = 128;
    // Tensor-core split only, set by attention_decode from decode_attention_window_whole()
    // (attention_decode_batch: 0), whatever the caller put here: a lone query's sliding window of
    // at most kBatchAttentionSplit keys is one split, as the batched step takes it.
    uint32_t window_whole = 0;
    // Tensor-core split only, set by attention_decode (attention_decode_batch: 0), whatever the
    // caller put here; neither changes the bits. head_major: the grid is (G, splits), so the kv
    // heads of one split, which read the same 1 KB rows of the cache, are launched together
    // (GPTOSS_DECODE_ATTN_HEAD_MAJOR=0: (splits, G)). merge_staged: the kv head's last CTA copies
    // up to 30 partials per warp into its free stages at once (one L2 round trip per 30 instead of
    // per 8) before folding them in split order (GPTOSS_DECODE_ATTN_MERGE_STAGED=0: registers).
    uint32_t head_major = 0, merge_staged = 0;
    // Tensor-core split only, set by attention_decode (attention_decode_batch: 0): the kv head's
    // last CTA merges the partials in two passes (all weights at once, then the o rows in split
    // order) instead of the left fold; other bits (decode_attention_merge_two_pass).
    uint32_t merge_two_pass = 0;
    // Lone query only (the batched step keeps batch_split_len), set by attention_decode from
    // decode_attention_max_splits(): 0 = decode_split_len_target's lengths, else decode_split_len's
    // with at most that many splits (lone_split_len).
    uint32_t split_max = 0;
    // Lone query, split_max 0: decode_split_len_target's ramp (1) or v43's step (0), set by
    // attention_decode from decode_attention_split_ramp().
    uint32_t split_ramp = 1;
};
// Floats per (head, split) partial of the decode attention: D outputs, m, l, 2 pad (16-byte rows).
constexpr uint32_t attn_partial_floats(uint32_t D) { return D + 4; }
constexpr uint32_t kAttentionSplit = 128;
// Decode attention splits: kAttentionSplit keys each, the length doubled while more than
// kMaxDecodeSplits splits would be needed for keys 0..pos (positions >= 16 384). A function of the
// position alone, so a token's bits do not depend on the grid, the batch or the session; at long
// contexts it keeps the merge (serial, in split order, by the last CTA of each kv head) to at
// most kMaxDecodeSplits partials: with 128-key splits a 130k-token context had ~1 000 of them,
// a chain of ~130 dependent L2 round trips per full layer.
#ifndef GPTOSS_MAX_DECODE_SPLITS  // build-time tuning knob (tools/device runs); 128 measured best
#define GPTOSS_MAX_DECODE_SPLITS 128
#endif
constexpr uint32_t kMaxDecodeSplits = GPTOSS_MAX_DECODE_SPLITS;
// min_len: the shortest split (a power of two >= kAttentionSplit; decode_attention_split_min()).
// max_splits: the most splits (0 = kMaxDecodeSplits; decode_attention_max_splits() for a lone query).
constexpr uint32_t decode_split_len(uint32_t pos, uint32_t min_len = kAttentionSplit, uint32_t max_splits = 0) {
    const uint32_t most = max_splits ? max_splits : kMaxDecodeSplits;
    uint32_t len = min_len;
    while (pos / len + 1 > most) len *= 2;
    return len;
}
// The lone query's split length (attention_decode's default since bench/NOTES.md "v43"): about
// 17 splits per kv head below 16 384 keys and about 33 from there (at depth: one wave of 2 CTAs per
// SM on a 132-SM GPU), in multiples of 128 keys (every warp of the tensor-core split walks as many
// 16-key sub-blocks), at least min_len. H200, 20b tg128, against decode_split_len with 128 splits
// at most (bench/NOTES.md "v43"): level at 4 096 keys, +1.2 % at 8 192 (17 splits of 512 against 33
// of 256), +3.9 % at 12 288, +4.7 % at 16 384, +8.2 % at 24 576, +4.1 % at 32 768, +7.2 % at
// 49 152, +3.6 % at 65 536 (17 splits instead of 33 gave +4.0 %, +1.8 %, -1 % at 16 384, 32 768,
// 65 536). A function of the position alone; never more splits than decode_splits_needed(pos).
// ramp (the default since bench/NOTES.md "v44"; AttentionArgs::split_ramp): the target grows
// from 17 to 33 between ~9 250 and 32 768 keys as isqrt(pos / 32) + 1 (a split's time grows with
// its keys, the merge's with the number of splits n = pos / len: a · len + b · n is least at
// len = sqrt(b / a · pos), and the measured best splits sat near len = 32 n); 17 below, 33 from
// 32 768 (one wave at depth). Else v43's step (17 below 16 384 keys, 33 from there). v44 (H200, 20b
// tg128, against the step): +0.8 % at 12 288 (20 splits against 17) and at 16 384 (22 against 33),
// +0.2 % at 20 480, -0.4 % at 24 576 (within the spread).
constexpr uint32_t decode_split_target(uint32_t pos, bool ramp = true) {
    if (!ramp) return pos < 16384 ? 17 : 33;
    uint32_t target = 17;
    while (target < 33 && target * target <= pos / 32) ++target;
    return target;
}
constexpr uint32_t decode_split_len_target(uint32_t pos, uint32_t min_len, bool ramp = true) {
    const uint32_t target = decode_split_target(pos, ramp);
    const uint32_t len = 128 * ((pos + 128 * target) / (128 * target));  // 128 * ceil((pos + 1) / (128 * target))
    return len > min_len ? len : min_len;
}
// Splits covering keys 0..pos (at most kMaxDecodeSplits); with min_len = kAttentionSplit an
// upper bound for every longer min_len.
constexpr uint32_t decode_splits_needed(uint32_t pos, uint32_t min_len = kAttentionSplit) {
    return pos / decode_split_len(pos, min_len) + 1;
}
// The batched step's splits (attention_decode_batch): at least kBatchAttentionSplit keys, so each of
// a CTA's 8 warps walks several 16-key sub-blocks with the next one in flight (128-key splits gave
// each warp one, and a CTA's life was its load and merge latency: H200, 64 streams, bench/NOTES.md
// "v20 batched attention"). Also a function of the position alone (batch invariance); its bits
// differ from attention_decode's.
// min_len 0 (the default since bench/NOTES.md "v44"): twice the lone query's split
// (decode_split_len_target), at least kBatchAttentionSplit: 512 keys up to ~4 300, 1 024 at 8 192,
// 2 048 at 32 768, ~17 splits at most; a batch of two or more sessions has the parallelism the lone
// query's splits buy. H200, 20b decode tok/s against the rule before (512, then decode_split_len;
// bench/NOTES.md "v44"): 2 streams at 8 192 keys +0.9 %, 8 at 8 192 +1.2 %, 2 at 32 768 +5.7 %,
// 2 at 65 536 +3.5 %; the same splits below ~4 300 keys (64 streams of 1 024 tokens level).
// min_len > 0: batch_attention_split()'s tuning knob GPTOSS_DECODE_BATCH_ATTN_SPLIT (256, 512, 1 024
// or 2 048: at least min_len keys, past that decode_split_len, the rule before v44). Read once per
// process; a process keeps one, since the bits of a full layer depend on it.
constexpr uint32_t kBatchAttentionSplit = 512;
constexpr uint32_t batch_split_len(uint32_t pos, uint32_t min_len = 0) {
    const uint32_t len = min_len ? decode_split_len(pos) : 2 * decode_split_len_target(pos, kAttentionSplit);
    const uint32_t least = min_len ? min_len : kBatchAttentionSplit;
    return len > least ? len : least;
}
constexpr uint32_t batch_splits_needed(uint32_t pos, uint32_t min_len = 0) {
    return pos / batch_split_len(pos, min_len) + 1;
}
uint32_t batch_attention_split();
// How many of a kv head's splits one CTA of the batched tensor-core attention takes (its bits do not
// depend on it; batch_attention_group in batch_decode.h): the power of two g <= max_splits that
// minimizes (waves of pairs · ceil(max_splits / g) CTAs at two per SM) · g, + 1 while a kv head
// still spans several CTAs (their partials' merge), the smaller g on a tie. pairs = sessions · kv
// heads. H200, 20b (bench/NOTES.md "v29"): 64 sessions at 2-4 splits take them all, 8 sessions at
// 9-16 splits and a lone session take one.
constexpr uint32_t batch_attention_group_for(uint64_t pairs, uint32_t max_splits, uint32_t sms) {
    const uint64_t slots = 2ull * (sms > 0 ? sms : 1u);
    const uint32_t splits = max_splits > 0 ? max_splits : 1u;
    uint32_t best = 1;
    uint64_t best_cost = ~0ull;
    for (uint32_t g = 1; g <= splits; g *= 2) {
        const uint64_t ctas = pairs * ((splits + g - 1) / g);
        const uint64_t cost = (ctas + slots - 1) / slots * g + (g < splits ? 1u : 0u);
        if (cost < best_cost) {
            best_cost = cost;
            best = g;
        }
    }
    return best;
}
// A sliding window of at most kBatchAttentionSplit keys goes through the batched step in one
// split, keys [pos - window + 1, pos] (one CTA per kv head, no partials to merge, whatever the
// window's place against the split grid; a function of the position alone, so still batch
// invariant): attention_decode_batch's launch for such a layer needs max_splits = 1.
constexpr bool batch_window_whole(uint32_t window) { return window > 0 && window <= kBatchAttentionSplit; }
// The CTA size of such a window's batched kernel: 4 warps (the default: a 64-session step's CTAs fit
// one wave) or 8 (the full layers' kernel); GPTOSS_DECODE_BATCH_ATTN_WINDOW_WARPS=4|8, read once,
// or set_batch_attention_window_warps (4, 8; 0 = that). The two give different bits, so a process
// that batches keeps one (batch invariance holds within either).
uint32_t batch_attention_window_warps();
void set_batch_attention_window_warps(uint32_t warps);
// Prefill / any T (attention_prefill.cu, tensor cores): one CTA per (16 tokens, kv head); q is
// rounded to bf16 (after the exact 1/8 scale), so are the softmax weights for the P·V product.
// A row's bits do not depend on T or on the chunking. k_new/v_new must be set; fails with
// INVALID_ARGUMENT for slots = 0, UNSUPPORTED for D != 64, more than 8 heads per kv head or
// more than 65535·16 tokens.
[[nodiscard]] gptoss_status attention_prefill(const AttentionArgs& args, cudaStream_t stream);
// Decode (T = 1): one CTA per (split, kv head) for max_splits splits starting at the split of
// the first visible key (early exit past the position); the last CTA of each kv head merges
// in order. partial: fp32 [Q, max_splits, attn_partial_floats(D)]; max_splits must be at least
// the number of splits the visible range touches (the split rule is decode_attention_max_splits';
// decode_splits_needed(pos) bounds every rule for a full layer);
// counters: int [G], zero before the first call (the merging CTA re-arms them).
[[nodiscard]] gptoss_status attention_decode(const AttentionArgs& args, float* partial, int* counters,
                                             uint32_t max_splits, cudaStream_t stream);
// Which decode split attention_decode and attention_decode_batch run: true (default) the
// tensor-core split, q and the softmax weights rounded to bf16 as in attention_prefill; false
// (GPTOSS_DECODE_ATTN_MMA=0) the per-head FMA split, exact fp32 q and softmax weights. Both are
// deterministic. set_decode_attention_mma is for tests and benchmarks: switch it only while no
// decode runs, and re-capture decode graphs after.
bool decode_attention_mma();
void set_decode_attention_mma(bool on);
// K/V sub-blocks in flight per warp in attention_decode's tensor-core split: 2 (default; 66 KB of
// shared memory per CTA) or 1 (GPTOSS_DECODE_ATTN_STAGES=1; 35 KB). The same bits either way
// (only when the loads are issued changes). The batched kernel always uses 1. Setter as above.
int decode_attention_stages();
void set_decode_attention_stages(int stages);
// attention_decode's shortest split in keys: 256 (default), or 128 ... 4096
// (GPTOSS_DECODE_ATTN_SPLIT, rounded down to a power of two; bench/NOTES.md "v26"): longer
// splits give each warp several 16-key sub-blocks and the merging CTA fewer partials, fewer CTAs
// a longer life. A function of the setting and the position, so still deterministic; the bits
// differ between settings. The batched kernel keeps batch_split_len. Setter as above.
uint32_t decode_attention_split_min();
void set_decode_attention_split_min(uint32_t keys);
// Whether attention_decode's tensor-core split takes a sliding window (window <= 512 keys) as one
// split of every visible key (true, the default; GPTOSS_DECODE_ATTN_WINDOW_WHOLE=0 for the split
// grid): one CTA per kv head that merges into the sink in place, where a window straddling a
// split edge (half the positions of a 128-key window against 256-key splits) took two CTAs, their
// partials and the counter's merge (H200, 20b tg128: +1.3 % at 8 192, +1.1 % at 32 768, level at
// 0; bench/NOTES.md "v42"). The bits of sliding layers differ between the settings; either is a
// function of the position. The FMA split keeps the grid. Setter as above.
bool decode_attention_window_whole();
void set_decode_attention_window_whole(bool on);
// AttentionArgs::head_major and merge_staged for attention_decode's tensor-core split: both on by
// default (GPTOSS_DECODE_ATTN_HEAD_MAJOR=0, GPTOSS_DECODE_ATTN_MERGE_STAGED=0 turn them off).
// Together on an H200, 20b tg128: +1.3 % at 8 192, +1.6 % at 32 768 (each alone −0.6..+1.1 %);
// bench/NOTES.md "v42". Neither changes the bits. Setters as above.
bool decode_attention_head_major();
void set_decode_attention_head_major(bool on);
bool decode_attention_merge_staged();
void set_decode_attention_merge_staged(bool on);
// The lone query's merge of a kv head's split partials in two passes (the largest maximum, then
// every split's weight at once, then the o rows in split order) instead of the left fold over the
// splits, whose exp per split is a dependent chain: other bits, a function of the position as
// before. GPTOSS_DECODE_ATTN_MERGE_2PASS=0 gives the fold back; default on.
bool decode_attention_merge_two_pass();
void set_decode_attention_merge_two_pass(bool on);
// The lone query's split rule: 0 (the default) = decode_split_len_target; 16, 32, 64 or 128 =
// decode_split_len with at most that many splits (128 = kMaxDecodeSplits: the rule before v43).
// GPTOSS_DECODE_ATTN_MAX_SPLITS overrides (tuning).
uint32_t decode_attention_max_splits();
void set_decode_attention_max_splits(uint32_t splits);
// decode_split_len_target's ramp (default on; GPTOSS_DECODE_ATTN_SPLIT_RAMP=0: v43's step).
bool decode_attention_split_ramp();
void set_decode_attention_split_ramp(bool on);

// Copies the chunk's k/v [T, G·D] into the cache: positions max(pos0, pos0 + T - slots) ..
// pos0 + T - 1 to slot = position % slots.
[[nodiscard]] gptoss_status kv_commit(const uint16_t* k_new, const uint16_t* v_new, uint16_t* k_cache,
                                      uint16_t* v_cache, uint32_t slots, const StepInfo* step,
                                      uint32_t T, uint32_t GD, cudaStream_t stream);

// ---------------------------------------------------------------------------
// Router (router.cu): logits fp32 [T, E] → experts int32 [T, K] (descending, ties: lower
// expert), weights fp32 [T, K] = softmax of the K logits; plus the grouped-GEMM route for
// tiles of `tile_tokens` pairs (see GemmRoute). tiles: int32 [1 + 3·max_tiles], pairs [T·K].
// tile_extra > 0: an expert's last tile takes up to tile_extra pairs more instead of a tile of
// its own (never more tiles than without it, so route_max_tiles still bounds them).
uint32_t route_max_tiles(uint32_t T, uint32_t E, uint32_t K, uint32_t tile_tokens);
[[nodiscard]] gptoss_status router_route(const float* logits, uint32_t T, uint32_t E, uint32_t K,
                                         int32_t* experts, float* weights, int32_t* tiles,
                                         int32_t* pairs, uint32_t tile_tokens, cudaStream_t stream,
                                         uint32_t tile_extra = 0);
// router_route's second half: the tiles and pairs from experts int32 [T, K] already chosen (the
// fused routers write experts themselves). Same arguments and errors as router_route.
[[nodiscard]] gptoss_status router_group(const int32_t* experts, uint32_t T, uint32_t E, uint32_t K, int32_t* tiles,
                                         int32_t* pairs, uint32_t tile_tokens, cudaStream_t stream,
                                         uint32_t tile_extra = 0);

// Decode (T = 1) fused router: xn = RMSNorm(x) · norm_w (bf16 permuted [H], as
// residual_rmsnorm kNone), logits = router(xn) (as gemm), then experts/weights/tiles/pairs as
// router_route(logits, T = 1) — bit-identical to those three launches, in one. x: fp32 [H]
// (read only); router: bf16 fragment weights [E, H] + fp32 bias [E]; logits: fp32 [E] (written);
// counter: one device int, zero before the first call (the kernel re-arms it).
// Supported when router_decode_supported(E, K, H): E <= 256, K <= 8, H % 64 == 0, H <= 4096.
struct RouterDecodeArgs {
    const float* x = nullptr;
    const float* norm_w = nullptr;
    float eps = 0.0f;
    GemmWeights router;
    uint32_t K = 0;
    uint16_t* xn = nullptr;
    float* logits = nullptr;
    int* counter = nullptr;
    int32_t* experts = nullptr;
    float* weights = nullptr;
    int32_t* tiles = nullptr;
    int32_t* pairs = nullptr;
    // The cross-CTA step: 1 = one thread-block cluster (DSMEM; used where the device, the binary
    // and E <= 128 allow, else the counter), 0 = the global counter (then `counter` is
    // required), -1 = router_decode_cluster_default().
    int cluster = -1;
    // Warps per slab CTA: 4 = gemm()'s summation order (bit-identical to residual_rmsnorm + gemm +
    // router_route; what a batched step of one token needs, to equal router_batch), 8 or 16 = the
    // slab's chunks split further (logits within fp32 rounding of those), 0 =
    // router_decode_warps_default(). Anything else: GPTOSS_ERR_INTERNAL.
    uint32_t warps = 0;
    // Set by router_decode / router_batch from router_topk_redux(), whatever the caller put here.
    int topk_redux = 0;
};
// The routers' top-K (router_route, router_decode, router_batch) selects by the warp's integer
// max reduction when no logit is NaN (redux.sync, sm_80+; ~4 dependent steps per expert instead
// of a 10-shuffle argmax butterfly), else by the butterfly: the same experts and weights either
// way. GPTOSS_ROUTER_TOPK_REDUX=0 keeps the butterfly always; default on. The setter is for tests
// (re-capture decode graphs after).
bool router_topk_redux();
void set_router_topk_redux(bool on);
bool router_decode_supported(uint32_t E, uint32_t K, uint32_t H);
// GPTOSS_DECODE_ROUTER_WARPS (4 / 8 / 16), else the built-in default; read once.
uint32_t router_decode_warps_default();
// GPTOSS_DECODE_ROUTER_CLUSTER (0 / 1), else the built-in default; read once.
bool router_decode_cluster_default();
// Whether the cluster variant can run for E experts here: sm_90 code for it in this binary, a
// compute capability 9+ device, at most 8 slab CTAs (E <= 128; the portable cluster size).
bool router_decode_cluster_usable(uint32_t E);
[[nodiscard]] gptoss_status router_decode(const RouterDecodeArgs& args, cudaStream_t stream);

// Batched steps (T >= 1 tokens; the batched decoder uses it from T = 2) fused router (router.cu,
// router_decode's kernel with a grid row per token): xn = RMSNorm(x) · norm_w (bf16 permuted [T,
// H], as residual_rmsnorm kNone), logits = router(xn) (fp32 [T, E], as gemm) and experts / weights
// (int32 / fp32 [T, K], as router_route's top-K), bit-identical to those launches at 4 warps (the
// default), in one; router_group then builds the tiles and pairs. x: fp32 [T, H] (read only);
// router: bf16 fragment weights [E, H] + fp32 bias.
// Usable where router_batch_usable(E, K, H): an sm_90 device and binary (thread-block clusters), E
// <= 128, K <= 8, K <= E, H % 64 == 0, H <= 4096 (44 KB of static shared memory per CTA); elsewhere
// router_batch fails with GPTOSS_ERR_UNSUPPORTED and the caller makes the three launches. xn,
// logits, experts and weights are required; T = 0 does nothing.
struct RouterBatchArgs {
    const float* x = nullptr;
    const float* norm_w = nullptr;
    float eps = 0.0f;
    GemmWeights router;
    uint32_t T = 0;
    uint32_t K = 0;
    uint16_t* xn = nullptr;
    float* logits = nullptr;
    int32_t* experts = nullptr;
    float* weights = nullptr;
    // Warps per slab CTA: 4 = gemm()'s order (the bits of the three launches above), 16 = the
    // order of router_decode at 16 warps, token by token (logits within fp32 rounding of gemm()'s;
    // the batched step's GPTOSS_DECODE_BATCH_ROUTER_WARPS). Anything else: GPTOSS_ERR_INTERNAL.
    uint32_t warps = 4;
};
bool router_batch_usable(uint32_t E, uint32_t K, uint32_t H);
[[nodiscard]] gptoss_status router_batch(const RouterBatchArgs& args, cudaStream_t stream);

// ---------------------------------------------------------------------------
// Sampling (sample.cu).
// Greedy argmax of fp32 [V] (lowest id on ties). `out` points to 8 device bytes that receive a
// 64-bit key; the id is ~(uint32_t)key (decode_argmax).
[[nodiscard]] gptoss_status argmax(const float* logits, uint32_t V, int32_t* out, cudaStream_t stream);
inline int32_t decode_argmax(unsigned long long key) { return int32_t(~uint32_t(key)); }

// Samples one token from fp32 logits [V] with the definition of sample_logits
// (gptoss-sampling.cpp), u in [0, 1) drawn by the host: temperature <= 0 → argmax (lowest id
// on ties); else candidates = the top_k largest logits (ties: lower id) if 0 < top_k < V, else
// all; p = exp((l − max)/T) in double; if top_p < 1, the shortest prefix of the candidates
// sorted by (logit desc, id asc) whose cumulative p/total reaches top_p (at least one); then
// the first kept id, in increasing id order, whose running sum of p exceeds u · Σ kept p.
// Writes the id to *token (device int32). Deterministic (fixed reduction trees, exact integer
// masses); it can differ from the host only where u·total or top_p is within double rounding of
// a cumulative sum (sums in another order). One cooperative launch up to V = 256·2048 (no sort:
// radix selects of the k-th key and of the top_p cut), the CUB full sort beyond. scratch:
// device memory of at least sample_scratch_bytes(V) bytes, 256-byte aligned, used by one call at
// a time. Fails with INVALID_ARGUMENT for a non-finite temperature or u outside [0, 1) (the
// engine never passes those).
[[nodiscard]] gptoss_status sample_scratch_bytes(uint32_t V, size_t* bytes_out);
[[nodiscard]] gptoss_status sample(const float* logits, uint32_t V, const SamplingConfig& config, double u,
                                   void* scratch, size_t scratch_bytes, int32_t* token, cudaStream_t stream);
// Whether sample() at T > 0 takes its cooperative path for V on the current device (the one
// cuda/sample_batch.h reproduces bit for bit); false where it would sort instead.
[[nodiscard]] gptoss_status sample_fast_path(uint32_t V, bool* out);

// Constrained decoding (mask.cu): logits[t] = -inf for every t whose bit is clear in `allowed`
// (device, ceil(V/32) u32 words, bit t%32 of word t/32). In place, on `stream`.
[[nodiscard]] gptoss_status apply_token_mask(float* logits, const uint32_t* allowed, uint32_t V, cudaStream_t stream);

// Streaming-read bandwidth probe (bench): sums n 16-byte words into *sink.
[[nodiscard]] gptoss_status read_probe(const void* data, size_t n_words16, float* sink,
                                       cudaStream_t stream);

}  // namespace cuda
}  // namespace gptoss
