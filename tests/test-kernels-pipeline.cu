// tests/test-kernels-pipeline.cu - the pipelined decode loop on the GPU (gptoss-decode-pipeline.cpp,
// cuda/decode_feed.h): the CUDA session takes it by default on one GPU, and it gives exactly the
// plain loop's results: the backend protocol (sample_ahead / decode_sampled / fetch_sampled)
// against decode + sample, logits bit for bit, greedy and sampled, including a decode_sampled at
// a position the feed did not write (the step uploaded from the host); and gptoss_generate with
// GPTOSS_DECODE_PIPELINE=0 against the default over calls that stop every way on reused sessions
// (tokens, stop reasons, reused prefix), and reused == fresh after a stop token's step wrote past
// the end; and constrained calls (json_schema, a required tool call) the same way. The engine loop's own logic is tested on the CPU (tests/test-decode-pipeline.cpp).
#include "tests/kernel-test-util.cuh"

#include <cstdlib>
#include <cstring>

namespace {

gptoss_model* load_gpu(const char* pipeline) {
    if (pipeline) setenv("GPTOSS_DECODE_PIPELINE", pipeline, 1);
    else unsetenv("GPTOSS_DECODE_PIPELINE");
    gptoss_model_params params = gptoss_model_default_params();
    params.device = 0;
    gptoss_model* model = nullptr;
    const gptoss_status status = gptoss_load(tiny_dir(), &params, &model);
    unsetenv("GPTOSS_DECODE_PIPELINE");
    INFO(gptoss_last_error());
    REQUIRE(status == GPTOSS_OK);
    return model;
}

gptoss_session* new_session(gptoss_model* model) {
    gptoss_session* s = nullptr;
    REQUIRE(gptoss_session_create(model, nullptr, &s) == GPTOSS_OK);
    return s;
}

std::vector<float> logits_of(gptoss::BackendSession& s) {
    const float* l = nullptr;
    OK(s.get_logits(&l));
    return std::vector<float>(l, l + 201088);
}

struct Run {
    std::vector<int32_t> tokens;
    gptoss_stop_reason stop;
    uint32_t n_cached;
};

Run generate(gptoss_session* s, const std::vector<int32_t>& prompt, const gptoss_sampling_params& sp, int stop_at) {
    struct Ud {
        int n, seen;
    } ud{stop_at, 0};
    auto cb = [](void* p, const gptoss_event*) {
        Ud* u = static_cast<Ud*>(p);
        return u->n == 0 || ++u->seen < u->n;
    };
    const gptoss_generate_result* r = nullptr;
    const gptoss_status status = gptoss_generate(s, prompt.data(), prompt.size(), &sp, cb, &ud, &r);
    INFO(gptoss_last_error());
    REQUIRE(status == GPTOSS_OK);
    return Run{std::vector<int32_t>(r->tokens, r->tokens + r->n_tokens), r->stop_reason, r->n_cached_tokens};
}

}  // namespace

TEST_CASE("CUDA sample_ahead / decode_sampled / fetch_sampled give decode + sample's tokens and logits bit for bit") {
    gptoss_model* model = load_gpu(nullptr);
    gptoss_session* a = new_session(model);
    gptoss_session* b = new_session(model);
    gptoss::BackendSession& plain = *a->backend;
    gptoss::BackendSession& piped = *b->backend;
    CHECK(piped.pipelines_decode());
    const std::vector<int32_t> p = prompt(150, 61);
    for (const gptoss::SamplingConfig cfg : {gptoss::SamplingConfig{0.0f, 1.0f, 0}, gptoss::SamplingConfig{0.8f, 1.0f, 0},
                                             gptoss::SamplingConfig{1.0f, 0.9f, 40}}) {
        INFO("temperature " << cfg.temperature << " top_p " << cfg.top_p << " top_k " << cfg.top_k);
        OK(plain.forward(p.data(), uint32_t(p.size()), 0));
        OK(piped.forward(p.data(), uint32_t(p.size()), 0));
        gptoss::Rng ra(5), rb(5);
        OK(piped.sample_ahead(cfg, rb.next_double(), nullptr));
        for (uint32_t i = 0; i < 40; ++i) {
            const uint32_t pos = uint32_t(p.size()) + i;
            int32_t want = -1, got = -1;
            OK(plain.sample(cfg, ra.next_double(), &want));
            OK(plain.decode(want, pos));
            OK(piped.decode_sampled(pos));  // enqueued before the token is read
            OK(piped.fetch_sampled(&got));
            REQUIRE(got == want);
            OK(piped.sample_ahead(cfg, rb.next_double(), nullptr));
            if (i % 13 == 0) CHECK(logits_of(piped) == logits_of(plain));
        }
        int32_t want = -1, got = -1;
        OK(plain.sample(cfg, ra.next_double(), &want));
        OK(piped.fetch_sampled(&got));
        CHECK(got == want);
    }
    // A decode_sampled at another position than the feed wrote (the last step's end): the step
    // comes from the host. Position 150 again, after a step at 150.
    OK(piped.forward(p.data(), 150, 0));
    OK(plain.forward(p.data(), 150, 0));
    const gptoss::SamplingConfig greedy{0.0f, 1.0f, 0};
    OK(piped.sample_ahead(greedy, 0.0, nullptr));
    int32_t tok = -1;
    OK(piped.fetch_sampled(&tok));
    OK(piped.decode_sampled(149));  // re-runs position 149 with the sampled token
    OK(plain.decode(tok, 149));
    CHECK(logits_of(piped) == logits_of(plain));
    // fetch without a pending sample is an internal error, not a hang.
    int32_t none = -1;
    CHECK(piped.fetch_sampled(&none) == GPTOSS_ERR_INTERNAL);
    gptoss_session_free(a);
    gptoss_session_free(b);
    gptoss_model_free(model);
}

TEST_CASE("gptoss_generate on the GPU: the pipelined loop (the default) equals GPTOSS_DECODE_PIPELINE=0, call after call") {
    gptoss_model* plain = load_gpu("0");
    gptoss_model* piped = load_gpu(nullptr);
    gptoss_session* a = new_session(plain);
    gptoss_session* b = new_session(piped);
    std::vector<int32_t> turn = prompt(200, 62);  // > 128: the sliding rings wrap
    gptoss_sampling_params greedy_sp;
    gptoss_sampling_params_init(&greedy_sp, sizeof greedy_sp);
    greedy_sp.temperature = 0.0f;
    greedy_sp.max_tokens = 12;
    greedy_sp.n_stop_tokens = 0;
    gptoss_session* scout = new_session(plain);
    const Run greedy = generate(scout, turn, greedy_sp, 0);
    gptoss_session_free(scout);
    REQUIRE(greedy.tokens.size() == 12);
    struct Call {
        float temperature, top_p;
        uint32_t top_k, max_tokens;
        int stop_token, stop_at;
    };
    const Call calls[] = {{0.0f, 1.0f, 0, 9, 1, 0}, {0.8f, 1.0f, 0, 30, -1, 0}, {1.0f, 0.9f, 40, 20, -1, 5},
                          {0.0f, 1.0f, 0, 1, -1, 0}, {0.7f, 1.0f, 0, 0, 6, 0},  {0.9f, 0.5f, 0, 25, -1, 1}};
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; ++i) {
        const Call& c = calls[i];
        INFO("call " << i);
        gptoss_sampling_params sp;
        gptoss_sampling_params_init(&sp, sizeof sp);
        sp.temperature = c.temperature;
        sp.top_p = c.top_p;
        sp.top_k = c.top_k;
        sp.seed = 70 + i;
        sp.max_tokens = c.max_tokens == 0 ? 64 : c.max_tokens;
        sp.n_stop_tokens = 0;
        if (c.stop_token >= 0) {
            sp.stop_tokens = &greedy.tokens[size_t(c.stop_token)];
            sp.n_stop_tokens = 1;
        }
        const Run want = generate(a, turn, sp, c.stop_at);
        const Run got = generate(b, turn, sp, c.stop_at);
        CHECK(got.tokens == want.tokens);
        CHECK(got.stop == want.stop);
        CHECK(got.n_cached == want.n_cached);
        gptoss_session* fresh = new_session(piped);
        CHECK(generate(fresh, turn, sp, c.stop_at).tokens == want.tokens);
        gptoss_session_free(fresh);
        turn.insert(turn.end(), want.tokens.begin(), want.tokens.end() - (want.tokens.empty() ? 0 : 1));
        const std::vector<int32_t> extra = prompt(6, 80 + i);
        turn.insert(turn.end(), extra.begin(), extra.end());
    }
    gptoss_session_free(a);
    gptoss_session_free(b);
    gptoss_model_free(plain);
    gptoss_model_free(piped);
}

TEST_CASE("gptoss_generate / gptoss_chat constrained on the GPU: pipelined (the default) equals GPTOSS_DECODE_PIPELINE=0") {
    gptoss_model* plain = load_gpu("0");
    gptoss_model* piped = load_gpu(nullptr);
    const std::vector<int32_t> p = prompt(40, 63);
    const int32_t end = 200002;
    for (uint64_t seed = 0; seed < 3; ++seed) {
        INFO("json_schema, seed " << seed);
        gptoss_sampling_params sp;
        gptoss_sampling_params_init(&sp, sizeof sp);
        sp.seed = seed;
        sp.max_tokens = 200;
        sp.json_schema = R"({"type":"object","properties":{"a":{"type":"number"},"b":{"type":"string","maxLength":6}},)"
                         R"("required":["a","b"],"additionalProperties":false})";
        sp.stop_tokens = &end;
        sp.n_stop_tokens = 1;
        gptoss_session* a = new_session(plain);
        gptoss_session* b = new_session(piped);
        const Run want = generate(a, p, sp, 0);
        const Run got = generate(b, p, sp, 0);
        CHECK(want.stop == GPTOSS_STOP_RETURN);
        CHECK(got.tokens == want.tokens);
        CHECK(got.stop == want.stop);
        gptoss_session_free(a);
        gptoss_session_free(b);
    }
    gptoss_tool tool = {"add", "Adds.", R"({"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]})"};
    gptoss_message history[1] = {{GPTOSS_ROLE_USER, GPTOSS_CHANNEL_NONE, "Add 2 and 3.", nullptr, nullptr, nullptr}};
    for (uint64_t seed = 0; seed < 3; ++seed) {
        INFO("tool call, seed " << seed);
        gptoss_chat_request req = gptoss_chat_default_request();
        req.messages = history;
        req.n_messages = 1;
        req.tools = &tool;
        req.n_tools = 1;
        req.tool_choice = GPTOSS_TOOL_CHOICE_REQUIRED;
        gptoss_sampling_params sp = gptoss_sampling_default_params();
        sp.seed = seed;
        sp.max_tokens = 400;
        std::string raw[2];
        gptoss_stop_reason stop[2] = {};
        for (int i = 0; i < 2; ++i) {
            gptoss_session* s = new_session(i == 0 ? plain : piped);
            const gptoss_chat_result* r = nullptr;
            REQUIRE(gptoss_chat(s, &req, &sp, nullptr, nullptr, &r) == GPTOSS_OK);
            raw[i] = r->raw;
            stop[i] = r->stop_reason;
            gptoss_session_free(s);
        }
        CHECK(stop[0] == GPTOSS_STOP_CALL);
        CHECK(raw[1] == raw[0]);
        CHECK(stop[1] == stop[0]);
    }
    gptoss_model_free(plain);
    gptoss_model_free(piped);
}

int main(int argc, char** argv) { return run_kernel_tests(argc, argv, "test-kernels-pipeline"); }
