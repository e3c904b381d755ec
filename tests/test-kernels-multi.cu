// tests/test-kernels-multi.cu - a model split over two GPUs (gptoss-shard.h, cuda/multi_gpu.cu)
// against the same checkpoint on one GPU, the oracle: logits of a prefilled prompt and of greedy
// decode steps (through the NCCL-carrying decode graph) within bf16 tolerance, greedy tokens
// identical away from near-ties, low-temperature sampling with the same u identical, the sliding snapshot
// restoring both ranks, and the public API (gptoss_load with params.devices) giving the same
// greedy reply as one GPU; plus the device-list errors through gptoss_load.
// Needs two CUDA devices and a checkpoint whose shape splits over two (kv heads even, expert
// width >= 128): GPTOSS_MULTI_MODEL=DIR, e.g. written by
//   gptoss-synth --preset tiny --hidden 128 --intermediate 256 --layers 3 --out DIR
// With fewer GPUs or no model it says so and exits 77 (skipped).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "gptoss-internal.h"
#include "gptoss-shard.h"
#include "cuda/backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace gptoss;

namespace {

constexpr double kTolerance = 2e-2;   // relative L2 of logits: bf16 activations, other fp32 sum order
constexpr float kDecisiveGap = 0.05f; // top-2 logit gap under which either greedy choice is right

std::string g_model;

double rel_l2(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

// Top-1 id and the gap to the second largest logit.
std::pair<int32_t, float> top1(const float* l, size_t n) {
    int32_t best = 0;
    for (size_t i = 1; i < n; ++i)
        if (l[i] > l[best]) best = int32_t(i);
    float second = -INFINITY;
    for (size_t i = 0; i < n; ++i)
        if (int32_t(i) != best) second = std::max(second, l[i]);
    return {best, l[best] - second};
}

struct Pair {
    std::unique_ptr<Checkpoint> ck;
    std::unique_ptr<Backend> one, two;
    std::unique_ptr<BackendSession> s1, s2;
};

void open_pair(Pair* p, uint32_t max_context, uint32_t max_batch) {
    REQUIRE(load_checkpoint(g_model, {}, &p->ck) == GPTOSS_OK);
    REQUIRE_MESSAGE(create_cuda_backend(*p->ck, 0, {}, &p->one) == GPTOSS_OK, std::string(gptoss_last_error()));
    const int32_t devs[] = {0, 1};
    REQUIRE_MESSAGE(create_sharded_cuda_backend(*p->ck, devs, 2, {}, &p->two) == GPTOSS_OK, std::string(gptoss_last_error()));
    REQUIRE_MESSAGE(p->one->create_session(max_context, max_batch, &p->s1) == GPTOSS_OK, std::string(gptoss_last_error()));
    REQUIRE_MESSAGE(p->two->create_session(max_context, max_batch, &p->s2) == GPTOSS_OK, std::string(gptoss_last_error()));
}

double compare_logits(Pair& p, const char* what) {
    const float *a = nullptr, *b = nullptr;
    REQUIRE_MESSAGE(p.s2->get_logits(&b) == GPTOSS_OK, std::string(gptoss_last_error()));
    std::vector<float> two(b, b + p.ck->config.vocab);
    REQUIRE_MESSAGE(p.s1->get_logits(&a) == GPTOSS_OK, std::string(gptoss_last_error()));
    const double e = rel_l2(two.data(), a, two.size());
    INFO(what);
    CHECK(e < kTolerance);
    CHECK(std::isfinite(e));
    return e;
}

}  // namespace

TEST_CASE("split over 2 GPUs: prefill and decode logits match one GPU; greedy tokens agree") {
    Pair p;
    open_pair(&p, 1024, 128);
    const uint32_t V = p.ck->config.vocab;
    Rng rng(5);
    std::vector<int32_t> prompt(300);
    for (int32_t& t : prompt) t = int32_t(rng.next_u64() % V);
    // chunks of 128: the sliding window (128) wraps, as in a real prefill
    for (uint32_t pos = 0; pos < prompt.size(); pos += 128) {
        const uint32_t n = std::min<uint32_t>(128, uint32_t(prompt.size()) - pos);
        REQUIRE(p.s1->forward(prompt.data() + pos, n, pos) == GPTOSS_OK);
        REQUIRE_MESSAGE(p.s2->forward(prompt.data() + pos, n, pos) == GPTOSS_OK, std::string(gptoss_last_error()));
    }
    double worst = compare_logits(p, "after the prompt");
    REQUIRE(p.s1->save_sliding_snapshot() == GPTOSS_OK);
    REQUIRE(p.s2->save_sliding_snapshot() == GPTOSS_OK);

    const SamplingConfig greedy{0.0f, 1.0f, 0};
    uint32_t pos = uint32_t(prompt.size());
    int32_t tok = 0;
    REQUIRE(p.s1->sample(greedy, 0.0, &tok) == GPTOSS_OK);
    int agree = 0, decisive = 0;
    std::vector<int32_t> first_tokens;
    for (int step = 0; step < 24; ++step, ++pos) {
        REQUIRE(p.s1->decode(tok, pos) == GPTOSS_OK);
        REQUIRE_MESSAGE(p.s2->decode(tok, pos) == GPTOSS_OK, std::string(gptoss_last_error()));
        worst = std::max(worst, compare_logits(p, "decode step"));
        const float* a = nullptr;
        REQUIRE(p.s1->get_logits(&a) == GPTOSS_OK);
        const auto [best, gap] = top1(a, V);
        int32_t t1 = 0, t2 = 0;
        REQUIRE(p.s1->sample(greedy, 0.0, &t1) == GPTOSS_OK);
        REQUIRE(p.s2->sample(greedy, 0.0, &t2) == GPTOSS_OK);
        CHECK(t1 == best);
        if (gap >= kDecisiveGap) {
            ++decisive;
            CHECK(t1 == t2);
        }
        agree += t1 == t2;
        // The same u on both, at a temperature where a decisive gap decides the draw (at T=1 over
        // this random model's nearly flat 200k logits, any rounding moves the draw a few ids).
        int32_t u1 = 0, u2 = 0;
        REQUIRE(p.s1->sample({0.01f, 0.9f, 0}, 0.37, &u1) == GPTOSS_OK);
        REQUIRE(p.s2->sample({0.01f, 0.9f, 0}, 0.37, &u2) == GPTOSS_OK);
        if (gap >= kDecisiveGap) CHECK(u1 == u2);
        // T=1 top_p=0.9 through the split model's sampler: a valid id, the draw reported only
        int32_t w2 = -1;
        REQUIRE(p.s2->sample({1.0f, 0.9f, 0}, 0.37, &w2) == GPTOSS_OK);
        CHECK((w2 >= 0 && uint32_t(w2) < V));
        tok = t1;  // both follow one GPU's choice, so every step compares the same input
        first_tokens.push_back(t1);
    }
    MESSAGE("worst relative L2 of logits, 2 GPUs vs 1: " << worst << "; greedy agreement " << agree << "/24 ("
                                                         << decisive << " decisive steps)");

    // The snapshot restores both ranks' sliding rings: re-decoding from the prompt's end gives
    // the first step's logits again.
    REQUIRE(p.s1->restore_sliding_snapshot() == GPTOSS_OK);
    REQUIRE(p.s2->restore_sliding_snapshot() == GPTOSS_OK);
    int32_t t0 = 0;
    REQUIRE(p.s1->forward(prompt.data() + prompt.size() - 1, 1, uint32_t(prompt.size()) - 1) == GPTOSS_OK);
    REQUIRE(p.s2->forward(prompt.data() + prompt.size() - 1, 1, uint32_t(prompt.size()) - 1) == GPTOSS_OK);
    compare_logits(p, "after restoring the snapshot");
    REQUIRE(p.s2->sample(greedy, 0.0, &t0) == GPTOSS_OK);
    int32_t t_one = 0;
    REQUIRE(p.s1->sample(greedy, 0.0, &t_one) == GPTOSS_OK);
    CHECK(t0 == t_one);
}

// Two ranks: every all-reduced value is one fp32 addition of the two partials, so the ways of
// running the collectives (cuda/rank_comm.h) must give bit-identical logits, NCCL's own
// ncclAllReduce being the oracle. A 600-token chunk (600 × hidden floats, past the LSA
// kernel's limit) takes ncclAllReduce inside lsa mode, the 100-token one and the decode steps
// the one-shot kernels (when this build and the NCCL library have the device API; else lsa
// falls back to nccl, which the log says). Then short chunks of 1-64 tokens between decode steps,
// so all-reduces of mixed lengths (and staging-slot layouts) alternate.
TEST_CASE("split over 2 GPUs: GPTOSS_MULTI_AR nccl and lsa give bit-identical logits (sym reported)") {
    Pair p;
    open_pair(&p, 1024, 640);
    const uint32_t V = p.ck->config.vocab;
    const char* old = std::getenv("GPTOSS_MULTI_AR");
    const std::string saved = old ? old : "";
    Rng rng(11);
    std::vector<int32_t> prompt(700);
    for (int32_t& t : prompt) t = int32_t(rng.next_u64() % V);
    std::vector<std::vector<float>> runs;
    std::vector<int32_t> tokens;
    for (const char* mode : {"nccl", "sym", "lsa"}) {
        setenv("GPTOSS_MULTI_AR", mode, 1);
        std::unique_ptr<BackendSession> s;
        REQUIRE_MESSAGE(p.two->create_session(1024, 640, &s) == GPTOSS_OK, std::string(gptoss_last_error()));
        std::vector<float> all;
        auto keep = [&] {
            const float* l = nullptr;
            REQUIRE(s->get_logits(&l) == GPTOSS_OK);
            all.insert(all.end(), l, l + V);
        };
        REQUIRE_MESSAGE(s->forward(prompt.data(), 600, 0) == GPTOSS_OK, std::string(gptoss_last_error()));
        keep();
        REQUIRE_MESSAGE(s->forward(prompt.data() + 600, 100, 600) == GPTOSS_OK, std::string(gptoss_last_error()));
        keep();
        for (uint32_t step = 0; step < 12; ++step) {
            if (runs.empty()) {
                int32_t t = 0;
                REQUIRE(s->sample({0.0f, 1.0f, 0}, 0.0, &t) == GPTOSS_OK);
                tokens.push_back(t);
            }
            REQUIRE_MESSAGE(s->decode(tokens[step], 700 + step) == GPTOSS_OK, std::string(gptoss_last_error()));
            keep();
        }
        // Short chunks between decode steps (0: one decode step): all-reduces of mixed lengths
        // take turns on the same staging slots, whose layout depends on the length.
        uint32_t pos = 712;
        size_t next = 12;
        for (uint32_t len : {3u, 0u, 5u, 2u, 0u, 0u, 17u, 4u, 0u, 64u, 1u, 0u, 2u, 0u}) {
            if (len > 0) {
                REQUIRE_MESSAGE(s->forward(prompt.data() + pos % 600, len, pos) == GPTOSS_OK,
                                std::string(gptoss_last_error()));
            } else {
                if (runs.empty()) {
                    int32_t t = 0;
                    REQUIRE(s->sample({0.0f, 1.0f, 0}, 0.0, &t) == GPTOSS_OK);
                    tokens.push_back(t);
                }
                REQUIRE_MESSAGE(s->decode(tokens[next++], pos) == GPTOSS_OK, std::string(gptoss_last_error()));
            }
            keep();
            pos += std::max(len, 1u);
        }
        size_t differ = 0;
        if (!runs.empty())
            for (size_t i = 0; i < all.size(); ++i) differ += std::memcmp(&all[i], &runs[0][i], 4) != 0;
        const std::string name = mode;
        INFO("GPTOSS_MULTI_AR=" << name);
        // sym: NCCL 2.28.3's in-place symmetric all-reduce gave other sums (cuda/rank_comm.h), so
        // it is reported, not required, until a newer NCCL is on the GPU machine.
        if (name != "sym") CHECK(differ == 0);
        MESSAGE("GPTOSS_MULTI_AR=" << name << ": " << differ << " of " << all.size() << " logits differ from nccl's");
        runs.push_back(std::move(all));
    }
    setenv("GPTOSS_MULTI_AR", "bogus", 1);
    std::unique_ptr<BackendSession> s;
    CHECK(p.two->create_session(256, 16, &s) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("GPTOSS_MULTI_AR is 'bogus'") != std::string::npos);
    if (old) setenv("GPTOSS_MULTI_AR", saved.c_str(), 1);
    else unsetenv("GPTOSS_MULTI_AR");
}

TEST_CASE("public API: params.devices {0, 1} answers like one GPU; bad device lists are refused") {
    gptoss_model_params mp = gptoss_model_default_params();
    const int32_t both[] = {0, 1};
    mp.devices = both;
    mp.n_devices = 2;
    gptoss_model* split = nullptr;
    REQUIRE_MESSAGE(gptoss_load(g_model.c_str(), &mp, &split) == GPTOSS_OK, std::string(gptoss_last_error()));
    gptoss_model_info info{};
    info.struct_size = sizeof info;
    REQUIRE(gptoss_model_get_info(split, &info) == GPTOSS_OK);
    CHECK(info.device == 0);

    gptoss_model_params mp1 = gptoss_model_default_params();
    const int32_t zero[] = {0};
    mp1.devices = zero;
    mp1.n_devices = 1;  // the single-GPU path
    gptoss_model* single = nullptr;
    REQUIRE(gptoss_load(g_model.c_str(), &mp1, &single) == GPTOSS_OK);

    std::vector<int32_t> prompt;
    Rng rng(9);
    for (int i = 0; i < 40; ++i) prompt.push_back(int32_t(rng.next_u64() % 199998));
    gptoss_sampling_params sp = gptoss_sampling_default_params();
    sp.temperature = 0;
    sp.max_tokens = 6;
    std::vector<std::vector<int32_t>> out;
    for (gptoss_model* m : {single, split}) {
        gptoss_session* s = nullptr;
        gptoss_session_params spp = gptoss_session_default_params();
        spp.max_context = 512;
        REQUIRE_MESSAGE(gptoss_session_create(m, &spp, &s) == GPTOSS_OK, std::string(gptoss_last_error()));
        const gptoss_generate_result* r = nullptr;
        REQUIRE_MESSAGE(gptoss_generate(s, prompt.data(), prompt.size(), &sp, nullptr, nullptr, &r) == GPTOSS_OK,
                        std::string(gptoss_last_error()));
        out.emplace_back(r->tokens, r->tokens + r->n_tokens);
        gptoss_session_free(s);
    }
    REQUIRE(!out[0].empty());
    REQUIRE(!out[1].empty());
    CHECK(out[0][0] == out[1][0]);
    size_t same = 0;
    while (same < std::min(out[0].size(), out[1].size()) && out[0][same] == out[1][same]) ++same;
    MESSAGE("gptoss_generate greedy: " << same << "/6 leading tokens identical on 2 GPUs and 1");
    gptoss_model_free(single);
    gptoss_model_free(split);

    const int32_t dup[] = {1, 1};
    mp.devices = dup;
    gptoss_model* bad = nullptr;
    CHECK(gptoss_load(g_model.c_str(), &mp, &bad) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("the same GPU as params.devices[0]") != std::string::npos);
    CHECK(bad == nullptr);
    const int32_t missing[] = {0, 64};
    mp.devices = missing;
    CHECK(gptoss_load(g_model.c_str(), &mp, &bad) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("params.devices[1] is 64") != std::string::npos);
}

int main(int argc, char** argv) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        std::printf("test-kernels-multi: SKIPPED: needs 2 CUDA devices, found %d\n", n);
        return 77;
    }
    const char* dir = std::getenv("GPTOSS_MULTI_MODEL");
    if (!dir || !*dir) {
        std::printf("test-kernels-multi: SKIPPED: set GPTOSS_MULTI_MODEL to a checkpoint that splits over 2 GPUs "
                    "(gptoss-synth --preset tiny --hidden 128 --intermediate 256 --layers 3 --out DIR)\n");
        return 77;
    }
    g_model = dir;
    doctest::Context ctx;
    ctx.applyCommandLine(argc, argv);
    return ctx.run();
}
