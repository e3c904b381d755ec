// gptoss-decode-pipeline.cpp - the pipelined decode loop (issue 12). The plain loop of
// gptoss.cpp samples token k, waits for it on the host, checks the stop conditions, then
// launches the forward of token k: the device idles for the host's round trip every token (the
// wake-up after the wait, the caller's on_token callback, the next launch). Here the sampled
// token stays on the device as the next step's input (BackendSession::sample_ahead /
// decode_sampled / fetch_sampled): the forward of token k is enqueued before the host reads
// token k, and the host runs the callback while that forward runs. The tokens, logits and K/V
// are the plain loop's (the same kernels in the same order; only where the token comes from
// differs). What it costs: when token k turns out to be a stop (a stop token, the callback's
// verdict, a cancel), the forward of token k has run for nothing, and it wrote the K/V of
// position cached.size() past the end of what `cached` lists (gptoss_session::kv_past_end, as
// the batched step's speculation does). max_tokens and a full context are known in advance, so
// the last token of such a call costs nothing extra, and nothing is sampled after a stop token.
// Constrained calls (json_schema, chat's tool and response constraints) too: the mask of token
// k + 1 is computed on the host after token k is read, while the device runs token k's forward.
// Used on a model without a batcher whose backend pipelines (the CUDA decode graph);
// GPTOSS_DECODE_PIPELINE=0 / 1 forces it off / on (A/B runs; on with the CPU backend runs this
// loop over the defaults, which is how CI tests it).
#include "gptoss-internal.h"

#include <algorithm>
#include <vector>

namespace gptoss {

gptoss_status resolve_decode_pipeline(int* out) { return env_switch("GPTOSS_DECODE_PIPELINE", out); }

bool use_decode_pipeline(const gptoss_session* session) {
    const gptoss_model* model = session->model;
    if (model->batcher != nullptr) return false;
    if (model->decode_pipeline >= 0) return model->decode_pipeline == 1;
    return session->backend->pipelines_decode();
}

// Runs the backend's decode of the sampled token at pos; on failure the cache's content is
// unknown (forget_cache), as for any forward.
static gptoss_status decode_sampled_or_forget(gptoss_session* session, uint32_t pos) {
    fault_point();
    const gptoss_status status = session->backend->decode_sampled(pos);
    if (status != GPTOSS_OK) forget_cache(session);
    return status;
}

gptoss_status decode_tokens_pipelined(gptoss_session* session, const GenerateOptions& options, GenerateOutput* out) {
    BackendSession& backend = *session->backend;
    Rng rng(options.seed);
    TokenConstraint* constraint = options.constraint.get();
    std::vector<uint32_t> allowed(constraint != nullptr ? (session->model->checkpoint->config.vocab + 31) / 32 : 0);
    // Samples the next token on the device: u drawn in the plain loop's order (one per token),
    // then the constraint's mask for it, if any (computed on the host while the device runs the
    // forward of the token before it).
    const auto sample_next = [&]() {
        const double u = rng.next_double();
        const bool masked = constraint != nullptr && constraint->mask(allowed.data(), uint32_t(allowed.size()));
        return backend.sample_ahead(options.sampling, u, masked ? allowed.data() : nullptr);
    };
    GPTOSS_TRY(sample_next());  // token 0, from the prefill's logits
    for (;;) {
        if (session->cancel_requested.load()) {
            out->stop_reason = GPTOSS_STOP_CANCELLED;
            return GPTOSS_OK;
        }
        const uint32_t pos = uint32_t(session->cached.size());
        // Whether token k can be followed at all: it does not reach max_tokens and its position
        // fits the context. If not, stop_after() below stops after it, and nothing is enqueued.
        const bool ahead = (options.max_tokens == 0 || out->tokens.size() + 1 < options.max_tokens) &&
                           pos < session->max_context;
        if (ahead) GPTOSS_TRY(decode_sampled_or_forget(session, pos));
        int32_t token = -1;
        gptoss_status status = backend.fetch_sampled(&token);
        if (status == GPTOSS_OK && constraint != nullptr) constraint->accept(token);
        // Token k + 1 from the step just enqueued, before the host's work on token k (the stop
        // checks, the callback); not after a stop token, where a constraint has no next mask.
        const bool stop_token =
            std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) != options.stop_tokens.end();
        if (status == GPTOSS_OK && ahead && !stop_token) status = sample_next();
        if (status != GPTOSS_OK) {
            if (ahead) forget_cache(session);  // position pos may hold an unlisted token's K/V
            return status;
        }
        out->tokens.push_back(token);
        if (stop_after(session, options, token, out)) {
            // The step of token k ran (or is running) anyway: its K/V sits at position pos.
            if (ahead) session->kv_past_end = true;
            return GPTOSS_OK;
        }
        if (!ahead || stop_token)
            return fail(GPTOSS_ERR_INTERNAL, "decode pipeline: token %zu went on past a stop", out->tokens.size());
        session->cached.push_back(token);
    }
}

}  // namespace gptoss
