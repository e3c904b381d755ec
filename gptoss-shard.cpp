// gptoss-shard.cpp - the split of a model over several GPUs (see gptoss-shard.h): device-list
// checks, the per-rank ranges of heads, expert width and vocabulary, and per-rank checkpoint
// views built from slices of the full checkpoint's tensors.
#include "gptoss-shard.h"

#include <algorithm>
#include <cstring>

namespace gptoss {

gptoss_status validate_devices(const int32_t* devices, size_t n, int device_count) {
    if (n == 0) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "params.n_devices is 0; give at least one device");
    if (devices == nullptr)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "params.devices is NULL but params.n_devices is %zu", n);
    if (device_count <= 0)
        return fail(GPTOSS_ERR_UNSUPPORTED, "params.devices lists %zu GPU(s), but no CUDA device was found", n);
    for (size_t i = 0; i < n; ++i) {
        if (devices[i] < 0 || devices[i] >= device_count)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                        "params.devices[%zu] is %d, but only %d CUDA device(s) exist (ordinals 0..%d)", i, devices[i],
                        device_count, device_count - 1);
        for (size_t j = 0; j < i; ++j)
            if (devices[j] == devices[i])
                return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                            "params.devices[%zu] is %d, the same GPU as params.devices[%zu]; each GPU may appear once",
                            i, devices[i], j);
    }
    return GPTOSS_OK;
}

gptoss_status plan_shards(const Config& c, uint32_t n, ShardPlan* out) {
    if (n == 0) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "plan_shards: 0 ranks");
    if (c.n_kv_heads == 0 || c.n_kv_heads % n)
        return fail(GPTOSS_ERR_UNSUPPORTED, "%u kv heads do not split evenly over %u GPUs", c.n_kv_heads, n);
    constexpr uint32_t kSlice = 64;  // the expert width slice: the kernels' tile along I
    const uint32_t slices = c.intermediate / kSlice;
    if (c.intermediate % kSlice || slices < n)
        return fail(GPTOSS_ERR_UNSUPPORTED,
                    "intermediate_size %u does not split over %u GPUs in slices of %u", c.intermediate, n, kSlice);
    ShardPlan p;
    p.n_ranks = n;
    const uint32_t per = (c.vocab + n - 1) / n;
    p.lm_rows = (per + 63) / 64 * 64;
    const uint32_t gq = c.n_heads / c.n_kv_heads;
    for (uint32_t r = 0; r < n; ++r) {
        ShardRange s;
        s.kv_head0 = r * (c.n_kv_heads / n);
        s.n_kv_heads = c.n_kv_heads / n;
        s.q_head0 = s.kv_head0 * gq;
        s.n_q_heads = s.n_kv_heads * gq;
        const uint32_t a = uint32_t(uint64_t(r) * slices / n), b = uint32_t(uint64_t(r + 1) * slices / n);
        s.i0 = a * kSlice;
        s.n_i = (b - a) * kSlice;
        s.vocab0 = r * p.lm_rows;
        s.n_vocab = p.lm_rows;
        p.ranks.push_back(s);
    }
    *out = std::move(p);
    return GPTOSS_OK;
}

Config shard_config(const Config& config, const ShardRange& range) {
    Config c = config;
    c.n_heads = range.n_q_heads;
    c.n_kv_heads = range.n_kv_heads;
    c.intermediate = range.n_i;
    return c;
}

namespace {

// Builds views and gathered copies for one rank.
class Slicer {
public:
    explicit Slicer(ShardCheckpoint& out) : out_(out) {}

    // Rows [row0, row0 + n) of a tensor whose rows are row_bytes long: a view, no copy.
    Tensor rows(const Tensor& t, uint64_t row0, uint64_t n, uint64_t row_bytes) {
        Tensor v = t;
        v.data = static_cast<const uint8_t*>(t.data) + row0 * row_bytes;
        v.n_bytes = n * row_bytes;
        if (!v.shape.empty()) v.shape[0] = n;
        return v;
    }

    // For each of `outer` records of record_bytes, the bytes [off, off + len): a gathered copy.
    Tensor gather(const Tensor& t, uint64_t outer, uint64_t record_bytes, uint64_t off, uint64_t len) {
        std::vector<uint8_t>& buf = own(outer * len);
        const uint8_t* src = static_cast<const uint8_t*>(t.data);
        for (uint64_t o = 0; o < outer; ++o) std::memcpy(buf.data() + o * len, src + o * record_bytes + off, len);
        Tensor v = t;
        v.data = buf.data();
        v.n_bytes = buf.size();
        return v;
    }

    Tensor zeros(const Tensor& t) {
        Tensor v = t;
        v.data = own(t.n_bytes).data();
        return v;
    }

    // Rows [row0, row0 + n) where rows past `have` are zeros.
    Tensor rows_padded(const Tensor& t, uint64_t row0, uint64_t n, uint64_t have, uint64_t row_bytes) {
        if (row0 + n <= have) return rows(t, row0, n, row_bytes);
        std::vector<uint8_t>& buf = own(n * row_bytes);
        const uint64_t real = row0 < have ? have - row0 : 0;
        if (real) std::memcpy(buf.data(), static_cast<const uint8_t*>(t.data) + row0 * row_bytes, real * row_bytes);
        Tensor v = t;
        v.data = buf.data();
        v.n_bytes = buf.size();
        if (!v.shape.empty()) v.shape[0] = n;
        return v;
    }

private:
    std::vector<uint8_t>& own(uint64_t bytes) {
        out_.owned.emplace_back(bytes, uint8_t(0));
        return out_.owned.back();
    }
    ShardCheckpoint& out_;
};

size_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : t == DType::BF16 ? 2 : 1; }

void slice_layer(Slicer& s, const Config& c, const ShardRange& r, bool first, const LayerWeights& w,
                 LayerWeights* o) {
    const uint64_t H = c.hidden, D = c.head_dim, I = c.intermediate, E = c.n_experts;
    *o = w;  // norms, router: replicated
    o->q_weight = s.rows(w.q_weight, r.q_head0 * D, r.n_q_heads * D, H * 2);
    o->q_bias = s.rows(w.q_bias, r.q_head0 * D, r.n_q_heads * D, 2);
    o->k_weight = s.rows(w.k_weight, r.kv_head0 * D, r.n_kv_heads * D, H * 2);
    o->k_bias = s.rows(w.k_bias, r.kv_head0 * D, r.n_kv_heads * D, 2);
    o->v_weight = s.rows(w.v_weight, r.kv_head0 * D, r.n_kv_heads * D, H * 2);
    o->v_bias = s.rows(w.v_bias, r.kv_head0 * D, r.n_kv_heads * D, 2);
    const uint64_t qd = uint64_t(c.n_heads) * D;
    o->o_weight = s.gather(w.o_weight, H, qd * 2, r.q_head0 * D * 2, r.n_q_heads * D * 2);
    o->o_bias = first ? w.o_bias : s.zeros(w.o_bias);
    o->sinks = s.rows(w.sinks, r.q_head0, r.n_q_heads, dtype_bytes(w.sinks.dtype));
    // gate_up: per expert rows 2·i0 .. 2·(i0 + n_i) (gate/up interleaved rows stay paired).
    o->gate_up_blocks = s.gather(w.gate_up_blocks, E, 2 * I * H / 2, 2 * r.i0 * H / 2, 2 * r.n_i * H / 2);
    o->gate_up_scales = s.gather(w.gate_up_scales, E, 2 * I * H / 32, 2 * r.i0 * H / 32, 2 * r.n_i * H / 32);
    o->gate_up_bias = s.gather(w.gate_up_bias, E, 2 * I * 2, 2 * r.i0 * 2, 2 * r.n_i * 2);
    // down: per (expert, output row) the columns i0 .. i0 + n_i.
    o->down_blocks = s.gather(w.down_blocks, E * H, I / 2, r.i0 / 2, r.n_i / 2);
    o->down_scales = s.gather(w.down_scales, E * H, I / 32, r.i0 / 32, r.n_i / 32);
    o->down_bias = first ? w.down_bias : s.zeros(w.down_bias);
}

}  // namespace

gptoss_status make_shard_checkpoint(const Checkpoint& full, const ShardPlan& plan, uint32_t rank,
                                    std::unique_ptr<ShardCheckpoint>* out) {
    return guarded("make_shard_checkpoint", [&]() -> gptoss_status {
        if (rank >= plan.n_ranks || plan.ranks.size() != plan.n_ranks)
            return fail(GPTOSS_ERR_INTERNAL, "make_shard_checkpoint: rank %u of a %u-rank plan", rank, plan.n_ranks);
        const Config& c = full.config;
        const ShardRange& r = plan.ranks[rank];
        auto sc = std::make_unique<ShardCheckpoint>();
        sc->owned.reserve(16 * c.n_layers + 4);  // Tensors point into `owned`: no reallocation moves them
        Slicer s(*sc);
        Checkpoint& ck = sc->checkpoint;
        ck.config = shard_config(c, r);
        const Weights& w = full.weights;
        ck.weights.embed = w.embed;
        ck.weights.norm = w.norm;
        ck.weights.lm_head = s.rows_padded(w.lm_head, r.vocab0, r.n_vocab, c.vocab, uint64_t(c.hidden) * 2);
        ck.weights.layers.resize(w.layers.size());
        for (size_t l = 0; l < w.layers.size(); ++l) slice_layer(s, c, r, rank == 0, w.layers[l], &ck.weights.layers[l]);
        for (const auto& b : sc->owned) ck.total_bytes += b.size();
        *out = std::move(sc);
        return GPTOSS_OK;
    });
}

}  // namespace gptoss
