// tools/bench-concurrency.h - gptoss-bench --concurrency N,...: N sessions on N threads generate
// at once through the public gptoss_generate on one model (continuous batching, issue 13: the
// model's DecodeBatcher shares their decode steps). Each stream gets its own random prompt of
// prompt_len tokens (distinct first token, so no prefix is shared), samples at temperature 1
// with its own seed, and asks for gen tokens (it may stop earlier on <|return|> or <|call|>).
// Reported per N: aggregate tok/s (all generated tokens / the round's wall time, prefill
// included), aggregate decode tok/s (tokens after each stream's first / the span from the
// first stream's first token to the last stream's last), mean per-stream decode tok/s, time to
// first token p50/p99 (from the call to the first streamed token), and the mean decode batch
// the batcher formed. Included by tools/gptoss-bench.cpp only.
#pragma once

#include "gptoss-internal.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace bench_concurrency {

struct Row {
    uint32_t streams = 0;
    uint64_t tokens = 0;
    double wall_s = 0, agg_tok_s = 0, agg_decode_tok_s = 0, stream_decode_tok_s = 0;
    double ttft_p50_ms = 0, ttft_p99_ms = 0, mean_batch = 0;
    int failures = 0;
};

inline double seconds_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Stream {
    gptoss_session* session = nullptr;
    std::vector<int32_t> prompt;
    double start = 0, first = 0, last = 0;
    uint32_t n = 0;
    gptoss_status status = GPTOSS_OK;
};

inline void run_stream(Stream* s, uint32_t gen, uint64_t seed) {
    gptoss_sampling_params p;
    gptoss_sampling_params_init(&p, sizeof p);
    p.temperature = 1.0f;
    p.seed = seed;
    p.max_tokens = gen;
    auto on_event = [](void* ud, const gptoss_event*) {
        auto* st = static_cast<Stream*>(ud);
        const double t = seconds_now();
        if (st->n++ == 0) st->first = t;
        st->last = t;
        return true;
    };
    const gptoss_generate_result* r = nullptr;
    s->start = seconds_now();
    s->status = gptoss_generate(s->session, s->prompt.data(), s->prompt.size(), &p, on_event, s, &r);
    if (s->status != GPTOSS_OK) std::fprintf(stderr, "gptoss-bench: stream failed: %s\n", gptoss_last_error());
}

inline double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

// One round of `n` streams on `model`. Sessions are created before the clock starts.
inline Row run_round(gptoss_model* model, uint32_t n, uint32_t prompt_len, uint32_t gen, uint32_t vocab) {
    std::vector<Stream> streams(n);
    gptoss::Rng rng(1234 + n);
    for (uint32_t i = 0; i < n; i++) {
        Stream& s = streams[i];
        gptoss_session_params sp;
        gptoss_session_params_init(&sp, sizeof sp);
        sp.max_context = prompt_len + gen + 16;
        if (gptoss_session_create(model, &sp, &s.session) != GPTOSS_OK) {
            std::fprintf(stderr, "gptoss-bench: creating stream %u's session: %s\n", i, gptoss_last_error());
            std::exit(1);
        }
        s.prompt.resize(prompt_len);
        for (int32_t& t : s.prompt) t = int32_t(rng.next_u64() % std::min<uint32_t>(vocab, 199998));
        s.prompt[0] = int32_t(i % std::min<uint32_t>(vocab, 199998));
    }
    uint64_t steps0 = 0, tokens0 = 0;
    if (model->batcher) model->batcher->counters(&steps0, &tokens0);
    const double t0 = seconds_now();
    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < n; i++) threads.emplace_back(run_stream, &streams[i], gen, 100 + i);
    for (std::thread& t : threads) t.join();
    Row row;
    row.streams = n;
    row.wall_s = seconds_now() - t0;
    std::vector<double> ttft, rates;
    double first = 1e300, last = 0;
    uint64_t decoded = 0;
    for (Stream& s : streams) {
        if (s.status != GPTOSS_OK) row.failures++;
        row.tokens += s.n;
        if (s.n > 0) {
            ttft.push_back((s.first - s.start) * 1e3);
            first = std::min(first, s.first);
            last = std::max(last, s.last);
            decoded += s.n - 1;
            if (s.n > 1) rates.push_back((s.n - 1) / (s.last - s.first));
        }
        gptoss_session_free(s.session);
    }
    row.agg_tok_s = double(row.tokens) / row.wall_s;
    row.agg_decode_tok_s = last > first ? double(decoded) / (last - first) : 0;
    for (double r : rates) row.stream_decode_tok_s += r / double(rates.size());
    row.ttft_p50_ms = percentile(ttft, 0.50);
    row.ttft_p99_ms = percentile(ttft, 0.99);
    if (model->batcher) {
        uint64_t steps = 0, tokens = 0;
        model->batcher->counters(&steps, &tokens);
        row.mean_batch = steps > steps0 ? double(tokens - tokens0) / double(steps - steps0) : 0;
    } else {
        row.mean_batch = 1;
    }
    return row;
}

// Runs every round and prints the table (or JSON) on stdout. Returns the process exit code.
inline int run(gptoss_model* model, const std::string& what, const std::vector<uint32_t>& counts,
               uint32_t prompt_len, uint32_t gen, bool json) {
    const uint32_t vocab = model->checkpoint->config.vocab;
    const uint32_t cap = model->batcher ? model->batcher->max_sessions() : 1;
    std::vector<Row> rows;
    for (uint32_t n : counts) {
        if (n == 0) continue;
        rows.push_back(run_round(model, n, prompt_len, gen, vocab));
        const Row& r = rows.back();
        std::fprintf(stderr, "concurrency %u: %.1f tok/s aggregate, ttft p50 %.1f ms\n", n, r.agg_tok_s, r.ttft_p50_ms);
    }
    int failures = 0;
    for (const Row& r : rows) failures += r.failures;
    const bool invariant = !model->batcher || model->batcher->invariant();
    if (json) {
        std::printf("{\"model\": \"%s\", \"max_decode_batch\": %u, \"batch_invariant\": %s, \"prompt\": %u, \"gen\": %u, "
                    "\"concurrency\": [\n",
                    what.c_str(), cap, invariant ? "true" : "false", prompt_len, gen);
        for (size_t i = 0; i < rows.size(); i++) {
            const Row& r = rows[i];
            std::printf("  {\"streams\": %u, \"tokens\": %llu, \"wall_s\": %.3f, \"tok_s\": %.2f, \"decode_tok_s\": %.2f, "
                        "\"stream_decode_tok_s\": %.2f, \"ttft_p50_ms\": %.2f, \"ttft_p99_ms\": %.2f, "
                        "\"mean_batch\": %.2f, \"failures\": %d}%s\n",
                        r.streams, (unsigned long long)r.tokens, r.wall_s, r.agg_tok_s, r.agg_decode_tok_s,
                        r.stream_decode_tok_s, r.ttft_p50_ms, r.ttft_p99_ms, r.mean_batch, r.failures,
                        i + 1 < rows.size() ? "," : "");
        }
        std::printf("]}\n");
        return failures == 0 ? 0 : 1;
    }
    std::printf("model: %s   max_decode_batch %u%s   prompt %u tokens, %u generated per stream\n", what.c_str(), cap,
                invariant ? "" : " (batch invariance off)", prompt_len, gen);
    std::printf("\n| streams | tokens | wall s  | tok/s    | decode tok/s | per-stream tok/s | TTFT p50 ms | TTFT p99 ms | mean batch |\n");
    std::printf("|---------|--------|---------|----------|--------------|------------------|-------------|-------------|------------|\n");
    for (const Row& r : rows)
        std::printf("| %7u | %6llu | %7.2f | %8.1f | %12.1f | %16.1f | %11.1f | %11.1f | %10.2f |\n", r.streams,
                    (unsigned long long)r.tokens, r.wall_s, r.agg_tok_s, r.agg_decode_tok_s, r.stream_decode_tok_s,
                    r.ttft_p50_ms, r.ttft_p99_ms, r.mean_batch);
    if (failures) std::printf("%d stream(s) failed\n", failures);
    return failures == 0 ? 0 : 1;
}

}  // namespace bench_concurrency
