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
#include <new>

namespace gptoss {
namespace {

class CpuBackend;

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

private:
    struct LayerCache {
        std::vector<float> k, v;  // [slots, G, D]
    };
    const CpuBackend& backend_;
    const Config& config_;
    uint32_t max_context_;
    std::vector<LayerCache> cache_;
    std::vector<LayerCache> snapshot_;   // sliding layers only (others left empty)
    bool have_snapshot_ = false;
    std::vector<float> logits_;
    // Scratch, sized for max_batch tokens.
    std::vector<float> x_, h_, q_, k_, v_, attn_, o_, router_, moe_, kv_k_, kv_v_, weights_;
    std::vector<int32_t> experts_;
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

    const Checkpoint& checkpoint_;
    cpu::Rope rope_;
    std::vector<std::vector<float>> sinks_;  // [L][Q] fp32
    cpu::PoolHold pool_;
};

CpuSession::CpuSession(const CpuBackend& backend, uint32_t max_context, uint32_t max_batch)
    : BackendSession(backend.checkpoint_.config.vocab), backend_(backend), config_(backend.checkpoint_.config),
      max_context_(max_context) {
    const Config& c = config_;
    const size_t T = max_batch, kv = size_t(c.n_kv_heads) * c.head_dim;
    cache_.resize(c.n_layers);
    snapshot_.resize(c.n_layers);
    for (uint32_t l = 0; l < c.n_layers; l++)
        if (c.layer_sliding[l]) {
            cache_[l].k.assign(size_t(c.sliding_window) * kv, 0.0f);
            cache_[l].v.assign(size_t(c.sliding_window) * kv, 0.0f);
        }
    logits_.resize(c.vocab);
    x_.resize(T * c.hidden);
    h_.resize(T * c.hidden);
    q_.resize(T * c.n_heads * c.head_dim);
    k_.resize(T * kv);
    v_.resize(T * kv);
    attn_.resize(T * c.n_heads * c.head_dim);
    o_.resize(T * c.hidden);
    router_.resize(T * c.n_experts);
    moe_.resize(T * c.hidden);
    experts_.resize(T * c.n_experts_per_token);
    weights_.resize(T * c.n_experts_per_token);
}

gptoss_status CpuSession::forward(const int32_t* tokens, uint32_t n, uint32_t pos) {
    const Config& c = config_;
    const Weights& w = backend_.checkpoint_.weights;
    const uint32_t H = c.hidden, Q = c.n_heads, G = c.n_kv_heads, D = c.head_dim, W = c.sliding_window;
    const size_t kv = size_t(G) * D;
    if (size_t(n) * H > x_.size() || pos + n > max_context_)
        return fail(GPTOSS_ERR_INTERNAL, "cpu forward: %u tokens at position %u exceed the session (max_context %u)",
                    n, pos, max_context_);

    cpu::embed(w.embed.bf16(), tokens, n, H, x_.data());
    for (uint32_t l = 0; l < c.n_layers; l++) {
        const LayerWeights& lw = w.layers[l];
        // Attention block.
        cpu::rmsnorm(x_.data(), lw.attn_norm.bf16(), n, H, c.rms_norm_eps, h_.data());
        cpu::matmul_bf16(h_.data(), lw.q_weight.bf16(), lw.q_bias.bf16(), n, H, Q * D, q_.data());
        cpu::matmul_bf16(h_.data(), lw.k_weight.bf16(), lw.k_bias.bf16(), n, H, G * D, k_.data());
        cpu::matmul_bf16(h_.data(), lw.v_weight.bf16(), lw.v_bias.bf16(), n, H, G * D, v_.data());
        cpu::rope(q_.data(), n, Q, D, pos, backend_.rope_);
        cpu::rope(k_.data(), n, G, D, pos, backend_.rope_);
        LayerCache& cache = cache_[l];
        if (lw.sliding) {
            // Gather the visible keys [lo, pos + n) contiguously: older ones from the ring,
            // this chunk's from k_/v_ (a chunk longer than the window would overwrite ring
            // slots that its own earlier queries still need, so the ring is written after).
            const uint32_t lo = pos + 1 > W ? pos + 1 - W : 0;
            const uint32_t S = pos + n - lo;
            kv_k_.resize(size_t(S) * kv);
            kv_v_.resize(size_t(S) * kv);
            for (uint32_t p = lo; p < pos; p++) {
                std::memcpy(&kv_k_[size_t(p - lo) * kv], &cache.k[size_t(p % W) * kv], kv * sizeof(float));
                std::memcpy(&kv_v_[size_t(p - lo) * kv], &cache.v[size_t(p % W) * kv], kv * sizeof(float));
            }
            std::memcpy(&kv_k_[size_t(pos - lo) * kv], k_.data(), size_t(n) * kv * sizeof(float));
            std::memcpy(&kv_v_[size_t(pos - lo) * kv], v_.data(), size_t(n) * kv * sizeof(float));
            cpu::attention(q_.data(), n, pos, Q, G, D, kv_k_.data(), kv_v_.data(), S, lo, W,
                           backend_.sinks_[l].data(), attn_.data());
            const uint32_t first = pos + n > W ? std::max(pos, pos + n - W) : pos;
            for (uint32_t p = first; p < pos + n; p++) {
                std::memcpy(&cache.k[size_t(p % W) * kv], &k_[size_t(p - pos) * kv], kv * sizeof(float));
                std::memcpy(&cache.v[size_t(p % W) * kv], &v_[size_t(p - pos) * kv], kv * sizeof(float));
            }
        } else {
            const size_t need = size_t(pos + n) * kv;
            if (cache.k.size() < need) {
                // Grow geometrically, capped at max_context: long contexts cost only what they use.
                const size_t grown = std::min(size_t(max_context_) * kv, std::max(need, cache.k.size() * 2));
                cache.k.resize(grown);
                cache.v.resize(grown);
            }
            std::memcpy(&cache.k[size_t(pos) * kv], k_.data(), size_t(n) * kv * sizeof(float));
            std::memcpy(&cache.v[size_t(pos) * kv], v_.data(), size_t(n) * kv * sizeof(float));
            cpu::attention(q_.data(), n, pos, Q, G, D, cache.k.data(), cache.v.data(), pos + n, 0, 0,
                           backend_.sinks_[l].data(), attn_.data());
        }
        cpu::matmul_bf16(attn_.data(), lw.o_weight.bf16(), lw.o_bias.bf16(), n, Q * D, H, o_.data());
        for (size_t i = 0; i < size_t(n) * H; i++) x_[i] += o_[i];

        // MoE block.
        cpu::rmsnorm(x_.data(), lw.mlp_norm.bf16(), n, H, c.rms_norm_eps, h_.data());
        cpu::matmul_bf16(h_.data(), lw.router_weight.bf16(), lw.router_bias.bf16(), n, H, c.n_experts,
                         router_.data());
        cpu::router_topk(router_.data(), n, c.n_experts, c.n_experts_per_token, experts_.data(), weights_.data());
        const cpu::MoeWeights mw{lw.gate_up_blocks.u8(), lw.gate_up_scales.u8(), lw.gate_up_bias.bf16(),
                                 lw.down_blocks.u8(),    lw.down_scales.u8(),    lw.down_bias.bf16()};
        cpu::moe(h_.data(), n, H, c.intermediate, mw, experts_.data(), weights_.data(), c.n_experts_per_token,
                 c.swiglu_limit, moe_.data());
        for (size_t i = 0; i < size_t(n) * H; i++) x_[i] += moe_[i];
    }
    // Logits of the last token only.
    const float* last = x_.data() + size_t(n - 1) * H;
    cpu::rmsnorm(last, w.norm.bf16(), 1, H, c.rms_norm_eps, h_.data());
    cpu::matmul_bf16(h_.data(), w.lm_head.bf16(), nullptr, 1, H, c.vocab, logits_.data());
    return GPTOSS_OK;
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
