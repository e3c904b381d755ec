// tests/test-model.cpp - the CPU backend against the transformers oracle (tests/data/golden/,
// made by tools/golden.py on the GPU machine; provenance in tests/data/PROVENANCE.md).
// The checkpoints are rewritten here by gptoss-synth (the synth-tiny fixture for tiny seed 1,
// this test for the shape variant) and must be byte-identical to the oracle's (sha256).
// Tolerances: every recorded logit within 1e-4 * max|logit| of transformers' fp32 value; greedy
// tokens from gptoss_generate(temperature 0) identical up to the first step whose recorded
// top-2 gap is not decisive (see kDecisiveGap): past a near-tie either choice is right, and
// everything after it legitimately differs.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "tests/sha256.h"

#include "gptoss-internal.h"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

constexpr double kLogitTolerance = 1e-4;  // times max|logit| at that position
// A step's greedy token is compared only while the recorded top-2 gap exceeds this many
// logit tolerances (each logit may move by 1e-4 * max|logit|, so the gap by twice that):
// a 5x margin over the worst case.
constexpr double kDecisiveGap = 10 * kLogitTolerance;

std::string env(const char* name) {
    const char* v = std::getenv(name);
    REQUIRE_MESSAGE(v != nullptr, name << " is not set (run through ctest)");
    return v;
}

// SHA-256: tests/sha256.h.
using gptoss_test::Sha256;

std::string sha256_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot open " << path);
    Sha256 sha;
    std::vector<char> buffer(1 << 20);
    while (in) {
        in.read(buffer.data(), std::streamsize(buffer.size()));
        sha.update(reinterpret_cast<const uint8_t*>(buffer.data()), size_t(in.gcount()));
    }
    return sha.hex();
}

// ---------------------------------------------------------------------------
// Goldens

struct Position {
    uint32_t pos = 0;
    double max_abs = 0;
    std::vector<int32_t> ids;
    std::vector<double> logits;
};

struct Prompt {
    std::string name;
    std::vector<int32_t> tokens;
    std::vector<Position> positions;
    std::vector<int32_t> greedy;
    std::vector<double> gaps;     // top-2 gap before each greedy token
    std::vector<double> max_abs;  // max|logit| before each greedy token
};

struct Golden {
    std::string checkpoint;       // the gptoss-synth command line
    std::vector<std::pair<std::string, std::string>> sha256;  // file, hex
    std::vector<Prompt> prompts;
};

// Accessors through locals: simdjson's chained temporaries trip GCC's -Wdangling-pointer.
simdjson::dom::element field(simdjson::dom::element obj, const char* key) {
    simdjson::dom::element e;
    REQUIRE_MESSAGE(obj.at_key(key).get(e) == simdjson::SUCCESS, "golden: field " << key << " missing");
    return e;
}

simdjson::dom::array array_of(simdjson::dom::element e) {
    simdjson::dom::array a;
    REQUIRE(e.get_array().get(a) == simdjson::SUCCESS);
    return a;
}

std::string string_of(simdjson::dom::element e) {
    std::string_view v;
    REQUIRE(e.get_string().get(v) == simdjson::SUCCESS);
    return std::string(v);
}

double double_of(simdjson::dom::element e) {
    double v = 0;
    REQUIRE(e.get_double().get(v) == simdjson::SUCCESS);
    return v;
}

int64_t int_of(simdjson::dom::element e) {
    int64_t v = 0;
    REQUIRE(e.get_int64().get(v) == simdjson::SUCCESS);
    return v;
}

template <typename T>
std::vector<T> numbers(simdjson::dom::element e) {
    std::vector<T> out;
    for (simdjson::dom::element x : array_of(e)) {
        if constexpr (std::is_integral_v<T>) out.push_back(T(int_of(x)));
        else out.push_back(T(double_of(x)));
    }
    return out;
}

Golden read_golden(const std::string& file) {
    const std::string path = env("GPTOSS_SOURCE_DIR") + "/tests/data/golden/" + file;
    simdjson::padded_string text;
    REQUIRE_MESSAGE(simdjson::padded_string::load(path).get(text) == simdjson::SUCCESS, "cannot read " << path);
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    REQUIRE_MESSAGE(parser.parse(text).get(root) == simdjson::SUCCESS, path << " is not JSON");
    Golden g;
    g.checkpoint = string_of(field(root, "checkpoint"));
    simdjson::dom::object sha;
    REQUIRE(field(root, "sha256").get_object().get(sha) == simdjson::SUCCESS);
    for (auto entry : sha) g.sha256.emplace_back(std::string(entry.key), string_of(entry.value));
    for (simdjson::dom::element p : array_of(field(root, "prompts"))) {
        Prompt prompt;
        prompt.name = string_of(field(p, "name"));
        prompt.tokens = numbers<int32_t>(field(p, "tokens"));
        for (simdjson::dom::element q : array_of(field(p, "positions"))) {
            Position pos;
            pos.pos = uint32_t(int_of(field(q, "pos")));
            pos.max_abs = double_of(field(q, "max_abs"));
            pos.ids = numbers<int32_t>(field(q, "ids"));
            pos.logits = numbers<double>(field(q, "logits"));
            REQUIRE(pos.ids.size() == pos.logits.size());
            prompt.positions.push_back(std::move(pos));
        }
        const simdjson::dom::element greedy = field(p, "greedy");
        prompt.greedy = numbers<int32_t>(field(greedy, "tokens"));
        prompt.gaps = numbers<double>(field(greedy, "top2_gap"));
        prompt.max_abs = numbers<double>(field(greedy, "max_abs"));
        REQUIRE(prompt.greedy.size() == prompt.gaps.size());
        g.prompts.push_back(std::move(prompt));
    }
    REQUIRE(g.prompts.size() >= 3);
    return g;
}

void check_sha256(const std::string& dir, const Golden& g) {
    REQUIRE(!g.sha256.empty());
    for (const auto& entry : g.sha256) {
        // Plain references: a structured binding cannot be captured by INFO's lambda in C++17 (clang).
        const std::string& file = entry.first;
        const std::string& hex = entry.second;
        INFO("checkpoint file " << dir << "/" << file << " (written by " << g.checkpoint << ")");
        CHECK(sha256_file(dir + "/" + file) == hex);
    }
}

gptoss_model* load_cpu(const std::string& dir) {
    gptoss_model_params params = gptoss_model_default_params();
    params.device = GPTOSS_DEVICE_CPU;
    gptoss_model* model = nullptr;
    const gptoss_status status = gptoss_load(dir.c_str(), &params, &model);
    INFO("gptoss_load(" << dir << "): " << gptoss_last_error());
    REQUIRE(status == GPTOSS_OK);
    return model;
}

// Runs every prompt through a backend session in chunks that end at the recorded positions
// (so the session's latest logits are those of each recorded position) and compares.
void check_logits(gptoss_model* model, const Golden& g) {
    const uint32_t max_batch = 64;
    size_t n_checked = 0;
    double worst_ratio = 0;  // max over positions of max|delta| / (max|logit|), for the log
    for (const Prompt& p : g.prompts) {
        std::unique_ptr<gptoss::BackendSession> session;
        REQUIRE(model->backend->create_session(uint32_t(p.tokens.size()), max_batch, &session) == GPTOSS_OK);
        uint32_t done = 0;
        for (const Position& q : p.positions) {
            while (done <= q.pos) {
                const uint32_t n = std::min(max_batch, q.pos + 1 - done);
                INFO(p.name << ": forward at " << done << " (" << n << " tokens): " << gptoss_last_error());
                REQUIRE(session->forward(p.tokens.data() + done, n, done) == GPTOSS_OK);
                done += n;
            }
            const float* logits = nullptr;
            REQUIRE(session->get_logits(&logits) == GPTOSS_OK);
            const double tol = kLogitTolerance * q.max_abs;
            double worst = 0, ours_max = 0;
            int32_t worst_id = -1;
            for (size_t i = 0; i < q.ids.size(); ++i) {
                const double d = std::fabs(double(logits[q.ids[i]]) - q.logits[i]);
                if (!(d <= worst)) {  // also catches NaN
                    worst = d;
                    worst_id = q.ids[i];
                }
            }
            const uint32_t V = model->checkpoint->config.vocab;
            for (uint32_t v = 0; v < V; ++v) ours_max = std::max(ours_max, std::fabs(double(logits[v])));
            INFO(p.name << " position " << q.pos << ": max |delta logit| " << worst << " at id " << worst_id
                 << ", tolerance " << tol << " (max|logit| " << q.max_abs << ", ours " << ours_max << ")");
            CHECK(worst <= tol);
            CHECK(std::fabs(ours_max - q.max_abs) <= tol);
            worst_ratio = std::max(worst_ratio, worst / q.max_abs);
            ++n_checked;
        }
    }
    MESSAGE(g.checkpoint << ": " << n_checked << " positions, worst max|delta logit| / max|logit| = " << worst_ratio);
    CHECK(n_checked >= 15);
}

// gptoss_generate at temperature 0 against the oracle's greedy continuation.
void check_greedy(gptoss_model* model, const Golden& g) {
    gptoss_session_params sp = gptoss_session_default_params();
    sp.max_context = 512;
    for (const Prompt& p : g.prompts) {
        size_t decisive = 0;  // steps before the first near-tie
        while (decisive < p.gaps.size() && p.gaps[decisive] > kDecisiveGap * p.max_abs[decisive]) ++decisive;
        INFO(p.name << ": comparing the first " << decisive << " of " << p.greedy.size()
             << " greedy tokens (the next step's top-2 gap is within " << kDecisiveGap << " * max|logit|)");
        REQUIRE(decisive >= 16);  // the goldens give a meaningful comparison

        gptoss_session* session = nullptr;
        REQUIRE(gptoss_session_create(model, &sp, &session) == GPTOSS_OK);
        gptoss_sampling_params s = gptoss_sampling_default_params();
        s.temperature = 0.0f;
        s.seed = 1;
        s.max_tokens = uint32_t(decisive);
        s.stop_tokens = nullptr;  // no stop token: the oracle's continuation has none
        s.n_stop_tokens = 0;
        const gptoss_generate_result* result = nullptr;
        const gptoss_status status =
            gptoss_generate(session, p.tokens.data(), p.tokens.size(), &s, nullptr, nullptr, &result);
        INFO(gptoss_last_error());
        REQUIRE(status == GPTOSS_OK);
        const std::vector<int32_t> ours(result->tokens, result->tokens + result->n_tokens);
        const std::vector<int32_t> want(p.greedy.begin(), p.greedy.begin() + long(decisive));
        CHECK(ours == want);
        gptoss_session_free(session);
    }
}

// Writes the checkpoint a golden names (its recorded gptoss-synth command) into a temp dir.
struct SynthDir {
    std::string path;
    explicit SynthDir(const std::string& command) {
        const std::string prefix = "gptoss-synth ";
        REQUIRE(command.rfind(prefix, 0) == 0);
        char tmpl[] = "/tmp/gptoss-test-model-XXXXXX";
        REQUIRE(mkdtemp(tmpl) != nullptr);
        path = tmpl;
        const std::string cmd = env("GPTOSS_BUILD_DIR") + "/gptoss-synth " + command.substr(prefix.size()) +
                                " --out " + path + " >/dev/null";
        INFO(cmd);
        REQUIRE(std::system(cmd.c_str()) == 0);
    }
    ~SynthDir() {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
    }
};

}  // namespace

TEST_CASE("sha256 implementation matches FIPS 180-4 test vectors") {
    Sha256 empty;
    CHECK(empty.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    Sha256 abc;
    abc.update(reinterpret_cast<const uint8_t*>("abc"), 3);
    CHECK(abc.hex() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    Sha256 s;
    s.update(reinterpret_cast<const uint8_t*>(two.data()), 20);  // split across updates
    s.update(reinterpret_cast<const uint8_t*>(two.data()) + 20, two.size() - 20);
    CHECK(s.hex() == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const std::string million(1000000, 'a');  // many blocks
    Sha256 m;
    m.update(reinterpret_cast<const uint8_t*>(million.data()), million.size());
    CHECK(m.hex() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("the tiny checkpoint is byte-identical to the one transformers was run on") {
    const Golden g = read_golden("tiny-seed1.json");
    CHECK(g.checkpoint == "gptoss-synth --preset tiny --seed 1");  // what the synth-tiny fixture runs
    check_sha256(env("GPTOSS_TINY_MODEL"), g);
}

TEST_CASE("tiny: CPU logits match transformers within 1e-4 * max|logit| at every recorded position") {
    const Golden g = read_golden("tiny-seed1.json");
    gptoss_model* model = load_cpu(env("GPTOSS_TINY_MODEL"));
    check_logits(model, g);
    gptoss_model_free(model);
}

TEST_CASE("tiny: greedy gptoss_generate reproduces transformers' continuations") {
    const Golden g = read_golden("tiny-seed1.json");
    gptoss_model* model = load_cpu(env("GPTOSS_TINY_MODEL"));
    check_greedy(model, g);
    gptoss_model_free(model);
}

TEST_CASE("shape variant (H, I, D, Q/G, E all distinct): logits and greedy tokens match transformers") {
    const Golden g = read_golden("variant-seed2.json");
    SynthDir dir(g.checkpoint);
    check_sha256(dir.path, g);
    gptoss_model* model = load_cpu(dir.path);
    check_logits(model, g);
    check_greedy(model, g);
    gptoss_model_free(model);
}
