// tools/gptoss-soak.cpp - the long-run soak of issue 17: N threads share one model and run
// mixed chat turns through the public API for a set time — plain turns, tool calls (tool_choice
// auto, required and named, arguments constrained to the tools' schemas) answered with a tool
// result, response_format json_schema answers, prompts that fill the session's context to within
// a few hundred tokens, cancellations (gptoss_session_cancel from another thread, and an event
// callback returning false), and sessions freed and created again at random. Every call must
// return GPTOSS_OK, or GPTOSS_ERR_CONTEXT_FULL when the conversation outgrew the context (it then
// starts over); anything else is a failure, printed with gptoss_last_error(). A monitor thread
// samples host memory (VmRSS) and, in CUDA builds, the device's used memory (cudaMemGetInfo)
// every 100 ms; memory is "flat" when the peak of the run's second half exceeds the peak of its
// first half by at most --host-slack / --device-slack MiB. Prints one line per --report
// seconds and a summary; exit 0 = no failure and flat memory, 1 = otherwise, 2 = bad arguments.
//   gptoss-soak --model DIR [--device cpu|auto|N] [--seconds 1800] [--threads 4] [--ctx 4096]
//               [--max-tokens 48] [--seed 1] [--report 60] [--host-slack 64] [--device-slack 64]
// --leak-mib-per-s N (for tests/test-soak.sh only) allocates and keeps N MiB of host memory per
// second in the run's second half, so the test can see the memory check fail.
#include "gptoss.h"
#include "tools/cli-args.h"

#ifdef GPTOSS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
const char* const kProgram = "gptoss-soak";

struct Options {
    std::string model;
    int32_t device = GPTOSS_DEVICE_AUTO;
    uint32_t seconds = 1800, threads = 4, ctx = 4096, max_tokens = 48, report = 60;
    uint64_t seed = 1;
    uint32_t host_slack_mib = 64, device_slack_mib = 64;
    uint32_t leak_mib_per_s = 0;
};

// Counters shared by the workers (relaxed: only summed for reports).
struct Stats {
    std::atomic<uint64_t> turns{0}, tokens{0}, tool_calls{0}, cancelled{0}, context_full{0};
    std::atomic<uint64_t> sessions{0}, failures{0};
};

// One memory sample: seconds since start, host RSS bytes, device used bytes (0: unknown).
struct Sample {
    double t;
    uint64_t rss, device_used;
};

uint64_t host_rss_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    return 0;
}

// Used bytes of CUDA device `device` (all processes), or 0 for the CPU or a CPU-only build.
uint64_t device_used_bytes(int32_t device) {
#ifdef GPTOSS_HAVE_CUDA
    size_t free_b = 0, total_b = 0;
    if (device >= 0 && cudaSetDevice(device) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        return total_b - free_b;
#endif
    (void)device;
    return 0;
}

// A message whose strings the soak owns (a chat result's strings live only until the next call).
struct OwnedMessage {
    gptoss_role role;
    gptoss_channel channel;
    std::string content, author, recipient, content_type;
    bool has_author = false, has_recipient = false, has_content_type = false;
};

OwnedMessage own(const gptoss_message& m) {
    OwnedMessage o{m.role, m.channel, m.content ? m.content : "", "", "", ""};
    if (m.author) o.author = m.author, o.has_author = true;
    if (m.recipient) o.recipient = m.recipient, o.has_recipient = true;
    if (m.content_type) o.content_type = m.content_type, o.has_content_type = true;
    return o;
}

std::vector<gptoss_message> view(const std::vector<OwnedMessage>& history) {
    std::vector<gptoss_message> v;
    for (const OwnedMessage& o : history)
        v.push_back({o.role, o.channel, o.content.c_str(), o.has_author ? o.author.c_str() : nullptr,
                     o.has_recipient ? o.recipient.c_str() : nullptr,
                     o.has_content_type ? o.content_type.c_str() : nullptr});
    return v;
}

const gptoss_tool kTools[] = {
    {"get_weather", "Current weather for a city.",
     R"({"type":"object","properties":{"city":{"type":"string","maxLength":24},)"
     R"("unit":{"enum":["c","f"]}},"required":["city"],"additionalProperties":false})"},
    {"add", "Adds two integers.",
     R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"]})"},
};
const char* const kAnswerSchema =
    R"({"type":"object","properties":{"answer":{"type":"string","maxLength":40},"confidence":)"
    R"({"type":"number"}},"required":["answer"],"additionalProperties":false})";

enum class Turn { plain, tools, json_answer, long_prompt, cancel_other, cancel_callback, new_session };

// A user message of about n_tokens tokens (the o200k tokenizer makes " word" one token).
std::string filler(uint32_t n_tokens, std::mt19937_64& rng) {
    static const char* const words[] = {" river", " stone", " paper", " orange", " window", " garden", " silver"};
    std::string s = "Summarize:";
    for (uint32_t i = 0; i < n_tokens; i++) s += words[rng() % 7];
    return s;
}

class Worker {
  public:
    Worker(gptoss_model* model, const Options& opt, Stats* stats, uint32_t id, Clock::time_point end)
        : model_(model), opt_(opt), stats_(stats), rng_(opt.seed * 1000003 + id), id_(id), end_(end) {}
    ~Worker() { gptoss_session_free(session_); }
    void run();

  private:
    bool new_session();
    void turn(Turn kind);
    gptoss_chat_request request_for(Turn kind, const std::vector<gptoss_message>& msgs);
    gptoss_sampling_params sampling_for(Turn kind);
    void record(gptoss_status st, const gptoss_chat_result* res);
    void fail(const char* what, gptoss_status st);

    gptoss_model* model_;
    const Options& opt_;
    Stats* stats_;
    std::mt19937_64 rng_;
    uint32_t id_;
    Clock::time_point end_;
    gptoss_session* session_ = nullptr;
    std::vector<OwnedMessage> history_;
    uint32_t stop_after_ = 0, seen_ = 0;  // cancel_callback: stop after this many events
};

void Worker::fail(const char* what, gptoss_status st) {
    stats_->failures++;
    std::fprintf(stderr, "%s: thread %u: %s: %s: %s\n", kProgram, id_, what, gptoss_status_string(st),
                 gptoss_last_error());
}

bool Worker::new_session() {
    gptoss_session_free(session_);
    session_ = nullptr;
    history_.clear();
    gptoss_session_params sp = gptoss_session_default_params();
    sp.max_context = opt_.ctx;
    const gptoss_status st = gptoss_session_create(model_, &sp, &session_);
    if (st != GPTOSS_OK) {
        fail("gptoss_session_create", st);
        return false;
    }
    stats_->sessions++;
    return true;
}

void Worker::run() {
    if (!new_session()) return;
    const Turn kinds[] = {Turn::plain, Turn::plain, Turn::tools, Turn::tools, Turn::json_answer,
                          Turn::long_prompt, Turn::cancel_other, Turn::cancel_callback, Turn::new_session};
    while (Clock::now() < end_ && session_) turn(kinds[rng_() % (sizeof kinds / sizeof kinds[0])]);
}

// The request of a turn of `kind` over msgs: tools with a random tool_choice, or a JSON-schema
// response_format, as the kind asks.
gptoss_chat_request Worker::request_for(Turn kind, const std::vector<gptoss_message>& msgs) {
    gptoss_chat_request req = gptoss_chat_default_request();
    req.messages = msgs.data();
    req.n_messages = msgs.size();
    req.instructions = "You are a terse assistant.";
    if (kind == Turn::tools) {
        req.tools = kTools;
        req.n_tools = 2;
        const gptoss_tool_choice choices[] = {GPTOSS_TOOL_CHOICE_AUTO, GPTOSS_TOOL_CHOICE_REQUIRED, GPTOSS_TOOL_CHOICE_NAMED};
        req.tool_choice = choices[rng_() % 3];
        if (req.tool_choice == GPTOSS_TOOL_CHOICE_NAMED) req.tool_choice_name = kTools[rng_() % 2].name;
        req.max_reasoning_tokens = uint32_t(rng_() % 16);  // the tiny random model reaches the call
    } else if (kind == Turn::json_answer) {
        req.response_format = GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA;
        req.response_format_name = "answer";
        req.response_format_schema = kAnswerSchema;
        req.max_reasoning_tokens = uint32_t(rng_() % 16);
    }
    return req;
}

gptoss_sampling_params Worker::sampling_for(Turn kind) {
    gptoss_sampling_params sp = gptoss_sampling_default_params();
    sp.seed = rng_();
    sp.temperature = (rng_() % 4 == 0) ? 0.0f : 1.0f;
    sp.max_tokens = 1 + uint32_t(rng_() % opt_.max_tokens);
    if (kind == Turn::json_answer || kind == Turn::tools) sp.max_tokens += 96;  // room for the constrained part
    return sp;
}

// A turn's outcome into the stats and the history (a tool call answered by a fixed tool message).
void Worker::record(gptoss_status st, const gptoss_chat_result* res) {
    stats_->turns++;
    if (st == GPTOSS_ERR_CONTEXT_FULL) {
        stats_->context_full++;
        history_.clear();
        return;
    }
    if (st != GPTOSS_OK) {
        fail("gptoss_chat", st);
        history_.clear();
        return;
    }
    stats_->tokens += res->n_completion_tokens;
    if (res->stop_reason == GPTOSS_STOP_CANCELLED) stats_->cancelled++;
    for (size_t i = 0; i < res->n_messages; i++) history_.push_back(own(res->messages[i]));
    for (size_t i = 0; i < res->n_tool_calls && res->stop_reason == GPTOSS_STOP_CALL; i++) {
        stats_->tool_calls++;
        const std::string author = res->tool_calls[i].recipient;
        history_.push_back(own({GPTOSS_ROLE_TOOL, GPTOSS_CHANNEL_COMMENTARY, R"({"ok":true,"value":"12C"})",
                                author.c_str(), nullptr, nullptr}));
    }
}

void Worker::turn(Turn kind) {
    if (kind == Turn::new_session) {
        new_session();
        return;
    }
    if (kind == Turn::long_prompt) history_.clear();
    const uint32_t near_full = opt_.ctx > 600 ? opt_.ctx - 400 - uint32_t(rng_() % 200) : opt_.ctx / 2;
    std::string text = kind == Turn::long_prompt ? filler(near_full, rng_) : "What is " + std::to_string(rng_() % 100) + " plus 7?";
    history_.push_back(own({GPTOSS_ROLE_USER, GPTOSS_CHANNEL_NONE, text.c_str(), nullptr, nullptr, nullptr}));
    const std::vector<gptoss_message> msgs = view(history_);
    const gptoss_chat_request req = request_for(kind, msgs);
    const gptoss_sampling_params sp = sampling_for(kind);
    std::thread canceller;
    if (kind == Turn::cancel_other) {
        const auto delay = std::chrono::microseconds(rng_() % 20000);
        canceller = std::thread([s = session_, delay] {
            std::this_thread::sleep_for(delay);
            gptoss_session_cancel(s);
        });
    }
    stop_after_ = kind == Turn::cancel_callback ? uint32_t(rng_() % 8) : UINT32_MAX;
    seen_ = 0;
    const gptoss_event_fn on_event = [](void* user, const gptoss_event*) {
        Worker* w = static_cast<Worker*>(user);
        return ++w->seen_ <= w->stop_after_;
    };
    const gptoss_chat_result* res = nullptr;
    const gptoss_status st = gptoss_chat(session_, &req, &sp, on_event, this, &res);
    if (canceller.joinable()) canceller.join();
    record(st, res);
}

uint64_t peak(const std::vector<Sample>& s, double from, double to, uint64_t Sample::*field) {
    uint64_t m = 0;
    for (const Sample& x : s)
        if (x.t >= from && x.t < to) m = std::max(m, x.*field);
    return m;
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::printf("usage: gptoss-soak --model DIR [--device cpu|auto|N] [--seconds S] [--threads N] [--ctx N]\n"
                        "                   [--max-tokens N] [--seed N] [--report S] [--host-slack MiB] [--device-slack MiB]\n");
            std::exit(0);
        }
        if (i + 1 >= argc) gptoss::cli::usage_error(kProgram, "%s needs a value", a.c_str());
        const std::string v = argv[++i];
        bool ok = true;
        if (a == "--model") o.model = v;
        else if (a == "--device") ok = gptoss::cli::parse_device(v, &o.device);
        else if (a == "--seconds") ok = gptoss::cli::parse_u32(v, &o.seconds) && o.seconds > 0;
        else if (a == "--threads") ok = gptoss::cli::parse_u32(v, &o.threads) && o.threads > 0 && o.threads <= 256;
        else if (a == "--ctx") ok = gptoss::cli::parse_u32(v, &o.ctx) && o.ctx >= 256;
        else if (a == "--max-tokens") ok = gptoss::cli::parse_u32(v, &o.max_tokens) && o.max_tokens > 0;
        else if (a == "--seed") ok = gptoss::cli::parse_u64(v, &o.seed);
        else if (a == "--report") ok = gptoss::cli::parse_u32(v, &o.report) && o.report > 0;
        else if (a == "--host-slack") ok = gptoss::cli::parse_u32(v, &o.host_slack_mib);
        else if (a == "--device-slack") ok = gptoss::cli::parse_u32(v, &o.device_slack_mib);
        else if (a == "--leak-mib-per-s") ok = gptoss::cli::parse_u32(v, &o.leak_mib_per_s) && o.leak_mib_per_s <= 1024;
        else gptoss::cli::usage_error(kProgram, "unknown option %s", a.c_str());
        if (!ok) gptoss::cli::usage_error(kProgram, "%s: invalid value '%s'", a.c_str(), v.c_str());
    }
    if (o.model.empty()) gptoss::cli::usage_error(kProgram, "--model DIR is required");
    return o;
}

void report(const Stats& s, const Sample& m) {
    std::printf("t=%6.0f s  turns %6llu  tokens %8llu  tool calls %5llu  cancelled %5llu  context full %4llu  "
                "sessions %5llu  failures %llu  rss %.1f MiB  device %.1f MiB\n",
                m.t, (unsigned long long)s.turns, (unsigned long long)s.tokens, (unsigned long long)s.tool_calls,
                (unsigned long long)s.cancelled, (unsigned long long)s.context_full, (unsigned long long)s.sessions,
                (unsigned long long)s.failures, m.rss / 1048576.0, m.device_used / 1048576.0);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    const Options opt = parse(argc, argv);
    gptoss_model_params mp = gptoss_model_default_params();
    mp.device = opt.device;
    gptoss_model* model = nullptr;
    if (gptoss_load(opt.model.c_str(), &mp, &model) != GPTOSS_OK) {
        std::fprintf(stderr, "%s: %s\n", kProgram, gptoss_last_error());
        return 1;
    }
    gptoss_model_info info{};
    info.struct_size = sizeof info;
    gptoss_model_get_info(model, &info);
    const bool on_gpu = info.device >= 0;
    std::printf("gptoss-soak: %s on %s, %u threads, %u s, context %u\n", opt.model.c_str(),
                on_gpu ? "the GPU" : "the CPU", opt.threads, opt.seconds, opt.ctx);
    Stats stats;
    const Clock::time_point start = Clock::now(), end = start + std::chrono::seconds(opt.seconds);
    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < opt.threads; i++)
        threads.emplace_back([&, i] { Worker(model, opt, &stats, i, end).run(); });
    std::vector<Sample> samples;
    std::vector<std::vector<char>> leaked;  // --leak-mib-per-s
    double next_report = opt.report;
    for (;;) {
        const double t = std::chrono::duration<double>(Clock::now() - start).count();
        if (opt.leak_mib_per_s && t >= opt.seconds / 2.0)
            leaked.emplace_back(size_t(opt.leak_mib_per_s) * 1048576 / 10, char(1));
        samples.push_back({t, host_rss_bytes(), device_used_bytes(info.device)});
        if (t >= next_report) report(stats, samples.back()), next_report += opt.report;
        if (Clock::now() >= end) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (std::thread& th : threads) th.join();
    samples.push_back({double(opt.seconds), host_rss_bytes(), device_used_bytes(info.device)});
    report(stats, samples.back());
    gptoss_model_free(model);
    const double half = opt.seconds / 2.0, inf = 1e30;
    const uint64_t h1 = peak(samples, 0, half, &Sample::rss), h2 = peak(samples, half, inf, &Sample::rss);
    const uint64_t d1 = peak(samples, 0, half, &Sample::device_used), d2 = peak(samples, half, inf, &Sample::device_used);
    const bool host_flat = h2 <= h1 + uint64_t(opt.host_slack_mib) * 1048576;
    const bool device_flat = d2 <= d1 + uint64_t(opt.device_slack_mib) * 1048576;
    std::printf("summary: %llu turns, %llu tokens, %llu failures; peak rss %.1f -> %.1f MiB (%s); peak device %.1f -> "
                "%.1f MiB (%s)\n",
                (unsigned long long)stats.turns, (unsigned long long)stats.tokens, (unsigned long long)stats.failures,
                h1 / 1048576.0, h2 / 1048576.0, host_flat ? "flat" : "GREW", d1 / 1048576.0, d2 / 1048576.0,
                on_gpu ? (device_flat ? "flat" : "GREW") : "no GPU");
    return stats.failures == 0 && stats.turns > 0 && host_flat && device_flat ? 0 : 1;
}
