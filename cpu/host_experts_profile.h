// cpu/host_experts_profile.h - where the µs of one host experts pass go (issue 16, bench/NOTES.md
// "v16 host experts"): cpu::host_moe_experts at T = 1 (a decode step's host layer) recorded
// piece by piece when on — the calling thread's preparation (bf16 → fp32, grouping, the int8
// quantization of x), each pool thread's wake-up (dispatch → its first work item), its work
// (time inside items, and the weight bytes those items read), its waits (a down range waiting
// for its expert's gate_up ranges), the spread of the threads' last item ends (imbalance) and
// the join (last item end → parallel_for returned on the caller). Means over all recorded calls,
// plus the call time's median / p90 / p99, as one line of text. On with GPTOSS_HOST_MOE_TIMING=1
// (the engine prints it next to its round-trip timer) or set_on (the bench). Costs two clock
// reads per work item (~64 items per 120b call) while on, one branch per item while off.
#pragma once

#include <cstdint>
#include <string>

namespace gptoss {
namespace cpu {
namespace host_profile {

// Whether calls are recorded: GPTOSS_HOST_MOE_TIMING=1 (read once) unless set_on overrode it.
bool on();
void set_on(bool on);
// steady_clock in ns.
int64_t now_ns();

// One call, driven by host_moe_experts under its scratch lock (one call at a time):
// call_begin (entry), quantized (x's int8 quantization took `ns`), dispatch (just before the
// parallel_for), item (from any pool thread: one work item's start / end, the weight bytes it
// read and the ns it waited inside), call_end (parallel_for returned: accumulates the call).
void call_begin();
void quantized(int64_t ns);
void dispatch();
void item(int64_t t0, int64_t t1, uint64_t bytes, int64_t wait_ns);
void call_end();

// The means so far ("" when no call was recorded); reset clears them.
std::string report();
void reset();
// Recorded calls so far, and the weight bytes all their items read (tests).
uint64_t calls();
uint64_t bytes();

}  // namespace host_profile
}  // namespace cpu
}  // namespace gptoss
