// cuda/batch_decode.h - batched decode on the GPU (issue 13, part 1): one forward step over N
// sessions' decode tokens, each at its own position with its own KV cache, for
// CudaBackend::decode_batch. Every kernel of the step computes a token's outputs in an order
// that depends only on that token's own row (gemm.cu's 16-row slab × 8-column tiles with the K
// split fixed by the shape; router/RMSNorm per row; the MoE combine in slot order; attention per
// item), so a session's logits are bit-identical alone (N = 1 through this path) or batched.
// They differ from the one-token decode graph (gemm_decode's split-K) in the last bits, as
// decode() may differ from forward(); a model uses one path or the other.
#pragma once

#include "cuda/kernels.h"
#include "cuda/sample_batch.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <chrono>
#include <map>
#include <utility>
#include <vector>

namespace gptoss {
namespace cuda {

// Whether CudaBackend::decode_batch takes this path: yes unless GPTOSS_CUDA_DECODE_BATCH=0 (read
// once per process), which runs each item's decode() in turn (Backend's default) instead.
bool batch_decode_enabled();
// From how many decode items on a step samples its items' next tokens itself
// (DecodeItem::sampling; cuda/sample_batch.h) instead of each session after the step; 0: never.
// GPTOSS_DECODE_BATCH_SAMPLE = N (0 off; read once per process), default 8 with speculation
// (batch_speculation_enabled), else 32. Either way a session gets the same tokens (sample_rows
// reproduces cuda::sample bit for bit), so the choice is speed only: H200, bench/NOTES.md "v14
// batched decode": in the step +5 % at 64 streams, -4 % at 8 (the sessions' own samplers overlap
// their threads' wake-ups with the step; one batched launch waits for the step, then wakes
// them); "v28": with speculation (which needs every row sampled in the step) from 8 items, 8
// streams +2.7 % against from 32.
uint32_t batch_sample_min_items();
// Whether batched steps speculate their next forward (BatchDecoder::drop_speculation's comment):
// on unless GPTOSS_DECODE_BATCH_SPECULATE=0 (read once per process). H200, 20b, bench/NOTES.md
// "v28": 64 streams +4.6 %, issue 13's 32 / 64-stream rows +4.2 / +2.7 %; steps under
// batch_sample_min_items() tokens never sample in the step, so never speculate.
bool batch_speculation_enabled();

// One item's KV cache of one layer (device pointers [slots, G, D] bf16) and its position.
struct BatchAttentionItem {
    uint16_t* k_cache;
    uint16_t* v_cache;
    uint32_t slots;
    int32_t pos;
};

// Decode attention (fused RoPE, cache write) for n_items queries: item i's qkv row is
// a.qkv + i·(Q + 2G)·D, its output row a.out + i·Q·D (bf16 permuted), its cache and position
// items[i] (device array). a.window / sinks / Q / G / D / inv_freq / rope_scale are shared;
// a.step, a.k_cache, a.v_cache, a.slots are ignored. partial: fp32 [n_items, Q, max_splits, D + 2];
// counters: int [n_items, G], zero before the first call (re-armed by the kernel). max_splits
// must cover every item's visible keys (batch_splits_needed). Item i's bits depend only on its
// query, cache and position: not on n_items, nor on how many of its batch_split_len-key splits a
// CTA takes (tensor-core kernel: batch_attention_group's choice from n_items, so that a large batch
// takes each kv head in one CTA with no partials, a lone query one CTA per split). They are not
// attention_decode's (longer splits).
[[nodiscard]] gptoss_status batch_attention_group(uint32_t n_items, uint32_t G, uint32_t max_splits, uint32_t* out);
// Tests and tuning: forces that group (a power of two; 0 = automatic, or GPTOSS_DECODE_BATCH_ATTN_GROUP).
void set_batch_attention_group(uint32_t group);
[[nodiscard]] gptoss_status attention_decode_batch(const AttentionArgs& a, const BatchAttentionItem* items,
                                                   uint32_t n_items, float* partial, int* counters,
                                                   uint32_t max_splits, cudaStream_t stream);

// The weights of one layer, as the CUDA backend holds them (GemmWeights of kernels.h).
struct BatchLayer {
    bool sliding = false;
    const float* attn_norm = nullptr;
    const float* mlp_norm = nullptr;
    const float* sinks = nullptr;
    GemmWeights qkv, o, router, gate_up, down;
};

struct BatchModel {
    uint32_t H = 0, I = 0, E = 0, K = 0, Q = 0, G = 0, D = 0, V = 0;
    uint32_t sliding_window = 0;
    float rms_norm_eps = 0.0f, swiglu_limit = 0.0f, rope_scale = 1.0f;
    const uint16_t* embed = nullptr;   // bf16 [V, H]
    const float* final_norm = nullptr;
    const float* inv_freq = nullptr;   // fp32 [D/2]
    GemmWeights lm_head;
    std::vector<BatchLayer> layers;
};

// One session's token in a step: its caches per layer (n_layers entries), position, token id,
// and where its logits (fp32 [V], device) go; `stream` is the session's stream (the step waits
// for its earlier work, and its later work waits for the step).
struct BatchSlot {
    const BatchAttentionItem* layers = nullptr;  // host array [n_layers]; .pos is ignored
    uint32_t pos = 0;
    int32_t token = 0;
    float* logits = nullptr;
    cudaStream_t stream = nullptr;
    SampleRow sample;  // kSkip (the default): the session samples on its own afterwards
};

// The scratch and stream of batched steps, one step at a time (the model's DecodeBatcher
// guarantees that). Grows its scratch on demand (more items, longer contexts).
class BatchDecoder {
public:
    BatchDecoder() = default;
    ~BatchDecoder();
    BatchDecoder(const BatchDecoder&) = delete;
    BatchDecoder& operator=(const BatchDecoder&) = delete;
    // Runs one step over slots[0..n) (1 <= n <= 65535, distinct sessions, valid tokens and
    // positions: the caller checked them) and returns once every item's logits are in place
    // (the sessions' streams are ordered after the step). Rows whose slot.sample is not kSkip
    // are sampled in the step (cuda/sample_batch.h): sampled[i] (host, n entries, may be null
    // when every row is kSkip) receives the token, -1 for kSkip rows, and their logits are NOT
    // copied to slot.logits; the step then waits for the device. DEVICE / OUT_OF_MEMORY on failure.
    // rows_stable: the caller expects the next step's rows among these (speculate() may run).
    [[nodiscard]] gptoss_status step(const BatchModel& m, const BatchSlot* slots, uint32_t n,
                                     int32_t* sampled = nullptr, bool rows_stable = false);

    // GPTOSS_DECODE_BATCH_TRACE=1 only (else nothing): times a prompt chunk that runs beside the
    // steps on its session's stream (events recorded before it, begin = true, and after it with
    // its `tokens`); read at the next traced step. At destruction: GPU ms per chunk size, and the
    // steps' wall split into steps with a chunk pending beside them and steps without.
    void trace_prefill(cudaStream_t session_stream, uint32_t tokens, bool begin);

    // Speculation (on unless GPTOSS_DECODE_BATCH_SPECULATE=0): when every row of a step is
    // sampled in it, the next step's forward (each row's sampled token at pos + 1) is launched
    // behind the sampler, before the host has the tokens, so the callers' turnaround overlaps it;
    // the next step() whose rows are all among those (same streams, positions and tokens, in any
    // order; rows it lacks are skipped) reuses it instead of running its own. The bits are the
    // same either way (batch invariance). The speculative forward writes each row's K/V at
    // pos + 1 even where its session stops before that token: decode K/V, never reused by a later
    // call (gptoss_session::kv_past_end). drop_speculation forgets the row of the session whose
    // stream is `stream` and, if it had one, waits for the speculative forward still in flight (a
    // session leaving the batch: nothing of it may run on the device after its generation
    // returns, and its next generation's rows must never match this one's; a session without a
    // row leaves at once, since only the latest speculation can still be running).
    gptoss_status drop_speculation(cudaStream_t stream);

private:
    struct SpecRow {
        cudaStream_t stream;
        uint32_t pos;
        int32_t token;  // -1 until the step's sampled tokens are back
    };
    std::vector<SpecRow> spec_;  // the speculative forward in flight (empty: none; stream null: a row dropped)
    // A step that reuses it: its slots in the speculation's row order (rows no slot asks for are
    // skipped rows), the sampled tokens in that order, and each slot's row.
    std::vector<BatchSlot> spec_slots_;
    std::vector<int32_t> spec_sampled_;
    std::vector<uint32_t> spec_row_of_;
    BatchAttentionItem* spec_items_host_ = nullptr;  // pinned [n_layers, cap_items_], inside sampled_host_'s block
    cudaEvent_t spec_copied_ = nullptr;  // recorded after the last copy out of spec_items_host_
    uint64_t spec_launched_ = 0, spec_reused_ = 0;
    bool spec_matches(const BatchSlot* slots, uint32_t n);
    gptoss_status speculate(const BatchModel& m, const BatchSlot* slots, uint32_t n);
    static uint32_t full_splits_for(const BatchSlot* slots, uint32_t n, uint32_t ahead);
    gptoss_status reserve(const BatchModel& m, uint32_t n, uint32_t splits);
    gptoss_status init_stream();  // stream_, done_, sampled_done_, spec_copied_ on the current device
    // The scratch of a step of `items` tokens and `sp` attention splits laid out from `base`:
    // returns its bytes; base null only measures, else the scratch pointers are set into it.
    size_t carve(const BatchModel& m, uint32_t items, uint32_t sp, char* base);
    gptoss_status enqueue(const BatchModel& m, uint32_t n, uint32_t full_splits);
    gptoss_status enqueue_attention(const BatchModel& m, uint32_t l, uint32_t n, uint32_t full_splits);
    gptoss_status enqueue_moe(const BatchModel& m, uint32_t l, uint32_t n);
    gptoss_status dense(uint32_t which, const GemmWeights& w, const uint16_t* x, uint32_t n, Epilogue epilogue,
                        float* out, uint32_t ldo, int nb);
    // The step's kernels as a CUDA graph per (n, splits) for n <= 64, captured on first use (they
    // read the tokens and caches from tokens_ / items_, so one graph serves every step of that
    // shape); GPTOSS_DECODE_BATCH_GRAPH=0 launches them directly.
    gptoss_status launch(const BatchModel& m, uint32_t n, uint32_t splits);
    void drop_graphs();
    int device_ = 0;  // where stream_ and the scratch live (the destructor switches to it)
    cudaStream_t stream_ = nullptr;
    std::map<std::pair<uint32_t, uint32_t>, cudaGraphExec_t> graphs_;
    // GPTOSS_DECODE_BATCH_TRACE=1: each step waits for the device; steps and wall ms per n are
    // printed to stderr when the decoder is destroyed.
    std::map<uint32_t, std::pair<uint64_t, double>> trace_;
    // GPTOSS_DECODE_BATCH_TRACE=1, per n: where a step's wall time goes on the host (ms summed):
    // the gap since the previous step returned (the callers' rendezvous and their per-token work),
    // the per-slot stream ordering, the rest before the graph launch, the launch, the wait; and the
    // step's GPU span (trace_begin_ .. trace_end_).
    struct StepTiming {
        uint64_t steps = 0;
        double gap = 0, order = 0, prep = 0, launch = 0, tail = 0, wait = 0, gpu = 0;
    };
    std::map<uint32_t, StepTiming> timing_;
    using Clock = std::chrono::steady_clock;
    Clock::time_point last_end_{};
    cudaEvent_t trace_begin_ = nullptr, trace_end_ = nullptr;
    // When a step passed its stages (step(): entry, the streams ordered, the inputs uploaded, the
    // graph launched, the sampler and copies enqueued, the sampled tokens back).
    struct StepStamps {
        Clock::time_point begin, order, prep, launch, tail, wait;
    };
    gptoss_status upload_step(const BatchModel& m, const BatchSlot* slots, uint32_t n, StepStamps* at);
    // may_speculate: speculate() may run behind the sampler (step()'s rows_stable, not profiling).
    gptoss_status sample_step(const BatchModel& m, const BatchSlot* slots, uint32_t n, int32_t* sampled, bool trace,
                              bool may_speculate, StepStamps* at);
    gptoss_status collect_step(uint32_t n, bool trace, const StepStamps& at);
    std::map<uint32_t, std::pair<uint64_t, double>> trace_mixed_;    // steps with a prompt chunk beside them
    std::map<uint32_t, std::pair<uint64_t, double>> trace_prefill_;  // prompt chunk tokens → count, GPU ms
    struct PendingChunk {
        cudaEvent_t begin, end;
        uint32_t tokens;
    };
    std::vector<PendingChunk> pending_chunks_;
    void collect_prefill();
    // GPTOSS_DECODE_BATCH_PROFILE=1: no graphs, events between the ops of each step (mark), each
    // step waits for the device; ms per op and step for each n go to stderr at destruction.
    struct Profile {
        uint64_t steps = 0;
        std::vector<std::pair<const char*, double>> ms;  // label (a literal) → ms summed over steps
    };
    gptoss_status mark(const char* label);
    gptoss_status collect_profile(uint32_t n);
    bool profiling_ = false;
    std::vector<std::pair<cudaEvent_t, const char*>> events_;
    std::map<uint32_t, Profile> profile_;
    cudaEvent_t done_ = nullptr;
    std::vector<cudaEvent_t> ready_;  // one per slot index: the session's stream before the step
    uint32_t cap_items_ = 0, cap_splits_ = 0;
    void* arena_ = nullptr;
    // scratch carved from arena_
    int32_t* tokens_ = nullptr;
    BatchAttentionItem* items_ = nullptr;  // [n_layers, cap_items_]
    float* x_ = nullptr;
    uint16_t* xn_ = nullptr;
    float* qkv_ = nullptr;
    uint16_t* attn_ = nullptr;
    float* rlogits_ = nullptr;
    int32_t* experts_ = nullptr;
    float* weights_ = nullptr;
    int32_t* tiles_ = nullptr;
    int32_t* pairs_ = nullptr;
    uint16_t* act_ = nullptr;
    float* part_ = nullptr;
    float* logits_ = nullptr;
    float* partial_ = nullptr;
    int* counters_ = nullptr;
    int* route_counter_ = nullptr;  // router_decode's, where it takes the counter path (re-armed by it)
    SampleRow* rows_ = nullptr;      // [cap_items_]
    int32_t* sampled_ = nullptr;     // [cap_items_]
    void* sample_scratch_ = nullptr;  // sample_rows_scratch_bytes(cap_items_)
    size_t sample_scratch_bytes_ = 0;
    int32_t* sampled_host_ = nullptr;  // pinned [cap_items_]
    cudaEvent_t sampled_done_ = nullptr;
    std::vector<SampleRow> rows_host_;
    std::vector<BatchAttentionItem> items_host_;
    std::vector<int32_t> tokens_host_;
};

}  // namespace cuda
}  // namespace gptoss
