// tests/test-kernels-sample-batch.cu - the batched sampler (cuda/sample_batch.h, issue 13): every
// row of one cuda::sample_rows launch, each with its own logits, temperature, top_k, top_p and
// u, gets exactly the token of the per-session sampler (cuda::sample, itself tested against
// sample_logits in test-kernels.cu) run on that row alone: greedy (T <= 0), T > 0 with and
// without top_k / top_p, degenerate cuts (top_k 1, V − 1, ≥ V; top_p 1e-6), ties (flat logits,
// +0/−0), very negative logits, V = 1, 2, 1000, 1001 (scalar loads), 201088 (the vocabulary);
// rows of greedy, sampled and top-cut configs mixed in one launch.
// And a row's token does not depend on its batch: the same rows at N = 1, 3 and 64, in another
// order, give the same tokens. kSkip rows (make_sample_row's fallbacks) come back as -1.
#include "tests/kernel-test-util.cuh"

#include "cuda/sample_batch.h"

#include <memory>

namespace {

std::vector<float> logits_of(int kind, uint32_t V, uint64_t seed) {
    Rand r(seed);
    std::vector<float> l(V);
    switch (kind % 5) {
        case 0:  // peaked
            l = r.floats(V, 1.0f);
            l[r.below(V)] = 60.0f;
            break;
        case 1:  // flat: every id ties
            std::fill(l.begin(), l.end(), 1.5f);
            break;
        case 2:  // signed zeros tie
            for (uint32_t i = 0; i < V; ++i) l[i] = r.below(2) ? 0.0f : -0.0f;
            if (V > 3) l[V / 3] = -1.0f;
            break;
        default:  // realistic (bf16-rounded, many repeats), kind 4 also very negative
            for (float& x : l) x = round_bf16(r.uniform(9.0f));
            if (kind % 5 == 4)
                for (uint32_t i = 0; i < V; ++i) {
                    const uint32_t m = r.below(8);
                    if (m < 3) l[i] = -1e30f;
                    else if (m == 3) l[i] = -80.0f - float(r.below(4));
                }
    }
    return l;
}

std::vector<SamplingConfig> configs_of(uint32_t V, bool many) {
    std::vector<SamplingConfig> cs = {{0.0f, 1.0f, 0}, {-1.0f, 0.5f, 3}};
    const std::vector<float> ts = many ? std::vector<float>{0.3f, 1.0f, 2.5f} : std::vector<float>{0.7f};
    for (float t : ts)
        for (uint32_t k : {0u, 1u, 40u, V - 1, V + 5})
            for (float p : {1.0f, 0.9f, 0.5f, 1e-6f}) cs.push_back(SamplingConfig{t, p, k});
    return cs;
}

struct Single {  // the per-session sampler
    uint32_t V;
    size_t bytes = 0;
    std::unique_ptr<Dev<char>> scratch;
    Dev<int32_t> token{2};
    explicit Single(uint32_t v) : V(v) {
        OK(cuda::sample_scratch_bytes(V, &bytes));
        scratch = std::make_unique<Dev<char>>(bytes);
    }
    int32_t run(const float* logits, const SamplingConfig& c, double u) {
        if (c.temperature <= 0.0f) {
            OK(cuda::argmax(logits, V, token.p, nullptr));
            std::vector<int32_t> k = token.get();
            unsigned long long key = 0;
            std::memcpy(&key, k.data(), 8);
            return cuda::decode_argmax(key);
        }
        OK(cuda::sample(logits, V, c, u, scratch->p, bytes, token.p, nullptr));
        return token.get()[0];
    }
};

struct Row {
    SamplingConfig c;
    double u;
    uint32_t logits;  // index of its logits vector
};

// Runs rows (in the given order) through one sample_rows launch; tokens in that order. pitch:
// the row stride (V: aligned rows, the 16-byte loads; V + 3: mostly the scalar loads).
std::vector<int32_t> batched(const std::vector<std::vector<float>>& logits, uint32_t V, const std::vector<Row>& rows,
                             size_t pitch) {
    bool fast = false;
    OK(cuda::sample_fast_path(V, &fast));
    REQUIRE(fast);
    const size_t ld = pitch;
    std::vector<float> all(rows.size() * ld, 0.0f);
    std::vector<cuda::SampleRow> params;
    for (size_t i = 0; i < rows.size(); ++i) {
        std::copy(logits[rows[i].logits].begin(), logits[rows[i].logits].end(), all.begin() + i * ld);
        params.push_back(cuda::make_sample_row(rows[i].c, rows[i].u, V, fast));
        REQUIRE(params.back().mode != cuda::SampleRow::kSkip);
    }
    Dev<float> dl(all);
    Dev<cuda::SampleRow> dp(params.size());
    REQUIRE(cudaMemcpy(dp.p, params.data(), params.size() * sizeof(params[0]), cudaMemcpyHostToDevice) == cudaSuccess);
    Dev<int32_t> tok(rows.size());
    const size_t bytes = cuda::sample_rows_scratch_bytes(uint32_t(rows.size()));
    Dev<char> scratch(bytes);
    OK(cuda::sample_rows(dl.p, V, ld, dp.p, uint32_t(rows.size()), scratch.p, bytes, tok.p, nullptr));
    return tok.get();
}

}  // namespace

TEST_CASE("sample_rows gives every row the per-session sampler's token (V = 1, 2, 1000, 1001, 201088)") {
    size_t checked = 0;
    for (uint32_t V : {1u, 2u, 1000u, 1001u, 201088u}) {
        const bool big = V == 201088;
        std::vector<std::vector<float>> logits;
        for (int kind = 0; kind < 5; ++kind) logits.push_back(logits_of(kind, V, 11 + V + uint64_t(kind)));
        Single single(V);
        std::vector<std::unique_ptr<Dev<float>>> dev;
        for (const auto& l : logits) dev.push_back(std::make_unique<Dev<float>>(l));
        Rng rng(V);
        std::vector<Row> rows;
        for (uint32_t k = 0; k < logits.size(); ++k)
            for (const SamplingConfig& c : configs_of(V, !big))
                for (double u : {0.0, 0.5, 0.999999, rng.next_double()}) {
                    if (big && rng.next_double() < 0.5) continue;  // ~half, to keep the batch < 200 MB
                    rows.push_back(Row{c, u, k});
                }
        const std::vector<int32_t> got = batched(logits, V, rows, V + 3);
        for (size_t i = 0; i < rows.size(); ++i) {
            const Row& r = rows[i];
            const int32_t want = single.run(dev[r.logits]->p, r.c, r.u);
            INFO("V " << V << " kind " << r.logits << " T " << r.c.temperature << " top_k " << r.c.top_k << " top_p "
                      << r.c.top_p << " u " << r.u);
            CHECK(got[i] == want);
            checked++;
        }
    }
    MESSAGE("sample_rows: " << checked << " rows compared with cuda::sample / cuda::argmax");
}

TEST_CASE("a row's token does not depend on the batch: N = 1, 3, 64, reversed") {
    const uint32_t V = 201088;
    std::vector<std::vector<float>> logits;
    for (int i = 0; i < 8; ++i) logits.push_back(logits_of(i < 5 ? i : 3, V, 500 + uint64_t(i)));
    const SamplingConfig cs[] = {{0.0f, 1.0f, 0}, {1.0f, 1.0f, 0}, {0.7f, 0.9f, 0}, {0.7f, 1.0f, 40},
                                 {1.0f, 0.95f, 50}, {2.5f, 0.5f, 0}, {0.3f, 1.0f, 1}, {1.0f, 1e-6f, 0}};
    Rng rng(3);
    std::vector<Row> rows;
    for (uint32_t i = 0; i < 64; ++i) rows.push_back(Row{cs[i % 8], rng.next_double(), (i / 8 + i) % 8});
    const std::vector<int32_t> all = batched(logits, V, rows, V);
    for (uint32_t i = 0; i < 64; ++i) CHECK(batched(logits, V, {rows[i]}, V)[0] == all[i]);
    for (uint32_t i = 0; i + 3 <= 64; i += 7) {
        const std::vector<int32_t> three = batched(logits, V, {rows[i + 2], rows[i], rows[i + 1]}, V);
        CHECK(three[0] == all[i + 2]);
        CHECK(three[1] == all[i]);
        CHECK(three[2] == all[i + 1]);
    }
    std::vector<Row> rev(rows.rbegin(), rows.rend());
    const std::vector<int32_t> r = batched(logits, V, rev, V);
    for (uint32_t i = 0; i < 64; ++i) CHECK(r[63 - i] == all[i]);
}

TEST_CASE("make_sample_row leaves what it cannot do exactly to the session (kSkip rows give -1)") {
    const uint32_t V = 1000;
    CHECK(cuda::make_sample_row({NAN, 1.0f, 0}, 0.5, V, true).mode == cuda::SampleRow::kSkip);
    CHECK(cuda::make_sample_row({1.0f, 1.0f, 0}, 1.0, V, true).mode == cuda::SampleRow::kSkip);
    CHECK(cuda::make_sample_row({1.0f, 1.0f, 0}, -0.1, V, true).mode == cuda::SampleRow::kSkip);
    CHECK(cuda::make_sample_row({1.0f, 1.0f, 0}, 0.5, V, false).mode == cuda::SampleRow::kSkip);  // sort path
    CHECK(cuda::make_sample_row({0.0f, 1.0f, 0}, 0.5, V, false).mode == cuda::SampleRow::kGreedy);
    CHECK(cuda::make_sample_row({1.0f, 1.0f, V}, 0.5, V, true).top_k == 0u);
    Dev<float> l(logits_of(3, V, 9));
    std::vector<cuda::SampleRow> params = {cuda::make_sample_row({NAN, 1.0f, 0}, 0.5, V, true),
                                           cuda::make_sample_row({0.0f, 1.0f, 0}, 0.5, V, true)};
    Dev<cuda::SampleRow> dp(2);
    REQUIRE(cudaMemcpy(dp.p, params.data(), 2 * sizeof(params[0]), cudaMemcpyHostToDevice) == cudaSuccess);
    // Both rows read the same logits (ld = 0 is refused, so two copies).
    std::vector<float> two = logits_of(3, V, 9);
    two.insert(two.end(), two.begin(), two.end());
    Dev<float> dl(two);
    Dev<int32_t> tok(2);
    const size_t bytes = cuda::sample_rows_scratch_bytes(2);
    Dev<char> scratch(bytes);
    OK(cuda::sample_rows(dl.p, V, V, dp.p, 2, scratch.p, bytes, tok.p, nullptr));
    const std::vector<int32_t> t = tok.get();
    CHECK(t[0] == -1);
    CHECK(t[1] == sample_logits(two.data(), V, {0.0f, 1.0f, 0}, 0.5));
    CHECK(cuda::sample_rows(dl.p, V, V - 1, dp.p, 2, scratch.p, bytes, tok.p, nullptr) == GPTOSS_ERR_INTERNAL);
    CHECK(cuda::sample_rows(dl.p, V, V, dp.p, 2, scratch.p, bytes - 1, tok.p, nullptr) == GPTOSS_ERR_INTERNAL);
}

int main(int argc, char** argv) { return run_kernel_tests(argc, argv, "test-kernels-sample-batch"); }
