// tests/test-api.cpp - one TEST_CASE per promise of gptoss.h for everything but chat and the
// tokenizer (their own tests): errors, extensible structs, model and session lifetime,
// generation, streaming, prefix reuse, cancellation, sampling. Runs on the tiny synthetic
// checkpoint ($GPTOSS_TINY_MODEL, written by the synth-tiny ctest fixture) with the CPU backend.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "tests/test-util.h"

#include "gptoss-internal.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using gptoss::test::prompt_of;

std::string tiny_model_dir() {
    const char* dir = std::getenv("GPTOSS_TINY_MODEL");
    REQUIRE_MESSAGE(dir != nullptr, "GPTOSS_TINY_MODEL is not set (run through ctest)");
    return dir;
}

// One CPU model shared by the tests (loading maps ~50 MB; a model is immutable and shareable).
gptoss_model* tiny_model() {
    static gptoss_model* model = [] {
        gptoss_model_params params = gptoss_model_default_params();
        params.device = GPTOSS_DEVICE_CPU;
        gptoss_model* m = nullptr;
        const gptoss_status status = gptoss_load(tiny_model_dir().c_str(), &params, &m);
        INFO(std::string(gptoss_last_error()));
        REQUIRE(status == GPTOSS_OK);
        return m;
    }();
    return model;
}

gptoss_session* new_session(uint32_t max_context = 1024, uint32_t max_batch = 0) {
    gptoss_session_params params = gptoss_session_default_params();
    params.max_context = max_context;
    params.max_batch = max_batch;
    gptoss_session* session = nullptr;
    const gptoss_status status = gptoss_session_create(tiny_model(), &params, &session);
    INFO(std::string(gptoss_last_error()));
    REQUIRE(status == GPTOSS_OK);
    return session;
}

gptoss_sampling_params sampling(uint64_t seed, uint32_t max_tokens, float temperature = 1.0f) {
    gptoss_sampling_params s = gptoss_sampling_default_params();
    s.seed = seed;
    s.max_tokens = max_tokens;
    s.temperature = temperature;
    return s;
}

std::vector<int32_t> generate(gptoss_session* session, const std::vector<int32_t>& prompt,
                              const gptoss_sampling_params& s, const gptoss_generate_result** out = nullptr) {
    const gptoss_generate_result* result = nullptr;
    const gptoss_status status = gptoss_generate(session, prompt.data(), prompt.size(), &s, nullptr, nullptr, &result);
    INFO(std::string(gptoss_last_error()));
    REQUIRE(status == GPTOSS_OK);
    if (out) *out = result;
    return std::vector<int32_t>(result->tokens, result->tokens + result->n_tokens);
}

}  // namespace

// ---------------------------------------------------------------------------
// Errors, versions, structs

TEST_CASE("free(NULL) and cancel(NULL) are no-ops") {
    gptoss_model_free(nullptr);
    gptoss_session_free(nullptr);
    gptoss_session_cancel(nullptr);
}

TEST_CASE("outputs are NULL after a failed load, and last_error names the directory") {
    gptoss_model* model = reinterpret_cast<gptoss_model*>(uintptr_t(1));
    CHECK(gptoss_load("/nonexistent/dir", nullptr, &model) == GPTOSS_ERR_IO);
    CHECK(model == nullptr);
    CHECK(std::string(gptoss_last_error()).find("/nonexistent/dir") != std::string::npos);
    CHECK(gptoss_load("/nonexistent/dir", nullptr, nullptr) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("model_out") != std::string::npos);
}

TEST_CASE("last_error is per thread and cleared by the next call") {
    gptoss_model* model = nullptr;
    REQUIRE(gptoss_load(nullptr, nullptr, &model) == GPTOSS_ERR_INVALID_ARGUMENT);
    std::string other;
    std::thread([&] { other = gptoss_last_error(); }).join();
    CHECK(other.empty());
    CHECK(std::string(gptoss_last_error()).find("model_dir") != std::string::npos);
    gptoss_model_info info{};
    info.struct_size = sizeof info;
    REQUIRE(gptoss_model_get_info(tiny_model(), &info) == GPTOSS_OK);
    CHECK(std::string(gptoss_last_error()).empty());
}

TEST_CASE("a smaller struct_size gets defaults; a larger one with non-zero tail is UNSUPPORTED") {
    // Older caller: only the first two fields of gptoss_sampling_params exist on its side.
    gptoss_sampling_params small;
    std::memset(&small, 0xAB, sizeof small);
    gptoss_sampling_params_init(&small, offsetof(gptoss_sampling_params, top_p));
    CHECK(small.struct_size == offsetof(gptoss_sampling_params, top_p));
    CHECK(small.temperature == 1.0f);
    small.temperature = 0.0f;
    gptoss_session* session = new_session();
    const std::vector<int32_t> prompt = prompt_of(8, 1);
    // The library defaults what the old struct lacks (max_tokens 0 → until a stop, so cap it
    // through a callback instead).
    int events = 0;
    auto stop_after_3 = [](void* ud, const gptoss_event*) { return ++*static_cast<int*>(ud) < 3; };
    const gptoss_generate_result* result = nullptr;
    REQUIRE(gptoss_generate(session, prompt.data(), prompt.size(), &small, stop_after_3, &events, &result) == GPTOSS_OK);
    CHECK(result->n_tokens == 3);
    CHECK(result->stop_reason == GPTOSS_STOP_CANCELLED);

    // Newer caller: a struct with an extra non-zero field the library does not know.
    struct Newer {
        gptoss_sampling_params base;
        uint64_t future_field;
    } newer;
    gptoss_sampling_params_init(&newer.base, sizeof newer);
    CHECK(newer.future_field == 0);  // init zeroes the caller's whole struct
    CHECK(newer.base.struct_size == sizeof newer);
    newer.base.max_tokens = 2;
    newer.base.seed = 5;
    REQUIRE(gptoss_generate(session, prompt.data(), prompt.size(), &newer.base, nullptr, nullptr, &result) == GPTOSS_OK);
    CHECK(result->n_tokens == 2);  // zero tail: accepted
    newer.future_field = 7;
    CHECK(gptoss_generate(session, prompt.data(), prompt.size(), &newer.base, nullptr, nullptr, &result) ==
          GPTOSS_ERR_UNSUPPORTED);
    CHECK(result == nullptr);
    CHECK(std::string(gptoss_last_error()).find("gptoss_sampling_params") != std::string::npos);

    gptoss_model_params mp;
    std::memset(&mp, 0, sizeof mp);  // struct_size 0: never initialised
    gptoss_model* model = nullptr;
    CHECK(gptoss_load(tiny_model_dir().c_str(), &mp, &model) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("struct_size") != std::string::npos);
    gptoss_session_free(session);
}

TEST_CASE("model_get_info fills only struct_size bytes and describes the checkpoint") {
    gptoss_model_info info;
    std::memset(&info, 0xCD, sizeof info);
    info.struct_size = offsetof(gptoss_model_info, n_experts);
    REQUIRE(gptoss_model_get_info(tiny_model(), &info) == GPTOSS_OK);
    CHECK(info.n_layers == 4);
    unsigned char tail;
    std::memcpy(&tail, reinterpret_cast<unsigned char*>(&info) + offsetof(gptoss_model_info, n_experts), 1);
    CHECK(tail == 0xCD);
    info.struct_size = sizeof info;
    REQUIRE(gptoss_model_get_info(tiny_model(), &info) == GPTOSS_OK);
    CHECK(std::string(info.name) == "gpt-oss");
    CHECK(info.n_vocab == 201088);
    CHECK(info.n_experts_per_token == 4);
    CHECK(info.device == GPTOSS_DEVICE_CPU);
    CHECK(info.weight_bytes > 0);
    CHECK(gptoss_model_get_info(tiny_model(), nullptr) == GPTOSS_ERR_INVALID_ARGUMENT);
}

TEST_CASE("session_create checks its arguments") {
    gptoss_session* session = reinterpret_cast<gptoss_session*>(uintptr_t(1));
    CHECK(gptoss_session_create(nullptr, nullptr, &session) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(session == nullptr);
    gptoss_session_params params = gptoss_session_default_params();
    params.max_context = 10u * 1000 * 1000;
    CHECK(gptoss_session_create(tiny_model(), &params, &session) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("max_context") != std::string::npos);
}

TEST_CASE("model freed before session: the session keeps working") {
    gptoss_model_params params = gptoss_model_default_params();
    params.device = GPTOSS_DEVICE_CPU;
    gptoss_model* model = nullptr;
    REQUIRE(gptoss_load(tiny_model_dir().c_str(), &params, &model) == GPTOSS_OK);
    gptoss_session_params sp = gptoss_session_default_params();
    sp.max_context = 256;
    gptoss_session* session = nullptr;
    REQUIRE(gptoss_session_create(model, &sp, &session) == GPTOSS_OK);
    gptoss_model_free(model);
    const std::vector<int32_t> prompt = prompt_of(5, 2);
    const gptoss_sampling_params s = sampling(3, 4);
    CHECK(generate(session, prompt, s).size() == 4);
    gptoss_session_free(session);  // frees the model too (ASan checks the leak)
}

TEST_CASE("progress callback is called with increasing fractions ending at 1.0 once, and can cancel a load") {
    struct Progress {
        int calls = 0;
        float last = -1;
        bool monotonic = true;
        bool cancel = false;
    };
    auto fn = [](void* ud, float f) {
        Progress* p = static_cast<Progress*>(ud);
        if (f <= p->last) p->monotonic = false;  // strictly increasing: 1.0 exactly once
        p->last = f;
        p->calls++;
        return !p->cancel;
    };
    Progress progress;
    gptoss_model_params params = gptoss_model_default_params();
    params.device = GPTOSS_DEVICE_CPU;
    params.progress = fn;
    params.progress_user_data = &progress;
    gptoss_model* model = nullptr;
    REQUIRE(gptoss_load(tiny_model_dir().c_str(), &params, &model) == GPTOSS_OK);
    CHECK(progress.calls >= 2);
    CHECK(progress.monotonic);
    CHECK(progress.last == 1.0f);
    gptoss_model_free(model);
    Progress cancelling;
    cancelling.cancel = true;
    params.progress_user_data = &cancelling;
    model = reinterpret_cast<gptoss_model*>(uintptr_t(1));
    CHECK(gptoss_load(tiny_model_dir().c_str(), &params, &model) == GPTOSS_ERR_CANCELLED);
    CHECK(model == nullptr);
}

// ---------------------------------------------------------------------------
// Generation

TEST_CASE("generate streams one event per sampled token, including the stop token") {
    gptoss_session* session = new_session();
    const std::vector<int32_t> prompt = prompt_of(12, 4);
    struct Seen {
        std::vector<int32_t> tokens;
        std::string text;
        bool sized = true;
    } seen;
    auto on_event = [](void* ud, const gptoss_event* e) {
        Seen* s = static_cast<Seen*>(ud);
        s->tokens.push_back(e->token);
        s->text.append(e->text, e->text_len);
        if (e->struct_size < sizeof(gptoss_event) || e->text == nullptr || std::strlen(e->text) != e->text_len)
            s->sized = false;
        return true;
    };
    // A stop set holding every id that greedy decoding produces makes the 6th token a stop.
    gptoss_sampling_params s = sampling(1, 5, 0.0f);
    const std::vector<int32_t> greedy = generate(session, prompt, s);
    REQUIRE(greedy.size() == 5);
    const gptoss_generate_result* result = nullptr;
    s.max_tokens = 0;
    s.stop_tokens = &greedy[2];
    s.n_stop_tokens = 1;
    REQUIRE(gptoss_generate(session, prompt.data(), prompt.size(), &s, on_event, &seen, &result) == GPTOSS_OK);
    const size_t first_stop = size_t(std::find(greedy.begin(), greedy.end(), greedy[2]) - greedy.begin());
    CHECK(result->n_tokens == first_stop + 1);
    CHECK(result->stop_reason == GPTOSS_STOP_TOKEN);
    CHECK(result->tokens[result->n_tokens - 1] == greedy[2]);
    CHECK(seen.tokens == std::vector<int32_t>(result->tokens, result->tokens + result->n_tokens));
    CHECK(seen.sized);
    CHECK(result->n_prompt_tokens == prompt.size());
    gptoss_session_free(session);
}

TEST_CASE("same seed + same input = same tokens; another seed differs") {
    gptoss_session* a = new_session();
    gptoss_session* b = new_session();
    const std::vector<int32_t> prompt = prompt_of(20, 5);
    const std::vector<int32_t> ta = generate(a, prompt, sampling(42, 10));
    const std::vector<int32_t> tb = generate(b, prompt, sampling(42, 10));
    const std::vector<int32_t> tc = generate(b, prompt, sampling(43, 10));
    CHECK(ta == tb);
    CHECK(ta != tc);
    gptoss_session_free(a);
    gptoss_session_free(b);
}

TEST_CASE("reused session == fresh session for the same seed, across the sliding window") {
    // Chunking must not matter either: the fresh sessions prefill in other chunk sizes.
    const std::vector<int32_t> base = prompt_of(300, 6);  // > 128: the sliding rings wrap
    gptoss_session* reused = new_session(2048, 64);
    const gptoss_generate_result* r = nullptr;
    const std::vector<int32_t> first = generate(reused, base, sampling(7, 16), &r);
    CHECK(r->n_cached_tokens == 0);

    // 1. The prompt plus part of what was generated plus new text: diverges after the
    //    snapshot, inside the generated turn (the Harmony case of API.md §6).
    std::vector<int32_t> next = base;
    next.insert(next.end(), first.begin(), first.begin() + 5);
    const std::vector<int32_t> extra = prompt_of(9, 8);
    next.insert(next.end(), extra.begin(), extra.end());
    const std::vector<int32_t> got = generate(reused, next, sampling(9, 12), &r);
    CHECK(r->n_cached_tokens == base.size());  // restored from the snapshot at the end of the prefill
    gptoss_session* fresh = new_session(2048, 37);
    const std::vector<int32_t> want = generate(fresh, next, sampling(9, 12), &r);
    CHECK(r->n_cached_tokens == 0);
    CHECK(got == want);

    // 2. Extending the whole cache: the prefilled prompt is reused; the positions the decode
    //    steps wrote are prefilled again (decode K/V is never reused, gptoss.cpp's invariant).
    std::vector<int32_t> longer = next;
    longer.insert(longer.end(), got.begin(), got.end() - 1);  // the last sampled token was never fed
    const std::vector<int32_t> got2 = generate(reused, longer, sampling(10, 8), &r);
    CHECK(r->n_cached_tokens == next.size());
    gptoss_session* fresh2 = new_session(2048, 128);
    CHECK(got2 == generate(fresh2, longer, sampling(10, 8)));

    // 3. Diverging far before the end: the rings cannot rewind, so it recomputes from 0 and
    //    still gives the fresh session's tokens.
    std::vector<int32_t> early(base.begin(), base.begin() + 200);
    const std::vector<int32_t> tail = prompt_of(30, 11);
    early.insert(early.end(), tail.begin(), tail.end());
    const std::vector<int32_t> got3 = generate(reused, early, sampling(12, 8), &r);
    CHECK(r->n_cached_tokens == 0);
    gptoss_session* fresh3 = new_session(2048, 200);
    CHECK(got3 == generate(fresh3, early, sampling(12, 8)));

    // 4. The same prompt again: all but the last position is reused.
    generate(reused, early, sampling(12, 8), &r);
    CHECK(r->n_cached_tokens == early.size() - 1);
    gptoss_session_free(reused);
    gptoss_session_free(fresh);
    gptoss_session_free(fresh2);
    gptoss_session_free(fresh3);
}

TEST_CASE("a prompt that does not fit is CONTEXT_FULL and leaves the session unchanged") {
    gptoss_session* session = new_session(64);
    const std::vector<int32_t> prompt = prompt_of(40, 13);
    const std::vector<int32_t> before = generate(session, prompt, sampling(1, 4));
    const std::vector<int32_t> too_long = prompt_of(65, 14);
    const gptoss_generate_result* r = reinterpret_cast<const gptoss_generate_result*>(uintptr_t(1));
    const gptoss_sampling_params s = sampling(1, 4);
    CHECK(gptoss_generate(session, too_long.data(), too_long.size(), &s, nullptr, nullptr, &r) == GPTOSS_ERR_CONTEXT_FULL);
    CHECK(r == nullptr);
    CHECK(std::string(gptoss_last_error()).find("65") != std::string::npos);
    const std::vector<int32_t> after = generate(session, prompt, sampling(1, 4), &r);
    CHECK(after == before);
    CHECK(r->n_cached_tokens == prompt.size() - 1);
    gptoss_session_free(session);
}

TEST_CASE("generation stops with CONTEXT_FULL when the context fills") {
    gptoss_session* session = new_session(48);
    const std::vector<int32_t> prompt = prompt_of(40, 15);
    const gptoss_generate_result* r = nullptr;
    gptoss_sampling_params s = sampling(2, 0);
    s.n_stop_tokens = 0;
    generate(session, prompt, s, &r);
    CHECK(r->stop_reason == GPTOSS_STOP_CONTEXT_FULL);
    CHECK(r->n_tokens == 48 - 40 + 1);  // the last sampled token has no room to be fed back
    gptoss_session_free(session);
}

TEST_CASE("max_tokens stops with MAX_TOKENS") {
    gptoss_session* session = new_session();
    const gptoss_generate_result* r = nullptr;
    gptoss_sampling_params s = sampling(3, 7);
    s.n_stop_tokens = 0;
    CHECK(generate(session, prompt_of(10, 16), s, &r).size() == 7);
    CHECK(r->stop_reason == GPTOSS_STOP_MAX_TOKENS);
    gptoss_session_free(session);
}

TEST_CASE("bad prompts and sampling params are INVALID_ARGUMENT naming the argument") {
    gptoss_session* session = new_session();
    const gptoss_generate_result* r = nullptr;
    std::vector<int32_t> prompt = prompt_of(6, 17);
    prompt[4] = 201088;
    gptoss_sampling_params s = sampling(1, 2);
    CHECK(gptoss_generate(session, prompt.data(), prompt.size(), &s, nullptr, nullptr, &r) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("prompt[4]") != std::string::npos);
    prompt[4] = 1;
    CHECK(gptoss_generate(session, prompt.data(), 0, &s, nullptr, nullptr, &r) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(gptoss_generate(session, nullptr, 3, &s, nullptr, nullptr, &r) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(gptoss_generate(nullptr, prompt.data(), prompt.size(), &s, nullptr, nullptr, &r) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(gptoss_generate(session, prompt.data(), prompt.size(), &s, nullptr, nullptr, nullptr) == GPTOSS_ERR_INVALID_ARGUMENT);
    s.temperature = -1.0f;
    CHECK(gptoss_generate(session, prompt.data(), prompt.size(), &s, nullptr, nullptr, &r) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("temperature") != std::string::npos);
    s.temperature = 1.0f;
    s.top_p = 0.0f;
    CHECK(gptoss_generate(session, prompt.data(), prompt.size(), &s, nullptr, nullptr, &r) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("top_p") != std::string::npos);
    gptoss_session_free(session);
}

// ---------------------------------------------------------------------------
// Cancellation

TEST_CASE("an event callback returning false cancels with the output so far") {
    gptoss_session* session = new_session();
    int n = 0;
    auto stop_at_4 = [](void* ud, const gptoss_event*) { return ++*static_cast<int*>(ud) < 4; };
    const gptoss_generate_result* r = nullptr;
    const std::vector<int32_t> prompt = prompt_of(5, 18);
    gptoss_sampling_params s = sampling(4, 50);
    s.n_stop_tokens = 0;
    REQUIRE(gptoss_generate(session, prompt.data(), prompt.size(), &s, stop_at_4, &n, &r) == GPTOSS_OK);
    CHECK(r->stop_reason == GPTOSS_STOP_CANCELLED);
    CHECK(r->n_tokens == 4);
    gptoss_session_free(session);
}

TEST_CASE("cancel from another thread stops the generation, and is not sticky") {
    gptoss_session* session = new_session(4096);
    const std::vector<int32_t> prompt = prompt_of(5, 19);
    gptoss_sampling_params s = sampling(5, 0);
    s.n_stop_tokens = 0;
    struct Shared {
        gptoss_session* session;
        std::atomic<int> tokens{0};
    } shared{session};
    auto count = [](void* ud, const gptoss_event*) {
        static_cast<Shared*>(ud)->tokens++;
        return true;
    };
    std::thread canceller([&] {
        while (shared.tokens.load() < 3) std::this_thread::yield();
        gptoss_session_cancel(session);
    });
    const gptoss_generate_result* r = nullptr;
    REQUIRE(gptoss_generate(session, prompt.data(), prompt.size(), &s, count, &shared, &r) == GPTOSS_OK);
    canceller.join();
    CHECK(r->stop_reason == GPTOSS_STOP_CANCELLED);
    CHECK(r->n_tokens >= 3);
    CHECK(r->n_tokens < 4096);
    // A cancel while nothing runs does nothing: the next call runs normally.
    gptoss_session_cancel(session);
    s.max_tokens = 3;
    generate(session, prompt, s, &r);
    CHECK(r->stop_reason == GPTOSS_STOP_MAX_TOKENS);
    gptoss_session_free(session);
}

TEST_CASE("the previous result stays valid until the next call returns") {
    gptoss_session* session = new_session();
    const gptoss_generate_result* first = nullptr;
    generate(session, prompt_of(6, 20), sampling(8, 5), &first);
    // Feed the previous result's own token array back as the prompt.
    const gptoss_generate_result* second = nullptr;
    const gptoss_sampling_params s = sampling(8, 3);
    REQUIRE(gptoss_generate(session, first->tokens, first->n_tokens, &s, nullptr, nullptr, &second) == GPTOSS_OK);
    CHECK(second != first);
    CHECK(second->n_tokens == 3);
    gptoss_session_free(session);
}

// ---------------------------------------------------------------------------
// Sampling definition (gptoss-internal.h)

TEST_CASE("sampling: temperature 0 is argmax with ties to the lower id; top_k 1 and tiny top_p agree") {
    std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f};
    gptoss::SamplingConfig greedy;
    greedy.temperature = 0.0f;
    CHECK(gptoss::sample_logits(logits.data(), 5, greedy, 0.99) == 1);
    gptoss::SamplingConfig top1;
    top1.top_k = 1;
    gptoss::SamplingConfig nucleus;
    nucleus.top_p = 0.01f;
    for (double u : {0.0, 0.5, 0.999}) {
        CHECK(gptoss::sample_logits(logits.data(), 5, top1, u) == 1);
        CHECK(gptoss::sample_logits(logits.data(), 5, nucleus, u) == 1);
    }
}

TEST_CASE("sampling: frequencies follow softmax(logits / temperature), restricted by top_k") {
    const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f};
    gptoss::SamplingConfig config;
    config.temperature = 0.7f;
    gptoss::Rng rng(123);
    std::vector<int> counts(4, 0);
    const int n = 200000;
    for (int i = 0; i < n; i++) counts[size_t(gptoss::sample_logits(logits.data(), 4, config, rng.next_double()))]++;
    double z = 0;
    for (float l : logits) z += std::exp(l / 0.7);
    for (size_t i = 0; i < 4; i++) {
        const double expected = std::exp(logits[i] / 0.7) / z;
        CHECK(std::fabs(counts[i] / double(n) - expected) < 0.005);
    }
    config.top_k = 2;  // keeps ids 2 and 0
    std::vector<int> k_counts(4, 0);
    for (int i = 0; i < n; i++) k_counts[size_t(gptoss::sample_logits(logits.data(), 4, config, rng.next_double()))]++;
    CHECK(k_counts[1] == 0);
    CHECK(k_counts[3] == 0);
    const double p2 = std::exp(2.0 / 0.7) / (std::exp(2.0 / 0.7) + std::exp(1.0 / 0.7));
    CHECK(std::fabs(k_counts[2] / double(n) - p2) < 0.005);
}

TEST_CASE("sampling: top_p keeps the smallest set reaching the mass") {
    // p ≈ [0.6439, 0.2369, 0.0871, 0.0321] for logits [3, 2, 1, 0]
    const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 2.0f};
    gptoss::SamplingConfig config;
    config.top_p = 0.8f;  // {1, 3} has 0.88 >= 0.8; {1} alone has 0.64
    gptoss::Rng rng(5);
    std::vector<int> counts(4, 0);
    for (int i = 0; i < 20000; i++) counts[size_t(gptoss::sample_logits(logits.data(), 4, config, rng.next_double()))]++;
    CHECK(counts[0] == 0);
    CHECK(counts[2] == 0);
    CHECK(counts[1] > 0);
    CHECK(counts[3] > 0);
}

TEST_CASE("Rng is deterministic for a seed and uniform on [0, 1)") {
    gptoss::Rng a(99), b(99), c(100);
    bool all_equal = true, any_differs = false;
    double sum = 0;
    for (int i = 0; i < 10000; i++) {
        const double x = a.next_double();
        all_equal &= x == b.next_double();
        any_differs |= x != c.next_double();
        CHECK((x >= 0.0 && x < 1.0));
        sum += x;
    }
    CHECK(all_equal);
    CHECK(any_differs);
    CHECK(std::fabs(sum / 10000 - 0.5) < 0.01);
}

// ---------------------------------------------------------------------------
// Faults (only in the sanitizer build, which defines GPTOSS_FAULT_INJECTION)

#ifdef GPTOSS_FAULT_INJECTION
TEST_CASE("an allocation failure anywhere is OUT_OF_MEMORY, leaks nothing, and leaves the session usable") {
    const std::vector<int32_t> prompt = prompt_of(140, 21);  // > 128: the sliding rings wrap
    gptoss_session* reference = new_session(512, 32);
    const std::vector<int32_t> want = generate(reference, prompt, sampling(6, 3));
    gptoss_session_free(reference);

    gptoss_model_params params = gptoss_model_default_params();
    params.device = GPTOSS_DEVICE_CPU;
    int failures = 0;
    for (uint64_t n = 1; n <= 12; n++) {
        CAPTURE(n);
        gptoss::fault_inject_after(n);
        gptoss_model* model = nullptr;
        gptoss_session* session = nullptr;
        gptoss_status status = gptoss_load(tiny_model_dir().c_str(), &params, &model);
        if (status == GPTOSS_OK) {
            gptoss_session_params sp = gptoss_session_default_params();
            sp.max_context = 512;
            sp.max_batch = 32;
            status = gptoss_session_create(model, &sp, &session);
        }
        const gptoss_generate_result* r = nullptr;
        const gptoss_sampling_params s = sampling(6, 3);
        if (status == GPTOSS_OK) status = gptoss_generate(session, prompt.data(), prompt.size(), &s, nullptr, nullptr, &r);
        if (status != GPTOSS_OK) {
            failures++;
            CHECK(status == GPTOSS_ERR_OUT_OF_MEMORY);
            CHECK(std::string(gptoss_last_error()).find("out of host memory") != std::string::npos);
            CHECK(r == nullptr);
        }
        gptoss::fault_inject_after(0);
        if (session != nullptr) {
            // Whatever failed, the session still gives the fresh session's tokens.
            CHECK(generate(session, prompt, sampling(6, 3)) == want);
        } else {
            CHECK(session == nullptr);
        }
        gptoss_session_free(session);
        gptoss_model_free(model);
    }
    CHECK(failures >= 8);
}
#endif
