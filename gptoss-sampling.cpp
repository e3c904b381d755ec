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

int32_t sample_logits(const float* logits, uint32_t n_vocab, const SamplingConfig& config, double u) {
    if (config.temperature <= 0.0f) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < n_vocab; i++)
            if (logits[i] > logits[best]) best = i;
        return int32_t(best);
    }
    // Candidates: every id, or the top_k largest logits (ties: lower id first).
    std::vector<uint32_t> ids;
    const bool use_top_k = config.top_k > 0 && config.top_k < n_vocab;
    const bool use_top_p = config.top_p < 1.0f;
    auto by_logit = [&](uint32_t a, uint32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    if (use_top_k || use_top_p) {
        ids.resize(n_vocab);
        for (uint32_t i = 0; i < n_vocab; i++) ids[i] = i;
        if (use_top_k) {
            std::partial_sort(ids.begin(), ids.begin() + config.top_k, ids.end(), by_logit);
            ids.resize(config.top_k);
        } else {
            std::sort(ids.begin(), ids.end(), by_logit);
        }
    }
    const uint32_t n = use_top_k || use_top_p ? uint32_t(ids.size()) : n_vocab;
    auto id_at = [&](uint32_t i) { return use_top_k || use_top_p ? ids[i] : i; };

    // Softmax of logits / temperature over the candidates, in double.
    float max_logit = -INFINITY;
    for (uint32_t i = 0; i < n; i++) max_logit = std::max(max_logit, logits[id_at(i)]);
    std::vector<double> p(n);
    double total = 0.0;
    const double inv_t = 1.0 / double(config.temperature);
    for (uint32_t i = 0; i < n; i++) total += (p[i] = std::exp((double(logits[id_at(i)]) - max_logit) * inv_t));

    if (use_top_p) {
        // ids are sorted by descending logit, hence by descending p: keep the shortest prefix
        // whose mass reaches top_p (at least one token).
        double mass = 0.0;
        uint32_t keep = 0;
        while (keep < n) {
            mass += p[keep] / total;
            keep++;
            if (mass >= double(config.top_p)) break;
        }
        ids.resize(keep);
        p.resize(keep);
    }
    if (use_top_k || use_top_p) {
        // Walk in increasing id order: sort the kept (id, p) pairs by id.
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
    const double target = u * total;
    double acc = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        acc += p[i];
        if (acc > target) return int32_t(i);
    }
    // Rounding left the walk short of the target: the last id with non-zero probability.
    for (uint32_t i = n; i-- > 0;)
        if (p[i] > 0.0) return int32_t(i);
    return 0;
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

}  // namespace gptoss
