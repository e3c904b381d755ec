// gptoss-chat.cpp - the command-line chat for gpt-oss, built on the public C ABI (gptoss.h) alone,
// linked against libgptoss.so as any user program would be: it is the first customer of the API.
//
// Modes: interactive (stdin is a terminal: line editing with libedit, streamed output, commands
// such as /save), line mode (stdin piped, no -p: every line is a user turn or a command), and
// one-shot (-p: one answer, only the final text or --json on stdout, exit 0).
// The conversation lives here as plain strings; every turn passes the whole history to
// gptoss_chat(), and the session reuses the prefix it already processed (API.md §6).
// Ctrl-C during generation reaches gptoss_session_cancel() through a self-pipe and a helper
// thread, because a signal handler may only do async-signal-safe work.

#include "gptoss.h"
#include "tokenizer/openai-json.h"
#include "tools/cli-args.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef GPTOSS_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace gptoss::openai;
using namespace gptoss::cli;

constexpr const char* kProgram = "gptoss-chat";
// A random model almost never samples <|call|> twice in a row, but a real one stuck in a loop
// could; this bounds the automatic tool rounds of one user turn.
constexpr int kMaxToolRounds = 16;
// The default tiny model writes random text until its context is full; cap a turn so a first
// try shows a complete turn and its stats line within a second or two.
constexpr uint32_t kTinyDefaultMaxTokens = 128;

// --- options -------------------------------------------------------------------------------

struct Options {
    std::string model_dir;              // empty: the default tiny model
    int32_t device = GPTOSS_DEVICE_AUTO;
    std::vector<int32_t> devices;       // --devices: the GPUs to split the model over
    int32_t n_cpu_moe = 0;              // --n-cpu-moe: layers whose experts stay in host memory
    uint64_t gpu_memory = 0;            // --gpu-memory: the GPU memory budget in bytes (0: free memory)
    gptoss_reasoning_effort effort = GPTOSS_REASONING_MEDIUM;
    bool effort_given = false;
    std::optional<std::string> system;  // developer instructions
    float temperature = 1.0f;
    float top_p = 1.0f;
    uint32_t top_k = 0;
    uint64_t seed = GPTOSS_SEED_RANDOM;
    std::optional<uint32_t> max_tokens;
    uint32_t ctx = 0;
    std::string tools_file;
    std::string tool_cmd;
    std::optional<std::string> prompt;  // -p
    bool json = false;
    std::string conversation_file;
    bool hide_reasoning = false;
    bool color = true;
    bool verbose = false;
    std::string history_file;           // empty: the default path
    std::string json_schema_file;       // --json-schema: the final answer's JSON Schema
    std::string json_schema;            //   its text
    std::string tool_choice = "auto";   // --tool-choice: auto, none, required or a function name
    std::optional<uint32_t> max_reasoning_tokens;  // --max-reasoning-tokens
};

void usage(FILE* out) {
    std::fprintf(out,
        "usage: %s [options]\n"
        "Chat with a gpt-oss model. Without --model, a tiny random model is made and used.\n"
        "\n"
        "model:\n"
        "  -m, --model DIR          Hugging Face checkpoint directory (config.json, tokenizer.json,\n"
        "                           *.safetensors); default $GPTOSS_MODEL, else the tiny model\n"
        "      --device cpu|auto|N  CPU reference backend, first GPU if any (default), or GPU N\n"
        "      --devices N,M,...    split the model over these GPUs (NCCL)\n"
        "      --n-cpu-moe N|auto   keep the MoE experts of the first N layers in host memory (the CPU\n"
        "                           runs them at decode), or auto: as few as fit --gpu-memory with\n"
        "                           room for --ctx tokens (default 32768 with auto)\n"
        "      --gpu-memory SIZE    GPU memory the model may use, e.g. 24G (default: what is free)\n"
        "      --ctx N              context length in tokens (default: the model's maximum)\n"
        "chat:\n"
        "  -r, --reasoning LEVEL    reasoning effort: low, medium (default) or high\n"
        "  -s, --system TEXT        developer instructions (the \"system prompt\")\n"
        "      --tools FILE         OpenAI-style function definitions (JSON array, or an object\n"
        "                           with \"tools\"); see examples/tools.json\n"
        "      --tool-cmd CMD       run CMD (with sh -c) for each tool call: arguments JSON on\n"
        "                           stdin, $GPTOSS_TOOL_NAME set, its stdout is the result\n"
        "      --conversation FILE  start from an OpenAI-style messages file (as /load); its tool_choice\n"
        "                           and response_format apply unless --tool-choice/--json-schema are given\n"
        "      --hide-reasoning     do not show the analysis channel\n"
        "      --json-schema FILE   the final answer is JSON matching this JSON Schema (constrained\n"
        "                           decoding; the schema is also shown to the model)\n"
        "      --tool-choice C      auto (default), none (no tool calls), required (the reply is a\n"
        "                           tool call), or a function name (a call to that function)\n"
        "      --max-reasoning-tokens N  at most N analysis tokens per turn, then the answer is\n"
        "                           forced (0: no analysis); default no bound\n"
        "sampling:\n"
        "      --temperature T      default 1.0; 0 is greedy\n"
        "      --top-p P            default 1.0 (off)\n"
        "      --top-k K            default 0 (off)\n"
        "      --seed N             same seed + same input = same output (default random)\n"
        "      --max-tokens N       per model turn (default: until the answer ends; 128 on the\n"
        "                           tiny model)\n"
        "one-shot:\n"
        "  -p, --prompt TEXT        answer TEXT (followed by stdin, when piped) and exit; prints\n"
        "                           only the final answer\n"
        "      --json               print the result as JSON: the conversation (usable with\n"
        "                           --conversation), choices and usage\n"
        "other:\n"
        "      --no-color           plain output (also when $NO_COLOR is set)\n"
        "      --history FILE       input history (default $XDG_STATE_HOME/gptoss/chat_history)\n"
        "  -v, --verbose            library log messages on stderr\n"
        "      --version            print the version\n"
        "  -h, --help               this text\n"
        "\n"
        "Type /help in the chat for its commands.\n",
        kProgram);
}

// Sampling settings shared by the command line and /set, so both validate the same way.
bool set_sampling_option(Options& o, const std::string& name, const std::string& value, std::string& err) {
    if (name == "temperature") {
        if (!parse_float(value, &o.temperature) || o.temperature < 0) { err = "expected a number >= 0"; return false; }
    } else if (name == "top-p" || name == "top_p") {
        if (!parse_float(value, &o.top_p) || !(o.top_p > 0 && o.top_p <= 1)) { err = "expected a number in (0, 1]"; return false; }
    } else if (name == "top-k" || name == "top_k") {
        if (!parse_u32(value, &o.top_k)) { err = "expected an integer >= 0"; return false; }
    } else if (name == "seed") {
        if (value == "random") o.seed = GPTOSS_SEED_RANDOM;
        else if (!parse_u64(value, &o.seed)) { err = "expected an integer >= 0 or \"random\""; return false; }
    } else if (name == "max-tokens" || name == "max_tokens") {
        uint32_t n = 0;
        if (!parse_u32(value, &n)) { err = "expected an integer >= 0 (0: no limit)"; return false; }
        o.max_tokens = n;
    } else {
        err = "unknown setting (temperature, top_p, top_k, seed, max_tokens)";
        return false;
    }
    return true;
}

[[noreturn]] void print_version() {
#ifdef GPTOSS_HAVE_LIBEDIT
    const char* editing = "libedit";
#else
    const char* editing = "none";
#endif
    std::printf("%s %s (library %u, line editing: %s)\n", kProgram, GPTOSS_VERSION_STRING, gptoss_version(), editing);
    std::exit(0);
}

// --devices: GPU numbers separated by commas.
std::vector<int32_t> parse_devices_arg(const std::string& v) {
    std::vector<int32_t> devices;
    size_t start = 0;
    while (start <= v.size()) {
        const size_t comma = std::min(v.find(',', start), v.size());
        uint32_t n = 0;
        if (!parse_u32(v.substr(start, comma - start), &n) || n > 1024)
            usage_error(kProgram, "--devices: expected GPU numbers separated by commas, found \"%s\"", v.c_str());
        devices.push_back(int32_t(n));
        start = comma + 1;
    }
    return devices;
}

// The options that choose the model and where it runs (next() reads the option's value);
// false when `arg` is none of them.
template <typename Next>
bool parse_model_option(const std::string& arg, Next&& next, Options& o) {
    if (arg == "-m" || arg == "--model") {
        o.model_dir = next();
    } else if (arg == "--device") {
        std::string v = next();
        if (!parse_device(v, &o.device))
            usage_error(kProgram, "--device: expected cpu, auto or a GPU number, found \"%s\"", v.c_str());
    } else if (arg == "--devices") {
        o.devices = parse_devices_arg(next());
    } else if (arg == "--n-cpu-moe") {
        std::string v = next();
        if (!parse_cpu_moe(v, &o.n_cpu_moe))
            usage_error(kProgram, "--n-cpu-moe: expected a number of layers or auto, found \"%s\"", v.c_str());
    } else if (arg == "--gpu-memory") {
        std::string v = next();
        if (!parse_bytes(v, &o.gpu_memory) || o.gpu_memory == 0)
            usage_error(kProgram, "--gpu-memory: expected a size such as 24G or 8192M, found \"%s\"", v.c_str());
    } else if (arg == "--ctx") {
        std::string v = next();
        if (!parse_u32(v, &o.ctx)) usage_error(kProgram, "--ctx: expected a token count, found \"%s\"", v.c_str());
    } else {
        return false;
    }
    return true;
}

Options parse_args(int argc, char** argv) {
    Options o;
    if (const char* m = std::getenv("GPTOSS_MODEL"); m && *m) o.model_dir = m;
    if (const char* nc = std::getenv("NO_COLOR"); nc && *nc) o.color = false;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        std::string value;
        bool has_inline_value = false;
        if (arg.rfind("--", 0) == 0) {
            size_t eq = arg.find('=');
            if (eq != std::string::npos) {
                value = arg.substr(eq + 1);
                arg = arg.substr(0, eq);
                has_inline_value = true;
            }
        }
        auto next = [&]() -> std::string {
            if (has_inline_value) return value;
            if (i + 1 >= argc) usage_error(kProgram, "%s needs a value", arg.c_str());
            return argv[++i];
        };
        if (arg == "-h" || arg == "--help") { usage(stdout); std::exit(0); }
        else if (arg == "--version") print_version();
        else if (parse_model_option(arg, next, o)) continue;
        else if (arg == "-r" || arg == "--reasoning") {
            std::string v = next();
            if (!parse_effort(v, &o.effort)) usage_error(kProgram, "--reasoning: expected low, medium or high, found \"%s\"", v.c_str());
            o.effort_given = true;
        }
        else if (arg == "-s" || arg == "--system") o.system = next();
        else if (arg == "--temperature" || arg == "--top-p" || arg == "--top-k" || arg == "--seed" ||
                 arg == "--max-tokens") {
            std::string v = next(), err;
            if (!set_sampling_option(o, arg.substr(2), v, err))
                usage_error(kProgram, "%s: %s, found \"%s\"", arg.c_str(), err.c_str(), v.c_str());
        }
        else if (arg == "--tools") o.tools_file = next();
        else if (arg == "--tool-cmd") o.tool_cmd = next();
        else if (arg == "-p" || arg == "--prompt") o.prompt = next();
        else if (arg == "--json") o.json = true;
        else if (arg == "--conversation") o.conversation_file = next();
        else if (arg == "--hide-reasoning") o.hide_reasoning = true;
        else if (arg == "--json-schema") o.json_schema_file = next();
        else if (arg == "--tool-choice") o.tool_choice = next();
        else if (arg == "--max-reasoning-tokens") {
            std::string v = next();
            uint32_t n = 0;
            if (!parse_u32(v, &n) || n == UINT32_MAX)
                usage_error(kProgram, "--max-reasoning-tokens: expected a token count, found \"%s\"", v.c_str());
            o.max_reasoning_tokens = n;
        }
        else if (arg == "--no-color") o.color = false;
        else if (arg == "--history") o.history_file = next();
        else if (arg == "-v" || arg == "--verbose") o.verbose = true;
        else usage_error(kProgram, "unknown option \"%s\"", argv[i]);
    }
    return o;
}

// --- files and processes ---------------------------------------------------------------------

bool read_file(const std::string& path, std::string& out, std::string& err) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) { err = path + ": is a directory, expected a JSON file"; return false; }
    std::ifstream in(path, std::ios::binary);
    if (!in) { err = path + ": " + std::strerror(errno); return false; }
    std::ostringstream ss;
    ss << in.rdbuf();
    out = ss.str();
    return true;
}

bool write_file(const std::string& path, const std::string& text, std::string& err) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) { err = path + ": " + std::strerror(errno); return false; }
    out << text;
    out.close();
    if (!out) { err = path + ": write failed"; return false; }
    return true;
}

std::string home_dir() {
    const char* h = std::getenv("HOME");
    return h && *h ? h : ".";
}

std::string xdg_dir(const char* var, const char* fallback_under_home) {
    const char* v = std::getenv(var);
    if (v && *v) return v;
    return home_dir() + "/" + fallback_under_home;
}

std::string self_dir() {
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (ec) return ".";
    return exe.parent_path().string();
}

// Starts argv (the current environment plus extra_env) with stdin from in_pipe[0] and stdout to
// out_pipe[1] when `to_pipe`, else to our stderr; closes the child's ends here. Returns 0 or an
// errno value (the pipes' parent ends are then closed too).
int spawn_piped(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env, const int (&in_pipe)[2],
                const int (&out_pipe)[2], bool to_pipe, pid_t* pid) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in_pipe[0], 0);
    posix_spawn_file_actions_addclose(&actions, in_pipe[1]);
    if (to_pipe) {
        posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
        posix_spawn_file_actions_addclose(&actions, out_pipe[0]);
    } else {
        posix_spawn_file_actions_adddup2(&actions, 2, 1);
    }
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
    for (const std::string& e : extra_env) env_strings.push_back(e);
    std::vector<char*> envp, args;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (std::string& a : argv_copy) args.push_back(a.data());
    args.push_back(nullptr);
    const int rc = posix_spawnp(pid, args[0], &actions, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    close(in_pipe[0]);
    if (to_pipe) close(out_pipe[1]);
    if (rc != 0) {
        close(in_pipe[1]);
        if (to_pipe) close(out_pipe[0]);
    }
    return rc;
}

// Feeds in_text to in_fd and drains out_fd into *output together (either fd may be -1), closing
// each when done: a tool that answers before reading all of a large argument would otherwise
// deadlock against us.
void pump(int in_fd, int out_fd, const std::string& in_text, std::string* output) {
    size_t written = 0;
    if (in_text.empty() && in_fd >= 0) { close(in_fd); in_fd = -1; }
    signal(SIGPIPE, SIG_IGN);
    while (in_fd >= 0 || out_fd >= 0) {
        pollfd fds[2];
        int n = 0;
        if (in_fd >= 0) fds[n++] = {in_fd, POLLOUT, 0};
        if (out_fd >= 0) fds[n++] = {out_fd, POLLIN, 0};
        if (poll(fds, nfds_t(n), -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int k = 0; k < n; ++k) {
            if (fds[k].fd == in_fd && fds[k].revents) {
                ssize_t w = write(in_fd, in_text.data() + written, in_text.size() - written);
                if (w > 0) written += size_t(w);
                if (w < 0 && errno != EINTR && errno != EAGAIN) written = in_text.size();
                if (written >= in_text.size()) { close(in_fd); in_fd = -1; }
            } else if (fds[k].fd == out_fd && fds[k].revents) {
                char buf[4096];
                ssize_t r = read(out_fd, buf, sizeof buf);
                if (r > 0) output->append(buf, size_t(r));
                else if (r == 0 || (errno != EINTR && errno != EAGAIN)) { close(out_fd); out_fd = -1; }
            }
        }
    }
}

// Runs argv with stdin from `input` (if not null) and returns its exit status; its stdout is
// collected into *output when not null, else sent to our stderr, so one-shot stdout stays clean.
int run_process(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                const std::string* input, std::string* output) {
    int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1};
    if (pipe(in_pipe) != 0) return -1;
    if (output && pipe(out_pipe) != 0) { close(in_pipe[0]); close(in_pipe[1]); return -1; }
    pid_t pid = 0;
    const int rc = spawn_piped(argv, extra_env, in_pipe, out_pipe, output != nullptr, &pid);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    static const std::string empty;
    pump(in_pipe[1], output ? out_pipe[0] : -1, input ? *input : empty, output);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// --- conversation ----------------------------------------------------------------------------

// A --tools file is a JSON array of OpenAI tool definitions, or a request body holding "tools".
// Both go through the library's parser so there is one JSON mapping.
bool load_tools_file(const std::string& path, std::vector<Tool>& out, std::string& err) {
    std::string text;
    if (!read_file(path, text, err)) return false;
    size_t first = text.find_first_not_of(" \t\r\n");
    std::string body;
    if (first != std::string::npos && text[first] == '[') body = "{\"messages\":[],\"tools\":" + text + "}";
    else body = text;
    ParsedConversation parsed;
    if (!parse_conversation(body, path, parsed, err)) return false;
    if (parsed.conversation.tools.empty()) {
        err = path + ": no tools found, expected a JSON array of {\"type\":\"function\",\"function\":{...}}";
        return false;
    }
    out = parsed.conversation.tools;
    return true;
}

// --- terminal output -------------------------------------------------------------------------

struct Style {
    bool on = false;
    const char* dim() const { return on ? "\x1b[2m" : ""; }
    const char* italic() const { return on ? "\x1b[3m" : ""; }
    const char* bold() const { return on ? "\x1b[1m" : ""; }
    const char* tool() const { return on ? "\x1b[36m" : ""; }
    const char* error() const { return on ? "\x1b[31m" : ""; }
    const char* reset() const { return on ? "\x1b[0m" : ""; }
};

// Prints the streamed turn: analysis dimmed (or a placeholder with --hide-reasoning), tool
// calls in color with their recipient, final text plain. A new segment starts whenever the
// channel or the recipient changes.
// The length of the longest prefix of `s` that does not end inside a UTF-8 sequence.
size_t complete_utf8_prefix(const std::string& s) {
    size_t n = s.size();
    for (size_t back = 1; back <= 4 && back <= n; ++back) {
        unsigned char c = static_cast<unsigned char>(s[n - back]);
        if ((c & 0xc0) == 0x80) continue;  // a continuation byte: look further back
        size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
        return len > back ? n - back : n;
    }
    return n;
}

// A Harmony header is a few tokens ("<|channel|>final<|message|>", or about ten for a tool call
// with a content type). One that goes on longer is not a header: the model is off the format
// (always so for the random tiny model), and its tokens are shown raw rather than hidden.
constexpr size_t kMaxHeaderTokens = 24;

class StreamPrinter {
public:
    StreamPrinter(FILE* out, Style style, bool hide_reasoning, const gptoss_model* model)
        : out_(out), style_(style), hide_reasoning_(hide_reasoning), model_(model) {}

    void event(const gptoss_event* e) {
        if (e->channel == GPTOSS_CHANNEL_NONE && e->text_len == 0) {
            header_token(e->token);
            return;
        }
        header_.clear();
        raw_mode_ = false;
        if (e->text_len == 0) return;
        std::string recipient = e->recipient ? e->recipient : "";
        if (!open_ || e->channel != channel_ || recipient != recipient_) begin(e->channel, recipient);
        if (hidden_) return;
        write(e->text, e->text_len);
    }

    // Ends the turn's output on a fresh line with the style reset.
    void finish() {
        end_segment();
        std::fflush(out_);
    }

private:
    void write(const char* text, size_t len) {
        if (len == 0) return;
        std::fwrite(text, 1, len, out_);
        at_line_start_ = text[len - 1] == '\n';
        std::fflush(out_);
    }

    // A token outside message content (a header, or text between messages): held back while it
    // may be a header, shown dimmed once it clearly is not.
    void header_token(int32_t token) {
        header_.push_back(token);
        if (!raw_mode_ && header_.size() <= kMaxHeaderTokens) return;
        if (!raw_mode_) {
            raw_mode_ = true;
            raw_bytes_.clear();
        }
        size_t n = 0;
        std::string bytes(64, '\0');
        gptoss_status st = gptoss_detokenize(model_, header_.data(), header_.size(), bytes.data(), bytes.size(), &n);
        if (st == GPTOSS_ERR_BUFFER_TOO_SMALL) {
            bytes.assign(n + 1, '\0');
            st = gptoss_detokenize(model_, header_.data(), header_.size(), bytes.data(), bytes.size(), &n);
        }
        header_.clear();
        if (st != GPTOSS_OK) return;
        raw_bytes_.append(bytes.data(), n);
        // A token can end inside a character: print only complete ones (a stray byte goes after
        // four bytes, so the terminal shows a replacement mark rather than waiting forever).
        size_t complete = complete_utf8_prefix(raw_bytes_);
        if (raw_bytes_.size() - complete >= 4) complete = raw_bytes_.size();
        if (complete == 0) return;
        if (!open_ || channel_ != GPTOSS_CHANNEL_NONE || !recipient_.empty()) begin(GPTOSS_CHANNEL_NONE, "");
        write(raw_bytes_.data(), complete);
        raw_bytes_.erase(0, complete);
    }

    void end_segment() {
        if (!open_) return;
        if (hidden_ && style_.on) {
            std::fprintf(out_, "\r\x1b[K");  // erase the "thinking..." placeholder
        } else {
            std::fputs(style_.reset(), out_);
            if (!at_line_start_) std::fputc('\n', out_);
        }
        at_line_start_ = true;
        open_ = false;
    }

    void begin(gptoss_channel channel, const std::string& recipient) {
        end_segment();
        open_ = true;
        channel_ = channel;
        recipient_ = recipient;
        hidden_ = false;
        if (!recipient.empty()) {
            std::fprintf(out_, "%s%s-> %s%s %s", style_.tool(), style_.bold(), recipient.c_str(), style_.reset(),
                         style_.tool());
            at_line_start_ = false;
        } else if (channel == GPTOSS_CHANNEL_ANALYSIS) {
            if (hide_reasoning_) {
                hidden_ = true;
                if (style_.on) std::fprintf(out_, "%sthinking...%s", style_.dim(), style_.reset());
                at_line_start_ = !style_.on;
            } else {
                std::fputs(style_.dim(), out_);
            }
        } else if (channel == GPTOSS_CHANNEL_COMMENTARY) {
            std::fputs(style_.italic(), out_);
        } else if (channel == GPTOSS_CHANNEL_NONE) {
            // Text outside any parsed message (a malformed header): shown dimmed, as it is not
            // an answer, but not hidden, so a misbehaving model stays visible.
            std::fputs(style_.dim(), out_);
        }
        std::fflush(out_);
    }

    FILE* out_;
    Style style_;
    bool hide_reasoning_;
    const gptoss_model* model_;
    std::vector<int32_t> header_;   // tokens since the last content token
    bool raw_mode_ = false;         // this header ran past kMaxHeaderTokens
    std::string raw_bytes_;         // raw text not yet printed (an incomplete character)
    bool open_ = false, hidden_ = false, at_line_start_ = true;
    gptoss_channel channel_ = GPTOSS_CHANNEL_NONE;
    std::string recipient_;
};

// --- Ctrl-C ----------------------------------------------------------------------------------

volatile sig_atomic_t g_sigint = 0;
volatile sig_atomic_t g_generating = 0;
int g_cancel_pipe[2] = {-1, -1};

extern "C" void on_sigint(int) {
    int saved = errno;
    g_sigint = 1;
    if (g_generating && g_cancel_pipe[1] >= 0) {
        char c = 'c';
        ssize_t ignored = write(g_cancel_pipe[1], &c, 1);
        (void)ignored;
    }
    errno = saved;
}

// Calls gptoss_session_cancel() (thread-safe, but not documented as async-signal-safe) on
// behalf of the signal handler.
class Canceller {
public:
    explicit Canceller(gptoss_session* session) : session_(session) {
        if (pipe(g_cancel_pipe) != 0) return;
        fcntl(g_cancel_pipe[1], F_SETFL, O_NONBLOCK);
        thread_ = std::thread([this]() {
            char c = 0;
            for (;;) {
                ssize_t r = read(g_cancel_pipe[0], &c, 1);
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0 || c == 'q') break;
                gptoss_session_cancel(session_);
            }
        });
    }
    ~Canceller() {
        if (thread_.joinable()) {
            char c = 'q';
            while (write(g_cancel_pipe[1], &c, 1) < 0 && errno == EINTR) {}
            thread_.join();
        }
        if (g_cancel_pipe[0] >= 0) close(g_cancel_pipe[0]);
        if (g_cancel_pipe[1] >= 0) close(g_cancel_pipe[1]);
        g_cancel_pipe[0] = g_cancel_pipe[1] = -1;
    }

private:
    gptoss_session* session_;
    std::thread thread_;
};

void install_sigint_handler() {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a read at the prompt must return so Ctrl-C can exit
    sigaction(SIGINT, &sa, nullptr);
}

// --- input -----------------------------------------------------------------------------------

class LineReader {
public:
    LineReader(bool interactive, std::string history_path)
        : interactive_(interactive), history_path_(std::move(history_path)) {
#ifdef GPTOSS_HAVE_LIBEDIT
        if (interactive_) {
            rl_catch_signals = 0;  // our SIGINT handler decides what Ctrl-C means
            using_history();
            stifle_history(1000);
            if (!history_path_.empty()) {
                std::error_code ec;
                fs::create_directories(fs::path(history_path_).parent_path(), ec);
                read_history(history_path_.c_str());
            }
        }
#endif
    }

    // Reads one line without its newline. Returns false at end of input or on Ctrl-C
    // (then interrupted() is true).
    bool read(const char* prompt, std::string& line) {
        g_sigint = 0;
        line.clear();
#ifdef GPTOSS_HAVE_LIBEDIT
        if (interactive_) {
            char* s = readline(prompt);
            if (!s) return false;
            line = s;
            std::free(s);
            return !g_sigint;
        }
#endif
        if (interactive_) {
            std::fputs(prompt, stdout);
            std::fflush(stdout);
        }
        if (!std::getline(std::cin, line)) {
            std::cin.clear();
            return false;
        }
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return !g_sigint;
    }

    bool interrupted() const { return g_sigint != 0; }

    void remember(const std::string& entry) {
#ifdef GPTOSS_HAVE_LIBEDIT
        if (!interactive_ || entry.empty()) return;
        add_history(entry.c_str());
        // Written after every entry, so a crash or a kill keeps what was typed.
        if (!history_path_.empty()) write_history(history_path_.c_str());
#else
        (void)entry;
#endif
    }

private:
    bool interactive_;
    std::string history_path_;
};

// --- the chat --------------------------------------------------------------------------------

// A copy of what the library reported for one gptoss_chat() call (its result is borrowed).
struct TurnStats {
    bool valid = false;
    uint32_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    double prefill_ms = 0, decode_ms = 0;
    gptoss_stop_reason stop = GPTOSS_STOP_RETURN;
};

struct LastReply {
    std::string final, analysis;
    size_t raw_bytes = 0;            // of the completion text, all rounds
    std::vector<Message> messages;  // this turn's assistant messages, all rounds
    TurnStats stats;                 // of the last gptoss_chat() call
    bool valid = false;
};

enum class Mode { Interactive, Lines, OneShot };

class Chat {
public:
    Chat(Options opts, Mode mode, gptoss_model* model, gptoss_session* session, bool tiny_model)
        : opts_(std::move(opts)), mode_(mode), model_(model), session_(session), tiny_model_(tiny_model) {
        style_.on = opts_.color && mode_ == Mode::Interactive && isatty(STDOUT_FILENO);
        conv_.instructions = opts_.system;
        conv_.effort = opts_.effort;
        if (!opts_.max_tokens && tiny_model_) opts_.max_tokens = kTinyDefaultMaxTokens;
    }

    Conversation& conversation() { return conv_; }
    const LastReply& last() const { return last_; }

    // Adopts a parsed conversation file (--conversation, /load). Its instructions, tools and
    // effort replace ours where it has them; the command line wins where it was explicit.
    void adopt(ParsedConversation parsed, bool command_line) {
        Conversation& c = parsed.conversation;
        conv_.messages = std::move(c.messages);
        if (parsed.has_instructions && !(command_line && opts_.system)) conv_.instructions = c.instructions;
        if (!c.tools.empty() && !(command_line && tools_from_cli_)) conv_.tools = c.tools;
        if (!(command_line && opts_.effort_given)) conv_.effort = c.effort;
        conv_.tool_choice = c.tool_choice;
        conv_.tool_choice_name = c.tool_choice_name;
        conv_.response_format = c.response_format;
        conv_.response_format_name = c.response_format_name;
        conv_.response_format_description = c.response_format_description;
        conv_.response_format_schema = c.response_format_schema;
        conv_.max_reasoning_tokens = c.max_reasoning_tokens;
    }

    void set_cli_tools(std::vector<Tool> tools) {
        conv_.tools = std::move(tools);
        tools_from_cli_ = true;
    }

    void add_user(std::string text) {
        Message m;
        m.role = GPTOSS_ROLE_USER;
        m.content = std::move(text);
        conv_.messages.push_back(std::move(m));
    }

    // Generates the assistant's reply to the conversation, running tool rounds as needed.
    // Returns false on a library error (already reported).
    bool respond(LineReader* reader) {
        last_ = LastReply();
        for (int round = 0;; ++round) {
            int pending = resolve_tool_calls(reader);
            if (pending < 0) return true;  // the user abandoned the tool call, or nobody can answer it
            if (round >= kMaxToolRounds) {
                note("stopped after %d tool rounds in one turn", kMaxToolRounds);
                return true;
            }
            TurnStats stats;
            if (!generate_once(stats)) return false;
            if (stats.stop != GPTOSS_STOP_CALL || !has_pending_tool_calls()) return true;
        }
    }

    void print_help() const {
        std::printf(
            "commands:\n"
            "  /reset               forget the conversation (keeps instructions and tools)\n"
            "  /effort LEVEL        reasoning effort: low, medium or high (now %s)\n"
            "  /save FILE           write the conversation as OpenAI-style JSON\n"
            "  /load FILE           read a conversation written by /save (or any OpenAI-style\n"
            "                       messages file)\n"
            "  /set NAME VALUE      temperature, top_p, top_k, seed, max_tokens\n"
            "  /stats               model, settings and token statistics\n"
            "  /help                this text\n"
            "  /quit                exit (also Ctrl-D, or Ctrl-C at the prompt)\n"
            "input:\n"
            "  end a line with \\ to continue it on the next line; or type \"\"\" to start and\n"
            "  end a block of several lines. Ctrl-C stops a reply that is being written.\n",
            effort_name(conv_.effort));
    }

    void print_stats() const {
        gptoss_model_info info;
        std::memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        if (gptoss_model_get_info(model_, &info) == GPTOSS_OK) {
            std::printf("model     %s: %u layers, %u experts (%u active), vocab %u, context %u, %.1f MiB of weights, %s\n",
                        info.name ? info.name : "?", info.n_layers, info.n_experts, info.n_experts_per_token,
                        info.n_vocab, info.max_context, double(info.weight_bytes) / (1024.0 * 1024.0),
                        info.device == GPTOSS_DEVICE_CPU ? "CPU" : ("GPU " + std::to_string(info.device)).c_str());
        }
        std::printf("settings  effort %s, temperature %g, top_p %g, top_k %u, seed %s, max_tokens %s, ctx %s\n",
                    effort_name(conv_.effort), double(opts_.temperature), double(opts_.top_p), opts_.top_k,
                    opts_.seed == GPTOSS_SEED_RANDOM ? "random" : std::to_string(opts_.seed).c_str(),
                    opts_.max_tokens && *opts_.max_tokens ? std::to_string(*opts_.max_tokens).c_str() : "none",
                    opts_.ctx ? std::to_string(opts_.ctx).c_str() : "model maximum");
        std::printf("chat      %zu messages, %zu tools%s\n", conv_.messages.size(), conv_.tools.size(),
                    conv_.instructions ? ", developer instructions set" : "");
        std::printf("totals    %u turns, %llu prompt tokens (%llu cached), %llu generated; prefill %.1f s, decode %.1f s\n",
                    total_calls_, (unsigned long long)total_prompt_, (unsigned long long)total_cached_,
                    (unsigned long long)total_completion_, total_prefill_ms_ / 1000.0, total_decode_ms_ / 1000.0);
        if (last_stats_.valid) std::printf("last      %s\n", stats_line(last_stats_).c_str());
    }

    // Handles a line starting with '/'. Returns false when the chat should end.
    bool command(const std::string& line) {
        std::istringstream in(line);
        std::string cmd, arg;
        in >> cmd;
        std::getline(in >> std::ws, arg);
        while (!arg.empty() && (arg.back() == ' ' || arg.back() == '\t')) arg.pop_back();
        if (cmd == "/quit" || cmd == "/exit" || cmd == "/bye") return false;
        if (cmd == "/help" || cmd == "/?") { print_help(); return true; }
        if (cmd == "/reset" || cmd == "/clear") {
            conv_.messages.clear();
            say("conversation cleared");
            return true;
        }
        if (cmd == "/effort") {
            if (arg.empty()) { say("reasoning effort is %s", effort_name(conv_.effort)); return true; }
            if (!parse_effort(arg, &conv_.effort)) { complain("/effort: expected low, medium or high, found \"%s\"", arg.c_str()); return true; }
            say("reasoning effort: %s", effort_name(conv_.effort));
            return true;
        }
        if (cmd == "/save") {
            if (arg.empty()) { complain("/save: expected a file name"); return true; }
            std::string err;
            if (!write_file(arg, "{\n" + conversation_json_fields(conv_) + "\n}\n", err)) complain("/save: %s", err.c_str());
            else say("saved %zu messages to %s", conv_.messages.size(), arg.c_str());
            return true;
        }
        if (cmd == "/load") {
            if (arg.empty()) { complain("/load: expected a file name"); return true; }
            std::string text, err;
            ParsedConversation parsed;
            if (!read_file(arg, text, err) || !parse_conversation(text, arg, parsed, err)) {
                complain("/load: %s", err.c_str());
                return true;
            }
            adopt(std::move(parsed), /*command_line=*/false);
            say("loaded %zu messages from %s", conv_.messages.size(), arg.c_str());
            return true;
        }
        if (cmd == "/set") {
            std::istringstream a(arg);
            std::string name, value, err;
            a >> name >> value;
            if (name.empty() || value.empty()) { complain("/set: expected NAME VALUE, e.g. /set temperature 0.7"); return true; }
            if (!set_sampling_option(opts_, name, value, err)) complain("/set %s: %s, found \"%s\"", name.c_str(), err.c_str(), value.c_str());
            else say("%s = %s", name.c_str(), value.c_str());
            return true;
        }
        if (cmd == "/stats") { print_stats(); return true; }
        complain("unknown command %s; /help lists the commands (start a message with a space to send text "
                 "beginning with /)", cmd.c_str());
        return true;
    }

    // Prints the JSON result of the last reply (one-shot and line mode with --json).
    void print_json() const {
        std::string out = "{\n";
        out += conversation_json_fields(conv_) + ",\n";
        gptoss_model_info info;
        std::memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        if (gptoss_model_get_info(model_, &info) == GPTOSS_OK && info.name) out += "  \"model\": " + json_str(info.name) + ",\n";
        // The reply as one OpenAI assistant message, in the same shape as the history.
        Conversation reply;
        reply.messages = last_.messages;
        std::string reply_messages = messages_json(reply);  // "[{...}]" or "[]"
        std::string message = reply_messages.size() > 2 ? reply_messages.substr(1, reply_messages.size() - 2)
                                                         : "{\"role\":\"assistant\",\"content\":\"\"}";
        // Several tool rounds make several OpenAI messages; choices[0] is the last, as an API
        // reply would be, and "messages" above holds them all.
        size_t last_msg = message.rfind(",\n    {\"role\":\"assistant\"");
        if (last_msg != std::string::npos) message = message.substr(last_msg + 6);
        const TurnStats& s = last_.stats;
        out += "  \"choices\": [{\"index\": 0, \"message\": " + message + ", \"finish_reason\": " +
               json_str(finish_reason(s.stop)) + "}],\n";
        out += "  \"final\": " + json_str(last_.final) + ",\n";
        out += "  \"analysis\": " + json_str(last_.analysis) + ",\n";
        out += "  \"stop_reason\": " + json_str(stop_reason_name(s.stop)) + ",\n";
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "  \"usage\": {\"prompt_tokens\": %u, \"completion_tokens\": %u, \"total_tokens\": %u, "
                      "\"prompt_tokens_details\": {\"cached_tokens\": %u}},\n"
                      "  \"timings\": {\"prefill_ms\": %.3f, \"decode_ms\": %.3f}\n",
                      s.prompt_tokens, s.completion_tokens, s.prompt_tokens + s.completion_tokens, s.cached_tokens,
                      s.prefill_ms, s.decode_ms);
        out += buf;
        out += "}\n";
        std::fwrite(out.data(), 1, out.size(), stdout);
        std::fflush(stdout);
    }

    // Line mode prints each answer as one-shot mode does: the final text and a newline; a turn
    // without a final answer prints what it got instead of a blank line (no_final_note()).
    // One-shot mode writes that note on stderr, keeping stdout for answers.
    void print_final(FILE* note_stream) const {
        if (last_.final.empty()) {
            std::fprintf(note_stream, "%s\n", no_final_note().c_str());
            std::fflush(note_stream);
            return;
        }
        std::fwrite(last_.final.data(), 1, last_.final.size(), stdout);
        std::fputc('\n', stdout);
        std::fflush(stdout);
    }

    // "[no final answer: 12 tokens (analysis: 40 bytes, 1 tool call), stop: max tokens]": the
    // turn's completion tokens, what the parsed messages hold, else the size of the raw text
    // (a model that writes no Harmony message at all, like the random tiny one).
    std::string no_final_note() const {
        size_t tool_calls = 0, commentary = 0;
        for (const Message& m : last_.messages) {
            if (m.recipient) ++tool_calls;
            else if (m.channel == GPTOSS_CHANNEL_COMMENTARY) commentary += m.content.size();
        }
        std::string parts;
        auto add = [&](const std::string& part) { parts += (parts.empty() ? "" : ", ") + part; };
        if (!last_.analysis.empty()) add("analysis: " + std::to_string(last_.analysis.size()) + " bytes");
        if (commentary) add("commentary: " + std::to_string(commentary) + " bytes");
        if (tool_calls) add(std::to_string(tool_calls) + (tool_calls == 1 ? " tool call" : " tool calls"));
        if (parts.empty()) add("no Harmony message; raw text: " + std::to_string(last_.raw_bytes) + " bytes");
        return "[no final answer: " + std::to_string(last_.stats.completion_tokens) + " tokens (" + parts +
               "), stop: " + stop_reason_name(last_.stats.stop) + "]";
    }

    static std::string stats_line(const TurnStats& s) {
        uint32_t computed = s.prompt_tokens - std::min(s.cached_tokens, s.prompt_tokens);
        double prefill_tps = s.prefill_ms > 0 ? computed * 1000.0 / s.prefill_ms : 0;
        double decode_tps = s.decode_ms > 0 ? s.completion_tokens * 1000.0 / s.decode_ms : 0;
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "%u prompt tokens (%u cached), prefill %.1f tok/s; %u tokens, decode %.1f tok/s; stop: %s",
                      s.prompt_tokens, s.cached_tokens, prefill_tps, s.completion_tokens, decode_tps,
                      stop_reason_name(s.stop));
        return buf;
    }

private:
    __attribute__((format(printf, 2, 3))) void say(const char* format, ...) const {
        // Outside a terminal, stdout holds only replies, so scripts can read them.
        FILE* out = mode_ == Mode::Interactive ? stdout : stderr;
        va_list args;
        va_start(args, format);
        std::fflush(stdout);
        std::fputs(style_.dim(), out);
        std::vfprintf(out, format, args);
        std::fputs(style_.reset(), out);
        std::fputc('\n', out);
        std::fflush(out);
        va_end(args);
    }

    __attribute__((format(printf, 2, 3))) void complain(const char* format, ...) const {
        va_list args;
        va_start(args, format);
        std::fflush(stdout);
        std::fprintf(stderr, "%s", style_.error());
        if (mode_ != Mode::Interactive) std::fprintf(stderr, "%s: ", kProgram);
        std::vfprintf(stderr, format, args);
        std::fprintf(stderr, "%s\n", style_.reset());
        va_end(args);
    }

    __attribute__((format(printf, 2, 3))) void note(const char* format, ...) const {
        va_list args;
        va_start(args, format);
        std::fflush(stdout);
        std::fprintf(stderr, "%s: ", kProgram);
        std::vfprintf(stderr, format, args);
        std::fputc('\n', stderr);
        va_end(args);
    }

    // The tool calls at the end of the history that have no result yet.
    bool has_pending_tool_calls() const {
        return !conv_.messages.empty() && conv_.messages.back().role == GPTOSS_ROLE_ASSISTANT &&
               conv_.messages.back().recipient.has_value();
    }

    // Answers the pending tool calls: by --tool-cmd, or by asking the user. Returns the number
    // answered, or -1 if they stay unanswered.
    int resolve_tool_calls(LineReader* reader) {
        if (!has_pending_tool_calls()) return 0;
        size_t first = conv_.messages.size();
        while (first > 0 && conv_.messages[first - 1].role == GPTOSS_ROLE_ASSISTANT) --first;
        std::vector<Message> calls;
        for (size_t i = first; i < conv_.messages.size(); ++i)
            if (conv_.messages[i].recipient) calls.push_back(conv_.messages[i]);
        for (const Message& call : calls) {
            std::string result;
            const std::string& recipient = *call.recipient;
            if (!opts_.tool_cmd.empty()) {
                std::string output;
                int rc = run_process({"/bin/sh", "-c", opts_.tool_cmd},
                                     {"GPTOSS_TOOL_NAME=" + function_name(recipient), "GPTOSS_TOOL_RECIPIENT=" + recipient},
                                     &call.content, &output);
                while (!output.empty() && output.back() == '\n') output.pop_back();
                if (rc != 0) {
                    note("--tool-cmd for %s exited with status %d", recipient.c_str(), rc);
                    result = "error: the tool failed (exit status " + std::to_string(rc) + ")" +
                             (output.empty() ? "" : ": " + output);
                } else {
                    result = output;
                }
                if (mode_ == Mode::Interactive)
                    std::printf("%s<- %s%s %s%s\n", style_.tool(), recipient.c_str(), style_.reset(), style_.dim(),
                                (result + style_.reset()).c_str());
            } else if (mode_ == Mode::OneShot || !reader) {
                // Nobody to ask: leave the call in the output (finish_reason "tool_calls").
                return -1;
            } else {
                std::string prompt = recipient + " result> ";
                if (!read_input(*reader, prompt.c_str(), "... ", result)) {
                    if (mode_ == Mode::Interactive) std::printf("\n");
                    say("tool call left unanswered");
                    return -1;
                }
            }
            Message m;
            m.role = GPTOSS_ROLE_TOOL;
            m.channel = GPTOSS_CHANNEL_COMMENTARY;
            m.author = recipient;
            m.content = result;
            conv_.messages.push_back(std::move(m));
        }
        return int(calls.size());
    }

    static bool on_event(void* user_data, const gptoss_event* event) {
        if (g_sigint) return false;
        auto* printer = static_cast<StreamPrinter*>(user_data);
        if (printer) printer->event(event);
        return true;
    }

    // The chat request for the conversation so far; `msgs` and `tools` hold what it points to.
    gptoss_chat_request build_request(std::vector<gptoss_message>* msgs, std::vector<gptoss_tool>* tools) const {
        msgs->reserve(conv_.messages.size());
        for (const Message& m : conv_.messages) {
            gptoss_message g;
            std::memset(&g, 0, sizeof g);
            g.role = m.role;
            g.channel = m.channel;
            g.content = m.content.c_str();
            g.author = m.author ? m.author->c_str() : nullptr;
            g.recipient = m.recipient ? m.recipient->c_str() : nullptr;
            g.content_type = m.content_type ? m.content_type->c_str() : nullptr;
            msgs->push_back(g);
        }
        for (const Tool& t : conv_.tools)
            tools->push_back({t.name.c_str(), t.description.c_str(), t.parameters ? t.parameters->c_str() : nullptr});
        gptoss_chat_request req = gptoss_chat_default_request();
        req.messages = msgs->data();
        req.n_messages = msgs->size();
        req.instructions = conv_.instructions ? conv_.instructions->c_str() : nullptr;
        req.tools = tools->data();
        req.n_tools = tools->size();
        req.reasoning_effort = conv_.effort;
        // The conversation file's tool_choice / response_format, unless the command line set them.
        req.response_format = conv_.response_format;
        if (conv_.response_format == GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA) {
            req.response_format_name = conv_.response_format_name.c_str();
            if (!conv_.response_format_description.empty())
                req.response_format_description = conv_.response_format_description.c_str();
            req.response_format_schema = conv_.response_format_schema.c_str();
        }
        req.tool_choice = conv_.tool_choice;
        if (conv_.tool_choice == GPTOSS_TOOL_CHOICE_NAMED) req.tool_choice_name = conv_.tool_choice_name.c_str();
        req.max_reasoning_tokens = opts_.max_reasoning_tokens.value_or(conv_.max_reasoning_tokens);
        if (!opts_.json_schema.empty()) {
            req.response_format = GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA;
            req.response_format_name = "response";
            req.response_format_description = nullptr;
            req.response_format_schema = opts_.json_schema.c_str();
        }
        if (opts_.tool_choice == "none") req.tool_choice = GPTOSS_TOOL_CHOICE_NONE;
        else if (opts_.tool_choice == "required") req.tool_choice = GPTOSS_TOOL_CHOICE_REQUIRED;
        else if (opts_.tool_choice != "auto") {
            req.tool_choice = GPTOSS_TOOL_CHOICE_NAMED;
            req.tool_choice_name = opts_.tool_choice.c_str();
        }
        return req;
    }

    gptoss_sampling_params sampling_params() const {
        gptoss_sampling_params sp = gptoss_sampling_default_params();
        sp.temperature = opts_.temperature;
        sp.top_p = opts_.top_p;
        sp.top_k = opts_.top_k;
        sp.seed = opts_.seed;
        sp.max_tokens = opts_.max_tokens.value_or(0);
        return sp;
    }

    // A reply into the conversation, the last reply (/json, --json) and the session totals.
    void record_result(const gptoss_chat_result& result, TurnStats& stats) {
        stats.valid = true;
        stats.prompt_tokens = result.n_prompt_tokens;
        stats.cached_tokens = result.n_cached_tokens;
        stats.completion_tokens = result.n_completion_tokens;
        stats.prefill_ms = result.prefill_ms;
        stats.decode_ms = result.decode_ms;
        stats.stop = result.stop_reason;
        for (size_t i = 0; i < result.n_messages; ++i) {
            Message m = copy_message(result.messages[i]);
            last_.messages.push_back(m);
            conv_.messages.push_back(std::move(m));
        }
        if (result.final && *result.final) last_.final = result.final;
        if (result.raw) last_.raw_bytes += std::strlen(result.raw);
        if (result.analysis && *result.analysis) {
            if (!last_.analysis.empty()) last_.analysis += "\n";
            last_.analysis += result.analysis;
        }
        last_.stats = stats;
        last_.valid = true;
        last_stats_ = stats;
        ++total_calls_;
        total_prompt_ += stats.prompt_tokens;
        total_cached_ += stats.cached_tokens;
        total_completion_ += stats.completion_tokens;
        total_prefill_ms_ += stats.prefill_ms;
        total_decode_ms_ += stats.decode_ms;
    }

    // The end of a streamed turn: [stopped] after Ctrl-C, the stats line, a full-context note.
    void print_turn_end(const TurnStats& stats) const {
        // The terminal echoes Ctrl-C as "^C" wherever the cursor is; write over it.
        if (stats.stop == GPTOSS_STOP_CANCELLED)
            std::printf("%s%s[stopped]%s\n", isatty(STDOUT_FILENO) ? "\r\x1b[K" : "", style_.bold(), style_.reset());
        std::printf("%s[%s]%s\n", style_.dim(), stats_line(stats).c_str(), style_.reset());
        if (stats.stop == GPTOSS_STOP_CONTEXT_FULL) note("the context is full: /reset, or start with a larger --ctx");
        std::fflush(stdout);
    }

    bool generate_once(TurnStats& stats) {
        std::vector<gptoss_message> msgs;
        std::vector<gptoss_tool> tools;
        const gptoss_chat_request req = build_request(&msgs, &tools);
        const gptoss_sampling_params sp = sampling_params();
        // Only a person at a terminal sees the turn as it is written; scripts get answers.
        const bool stream = mode_ == Mode::Interactive && !opts_.json;
        StreamPrinter printer(stdout, style_, opts_.hide_reasoning, model_);
        const gptoss_chat_result* result = nullptr;
        g_sigint = 0;
        g_generating = 1;
        gptoss_status st = gptoss_chat(session_, &req, &sp, on_event, stream ? &printer : nullptr, &result);
        g_generating = 0;
        if (stream) printer.finish();
        if (st != GPTOSS_OK) {
            complain("generation failed: %s", gptoss_last_error());
            if (st == GPTOSS_ERR_CONTEXT_FULL)
                note("hint: the conversation no longer fits in the context; /reset, or start with a larger --ctx");
            else if (st == GPTOSS_ERR_DEVICE)
                note("hint: the GPU failed and the model cannot be used any more; restart %s", kProgram);
            return false;
        }
        record_result(*result, stats);
        if (stream) print_turn_end(stats);
        return true;
    }

public:
    // Reads one user input, joining continuation lines ("\" at the end) and """ blocks.
    // Returns false at end of input or on Ctrl-C.
    static bool read_input(LineReader& reader, const char* prompt, const char* more, std::string& text) {
        text.clear();
        std::string line;
        if (!reader.read(prompt, line)) return false;
        std::string trimmed = line;
        trimmed.erase(0, trimmed.find_first_not_of(" \t"));
        if (trimmed.rfind("\"\"\"", 0) == 0) {
            // A block: everything up to a line ending in """ (which may be the first line).
            std::string rest = trimmed.substr(3);
            for (;;) {
                size_t end = rest.rfind("\"\"\"");
                bool closes = end != std::string::npos && rest.find_last_not_of(" \t") == end + 2;
                if (closes) {
                    text += rest.substr(0, end);
                    break;
                }
                text += rest + "\n";
                if (!reader.read(more, rest)) return false;
            }
            // The opening line holds only the quotes in the usual case; drop that empty line.
            if (!text.empty() && text[0] == '\n') text.erase(0, 1);
            return true;
        }
        while (!line.empty() && line.back() == '\\') {
            line.pop_back();
            text += line + "\n";
            if (!reader.read(more, line)) return false;
        }
        text += line;
        return true;
    }

private:
    Options opts_;
    Mode mode_;
    gptoss_model* model_;
    gptoss_session* session_;
    bool tiny_model_;
    bool tools_from_cli_ = false;
    Style style_;
    Conversation conv_;
    LastReply last_;
    TurnStats last_stats_;
    uint32_t total_calls_ = 0;
    uint64_t total_prompt_ = 0, total_cached_ = 0, total_completion_ = 0;
    double total_prefill_ms_ = 0, total_decode_ms_ = 0;
};

// --- model loading ---------------------------------------------------------------------------

struct Progress {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    bool tty = isatty(STDERR_FILENO);
    bool drawn = false;
};

bool on_progress(void* user_data, float fraction) {
    auto* p = static_cast<Progress*>(user_data);
    if (!p->tty) return true;
    // Only loads that take more than a moment get a bar; the tiny model loads in milliseconds.
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - p->start).count();
    if (elapsed < 0.3 && !p->drawn) return true;
    fraction = std::clamp(fraction, 0.0f, 1.0f);
    const int width = 40;
    int filled = int(fraction * width + 0.5f);
    std::fprintf(stderr, "\rloading [%.*s%*s] %3d%%  %.0f s", filled, "########################################",
                 width - filled, "", int(fraction * 100 + 0.5f), elapsed);
    std::fflush(stderr);
    p->drawn = true;
    return true;
}

// Says what went wrong in the user's terms, after the library's own message.
void load_hint(gptoss_status st, const std::string& dir, int32_t device) {
    std::error_code ec;
    switch (st) {
        case GPTOSS_ERR_IO:
            if (!fs::exists(dir, ec))
                std::fprintf(stderr, "hint: %s does not exist. Download a model first, for example:\n"
                                     "  huggingface-cli download openai/gpt-oss-20b --exclude 'original/*' 'metal/*' --local-dir ~/gpt-oss-20b\n"
                                     "then run: %s --model ~/gpt-oss-20b\n", dir.c_str(), kProgram);
            else
                std::fprintf(stderr, "hint: --model expects a Hugging Face checkpoint directory holding config.json, "
                                     "tokenizer.json and model*.safetensors\n");
            break;
        case GPTOSS_ERR_FORMAT:
            std::fprintf(stderr, "hint: %s does not look like a gpt-oss checkpoint (gpt-oss-20b or gpt-oss-120b in "
                                 "Hugging Face layout); a partial download also looks like this\n", dir.c_str());
            break;
        case GPTOSS_ERR_OUT_OF_MEMORY:
            std::fprintf(stderr, "hint: not enough %s memory. gpt-oss-20b needs about 14 GB of GPU memory and "
                                 "gpt-oss-120b about 65 GB; close other GPU programs, pick another GPU with --device N, "
                                 "lower --ctx, or keep experts in host memory with --n-cpu-moe auto\n", device == GPTOSS_DEVICE_CPU ? "host" : "GPU");
            break;
        case GPTOSS_ERR_UNSUPPORTED:
            std::fprintf(stderr, "hint: this build or this GPU cannot run the model; --device cpu runs the (slow) CPU "
                                 "reference backend\n");
            break;
        case GPTOSS_ERR_DEVICE:
            std::fprintf(stderr, "hint: the GPU reported an error; check nvidia-smi, or try --device cpu\n");
            break;
        default:
            break;
    }
}

// The default model: a tiny checkpoint with random weights and the real tokenizer, written
// once by gptoss-synth (built next to this program) into the cache.
bool ensure_tiny_model(std::string& dir) {
    dir = xdg_dir("XDG_CACHE_HOME", ".cache") + "/gptoss/models/tiny-v1";
    std::error_code ec;
    if (fs::exists(dir + "/config.json", ec)) return true;
    std::string tokenizer_dir = xdg_dir("GPTOSS_TOKENIZER_DIR", ".cache/gptoss/tokenizer-gptoss");
    if (!fs::exists(tokenizer_dir + "/tokenizer.json", ec)) {
        std::fprintf(stderr, "%s: no --model given, and the default tiny model needs the gpt-oss tokenizer, which is "
                             "not in %s\nhint: run `make` (or `bash tools/fetch-tokenizer.sh`) in the gptoss source "
                             "tree, or pass --model DIR\n", kProgram, tokenizer_dir.c_str());
        return false;
    }
    std::string synth = self_dir() + "/gptoss-synth";
    if (!fs::exists(synth, ec)) synth = "gptoss-synth";  // from PATH
    std::fprintf(stderr, "%s: no --model given; writing the default tiny model to %s (once)\n", kProgram, dir.c_str());
    std::string tmp = dir + ".tmp-" + std::to_string(getpid());
    fs::create_directories(fs::path(dir).parent_path(), ec);
    // gptoss-synth's report names the temporary directory; it is shown only if something failed.
    std::string report;
    int rc = run_process({synth, "--preset", "tiny", "--seed", "1", "--out", tmp, "--tokenizer-dir", tokenizer_dir},
                         {}, nullptr, &report);
    if (rc != 0) {
        std::fputs(report.c_str(), stderr);
        fs::remove_all(tmp, ec);
        if (rc < 0)
            std::fprintf(stderr, "%s: could not run %s: %s\nhint: gptoss-synth is built next to %s by `make`; "
                                 "or pass --model DIR\n", kProgram, synth.c_str(), std::strerror(errno), kProgram);
        else
            std::fprintf(stderr, "%s: %s could not write the tiny model (exit status %d)\n", kProgram, synth.c_str(), rc);
        return false;
    }
    // Renamed into place only when complete, so an interrupted first run is not mistaken
    // for a model; a concurrent first run may have won the race, which is fine.
    fs::rename(tmp, dir, ec);
    if (ec) fs::remove_all(tmp, ec);
    return fs::exists(dir + "/config.json", ec);
}

void tiny_model_notice() {
    std::fprintf(stderr,
                 "note: this is the default tiny model. Its weights are random, so its replies are nonsense: it\n"
                 "      shows that everything works without a download. For real answers, get gpt-oss-20b\n"
                 "      (Hugging Face layout: config.json, tokenizer.json, model-*.safetensors), e.g.\n"
                 "        huggingface-cli download openai/gpt-oss-20b --exclude 'original/*' 'metal/*' --local-dir ~/gpt-oss-20b\n"
                 "      and run: %s --model ~/gpt-oss-20b\n", kProgram);
}

extern "C" void log_to_stderr(void*, gptoss_log_level level, const char* message) {
    static const char* names[] = {"debug", "info", "warn", "error"};
    std::fprintf(stderr, "gptoss %s: %s\n", names[std::clamp(int(level), 0, 3)], message);
}

// --- modes -----------------------------------------------------------------------------------

int run_oneshot(Chat& chat, const Options& o) {
    std::string text = *o.prompt;
    if (!isatty(STDIN_FILENO)) {
        std::ostringstream ss;
        ss << std::cin.rdbuf();
        std::string piped = ss.str();
        while (!piped.empty() && (piped.back() == '\n' || piped.back() == '\r')) piped.pop_back();
        if (!piped.empty()) text = text.empty() ? piped : text + "\n\n" + piped;
    }
    // An empty prompt adds no user message: the model continues the --conversation as it is
    // (for example after pending tool calls).
    if (!text.empty()) chat.add_user(text);
    else if (chat.conversation().messages.empty()) {
        std::fprintf(stderr, "%s: -p: the prompt is empty and there is no --conversation to continue\n", kProgram);
        return 2;
    }
    if (!chat.respond(nullptr)) return 1;
    if (o.json) {
        chat.print_json();
    } else {
        chat.print_final(stderr);
    }
    return 0;
}

int run_loop(Chat& chat, const Options& o, Mode mode) {
    std::string history = o.history_file;
    if (history.empty()) history = xdg_dir("XDG_STATE_HOME", ".local/state") + "/gptoss/chat_history";
    LineReader reader(mode == Mode::Interactive, history);
    if (mode == Mode::Interactive)
        std::printf("Type a message, or /help for commands. Ctrl-C stops a reply; Ctrl-D exits.\n");
    // A conversation that ends in unanswered tool calls (from --conversation) continues first.
    if (!chat.conversation().messages.empty() && chat.conversation().messages.back().role == GPTOSS_ROLE_ASSISTANT &&
        chat.conversation().messages.back().recipient) {
        chat.respond(&reader);
        if (o.json) chat.print_json();
    }
    for (;;) {
        std::string text;
        if (!Chat::read_input(reader, ">>> ", "... ", text)) {
            if (mode == Mode::Interactive) std::printf("\n");
            break;
        }
        if (text.find_first_not_of(" \t\n") == std::string::npos) continue;
        reader.remember(text);
        if (text[0] == '/') {
            if (!chat.command(text)) break;
            continue;
        }
        chat.add_user(text);
        if (!chat.respond(&reader)) {
            if (mode != Mode::Interactive) return 1;
            continue;
        }
        if (o.json) chat.print_json();
        else if (mode == Mode::Lines) chat.print_final(stdout);
    }
    return 0;
}

}  // namespace

// --tools, --json-schema and --conversation, read before the model loads (a typo should not cost
// a load); false after saying what is wrong.
bool read_input_files(Options& o, std::vector<Tool>* cli_tools, std::optional<ParsedConversation>* start) {
    std::string err;
    if (!o.tools_file.empty() && !load_tools_file(o.tools_file, *cli_tools, err)) {
        std::fprintf(stderr, "%s: --tools %s\n", kProgram, err.c_str());
        return false;
    }
    if (!o.json_schema_file.empty() && !read_file(o.json_schema_file, o.json_schema, err)) {
        std::fprintf(stderr, "%s: --json-schema %s\n", kProgram, err.c_str());
        return false;
    }
    if (!o.conversation_file.empty()) {
        std::string text;
        ParsedConversation parsed;
        if (!read_file(o.conversation_file, text, err) || !parse_conversation(text, o.conversation_file, parsed, err)) {
            std::fprintf(stderr, "%s: --conversation %s\n", kProgram, err.c_str());
            return false;
        }
        *start = std::move(parsed);
    }
    return true;
}

// The model from `dir` with the command line's device options, or null after saying why.
gptoss_model* load_model(Options& o, const std::string& dir) {
    Progress progress;
    gptoss_model_params mp = gptoss_model_default_params();
    mp.device = o.device;
    mp.devices = o.devices.empty() ? nullptr : o.devices.data();
    mp.n_devices = o.devices.size();
    mp.n_cpu_moe = o.n_cpu_moe;
    mp.gpu_memory_budget = o.gpu_memory;
    if (o.n_cpu_moe == GPTOSS_CPU_MOE_AUTO && o.ctx == 0) o.ctx = 32768;  // what auto fits by default
    mp.fit_context = o.ctx;
    mp.progress = on_progress;
    mp.progress_user_data = &progress;
    gptoss_model* model = nullptr;
    const gptoss_status st = gptoss_load(dir.c_str(), &mp, &model);
    if (progress.drawn) std::fprintf(stderr, "\r\x1b[K");
    if (st != GPTOSS_OK) {
        std::fprintf(stderr, "%s: cannot load the model from %s: %s\n", kProgram, dir.c_str(), gptoss_last_error());
        load_hint(st, dir, o.device);
        return nullptr;
    }
    return model;
}

// The interactive session's first line: the model, where it runs, its context.
void print_banner(const Options& o, const gptoss_model* model) {
    gptoss_model_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (gptoss_model_get_info(model, &info) != GPTOSS_OK) return;
    std::printf("%s %s on %s, %u layers%s, context %u\n", kProgram, info.name ? info.name : "?",
                info.device == GPTOSS_DEVICE_CPU ? "the CPU" : ("GPU " + std::to_string(info.device)).c_str(),
                info.n_layers,
                info.n_cpu_moe ? (" (the experts of " + std::to_string(info.n_cpu_moe) + " in host memory, " +
                                  std::to_string(info.host_weight_bytes / 1000000) + " MB)").c_str()
                               : "",
                o.ctx ? o.ctx : info.max_context);
}

int main(int argc, char** argv) {
    Options o = parse_args(argc, argv);
    if (o.verbose) gptoss_set_log_callback(log_to_stderr, nullptr, GPTOSS_LOG_INFO);
    if (gptoss_version() / 1000000 != GPTOSS_VERSION_MAJOR) {
        std::fprintf(stderr, "%s: libgptoss version %u does not match this program (%s)\n", kProgram, gptoss_version(),
                     GPTOSS_VERSION_STRING);
        return 1;
    }
    Mode mode = o.prompt ? Mode::OneShot : isatty(STDIN_FILENO) ? Mode::Interactive : Mode::Lines;
    std::vector<Tool> cli_tools;
    std::optional<ParsedConversation> start;
    if (!read_input_files(o, &cli_tools, &start)) return 2;

    bool tiny = o.model_dir.empty();
    std::string dir = o.model_dir;
    if (tiny && !ensure_tiny_model(dir)) return 1;
    if (!tiny && !dir.empty() && dir[0] == '~') dir = home_dir() + dir.substr(1);
    gptoss_model* model = load_model(o, dir);
    if (model == nullptr) return 1;
    gptoss_session_params sp = gptoss_session_default_params();
    sp.max_context = o.ctx;
    gptoss_session* session = nullptr;
    const gptoss_status st = gptoss_session_create(model, &sp, &session);
    if (st != GPTOSS_OK) {
        std::fprintf(stderr, "%s: cannot create a session: %s\n", kProgram, gptoss_last_error());
        if (st == GPTOSS_ERR_OUT_OF_MEMORY) std::fprintf(stderr, "hint: the KV cache does not fit; lower --ctx\n");
        gptoss_model_free(model);
        return 1;
    }
    if (tiny) tiny_model_notice();
    if (mode == Mode::Interactive) print_banner(o, model);

    int rc = 0;
    {
        Chat chat(o, mode, model, session, tiny);
        if (!cli_tools.empty()) chat.set_cli_tools(std::move(cli_tools));
        if (start) chat.adopt(std::move(*start), /*command_line=*/true);
        Canceller canceller(session);
        install_sigint_handler();
        rc = mode == Mode::OneShot ? run_oneshot(chat, o) : run_loop(chat, o, mode);
        signal(SIGINT, SIG_DFL);
    }
    gptoss_session_free(session);
    gptoss_model_free(model);
    return rc;
}
