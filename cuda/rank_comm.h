// cuda/rank_comm.h - one rank's collectives of a split model (cuda/multi_gpu.cu owns the ranks).
// Three ways to run the decode step's small all-reduces, chosen per session by
// GPTOSS_MULTI_AR (default "nccl"; a failed symmetric allocation falls back to "nccl" before the
// first collective, with a log line):
//   nccl  ncclAllReduce / ncclAllGather on the session's ordinary buffers (v12).
//   sym   the same calls, but the buffers they touch (cuda/backend.h place_session_collectives)
//         live in NCCL symmetric memory (ncclMemAlloc + ncclCommWindowRegister with
//         NCCL_WIN_COLL_SYMMETRIC), so NCCL may pick its symmetric low-latency kernels.
//   lsa   as sym, plus NCCL's device API (ncclDevCommCreate with LSA barriers; never multimem):
//         an all-reduce of at most kLsaMaxFloats is one kernel that copies the rank's partial
//         into a staging slot of the window, meets the other ranks at an LSA barrier and sums
//         every rank's slot over NVLink loads in rank order 0..n-1 (so every rank holds the same
//         bits); the logits all-gather reads the peers' slices straight from their windows.
//         Larger all-reduces (prefill chunks) stay ncclAllReduce on symmetric memory.
// Staging slots alternate per LSA all-reduce; a forward issues an even number of them (two per
// layer), so consecutive ones never share a slot and one barrier per all-reduce suffices (a rank
// passes barrier k+1 only after every peer finished all-reduce k).
#pragma once

#ifdef GPTOSS_HAVE_NCCL
#include "cuda/backend.h"

#include <nccl.h>

#include <cstdint>

namespace gptoss {
namespace cuda {

enum class CollectiveMode { kNccl, kSymmetric, kLsa };

// GPTOSS_MULTI_AR = nccl | sym | lsa (unset: nccl). Anything else: INVALID_ARGUMENT naming it.
[[nodiscard]] gptoss_status collective_mode_from_env(CollectiveMode* out);
const char* collective_mode_name(CollectiveMode mode);
// True when lsa mode can run: built with nccl_device.h and the loaded library is that version.
bool lsa_available();

struct LsaState;  // the ncclDevComm (rank_comm.cu)

// One rank's communicator and its symmetric window. The window holds the session's
// collective buffers (session_collective_bytes) and then the LSA staging: two all-reduce slots
// of kLsaMaxFloats each.
struct RankComm {
    ncclComm_t comm = nullptr;
    int rank = 0, n_ranks = 1;
    CollectiveMode mode = CollectiveMode::kNccl;
    char* sym = nullptr;        // ncclMemAlloc'd, sym_bytes
    size_t sym_bytes = 0;
    size_t stage_off = 0;       // offset of the staging slots in the window
    ncclWindow_t win = nullptr;
    LsaState* lsa = nullptr;    // set in lsa mode
    uint64_t lsa_reduces = 0;   // LSA all-reduces enqueued (or captured) so far: picks the slot
};

// Largest all-reduce (floats) the LSA kernel takes; larger ones go to ncclAllReduce.
constexpr size_t kLsaMaxFloats = 64 * 1024;

// Steps of setting up symmetric mode for rank `rc` whose CUDA session is `session` (current
// device: the rank's). alloc: ncclMemAlloc of the window (not collective; call for every rank
// before register). register_window: the collective ncclCommWindowRegister (+ ncclDevCommCreate
// in lsa mode): every rank's call must run at once, one thread per rank; then the session's
// collective buffers move into the window. release: deregisters and frees (collective too,
// unless rc->comm was aborted and cleared: then it only frees).
[[nodiscard]] gptoss_status rank_comm_alloc(RankComm* rc, BackendSession* session);
[[nodiscard]] gptoss_status rank_comm_register(RankComm* rc, BackendSession* session);
void rank_comm_release(RankComm* rc);
// Frees what rank_comm_alloc took when the collective steps never ran (the fallback to nccl).
void rank_comm_free_unregistered(RankComm* rc);

}  // namespace cuda
}  // namespace gptoss
#endif  // GPTOSS_HAVE_NCCL
