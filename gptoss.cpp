// gptoss.cpp - the engine core and the C entry points of gptoss.h (except chat, which lives
// in gptoss-harmony.cpp, and loading, in gptoss-loader.cpp).
// Sections: errors & logging | extensible structs | model | session | generation loop
// (KV prefix reuse, sliding-window snapshot, sampling, streaming) | tokenizer shims.
// Every extern "C" function is a thin shim: check arguments, catch everything, return a status.
// Invariant: session->cached lists exactly the tokens whose K/V the backend's cache holds
// (for sliding layers: the last `sliding_window` of them), at positions 0..n-1; the first
// session->n_prefilled of them were written by the prefill path (BackendSession::forward).
// "Same arguments + seed -> same tokens, reused == fresh" rests on two facts: prefill is
// chunk-invariant, and only prefill-written K/V is ever reused -- positions a decode step
// wrote are prefilled again by the next call that reuses the prefix (decode kernels sum in
// an order of their own, so their K/V differ from prefill's within bf16 rounding).
#include "gptoss-internal.h"
#include "gptoss-offload.h"
#include "gptoss-shard.h"

#include "tokenizer/chat-json.h"  // defines: first_invalid_utf8
#include "tokenizer/tokenizer.h"  // defines: Tokenizer, Utf8StreamDecoder

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <sys/stat.h>

namespace gptoss {

// ---------------------------------------------------------------------------
// Errors and logging

static thread_local std::string t_last_error;

std::string escape_nonprintable(std::string_view text) {
    static const char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        const uint8_t c = uint8_t(text[i]);
        size_t n = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (n > 1 && (i + n > text.size() || first_invalid_utf8(text.data() + i, n) != n)) n = 0;
        if (n == 0 || c < 0x20 || c == 0x7f) {
            out += "\\x";
            out += kHex[c >> 4];
            out += kHex[c & 15];
            ++i;
        } else {
            out.append(text.data() + i, n);
            i += n;
        }
    }
    return out;
}

gptoss_status fail(gptoss_status status, const char* format, ...) {
    char buffer[2048];
    va_list args;
    va_start(args, format);
    vsnprintf(buffer, sizeof buffer, format, args);
    va_end(args);
    t_last_error = escape_nonprintable(buffer);
    log(GPTOSS_LOG_DEBUG, "error: %s", t_last_error.c_str());
    return status;
}

void clear_error() { t_last_error.clear(); }

static gptoss_log_fn g_log_fn = nullptr;
static void* g_log_user_data = nullptr;
static gptoss_log_level g_log_min_level = GPTOSS_LOG_ERROR;

// GPTOSS_LOG=debug|info|warn|error prints to stderr when no callback is installed: a
// debugging aid only (API.md §8); it never changes results.
static int env_log_level() {
    static const int level = [] {
        const char* env = std::getenv("GPTOSS_LOG");
        if (env == nullptr) return -1;
        if (!strcmp(env, "debug")) return int(GPTOSS_LOG_DEBUG);
        if (!strcmp(env, "info")) return int(GPTOSS_LOG_INFO);
        if (!strcmp(env, "warn")) return int(GPTOSS_LOG_WARN);
        if (!strcmp(env, "error")) return int(GPTOSS_LOG_ERROR);
        return -1;
    }();
    return level;
}

void log(gptoss_log_level level, const char* format, ...) {
    const bool to_callback = g_log_fn != nullptr && level >= g_log_min_level;
    const bool to_stderr = g_log_fn == nullptr && env_log_level() >= 0 && int(level) >= env_log_level();
    if (!to_callback && !to_stderr) return;
    char buffer[2048];
    va_list args;
    va_start(args, format);
    vsnprintf(buffer, sizeof buffer, format, args);
    va_end(args);
    const std::string line = escape_nonprintable(buffer);
    if (to_callback) {
        g_log_fn(g_log_user_data, level, line.c_str());
    } else {
        static const char* const kNames[] = {"debug", "info", "warn", "error"};
        fprintf(stderr, "gptoss %s: %s\n", kNames[level], line.c_str());
    }
}

#ifdef GPTOSS_FAULT_INJECTION
static std::atomic<uint64_t> g_fault_countdown{0};
void fault_inject_after(uint64_t n) { g_fault_countdown.store(n); }
void fault_point() {
    uint64_t n = g_fault_countdown.load();
    while (n != 0 && !g_fault_countdown.compare_exchange_weak(n, n - 1)) {}
    if (n == 1) throw std::bad_alloc();
}
#endif

// ---------------------------------------------------------------------------
// Extensible structs (API.md §3)

gptoss_status read_extensible(const void* in, size_t sizeof_t, void* out, const char* what) {
    uint32_t struct_size;
    std::memcpy(&struct_size, in, sizeof struct_size);
    if (struct_size < sizeof(uint32_t))
        return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                    "%s: struct_size is %u; initialise the struct with its *_init function", what, struct_size);
    const unsigned char* bytes = static_cast<const unsigned char*>(in);
    for (size_t i = sizeof_t; i < struct_size; i++)
        if (bytes[i] != 0)
            return fail(GPTOSS_ERR_UNSUPPORTED,
                        "%s: byte %zu is set, but this library (%s) knows only the first %zu bytes of the "
                        "struct: a field of a newer gptoss.h is not supported",
                        what, i, GPTOSS_VERSION_STRING, sizeof_t);
    std::memcpy(out, in, std::min<size_t>(struct_size, sizeof_t));
    std::memcpy(out, &struct_size, sizeof struct_size);
    return GPTOSS_OK;
}

// Zeroes the caller's struct (all of its `struct_size` bytes) and writes `defaults` into the
// part both sides know.
static void init_extensible(void* params, size_t struct_size, const void* defaults, size_t sizeof_t) {
    if (params == nullptr || struct_size < sizeof(uint32_t)) return;
    std::memset(params, 0, struct_size);
    std::memcpy(params, defaults, std::min(struct_size, sizeof_t));
    const uint32_t size32 = uint32_t(std::min<size_t>(struct_size, UINT32_MAX));
    std::memcpy(params, &size32, sizeof size32);
}

// ---------------------------------------------------------------------------
// Model

static void model_release(gptoss_model* model) {
    if (model != nullptr && model->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete model;
}

static const char* model_name(const Config& c) {
    if (c.n_layers == 24 && c.n_experts == 32 && c.hidden == 2880) return "gpt-oss-20b";
    if (c.n_layers == 36 && c.n_experts == 128 && c.hidden == 2880) return "gpt-oss-120b";
    return "gpt-oss";
}

static bool file_exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// params.device / params.devices → *device (a CUDA ordinal or GPTOSS_DEVICE_CPU) and, for two
// or more GPUs, *split, the devices to split the model over (gptoss-shard.h); errors name the field.
static gptoss_status resolve_devices(const gptoss_model_params& params, int32_t* device_out,
                                     std::vector<int32_t>* split) {
    int32_t device = params.device;
#ifdef GPTOSS_HAVE_CUDA
    const int n_devices = cuda_device_count();
#else
    const int n_devices = 0;
#endif
    if (params.n_devices > 0 || params.devices != nullptr) {
        if (params.devices == nullptr || params.n_devices == 0)  // a malformed list, whatever the build
            return validate_devices(params.devices, params.n_devices, n_devices);
#ifndef GPTOSS_HAVE_CUDA
        return fail(GPTOSS_ERR_UNSUPPORTED, "params.devices: this build has no CUDA backend (built without nvcc)");
#endif
        GPTOSS_TRY(validate_devices(params.devices, params.n_devices, n_devices));
        device = params.devices[0];
        if (params.n_devices > 1) split->assign(params.devices, params.devices + params.n_devices);
    }
    if (device < GPTOSS_DEVICE_AUTO)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                    "params.device: %d is not a CUDA ordinal, GPTOSS_DEVICE_CPU (-1) or GPTOSS_DEVICE_AUTO (-2)", device);
    if (device == GPTOSS_DEVICE_AUTO) device = n_devices > 0 ? 0 : GPTOSS_DEVICE_CPU;
    if (device >= 0) {
#ifndef GPTOSS_HAVE_CUDA
        return fail(GPTOSS_ERR_UNSUPPORTED,
                    "params.device: %d asks for a GPU, but this build has no CUDA backend (built without nvcc); "
                    "use GPTOSS_DEVICE_CPU",
                    device);
#else
        if (n_devices == 0)
            return fail(GPTOSS_ERR_UNSUPPORTED, "params.device: %d asks for a GPU, but no CUDA device was found", device);
        if (device >= n_devices)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "params.device: %d, but only %d CUDA device(s) exist", device,
                        n_devices);
#endif
    }
    *device_out = device;
    return GPTOSS_OK;
}

// params.n_cpu_moe / gpu_memory_budget / fit_context → *offload (the upper bound of n_cpu_moe is
// checked once n_layers is known); experts in host memory need a single device.
static gptoss_status resolve_offload(const gptoss_model_params& params, size_t n_split, OffloadRequest* offload) {
    offload->n_cpu_moe = params.n_cpu_moe;
    offload->gpu_memory_budget = params.gpu_memory_budget;
    offload->fit_context = params.fit_context;
    if (offload->n_cpu_moe < GPTOSS_CPU_MOE_AUTO)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                    "params.n_cpu_moe: %d; expected 0 (all experts on the GPU), a number of layers, or "
                    "GPTOSS_CPU_MOE_AUTO (-1)",
                    offload->n_cpu_moe);
    if (n_split > 1 && (offload->n_cpu_moe != 0 || offload->gpu_memory_budget != 0))
        return fail(GPTOSS_ERR_UNSUPPORTED,
                    "params.n_cpu_moe / params.gpu_memory_budget: experts in host memory are not supported with "
                    "several devices (params.devices)");
    return GPTOSS_OK;
}

// The model's tokenizer from model_dir/tokenizer.json, when the file exists (else a warning).
static gptoss_status load_tokenizer(const char* model_dir, gptoss_model* model) {
    const std::string tokenizer_path = std::string(model_dir) + "/tokenizer.json";
    if (!file_exists(tokenizer_path)) {
        log(GPTOSS_LOG_WARN, "%s: not found; tokenize, detokenize and chat will be unavailable", tokenizer_path.c_str());
        return GPTOSS_OK;
    }
    std::unique_ptr<Tokenizer> tokenizer;
    GPTOSS_TRY(Tokenizer::load_hf_json(tokenizer_path, &tokenizer));
    model->tokenizer = std::move(tokenizer);
    return GPTOSS_OK;
}

// The backend for the loaded checkpoint: the CPU, one GPU, or the GPUs of `split`.
static gptoss_status create_backend(gptoss_model* model, int32_t device, const std::vector<int32_t>& split,
                                    const OffloadRequest& offload, const ProgressFn& upload_progress) {
    if (device == GPTOSS_DEVICE_CPU) {
        if (offload.n_cpu_moe != 0)
            log(GPTOSS_LOG_INFO, "params.n_cpu_moe: ignored by the CPU backend (every weight is in host memory)");
        return create_cpu_backend(*model->checkpoint, &model->backend);
    }
#ifdef GPTOSS_HAVE_CUDA
    if (split.size() > 1)
        return create_sharded_cuda_backend(*model->checkpoint, split.data(), split.size(), upload_progress,
                                           &model->backend);
    return create_cuda_backend(*model->checkpoint, device, offload, upload_progress, &model->backend);
#else
    (void)split, (void)upload_progress;
    return GPTOSS_OK;
#endif
}

static gptoss_status load_model(const char* model_dir, const gptoss_model_params& params, gptoss_model** out) {
    int32_t device = GPTOSS_DEVICE_CPU;
    std::vector<int32_t> split;  // two or more GPUs (gptoss-shard.h)
    GPTOSS_TRY(resolve_devices(params, &device, &split));
    uint32_t max_decode_batch = 1;
    GPTOSS_TRY(resolve_max_decode_batch(params.max_decode_batch, &max_decode_batch));
    bool batch_invariant = true;
    GPTOSS_TRY(resolve_batch_invariant(params.batch_invariant, &batch_invariant));
    int decode_pipeline = -1;
    GPTOSS_TRY(resolve_decode_pipeline(&decode_pipeline));
    OffloadRequest offload;
    GPTOSS_TRY(resolve_offload(params, split.size(), &offload));

    // Loading the files is the first half of the progress bar, uploading to a GPU the second.
    // Every report goes through `report`, which passes on only increasing fractions, so the
    // caller sees 1.0 exactly once (the file loader and the upload each end at their 1.0).
    const float file_share = device >= 0 ? 0.5f : 1.0f;
    float reported = -1.0f;
    auto report = [&](float f) {
        if (params.progress == nullptr || f <= reported) return true;
        reported = f;
        return params.progress(params.progress_user_data, f);
    };
    ProgressFn file_progress, upload_progress;
    if (params.progress != nullptr) {
        file_progress = [&](float f) { return report(f * file_share); };
        upload_progress = [&](float f) { return report(0.5f + 0.5f * f); };
    }

    fault_point();
    std::unique_ptr<gptoss_model> model(new gptoss_model());
    GPTOSS_TRY(load_checkpoint(model_dir, file_progress, &model->checkpoint));
    GPTOSS_TRY(load_tokenizer(model_dir, model.get()));
    fault_point();
    GPTOSS_TRY(check_offload_request(offload, model->checkpoint->config.n_layers));
    GPTOSS_TRY(create_backend(model.get(), device, split, offload, upload_progress));
    if (!report(1.0f)) return fail(GPTOSS_ERR_CANCELLED, "%s: loading cancelled by the progress callback", model_dir);
    model->decode_pipeline = decode_pipeline;
    if (max_decode_batch > 1)
        model->batcher.reset(new DecodeBatcher(*model->backend, max_decode_batch, batch_invariant));
    model->name = model_name(model->checkpoint->config);
    *out = model.release();
    return GPTOSS_OK;
}

// ---------------------------------------------------------------------------
// Generation loop

static double ms_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

static gptoss_status check_model_usable(const gptoss_model* model, const char* function) {
    if (model->poisoned.load())
        return fail(GPTOSS_ERR_DEVICE, "%s: an earlier CUDA error left this model unusable; free it and load again",
                    function);
    return GPTOSS_OK;
}

// Where the cache can resume for a prompt whose first `prefix` tokens equal the cached ones:
// the position to restart from, after restoring the sliding snapshot if `*use_snapshot`.
static uint32_t resume_position(const gptoss_session* session, uint32_t prefix, bool* use_snapshot) {
    const Config& c = session->model->checkpoint->config;
    const uint32_t n = uint32_t(session->cached.size());
    const uint32_t W = c.sliding_window;
    const bool has_sliding = std::find(c.layer_sliding.begin(), c.layer_sliding.end(), true) != c.layer_sliding.end();
    *use_snapshot = false;
    // Resuming at r needs the sliding K/V of [r - W + 1, r); the rings hold [n - W, n), or
    // [n + 1 - W, n) when position n was written past the end (kv_past_end; prefix < n then).
    const uint32_t held_end = session->kv_past_end ? n + 1 : n;
    if (prefix >= n || !has_sliding || held_end <= W || prefix + 1 >= held_end) return prefix;
    // The trap of API.md §6: the rings cannot rewind. The snapshot taken after the last
    // prefill holds them as they were at s = snapshot_pos, i.e. [s - W, s): enough to resume
    // at s - 1 or s.
    const uint32_t s = session->snapshot_pos;
    if (s > 0 && s <= prefix + 1) {
        *use_snapshot = true;
        return std::min(prefix, s);
    }
    return 0;
}

static gptoss_status generate_on_cache(gptoss_session* session, const int32_t* prompt, size_t n_prompt,
                                       const GenerateOptions& options, GenerateOutput* out);

void forget_cache(gptoss_session* session) {
    session->cached.clear();
    session->n_prefilled = 0;
    session->snapshot_pos = 0;
    session->kv_past_end = false;
}

gptoss_status session_generate(gptoss_session* session, const int32_t* prompt, size_t n_prompt,
                               const GenerateOptions& options, GenerateOutput* out) {
    gptoss_status status;
    try {
        status = generate_on_cache(session, prompt, n_prompt, options, out);
    } catch (...) {
        // A forward pass that stopped half-way may have overwritten sliding-ring slots that
        // `cached` still counts on: forget the cache (correct, only slower next time).
        forget_cache(session);
        throw;
    }
    // A CUDA error is sticky for the whole context: poison the model (API.md §1).
    if (status == GPTOSS_ERR_DEVICE) session->model->poisoned.store(true);
    return status;
}

// Prefill (n tokens) or decode (one token) at pos; on failure the cache's content is unknown,
// so nothing is counted as cached.
enum class Pass { kPrefill, kDecode };
static gptoss_status forward_or_forget(gptoss_session* session, const int32_t* tokens, uint32_t n, uint32_t pos,
                                       Pass pass, const SamplingConfig* sampling = nullptr, double u = 0.0,
                                       int32_t* sampled = nullptr) {
    fault_point();
    const gptoss_status status = pass == Pass::kDecode ? decode_step(session, tokens[0], pos, sampling, u, sampled)
                                                       : prefill_step(session, tokens, n, pos);
    if (status != GPTOSS_OK) forget_cache(session);
    return status;
}

static gptoss_status check_prompt(const gptoss_session* session, const int32_t* prompt, size_t n_prompt) {
    const gptoss_model* model = session->model;
    const Config& config = model->checkpoint->config;
    GPTOSS_TRY(check_model_usable(model, "generate"));
    if (n_prompt == 0) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "prompt: empty (n_prompt is 0)");
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || uint32_t(prompt[i]) >= config.vocab)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "prompt[%zu]: token id %d is outside the vocabulary [0, %u)", i,
                        prompt[i], config.vocab);
    if (n_prompt > session->max_context)
        return fail(GPTOSS_ERR_CONTEXT_FULL, "prompt: %zu tokens do not fit the session's max_context of %u",
                    n_prompt, session->max_context);
    return GPTOSS_OK;
}

// Keeps the longest common prefix of the prompt and the prefill-written part of the cache
// (always recomputing the last prompt position, whose logits start the generation), restoring
// the sliding snapshot where that prefix needs it; *resume = the first position to prefill.
static gptoss_status reuse_prefix(gptoss_session* session, const int32_t* prompt, size_t n_prompt, uint32_t* resume) {
    uint32_t prefix = 0;
    const uint32_t n_reusable = session->n_prefilled;
    while (prefix < n_reusable && prefix < n_prompt && session->cached[prefix] == prompt[prefix]) prefix++;
    prefix = std::min(prefix, uint32_t(n_prompt - 1));
    bool use_snapshot = false;
    *resume = resume_position(session, prefix, &use_snapshot);
    if (use_snapshot) {
        const gptoss_status status = session->backend->restore_sliding_snapshot();
        if (status != GPTOSS_OK) {
            forget_cache(session);
            return status;
        }
    }
    session->cached.resize(*resume);
    session->n_prefilled = *resume;
    if (session->snapshot_pos > *resume) session->snapshot_pos = 0;  // its prefix is about to change
    session->kv_past_end = false;  // the rings hold [resume - W, resume) (resume_position)
    return GPTOSS_OK;
}

// Prefills prompt positions resume..n_prompt-1 in chunks of max_batch, split at the snapshot
// position (options.snapshot_at, else the end of the prompt; a position already behind us is
// kept only if the current snapshot is exactly there) where the sliding rings are saved.
// Cancel is checked between chunks: *cancelled, and the rest is not prefilled.
static gptoss_status prefill_prompt(gptoss_session* session, const int32_t* prompt, size_t n_prompt, uint32_t resume,
                                    uint32_t snapshot_at, bool* cancelled) {
    BackendSession& backend = *session->backend;
    *cancelled = false;
    uint32_t snap = snapshot_at == 0 || snapshot_at > n_prompt ? uint32_t(n_prompt) : snapshot_at;
    bool snapped = false;
    if (snap < resume) {
        if (session->snapshot_pos == snap) snapped = true;
        else snap = uint32_t(n_prompt);
    }
    for (uint32_t pos = resume; pos < n_prompt;) {
        if (!snapped && pos == snap) {
            GPTOSS_TRY(backend.save_sliding_snapshot());
            session->snapshot_pos = snap;
            snapped = true;
        }
        if (session->cancel_requested.load()) {
            *cancelled = true;
            return GPTOSS_OK;
        }
        uint32_t n = std::min<uint32_t>(session->max_batch, uint32_t(n_prompt) - pos);
        if (!snapped && pos < snap) n = std::min(n, snap - pos);
        GPTOSS_TRY(forward_or_forget(session, prompt + pos, n, pos, Pass::kPrefill));
        session->cached.insert(session->cached.end(), prompt + pos, prompt + pos + n);
        session->n_prefilled = uint32_t(session->cached.size());
        pos += n;
    }
    if (!snapped) {
        GPTOSS_TRY(backend.save_sliding_snapshot());
        session->snapshot_pos = uint32_t(n_prompt);
    }
    return GPTOSS_OK;
}

// After sampling `token`: the reason to stop now, or false to go on (stop tokens, on_token's
// verdict, max_tokens, a full context). Stops before feeding a token whose logits nobody uses.
bool stop_after(const gptoss_session* session, const GenerateOptions& options, int32_t token, GenerateOutput* out) {
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) != options.stop_tokens.end()) {
        out->stop_reason = token == 200002 ? GPTOSS_STOP_RETURN : token == 200012 ? GPTOSS_STOP_CALL : GPTOSS_STOP_TOKEN;
        if (options.on_token) options.on_token(token);
        return true;
    }
    if (options.on_token) {
        const int verdict = options.on_token(token);
        if (verdict != kContinue) {
            out->stop_reason = gptoss_stop_reason(verdict);
            return true;
        }
    }
    if (options.max_tokens != 0 && out->tokens.size() >= options.max_tokens) {
        out->stop_reason = GPTOSS_STOP_MAX_TOKENS;
        return true;
    }
    if (session->cached.size() >= session->max_context) {
        out->stop_reason = GPTOSS_STOP_CONTEXT_FULL;
        return true;
    }
    return false;
}

// Samples and feeds tokens until a stop (stop_after) or cancel.
static gptoss_status decode_tokens(gptoss_session* session, const GenerateOptions& options, GenerateOutput* out) {
    gptoss_model* model = session->model;
    BackendSession& backend = *session->backend;
    Rng rng(options.seed);
    TokenConstraint* constraint = options.constraint.get();
    std::vector<uint32_t> allowed(constraint != nullptr ? (model->checkpoint->config.vocab + 31) / 32 : 0);
    const DecodeLoop batched(session);  // decode steps may be shared with other sessions
    // With a batcher and no constraint, a decode step may sample the next token in the step
    // (DecodeItem::sampled); its u is drawn before the step, so the RNG sequence is the same.
    const bool sample_in_step = constraint == nullptr && model->batcher != nullptr;
    int32_t presampled = -1;
    double next_u = -1.0;  // drawn for the step, not used there: the next sample's u
    for (;;) {
        if (session->cancel_requested.load()) {
            out->stop_reason = GPTOSS_STOP_CANCELLED;
            return GPTOSS_OK;
        }
        int32_t token = presampled;
        const double u = next_u >= 0.0 ? next_u : rng.next_double();
        presampled = -1;
        next_u = -1.0;
        // The mask is computed on the host while the device still runs the step's forward.
        if (token >= 0) {
            // sampled in the step
        } else if (constraint != nullptr && constraint->mask(allowed.data(), uint32_t(allowed.size()))) {
            GPTOSS_TRY(backend.sample_masked(options.sampling, u, allowed.data(), &token));
        } else {
            GPTOSS_TRY(backend.sample(options.sampling, u, &token));
        }
        if (constraint != nullptr) constraint->accept(token);
        out->tokens.push_back(token);
        if (stop_after(session, options, token, out)) return GPTOSS_OK;
        const uint32_t pos = uint32_t(session->cached.size());
        if (sample_in_step) {
            next_u = rng.next_double();
            // The step may also run the forward of the token it samples (kv_past_end).
            session->kv_past_end = true;
            GPTOSS_TRY(forward_or_forget(session, &token, 1, pos, Pass::kDecode, &options.sampling, next_u, &presampled));
        } else {
            GPTOSS_TRY(forward_or_forget(session, &token, 1, pos, Pass::kDecode));
        }
        session->cached.push_back(token);
    }
}

static gptoss_status generate_on_cache(gptoss_session* session, const int32_t* prompt, size_t n_prompt,
                                       const GenerateOptions& options, GenerateOutput* out) {
    GPTOSS_TRY(check_prompt(session, prompt, n_prompt));
    *out = GenerateOutput();
    out->n_prompt_tokens = uint32_t(n_prompt);
    const auto start = std::chrono::steady_clock::now();
    uint32_t resume = 0;
    GPTOSS_TRY(reuse_prefix(session, prompt, n_prompt, &resume));
    out->n_cached_tokens = resume;
    bool cancelled = false;
    GPTOSS_TRY(prefill_prompt(session, prompt, n_prompt, resume, options.snapshot_at, &cancelled));
    out->prefill_ms = ms_since(start);
    if (cancelled) {
        out->stop_reason = GPTOSS_STOP_CANCELLED;
        return GPTOSS_OK;
    }
    const auto decode_start = std::chrono::steady_clock::now();
    if (use_decode_pipeline(session)) GPTOSS_TRY(decode_tokens_pipelined(session, options, out));
    else GPTOSS_TRY(decode_tokens(session, options, out));
    out->decode_ms = ms_since(decode_start);
    return GPTOSS_OK;
}

static const int32_t kDefaultStopTokens[2] = {200002, 200012};  // <|return|>, <|call|>

gptoss_status make_generate_options(const gptoss_sampling_params& params, GenerateOptions* out) {
    if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature))
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "sampling.temperature: %g is not a finite number >= 0",
                    double(params.temperature));
    if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "sampling.top_p: %g is outside (0, 1]", double(params.top_p));
    if (params.n_stop_tokens > 0 && params.stop_tokens == nullptr)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "sampling.stop_tokens: NULL with n_stop_tokens %zu", params.n_stop_tokens);
    if (params.n_stop_strings > 0 && params.stop_strings == nullptr)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "sampling.stop_strings: NULL with n_stop_strings %zu",
                    params.n_stop_strings);
    for (size_t i = 0; i < params.n_stop_strings; i++) {
        if (params.stop_strings[i] == nullptr || params.stop_strings[i][0] == '\0')
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "sampling.stop_strings[%zu]: NULL or empty", i);
        // Output text is valid UTF-8; a stop string that is not could match inside a character
        // and cut an event's text there (found by tests/fuzz/fuzz-harmony).
        const size_t len = std::strlen(params.stop_strings[i]);
        const size_t bad = first_invalid_utf8(params.stop_strings[i], len);
        if (bad != len)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "sampling.stop_strings[%zu]: invalid UTF-8 at byte %zu", i, bad);
    }
    *out = GenerateOptions();
    out->sampling.temperature = params.temperature;
    out->sampling.top_p = params.top_p;
    out->sampling.top_k = params.top_k;
    out->max_tokens = params.max_tokens;
    if (params.seed == GPTOSS_SEED_RANDOM) {
        std::random_device device;
        out->seed = (uint64_t(device()) << 32) ^ device();
    } else {
        out->seed = params.seed;
    }
    out->stop_tokens.assign(params.stop_tokens, params.stop_tokens + params.n_stop_tokens);
    return GPTOSS_OK;
}

// The text of one token for streaming: bytes through the UTF-8 holder, so events carry only
// complete characters.
static void token_text(const Tokenizer* tokenizer, int32_t token, Utf8StreamDecoder* decoder, std::string* text) {
    text->clear();
    if (tokenizer == nullptr || token < 0 || uint32_t(token) >= tokenizer->n_vocab()) return;
    decoder->push(tokenizer->token_bytes(token), text);
}

// gptoss_generate's options: the sampling parameters, and a JSON Schema constraint when
// params.json_schema asks for one.
static gptoss_status token_generate_options(gptoss_session* session, const gptoss_sampling_params& params,
                                            GenerateOptions* options) {
    GPTOSS_TRY(make_generate_options(params, options));
    if (params.json_schema == nullptr) return GPTOSS_OK;
    if (session->model->tokenizer == nullptr)
        return fail(GPTOSS_ERR_UNSUPPORTED, "sampling.json_schema: the model has no tokenizer (tokenizer.json missing)");
    if (options->stop_tokens.empty())
        return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                    "sampling.json_schema: needs at least one stop token to end the document (stop_tokens is empty)");
    return make_json_constraint(session->model, params.json_schema, "sampling.json_schema", options->stop_tokens,
                                &options->constraint);
}

// gptoss_generate's streaming: each sampled token's complete characters go to on_event, and
// stop strings are matched against the text so far (stop_cut: where the first match begins).
struct TextStream {
    const Tokenizer* tokenizer;
    gptoss_event_fn on_event;
    void* user_data;
    std::vector<std::string> stop_strings;
    Utf8StreamDecoder decoder;
    std::string piece, text_so_far;
    size_t stop_cut = std::string::npos;

    TextStream(const Tokenizer* t, const gptoss_sampling_params& params, gptoss_event_fn fn, void* user)
        : tokenizer(t), on_event(fn), user_data(user),
          stop_strings(params.stop_strings, params.stop_strings + params.n_stop_strings) {}

    // GenerateOptions::on_token: kContinue, or the reason to stop.
    int push(int32_t token) {
        token_text(tokenizer, token, &decoder, &piece);
        if (on_event != nullptr) {
            gptoss_event event;
            std::memset(&event, 0, sizeof event);
            event.struct_size = sizeof event;
            event.token = token;
            event.text = piece.c_str();
            event.text_len = piece.size();
            event.channel = GPTOSS_CHANNEL_NONE;
            event.recipient = nullptr;
            if (!on_event(user_data, &event)) return GPTOSS_STOP_CANCELLED;
        }
        if (stop_strings.empty()) return kContinue;
        const size_t from = text_so_far.size();
        text_so_far += piece;
        for (const std::string& s : stop_strings) {
            const size_t at = text_so_far.find(s, from >= s.size() ? from - s.size() + 1 : 0);
            if (at != std::string::npos) {
                stop_cut = std::min(stop_cut, at);
                return GPTOSS_STOP_STRING;
            }
        }
        return kContinue;
    }
};

// gptoss_generate's result, built in the session's idle slot and then swapped in (API.md §2);
// the text is cut where a stop string began.
static gptoss_status store_generate_result(gptoss_session* session, GenerateOutput output, size_t stop_cut,
                                           const gptoss_generate_result** result_out) {
    fault_point();
    const Tokenizer* tokenizer = session->model->tokenizer.get();
    const int next = 1 - session->generate_current;
    GenerateResultStorage& storage = session->generate_results[next];
    storage.tokens = std::move(output.tokens);
    storage.text.clear();
    if (tokenizer != nullptr) GPTOSS_TRY(tokenizer->decode(storage.tokens.data(), storage.tokens.size(), &storage.text));
    if (stop_cut != std::string::npos && stop_cut < storage.text.size()) storage.text.resize(stop_cut);
    gptoss_generate_result& r = storage.result;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.tokens = storage.tokens.data();
    r.n_tokens = storage.tokens.size();
    r.text = storage.text.c_str();
    r.text_len = storage.text.size();
    r.stop_reason = output.stop_reason;
    r.n_prompt_tokens = output.n_prompt_tokens;
    r.n_cached_tokens = output.n_cached_tokens;
    r.prefill_ms = output.prefill_ms;
    r.decode_ms = output.decode_ms;
    session->generate_current = next;
    *result_out = &r;
    return GPTOSS_OK;
}

// ---------------------------------------------------------------------------
// C API: status, errors, logging, version. The extern "C" functions sit inside namespace
// gptoss only for name lookup; C linkage gives them their plain gptoss_* symbols.

extern "C" {

GPTOSS_API const char* gptoss_status_string(gptoss_status status) {
    switch (status) {
        case GPTOSS_OK: return "ok";
        case GPTOSS_ERR_INVALID_ARGUMENT: return "invalid argument";
        case GPTOSS_ERR_IO: return "i/o error";
        case GPTOSS_ERR_FORMAT: return "malformed file";
        case GPTOSS_ERR_UNSUPPORTED: return "unsupported";
        case GPTOSS_ERR_OUT_OF_MEMORY: return "out of memory";
        case GPTOSS_ERR_DEVICE: return "device error";
        case GPTOSS_ERR_CONTEXT_FULL: return "context full";
        case GPTOSS_ERR_BUFFER_TOO_SMALL: return "buffer too small";
        case GPTOSS_ERR_CANCELLED: return "cancelled";
        case GPTOSS_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

GPTOSS_API const char* gptoss_last_error(void) { return t_last_error.c_str(); }

GPTOSS_API uint32_t gptoss_version(void) { return GPTOSS_VERSION_NUMBER; }

GPTOSS_API void gptoss_set_log_callback(gptoss_log_fn fn, void* user_data, gptoss_log_level min_level) {
    g_log_fn = fn;
    g_log_user_data = user_data;
    g_log_min_level = min_level;
}

// ---------------------------------------------------------------------------
// C API: model

GPTOSS_API void gptoss_model_params_init(gptoss_model_params* params, size_t struct_size) {
    gptoss_model_params defaults;
    std::memset(&defaults, 0, sizeof defaults);
    defaults.device = GPTOSS_DEVICE_AUTO;
    init_extensible(params, struct_size, &defaults, sizeof defaults);
}

GPTOSS_API gptoss_status gptoss_load(const char* model_dir, const gptoss_model_params* params,
                                     gptoss_model** model_out) {
    return guarded("gptoss_load", [&]() -> gptoss_status {
        if (model_out == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_load: model_out is NULL");
        *model_out = nullptr;
        if (model_dir == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_load: model_dir is NULL");
        gptoss_model_params p;
        gptoss_model_params_init(&p, sizeof p);
        if (params != nullptr) GPTOSS_TRY(read_params(params, &p, "gptoss_model_params"));
        return load_model(model_dir, p, model_out);
    });
}

GPTOSS_API void gptoss_model_free(gptoss_model* model) { model_release(model); }

GPTOSS_API gptoss_status gptoss_model_get_info(const gptoss_model* model, gptoss_model_info* info) {
    return guarded("gptoss_model_get_info", [&]() -> gptoss_status {
        if (model == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_model_get_info: model is NULL");
        if (info == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_model_get_info: info is NULL");
        const uint32_t size = info->struct_size;
        if (size < sizeof(uint32_t))
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_model_get_info: info->struct_size is %u; set it to "
                        "sizeof(gptoss_model_info)", size);
        const Config& c = model->checkpoint->config;
        gptoss_model_info full;
        std::memset(&full, 0, sizeof full);
        full.struct_size = size;
        full.name = model->name.c_str();
        full.n_layers = c.n_layers;
        full.n_experts = c.n_experts;
        full.n_experts_per_token = c.n_experts_per_token;
        full.n_vocab = c.vocab;
        full.max_context = c.max_context;
        full.weight_bytes = model->backend->weight_bytes();
        full.device = model->backend->device();
        full.n_cpu_moe = model->backend->n_cpu_moe();
        full.host_weight_bytes = model->backend->host_weight_bytes();
        std::memcpy(info, &full, std::min<size_t>(size, sizeof full));
        return GPTOSS_OK;
    });
}

// ---------------------------------------------------------------------------
// C API: tokenizer

GPTOSS_API gptoss_status gptoss_tokenize(const gptoss_model* model, const char* text, size_t text_len,
                                         bool allow_special, int32_t* tokens, size_t capacity,
                                         size_t* n_tokens_out) {
    return guarded("gptoss_tokenize", [&]() -> gptoss_status {
        if (model == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_tokenize: model is NULL");
        if (n_tokens_out == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_tokenize: n_tokens_out is NULL");
        if (text == nullptr && text_len > 0)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_tokenize: text is NULL but text_len is %zu", text_len);
        if (tokens == nullptr && capacity > 0)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_tokenize: tokens is NULL but capacity is %zu", capacity);
        if (!model->tokenizer)
            return fail(GPTOSS_ERR_UNSUPPORTED, "gptoss_tokenize: the model directory had no tokenizer.json");
        std::vector<int32_t> ids;
        GPTOSS_TRY(model->tokenizer->encode(text == nullptr ? "" : text, text_len, allow_special, &ids));
        *n_tokens_out = ids.size();
        if (ids.size() > capacity)
            return fail(GPTOSS_ERR_BUFFER_TOO_SMALL, "gptoss_tokenize: %zu tokens do not fit capacity %zu", ids.size(),
                        capacity);
        if (!ids.empty()) std::memcpy(tokens, ids.data(), ids.size() * sizeof(int32_t));
        return GPTOSS_OK;
    });
}

GPTOSS_API gptoss_status gptoss_detokenize(const gptoss_model* model, const int32_t* tokens, size_t n_tokens,
                                           char* text, size_t capacity, size_t* text_len_out) {
    return guarded("gptoss_detokenize", [&]() -> gptoss_status {
        if (model == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_detokenize: model is NULL");
        if (text_len_out == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_detokenize: text_len_out is NULL");
        if (tokens == nullptr && n_tokens > 0)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_detokenize: tokens is NULL but n_tokens is %zu", n_tokens);
        if (text == nullptr && capacity > 0)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_detokenize: text is NULL but capacity is %zu", capacity);
        if (!model->tokenizer)
            return fail(GPTOSS_ERR_UNSUPPORTED, "gptoss_detokenize: the model directory had no tokenizer.json");
        std::string bytes;
        GPTOSS_TRY(model->tokenizer->decode(tokens, n_tokens, &bytes));
        *text_len_out = bytes.size();
        if (bytes.size() + 1 > capacity)
            return fail(GPTOSS_ERR_BUFFER_TOO_SMALL, "gptoss_detokenize: %zu bytes plus the NUL do not fit capacity %zu",
                        bytes.size(), capacity);
        std::memcpy(text, bytes.data(), bytes.size());
        text[bytes.size()] = '\0';
        return GPTOSS_OK;
    });
}

// ---------------------------------------------------------------------------
// C API: session

GPTOSS_API void gptoss_session_params_init(gptoss_session_params* params, size_t struct_size) {
    gptoss_session_params defaults;
    std::memset(&defaults, 0, sizeof defaults);
    init_extensible(params, struct_size, &defaults, sizeof defaults);
}

GPTOSS_API gptoss_status gptoss_session_create(gptoss_model* model, const gptoss_session_params* params,
                                               gptoss_session** session_out) {
    return guarded("gptoss_session_create", [&]() -> gptoss_status {
        if (session_out == nullptr)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_session_create: session_out is NULL");
        *session_out = nullptr;
        if (model == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_session_create: model is NULL");
        GPTOSS_TRY(check_model_usable(model, "gptoss_session_create"));
        gptoss_session_params p;
        gptoss_session_params_init(&p, sizeof p);
        if (params != nullptr) GPTOSS_TRY(read_params(params, &p, "gptoss_session_params"));
        const Config& c = model->checkpoint->config;
        const uint32_t max_context = p.max_context == 0 ? c.max_context : p.max_context;
        if (max_context > c.max_context)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                        "gptoss_session_create: params.max_context %u exceeds the model's max_position_embeddings %u",
                        max_context, c.max_context);
        const uint32_t max_batch = p.max_batch == 0 ? model->backend->default_max_batch() : p.max_batch;
        fault_point();
        std::unique_ptr<gptoss_session> session(new gptoss_session());
        session->model = model;
        session->max_context = max_context;
        session->max_batch = max_batch;
        {
            std::lock_guard<std::mutex> lock(model->mutex);
            const gptoss_status status = model->backend->create_session(max_context, max_batch, &session->backend);
            if (status == GPTOSS_ERR_DEVICE) model->poisoned.store(true);
            GPTOSS_TRY(status);
        }
        model->refs.fetch_add(1, std::memory_order_relaxed);
        *session_out = session.release();
        return GPTOSS_OK;
    });
}

GPTOSS_API void gptoss_session_free(gptoss_session* session) {
    if (session == nullptr) return;
    gptoss_model* model = session->model;
    delete session;
    model_release(model);
}

GPTOSS_API void gptoss_session_cancel(gptoss_session* session) {
    if (session != nullptr && session->running.load()) session->cancel_requested.store(true);
}

GPTOSS_API void gptoss_sampling_params_init(gptoss_sampling_params* params, size_t struct_size) {
    gptoss_sampling_params defaults;
    std::memset(&defaults, 0, sizeof defaults);
    defaults.temperature = 1.0f;
    defaults.top_p = 1.0f;
    defaults.top_k = 0;
    defaults.seed = GPTOSS_SEED_RANDOM;
    defaults.max_tokens = 0;
    defaults.stop_tokens = kDefaultStopTokens;
    defaults.n_stop_tokens = 2;
    init_extensible(params, struct_size, &defaults, sizeof defaults);
}

// ---------------------------------------------------------------------------
// C API: generate

GPTOSS_API gptoss_status gptoss_generate(gptoss_session* session, const int32_t* prompt, size_t n_prompt,
                                         const gptoss_sampling_params* sampling, gptoss_event_fn on_event,
                                         void* user_data, const gptoss_generate_result** result_out) {
    if (result_out != nullptr) *result_out = nullptr;
    if (session == nullptr)
        return guarded("gptoss_generate", [] { return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_generate: session is NULL"); });
    session->cancel_requested.store(false);
    session->running.store(true);
    const gptoss_status status = guarded("gptoss_generate", [&]() -> gptoss_status {
        if (result_out == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_generate: result_out is NULL");
        if (prompt == nullptr && n_prompt > 0)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_generate: prompt is NULL but n_prompt is %zu", n_prompt);
        gptoss_sampling_params params;
        gptoss_sampling_params_init(&params, sizeof params);
        if (sampling != nullptr) GPTOSS_TRY(read_params(sampling, &params, "gptoss_sampling_params"));
        GenerateOptions options;
        GPTOSS_TRY(token_generate_options(session, params, &options));
        const Tokenizer* tokenizer = session->model->tokenizer.get();
        TextStream stream(tokenizer, params, on_event, user_data);
        options.on_token = [&](int32_t token) { return stream.push(token); };
        GenerateOutput output;
        GPTOSS_TRY(session_generate(session, prompt, n_prompt, options, &output));
        GPTOSS_TRY(store_generate_result(session, std::move(output), stream.stop_cut, result_out));
        return GPTOSS_OK;
    });
    session->running.store(false);
    return status;
}

}  // extern "C"

}  // namespace gptoss

// Frees the backend before the checkpoint: the backend may point into its mappings.
gptoss_model::~gptoss_model() {
    backend.reset();
    checkpoint.reset();
}
