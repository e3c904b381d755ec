// tests/test-threads.cpp - races: N sessions on one model in N threads, through the public API
// only, on the tiny synthetic checkpoint ($GPTOSS_TINY_MODEL, the synth-tiny fixture). The
// model is shared (gptoss.h: immutable, share it freely); each session is used by one thread.
// Oracles: every thread's tokens and chat replies equal what the same calls give when run one
// after the other on one thread (same seed, same prompt); gptoss_session_cancel() from another
// thread stops a running call with GPTOSS_STOP_CANCELLED; the model and the sessions can be
// freed in any order from any thread; gptoss_last_error() stays per thread. `make test-tsan`
// runs it under ThreadSanitizer (CPU backend), which turns any data race into a failure.
// GPTOSS_TEST_THREADS_DEVICE=auto runs it on the GPU instead (compute-sanitizer racecheck).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "gptoss.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 3;
constexpr uint32_t kMaxTokens = 4;

gptoss_model* load_model() {
    const char* dir = std::getenv("GPTOSS_TINY_MODEL");
    REQUIRE_MESSAGE(dir != nullptr, "GPTOSS_TINY_MODEL is not set (run through ctest)");
    gptoss_model_params params = gptoss_model_default_params();
    const char* device = std::getenv("GPTOSS_TEST_THREADS_DEVICE");
    params.device = device && std::strcmp(device, "auto") == 0 ? GPTOSS_DEVICE_AUTO : GPTOSS_DEVICE_CPU;
    gptoss_model* model = nullptr;
    REQUIRE_MESSAGE(gptoss_load(dir, &params, &model) == GPTOSS_OK, gptoss_last_error());
    return model;
}

gptoss_session* new_session(gptoss_model* model) {
    gptoss_session_params params = gptoss_session_default_params();
    params.max_context = 512;
    gptoss_session* session = nullptr;
    if (gptoss_session_create(model, &params, &session) != GPTOSS_OK) return nullptr;
    return session;
}

std::vector<int32_t> prompt_for(gptoss_model* model, int i) {
    const std::string text = "Thread " + std::to_string(i) + " asks: what is " + std::to_string(i) + " + 2?";
    std::vector<int32_t> tokens(256);
    size_t n = 0;
    if (gptoss_tokenize(model, text.c_str(), text.size(), false, tokens.data(), tokens.size(), &n) != GPTOSS_OK) return {};
    tokens.resize(n);
    return tokens;
}

// One generate call (seed i); empty on failure.
std::vector<int32_t> generate(gptoss_session* session, const std::vector<int32_t>& prompt, int i) {
    gptoss_sampling_params sampling = gptoss_sampling_default_params();
    sampling.seed = uint64_t(100 + i);
    sampling.max_tokens = kMaxTokens;
    sampling.n_stop_tokens = 0;
    sampling.stop_tokens = nullptr;
    const gptoss_generate_result* result = nullptr;
    if (gptoss_generate(session, prompt.data(), prompt.size(), &sampling, nullptr, nullptr, &result) != GPTOSS_OK)
        return {};
    return std::vector<int32_t>(result->tokens, result->tokens + result->n_tokens);
}

// One chat turn (seed i): the raw completion text; "" on failure.
std::string chat(gptoss_session* session, int i) {
    const std::string question = "Question " + std::to_string(i);
    gptoss_message message = {GPTOSS_ROLE_USER, GPTOSS_CHANNEL_NONE, question.c_str(), nullptr, nullptr, nullptr};
    gptoss_chat_request request = gptoss_chat_default_request();
    request.messages = &message;
    request.n_messages = 1;
    gptoss_sampling_params sampling = gptoss_sampling_default_params();
    sampling.seed = uint64_t(200 + i);
    sampling.max_tokens = kMaxTokens;
    const gptoss_chat_result* result = nullptr;
    if (gptoss_chat(session, &request, &sampling, nullptr, nullptr, &result) != GPTOSS_OK) return "";
    return std::string("ok:") + result->raw;
}

struct Expected {
    std::vector<std::vector<int32_t>> prompts, tokens;
    std::vector<std::string> chats;
};

// What each thread's calls give on one thread, one after the other: the oracle.
Expected sequential(gptoss_model* model) {
    Expected e;
    for (int i = 0; i < kThreads; ++i) {
        e.prompts.push_back(prompt_for(model, i));
        REQUIRE(!e.prompts.back().empty());
        gptoss_session* s = new_session(model);
        REQUIRE(s != nullptr);
        e.tokens.push_back(generate(s, e.prompts[i], i));
        REQUIRE(e.tokens.back().size() == kMaxTokens);
        e.chats.push_back(chat(s, i));
        REQUIRE(e.chats.back().size() > 3);
        gptoss_session_free(s);
    }
    return e;
}

}  // namespace

TEST_CASE("N sessions on one model in N threads: generate and chat give the one-thread results") {
    gptoss_model* model = load_model();
    const Expected expected = sequential(model);
    std::vector<std::vector<int32_t>> tokens(kThreads), tokens_again(kThreads);
    std::vector<std::string> chats(kThreads);
    std::vector<std::thread> threads;
    std::atomic<int> ready{0};
    for (int i = 0; i < kThreads; ++i)
        threads.emplace_back([&, i] {
            gptoss_session* s = new_session(model);
            ready.fetch_add(1);
            while (ready.load() < kThreads) std::this_thread::yield();  // start together
            if (s == nullptr) return;
            tokens[i] = generate(s, expected.prompts[i], i);
            chats[i] = chat(s, i);
            tokens_again[i] = generate(s, expected.prompts[i], i);  // reuses the session's cache
            gptoss_session_free(s);
        });
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < kThreads; ++i) {
        CAPTURE(i);
        CHECK(tokens[i] == expected.tokens[i]);
        CHECK(chats[i] == expected.chats[i]);
        CHECK(tokens_again[i] == expected.tokens[i]);
    }
    gptoss_model_free(model);
}

TEST_CASE("gptoss_session_cancel from another thread stops running calls") {
    gptoss_model* model = load_model();
    std::vector<int32_t> prompt = prompt_for(model, 0);
    REQUIRE(!prompt.empty());
    struct Run {
        gptoss_session* session = nullptr;
        std::atomic<int> events{0};
        gptoss_status status = GPTOSS_ERR_INTERNAL;
        gptoss_stop_reason stop = GPTOSS_STOP_RETURN;
        size_t n_tokens = 0;
    };
    std::vector<std::unique_ptr<Run>> runs;
    for (int i = 0; i < kThreads; ++i) {
        runs.push_back(std::make_unique<Run>());
        runs.back()->session = new_session(model);
        REQUIRE(runs.back()->session != nullptr);
    }
    constexpr uint32_t kLong = 400;  // far more than the cancelling thread lets it write
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
        threads.emplace_back([&, i] {
            Run& run = *runs[i];
            gptoss_sampling_params sampling = gptoss_sampling_default_params();
            sampling.seed = uint64_t(i);
            sampling.max_tokens = kLong;
            sampling.n_stop_tokens = 0;
            sampling.stop_tokens = nullptr;
            auto on_event = [](void* user, const gptoss_event*) {
                static_cast<Run*>(user)->events.fetch_add(1);
                return true;
            };
            const gptoss_generate_result* result = nullptr;
            run.status = gptoss_generate(run.session, prompt.data(), prompt.size(), &sampling, on_event, &run, &result);
            if (run.status == GPTOSS_OK) {
                run.stop = result->stop_reason;
                run.n_tokens = result->n_tokens;
            }
        });
    // The canceller: once a run has produced two tokens it is running; cancel it.
    std::thread canceller([&] {
        for (int done = 0; done < kThreads;) {
            done = 0;
            for (auto& run : runs) {
                if (run->events.load() >= 2) {
                    gptoss_session_cancel(run->session);
                    ++done;
                }
            }
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
    });
    for (std::thread& t : threads) t.join();
    canceller.join();
    for (int i = 0; i < kThreads; ++i) {
        CAPTURE(i);
        CHECK(runs[i]->status == GPTOSS_OK);
        CHECK(runs[i]->stop == GPTOSS_STOP_CANCELLED);
        CHECK(runs[i]->n_tokens >= 2);
        CHECK(runs[i]->n_tokens < kLong);
    }
    // A cancelled session works again, and cancel with nothing running does nothing.
    gptoss_session_cancel(runs[0]->session);
    CHECK(generate(runs[0]->session, prompt, 0).size() == kMaxTokens);
    for (auto& run : runs) gptoss_session_free(run->session);
    gptoss_model_free(model);
}

TEST_CASE("the model and its sessions are freed in any order, from any thread") {
    for (int order = 0; order < 3; ++order) {
        CAPTURE(order);
        gptoss_model* model = load_model();
        const std::vector<int32_t> prompt = prompt_for(model, 1);
        std::vector<gptoss_session*> sessions(kThreads, nullptr);
        for (auto& s : sessions) {
            s = new_session(model);
            REQUIRE(s != nullptr);
        }
        const std::vector<int32_t> expected = generate(sessions[0], prompt, 1);
        REQUIRE(expected.size() == kMaxTokens);
        if (order == 0) gptoss_model_free(model);  // first: the sessions keep it alive
        std::vector<std::thread> threads;
        std::vector<std::vector<int32_t>> got(kThreads);
        std::atomic<bool> model_freed{order == 0};
        for (int i = 0; i < kThreads; ++i)
            threads.emplace_back([&, i] {
                got[i] = generate(sessions[i], prompt, 1);
                // Free in reverse order of thread index, racing with the others' generate.
                if (i == 1 && order == 1) {
                    gptoss_model_free(model);  // while other threads still generate
                    model_freed.store(true);
                }
                gptoss_session_free(sessions[i]);
            });
        for (std::thread& t : threads) t.join();
        for (int i = 0; i < kThreads; ++i) CHECK(got[i] == expected);
        if (!model_freed.load()) gptoss_model_free(model);  // last: after every session
    }
}

TEST_CASE("gptoss_last_error is per thread") {
    gptoss_model* model = load_model();
    std::atomic<int> phase{0};
    std::string other_before, other_after;
    std::thread other([&] {
        other_before = gptoss_last_error();
        phase.store(1);
        while (phase.load() < 2) std::this_thread::yield();
        other_after = gptoss_last_error();
    });
    while (phase.load() < 1) std::this_thread::yield();
    gptoss_session* session = nullptr;
    gptoss_session_params params = gptoss_session_default_params();
    params.max_context = 1u << 30;  // more than the model allows
    CHECK(gptoss_session_create(model, &params, &session) != GPTOSS_OK);
    CHECK(std::string(gptoss_last_error()) != "");
    phase.store(2);
    other.join();
    CHECK(other_before == "");
    CHECK(other_after == "");
    gptoss_model_free(model);
}
