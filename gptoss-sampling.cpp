// gptoss-sampling.cpp - token sampling on the host and the seeded PRNG behind it.
// The definition (gptoss-internal.h, SamplingConfig) is what a device sampler must match:
// temperature, then top_k, then top_p (nucleus), then one uniform draw u walks the kept
// tokens in increasing id order. Walking in id order (rather than by probability) makes the
// common case (no top_k, no top_p) a single pass without a sort over the 201088 logits.
// Reproducibility: the same seed and the same logits give the same token on every machine;
// the PRNG is xoshiro256** seeded through splitmix64 (Blackman & Vigna, prng.di.unimi.it).
#include "gptoss-internal.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace gptoss {

// ---------------------------------------------------------------------------
// PRNG

uint64_t splitmix64(uint64_t* state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

Rng::Rng(uint64_t seed) {
    uint64_t state = seed;
    for (uint64_t& s : s_) s = splitmix64(&state);
}

uint64_t Rng::next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
}

double Rng::next_double() { return double(next_u64() >> 11) * 0x1.0p-53; }

// ---------------------------------------------------------------------------
// Sampling

namespace {

// Greedy: the first id with the largest logit.
int32_t argmax_id(const float* logits, uint32_t n_vocab) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return int32_t(best);
}

// The candidates in descending logit order (ties: lower id first): the top_k largest when
// use_top_k, else every id (for top_p).
std::vector<uint32_t> candidates(const float* logits, uint32_t n_vocab, uint32_t top_k, bool use_top_k) {
    auto by_logit = [&](uint32_t a, uint32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::vector<uint32_t> ids(n_vocab);
    for (uint32_t i = 0; i < n_vocab; i++) ids[i] = i;
    if (use_top_k) {
        std::partial_sort(ids.begin(), ids.begin() + top_k, ids.end(), by_logit);
        ids.resize(top_k);
    } else {
        std::sort(ids.begin(), ids.end(), by_logit);
    }
    return ids;
}

// p holds the candidates' weights in descending order (total: their sum): the length of the
// shortest prefix whose mass reaches top_p (at least one token).
uint32_t nucleus(const std::vector<double>& p, double total, float top_p) {
    double mass = 0.0;
    uint32_t keep = 0;
    while (keep < p.size()) {
        mass += p[keep] / total;
        keep++;
        if (mass >= double(top_p)) break;
    }
    return keep;
}

// One draw u over the kept (ids[i], p[i]) walked in increasing id order.
int32_t walk_by_id(const std::vector<uint32_t>& ids, const std::vector<double>& p, double u) {
    std::vector<uint32_t> order(ids.size());
    for (uint32_t i = 0; i < order.size(); i++) order[i] = i;
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return ids[a] < ids[b]; });
    double kept = 0.0;
    for (uint32_t i : order) kept += p[i];
    const double target = u * kept;
    double acc = 0.0;
    for (uint32_t i : order) {
        acc += p[i];
        if (acc > target) return int32_t(ids[i]);
    }
    return int32_t(ids[order.back()]);
}

// One draw u over every id (p[i]: id i's weight, total their sum), in id order.
int32_t walk_all(const std::vector<double>& p, double total, double u) {
    const double target = u * total;
    double acc = 0.0;
    for (uint32_t i = 0; i < p.size(); i++) {
        acc += p[i];
        if (acc > target) return int32_t(i);
    }
    // Rounding left the walk short of the target: the last id with non-zero probability.
    for (uint32_t i = uint32_t(p.size()); i-- > 0;)
        if (p[i] > 0.0) return int32_t(i);
    return 0;
}

}  // namespace

int32_t sample_logits(const float* logits, uint32_t n_vocab, const SamplingConfig& config, double u) {
    if (config.temperature <= 0.0f) return argmax_id(logits, n_vocab);
    // Candidates: every id, or the top_k largest logits / all sorted for top_p.
    const bool use_top_k = config.top_k > 0 && config.top_k < n_vocab;
    const bool use_top_p = config.top_p < 1.0f;
    const bool subset = use_top_k || use_top_p;
    std::vector<uint32_t> ids;
    if (subset) ids = candidates(logits, n_vocab, config.top_k, use_top_k);
    const uint32_t n = subset ? uint32_t(ids.size()) : n_vocab;
    auto id_at = [&](uint32_t i) { return subset ? ids[i] : i; };

    // Softmax of logits / temperature over the candidates, in double.
    float max_logit = -INFINITY;
    for (uint32_t i = 0; i < n; i++) max_logit = std::max(max_logit, logits[id_at(i)]);
    std::vector<double> p(n);
    double total = 0.0;
    const double inv_t = 1.0 / double(config.temperature);
    for (uint32_t i = 0; i < n; i++) total += (p[i] = std::exp((double(logits[id_at(i)]) - max_logit) * inv_t));

    if (use_top_p) {  // ids are sorted by descending logit, hence by descending p
        const uint32_t keep = nucleus(p, total, config.top_p);
        ids.resize(keep);
        p.resize(keep);
    }
    return subset ? walk_by_id(ids, p, u) : walk_all(p, total, u);
}

gptoss_status BackendSession::sample(const SamplingConfig& config, double u, int32_t* token_out) {
    const float* logits = nullptr;
    GPTOSS_TRY(get_logits(&logits));
    *token_out = sample_logits(logits, n_vocab_, config, u);
    return GPTOSS_OK;
}

gptoss_status BackendSession::sample_masked(const SamplingConfig& config, double u, const uint32_t* allowed,
                                            int32_t* token_out) {
    const float* logits = nullptr;
    GPTOSS_TRY(get_logits(&logits));
    thread_local std::vector<float> masked;
    masked.assign(logits, logits + n_vocab_);
    for (uint32_t t = 0; t < n_vocab_; ++t)
        if (!((allowed[t / 32] >> (t % 32)) & 1u)) masked[t] = -INFINITY;
    *token_out = sample_logits(masked.data(), n_vocab_, config, u);
    return GPTOSS_OK;
}

// The pipelined loop's defaults (gptoss-internal.h): sample now, keep the token on the host.
gptoss_status BackendSession::sample_ahead(const SamplingConfig& config, double u, const uint32_t* allowed) {
    ahead_token_ = -1;
    int32_t token = -1;
    GPTOSS_TRY(allowed != nullptr ? sample_masked(config, u, allowed, &token) : sample(config, u, &token));
    ahead_token_ = token;
    return GPTOSS_OK;
}

gptoss_status BackendSession::decode_sampled(uint32_t pos) {
    if (ahead_token_ < 0) return fail(GPTOSS_ERR_INTERNAL, "decode_sampled: no sample_ahead() before it");
    return decode(ahead_token_, pos);
}

gptoss_status BackendSession::fetch_sampled(int32_t* token_out) {
    if (ahead_token_ < 0) return fail(GPTOSS_ERR_INTERNAL, "fetch_sampled: no sample_ahead() before it");
    *token_out = ahead_token_;
    return GPTOSS_OK;
}

}  // namespace gptoss
