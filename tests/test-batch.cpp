// tests/test-batch.cpp - continuous batching (gptoss-batch.cpp, issue 13): sessions of one
// model generating on several threads at once share decode steps, and every session's tokens,
// stop reasons and streamed events are exactly what it produces alone on a model without
// batching (the oracle: the same CPU backend, one session at a time). Also the DecodeBatcher
// itself over a fake backend: the cap, first-come order, and errors that stay with their
// session. Runs on the tiny checkpoint ($GPTOSS_TINY_MODEL, synth-tiny fixture) on the CPU, or
// with GPTOSS_TEST_BATCH_DEVICE=N on CUDA device N (ctest's test-batch-gpu: the batched GPU step,
// sampling in the step and speculating; exit 77, skipped, when there is no such device).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "tests/test-util.h"

#include "gptoss-internal.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using gptoss::test::prompt_of;

// GPTOSS_TEST_BATCH_DEVICE=N runs the engine tests on CUDA device N instead of the CPU
// (tools/device-batch.sh does, with the batched GPU step of cuda/batch_decode.h).
int32_t test_device() {
    const char* d = std::getenv("GPTOSS_TEST_BATCH_DEVICE");
    return d && *d ? int32_t(std::atoi(d)) : GPTOSS_DEVICE_CPU;
}

gptoss_model* load_tiny(uint32_t max_decode_batch, int32_t batch_invariant = GPTOSS_BATCH_INVARIANT_ON) {
    const char* dir = std::getenv("GPTOSS_TINY_MODEL");
    REQUIRE_MESSAGE(dir != nullptr, "GPTOSS_TINY_MODEL is not set (run through ctest)");
    gptoss_model_params params = gptoss_model_default_params();
    params.device = test_device();
    params.max_decode_batch = max_decode_batch;
    params.batch_invariant = batch_invariant;
    gptoss_model* model = nullptr;
    const gptoss_status status = gptoss_load(dir, &params, &model);
    INFO(std::string(gptoss_last_error()));
    REQUIRE(status == GPTOSS_OK);
    return model;
}

// gptoss_load of the tiny checkpoint on the CPU with `params` fails with INVALID_ARGUMENT and
// leaves *model_out null.
void check_load_refused(gptoss_model_params params) {
    const char* dir = std::getenv("GPTOSS_TINY_MODEL");
    REQUIRE(dir != nullptr);
    params.device = GPTOSS_DEVICE_CPU;
    gptoss_model* model = reinterpret_cast<gptoss_model*>(uintptr_t(1));
    CHECK(gptoss_load(dir, &params, &model) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(model == nullptr);
}

gptoss_session* new_session(gptoss_model* model) {
    gptoss_session_params params = gptoss_session_default_params();
    params.max_context = 512;
    params.max_batch = 16;
    gptoss_session* session = nullptr;
    REQUIRE(gptoss_session_create(model, &params, &session) == GPTOSS_OK);
    return session;
}
// One generation request and what came of it.
struct Job {
    std::vector<int32_t> prompt;
    float temperature = 1.0f, top_p = 1.0f;
    uint32_t top_k = 0, max_tokens = 24;
    uint64_t seed = 0;
    std::vector<int32_t> stop_tokens;
    std::string stop_string;          // empty: none
    uint32_t cancel_after = 0;        // > 0: gptoss_session_cancel from the callback after this many events
    int start_delay_ms = 0;
    // Results.
    gptoss_status status = GPTOSS_OK;
    std::string error;
    std::vector<int32_t> tokens, streamed;
    std::string text;
    gptoss_stop_reason stop = GPTOSS_STOP_MAX_TOKENS;
};

struct CallbackState {
    Job* job;
    gptoss_session* session;
};

void run_job(gptoss_session* session, Job* job) {
    if (job->start_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(job->start_delay_ms));
    gptoss_sampling_params s = gptoss_sampling_default_params();
    s.temperature = job->temperature;
    s.top_p = job->top_p;
    s.top_k = job->top_k;
    s.seed = job->seed;
    s.max_tokens = job->max_tokens;
    if (!job->stop_tokens.empty()) {
        s.stop_tokens = job->stop_tokens.data();
        s.n_stop_tokens = job->stop_tokens.size();
    }
    const char* stop_strings[1] = {job->stop_string.c_str()};
    if (!job->stop_string.empty()) {
        s.stop_strings = stop_strings;
        s.n_stop_strings = 1;
    }
    CallbackState state{job, session};
    auto on_event = [](void* ud, const gptoss_event* e) {
        auto* st = static_cast<CallbackState*>(ud);
        st->job->streamed.push_back(e->token);
        if (st->job->cancel_after != 0 && st->job->streamed.size() == st->job->cancel_after)
            gptoss_session_cancel(st->session);
        return true;
    };
    job->streamed.clear();
    const gptoss_generate_result* result = nullptr;
    job->status = gptoss_generate(session, job->prompt.data(), job->prompt.size(), &s, on_event, &state, &result);
    job->error = gptoss_last_error();
    if (job->status != GPTOSS_OK) return;
    job->tokens.assign(result->tokens, result->tokens + result->n_tokens);
    job->text.assign(result->text, result->text_len);
    job->stop = result->stop_reason;
}

// A mix of prompts, lengths (so prefills end at different times: sessions join mid-flight),
// sampling settings, max_tokens (they leave at different times), stops and a cancel.
std::vector<Job> mixed_jobs(size_t n) {
    std::vector<Job> jobs(n);
    for (size_t i = 0; i < n; i++) {
        Job& j = jobs[i];
        j.prompt = prompt_of(3 + 7 * i % 20, 100 + i);
        j.seed = 1000 + i;
        j.temperature = i % 3 == 0 ? 0.0f : i % 3 == 1 ? 0.8f : 1.2f;
        j.top_p = i % 4 == 1 ? 0.9f : 1.0f;
        j.top_k = i % 5 == 2 ? 40 : 0;
        j.max_tokens = uint32_t(6 + 5 * i % 16);
        j.start_delay_ms = int(i % 4) * 3;
    }
    return jobs;
}

// Runs every job alone, one after another, on a model without batching. On a GPU the model
// batches (cap 8) but runs one session at a time: each step then holds one token, through the
// same batched kernels, while the one-token decode graph rounds differently.
void run_alone(std::vector<Job>* jobs) {
    gptoss_model* model = load_tiny(test_device() == GPTOSS_DEVICE_CPU ? 1 : 8);
    gptoss_session* session = new_session(model);
    for (Job& j : *jobs) run_job(session, &j);
    gptoss_session_free(session);
    gptoss_model_free(model);
}

// Runs every job on its own session and thread, all at once, on `model`.
void run_together(gptoss_model* model, std::vector<Job>* jobs) {
    std::vector<gptoss_session*> sessions;
    for (size_t i = 0; i < jobs->size(); i++) sessions.push_back(new_session(model));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < jobs->size(); i++) threads.emplace_back(run_job, sessions[i], &(*jobs)[i]);
    for (std::thread& t : threads) t.join();
    for (gptoss_session* s : sessions) gptoss_session_free(s);
}

double mean_batch(gptoss_model* model) {
    uint64_t steps = 0, tokens = 0;
    model->batcher->counters(&steps, &tokens);
    return steps == 0 ? 0.0 : double(tokens) / double(steps);
}

// Three printable ASCII bytes from the second half of `text` (a stop string that splits no
// character), or "" if there are none.
std::string ascii_piece(const std::string& text) {
    for (size_t i = text.size() / 2; i + 3 <= text.size(); i++)
        if (std::isprint(static_cast<unsigned char>(text[i])) && std::isprint(static_cast<unsigned char>(text[i + 1])) &&
            std::isprint(static_cast<unsigned char>(text[i + 2])) && text[i] != '<')
            return text.substr(i, 3);
    return "";
}

void check_same(const std::vector<Job>& alone, const std::vector<Job>& together) {
    for (size_t i = 0; i < alone.size(); i++) {
        INFO("job " << i << ": " << together[i].error);
        REQUIRE(alone[i].status == GPTOSS_OK);
        REQUIRE(together[i].status == GPTOSS_OK);
        CHECK(together[i].tokens == alone[i].tokens);
        CHECK(together[i].text == alone[i].text);
        CHECK(together[i].stop == alone[i].stop);
        CHECK(together[i].streamed == alone[i].streamed);
    }
}

}  // namespace

TEST_CASE("the batch cap comes from params.max_decode_batch or GPTOSS_DECODE_BATCH, and bad values are named") {
    uint32_t n = 0;
    unsetenv("GPTOSS_DECODE_BATCH");
    REQUIRE(gptoss::resolve_max_decode_batch(0, &n) == GPTOSS_OK);
    CHECK(n == 1);  // off by default
    REQUIRE(gptoss::resolve_max_decode_batch(8, &n) == GPTOSS_OK);
    CHECK(n == 8);
    setenv("GPTOSS_DECODE_BATCH", "16", 1);
    REQUIRE(gptoss::resolve_max_decode_batch(0, &n) == GPTOSS_OK);
    CHECK(n == 16);
    REQUIRE(gptoss::resolve_max_decode_batch(4, &n) == GPTOSS_OK);
    CHECK(n == 4);  // the parameter wins
    setenv("GPTOSS_DECODE_BATCH", "lots", 1);
    CHECK(gptoss::resolve_max_decode_batch(0, &n) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("GPTOSS_DECODE_BATCH") != std::string::npos);
    unsetenv("GPTOSS_DECODE_BATCH");
    CHECK(gptoss::resolve_max_decode_batch(5000, &n) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("max_decode_batch") != std::string::npos);

    gptoss_model_params params = gptoss_model_default_params();
    params.max_decode_batch = 5000;
    check_load_refused(params);
}

TEST_CASE("batch invariance comes from params.batch_invariant or GPTOSS_BATCH_INVARIANT, and bad values are named") {
    bool on = false;
    unsetenv("GPTOSS_BATCH_INVARIANT");
    REQUIRE(gptoss::resolve_batch_invariant(0, &on) == GPTOSS_OK);
    CHECK(on);  // on by default
    REQUIRE(gptoss::resolve_batch_invariant(GPTOSS_BATCH_INVARIANT_OFF, &on) == GPTOSS_OK);
    CHECK(!on);
    setenv("GPTOSS_BATCH_INVARIANT", "0", 1);
    REQUIRE(gptoss::resolve_batch_invariant(0, &on) == GPTOSS_OK);
    CHECK(!on);
    REQUIRE(gptoss::resolve_batch_invariant(GPTOSS_BATCH_INVARIANT_ON, &on) == GPTOSS_OK);
    CHECK(on);  // the parameter wins
    setenv("GPTOSS_BATCH_INVARIANT", "1", 1);
    REQUIRE(gptoss::resolve_batch_invariant(0, &on) == GPTOSS_OK);
    CHECK(on);
    setenv("GPTOSS_BATCH_INVARIANT", "off", 1);
    CHECK(gptoss::resolve_batch_invariant(0, &on) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("GPTOSS_BATCH_INVARIANT: \"off\"") != std::string::npos);
    unsetenv("GPTOSS_BATCH_INVARIANT");
    CHECK(gptoss::resolve_batch_invariant(3, &on) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("params.batch_invariant: 3") != std::string::npos);
    CHECK(gptoss::resolve_batch_invariant(-1, &on) == GPTOSS_ERR_INVALID_ARGUMENT);

    gptoss_model_params params = gptoss_model_default_params();
    params.max_decode_batch = 4;
    params.batch_invariant = 7;
    check_load_refused(params);
    CHECK(std::string(gptoss_last_error()).find("batch_invariant") != std::string::npos);
}

TEST_CASE("8 sessions on 8 threads share decode steps and each gets exactly its tokens alone") {
    std::vector<Job> alone = mixed_jobs(8);
    // A stop token and a stop string taken from what the alone runs produce, so both fire.
    alone[3].max_tokens = 20;
    alone[5].max_tokens = 20;
    alone[6].cancel_after = 5;
    run_alone(&alone);
    REQUIRE(alone[3].tokens.size() > 10);
    alone[3].stop_tokens = {alone[3].tokens[9]};
    REQUIRE(alone[5].text.size() > 12);
    alone[5].stop_string = ascii_piece(alone[5].text);
    REQUIRE(!alone[5].stop_string.empty());
    const std::vector<Job> first = alone;
    run_alone(&alone);
    // The same arguments and seeds give the same tokens: the second run (with the stops added)
    // is a prefix of the first, whatever the session held before (job 3 now ends earlier).
    for (size_t i = 0; i < alone.size(); i++) {
        const std::vector<int32_t>& a = first[i].tokens;
        const std::vector<int32_t>& b = alone[i].tokens;
        size_t same = 0;
        while (same < a.size() && same < b.size() && a[same] == b[same]) same++;
        INFO("job " << i << ": run 1 " << a.size() << " tokens, run 2 " << b.size() << ", first difference at "
                    << same << "; stop string '" << alone[i].stop_string << "' in run 1's text '" << first[i].text
                    << "'");
        CHECK(same == b.size());
    }
    CHECK(alone[3].stop == GPTOSS_STOP_TOKEN);
    CHECK(alone[5].stop == GPTOSS_STOP_STRING);
    CHECK(alone[6].stop == GPTOSS_STOP_CANCELLED);
    CHECK(alone[6].tokens.size() == 5);

    gptoss_model* model = load_tiny(8);
    REQUIRE(model->batcher != nullptr);
    std::vector<Job> together = alone;
    run_together(model, &together);
    check_same(alone, together);
    INFO("mean decode batch " << mean_batch(model));
    CHECK(mean_batch(model) > 1.5);  // they really shared steps
    gptoss_model_free(model);
}

TEST_CASE("more sessions than the cap: steps hold at most max_decode_batch, results unchanged") {
    std::vector<Job> alone = mixed_jobs(6);
    run_alone(&alone);
    gptoss_model* model = load_tiny(2);
    std::vector<Job> together = alone;
    run_together(model, &together);
    check_same(alone, together);
    CHECK(mean_batch(model) <= 2.0);
    CHECK(mean_batch(model) > 1.0);
    gptoss_model_free(model);
}

TEST_CASE("sessions join and leave mid-flight: a second wave starts while the first decodes") {
    std::vector<Job> alone = mixed_jobs(6);
    for (size_t i = 0; i < alone.size(); i++) alone[i].max_tokens = i < 3 ? 24 : 5;
    run_alone(&alone);
    gptoss_model* model = load_tiny(8);
    std::vector<Job> together = alone;
    for (size_t i = 3; i < together.size(); i++) together[i].start_delay_ms = 20 + 5 * int(i);
    run_together(model, &together);
    check_same(alone, together);
    // The same sessions again (prefix reuse) while other threads still decode.
    std::vector<gptoss_session*> sessions = {new_session(model), new_session(model)};
    std::vector<Job> again = {alone[0], alone[1]};
    run_job(sessions[0], &again[0]);  // warm the cache of session 0
    std::thread t1([&] { run_job(sessions[0], &again[0]); });
    std::thread t2([&] { run_job(sessions[1], &again[1]); });
    t1.join();
    t2.join();
    CHECK(again[0].tokens == alone[0].tokens);
    CHECK(again[1].tokens == alone[1].tokens);
    for (gptoss_session* s : sessions) gptoss_session_free(s);
    gptoss_model_free(model);
}

TEST_CASE("a session reused after a short batched generation continues exactly like a fresh one") {
    // Two tokens after a prompt longer than the sliding window: the step that samples the second
    // may run its forward too (the CUDA step's speculation, with in-step sampling), writing K/V
    // one position past what the session keeps (gptoss_session::kv_past_end); the next prompt
    // extends the first by its first token, the resume case that must not trust that ring slot.
    gptoss_model* model = load_tiny(8);
    gptoss_session* reused = new_session(model);
    Job first;
    first.prompt = prompt_of(200, 7);
    first.temperature = 0.0f;
    first.max_tokens = 2;
    run_job(reused, &first);
    REQUIRE(first.status == GPTOSS_OK);
    REQUIRE(first.tokens.size() == 2);
    Job next;
    next.prompt = first.prompt;
    next.prompt.push_back(first.tokens[0]);
    for (int32_t t : prompt_of(5, 8)) next.prompt.push_back(t);
    next.temperature = 0.8f;
    next.seed = 42;
    next.max_tokens = 12;
    Job fresh = next;
    run_job(reused, &next);
    gptoss_session* other = new_session(model);
    run_job(other, &fresh);
    REQUIRE(next.status == GPTOSS_OK);
    REQUIRE(fresh.status == GPTOSS_OK);
    CHECK(next.tokens == fresh.tokens);
    gptoss_session_free(other);
    gptoss_session_free(reused);
    gptoss_model_free(model);
}

TEST_CASE("batch invariance off: a lone session decodes through its own decode path, as on a model without batching") {
    // The oracle: a model without batching (max_decode_batch 1: session->decode, on CUDA the
    // decode graph). With invariance off, a batching model running one session at a time takes
    // the same path for every decode step, so the tokens are the same bits on any backend.
    std::vector<Job> plain = mixed_jobs(6);
    {
        gptoss_model* model = load_tiny(1);
        REQUIRE(model->batcher == nullptr);
        gptoss_session* session = new_session(model);
        for (Job& j : plain) run_job(session, &j);
        gptoss_session_free(session);
        gptoss_model_free(model);
    }
    gptoss_model* model = load_tiny(8, GPTOSS_BATCH_INVARIANT_OFF);
    REQUIRE(model->batcher != nullptr);
    CHECK(!model->batcher->invariant());
    gptoss_session* session = new_session(model);
    std::vector<Job> lone = plain;
    for (Job& j : lone) run_job(session, &j);
    check_same(plain, lone);
    uint64_t steps = 0, tokens = 0, lone_steps = 0;
    model->batcher->counters(&steps, &tokens, &lone_steps);
    CHECK(steps > 0);
    CHECK(lone_steps == steps);  // one session at a time: every decode step alone
    CHECK(tokens == steps);
    gptoss_session_free(session);

    // Sessions together still share steps; the CPU's batched step equals its one-token path, so
    // there the tokens are the same as well (on a GPU they may differ within bf16 rounding).
    std::vector<Job> together = plain;
    run_together(model, &together);
    for (const Job& j : together) CHECK(j.status == GPTOSS_OK);
    if (test_device() == GPTOSS_DEVICE_CPU) check_same(plain, together);
    uint64_t steps2 = 0, tokens2 = 0, lone2 = 0;
    model->batcher->counters(&steps2, &tokens2, &lone2);
    INFO("steps " << steps2 - steps << ", lone " << lone2 - lone_steps << ", tokens " << tokens2 - tokens);
    CHECK(tokens2 - tokens > steps2 - steps);  // some steps held more than one token
    gptoss_model_free(model);
}

TEST_CASE("a bad request fails alone; the sessions beside it are untouched") {
    std::vector<Job> alone = mixed_jobs(4);
    run_alone(&alone);
    gptoss_model* model = load_tiny(4);
    std::vector<Job> together = alone;
    Job bad = alone[0];
    bad.prompt[1] = 999999999;  // outside the vocabulary
    together.push_back(bad);
    run_together(model, &together);
    CHECK(together.back().status == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(together.back().error.find("prompt[1]") != std::string::npos);
    together.pop_back();
    check_same(alone, together);
    gptoss_model_free(model);
}

// ---------------------------------------------------------------------------
// DecodeBatcher over a fake backend: which items run together, and failures per item.

namespace {

class FakeSession final : public gptoss::BackendSession {
public:
    FakeSession() : BackendSession(1) {}
    gptoss_status forward(const int32_t*, uint32_t n, uint32_t) override {
        prefilled += n;
        return GPTOSS_OK;
    }
    // Reached only through Backend::decode_batch's base version: a lone step, invariance off.
    gptoss_status decode(int32_t token, uint32_t) override {
        if (token < 0) return gptoss::fail(GPTOSS_ERR_DEVICE, "fake decode: token %d refused", int(token));
        seen.push_back(token);
        lone.push_back(token);
        return GPTOSS_OK;
    }
    gptoss_status get_logits(const float** out) override {
        *out = &logit_;
        return GPTOSS_OK;
    }
    gptoss_status save_sliding_snapshot() override { return GPTOSS_OK; }
    gptoss_status restore_sliding_snapshot() override { return GPTOSS_OK; }
    std::vector<int32_t> seen;  // tokens decoded, in order
    std::vector<int32_t> lone;  // those of them decoded by decode() (a lone step)
    uint32_t prefilled = 0;     // prompt tokens run
private:
    float logit_ = 0;
};

// Fails every item whose token is negative, with a message naming it; records batch sizes.
class FakeBackend final : public gptoss::Backend {
public:
    gptoss_status create_session(uint32_t, uint32_t, std::unique_ptr<gptoss::BackendSession>*) override {
        return GPTOSS_ERR_UNSUPPORTED;
    }
    uint64_t weight_bytes() const override { return 0; }
    int32_t device() const override { return GPTOSS_DEVICE_CPU; }
    uint32_t default_max_batch() const override { return 1; }
    void decode_batch(gptoss::DecodeItem* const* items, uint32_t n, bool rows_stable) override {
        CHECK(!busy.exchange(true));  // one step at a time
        uint32_t decode = 0, prefill_tokens = 0, prefill_chunks = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (items[i]->prefill) {
                prefill_tokens += items[i]->n;
                prefill_chunks++;
                static_cast<FakeSession*>(items[i]->session)->prefilled += items[i]->n;
                items[i]->status = GPTOSS_OK;
            } else {
                decode++;
            }
        }
        // Decode tokens up to the cap; prefill within the budget unless it is a single chunk.
        CHECK(decode <= cap);
        CHECK((prefill_chunks <= 1 || decode + prefill_tokens <= gptoss::DecodeBatcher::step_token_budget()));
        if (decode > 0) sizes.push_back(decode);
        // A step with a prompt chunk is never "rows stable" (its session joins the decode later).
        if (rows_stable) {
            CHECK(prefill_chunks == 0);
            stable_steps++;
        }
        for (uint32_t i = 0; i < n; i++) {
            gptoss::DecodeItem& item = *items[i];
            if (item.prefill) continue;
            CHECK(item.n == 1);
            if (item.tokens[0] < 0) {
                item.status = GPTOSS_ERR_DEVICE;
                item.error = "fake decode: token " + std::to_string(item.tokens[0]) + " refused";
            } else {
                static_cast<FakeSession*>(item.session)->seen.push_back(item.tokens[0]);
                item.status = GPTOSS_OK;
            }
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        busy.store(false);
    }
    bool speculates() const override { return true; }
    // A leaving session: never while a step runs (the batcher waits for it to end).
    // (called under the batcher's mutex: one at a time)
    void drop_speculation(gptoss::BackendSession* session) override {
        CHECK(!busy.load());
        dropped.push_back(session);
    }
    uint32_t cap = 3;
    std::atomic<bool> busy{false};
    std::vector<gptoss::BackendSession*> dropped;  // the sessions drop_speculation was called for, in order
    std::vector<uint32_t> sizes;  // written only inside decode_batch (one step at a time)
    int stable_steps = 0;         // steps called with rows_stable (likewise)
};

}  // namespace

TEST_CASE("DecodeBatcher: steps within the cap and token budget, every item delivered once, failures per thread") {
    FakeBackend backend;
    gptoss::DecodeBatcher batcher(backend, 3);
    constexpr int kThreads = 7, kSteps = 40;
    std::vector<FakeSession> sessions(kThreads);
    std::vector<std::string> errors(kThreads);
    std::vector<int> failures(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; t++)
        threads.emplace_back([&, t] {
            batcher.enter();
            for (int i = 0; i < kSteps; i++) {
                // Thread 4 asks for a refused token at step 10 and goes on.
                const int32_t token = t == 4 && i == 10 ? -7 : t * 1000 + i;
                gptoss::clear_error();  // as every public entry point does
                if (batcher.run(&sessions[t], &token, 1, uint32_t(i), false) != GPTOSS_OK) {
                    failures[t]++;
                    errors[t] = gptoss_last_error();
                } else {
                    CHECK(std::string(gptoss_last_error()).empty());
                }
            }
            batcher.leave(&sessions[t]);
        });
    // Two late arrivals prefill 1000 tokens in chunks of 200 while the others decode.
    std::vector<FakeSession> prefillers(2);
    for (int p = 0; p < 2; p++)
        threads.emplace_back([&, p] {
            std::vector<int32_t> chunk(200, 1);
            for (uint32_t pos = 0; pos < 1000; pos += 200)
                CHECK(batcher.run(&prefillers[p], chunk.data(), 200, pos, true) == GPTOSS_OK);
        });
    for (std::thread& t : threads) t.join();
    for (const FakeSession& p : prefillers) CHECK(p.prefilled == 1000);
    for (int t = 0; t < kThreads; t++) {
        CHECK(failures[t] == (t == 4 ? 1 : 0));
        CHECK(sessions[t].seen.size() == size_t(t == 4 ? kSteps - 1 : kSteps));
        for (size_t i = 1; i < sessions[t].seen.size(); i++) CHECK(sessions[t].seen[i] > sessions[t].seen[i - 1]);
    }
    CHECK(errors[4] == "fake decode: token -7 refused");
    uint64_t steps = 0, tokens = 0;
    batcher.counters(&steps, &tokens);
    CHECK(tokens == uint64_t(kThreads) * kSteps);
    CHECK(steps == backend.sizes.size());
    for (uint32_t n : backend.sizes) CHECK((n >= 1 && n <= 3));
    CHECK(double(tokens) / double(steps) > 1.5);
    // Once per leave(), each between steps, for the session leaving.
    std::vector<gptoss::BackendSession*> expected, dropped = backend.dropped;
    for (FakeSession& s : sessions) expected.push_back(&s);
    std::sort(expected.begin(), expected.end());
    std::sort(dropped.begin(), dropped.end());
    CHECK(dropped == expected);
}

TEST_CASE("DecodeBatcher: rows_stable when every decoding session is in the step, never beside a prompt chunk") {
    FakeBackend backend;
    gptoss::DecodeBatcher batcher(backend, 3);
    constexpr int kThreads = 2, kSteps = 30;
    std::vector<FakeSession> sessions(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; t++)
        threads.emplace_back([&, t] {
            batcher.enter();
            for (int i = 0; i < kSteps; i++) {
                const int32_t token = t * 1000 + i;
                CHECK(batcher.run(&sessions[t], &token, 1, uint32_t(i), false) == GPTOSS_OK);
            }
            batcher.leave(&sessions[t]);
        });
    FakeSession prefiller;  // prompt chunks beside the first steps
    std::vector<int32_t> chunk(100, 1);
    for (uint32_t pos = 0; pos < 500; pos += 100) CHECK(batcher.run(&prefiller, chunk.data(), 100, pos, true) == GPTOSS_OK);
    for (std::thread& t : threads) t.join();
    CHECK(prefiller.prefilled == 500);
    // Both sessions wait for each other (the gather window), so most of the 30+ steps hold both.
    CHECK(backend.stable_steps > 0);
}

TEST_CASE("DecodeBatcher, invariance off: a step of one decode token runs the session's own decode(), its "
          "speculation dropped first; larger steps stay batched") {
    FakeBackend backend;
    gptoss::DecodeBatcher batcher(backend, 3, /*invariant=*/false);
    // One session alone: every step is lone, the backend's batched step never runs.
    FakeSession solo;
    batcher.enter();
    for (int i = 0; i < 5; i++) {
        const int32_t token = 100 + i;
        CHECK(batcher.run(&solo, &token, 1, uint32_t(i), false) == GPTOSS_OK);
    }
    const int32_t refused = -3;
    CHECK(batcher.run(&solo, &refused, 1, 5, false) == GPTOSS_ERR_DEVICE);
    CHECK(std::string(gptoss_last_error()) == "fake decode: token -3 refused");
    batcher.leave(&solo);
    CHECK(solo.lone == std::vector<int32_t>{100, 101, 102, 103, 104});
    CHECK(backend.sizes.empty());
    CHECK(backend.dropped.size() == 7);  // before each of the 6 lone steps, then at leave()
    uint64_t steps = 0, tokens = 0, lone = 0;
    batcher.counters(&steps, &tokens, &lone);
    CHECK(steps == 6);
    CHECK(lone == 6);

    // Four threads, all inside their decode loops before the first token: steps of 2-3 tokens
    // go to the backend, lone ones (a thread the gather window left behind, or the last one)
    // to the session; every token is delivered once, in order.
    constexpr int kThreads = 4, kSteps = 30;
    std::vector<FakeSession> sessions(kThreads);
    std::vector<std::thread> threads;
    std::atomic<int> entered{0};
    for (int t = 0; t < kThreads; t++)
        threads.emplace_back([&, t] {
            batcher.enter();
            entered++;
            while (entered.load() < kThreads) std::this_thread::yield();
            for (int i = 0; i < kSteps; i++) {
                const int32_t token = t * 1000 + i;
                CHECK(batcher.run(&sessions[t], &token, 1, uint32_t(i), false) == GPTOSS_OK);
            }
            batcher.leave(&sessions[t]);
        });
    for (std::thread& t : threads) t.join();
    size_t lone_tokens = 0;
    for (int t = 0; t < kThreads; t++) {
        CHECK(sessions[t].seen.size() == size_t(kSteps));
        for (size_t i = 1; i < sessions[t].seen.size(); i++) CHECK(sessions[t].seen[i] > sessions[t].seen[i - 1]);
        lone_tokens += sessions[t].lone.size();
    }
    for (uint32_t n : backend.sizes) CHECK(n >= 2);  // a single token never reaches the batched step
    uint64_t steps2 = 0, tokens2 = 0, lone2 = 0;
    batcher.counters(&steps2, &tokens2, &lone2);
    CHECK(tokens2 - tokens == uint64_t(kThreads) * kSteps);
    CHECK(lone2 - lone == lone_tokens);
    CHECK(steps2 - steps == backend.sizes.size() + lone_tokens);
    CHECK(!backend.sizes.empty());
}

int main(int argc, char** argv) {
    const int32_t device = test_device();
    if (device != GPTOSS_DEVICE_CPU) {
#ifdef GPTOSS_HAVE_CUDA
        const bool present = device >= 0 && device < gptoss::cuda_device_count();
#else
        const bool present = false;
#endif
        if (!present) {
            std::printf("no CUDA device %d (GPTOSS_TEST_BATCH_DEVICE) in this build or machine: skipping test-batch\n",
                        int(device));
            return 77;
        }
    }
    doctest::Context context(argc, argv);
    return context.run();
}
