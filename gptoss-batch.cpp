// gptoss-batch.cpp - continuous batching of decode steps (issue 13, part 1). When several
// threads generate on different sessions of one model at once, each session's decode loop
// hands its next token to the model's DecodeBatcher instead of calling the backend itself.
// The batcher has no thread of its own: it is a rendezvous (flat combining). A waiting caller
// becomes the step's leader once no step is running and either every session inside a decode
// loop has submitted its token or a short gather window has passed; the leader runs one
// Backend::decode_batch over up to max_sessions pending tokens (first come, first served),
// then wakes the others, each of which goes back to its own sampling (unless the step sampled
// its token already: DecodeItem::sampling, same token), stop strings, callbacks and cancel
// checks. Sessions join (enter) when their decode loop starts, after their own
// prefill, and leave when it ends, so the batch grows and shrinks mid-flight. Errors stay per
// session: a failed item's message is re-recorded in its caller's thread. Results do not depend
// on the batch (Backend::decode_batch's contract), so the timing of who joins which step never
// changes a token. Prompt chunks join steps too, after the decode tokens and within a token
// budget per step, so a long prompt enters between the streams' steps instead of beside them.
// With batch invariance off (gptoss_model_params.batch_invariant), a step that holds one
// session's decode token and no other runs through that session's own decode() (the CUDA decode
// graph) instead of the backend's batched step.
#include "gptoss-internal.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <vector>

namespace gptoss {

uint32_t DecodeBatcher::step_token_budget() {
    static const uint32_t budget = [] {
        const char* e = std::getenv("GPTOSS_DECODE_BATCH_TOKEN_BUDGET");
        const long v = e && *e ? std::strtol(e, nullptr, 10) : long(kStepTokenBudget);
        return uint32_t(v >= 64 && v <= 65536 ? v : long(kStepTokenBudget));
    }();
    return budget;
}

// How long a ready caller waits for the other sessions in a decode loop to submit their tokens
// before it runs a smaller step anyway (a session may be busy in a slow streaming callback).
// 20 ms: after a GPU step every session samples on its own (one device sampler launch each,
// which run one after another), so with 64 streams the last ones submit a few ms after the
// first; a 2 ms window split the streams into steps of ~4-19 tokens (H200, bench/NOTES.md "v13
// GPU batched decode": 64 streams 1686 tok/s at 2 ms, 4021 at 20 ms). The window only runs while
// a session in a decode loop has not submitted, so a lone session never waits.
// GPTOSS_DECODE_BATCH_GATHER_US overrides it (tuning runs; read once per process).
static std::chrono::microseconds gather_window() {
    static const std::chrono::microseconds window = [] {
        const char* e = std::getenv("GPTOSS_DECODE_BATCH_GATHER_US");
        const long us = e && *e ? std::strtol(e, nullptr, 10) : 20000;
        return std::chrono::microseconds(us > 0 && us <= 1000000 ? us : 20000);
    }();
    return window;
}

static bool wake_all_on_submit() {
    static const bool on = [] {
        const char* e = std::getenv("GPTOSS_DECODE_BATCH_WAKE_ALL");
        return e && *e && std::strcmp(e, "0") != 0;
    }();
    return on;
}

void Backend::decode_batch(DecodeItem* const* items, uint32_t n, bool /*rows_stable*/) {
    for (uint32_t i = 0; i < n; i++) {
        DecodeItem& item = *items[i];
        try {
            item.status = item.prefill ? item.session->forward(item.tokens, item.n, item.pos)
                                       : item.session->decode(item.tokens[0], item.pos);
            if (item.status != GPTOSS_OK) item.error = gptoss_last_error();
        } catch (const std::bad_alloc&) {
            item.status = GPTOSS_ERR_OUT_OF_MEMORY;
            item.error = "decode: out of host memory";
        } catch (const std::exception& e) {
            item.status = GPTOSS_ERR_INTERNAL;
            item.error = std::string("decode: unexpected exception: ") + e.what();
        }
    }
}

struct DecodeBatcher::State {
    // A caller's request. Its caller sleeps on the request's own mutex and condition variable,
    // so the end of a step wakes exactly the step's callers, none of which then needs `mutex`
    // to return (all of them woken through one condition variable on `mutex` queued up on it:
    // ~0.7 ms between two 64-token steps on the GPU machine, bench/NOTES.md "v27").
    struct Request {
        DecodeItem item;
        bool taken = false;             // in a step (under State::mutex)
        std::atomic<bool> done{false};  // the step ended (set under m)
        bool poked = false;             // under m: the batcher's state changed, look again
        std::mutex m;
        std::condition_variable cv;
    };
    std::mutex mutex;
    std::vector<Request*> pending;  // submitted, not yet taken by a step, oldest first
    size_t pending_decode = 0;      // how many of them are decode tokens
    uint32_t active = 0;            // sessions between enter() and leave()
    bool stepping = false;          // a leader is running decode_batch
    std::condition_variable step_end;  // stepping went false (leave() waits for it)
    uint64_t steps = 0, tokens = 0, lone_steps = 0;

    // Wakes r's caller with r marked done (its step ended) or poked (look again).
    static void wake(Request* r, bool done) {
        std::lock_guard<std::mutex> g(r->m);
        if (done) r->done.store(true);
        else r->poked = true;
        r->cv.notify_one();  // under r->m: the caller, which frees r on return, waits for r->m
    }
    // Wakes every waiting caller whose request no step has taken (caller holds `mutex`, so
    // none of them can be taken, finished and gone meanwhile).
    void poke_pending() {
        for (Request* r : pending) wake(r, false);
    }
};

// Sleeps until `r` is done or poked, or until `deadline` (when given).
template <typename Request>
static void await(Request* r, const std::chrono::steady_clock::time_point* deadline) {
    std::unique_lock<std::mutex> g(r->m);
    const auto ready = [r] { return r->done.load() || r->poked; };
    if (deadline != nullptr) r->cv.wait_until(g, *deadline, ready);
    else r->cv.wait(g, ready);
    r->poked = false;
}

// Sleeps until `r` is done. Always through r->m, even when `done` already reads true: its
// step's leader sets it inside wake(), still holding r->m and about to call notify_one on r->cv,
// and r lives in the caller's frame (returning on the bare atomic destroyed r->cv under the
// leader's notify_one: ThreadSanitizer, test-batch, CI of 2026-12-02).
template <typename Request>
static void await_done(Request* r) {
    std::unique_lock<std::mutex> g(r->m);
    r->cv.wait(g, [r] { return r->done.load(); });
}

DecodeBatcher::DecodeBatcher(Backend& backend, uint32_t max_sessions, bool invariant)
    : backend_(backend), max_sessions_(max_sessions), invariant_(invariant), state_(new State()) {}

DecodeBatcher::~DecodeBatcher() = default;

void DecodeBatcher::enter() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->active++;
}

void DecodeBatcher::leave(BackendSession* session) {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->active--;
    // Nothing of the leaving session may still run when its generation returns (a step's
    // speculative forward: Backend::drop_speculation); no step starts while the lock is held.
    if (backend_.speculates()) {
        state_->step_end.wait(lock, [this] { return !state_->stepping; });
        backend_.drop_speculation(session);
    }
    state_->poke_pending();  // the waiters may now be everyone left
}

void DecodeBatcher::counters(uint64_t* steps, uint64_t* tokens, uint64_t* lone_steps) const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    *steps = state_->steps;
    *tokens = state_->tokens;
    if (lone_steps != nullptr) *lone_steps = state_->lone_steps;
}

// Runs a step's items: the backend's batched step, or, when `lone` (batch invariance off and a
// single decode token), each item on its own session (Backend::decode_batch's base version: the
// decode token through session->decode(), a prompt chunk through forward(), as the CUDA step
// runs chunks anyway). The lone session's part of an earlier step's speculative forward is
// dropped first: decode() now writes that position itself, so no later batched step may take
// the speculation's row for it (on the GPU the session's stream already runs after that forward).
static void run_step(Backend& backend, DecodeItem* const* items, uint32_t n, bool rows_stable, bool lone) {
    if (!lone) {
        backend.decode_batch(items, n, rows_stable);
        return;
    }
    if (backend.speculates())
        for (uint32_t i = 0; i < n; i++)
            if (!items[i]->prefill) backend.drop_speculation(items[i]->session);
    backend.Backend::decode_batch(items, n, false);
}

// The step a leader runs (its vectors reserved for pending.size(), so nothing here allocates):
// every pending decode token (up to max_sessions), then prompt chunks while the step has at
// most step_token_budget() tokens (at least one chunk); the rest stay in *kept, in order.
// Returns the number of decode tokens taken.
template <typename Request>
static uint32_t take_step(const std::vector<Request*>& pending, uint32_t max_sessions, std::vector<Request*>* batch,
                          std::vector<Request*>* kept) {
    uint32_t n_decode = 0, n_tokens = 0;
    for (Request* r : pending)
        if (!r->item.prefill && n_decode < max_sessions) {
            batch->push_back(r);
            n_decode++;
            n_tokens++;
        }
    bool any_prefill = false;
    uint32_t decode_seen = 0;  // the first n_decode decode requests are in the batch
    for (Request* r : pending) {
        if (!r->item.prefill) {
            if (decode_seen++ >= n_decode) kept->push_back(r);
        } else if (!any_prefill || n_tokens + r->item.n <= DecodeBatcher::step_token_budget()) {
            batch->push_back(r);
            n_tokens += r->item.n;
            any_prefill = true;
        } else {
            kept->push_back(r);
        }
    }
    return n_decode;
}

// One step led by the caller holding `lock` (released while the step runs, held again on
// return): the oldest pending requests (not necessarily the leader's own, `own`), every taker
// woken after. Out of memory while reserving withdraws `own` (nobody took it yet) and rethrows.
template <typename State>
static void lead_step(State& s, std::unique_lock<std::mutex>& lock, typename State::Request* own,
                      uint32_t max_sessions, bool invariant, Backend& backend) {
    using Request = typename State::Request;
    std::vector<Request*> batch, kept;
    std::vector<DecodeItem*> items;
    try {
        batch.reserve(s.pending.size());
        kept.reserve(s.pending.size());
        items.reserve(s.pending.size());
    } catch (...) {
        s.pending.erase(std::find(s.pending.begin(), s.pending.end(), own));
        if (!own->item.prefill) s.pending_decode--;
        throw;
    }
    // Nothing below throws once the vectors are reserved.
    const uint32_t n_decode = take_step(s.pending, max_sessions, &batch, &kept);
    // Rows stable: no prompt chunk in the step or left waiting, every decoding session in it (a
    // session still prefilling elsewhere may join the next step anyway: a wasted speculation).
    const bool rows_stable = kept.empty() && n_decode == batch.size() && n_decode == s.active;
    s.pending.swap(kept);
    s.pending_decode -= n_decode;
    for (Request* r : batch) {
        r->taken = true;
        items.push_back(&r->item);
    }
    s.stepping = true;
    const bool lone = !invariant && n_decode == 1;
    lock.unlock();
    try {
        run_step(backend, items.data(), uint32_t(items.size()), rows_stable, lone);
    } catch (...) {  // decode_batch promises not to throw; never strand the waiters
        for (DecodeItem* item : items)
            if (item->status == GPTOSS_OK) {
                item->status = GPTOSS_ERR_INTERNAL;
                item->error = "decode_batch: unexpected exception";
            }
    }
    lock.lock();
    s.stepping = false;
    s.step_end.notify_all();  // leave() (no caller waits on it otherwise)
    if (n_decode > 0) s.steps++;  // steps with decode tokens: tokens / steps = mean batch
    if (lone) s.lone_steps++;
    s.tokens += n_decode;
    s.poke_pending();  // submitted during the step: one of them may lead the next
    lock.unlock();
    // The step's callers, each woken on its own (nobody else touches a taken request).
    for (Request* r : batch) State::wake(r, true);
    lock.lock();
}

gptoss_status DecodeBatcher::run(BackendSession* session, const int32_t* tokens, uint32_t n, uint32_t pos,
                                 bool prefill, const SamplingConfig* sampling, double u, int32_t* sampled) {
    State& s = *state_;
    State::Request request;
    request.item.session = session;
    request.item.tokens = tokens;
    request.item.n = n;
    request.item.pos = pos;
    request.item.prefill = prefill;
    if (sampled != nullptr) *sampled = -1;
    if (!prefill && sampled != nullptr) {
        request.item.sampling = sampling;
        request.item.u = u;
    }
    // The gather window runs while no step does: a caller that submitted during a step starts
    // its window when that step ends (a window counted from the submission ran out just after
    // the step, so one or two sessions that had missed a step's gather led the next one with
    // whoever had resubmitted by then and missed again: 62-63 of 64 streams per steady step,
    // bench/NOTES.md "v16 batched decode").
    auto deadline = std::chrono::steady_clock::now() + gather_window();
    bool led = false;
    std::unique_lock<std::mutex> lock(s.mutex);
    s.pending.push_back(&request);
    if (!prefill) s.pending_decode++;
    // The waiters need not hear of a submission: if it completes the batch, this caller leads
    // the step itself (below); a gather window that runs out wakes its waiter by itself. Waking
    // them all on every submission cost O(sessions²) wake-ups per step (64 streams: ~4000).
    // GPTOSS_DECODE_BATCH_WAKE_ALL=1 restores that (A/B runs).
    if (wake_all_on_submit()) s.poke_pending();
    // Sleeps with `mutex` released; a request done meanwhile returns without taking it again
    // (the usual end of a wait: its step's leader woke it).
    const auto sleep = [&](const std::chrono::steady_clock::time_point* until) {
        lock.unlock();
        await(&request, until);
        if (!request.done.load()) lock.lock();
    };
    while (lock.owns_lock() && !request.taken) {
        const bool all_in = s.pending_decode >= std::min<size_t>(s.active, max_sessions_);
        if (s.stepping) {
            sleep(nullptr);
            deadline = std::chrono::steady_clock::now() + gather_window();
        } else if (!all_in && std::chrono::steady_clock::now() < deadline) {
            sleep(&deadline);
        } else {
            lead_step(s, lock, &request, max_sessions_, invariant_, backend_);
            led = true;
        }
    }
    if (lock.owns_lock()) lock.unlock();
    await_done(&request);  // taken: woken by its step's leader
    if (request.item.status != GPTOSS_OK) return fail(request.item.status, "%s", request.item.error.c_str());
    if (sampled != nullptr && request.item.sampling != nullptr) *sampled = request.item.sampled;
    if (led) clear_error();  // other items' messages recorded on this thread are not ours
    return GPTOSS_OK;
}

gptoss_status resolve_max_decode_batch(uint32_t param, uint32_t* out) {
    constexpr uint32_t kMax = 1024;
    uint32_t n = param;
    if (n == 0) {
        n = 1;
        if (const char* env = std::getenv("GPTOSS_DECODE_BATCH"); env != nullptr && *env != '\0') {
            char* end = nullptr;
            const unsigned long v = std::strtoul(env, &end, 10);
            if (*end != '\0' || v == 0 || v > kMax || env[0] == '-')
                return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                            "GPTOSS_DECODE_BATCH: \"%s\" is not a number of sessions in [1, %u]", env, kMax);
            n = uint32_t(v);
        }
    }
    if (n > kMax)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "params.max_decode_batch: %u exceeds the maximum of %u", n, kMax);
    *out = n;
    return GPTOSS_OK;
}

gptoss_status resolve_batch_invariant(int32_t param, bool* out) {
    if (param == GPTOSS_BATCH_INVARIANT_ON || param == GPTOSS_BATCH_INVARIANT_OFF) {
        *out = param == GPTOSS_BATCH_INVARIANT_ON;
        return GPTOSS_OK;
    }
    if (param != 0)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                    "params.batch_invariant: %d is neither GPTOSS_BATCH_INVARIANT_ON (1), GPTOSS_BATCH_INVARIANT_OFF "
                    "(2) nor 0 (the default)",
                    int(param));
    int env = -1;
    GPTOSS_TRY(env_switch("GPTOSS_BATCH_INVARIANT", &env));
    *out = env != 0;
    return GPTOSS_OK;
}

gptoss_status env_switch(const char* name, int* out) {
    *out = -1;
    const char* env = std::getenv(name);
    if (env == nullptr || *env == '\0') return GPTOSS_OK;
    if (std::strcmp(env, "0") != 0 && std::strcmp(env, "1") != 0)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: \"%s\" is neither 1 (on) nor 0 (off)", name, env);
    *out = env[0] == '1' ? 1 : 0;
    return GPTOSS_OK;
}

gptoss_status decode_step(gptoss_session* session, int32_t token, uint32_t pos, const SamplingConfig* sampling,
                          double u, int32_t* sampled) {
    if (sampled != nullptr) *sampled = -1;
    DecodeBatcher* batcher = session->model->batcher.get();
    if (batcher == nullptr) return session->backend->decode(token, pos);
    return batcher->run(session->backend.get(), &token, 1, pos, false, sampling, u, sampled);
}

gptoss_status prefill_step(gptoss_session* session, const int32_t* tokens, uint32_t n, uint32_t pos) {
    DecodeBatcher* batcher = session->model->batcher.get();
    if (batcher == nullptr) return session->backend->forward(tokens, n, pos);
    return batcher->run(session->backend.get(), tokens, n, pos, true);
}

DecodeLoop::DecodeLoop(gptoss_session* session)
    : batcher_(session->model->batcher.get()), session_(session->backend.get()) {
    if (batcher_ != nullptr) batcher_->enter();
}

DecodeLoop::~DecodeLoop() {
    if (batcher_ != nullptr) batcher_->leave(session_);
}

}  // namespace gptoss
