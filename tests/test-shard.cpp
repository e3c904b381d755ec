// tests/test-shard.cpp - the multi-GPU split without GPUs: device-list errors, the sharding
// arithmetic for the 20b/120b shapes, and the CPU reference of one sharded layer. The oracle for
// the last is the unsharded layer run by the same cpu/reference ops: the sum over ranks of each
// rank's attention output (o_proj, bias on rank 0) and MoE output, and the concatenation of the
// ranks' lm_head rows, must equal the full model's within fp32 rounding. The ranks' weights come
// from make_shard_checkpoint, so a wrong slice offset or stride fails here.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "gptoss-shard.h"
#include "cpu/reference.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace gptoss;

namespace {

Config shape(uint32_t layers, uint32_t experts, uint32_t hidden, uint32_t inter, uint32_t heads, uint32_t kv,
             uint32_t dim, uint32_t vocab) {
    Config c;
    c.n_layers = layers; c.n_experts = experts; c.n_experts_per_token = 2; c.hidden = hidden; c.intermediate = inter;
    c.n_heads = heads; c.n_kv_heads = kv; c.head_dim = dim; c.vocab = vocab; c.sliding_window = 128;
    c.max_context = 4096;
    c.layer_sliding.assign(layers, false);
    return c;
}

std::string last_error() { return gptoss_last_error(); }

// A random model held in host vectors, with Tensors pointing at them.
struct RandomModel {
    Checkpoint ck;
    std::vector<std::vector<uint8_t>> store;
    Rng rng{7};

    Tensor make(DType t, std::vector<uint64_t> shape, int kind) {
        uint64_t n = 1;
        for (uint64_t s : shape) n *= s;
        const uint64_t bytes = n * (t == DType::BF16 ? 2 : t == DType::F32 ? 4 : 1);
        store.emplace_back(bytes);
        uint8_t* p = store.back().data();
        for (uint64_t i = 0; i < n; ++i) {
            const double u = rng.next_double() * 2 - 1;
            if (t == DType::BF16) {
                const uint16_t b = f32_to_bf16(float(kind == 1 ? 1.0 + 0.1 * u : 0.1 * u));
                std::memcpy(p + 2 * i, &b, 2);
            } else if (t == DType::F32) {
                const float f = float(u);
                std::memcpy(p + 4 * i, &f, 4);
            } else {
                p[i] = kind == 2 ? uint8_t(121 + rng.next_u64() % 4) : uint8_t(rng.next_u64());  // scales or nibbles
            }
        }
        Tensor x;
        x.data = p; x.dtype = t; x.shape = shape; x.n_bytes = bytes;
        return x;
    }

    explicit RandomModel(const Config& c) {
        ck.config = c;
        const uint64_t H = c.hidden, I = c.intermediate, E = c.n_experts, Q = c.n_heads, G = c.n_kv_heads,
                       D = c.head_dim, V = c.vocab;
        Weights& w = ck.weights;
        w.embed = make(DType::BF16, {V, H}, 0);
        w.norm = make(DType::BF16, {H}, 1);
        w.lm_head = make(DType::BF16, {V, H}, 0);
        w.layers.resize(c.n_layers);
        for (LayerWeights& l : w.layers) {
            l.attn_norm = make(DType::BF16, {H}, 1);
            l.mlp_norm = make(DType::BF16, {H}, 1);
            l.q_weight = make(DType::BF16, {Q * D, H}, 0);
            l.q_bias = make(DType::BF16, {Q * D}, 0);
            l.k_weight = make(DType::BF16, {G * D, H}, 0);
            l.k_bias = make(DType::BF16, {G * D}, 0);
            l.v_weight = make(DType::BF16, {G * D, H}, 0);
            l.v_bias = make(DType::BF16, {G * D}, 0);
            l.o_weight = make(DType::BF16, {H, Q * D}, 0);
            l.o_bias = make(DType::BF16, {H}, 0);
            l.sinks = make(DType::F32, {Q}, 0);
            l.router_weight = make(DType::BF16, {E, H}, 0);
            l.router_bias = make(DType::BF16, {E}, 0);
            l.gate_up_blocks = make(DType::U8, {E, 2 * I, H / 32, 16}, 0);
            l.gate_up_scales = make(DType::U8, {E, 2 * I, H / 32}, 2);
            l.gate_up_bias = make(DType::BF16, {E, 2 * I}, 0);
            l.down_blocks = make(DType::U8, {E, H, I / 32, 16}, 0);
            l.down_scales = make(DType::U8, {E, H, I / 32}, 2);
            l.down_bias = make(DType::BF16, {E, H}, 0);
        }
    }
};

// Attention block of layer 0 without the residual: o_proj(attention(rope(qkv(x)))) + o_bias.
std::vector<float> attention_out(const Checkpoint& ck, const std::vector<float>& x, uint32_t T) {
    const Config& c = ck.config;
    const LayerWeights& w = ck.weights.layers[0];
    const uint32_t H = c.hidden, Q = c.n_heads, G = c.n_kv_heads, D = c.head_dim;
    std::vector<float> q(size_t(T) * Q * D), k(size_t(T) * G * D), v(size_t(T) * G * D), a(size_t(T) * Q * D);
    cpu::matmul_bf16(x.data(), w.q_weight.bf16(), w.q_bias.bf16(), T, H, Q * D, q.data());
    cpu::matmul_bf16(x.data(), w.k_weight.bf16(), w.k_bias.bf16(), T, H, G * D, k.data());
    cpu::matmul_bf16(x.data(), w.v_weight.bf16(), w.v_bias.bf16(), T, H, G * D, v.data());
    const cpu::Rope rope = cpu::rope_init(c);
    cpu::rope(q.data(), T, Q, D, 0, rope);
    cpu::rope(k.data(), T, G, D, 0, rope);
    std::vector<float> sinks(Q);
    std::memcpy(sinks.data(), w.sinks.data, Q * 4);
    cpu::attention(q.data(), T, 0, Q, G, D, k.data(), v.data(), T, 0, 0, sinks.data(), a.data());
    std::vector<float> o(size_t(T) * H);
    cpu::matmul_bf16(a.data(), w.o_weight.bf16(), w.o_bias.bf16(), T, Q * D, H, o.data());
    return o;
}

std::vector<float> moe_out(const Checkpoint& ck, const std::vector<float>& x, uint32_t T, const int32_t* experts,
                           const float* weights) {
    const Config& c = ck.config;
    const LayerWeights& w = ck.weights.layers[0];
    cpu::MoeWeights m{w.gate_up_blocks.u8(), w.gate_up_scales.u8(), w.gate_up_bias.bf16(),
                      w.down_blocks.u8(),    w.down_scales.u8(),    w.down_bias.bf16()};
    std::vector<float> out(size_t(T) * c.hidden);
    cpu::moe(x.data(), T, c.hidden, c.intermediate, m, experts, weights, c.n_experts_per_token, c.swiglu_limit,
             out.data());
    return out;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

TEST_CASE("device lists: duplicates, missing devices and empty lists get a clear error") {
    const int32_t ok[] = {1, 0};
    CHECK(validate_devices(ok, 2, 2) == GPTOSS_OK);
    const int32_t dup[] = {0, 1, 0};
    CHECK(validate_devices(dup, 3, 4) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(last_error().find("params.devices[2] is 0, the same GPU as params.devices[0]") != std::string::npos);
    const int32_t missing[] = {0, 2};
    CHECK(validate_devices(missing, 2, 2) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(last_error().find("params.devices[1] is 2, but only 2 CUDA device(s) exist") != std::string::npos);
    const int32_t negative[] = {-1};
    CHECK(validate_devices(negative, 1, 2) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(validate_devices(ok, 0, 2) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(validate_devices(nullptr, 2, 2) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(validate_devices(ok, 2, 0) == GPTOSS_ERR_UNSUPPORTED);
}

TEST_CASE("gptoss_load: params.devices errors without GPUs") {
    const char* dir = std::getenv("GPTOSS_TINY_MODEL");
    REQUIRE_MESSAGE(dir != nullptr, "GPTOSS_TINY_MODEL is not set (run through ctest)");
    gptoss_model_params mp = gptoss_model_default_params();
    CHECK(mp.devices == nullptr);
    CHECK(mp.n_devices == 0);
    mp.n_devices = 2;  // a count without a list
    gptoss_model* m = nullptr;
    CHECK(gptoss_load(dir, &mp, &m) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(last_error().find("params.devices is NULL but params.n_devices is 2") != std::string::npos);
    CHECK(m == nullptr);
    const int32_t two[] = {0, 1};
    mp.devices = two;
    mp.n_devices = 0;  // a list without a count
    CHECK(gptoss_load(dir, &mp, &m) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(last_error().find("params.n_devices is 0") != std::string::npos);
#ifdef GPTOSS_HAVE_CUDA
    const bool no_gpu = cuda_device_count() == 0;
#else
    const bool no_gpu = true;
#endif
    if (no_gpu) {  // CI: no CUDA build or no GPU
        mp.n_devices = 2;
        CHECK(gptoss_load(dir, &mp, &m) == GPTOSS_ERR_UNSUPPORTED);
        CHECK(m == nullptr);
    }
}

TEST_CASE("sharding arithmetic for the 20b/120b shapes") {
    const Config c = shape(36, 128, 2880, 2880, 64, 8, 64, 201088);
    ShardPlan p;
    REQUIRE(plan_shards(c, 2, &p) == GPTOSS_OK);
    REQUIRE(p.ranks.size() == 2);
    CHECK(p.lm_rows == 100544);  // 201088 / 2, already a multiple of 64
    CHECK(p.ranks[0].q_head0 == 0);
    CHECK(p.ranks[0].n_q_heads == 32);
    CHECK(p.ranks[1].q_head0 == 32);
    CHECK(p.ranks[1].kv_head0 == 4);
    CHECK(p.ranks[1].n_kv_heads == 4);
    CHECK(p.ranks[0].i0 == 0);
    CHECK(p.ranks[0].n_i == 1408);  // 45 slices of 64: 22 + 23
    CHECK(p.ranks[1].i0 == 1408);
    CHECK(p.ranks[1].n_i == 1472);
    CHECK(p.ranks[1].vocab0 == 100544);
    const Config s = shard_config(c, p.ranks[1]);
    CHECK(s.n_heads == 32);
    CHECK(s.n_kv_heads == 4);
    CHECK(s.intermediate == 1472);
    CHECK(s.vocab == 201088);
    CHECK(s.hidden == 2880);

    REQUIRE(plan_shards(c, 4, &p) == GPTOSS_OK);
    uint32_t total_i = 0;
    for (const ShardRange& r : p.ranks) {
        CHECK(r.i0 == total_i);
        CHECK(r.n_i % 64 == 0);
        CHECK(r.n_kv_heads == 2);
        total_i += r.n_i;
    }
    CHECK(total_i == 2880);
    CHECK(p.lm_rows % 64 == 0);
    CHECK(uint64_t(p.lm_rows) * 4 >= 201088);

    CHECK(plan_shards(c, 3, &p) == GPTOSS_ERR_UNSUPPORTED);
    CHECK(last_error().find("8 kv heads do not split evenly over 3 GPUs") != std::string::npos);
    const Config narrow = shape(1, 4, 64, 64, 4, 2, 16, 100);
    CHECK(plan_shards(narrow, 2, &p) == GPTOSS_ERR_UNSUPPORTED);
    CHECK(last_error().find("intermediate_size 64") != std::string::npos);
}

TEST_CASE("CPU reference: the sum of the shards of one layer equals the unsharded layer") {
    cpu::PoolHold pool;
    const Config c = shape(1, 4, 64, 192, 4, 2, 16, 100);
    RandomModel m(c);
    for (uint32_t n : {2u}) {
        CAPTURE(n);
        ShardPlan plan;
        REQUIRE(plan_shards(c, n, &plan) == GPTOSS_OK);
        CHECK(plan.lm_rows == 64);
        std::vector<std::unique_ptr<ShardCheckpoint>> shards(n);
        for (uint32_t r = 0; r < n; ++r) REQUIRE(make_shard_checkpoint(m.ck, plan, r, &shards[r]) == GPTOSS_OK);
        CHECK(shards[0]->checkpoint.config.intermediate == 64);
        CHECK(shards[1]->checkpoint.config.intermediate == 128);

        const uint32_t T = 5;
        std::vector<float> x(size_t(T) * c.hidden);
        Rng rng(3);
        for (float& v : x) v = float(rng.next_double() * 2 - 1);

        // attention: sum over ranks == full
        const std::vector<float> full_att = attention_out(m.ck, x, T);
        std::vector<float> sum_att(full_att.size(), 0.0f);
        for (uint32_t r = 0; r < n; ++r) {
            const std::vector<float> part = attention_out(shards[r]->checkpoint, x, T);
            for (size_t i = 0; i < part.size(); ++i) sum_att[i] += part[i];
        }
        CHECK(rel_l2(sum_att, full_att) < 1e-5);

        // MoE with the full router's choices (every rank computes the same routing)
        const LayerWeights& w = m.ck.weights.layers[0];
        std::vector<float> logits(size_t(T) * c.n_experts);
        cpu::matmul_bf16(x.data(), w.router_weight.bf16(), w.router_bias.bf16(), T, c.hidden, c.n_experts,
                         logits.data());
        std::vector<int32_t> experts(size_t(T) * c.n_experts_per_token);
        std::vector<float> weights(experts.size());
        cpu::router_topk(logits.data(), T, c.n_experts, c.n_experts_per_token, experts.data(), weights.data());
        const std::vector<float> full_moe = moe_out(m.ck, x, T, experts.data(), weights.data());
        std::vector<float> sum_moe(full_moe.size(), 0.0f);
        for (uint32_t r = 0; r < n; ++r) {
            const std::vector<float> part = moe_out(shards[r]->checkpoint, x, T, experts.data(), weights.data());
            for (size_t i = 0; i < part.size(); ++i) sum_moe[i] += part[i];
        }
        CHECK(rel_l2(sum_moe, full_moe) < 1e-5);
        // A shard alone is not the whole (the test can fail).
        CHECK(rel_l2(moe_out(shards[0]->checkpoint, x, T, experts.data(), weights.data()), full_moe) > 1e-2);

        // lm_head: the ranks' rows, concatenated and cut at V, are the full logits
        std::vector<float> full_lm(c.vocab), cat;
        cpu::matmul_bf16(x.data(), m.ck.weights.lm_head.bf16(), nullptr, 1, c.hidden, c.vocab, full_lm.data());
        for (uint32_t r = 0; r < n; ++r) {
            std::vector<float> part(plan.lm_rows);
            cpu::matmul_bf16(x.data(), shards[r]->checkpoint.weights.lm_head.bf16(), nullptr, 1, c.hidden,
                             plan.lm_rows, part.data());
            cat.insert(cat.end(), part.begin(), part.end());
        }
        REQUIRE(cat.size() == size_t(n) * plan.lm_rows);
        for (size_t i = c.vocab; i < cat.size(); ++i) CHECK(cat[i] == 0.0f);  // zero padding rows
        cat.resize(c.vocab);
        CHECK(cat == full_lm);
    }
}
