// gptoss.h - run OpenAI's gpt-oss models on an NVIDIA GPU (or, slowly, on the CPU).
//
// Two objects:
//   gptoss_model    the weights and tokenizer of one checkpoint, resident on one GPU.
//                   Immutable once loaded; share it freely between threads.
//   gptoss_session  working memory for one generation at a time: KV cache, scratch
//                   buffers, and the result of its latest call. One thread at a time.
//
// Every generate/chat call is a function of its arguments alone (given a seed). The
// session is a cache, not a conversation: pass the whole prompt or conversation each
// time, and the session skips the longest prefix it has already processed.
//
// Basic use:
//
//     gptoss_model* model = NULL;
//     if (gptoss_load("/models/gpt-oss-20b", NULL, &model) != GPTOSS_OK) {
//         fprintf(stderr, "gptoss: %s\n", gptoss_last_error());
//         return 1;
//     }
//     gptoss_session* session = NULL;
//     if (gptoss_session_create(model, NULL, &session) != GPTOSS_OK) { ... }
//
//     gptoss_message history[1] = {{ GPTOSS_ROLE_USER }};
//     history[0].content = "What is 2 + 2?";
//     gptoss_chat_request request = gptoss_chat_default_request();
//     request.messages   = history;
//     request.n_messages = 1;
//
//     const gptoss_chat_result* reply = NULL;
//     if (gptoss_chat(session, &request, NULL, NULL, NULL, &reply) == GPTOSS_OK)
//         printf("%s\n", reply->final);
//
//     gptoss_session_free(session);
//     gptoss_model_free(model);
//
// Rules that hold for every function unless its comment says otherwise:
//   - A function that can fail returns gptoss_status. On failure it stores NULL in
//     pointer out-parameters, leaves other out-parameters unchanged, and records a
//     message for gptoss_last_error().
//   - Strings are UTF-8 and NUL-terminated unless a length is passed with them.
//   - The caller owns what it passes in; the library copies what it keeps.
//   - Pointers returned by the library are borrowed: never free them. Each comment
//     says how long they stay valid.
//   - Callbacks run synchronously on the calling thread and are never called after
//     the function that received them returns. Their arguments are valid only
//     during the callback.
//   - Passing NULL to a *_free function does nothing.

#ifndef GPTOSS_H
#define GPTOSS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPTOSS_VERSION_MAJOR  0
#define GPTOSS_VERSION_MINOR  1
#define GPTOSS_VERSION_PATCH  0
#define GPTOSS_VERSION_NUMBER (GPTOSS_VERSION_MAJOR * 1000000 + GPTOSS_VERSION_MINOR * 1000 + GPTOSS_VERSION_PATCH)
#define GPTOSS_VERSION_STRING "0.1.0"

#ifndef GPTOSS_API
#  if defined(GPTOSS_BUILD) && defined(__GNUC__)
#    define GPTOSS_API __attribute__((visibility("default")))
#  else
#    define GPTOSS_API
#  endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------------------
// Status, errors, logging, version

typedef enum gptoss_status {
    GPTOSS_OK                   = 0,
    GPTOSS_ERR_INVALID_ARGUMENT = 1,  // NULL where a value is required, value out of range, malformed schema
    GPTOSS_ERR_IO               = 2,  // a file could not be opened or read
    GPTOSS_ERR_FORMAT           = 3,  // a file is malformed or disagrees with config.json
    GPTOSS_ERR_UNSUPPORTED      = 4,  // valid request this build cannot serve (GPU, dtype, newer struct)
    GPTOSS_ERR_OUT_OF_MEMORY    = 5,  // a host or device allocation failed
    GPTOSS_ERR_DEVICE           = 6,  // CUDA failed; the model and its sessions are no longer usable
    GPTOSS_ERR_CONTEXT_FULL     = 7,  // the prompt alone does not fit in the session's context
    GPTOSS_ERR_BUFFER_TOO_SMALL = 8,  // the caller's buffer is too small; the needed size was stored
    GPTOSS_ERR_CANCELLED        = 9,  // loading was cancelled by the progress callback
    GPTOSS_ERR_INTERNAL         = 10, // a bug in gptoss; please report gptoss_last_error()
} gptoss_status;

// A short, static description of `status`, such as "out of memory".
GPTOSS_API const char* gptoss_status_string(gptoss_status status);

// Describes the most recent failure of a gptoss function on the calling thread:
// what failed and why, naming files, tensors and values (for example "model-00002-of-00003
// .safetensors: tensor model.layers.3.mlp.router.weight has shape [32, 2880], config.json
// implies [128, 2880]"). Valid until the next gptoss call on this thread. Returns "" if
// nothing has failed on this thread.
GPTOSS_API const char* gptoss_last_error(void);

// GPTOSS_VERSION_NUMBER of the library as built. Compare it with the header's to catch a
// mismatched shared library: gptoss_version() / 1000000 == GPTOSS_VERSION_MAJOR.
GPTOSS_API uint32_t gptoss_version(void);

typedef enum gptoss_log_level {
    GPTOSS_LOG_DEBUG = 0,
    GPTOSS_LOG_INFO  = 1,
    GPTOSS_LOG_WARN  = 2,
    GPTOSS_LOG_ERROR = 3,
} gptoss_log_level;

// Receives one log line, without a trailing newline. May be called from any thread.
typedef void (*gptoss_log_fn)(void* user_data, gptoss_log_level level, const char* message);

// Sends messages at `min_level` and above to `fn`. By default the library prints nothing;
// errors are reported through return values and gptoss_last_error(). Pass NULL to silence
// again. Not thread-safe: call it before any other gptoss function.
// For debugging only: with no callback installed, the environment variable
// GPTOSS_LOG=debug|info|warn|error prints messages at that level and above to stderr.
GPTOSS_API void gptoss_set_log_callback(gptoss_log_fn fn, void* user_data, gptoss_log_level min_level);

// ---------------------------------------------------------------------------
// Model

typedef struct gptoss_model   gptoss_model;
typedef struct gptoss_session gptoss_session;

#define GPTOSS_DEVICE_CPU  (-1)
#define GPTOSS_DEVICE_AUTO (-2)

// Reports loading progress as a fraction in [0, 1], strictly increasing; a load that succeeds
// ends with exactly one call with 1.0.
// Return false to cancel.
typedef bool (*gptoss_progress_fn)(void* user_data, float fraction);

typedef struct gptoss_model_params {
    uint32_t           struct_size;        // sizeof(gptoss_model_params); set by gptoss_model_params_init
    int32_t            device;             // CUDA device ordinal, GPTOSS_DEVICE_CPU for the CPU
                                           // reference backend, or GPTOSS_DEVICE_AUTO (the default):
                                           // device 0 if a CUDA device exists, else the CPU.
    gptoss_progress_fn progress;           // Default NULL.
    void*              progress_user_data;
    // Continuous batching: how many sessions of this model may share one decode step when
    // several threads generate at once (each session's tokens are the same as alone).
    // Default 0: the environment variable GPTOSS_DECODE_BATCH if set, else 1. 1 = off (each
    // session decodes on its own). At most 1024. Appended in 0.1 (issue 13).
    uint32_t           max_decode_batch;
    // Several GPUs (appended in 0.1). Default NULL / 0: the model runs on `device`. Otherwise
    // `device` is ignored and the model runs on these n_devices CUDA ordinals (the list is
    // copied): one entry is the single-GPU path on that GPU; two or more split the model over
    // them with NCCL (attention heads, each expert's width and the vocabulary; one process, the
    // calling thread plus one thread per further GPU during each step). Each GPU may appear
    // once and must exist, else GPTOSS_ERR_INVALID_ARGUMENT naming the entry; a library built
    // without CUDA or NCCL, or a model whose kv heads do not divide evenly, gives
    // GPTOSS_ERR_UNSUPPORTED. Before it creates NCCL communicators the library sets
    // NCCL_NVLS_ENABLE=0 in the process environment unless the variable is already set
    // (NVLink multicast off). gptoss_model_info.device reports devices[0].
    const int32_t*     devices;
    size_t             n_devices;
    // MoE experts in host memory (appended in 0.1, issue 16), for GPUs smaller than the model:
    // the experts of the first n_cpu_moe layers stay in host memory (the dense weights,
    // attention, router and KV cache stay on the GPU). Decode and short chunks run those
    // experts on the CPU (SIMD, the worker pool of GPTOSS_THREADS threads); long prefill chunks
    // stream them to the GPU instead. 0 (the default): every expert on the GPU.
    // GPTOSS_CPU_MOE_AUTO: the fewest layers that let the weights plus one session of
    // fit_context tokens fit gpu_memory_budget. At most n_layers, else
    // GPTOSS_ERR_INVALID_ARGUMENT. Ignored by the CPU backend; with several devices
    // GPTOSS_ERR_UNSUPPORTED. gptoss_model_info reports what went where.
    int32_t            n_cpu_moe;
    // Bytes of GPU memory this model may use: its weights, its streaming buffers and the KV
    // caches and scratch of its sessions together (a session that would go over fails with
    // GPTOSS_ERR_OUT_OF_MEMORY naming the budget). 0 (the default): the device's free memory
    // at load time less 512 MiB for the CUDA context.
    uint64_t           gpu_memory_budget;
    // GPTOSS_CPU_MOE_AUTO: tokens of KV cache (one session, default max_batch) the budget must
    // leave room for. 0 (the default): 32768.
    uint32_t           fit_context;
    // Batch invariance of a model with max_decode_batch > 1 (appended in 0.1, issue 13).
    // GPTOSS_BATCH_INVARIANT_ON: a session's tokens are the same whatever other sessions share
    // its decode steps, alone included (the batched kernels reduce each token's column in one
    // order at every batch size), so the same arguments and seed always give the same tokens.
    // GPTOSS_BATCH_INVARIANT_OFF: a step whose only decode token is one session's runs that
    // session's own one-token decode path instead (on CUDA the decode graph, as on a model
    // without batching, which is faster than the batched kernels at one token; bench/NOTES.md
    // "v30", "v45"), so a lone stream on a batching model runs the same path as on a model
    // without batching. Its tokens can then differ (within bf16 rounding: near-ties of greedy,
    // sampled tokens after them) between a run alone and a run where other sessions shared some
    // of its steps. Steps of two or more sessions, prompt chunks and the CPU backend (whose
    // steps equal its one-token path) are unchanged.
    // 0 (the default): the environment variable GPTOSS_BATCH_INVARIANT ("1" on, "0" off) if
    // set, else on. Another value, here or in the variable: GPTOSS_ERR_INVALID_ARGUMENT.
    int32_t            batch_invariant;
} gptoss_model_params;

// gptoss_model_params.n_cpu_moe: choose the split from gpu_memory_budget.
#define GPTOSS_CPU_MOE_AUTO (-1)
// gptoss_model_params.batch_invariant.
#define GPTOSS_BATCH_INVARIANT_ON  1
#define GPTOSS_BATCH_INVARIANT_OFF 2

// Fills `params` with defaults. `struct_size` is sizeof(*params) as the caller compiled it,
// which keeps callers built against an older or newer gptoss.h working.
GPTOSS_API void gptoss_model_params_init(gptoss_model_params* params, size_t struct_size);

static inline gptoss_model_params gptoss_model_default_params(void) {
    gptoss_model_params params;
    gptoss_model_params_init(&params, sizeof params);
    return params;
}

// Loads a checkpoint from a directory in Hugging Face layout: config.json, tokenizer.json,
// and model.safetensors or model.safetensors.index.json with its shards. Every tensor is
// checked against config.json; a mismatch fails with GPTOSS_ERR_FORMAT, and the message
// names the file, the tensor, and the expected and found dtype or shape.
// `params` may be NULL for defaults.
// On success stores a new model in *model_out; release it with gptoss_model_free().
// Returns GPTOSS_ERR_CANCELLED if params->progress returned false.
GPTOSS_API gptoss_status gptoss_load(const char* model_dir,
                                     const gptoss_model_params* params,
                                     gptoss_model** model_out);

// Releases the caller's hold on `model`. Its memory is freed once every session created
// from it has been freed as well, so models and sessions can be freed in any order (as
// garbage-collected bindings do).
GPTOSS_API void gptoss_model_free(gptoss_model* model);

typedef struct gptoss_model_info {
    uint32_t    struct_size;           // set by the caller: sizeof(gptoss_model_info)
    const char* name;                  // "gpt-oss-20b", "gpt-oss-120b", or "gpt-oss" for other shapes
    uint32_t    n_layers;
    uint32_t    n_experts;
    uint32_t    n_experts_per_token;
    uint32_t    n_vocab;
    uint32_t    max_context;           // tokens
    uint64_t    weight_bytes;          // device memory held by the weights
    int32_t     device;                // CUDA device ordinal, or GPTOSS_DEVICE_CPU
    // Appended in 0.1 (issue 16): layers whose experts are in host memory (the first ones;
    // gptoss_model_params.n_cpu_moe), and the bytes of host memory they hold (0 for none and
    // for the CPU backend, whose weights are the mapped files).
    uint32_t    n_cpu_moe;
    uint64_t    host_weight_bytes;
} gptoss_model_info;

// Fills the first info->struct_size bytes of `info`. Strings live as long as the model.
GPTOSS_API gptoss_status gptoss_model_get_info(const gptoss_model* model, gptoss_model_info* info);

// ---------------------------------------------------------------------------
// Tokenizer (o200k_harmony). Safe to call from any thread.

// Converts `text_len` bytes of UTF-8 `text` to token ids. Text that spells a special token,
// such as "<|start|>", becomes that token only if `allow_special` is true; otherwise it is
// ordinary text, which is what untrusted input needs.
// `text` must be valid UTF-8: a byte-level BPE could encode any bytes, but accepting them
// silently hides caller bugs, so invalid UTF-8 fails with GPTOSS_ERR_INVALID_ARGUMENT and a
// message naming the byte offset. NUL bytes are ordinary text (the length is explicit).
// `text` may be NULL only when `text_len` is 0; `tokens` may be NULL only when `capacity` is 0.
// Stores the number of tokens in *n_tokens_out and writes them to `tokens` if `capacity`
// suffices; otherwise returns GPTOSS_ERR_BUFFER_TOO_SMALL, so a call with capacity 0 sizes
// the buffer.
GPTOSS_API gptoss_status gptoss_tokenize(const gptoss_model* model,
                                         const char* text, size_t text_len,
                                         bool allow_special,
                                         int32_t* tokens, size_t capacity,
                                         size_t* n_tokens_out);

// Converts token ids to text; special tokens appear as their names ("<|end|>").
// An id outside [0, n_vocab) fails with GPTOSS_ERR_INVALID_ARGUMENT naming its position. Stores the
// byte length in *text_len_out and writes the text plus a NUL to `text` if `capacity`
// suffices; otherwise returns GPTOSS_ERR_BUFFER_TOO_SMALL. A token sequence can end inside a
// multi-byte character, so the bytes are not always valid UTF-8; streamed text always is
// (see gptoss_event).
GPTOSS_API gptoss_status gptoss_detokenize(const gptoss_model* model,
                                           const int32_t* tokens, size_t n_tokens,
                                           char* text, size_t capacity,
                                           size_t* text_len_out);

// ---------------------------------------------------------------------------
// Session

typedef struct gptoss_session_params {
    uint32_t struct_size;       // sizeof(gptoss_session_params); set by gptoss_session_params_init
    uint32_t max_context;       // tokens. Default 0: the model's maximum (KV memory grows linearly).
    uint32_t max_batch;         // prompt tokens processed per step (one forward; CUDA: at most 8192). Default 0:
                                // chosen by the library: CUDA 4096 for a one-GPU model without
                                // gpu_memory_budget on a device of >= 64 GiB, else 2048; CPU 64.
                                // Larger chunks prefill long prompts faster for more session memory.
} gptoss_session_params;

GPTOSS_API void gptoss_session_params_init(gptoss_session_params* params, size_t struct_size);

static inline gptoss_session_params gptoss_session_default_params(void) {
    gptoss_session_params params;
    gptoss_session_params_init(&params, sizeof params);
    return params;
}

// Creates a session on `model`'s GPU. `params` may be NULL for defaults. The session keeps
// the model alive. Safe to call from any thread.
GPTOSS_API gptoss_status gptoss_session_create(gptoss_model* model,
                                               const gptoss_session_params* params,
                                               gptoss_session** session_out);

GPTOSS_API void gptoss_session_free(gptoss_session* session);

// Asks a gptoss_generate() or gptoss_chat() running on `session` to stop before its next
// token; that call then returns GPTOSS_OK with stop_reason GPTOSS_STOP_CANCELLED and the
// output so far. Safe to call from any thread, including from a callback. Does nothing if no
// call is running. Never call it on a session that is being freed.
GPTOSS_API void gptoss_session_cancel(gptoss_session* session);

// ---------------------------------------------------------------------------
// Sampling and streaming (shared by gptoss_generate and gptoss_chat)

#define GPTOSS_SEED_RANDOM UINT64_MAX

typedef struct gptoss_sampling_params {
    uint32_t           struct_size;     // sizeof(gptoss_sampling_params); set by gptoss_sampling_params_init
    float              temperature;     // Default 1.0, as OpenAI recommends for gpt-oss. 0 = greedy.
    float              top_p;           // Default 1.0 (off).
    uint32_t           top_k;           // Default 0 (off).
    uint64_t           seed;            // Default GPTOSS_SEED_RANDOM. Same seed + same input = same output.
    uint32_t           max_tokens;      // Default 0: until a stop or a full context.
    const int32_t*     stop_tokens;     // Default: <|return|> and <|call|>. Ignored by gptoss_chat.
    size_t             n_stop_tokens;
    const char* const* stop_strings;    // Default none. Matched against final-channel text in chat.
                                        // Each non-empty valid UTF-8, else GPTOSS_ERR_INVALID_ARGUMENT.
    size_t             n_stop_strings;
    // Appended in 0.1 (constrained decoding, README "Structured output"):
    const char*        json_schema;     // Default NULL. gptoss_generate: the generated text is one JSON
                                        // value that matches this JSON Schema (the subset README lists;
                                        // "{}" = any JSON value), followed by one of stop_tokens; from the
                                        // first sampled token on. An unsupported keyword or malformed
                                        // schema fails with GPTOSS_ERR_INVALID_ARGUMENT naming its JSON
                                        // path ("json_schema: /properties/a/pattern: unsupported keyword").
                                        // Ignored by gptoss_chat (use request->response_format).
} gptoss_sampling_params;

GPTOSS_API void gptoss_sampling_params_init(gptoss_sampling_params* params, size_t struct_size);

static inline gptoss_sampling_params gptoss_sampling_default_params(void) {
    gptoss_sampling_params params;
    gptoss_sampling_params_init(&params, sizeof params);
    return params;
}

typedef enum gptoss_channel {
    GPTOSS_CHANNEL_NONE       = 0,
    GPTOSS_CHANNEL_ANALYSIS   = 1,    // chain of thought
    GPTOSS_CHANNEL_COMMENTARY = 2,    // tool calls and preambles
    GPTOSS_CHANNEL_FINAL      = 3,    // the answer for the user
} gptoss_channel;

typedef enum gptoss_stop_reason {
    GPTOSS_STOP_RETURN       = 0,     // sampled <|return|>: the answer is complete
    GPTOSS_STOP_CALL         = 1,     // sampled <|call|>: the model is calling a tool
    GPTOSS_STOP_TOKEN        = 2,     // sampled another token from stop_tokens
    GPTOSS_STOP_STRING       = 3,     // produced one of stop_strings (not included in the output)
    GPTOSS_STOP_MAX_TOKENS   = 4,
    GPTOSS_STOP_CONTEXT_FULL = 5,
    GPTOSS_STOP_CANCELLED    = 6,     // gptoss_session_cancel() or a callback returned false
} gptoss_stop_reason;

// One sampled token.
typedef struct gptoss_event {
    uint32_t       struct_size;       // grows in later versions; check before reading new fields
    int32_t        token;
    const char*    text;              // complete UTF-8 characters this token finished; often ""
    size_t         text_len;
    gptoss_channel channel;           // chat: channel of the message being written
    const char*    recipient;         // chat: "functions.NAME" while writing a tool call, else NULL
} gptoss_event;

// Called once per sampled token. Return false to stop generating. Must not call gptoss
// functions on the same session, except gptoss_session_cancel(). On one GPU (a model without
// decode batching) the forward pass of this token already runs while the callback does, so
// time spent here overlaps decoding, up to one step.
typedef bool (*gptoss_event_fn)(void* user_data, const gptoss_event* event);

// ---------------------------------------------------------------------------
// Generate: raw tokens in, tokens out

typedef struct gptoss_generate_result {
    uint32_t           struct_size;
    const int32_t*     tokens;            // sampled tokens, including the stop token if any
    size_t             n_tokens;
    const char*        text;              // `tokens` as text, special tokens included
    size_t             text_len;
    gptoss_stop_reason stop_reason;
    uint32_t           n_prompt_tokens;
    uint32_t           n_cached_tokens;   // prompt tokens reused from the session, not recomputed
    double             prefill_ms;
    double             decode_ms;
} gptoss_generate_result;

// Continues `prompt`, which is the whole prompt rather than the tokens since the last call.
// The session reuses the longest prefix of `prompt` it has already processed.
// `sampling` may be NULL for defaults; `on_event` may be NULL.
// On success stores a result owned by the session in *result_out, valid until the next
// gptoss_generate(), gptoss_chat() or gptoss_session_free() on this session.
// If the prompt does not fit, returns GPTOSS_ERR_CONTEXT_FULL and the session is unchanged.
GPTOSS_API gptoss_status gptoss_generate(gptoss_session* session,
                                         const int32_t* prompt, size_t n_prompt,
                                         const gptoss_sampling_params* sampling,
                                         gptoss_event_fn on_event, void* user_data,
                                         const gptoss_generate_result** result_out);

// ---------------------------------------------------------------------------
// Chat: Harmony messages in, parsed messages out

typedef enum gptoss_role {
    GPTOSS_ROLE_USER      = 0,
    GPTOSS_ROLE_ASSISTANT = 1,
    GPTOSS_ROLE_TOOL      = 2,
    // The system and developer messages are rendered from gptoss_chat_request.
} gptoss_role;

typedef enum gptoss_reasoning_effort {
    GPTOSS_REASONING_LOW    = 0,
    GPTOSS_REASONING_MEDIUM = 1,
    GPTOSS_REASONING_HIGH   = 2,
} gptoss_reasoning_effort;

// One Harmony message. The layout of this struct never changes (arrays need a fixed stride).
typedef struct gptoss_message {
    gptoss_role    role;
    gptoss_channel channel;        // assistant: ANALYSIS, COMMENTARY or FINAL (NONE renders no
                                   // channel); tool: COMMENTARY; user: ignored
    const char*    content;        // required (may be "")
    const char*    author;         // tool results: the tool, e.g. "functions.get_weather", which an
                                   // earlier assistant message must have as recipient; else NULL
    const char*    recipient;      // tool calls: e.g. "functions.get_weather"; tool results: NULL
                                   // renders "to=assistant"; else NULL. No whitespace.
    const char*    content_type;   // tool calls: "json" or, as the parser returns it,
                                   // "<|constrain|>json" (both render " <|constrain|>json"); any
                                   // other value renders as plain " value"; else NULL
} gptoss_message;

// A function the model may call. Layout never changes.
typedef struct gptoss_tool {
    const char* name;              // "get_weather"; the model calls it as functions.get_weather
    const char* description;
    const char* parameters;        // JSON Schema of the argument object; NULL if none
} gptoss_tool;

// Which tool calls gptoss_chat allows (OpenAI's tool_choice).
typedef enum gptoss_tool_choice {
    GPTOSS_TOOL_CHOICE_AUTO     = 0,  // the model decides (no constraint)
    GPTOSS_TOOL_CHOICE_NONE     = 1,  // no tool call can be opened
    GPTOSS_TOOL_CHOICE_REQUIRED = 2,  // the next message is a call to one of the tools
    GPTOSS_TOOL_CHOICE_NAMED    = 3,  // the next message is a call to tool_choice_name
} gptoss_tool_choice;

// What the final answer must be (OpenAI's response_format).
typedef enum gptoss_response_format {
    GPTOSS_RESPONSE_FORMAT_TEXT        = 0,  // free text
    GPTOSS_RESPONSE_FORMAT_JSON_OBJECT = 1,  // any JSON object
    GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA = 2,  // JSON matching response_format_schema
} gptoss_response_format;

typedef struct gptoss_chat_request {
    uint32_t                struct_size;      // set by gptoss_chat_request_init
    const gptoss_message*   messages;         // the conversation so far, oldest first
    size_t                  n_messages;
    const char*             instructions;     // the developer message ("system prompt"). Default NULL.
    const gptoss_tool*      tools;            // Default none.
    size_t                  n_tools;
    gptoss_reasoning_effort reasoning_effort; // Default MEDIUM.
    const char*             current_date;     // "YYYY-MM-DD" for the system message. Default NULL: omitted.
    bool                    keep_analysis;    // Default false: drop the analysis of turns that ended
                                              // in a final answer, as Harmony prescribes.
    // Appended in 0.1 (constrained decoding, README "Structured output"). The analysis channel's
    // text is never held to a schema.
    gptoss_tool_choice      tool_choice;      // Default AUTO. REQUIRED/NAMED constrain the next message's
                                              // header to a call ("to=functions.NAME"), then its arguments.
    const char*             tool_choice_name; // NAMED: the function, "get_weather" (must be in tools). Else NULL.
    bool                    constrain_tool_arguments; // Default true: a call's arguments, from <|message|>
                                              // to <|call|>, match the tool's parameters schema (tools
                                              // without parameters stay free). false: no constraint.
    gptoss_response_format  response_format;  // Default TEXT. JSON_*: the developer message gets Harmony's
                                              // "# Response Formats" section and the final-channel message
                                              // is constrained to the schema (JSON_OBJECT: any object).
    const char*             response_format_name;        // JSON_SCHEMA: the format's name (required)
    const char*             response_format_description; // optional, rendered as "// description"
    const char*             response_format_schema;      // JSON_SCHEMA: the JSON Schema (required)
    // Appended in 0.1 (a reasoning budget; OpenAI-style JSON "thinking_token_budget", as vLLM):
    uint32_t                max_reasoning_tokens; // Default UINT32_MAX: no bound. Otherwise the analysis
                                              // takes at most this many tokens, then the library writes
                                              // <|end|> and the answer's header (0: no analysis). This or
                                              // response_format JSON_* makes the turn one analysis message at
                                              // most, then the answer: headers are forced to
                                              // "<|channel|>final<|message|>" or, with tool_choice AUTO, a
                                              // call (no preambles). max_tokens still counts every token.
} gptoss_chat_request;

GPTOSS_API void gptoss_chat_request_init(gptoss_chat_request* request, size_t struct_size);

static inline gptoss_chat_request gptoss_chat_default_request(void) {
    gptoss_chat_request request;
    gptoss_chat_request_init(&request, sizeof request);
    return request;
}

// A tool call made by the model. Layout never changes.
typedef struct gptoss_tool_call {
    const char* name;              // without namespace: "get_weather"
    const char* recipient;         // as written: "functions.get_weather"
    const char* arguments;         // as written; normally JSON; not validated
    const char* content_type;      // "json", another type, or NULL
} gptoss_tool_call;

typedef struct gptoss_chat_result {
    uint32_t                struct_size;
    const char*             final;          // the answer for the user; "" if none
    const char*             analysis;       // chain of thought; not held to the safety standard of
                                            // final answers, so do not show it to end users
    const gptoss_tool_call* tool_calls;     // the assistant messages with a recipient; NULL if none
    size_t                  n_tool_calls;
    const gptoss_message*   messages;       // this turn's assistant messages, parsed; append them
                                            // to the history as they are (NULL if none)
    size_t                  n_messages;
    gptoss_stop_reason      stop_reason;
    const char*             raw;            // the completion as text, special tokens included
                                            // (valid UTF-8: a cut-off character becomes U+FFFD)
    uint32_t                n_prompt_tokens;
    uint32_t                n_cached_tokens;
    uint32_t                n_completion_tokens;
    double                  prefill_ms;
    double                  decode_ms;
} gptoss_chat_result;

// Renders `request` in the Harmony format, up to and including "<|start|>assistant", exactly
// as openai/harmony renders it, with the analysis of every turn that ended in a final message
// dropped unless request->keep_analysis. Message text is always plain text: content spelling
// "<|end|>" cannot become a special token. Buffer rules as for gptoss_tokenize(). Useful for
// gptoss_generate() and for tests. A NULL string that is required, an unknown enum value,
// non-UTF-8 text, a tool result answering no earlier tool call, or a tool whose parameters are
// not a JSON Schema object fails with GPTOSS_ERR_INVALID_ARGUMENT naming the field
// ("messages[3].content: invalid UTF-8 at byte 5", "tools[0].parameters.properties: ...").
GPTOSS_API gptoss_status gptoss_chat_render(const gptoss_model* model,
                                            const gptoss_chat_request* request,
                                            int32_t* tokens, size_t capacity,
                                            size_t* n_tokens_out);

// Generates the assistant's next turn for `request` and parses it. Sampling stops on
// <|return|>, <|call|> or <|endoftext|> (never on <|end|>, which ends each analysis message);
// sampling->stop_tokens is ignored and sampling->stop_strings match final-channel text only.
// The parser is lenient: a malformed message header never fails the call; its text still
// appears in `raw`. Requests are checked as by gptoss_chat_render().
// `sampling` may be NULL for defaults; `on_event` may be NULL.
// The session reuses the longest prefix it still holds; the next turn's prompt diverges inside
// the turn generated last (CoT dropping, re-rendered tool calls), and n_cached_tokens shows
// how much was reused.
// On success stores a result owned by the session in *result_out, valid until the next
// gptoss_generate(), gptoss_chat() or gptoss_session_free() on this session.
GPTOSS_API gptoss_status gptoss_chat(gptoss_session* session,
                                     const gptoss_chat_request* request,
                                     const gptoss_sampling_params* sampling,
                                     gptoss_event_fn on_event, void* user_data,
                                     const gptoss_chat_result** result_out);

// ---------------------------------------------------------------------------
// Conversations as JSON: the OpenAI Chat Completions request shape

typedef struct gptoss_conversation gptoss_conversation;

// Parses `json_len` bytes of an OpenAI Chat Completions request body into a chat request:
// "messages" (role system|developer|user|assistant|tool; content as a string or an array of
// {"type":"text","text":...} parts; assistant "tool_calls" with function name/arguments and
// "reasoning_content" or "thinking" as analysis; tool "tool_call_id" or "name"), "tools"
// ({"type":"function","function":{name, description, parameters}}), "reasoning_effort"
// (low|medium|high), "tool_choice" ("auto"|"none"|"required"|{"type":"function","function":
// {"name":...}}), "response_format" ({"type":"text"|"json_object"} or {"type":"json_schema",
// "json_schema":{"name", "description", "schema"}}), "thinking_token_budget" (vLLM's name; an integer
// in [0, UINT32_MAX - 1] → max_reasoning_tokens). System and developer messages become
// `instructions`. Other fields are ignored. On failure returns GPTOSS_ERR_INVALID_ARGUMENT with a message naming the field, for
// example "messages[3].tool_calls[0].function.arguments: expected a string".
// On success stores a new conversation in *conversation_out; release it with
// gptoss_conversation_free().
GPTOSS_API gptoss_status gptoss_conversation_parse_json(const char* json, size_t json_len,
                                                        gptoss_conversation** conversation_out);

// The request the conversation holds, with defaults for what the JSON did not say. It and every
// string it points to live until gptoss_conversation_free(). Returns NULL if `conversation` is NULL.
GPTOSS_API const gptoss_chat_request* gptoss_conversation_get_request(const gptoss_conversation* conversation);

GPTOSS_API void gptoss_conversation_free(gptoss_conversation* conversation);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // GPTOSS_H
