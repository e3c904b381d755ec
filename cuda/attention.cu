// cuda/attention.cu - decode attention (one token) with per-head sinks, optional sliding window
// and GQA, plus the KV-cache commit; prefill attention is cuda/attention_prefill.cu (tensor
// cores). Math (MODEL.md §Attention with sinks):
// p_i = exp(s_i − m) / (Σ_j exp(s_j − m) + exp(S − m)), s_i = q·k_i / sqrt(D), out = Σ p_i v_i.
//
// Mapping: a warp owns one head of one split. Lane l owns keys l and l+32 of each 64-key block
// for the scores and dims 2l, 2l+1 of the output. Keys are visited in absolute 64-key blocks,
// grouped into splits of lone_split_len (kernels.h decode_split_len_target; batched: batch_split_len)
// keys: each split is an online softmax from scratch, and
// splits are merged in increasing order into a state that starts as the sink (M = S, L = 1,
// O = 0). The kernel runs one CTA per split and its last CTA per kv head merges (with a single
// split, that CTA merges in place). It also applies RoPE to q and the new key and writes the
// new K/V to the cache (no rope_qkv launch). Every fp32 operation is explicitly rounded, so
// decode is deterministic run to run (it need not match prefill bit for bit: only
// prefill-written K/V is ever reused).
// Floor: K/V bytes, 2·G·D·2 = 2 KB per visible key per layer.
// By default each split is computed on tensor cores instead (attention_decode_cta_mma below;
// cuda/attention_mma.cuh; GPTOSS_DECODE_ATTN_MMA=0 for the FMA split): same grid, partials and
// merges, q and the softmax weights in bf16; a sliding window is one split of its own
// (kernels.h decode_attention_window_whole), one CTA per kv head; the grid is head-major and the
// last CTA per kv head stages the partials in shared memory (decode_attention_head_major,
// decode_attention_merge_staged; the same bits) and merges them in two passes
// (decode_attention_merge_two_pass; other bits than the fold). Those process settings live in
// cuda/attention_settings.cu.
#include "cuda/attention_mma.cuh"
#include "cuda/common.cuh"
#include "cuda/batch_decode.h"
#include "cuda/kernels.h"

#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>

namespace gptoss {
namespace cuda {
namespace {

constexpr int kD = 64;
constexpr int kBlock = 64;
constexpr int kMaxHeads = 8;      // query heads per kv head
constexpr int kRowWords = 33;     // 64 bf16 + 1 pad word: conflict-free column reads
constexpr int kPartial = int(attn_partial_floats(kD));  // floats per (head, split) partial

// Online-softmax state of NH heads (lane l holds output dims 2l, 2l+1).
template <int NH>
struct SplitState {
    float m[NH], l[NH], o[NH][2];
};

template <int NH>
__device__ __forceinline__ void reset(SplitState<NH>& st) {
#pragma unroll
    for (int h = 0; h < NH; ++h) {
        st.m[h] = -INFINITY;
        st.l[h] = 0.0f;
        st.o[h][0] = st.o[h][1] = 0.0f;
    }
}

__device__ __forceinline__ float lo_bf16(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// One 64-key block [kb, kb + 64) for a query at position p seeing keys [lo, p].
// qs: fp32 [NH][64]; ks, vs: [64][kRowWords] words; ps: this warp's fp32 [NH][64]. Heads h >= hpg
// are skipped.
template <int NH>
__device__ __forceinline__ void attend_block(SplitState<NH>& st, const float* qs, const uint32_t* ks,
                                             const uint32_t* vs, float* ps, int kb, int lo, int p,
                                             int hpg, int lane) {
    const int k0 = kb + lane, k1 = kb + lane + 32;
    const bool vis0 = k0 >= lo && k0 <= p, vis1 = k1 >= lo && k1 <= p;
    float s0[NH], s1[NH];
#pragma unroll
    for (int h = 0; h < NH; ++h) s0[h] = s1[h] = 0.0f;
    const uint32_t* kr0 = ks + lane * kRowWords;
    const uint32_t* kr1 = ks + (lane + 32) * kRowWords;
#pragma unroll 4
    for (int d2 = 0; d2 < kD / 2; ++d2) {
        const uint32_t w0 = kr0[d2], w1 = kr1[d2];
        const float a0 = lo_bf16(w0), b0 = hi_bf16(w0), a1 = lo_bf16(w1), b1 = hi_bf16(w1);
#pragma unroll
        for (int h = 0; h < NH; ++h) {
            if (h < hpg) {
                const float2 qv = reinterpret_cast<const float2*>(qs + h * kD)[d2];
                s0[h] = __fmaf_rn(qv.x, a0, s0[h]);
                s0[h] = __fmaf_rn(qv.y, b0, s0[h]);
                s1[h] = __fmaf_rn(qv.x, a1, s1[h]);
                s1[h] = __fmaf_rn(qv.y, b1, s1[h]);
            }
        }
    }
    const float sm_scale = 0.125f;  // 1/sqrt(64), exact
#pragma unroll
    for (int h = 0; h < NH; ++h) {
        if (h >= hpg) break;
        const float a0 = vis0 ? __fmul_rn(s0[h], sm_scale) : -INFINITY;
        const float a1 = vis1 ? __fmul_rn(s1[h], sm_scale) : -INFINITY;
        const float m_new = fmaxf(st.m[h], warp_max(fmaxf(a0, a1)));
        if (m_new == -INFINITY) {
            ps[h * kBlock + lane] = 0.0f;
            ps[h * kBlock + lane + 32] = 0.0f;
            continue;
        }
        const float alpha = expf(st.m[h] - m_new);
        const float e0 = vis0 ? expf(a0 - m_new) : 0.0f;
        const float e1 = vis1 ? expf(a1 - m_new) : 0.0f;
        st.l[h] = __fmaf_rn(st.l[h], alpha, warp_sum(__fadd_rn(e0, e1)));
        st.o[h][0] = __fmul_rn(st.o[h][0], alpha);
        st.o[h][1] = __fmul_rn(st.o[h][1], alpha);
        st.m[h] = m_new;
        ps[h * kBlock + lane] = e0;
        ps[h * kBlock + lane + 32] = e1;
    }
    __syncwarp();
#pragma unroll 4
    for (int j = 0; j < kBlock; ++j) {
        const uint32_t w = vs[j * kRowWords + lane];
        const float vx = lo_bf16(w), vy = hi_bf16(w);
#pragma unroll
        for (int h = 0; h < NH; ++h) {
            if (h < hpg) {
                const float pj = ps[h * kBlock + j];
                st.o[h][0] = __fmaf_rn(pj, vx, st.o[h][0]);
                st.o[h][1] = __fmaf_rn(pj, vy, st.o[h][1]);
            }
        }
    }
    __syncwarp();
}

// Merges a finished split (m, l) into the running (M, L) and returns the weights of the old
// state (a) and of the split (b); merge_o then applies them per output dim.
__device__ __forceinline__ void merge_ml(float& M, float& L, float m, float l, float& a, float& b) {
    const float mn = fmaxf(M, m);
    a = expf(M - mn);
    b = expf(m - mn);
    L = __fadd_rn(__fmul_rn(L, a), __fmul_rn(l, b));
    M = mn;
}
__device__ __forceinline__ void merge_o(float& O, float o, float a, float b) {
    O = __fadd_rn(__fmul_rn(O, a), __fmul_rn(o, b));
}
// One query head's output state (lane l: dims 2l, 2l + 1) as finish_split builds it: the sink,
// then each split's (m, l, o) folded in split order.
struct HeadFold {
    float M, L = 1.0f, O0 = 0.0f, O1 = 0.0f;
    __device__ explicit HeadFold(float sink) : M(sink) {}
    __device__ __forceinline__ void add(float m, float l, float o0, float o1) {
        float wa, wb;
        merge_ml(M, L, m, l, wa, wb);
        merge_o(O0, o0, wa, wb);
        merge_o(O1, o1, wa, wb);
    }
};

// Loads keys [kb, kb + 64) of kv head g into shared memory (zero outside [0, kmax]) with NT
// threads; all of a pass's 16-byte loads are issued before any store, so a pass costs one
// memory round trip.
template <int NT>
__device__ __forceinline__ void load_kv_block(const AttentionArgs& a, int pos0, int kb, int kmax, int g,
                                              uint32_t* ks, uint32_t* vs, int tid) {
    constexpr int kPer = kBlock * 8 / NT;          // 16-byte pieces per thread (8 per 64-dim row)
    constexpr int kBatch = kPer < 8 ? kPer : 8;
    const int GD = int(a.G) * kD;
#pragma unroll
    for (int pass = 0; pass < kPer / kBatch; ++pass) {
        uint4 kr[kBatch], vr[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const int i = tid + (pass * kBatch + j) * NT;
            const int key = i >> 3, part = i & 7;
            const int kp = kb + key;
            kr[j] = vr[j] = make_uint4(0, 0, 0, 0);
            if (kp >= 0 && kp <= kmax) {
                size_t off;
                const uint16_t *kbase, *vbase;
                if (kp >= pos0 && a.k_new) {
                    off = size_t(kp - pos0) * GD + g * kD;
                    kbase = a.k_new;
                    vbase = a.v_new;
                } else {
                    off = size_t(uint32_t(kp) % a.slots) * GD + g * kD;
                    kbase = a.k_cache;
                    vbase = a.v_cache;
                }
                kr[j] = __ldg(reinterpret_cast<const uint4*>(kbase + off + part * 8));
                vr[j] = __ldg(reinterpret_cast<const uint4*>(vbase + off + part * 8));
            }
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const int i = tid + (pass * kBatch + j) * NT;
            const int key = i >> 3, part = i & 7;
            uint32_t* kd = ks + key * kRowWords + part * 4;
            uint32_t* vd = vs + key * kRowWords + part * 4;
            kd[0] = kr[j].x; kd[1] = kr[j].y; kd[2] = kr[j].z; kd[3] = kr[j].w;
            vd[0] = vr[j].x; vd[1] = vr[j].y; vd[2] = vr[j].z; vd[3] = vr[j].w;
        }
    }
}

__device__ __forceinline__ int visible_lo(int p, uint32_t window) {
    return window ? max(0, p - int(window) + 1) : 0;
}
// A lone query's split length at position p (AttentionArgs::split_max).
__device__ __forceinline__ uint32_t lone_split_len(const AttentionArgs& a, uint32_t p) {
    return a.split_max ? decode_split_len(p, a.split_min, a.split_max)
                       : decode_split_len_target(p, a.split_min, a.split_ramp != 0);
}
// The CTA's kv head and split index in the decode grid (AttentionArgs::head_major).
__device__ __forceinline__ int cta_head(const AttentionArgs& a) { return int(a.head_major ? blockIdx.x : blockIdx.y); }
__device__ __forceinline__ int cta_split(const AttentionArgs& a) { return int(a.head_major ? blockIdx.y : blockIdx.x); }

// ---------------------------------------------------------------------------
// Decode: one CTA of 8 warps per (split, kv head); warp h owns query head h of the group (the
// K/V block is loaded once for all of them); the last CTA of each kv head merges the splits.
// With a.qkv set, RoPE and the cache write of the new key/value happen here too.

constexpr size_t kDecodeSmem = sizeof(float) * kMaxHeads * kD + sizeof(uint32_t) * 2 * kBlock * kRowWords +
                               sizeof(float) * kMaxHeads * kBlock;

// Fused RoPE (a.qkv set): q of the group's heads rotated into qs; the CTA whose split holds the
// position also rotates the new key, writes key and value to the cache slot and keeps them as
// packed bf16 words (knew/vnew [32]) for its own block, because the block load reads the cache
// through the read-only path, which must not see this kernel's writes.
template <int NT = 256>
__device__ __forceinline__ void decode_rope(const AttentionArgs& a, int g, int hpg, int p, bool owns_p, float* qs,
                                            uint32_t* knew, uint32_t* vnew) {
    __shared__ float cs[kD / 2], sn[kD / 2];
    constexpr int half = kD / 2;
    constexpr int kPass = kMaxHeads * half / NT;  // (head, i) q pairs per thread
    static_assert(kMaxHeads * half % NT == 0 && NT >= 3 * half,
                  "decode_rope: whole passes of q pairs; the key and value owners all in the first pass");
    // Every load is issued before the first use (one memory round trip): thread t owns q pairs
    // (idx / half, idx % half) for idx = t, t + NT, ...; threads 0..31 also hold the key pair,
    // 32..95 a value.
    const float* row = a.qkv;
    float q1[kPass], q2[kPass];
#pragma unroll
    for (int ps = 0; ps < kPass; ++ps) {
        const int idx = threadIdx.x + ps * NT, h = idx / half, i = idx % half;
        const bool has_q = idx < hpg * half;
        const float* xq = row + size_t(g * hpg + h) * kD;
        q1[ps] = has_q ? xq[i] : 0.0f;
        q2[ps] = has_q ? xq[i + half] : 0.0f;
    }
    const int idx = threadIdx.x, i = idx % half;
    const float* xk = row + size_t(a.Q + g) * kD;
    const bool has_k = owns_p && idx < half, has_v = owns_p && idx >= half && idx < 3 * half;
    const float k1 = has_k ? xk[i] : 0.0f, k2 = has_k ? xk[i + half] : 0.0f;
    const float vv = has_v ? row[size_t(a.Q + a.G + g) * kD + (idx - half)] : 0.0f;
    if (idx < half) rope_cos_sin(float(p), a.inv_freq[idx], a.rope_scale, cs[idx], sn[idx]);
    __syncthreads();
#pragma unroll
    for (int ps = 0; ps < kPass; ++ps) {
        const int qi = threadIdx.x + ps * NT, h = qi / half, c = qi % half;
        if (qi < hpg * half) {
            float o1, o2;
            rope_rotate(q1[ps], q2[ps], cs[c], sn[c], o1, o2);
            qs[h * kD + c] = o1;
            qs[h * kD + c + half] = o2;
        }
    }
    if (!owns_p) return;
    const size_t slot_off = size_t(uint32_t(p) % a.slots) * a.G * kD + size_t(g) * kD;
    if (has_k) {
        float o1, o2;
        rope_rotate(k1, k2, cs[i], sn[i], o1, o2);
        const uint16_t b1 = f32_to_bf16_bits(o1), b2 = f32_to_bf16_bits(o2);
        uint16_t* kc = a.k_cache + slot_off;
        kc[i] = b1;
        kc[i + half] = b2;
        reinterpret_cast<uint16_t*>(knew)[i] = b1;
        reinterpret_cast<uint16_t*>(knew)[i + half] = b2;
    } else if (has_v) {
        const int d = idx - half;  // 0 .. 63
        const uint16_t b = f32_to_bf16_bits(vv);
        a.v_cache[slot_off + d] = b;
        reinterpret_cast<uint16_t*>(vnew)[d] = b;
    }
}

// finish_split's parts. Query head `head`'s output (lane l: dims 2l, 2l + 1) from its merged state.
__device__ __forceinline__ void store_head(const AttentionArgs& a, int head, const HeadFold& f) {
    const int lane = threadIdx.x & 31;
    a.out[permuted_k(uint32_t(head) * kD + 2 * lane)] = f32_to_bf16_bits(__fdiv_rn(f.O0, f.L));
    a.out[permuted_k(uint32_t(head) * kD + 2 * lane + 1)] = f32_to_bf16_bits(__fdiv_rn(f.O1, f.L));
}
// Split s_rel's state of query head `head` into its partial slot.
__device__ __forceinline__ void store_partial(const SplitState<1>& st, int head, int s_rel, float* partial,
                                              uint32_t max_splits) {
    const int lane = threadIdx.x & 31;
    float* dst = partial + (size_t(head) * max_splits + s_rel) * kPartial;
    dst[2 * lane] = st.o[0][0];
    dst[2 * lane + 1] = st.o[0][1];
    if (lane == 0) {
        dst[kD] = st.m[0];
        dst[kD + 1] = st.l[0];
    }
}
// Whether this CTA is the last of the `ctas` CTAs of kv head blockIdx.y to finish (after its
// partials are stored); the last one re-arms the counter. Every thread of the CTA calls it.
__device__ __forceinline__ bool last_of(int* counters, int ctas, int g) {
    __shared__ int is_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        is_last = atomicAdd(counters + g, 1) == ctas - 1;
        if (is_last) counters[g] = 0;
    }
    __syncthreads();
    return is_last != 0;
}
// Head `head`'s n split partials merged into the sink in split order (8 splits' loads in flight).
// stage (a.merge_staged): this warp's free shared memory for cap partials; each batch of cap
// partials is copied there at once (cp.async, one L2 round trip), then folded in the same order.
__device__ __forceinline__ void merge_partials(const AttentionArgs& a, int head, float sink, int n,
                                               const float* partial, uint32_t max_splits, float* stage = nullptr,
                                               int cap = 0) {
    const int lane = threadIdx.x & 31;
    __threadfence();
    HeadFold f(sink);
    if (stage && cap > 0) {
        for (int base = 0; base < n; base += cap) {
            const int cnt = min(cap, n - base);
            const float* src = partial + (size_t(head) * max_splits + base) * kPartial;
            for (int i = lane; i < cnt * kPartial / 4; i += 32) cp_async16(stage + 4 * i, src + 4 * i);
            cp_async_commit();
            cp_async_wait<0>();
            __syncwarp();
            for (int j = 0; j < cnt; ++j) {
                const float* s = stage + j * kPartial;
                f.add(s[kD], s[kD + 1], s[2 * lane], s[2 * lane + 1]);
            }
            __syncwarp();
        }
        store_head(a, head, f);
        return;
    }
    for (int base = 0; base < n; base += 8) {
        float m[8], l[8], o0[8], o1[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (base + j < n) {
                const float* src = partial + (size_t(head) * max_splits + base + j) * kPartial;
                m[j] = __ldcg(src + kD);
                l[j] = __ldcg(src + kD + 1);
                o0[j] = __ldcg(src + 2 * lane);
                o1[j] = __ldcg(src + 2 * lane + 1);
            }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (base + j < n) f.add(m[j], l[j], o0[j], o1[j]);
        }
    }
    store_head(a, head, f);
}

// Head `head`'s n split partials merged in two passes (the lone query's tensor-core split,
// a.merge_two_pass): first the largest of the sink and the splits' maxima, M (a warp max over
// each lane's splits s = lane, lane + 32, ...), every split's weight w_s = e^(m_s - M) at once and
// L = e^(sink - M) + sum_s l_s w_s (each lane's splits in order, then warp_sum's xor butterfly,
// which gives every lane the same sum); then O = sum_s w_s o_s in split order, the o rows copied
// into the warp's free stage (stage_floats floats: the weights, then as many 64-float rows as fit)
// one batch per L2 round trip, the first batch's copy issued with the (m, l) loads. The left fold
// (merge_partials) chains a dependent exp per split; this computes them side by side (H200, 20b
// tg128 +0.5 % at 8 192 and 32 768, bench/NOTES.md "v43"). Other bits than the fold, a function of
// the position as before (decode need not equal prefill, issue 12). n <= kTwoPassSplits.
constexpr int kTwoPassPer = int(kMaxDecodeSplits + 31) / 32;  // splits per lane
constexpr int kTwoPassSplits = 32 * kTwoPassPer;
__device__ __forceinline__ void merge_partials_2pass(const AttentionArgs& a, int head, float sink, int n,
                                                     const float* partial, uint32_t max_splits, float* stage,
                                                     int stage_floats) {
    const int lane = threadIdx.x & 31;
    __threadfence();
    const float* src = partial + size_t(head) * max_splits * kPartial;
    float* ws = stage;                              // [kTwoPassSplits] weights
    float* rows = stage + kTwoPassSplits;           // [cap][64] o rows
    const int cap = (stage_floats - kTwoPassSplits) / kD;
    const auto copy_rows = [&](int b0, int cnt) {  // rows b0 .. b0 + cnt - 1: 16 pieces of 16 bytes each
        for (int i = lane; i < cnt * (kD / 4); i += 32)
            cp_async16(rows + 4 * i, src + size_t(b0 + i / (kD / 4)) * kPartial + 4 * (i % (kD / 4)));
        cp_async_commit();
    };
    copy_rows(0, min(cap, n));
    float m[kTwoPassPer], l[kTwoPassPer];
    float M = sink;
#pragma unroll
    for (int k = 0; k < kTwoPassPer; ++k) {
        const int j = lane + 32 * k;
        m[k] = -INFINITY;
        l[k] = 0.0f;
        if (j < n) {
            m[k] = __ldcg(src + size_t(j) * kPartial + kD);
            l[k] = __ldcg(src + size_t(j) * kPartial + kD + 1);
        }
        M = fmaxf(M, m[k]);
    }
    M = warp_max(M);  // finite: the sink is
    float ls = 0.0f;
#pragma unroll
    for (int k = 0; k < kTwoPassPer; ++k) {
        const int j = lane + 32 * k;
        if (j >= n) break;
        const float w = expf(m[k] - M);
        ws[j] = w;
        ls = __fadd_rn(ls, __fmul_rn(l[k], w));
    }
    const float L = __fadd_rn(expf(sink - M), warp_sum(ls));
    float O0 = 0.0f, O1 = 0.0f;
    for (int b0 = 0; b0 < n; b0 += cap) {
        const int cnt = min(cap, n - b0);
        if (b0 > 0) {
            __syncwarp();  // every lane is done with the previous batch's rows
            copy_rows(b0, cnt);
        }
        cp_async_wait<0>();
        __syncwarp();  // the rows and (first batch) the weights are visible to the warp
        for (int r = 0; r < cnt; ++r) {
            const float w = ws[b0 + r];
            const float2 o = reinterpret_cast<const float2*>(rows + r * kD)[lane];
            O0 = __fmaf_rn(w, o.x, O0);
            O1 = __fmaf_rn(w, o.y, O1);
        }
    }
    HeadFold f(sink);
    f.L = L;
    f.O0 = O0;
    f.O1 = O1;
    store_head(a, head, f);
}

// The end of a split CTA: st holds warp h's state for query head h of kv head blockIdx.y (lane l:
// output dims 2l, 2l + 1). With one split (s_first == s_last) it merges into the sink in place;
// else it writes its partial and the last CTA of the kv head merges every split in order.
// sink: a.sinks[head] of warp h's query head (warps h < Q / G), which the caller loads early (a
// weight: before its dependency wait where it has one), not on the step's critical path here.
// (The sink, then each split in order, through merge_ml / merge_o: a left fold whose bits do
// not depend on which CTA holds which split, so attention_decode_cta_mma may group splits.)
// stage (the tensor-core split; else null): this warp's free shared memory, stage_floats floats,
// which the merge uses when a.merge_two_pass (merge_partials_2pass) or a.merge_staged is set.
__device__ __forceinline__ void finish_split(const AttentionArgs& a, const SplitState<1>& st, float sink, int s_first,
                                             int s_last, int s_rel, float* partial, int* counters,
                                             uint32_t max_splits, float* stage = nullptr, int stage_floats = 0) {
    const int warp = threadIdx.x >> 5;
    const int g = cta_head(a);
    const int hpg = int(a.Q / a.G);
    if (s_first == s_last) {  // one split: merge it into the sink here (the same merge_ml/merge_o
        if (warp >= hpg) return;  // sequence as below, so the same bits), no partials, no counter
        HeadFold f(sink);
        f.add(st.m[0], st.l[0], st.o[0][0], st.o[0][1]);
        store_head(a, g * hpg + warp, f);
        return;
    }
    if (warp < hpg) store_partial(st, g * hpg + warp, s_rel, partial, max_splits);
    // The last split CTA of this kv head to finish merges every split in order, then re-arms
    // the counter.
    if (!last_of(counters, s_last - s_first + 1, g) || warp >= hpg) return;
    const int n = min(s_last - s_first + 1, int(max_splits));
    if (stage && a.merge_two_pass && n <= kTwoPassSplits && stage_floats >= kTwoPassSplits + kD) {
        merge_partials_2pass(a, g * hpg + warp, sink, n, partial, max_splits, stage, stage_floats);
        return;
    }
    merge_partials(a, g * hpg + warp, sink, n, partial, max_splits, a.merge_staged ? stage : nullptr,
                   stage_floats / kPartial);
}

// The decode CTA (split blockIdx.x, kv head blockIdx.y) of one query at position pos0; shared
// by the one-token kernel and the batched one (cuda/batch_decode.h), so both compute the same bits.
// pre_kb: the K/V block the caller already loaded into shared memory (before its dependency
// wait; fused RoPE only), else INT_MIN.
template <bool kBatch = false>
__device__ __forceinline__ void attention_decode_cta(const AttentionArgs& a, int pos0, float* partial, int* counters,
                                                     uint32_t max_splits, int pre_kb = INT_MIN) {
    extern __shared__ float smem[];
    float* qs = smem;
    uint32_t* ks = reinterpret_cast<uint32_t*>(qs + kMaxHeads * kD);
    uint32_t* vs = ks + kBlock * kRowWords;
    float* ps_all = reinterpret_cast<float*>(vs + kBlock * kRowWords);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = blockIdx.y;
    const int hpg = int(a.Q / a.G);
    const int p = pos0, lo = visible_lo(p, a.window);
    // kAttentionSplit, longer past 16 384 keys; batched: batch_split_len, a sliding window whole
    const int len = int(kBatch ? batch_split_len(uint32_t(p), a.split_min) : lone_split_len(a, uint32_t(p)));
    const bool whole = kBatch && batch_window_whole(a.window);
    const int s_rel = blockIdx.x, s = lo / len + s_rel;
    const int s_begin = whole ? lo & ~(kBlock - 1) : s * len, s_end = whole ? p : s_begin + len - 1;
    if (whole ? s_rel != 0 : s_begin > p || s_end < lo) return;
    __shared__ uint32_t knew[kD / 2], vnew[kD / 2];
    const float sink = warp < hpg ? __ldg(a.sinks + g * hpg + warp) : 0.0f;
    const bool fused = a.qkv != nullptr;
    if (fused) decode_rope(a, g, hpg, p, s_end >= p, qs, knew, vnew);
    else
        for (int i = threadIdx.x; i < hpg * kD; i += blockDim.x) qs[i] = a.q[size_t(g) * hpg * kD + i];
    SplitState<1> st;
    reset(st);
    for (int kb = s_begin; kb <= s_end; kb += kBlock) {
        if (kb > p || kb + kBlock - 1 < lo) continue;
        if (kb != pre_kb) {
            __syncthreads();
            load_kv_block<256>(a, pos0, kb, fused ? p - 1 : p, g, ks, vs, threadIdx.x);
        }
        if (fused && kb + kBlock > p) {  // the new key's row (block-uniform condition)
            __syncthreads();
            if (threadIdx.x < kD / 2) {
                ks[(p - kb) * kRowWords + threadIdx.x] = knew[threadIdx.x];
                vs[(p - kb) * kRowWords + threadIdx.x] = vnew[threadIdx.x];
            }
        }
        __syncthreads();
        if (warp < hpg) attend_block<1>(st, qs + warp * kD, ks, vs, ps_all + warp * kBlock, kb, lo, p, 1, lane);
    }
    finish_split(a, st, sink, whole ? 0 : lo / len, whole ? 0 : p / len, s_rel, partial, counters, max_splits);
}

// ---------------------------------------------------------------------------
// Tensor-core decode split (the default; GPTOSS_DECODE_ATTN_MMA=0 turns it off): the grid,
// partials and merges of attention_decode_cta, but the split's keys go through mma.sync
// m16n8k16 instead of per-head FMA loops (which issue ~2.75 instructions per FMA and made the
// 130k-key split instruction-bound). The group's query heads are the MMA rows 0..7 (rows 8..15
// are zero); warp w takes the split's 16-key sub-blocks w, w + 8, ... , each cp.async'ed into its
// own 4 KB of shared memory (K, then V; swizzled for ldmatrix), with its own online softmax;
// then the 8 warps' states are merged in warp order through shared memory into the per-head
// state finish_split takes. Numerics as prefill (attention_prefill.cu): q/8 rounded to bf16, P
// rounded to bf16 for P·V while l sums the fp32 p, exp as ex2.approx; deterministic, the same
// bits alone or batched. H200, 20b tg: +42 % at 130 000 positions, +16 % at 32 768, +2–4 % at
// 2 048–8 192, −0.5 % at 0 (bench/NOTES.md "v15 decode attention on tensor cores").
constexpr int kSubKeys = 16;
constexpr int kSubTile = kSubKeys * kD * 2;  // one K or V sub-block: 2 KB
constexpr int kDecodeWarps = 8;
constexpr size_t decode_smem_mma(int stages, int warps = kDecodeWarps) {
    return sizeof(float) * kMaxHeads * kD + size_t(warps) * stages * 2 * kSubTile;
}
constexpr size_t kDecodeSmemMma = decode_smem_mma(1);
static_assert(kDecodeSmemMma <= 48 * 1024, "the one-stage decode kernels launch without a shared-memory opt-in");
static_assert(kMaxHeads * (kD + 2) * sizeof(float) <= 2 * kSubTile, "a warp's state fits its stage");

// Issues warp-lane `lane`'s cp.async of keys [kb, kb + 16) of kv head g into a warp stage (K at
// stage, V at stage + kSubTile); keys outside [lo, kmax] are zero-filled (kmax: the last cached
// key; with fused RoPE the new key is patched in afterwards).
__device__ __forceinline__ void load_sub_block(const AttentionArgs& a, uint32_t stage, int kb, int lo, int kmax,
                                               int pos0, int g, int lane) {
    const int c = lane & 7;
#pragma unroll
    for (int j = 0; j < kSubKeys / 4; ++j) {
        const int r = (lane >> 3) + 4 * j;
        attn_mma::cp_async_kv_chunk(a, kb + r, lo, kmax, pos0, g, c, stage + attn_mma::swz(r, c),
                                    stage + kSubTile + attn_mma::swz(r, c));
    }
}

// One split's keys [s_begin, s_end] through the CTA's kWarps warps (8; 4 for the batched sliding
// window) (warp w: the split's 16-key sub-blocks w, w + kWarps, ... with a visible key, kStages in
// flight), each with its own online softmax; then the warps' states merged in warp order into warp
// w's state for query heads w, w + kWarps, ... (st slots 0 .. NH - 1; heads < hpg).
// On entry the warp's first kStages sub-blocks are requested (split_prefetch) and, past the
// first split, every warp is done with the stages' previous contents.
struct SplitKeys {
    int kb, sb_last;  // this warp's first sub-block, the split's last
};
template <int kStages, int kWarps = kDecodeWarps>
__device__ __forceinline__ SplitKeys split_prefetch(const AttentionArgs& a, int s_begin, int s_end, int p, int lo,
                                                    int kmax, uint32_t stage0) {
    using namespace attn_mma;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sb_first = max(s_begin, lo & ~(kSubKeys - 1)), sb_last = min(s_end, p) & ~(kSubKeys - 1);
    constexpr int kStride = kWarps * kSubKeys;
    const int kb = sb_first + warp * kSubKeys;
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
        if (kb + st * kStride <= sb_last)
            load_sub_block(a, stage0 + st * 2 * kSubTile, kb + st * kStride, lo, kmax, p, cta_head(a), lane);
        cp_async_commit();
    }
    return SplitKeys{kb, sb_last};
}

template <int kStages, int kWarps = kDecodeWarps, int NH = 1>
__device__ __forceinline__ void split_state(const AttentionArgs& a, SplitKeys keys, int p, int lo, bool fused,
                                            const uint32_t (&qf)[4][4], uint8_t* stages, uint32_t stage0,
                                            const uint32_t* knew, const uint32_t* vnew, SplitState<NH>& st) {
    static_assert(kWarps * NH == kMaxHeads, "split_state: every query head merged by one warp");
    using namespace attn_mma;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gq = lane >> 2, tq = lane & 3;
    const int hpg = int(a.Q / a.G);
    const int g = cta_head(a);
    const int kmax = fused ? p - 1 : p;
    constexpr int kStride = kWarps * kSubKeys;
    uint8_t* my_stage = stages + size_t(warp) * kStages * 2 * kSubTile;
    int kb = keys.kb;
    const int sb_last = keys.sb_last;
    float m = -INFINITY, l = 0.0f;  // row gq's running max and this lane's share of its denominator
    float o[8][4];
#pragma unroll
    for (int nd = 0; nd < 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    for (int it = 0; kb <= sb_last; kb += kStride, ++it) {
        const int cur = kStages == 1 ? 0 : it % kStages;
        const uint32_t stage = stage0 + cur * 2 * kSubTile;
        cp_async_wait<kStages - 1>();
        __syncwarp();
        if (fused && kb <= p && p < kb + kSubKeys && lane < 16) {  // the new key's row, from knew / vnew
            const uint32_t* src = (lane < 8 ? knew : vnew) + (lane & 7) * 4;
            *reinterpret_cast<uint4*>(my_stage + cur * 2 * kSubTile + (lane < 8 ? 0 : kSubTile) + swz(p - kb, lane & 7)) =
                make_uint4(src[0], src[1], src[2], src[3]);
        }
        __syncwarp();  // (outside the branch: every lane must reach it)
        float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4(stage + swz((lane >> 4) * 8 + (lane & 7), 2 * ks + ((lane >> 3) & 1)), b0, b1, b2, b3);
            mma(sc[0], qf[ks], b0, b1);
            mma(sc[1], qf[ks], b2, b3);
        }
        float mx = m;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = kb + nt * 8 + 2 * tq + e;
                if (key > p || key < lo) sc[nt][e] = -INFINITY;
                mx = fmaxf(mx, sc[nt][e]);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));  // finite: the sub-block has a visible key
        const float alpha = ex2(__fmul_rn(__fsub_rn(m, mx), kLog2e));
        const float ml = __fmul_rn(mx, kLog2e);
        m = mx;
        l = __fmul_rn(l, alpha);
#pragma unroll
        for (int nd = 0; nd < 8; ++nd) {
            o[nd][0] = __fmul_rn(o[nd][0], alpha);
            o[nd][1] = __fmul_rn(o[nd][1], alpha);
        }
        uint32_t pa[4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const float p0 = ex2(__fmaf_rn(sc[nt][0], kLog2e, -ml)), p1 = ex2(__fmaf_rn(sc[nt][1], kLog2e, -ml));
            l = __fadd_rn(l, __fadd_rn(p0, p1));
            pa[2 * nt] = pack_bf16x2(p0, p1);
            pa[2 * nt + 1] = 0u;  // rows gq + 8
        }
#pragma unroll
        for (int dp = 0; dp < 4; ++dp) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4_trans(stage + kSubTile + swz(((lane >> 3) & 1) * 8 + (lane & 7), 2 * dp + (lane >> 4)), b0, b1,
                          b2, b3);
            mma(o[2 * dp], pa, b0, b1);
            mma(o[2 * dp + 1], pa, b2, b3);
        }
        __syncwarp();  // every lane's ldmatrix is done before the stage is refilled
        const int next = kb + kStages * kStride;
        if (next <= sb_last) load_sub_block(a, stage, next, lo, kmax, p, g, lane);
        cp_async_commit();
    }
    // This warp's state for rows 0..7 into its own stage: [row][0..63] o, [row][64] m, [row][65] l.
    l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 1));
    l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 2));
    cp_async_wait<0>();
    __syncwarp();
    float* ws = reinterpret_cast<float*>(my_stage) + gq * (kD + 2);
#pragma unroll
    for (int nd = 0; nd < 8; ++nd) {
        ws[nd * 8 + 2 * tq] = o[nd][0];
        ws[nd * 8 + 2 * tq + 1] = o[nd][1];
    }
    if (tq == 0) {
        ws[kD] = m;
        ws[kD + 1] = l;
    }
    __syncthreads();
    // Warp w merges heads w, w + kWarps, ... (st slot hh: head w + hh·kWarps), each over the
    // kWarps warp states in warp order (empty warps skipped).
    reset(st);
#pragma unroll
    for (int hh = 0; hh < NH; ++hh) {
        const int head = warp + hh * kWarps;
        if (head >= hpg) continue;
        bool any = false;
        for (int w = 0; w < kWarps; ++w) {
            const float* src =
                reinterpret_cast<const float*>(stages + size_t(w) * kStages * 2 * kSubTile) + head * (kD + 2);
            const float mw = src[kD];
            if (mw == -INFINITY) continue;
            const float lw = src[kD + 1], o0 = src[2 * lane], o1 = src[2 * lane + 1];
            if (!any) {
                st.m[hh] = mw;
                st.l[hh] = lw;
                st.o[hh][0] = o0;
                st.o[hh][1] = o1;
                any = true;
                continue;
            }
            float wa, wb;
            merge_ml(st.m[hh], st.l[hh], mw, lw, wa, wb);
            merge_o(st.o[hh][0], o0, wa, wb);
            merge_o(st.o[hh][1], o1, wa, wb);
        }
    }
}

// This lane's A fragments of q/8 for the split's mma (row gq = query head gq, from the roped
// rows in shared memory; rows gq + 8 are zero).
__device__ __forceinline__ void query_fragments(const float* qs, int hpg, uint32_t (&qf)[4][4]) {
    const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int d = 16 * ks + 8 * hi + 2 * tq;
            const float2 v = gq < hpg ? *reinterpret_cast<const float2*>(qs + gq * kD + d) : make_float2(0.0f, 0.0f);
            qf[ks][2 * hi] = pack_bf16x2(v.x * 0.125f, v.y * 0.125f);
            qf[ks][2 * hi + 1] = 0u;
        }
    }
}

// kPrefetch (fused RoPE only): the caller has not waited for the kernel's dependencies yet; the
// warp's first sub-block (cached keys below the step's position, written by earlier launches) is
// requested first and the wait follows it, as in bf16_attention_decode_kernel's prefetch.
// group (batched only): this CTA takes `group` consecutive splits of its kv head, blockIdx.x · group
// onwards, one after another; when it holds all of them it folds their states into the sink
// itself (no partials, no counter), else it stores each split's partial and the kv head's last
// CTA merges them. The fold's order is finish_split's (the sink, then the splits in order), so the
// bits do not depend on the group (attention_decode_batch chooses it from the batch size).
template <bool kPrefetch, int kStages, bool kBatch = false>
__device__ __forceinline__ void attention_decode_cta_mma(const AttentionArgs& a, int pos0, float* partial,
                                                         int* counters, uint32_t max_splits, int group = 1) {
    using namespace attn_mma;
    extern __shared__ __align__(128) float smem[];
    float* qs = smem;
    uint8_t* stages = reinterpret_cast<uint8_t*>(qs + kMaxHeads * kD);
    const int warp = threadIdx.x >> 5;
    const int g = cta_head(a);
    const int hpg = int(a.Q / a.G);
    const int p = pos0, lo = visible_lo(p, a.window);
    const int len = int(kBatch ? batch_split_len(uint32_t(p), a.split_min) : lone_split_len(a, uint32_t(p)));
    // The sliding window in one split: the batched step, and a lone query with a.window_whole.
    const bool whole = (kBatch || a.window_whole) && batch_window_whole(a.window);
    // The kv head's splits s_first .. s_last (relative numbers 0 .. n_splits - 1); this CTA's
    // [r0, r1).
    const int s_first = whole ? 0 : lo / len, n_splits = whole ? 1 : p / len - s_first + 1;
    const int grp = kBatch ? group : 1;  // (one split per CTA for a lone query: a constant)
    const int r0 = cta_split(a) * grp;
    if (r0 >= n_splits) return;
    const int r1 = kBatch ? min(r0 + grp, n_splits) : r0 + 1;
    __shared__ uint32_t knew[kD / 2], vnew[kD / 2];
    const float sink = warp < hpg ? __ldg(a.sinks + g * hpg + warp) : 0.0f;  // before the wait: a weight
    const bool fused = a.qkv != nullptr;
    const int kmax = fused ? p - 1 : p;
    const uint32_t stage0 = static_cast<uint32_t>(__cvta_generic_to_shared(stages + size_t(warp) * kStages * 2 * kSubTile));
    auto split_range = [&](int r, int* b, int* e) {
        const int sb = whole ? lo & ~(kSubKeys - 1) : (s_first + r) * len;
        *b = sb;
        *e = whole ? p : sb + len - 1;
    };
    int s_begin, s_end;
    split_range(r0, &s_begin, &s_end);
    SplitKeys keys = split_prefetch<kStages>(a, s_begin, s_end, p, lo, kmax, stage0);
    if constexpr (kPrefetch) {
        pdl_wait();
        pdl_launch_dependents();
    }
    if (fused) decode_rope(a, g, hpg, p, r1 == n_splits, qs, knew, vnew);  // the CTA of the last split owns p
    else
        for (int i = threadIdx.x; i < hpg * kD; i += blockDim.x) qs[i] = a.q[size_t(g) * hpg * kD + i];
    __syncthreads();
    uint32_t qf[4][4];
    query_fragments(qs, hpg, qf);
    SplitState<1> st;
    if constexpr (!kBatch) {  // one split per CTA
        split_state<kStages>(a, keys, p, lo, fused, qf, stages, stage0, knew, vnew, st);
        constexpr int kWarpStage = kStages * 2 * kSubTile;  // bytes of a warp's stages
        finish_split(a, st, sink, s_first, s_first + n_splits - 1, r0, partial, counters, max_splits,
                     reinterpret_cast<float*>(stages + size_t(warp) * kWarpStage), kWarpStage / int(sizeof(float)));
        return;
    }
    const bool all = r0 == 0 && r1 == n_splits;  // this CTA folds every split itself
    HeadFold f(sink);
    for (int r = r0; r < r1; ++r) {
        if (r > r0) {
            __syncthreads();  // every warp has read the previous split's states from the stages
            split_range(r, &s_begin, &s_end);
            keys = split_prefetch<kStages>(a, s_begin, s_end, p, lo, kmax, stage0);
        }
        split_state<kStages>(a, keys, p, lo, fused, qf, stages, stage0, knew, vnew, st);
        if (warp >= hpg) continue;
        if (all) f.add(st.m[0], st.l[0], st.o[0][0], st.o[0][1]);
        else store_partial(st, g * hpg + warp, r, partial, max_splits);
    }
    if (all) {
        if (warp < hpg) store_head(a, g * hpg + warp, f);
        return;
    }
    if (!last_of(counters, (n_splits + grp - 1) / grp, g) || warp >= hpg) return;
    merge_partials(a, g * hpg + warp, sink, min(n_splits, int(max_splits)), partial, max_splits);
}

// prefetch (fused RoPE only; GPTOSS_DECODE_ATTN_PREFETCH): the step's position (uploaded before
// the graph launch) and the cached K/V of the positions before it (written by earlier launches)
// are final when this kernel starts, so the CTA's first visible K/V block is loaded before the
// dependency wait, while the QKV GEMV still runs; only the q/k/v row load stays behind it.
__global__ __launch_bounds__(256) void bf16_attention_decode_kernel(const AttentionArgs a, float* partial,
                                                                   int* counters, uint32_t max_splits, int prefetch) {
    if (prefetch) {
        const int p = a.step->pos0, lo = visible_lo(p, a.window);
        const int len = int(lone_split_len(a, uint32_t(p)));
        const int s_begin = (lo / len + int(blockIdx.x)) * len;
        const int s_end = s_begin + len - 1;
        int kb = s_begin;
        while (kb <= s_end && (kb > p || kb + kBlock - 1 < lo)) kb += kBlock;  // the loop's first block
        int pre = INT_MIN;
        if (s_begin <= p && s_end >= lo && kb <= s_end) {
            extern __shared__ float smem[];
            uint32_t* ks = reinterpret_cast<uint32_t*>(smem + kMaxHeads * kD);
            load_kv_block<256>(a, p, kb, p - 1, int(blockIdx.y), ks, ks + kBlock * kRowWords, threadIdx.x);
            pre = kb;
        }
        pdl_wait();
        pdl_launch_dependents();
        attention_decode_cta(a, p, partial, counters, max_splits, pre);
        return;
    }
    pdl_wait();
    pdl_launch_dependents();
    attention_decode_cta(a, a.step->pos0, partial, counters, max_splits);
}

// The tensor-core variant of bf16_attention_decode_kernel; prefetch as there (each warp's first
// K/V sub-block is requested before the dependency wait).
// kStages = 2 (decode_attention_stages, the default): two sub-blocks in flight per warp (66 KB of
// shared memory, opted in at the launch). (Registers capped for 3 CTAs per SM lost 2–9 % at depth:
// bench/NOTES.md "v16 decode attention".)
template <int kStages>
__global__ __launch_bounds__(256, 2) void bf16_attention_decode_mma_kernel(const AttentionArgs a, float* partial,
                                                                          int* counters, uint32_t max_splits,
                                                                          int prefetch) {
    if (prefetch) {
        attention_decode_cta_mma<true, kStages>(a, a.step->pos0, partial, counters, max_splits);
        return;
    }
    pdl_wait();
    pdl_launch_dependents();
    attention_decode_cta_mma<false, kStages>(a, a.step->pos0, partial, counters, max_splits);
}

// Batched decode: item i's arguments (its own cache and rows of qkv and out), the rest a's.
__device__ __forceinline__ AttentionArgs item_args(const AttentionArgs& a, const BatchAttentionItem& it, uint32_t i) {
    AttentionArgs b = a;
    b.k_cache = it.k_cache;
    b.v_cache = it.v_cache;
    b.slots = it.slots;
    b.qkv = a.qkv + size_t(i) * (a.Q + 2 * a.G) * kD;
    b.out = a.out + size_t(i) * a.Q * kD;
    return b;
}

// Batched decode: item blockIdx.z is one session's query, with its own cache, position and rows
// of qkv / out / partial / counters (attention_decode_batch); batch_split_len-key splits; kMma:
// the tensor-core split with two sub-blocks in flight per warp, whose first cached keys are
// requested before the wait for the QKV kernel (as bf16_attention_decode_mma_kernel's prefetch):
// the items were uploaded before the step's first kernel and the cached keys below each item's
// position by earlier steps, so neither depends on the kernel this one overlaps.
template <bool kMma>
__global__ __launch_bounds__(256, 2) void bf16_attention_decode_batch_kernel(const AttentionArgs a,
                                                                         const BatchAttentionItem* items,
                                                                         float* partial, int* counters,
                                                                         uint32_t max_splits, int group) {
    if (!kMma) {
        pdl_wait();
        pdl_launch_dependents();
    }
    const uint32_t i = blockIdx.z;
    const BatchAttentionItem it = items[i];
    const AttentionArgs b = item_args(a, it, i);
    float* const part = partial + size_t(i) * a.Q * max_splits * kPartial;
    if (kMma) attention_decode_cta_mma<true, 2, true>(b, it.pos, part, counters + size_t(i) * a.G, max_splits, group);
    else attention_decode_cta<true>(b, it.pos, part, counters + size_t(i) * a.G, max_splits);
}

// The batched step's sliding window (batch_window_whole: keys [pos - window + 1, pos] in one
// split, no partials) in CTAs of kWindowWarps warps instead of 8: a 64-session step's 512 (session,
// kv head) CTAs then fit one wave (4 CTAs of 128 threads per SM by registers, against two waves of
// 8-warp CTAs at 2 per SM); each warp takes every fourth 16-key sub-block of the window (2-3 of
// them, all three in flight: requested before the wait for the QKV kernel) and merges two query
// heads. The same arithmetic as split_state's, with
// another split of the keys between warps, so its bits differ from the 8-warp form's; the batched
// step uses one form at every batch size (batch_attention_window_warps), which keeps it batch
// invariant.
constexpr int kWindowWarps = 4;
constexpr int kWindowStages = 3;  // a warp's sub-blocks of a 128-key window: at most 3
constexpr size_t kWindowSmem = decode_smem_mma(kWindowStages, kWindowWarps);

__device__ __forceinline__ void attention_window_cta(const AttentionArgs& a, int p) {
    using namespace attn_mma;
    constexpr int NH = kMaxHeads / kWindowWarps;
    extern __shared__ __align__(128) float smem[];
    float* qs = smem;
    uint8_t* stages = reinterpret_cast<uint8_t*>(qs + kMaxHeads * kD);
    __shared__ uint32_t knew[kD / 2], vnew[kD / 2];
    const int warp = threadIdx.x >> 5, g = blockIdx.y, hpg = int(a.Q / a.G);
    const int lo = visible_lo(p, a.window);
    float sink[NH];  // weights: before the wait
#pragma unroll
    for (int hh = 0; hh < NH; ++hh) {
        const int head = warp + hh * kWindowWarps;
        sink[hh] = head < hpg ? __ldg(a.sinks + g * hpg + head) : 0.0f;
    }
    const uint32_t stage0 =
        static_cast<uint32_t>(__cvta_generic_to_shared(stages + size_t(warp) * kWindowStages * 2 * kSubTile));
    // The cached keys below p (earlier steps') before the wait for the QKV kernel; the new key after.
    const SplitKeys keys = split_prefetch<kWindowStages, kWindowWarps>(a, lo & ~(kSubKeys - 1), p, p, lo, p - 1, stage0);
    pdl_wait();
    pdl_launch_dependents();
    decode_rope<32 * kWindowWarps>(a, g, hpg, p, true, qs, knew, vnew);
    __syncthreads();
    uint32_t qf[4][4];
    query_fragments(qs, hpg, qf);
    SplitState<NH> st;
    split_state<kWindowStages, kWindowWarps, NH>(a, keys, p, lo, true, qf, stages, stage0, knew, vnew, st);
#pragma unroll
    for (int hh = 0; hh < NH; ++hh) {
        const int head = warp + hh * kWindowWarps;
        if (head >= hpg) continue;
        HeadFold f(sink[hh]);
        f.add(st.m[hh], st.l[hh], st.o[hh][0], st.o[hh][1]);
        store_head(a, g * hpg + head, f);
    }
}

// Item blockIdx.z's window (as bf16_attention_decode_batch_kernel's items), kv head blockIdx.y.
__global__ __launch_bounds__(32 * kWindowWarps, 4) void bf16_attention_decode_window_kernel(const AttentionArgs a,
                                                                                          const BatchAttentionItem* items) {
    const BatchAttentionItem it = items[blockIdx.z];
    attention_window_cta(item_args(a, it, blockIdx.z), it.pos);
}

__global__ void bf16_kv_commit_kernel(const uint16_t* __restrict__ k_new, const uint16_t* __restrict__ v_new,
                                      uint16_t* __restrict__ k_cache, uint16_t* __restrict__ v_cache,
                                      uint32_t slots, const StepInfo* step, uint32_t T, uint32_t GD) {
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t t = blockIdx.x;
    if (T > slots && t < T - slots) return;  // overwritten later in this chunk
    const uint32_t slot = uint32_t(step->pos0 + int32_t(t)) % slots;
    for (uint32_t i = threadIdx.x; i < GD; i += blockDim.x) {
        k_cache[size_t(slot) * GD + i] = k_new[size_t(t) * GD + i];
        v_cache[size_t(slot) * GD + i] = v_new[size_t(t) * GD + i];
    }
}

// The dynamic shared-memory opt-in a launch of `kernel` with `smem` bytes needs past 48 KB (the
// attribute is per device: set at each launch, cheap; graphs capture the launch once).
template <typename Kernel>
gptoss_status opt_in_smem(Kernel kernel, size_t smem, const char* what) {
    if (smem <= 48 * 1024) return GPTOSS_OK;
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return fail(GPTOSS_ERR_DEVICE, "%s: shared-memory opt-in: %s", what, cudaGetErrorString(err));
    return GPTOSS_OK;
}

gptoss_status check(const AttentionArgs& a) {
    if (a.D != kD) return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA attention: head_dim %u, only 64 is supported", a.D);
    if (a.G == 0 || a.Q % a.G != 0 || a.Q / a.G > kMaxHeads)
        return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA attention: %u query heads per kv head, at most %d supported",
                    a.G ? a.Q / a.G : 0, kMaxHeads);
    return GPTOSS_OK;
}

}  // namespace

gptoss_status attention_decode(const AttentionArgs& a, float* partial, int* counters, uint32_t max_splits,
                               cudaStream_t stream) {
    GPTOSS_TRY(check(a));
    if (a.T != 1) return fail(GPTOSS_ERR_INTERNAL, "attention_decode: T=%u, expected 1", a.T);
    const dim3 grid(max_splits, a.G);
    static const bool prefetch_on = [] {  // GPTOSS_DECODE_ATTN_PREFETCH=0|1 (default 1)
        const char* s = std::getenv("GPTOSS_DECODE_ATTN_PREFETCH");
        return !(s && *s) || std::atoi(s) != 0;
    }();
    const int prefetch = prefetch_on && a.qkv != nullptr;
    AttentionArgs b = a;
    b.split_min = decode_attention_split_min();
    b.split_max = decode_attention_max_splits();
    b.split_ramp = decode_attention_split_ramp() ? 1u : 0u;
    b.window_whole = b.head_major = b.merge_staged = b.merge_two_pass = 0;
    if (decode_attention_mma()) {
        b.window_whole = decode_attention_window_whole() ? 1u : 0u;
        const bool head_major = decode_attention_head_major();
        b.head_major = head_major ? 1u : 0u;
        b.merge_staged = decode_attention_merge_staged() ? 1u : 0u;
        b.merge_two_pass = decode_attention_merge_two_pass() ? 1u : 0u;
        const bool one = b.window_whole && batch_window_whole(a.window);  // the window's one CTA per kv head
        const int stages = decode_attention_stages();
        const auto kernel = stages == 2 ? bf16_attention_decode_mma_kernel<2> : bf16_attention_decode_mma_kernel<1>;
        const size_t smem = decode_smem_mma(stages);
        GPTOSS_TRY(opt_in_smem(kernel, smem, "attention_decode"));
        const dim3 g2 = one ? dim3(1, a.G) : grid;
        GPTOSS_LAUNCH(kernel, head_major ? dim3(g2.y, g2.x) : g2, 256, smem, stream, b, partial, counters, max_splits,
                      prefetch);
    } else {
        GPTOSS_LAUNCH(bf16_attention_decode_kernel, grid, 256, kDecodeSmem, stream, b, partial, counters, max_splits,
                      prefetch);
    }
    return GPTOSS_OK;
}

// Splits per CTA of the batched tensor-core attention (attention_decode_cta_mma's group; the bits do
// not depend on it): batch_attention_group_for's cost model (kernels.h), so a large batch takes each
// kv head's keys in one CTA with no partials to merge, and a lone session at a long context keeps a
// CTA per split. GPTOSS_DECODE_BATCH_ATTN_GROUP (1, 2, 4, ... 64) forces it (A/B runs).
namespace {
std::atomic<uint32_t> g_batch_attention_group{0};  // set_batch_attention_group (0: automatic)
}  // namespace

void set_batch_attention_group(uint32_t group) { g_batch_attention_group.store(group); }

gptoss_status batch_attention_group(uint32_t n_items, uint32_t G, uint32_t max_splits, uint32_t* out) {
    static const int env = env_choice("GPTOSS_DECODE_BATCH_ATTN_GROUP", {1, 2, 4, 8, 16, 32, 64}, 0);
    const uint32_t set = g_batch_attention_group.load(), forced = set != 0 ? set : uint32_t(env);
    if (forced > 0) {
        *out = std::min(forced, std::max(max_splits, 1u));
        return GPTOSS_OK;
    }
    DeviceProps dp;
    GPTOSS_CUDA_TRY(current_device_props(&dp));
    *out = batch_attention_group_for(uint64_t(n_items) * G, max_splits, uint32_t(std::max(dp.sms, 1)));
    return GPTOSS_OK;
}

namespace {
std::atomic<uint32_t> g_batch_attention_window_warps{0};  // set_batch_attention_window_warps (0: default)
}  // namespace

void set_batch_attention_window_warps(uint32_t warps) { g_batch_attention_window_warps.store(warps); }

uint32_t batch_attention_window_warps() {
    static const int env = env_choice("GPTOSS_DECODE_BATCH_ATTN_WINDOW_WARPS", {4, 8}, kWindowWarps);
    const uint32_t set = g_batch_attention_window_warps.load();
    return set == 4 || set == 8 ? set : uint32_t(env);
}

uint32_t batch_attention_split() {  // 0: batch_split_len's rule; else GPTOSS_DECODE_BATCH_ATTN_SPLIT's
    static const uint32_t len = uint32_t(env_choice("GPTOSS_DECODE_BATCH_ATTN_SPLIT", {256, 512, 1024, 2048}, 0));
    return len;
}

gptoss_status attention_decode_batch(const AttentionArgs& a, const BatchAttentionItem* items, uint32_t n_items,
                                    float* partial, int* counters, uint32_t max_splits, cudaStream_t stream) {
    GPTOSS_TRY(check(a));
    if (!a.qkv || !a.inv_freq || !a.out || !items)
        return fail(GPTOSS_ERR_INTERNAL, "attention_decode_batch: qkv, inv_freq, out and items are required");
    if (n_items == 0) return GPTOSS_OK;
    if (n_items > 65535) return fail(GPTOSS_ERR_INTERNAL, "attention_decode_batch: %u items exceed the grid", n_items);
    AttentionArgs b = a;
    b.split_min = batch_attention_split();
    b.window_whole = b.head_major = b.merge_staged = b.merge_two_pass = 0;  // (its own test, batch_window_whole)
    if (!decode_attention_mma()) {
        const dim3 grid(max_splits, a.G, n_items);
        GPTOSS_LAUNCH(bf16_attention_decode_batch_kernel<false>, grid, 256, kDecodeSmem, stream, b, items, partial,
                      counters, max_splits, 1);
        return GPTOSS_OK;
    }
    if (batch_window_whole(a.window) && batch_attention_window_warps() == kWindowWarps) {
        GPTOSS_TRY(opt_in_smem(bf16_attention_decode_window_kernel, kWindowSmem, "attention_decode_batch (window)"));
        GPTOSS_LAUNCH(bf16_attention_decode_window_kernel, dim3(1, a.G, n_items), 32 * kWindowWarps, kWindowSmem,
                      stream, b, items);
        return GPTOSS_OK;
    }
    uint32_t group = 1;
    GPTOSS_TRY(batch_attention_group(n_items, a.G, max_splits, &group));
    const dim3 grid(ceil_div(max_splits, group), a.G, n_items);
    const size_t smem = decode_smem_mma(2);
    GPTOSS_TRY(opt_in_smem(bf16_attention_decode_batch_kernel<true>, smem, "attention_decode_batch"));
    GPTOSS_LAUNCH(bf16_attention_decode_batch_kernel<true>, grid, 256, smem, stream, b, items, partial, counters,
                  max_splits, int(group));
    return GPTOSS_OK;
}

gptoss_status kv_commit(const uint16_t* k_new, const uint16_t* v_new, uint16_t* k_cache, uint16_t* v_cache,
                        uint32_t slots, const StepInfo* step, uint32_t T, uint32_t GD, cudaStream_t stream) {
    if (T == 0) return GPTOSS_OK;
    GPTOSS_LAUNCH(bf16_kv_commit_kernel, T, 256, 0, stream, k_new, v_new, k_cache, v_cache, slots, step, T, GD);
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
