// gptoss-batch.cpp - continuous batching of decode steps (issue 13, part 1). When several
// threads generate on different sessions of one model at once, each session's decode loop
// hands its next token to the model's DecodeBatcher instead of calling the backend itself.
// The batcher has no thread of its own: it is a rendezvous (flat combining). A waiting caller
// becomes the step's leader once no step is running and either every session inside a decode
// loop has submitted its token or a short gather window has passed; the leader runs one
// Backend::decode_batch over up to max_sessions pending tokens (first come, first served),
// then wakes the others, each of which goes back to its own sampling, stop strings, callbacks
// and cancel checks. Sessions join (enter) when their decode loop starts, after their own
// prefill, and leave when it ends, so the batch grows and shrinks mid-flight. Errors stay per
// session: a failed item's message is re-recorded in its caller's thread. Results do not depend
// on the batch (Backend::decode_batch's contract), so the timing of who joins which step never
// changes a token. Prefill is not batched yet: it runs on the caller's thread, beside steps.
#include "gptoss-internal.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>

namespace gptoss {

// How long a ready caller waits for the other sessions in a decode loop to submit their tokens
// before it runs a smaller step anyway (a session may be busy in a slow streaming callback).
static constexpr std::chrono::microseconds kGatherWindow{2000};

void Backend::decode_batch(DecodeItem* const* items, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        DecodeItem& item = *items[i];
        try {
            item.status = item.session->decode(item.token, item.pos);
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
    struct Request {
        DecodeItem item;
        bool done = false;
    };
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<Request*> pending;   // submitted, not yet taken by a step
    uint32_t active = 0;            // sessions between enter() and leave()
    bool stepping = false;          // a leader is running decode_batch
    uint64_t steps = 0, tokens = 0;
};

DecodeBatcher::DecodeBatcher(Backend& backend, uint32_t max_sessions)
    : backend_(backend), max_sessions_(max_sessions), state_(new State()) {}

DecodeBatcher::~DecodeBatcher() = default;

void DecodeBatcher::enter() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->active++;
}

void DecodeBatcher::leave() {
    {
        std::lock_guard<std::mutex> lock(state_->mutex);
        state_->active--;
    }
    state_->wake.notify_all();  // the waiters may now be everyone left
}

void DecodeBatcher::counters(uint64_t* steps, uint64_t* tokens) const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    *steps = state_->steps;
    *tokens = state_->tokens;
}

gptoss_status DecodeBatcher::decode(BackendSession* session, int32_t token, uint32_t pos) {
    State& s = *state_;
    State::Request request;
    request.item.session = session;
    request.item.token = token;
    request.item.pos = pos;
    const auto deadline = std::chrono::steady_clock::now() + kGatherWindow;
    bool led = false;
    std::unique_lock<std::mutex> lock(s.mutex);
    s.pending.push_back(&request);
    s.wake.notify_all();
    while (!request.done) {
        const bool all_in = s.pending.size() >= std::min<size_t>(s.active, max_sessions_);
        if (s.stepping) {
            s.wake.wait(lock);
        } else if (!all_in && std::chrono::steady_clock::now() < deadline) {
            s.wake.wait_until(lock, deadline);
        } else {
            // Lead one step over the oldest pending requests (not necessarily our own).
            // Nothing below throws once the vectors are reserved.
            std::vector<State::Request*> batch;
            std::vector<DecodeItem*> items;
            batch.reserve(max_sessions_);
            items.reserve(max_sessions_);
            while (!s.pending.empty() && batch.size() < max_sessions_) {
                batch.push_back(s.pending.front());
                s.pending.pop_front();
            }
            for (State::Request* r : batch) items.push_back(&r->item);
            s.stepping = true;
            lock.unlock();
            try {
                backend_.decode_batch(items.data(), uint32_t(items.size()));
            } catch (...) {  // decode_batch promises not to throw; never strand the waiters
                for (DecodeItem* item : items)
                    if (item->status == GPTOSS_OK) {
                        item->status = GPTOSS_ERR_INTERNAL;
                        item->error = "decode_batch: unexpected exception";
                    }
            }
            lock.lock();
            for (State::Request* r : batch) r->done = true;
            s.stepping = false;
            s.steps++;
            s.tokens += batch.size();
            led = true;
            s.wake.notify_all();
        }
    }
    lock.unlock();
    if (request.item.status != GPTOSS_OK) return fail(request.item.status, "%s", request.item.error.c_str());
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

gptoss_status decode_step(gptoss_session* session, int32_t token, uint32_t pos) {
    DecodeBatcher* batcher = session->model->batcher.get();
    if (batcher == nullptr) return session->backend->decode(token, pos);
    return batcher->decode(session->backend.get(), token, pos);
}

DecodeLoop::DecodeLoop(gptoss_session* session) : batcher_(session->model->batcher.get()) {
    if (batcher_ != nullptr) batcher_->enter();
}

DecodeLoop::~DecodeLoop() {
    if (batcher_ != nullptr) batcher_->leave();
}

}  // namespace gptoss
