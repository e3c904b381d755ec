// tools/gptoss-bench.cpp - llama-bench for gptoss: prompt processing (pp) and token generation
// (tg) throughput of the CUDA backend at chosen context depths, against the hardware ceilings
// measured in the same run (device-to-device copy bandwidth for decode, cuBLASLt bf16 rate for
// prefill). `--synthetic 20b|120b` builds random weights directly in GPU memory (a 120b-shaped
// file does not fit the GPU machine's disk); `--model DIR` loads a checkpoint and reports the
// load rate. Decode bytes per token = every active weight once (attention projections, router,
// 4 experts per layer, lm_head) + the K/V the token attends to, from the config (DEVICE.md).
// Also prints the sampling latency per call (greedy, T=1 top_p=0.9, T=0.7 top_k=40), and with
// --ttft N,... the time to first token of one N-token prompt through gptoss_generate (the public
// path: the engine's chunking, a fresh session each, greedy, max_tokens 1). --concurrency
// N,... runs N streams at once through the public API instead (tools/bench-concurrency.h).
// With --json-schema FILE --tokenizer DIR, two more tg lines at each depth: T=1 sampling without
// and with the schema's token mask (constrained decoding: host mask from tokenizer/grammar-mask.h,
// applied on the device before the sampler; a finished document starts a new one), plus the
// schema's compile time and the mean host time of a mask.
// --devices 0,1 splits the model over those GPUs (gptoss-shard.h, NCCL; --profile shows the first
// GPU's ops, a collective's time including the wait for the others; no --ttft); with
// --no-collectives the split model skips its collectives (timing only: what free communication
// would give).
// the ceilings are the first GPU's, so the decode floor and %-of-floor are one GPU's: its share of the
// split model's bytes (decode_bytes with split = the GPU count).
// --n-cpu-moe N|auto [--gpu-memory SIZE] keeps the experts of the first N layers in host memory
// (issue 16; random host weights with --synthetic); the decode floor is then the GPU part at the
// copy bandwidth plus the host layers' chosen experts at the host-memory streaming-read rate
// measured in the same run with the same threads (cpu::measure_host_read_gbps).
#include "gptoss-internal.h"
#include "gptoss-offload.h"
#include "cpu/host_experts.h"
#include "tools/bench-concurrency.h"
#include "tools/bench-host-moe.h"
#include "tools/cli-args.h"
#include "tokenizer/grammar-mask.h"
#include "tokenizer/json-schema.h"
#include "tokenizer/tokenizer.h"
#ifdef GPTOSS_HAVE_CUDA
#include "cuda/backend.h"
#include "gptoss-shard.h"
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void die(const char* fmt, const char* arg = "") {
    std::fprintf(stderr, "gptoss-bench: ");
    std::fprintf(stderr, fmt, arg);
    std::fprintf(stderr, "\n");
    std::exit(2);
}

void check(gptoss_status s, const char* what) {
    if (s != GPTOSS_OK) {
        std::fprintf(stderr, "gptoss-bench: %s failed: %s\n", what, gptoss_last_error());
        std::exit(1);
    }
}


std::vector<uint32_t> parse_list(const char* s) {
    std::vector<uint32_t> v;
    for (const char* p = s; *p;) {
        char* end = nullptr;
        const unsigned long x = std::strtoul(p, &end, 10);
        if (end == p) die("bad number list \"%s\"", s);
        v.push_back(uint32_t(x));
        p = *end == ',' ? end + 1 : end;
    }
    return v;
}

[[maybe_unused]] gptoss::Config preset(const std::string& name) {
    gptoss::Config c;
    if (name != "20b" && name != "120b") die("--synthetic is \"%s\", expected 20b or 120b", name.c_str());
    const bool big = name == "120b";
    c.n_layers = big ? 36 : 24;
    c.n_experts = big ? 128 : 32;
    c.n_experts_per_token = 4;
    c.hidden = 2880; c.intermediate = 2880; c.n_heads = 64; c.n_kv_heads = 8; c.head_dim = 64;
    c.vocab = 201088; c.sliding_window = 128; c.max_context = 131072;
    c.rope_theta = 150000.0f; c.rope_factor = 32.0f; c.rope_beta_fast = 32.0f; c.rope_beta_slow = 1.0f;
    c.rope_original_max_context = 4096; c.swiglu_limit = 7.0f; c.rms_norm_eps = 1e-5f;
    c.layer_sliding.resize(c.n_layers);
    for (uint32_t l = 0; l < c.n_layers; ++l) c.layer_sliding[l] = l % 2 == 0;
    return c;
}

// Bytes one decoded token must read at context position `pos` (weights + visible K/V).
// split: the model over that many GPUs (gptoss-shard.h): each reads 1/split of the attention
// weights and K/V (heads), of every expert (columns) and of lm_head (vocabulary rows), and the
// whole router; the bytes are one GPU's.
double decode_bytes(const gptoss::Config& c, uint32_t pos, uint32_t split = 1) {
    const double H = c.hidden, I = c.intermediate, E = c.n_experts, K = c.n_experts_per_token;
    const double QD = double(c.n_heads) * c.head_dim, KV = double(c.n_kv_heads) * c.head_dim;
    const double attn = 2.0 * (H * (QD + 2 * KV) + QD * H) + 2.0 * (QD + 2 * KV + H);
    const double router = 2.0 * E * H + 2.0 * E;
    const double expert = (2 * I * H + H * I) * (0.5 + 1.0 / 32) + 2.0 * (2 * I + H);
    const double n = split > 0 ? split : 1;
    double bytes = c.n_layers * ((attn + K * expert) / n + router) + 2.0 * c.vocab * H / n;
    for (uint32_t l = 0; l < c.n_layers; ++l) {
        const double keys = c.layer_sliding[l] ? std::min<double>(pos + 1, c.sliding_window) : pos + 1.0;
        bytes += keys * KV * 2 * 2 / n;
    }
    return bytes;
}

// Bytes of the MXFP4 experts (blocks, scales, biases) one decoded token reads in host memory
// when the first n_host layers keep their experts there.
[[maybe_unused]] double host_decode_bytes(const gptoss::Config& c, uint32_t n_host) {
    const double H = c.hidden, I = c.intermediate, K = c.n_experts_per_token;
    return n_host * K * ((2 * I * H + H * I) * (0.5 + 1.0 / 32) + 2.0 * (2 * I + H));
}

// Tokens per forward when filling the context to a depth: the largest pp size, or 512 when
// only decode is measured (-p 0; a 0-token chunk would never advance).
uint32_t fill_chunk(uint32_t max_pp) { return max_pp ? max_pp : 512u; }

// FLOPs of a prefill of n tokens at depth d (2 per weight per token, attention core, no lm_head
// except for the last token).
double prefill_flops(const gptoss::Config& c, uint32_t d, uint32_t n) {
    const double H = c.hidden, I = c.intermediate, E = c.n_experts, K = c.n_experts_per_token;
    const double QD = double(c.n_heads) * c.head_dim, KV = double(c.n_kv_heads) * c.head_dim;
    const double per_token = c.n_layers * 2.0 * (H * (QD + 2 * KV) + QD * H + E * H + K * 3 * I * H);
    double attn = 0;
    for (uint32_t l = 0; l < c.n_layers; ++l)
        for (uint32_t t = 0; t < n; t += 16) {  // sampled every 16 tokens
            const double keys = c.layer_sliding[l] ? std::min<double>(d + t + 1, c.sliding_window) : d + t + 1.0;
            attn += 16.0 * 4.0 * QD * keys;
        }
    return per_token * n + attn + 2.0 * c.vocab * H;
}

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Result {
    std::string test;
    uint32_t depth, n;
    double ms_per_token, tok_s, gbps, pct_floor, tflops, pct_tc;
};

#ifdef GPTOSS_HAVE_CUDA
// Time to first token of one prompt of each length in `lengths` through gptoss_generate, on a
// model wrapping `backend` (taken over and released with the model). Returns (N, seconds).
std::vector<std::pair<uint32_t, double>> measure_ttft(std::unique_ptr<gptoss::Backend> backend,
                                                      const gptoss::Config& config,
                                                      const std::vector<uint32_t>& lengths, uint32_t max_batch) {
    using namespace gptoss;
    gptoss_model* model = new gptoss_model();
    model->checkpoint = std::make_unique<Checkpoint>();
    model->checkpoint->config = config;
    model->backend = std::move(backend);
    model->name = "synthetic";
    std::vector<std::pair<uint32_t, double>> out;
    Rng rng(7);
    for (uint32_t n : lengths) {
        std::vector<int32_t> prompt(n);
        for (int32_t& t : prompt) t = int32_t(rng.next_u64() % 199998);
        gptoss_session_params sp;
        gptoss_session_params_init(&sp, sizeof sp);
        sp.max_context = std::min(config.max_context, n + 16);
        sp.max_batch = max_batch;
        gptoss_session* session = nullptr;
        check(gptoss_session_create(model, &sp, &session), "creating the time-to-first-token session");
        gptoss_sampling_params s;
        gptoss_sampling_params_init(&s, sizeof s);
        s.temperature = 0.0f;
        s.max_tokens = 1;
        s.seed = 1;
        const gptoss_generate_result* r = nullptr;
        const double t0 = now_ms();
        check(gptoss_generate(session, prompt.data(), prompt.size(), &s, nullptr, nullptr, &r), "time to first token");
        const double sec = (now_ms() - t0) / 1e3;
        std::fprintf(stderr, "ttft %u: %.3f s (%.0f tok/s)\n", n, sec, n / sec);
        out.emplace_back(n, sec);
        gptoss_session_free(session);
    }
    gptoss_model_free(model);
    return out;
}
#endif


// run_cpu's report: JSON, or the model line and the results table.
void print_cpu_report(const std::string& model_dir, const gptoss::Config& config, double load_s,
                      const std::vector<Result>& results, bool json) {
    const unsigned threads = std::thread::hardware_concurrency();
    if (json) {
        std::printf("{\"model\": \"%s\", \"layers\": %u, \"device\": \"cpu\", \"threads\": %u, \"load_s\": %.2f,\n"
                    " \"results\": [\n", model_dir.c_str(), config.n_layers, threads, load_s);
        for (size_t i = 0; i < results.size(); ++i) {
            const Result& r = results[i];
            std::printf("  {\"test\": \"%s\", \"depth\": %u, \"tokens\": %u, \"tok_s\": %.3f, \"ms_per_token\": %.3f, "
                        "\"gbps\": %.3f, \"tflops\": %.4f}%s\n", r.test.c_str(), r.depth, r.n, r.tok_s, r.ms_per_token,
                        r.gbps, r.tflops, i + 1 < results.size() ? "," : "");
        }
        std::printf(" ]\n}\n");
        return;
    }
    std::printf("model: %s (%u layers, hidden %u, %u experts)   device: CPU reference backend, %u hardware threads\n",
                model_dir.c_str(), config.n_layers, config.hidden, config.n_experts, threads);
    std::printf("mapped and checked in %.2f s; no floor is given for the CPU\n", load_s);
    std::printf("\n| test   | depth | tok/s    | ms/token   | GB/s   | TFLOP/s |\n");
    std::printf("|--------|-------|----------|------------|--------|---------|\n");
    for (const Result& r : results)
        std::printf("| %-6s | %5u | %8.2f | %10.2f | %6.2f | %7.4f |\n", r.test.c_str(), r.depth, r.tok_s,
                    r.ms_per_token, r.gbps, r.tflops);
}

// The CPU reference backend on a checkpoint: the same pp/tg loop, no ceilings (a CPU has no
// measured floor here; GB/s is the weight traffic the decode formula implies).
int run_cpu(const std::string& model_dir, const std::vector<uint32_t>& pp, const std::vector<uint32_t>& depths,
            uint32_t tg, uint32_t reps, bool json) {
    using namespace gptoss;
    if (model_dir.empty()) die("--device cpu needs --model DIR (synthetic weights are built on a GPU)");
    std::unique_ptr<Checkpoint> ck;
    std::unique_ptr<Backend> backend;
    const double t0 = now_ms();
    check(load_checkpoint(model_dir, {}, &ck), "loading the checkpoint");
    check(create_cpu_backend(*ck, &backend), "creating the CPU backend");
    const double load_s = (now_ms() - t0) / 1e3;
    const Config& config = ck->config;
    const uint32_t max_pp = *std::max_element(pp.begin(), pp.end());
    const uint32_t fill = fill_chunk(max_pp);
    const uint32_t max_depth = *std::max_element(depths.begin(), depths.end());
    std::unique_ptr<BackendSession> session;
    check(backend->create_session(max_depth + std::max(max_pp, tg) + 16, fill, &session), "creating the session");
    Rng rng(42);
    std::vector<int32_t> tokens(size_t(max_depth) + max_pp + tg + 16);
    for (int32_t& t : tokens) t = int32_t(rng.next_u64() % std::min<uint32_t>(199998, config.vocab));
    std::vector<Result> results;
    const SamplingConfig greedy{0.0f, 1.0f, 0};
    for (uint32_t depth : depths) {
        for (uint32_t pos = 0; pos < depth; pos += fill)
            check(session->forward(tokens.data() + pos, std::min(fill, depth - pos), pos), "filling the context");
        for (uint32_t n : pp) {
            if (n == 0) continue;  // -p 0: decode only
            std::vector<double> t;
            for (uint32_t r = 0; r < reps; ++r) {
                const double start = now_ms();
                check(session->forward(tokens.data() + depth, n, depth), "prefill");
                t.push_back(now_ms() - start);
            }
            const double ms = bench_concurrency::percentile(t, 0.5);
            results.push_back(Result{"pp" + std::to_string(n), depth, n, ms / n, n / (ms / 1e3), 0, 0,
                                     prefill_flops(config, depth, n) / (ms / 1e3) / 1e12, 0});
            std::fprintf(stderr, "%s @ %u: %.2f tok/s\n", results.back().test.c_str(), depth, results.back().tok_s);
        }
        if (tg) {
            std::vector<double> t;
            double bytes = 0;
            for (uint32_t r = 0; r < reps; ++r) {
                int32_t tok = tokens[depth];
                bytes = 0;
                const double start = now_ms();
                for (uint32_t i = 0; i < tg; ++i) {
                    check(session->decode(tok, depth + i), "decode");
                    check(session->sample(greedy, 0.0, &tok), "decode");
                    bytes += decode_bytes(config, depth + i);
                }
                t.push_back(now_ms() - start);
            }
            const double ms = bench_concurrency::percentile(t, 0.5);
            results.push_back(Result{"tg" + std::to_string(tg), depth, tg, ms / tg, tg / (ms / 1e3),
                                     bytes / (ms / 1e3) / 1e9, 0, 0, 0});
            std::fprintf(stderr, "%s @ %u: %.2f tok/s\n", results.back().test.c_str(), depth, results.back().tok_s);
        }
    }
    print_cpu_report(model_dir, config, load_s, results, json);
    return 0;
}

// --concurrency: a model from --model DIR (gptoss_load on `device`) or, on a GPU, --synthetic
// weights wrapped in a model; its decode batch cap is `decode_batch` (0: the largest count), its
// batch invariance `batch_invariant` (gptoss_model_params.batch_invariant).
int run_concurrency(const std::string& model_dir, const std::string& synthetic, int32_t device, uint32_t layers,
                    const std::vector<uint32_t>& counts, uint32_t decode_batch, int32_t batch_invariant,
                    uint32_t prompt_len, uint32_t gen, bool json) {
    using namespace gptoss;
    const uint32_t cap = decode_batch ? decode_batch : *std::max_element(counts.begin(), counts.end());
    gptoss_model* model = nullptr;
    if (!model_dir.empty()) {
        gptoss_model_params mp;
        gptoss_model_params_init(&mp, sizeof mp);
        mp.device = device;
        mp.max_decode_batch = cap;
        mp.batch_invariant = batch_invariant;
        check(gptoss_load(model_dir.c_str(), &mp, &model), "loading the model");
    } else {
#ifdef GPTOSS_HAVE_CUDA
        Config config = preset(synthetic);
        if (layers) {
            config.n_layers = layers;
            config.layer_sliding.resize(layers);
        }
        std::unique_ptr<Backend> backend;
        check(cuda::create_synthetic_backend(config, device, 1, &backend), "building the synthetic model");
        model = new gptoss_model();
        model->checkpoint = std::make_unique<Checkpoint>();
        model->checkpoint->config = config;
        model->backend = std::move(backend);
        model->name = "synthetic";
        bool invariant = true;
        check(resolve_batch_invariant(batch_invariant, &invariant), "--batch-invariant");
        if (cap > 1) model->batcher.reset(new DecodeBatcher(*model->backend, cap, invariant));
#else
        (void)layers;
        die("--synthetic needs the CUDA backend");
#endif
    }
    const int rc = bench_concurrency::run(model, model_dir.empty() ? "synthetic " + synthetic : model_dir, counts,
                                          prompt_len, gen, json);
    gptoss_model_free(model);
    return rc;
}

}  // namespace

// Constrained decoding cost: tg tokens at T=1 from `depth`, unconstrained (mask == false) or
// under the schema (a document that completes is followed by <|return|>, then a new document).
struct SchemaBench {
    const gptoss::Tokenizer* tokenizer = nullptr;
    std::shared_ptr<const gptoss::schema::Grammar> grammar;
    std::shared_ptr<const gptoss::schema::TokenTable> table;
    double compile_ms = 0, table_ms = 0, mask_ms = 0;
    uint64_t masks = 0, hits = 0, documents = 0;
};

double run_tg_t1(gptoss::BackendSession& session, int32_t first, uint32_t depth, uint32_t tg, SchemaBench* sb,
                 bool mask) {
    using namespace gptoss;
    const SamplingConfig t1{1.0f, 1.0f, 0};
    Rng rng(7);
    std::unique_ptr<schema::Matcher> m;
    std::unique_ptr<schema::MaskCache> cache;
    if (mask) cache = std::make_unique<schema::MaskCache>(sb->grammar, sb->table);
    std::vector<uint32_t> bits(sb ? sb->table->n_words() : 0);
    int32_t tok = first;
    const auto now = [] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
    const double t0 = now();
    for (uint32_t i = 0; i < tg; ++i) {
        check(session.decode(tok, depth + i), "decode");
        if (!mask) {
            check(session.sample(t1, rng.next_double(), &tok), "decode");
            continue;
        }
        if (!m) m = std::make_unique<schema::Matcher>(sb->grammar);
        const double m0 = now();
        cache->mask(m->state(), bits.data());
        if (m->can_finish()) bits[200002 / 32] |= 1u << (200002 % 32);
        sb->mask_ms += now() - m0;
        sb->masks++;
        check(session.sample_masked(t1, rng.next_double(), bits.data(), &tok), "decode");
        if (tok == 200002) {
            m.reset();
            sb->documents++;
        } else {
            (void)m->advance(sb->tokenizer->token_bytes(tok));
        }
    }
    const double ms = now() - t0;
    if (cache) sb->hits += cache->hits();
    return ms;
}

SchemaBench load_schema_bench(const std::string& schema_file, const std::string& tokenizer_dir,
                              std::unique_ptr<gptoss::Tokenizer>* tokenizer) {
    using namespace gptoss;
    SchemaBench sb;
    FILE* f = std::fopen(schema_file.c_str(), "rb");
    if (!f) die("cannot open --json-schema %s", schema_file.c_str());
    std::string text;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    std::fclose(f);
    check(Tokenizer::load_hf_json(tokenizer_dir + "/tokenizer.json", tokenizer), "loading the tokenizer");
    sb.tokenizer = tokenizer->get();
    auto t0 = std::chrono::steady_clock::now();
    const int n = 100;
    for (int i = 0; i < n; ++i) check(schema::compile(text, schema_file, &sb.grammar), "compiling the schema");
    sb.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / n;
    t0 = std::chrono::steady_clock::now();
    sb.table = schema::TokenTable::get(**tokenizer);
    sb.table_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return sb;
}

namespace {

// Everything main reads from the command line (see print_usage).
struct BenchArgs {
    std::string model_dir, synthetic, schema_file, tokenizer_dir, host_moe, host_moe_sweep;
    int32_t device = 0;
    std::vector<int32_t> devices;  // --devices: two or more split the model
    std::vector<uint32_t> pp{512, 2048}, depths{0, 8192};
    std::vector<uint32_t> ttft, concurrency;
    uint32_t ttft_max_batch = 0;  // --max-batch: the --ttft sessions' max_batch (0: the library's default)
    uint32_t decode_batch = 0;
    int32_t batch_invariant = 0;  // --batch-invariant on|off (0: the library's default)
    uint32_t tg = 128, reps = 3, layers = 0;
    bool json = false, profile = false, gemm_probe = true, no_collectives = false;
    bool decode_gap = false;  // --decode-gap: "tgN plain|pipelined" and "tgN nosync" rows (bench_decode_gap)
    gptoss::OffloadRequest offload;  // --n-cpu-moe, --gpu-memory
};

void print_usage() {
    std::printf(
        "usage: gptoss-bench (--model DIR | --synthetic 20b|120b) [--device N|cpu] [--devices 0,1] [-p 512,2048] [-n 128]\n"
        "                    [-d 0,8192] [-r REPS] [--layers N] [--ttft 8192,32768,131000 [--max-batch N]] [--profile] [--json]\n"
        "                    [--no-gemm-probe] [--decode-gap] [--json-schema FILE --tokenizer DIR] [--no-collectives]\n"
        "                    [--concurrency 1,8,32,64 [--decode-batch N] [--batch-invariant on|off]]\n"
        "                    [--n-cpu-moe N|auto [--gpu-memory 24G]]\n"
        "       gptoss-bench --host-moe 20b|120b [--json]   (CPU only: host MXFP4 experts vs the host read floor)\n"
        "       gptoss-bench --host-moe-sweep 20b|120b      (CPU only: the host experts' splits, prefetch, pages, pool sizes)\n"
        "Prints pp (prefill) and tg (decode) throughput at each context depth, with GB/s and %% of the\n"
        "bandwidth floor (decode) or TFLOP/s and %% of the measured bf16 tensor-core rate (prefill).\n"
        "--concurrency: N streams at once through gptoss_generate (prompt -p's first value, -n tokens\n"
        "each), decode steps batched up to --decode-batch sessions (default the largest N; 1 = off);\n"
        "--batch-invariant off: a step of one stream runs its one-token decode path (gptoss.h).\n"
        "--max-batch: prompt tokens per forward of the --ttft sessions (default: the library's choice).\n"
        "tg rows run the decode loop gptoss_generate takes (pipelined on one GPU; GPTOSS_DECODE_PIPELINE=0/1).\n"
        "--decode-gap (GPU): after each tg row a \"tgN plain\" (or \"tgN pipelined\") row, the other decode\n"
        "loop, and a \"tgN nosync\" row, the same steps with no sampling between them: what the host round\n"
        "trip between two decode steps still costs is the difference.\n");
}

BenchArgs parse_args(int argc, char** argv) {
    BenchArgs b;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> const char* {
            if (i + 1 >= argc) die("%s needs a value", a.c_str());
            return argv[++i];
        };
        if (a == "--model" || a == "-m") b.model_dir = value();
        else if (a == "--synthetic") b.synthetic = value();
        else if (a == "--device") {
            const std::string d = value();
            b.device = d == "cpu" ? GPTOSS_DEVICE_CPU : int32_t(std::atoi(d.c_str()));
        }
        else if (a == "--no-collectives") b.no_collectives = true;
        else if (a == "--devices") {
            for (uint32_t d : parse_list(value())) b.devices.push_back(int32_t(d));
            if (!b.devices.empty()) b.device = b.devices[0];
        }
        else if (a == "-p" || a == "--prompt") b.pp = parse_list(value());
        else if (a == "-n" || a == "--gen") b.tg = uint32_t(std::atoi(value()));
        else if (a == "-d" || a == "--depth") b.depths = parse_list(value());
        else if (a == "-r" || a == "--reps") b.reps = uint32_t(std::max(1, std::atoi(value())));
        else if (a == "--layers") b.layers = uint32_t(std::atoi(value()));
        else if (a == "--ttft") b.ttft = parse_list(value());
        else if (a == "--max-batch") b.ttft_max_batch = uint32_t(std::atoi(value()));
        else if (a == "--concurrency") b.concurrency = parse_list(value());
        else if (a == "--decode-batch") b.decode_batch = uint32_t(std::atoi(value()));
        else if (a == "--batch-invariant") {
            const std::string v = value();
            if (!gptoss::cli::parse_batch_invariant(v, &b.batch_invariant))
                die("--batch-invariant: expected on or off, found \"%s\"", v.c_str());
        }
        else if (a == "--json") b.json = true;
        else if (a == "--profile") b.profile = true;
        else if (a == "--no-gemm-probe") b.gemm_probe = false;
        else if (a == "--decode-gap") b.decode_gap = true;
        else if (a == "--json-schema") b.schema_file = value();
        else if (a == "--tokenizer") b.tokenizer_dir = value();
        else if (a == "--host-moe") b.host_moe = value();  // CPU experts of issue 16 (tools/bench-host-moe.h)
        else if (a == "--host-moe-sweep") b.host_moe_sweep = value();
        else if (a == "--n-cpu-moe") {
            if (!gptoss::cli::parse_cpu_moe(value(), &b.offload.n_cpu_moe)) die("--n-cpu-moe: expected N or auto");
        }
        else if (a == "--gpu-memory") {
            if (!gptoss::cli::parse_bytes(value(), &b.offload.gpu_memory_budget)) die("--gpu-memory: expected e.g. 24G");
        }
        else if (a == "-h" || a == "--help") {
            print_usage();
            std::exit(0);
        } else die("unknown option %s (see --help)", a.c_str());
    }
    return b;
}

#ifdef GPTOSS_HAVE_CUDA
// The model under test: synthetic weights built on the device(s), or a checkpoint uploaded.
struct BenchModel {
    std::unique_ptr<gptoss::Checkpoint> ck;
    std::unique_ptr<gptoss::Backend> backend;
    gptoss::Config config;
    double load_s = 0, load_gb = 0;  // load_gb 0: synthetic
};

BenchModel load_bench_model(const BenchArgs& a, const gptoss::OffloadRequest& offload) {
    using namespace gptoss;
    BenchModel m;
    const bool offloading = offload.n_cpu_moe != 0 || offload.gpu_memory_budget != 0;
    const bool split = a.devices.size() > 1;
    if (!a.synthetic.empty()) {
        m.config = preset(a.synthetic);
        if (a.layers) {
            m.config.n_layers = a.layers;
            m.config.layer_sliding.resize(a.layers);
        }
        const double t0 = now_ms();
        if (split)
            check(cuda::create_sharded_synthetic_backend(m.config, a.devices.data(), a.devices.size(), 1, &m.backend),
                  "building the synthetic model over several GPUs");
        else if (offloading)
            check(cuda::create_synthetic_backend(m.config, a.device, 1, offload, &m.backend),
                  "building the synthetic model");
        else
            check(cuda::create_synthetic_backend(m.config, a.device, 1, &m.backend), "building the synthetic model");
        m.load_s = (now_ms() - t0) / 1e3;
        return m;
    }
    const double t0 = now_ms();
    check(load_checkpoint(a.model_dir, {}, &m.ck), "loading the checkpoint");
    const double t1 = now_ms();
    if (split)
        check(create_sharded_cuda_backend(*m.ck, a.devices.data(), a.devices.size(), {}, &m.backend),
              "uploading the weights to several GPUs");
    else if (offloading)
        check(create_cuda_backend(*m.ck, a.device, offload, {}, &m.backend), "uploading the weights");
    else
        check(create_cuda_backend(*m.ck, a.device, {}, &m.backend), "uploading the weights");
    m.load_s = (now_ms() - t1) / 1e3;
    m.load_gb = double(m.ck->total_bytes) / 1e9;
    m.config = m.ck->config;
    std::fprintf(stderr, "mapped in %.2f s; uploaded %.2f GB in %.2f s (%.2f GB/s)\n", (t1 - t0) / 1e3, m.load_gb,
                 m.load_s, m.load_gb / m.load_s);
    return m;
}

using OpTimes = std::vector<std::pair<std::string, double>>;

// Everything one run measured, for the text or JSON report.
struct Report {
    std::string what;
    gptoss::Config config;
    gptoss::cuda::DeviceCeilings ceil;
    double load_s = 0, load_gb = 0;
    uint32_t n_host = 0;  // layers whose experts are in host memory
    uint32_t split = 1;   // GPUs the model is split over (--devices): floors are one GPU's share
    double host_gbps = 0, host_weight_gb = 0, weight_gb = 0;
    std::vector<Result> results;
    OpTimes sample_us;
    std::vector<std::pair<uint32_t, double>> ttft_s;
    std::vector<std::pair<std::string, OpTimes>> profiles;
};

void add_result(Report* rep, const Result& res) {
    std::fprintf(stderr, "%s @ %u: %.1f tok/s\n", res.test.c_str(), res.depth, res.tok_s);
    rep->results.push_back(res);
}

// pp lines at `depth` (the context already filled): the median of reps forwards after a warm-up.
void bench_prefill(gptoss::BackendSession& session, const std::vector<int32_t>& tokens, uint32_t depth,
                   const BenchArgs& a, Report* rep) {
    for (uint32_t n : a.pp) {
        if (n == 0) continue;  // -p 0: decode only
        std::vector<double> t;
        for (uint32_t r = 0; r <= a.reps; ++r) {  // first run is the warm-up
            const double t0 = now_ms();
            check(session.forward(tokens.data() + depth, n, depth), "prefill");
            check(gptoss::cuda::synchronize(&session), "prefill");
            if (r) t.push_back(now_ms() - t0);
        }
        const double ms = bench_concurrency::percentile(t, 0.5);
        Result res{"pp" + std::to_string(n), depth, n, ms / n, n / (ms / 1e3), 0, 0, 0, 0};
        res.tflops = prefill_flops(rep->config, depth, n) / (ms / 1e3) / 1e12;
        res.pct_tc = rep->ceil.bf16_tflops > 0 ? 100.0 * res.tflops / rep->ceil.bf16_tflops : 0;
        add_result(rep, res);
    }
}

// Whether gptoss_generate takes the pipelined decode loop on this session
// (GPTOSS_DECODE_PIPELINE if set, else the backend's choice; gptoss-decode-pipeline.cpp).
bool decode_pipelined(const gptoss::BackendSession& session) {
    int v = -1;
    check(gptoss::resolve_decode_pipeline(&v), "reading GPTOSS_DECODE_PIPELINE");
    return v >= 0 ? v == 1 : session.pipelines_decode();
}

// tg greedy decode steps from `first` at `depth`, as gptoss_generate runs them: pipelined (each
// sampled token fed to the next step on the device and read after that step is enqueued) or
// plain (sample, wait, decode). Wall ms, until the last token is on the host.
double run_tg(gptoss::BackendSession& session, int32_t first, uint32_t depth, uint32_t tg, bool pipelined) {
    const gptoss::SamplingConfig greedy{0.0f, 1.0f, 0};
    int32_t tok = first;
    const double t0 = now_ms();
    if (!pipelined) {
        for (uint32_t i = 0; i < tg; ++i) {
            check(session.decode(tok, depth + i), "decode");
            check(session.sample(greedy, 0.0, &tok), "decode");
        }
        return now_ms() - t0;
    }
    check(session.decode(tok, depth), "decode");
    check(session.sample_ahead(greedy, 0.0, nullptr), "decode");
    for (uint32_t i = 1; i < tg; ++i) {
        check(session.decode_sampled(depth + i), "decode");
        check(session.fetch_sampled(&tok), "decode");
        check(session.sample_ahead(greedy, 0.0, nullptr), "decode");
    }
    check(session.fetch_sampled(&tok), "decode");
    return now_ms() - t0;
}

// The tg line at `depth` (greedy, GPU sampling, the decode graph, the loop gptoss_generate
// takes), against the bandwidth floor; with a schema, the T=1 lines without and with its mask.
void bench_decode(gptoss::BackendSession& session, const std::vector<int32_t>& tokens, uint32_t depth,
                  const BenchArgs& a, SchemaBench* sb, Report* rep) {
    const gptoss::SamplingConfig greedy{0.0f, 1.0f, 0};
    const uint32_t tg = a.tg;
    int32_t tok = tokens[depth];
    check(session.decode(tok, depth), "decode warm-up");  // captures the graph
    check(session.sample(greedy, 0.0, &tok), "decode warm-up");
    const bool pipelined = decode_pipelined(session);
    std::vector<double> t;
    double bytes = 0;
    for (uint32_t i = 0; i < tg; ++i) bytes += decode_bytes(rep->config, depth + i, rep->split);
    for (uint32_t r = 0; r < a.reps; ++r) t.push_back(run_tg(session, tokens[depth], depth, tg, pipelined));
    const double ms = bench_concurrency::percentile(t, 0.5);
    Result res{"tg" + std::to_string(tg), depth, tg, ms / tg, tg / (ms / 1e3), 0, 0, 0, 0};
    res.gbps = bytes / (ms / 1e3) / 1e9;
    res.pct_floor = 100.0 * res.gbps / rep->ceil.copy_gbps;
    if (rep->n_host > 0) {  // the floor: the GPU part at the copy rate + the host part at the host read rate
        const double hb = host_decode_bytes(rep->config, rep->n_host) * tg;
        const double floor_ms = ((bytes - hb) / (rep->ceil.copy_gbps * 1e9) + hb / (rep->host_gbps * 1e9)) * 1e3;
        res.pct_floor = 100.0 * floor_ms / ms;
    }
    add_result(rep, res);
    if (!sb->grammar) return;
    for (bool mask : {false, true}) {
        std::vector<double> tm;
        for (uint32_t r = 0; r < a.reps; ++r) tm.push_back(run_tg_t1(session, tokens[depth], depth, tg, sb, mask));
        const double msm = bench_concurrency::percentile(tm, 0.5);
        add_result(rep, Result{"tg" + std::to_string(tg) + (mask ? " T=1 json" : " T=1"), depth, tg, msm / tg,
                               tg / (msm / 1e3), 0, 0, 0, 0});
    }
}

// --decode-gap: the tg loop again with no sample() between the steps (the same token fed at every
// position, one sample at the end to wait), so the GPU runs the decode steps back to back. Its
// ms per token against the tg row's is what the host round trip between two steps still costs
// (the sampler, the hand-over of the token, the host's work and the next step's launch). Row
// "tgN nosync"; diagnostic only (the K/V it writes is of no real sequence). Then the tg loop
// the tg row did not take: "tgN plain" (sample, wait, decode) after a pipelined tg row, else
// "tgN pipelined" (gptoss-decode-pipeline.cpp), the A/B of the pipelined loop in one run.
void bench_decode_gap(gptoss::BackendSession& session, const std::vector<int32_t>& tokens, uint32_t depth,
                      const BenchArgs& a, Report* rep) {
    const gptoss::SamplingConfig greedy{0.0f, 1.0f, 0};
    const bool other = !decode_pipelined(session);
    std::vector<double> other_t;
    for (uint32_t r = 0; r < a.reps; ++r) other_t.push_back(run_tg(session, tokens[depth], depth, a.tg, other));
    const double other_ms = bench_concurrency::percentile(other_t, 0.5);
    add_result(rep, Result{"tg" + std::to_string(a.tg) + (other ? " pipelined" : " plain"), depth, a.tg,
                           other_ms / a.tg, a.tg / (other_ms / 1e3), 0, 0, 0, 0});
    std::vector<double> t;
    for (uint32_t r = 0; r < a.reps; ++r) {
        int32_t tok = tokens[depth];
        const double t0 = now_ms();
        for (uint32_t i = 0; i < a.tg; ++i) check(session.decode(tok, depth + i), "decode");
        check(session.sample(greedy, 0.0, &tok), "decode");
        t.push_back(now_ms() - t0);
    }
    const double ms = bench_concurrency::percentile(t, 0.5);
    add_result(rep, Result{"tg" + std::to_string(a.tg) + " nosync", depth, a.tg, ms / a.tg, a.tg / (ms / 1e3), 0, 0,
                           0, 0});
}

// Sampling latency per call on the last logits (host-timed: launches + the 4-byte copy).
OpTimes sampling_latency(gptoss::BackendSession& session) {
    using gptoss::SamplingConfig;
    OpTimes out;
    for (const auto& [name, cfg] : std::vector<std::pair<std::string, SamplingConfig>>{
             {"greedy", {0.0f, 1.0f, 0}}, {"T=1 top_p=0.9", {1.0f, 0.9f, 0}}, {"T=0.7 top_k=40", {0.7f, 1.0f, 40}}}) {
        int32_t tok = 0;
        check(session.sample(cfg, 0.5, &tok), "sampling warm-up");
        const int n = 200;
        const double t0 = now_ms();
        for (int i = 0; i < n; ++i) check(session.sample(cfg, (i + 0.5) / n, &tok), "sampling");
        out.emplace_back(name, (now_ms() - t0) * 1e3 / n);
    }
    return out;
}

// --profile: un-graphed per-op times of a decode step at depth 0 and the deepest depth, and of
// the largest prefill at 0 and at the deepest depth.
std::vector<std::pair<std::string, OpTimes>> collect_profiles(gptoss::BackendSession& session,
                                                              const std::vector<int32_t>& tokens, uint32_t max_pp,
                                                              uint32_t max_depth) {
    using gptoss::cuda::profile_forward;
    std::vector<std::pair<std::string, OpTimes>> profiles;
    for (uint32_t depth : {0u, max_depth}) {
        OpTimes ops;
        int32_t tok = tokens[0];
        check(profile_forward(&session, &tok, 1, depth, true, &ops), "profiling decode");
        profiles.emplace_back("decode @" + std::to_string(depth), ops);
    }
    if (!max_pp) return profiles;
    OpTimes ops;
    check(profile_forward(&session, tokens.data(), max_pp, 0, false, &ops), "profiling prefill");
    profiles.emplace_back("prefill " + std::to_string(max_pp) + " @0", ops);
    if (max_depth > 0) {  // attention's share grows with depth
        ops.clear();
        check(profile_forward(&session, tokens.data(), max_pp, max_depth, false, &ops), "profiling prefill at depth");
        profiles.emplace_back("prefill " + std::to_string(max_pp) + " @" + std::to_string(max_depth), ops);
    }
    return profiles;
}

void print_json(const Report& r) {
    const auto& c = r.ceil;
    std::printf("{\"model\": \"%s\", \"layers\": %u, \"device\": \"%s\", \"sm_count\": %d, \"memory_gib\": %.1f,\n",
                r.what.c_str(), r.config.n_layers, c.name.c_str(), c.sm_count, c.memory_gib);
    std::printf(" \"copy_gbps\": %.1f, \"read_gbps\": %.1f, \"bf16_tflops\": %.1f, \"load_s\": %.2f, \"load_gb\": %.2f,\n",
                c.copy_gbps, c.read_gbps, c.bf16_tflops, r.load_s, r.load_gb);
    std::printf(" \"decode_bytes_per_token_at_0\": %.0f,\n \"sample_us\": {", decode_bytes(r.config, 0, r.split));
    for (size_t i = 0; i < r.sample_us.size(); ++i)
        std::printf("%s\"%s\": %.1f", i ? ", " : "", r.sample_us[i].first.c_str(), r.sample_us[i].second);
    std::printf("},\n \"results\": [\n");
    for (size_t i = 0; i < r.results.size(); ++i) {
        const Result& x = r.results[i];
        std::printf("  {\"test\": \"%s\", \"depth\": %u, \"tokens\": %u, \"tok_s\": %.1f, \"ms_per_token\": %.4f, "
                    "\"gbps\": %.1f, \"pct_floor\": %.1f, \"tflops\": %.1f, \"pct_tensor_core\": %.1f}%s\n",
                    x.test.c_str(), x.depth, x.n, x.tok_s, x.ms_per_token, x.gbps, x.pct_floor, x.tflops, x.pct_tc,
                    i + 1 < r.results.size() ? "," : "");
    }
    std::printf(" ],\n \"ttft_s\": {");
    for (size_t i = 0; i < r.ttft_s.size(); ++i)
        std::printf("%s\"%u\": %.4f", i ? ", " : "", r.ttft_s[i].first, r.ttft_s[i].second);
    std::printf("},\n \"profile_ms\": {");
    for (size_t p = 0; p < r.profiles.size(); ++p) {
        std::printf("%s\n  \"%s\": {", p ? "," : "", r.profiles[p].first.c_str());
        for (size_t i = 0; i < r.profiles[p].second.size(); ++i)
            std::printf("%s\"%s\": %.4f", i ? ", " : "", r.profiles[p].second[i].first.c_str(),
                        r.profiles[p].second[i].second);
        std::printf("}");
    }
    std::printf("}\n}\n");
}

// The text report's head: the model, the ceilings and the decode floor, the load, the schema.
void print_text_head(const Report& r, const std::string& schema_file, const SchemaBench& sb) {
    const auto& c = r.ceil;
    std::printf("model: %s (%u layers)   device: %s, %d SMs, %.1f GiB\n", r.what.c_str(), r.config.n_layers,
                c.name.c_str(), c.sm_count, c.memory_gib);
    std::printf("ceilings: D2D copy %.0f GB/s, streaming read %.0f GB/s, cuBLASLt bf16 %.0f TFLOP/s\n", c.copy_gbps,
                c.read_gbps, c.bf16_tflops);
    const double bytes0 = decode_bytes(r.config, 0, r.split), floor_ms = bytes0 / (c.copy_gbps * 1e9) * 1e3;
    std::printf("decode floor at depth 0: %.3f GB/token%s / %.0f GB/s = %.3f ms/token = %.0f tok/s\n", bytes0 / 1e9,
                r.split > 1 ? " per GPU (its share of the split model)" : "", c.copy_gbps, floor_ms, 1e3 / floor_ms);
    if (r.n_host > 0) {
        const double hb = host_decode_bytes(r.config, r.n_host);
        const double off_ms = ((bytes0 - hb) / (c.copy_gbps * 1e9) + hb / (r.host_gbps * 1e9)) * 1e3;
        std::printf("experts of %u of %u layers in host memory (%.2f GB; device weights %.2f GB): host streaming read "
                    "%.1f GB/s (%u hardware threads); decode floor %.3f GB/token on the GPU + %.3f GB/token from host "
                    "memory = %.3f ms/token = %.1f tok/s (%% floor of tg lines is against this)\n",
                    r.n_host, r.config.n_layers, r.host_weight_gb, r.weight_gb, r.host_gbps,
                    std::thread::hardware_concurrency(), (bytes0 - hb) / 1e9, hb / 1e9, off_ms, 1e3 / off_ms);
    }
    if (r.load_gb > 0) std::printf("load: %.2f GB in %.2f s = %.2f GB/s\n", r.load_gb, r.load_s, r.load_gb / r.load_s);
    else std::printf("synthetic weights built on the device in %.2f s\n", r.load_s);
    if (sb.grammar)
        std::printf("json schema %s: compile %.3f ms, token table %.0f ms (once per tokenizer), mask %.1f µs mean "
                    "(host; %llu masks, %llu cache hits, %llu documents)\n",
                    schema_file.c_str(), sb.compile_ms, sb.table_ms, sb.masks ? sb.mask_ms * 1e3 / sb.masks : 0.0,
                    (unsigned long long)sb.masks, (unsigned long long)sb.hits, (unsigned long long)sb.documents);
}

// The rest: sampling latency, the results table, time to first token, the profiles.
void print_text_body(const Report& r) {
    std::printf("sampling, µs per call:");
    for (const auto& [name, us] : r.sample_us) std::printf("  %s %.1f", name.c_str(), us);
    std::printf("\n");
    std::printf("\n| test   | depth | tok/s    | ms/token | GB/s   | %% floor | TFLOP/s | %% bf16 TC |\n");
    std::printf("|--------|-------|----------|----------|--------|---------|---------|-----------|\n");
    for (const Result& x : r.results)
        std::printf("| %-6s | %5u | %8.1f | %8.4f | %6.0f | %7.1f | %7.1f | %9.1f |\n", x.test.c_str(), x.depth,
                    x.tok_s, x.ms_per_token, x.gbps, x.pct_floor, x.tflops, x.pct_tc);
    for (const auto& [n, sec] : r.ttft_s)
        std::printf("time to first token, %u-token prompt (gptoss_generate, fresh session): %.3f s = %.0f tok/s\n", n,
                    sec, n / sec);
    for (const auto& [name, ops] : r.profiles) {
        double total = 0;
        for (const auto& o : ops) total += o.second;
        std::printf("\nper-op time, %s (un-graphed, summed over layers): %.3f ms\n", name.c_str(), total);
        for (const auto& o : ops) std::printf("  %-24s %8.4f ms  %5.1f%%\n", o.first.c_str(), o.second, 100 * o.second / total);
    }
}

// The pp / tg run on one or several GPUs (everything but --concurrency, --device cpu and the
// host-experts benches).
int run_gpu(const BenchArgs& a) {
    using namespace gptoss;
    if (a.no_collectives) {
        std::fprintf(stderr, "--no-collectives: the split model skips its all-reduces (timing only, wrong results)\n");
        cuda::debug_skip_collectives(true);
    }
    Report rep;
    rep.split = uint32_t(std::max<size_t>(a.devices.size(), 1));
    check(cuda::measure_ceilings(a.device, a.gemm_probe, &rep.ceil), "measuring the device ceilings");
    OffloadRequest offload = a.offload;
    if ((offload.n_cpu_moe != 0 || offload.gpu_memory_budget != 0) && a.devices.size() > 1)
        die("--n-cpu-moe / --gpu-memory take one GPU");
    const uint32_t max_pp = *std::max_element(a.pp.begin(), a.pp.end());
    const uint32_t fill = fill_chunk(max_pp);
    const uint32_t max_depth = *std::max_element(a.depths.begin(), a.depths.end());
    const uint32_t max_context = max_depth + std::max(max_pp, a.tg) + 16;
    offload.fit_context = max_context;  // the session below
    BenchModel m = load_bench_model(a, offload);
    rep.config = m.config;
    rep.load_s = m.load_s;
    rep.load_gb = m.load_gb;
    // Experts in host memory: the host's streaming-read rate with the same threads, for the floor.
    rep.n_host = m.backend->n_cpu_moe();
    rep.host_gbps = rep.n_host ? cpu::measure_host_read_gbps(size_t(4) << 30) : 0.0;
    rep.host_weight_gb = double(m.backend->host_weight_bytes()) / 1e9;
    rep.weight_gb = double(m.backend->weight_bytes()) / 1e9;
    std::unique_ptr<BackendSession> session;
    check(m.backend->create_session(max_context, fill, &session), "creating the session");

    Rng rng(42);
    std::vector<int32_t> tokens(size_t(max_depth) + max_pp + a.tg + 16);
    for (int32_t& t : tokens) t = int32_t(rng.next_u64() % 199998);
    std::unique_ptr<Tokenizer> schema_tokenizer;
    SchemaBench sb;
    if (!a.schema_file.empty()) sb = load_schema_bench(a.schema_file, a.tokenizer_dir, &schema_tokenizer);
    for (uint32_t depth : a.depths) {
        for (uint32_t pos = 0; pos < depth; pos += fill)
            check(session->forward(tokens.data() + pos, std::min(fill, depth - pos), pos), "filling the context");
        check(cuda::synchronize(session.get()), "filling the context");
        bench_prefill(*session, tokens, depth, a, &rep);
        if (a.tg) bench_decode(*session, tokens, depth, a, &sb, &rep);
        if (a.tg && a.decode_gap) bench_decode_gap(*session, tokens, depth, a, &rep);
    }
    rep.sample_us = sampling_latency(*session);
    if (a.profile) rep.profiles = collect_profiles(*session, tokens, max_pp, max_depth);
    session.reset();
    if (!a.ttft.empty() && a.devices.size() <= 1)
        rep.ttft_s = measure_ttft(std::move(m.backend), rep.config, a.ttft, a.ttft_max_batch);

    rep.what = a.synthetic.empty() ? a.model_dir : "synthetic " + a.synthetic;
    if (a.devices.size() > 1) rep.what += " split over " + std::to_string(a.devices.size()) + " GPUs";
    if (a.json) {
        print_json(rep);
        return 0;
    }
    print_text_head(rep, a.schema_file, sb);
    print_text_body(rep);
    return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
    const BenchArgs a = parse_args(argc, argv);
    if (!a.host_moe.empty()) return run_host_moe(a.host_moe, a.json);
    if (!a.host_moe_sweep.empty()) return run_host_moe_sweep(a.host_moe_sweep);
    if (a.model_dir.empty() == a.synthetic.empty()) die("give exactly one of --model DIR and --synthetic 20b|120b");
    if (a.schema_file.empty() != a.tokenizer_dir.empty()) die("--json-schema and --tokenizer go together");
    if (!a.concurrency.empty())
        return run_concurrency(a.model_dir, a.synthetic, a.device, a.layers, a.concurrency, a.decode_batch,
                               a.batch_invariant, a.pp.empty() ? 512 : a.pp[0], a.tg, a.json);
    if (a.device == GPTOSS_DEVICE_CPU && a.decode_gap)
        die("--decode-gap needs a GPU (the CPU decodes in the host's thread)");
    if (a.device == GPTOSS_DEVICE_CPU) return run_cpu(a.model_dir, a.pp, a.depths, a.tg, a.reps, a.json);
#ifndef GPTOSS_HAVE_CUDA
    (void)&run_tg_t1; (void)&load_schema_bench;
    die("this build has no CUDA backend (configure with nvcc available)");
#else
    return run_gpu(a);
#endif
}
