// cuda/decode_probe.h - a timing-only probe of the decode graph (issue 12's breakdown): with
// GPTOSS_DECODE_PROBE=LIST (comma-separated op names: qkv, attn, o, router, gate_up, down,
// combine, or "all" for those seven; lm_head, which "all" leaves alone), the decode step launches
// an empty kernel (1 CTA of 32 threads: griddepcontrol.wait + launch_dependents, nothing else) in
// place of each listed op.
// The step keeps its launch count and PDL chain, so step(full) − step(op emptied) is the op's
// in-graph cost, and step(all emptied) − step(all,lm_head emptied) is the lm_head's, so the
// launch boundaries' share of step(all,lm_head) is measured, not estimated. The tokens it
// produces are garbage: for measurements only (gptoss-bench), never a default. Prefill is never
// touched.
#pragma once

#include "gptoss.h"

#include <cuda_runtime.h>

namespace gptoss {
namespace cuda {

enum class DecodeOp : unsigned {
    kQkv = 1, kAttn = 2, kO = 4, kRouter = 8, kGateUp = 16, kDown = 32, kCombine = 64, kLmHead = 128
};

// Whether GPTOSS_DECODE_PROBE lists `op` (parsed once; unknown names are reported on stderr
// and ignored).
bool decode_probe_skips(DecodeOp op);

// Launches the empty PDL kernel on `stream` (capturable).
[[nodiscard]] gptoss_status decode_probe_empty(cudaStream_t stream);

}  // namespace cuda
}  // namespace gptoss
