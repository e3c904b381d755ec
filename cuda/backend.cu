// cuda/backend.cu - the CUDA backend: weights on the device (uploaded from the mapped
// checkpoint through pinned staging buffers, repacked at load), sessions with their KV cache
// and scratch, and the forward pass as a sequence of the launchers in cuda/kernels.h; the
// decode step (one token) is captured once per session as a CUDA graph and replayed.
// Mirrors the CPU backend (cpu/backend.cpp) op for op; math in MODEL.md §Forward pass.
// Faults: every CUDA failure becomes GPTOSS_ERR_DEVICE (and poisons this backend: later
// calls fail too) or OUT_OF_MEMORY; the caller's current device is restored after each call.
#include "cuda/backend.h"
#include "cuda/batch_decode.h"
#include "cuda/decode_feed.h"
#include "cuda/common.cuh"
#include "cuda/decode_probe.h"
#include "cuda/host_moe.h"
#include "cuda/kernels.h"
#include "cuda/multi_gpu.h"
#include "cpu/reference.h"
#include "gptoss-offload.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

namespace gptoss {

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

namespace cuda {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

// Carves one device allocation into aligned pieces (two passes: measure, then assign).
class Carver {
public:
    explicit Carver(char* base) : base_(base) {}
    template <typename T> T* take(size_t bytes) {
        T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
        used_ += align_up(bytes);
        return p;
    }
    size_t used() const { return used_; }
private:
    char* base_;
    size_t used_ = 0;
};

struct LayerDev {
    bool sliding = false;
    float* attn_norm = nullptr;
    float* mlp_norm = nullptr;
    void* qkv_w = nullptr;
    float* qkv_b = nullptr;
    void* o_w = nullptr;
    float* o_b = nullptr;
    float* sinks = nullptr;
    void* router_w = nullptr;
    float* router_b = nullptr;
    uint16_t* router_fold_w = nullptr;  // router_fold_pack's layout (CudaBackend::router_fold_)
    void* gu_w = nullptr;
    uint16_t* gu_s = nullptr;
    float* gu_b = nullptr;
    void* dn_w = nullptr;
    uint16_t* dn_s = nullptr;
    float* dn_b = nullptr;
};

struct Dims {
    uint32_t H, I, E, K, Q, G, D, V, QD, QKV;
};

Dims dims_of(const Config& c) {
    Dims d{};
    d.H = c.hidden; d.I = c.intermediate; d.E = c.n_experts; d.K = c.n_experts_per_token;
    d.Q = c.n_heads; d.G = c.n_kv_heads; d.D = c.head_dim; d.V = c.vocab;
    d.QD = d.Q * d.D;
    d.QKV = (d.Q + 2 * d.G) * d.D;
    return d;
}

gptoss_status check_config(const Config& c) {
    const Dims d = dims_of(c);
    if (d.H % 64 || d.I % 64 || d.QD % 64)
        return fail(GPTOSS_ERR_UNSUPPORTED,
                    "CUDA backend: hidden_size %u, intermediate_size %u and heads·head_dim %u must be multiples of 64",
                    d.H, d.I, d.QD);
    if (d.D != 64) return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA backend: head_dim %u, only 64 is supported", d.D);
    if (d.G == 0 || d.Q % d.G || d.Q / d.G > 8)
        return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA backend: %u heads over %u kv heads, at most 8 per kv head", d.Q, d.G);
    if (d.E > 256 || d.K == 0 || d.K > 8 || d.K > d.E)
        return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA backend: %u experts, top-%u; supported up to 256, top-8", d.E, d.K);
    if (c.layer_sliding.size() != c.n_layers)
        return fail(GPTOSS_ERR_INTERNAL, "CUDA backend: layer_sliding has %zu entries, expected %u",
                    c.layer_sliding.size(), c.n_layers);
    return GPTOSS_OK;
}

class CudaBackend;
class Stager;

// ---------------------------------------------------------------------------
// Session

class CudaSession final : public BackendSession {
public:
    CudaSession(CudaBackend& backend, uint32_t n_vocab, uint32_t max_context, uint32_t max_batch)
        : BackendSession(n_vocab), be_(backend), max_context_(max_context), max_batch_(max_batch) {}
    ~CudaSession() override;

    gptoss_status init();
    gptoss_status forward(const int32_t* tokens, uint32_t n, uint32_t pos) override;
    gptoss_status decode(int32_t token, uint32_t pos) override;
    gptoss_status get_logits(const float** logits_out) override;
    gptoss_status sample(const SamplingConfig& config, double u, int32_t* token_out) override;
    gptoss_status sample_masked(const SamplingConfig& config, double u, const uint32_t* allowed,
                                int32_t* token_out) override;
    // The pipelined decode loop (gptoss-internal.h; cuda/decode_feed.h): the sampler's token goes
    // to the next step's input on the device. One GPU with every expert on it; otherwise (and
    // for a sampling config the device sampler does not take) the defaults.
    bool pipelines_decode() const override;
    gptoss_status sample_ahead(const SamplingConfig& config, double u, const uint32_t* allowed) override;
    gptoss_status decode_sampled(uint32_t pos) override;
    gptoss_status fetch_sampled(int32_t* token_out) override;
    gptoss_status save_sliding_snapshot() override;
    gptoss_status restore_sliding_snapshot() override;
    gptoss_status copy_sliding(bool restore);

    gptoss_status profile(const int32_t* tokens, uint32_t n, uint32_t pos, bool decode,
                          std::vector<std::pair<std::string, double>>* out);
    gptoss_status sync();
    // Whether decode(token, pos) replays the captured graph (no capture, hence no host-side
    // NCCL calls for a split model's rank).
    bool decode_replays(uint32_t pos) const { return graph_ && decode_splits_needed(pos) <= graph_splits_; }
    // CudaBackend::decode_batch: checks a decode token at pos and describes it for the step.
    gptoss_status batch_slot(int32_t token, uint32_t pos, BatchSlot* out);
    void batch_done(bool ok) { have_logits_ = ok; }
    // The prompt-chunk trace and the speculation's rows (batch_decode.h) identify a session by it.
    cudaStream_t batch_stream() const { return stream_; }

private:
    gptoss_status upload_step(const int32_t* tokens, uint32_t n, uint32_t pos);
    gptoss_status check_step(uint32_t n, uint32_t pos) const;
    // decode()'s graph at pos (captured again when pos needs more attention splits), launched;
    // the step's token and StepInfo are already on their way to the device.
    gptoss_status launch_decode(uint32_t pos);
    // Constrained decoding: the allowed-token bits up (pinned staging, then mask_) and the latest
    // logits masked in place on the device (cuda/mask.cu); the previous upload must be complete.
    gptoss_status mask_logits(const uint32_t* allowed);
    // The whole forward on stream_: the prefill kernels for n >= 1 tokens, or (decode) the
    // decode kernels for one token; full_splits = decode attention splits per full layer.
    gptoss_status enqueue(uint32_t n, bool decode, uint32_t full_splits);
    // enqueue()'s parts for layer l, in order: QKV, RoPE, attention, O (+ the split model's
    // attention all-reduce); RMSNorm + router + top-K + route; the experts (or host_moe) and the
    // combine + the next layer's RMSNorm. route: gate_up's route over tiles_ / pairs_, whose
    // tiling the router writes (down reads the same with in_div 1).
    gptoss_status enqueue_attention(uint32_t l, uint32_t n, bool decode, uint32_t full_splits);
    gptoss_status enqueue_router(uint32_t l, uint32_t n, bool decode, const GemmRoute& route);
    gptoss_status enqueue_moe(uint32_t l, uint32_t n, bool decode, const GemmRoute& route);
    // GEMM dispatch of enqueue(): the decode kernels (one token) or the prefill kernels (a
    // chunk). Arguments as cuda::gemm (kernels.h); route null for dense weights.
    gptoss_status project(bool decode, const GemmWeights& w, const uint16_t* x, uint32_t n_rows,
                          const GemmRoute* route, Epilogue epilogue, float* out_f32, uint16_t* out_bf16,
                          uint32_t ldo, float swiglu_limit, bool route_ready = false,
                          const RouterFoldArgs* fold = nullptr);
    // Whether this decode step's router runs in the O projection's epilogue (router_fold.cu):
    // the backend's router_fold_, one GPU, neither op emptied by the decode probe.
    bool folds_router(bool decode) const;
    gptoss_status mark(const char* label);
    gptoss_status checked(gptoss_status s);
    gptoss_status host_moe_failed();  // OUT_OF_MEMORY if a host-expert callback failed
    // The MoE experts of host layer l (issue 16): on the CPU for decode and short chunks, else
    // streamed into the backend's slot and run by the usual GEMMs.
    gptoss_status host_moe(uint32_t l, uint32_t n, bool decode, const GemmRoute& r1, const GemmRoute& r2);

public:
    // Device bytes of this session's KV cache and scratch (layout(nullptr) measures).
    size_t layout(char* base);
    // Split model: x_, part_, logits_ carved from `base` instead (nullptr: measures),
    // place_collectives() also zeroes them.
    size_t carve_collectives(char* base);
    [[nodiscard]] gptoss_status place_collectives(char* base);

public:
    void* comm_ = nullptr;  // ncclComm_t when this is one rank of a split model (set_session_comm)
private:
    HostMoeSession host_moe_;  // host layers' CPU path (pinned buffers, callbacks)
    size_t arena_bytes_ = 0;   // counted against the backend's budget
    CudaBackend& be_;
    uint32_t max_context_, max_batch_;
    int device_ = 0;
    cudaStream_t stream_ = nullptr;
    DeviceBuffer arena_;
    uint32_t max_splits_ = 0, max_tiles_ = 0;
    bool prefill_gemm_ = true;  // gemm_prefill for chunks; GPTOSS_GEMM_PREFILL=0: gemm() (A/B runs)
    // Splits the decode graph's full-attention launches cover: the graph is re-captured with
    // twice as many when the context outgrows them, so a 131072-token session does not launch
    // ~1000 idle CTAs per layer while its context is short.
    uint32_t graph_splits_ = 0;
    // scratch
    StepInfo* step_ = nullptr;
    int32_t* tokens_ = nullptr;
    float* x_ = nullptr;
    uint16_t* xn_ = nullptr;
    float* qkv_ = nullptr;
    float* q_ = nullptr;
    uint16_t* k_new_ = nullptr;
    uint16_t* v_new_ = nullptr;
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
    float* fold_partial_ = nullptr;  // the router fold's partial sums (CudaBackend::router_fold_)
    int32_t* argmax_ = nullptr;
    void* sample_scratch_ = nullptr;  // cuda::sample's scratch (sample_bytes_)
    size_t sample_bytes_ = 0;
    int32_t* token_ = nullptr;
    uint32_t* mask_ = nullptr;        // constrained decoding: the allowed-token bits [ceil(V/32)],
    uint32_t* mask_host_ = nullptr;   // and their pinned staging copy (allocated on first use),
    cudaEvent_t mask_event_ = nullptr;  // recorded after its latest upload
    struct LayerKv { uint16_t* k; uint16_t* v; uint32_t slots; uint16_t* snap_k; uint16_t* snap_v; };
    std::vector<LayerKv> kv_;
    std::vector<BatchAttentionItem> batch_layers_;  // kv_ as the batched step takes it
    // host side
    std::vector<float> logits_host_;
    std::vector<int32_t> tokens_host_;
    StepInfo step_host_{};
    cudaGraphExec_t graph_ = nullptr;
    bool have_logits_ = false;
    // The pipelined loop: next_pos_ = the end of the latest step (where a decode continues);
    // ahead_on_device_: the latest sample_ahead() went through feed_, which wrote tokens_[0] and
    // step_ = {ahead_pos_, 1}.
    DecodeFeed feed_;
    uint32_t next_pos_ = 0, ahead_pos_ = 0;
    bool ahead_on_device_ = false;
    // profiling
    bool profiling_ = false;
    std::vector<cudaEvent_t> events_;
    std::vector<const char*> labels_;
};

// ---------------------------------------------------------------------------
// Backend

class CudaBackend final : public Backend {
public:
    CudaBackend(const Config& config, int32_t device, const RankInfo& rank = RankInfo())
        : config_(config), dims_(dims_of(config)), device_(device), rank_(rank) {
        const Dims& d = dims_;
        router_fold_ = rank_.n_ranks == 1 && router_fold_default() && router_fold_supported(d.E, d.K, d.H) &&
                       decode_gemv_fold_usable(decode_tuning().bf16, d.QD);
    }
    ~CudaBackend() override {
        DeviceGuard guard(device_);
        arena_.reset();
    }

    gptoss_status create_session(uint32_t max_context, uint32_t max_batch,
                                 std::unique_ptr<BackendSession>* out) override {
        if (poisoned_) return fail(GPTOSS_ERR_DEVICE, "CUDA backend: an earlier CUDA error made this model unusable");
        if (max_context == 0 || max_batch == 0)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "CUDA session: max_context %u and max_batch %u must be > 0",
                        max_context, max_batch);
        if (max_batch > 8192)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "CUDA session: max_batch %u, at most 8192", max_batch);
        DeviceGuard guard(device_);
        auto s = std::make_unique<CudaSession>(*this, dims_.V, max_context, max_batch);
        GPTOSS_TRY(s->init());
        *out = std::move(s);
        return GPTOSS_OK;
    }
    uint64_t weight_bytes() const override { return arena_.bytes(); }
    uint32_t n_cpu_moe() const override { return host_.n_host(); }
    uint64_t host_weight_bytes() const override { return host_.bytes(); }
    int32_t device() const override { return device_; }
    // Prompt tokens per forward when the session leaves max_batch 0: 4096 for a one-device model
    // without a memory budget on a device of >= 64 GiB (one forward of 4096 tokens against two of
    // 2048, H200: 20b +6.6 %, 120b +3 % at depth 0 and +10 % at depth 16 384, bench/NOTES.md v24-v25;
    // ~270 MB more session scratch), else 2048 (the prefill GEMM tiles fill: 20b 256 pairs per expert).
    uint32_t default_max_batch() const override {
        return large_device() && rank_.n_ranks == 1 && budget_ == 0 ? 4096u : 2048u;
    }
    // Whether the device has >= 64 GiB of memory (asked once).
    bool large_device() const {
        if (large_device_.load() < 0) {
            cudaDeviceProp p{};
            const bool ok = cudaGetDeviceProperties(&p, device_) == cudaSuccess;
            if (!ok) cudaGetLastError();
            large_device_.store(ok && p.totalGlobalMem >= (size_t(64) << 30) ? 1 : 0);
        }
        return large_device_.load() == 1;
    }
    // Batched decode (cuda/batch_decode.h) unless GPTOSS_CUDA_DECODE_BATCH=0; single-GPU models
    // with every expert on the device; otherwise the default (each item's decode() in turn).
    void decode_batch(DecodeItem* const* items, uint32_t n, bool rows_stable) override;
    bool speculates() const override { return batch_speculation_enabled(); }
    void drop_speculation(BackendSession* session) override;
    const BatchModel& batch_model();

    // Layout of every weight in one allocation; with base == nullptr only measures.
    size_t layout(char* base) {
        const Dims& d = dims_;
        Carver c(base);
        embed_ = c.take<uint16_t>(size_t(d.V) * d.H * 2);
        lm_head_ = c.take<void>(bf16_fragment_bytes(lm_rows(), d.H));
        final_norm_ = c.take<float>(d.H * 4);
        inv_freq_ = c.take<float>(d.D / 2 * 4);
        bad_scale_ = c.take<int>(4);
        layers_.assign(config_.n_layers, LayerDev{});
        for (uint32_t l = 0; l < config_.n_layers; ++l) {
            LayerDev& L = layers_[l];
            L.sliding = config_.layer_sliding[l];
            L.attn_norm = c.take<float>(d.H * 4);
            L.mlp_norm = c.take<float>(d.H * 4);
            L.qkv_w = c.take<void>(bf16_fragment_bytes(d.QKV, d.H));
            L.qkv_b = c.take<float>(size_t(d.QKV) * 4);
            L.o_w = c.take<void>(bf16_fragment_bytes(d.H, d.QD));
            L.o_b = c.take<float>(d.H * 4);
            L.sinks = c.take<float>(d.Q * 4);
            L.router_w = c.take<void>(bf16_fragment_bytes(d.E, d.H));
            L.router_b = c.take<float>(d.E * 4);
            if (router_fold_) L.router_fold_w = c.take<uint16_t>(router_fold_bytes(d.E, d.H));
            L.gu_b = c.take<float>(size_t(d.E) * 2 * d.I * 4);
            L.dn_b = c.take<float>(size_t(d.E) * d.H * 4);
            if (l < n_host_) continue;  // experts in host memory (host_moe.h)
            take_experts(c, &L.gu_w, &L.gu_s, &L.dn_w, &L.dn_s);
        }
        // A host layer's experts stream through one raw buffer into one slot (long chunks).
        if (n_host_ > 0) {
            stream_raw_ = c.take<void>(HostExperts::streaming_raw_bytes(config_));
            take_experts(c, &slot_.gu_w, &slot_.gu_s, &slot_.dn_w, &slot_.dn_s);
        }
        return c.used();
    }
    void take_experts(Carver& c, void** gu_w, uint16_t** gu_s, void** dn_w, uint16_t** dn_s) {
        const Dims& d = dims_;
        *gu_w = c.take<void>(size_t(d.E) * mxfp4_fragment_bytes(2 * d.I, d.H));
        *gu_s = c.take<uint16_t>(size_t(d.E) * mxfp4_scale_bytes(2 * d.I, d.H));
        *dn_w = c.take<void>(size_t(d.E) * mxfp4_fragment_bytes(d.H, d.I));
        *dn_s = c.take<uint16_t>(size_t(d.E) * mxfp4_scale_bytes(d.H, d.I));
    }
    // Device bytes by part (gptoss-offload.h) for a session of fit_context tokens.
    OffloadSizes offload_sizes(uint32_t fit_context);
    // Chooses the host layers for `request` (plan_offload against the budget) and reserves
    // their host memory; then allocate() lays out the rest.
    gptoss_status plan_host_layers(const OffloadRequest& request);
    // Session bytes against the caller's budget (gptoss_model_params.gpu_memory_budget).
    gptoss_status reserve_session_bytes(size_t bytes);
    void release_session_bytes(size_t bytes) { session_bytes_ -= bytes; }

    gptoss_status allocate(size_t extra_bytes) {
        const size_t bytes = layout(nullptr);
        size_t free_b = 0, total_b = 0;
        GPTOSS_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
        if (bytes + extra_bytes > free_b)
            return fail(GPTOSS_ERR_OUT_OF_MEMORY,
                        "CUDA backend: the weights need %zu bytes (+%zu staging) on device %d, only %zu bytes free of %zu",
                        bytes, extra_bytes, device_, free_b, total_b);
        GPTOSS_TRY(arena_.alloc(bytes, "model weights"));
        layout(arena_.as<char>());
        return GPTOSS_OK;
    }

    gptoss_status upload_rope() {
        const cpu::Rope rope = cpu::rope_init(config_);
        rope_scale_ = rope.scale;
        GPTOSS_CUDA_TRY(cudaMemcpy(inv_freq_, rope.inv_freq, dims_.D / 2 * sizeof(float), cudaMemcpyHostToDevice));
        return GPTOSS_OK;
    }

    gptoss_status load(const Checkpoint& ck, const ProgressFn& progress);
    // load()'s parts for one layer, through the pinned stager and the raw device staging at rb:
    // norms, QKV, O, sinks, the router and the expert biases; the experts' MXFP4 blocks and
    // scales, repacked (device layers only).
    gptoss_status load_layer_dense(const LayerWeights& lw, LayerDev& L, Stager& st, char* rb, cudaStream_t s);
    gptoss_status load_layer_experts(const LayerWeights& lw, LayerDev& L, Stager& st, char* rb, cudaStream_t s);
    gptoss_status synthesize(uint64_t seed);

    GemmWeights dense(const void* w, const float* bias, uint32_t N, uint32_t K) const {
        GemmWeights g;
        g.w = w; g.bias = bias; g.N = N; g.K = K;
        return g;
    }
    GemmWeights experts(const void* w, const uint16_t* s, const float* b, uint32_t N, uint32_t K) const {
        GemmWeights g;
        g.w = w; g.scales = s; g.bias = b; g.mxfp4 = true; g.N = N; g.K = K;
        g.w_expert_stride = mxfp4_fragment_bytes(N, K);
        g.s_expert_stride = mxfp4_scale_bytes(N, K) / 2;
        g.bias_expert_stride = N;
        return g;
    }

    // lm_head rows held here: all V, or this rank's share of a split model.
    uint32_t lm_rows() const { return rank_.lm_rows ? rank_.lm_rows : dims_.V; }

    Config config_;
    Dims dims_;
    int32_t device_;
    RankInfo rank_;
    DeviceBuffer arena_;
    uint16_t* embed_ = nullptr;
    void* lm_head_ = nullptr;
    float* final_norm_ = nullptr;
    float* inv_freq_ = nullptr;
    int* bad_scale_ = nullptr;
    float rope_scale_ = 1.0f;
    std::vector<LayerDev> layers_;
    std::atomic<bool> poisoned_{false};
    // Issue 16: the experts of layers [0, n_host_) live in host_; one device slot streams them.
    uint32_t n_host_ = 0;
    // The decode graph's router folded into the O projection (router_fold.cu; one GPU, the fold's
    // shapes, GPTOSS_DECODE_ROUTER_FOLD); its weights' layout is kept only when set.
    bool router_fold_ = false;
    HostExperts host_;
    void* stream_raw_ = nullptr;
    LayerDev slot_;
    uint64_t budget_ = 0;  // the caller's gpu_memory_budget (0: none, only the device's free memory)
    mutable std::atomic<int> large_device_{-1};  // large_device(): unknown / no / yes
    std::atomic<uint64_t> session_bytes_{0};
    BatchModel batch_model_;
    BatchDecoder batch_;
};

// Host → device through two pinned staging buffers: the CPU copies (page-faults the mapping)
// into one while the DMA engine drains the other.
class Stager {
public:
    static constexpr size_t kChunk = 64u << 20;
    gptoss_status init(cudaStream_t stream) {
        stream_ = stream;
        for (int i = 0; i < 2; ++i) {
            GPTOSS_CUDA_TRY(cudaMallocHost(&buf_[i], kChunk));
            GPTOSS_CUDA_TRY(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
            GPTOSS_CUDA_TRY(cudaEventRecord(done_[i], stream_));
        }
        return GPTOSS_OK;
    }
    ~Stager() {
        for (int i = 0; i < 2; ++i) {
            if (done_[i]) { cudaEventSynchronize(done_[i]); cudaEventDestroy(done_[i]); }
            if (buf_[i]) cudaFreeHost(buf_[i]);
        }
    }
    gptoss_status upload(const void* host, size_t bytes, void* dev) {
        const char* src = static_cast<const char*>(host);
        char* dst = static_cast<char*>(dev);
        for (size_t off = 0; off < bytes; off += kChunk) {
            const size_t n = std::min(kChunk, bytes - off);
            GPTOSS_CUDA_TRY(cudaEventSynchronize(done_[cur_]));
            std::memcpy(buf_[cur_], src + off, n);
            GPTOSS_CUDA_TRY(cudaMemcpyAsync(dst + off, buf_[cur_], n, cudaMemcpyHostToDevice, stream_));
            GPTOSS_CUDA_TRY(cudaEventRecord(done_[cur_], stream_));
            cur_ ^= 1;
        }
        return GPTOSS_OK;
    }
private:
    cudaStream_t stream_ = nullptr;
    void* buf_[2] = {nullptr, nullptr};
    cudaEvent_t done_[2] = {nullptr, nullptr};
    int cur_ = 0;
};

class StreamOwner {
public:
    ~StreamOwner() { if (s) { cudaStreamSynchronize(s); cudaStreamDestroy(s); } }
    cudaStream_t s = nullptr;
};

// n bf16 values at `data` (host) → fp32 at `out` (device) through the raw staging at rb; gate_up:
// regrouped as the gate/up rows are (repack.cu).
gptoss_status bf16_to_f32_via(Stager& st, char* rb, cudaStream_t s, const void* data, uint32_t n, bool gate_up,
                              float* out) {
    GPTOSS_TRY(st.upload(data, size_t(n) * 2, rb));
    return bf16_to_f32(rb, n, gate_up, out, s);
}

gptoss_status CudaBackend::load(const Checkpoint& ck, const ProgressFn& progress) {
    const Dims& d = dims_;
    const Weights& w = ck.weights;
    // Raw staging on the device: the largest piece repacked at once.
    const size_t lm_chunk = 16384;  // lm_head rows staged per repack
    const size_t raw_bytes = std::max({size_t(d.QKV) * d.H * 2, size_t(d.H) * d.QD * 2, lm_chunk * d.H * 2,
                                       size_t(2 * d.I) * d.H / 2 + size_t(2 * d.I) * d.H / 32,
                                       size_t(d.E) * d.H * 2, size_t(d.E) * 2 * d.I * 2});
    GPTOSS_TRY(allocate(raw_bytes));
    DeviceBuffer raw;
    GPTOSS_TRY(raw.alloc(raw_bytes, "weight staging"));
    StreamOwner stream;
    GPTOSS_CUDA_TRY(cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
    Stager st;
    GPTOSS_TRY(st.init(stream.s));
    char* rb = raw.as<char>();
    GPTOSS_CUDA_TRY(cudaMemsetAsync(bad_scale_, 0, sizeof(int), stream.s));

    GPTOSS_TRY(st.upload(w.embed.data, size_t(d.V) * d.H * 2, embed_));
    for (size_t r0 = 0; r0 < lm_rows(); r0 += lm_chunk) {
        const size_t n = std::min<size_t>(lm_chunk, lm_rows() - r0);
        GPTOSS_TRY(st.upload(w.lm_head.bf16() + r0 * d.H, n * d.H * 2, rb));
        GPTOSS_TRY(repack_bf16(reinterpret_cast<uint16_t*>(rb), uint32_t(n), d.H,
                               static_cast<char*>(lm_head_) + (r0 / 16) * (d.H / 64) * 2048, stream.s));
    }
    GPTOSS_TRY(bf16_to_f32_via(st, rb, stream.s, w.norm.data, d.H, false, final_norm_));
    GPTOSS_TRY(upload_rope());

    for (uint32_t l = 0; l < config_.n_layers; ++l) {
        const LayerWeights& lw = w.layers[l];
        GPTOSS_TRY(load_layer_dense(lw, layers_[l], st, rb, stream.s));
        if (l < n_host_) GPTOSS_TRY(host_.copy_layer(l, lw));
        else GPTOSS_TRY(load_layer_experts(lw, layers_[l], st, rb, stream.s));
        if (progress && !progress(float(l + 1) / float(config_.n_layers))) {
            GPTOSS_CUDA_TRY(cudaStreamSynchronize(stream.s));
            return fail(GPTOSS_ERR_CANCELLED, "loading cancelled by the progress callback after layer %u", l);
        }
    }
    int bad = 0;
    GPTOSS_CUDA_TRY(cudaMemcpyAsync(&bad, bad_scale_, sizeof(int), cudaMemcpyDeviceToHost, stream.s));
    GPTOSS_CUDA_TRY(cudaStreamSynchronize(stream.s));
    if (bad)
        return fail(GPTOSS_ERR_UNSUPPORTED,
                    "CUDA backend: an MXFP4 scale byte is %d (2^%d); the GPU dequantizer supports at most 128", bad,
                    bad - 127);
    return GPTOSS_OK;
}

gptoss_status CudaBackend::load_layer_dense(const LayerWeights& lw, LayerDev& L, Stager& st, char* rb,
                                            cudaStream_t s) {
    const Dims& d = dims_;
    GPTOSS_TRY(bf16_to_f32_via(st, rb, s, lw.attn_norm.data, d.H, false, L.attn_norm));
    GPTOSS_TRY(bf16_to_f32_via(st, rb, s, lw.mlp_norm.data, d.H, false, L.mlp_norm));
    // q | k | v rows concatenated, then one repack.
    const size_t qb = size_t(d.QD) * d.H * 2, kb = size_t(d.G) * d.D * d.H * 2;
    GPTOSS_TRY(st.upload(lw.q_weight.data, qb, rb));
    GPTOSS_TRY(st.upload(lw.k_weight.data, kb, rb + qb));
    GPTOSS_TRY(st.upload(lw.v_weight.data, kb, rb + qb + kb));
    GPTOSS_TRY(repack_bf16(reinterpret_cast<uint16_t*>(rb), d.QKV, d.H, L.qkv_w, s));
    GPTOSS_TRY(st.upload(lw.q_bias.data, d.QD * 2, rb));
    GPTOSS_TRY(st.upload(lw.k_bias.data, d.G * d.D * 2, rb + d.QD * 2));
    GPTOSS_TRY(st.upload(lw.v_bias.data, d.G * d.D * 2, rb + d.QD * 2 + d.G * d.D * 2));
    GPTOSS_TRY(bf16_to_f32(rb, d.QKV, false, L.qkv_b, s));
    GPTOSS_TRY(st.upload(lw.o_weight.data, size_t(d.H) * d.QD * 2, rb));
    GPTOSS_TRY(repack_bf16(reinterpret_cast<uint16_t*>(rb), d.H, d.QD, L.o_w, s));
    GPTOSS_TRY(bf16_to_f32_via(st, rb, s, lw.o_bias.data, d.H, false, L.o_b));
    if (lw.sinks.dtype == DType::F32) {
        GPTOSS_TRY(st.upload(lw.sinks.data, d.Q * 4, L.sinks));
    } else {
        GPTOSS_TRY(bf16_to_f32_via(st, rb, s, lw.sinks.data, d.Q, false, L.sinks));
    }
    GPTOSS_TRY(st.upload(lw.router_weight.data, size_t(d.E) * d.H * 2, rb));
    GPTOSS_TRY(repack_bf16(reinterpret_cast<uint16_t*>(rb), d.E, d.H, L.router_w, s));
    if (L.router_fold_w) GPTOSS_TRY(router_fold_pack(L.router_w, d.E, d.H, L.router_fold_w, s));
    GPTOSS_TRY(bf16_to_f32_via(st, rb, s, lw.router_bias.data, d.E, false, L.router_b));
    // The gate/up regrouping of the rows applies to each expert's bias too.
    for (uint32_t e = 0; e < d.E; ++e)
        GPTOSS_TRY(bf16_to_f32_via(st, rb, s, lw.gate_up_bias.bf16() + size_t(e) * 2 * d.I, 2 * d.I, true,
                                   L.gu_b + size_t(e) * 2 * d.I));
    return bf16_to_f32_via(st, rb, s, lw.down_bias.data, d.E * d.H, false, L.dn_b);
}

gptoss_status CudaBackend::load_layer_experts(const LayerWeights& lw, LayerDev& L, Stager& st, char* rb,
                                              cudaStream_t s) {
    const Dims& d = dims_;
    const GemmWeights gu = experts(L.gu_w, L.gu_s, L.gu_b, 2 * d.I, d.H);
    const GemmWeights dn = experts(L.dn_w, L.dn_s, L.dn_b, d.H, d.I);
    const size_t gu_blk = size_t(2 * d.I) * d.H / 2, gu_sc = size_t(2 * d.I) * d.H / 32;
    const size_t dn_blk = size_t(d.H) * d.I / 2, dn_sc = size_t(d.H) * d.I / 32;
    for (uint32_t e = 0; e < d.E; ++e) {
        GPTOSS_TRY(st.upload(lw.gate_up_blocks.u8() + e * gu_blk, gu_blk, rb));
        GPTOSS_TRY(st.upload(lw.gate_up_scales.u8() + e * gu_sc, gu_sc, rb + gu_blk));
        GPTOSS_TRY(repack_mxfp4(reinterpret_cast<uint8_t*>(rb), reinterpret_cast<uint8_t*>(rb + gu_blk), 2 * d.I,
                                d.H, true, static_cast<char*>(L.gu_w) + e * gu.w_expert_stride,
                                L.gu_s + e * gu.s_expert_stride, bad_scale_, s));
        GPTOSS_TRY(st.upload(lw.down_blocks.u8() + e * dn_blk, dn_blk, rb));
        GPTOSS_TRY(st.upload(lw.down_scales.u8() + e * dn_sc, dn_sc, rb + dn_blk));
        GPTOSS_TRY(repack_mxfp4(reinterpret_cast<uint8_t*>(rb), reinterpret_cast<uint8_t*>(rb + dn_blk), d.H, d.I,
                                false, static_cast<char*>(L.dn_w) + e * dn.w_expert_stride,
                                L.dn_s + e * dn.s_expert_stride, bad_scale_, s));
    }
    return GPTOSS_OK;
}

gptoss_status CudaBackend::synthesize(uint64_t seed) {
    const Dims& d = dims_;
    GPTOSS_TRY(allocate(0));
    StreamOwner stream;
    GPTOSS_CUDA_TRY(cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
    uint64_t k = seed * 1000003ull;
    const float amp = 0.0346f;  // uniform [-a, a) has std a/sqrt(3) = 0.02
    auto bf16 = [&](void* p, size_t bytes) { return fill_random(p, bytes / 4, ++k, true, amp, stream.s); };
    auto vec = [&](float* p, size_t n, float c, float a) { return fill_random_f32(p, n, ++k, c, a, stream.s); };
    GPTOSS_TRY(bf16(embed_, size_t(d.V) * d.H * 2));
    GPTOSS_TRY(bf16(lm_head_, bf16_fragment_bytes(lm_rows(), d.H)));
    GPTOSS_TRY(vec(final_norm_, d.H, 1.0f, 0.05f));
    GPTOSS_TRY(upload_rope());
    for (LayerDev& L : layers_) {
        GPTOSS_TRY(vec(L.attn_norm, d.H, 1.0f, 0.05f));
        GPTOSS_TRY(vec(L.mlp_norm, d.H, 1.0f, 0.05f));
        GPTOSS_TRY(bf16(L.qkv_w, bf16_fragment_bytes(d.QKV, d.H)));
        GPTOSS_TRY(vec(L.qkv_b, d.QKV, 0.0f, 0.01f));
        GPTOSS_TRY(bf16(L.o_w, bf16_fragment_bytes(d.H, d.QD)));
        GPTOSS_TRY(vec(L.o_b, d.H, 0.0f, 0.01f));
        GPTOSS_TRY(vec(L.sinks, d.Q, 0.0f, 1.0f));
        GPTOSS_TRY(bf16(L.router_w, bf16_fragment_bytes(d.E, d.H)));
        if (L.router_fold_w) GPTOSS_TRY(router_fold_pack(L.router_w, d.E, d.H, L.router_fold_w, stream.s));
        GPTOSS_TRY(vec(L.router_b, d.E, 0.0f, 0.01f));
        if (L.gu_w == nullptr) continue;  // a host layer: host_moe_biases() below
        GPTOSS_TRY(fill_random(L.gu_w, size_t(d.E) * mxfp4_fragment_bytes(2 * d.I, d.H) / 4, ++k, false, 0, stream.s));
        GPTOSS_TRY(fill_random_scales(L.gu_s, size_t(d.E) * mxfp4_scale_bytes(2 * d.I, d.H) / 2, ++k, 118, 122, stream.s));
        GPTOSS_TRY(vec(L.gu_b, size_t(d.E) * 2 * d.I, 0.0f, 0.01f));
        GPTOSS_TRY(fill_random(L.dn_w, size_t(d.E) * mxfp4_fragment_bytes(d.H, d.I) / 4, ++k, false, 0, stream.s));
        GPTOSS_TRY(fill_random_scales(L.dn_s, size_t(d.E) * mxfp4_scale_bytes(d.H, d.I) / 2, ++k, 118, 122, stream.s));
        GPTOSS_TRY(vec(L.dn_b, size_t(d.E) * d.H, 0.0f, 0.01f));
    }
    if (n_host_ > 0) {
        // Host layers: random experts in host memory; their biases go to the device from
        // there, so the CPU and streaming paths see the same weights.
        host_.fill_random(seed);
        DeviceBuffer raw;
        GPTOSS_TRY(raw.alloc(size_t(d.E) * 2 * d.I * 2, "bias staging"));
        for (uint32_t l = 0; l < n_host_; ++l) {
            const cpu::MoeWeights hw = host_.layer(l);
            GPTOSS_CUDA_TRY(cudaMemcpyAsync(raw.get(), hw.gate_up_bias, size_t(d.E) * 2 * d.I * 2,
                                            cudaMemcpyHostToDevice, stream.s));
            for (uint32_t e = 0; e < d.E; ++e)
                GPTOSS_TRY(bf16_to_f32(raw.as<char>() + size_t(e) * 2 * d.I * 2, 2 * d.I, true,
                                       layers_[l].gu_b + size_t(e) * 2 * d.I, stream.s));
            GPTOSS_CUDA_TRY(cudaMemcpyAsync(raw.get(), hw.down_bias, size_t(d.E) * d.H * 2, cudaMemcpyHostToDevice,
                                            stream.s));
            GPTOSS_TRY(bf16_to_f32(raw.get(), d.E * d.H, false, layers_[l].dn_b, stream.s));
            GPTOSS_CUDA_TRY(cudaStreamSynchronize(stream.s));  // raw is reused by the next layer
        }
    }
    GPTOSS_CUDA_TRY(cudaStreamSynchronize(stream.s));
    return GPTOSS_OK;
}

OffloadSizes CudaBackend::offload_sizes(uint32_t fit_context) {
    OffloadSizes z;
    z.n_layers = config_.n_layers;
    const uint32_t keep = n_host_;
    n_host_ = 0;
    const size_t all = layout(nullptr);
    n_host_ = config_.n_layers;
    const size_t none = layout(nullptr);
    n_host_ = keep;
    z.streaming = HostExperts::streaming_bytes(config_);
    z.fixed = none >= z.streaming ? none - z.streaming : none;
    z.expert_layer = z.n_layers ? (all - z.fixed) / z.n_layers : 0;
    CudaSession probe(*this, dims_.V, fit_context ? fit_context : kDefaultFitContext, default_max_batch());
    size_t sample_bytes = 0;
    if (sample_scratch_bytes(dims_.V, &sample_bytes) != GPTOSS_OK) sample_bytes = 0;
    z.session = probe.layout(nullptr) + sample_bytes + 256;
    return z;
}

gptoss_status CudaBackend::plan_host_layers(const OffloadRequest& request) {
    size_t free_b = 0, total_b = 0;
    GPTOSS_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    const uint64_t budget = offload_budget(request, free_b);
    budget_ = request.gpu_memory_budget;
    const OffloadSizes sizes = offload_sizes(request.fit_context);
    uint32_t n = 0;
    const char* name = config_.n_layers == 36 ? "gpt-oss-120b" : config_.n_layers == 24 ? "gpt-oss-20b" : "the model";
    GPTOSS_TRY(plan_offload(sizes, request, budget, name, &n));
    n_host_ = n;
    GPTOSS_TRY(host_.init(config_, n));
    if (n > 0 || request.gpu_memory_budget != 0)
        log(GPTOSS_LOG_INFO,
            "CUDA backend: experts of layers 0..%d in host memory (%s%s), layers %u..%u on device %d; device: %s of "
            "weights and streaming buffers + %s per session of %u tokens, budget %s",
            int(n) - 1, gigabytes(host_.bytes()).c_str(), n > 0 ? "" : ", none", n, config_.n_layers - 1, device_,
            gigabytes(offload_weight_bytes(sizes, n)).c_str(), gigabytes(sizes.session).c_str(),
            request.fit_context ? request.fit_context : kDefaultFitContext, gigabytes(budget).c_str());
    return GPTOSS_OK;
}

gptoss_status CudaBackend::reserve_session_bytes(size_t bytes) {
    if (budget_ == 0) {
        session_bytes_ += bytes;
        return GPTOSS_OK;
    }
    const uint64_t used = arena_.bytes() + session_bytes_.load();
    if (used + bytes > budget_)
        return fail(GPTOSS_ERR_OUT_OF_MEMORY,
                    "CUDA session: KV cache and scratch need %s, but the model's weights and sessions already hold %s "
                    "of its GPU memory budget (params.gpu_memory_budget) of %s",
                    gigabytes(bytes).c_str(), gigabytes(used).c_str(), gigabytes(budget_).c_str());
    session_bytes_ += bytes;
    return GPTOSS_OK;
}

// ---------------------------------------------------------------------------
// Session implementation

CudaSession::~CudaSession() {
    if (arena_bytes_) be_.release_session_bytes(arena_bytes_);
    if (stream_ == nullptr && arena_.get() == nullptr) return;  // never initialised (offload_sizes' probe)
    DeviceGuard guard(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    feed_.release();
    if (graph_) cudaGraphExecDestroy(graph_);
    if (mask_) cudaFree(mask_);
    if (mask_host_) cudaFreeHost(mask_host_);
    if (mask_event_) cudaEventDestroy(mask_event_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
    arena_.reset();
}

gptoss_status CudaSession::checked(gptoss_status s) {
    if (s == GPTOSS_ERR_DEVICE) be_.poisoned_ = true;
    return s;
}

size_t CudaSession::layout(char* base) {
    const Dims& d = be_.dims_;
    const Config& c = be_.config_;
    const uint32_t T = max_batch_;
    max_splits_ = ceil_div(max_context_, kAttentionSplit) + 1;
    max_tiles_ = route_max_tiles(T, d.E, d.K, 8);
    Carver cv(base);
    step_ = cv.take<StepInfo>(sizeof(StepInfo));
    tokens_ = cv.take<int32_t>(T * 4);
    x_ = cv.take<float>(size_t(T) * d.H * 4);
    xn_ = cv.take<uint16_t>(size_t(T) * d.H * 2);
    qkv_ = cv.take<float>(size_t(T) * d.QKV * 4);
    q_ = cv.take<float>(size_t(T) * d.QD * 4);
    k_new_ = cv.take<uint16_t>(size_t(T) * d.G * d.D * 2);
    v_new_ = cv.take<uint16_t>(size_t(T) * d.G * d.D * 2);
    attn_ = cv.take<uint16_t>(size_t(T) * d.QD * 2);
    rlogits_ = cv.take<float>(size_t(T) * d.E * 4);
    experts_ = cv.take<int32_t>(size_t(T) * d.K * 4);
    weights_ = cv.take<float>(size_t(T) * d.K * 4);
    tiles_ = cv.take<int32_t>((1 + 3 * size_t(max_tiles_)) * 4);
    pairs_ = cv.take<int32_t>(size_t(T) * d.K * 4);
    act_ = cv.take<uint16_t>(size_t(T) * d.K * d.I * 2);
    part_ = cv.take<float>(size_t(T) * d.K * d.H * 4);
    logits_ = cv.take<float>(std::max<size_t>(d.V, size_t(be_.lm_rows()) * be_.rank_.n_ranks) * 4);
    partial_ = cv.take<float>(size_t(d.Q) * max_splits_ * attn_partial_floats(d.D) * 4);
    argmax_ = cv.take<int32_t>(8);
    token_ = cv.take<int32_t>(4);
    sample_scratch_ = cv.take<void>(sample_bytes_);
    counters_ = cv.take<int>(size_t(d.G + 2) * 4);  // attention's G, the router's, the router fold's
    fold_partial_ = be_.router_fold_ ? cv.take<float>(size_t(ceil_div(d.H, 16)) * (d.E + 1) * 4) : nullptr;
    kv_.assign(c.n_layers, LayerKv{});
    for (uint32_t l = 0; l < c.n_layers; ++l) {
        LayerKv& kv = kv_[l];
        kv.slots = c.layer_sliding[l] ? std::min(c.sliding_window, max_context_) : max_context_;
        const size_t bytes = size_t(kv.slots) * d.G * d.D * 2;
        kv.k = cv.take<uint16_t>(bytes);
        kv.v = cv.take<uint16_t>(bytes);
        kv.snap_k = c.layer_sliding[l] ? cv.take<uint16_t>(bytes) : nullptr;
        kv.snap_v = c.layer_sliding[l] ? cv.take<uint16_t>(bytes) : nullptr;
    }
    batch_layers_.clear();
    for (const LayerKv& kv : kv_) batch_layers_.push_back(BatchAttentionItem{kv.k, kv.v, kv.slots, 0});
    return cv.used();
}

size_t CudaSession::carve_collectives(char* base) {
    const Dims& d = be_.dims_;
    Carver cv(base);
    float* x = cv.take<float>(size_t(max_batch_) * d.H * 4);
    float* part = cv.take<float>(size_t(max_batch_) * d.K * d.H * 4);
    float* logits = cv.take<float>(std::max<size_t>(d.V, size_t(be_.lm_rows()) * be_.rank_.n_ranks) * 4);
    if (base) x_ = x, part_ = part, logits_ = logits;
    return cv.used();
}

gptoss_status CudaSession::place_collectives(char* base) {
    const size_t bytes = carve_collectives(base);
    DeviceGuard guard(device_);
    return checked(cuda_status(cudaMemsetAsync(base, 0, bytes, stream_), "cudaMemsetAsync", __FILE__, __LINE__));
}

gptoss_status CudaSession::init() {
    device_ = be_.device_;
    const Dims& d = be_.dims_;
    const char* pg = std::getenv("GPTOSS_GEMM_PREFILL");
    prefill_gemm_ = !(pg && std::strcmp(pg, "0") == 0);
    GPTOSS_TRY(checked(sample_scratch_bytes(d.V, &sample_bytes_)));
    const size_t bytes = layout(nullptr);
    size_t free_b = 0, total_b = 0;
    GPTOSS_TRY(checked(cuda_status(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo", __FILE__, __LINE__)));
    if (bytes > free_b)
        return fail(GPTOSS_ERR_OUT_OF_MEMORY,
                    "CUDA session: KV cache and scratch need %zu bytes (max_context %u, max_batch %u) on device %d, "
                    "only %zu bytes free",
                    bytes, max_context_, max_batch_, device_, free_b);
    GPTOSS_TRY(be_.reserve_session_bytes(bytes));
    arena_bytes_ = bytes;
    GPTOSS_TRY(arena_.alloc(bytes, "session KV cache and scratch"));
    layout(arena_.as<char>());
    GPTOSS_TRY(checked(cuda_status(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate",
                                   __FILE__, __LINE__)));
    // Zeroed so that nothing ever reads uninitialized memory (compute-sanitizer initcheck).
    GPTOSS_TRY(checked(cuda_status(cudaMemsetAsync(arena_.get(), 0, arena_.bytes(), stream_), "cudaMemsetAsync",
                                   __FILE__, __LINE__)));
    logits_host_.resize(d.V);
    if (be_.n_host_ > 0) GPTOSS_TRY(host_moe_.init(&be_.host_, be_.config_));
    return GPTOSS_OK;
}

gptoss_status CudaSession::mark(const char* label) {
    if (!profiling_) return GPTOSS_OK;
    cudaEvent_t e;
    GPTOSS_CUDA_TRY(cudaEventCreate(&e));
    events_.push_back(e);
    labels_.push_back(label);
    GPTOSS_CUDA_TRY(cudaEventRecord(e, stream_));
    return GPTOSS_OK;
}

gptoss_status CudaSession::project(bool decode, const GemmWeights& w, const uint16_t* x, uint32_t n_rows,
                                   const GemmRoute* route, Epilogue epilogue, float* out_f32, uint16_t* out_bf16,
                                   uint32_t ldo, float swiglu_limit, bool route_ready, const RouterFoldArgs* fold) {
    // Decode: gemm_decode's split-K GEMVs (route_ready: the route was final before the previous
    // kernel's wait); lm_head-sized N (thousands of slabs, already at the floor) keeps gemm.
    const DecodeTuning& dt = decode_tuning();
    if (decode && (route || n_rows == 1) && w.N <= 65536)
        return gemm_decode(w, x, route, route_ready && dt.route_ready, epilogue, out_f32, out_bf16, ldo, swiglu_limit,
                           w.mxfp4 ? dt.fp4 : dt.bf16, stream_, fold);
    if (fold) return fail(GPTOSS_ERR_INTERNAL, "CUDA project: the router fold is a decode GEMV epilogue");
    // Prefill: the tiled kernel for the expert GEMMs and the dense projections; the router
    // (N <= 256 rows) keeps gemm(), whose logits are the fused decode router's bits.
    if (!decode && prefill_gemm_ && (route || w.N > 256))
        return gemm_prefill(w, x, n_rows, route, epilogue, out_f32, out_bf16, ldo, swiglu_limit, stream_);
    // The prefill router (a few 16-row slabs) at 2 column tiles per CTA: 4× the CTAs of nb 8, whose
    // 64 CTAs for the 20b left half the SMs idle; 0.46 → 0.24 ms per 20b prefill of 2048, nb 1 no
    // better (bench/NOTES.md "v19 prefill router"). Same bits whatever nb.
    const int nb = decode ? 1 : w.N <= 256 ? 2 : 8;
    return gemm(w, x, n_rows, route, epilogue, out_f32, out_bf16, ldo, swiglu_limit, nb, stream_);
}

// Timing only (decode_probe.h): an empty kernel in place of each op GPTOSS_DECODE_PROBE lists.
bool emptied(bool decode, DecodeOp op) { return decode && decode_probe_skips(op); }

bool CudaSession::folds_router(bool decode) const {
    return decode && be_.router_fold_ && comm_ == nullptr && !emptied(decode, DecodeOp::kO) &&
           !emptied(decode, DecodeOp::kRouter);
}

gptoss_status CudaSession::enqueue(uint32_t n, bool decode, uint32_t full_splits) {
    CudaBackend& b = be_;
    const Dims& d = b.dims_;
    const Config& c = b.config_;
    if (decode && n != 1) return fail(GPTOSS_ERR_INTERNAL, "CUDA enqueue: decode of %u tokens", n);
    // Route tiles: 8 token columns per tile of gemm()'s nb, or gemm_prefill's 64 / 128 tokens.
    GemmRoute route;
    route.tiles = tiles_;
    route.pairs = pairs_;
    route.in_div = d.K;
    route.tile_tokens = decode ? 8u : prefill_gemm_ ? gemm_prefill_tile_tokens(n * d.K, d.E) : 64u;
    route.max_tiles = route_max_tiles(n, d.E, d.K, route.tile_tokens);
    route.tile_extra = !decode && prefill_gemm_ ? gemm_prefill_tile_extra(route.tile_tokens) : 0u;

    ResidualArgs embed;
    embed.mode = ResidualMode::kEmbed;
    embed.embed = b.embed_;
    embed.tokens = tokens_;
    GPTOSS_TRY(mark("start"));
    GPTOSS_TRY(residual_rmsnorm(embed, x_, b.layers_[0].attn_norm, c.rms_norm_eps, xn_, n, d.H, stream_));
    GPTOSS_TRY(mark("embed+norm"));
    for (uint32_t l = 0; l < c.n_layers; ++l) {
        GPTOSS_TRY(enqueue_attention(l, n, decode, full_splits));
        GPTOSS_TRY(enqueue_router(l, n, decode, route));
        GPTOSS_TRY(enqueue_moe(l, n, decode, route));
    }
    // One row: the decode GEMV serves prefill too (a row's bits depend only on that row).
    // Split model: this rank's vocabulary rows land at their offset; the all-gather fills the rest.
    const uint32_t lm_rows = b.lm_rows();
    if (emptied(decode, DecodeOp::kLmHead)) GPTOSS_TRY(decode_probe_empty(stream_));
    else
        GPTOSS_TRY(project(true, b.dense(b.lm_head_, nullptr, lm_rows, d.H), xn_ + size_t(n - 1) * d.H, 1, nullptr,
                           Epilogue::kStore, logits_ + size_t(b.rank_.rank) * lm_rows, nullptr, lm_rows, 0));
    GPTOSS_TRY(mark("lm_head"));
    if (comm_) {
        GPTOSS_TRY(rank_all_gather(comm_, logits_, lm_rows, stream_));
        GPTOSS_TRY(mark("all-gather (logits)"));
    }
    return GPTOSS_OK;
}

gptoss_status CudaSession::enqueue_attention(uint32_t l, uint32_t n, bool decode, uint32_t full_splits) {
    CudaBackend& b = be_;
    const Dims& d = b.dims_;
    const Config& c = b.config_;
    const LayerDev& L = b.layers_[l];
    const LayerKv& kv = kv_[l];
    cudaStream_t s = stream_;
    if (emptied(decode, DecodeOp::kQkv)) {
        GPTOSS_TRY(decode_probe_empty(s));
    } else {
        GPTOSS_TRY(project(decode, b.dense(L.qkv_w, L.qkv_b, d.QKV, d.H), xn_, n, nullptr, Epilogue::kStore, qkv_,
                           nullptr, d.QKV, 0));
        GPTOSS_TRY(mark("qkv gemm"));
    }
    // Decode writes K/V straight into the cache; a chunk goes through k_new_/v_new_ and is
    // committed after attention (its queries still need the ring slots it will overwrite).
    // (RoPE is fused into the decode attention kernel.)
    const bool direct = decode;
    if (!direct) {
        GPTOSS_TRY(rope_qkv(qkv_, step_, b.inv_freq_, b.rope_scale_, q_, k_new_, v_new_, nullptr, nullptr, kv.slots,
                            n, d.Q, d.G, d.D, s));
        GPTOSS_TRY(mark("rope"));
    }
    AttentionArgs aa;
    aa.q = q_; aa.k_new = direct ? nullptr : k_new_; aa.v_new = direct ? nullptr : v_new_; aa.k_cache = kv.k; aa.v_cache = kv.v;
    aa.slots = kv.slots; aa.window = L.sliding ? c.sliding_window : 0; aa.sinks = L.sinks; aa.step = step_;
    aa.T = n; aa.Q = d.Q; aa.G = d.G; aa.D = d.D; aa.out = attn_;
    if (decode) {
        aa.qkv = qkv_; aa.inv_freq = b.inv_freq_; aa.rope_scale = b.rope_scale_;
        const uint32_t splits = L.sliding ? std::min(max_splits_, ceil_div(c.sliding_window, kAttentionSplit) + 1)
                                          : std::min(full_splits, kMaxDecodeSplits);
        if (emptied(decode, DecodeOp::kAttn)) GPTOSS_TRY(decode_probe_empty(s));
        else GPTOSS_TRY(attention_decode(aa, partial_, counters_, splits, s));
    } else {
        GPTOSS_TRY(attention_prefill(aa, s));
    }
    GPTOSS_TRY(mark(direct ? (L.sliding ? "rope + attention (sliding)" : "rope + attention (full)")
                           : (L.sliding ? "attention (sliding)" : "attention (full)")));
    if (!direct) {
        GPTOSS_TRY(kv_commit(k_new_, v_new_, kv.k, kv.v, kv.slots, step_, n, d.G * d.D, s));
        GPTOSS_TRY(mark("kv commit"));
    }
    // Split model: rank 0 adds the residual, the others store their partial o_proj; the
    // all-reduce sums them (gptoss-shard.h).
    RouterFoldArgs fold;
    const bool folded = folds_router(decode);
    if (folded) {
        fold.w = L.router_fold_w; fold.bias = L.router_b; fold.norm_w = L.mlp_norm; fold.eps = c.rms_norm_eps;
        fold.E = d.E; fold.K = d.K; fold.partial = fold_partial_; fold.counter = counters_ + d.G + 1;
        fold.xn = xn_; fold.logits = rlogits_; fold.experts = experts_; fold.weights = weights_; fold.tiles = tiles_;
        fold.pairs = pairs_;
    }
    if (emptied(decode, DecodeOp::kO)) GPTOSS_TRY(decode_probe_empty(s));
    else GPTOSS_TRY(project(decode, b.dense(L.o_w, L.o_b, d.H, d.QD), attn_, n, nullptr,
                            b.rank_.rank == 0 ? Epilogue::kAdd : Epilogue::kStore, x_, nullptr, d.H, 0, false,
                            folded ? &fold : nullptr));
    GPTOSS_TRY(mark(folded ? "o gemm + residual + rmsnorm + router + top-k (folded)" : "o gemm + residual"));
    if (comm_) {
        GPTOSS_TRY(rank_all_reduce(comm_, x_, size_t(n) * d.H, s));
        GPTOSS_TRY(mark("all-reduce (attention)"));
    }
    return GPTOSS_OK;
}

gptoss_status CudaSession::enqueue_router(uint32_t l, uint32_t n, bool decode, const GemmRoute& route) {
    CudaBackend& b = be_;
    const Dims& d = b.dims_;
    const Config& c = b.config_;
    const LayerDev& L = b.layers_[l];
    cudaStream_t s = stream_;
    if (folds_router(decode)) return GPTOSS_OK;  // O's epilogue routed (enqueue_attention)
    if (decode && router_decode_supported(d.E, d.K, d.H)) {
        RouterDecodeArgs ra;
        ra.x = x_; ra.norm_w = L.mlp_norm; ra.eps = c.rms_norm_eps; ra.router = b.dense(L.router_w, L.router_b, d.E, d.H);
        ra.K = d.K; ra.xn = xn_; ra.logits = rlogits_; ra.counter = counters_ + d.G; ra.experts = experts_; ra.weights = weights_; ra.tiles = tiles_; ra.pairs = pairs_;
        if (emptied(decode, DecodeOp::kRouter)) GPTOSS_TRY(decode_probe_empty(s));
        else GPTOSS_TRY(router_decode(ra, s));
        return mark("rmsnorm + router + top-k (fused)");
    }
    ResidualArgs none;
    GPTOSS_TRY(residual_rmsnorm(none, x_, L.mlp_norm, c.rms_norm_eps, xn_, n, d.H, s));
    GPTOSS_TRY(mark("rmsnorm"));
    GPTOSS_TRY(project(decode, b.dense(L.router_w, L.router_b, d.E, d.H), xn_, n, nullptr, Epilogue::kStore,
                       rlogits_, nullptr, d.E, 0));
    GPTOSS_TRY(mark("router gemm"));
    GPTOSS_TRY(router_route(rlogits_, n, d.E, d.K, experts_, weights_, tiles_, pairs_, route.tile_tokens, s,
                            route.tile_extra));
    return mark("router top-k + route");
}

gptoss_status CudaSession::enqueue_moe(uint32_t l, uint32_t n, bool decode, const GemmRoute& route) {
    CudaBackend& b = be_;
    const Dims& d = b.dims_;
    const Config& c = b.config_;
    const LayerDev& L = b.layers_[l];
    cudaStream_t s = stream_;
    const GemmRoute& r1 = route;
    GemmRoute r2 = route;
    r2.in_div = 1;
    const float* next_norm = l + 1 < c.n_layers ? b.layers_[l + 1].attn_norm : b.final_norm_;
    if (l < b.n_host_) {
        GPTOSS_TRY(host_moe(l, n, decode, r1, r2));
    } else {
        if (emptied(decode, DecodeOp::kGateUp)) GPTOSS_TRY(decode_probe_empty(s));
        else GPTOSS_TRY(project(decode, b.experts(L.gu_w, L.gu_s, L.gu_b, 2 * d.I, d.H), xn_, n, &r1,
                                Epilogue::kSwiglu, nullptr, act_, d.I, c.swiglu_limit));
        GPTOSS_TRY(mark("moe gate_up + swiglu"));
        if (emptied(decode, DecodeOp::kDown)) {
            GPTOSS_TRY(decode_probe_empty(s));
        } else {
            GPTOSS_TRY(project(decode, b.experts(L.dn_w, L.dn_s, L.dn_b, d.H, d.I), act_, n * d.K, &r2,
                               Epilogue::kStore, part_, nullptr, d.H, 0, /*route_ready=*/true));
            GPTOSS_TRY(mark("moe down"));
        }
    }
    ResidualArgs moe;
    moe.mode = ResidualMode::kMoeAdd;
    moe.part = part_;
    moe.weights = weights_;
    moe.K = d.K;
    // Split model: each rank's expert outputs are partial sums over its expert columns, so
    // the combined residual is all-reduced, rank 0 adding x. Decode in lsa mode folds that
    // all-reduce into the combine kernel (ResidualArgs::ll, rank_ll_reduce: one kernel
    // instead of four); otherwise x is zeroed on the other ranks, combined, all-reduced and
    // then normed.
    const bool fused = comm_ && decode && n == 1 && rank_ll_reduce(comm_, d.H, &moe.ll);
    if (comm_ && !fused && b.rank_.rank != 0)  // the residual is rank 0's to add
        GPTOSS_CUDA_TRY(cudaMemsetAsync(x_, 0, size_t(n) * d.H * sizeof(float), s));
    if (emptied(decode, DecodeOp::kCombine)) GPTOSS_TRY(decode_probe_empty(s));
    else GPTOSS_TRY(residual_rmsnorm(moe, x_, next_norm, c.rms_norm_eps, xn_, n, d.H, s));
    GPTOSS_TRY(mark(fused ? "moe combine + all-reduce + rmsnorm" : "moe combine + rmsnorm"));
    if (comm_ && !fused) {
        GPTOSS_TRY(rank_all_reduce(comm_, x_, size_t(n) * d.H, s));
        ResidualArgs none;
        GPTOSS_TRY(residual_rmsnorm(none, x_, next_norm, c.rms_norm_eps, xn_, n, d.H, s));
        GPTOSS_TRY(mark("all-reduce (moe) + rmsnorm"));
    }
    return GPTOSS_OK;
}

gptoss_status CudaSession::host_moe(uint32_t l, uint32_t n, bool decode, const GemmRoute& r1, const GemmRoute& r2) {
    CudaBackend& b = be_;
    const Dims& d = b.dims_;
    const LayerDev& L = b.layers_[l];
    if (n <= host_moe_.max_tokens()) {
        GPTOSS_TRY(host_moe_.enqueue(l, n, step_, xn_, experts_, part_, stream_));
        return mark("moe experts on the CPU (host layers)");
    }
    // forward() holds the slot's mutex until the stream has finished with it.
    const LayerDev& S = b.slot_;
    GPTOSS_TRY(host_moe_.stream_layer(l, b.stream_raw_, S.gu_w, S.gu_s, S.dn_w, S.dn_s, b.bad_scale_, stream_));
    GPTOSS_TRY(mark("moe experts streamed to the GPU (host layers)"));
    GPTOSS_TRY(project(decode, b.experts(S.gu_w, S.gu_s, L.gu_b, 2 * d.I, d.H), xn_, n, &r1, Epilogue::kSwiglu,
                       nullptr, act_, d.I, b.config_.swiglu_limit));
    GPTOSS_TRY(mark("moe gate_up + swiglu"));
    GPTOSS_TRY(project(decode, b.experts(S.dn_w, S.dn_s, L.dn_b, d.H, d.I), act_, n * d.K, &r2, Epilogue::kStore,
                       part_, nullptr, d.H, 0, /*route_ready=*/true));
    return mark("moe down");
}

gptoss_status CudaSession::upload_step(const int32_t* tokens, uint32_t n, uint32_t pos) {
    const uint32_t V = be_.dims_.V;
    for (uint32_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || uint32_t(tokens[i]) >= V)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "CUDA forward: token %d at index %u is outside [0, %u)", tokens[i],
                        i, V);
    // Pageable sources: cudaMemcpyAsync stages them before returning, so the host copies can
    // be reused at once even while earlier work is still queued.
    tokens_host_.assign(tokens, tokens + n);
    next_pos_ = pos + n;
    step_host_.pos0 = int32_t(pos);
    step_host_.n_tokens = int32_t(n);
    GPTOSS_CUDA_TRY(cudaMemcpyAsync(tokens_, tokens_host_.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    GPTOSS_CUDA_TRY(cudaMemcpyAsync(step_, &step_host_, sizeof(StepInfo), cudaMemcpyHostToDevice, stream_));
    return GPTOSS_OK;
}

gptoss_status CudaSession::check_step(uint32_t n, uint32_t pos) const {
    if (be_.poisoned_) return fail(GPTOSS_ERR_DEVICE, "CUDA backend: an earlier CUDA error made this model unusable");
    if (n == 0 || n > max_batch_)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "CUDA forward: %u tokens, expected 1..%u", n, max_batch_);
    if (uint64_t(pos) + n > max_context_)
        return fail(GPTOSS_ERR_CONTEXT_FULL, "CUDA forward: positions %u..%u exceed max_context %u", pos,
                    pos + n - 1, max_context_);
    return GPTOSS_OK;
}

gptoss_status CudaSession::forward(const int32_t* tokens, uint32_t n, uint32_t pos) {
    GPTOSS_TRY(check_step(n, pos));
    DeviceGuard guard(device_);
    have_logits_ = false;
    GPTOSS_TRY(checked(upload_step(tokens, n, pos)));
    if (be_.n_host_ > 0 && n > host_moe_.max_tokens()) {
        // Streams host layers through the backend's one slot: no other session may use it
        // until this chunk's kernels are done with it.
        std::lock_guard<std::mutex> lock(be_.host_.slot_mutex());
        const gptoss_status st = enqueue(n, false, max_splits_);
        host_moe_.finish_streaming();  // its copies into the slot's raw buffer, done or not queued
        GPTOSS_TRY(checked(st));
        GPTOSS_TRY(sync());
    } else {
        GPTOSS_TRY(checked(enqueue(n, false, max_splits_)));
    }
    have_logits_ = true;
    return GPTOSS_OK;
}

// One token through the decode kernels, as a CUDA graph captured on first use.
gptoss_status CudaSession::decode(int32_t token, uint32_t pos) {
    GPTOSS_TRY(check_step(1, pos));
    DeviceGuard guard(device_);
    have_logits_ = false;
    GPTOSS_TRY(checked(upload_step(&token, 1, pos)));
    return launch_decode(pos);
}

gptoss_status CudaSession::launch_decode(uint32_t pos) {
    const uint32_t needed = decode_splits_needed(pos);  // splits of keys 0..pos
    if (graph_ && needed > graph_splits_) {
        cudaGraphExecDestroy(graph_);
        graph_ = nullptr;
    }
    if (!graph_) {
        graph_splits_ = 16;
        while (graph_splits_ < needed) graph_splits_ *= 2;
        graph_splits_ = std::min(graph_splits_, max_splits_);
        GPTOSS_TRY(checked(cuda_status(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                                       "cudaStreamBeginCapture", __FILE__, __LINE__)));
        const gptoss_status st = enqueue(1, true, graph_splits_);
        cudaGraph_t graph = nullptr;
        const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
        if (st != GPTOSS_OK) {
            if (graph) cudaGraphDestroy(graph);
            return checked(st);
        }
        GPTOSS_TRY(checked(cuda_status(end, "cudaStreamEndCapture", __FILE__, __LINE__)));
        const cudaError_t inst = cudaGraphInstantiate(&graph_, graph, 0);
        cudaGraphDestroy(graph);
        GPTOSS_TRY(checked(cuda_status(inst, "cudaGraphInstantiate", __FILE__, __LINE__)));
    }
    host_moe_.arm(be_.n_host_);  // the poll thread's requests (host_moe.h; no-op unless polling)
    GPTOSS_TRY(checked(cuda_status(cudaGraphLaunch(graph_, stream_), "cudaGraphLaunch", __FILE__, __LINE__)));
    have_logits_ = true;
    return GPTOSS_OK;
}

gptoss_status CudaSession::batch_slot(int32_t token, uint32_t pos, BatchSlot* out) {
    GPTOSS_TRY(check_step(1, pos));
    if (token < 0 || uint32_t(token) >= be_.dims_.V)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "CUDA decode: token %d is outside [0, %u)", token, be_.dims_.V);
    have_logits_ = false;
    out->layers = batch_layers_.data();
    out->pos = pos;
    out->token = token;
    out->logits = logits_;
    out->stream = stream_;
    return GPTOSS_OK;
}

const BatchModel& CudaBackend::batch_model() {
    BatchModel& m = batch_model_;
    if (!m.layers.empty()) return m;
    const Dims& d = dims_;
    m.H = d.H; m.I = d.I; m.E = d.E; m.K = d.K; m.Q = d.Q; m.G = d.G; m.D = d.D; m.V = d.V;
    m.sliding_window = config_.sliding_window;
    m.rms_norm_eps = config_.rms_norm_eps; m.swiglu_limit = config_.swiglu_limit; m.rope_scale = rope_scale_;
    m.embed = embed_; m.final_norm = final_norm_; m.inv_freq = inv_freq_;
    m.lm_head = dense(lm_head_, nullptr, d.V, d.H);
    for (const LayerDev& L : layers_) {
        BatchLayer b;
        b.sliding = L.sliding; b.attn_norm = L.attn_norm; b.mlp_norm = L.mlp_norm; b.sinks = L.sinks;
        b.qkv = dense(L.qkv_w, L.qkv_b, d.QKV, d.H);
        b.o = dense(L.o_w, L.o_b, d.H, d.QD);
        b.router = dense(L.router_w, L.router_b, d.E, d.H);
        b.gate_up = experts(L.gu_w, L.gu_s, L.gu_b, 2 * d.I, d.H);
        b.down = experts(L.dn_w, L.dn_s, L.dn_b, d.H, d.I);
        m.layers.push_back(b);
    }
    return m;
}

void CudaBackend::decode_batch(DecodeItem* const* items, uint32_t n, bool rows_stable) {
    if (!batch_decode_enabled() || n_host_ > 0 || rank_.n_ranks > 1 || lm_rows() != dims_.V)
        return Backend::decode_batch(items, n, rows_stable);
    DeviceGuard guard(device_);
    std::vector<DecodeItem*> batched;
    std::vector<BatchSlot> slots;
    for (uint32_t i = 0; i < n; ++i) {
        DecodeItem& item = *items[i];
        if (item.prefill) {  // a prompt chunk: the session's own forward()
            cudaStream_t ps = static_cast<CudaSession*>(item.session)->batch_stream();
            batch_.trace_prefill(ps, 0, true);
            Backend::decode_batch(&items[i], 1, false);
            batch_.trace_prefill(ps, item.n, false);
            continue;
        }
        BatchSlot slot;
        item.status = static_cast<CudaSession*>(item.session)->batch_slot(item.tokens[0], item.pos, &slot);
        if (item.status != GPTOSS_OK) {
            item.error = gptoss_last_error();
            continue;
        }
        batched.push_back(&item);
        slots.push_back(slot);
    }
    if (batched.empty()) return;
    // Sampling in the step (steps of at least batch_sample_min_items() tokens) where the batched
    // sampler gives exactly this session's sample(); anything else (no config, the sort
    // fallback, bad u, a small step) stays kSkip: the session samples itself, same token.
    const uint32_t min_items = batch_sample_min_items();
    const bool in_step = min_items > 0 && batched.size() >= min_items;
    bool fast = false;
    if (in_step && sample_fast_path(dims_.V, &fast) != GPTOSS_OK) fast = false;
    for (size_t i = 0; i < batched.size(); ++i)
        if (in_step && batched[i]->sampling != nullptr)
            slots[i].sample = make_sample_row(*batched[i]->sampling, batched[i]->u, dims_.V, fast);
    std::vector<int32_t> sampled(batched.size(), -1);
    gptoss_status st = poisoned_ ? fail(GPTOSS_ERR_DEVICE, "CUDA backend: an earlier CUDA error made this model unusable")
                                 : batch_.step(batch_model(), slots.data(), uint32_t(slots.size()), sampled.data(), rows_stable);
    if (st == GPTOSS_ERR_DEVICE) poisoned_ = true;
    const std::string error = st == GPTOSS_OK ? std::string() : std::string(gptoss_last_error());
    for (size_t i = 0; i < batched.size(); ++i) {
        DecodeItem* item = batched[i];
        item->status = st;
        item->error = error;
        if (st == GPTOSS_OK) item->sampled = sampled[i];
        // A row sampled in the step has no logits in its session (BatchDecoder::step).
        static_cast<CudaSession*>(item->session)->batch_done(st == GPTOSS_OK && sampled[i] < 0);
    }
}

void CudaBackend::drop_speculation(BackendSession* session) {
    DeviceGuard guard(device_);
    if (batch_.drop_speculation(static_cast<CudaSession*>(session)->batch_stream()) != GPTOSS_OK) poisoned_ = true;
}

gptoss_status CudaSession::sync() {
    DeviceGuard guard(device_);
    // (cudaStreamSynchronize unless the host experts asked for a blocking wait; host_moe.h)
    GPTOSS_TRY(checked(cuda_status(host_moe_.synchronize(stream_), "forward pass", __FILE__, __LINE__)));
    return host_moe_failed();
}

gptoss_status CudaSession::host_moe_failed() {
    if (!host_moe_.take_failure()) return GPTOSS_OK;
    have_logits_ = false;
    return fail(GPTOSS_ERR_OUT_OF_MEMORY, "CUDA session: the CPU could not compute a host layer's experts (host "
                                          "memory for its scratch ran out); this step's results are lost");
}

gptoss_status CudaSession::get_logits(const float** logits_out) {
    if (be_.poisoned_) return fail(GPTOSS_ERR_DEVICE, "CUDA backend: an earlier CUDA error made this model unusable");
    if (!have_logits_) return fail(GPTOSS_ERR_INTERNAL, "CUDA get_logits: no forward() has run");
    DeviceGuard guard(device_);
    GPTOSS_TRY(checked(cuda_status(cudaMemcpyAsync(logits_host_.data(), logits_, logits_host_.size() * 4,
                                                   cudaMemcpyDeviceToHost, stream_),
                                   "copying logits", __FILE__, __LINE__)));
    GPTOSS_TRY(sync());
    *logits_out = logits_host_.data();
    return GPTOSS_OK;
}

// On the device for every config the engine can pass (cuda::sample implements sample_logits'
// definition); a non-finite temperature or u outside [0, 1) (never from the engine, whose
// read_params rejects them) takes the host path so that the behaviour stays sample_logits'.
gptoss_status CudaSession::sample(const SamplingConfig& config, double u, int32_t* token_out) {
    if (!std::isfinite(config.temperature) || !(u >= 0.0 && u < 1.0)) return BackendSession::sample(config, u, token_out);
    if (be_.poisoned_) return fail(GPTOSS_ERR_DEVICE, "CUDA backend: an earlier CUDA error made this model unusable");
    if (!have_logits_) return fail(GPTOSS_ERR_INTERNAL, "CUDA sample: no forward() has run");
    DeviceGuard guard(device_);
    if (config.temperature <= 0.0f) {
        GPTOSS_TRY(checked(argmax(logits_, be_.dims_.V, argmax_, stream_)));
        unsigned long long key = 0;
        GPTOSS_TRY(checked(cuda_status(cudaMemcpyAsync(&key, argmax_, sizeof(key), cudaMemcpyDeviceToHost, stream_),
                                       "copying the sampled token", __FILE__, __LINE__)));
        GPTOSS_TRY(sync());
        *token_out = decode_argmax(key);
        return GPTOSS_OK;
    }
    GPTOSS_TRY(checked(cuda::sample(logits_, be_.dims_.V, config, u, sample_scratch_, sample_bytes_, token_, stream_)));
    int32_t token = 0;
    GPTOSS_TRY(checked(cuda_status(cudaMemcpyAsync(&token, token_, sizeof(token), cudaMemcpyDeviceToHost, stream_),
                                   "copying the sampled token", __FILE__, __LINE__)));
    GPTOSS_TRY(sync());
    *token_out = token;
    return GPTOSS_OK;
}

// Constrained decoding: the mask goes up (25 KB), the logits are masked in place on the device
// (cuda/mask.cu), then the usual sampler runs.
gptoss_status CudaSession::sample_masked(const SamplingConfig& config, double u, const uint32_t* allowed,
                                         int32_t* token_out) {
    if (!std::isfinite(config.temperature) || !(u >= 0.0 && u < 1.0))
        return BackendSession::sample_masked(config, u, allowed, token_out);
    if (be_.poisoned_) return fail(GPTOSS_ERR_DEVICE, "CUDA backend: an earlier CUDA error made this model unusable");
    if (!have_logits_) return fail(GPTOSS_ERR_INTERNAL, "CUDA sample: no forward() has run");
    DeviceGuard guard(device_);
    GPTOSS_TRY(mask_logits(allowed));
    return sample(config, u, token_out);
}

gptoss_status CudaSession::mask_logits(const uint32_t* allowed) {
    const size_t bytes = size_t(be_.dims_.V + 31) / 32 * sizeof(uint32_t);
    if (mask_ == nullptr) {
        GPTOSS_TRY(checked(cuda_status(cudaMalloc(&mask_, bytes), "allocating the token mask", __FILE__, __LINE__)));
        GPTOSS_TRY(checked(cuda_status(cudaMallocHost(&mask_host_, bytes), "allocating the token mask", __FILE__, __LINE__)));
    }
    // The previous upload read the staging copy before it is overwritten (a pipelined call may
    // have left one queued behind its last step; in the loop it is long done).
    if (mask_event_ == nullptr)
        GPTOSS_TRY(checked(cuda_status(cudaEventCreateWithFlags(&mask_event_, cudaEventDisableTiming),
                                       "creating the token mask's event", __FILE__, __LINE__)));
    else
        GPTOSS_TRY(checked(cuda_status(cudaEventSynchronize(mask_event_), "the previous token mask upload", __FILE__,
                                       __LINE__)));
    std::memcpy(mask_host_, allowed, bytes);
    GPTOSS_TRY(checked(cuda_status(cudaMemcpyAsync(mask_, mask_host_, bytes, cudaMemcpyHostToDevice, stream_),
                                   "uploading the token mask", __FILE__, __LINE__)));
    GPTOSS_TRY(checked(cuda_status(cudaEventRecord(mask_event_, stream_), "recording the token mask upload", __FILE__,
                                   __LINE__)));
    return checked(apply_token_mask(logits_, mask_, be_.dims_.V, stream_));
}

bool CudaSession::pipelines_decode() const { return be_.n_host_ == 0 && be_.rank_.n_ranks == 1; }

// The pipelined loop (gptoss-decode-pipeline.cpp): the same sampler kernels as sample(), then
// feed_ hands the token to the next step on the device instead of a copy and a wait.
gptoss_status CudaSession::sample_ahead(const SamplingConfig& config, double u, const uint32_t* allowed) {
    ahead_on_device_ = false;
    if (!pipelines_decode() || !std::isfinite(config.temperature) || !(u >= 0.0 && u < 1.0))
        return BackendSession::sample_ahead(config, u, allowed);
    if (be_.poisoned_) return fail(GPTOSS_ERR_DEVICE, "CUDA backend: an earlier CUDA error made this model unusable");
    if (!have_logits_) return fail(GPTOSS_ERR_INTERNAL, "CUDA sample: no forward() has run");
    DeviceGuard guard(device_);
    if (allowed != nullptr) GPTOSS_TRY(mask_logits(allowed));
    const bool greedy = config.temperature <= 0.0f;
    if (greedy) GPTOSS_TRY(checked(argmax(logits_, be_.dims_.V, argmax_, stream_)));
    else GPTOSS_TRY(checked(cuda::sample(logits_, be_.dims_.V, config, u, sample_scratch_, sample_bytes_, token_, stream_)));
    GPTOSS_TRY(checked(feed_.feed(greedy ? argmax_ : token_, greedy, tokens_, step_, int32_t(next_pos_), stream_)));
    ahead_on_device_ = true;
    ahead_pos_ = next_pos_;
    return GPTOSS_OK;
}

gptoss_status CudaSession::decode_sampled(uint32_t pos) {
    if (!ahead_on_device_) return BackendSession::decode_sampled(pos);
    GPTOSS_TRY(check_step(1, pos));
    DeviceGuard guard(device_);
    have_logits_ = false;
    if (pos != ahead_pos_) {  // not where the last step ended: the StepInfo from the host
        step_host_.pos0 = int32_t(pos);
        step_host_.n_tokens = 1;
        GPTOSS_TRY(checked(cuda_status(cudaMemcpyAsync(step_, &step_host_, sizeof(StepInfo), cudaMemcpyHostToDevice, stream_),
                                       "uploading the decode step", __FILE__, __LINE__)));
    }
    next_pos_ = pos + 1;
    return launch_decode(pos);
}

gptoss_status CudaSession::fetch_sampled(int32_t* token_out) {
    if (!ahead_on_device_) return BackendSession::fetch_sampled(token_out);
    DeviceGuard guard(device_);
    int32_t token = -1;
    GPTOSS_TRY(checked(feed_.fetch(&token)));
    if (token < 0 || uint32_t(token) >= be_.dims_.V)
        return fail(GPTOSS_ERR_INTERNAL, "CUDA sample: the sampled token %d is outside [0, %u)", token, be_.dims_.V);
    *token_out = token;
    return GPTOSS_OK;
}

gptoss_status CudaSession::save_sliding_snapshot() { return copy_sliding(/*restore=*/false); }

gptoss_status CudaSession::restore_sliding_snapshot() { return copy_sliding(/*restore=*/true); }

// Copies every sliding layer's ring to its snapshot buffers, or back (API.md §6).
gptoss_status CudaSession::copy_sliding(bool restore) {
    if (be_.poisoned_) return fail(GPTOSS_ERR_DEVICE, "CUDA backend: an earlier CUDA error made this model unusable");
    DeviceGuard guard(device_);
    const size_t row = size_t(be_.dims_.G) * be_.dims_.D * 2;
    const char* what = restore ? "snapshot restore" : "snapshot";
    for (const LayerKv& kv : kv_) {
        if (!kv.snap_k) continue;
        uint16_t* const live[2] = {kv.k, kv.v};
        uint16_t* const saved[2] = {kv.snap_k, kv.snap_v};
        for (int i = 0; i < 2; i++)
            GPTOSS_TRY(checked(cuda_status(cudaMemcpyAsync(restore ? live[i] : saved[i], restore ? saved[i] : live[i],
                                                           kv.slots * row, cudaMemcpyDeviceToDevice, stream_),
                                           what, __FILE__, __LINE__)));
    }
    return GPTOSS_OK;
}

gptoss_status CudaSession::profile(const int32_t* tokens, uint32_t n, uint32_t pos, bool decode,
                                   std::vector<std::pair<std::string, double>>* out) {
    if (n == 0 || n > max_batch_ || uint64_t(pos) + n > max_context_ || (decode && n != 1))
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "CUDA profile: %u tokens at %u do not fit", n, pos);
    DeviceGuard guard(device_);
    std::unique_lock<std::mutex> slot_lock;  // host layers may stream through the backend's slot
    if (be_.n_host_ > 0) slot_lock = std::unique_lock<std::mutex>(be_.host_.slot_mutex());
    GPTOSS_TRY(checked(upload_step(tokens, n, pos)));
    profiling_ = true;
    const gptoss_status st = enqueue(n, decode, max_splits_);
    profiling_ = false;
    if (be_.n_host_ > 0) host_moe_.finish_streaming();
    GPTOSS_TRY(checked(st));
    GPTOSS_TRY(sync());
    have_logits_ = true;
    std::vector<std::string> order;
    std::map<std::string, double> total;
    for (size_t i = 1; i < events_.size(); ++i) {
        float ms = 0;
        GPTOSS_CUDA_TRY(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
        const std::string key = labels_[i];
        if (!total.count(key)) order.push_back(key);
        total[key] += ms;
    }
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    events_.clear();
    labels_.clear();
    for (const std::string& k : order) out->emplace_back(k, total[k]);
    return GPTOSS_OK;
}

}  // namespace

// ---------------------------------------------------------------------------
// Entry points

gptoss_status create_synthetic_backend(const Config& config, int32_t device, uint64_t seed,
                                       std::unique_ptr<Backend>* out) {
    return create_synthetic_rank_backend(config, device, seed, RankInfo(), out);
}

gptoss_status create_synthetic_backend(const Config& config, int32_t device, uint64_t seed,
                                       const OffloadRequest& request, std::unique_ptr<Backend>* out) {
    GPTOSS_TRY(check_config(config));
    const int n = cuda_device_count();
    if (device < 0 || device >= n)
        return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA backend: device %d requested, %d CUDA devices present", device, n);
    DeviceGuard guard(device);
    auto b = std::make_unique<CudaBackend>(config, device);
    GPTOSS_TRY(b->plan_host_layers(request));
    GPTOSS_TRY(b->synthesize(seed));
    *out = std::move(b);
    return GPTOSS_OK;
}

bool decode_replays(const BackendSession* session, uint32_t pos) {
    auto* s = dynamic_cast<const CudaSession*>(session);
    return s && s->decode_replays(pos);
}

gptoss_status set_session_comm(BackendSession* session, void* comm) {
    auto* s = dynamic_cast<CudaSession*>(session);
    if (!s) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "set_session_comm: not a CUDA session");
    s->comm_ = comm;
    return GPTOSS_OK;
}

size_t session_collective_bytes(BackendSession* session) {
    auto* s = dynamic_cast<CudaSession*>(session);
    return s ? s->carve_collectives(nullptr) : 0;
}

gptoss_status place_session_collectives(BackendSession* session, char* base) {
    auto* s = dynamic_cast<CudaSession*>(session);
    if (!s || !base) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "place_session_collectives: not a CUDA session");
    return s->place_collectives(base);
}

gptoss_status create_synthetic_rank_backend(const Config& config, int32_t device, uint64_t seed, const RankInfo& rank,
                                            std::unique_ptr<Backend>* out) {
    GPTOSS_TRY(check_config(config));
    const int n = cuda_device_count();
    if (device < 0 || device >= n)
        return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA backend: device %d requested, %d CUDA devices present", device, n);
    DeviceGuard guard(device);
    auto b = std::make_unique<CudaBackend>(config, device, rank);
    GPTOSS_TRY(b->synthesize(seed));
    *out = std::move(b);
    return GPTOSS_OK;
}

gptoss_status profile_forward(BackendSession* session, const int32_t* tokens, uint32_t n, uint32_t pos, bool decode,
                              std::vector<std::pair<std::string, double>>* ms_by_op) {
    auto* s = dynamic_cast<CudaSession*>(session);
    if (!s) return sharded_profile(session, tokens, n, pos, decode, ms_by_op);  // a split model: rank 0's ops
    return s->profile(tokens, n, pos, decode, ms_by_op);
}

gptoss_status synchronize(BackendSession* session) {
    auto* s = dynamic_cast<CudaSession*>(session);
    if (!s) return sharded_synchronize(session);
    return s->sync();
}

}  // namespace cuda

gptoss_status create_cuda_backend(const Checkpoint& checkpoint, int32_t device, const ProgressFn& progress,
                                  std::unique_ptr<Backend>* out) {
    return cuda::create_rank_backend(checkpoint, device, cuda::RankInfo(), progress, out);
}

gptoss_status create_cuda_backend(const Checkpoint& checkpoint, int32_t device, const OffloadRequest& request,
                                  const ProgressFn& progress, std::unique_ptr<Backend>* out) {
    return cuda::create_rank_backend(checkpoint, device, cuda::RankInfo(), progress, out, &request);
}

gptoss_status cuda::create_rank_backend(const Checkpoint& checkpoint, int32_t device, const RankInfo& rank,
                                        const ProgressFn& progress, std::unique_ptr<Backend>* out,
                                        const OffloadRequest* request) {
    GPTOSS_TRY(cuda::check_config(checkpoint.config));
    const int n = cuda_device_count();
    if (n == 0) return fail(GPTOSS_ERR_UNSUPPORTED, "CUDA backend: no CUDA device is present");
    if (device < 0 || device >= n)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "CUDA backend: device %d requested, devices 0..%d present", device,
                    n - 1);
    cuda::DeviceGuard guard(device);
    auto b = std::make_unique<cuda::CudaBackend>(checkpoint.config, device, rank);
    if (request != nullptr) GPTOSS_TRY(b->plan_host_layers(*request));
    const auto t0 = std::chrono::steady_clock::now();
    GPTOSS_TRY(b->load(checkpoint, progress));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log(GPTOSS_LOG_INFO, "CUDA backend: loaded %.2f GB of weights on device %d%s in %.2f s (%.2f GB/s)",
        double(b->weight_bytes()) / 1e9, device,
        b->n_cpu_moe() ? (" and " + gigabytes(b->host_weight_bytes()) + " of experts in host memory").c_str() : "", s,
        double(checkpoint.total_bytes) / 1e9 / s);
    *out = std::move(b);
    return GPTOSS_OK;
}

}  // namespace gptoss
