// cuda/multi_gpu.cu - one model over several GPUs of one process, with NCCL. The sharded
// backend owns one ordinary CUDA backend per GPU, each loaded with its rank's slice of the
// weights (gptoss-shard.h: kv-head tensor-parallel attention, expert-width-sliced MoE,
// vocabulary-split lm_head); a sharded session owns one CUDA session per GPU plus one NCCL
// communicator per GPU, so that sessions never share a communicator and may run on different
// threads. Each rank's forward pass all-reduces twice per layer (the residual after o_proj; the
// combined MoE residual, in decode folded into the combine kernel in lsa mode) and all-gathers the logits
// (cuda/backend.cu, on the rank's own stream, inside its decode graph);
// rank 0 then samples as a single GPU does. A step runs ranks 1..n-1 on threads of their own and
// rank 0 on the caller's, because a NCCL collective may block its host thread until every
// rank has issued it. NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is set in the
// process environment before the first communicator unless the caller already set it.
// A failure on one rank aborts the session's communicators (so no GPU waits forever on a
// collective) and makes the session unusable. How the collectives run (plain NCCL, NCCL
// symmetric memory, or one-shot kernels on NCCL's device API) is cuda/rank_comm.h's.
#include "cuda/multi_gpu.h"
#include "cuda/common.cuh"
#include "gptoss-shard.h"

#ifdef GPTOSS_HAVE_NCCL
#include "cuda/rank_comm.h"
#include <nccl.h>
#endif

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

namespace gptoss {

#ifndef GPTOSS_HAVE_NCCL

namespace cuda {
gptoss_status rank_all_reduce(void*, float*, size_t, cudaStream_t) {
    return fail(GPTOSS_ERR_UNSUPPORTED, "this build has no NCCL: a model cannot be split over several GPUs");
}
gptoss_status rank_all_gather(void*, float*, size_t, cudaStream_t) {
    return fail(GPTOSS_ERR_UNSUPPORTED, "this build has no NCCL: a model cannot be split over several GPUs");
}
bool rank_ll_reduce(void*, size_t, LlReduce*) { return false; }
void debug_skip_collectives(bool) {}
gptoss_status sharded_synchronize(BackendSession*) {
    return fail(GPTOSS_ERR_INVALID_ARGUMENT, "synchronize: not a CUDA session");
}
gptoss_status sharded_profile(BackendSession*, const int32_t*, uint32_t, uint32_t, bool,
                              std::vector<std::pair<std::string, double>>*) {
    return fail(GPTOSS_ERR_INVALID_ARGUMENT, "profile_forward: not a CUDA session");
}
gptoss_status create_sharded_synthetic_backend(const Config&, const int32_t*, size_t, uint64_t,
                                               std::unique_ptr<Backend>*) {
    return fail(GPTOSS_ERR_UNSUPPORTED, "this build has no NCCL (nccl.h was not found at configure time): "
                                        "a model cannot be split over several GPUs");
}
}  // namespace cuda

gptoss_status create_sharded_cuda_backend(const Checkpoint&, const int32_t*, size_t, const ProgressFn&,
                                          std::unique_ptr<Backend>*) {
    return fail(GPTOSS_ERR_UNSUPPORTED, "this build has no NCCL (nccl.h was not found at configure time): "
                                        "a model cannot be split over several GPUs");
}

#else

namespace cuda {
namespace {

gptoss_status nccl_status(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return GPTOSS_OK;
    return fail(GPTOSS_ERR_DEVICE, "NCCL: %s failed: %s", what, ncclGetErrorString(r));
}

class ShardedBackend;

class ShardedSession final : public BackendSession {
public:
    ShardedSession(uint32_t n_vocab, std::vector<int32_t> devices, uint32_t lm_rows)
        : BackendSession(n_vocab), devices_(std::move(devices)), lm_rows_(lm_rows) {}
    ~ShardedSession() override {
        ranks_.clear();  // each syncs its stream first
        release_windows();
        for (ncclComm_t c : comms_)
            if (c) ncclCommDestroy(c);
    }

    gptoss_status init(const std::vector<std::unique_ptr<Backend>>& backends, uint32_t max_context,
                       uint32_t max_batch) {
        CollectiveMode mode = CollectiveMode::kNccl;
        GPTOSS_TRY(collective_mode_from_env(&mode));
        ranks_.resize(backends.size());
        for (size_t r = 0; r < backends.size(); ++r)
            GPTOSS_TRY(backends[r]->create_session(max_context, max_batch, &ranks_[r]));
        setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
        comms_.assign(devices_.size(), nullptr);
        GPTOSS_TRY(nccl_status(ncclCommInitAll(comms_.data(), int(devices_.size()), devices_.data()),
                               "ncclCommInitAll"));
        if (mode == CollectiveMode::kLsa && !lsa_available()) {
            const char* asked = std::getenv("GPTOSS_MULTI_AR");  // the default (lsa) falls back quietly
            log(asked && *asked ? GPTOSS_LOG_WARN : GPTOSS_LOG_INFO, "split model: NCCL's device API is not available (no nccl_device.h at build time, "
                                 "or the library's version differs from the header's): plain NCCL collectives");
            mode = CollectiveMode::kNccl;
        }
        rcs_.resize(ranks_.size());  // never resized again: the rank sessions hold pointers into it
        for (size_t r = 0; r < ranks_.size(); ++r) {
            rcs_[r].comm = comms_[r];
            rcs_[r].rank = int(r);
            rcs_[r].n_ranks = int(ranks_.size());
            rcs_[r].mode = mode;
        }
        if (mode == CollectiveMode::kSymmetric)
            log(GPTOSS_LOG_WARN, "split model: GPTOSS_MULTI_AR=sym: NCCL 2.28.3's in-place symmetric all-reduce "
                                 "gave wrong sums here (cuda/rank_comm.h); use it only with a newer NCCL");
        if (mode != CollectiveMode::kNccl) GPTOSS_TRY(setup_windows());
        log(GPTOSS_LOG_INFO, "split model: collectives %s", collective_mode_name(rcs_[0].mode));
        for (size_t r = 0; r < ranks_.size(); ++r) GPTOSS_TRY(set_session_comm(ranks_[r].get(), &rcs_[r]));
        return warm_up();
    }

    gptoss_status forward(const int32_t* tokens, uint32_t n, uint32_t pos) override {
        return run_all([&](size_t r) { return ranks_[r]->forward(tokens, n, pos); });
    }
    // Replaying the captured graphs issues no NCCL host calls, so one thread launches every
    // rank's; a capture needs every rank's thread in NCCL at once.
    gptoss_status decode(int32_t token, uint32_t pos) override {
        bool replay = true;
        for (const auto& r : ranks_) replay = replay && decode_replays(r.get(), pos);
        auto step = [&](size_t r) { return ranks_[r]->decode(token, pos); };
        return replay ? run_each(step, /*abort=*/true) : run_all(step);
    }
    // Rank 0 holds the all-gathered logits; its stream waited for every rank's share.
    gptoss_status get_logits(const float** logits_out) override {
        GPTOSS_TRY(usable());
        return ranks_[0]->get_logits(logits_out);
    }
    gptoss_status sample(const SamplingConfig& config, double u, int32_t* token_out) override {
        GPTOSS_TRY(usable());
        return ranks_[0]->sample(config, u, token_out);
    }
    gptoss_status sample_masked(const SamplingConfig& config, double u, const uint32_t* allowed,
                                int32_t* token_out) override {
        GPTOSS_TRY(usable());
        return ranks_[0]->sample_masked(config, u, allowed, token_out);
    }
    gptoss_status save_sliding_snapshot() override {
        return run_each([&](size_t r) { return ranks_[r]->save_sliding_snapshot(); });
    }
    gptoss_status restore_sliding_snapshot() override {
        return run_each([&](size_t r) { return ranks_[r]->restore_sliding_snapshot(); });
    }
    gptoss_status sync() {
        return run_each([&](size_t r) { return synchronize(ranks_[r].get()); });
    }
    gptoss_status profile(const int32_t* tokens, uint32_t n, uint32_t pos, bool decode,
                          std::vector<std::pair<std::string, double>>* out) {
        std::vector<std::vector<std::pair<std::string, double>>> ops(ranks_.size());
        GPTOSS_TRY(run_all([&](size_t r) { return profile_forward(ranks_[r].get(), tokens, n, pos, decode, &ops[r]); }));
        out->insert(out->end(), ops[0].begin(), ops[0].end());
        return GPTOSS_OK;
    }

private:
    gptoss_status usable() const {
        if (broken_) return fail(GPTOSS_ERR_DEVICE, "split model: an earlier failure on one GPU made this session unusable");
        return GPTOSS_OK;
    }

    // Symmetric memory for every rank: allocations first (a failure there falls back to plain
    // NCCL for all ranks), then the collective registration on one thread per rank.
    gptoss_status setup_windows() {
        for (size_t r = 0; r < ranks_.size(); ++r) {
            DeviceGuard guard(devices_[r]);
            if (rank_comm_alloc(&rcs_[r], ranks_[r].get(), lm_rows_) != GPTOSS_OK) {
                log(GPTOSS_LOG_WARN, "split model: %s; plain NCCL collectives instead", gptoss_last_error());
                for (RankComm& rc : rcs_) rank_comm_free_unregistered(&rc);
                return GPTOSS_OK;
            }
        }
        registered_ = true;
        return run_all([&](size_t r) {
            DeviceGuard guard(devices_[r]);
            return rank_comm_register(&rcs_[r], ranks_[r].get());
        });
    }

    // Deregistration is collective: one thread per rank. After an abort only the memory is freed.
    void release_windows() {
        if (!registered_) return;
        std::vector<std::thread> threads;
        for (size_t r = 0; r < rcs_.size(); ++r)
            threads.emplace_back([&, r] {
                DeviceGuard guard(devices_[r]);
                rank_comm_release(&rcs_[r]);
            });
        for (std::thread& t : threads) t.join();
        registered_ = false;
    }

    // One all-reduce on every rank (grouped from this thread), so that NCCL connects its
    // channels now rather than inside the first decode graph's capture.
    gptoss_status warm_up() {
        std::vector<DeviceBuffer> bufs(devices_.size());
        GPTOSS_TRY(nccl_status(ncclGroupStart(), "ncclGroupStart"));
        gptoss_status st = GPTOSS_OK;
        for (size_t r = 0; r < devices_.size() && st == GPTOSS_OK; ++r) {
            DeviceGuard guard(devices_[r]);
            st = bufs[r].alloc(256, "NCCL warm-up");
            if (st == GPTOSS_OK) st = cuda_status(cudaMemset(bufs[r].get(), 0, 256), "cudaMemset", __FILE__, __LINE__);
            if (st == GPTOSS_OK)
                st = nccl_status(ncclAllReduce(bufs[r].get(), bufs[r].get(), 64, ncclFloat, ncclSum, comms_[r], nullptr),
                                 "ncclAllReduce (warm-up)");
        }
        const gptoss_status end = nccl_status(ncclGroupEnd(), "ncclGroupEnd");
        GPTOSS_TRY(st);
        GPTOSS_TRY(end);
        for (size_t r = 0; r < devices_.size(); ++r) {
            DeviceGuard guard(devices_[r]);
            GPTOSS_CUDA_TRY(cudaDeviceSynchronize());
        }
        return GPTOSS_OK;
    }

    // fn(r) for every rank, ranks 1.. on their own threads, rank 0 on this one. On any failure
    // the communicators are aborted (a rank may be waiting in a collective for the failed one)
    // and the first failure's message is kept, naming its GPU.
    template <typename Fn>
    gptoss_status run_all(const Fn& fn) {
        GPTOSS_TRY(usable());
        const size_t n = ranks_.size();
        std::vector<gptoss_status> st(n, GPTOSS_OK);
        std::vector<std::string> msg(n);
        auto one = [&](size_t r) {
            st[r] = fn(r);
            if (st[r] != GPTOSS_OK) msg[r] = gptoss_last_error();
        };
        std::vector<std::thread> threads;
        threads.reserve(n - 1);
        for (size_t r = 1; r < n; ++r) threads.emplace_back(one, r);
        one(0);
        for (std::thread& t : threads) t.join();
        return collect(st, msg, /*abort=*/true);
    }

    // fn(r) for every rank on this thread (calls that never block in a collective).
    template <typename Fn>
    gptoss_status run_each(const Fn& fn, bool abort = false) {
        GPTOSS_TRY(usable());
        std::vector<gptoss_status> st(ranks_.size(), GPTOSS_OK);
        std::vector<std::string> msg(ranks_.size());
        for (size_t r = 0; r < ranks_.size(); ++r) {
            st[r] = fn(r);
            if (st[r] != GPTOSS_OK) msg[r] = gptoss_last_error();
        }
        return collect(st, msg, abort);
    }

    gptoss_status collect(const std::vector<gptoss_status>& st, const std::vector<std::string>& msg, bool abort) {
        for (size_t r = 0; r < st.size(); ++r) {
            if (st[r] == GPTOSS_OK) continue;
            // Argument errors are found before any rank launches work, identically on every rank.
            const bool before_launch = st[r] == GPTOSS_ERR_INVALID_ARGUMENT || st[r] == GPTOSS_ERR_CONTEXT_FULL;
            if (abort && !before_launch) {
                for (ncclComm_t& c : comms_) {
                    if (c) ncclCommAbort(c);
                    c = nullptr;
                }
                for (RankComm& rc : rcs_) rc.comm = nullptr;
                broken_ = true;
            }
            return fail(st[r], "GPU %d (rank %zu of %zu): %s", devices_[r], r, st.size(), msg[r].c_str());
        }
        return GPTOSS_OK;
    }

    std::vector<int32_t> devices_;
    uint32_t lm_rows_ = 0;  // logits rows per rank (ShardPlan::lm_rows)
    std::vector<std::unique_ptr<BackendSession>> ranks_;
    std::vector<ncclComm_t> comms_;
    std::vector<RankComm> rcs_;
    bool registered_ = false;
    bool broken_ = false;
};

class ShardedBackend final : public Backend {
public:
    ShardedBackend(const Config& config, std::vector<int32_t> devices) : config_(config), devices_(std::move(devices)) {}

    gptoss_status create_session(uint32_t max_context, uint32_t max_batch,
                                 std::unique_ptr<BackendSession>* out) override {
        ShardPlan plan;
        GPTOSS_TRY(plan_shards(config_, uint32_t(devices_.size()), &plan));
        auto s = std::make_unique<ShardedSession>(config_.vocab, devices_, plan.lm_rows);
        GPTOSS_TRY(s->init(ranks_, max_context, max_batch));
        *out = std::move(s);
        return GPTOSS_OK;
    }
    uint64_t weight_bytes() const override {
        uint64_t b = 0;
        for (const auto& r : ranks_) b += r->weight_bytes();
        return b;
    }
    int32_t device() const override { return devices_[0]; }
    uint32_t default_max_batch() const override { return ranks_[0]->default_max_batch(); }

    Config config_;
    std::vector<int32_t> devices_;
    std::vector<std::unique_ptr<Backend>> ranks_;
};

gptoss_status check_devices(const int32_t* devices, size_t n) {
    GPTOSS_TRY(validate_devices(devices, n, cuda_device_count()));
    if (n < 2) return fail(GPTOSS_ERR_INTERNAL, "sharded backend: %zu device(s); one device takes the single-GPU path", n);
    return GPTOSS_OK;
}

void log_rank(const ShardPlan& plan, uint32_t r, int32_t device, const Backend& b) {
    const ShardRange& s = plan.ranks[r];
    log(GPTOSS_LOG_INFO,
        "split model: GPU %d (rank %u of %u): query heads %u..%u, expert columns %u..%u, vocab rows %u..%u, "
        "%.2f GB of weights",
        device, r, plan.n_ranks, s.q_head0, s.q_head0 + s.n_q_heads - 1, s.i0, s.i0 + s.n_i - 1, s.vocab0,
        s.vocab0 + s.n_vocab - 1, double(b.weight_bytes()) / 1e9);
}

RankInfo rank_info(const ShardPlan& plan, uint32_t r) {
    RankInfo info;
    info.rank = r;
    info.n_ranks = plan.n_ranks;
    info.lm_rows = plan.lm_rows;
    return info;
}

}  // namespace

std::atomic<bool> g_skip_collectives{false};

void debug_skip_collectives(bool skip) { g_skip_collectives = skip; }

gptoss_status sharded_profile(BackendSession* session, const int32_t* tokens, uint32_t n, uint32_t pos, bool decode,
                              std::vector<std::pair<std::string, double>>* ms_by_op) {
    auto* s = dynamic_cast<ShardedSession*>(session);
    if (!s) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "profile_forward: not a CUDA session");
    return s->profile(tokens, n, pos, decode, ms_by_op);
}

gptoss_status sharded_synchronize(BackendSession* session) {
    auto* s = dynamic_cast<ShardedSession*>(session);
    if (!s) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "synchronize: not a CUDA session");
    return s->sync();
}

gptoss_status create_sharded_synthetic_backend(const Config& config, const int32_t* devices, size_t n, uint64_t seed,
                                               std::unique_ptr<Backend>* out) {
    GPTOSS_TRY(check_devices(devices, n));
    ShardPlan plan;
    GPTOSS_TRY(plan_shards(config, uint32_t(n), &plan));
    auto b = std::make_unique<ShardedBackend>(config, std::vector<int32_t>(devices, devices + n));
    b->ranks_.resize(n);
    for (uint32_t r = 0; r < n; ++r)
        GPTOSS_TRY(create_synthetic_rank_backend(shard_config(config, plan.ranks[r]), devices[r], seed + r,
                                                 rank_info(plan, r), &b->ranks_[r]));
    for (uint32_t r = 0; r < n; ++r) log_rank(plan, r, devices[r], *b->ranks_[r]);
    *out = std::move(b);
    return GPTOSS_OK;
}

}  // namespace cuda

// Loads one rank at a time: its checkpoint view (host copies of the strided slices) lives only
// while that rank uploads.
gptoss_status create_sharded_cuda_backend(const Checkpoint& checkpoint, const int32_t* devices, size_t n,
                                          const ProgressFn& progress, std::unique_ptr<Backend>* out) {
    GPTOSS_TRY(cuda::check_devices(devices, n));
    ShardPlan plan;
    GPTOSS_TRY(plan_shards(checkpoint.config, uint32_t(n), &plan));
    auto b = std::make_unique<cuda::ShardedBackend>(checkpoint.config, std::vector<int32_t>(devices, devices + n));
    b->ranks_.resize(n);
    for (uint32_t r = 0; r < n; ++r) {
        std::unique_ptr<ShardCheckpoint> view;
        GPTOSS_TRY(make_shard_checkpoint(checkpoint, plan, r, &view));
        ProgressFn part;
        if (progress) part = [&, r](float f) { return progress((float(r) + f) / float(n)); };
        GPTOSS_TRY(cuda::create_rank_backend(view->checkpoint, devices[r], cuda::rank_info(plan, r), part,
                                             &b->ranks_[r]));
        cuda::log_rank(plan, r, devices[r], *b->ranks_[r]);
    }
    log(GPTOSS_LOG_INFO, "split model: %zu GPUs, %.2f GB of weights in all", n, double(b->weight_bytes()) / 1e9);
    *out = std::move(b);
    return GPTOSS_OK;
}

#endif  // GPTOSS_HAVE_NCCL

}  // namespace gptoss
