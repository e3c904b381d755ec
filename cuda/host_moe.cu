// cuda/host_moe.cu - host-resident MoE experts of the CUDA backend (cuda/host_moe.h): the host
// store and its loading, the streaming of one layer to the GPU, and the per-session decode path
// through a host callback running cpu::host_moe_experts.
#include "cuda/host_moe.h"

#include "cpu/host_experts.h"
#include "cuda/common.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace gptoss {
namespace cuda {

uint32_t host_moe_stream_min() {
    // CPU time grows with the tokens (each brings K expert GEMVs of compute), streaming costs
    // one layer's copy whatever the chunk: a 120b layer is 1.6 GB (~60 ms over PCIe 5), the CPU
    // does ~1-2 tokens per ms there. Default 32 until measured per machine (bench/NOTES.md).
    static const uint32_t value = [] {
        const char* env = std::getenv("GPTOSS_HOST_MOE_STREAM_MIN");
        if (env != nullptr) {
            char* end = nullptr;
            const unsigned long v = std::strtoul(env, &end, 10);
            if (end != env && *end == '\0' && v >= 1 && v <= 4096) return uint32_t(v);
            log(GPTOSS_LOG_WARN, "GPTOSS_HOST_MOE_STREAM_MIN=%s is not a number in 1..4096; using 32", env);
        }
        return 32u;
    }();
    return value;
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
    if (cudaHostRegister(p, bytes_, cudaHostRegisterPortable) == cudaSuccess) {
        pinned_ = registered_ = true;
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
    if (cudaHostAlloc(&p, bytes_, cudaHostAllocPortable) == cudaSuccess) {
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
    pool_.reset(new cpu::PoolHold());
    return GPTOSS_OK;
}

cpu::MoeWeights HostExperts::layer(uint32_t l) const {
    const uint8_t* base = store_ + size_t(l) * lay_.layer_bytes;
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
    if (copy_stream_ != nullptr) {
        cudaStreamSynchronize(copy_stream_);
        cudaStreamDestroy(copy_stream_);
    }
    for (cudaEvent_t e : {raw_ready_, raw_free_})
        if (e != nullptr) cudaEventDestroy(e);
    for (void* p : {static_cast<void*>(step_host_), static_cast<void*>(xn_host_), static_cast<void*>(experts_host_),
                    static_cast<void*>(part_host_)})
        if (p != nullptr) cudaFreeHost(p);
}

gptoss_status HostMoeSession::init(const HostExperts* experts, const Config& config) {
    experts_ = experts;
    H_ = config.hidden;
    I_ = config.intermediate;
    K_ = config.n_experts_per_token;
    swiglu_limit_ = config.swiglu_limit;
    max_tokens_ = host_moe_stream_min();
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

void CUDART_CB HostMoeSession::run(void* p) {
    const Call& call = *static_cast<const Call*>(p);
    const HostMoeSession& s = *call.self;
    const uint32_t n = uint32_t(s.step_host_->n_tokens);
    if (n == 0 || n > s.max_tokens_) return;  // enqueue() checked it; never read past the buffers
    // The GPU keeps GEMM inputs in the fragment-permuted order (permuted_k, cuda/common.cuh);
    // the CPU kernel reads rows in natural order.
    uint16_t* natural = s.xn_natural_.data();
    for (uint32_t t = 0; t < n; ++t) {
        const uint16_t* src = s.xn_host_ + size_t(t) * s.H_;
        uint16_t* dst = natural + size_t(t) * s.H_;
        for (uint32_t k = 0; k < s.H_; ++k) dst[k] = src[permuted_k(k)];
    }
    try {  // nothing may unwind into the driver's thread; init() reserved the scratch, so unlikely
        cpu::host_moe_experts(natural, n, s.H_, s.I_, s.experts_->layer(call.layer), s.experts_host_, s.K_,
                              s.swiglu_limit_, s.part_host_);
    } catch (...) {
        s.failed_.store(true);
    }
}

gptoss_status HostMoeSession::enqueue(uint32_t l, uint32_t n, const StepInfo* step, const uint16_t* xn,
                                      const int32_t* experts, float* part, cudaStream_t stream) {
    if (l >= calls_.size() || n == 0 || n > max_tokens_)
        return fail(GPTOSS_ERR_INTERNAL, "host experts: layer %u, %u tokens (host layers %zu, at most %u tokens)", l, n,
                    calls_.size(), max_tokens_);
    GPTOSS_CUDA_TRY(cudaMemcpyAsync(step_host_, step, sizeof(StepInfo), cudaMemcpyDeviceToHost, stream));
    GPTOSS_CUDA_TRY(cudaMemcpyAsync(xn_host_, xn, size_t(n) * H_ * 2, cudaMemcpyDeviceToHost, stream));
    GPTOSS_CUDA_TRY(cudaMemcpyAsync(experts_host_, experts, size_t(n) * K_ * 4, cudaMemcpyDeviceToHost, stream));
    GPTOSS_CUDA_TRY(cudaLaunchHostFunc(stream, &HostMoeSession::run, &calls_[l]));
    GPTOSS_CUDA_TRY(cudaMemcpyAsync(part, part_host_, size_t(n) * K_ * H_ * 4, cudaMemcpyHostToDevice, stream));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
