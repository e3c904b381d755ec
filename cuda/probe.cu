// cuda/probe.cu - the hardware ceilings gptoss-bench divides by, measured in the same run:
// device-to-device copy bandwidth (bytes read + written), a streaming-read kernel, and the
// bf16 tensor-core rate of a cuBLASLt 8192³ GEMM (fp32 accumulate) on random data.
// Each is the median of several timed repetitions after a warm-up (METHOD.md).
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "cuda/kernels.h"

#include <cublasLt.h>

#include <algorithm>
#include <vector>

namespace gptoss {
namespace cuda {
namespace {

#define GPTOSS_CUBLAS_TRY(call)                                                                        \
    do {                                                                                               \
        const cublasStatus_t st_ = (call);                                                             \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                              \
            return fail(GPTOSS_ERR_DEVICE, "cuBLASLt: %s failed at %s:%d: status %d", #call, __FILE__, \
                        __LINE__, int(st_));                                                           \
    } while (0)

struct Events {
    cudaEvent_t a = nullptr, b = nullptr;
    ~Events() { if (a) cudaEventDestroy(a); if (b) cudaEventDestroy(b); }
};

template <typename F>
gptoss_status time_median(cudaStream_t s, int reps, F&& fn, double* ms_out) {
    Events ev;
    GPTOSS_CUDA_TRY(cudaEventCreate(&ev.a));
    GPTOSS_CUDA_TRY(cudaEventCreate(&ev.b));
    GPTOSS_TRY(fn());  // warm-up
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        GPTOSS_CUDA_TRY(cudaEventRecord(ev.a, s));
        GPTOSS_TRY(fn());
        GPTOSS_CUDA_TRY(cudaEventRecord(ev.b, s));
        GPTOSS_CUDA_TRY(cudaEventSynchronize(ev.b));
        float ms = 0;
        GPTOSS_CUDA_TRY(cudaEventElapsedTime(&ms, ev.a, ev.b));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    *ms_out = t[t.size() / 2];
    return GPTOSS_OK;
}

gptoss_status gemm_rate(cudaStream_t s, double* tflops) {
    const int n = 8192;
    DeviceBuffer a, b, c, ws;
    GPTOSS_TRY(a.alloc(size_t(n) * n * 2, "GEMM probe A"));
    GPTOSS_TRY(b.alloc(size_t(n) * n * 2, "GEMM probe B"));
    GPTOSS_TRY(c.alloc(size_t(n) * n * 2, "GEMM probe C"));
    const size_t ws_bytes = 64u << 20;
    GPTOSS_TRY(ws.alloc(ws_bytes, "GEMM probe workspace"));
    GPTOSS_TRY(fill_random(a.get(), size_t(n) * n / 2, 1, true, 1.0f, s));
    GPTOSS_TRY(fill_random(b.get(), size_t(n) * n / 2, 2, true, 1.0f, s));
    cublasLtHandle_t h = nullptr;
    GPTOSS_CUBLAS_TRY(cublasLtCreate(&h));
    struct Cleanup {
        cublasLtHandle_t h; cublasLtMatmulDesc_t op = nullptr; cublasLtMatrixLayout_t l = nullptr;
        cublasLtMatmulPreference_t pref = nullptr;
        ~Cleanup() {
            if (pref) cublasLtMatmulPreferenceDestroy(pref);
            if (l) cublasLtMatrixLayoutDestroy(l);
            if (op) cublasLtMatmulDescDestroy(op);
            cublasLtDestroy(h);
        }
    } cl{h};
    GPTOSS_CUBLAS_TRY(cublasLtMatmulDescCreate(&cl.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    GPTOSS_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&cl.l, CUDA_R_16BF, n, n, n));
    GPTOSS_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&cl.pref));
    GPTOSS_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(cl.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &ws_bytes, sizeof(ws_bytes)));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    GPTOSS_CUBLAS_TRY(cublasLtMatmulAlgoGetHeuristic(h, cl.op, cl.l, cl.l, cl.l, cl.l, cl.pref, 1, &heur, &found));
    if (found == 0) return fail(GPTOSS_ERR_DEVICE, "cuBLASLt: no bf16 GEMM algorithm for %d³", n);
    const float alpha = 1.0f, beta = 0.0f;
    double ms = 0;
    GPTOSS_TRY(time_median(s, 10, [&]() -> gptoss_status {
        GPTOSS_CUBLAS_TRY(cublasLtMatmul(h, cl.op, &alpha, a.get(), cl.l, b.get(), cl.l, &beta, c.get(), cl.l, c.get(),
                                         cl.l, &heur.algo, ws.get(), ws_bytes, s));
        return GPTOSS_OK;
    }, &ms));
    *tflops = 2.0 * n * double(n) * n / (ms * 1e-3) / 1e12;
    return GPTOSS_OK;
}

}  // namespace

gptoss_status measure_ceilings(int32_t device, bool with_gemm, DeviceCeilings* out) {
    DeviceGuard guard(device);
    cudaDeviceProp prop{};
    GPTOSS_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
    out->name = prop.name;
    out->sm_count = prop.multiProcessorCount;
    out->memory_gib = double(prop.totalGlobalMem) / double(1ull << 30);
    cudaStream_t s = nullptr;
    GPTOSS_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    struct StreamGuard { cudaStream_t s; ~StreamGuard() { cudaStreamSynchronize(s); cudaStreamDestroy(s); } } sg{s};
    const size_t bytes = size_t(2) << 30;
    DeviceBuffer src, dst, sink;
    GPTOSS_TRY(src.alloc(bytes, "bandwidth probe"));
    GPTOSS_TRY(dst.alloc(bytes, "bandwidth probe"));
    GPTOSS_TRY(sink.alloc(4, "bandwidth probe"));
    GPTOSS_TRY(fill_random(src.get(), bytes / 4, 3, false, 0, s));
    double ms = 0;
    GPTOSS_TRY(time_median(s, 10, [&]() -> gptoss_status {
        GPTOSS_CUDA_TRY(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, s));
        return GPTOSS_OK;
    }, &ms));
    out->copy_gbps = 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
    GPTOSS_TRY(time_median(s, 10, [&]() { return read_probe(src.get(), bytes / 16, sink.as<float>(), s); }, &ms));
    out->read_gbps = double(bytes) / (ms * 1e-3) / 1e9;
    if (with_gemm) GPTOSS_TRY(gemm_rate(s, &out->bf16_tflops));
    return GPTOSS_OK;
}

}  // namespace cuda
}  // namespace gptoss
