// cpu/backend.cpp - the CPU reference backend: the forward pass of MODEL.md in fp32, built
// from the ops of cpu/reference.h, reading bf16 and MXFP4 weights straight from the mapped
// checkpoint (nothing is copied but the sinks). Runs where no GPU is, and is the oracle the
// CUDA backend is checked against.
// KV cache: full layers keep K/V of every position (grown on demand up to max_context);
// sliding layers keep a ring of `sliding_window` slots, slot = position % window (API.md §6).
#include "cpu/reference.h"
#include "gptoss-internal.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

namespace gptoss {
namespace {

class CpuBackend;
class CpuSession;

// Working buffers of one forward pass, sized for `T` rows on first use (grown, never shrunk).
struct Scratch {
    std::vector<float> x, h, q, k, v, attn, o, router, moe, kv_k, kv_v, weights;
    std::vector<int32_t> experts;
    void ensure(const Config& c, size_t T) {
        const size_t kv = size_t(c.n_kv_heads) * c.head_dim;
        x.resize(T * c.hidden);
        h.resize(T * c.hidden);
        q.resize(T * c.n_heads * c.head_dim);
        k.resize(T * kv);
        v.resize(T * kv);
        attn.resize(T * c.n_heads * c.head_dim);
        o.resize(T * c.hidden);
        router.resize(T * c.n_experts);
        moe.resize(T * c.hidden);
        experts.resize(T * c.n_experts_per_token);
        weights.resize(T * c.n_experts_per_token);
    }
};

// Rows [row, row + n) of a forward pass belong to `session` at positions [pos, pos + n).
// A prefill chunk is one segment; a batched decode step is one single-row segment per session.
struct Segment {
    CpuSession* session;
    uint32_t row, n, pos;
};

class CpuSession final : public BackendSession {
public:
    CpuSession(const CpuBackend& backend, uint32_t max_context, uint32_t max_batch);
    gptoss_status forward(const int32_t* tokens, uint32_t n, uint32_t pos) override;
    gptoss_status get_logits(const float** logits_out) override {
        *logits_out = logits_.data();
        return GPTOSS_OK;
    }
    gptoss_status save_sliding_snapshot() override;
    gptoss_status restore_sliding_snapshot() override;

    // Stores the K/V of n rows at [pos, pos + n) in layer l's cache and writes their attention
    // output. q: [n, Q, D], k, v: [n, G, D] (roped); out: [n, Q, D]. `s` lends the gather buffers.
    void attend(uint32_t l, const float* q, const float* k, const float* v, uint32_t n, uint32_t pos, Scratch& s,
                float* out);
    uint32_t max_context() const { return max_context_; }
    std::vector<float> logits_;

private:
    struct LayerCache {
        std::vector<float> k, v;  // [slots, G, D]
    };
    const CpuBackend& backend_;
    const Config& config_;
    uint32_t max_context_, max_batch_;
    std::vector<LayerCache> cache_;
    std::vector<LayerCache> snapshot_;   // sliding layers only (others left empty)
    bool have_snapshot_ = false;
    Scratch scratch_;
};

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(const Checkpoint& checkpoint) : checkpoint_(checkpoint) {
        const Config& c = checkpoint.config;
        rope_ = cpu::rope_init(c);
        sinks_.resize(c.n_layers);
        for (uint32_t l = 0; l < c.n_layers; l++) {
            const Tensor& s = checkpoint.weights.layers[l].sinks;
            sinks_[l].resize(c.n_heads);
            for (uint32_t j = 0; j < c.n_heads; j++)
                sinks_[l][j] = s.dtype == DType::F32 ? static_cast<const float*>(s.data)[j] : bf16_to_f32(s.bf16()[j]);
        }
    }
    gptoss_status create_session(uint32_t max_context, uint32_t max_batch,
                                 std::unique_ptr<BackendSession>* out) override {
        out->reset(new CpuSession(*this, max_context, max_batch));
        return GPTOSS_OK;
    }
    uint64_t weight_bytes() const override { return checkpoint_.total_bytes; }
    int32_t device() const override { return GPTOSS_DEVICE_CPU; }
    uint32_t default_max_batch() const override { return 64; }
    void decode_batch(DecodeItem* const* items, uint32_t n, bool rows_stable) override;

    // Runs the layers over `tokens` [T], whose rows the segments partition, and leaves in each
    // segment's session the logits of its last row. Every op reduces each row on its own in a
    // fixed order (cpu/reference.h), so a row's results do not depend on the other rows.
    void run(Scratch& s, const int32_t* tokens, uint32_t T, const Segment* segments, uint32_t n_segments) const;

    const Checkpoint& checkpoint_;
    cpu::Rope rope_;
    std::vector<std::vector<float>> sinks_;  // [L][Q] fp32
    cpu::PoolHold pool_;
    std::mutex batch_mutex_;  // guards batch_scratch_
    Scratch batch_scratch_;
};

CpuSession::CpuSession(const CpuBackend& backend, uint32_t max_context, uint32_t max_batch)
    : BackendSession(backend.checkpoint_.config.vocab), backend_(backend), config_(backend.checkpoint_.config),
      max_context_(max_context), max_batch_(max_batch) {
    const Config& c = config_;
    const size_t kv = size_t(c.n_kv_heads) * c.head_dim;
    cache_.resize(c.n_layers);
    snapshot_.resize(c.n_layers);
    for (uint32_t l = 0; l < c.n_layers; l++)
        if (c.layer_sliding[l]) {
            cache_[l].k.assign(size_t(c.sliding_window) * kv, 0.0f);
            cache_[l].v.assign(size_t(c.sliding_window) * kv, 0.0f);
        }
    logits_.resize(c.vocab);
    scratch_.ensure(c, max_batch);
}

gptoss_status CpuSession::forward(const int32_t* tokens, uint32_t n, uint32_t pos) {
    if (n > max_batch_ || pos + n > max_context_)
        return fail(GPTOSS_ERR_INTERNAL, "cpu forward: %u tokens at position %u exceed the session (max_context %u)",
                    n, pos, max_context_);
    const Segment segment{this, 0, n, pos};
    backend_.run(scratch_, tokens, n, &segment, 1);
    return GPTOSS_OK;
}

void CpuSession::attend(uint32_t l, const float* q, const float* k, const float* v, uint32_t n, uint32_t pos,
                        Scratch& s, float* out) {
    const Config& c = config_;
    const uint32_t Q = c.n_heads, G = c.n_kv_heads, D = c.head_dim, W = c.sliding_window;
    const size_t kv = size_t(G) * D;
    LayerCache& cache = cache_[l];
    if (c.layer_sliding[l]) {
        // Gather the visible keys [lo, pos + n) contiguously: older ones from the ring,
        // this chunk's from k/v (a chunk longer than the window would overwrite ring
        // slots that its own earlier queries still need, so the ring is written after).
        const uint32_t lo = pos + 1 > W ? pos + 1 - W : 0;
        const uint32_t S = pos + n - lo;
        s.kv_k.resize(size_t(S) * kv);
        s.kv_v.resize(size_t(S) * kv);
        for (uint32_t p = lo; p < pos; p++) {
            std::memcpy(&s.kv_k[size_t(p - lo) * kv], &cache.k[size_t(p % W) * kv], kv * sizeof(float));
            std::memcpy(&s.kv_v[size_t(p - lo) * kv], &cache.v[size_t(p % W) * kv], kv * sizeof(float));
        }
        std::memcpy(&s.kv_k[size_t(pos - lo) * kv], k, size_t(n) * kv * sizeof(float));
        std::memcpy(&s.kv_v[size_t(pos - lo) * kv], v, size_t(n) * kv * sizeof(float));
        cpu::attention(q, n, pos, Q, G, D, s.kv_k.data(), s.kv_v.data(), S, lo, W, backend_.sinks_[l].data(), out);
        const uint32_t first = pos + n > W ? std::max(pos, pos + n - W) : pos;
        for (uint32_t p = first; p < pos + n; p++) {
            std::memcpy(&cache.k[size_t(p % W) * kv], &k[size_t(p - pos) * kv], kv * sizeof(float));
            std::memcpy(&cache.v[size_t(p % W) * kv], &v[size_t(p - pos) * kv], kv * sizeof(float));
        }
    } else {
        const size_t need = size_t(pos + n) * kv;
        if (cache.k.size() < need) {
            // Grow geometrically, capped at max_context: long contexts cost only what they use.
            const size_t grown = std::min(size_t(max_context_) * kv, std::max(need, cache.k.size() * 2));
            cache.k.resize(grown);
            cache.v.resize(grown);
        }
        std::memcpy(&cache.k[size_t(pos) * kv], k, size_t(n) * kv * sizeof(float));
        std::memcpy(&cache.v[size_t(pos) * kv], v, size_t(n) * kv * sizeof(float));
        cpu::attention(q, n, pos, Q, G, D, cache.k.data(), cache.v.data(), pos + n, 0, 0, backend_.sinks_[l].data(),
                       out);
    }
}

void CpuBackend::run(Scratch& s, const int32_t* tokens, uint32_t T, const Segment* segments,
                     uint32_t n_segments) const {
    const Config& c = checkpoint_.config;
    const Weights& w = checkpoint_.weights;
    const uint32_t H = c.hidden, Q = c.n_heads, G = c.n_kv_heads, D = c.head_dim;
    const size_t kv = size_t(G) * D, qd = size_t(Q) * D;
    s.ensure(c, T);
    cpu::embed(w.embed.bf16(), tokens, T, H, s.x.data());
    for (uint32_t l = 0; l < c.n_layers; l++) {
        const LayerWeights& lw = w.layers[l];
        // Attention block: projections over all rows, RoPE and attention per segment.
        cpu::rmsnorm(s.x.data(), lw.attn_norm.bf16(), T, H, c.rms_norm_eps, s.h.data());
        cpu::matmul_bf16(s.h.data(), lw.q_weight.bf16(), lw.q_bias.bf16(), T, H, Q * D, s.q.data());
        cpu::matmul_bf16(s.h.data(), lw.k_weight.bf16(), lw.k_bias.bf16(), T, H, G * D, s.k.data());
        cpu::matmul_bf16(s.h.data(), lw.v_weight.bf16(), lw.v_bias.bf16(), T, H, G * D, s.v.data());
        for (uint32_t i = 0; i < n_segments; i++) {
            const Segment& g = segments[i];
            float* q = s.q.data() + g.row * qd;
            float* k = s.k.data() + g.row * kv;
            cpu::rope(q, g.n, Q, D, g.pos, rope_);
            cpu::rope(k, g.n, G, D, g.pos, rope_);
            g.session->attend(l, q, k, s.v.data() + g.row * kv, g.n, g.pos, s, s.attn.data() + g.row * qd);
        }
        cpu::matmul_bf16(s.attn.data(), lw.o_weight.bf16(), lw.o_bias.bf16(), T, Q * D, H, s.o.data());
        for (size_t i = 0; i < size_t(T) * H; i++) s.x[i] += s.o[i];

        // MoE block.
        cpu::rmsnorm(s.x.data(), lw.mlp_norm.bf16(), T, H, c.rms_norm_eps, s.h.data());
        cpu::matmul_bf16(s.h.data(), lw.router_weight.bf16(), lw.router_bias.bf16(), T, H, c.n_experts,
                         s.router.data());
        cpu::router_topk(s.router.data(), T, c.n_experts, c.n_experts_per_token, s.experts.data(), s.weights.data());
        const cpu::MoeWeights mw{lw.gate_up_blocks.u8(), lw.gate_up_scales.u8(), lw.gate_up_bias.bf16(),
                                 lw.down_blocks.u8(),    lw.down_scales.u8(),    lw.down_bias.bf16()};
        cpu::moe(s.h.data(), T, H, c.intermediate, mw, s.experts.data(), s.weights.data(), c.n_experts_per_token,
                 c.swiglu_limit, s.moe.data());
        for (size_t i = 0; i < size_t(T) * H; i++) s.x[i] += s.moe[i];
    }
    // Logits of each segment's last row only: gather those rows, one lm_head pass.
    for (uint32_t i = 0; i < n_segments; i++)
        std::memcpy(&s.o[size_t(i) * H], &s.x[size_t(segments[i].row + segments[i].n - 1) * H], H * sizeof(float));
    cpu::rmsnorm(s.o.data(), w.norm.bf16(), n_segments, H, c.rms_norm_eps, s.h.data());
    if (n_segments == 1) {
        cpu::matmul_bf16(s.h.data(), w.lm_head.bf16(), nullptr, 1, H, c.vocab, segments[0].session->logits_.data());
        return;
    }
    std::vector<float> logits(size_t(n_segments) * c.vocab);
    cpu::matmul_bf16(s.h.data(), w.lm_head.bf16(), nullptr, n_segments, H, c.vocab, logits.data());
    for (uint32_t i = 0; i < n_segments; i++)
        std::memcpy(segments[i].session->logits_.data(), &logits[size_t(i) * c.vocab], c.vocab * sizeof(float));
}

void CpuBackend::decode_batch(DecodeItem* const* items, uint32_t n, bool /*rows_stable*/) {
    std::vector<int32_t> tokens;
    std::vector<Segment> segments;
    for (uint32_t i = 0; i < n; i++) {
        DecodeItem& item = *items[i];
        auto* session = static_cast<CpuSession*>(item.session);
        if (item.n == 0 || item.pos + item.n > session->max_context()) {
            item.status = GPTOSS_ERR_INTERNAL;
            item.error = "cpu decode_batch: " + std::to_string(item.n) + " tokens at position " + std::to_string(item.pos) +
                         " exceed the session (max_context " + std::to_string(session->max_context()) + ")";
            continue;
        }
        segments.push_back(Segment{session, uint32_t(tokens.size()), item.n, item.pos});
        tokens.insert(tokens.end(), item.tokens, item.tokens + item.n);
        item.status = GPTOSS_OK;
    }
    if (segments.empty()) return;
    std::lock_guard<std::mutex> lock(batch_mutex_);
    run(batch_scratch_, tokens.data(), uint32_t(tokens.size()), segments.data(), uint32_t(segments.size()));
    // Sampling in the step (DecodeItem::sampling): the session's own sampler, so the caller's
    // path is exercised here too; a failure just leaves the sampling to the caller.
    for (uint32_t i = 0; i < n; i++) {
        DecodeItem& item = *items[i];
        int32_t token = -1;
        if (item.status == GPTOSS_OK && !item.prefill && item.sampling != nullptr &&
            item.session->sample(*item.sampling, item.u, &token) == GPTOSS_OK)
            item.sampled = token;
    }
    clear_error();
}

gptoss_status CpuSession::save_sliding_snapshot() {
    for (uint32_t l = 0; l < config_.n_layers; l++)
        if (config_.layer_sliding[l]) snapshot_[l] = cache_[l];
    have_snapshot_ = true;
    return GPTOSS_OK;
}

gptoss_status CpuSession::restore_sliding_snapshot() {
    if (!have_snapshot_) return fail(GPTOSS_ERR_INTERNAL, "cpu session: restore without a snapshot");
    for (uint32_t l = 0; l < config_.n_layers; l++)
        if (config_.layer_sliding[l]) cache_[l] = snapshot_[l];
    return GPTOSS_OK;
}

}  // namespace

gptoss_status create_cpu_backend(const Checkpoint& checkpoint, std::unique_ptr<Backend>* out) {
    out->reset(new CpuBackend(checkpoint));
    return GPTOSS_OK;
}

}  // namespace gptoss
