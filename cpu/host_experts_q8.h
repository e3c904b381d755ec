// cpu/host_experts_q8.h - internal to cpu/host_experts*.cpp and their tests: the int8-activation
// path of the host experts (issue 16). The float kernels of host_experts.cpp spend ~7 vector
// instructions per 32 weights on dequantizing MXFP4 to fp32, which made the 120b decode
// compute-bound at ~60 GB/s on a 16-thread Xeon that reads 140 GB/s. Here each activation row
// is quantized once per call to int8 with one scale per 32-element block (q = round(x · 127 /
// max|x|), d = max|x| / 127, as llama.cpp's Q8_0 activations), the MXFP4 codes map to the
// integers 2·E2M1 + 12 ∈ [0, 24] with one pshufb, and 8 blocks at a time are dotted with
// vpdpbusd (AVX-512 VNNI) or vpmaddubsw + vpmaddwd (AVX2); the +12 offset is removed with the
// per-block 12·Σq kept beside q, and each block's exact integer sum is scaled by its E8M0 power
// of two and d/2 in fp32. Error against the float path: the activation rounding, |Δx| ≤ d/2 per
// element (tests/test-host-experts-q8.cpp bounds it so). GPTOSS_HOST_MOE_Q8=0 selects the float
// kernels instead.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gptoss {
namespace cpu {
namespace host_q8 {

// Software prefetch of a matrix's streams (cpu::HostMoeTuning). Hints only: same results.
struct Prefetch {
    uint32_t bytes = 0;        // distance in the block stream (0: no software prefetch at all)
    uint32_t locality = 3;     // __builtin_prefetch's locality: 3 prefetcht0, 2 t1, 1 t2, 0 nta
    uint32_t scale_bytes = 0;  // distance in the scale stream, both lines of a row's scales;
                               // 0: one line at bytes / 16 (v14's)
};

// One expert's MXFP4 matrix in the checkpoint layout: rows of nb blocks (16 bytes + 1 scale byte each).
struct Mat {
    const uint8_t* blocks;  // [N, nb, 16]
    const uint8_t* scales;  // [N, nb]
    uint32_t nb;
    Prefetch prefetch = {};  // software prefetch (bytes 0: none)
};

// A quantized activation row is ⌈nb / 8⌉ groups of kGroupBytes: 256 bytes of q (int8), in the
// lane order the kernels load (q8_layout_offset), then 8 int32 12·Σq and 8 fp32 d/2, one per
// block in kBlockOrder order. Padding blocks (past nb) are zero.
constexpr uint32_t kGroupBlocks = 8;
constexpr uint32_t kGroupBytes = 320;
// Lane j of a group's vectors holds block kBlockOrder[j] (the AVX2 transpose's order, kept by
// the AVX-512 kernel so that both read the same rows).
constexpr uint8_t kBlockOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

inline size_t row_bytes(uint32_t k) { return size_t((k / 32 + kGroupBlocks - 1) / kGroupBlocks) * kGroupBytes; }

// Byte offset inside a group of element e (0..31) of the block at lane j (0..7): unit u = e / 8
// (4 bytes of the block's 16), units (0,1) then (2,3), low nibbles (even e) before high ones.
inline uint32_t layout_offset(uint32_t lane, uint32_t e) {
    const uint32_t u = e / 8, r = e % 8;
    return (u / 2) * 128 + (r & 1) * 64 + (u % 2) * 32 + lane * 4 + r / 2;
}

// Quantizes a row of k (multiple of 32) fp32 values in host_experts.cpp's permuted layout
// ([blocks][16 even | 16 odd], xp[perm(k)] = x[k]) into dst (row_bytes(k) bytes). Returns false,
// leaving dst undefined, when a value is not finite (the caller then uses the float kernels).
bool quantize_row(const float* xp, uint32_t k, uint8_t* dst);
// The same for group `group` (blocks 8·group .. +8) of the row only: its kGroupBytes at
// dst + group · kGroupBytes (so that threads can quantize one row's groups in parallel).
bool quantize_group(const float* xp, uint32_t k, uint32_t group, uint8_t* dst);
// Block `block` only (its q bytes, 12·Σq and d/2 in its group of dst; nothing else written), for
// the gate_up work items that produce exactly one block of y each. False if a value is not finite.
bool quantize_block(const float* xp, uint32_t block, uint8_t* dst);
// The portable loop quantize_block uses where the CPU lacks AVX2 (tests: the same bytes).
bool quantize_block_scalar(const float* xp, uint32_t block, uint8_t* dst);

// Rows [r0, r1) of m times the n (1..4) quantized inputs xq[j]: outs[j][r - r0] = the dot (no
// bias). A row holding a scale byte 0 or ≥ 253 is not computed here: its index goes to
// exact_rows[(*n_exact)++] (capacity r1 - r0) and the caller computes it in the reference's order.
using RowsFn = void (*)(const Mat& m, uint32_t r0, uint32_t r1, const uint8_t* const* xq, uint32_t n,
                        float* const* outs, uint32_t* exact_rows, uint32_t* n_exact);

// The kernel for this CPU: AVX-512 with VNNI (avx512bw + avx512vnni) if want_avx512 and present,
// else AVX2, else nullptr (no int8 path; use the float kernels).
RowsFn rows_fn(bool want_avx512);
// The kernels by name, for tests ("avx512-vnni", "avx2"); nullptr when this CPU lacks it.
RowsFn rows_fn_named(const char* name);

}  // namespace host_q8
}  // namespace cpu
}  // namespace gptoss
