// gptoss-server.cpp - an OpenAI-compatible HTTP server for gpt-oss, built on the public C API
// (gptoss.h) alone and on Debian's cpp-httplib: POST /v1/chat/completions (streamed as
// server-sent events or not), GET /v1/models and GET /health. The request and reply shapes come
// from gptoss_openai (tokenizer/openai-json.h), which gptoss-chat shares.
//
// One model, --parallel N sessions. Each request takes one session for its whole generation on
// an HTTP worker thread (the library batches the decode steps of sessions generating at once); a request goes to the free session that holds the longest prefix of its
// rendered prompt when that is at least half of it (a conversation's next turn reuses its KV),
// else to the least recently used one. Requests wait for a session in arrival order, at most
// --queue of them; more get 503. A client that goes away, waiting or generating, cancels its
// request and frees its session. SIGINT and SIGTERM cancel what is running and stop cleanly.

#include "gptoss.h"
#include "tokenizer/openai-json.h"
#include "tools/cli-args.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

namespace {

namespace oa = gptoss::openai;
using namespace gptoss::cli;
constexpr const char* kProgram = "gptoss-server";

// --- options -------------------------------------------------------------------------------

struct Options {
    std::string model_dir;
    int32_t device = GPTOSS_DEVICE_AUTO;
    std::string host = "127.0.0.1";
    int port = 8080;
    uint32_t parallel = 1;
    uint32_t decode_batch = 0;  // 0: --parallel
    int32_t batch_invariant = 0;  // gptoss_model_params.batch_invariant (0: $GPTOSS_BATCH_INVARIANT, else on)
    uint32_t ctx = 0;
    std::string api_key;
    uint32_t queue = 32;
    std::string alias;
    bool verbose = false;
};

void usage(FILE* out) {
    std::fprintf(out,
        "usage: %s --model DIR [options]\n"
        "Serve a gpt-oss model over the OpenAI Chat Completions API.\n"
        "\n"
        "  -m, --model DIR       Hugging Face checkpoint directory (default $GPTOSS_MODEL)\n"
        "      --device cpu|auto|N  CPU reference backend, first GPU if any (default), or GPU N\n"
        "      --host ADDR       address to listen on (default 127.0.0.1: this machine only)\n"
        "      --port N          port (default 8080; 0 picks a free one)\n"
        "      --parallel N      sessions, i.e. requests generating at once (default 1)\n"
        "      --decode-batch N  sessions that share one decode step (default: --parallel; 1: off)\n"
        "      --batch-invariant on|off\n"
        "                        on (default): a request's tokens never depend on which others share\n"
        "                        its decode steps; off: a request decoding alone takes the one-token\n"
        "                        decode path, faster on a GPU, and its tokens may then differ within\n"
        "                        bf16 rounding from a run beside others\n"
        "      --ctx N           context length of each session in tokens (default: the model's)\n"
        "      --queue N         requests that may wait for a session; more get 503 (default 32)\n"
        "      --api-key KEY     require \"Authorization: Bearer KEY\" (default $GPTOSS_API_KEY,\n"
        "                        else none)\n"
        "      --alias NAME      the model's name in replies and /v1/models (default: gpt-oss-20b\n"
        "                        or gpt-oss-120b, as the checkpoint says)\n"
        "  -v, --verbose         library log messages on stderr\n"
        "      --version         print the version\n"
        "  -h, --help            this text\n",
        kProgram);
}

Options parse_args(int argc, char** argv) {
    Options o;
    if (const char* m = std::getenv("GPTOSS_MODEL"); m && *m) o.model_dir = m;
    if (const char* k = std::getenv("GPTOSS_API_KEY"); k && *k) o.api_key = k;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i], value;
        bool inline_value = false;
        if (arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos) {
            value = arg.substr(arg.find('=') + 1);
            arg = arg.substr(0, arg.find('='));
            inline_value = true;
        }
        auto next = [&]() -> std::string {
            if (inline_value) return value;
            if (i + 1 >= argc) usage_error(kProgram, "%s needs a value", arg.c_str());
            return argv[++i];
        };
        auto number = [&](uint32_t min, uint32_t* out) {
            const std::string v = next();
            if (!parse_u32(v, out) || *out < min) usage_error(kProgram, "%s: expected an integer >= %u, found \"%s\"", arg.c_str(), min, v.c_str());
        };
        if (arg == "-h" || arg == "--help") { usage(stdout); std::exit(0); }
        else if (arg == "--version") { std::printf("%s %s (library %u)\n", kProgram, GPTOSS_VERSION_STRING, gptoss_version()); std::exit(0); }
        else if (arg == "-m" || arg == "--model") o.model_dir = next();
        else if (arg == "--device") {
            const std::string v = next();
            if (!parse_device(v, &o.device))
                usage_error(kProgram, "--device: expected cpu, auto or a GPU number, found \"%s\"", v.c_str());
        }
        else if (arg == "--host") o.host = next();
        else if (arg == "--port") {
            uint32_t p = 0;
            number(0, &p);
            if (p > 65535) usage_error(kProgram, "--port: %u is not a port (0 to 65535)", p);
            o.port = int(p);
        }
        else if (arg == "--parallel") number(1, &o.parallel);
        else if (arg == "--decode-batch") number(1, &o.decode_batch);
        else if (arg == "--batch-invariant") {
            const std::string v = next();
            if (!parse_batch_invariant(v, &o.batch_invariant))
                usage_error(kProgram, "--batch-invariant: expected on or off, found \"%s\"", v.c_str());
        }
        else if (arg == "--ctx") number(0, &o.ctx);
        else if (arg == "--queue") number(0, &o.queue);
        else if (arg == "--api-key") o.api_key = next();
        else if (arg == "--alias") o.alias = next();
        else if (arg == "-v" || arg == "--verbose") o.verbose = true;
        else usage_error(kProgram, "unknown option \"%s\"", argv[i]);
    }
    if (o.model_dir.empty()) usage_error(kProgram, "--model DIR is required (or set $GPTOSS_MODEL)");
    if (o.parallel > 1024) usage_error(kProgram, "--parallel: %u sessions is more than 1024", o.parallel);
    return o;
}

// --- the session pool ----------------------------------------------------------------------

struct Slot {
    gptoss_session* session = nullptr;
    std::vector<int32_t> held;  // the tokens its KV cache holds, as far as we know
    uint64_t last_used = 0;
    bool busy = false;
};

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

class SessionPool {
public:
    enum class Wait { Got, Full, Closed, Gone };

    SessionPool(uint32_t queue_max) : queue_max_(queue_max) {}
    ~SessionPool() {
        for (Slot& s : slots_) gptoss_session_free(s.session);
    }

    bool add(gptoss_model* model, const gptoss_session_params& params) {
        Slot slot;
        if (gptoss_session_create(model, &params, &slot.session) != GPTOSS_OK) return false;
        slots_.push_back(std::move(slot));
        return true;
    }

    // Waits, in arrival order, for a free session for `prompt`. Full: queue_max requests are
    // waiting already. Gone: client_gone() said so while waiting. Closed: shutting down.
    Wait acquire(const std::vector<int32_t>& prompt, const std::function<bool()>& client_gone, Slot** out) {
        std::unique_lock<std::mutex> lock(mu_);
        if (closed_) return Wait::Closed;
        if ((waiting_.size() > 0 || !any_free()) && waiting_.size() >= queue_max_) return Wait::Full;
        const uint64_t ticket = next_ticket_++;
        waiting_.push_back(ticket);
        for (;;) {
            Wait result = Wait::Got;
            if (closed_) result = Wait::Closed;
            else if (waiting_.front() == ticket && any_free()) *out = pick(prompt);
            else if (client_gone()) result = Wait::Gone;
            else {
                cv_.wait_for(lock, std::chrono::milliseconds(100));
                continue;
            }
            waiting_.erase(std::find(waiting_.begin(), waiting_.end(), ticket));
            cv_.notify_all();
            return result;
        }
    }

    // Gives the session back; `held` is what its cache now holds (empty if unknown).
    void release(Slot* slot, std::vector<int32_t> held) {
        std::lock_guard<std::mutex> lock(mu_);
        slot->held = std::move(held);
        slot->busy = false;
        cv_.notify_all();
    }

    // Shutting down: cancels every generation and refuses new requests.
    void close() {
        std::lock_guard<std::mutex> lock(mu_);
        closed_ = true;
        for (Slot& s : slots_)
            if (s.busy) gptoss_session_cancel(s.session);
        cv_.notify_all();
    }

    std::string status_json() {
        std::lock_guard<std::mutex> lock(mu_);
        size_t busy = 0;
        for (const Slot& s : slots_) busy += s.busy;
        return "{\"status\":\"ok\",\"sessions\":" + std::to_string(slots_.size()) + ",\"busy\":" +
               std::to_string(busy) + ",\"waiting\":" + std::to_string(waiting_.size()) + "}";
    }

    size_t size() const { return slots_.size(); }
    bool closed() {
        std::lock_guard<std::mutex> lock(mu_);
        return closed_;
    }

private:
    bool any_free() const {
        return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.busy; });
    }

    // The free session with the longest common prefix if it covers half the prompt, else the
    // least recently used free one (whose cache is the least likely to be wanted again).
    Slot* pick(const std::vector<int32_t>& prompt) {
        Slot *best = nullptr, *lru = nullptr;
        size_t best_len = 0;
        for (Slot& s : slots_) {
            if (s.busy) continue;
            const size_t len = common_prefix(s.held, prompt);
            if (!best || len > best_len) { best = &s; best_len = len; }
            if (!lru || s.last_used < lru->last_used) lru = &s;
        }
        Slot* chosen = best_len > 0 && 2 * best_len >= prompt.size() ? best : lru;
        chosen->busy = true;
        chosen->last_used = ++clock_;
        return chosen;
    }

    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<Slot> slots_;
    std::deque<uint64_t> waiting_;
    uint64_t next_ticket_ = 0, clock_ = 0;
    uint32_t queue_max_;
    bool closed_ = false;
};

// --- the client's connection ---------------------------------------------------------------

// cpp-httplib 0.11 (Debian 12) tells a handler nothing about its connection closing (newer
// versions have Request::is_connection_closed), so the socket is found by its two addresses and
// polled for the peer's hang-up. -1 if it cannot be found; then only a failed write notices.
int connection_fd(const httplib::Request& req) {
    DIR* dir = opendir("/proc/self/fd");
    if (!dir) return -1;
    int found = -1;
    while (dirent* e = readdir(dir)) {
        const int fd = std::atoi(e->d_name);
        if (fd <= 2) continue;
        sockaddr_storage peer{}, local{};
        socklen_t pl = sizeof peer, ll = sizeof local;
        if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
        if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
        auto port = [](const sockaddr_storage& a) {
            return a.ss_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port)
                 : a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port) : -1;
        };
        auto addr = [](const sockaddr_storage& a) {
            char buf[INET6_ADDRSTRLEN] = "";
            if (a.ss_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
            else if (a.ss_family == AF_INET6) inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
            return std::string(buf);
        };
        if (port(peer) == req.remote_port && port(local) == req.local_port && addr(peer) == req.remote_addr) {
            found = fd;
            break;
        }
    }
    closedir(dir);
    return found;
}

bool peer_closed(int fd) {
    if (fd < 0) return false;
    pollfd p{fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// --- the server ----------------------------------------------------------------------------

std::string random_id(const char* prefix) {
    static std::mutex mu;
    static std::mt19937_64 rng{std::random_device{}()};
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    std::lock_guard<std::mutex> lock(mu);
    std::string id = prefix;
    for (int i = 0; i < 24; ++i) id += digits[rng() % 62];
    return id;
}

void send_error(httplib::Response& res, int status, const oa::Error& error, const char* type, const char* code = "") {
    res.status = status;
    res.set_content(oa::error_json(error, type, code), "application/json");
}

bool same_key(const std::string& a, const std::string& b) {  // in time independent of where they differ
    unsigned char diff = a.size() != b.size();
    for (size_t i = 0; i < b.size(); ++i) diff |= static_cast<unsigned char>((i < a.size() ? a[i] : 0) ^ b[i]);
    return diff == 0;
}

// One generation on a leased session: runs gptoss_chat, streams through `on_chunk` if given,
// cancels when the client is gone, and gives the session back with what its cache holds.
struct Generation {
    SessionPool* pool;
    Slot* slot;
    oa::CompletionRequest request;
    std::vector<int32_t> prompt;
    int fd = -1;
    std::unique_ptr<oa::StreamMapper> mapper;                   // streaming only
    std::function<bool(const std::string&)> write;              // streaming only
    std::vector<int32_t> sampled;
    bool released = false;

    ~Generation() { release(false); }

    void release(bool ok) {
        if (released || slot == nullptr) return;
        released = true;
        std::vector<int32_t> held;
        if (ok) {
            held = prompt;
            held.insert(held.end(), sampled.begin(), sampled.end());
        }
        pool->release(slot, std::move(held));
    }

    static bool on_event(void* user_data, const gptoss_event* event) {
        auto* g = static_cast<Generation*>(user_data);
        g->sampled.push_back(event->token);
        if (peer_closed(g->fd)) return false;
        if (g->mapper) {
            const std::string out = g->mapper->on_event(*event);
            if (!out.empty() && !g->write(out)) return false;
        }
        return true;
    }

    gptoss_status run(const gptoss_chat_result** result) {
        const gptoss_sampling_params sampling = request.sampling();
        return gptoss_chat(slot->session, &request.chat, &sampling, on_event, this, result);
    }
};

class Server {
public:
    Server(const Options& o, gptoss_model* model, SessionPool* pool, std::string alias, uint32_t ctx)
        : opts_(o), model_(model), pool_(pool), alias_(std::move(alias)), ctx_(ctx), started_(std::time(nullptr)) {}

    void install(httplib::Server& svr) {
        svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
            return authorized(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                        : httplib::Server::HandlerResponse::Handled;
        });
        svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(pool_->status_json(), "application/json");
        });
        svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content("{\"object\":\"list\",\"data\":[{\"id\":" + oa::json_str(alias_) +
                                ",\"object\":\"model\",\"created\":" + std::to_string(started_) +
                                ",\"owned_by\":\"gptoss\"}]}",
                            "application/json");
        });
        svr.Post("/v1/chat/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { chat_completions(req, res); });
        svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
            if (!res.body.empty()) return;
            // cpp-httplib parses a form-encoded body (curl -d without a Content-Type) and caps it at 8 KiB.
            const bool form = req.get_header_value("Content-Type").find("x-www-form-urlencoded") != std::string::npos;
            const std::string what = res.status == 404 ? "no such endpoint: " + req.method + " " + req.path
                                   : res.status == 413 && form ? std::string("the request body is too large for a form; "
                                                                             "send it as Content-Type: application/json")
                                   : res.status == 413 ? std::string("the request body is too large")
                                                       : "HTTP status " + std::to_string(res.status);
            res.set_content(oa::error_json({what, ""}, "invalid_request_error"), "application/json");
        });
        svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr e) {
            std::string what = "internal error";
            try { std::rethrow_exception(e); } catch (const std::exception& x) { what += std::string(": ") + x.what(); } catch (...) {}
            send_error(res, 500, {what, ""}, "server_error");
        });
        svr.set_logger([](const httplib::Request& req, const httplib::Response& res) {
            std::fprintf(stderr, "%s: %s %s %d\n", kProgram, req.method.c_str(), req.path.c_str(), res.status);
        });
    }

private:
    bool authorized(const httplib::Request& req, httplib::Response& res) const {
        if (opts_.api_key.empty() || req.path == "/health") return true;
        const std::string header = req.get_header_value("Authorization");
        const std::string want = "Bearer " + opts_.api_key;
        if (same_key(header, want)) return true;
        send_error(res, 401,
                   {header.empty() ? "missing API key: send \"Authorization: Bearer KEY\" with the key given to --api-key"
                                   : "incorrect API key", ""},
                   "invalid_request_error", "invalid_api_key");
        return false;
    }

    // The prompt as gptoss_chat will render it; false after sending a 400.
    bool render(const oa::CompletionRequest& request, std::vector<int32_t>* prompt, httplib::Response& res) const {
        size_t n = 0;
        gptoss_status st = gptoss_chat_render(model_, &request.chat, nullptr, 0, &n);
        if (st == GPTOSS_ERR_BUFFER_TOO_SMALL) {
            prompt->resize(n);
            st = gptoss_chat_render(model_, &request.chat, prompt->data(), prompt->size(), &n);
        }
        if (st != GPTOSS_OK) {
            send_error(res, 400, oa::request_error(request, st, gptoss_last_error()), "invalid_request_error");
            return false;
        }
        if (n >= ctx_) {
            send_error(res, 400,
                       {"the prompt is " + std::to_string(n) + " tokens; the context is " + std::to_string(ctx_) +
                            " tokens (--ctx), and the reply needs room too", "messages"},
                       "invalid_request_error", "context_length_exceeded");
            return false;
        }
        return true;
    }

    void chat_completions(const httplib::Request& req, httplib::Response& res) {
        auto g = std::make_shared<Generation>();
        oa::Error error;
        if (!oa::parse_completion_request(req.body.data(), req.body.size(), &g->request, &error))
            return send_error(res, 400, error, "invalid_request_error");
        if (!render(g->request, &g->prompt, res)) return;
        g->pool = pool_;
        g->fd = connection_fd(req);
        const int fd = g->fd;
        switch (pool_->acquire(g->prompt, [fd] { return peer_closed(fd); }, &g->slot)) {
        case SessionPool::Wait::Got: break;
        case SessionPool::Wait::Full:
            res.set_header("Retry-After", "1");
            return send_error(res, 503,
                              {"the server is busy: all " + std::to_string(pool_->size()) + " sessions are generating and " +
                                   std::to_string(opts_.queue) + " requests are waiting (--parallel, --queue); retry later", ""},
                              "server_error", "server_busy");
        case SessionPool::Wait::Closed:
            return send_error(res, 503, {"the server is shutting down", ""}, "server_error", "shutting_down");
        case SessionPool::Wait::Gone:
            res.status = 499;  // nobody reads it
            return;
        }
        const std::string id = random_id("chatcmpl-");
        const int64_t created = std::time(nullptr);
        if (!g->request.stream) return complete(*g, id, created, res);
        g->mapper = std::make_unique<oa::StreamMapper>(id, created, alias_, g->request.include_usage,
                                                       [] { return random_id("call_"); });
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider("text/event-stream", [g](size_t, httplib::DataSink& sink) {
            g->write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
            stream(*g);
            sink.done();
            return true;
        });
    }

    void complete(Generation& g, const std::string& id, int64_t created, httplib::Response& res) {
        const gptoss_chat_result* result = nullptr;
        const gptoss_status st = g.run(&result);
        if (st != GPTOSS_OK) {
            const oa::Error error = oa::request_error(g.request, st, gptoss_last_error());
            g.release(false);
            const bool client = st == GPTOSS_ERR_CONTEXT_FULL || st == GPTOSS_ERR_INVALID_ARGUMENT || st == GPTOSS_ERR_UNSUPPORTED;
            return send_error(res, client ? 400 : 500, error, client ? "invalid_request_error" : "server_error");
        }
        if (result->stop_reason == GPTOSS_STOP_CANCELLED && g.pool->closed()) {
            g.release(true);
            return send_error(res, 503, {"the server is shutting down; the reply was cut short", ""}, "server_error",
                              "shutting_down");
        }
        const oa::Reply reply = oa::reply_from_result(*result, [] { return random_id("call_"); });
        res.set_content(oa::completion_json(id, created, alias_, reply,
                                            oa::reply_finish_reason(result->stop_reason, reply),
                                            {result->n_prompt_tokens, result->n_completion_tokens, result->n_cached_tokens}),
                        "application/json");
        log_turn(*result);
        g.release(true);
    }

    static void stream(Generation& g) {
        if (!g.write(g.mapper->first_chunk())) return g.release(false);
        const gptoss_chat_result* result = nullptr;
        const gptoss_status st = g.run(&result);
        // Headers are gone: an error travels as an event, which the OpenAI SDKs raise.
        if (st != GPTOSS_OK) {
            g.write("data: " + oa::error_json(oa::request_error(g.request, st, gptoss_last_error()), "server_error") + "\n\n");
            return g.release(false);
        }
        if (result->stop_reason == GPTOSS_STOP_CANCELLED && g.pool->closed()) {
            g.write("data: " + oa::error_json({"the server is shutting down; the reply was cut short", ""},
                                              "server_error", "shutting_down") + "\n\n");
            return g.release(true);
        }
        g.write(g.mapper->finish(*result));
        log_turn(*result);
        g.release(true);
    }

    static void log_turn(const gptoss_chat_result& r) {
        std::fprintf(stderr, "%s: %u prompt tokens (%u cached), %u completion tokens, prefill %.0f ms, decode %.0f ms\n",
                     kProgram, r.n_prompt_tokens, r.n_cached_tokens, r.n_completion_tokens, r.prefill_ms, r.decode_ms);
    }

    const Options& opts_;
    gptoss_model* model_;
    SessionPool* pool_;
    std::string alias_;
    uint32_t ctx_;
    int64_t started_;
};

extern "C" void log_to_stderr(void*, gptoss_log_level level, const char* message) {
    static const char* names[] = {"debug", "info", "warn", "error"};
    std::fprintf(stderr, "gptoss %s: %s\n", names[std::clamp(int(level), 0, 3)], message);
}

}  // namespace

// Loads o.model_dir (concurrent requests share decode steps: continuous batching in the library)
// and fills *info; says why on stderr and returns null when it cannot.
static gptoss_model* load_model(const Options& o, gptoss_model_info* info) {
    gptoss_model_params mp = gptoss_model_default_params();
    mp.device = o.device;
    mp.max_decode_batch = std::min<uint32_t>(o.decode_batch ? o.decode_batch : o.parallel, 1024);
    mp.batch_invariant = o.batch_invariant;
    gptoss_model* model = nullptr;
    if (gptoss_load(o.model_dir.c_str(), &mp, &model) != GPTOSS_OK) {
        std::fprintf(stderr, "%s: cannot load the model from %s: %s\n", kProgram, o.model_dir.c_str(), gptoss_last_error());
        return nullptr;
    }
    std::memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    if (gptoss_model_get_info(model, info) != GPTOSS_OK) info->name = "gpt-oss";
    return model;
}

// Creates o.parallel sessions of ctx tokens and serves until SIGINT or SIGTERM (stop_signals,
// blocked in every thread, taken by one with sigwait) or a listen error. Returns the exit status.
static int serve(const Options& o, gptoss_model* model, const gptoss_model_info& info, uint32_t ctx,
          const sigset_t& stop_signals) {
    SessionPool pool(o.queue);
    gptoss_session_params sp = gptoss_session_default_params();
    sp.max_context = ctx;
    for (uint32_t i = 0; i < o.parallel; ++i) {
        if (!pool.add(model, sp)) {
            std::fprintf(stderr, "%s: cannot create session %u of %u: %s\n%s", kProgram, i + 1, o.parallel,
                         gptoss_last_error(), "hint: lower --parallel or --ctx\n");
            return 1;
        }
    }
    Server server(o, model, &pool, o.alias.empty() ? std::string(info.name ? info.name : "gpt-oss") : o.alias, ctx);
    httplib::Server svr;
    // Waiting requests hold a worker thread each, so there are enough for all of them.
    const size_t threads = o.parallel + o.queue + 8;
    svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    svr.set_payload_max_length(64u << 20);
    server.install(svr);
    const int port = o.port == 0 ? svr.bind_to_any_port(o.host) : (svr.bind_to_port(o.host, o.port) ? o.port : -1);
    if (port < 0) {
        std::fprintf(stderr, "%s: cannot listen on %s:%d: %s\n", kProgram, o.host.c_str(), o.port, std::strerror(errno));
        return 1;
    }
    std::thread signals([&] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        if (sig == SIGINT || sig == SIGTERM) std::fprintf(stderr, "%s: %s, stopping\n", kProgram, strsignal(sig));
        pool.close();
        svr.stop();
    });
    std::fprintf(stderr, "%s: %s on %s, sessions: %u of %u tokens each, listening on http://%s:%d\n", kProgram,
                 info.name ? info.name : "?", info.device == GPTOSS_DEVICE_CPU ? "the CPU" : "the GPU", o.parallel, ctx,
                 o.host.c_str(), port);
    const int rc = svr.listen_after_bind() ? 0 : 1;
    pool.close();
    pthread_kill(signals.native_handle(), SIGTERM);  // harmless if it already returned
    signals.join();
    return rc;
}

int main(int argc, char** argv) {
    const Options o = parse_args(argc, argv);
    if (o.verbose) gptoss_set_log_callback(log_to_stderr, nullptr, GPTOSS_LOG_INFO);
    signal(SIGPIPE, SIG_IGN);
    // SIGINT and SIGTERM are taken by one thread with sigwait; every other thread blocks them.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    gptoss_model_info info;
    gptoss_model* model = load_model(o, &info);
    if (model == nullptr) return 1;
    const uint32_t ctx = o.ctx ? std::min(o.ctx, info.max_context) : info.max_context;
    const int rc = serve(o, model, info, ctx, stop_signals);
    gptoss_model_free(model);
    return rc;
}
