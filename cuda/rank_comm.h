// cuda/rank_comm.h - one rank's collectives of a split model (cuda/multi_gpu.cu owns the ranks).
// Three ways to run the decode step's small all-reduces, chosen per session by
// GPTOSS_MULTI_AR (default "lsa" since 2x H200, 2026-11-26: bit-identical to nccl and 20b tg128 699
// vs 610 tok/s, 120b 479 vs 419; lsa without the device API at build or run time, and a failed
// symmetric allocation, fall back to "nccl" before the first collective, with a log line):
//   nccl  ncclAllReduce / ncclAllGather on the session's ordinary buffers (v12).
//   sym   the same calls, but the buffers they touch (cuda/backend.h place_session_collectives)
//         live in NCCL symmetric memory (ncclMemAlloc + ncclCommWindowRegister with
//         NCCL_WIN_COLL_SYMMETRIC), so NCCL may pick its symmetric low-latency kernels.
//         WRONG RESULTS with NCCL 2.28.3 (2x H200, 2026-11-26: in-place symmetric all-reduces
//         gave other sums, intermittently; cf. NVIDIA/nccl issue 1924): opt-in, for newer NCCL.
//   lsa   NCCL's device API (ncclDevCommCreate with LSA barriers; never multimem) on a window of
//         its own (staging only; the session's buffers stay ordinary): an all-reduce of at most
//         kLsaMaxFloats / (2 n_ranks) floats is one kernel that stores the rank's partial as
//         (value, sequence number) pairs (NCCL's LL protocol) into its region of every peer's
//         staging slot over NVLink, waits in its own slot until every peer's pairs carry the
//         all-reduce's number, and sums in rank order 0..n-1 (so every rank holds the same
//         bits; v18: no barrier, no remote loads); the logits all-gather copies
//         the rank's slice into the window's gather region and reads the peers' regions.
//         Larger all-reduces (prefill chunks) stay plain ncclAllReduce.
// Staging slots alternate per LSA all-reduce; a forward issues an even number of them (two per
// layer), so consecutive ones never share a slot: a rank writes a slot again two all-reduces
// later, after it received every peer's pairs of the one in between, which a peer sends only
// once its kernel on that slot has ended.
#pragma once

#ifdef GPTOSS_HAVE_NCCL
#include "cuda/backend.h"
#include "cuda/kernels.h"

#include <nccl.h>

#include <cstdint>

namespace gptoss {
namespace cuda {

enum class CollectiveMode { kNccl, kSymmetric, kLsa };

// GPTOSS_MULTI_AR = nccl | sym | lsa (unset: lsa). Anything else: INVALID_ARGUMENT naming it.
[[nodiscard]] gptoss_status collective_mode_from_env(CollectiveMode* out);
const char* collective_mode_name(CollectiveMode mode);
// True when lsa mode can run: built with nccl_device.h and the loaded library is that version.
bool lsa_available();

struct LsaState;  // the ncclDevComm (rank_comm.cu)

// One rank's communicator and its symmetric window: in sym mode the session's collective
// buffers (session_collective_bytes) first; then two all-reduce staging slots of kLsaMaxFloats
// and a gather region of one rank's logits (both used in lsa mode).
struct RankComm {
    ncclComm_t comm = nullptr;
    int rank = 0, n_ranks = 1;
    CollectiveMode mode = CollectiveMode::kNccl;
    char* sym = nullptr;        // ncclMemAlloc'd, sym_bytes
    size_t sym_bytes = 0;
    size_t stage_off = 0;       // offset of the two staging slots in the window
    size_t gather_off = 0;      // offset of the gather region (gather_floats) in the window
    size_t gather_floats = 0;
    ncclWindow_t win = nullptr;
    LsaState* lsa = nullptr;    // set in lsa mode
    // lsa mode: slot k's base in rank r's window as this rank addresses it (rank_ll_reduce).
    char* slot_ptr[2][kLlMaxRanks] = {};
    uint64_t lsa_reduces = 0;   // LSA all-reduces enqueued (or captured) so far: picks the slot
};

// Floats of one staging slot: the LSA kernel takes all-reduces of up to kLsaMaxFloats / (2 n_ranks)
// floats (one region of (value, sequence) pairs per rank); larger ones go to ncclAllReduce.
constexpr size_t kLsaMaxFloats = 64 * 1024;

// Steps of setting up sym or lsa mode for rank `rc` whose CUDA session is `session` (current
// device: the rank's). alloc: ncclMemAlloc of the window (not collective; call for every rank
// before register); gather_floats: the logits rows each rank holds (ShardPlan::lm_rows).
// register: the collective ncclCommWindowRegister (+ ncclDevCommCreate in lsa mode): every
// rank's call must run at once, one thread per rank; then, in sym mode, the session's
// collective buffers move into the window. release: deregisters and frees (collective too,
// unless rc->comm was aborted and cleared: then it only frees).
[[nodiscard]] gptoss_status rank_comm_alloc(RankComm* rc, BackendSession* session, size_t gather_floats);
[[nodiscard]] gptoss_status rank_comm_register(RankComm* rc, BackendSession* session);
void rank_comm_release(RankComm* rc);
// Frees what rank_comm_alloc took when the collective steps never ran (the fallback to nccl).
void rank_comm_free_unregistered(RankComm* rc);

}  // namespace cuda
}  // namespace gptoss
#endif  // GPTOSS_HAVE_NCCL
