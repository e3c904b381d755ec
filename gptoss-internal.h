// gptoss-internal.h - the engine's private C++ interfaces, shared by gptoss*.cpp, cpu/, cuda/,
// tokenizer/ glue and the tests. Nothing here is installed or exported: the public contract
// is gptoss.h alone.
//
// The seams:
//   errors     fail() records the thread-local message behind gptoss_last_error().
//   Config     config.json, parsed and checked (gptoss-loader.cpp).
//   Checkpoint the mmapped safetensors files and a typed view of every tensor (gptoss-loader.cpp).
//   Backend    one per model: weights in the form a device wants (cpu/, cuda/).
//   BackendSession  one per session: KV cache + scratch; runs the forward pass on token chunks.
//   Model, Session  the objects behind the public handles (gptoss.cpp).
//   session_generate  prefix reuse + prefill + decode loop + sampling; used by gptoss_generate
//                     and by gptoss_chat (gptoss-harmony.cpp).
#pragma once

#include "gptoss.h"

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <vector>

namespace gptoss {

// ---------------------------------------------------------------------------
// Errors and logging (gptoss.cpp)

// Formats the thread-local message behind gptoss_last_error() and returns `status`.
// Messages answer "what, where, expected, found" on one line, no trailing period. Bytes from
// untrusted input that %s copies in are made safe to print: control characters and invalid
// UTF-8 become \xNN (escape_nonprintable), so the message is always printable UTF-8.
[[nodiscard]] gptoss_status fail(gptoss_status status, const char* format, ...)
    __attribute__((format(printf, 2, 3)));
void clear_error();
// `text` with each control character (< 0x20, 0x7f) and each byte of invalid UTF-8 written as
// \xNN (lowercase hex); valid printable UTF-8 is kept. fail() and log() apply it.
std::string escape_nonprintable(std::string_view text);
// Sends one line to the log callback, if one is installed and `level` is high enough.
void log(gptoss_log_level level, const char* format, ...) __attribute__((format(printf, 2, 3)));

#define GPTOSS_TRY(expr)                                   \
    do {                                                   \
        const gptoss_status gptoss_try_status_ = (expr);   \
        if (gptoss_try_status_ != GPTOSS_OK) return gptoss_try_status_; \
    } while (0)

// Runs `body` (returning gptoss_status) with the error text cleared, and turns any escaping
// exception into a status: bad_alloc → OUT_OF_MEMORY, anything else → INTERNAL. Every
// extern "C" entry point runs through it, so no exception crosses the C ABI.
template <typename Body>
gptoss_status guarded(const char* function, const Body& body) {
    try {
        clear_error();
        return body();
    } catch (const std::bad_alloc&) {
        return fail(GPTOSS_ERR_OUT_OF_MEMORY, "%s: out of host memory", function);
    } catch (const std::exception& e) {
        return fail(GPTOSS_ERR_INTERNAL, "%s: unexpected exception: %s", function, e.what());
    } catch (...) {
        return fail(GPTOSS_ERR_INTERNAL, "%s: unexpected exception", function);
    }
}

// Reads an extensible struct the caller passed (API.md §3): copies min(struct_size, sizeof(T))
// bytes over `defaults`, and fails with UNSUPPORTED if a larger struct has a non-zero byte
// beyond sizeof(T). `what` names the struct in the message.
gptoss_status read_extensible(const void* in, size_t sizeof_t, void* out, const char* what);
template <typename T>
[[nodiscard]] gptoss_status read_params(const T* in, T* out, const char* what) {
    return read_extensible(in, sizeof(T), out, what);
}

// Fault injection for tests (STYLE.md §5, SQLite faultsim lite). In builds with
// GPTOSS_FAULT_INJECTION (the sanitizer test build), fault_point() marks a place that
// allocates; after fault_inject_after(n), the n-th point reached throws std::bad_alloc, which
// the C shims turn into GPTOSS_ERR_OUT_OF_MEMORY. Elsewhere it compiles to nothing.
#ifdef GPTOSS_FAULT_INJECTION
void fault_point();
void fault_inject_after(uint64_t n);  // 0 disables
#else
inline void fault_point() {}
#endif

// ---------------------------------------------------------------------------
// bf16 helpers (host)

inline float bf16_to_f32(uint16_t bits) {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}
// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

// ---------------------------------------------------------------------------
// config.json (gptoss-loader.cpp). Field names follow MODEL.md's shape letters.

struct Config {
    uint32_t n_layers = 0;            // num_hidden_layers
    uint32_t n_experts = 0;           // E, num_local_experts
    uint32_t n_experts_per_token = 0; // K, num_experts_per_tok
    uint32_t hidden = 0;              // H, hidden_size (multiple of 32)
    uint32_t intermediate = 0;        // I, intermediate_size (multiple of 32)
    uint32_t n_heads = 0;             // Q, num_attention_heads
    uint32_t n_kv_heads = 0;          // G, num_key_value_heads (divides Q)
    uint32_t head_dim = 0;            // D, head_dim (even)
    uint32_t vocab = 0;               // V, vocab_size
    uint32_t sliding_window = 0;      // keys visible to a sliding layer, self included (128)
    uint32_t max_context = 0;         // max_position_embeddings
    float rms_norm_eps = 1e-5f;
    float rope_theta = 150000.0f;
    // rope_scaling (YaRN). factor 1 with no rope_scaling object means plain RoPE.
    float rope_factor = 1.0f;
    float rope_beta_fast = 32.0f;
    float rope_beta_slow = 1.0f;
    uint32_t rope_original_max_context = 4096;
    bool rope_truncate = false;
    float swiglu_limit = 7.0f;
    std::vector<bool> layer_sliding;  // [n_layers]: true for "sliding_attention"
    std::vector<int32_t> eos_token_ids;  // from config.json / generation_config.json, may be empty
};

// Reads and checks `dir`/config.json. Fails with IO (missing) or FORMAT (not JSON, missing or
// inconsistent field), naming the file and field.
[[nodiscard]] gptoss_status load_config(const std::string& dir, Config* out);
// The same checks on `len` bytes of config.json text (`path` names it in messages), without
// generation_config.json. The seam tests/fuzz/fuzz-config.cpp drives.
[[nodiscard]] gptoss_status parse_config_json(const std::string& path, const char* json, size_t len,
                                              Config* out);

// ---------------------------------------------------------------------------
// Checkpoint (gptoss-loader.cpp)

enum class DType : uint8_t { BF16, F32, U8 };

// A tensor inside a mapped safetensors file. `data` points into the mapping and lives as long
// as the Checkpoint.
struct Tensor {
    const void* data = nullptr;
    DType dtype = DType::BF16;
    std::vector<uint64_t> shape;
    uint64_t n_bytes = 0;
    std::string name;
    const uint16_t* bf16() const { return static_cast<const uint16_t*>(data); }
    const uint8_t* u8() const { return static_cast<const uint8_t*>(data); }
};

struct LayerWeights {
    bool sliding = false;
    Tensor attn_norm;                 // bf16 [H]
    Tensor q_weight, q_bias;          // bf16 [Q*D, H], [Q*D]
    Tensor k_weight, k_bias;          // bf16 [G*D, H], [G*D]
    Tensor v_weight, v_bias;          // bf16 [G*D, H], [G*D]
    Tensor o_weight, o_bias;          // bf16 [H, Q*D], [H]
    Tensor sinks;                     // bf16 or f32 [Q]
    Tensor mlp_norm;                  // bf16 [H]
    Tensor router_weight, router_bias;  // bf16 [E, H], [E]
    Tensor gate_up_blocks;            // u8 [E, 2I, H/32, 16]   rows interleaved gate0, up0, gate1, ...
    Tensor gate_up_scales;            // u8 [E, 2I, H/32]       E8M0
    Tensor gate_up_bias;              // bf16 [E, 2I]
    Tensor down_blocks;               // u8 [E, H, I/32, 16]
    Tensor down_scales;               // u8 [E, H, I/32]
    Tensor down_bias;                 // bf16 [E, H]
};

struct Weights {
    Tensor embed;                     // bf16 [V, H]
    std::vector<LayerWeights> layers;
    Tensor norm;                      // bf16 [H]
    Tensor lm_head;                   // bf16 [V, H]
};

// Loading progress: fraction in [0, 1]; return false to cancel.
using ProgressFn = std::function<bool(float)>;

struct MappedFile;  // defined in gptoss-loader.cpp

struct Checkpoint {
    Config config;
    Weights weights;
    std::vector<std::unique_ptr<MappedFile>> files;
    uint64_t total_bytes = 0;         // bytes of tensor data in all shards
    Checkpoint();
    ~Checkpoint();
};

// Opens `dir` (config.json + model.safetensors or model.safetensors.index.json and shards),
// maps every shard and checks every tensor (dtype, shape against config, offsets, overlaps,
// coverage). Unexpected extra tensors are logged as warnings. `progress` may be empty; it is
// called at least once per shard. On failure nothing stays mapped.
[[nodiscard]] gptoss_status load_checkpoint(const std::string& dir, const ProgressFn& progress,
                                            std::unique_ptr<Checkpoint>* out);

// The checks load_checkpoint applies to one shard, on `size` bytes in memory (`path` names it in
// messages): header length, JSON header, dtypes, shapes, data_offsets inside the data region,
// alignment, and a data region tiled exactly (no overlap, no gap). Appends the tensor names to
// *names when it is not NULL. FORMAT naming the tensor on failure. tests/fuzz/fuzz-safetensors.
[[nodiscard]] gptoss_status check_safetensors_shard(const std::string& path, const uint8_t* data,
                                                    size_t size, std::vector<std::string>* names);
// Parses model.safetensors.index.json text: shard file names in order of first appearance
// (plain names in the model directory: no '/', ".", ".."), and the shard of each tensor.
// FORMAT naming the entry on failure. tests/fuzz/fuzz-index.
[[nodiscard]] gptoss_status read_safetensors_index(const std::string& path, const char* json, size_t len,
                                                   std::vector<std::string>* shards,
                                                   std::map<std::string, std::string>* weight_map);

// ---------------------------------------------------------------------------
// Sampling (gptoss-sampling.cpp). One implementation, used by every backend that samples on
// the host; a device sampler must implement the same definition:
//   1. temperature == 0: argmax, lowest id on ties.
//   2. else: z = logits / temperature; keep the top_k largest (if top_k > 0; ties by lower id);
//      p = softmax(z over kept); sort kept by p descending (ties by lower id); keep the shortest
//      prefix whose cumulative p >= top_p (if top_p < 1; at least one token); renormalise;
//      return the first token whose cumulative p exceeds u * total, u in [0, 1).
struct SamplingConfig {
    float temperature = 1.0f;
    float top_p = 1.0f;
    uint32_t top_k = 0;
};
int32_t sample_logits(const float* logits, uint32_t n_vocab, const SamplingConfig& config,
                      double u);

// One splitmix64 step (Blackman & Vigna): advances *state, returns the mixed value.
uint64_t splitmix64(uint64_t* state);

// Deterministic on every machine: splitmix64 seeding + xoshiro256** (Blackman & Vigna).
class Rng {
public:
    explicit Rng(uint64_t seed);
    uint64_t next_u64();
    double next_double();  // [0, 1), 53 random bits
private:
    uint64_t s_[4];
};

// ---------------------------------------------------------------------------
// Backends (cpu/backend.cpp, cuda/backend.cu)

class BackendSession {
public:
    // n_vocab: V, the number of logits the default sample() walks.
    explicit BackendSession(uint32_t n_vocab) : n_vocab_(n_vocab) {}
    virtual ~BackendSession() = default;
    // Prefill: runs `n` tokens (1 <= n <= max_batch) at positions [pos, pos + n): stores their
    // K/V in the cache (a sliding layer keeps the last `sliding_window` positions in a ring,
    // slot = position % window) and keeps the logits of the last token for get_logits()/
    // sample(). Chunk-invariant: a position's K/V and logits are bit-identical however the
    // positions before it were split into forward() calls.
    // Precondition, guaranteed by the engine: the K/V of positions [0, pos) that each layer
    // keeps are valid, and pos + n <= max_context.
    [[nodiscard]] virtual gptoss_status forward(const int32_t* tokens, uint32_t n, uint32_t pos) = 0;
    // Decode: one token at `pos`, same contract as forward(&token, 1, pos) except that its
    // kernels may sum in an order of their own, so its K/V and logits equal forward()'s only
    // within bf16 tolerance (deterministically, run to run). The engine never reuses K/V
    // written by decode() in a later call: it re-prefills those positions (session.n_prefilled).
    [[nodiscard]] virtual gptoss_status decode(int32_t token, uint32_t pos) { return forward(&token, 1, pos); }
    // Host copy of the logits [V] (fp32) of the last token of the latest forward(). The pointer
    // lives until the next call on this object.
    [[nodiscard]] virtual gptoss_status get_logits(const float** logits_out) = 0;
    // Samples from the latest logits with `u` drawn by the engine. The default samples on the
    // host with sample_logits(); a device backend may override it with the same definition.
    [[nodiscard]] virtual gptoss_status sample(const SamplingConfig& config, double u, int32_t* token_out);
    // sample() over the logits with every token whose bit is clear in `allowed` set to -inf
    // (allowed: ceil(V/32) words, bit t%32 of word t/32 for token t; at least one bit set).
    // The latest logits may stay masked afterwards. The default masks a host copy; a device
    // backend masks on the device (cuda/mask.cu) so the logits never come to the host.
    [[nodiscard]] virtual gptoss_status sample_masked(const SamplingConfig& config, double u, const uint32_t* allowed,
                                                      int32_t* token_out);
    // The pipelined decode loop (gptoss-decode-pipeline.cpp; issue 12): the sampled token feeds
    // the next decode step on the device, so the host reads token k (and runs the caller's
    // callback) while the device already runs the forward of token k and samples k + 1.
    // sample_ahead(config, u, allowed): sample() from the latest logits (sample_masked() when
    // `allowed` is not null; it is read during the call), the token kept for decode_sampled()
    // and fetch_sampled(); decode_sampled(pos): decode(that token, pos);
    // fetch_sampled(): the token to the host (waits for it). Each sample_ahead() is followed by
    // at most one decode_sampled() and one fetch_sampled(), in either order, before the next
    // sample_ahead(). The results are those of sample() + decode(): the same tokens, logits and
    // K/V. The defaults run sample() at once (nothing overlaps); a device backend overrides
    // all three and says so with pipelines_decode().
    virtual bool pipelines_decode() const { return false; }
    [[nodiscard]] virtual gptoss_status sample_ahead(const SamplingConfig& config, double u, const uint32_t* allowed);
    [[nodiscard]] virtual gptoss_status decode_sampled(uint32_t pos);
    [[nodiscard]] virtual gptoss_status fetch_sampled(int32_t* token_out);
    // Copies every sliding layer's ring (API.md §6) aside / back. After restore, the cache
    // holds for sliding layers what it held at the save; full layers are untouched (their
    // entries below the saved position are still valid, since the engine only rewinds).
    [[nodiscard]] virtual gptoss_status save_sliding_snapshot() = 0;
    [[nodiscard]] virtual gptoss_status restore_sliding_snapshot() = 0;

protected:
    const uint32_t n_vocab_;
    int32_t ahead_token_ = -1;  // the defaults' token of the latest sample_ahead(); -1: none
};

// One session's share of a batched step (gptoss-batch.cpp): a decode token (prefill false,
// n 1: decode(tokens[0], pos) semantics) or a prefill chunk (prefill true: forward(tokens, n,
// pos) semantics, chunk-invariant K/V). `tokens` is borrowed for the step. The backend sets
// status (and, on failure, error: the message for that session's caller) for every item.
// Sampling in the step (decode items only): with `sampling` set (borrowed), a backend may also
// sample the next token from the step's logits as session->sample(*sampling, u) would, exactly,
// and put it in `sampled`; it leaves `sampled` at -1 when it does not (the caller then samples
// with the same u itself). The logits stay available either way.
struct DecodeItem {
    BackendSession* session = nullptr;
    const int32_t* tokens = nullptr;
    uint32_t n = 1;
    uint32_t pos = 0;
    bool prefill = false;
    const SamplingConfig* sampling = nullptr;
    double u = 0.0;
    int32_t sampled = -1;
    gptoss_status status = GPTOSS_OK;
    std::string error;
};

class Backend {
public:
    virtual ~Backend() = default;
    [[nodiscard]] virtual gptoss_status create_session(uint32_t max_context, uint32_t max_batch,
                                                       std::unique_ptr<BackendSession>* out) = 0;
    virtual uint64_t weight_bytes() const = 0;   // memory held for the weights (device or host copies)
    virtual int32_t device() const = 0;          // CUDA ordinal or GPTOSS_DEVICE_CPU
    virtual uint32_t default_max_batch() const = 0;
    // Layers whose MoE experts are in host memory, and the host bytes they hold (issue 16).
    virtual uint32_t n_cpu_moe() const { return 0; }
    virtual uint64_t host_weight_bytes() const { return 0; }
    // Runs n items, each on its own session (distinct sessions of this backend), as if each
    // ran session->decode(tokens[0], pos) or, for a prefill item, forward(tokens, n, pos)
    // alone: a session's K/V and logits must be bit-identical whatever else is in the batch
    // (batch invariance). Never throws past an item: a failure is that item's status. Called
    // by one thread at a time (the model's DecodeBatcher). The default runs them in turn.
    // A backend may run work for an item's session beyond the call (the CUDA step's speculative
    // forward of each sampled token at pos + 1, whose K/V it writes: never reused, see
    // gptoss_session::kv_past_end); drop_speculation, called by the batcher when `session`
    // leaves and no step runs, waits for such work and forgets that session's part of it.
    // rows_stable: the batcher expects the next step's decode items to be among these (no
    // prompt chunk in this step or waiting, every session in a decode loop is in it), so such
    // work is likely used; false: the next step probably has new rows, do not start any.
    virtual void decode_batch(DecodeItem* const* items, uint32_t n, bool rows_stable);
    virtual bool speculates() const { return false; }  // whether decode_batch may run such work
    virtual void drop_speculation(BackendSession* /*session*/) {}
};

// cpu/backend.cpp. Keeps pointers into `checkpoint`, which must outlive the backend.
[[nodiscard]] gptoss_status create_cpu_backend(const Checkpoint& checkpoint, std::unique_ptr<Backend>* out);

#ifdef GPTOSS_HAVE_CUDA
// cuda/backend.cu. Number of usable CUDA devices (0 when there is no driver or no GPU).
int cuda_device_count();
[[nodiscard]] gptoss_status create_cuda_backend(const Checkpoint& checkpoint, int32_t device,
                                                const ProgressFn& progress,
                                                std::unique_ptr<Backend>* out);
// The same with experts in host memory as `request` asks (gptoss-offload.h).
struct OffloadRequest;
[[nodiscard]] gptoss_status create_cuda_backend(const Checkpoint& checkpoint, int32_t device,
                                                const OffloadRequest& request, const ProgressFn& progress,
                                                std::unique_ptr<Backend>* out);
#endif

// ---------------------------------------------------------------------------
// Model and session (gptoss.cpp)

class Tokenizer;  // tokenizer/tokenizer.h

// Continuous batching (gptoss-batch.cpp): gathers the decode steps of the sessions of one
// model that are decoding at the same time, from whatever threads run them, into one
// Backend::decode_batch call of at most max_sessions items.
class DecodeBatcher {
public:
    // invariant: gptoss_model_params.batch_invariant resolved (resolve_batch_invariant). When
    // false, a step whose decode tokens are a single session's runs through the base
    // Backend::decode_batch, i.e. that session's own decode() (after drop_speculation for it:
    // an earlier step's speculative forward may still hold its next position).
    DecodeBatcher(Backend& backend, uint32_t max_sessions, bool invariant = true);
    ~DecodeBatcher();
    // A session's decode loop is inside enter() .. leave(): the batcher waits for the
    // sessions inside (up to a short gather window) before it starts a step.
    void enter();
    void leave(BackendSession* session);
    // Runs one decode token (or, with `prefill`, a prompt chunk of n tokens) of `session` as
    // part of a step; blocks until it is done. A step holds every pending decode token (up to
    // max_sessions) and then prefill chunks, oldest first, while it has at most
    // step_token_budget() tokens (at least one chunk), so a long prompt enters chunk by chunk
    // between the streams' steps. On failure records the session's own message (fail()) and
    // returns its status. `sampling`, `u`, `sampled`: DecodeItem's (decode tokens only; may be
    // null; *sampled is -1 when the step did not sample).
    [[nodiscard]] gptoss_status run(BackendSession* session, const int32_t* tokens, uint32_t n, uint32_t pos,
                                    bool prefill, const SamplingConfig* sampling = nullptr, double u = 0.0,
                                    int32_t* sampled = nullptr);
    // Tokens per step (decode tokens + prompt chunks) beyond which no further chunk joins:
    // kStepTokenBudget, or GPTOSS_DECODE_BATCH_TOKEN_BUDGET (64..65536; read once per process).
    // 4096 (vLLM's and TensorRT-LLM's token budgets are 2048-8192): 64 streams arriving at once
    // with 512-token prompts join up to 8 per step, so the last one starts sooner; H200, 20b, 64
    // streams of 256 tokens: 5 617-5 743 -> 6 018-6 037 tok/s, TTFT p99 1.15-1.19 -> 1.03 s
    // against 512 (bench/NOTES.md "v22 batched MoE"). The cost is inter-token latency while
    // prompts join: there a running stream's step took ~90-110 ms (8 chunks of 512 at once)
    // instead of ~15-25 ms (one); set the variable lower where that matters more than time to
    // first token.
    static constexpr uint32_t kStepTokenBudget = 4096;
    static uint32_t step_token_budget();
    uint32_t max_sessions() const { return max_sessions_; }
    // Steps with decode tokens run, and decode tokens run, so far (tokens / steps = mean batch);
    // lone_steps (may be null): how many of those steps ran one session's own decode()
    // (batch invariance off).
    void counters(uint64_t* steps, uint64_t* tokens, uint64_t* lone_steps = nullptr) const;
    bool invariant() const { return invariant_; }

private:
    struct State;
    Backend& backend_;
    const uint32_t max_sessions_;
    const bool invariant_;
    std::unique_ptr<State> state_;
};

// Resolves the decode batch cap from params.max_decode_batch and GPTOSS_DECODE_BATCH
// (gptoss-batch.cpp): 1 means off. Fails with INVALID_ARGUMENT naming a bad value.
[[nodiscard]] gptoss_status resolve_max_decode_batch(uint32_t param, uint32_t* out);
// Resolves params.batch_invariant (0: GPTOSS_BATCH_INVARIANT, else on) into *out
// (gptoss-batch.cpp). Fails with INVALID_ARGUMENT naming a bad value.
[[nodiscard]] gptoss_status resolve_batch_invariant(int32_t param, bool* out);
// An on/off environment variable (gptoss-batch.cpp): *out = 1 for "1", 0 for "0", -1 when unset
// or empty; anything else INVALID_ARGUMENT naming the variable and its value.
[[nodiscard]] gptoss_status env_switch(const char* name, int* out);

}  // namespace gptoss

struct gptoss_model {
    std::atomic<int> refs{1};                         // caller's hold + one per session
    std::unique_ptr<gptoss::Checkpoint> checkpoint;
    std::unique_ptr<gptoss::Backend> backend;
    std::shared_ptr<const gptoss::Tokenizer> tokenizer;  // null if the directory has none
    std::string name;
    std::atomic<bool> poisoned{false};                // a CUDA error happened: every call fails
    std::unique_ptr<gptoss::DecodeBatcher> batcher;   // null: each session decodes alone
    int decode_pipeline = -1;                         // GPTOSS_DECODE_PIPELINE at load: 0 off, 1 on,
                                                      // -1 unset (the backend decides)
    std::mutex mutex;                                 // guards session creation and token_table
    std::shared_ptr<const void> token_table;          // schema::TokenTable, built by the first
                                                      // constrained call (gptoss-constraint.cpp)
    ~gptoss_model();
};

namespace gptoss {

// Storage for a gptoss_generate_result; the session keeps two and swaps (API.md §2).
struct GenerateResultStorage {
    gptoss_generate_result result{};
    std::vector<int32_t> tokens;
    std::string text;
};

}  // namespace gptoss

struct gptoss_session {
    gptoss_model* model = nullptr;
    std::unique_ptr<gptoss::BackendSession> backend;
    uint32_t max_context = 0;
    uint32_t max_batch = 0;
    std::vector<int32_t> cached;          // tokens whose K/V the cache holds, positions 0..n-1
    uint32_t n_prefilled = 0;             // cached[0..n_prefilled) were written by forward() (the
                                          // prefill path); later ones by decode(), never reused
    uint32_t snapshot_pos = 0;            // sliding rings saved after position snapshot_pos-1; 0: none
    bool kv_past_end = false;             // K/V of position cached.size() may have been written too
                                          // (a batched step's speculative forward): the sliding rings
                                          // hold [n + 1 - W, n + 1), position n's entry unusable
    std::atomic<bool> cancel_requested{false};
    std::atomic<bool> running{false};
    gptoss::GenerateResultStorage generate_results[2];
    int generate_current = 0;
    std::shared_ptr<void> chat_result;    // owned by gptoss-harmony.cpp
    std::shared_ptr<void> chat_result_previous;
};

namespace gptoss {

// What session_generate reports to its caller for each sampled token.
// Return kContinue to go on, or a gptoss_stop_reason to stop after this token.
constexpr int kContinue = -1;
using TokenHook = std::function<int(int32_t token)>;

// Constrained decoding (gptoss-constraint.cpp): which tokens may come next. The generation loop
// asks mask() before each token and reports the sampled one to accept().
class TokenConstraint {
public:
    virtual ~TokenConstraint() = default;
    // Fills `allowed` (n_words words, bit t%32 of word t/32 = token t may come next) and returns
    // true, or returns false (leaving it alone) when every token may come. Never all zero.
    virtual bool mask(uint32_t* allowed, uint32_t n_words) = 0;
    virtual void accept(int32_t token) = 0;
};

// gptoss_generate's json_schema: the text from the first sampled token on is one JSON document
// matching the schema, then one of `end_tokens`. INVALID_ARGUMENT (naming `where`) for a schema
// that does not compile.
[[nodiscard]] gptoss_status make_json_constraint(gptoss_model* model, std::string_view schema,
                                                 const std::string& where, std::vector<int32_t> end_tokens,
                                                 std::shared_ptr<TokenConstraint>* out);

// gptoss_chat's constraints over a Harmony turn that starts after "<|start|>assistant":
// tool-call arguments (tools with a grammar, from <|message|> to <|call|>), the final-channel
// message (response), tool_choice NONE (no recipient can be written: no token holding '=' in a
// header, no <|call|>) and REQUIRED/NAMED (the first message's header is forced to
// "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>" for one of `forced`).
struct ChatConstraintSpec {
    std::vector<std::pair<std::string, std::string>> tool_schemas;  // name → parameters schema (constrained)
    std::vector<std::string> forced;       // REQUIRED/NAMED: the functions the first message may call
    bool forbid_calls = false;             // NONE
    std::string response_schema;           // empty: the final channel is free
    // The turn's shape (response_format JSON_* or a reasoning budget; gptoss-constraint.cpp):
    // headers forced to analysis (first message only, unless the budget is 0), final or a call
    // to one of `callable`; the analysis ends with <|end|> after at most max_reasoning_tokens.
    bool shaped = false;
    uint32_t max_reasoning_tokens = UINT32_MAX;
    std::vector<std::string> callable;     // tool_choice AUTO: the tools the answer may call
};
// Returns a null *out when the spec constrains nothing. Schema errors name the field
// ("tools[1].parameters: /properties/a/pattern: unsupported keyword ...").
[[nodiscard]] gptoss_status make_chat_constraint(gptoss_model* model, const ChatConstraintSpec& spec,
                                                 const std::vector<std::string>& tool_where,
                                                 const std::string& response_where,
                                                 std::shared_ptr<TokenConstraint>* out);

struct GenerateOptions {
    SamplingConfig sampling;
    uint64_t seed = 0;                    // already resolved (never GPTOSS_SEED_RANDOM)
    uint32_t max_tokens = 0;              // 0: until a stop or a full context
    std::vector<int32_t> stop_tokens;
    TokenHook on_token;                   // may be empty
    uint32_t snapshot_at = 0;             // where to snapshot the sliding rings: 0 (or >= n_prompt)
                                          // = end of the prefill; else this prompt position. Chat
                                          // passes where the next turn's CoT drop will diverge.
    std::shared_ptr<TokenConstraint> constraint;  // null: unconstrained (the plain sample() path)
};

struct GenerateOutput {
    std::vector<int32_t> tokens;          // sampled, including the stop token if any
    gptoss_stop_reason stop_reason = GPTOSS_STOP_MAX_TOKENS;
    uint32_t n_prompt_tokens = 0;
    uint32_t n_cached_tokens = 0;
    double prefill_ms = 0;
    double decode_ms = 0;
};

// The generation loop behind gptoss_generate and gptoss_chat: reuses the longest cached prefix
// (restoring the sliding snapshot where API.md §6 needs it), prefills the rest in chunks of
// max_batch (checking cancel between chunks), snapshots the sliding rings, then samples until
// a stop token, max_tokens, a full context, cancel, or on_token says stop. On failure the
// session's cache is left consistent (cached is trimmed to what the cache really holds).
[[nodiscard]] gptoss_status session_generate(gptoss_session* session, const int32_t* prompt,
                                             size_t n_prompt, const GenerateOptions& options,
                                             GenerateOutput* out);

// Decodes `token` at `pos` / prefills `n` tokens at `pos` on the session's backend, through the
// model's batcher if it has one (gptoss-batch.cpp). DecodeLoop marks a session's decode loop
// for the batcher. With `sampled` non-null the step may also sample the next token with
// (*sampling, u) (DecodeItem): *sampled is that token, or -1 when the caller must sample.
[[nodiscard]] gptoss_status decode_step(gptoss_session* session, int32_t token, uint32_t pos,
                                        const SamplingConfig* sampling = nullptr, double u = 0.0,
                                        int32_t* sampled = nullptr);
[[nodiscard]] gptoss_status prefill_step(gptoss_session* session, const int32_t* tokens, uint32_t n, uint32_t pos);

// The decode loop's pieces shared with gptoss-decode-pipeline.cpp (gptoss.cpp). stop_after:
// after sampling `token` (already in out->tokens), whether to stop now (a stop token, on_token's
// verdict, max_tokens, a full context), setting out->stop_reason. forget_cache: the cache's
// content is unknown (a failed forward): nothing counts as cached.
bool stop_after(const gptoss_session* session, const GenerateOptions& options, int32_t token, GenerateOutput* out);
void forget_cache(gptoss_session* session);

// The pipelined decode loop (gptoss-decode-pipeline.cpp). resolve_decode_pipeline: the
// environment variable GPTOSS_DECODE_PIPELINE ("0" / "1"; unset or empty: -1, the backend
// decides), INVALID_ARGUMENT naming it otherwise. use_decode_pipeline: whether this call takes
// the session's calls take the pipelined loop (no batcher, and on by the variable or the backend).
// decode_tokens_pipelined: the decode loop of session_generate, from the prefill's logits on,
// with the same results as the plain loop (tokens, stop reason, cached).
[[nodiscard]] gptoss_status resolve_decode_pipeline(int* out);
bool use_decode_pipeline(const gptoss_session* session);
[[nodiscard]] gptoss_status decode_tokens_pipelined(gptoss_session* session, const GenerateOptions& options,
                                                    GenerateOutput* out);
class DecodeLoop {
public:
    explicit DecodeLoop(gptoss_session* session);
    ~DecodeLoop();
    DecodeLoop(const DecodeLoop&) = delete;
    DecodeLoop& operator=(const DecodeLoop&) = delete;
private:
    DecodeBatcher* batcher_;
    BackendSession* session_;  // the backend session, for leave()
};

// Checks a chat request as gptoss_chat_render() does and renders it as Harmony text (special
// tokens spelled by name), without a model or tokenizer (gptoss-harmony.cpp). `request` must be
// a complete struct (as gptoss_conversation_get_request() gives). tests/fuzz/fuzz-conversation.
[[nodiscard]] gptoss_status render_request_text(const gptoss_chat_request& request, std::string* out);

// Converts public sampling params (already read with read_params) to options; resolves the
// seed (GPTOSS_SEED_RANDOM draws one from std::random_device).
[[nodiscard]] gptoss_status make_generate_options(const gptoss_sampling_params& params,
                                                  GenerateOptions* out);

}  // namespace gptoss
