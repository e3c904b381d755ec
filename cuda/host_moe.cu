// cuda/host_moe.cu - host-resident MoE experts of the CUDA backend (cuda/host_moe.h): the host
// store and its loading, the streaming of one layer to the GPU, and the per-session decode path
// (cpu::host_moe_experts on the pool, and at one token the GPU's share of the experts).
#include "cuda/host_moe.h"

#include "cpu/host_experts.h"
#include "cuda/common.cuh"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace gptoss {
namespace cuda {

uint32_t host_moe_stream_min(const Config& config) {
    // A chunk of T tokens costs the CPU about one read of every expert its T·K pairs touch, once
    // per 4 tokens an expert holds (the int8 kernel's width), plus their arithmetic; streaming
    // costs one copy of the layer over PCIe whatever T. Measured on the H200 machine
    // (bench/NOTES.md "v18 host experts", tools/device-hostmoe-crossover.sh): equal at T = 32 for
    // 20b (32 experts) and at T = 128 for 120b (128), i.e. when the chunk's pairs average K per
    // expert. So the default is n_experts; GPTOSS_HOST_MOE_STREAM_MIN overrides (1..4096).
    static const long env = [] {
        const char* v = std::getenv("GPTOSS_HOST_MOE_STREAM_MIN");
        if (v == nullptr) return 0L;
        char* end = nullptr;
        const long n = std::strtol(v, &end, 10);
        if (end != v && *end == '\0' && n >= 1 && n <= 4096) return n;
        log(GPTOSS_LOG_WARN, "GPTOSS_HOST_MOE_STREAM_MIN=%s is not a number in 1..4096; using n_experts", v);
        return 0L;
    }();
    return env > 0 ? uint32_t(env) : std::clamp<uint32_t>(config.n_experts, 1, 4096);
}

// ---------------------------------------------------------------------------
// HostExperts

HostExperts::Layout HostExperts::layout_of(const Config& c) {
    const size_t E = c.n_experts, H = c.hidden, I = c.intermediate;
    Layout l{};
    size_t at = 0;
    auto take = [&](size_t bytes) {
        const size_t off = at;
        at += (bytes + 255) & ~size_t(255);
        return off;
    };
    l.gu_blocks = take(E * 2 * I * H / 2);
    l.gu_scales = take(E * 2 * I * H / 32);
    l.dn_blocks = take(E * H * I / 2);
    l.dn_scales = take(E * H * I / 32);
    l.mxfp4_bytes = at;  // the four MXFP4 tensors, contiguous: one H2D copy streams a layer
    l.gu_bias = take(E * 2 * I * 2);
    l.dn_bias = take(E * H * 2);
    l.layer_bytes = at;
    return l;
}

uint64_t HostExperts::streaming_raw_bytes(const Config& config) { return layout_of(config).mxfp4_bytes; }

uint64_t HostExperts::streaming_bytes(const Config& c) {
    const uint64_t E = c.n_experts;
    const uint64_t slot = E * (mxfp4_fragment_bytes(2 * c.intermediate, c.hidden) +
                               mxfp4_scale_bytes(2 * c.intermediate, c.hidden) +
                               mxfp4_fragment_bytes(c.hidden, c.intermediate) +
                               mxfp4_scale_bytes(c.hidden, c.intermediate));
    return streaming_raw_bytes(c) + slot + 4 * 256;  // + the Carver's alignment of four pieces
}

HostExperts::~HostExperts() {
    if (store_ == nullptr) return;
    if (registered_) cudaHostUnregister(store_);
    if (pinned_ && !registered_) cudaFreeHost(store_);
    else std::free(store_);  // aligned_alloc or cpu::host_weights_alloc
}

// The store on huge pages (cpu::host_weights_alloc: the CPU streams ~50 MB of it per decode
// step), then pinned in place with cudaHostRegister. False (nothing held) if the allocation fails.
bool HostExperts::alloc_huge() {
    void* p = cpu::host_weights_alloc(bytes_, true);
    if (p == nullptr) return false;
    store_ = static_cast<uint8_t*>(p);
    if (cudaHostRegister(p, bytes_, cudaHostRegisterPortable | cudaHostRegisterMapped) == cudaSuccess) {
        pinned_ = registered_ = true;
        map_store();
    } else {
        cudaGetLastError();  // clear the registration error
        log(GPTOSS_LOG_WARN,
            "host experts: %llu bytes could not be pinned (cudaHostRegister); long prefill chunks stream them through "
            "pageable copies, more slowly",
            static_cast<unsigned long long>(bytes_));
    }
    return true;
}

gptoss_status HostExperts::init(const Config& config, uint32_t n_host) {
    config_ = config;
    n_host_ = n_host;
    lay_ = layout_of(config);
    if (n_host == 0) return GPTOSS_OK;
    bytes_ = uint64_t(n_host) * lay_.layer_bytes;
    if (cpu::host_weights_huge_default()) {  // GPTOSS_HOST_HUGEPAGE=0: the cudaHostAlloc store below
        if (!alloc_huge())
            return fail(GPTOSS_ERR_OUT_OF_MEMORY,
                        "host experts: %llu bytes of host memory for the experts of %u layers could not be allocated",
                        static_cast<unsigned long long>(bytes_), n_host);
        pool_.reset(new cpu::PoolHold());
        return GPTOSS_OK;
    }
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes_, cudaHostAllocPortable | cudaHostAllocMapped) == cudaSuccess) {
        pinned_ = true;
    } else {
        cudaGetLastError();  // clear the allocation error
        p = std::aligned_alloc(4096, (bytes_ + 4095) & ~uint64_t(4095));
        if (p == nullptr)
            return fail(GPTOSS_ERR_OUT_OF_MEMORY,
                        "host experts: %llu bytes of host memory for the experts of %u layers could not be allocated",
                        static_cast<unsigned long long>(bytes_), n_host);
        log(GPTOSS_LOG_WARN,
            "host experts: %llu bytes could not be pinned (cudaHostAlloc); long prefill chunks stream them through "
            "pageable copies, more slowly",
            static_cast<unsigned long long>(bytes_));
    }
    store_ = static_cast<uint8_t*>(p);
    if (pinned_) map_store();
    pool_.reset(new cpu::PoolHold());
    return GPTOSS_OK;
}

// The pinned store's address in the current device's space (the GPU's share of decode steps reads
// it there); without one the GPU computes no experts of host layers.
void HostExperts::map_store() {
    void* dev = nullptr;
    if (cudaHostGetDevicePointer(&dev, store_, 0) == cudaSuccess) {
        store_dev_ = static_cast<uint8_t*>(dev);
    } else {
        cudaGetLastError();
        log(GPTOSS_LOG_INFO, "host experts: the pinned store is not mapped into the GPU's address space; the CPU "
                             "computes every expert of host layers");
    }
}

bool HostExperts::device_layer(uint32_t l, HostExpertsView* view) const {
    if (store_dev_ == nullptr || l >= n_host_) return false;
    const cpu::MoeWeights w = layer_at(store_dev_, l);
    *view = HostExpertsView{w.gate_up_blocks, w.gate_up_scales, w.gate_up_bias,
                            w.down_blocks,    w.down_scales,    w.down_bias};
    return true;
}

cpu::MoeWeights HostExperts::layer(uint32_t l) const { return layer_at(store_, l); }

// Layer l's six tensors at `store` (the host address, or the mapped device address).
cpu::MoeWeights HostExperts::layer_at(const uint8_t* store, uint32_t l) const {
    const uint8_t* base = store + size_t(l) * lay_.layer_bytes;
    cpu::MoeWeights w;
    w.gate_up_blocks = base + lay_.gu_blocks;
    w.gate_up_scales = base + lay_.gu_scales;
    w.gate_up_bias = reinterpret_cast<const uint16_t*>(base + lay_.gu_bias);
    w.down_blocks = base + lay_.dn_blocks;
    w.down_scales = base + lay_.dn_scales;
    w.down_bias = reinterpret_cast<const uint16_t*>(base + lay_.dn_bias);
    return w;
}

namespace {

constexpr size_t kPiece = 16u << 20;

// Copies n bytes on the worker pool in kPiece pieces (first touch of the mapping included).
void parallel_copy(uint8_t* dst, const uint8_t* src, size_t n) {
    struct Ctx { uint8_t* dst; const uint8_t* src; size_t n; };
    Ctx ctx{dst, src, n};
    cpu::parallel_for((n + kPiece - 1) / kPiece, [](void* c, size_t i) {
        const Ctx& x = *static_cast<const Ctx*>(c);
        const size_t off = i * kPiece;
        std::memcpy(x.dst + off, x.src + off, std::min(kPiece, x.n - off));
    }, &ctx);
}

// The largest scale byte of n.
uint8_t max_byte(const uint8_t* p, size_t n) {
    uint8_t m = 0;
    for (size_t i = 0; i < n; ++i) m = std::max(m, p[i]);
    return m;
}

}  // namespace

gptoss_status HostExperts::copy_layer(uint32_t l, const LayerWeights& w) {
    if (l >= n_host_) return fail(GPTOSS_ERR_INTERNAL, "host experts: layer %u is not a host layer", l);
    uint8_t* base = store_ + size_t(l) * lay_.layer_bytes;
    const Tensor* parts[6] = {&w.gate_up_blocks, &w.gate_up_scales, &w.down_blocks,
                              &w.down_scales,    &w.gate_up_bias,   &w.down_bias};
    const size_t offs[6] = {lay_.gu_blocks, lay_.gu_scales, lay_.dn_blocks, lay_.dn_scales, lay_.gu_bias, lay_.dn_bias};
    for (int i = 0; i < 6; ++i) parallel_copy(base + offs[i], parts[i]->u8(), parts[i]->n_bytes);
    for (const Tensor* t : {&w.gate_up_scales, &w.down_scales}) {
        const uint8_t m = max_byte(t->u8(), t->n_bytes);
        if (m > 128)
            return fail(GPTOSS_ERR_UNSUPPORTED,
                        "%s: an MXFP4 scale byte is %d (2^%d); the GPU dequantizer (which streams host layers for "
                        "long prompts) supports at most 128",
                        t->name.c_str(), m, m - 127);
    }
    return GPTOSS_OK;
}

void HostExperts::fill_random(uint64_t seed) {
    struct Ctx { const HostExperts* self; uint64_t seed; };
    Ctx ctx{this, seed};
    // One work item per (layer, 16 MiB piece of the layer); every byte a function of (seed, offset).
    const size_t pieces = (lay_.layer_bytes + kPiece - 1) / kPiece;
    cpu::parallel_for(size_t(n_host_) * pieces, [](void* c, size_t item) {
        const Ctx& x = *static_cast<const Ctx*>(c);
        const HostExperts& h = *x.self;
        const size_t pieces_per = (h.lay_.layer_bytes + kPiece - 1) / kPiece;
        const size_t l = item / pieces_per, begin = (item % pieces_per) * kPiece;
        const size_t end = std::min(h.lay_.layer_bytes, begin + kPiece);
        uint8_t* base = h.store_ + l * h.lay_.layer_bytes;
        for (size_t off = begin; off < end; off += 8) {
            uint64_t state = x.seed * 0x9E3779B97F4A7C15ull + l * 0x100000001B3ull + off;
            uint64_t r = splitmix64(&state);
            uint8_t bytes[8];
            const bool scales = (off >= h.lay_.gu_scales && off < h.lay_.dn_blocks) ||
                                (off >= h.lay_.dn_scales && off < h.lay_.mxfp4_bytes);
            const bool bias = off >= h.lay_.gu_bias;
            for (int i = 0; i < 8; ++i, r >>= 8) {
                if (scales) {
                    bytes[i] = uint8_t(118 + (r & 0xff) % 5);
                } else if (bias) {
                    // bf16 pairs: little-endian, even byte low; ~U(-0.01, 0.01) as the GPU synth's biases
                    if (i % 2 == 0) {
                        const float v = (float((r & 0xffff)) / 65535.0f * 2.0f - 1.0f) * 0.01f;
                        const uint16_t b = f32_to_bf16(v);
                        bytes[i] = uint8_t(b & 0xff);
                        bytes[i + 1] = uint8_t(b >> 8);
                    }
                } else {
                    bytes[i] = uint8_t(r);
                }
            }
            std::memcpy(base + off, bytes, std::min<size_t>(8, end - off));
        }
    }, &ctx);
}

gptoss_status HostExperts::stream_layer(uint32_t l, void* raw, void* gu_w, uint16_t* gu_s, void* dn_w, uint16_t* dn_s,
                                        int* bad_scale, cudaStream_t stream) const {
    GPTOSS_TRY(copy_raw(l, raw, stream));
    return repack(raw, gu_w, gu_s, dn_w, dn_s, bad_scale, stream);
}

gptoss_status HostExperts::copy_raw(uint32_t l, void* raw, cudaStream_t stream) const {
    const uint8_t* base = store_ + size_t(l) * lay_.layer_bytes;
    GPTOSS_CUDA_TRY(cudaMemcpyAsync(raw, base, lay_.mxfp4_bytes, cudaMemcpyHostToDevice, stream));
    return GPTOSS_OK;
}

gptoss_status HostExperts::repack(const void* raw, void* gu_w, uint16_t* gu_s, void* dn_w, uint16_t* dn_s,
                                  int* bad_scale, cudaStream_t stream) const {
    const Config& c = config_;
    const uint32_t E = c.n_experts, H = c.hidden, I = c.intermediate;
    const uint8_t* r = static_cast<const uint8_t*>(raw);
    const size_t gu_blk = size_t(2 * I) * H / 2, gu_sc = size_t(2 * I) * H / 32;
    const size_t dn_blk = size_t(H) * I / 2, dn_sc = size_t(H) * I / 32;
    for (uint32_t e = 0; e < E; ++e) {
        GPTOSS_TRY(repack_mxfp4(r + lay_.gu_blocks + e * gu_blk, r + lay_.gu_scales + e * gu_sc, 2 * I, H, true,
                                static_cast<char*>(gu_w) + e * mxfp4_fragment_bytes(2 * I, H),
                                gu_s + e * (mxfp4_scale_bytes(2 * I, H) / 2), bad_scale, stream));
        GPTOSS_TRY(repack_mxfp4(r + lay_.dn_blocks + e * dn_blk, r + lay_.dn_scales + e * dn_sc, H, I, false,
                                static_cast<char*>(dn_w) + e * mxfp4_fragment_bytes(H, I),
                                dn_s + e * (mxfp4_scale_bytes(H, I) / 2), bad_scale, stream));
    }
    return GPTOSS_OK;
}

// ---------------------------------------------------------------------------
// HostMoeSession

HostMoeSession::~HostMoeSession() {
    if (poller_.joinable()) {
        {
            std::lock_guard<std::mutex> lock(poll_mutex_);
            stop_ = true;
        }
        poll_cv_.notify_all();
        poller_.join();
    }
    if (copy_stream_ != nullptr) {
        cudaStreamSynchronize(copy_stream_);
        cudaStreamDestroy(copy_stream_);
    }
    for (cudaEvent_t e : {raw_ready_, raw_free_, blocking_})
        if (e != nullptr) cudaEventDestroy(e);
    if (seq_dev_ != nullptr) cudaFree(seq_dev_);
    if (gpu_h_ != nullptr) cudaFree(gpu_h_);
    for (void* p : {static_cast<void*>(step_host_), static_cast<void*>(xn_host_), static_cast<void*>(experts_host_),
                    static_cast<void*>(part_host_), static_cast<void*>(mailbox_)})
        if (p != nullptr) cudaFreeHost(p);
}

gptoss_status HostMoeSession::init(const HostExperts* experts, const Config& config) {
    experts_ = experts;
    H_ = config.hidden;
    I_ = config.intermediate;
    K_ = config.n_experts_per_token;
    swiglu_limit_ = config.swiglu_limit;
    max_tokens_ = host_moe_stream_min(config);
    GPTOSS_CUDA_TRY(cudaMallocHost(&step_host_, sizeof(StepInfo)));
    GPTOSS_CUDA_TRY(cudaMallocHost(&xn_host_, size_t(max_tokens_) * H_ * 2));
    xn_natural_.resize(size_t(max_tokens_) * H_);
    GPTOSS_CUDA_TRY(cudaMallocHost(&experts_host_, size_t(max_tokens_) * K_ * 4));
    GPTOSS_CUDA_TRY(cudaMallocHost(&part_host_, size_t(max_tokens_) * K_ * H_ * 4));
    cpu::host_moe_reserve(max_tokens_, K_, H_, I_);  // the callbacks then never allocate
    calls_.resize(experts->n_host());
    for (uint32_t l = 0; l < experts->n_host(); ++l) calls_[l] = Call{this, l};
    const char* overlap = std::getenv("GPTOSS_HOST_MOE_OVERLAP");
    if (!(overlap && std::strcmp(overlap, "0") == 0)) {
        GPTOSS_CUDA_TRY(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
        GPTOSS_CUDA_TRY(cudaEventCreateWithFlags(&raw_ready_, cudaEventDisableTiming));
        GPTOSS_CUDA_TRY(cudaEventCreateWithFlags(&raw_free_, cudaEventDisableTiming));
    }
    return init_trip();
}

// The round trip's parts that the options ask for (cuda/host_moe_trip.h).
gptoss_status HostMoeSession::init_trip() {
    const HostTripOptions& o = host_trip_options();
    if (o.timing) GPTOSS_CUDA_TRY(timer_.init(experts_->n_host()));
    if (o.blocking) GPTOSS_CUDA_TRY(cudaEventCreateWithFlags(&blocking_, cudaEventBlockingSync | cudaEventDisableTiming));
    staged_ = o.stage || o.poll;
    if (!o.poll) return GPTOSS_OK;
    GPTOSS_CUDA_TRY(cudaMallocHost(&mailbox_, sizeof(HostMailbox)));
    std::memset(static_cast<void*>(mailbox_), 0, sizeof(HostMailbox));
    GPTOSS_CUDA_TRY(cudaMalloc(&seq_dev_, sizeof(uint32_t)));
    GPTOSS_CUDA_TRY(cudaMemset(seq_dev_, 0, sizeof(uint32_t)));
    GPTOSS_TRY(init_gpu_share());
    poller_ = std::thread([this] { poll_loop(); });
    return GPTOSS_OK;
}

// The GPU's share of one-token steps (poll way only: the callback way blocks the stream while
// the CPU computes): host_gpu_slots_default of the K experts, or GPTOSS_HOST_MOE_GPU_SLOTS.
gptoss_status HostMoeSession::init_gpu_share() {
    HostExpertsView view{};
    if (H_ > kHostGpuMaxH || I_ > kHostGpuMaxH || !experts_->device_layer(0, &view)) return GPTOSS_OK;
    const int want = host_trip_options().gpu_slots;
    int device = 0;
    GPTOSS_CUDA_TRY(cudaGetDevice(&device));
    char link[48];
    const uint32_t fallback = host_gpu_slots_default(device, K_, link, sizeof link);
    const uint32_t slots = std::min<uint32_t>(want < 0 ? fallback : uint32_t(want), K_);
    static std::once_flag said;
    std::call_once(said, [&] {
        log(GPTOSS_LOG_INFO,
            "host experts: the GPU computes %u of each decode token's %u experts of host layers from host memory "
            "(%s%s), the CPU the rest",
            slots, K_, link, want < 0 ? "" : "; GPTOSS_HOST_MOE_GPU_SLOTS");
    });
    if (slots == 0) return GPTOSS_OK;
    GPTOSS_CUDA_TRY(cudaMalloc(&gpu_h_, size_t(slots) * I_ * sizeof(float)));
    gpu_slots_ = slots;
    return GPTOSS_OK;
}

gptoss_status HostMoeSession::queue_copy(uint32_t l, void* raw) {
    GPTOSS_CUDA_TRY(cudaStreamWaitEvent(copy_stream_, raw_free_, 0));  // (never recorded: no wait)
    GPTOSS_TRY(experts_->copy_raw(l, raw, copy_stream_));
    GPTOSS_CUDA_TRY(cudaEventRecord(raw_ready_, copy_stream_));
    return GPTOSS_OK;
}

gptoss_status HostMoeSession::stream_layer(uint32_t l, void* raw, void* gu_w, uint16_t* gu_s, void* dn_w,
                                           uint16_t* dn_s, int* bad_scale, cudaStream_t stream) {
    if (copy_stream_ == nullptr) return experts_->stream_layer(l, raw, gu_w, gu_s, dn_w, dn_s, bad_scale, stream);
    if (l == 0) GPTOSS_TRY(queue_copy(0, raw));  // the chunk's first host layer
    GPTOSS_CUDA_TRY(cudaStreamWaitEvent(stream, raw_ready_, 0));
    GPTOSS_TRY(experts_->repack(raw, gu_w, gu_s, dn_w, dn_s, bad_scale, stream));
    GPTOSS_CUDA_TRY(cudaEventRecord(raw_free_, stream));
    if (l + 1 < experts_->n_host()) GPTOSS_TRY(queue_copy(l + 1, raw));
    return GPTOSS_OK;
}

void HostMoeSession::finish_streaming() {
    if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
}

void HostMoeSession::compute(uint32_t layer) {
    const int64_t h0 = timer_.on() ? HostTripTimer::now_ns() : 0;
    const uint32_t n = uint32_t(step_host_->n_tokens);
    if (n == 0 || n > max_tokens_) return;  // enqueue() checked it; never read past the buffers
    // The GPU keeps GEMM inputs in the fragment-permuted order (permuted_k, cuda/common.cuh);
    // the CPU kernel reads rows in natural order (the staging kernel wrote them so).
    const uint16_t* x = xn_host_;
    if (!staged_) {
        uint16_t* natural = xn_natural_.data();
        for (uint32_t t = 0; t < n; ++t) {
            const uint16_t* src = xn_host_ + size_t(t) * H_;
            uint16_t* dst = natural + size_t(t) * H_;
            for (uint32_t k = 0; k < H_; ++k) dst[k] = src[permuted_k(k)];
        }
        x = natural;
    }
    const int64_t h1 = timer_.on() ? HostTripTimer::now_ns() : 0;
    try {  // nothing may unwind into the driver's thread; init() reserved the scratch, so unlikely
        // At n = 1 the GPU computes the last gpu_slots_ experts: the CPU's [1, K - g, H] are the
        // first rows of part_host_ and read the first K - g ids.
        const uint32_t k_cpu = cpu_slots(n);
        if (k_cpu > 0)
            cpu::host_moe_experts(x, n, H_, I_, experts_->layer(layer), experts_host_, k_cpu, swiglu_limit_,
                                  part_host_);
    } catch (...) {
        failed_.store(true);
    }
    if (timer_.on()) timer_.host(layer, n, h0, h1, HostTripTimer::now_ns());
}

void CUDART_CB HostMoeSession::run(void* p) {
    const Call& call = *static_cast<const Call*>(p);
    call.self->compute(call.layer);
}

void HostMoeSession::arm(uint32_t requests) {
    if (!polling() || requests == 0) return;
    armed_.fetch_add(int(requests));
    std::lock_guard<std::mutex> lock(poll_mutex_);
    poll_cv_.notify_one();
}

bool HostMoeSession::take_armed() {
    int a = armed_.load();
    while (a > 0 && !armed_.compare_exchange_weak(a, a - 1)) {
    }
    return a > 1;
}

// Sleeps until armed (or 50 ms: a request nobody announced is still served), then serves.
void HostMoeSession::poll_loop() {
    std::unique_lock<std::mutex> lock(poll_mutex_);
    for (;;) {
        poll_cv_.wait_for(lock, std::chrono::milliseconds(50),
                          [&] { return stop_ || armed_.load() > 0 || mailbox_->req != last_seq_; });
        if (stop_) return;
        lock.unlock();
        serve_armed();
        lock.lock();
    }
}

// Spins on the mailbox until the armed requests are served; after 2 ms without one it polls
// every 50 µs, and after 100 ms it gives up the count (an enqueue that failed after arming);
// a session being destroyed (stop_) ends the wait at once, whatever is still armed.
void HostMoeSession::serve_armed() {
    const bool spin = host_trip_options().worker_spin;
    if (spin) cpu::pool_spin_hint(true);
    int64_t idle_since = HostTripTimer::now_ns();
    for (uint32_t i = 0;; i++) {
        const uint32_t req = mailbox_->req;
        if (req != last_seq_) {
            std::atomic_thread_fence(std::memory_order_acquire);
            compute(mailbox_->layer);
            last_seq_ = req;
            std::atomic_thread_fence(std::memory_order_seq_cst);
            mailbox_->done = req;
            if (!take_armed()) break;
            idle_since = HostTripTimer::now_ns();
            continue;
        }
        cpu::cpu_relax();
        if ((i & 255) != 255) continue;
        const int64_t idle = HostTripTimer::now_ns() - idle_since;
        if (idle > 100000000 || armed_.load() == 0 || stop_.load(std::memory_order_relaxed)) {
            armed_.store(0);
            break;
        }
        if (idle > 2000000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (spin) cpu::pool_spin_hint(false);
}

cudaError_t HostMoeSession::synchronize(cudaStream_t stream) {
    if (blocking_ == nullptr) return cudaStreamSynchronize(stream);
    const cudaError_t err = cudaEventRecord(blocking_, stream);
    return err != cudaSuccess ? err : cudaEventSynchronize(blocking_);
}

gptoss_status HostMoeSession::enqueue(uint32_t l, uint32_t n, const StepInfo* step, const uint16_t* xn,
                                      const int32_t* experts, float* part, cudaStream_t stream) {
    if (l >= calls_.size() || n == 0 || n > max_tokens_)
        return fail(GPTOSS_ERR_INTERNAL, "host experts: layer %u, %u tokens (host layers %zu, at most %u tokens)", l, n,
                    calls_.size(), max_tokens_);
    if (timer_.on()) GPTOSS_CUDA_TRY(timer_.stamp(l, 0, stream));
    if (polling()) {
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        GPTOSS_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
        GPTOSS_CUDA_TRY(launch_host_stage(step, xn, experts, n, H_, K_, step_host_, xn_host_, experts_host_, mailbox_,
                                          seq_dev_, l, stream));
        if (capture == cudaStreamCaptureStatusNone) arm(1);  // a graph's launch arms its requests
        const uint32_t k_cpu = cpu_slots(n);
        if (k_cpu < K_) {  // the GPU's share, while the CPU computes the rest
            HostExpertsView view{};
            if (!experts_->device_layer(l, &view))
                return fail(GPTOSS_ERR_INTERNAL, "host experts: layer %u has no mapped view", l);
            GPTOSS_CUDA_TRY(launch_host_gpu_experts(view, xn, experts, k_cpu, K_ - k_cpu, H_, I_, swiglu_limit_, gpu_h_,
                                                    part, stream));
        }
        GPTOSS_CUDA_TRY(launch_host_wait(mailbox_, seq_dev_, part_host_, part, size_t(n) * k_cpu * H_, stream));
    } else {
        if (staged_) {
            GPTOSS_CUDA_TRY(launch_host_stage(step, xn, experts, n, H_, K_, step_host_, xn_host_, experts_host_, nullptr,
                                              nullptr, l, stream));
        } else {
            GPTOSS_CUDA_TRY(cudaMemcpyAsync(step_host_, step, sizeof(StepInfo), cudaMemcpyDeviceToHost, stream));
            GPTOSS_CUDA_TRY(cudaMemcpyAsync(xn_host_, xn, size_t(n) * H_ * 2, cudaMemcpyDeviceToHost, stream));
            GPTOSS_CUDA_TRY(cudaMemcpyAsync(experts_host_, experts, size_t(n) * K_ * 4, cudaMemcpyDeviceToHost, stream));
        }
        GPTOSS_CUDA_TRY(cudaLaunchHostFunc(stream, &HostMoeSession::run, &calls_[l]));
        GPTOSS_CUDA_TRY(cudaMemcpyAsync(part, part_host_, size_t(n) * K_ * H_ * 4, cudaMemcpyHostToDevice, stream));
    }
    if (timer_.on()) GPTOSS_CUDA_TRY(timer_.stamp(l, 1, stream));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
