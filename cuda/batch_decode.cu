// cuda/batch_decode.cu - one batched decode step on the GPU (issue 13, part 1; the design is
// bench/NOTES.md "Continuous batching"). N sessions' tokens go through the forward pass as the
// N rows of one step: gemm.cu's tensor-core kernel for the projections (QKV, O + residual,
// router, lm_head: one CTA per 16-row weight slab × 8·NB token columns), except QKV, O and lm_head
// of steps of 16 tokens or more, which go through dense_batch_gemm (cuda/dense_batch.h: 4-8 slabs
// per CTA share each staged chunk of the token rows; gemm()'s bits), the MoE experts grouped by
// expert through router_route's
// tiles (moe_batch_gemm by default: each expert slab's weights read and dequantized once for up
// to 16 of its tokens, cuda/moe_decode_batch.h), residual_rmsnorm per row, and the
// decode attention kernel indexed by item (attention_decode_batch: each item its own cache,
// position and window). A lone token's MLP norm, router and route are router_decode's one launch
// (router.cu), steps of 2-64 tokens of the 20b router_batch + router_group (router.cu,
// sm_90; elsewhere the three launches they replace, with the same bits). The K split and reduction
// order of every kernel are functions of the shape only, never of N or of which tokens share a
// tile, so a session's logits are bit-identical
// whatever the batch (batch invariance; tests/test-kernels-batch.cu). Steps of at least
// batch_sample_min_items() tokens then sample the rows whose sessions asked for it
// (cuda/sample_batch.h; the same tokens as each session's own sampler) and return the tokens;
// the other rows' logits are copied into their sessions' own buffers, on the step's stream, and
// each session's stream waits for the step before its sampler runs.
#include "cuda/batch_decode.h"
#include "cuda/common.cuh"
#include "cuda/dense_batch.h"
#include "cuda/moe_decode_batch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace gptoss {
namespace cuda {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

// 8-column tiles per CTA of the dense projections: nb = 8 (one CTA per slab carries up to 64
// tokens) above 8 tokens, else 1 (the decode ring). GPTOSS_DECODE_BATCH_NB = 1 | 2 | 8 forces one
// (A/B runs); the results are the same bits either way (gemm.cu).
int dense_nb_forced() {
    static const int forced = env_choice("GPTOSS_DECODE_BATCH_NB", {1, 2, 8}, 0);
    return forced;
}
int dense_nb(uint32_t n) {
    if (dense_nb_forced()) return dense_nb_forced();
    return n > 8 ? 8 : 1;
}
// Column tiles per CTA of the per-layer projections QKV, O and router (GPTOSS_DECODE_BATCH_PROJ_NB;
// GPTOSS_DECODE_BATCH_ROUTER_NB overrides it for the router): 1 | 2 | 8 forces one, unset or 0 =
// nb 2 for QKV and O at 9-15 tokens (below dense_batch_gemm's threshold) else dense_nb, and nb 2
// above 8 tokens for the router. H200 per-op profile at 64 tokens (bench/NOTES.md "v16 batched
// decode"): QKV and O at nb 2 or 1 are no faster or slower
// (0.59 -> 0.86 / 1.33 ms per step for QKV), the router's two 16-row slabs at nb 2 or 1 are 0.27
// ms per step faster; through gptoss-bench at 64 streams the router at nb 2 gave +2.1 % and
// +2.0 % in two rounds against nb 8 (v18 batched decode). lm_head keeps dense_nb: its CTAs run
// slab-major, so at nb < 8 each column tile would read its 1.2 GB again. Same bits whichever.
int forced_nb(const char* name) { return env_choice(name, {1, 2, 8}, 0); }
int proj_nb(uint32_t n) {
    static const int forced = forced_nb("GPTOSS_DECODE_BATCH_PROJ_NB");
    if (forced) return forced;
    // Steps of 9-15 tokens (below dense_batch_gemm's threshold): 2 column tiles per CTA, so each
    // slab's weights stream through the NB <= 2 register ring (QKV 0.419 -> 0.343, O 0.470 -> 0.320
    // ms per 12-token step against 8 tiles; bench/NOTES.md "v23").
    return n > 8 && n < kDenseBatchMinTokens && !dense_nb_forced() ? 2 : dense_nb(n);
}
int router_nb(uint32_t n) {
    static const int forced = forced_nb("GPTOSS_DECODE_BATCH_ROUTER_NB");
    static const int proj_forced = forced_nb("GPTOSS_DECODE_BATCH_PROJ_NB");
    if (forced) return forced;
    if (proj_forced) return proj_forced;
    return n > 8 && !dense_nb_forced() ? 2 : dense_nb(n);
}
// Steps of 2-64 tokens of a model with up to 32 experts (20b): the MLP RMSNorm, router GEMM and
// top-K in router_batch's one launch (router.cu) where usable (sm_90), else the three launches;
// the same bits either way. The three and the work list cost ~10 µs per layer in the step's
// graph; the one launch gave H200 +1.2 % at 8 streams, +0.7-1.5 % at 32 and +0-1.1 % at 64, but
// 120b (8-slab clusters, 8 CTAs per token) lost 0.6 % at 64 streams (bench/NOTES.md "v34"), so
// its 128 experts keep the three. Larger steps (prompt chunks) keep them too: one token per CTA
// re-reads the router per token.
// GPTOSS_DECODE_BATCH_ROUTER_FUSED=0 forces the three launches, =2 the one launch at any E (A/B runs).
constexpr uint32_t kRouterFusedMaxTokens = 64, kRouterFusedMaxExperts = 32;
bool router_fused_model(const BatchModel& m) {  // whether the model's steps may take the one launch
    static const int mode = env_choice("GPTOSS_DECODE_BATCH_ROUTER_FUSED", {0, 1, 2}, 1);
    if (mode == 0 || (mode == 1 && m.E > kRouterFusedMaxExperts)) return false;
    return router_batch_usable(m.E, m.K, m.H);
}
// Warps per slab CTA of the step's fused router: 4 (default) = gemm()'s order, the three launches'
// bits; GPTOSS_DECODE_BATCH_ROUTER_WARPS=16 = router_decode's 16-warp order (the decode graph's
// chain of 3 chunks per warp instead of 12; not yet measured in the batched step). At 16 every
// step of the model routes through the one launch, whatever its size (the three launches keep
// gemm()'s order), and a lone token through router_decode at 16, so batch invariance holds; a
// model that cannot take the one launch keeps 4.
uint32_t router_warps(const BatchModel& m) {
    static const int env = env_choice("GPTOSS_DECODE_BATCH_ROUTER_WARPS", {4, 16}, 4);
    return env == 16 && router_fused_model(m) ? 16u : 4u;  // the default asks nothing of the device
}
bool router_fused(const BatchModel& m, uint32_t n) {
    return router_fused_model(m) && (n <= kRouterFusedMaxTokens || router_warps(m) == 16);
}
// MoE: route tiles of 8·nb pairs, one CTA per (expert tile, 16-row slab); nb = 1 (tiles of 8
// pairs). GPTOSS_DECODE_BATCH_MOE_NB = 2: tiles of 16 pairs (the activation ring of decode for
// both column groups, empty groups skipped), so nearly every expert of a 64-token step is one
// tile; it measured no faster at 64 streams (H200, bench/NOTES.md "v14 batched decode": the
// second tile's re-read is an L2 hit, the kernel is not bound by those bytes). 8: tiles of 64
// pairs without the ring. Same bits whichever.
int moe_nb() {
    static const int nb = env_choice("GPTOSS_DECODE_BATCH_MOE_NB", {1, 2, 8}, 1);
    return nb;
}

}  // namespace

bool batch_decode_enabled() {
    static const bool enabled = [] {
        const char* e = std::getenv("GPTOSS_CUDA_DECODE_BATCH");
        return !(e && std::strcmp(e, "0") == 0);
    }();
    return enabled;
}

static bool env_on(const char* name, bool fallback) {
    const char* e = std::getenv(name);
    return e && *e ? std::strcmp(e, "0") != 0 : fallback;
}

// GPTOSS_DECODE_BATCH_TEST_STALL_US = N (tests only; read once per process): after each step's
// sampled tokens, stream_ spins N µs before the next work, so the device lags the host by N µs as
// it does on a GPU time-sliced with another process (test-batch-gpu-stall; bench/NOTES.md "v32").
static uint32_t test_stall_us() {
    static const uint32_t us = [] {
        const char* e = std::getenv("GPTOSS_DECODE_BATCH_TEST_STALL_US");
        const long v = e && *e ? std::strtol(e, nullptr, 10) : 0;
        return v > 0 && v <= 1000000 ? uint32_t(v) : 0u;
    }();
    return us;
}

__global__ void stall_kernel(uint32_t us) {
    uint64_t t0 = 0, t = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < uint64_t(us) * 1000u);
}

uint32_t batch_sample_min_items() {
    static const uint32_t min_items = [] {
        const char* e = std::getenv("GPTOSS_DECODE_BATCH_SAMPLE");
        if (!e || !*e) return batch_speculation_enabled() ? 8u : 32u;
        const long v = std::strtol(e, nullptr, 10);
        return v > 0 && v <= 65535 ? uint32_t(v) : 0u;
    }();
    return min_items;
}

BatchDecoder::~BatchDecoder() {
    if (!stream_) return;  // never stepped: nothing allocated
    DeviceGuard guard(device_);
    cudaStreamSynchronize(stream_);
    drop_graphs();
    if (!trace_.empty()) {
        std::fprintf(stderr, "decode_batch steps (GPTOSS_DECODE_BATCH_TRACE):");
        for (const auto& [n, t] : trace_)
            std::fprintf(stderr, " n=%u: %llu x %.3f ms;", n, static_cast<unsigned long long>(t.first),
                         t.second / double(t.first));
        std::fprintf(stderr, "\n");
    }
    if (!timing_.empty())
        std::fprintf(stderr, "decode_batch speculative forwards (GPTOSS_DECODE_BATCH_TRACE): %llu launched, %llu used\n",
                     static_cast<unsigned long long>(spec_launched_), static_cast<unsigned long long>(spec_reused_));
    for (const auto& [n, t] : timing_) {
        const double k = double(t.steps);
        std::fprintf(stderr,
                     "decode_batch step timing (GPTOSS_DECODE_BATCH_TRACE) n=%u, %llu steps, ms per step: gap before "
                     "the step %.3f; stream ordering %.3f; other host work before the launch %.3f; launch %.3f; "
                     "sampler and logits copies %.3f; wait for the sampled tokens %.3f; GPU span %.3f\n",
                     n, static_cast<unsigned long long>(t.steps), t.gap / k, t.order / k, t.prep / k, t.launch / k,
                     t.tail / k, t.wait / k, t.gpu / k);
    }
    if (trace_begin_) cudaEventDestroy(trace_begin_);
    if (trace_end_) cudaEventDestroy(trace_end_);
    collect_prefill();
    auto print = [](const char* what, const std::map<uint32_t, std::pair<uint64_t, double>>& m) {
        if (m.empty()) return;
        std::fprintf(stderr, "%s:", what);
        for (const auto& [n, t] : m)
            std::fprintf(stderr, " n=%u: %llu x %.3f ms;", n, static_cast<unsigned long long>(t.first),
                         t.second / double(t.first));
        std::fprintf(stderr, "\n");
    };
    print("decode_batch steps beside a prompt chunk (GPTOSS_DECODE_BATCH_TRACE)", trace_mixed_);
    print("decode_batch prompt chunks, GPU ms by tokens (GPTOSS_DECODE_BATCH_TRACE)", trace_prefill_);
    for (const auto& [n, p] : profile_) {
        std::fprintf(stderr, "decode_batch profile (GPTOSS_DECODE_BATCH_PROFILE) n=%u, %llu steps, ms per step:", n,
                     static_cast<unsigned long long>(p.steps));
        for (const auto& [label, ms] : p.ms) std::fprintf(stderr, " %s %.3f;", label, ms / double(p.steps));
        std::fprintf(stderr, "\n");
    }
    for (auto& e : events_) cudaEventDestroy(e.first);
    if (arena_) cudaFree(arena_);
    if (sampled_host_) cudaFreeHost(sampled_host_);
    if (sampled_done_) cudaEventDestroy(sampled_done_);
    if (spec_copied_) cudaEventDestroy(spec_copied_);
    for (cudaEvent_t e : ready_) cudaEventDestroy(e);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
}

gptoss_status BatchDecoder::init_stream() {
    GPTOSS_CUDA_TRY(cudaGetDevice(&device_));  // the caller's DeviceGuard chose the backend's
    GPTOSS_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GPTOSS_CUDA_TRY(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    GPTOSS_CUDA_TRY(cudaEventCreateWithFlags(&sampled_done_, cudaEventDisableTiming));
    GPTOSS_CUDA_TRY(cudaEventCreateWithFlags(&spec_copied_, cudaEventDisableTiming));
    return GPTOSS_OK;
}

size_t BatchDecoder::carve(const BatchModel& m, uint32_t items, uint32_t sp, char* base) {
    const uint32_t L = uint32_t(m.layers.size()), QKV = (m.Q + 2 * m.G) * m.D, QD = m.Q * m.D;
    const uint32_t max_tiles = route_max_tiles(items, m.E, m.K, 8);
    size_t off = 0;
    auto take = [&](auto*& p, size_t bytes) {
        if (base) p = reinterpret_cast<std::remove_reference_t<decltype(p)>>(base + off);
        off += align_up(bytes);
    };
    take(tokens_, size_t(items) * 4);
    take(items_, size_t(L) * items * sizeof(BatchAttentionItem));
    take(x_, size_t(items) * m.H * 4);
    take(xn_, size_t(items) * m.H * 2);
    take(qkv_, size_t(items) * QKV * 4);
    take(attn_, size_t(items) * QD * 2);
    take(rlogits_, size_t(items) * m.E * 4);
    take(experts_, size_t(items) * m.K * 4);
    take(weights_, size_t(items) * m.K * 4);
    take(tiles_, (1 + 3 * size_t(max_tiles)) * 4);
    take(pairs_, size_t(items) * m.K * 4);
    take(act_, size_t(items) * m.K * m.I * 2);
    take(part_, size_t(items) * m.K * m.H * 4);
    take(logits_, size_t(items) * m.V * 4);
    take(partial_, size_t(items) * m.Q * sp * attn_partial_floats(m.D) * 4);
    take(counters_, size_t(items) * m.G * 4);
    take(route_counter_, 4);
    take(rows_, size_t(items) * sizeof(SampleRow));
    take(sampled_, size_t(items) * 4);
    char* scratch = nullptr;
    take(scratch, sample_rows_scratch_bytes(items));
    if (base) {
        sample_scratch_ = scratch;
        sample_scratch_bytes_ = sample_rows_scratch_bytes(items);
    }
    return off;
}

// Sizes the scratch for n items and `splits` attention splits (grown to powers of two).
gptoss_status BatchDecoder::reserve(const BatchModel& m, uint32_t n, uint32_t splits) {
    if (!stream_) GPTOSS_TRY(init_stream());
    while (ready_.size() < n) {
        cudaEvent_t e = nullptr;
        GPTOSS_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        ready_.push_back(e);
    }
    if (n <= cap_items_ && splits <= cap_splits_) return GPTOSS_OK;
    uint32_t items = std::max(cap_items_, 8u), sp = std::max(cap_splits_, 16u);
    while (items < n) items *= 2;
    while (sp < splits) sp *= 2;
    const size_t bytes = carve(m, items, sp, nullptr);
    GPTOSS_CUDA_TRY(cudaStreamSynchronize(stream_));
    drop_graphs();  // they hold the old scratch pointers
    if (arena_) {
        GPTOSS_CUDA_TRY(cudaFree(arena_));
        arena_ = nullptr;
        cap_items_ = cap_splits_ = 0;
    }
    if (sampled_host_) {
        GPTOSS_CUDA_TRY(cudaFreeHost(sampled_host_));
        sampled_host_ = nullptr;
    }
    // Pinned: the sampled tokens, then the speculative step's items (speculate()).
    const size_t spec_off = align_up(size_t(items) * 4);
    const size_t pinned = spec_off + m.layers.size() * items * sizeof(BatchAttentionItem);
    if (cudaMallocHost(&sampled_host_, pinned) != cudaSuccess) {
        cudaGetLastError();
        sampled_host_ = nullptr;
        return fail(GPTOSS_ERR_OUT_OF_MEMORY,
                    "CUDA decode_batch: %zu bytes of pinned memory for sampled tokens and step items", pinned);
    }
    spec_items_host_ = reinterpret_cast<BatchAttentionItem*>(reinterpret_cast<char*>(sampled_host_) + spec_off);
    const cudaError_t err = cudaMalloc(&arena_, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();
        arena_ = nullptr;
        return fail(GPTOSS_ERR_OUT_OF_MEMORY,
                    "CUDA decode_batch: the scratch of a step of %u tokens with %u attention splits needs %zu bytes",
                    items, sp, bytes);
    }
    // Zeroed: the attention counters must start at 0, and nothing reads uninitialized memory.
    GPTOSS_CUDA_TRY(cudaMemsetAsync(arena_, 0, bytes, stream_));
    carve(m, items, sp, static_cast<char*>(arena_));
    cap_items_ = items;
    cap_splits_ = sp;
    return GPTOSS_OK;
}

gptoss_status BatchDecoder::step(const BatchModel& m, const BatchSlot* slots, uint32_t n, int32_t* sampled,
                                 bool rows_stable) {
    if (n == 0) return GPTOSS_OK;
    if (n > 65535) return fail(GPTOSS_ERR_INTERNAL, "CUDA decode_batch: %u items in one step", n);
    StepStamps at;
    at.begin = Clock::now();
    // The speculative forward of the previous step, when it ran every one of these rows
    // (speculate()): the step samples in its row order (spec_slots_), the tokens go back to the
    // caller's order at the end.
    const bool reuse = spec_matches(slots, n);
    const uint32_t n_rows = reuse ? uint32_t(spec_.size()) : n;
    spec_.clear();
    static const bool profile = env_on("GPTOSS_DECODE_BATCH_PROFILE", false);
    static const bool trace = env_on("GPTOSS_DECODE_BATCH_TRACE", false);
    profiling_ = profile;
    const bool may_speculate = rows_stable && !profiling_;
    if (!reuse) {
        const uint32_t full_splits = full_splits_for(slots, n, 0);
        GPTOSS_TRY(reserve(m, n, full_splits));
        if (trace && !trace_begin_) {
            GPTOSS_CUDA_TRY(cudaEventCreate(&trace_begin_));
            GPTOSS_CUDA_TRY(cudaEventCreate(&trace_end_));
        }
        GPTOSS_TRY(upload_step(m, slots, n, &at));
        if (trace) GPTOSS_CUDA_TRY(cudaEventRecord(trace_begin_, stream_));
        GPTOSS_TRY(launch(m, n, full_splits));
    } else {
        at.order = at.prep = Clock::now();
        if (trace) GPTOSS_CUDA_TRY(cudaEventRecord(trace_begin_, stream_));  // the sampler alone
        spec_reused_++;
    }
    at.launch = Clock::now();
    if (!reuse) {
        GPTOSS_TRY(sample_step(m, slots, n, sampled, trace, may_speculate, &at));
    } else {
        spec_sampled_.assign(n_rows, -1);
        GPTOSS_TRY(sample_step(m, spec_slots_.data(), n_rows, spec_sampled_.data(), trace, may_speculate, &at));
        if (sampled != nullptr)
            for (uint32_t i = 0; i < n; ++i) sampled[i] = spec_sampled_[spec_row_of_[i]];
    }
    if (trace || profiling_) GPTOSS_TRY(collect_step(n, trace, at));
    return GPTOSS_OK;
}

// The step's inputs: each slot's token and per-layer attention item (its position set) to the
// device, after each session's earlier work on its own stream.
gptoss_status BatchDecoder::upload_step(const BatchModel& m, const BatchSlot* slots, uint32_t n, StepStamps* at) {
    const uint32_t L = uint32_t(m.layers.size());
    items_host_.resize(size_t(L) * cap_items_);
    tokens_host_.assign(n, 0);
    for (uint32_t i = 0; i < n; ++i) {
        tokens_host_[i] = slots[i].token;
        for (uint32_t l = 0; l < L; ++l) {
            BatchAttentionItem it = slots[i].layers[l];
            it.pos = int32_t(slots[i].pos);
            items_host_[size_t(l) * cap_items_ + i] = it;
        }
        // The session's earlier work (its prefill, its last sampler) comes first.
        GPTOSS_CUDA_TRY(cudaEventRecord(ready_[i], slots[i].stream));
        GPTOSS_CUDA_TRY(cudaStreamWaitEvent(stream_, ready_[i], 0));
    }
    at->order = Clock::now();
    // Pageable sources: staged before cudaMemcpyAsync returns, so the host vectors may change.
    GPTOSS_CUDA_TRY(cudaMemcpyAsync(tokens_, tokens_host_.data(), n * 4, cudaMemcpyHostToDevice, stream_));
    GPTOSS_CUDA_TRY(cudaMemcpyAsync(items_, items_host_.data(), items_host_.size() * sizeof(BatchAttentionItem),
                                    cudaMemcpyHostToDevice, stream_));
    at->prep = Clock::now();
    return GPTOSS_OK;
}

// After the forward: sampling in the step (one launch over the [n, V] logits, the tokens back to
// the host) for the rows that ask, the other rows' logits into their sessions' buffers, the
// sessions' streams ordered after the step; waits for the sampled tokens.
gptoss_status BatchDecoder::sample_step(const BatchModel& m, const BatchSlot* slots, uint32_t n, int32_t* sampled,
                                        bool trace, bool may_speculate, StepStamps* at) {
    bool any_sample = false;
    rows_host_.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
        rows_host_[i] = slots[i].sample;
        any_sample = any_sample || slots[i].sample.mode != SampleRow::kSkip;
    }
    if (any_sample && sampled == nullptr) return fail(GPTOSS_ERR_INTERNAL, "CUDA decode_batch: rows to sample, nowhere to put them");
    if (any_sample) {
        GPTOSS_CUDA_TRY(cudaMemcpyAsync(rows_, rows_host_.data(), n * sizeof(SampleRow), cudaMemcpyHostToDevice, stream_));
        GPTOSS_TRY(sample_rows(logits_, m.V, m.V, rows_, n, sample_scratch_, sample_scratch_bytes_, sampled_, stream_));
        GPTOSS_TRY(mark("batched sample"));
        GPTOSS_CUDA_TRY(cudaMemcpyAsync(sampled_host_, sampled_, n * 4, cudaMemcpyDeviceToHost, stream_));
        GPTOSS_CUDA_TRY(cudaEventRecord(sampled_done_, stream_));
        if (test_stall_us() > 0) {
            stall_kernel<<<1, 1, 0, stream_>>>(test_stall_us());
            GPTOSS_CUDA_TRY(cudaGetLastError());
        }
    }
    if (trace) GPTOSS_CUDA_TRY(cudaEventRecord(trace_end_, stream_));
    // Each row's logits into its session's buffer, except rows sampled here: their session
    // never reads them (it has its token) and is told it has no logits (batch_done).
    // (A reused speculation's rows that no slot asks for have neither logits nor stream.)
    uint32_t n_skip = 0;
    for (uint32_t i = 0; i < n; ++i)
        if (slots[i].sample.mode == SampleRow::kSkip) {
            n_skip++;
            if (slots[i].logits != nullptr)
                GPTOSS_CUDA_TRY(cudaMemcpyAsync(slots[i].logits, logits_ + size_t(i) * m.V, size_t(m.V) * 4,
                                                cudaMemcpyDeviceToDevice, stream_));
        }
    if (n_skip == 0 && may_speculate) GPTOSS_TRY(speculate(m, slots, n));
    GPTOSS_CUDA_TRY(cudaEventRecord(done_, stream_));  // after the speculative forward, if any
    for (uint32_t i = 0; i < n; ++i)
        if (slots[i].stream != nullptr) GPTOSS_CUDA_TRY(cudaStreamWaitEvent(slots[i].stream, done_, 0));
    at->tail = Clock::now();
    if (any_sample) {  // the logits copies may still run: the sessions' streams wait for them
        GPTOSS_CUDA_TRY(cudaEventSynchronize(sampled_done_));
        std::memcpy(sampled, sampled_host_, n * 4);
        for (size_t i = 0; i < spec_.size(); ++i) spec_[i].token = sampled[i];
    } else if (sampled != nullptr) {
        for (uint32_t i = 0; i < n; ++i) sampled[i] = -1;
    }
    at->wait = Clock::now();
    return GPTOSS_OK;
}

// GPTOSS_DECODE_BATCH_TRACE / _PROFILE: waits for the device and adds the step to the tables the
// destructor prints.
gptoss_status BatchDecoder::collect_step(uint32_t n, bool trace, const StepStamps& at) {
    // (the events of this step; a speculative forward behind them keeps running)
    if (profiling_) GPTOSS_CUDA_TRY(cudaStreamSynchronize(stream_));
    else GPTOSS_CUDA_TRY(cudaEventSynchronize(trace_end_));
    const auto ms = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
    };
    if (trace) {
        float gpu = 0.0f;
        GPTOSS_CUDA_TRY(cudaEventElapsedTime(&gpu, trace_begin_, trace_end_));
        StepTiming& acc = timing_[n];
        acc.steps++;
        acc.gap += last_end_ != Clock::time_point{} ? ms(last_end_, at.begin) : 0.0;
        acc.order += ms(at.begin, at.order);
        acc.prep += ms(at.order, at.prep);
        acc.launch += ms(at.prep, at.launch);
        acc.tail += ms(at.launch, at.tail);
        acc.wait += ms(at.tail, at.wait);
        acc.gpu += gpu;
    }
    if (profiling_) GPTOSS_TRY(collect_profile(n));
    auto& t = trace_[n];
    t.first++;
    const double wall = ms(at.begin, Clock::now());
    t.second += wall;
    if (!pending_chunks_.empty()) {
        auto& tm = trace_mixed_[n];
        tm.first++;
        tm.second += wall;
    }
    collect_prefill();
    last_end_ = Clock::now();
    return GPTOSS_OK;
}

// Splits of the full layers for the rows at pos + ahead: a power of two covering every item (CTAs
// past an item's position exit at once; an item's bits do not depend on the count), so graphs
// are few.
uint32_t BatchDecoder::full_splits_for(const BatchSlot* slots, uint32_t n, uint32_t ahead) {
    uint32_t needed = 0, full_splits = 1;
    for (uint32_t i = 0; i < n; ++i) needed = std::max(needed, batch_splits_needed(slots[i].pos + ahead, batch_attention_split()));
    while (full_splits < needed) full_splits *= 2;
    return full_splits;
}

// On unless GPTOSS_DECODE_BATCH_SPECULATE=0 (bench/NOTES.md "v28": run on the H200 with the GPU
// test-batch sampling in the step from one row, and measured off / on).
bool batch_speculation_enabled() {
    static const bool on = env_on("GPTOSS_DECODE_BATCH_SPECULATE", true);
    return on;
}

// Whether every slot is a row of the speculative forward in flight (same stream, position and
// token); if so, fills spec_slots_ (the slots in the speculation's row order, skipped rows where
// no slot asks) and spec_row_of_. n <= 64 in practice: the quadratic search costs microseconds.
bool BatchDecoder::spec_matches(const BatchSlot* slots, uint32_t n) {
    if (spec_.empty() || n > spec_.size()) return false;
    spec_slots_.assign(spec_.size(), BatchSlot{});
    spec_row_of_.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t r = 0;
        while (r < spec_.size() && spec_[r].stream != slots[i].stream) ++r;
        if (r == spec_.size() || slots[i].pos != spec_[r].pos || slots[i].token != spec_[r].token || spec_[r].token < 0)
            return false;
        spec_slots_[r] = slots[i];
        spec_row_of_[i] = r;
    }
    return true;
}

// Every row of this step is sampled in it (sampled_, device): the next step's forward of those
// tokens at pos + 1 goes on stream_ now, behind the sampler, so the GPU runs it while the host
// hands the tokens out and the sessions come back. Only where it needs no new scratch (the
// splits at pos + 1 fit) and every row's pos + 1 is inside its full layers' caches.
gptoss_status BatchDecoder::speculate(const BatchModel& m, const BatchSlot* slots, uint32_t n) {
    if (!batch_speculation_enabled() || n > cap_items_) return GPTOSS_OK;
    const uint32_t L = uint32_t(m.layers.size());
    for (uint32_t i = 0; i < n; ++i) {
        if (slots[i].sample.mode == SampleRow::kSkip) return GPTOSS_OK;
        for (uint32_t l = 0; l < L; ++l) {  // a sliding ring of the whole window wraps by design
            const bool ring = m.layers[l].sliding && slots[i].layers[l].slots >= m.sliding_window;
            if (!ring && slots[i].pos + 1 >= slots[i].layers[l].slots) return GPTOSS_OK;
        }
    }
    const uint32_t full_splits = full_splits_for(slots, n, 1);
    if (full_splits > cap_splits_) return GPTOSS_OK;
    // The previous speculation's copy out of spec_items_host_ must have run before the host
    // rewrites it. The host last waited for a point before that copy (the previous step's
    // sampled tokens), so without this wait a GPU shared with another process (time-sliced, so
    // a copy can start milliseconds after the host moved on) copied this step's positions into
    // the previous speculative forward: wrong tokens, run to run (bench/NOTES.md "v32"). The copy
    // sits before this step's sampler, which the host waits for next anyway.
    GPTOSS_CUDA_TRY(cudaEventSynchronize(spec_copied_));
    for (uint32_t i = 0; i < n; ++i)
        for (uint32_t l = 0; l < L; ++l) {
            BatchAttentionItem it = slots[i].layers[l];
            it.pos = int32_t(slots[i].pos + 1);
            spec_items_host_[size_t(l) * cap_items_ + i] = it;
        }
    // Pinned source (the copy is asynchronous); spec_copied_ marks when the device has read it.
    GPTOSS_CUDA_TRY(cudaMemcpyAsync(items_, spec_items_host_, size_t(L) * cap_items_ * sizeof(BatchAttentionItem),
                                    cudaMemcpyHostToDevice, stream_));
    GPTOSS_CUDA_TRY(cudaEventRecord(spec_copied_, stream_));
    GPTOSS_CUDA_TRY(cudaMemcpyAsync(tokens_, sampled_, n * 4, cudaMemcpyDeviceToDevice, stream_));
    GPTOSS_TRY(launch(m, n, full_splits));
    spec_.resize(n);
    for (uint32_t i = 0; i < n; ++i) spec_[i] = SpecRow{slots[i].stream, slots[i].pos + 1, -1};  // token: after the sync
    spec_launched_++;
    return GPTOSS_OK;
}

gptoss_status BatchDecoder::drop_speculation(cudaStream_t stream) {
    if (spec_.empty()) return GPTOSS_OK;
    bool live = false, mine = false;
    for (SpecRow& row : spec_) {
        if (row.stream == stream) {
            row.stream = nullptr;
            mine = true;
        }
        live = live || row.stream != nullptr;
    }
    if (!live) spec_.clear();
    // Only a session with a row in the speculation has its K/V and logits written by it; the
    // others leave without waiting for it.
    if (mine) GPTOSS_CUDA_TRY(cudaStreamSynchronize(stream_));
    return GPTOSS_OK;
}

void BatchDecoder::trace_prefill(cudaStream_t session_stream, uint32_t tokens, bool begin) {
    static const bool trace = env_on("GPTOSS_DECODE_BATCH_TRACE", false);
    if (!trace) return;
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess || cudaEventRecord(e, session_stream) != cudaSuccess) {
        cudaGetLastError();  // a trace only: lose this chunk's timing, never the step
        if (e) cudaEventDestroy(e);
        if (!begin && !pending_chunks_.empty() && !pending_chunks_.back().end) {
            cudaEventDestroy(pending_chunks_.back().begin);
            pending_chunks_.pop_back();
        }
        return;
    }
    if (begin) {
        pending_chunks_.push_back(PendingChunk{e, nullptr, 0});
    } else if (!pending_chunks_.empty() && !pending_chunks_.back().end) {
        pending_chunks_.back().end = e;
        pending_chunks_.back().tokens = tokens;
    } else {
        cudaEventDestroy(e);
    }
}

// Reads the finished chunks' GPU time into trace_prefill_ (waits for them).
void BatchDecoder::collect_prefill() {
    for (const PendingChunk& c : pending_chunks_) {
        float ms = 0;
        if (c.end && cudaEventSynchronize(c.end) == cudaSuccess &&
            cudaEventElapsedTime(&ms, c.begin, c.end) == cudaSuccess) {
            auto& t = trace_prefill_[c.tokens];
            t.first++;
            t.second += double(ms);
        }
        cudaGetLastError();
        cudaEventDestroy(c.begin);
        if (c.end) cudaEventDestroy(c.end);
    }
    pending_chunks_.clear();
}

void BatchDecoder::drop_graphs() {
    for (auto& g : graphs_) cudaGraphExecDestroy(g.second);
    graphs_.clear();
}

gptoss_status BatchDecoder::launch(const BatchModel& m, uint32_t n, uint32_t splits) {
    // Graphs up to 64 items (at most 64 × a few split buckets of them); larger steps launch directly.
    static const bool use_graphs = env_on("GPTOSS_DECODE_BATCH_GRAPH", true);
    if (!use_graphs || n > 64 || profiling_) return enqueue(m, n, splits);
    auto it = graphs_.find({n, splits});
    if (it == graphs_.end()) {
        GPTOSS_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        const gptoss_status st = enqueue(m, n, splits);
        cudaGraph_t graph = nullptr;
        const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
        if (st != GPTOSS_OK) {
            if (graph) cudaGraphDestroy(graph);
            return st;
        }
        GPTOSS_CUDA_TRY(end);
        cudaGraphExec_t exec = nullptr;
        const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        GPTOSS_CUDA_TRY(inst);
        it = graphs_.emplace(std::make_pair(n, splits), exec).first;
    }
    GPTOSS_CUDA_TRY(cudaGraphLaunch(it->second, stream_));
    return GPTOSS_OK;
}

// The forward pass of n rows on stream_ (MODEL.md §Forward pass; the prefill path's op order).
gptoss_status BatchDecoder::enqueue(const BatchModel& m, uint32_t n, uint32_t full_splits) {
    const uint32_t QKV = (m.Q + 2 * m.G) * m.D;
    const int pnb = proj_nb(n);
    ResidualArgs embed;
    embed.mode = ResidualMode::kEmbed;
    embed.embed = m.embed;
    embed.tokens = tokens_;
    GPTOSS_TRY(mark("start"));
    GPTOSS_TRY(residual_rmsnorm(embed, x_, m.layers[0].attn_norm, m.rms_norm_eps, xn_, n, m.H, stream_));
    GPTOSS_TRY(mark("embed + rmsnorm"));
    for (uint32_t l = 0; l < uint32_t(m.layers.size()); ++l) {
        const BatchLayer& L = m.layers[l];
        GPTOSS_TRY(dense(kDenseQkv, L.qkv, xn_, n, Epilogue::kStore, qkv_, QKV, pnb));
        GPTOSS_TRY(mark("qkv gemm"));
        GPTOSS_TRY(enqueue_attention(m, l, n, full_splits));
        GPTOSS_TRY(mark(L.sliding ? "rope + attention (sliding)" : "rope + attention (full)"));
        GPTOSS_TRY(dense(kDenseO, L.o, attn_, n, Epilogue::kAdd, x_, m.H, pnb));
        GPTOSS_TRY(mark("o gemm + residual"));
        GPTOSS_TRY(enqueue_moe(m, l, n));
    }
    GPTOSS_TRY(dense(kDenseLmHead, m.lm_head, xn_, n, Epilogue::kStore, logits_, m.V, dense_nb(n)));
    return mark("lm_head");
}

// Layer l's attention over each item's own cache (RoPE of q and k fused; the new K/V written).
gptoss_status BatchDecoder::enqueue_attention(const BatchModel& m, uint32_t l, uint32_t n, uint32_t full_splits) {
    const BatchLayer& L = m.layers[l];
    AttentionArgs aa;
    aa.window = L.sliding ? m.sliding_window : 0;
    aa.sinks = L.sinks;
    aa.T = 1; aa.Q = m.Q; aa.G = m.G; aa.D = m.D;
    aa.out = attn_;
    aa.qkv = qkv_;
    aa.inv_freq = m.inv_freq;
    aa.rope_scale = m.rope_scale;
    const uint32_t splits = !L.sliding                             ? full_splits
                            : batch_window_whole(m.sliding_window) ? 1u
                            : std::min(full_splits, ceil_div(m.sliding_window, kBatchAttentionSplit) + 1);
    return attention_decode_batch(aa, items_ + size_t(l) * cap_items_, n, partial_, counters_, splits, stream_);
}

// Layer l's MLP: RMSNorm + router + route, the routed experts (gate_up + SwiGLU, down), the
// combine into the residual with the next RMSNorm (the next layer's, or the final one).
gptoss_status BatchDecoder::enqueue_moe(const BatchModel& m, uint32_t l, uint32_t n) {
    const BatchLayer& L = m.layers[l];
    cudaStream_t s = stream_;
    const int mnb = moe_nb();
    // cuda/moe_decode_batch.h: route tiles of 16 pairs, one launch per expert GEMM.
    const bool wide = moe_batch_enabled();
    const uint32_t tile_tokens = wide ? 16u : 8u * uint32_t(mnb);
    // A lone token (one session generating) routes with router_decode: its route is the one-pair
    // tiles router_route writes for one token at any tile size (bench/NOTES.md v23: +4 %).
    if (n == 1 && !L.router.mxfp4 && router_decode_supported(m.E, m.K, m.H)) {  // the three below in one launch
        RouterDecodeArgs ra;
        ra.x = x_; ra.norm_w = L.mlp_norm; ra.eps = m.rms_norm_eps; ra.router = L.router; ra.K = m.K;
        ra.xn = xn_; ra.logits = rlogits_; ra.counter = route_counter_; ra.experts = experts_;
        ra.weights = weights_; ra.tiles = tiles_; ra.pairs = pairs_;
        ra.warps = router_warps(m);  // router_batch's order: a lone step equals the same token in a larger one
        GPTOSS_TRY(router_decode(ra, s));
    } else if (!L.router.mxfp4 && router_fused(m, n)) {  // the three below in one launch + the grouping
        RouterBatchArgs rb;
        rb.x = x_; rb.norm_w = L.mlp_norm; rb.eps = m.rms_norm_eps; rb.router = L.router; rb.T = n; rb.K = m.K;
        rb.xn = xn_; rb.logits = rlogits_; rb.experts = experts_; rb.weights = weights_;
        rb.warps = router_warps(m);
        GPTOSS_TRY(router_batch(rb, s));
        GPTOSS_TRY(router_group(experts_, n, m.E, m.K, tiles_, pairs_, tile_tokens, s));
    } else {
        ResidualArgs none;
        GPTOSS_TRY(residual_rmsnorm(none, x_, L.mlp_norm, m.rms_norm_eps, xn_, n, m.H, s));
        GPTOSS_TRY(gemm(L.router, xn_, n, nullptr, Epilogue::kStore, rlogits_, nullptr, m.E, 0, router_nb(n), s));
        GPTOSS_TRY(router_route(rlogits_, n, m.E, m.K, experts_, weights_, tiles_, pairs_, tile_tokens, s));
    }
    GPTOSS_TRY(mark("rmsnorm + router + route"));
    GemmRoute r1;
    r1.tiles = tiles_; r1.pairs = pairs_; r1.in_div = m.K; r1.tile_tokens = tile_tokens;
    r1.max_tiles = route_max_tiles(n, m.E, m.K, tile_tokens);
    GemmRoute r2 = r1;
    r2.in_div = 1;
    if (wide) {
        GPTOSS_TRY(moe_batch_gemm(L.gate_up, xn_, r1, Epilogue::kSwiglu, nullptr, act_, m.I, m.swiglu_limit, 0, s));
        GPTOSS_TRY(mark("moe gate_up + swiglu"));
        GPTOSS_TRY(moe_batch_gemm(L.down, act_, r2, Epilogue::kStore, part_, nullptr, m.H, 0, 0, s));
    } else {
        GPTOSS_TRY(gemm(L.gate_up, xn_, n, &r1, Epilogue::kSwiglu, nullptr, act_, m.I, m.swiglu_limit, mnb, s));
        GPTOSS_TRY(mark("moe gate_up + swiglu"));
        GPTOSS_TRY(gemm(L.down, act_, n * m.K, &r2, Epilogue::kStore, part_, nullptr, m.H, 0, mnb, s));
    }
    GPTOSS_TRY(mark("moe down"));
    ResidualArgs moe;
    moe.mode = ResidualMode::kMoeAdd;
    moe.part = part_;
    moe.weights = weights_;
    moe.K = m.K;
    const float* next_norm = l + 1 < m.layers.size() ? m.layers[l + 1].attn_norm : m.final_norm;
    GPTOSS_TRY(residual_rmsnorm(moe, x_, next_norm, m.rms_norm_eps, xn_, n, m.H, s));
    return mark("moe combine + rmsnorm");
}

// A dense projection of the step (`which`: its bit for dense_batch_use): dense_batch_gemm where it
// is faster, else gemm() at nb column tiles per CTA; the two give the same bits.
gptoss_status BatchDecoder::dense(uint32_t which, const GemmWeights& w, const uint16_t* x, uint32_t n,
                                  Epilogue epilogue, float* out, uint32_t ldo, int nb) {
    if (dense_batch_use(which, n) && !w.mxfp4)
        return dense_batch_gemm(w, x, n, epilogue, out, ldo, stream_);
    return gemm(w, x, n, nullptr, epilogue, out, nullptr, ldo, 0, nb, stream_);
}

gptoss_status BatchDecoder::mark(const char* label) {
    if (!profiling_) return GPTOSS_OK;
    cudaEvent_t e = nullptr;
    GPTOSS_CUDA_TRY(cudaEventCreate(&e));
    events_.emplace_back(e, label);
    GPTOSS_CUDA_TRY(cudaEventRecord(e, stream_));
    return GPTOSS_OK;
}

// Sums the marked intervals of the step just synchronised into profile_[n].
gptoss_status BatchDecoder::collect_profile(uint32_t n) {
    Profile& p = profile_[n];
    p.steps++;
    for (size_t i = 1; i < events_.size(); ++i) {
        float ms = 0;
        GPTOSS_CUDA_TRY(cudaEventElapsedTime(&ms, events_[i - 1].first, events_[i].first));
        auto it = std::find_if(p.ms.begin(), p.ms.end(), [&](const auto& e) { return e.first == events_[i].second; });
        if (it == p.ms.end()) p.ms.emplace_back(events_[i].second, double(ms));
        else it->second += double(ms);
    }
    for (auto& e : events_) cudaEventDestroy(e.first);
    events_.clear();
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
