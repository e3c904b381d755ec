// tests/test-decode-pipeline.cpp - the pipelined decode loop (gptoss-decode-pipeline.cpp) on the
// CPU backend: GPTOSS_DECODE_PIPELINE's resolution and errors; the same tokens, stop reasons and
// prefix reuse as the plain loop (a model loaded with the variable at 0 against one at 1, over
// calls that stop every way, on reused sessions); and, through a recording wrapper around the
// CPU session that says it pipelines, the order of the backend calls (the forward of token k is
// enqueued before the host reads token k; nothing is enqueued after the last token of
// max_tokens or a full context) and the K/V written past the end after a stop.
// The CUDA side (the token fed on the device) runs in tests/test-kernels.cu on the GPU machine.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "tests/test-util.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

using gptoss::test::prompt_of;

namespace {

std::string tiny_dir() {
    const char* dir = std::getenv("GPTOSS_TINY_MODEL");
    REQUIRE_MESSAGE(dir != nullptr, "GPTOSS_TINY_MODEL is not set (run through ctest)");
    return dir;
}

// Loads the tiny model on the CPU with GPTOSS_DECODE_PIPELINE set to `value` (nullptr: unset).
gptoss_status load_with(const char* value, gptoss_model** out) {
    if (value) setenv("GPTOSS_DECODE_PIPELINE", value, 1);
    else unsetenv("GPTOSS_DECODE_PIPELINE");
    gptoss_model_params params = gptoss_model_default_params();
    params.device = GPTOSS_DEVICE_CPU;
    const gptoss_status status = gptoss_load(tiny_dir().c_str(), &params, out);
    unsetenv("GPTOSS_DECODE_PIPELINE");
    return status;
}

gptoss_model* model_with(const char* value) {
    gptoss_model* model = nullptr;
    const gptoss_status status = load_with(value, &model);
    INFO(gptoss_last_error());
    REQUIRE(status == GPTOSS_OK);
    return model;
}

gptoss_session* session_of(gptoss_model* model, uint32_t max_context = 2048) {
    gptoss_session_params sp = gptoss_session_default_params();
    sp.max_context = max_context;
    gptoss_session* s = nullptr;
    REQUIRE(gptoss_session_create(model, &sp, &s) == GPTOSS_OK);
    return s;
}

gptoss_sampling_params sampling(uint64_t seed, uint32_t max_tokens, float temperature = 0.8f) {
    gptoss_sampling_params s;
    gptoss_sampling_params_init(&s, sizeof s);
    s.seed = seed;
    s.max_tokens = max_tokens;
    s.temperature = temperature;
    s.n_stop_tokens = 0;
    return s;
}

struct Run {
    std::vector<int32_t> tokens;
    gptoss_stop_reason stop = GPTOSS_STOP_MAX_TOKENS;
    uint32_t n_cached = 0;
};

// An event callback that stops (returns false) at the n-th token; n = 0: never.
struct StopAt {
    int n = 0, seen = 0;
    static bool call(void* ud, const gptoss_event*) {
        StopAt* s = static_cast<StopAt*>(ud);
        return s->n == 0 || ++s->seen < s->n;
    }
};

Run generate(gptoss_session* session, const std::vector<int32_t>& prompt, const gptoss_sampling_params& s,
             int stop_at = 0) {
    StopAt cb{stop_at, 0};
    const gptoss_generate_result* r = nullptr;
    const gptoss_status status = gptoss_generate(session, prompt.data(), prompt.size(), &s, StopAt::call, &cb, &r);
    INFO(gptoss_last_error());
    REQUIRE(status == GPTOSS_OK);
    return Run{std::vector<int32_t>(r->tokens, r->tokens + r->n_tokens), r->stop_reason, r->n_cached_tokens};
}

// Wraps a session's backend: forwards everything, says it pipelines (so the engine takes the
// pipelined loop on the CPU), and records the pipelined calls: 'S' sample_ahead ('M' with a
// mask), 'D' decode_sampled, 'F' fetch_sampled; and counts restore_sliding_snapshot() calls.
class Recorder final : public gptoss::BackendSession {
public:
    Recorder(std::unique_ptr<gptoss::BackendSession> inner, uint32_t n_vocab)
        : BackendSession(n_vocab), inner_(std::move(inner)) {}
    std::string calls;
    std::vector<uint32_t> decoded_at;
    bool pipelines_decode() const override { return true; }
    gptoss_status forward(const int32_t* tokens, uint32_t n, uint32_t pos) override {
        return inner_->forward(tokens, n, pos);
    }
    gptoss_status decode(int32_t token, uint32_t pos) override { return inner_->decode(token, pos); }
    gptoss_status get_logits(const float** logits) override { return inner_->get_logits(logits); }
    gptoss_status sample(const gptoss::SamplingConfig& c, double u, int32_t* t) override {
        return inner_->sample(c, u, t);
    }
    gptoss_status sample_ahead(const gptoss::SamplingConfig& c, double u, const uint32_t* allowed) override {
        calls += allowed ? 'M' : 'S';
        return inner_->sample_ahead(c, u, allowed);
    }
    gptoss_status sample_masked(const gptoss::SamplingConfig& c, double u, const uint32_t* allowed,
                                int32_t* t) override {
        return inner_->sample_masked(c, u, allowed, t);
    }
    gptoss_status decode_sampled(uint32_t pos) override {
        calls += 'D';
        decoded_at.push_back(pos);
        return inner_->decode_sampled(pos);
    }
    gptoss_status fetch_sampled(int32_t* t) override {
        calls += 'F';
        return inner_->fetch_sampled(t);
    }
    gptoss_status save_sliding_snapshot() override { return inner_->save_sliding_snapshot(); }
    gptoss_status restore_sliding_snapshot() override {
        ++restores;
        return inner_->restore_sliding_snapshot();
    }
    int restores = 0;

private:
    std::unique_ptr<gptoss::BackendSession> inner_;
};

Recorder* record(gptoss_session* session) {
    auto* r = new Recorder(std::move(session->backend), session->model->checkpoint->config.vocab);
    session->backend.reset(r);
    return r;
}

}  // namespace

TEST_CASE("GPTOSS_DECODE_PIPELINE: 0 or 1, unset or empty lets the backend decide; anything else fails the load") {
    for (const char* value : std::vector<const char*>{"0", "1", "", nullptr}) {
        gptoss_model* model = nullptr;
        CHECK(load_with(value, &model) == GPTOSS_OK);
        REQUIRE(model != nullptr);
        CHECK(model->decode_pipeline == (value == nullptr || *value == '\0' ? -1 : value[0] - '0'));
        gptoss_model_free(model);
    }
    for (const char* value : {"2", "on", "01", " 1"}) {
        INFO(value);
        gptoss_model* model = nullptr;
        CHECK(load_with(value, &model) == GPTOSS_ERR_INVALID_ARGUMENT);
        CHECK(model == nullptr);
        CHECK(std::string(gptoss_last_error()).find("GPTOSS_DECODE_PIPELINE") != std::string::npos);
    }
}

TEST_CASE("the pipelined loop gives the plain loop's tokens, stop reasons and prefix reuse, call after call") {
    gptoss_model* plain = model_with("0");
    gptoss_model* piped = model_with("1");
    gptoss_session* a = session_of(plain);
    gptoss_session* b = session_of(piped);
    std::vector<int32_t> prompt = prompt_of(150, 31);  // > 128: the sliding rings wrap
    // A greedy run picks stop tokens that occur in it.
    gptoss_session* scout = session_of(plain);
    const Run greedy = generate(scout, prompt, sampling(1, 12, 0.0f));
    gptoss_session_free(scout);
    REQUIRE(greedy.tokens.size() == 12);
    struct Call {
        uint64_t seed;
        uint32_t max_tokens;
        float temperature, top_p;
        uint32_t top_k;
        int stop_token;  // index into greedy.tokens, -1: none
        int stop_at;     // the callback stops at this token, 0: never
    };
    const Call calls[] = {
        {2, 1, 0.8f, 1.0f, 0, -1, 0},   {3, 9, 0.0f, 1.0f, 0, 4, 0},   {4, 7, 1.0f, 0.9f, 0, -1, 0},
        {5, 20, 0.7f, 1.0f, 40, -1, 3}, {6, 0, 0.0f, 1.0f, 0, 7, 0},   {7, 2, 0.0f, 1.0f, 0, -1, 0},
        {8, 30, 1.0f, 1.0f, 0, -1, 1},  {9, 6, 0.9f, 0.5f, 5, -1, 0},
    };
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; ++i) {
        const Call& c = calls[i];
        INFO("call " << i);
        gptoss_sampling_params s = sampling(c.seed, c.max_tokens, c.temperature);
        s.top_p = c.top_p;
        s.top_k = c.top_k;
        if (c.stop_token >= 0) {
            s.stop_tokens = &greedy.tokens[size_t(c.stop_token)];
            s.n_stop_tokens = 1;
        }
        const Run want = generate(a, prompt, s, c.stop_at);
        const Run got = generate(b, prompt, s, c.stop_at);
        CHECK(got.tokens == want.tokens);
        CHECK(got.stop == want.stop);
        CHECK(got.n_cached == want.n_cached);
        // A fresh session of the pipelined model agrees too (reused == fresh).
        gptoss_session* fresh = session_of(piped);
        CHECK(generate(fresh, prompt, s, c.stop_at).tokens == want.tokens);
        gptoss_session_free(fresh);
        // The next turn: this one's tokens (all but the last, which was never fed) and new text.
        prompt.insert(prompt.end(), want.tokens.begin(), want.tokens.end() - (want.tokens.empty() ? 0 : 1));
        const std::vector<int32_t> extra = prompt_of(5, 40 + i);
        prompt.insert(prompt.end(), extra.begin(), extra.end());
    }
    gptoss_session_free(a);
    gptoss_session_free(b);
    gptoss_model_free(plain);
    gptoss_model_free(piped);
}

TEST_CASE("the pipelined loop stops with CONTEXT_FULL as the plain loop does") {
    gptoss_model* plain = model_with("0");
    gptoss_model* piped = model_with("1");
    gptoss_session* a = session_of(plain, 40);
    gptoss_session* b = session_of(piped, 40);
    const std::vector<int32_t> prompt = prompt_of(30, 32);
    const Run want = generate(a, prompt, sampling(3, 0));
    CHECK(want.stop == GPTOSS_STOP_CONTEXT_FULL);
    CHECK(want.tokens.size() == 11);  // positions 30..39 fed, the 11th token sampled from position 39
    const Run got = generate(b, prompt, sampling(3, 0));
    CHECK(got.tokens == want.tokens);
    CHECK(got.stop == want.stop);
    gptoss_session_free(a);
    gptoss_session_free(b);
    gptoss_model_free(plain);
    gptoss_model_free(piped);
}

TEST_CASE("pipelined: the forward of token k is enqueued before token k is read, and never past max_tokens") {
    gptoss_model* model = model_with(nullptr);  // unset: the backend (here the recorder) decides
    gptoss_session* session = session_of(model);
    Recorder* rec = record(session);
    const std::vector<int32_t> prompt = prompt_of(20, 33);
    const Run run = generate(session, prompt, sampling(4, 3));
    CHECK(run.tokens.size() == 3);
    CHECK(rec->calls == "SDFSDFSF");  // token 2 is the last: no step after it
    CHECK(rec->decoded_at == std::vector<uint32_t>{20, 21});
    CHECK_FALSE(session->kv_past_end);
    CHECK(session->cached.size() == 22);
    gptoss_session_free(session);
    gptoss_model_free(model);
}

TEST_CASE("pipelined: a stop token leaves its step's K/V past the end, and the next call still equals a fresh one") {
    gptoss_model* model = model_with(nullptr);
    gptoss_session* session = session_of(model);
    Recorder* rec = record(session);
    const std::vector<int32_t> prompt = prompt_of(140, 34);
    const Run greedy = generate(session, prompt, sampling(1, 6, 0.0f));
    REQUIRE(greedy.tokens.size() == 6);
    rec->calls.clear();
    // Stop at greedy token 1: k = 1 is where a missing past-end mark would matter (the rings
    // would be taken to hold position 13, which the stop token's step overwrote).
    REQUIRE(greedy.tokens[0] != greedy.tokens[1]);
    gptoss_sampling_params s = sampling(1, 0, 0.0f);
    s.stop_tokens = &greedy.tokens[1];
    s.n_stop_tokens = 1;
    const Run stopped = generate(session, prompt, s);
    const size_t k = 1;
    REQUIRE(stopped.tokens.size() == k + 1);
    CHECK(stopped.stop == GPTOSS_STOP_TOKEN);
    // One sample_ahead before the loop, then per token: its step, its fetch, the next sample;
    // none after the stop token.
    CHECK(rec->calls == "SDFSDF");
    CHECK(session->kv_past_end);                        // the stop token's step wrote position 140 + k
    CHECK(session->cached.size() == prompt.size() + k);  // but the stop token is not listed
    // The next turn reuses the prefix and equals a fresh session.
    std::vector<int32_t> next = prompt;
    next.insert(next.end(), stopped.tokens.begin(), stopped.tokens.end());
    const std::vector<int32_t> extra = prompt_of(4, 35);
    next.insert(next.end(), extra.begin(), extra.end());
    rec->restores = 0;
    const Run reused = generate(session, next, sampling(11, 8));
    CHECK(reused.n_cached == prompt.size());
    // Resuming at 140 needs the sliding K/V of 13..139, and position 13's slot now holds 141's:
    // the rings come back from the snapshot taken at the end of the prefill.
    CHECK(rec->restores == 1);
    gptoss_session* fresh = session_of(model);
    CHECK(generate(fresh, next, sampling(11, 8)).tokens == reused.tokens);
    gptoss_session_free(fresh);
    gptoss_session_free(session);
    gptoss_model_free(model);
}

TEST_CASE("pipelined: a cancel from the callback returns the tokens so far, as the plain loop") {
    gptoss_model* model = model_with(nullptr);
    gptoss_session* session = session_of(model);
    Recorder* rec = record(session);
    struct Ud {
        gptoss_session* session;
        int n = 0;
    } ud{session};
    auto cancel_at_2 = [](void* p, const gptoss_event*) {
        Ud* u = static_cast<Ud*>(p);
        if (++u->n == 2) gptoss_session_cancel(u->session);
        return true;
    };
    const std::vector<int32_t> prompt = prompt_of(10, 36);
    gptoss_sampling_params s = sampling(5, 50);
    const gptoss_generate_result* r = nullptr;
    REQUIRE(gptoss_generate(session, prompt.data(), prompt.size(), &s, cancel_at_2, &ud, &r) == GPTOSS_OK);
    CHECK(r->stop_reason == GPTOSS_STOP_CANCELLED);
    CHECK(r->n_tokens == 2);
    CHECK(rec->calls == "SDFSDFS");
    gptoss_session_free(session);
    gptoss_model_free(model);
}

TEST_CASE("pipelined constrained decoding (json_schema, tool calls) gives the plain loop's tokens, masks on the host") {
    gptoss_model* plain = model_with("0");
    gptoss_model* piped = model_with("1");
    const char* schema = R"({"type":"object","properties":{"a":{"type":"number"},"b":{"type":"string","maxLength":6}},)"
                         R"("required":["a","b"],"additionalProperties":false})";
    const std::vector<int32_t> prompt = prompt_of(40, 37);
    for (uint64_t seed = 0; seed < 3; ++seed) {
        INFO("json_schema, seed " << seed);
        gptoss_sampling_params s = sampling(seed, 200);
        s.json_schema = schema;
        const int32_t end = 200002;
        s.stop_tokens = &end;
        s.n_stop_tokens = 1;
        gptoss_session* a = session_of(plain);
        gptoss_session* b = session_of(piped);
        const Run want = generate(a, prompt, s);
        const Run got = generate(b, prompt, s);
        CHECK(want.stop == GPTOSS_STOP_RETURN);  // the document is complete: the schema's end
        CHECK(got.tokens == want.tokens);
        CHECK(got.stop == want.stop);
        gptoss_session_free(a);
        gptoss_session_free(b);
    }
    gptoss_tool tool = {"add", "Adds.", R"({"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]})"};
    gptoss_message history[1] = {{GPTOSS_ROLE_USER, GPTOSS_CHANNEL_NONE, "Add 2 and 3.", nullptr, nullptr, nullptr}};
    for (uint64_t seed = 0; seed < 3; ++seed) {
        INFO("tool call, seed " << seed);
        gptoss_chat_request req = gptoss_chat_default_request();
        req.messages = history;
        req.n_messages = 1;
        req.tools = &tool;
        req.n_tools = 1;
        req.tool_choice = GPTOSS_TOOL_CHOICE_REQUIRED;
        gptoss_sampling_params p = gptoss_sampling_default_params();
        p.seed = seed;
        p.max_tokens = 400;
        std::string raw[2];
        gptoss_stop_reason stop[2] = {};
        int i = 0;
        for (gptoss_model* m : {plain, piped}) {
            gptoss_session* s = session_of(m);
            Recorder* rec = m == piped ? record(s) : nullptr;
            const gptoss_chat_result* r = nullptr;
            REQUIRE(gptoss_chat(s, &req, &p, nullptr, nullptr, &r) == GPTOSS_OK);
            raw[i] = r->raw;
            stop[i] = r->stop_reason;
            // The forced call's header and its arguments were masked: sample_ahead with a mask.
            if (rec) CHECK(rec->calls.find('M') != std::string::npos);
            gptoss_session_free(s);
            ++i;
        }
        CHECK(stop[0] == GPTOSS_STOP_CALL);
        CHECK(raw[1] == raw[0]);
        CHECK(stop[1] == stop[0]);
    }
    gptoss_model_free(plain);
    gptoss_model_free(piped);
}
