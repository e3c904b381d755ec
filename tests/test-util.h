// tests/test-util.h - fixtures shared by the CPU doctest files (tests/test-*.cpp): the real
// gpt-oss tokenizer (GPTOSS_TOKENIZER_DIR, loaded once), the tiny synthetic checkpoint on the CPU
// backend (GPTOSS_TINY_MODEL, loaded once and kept for the process), and deterministic prompts
// of ordinary-text token ids. ctest sets both variables; run alone, a test says which is missing.
// Test-only, header-only: include it after <doctest/doctest.h>, once per test executable.
#pragma once

#include "gptoss-internal.h"
#include "gptoss.h"
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace gptoss::test {

inline const Tokenizer& real_tokenizer() {
    static std::unique_ptr<Tokenizer> tokenizer = [] {
        const char* dir = std::getenv("GPTOSS_TOKENIZER_DIR");
        REQUIRE_MESSAGE(dir != nullptr, "GPTOSS_TOKENIZER_DIR is not set (run through ctest)");
        std::unique_ptr<Tokenizer> t;
        const gptoss_status status = Tokenizer::load_hf_json(std::string(dir) + "/tokenizer.json", &t);
        INFO(gptoss_last_error());
        REQUIRE(status == GPTOSS_OK);
        return t;
    }();
    return *tokenizer;
}

// The tiny checkpoint on the CPU backend; never freed (shared by every test case).
inline gptoss_model* tiny_model() {
    static gptoss_model* model = [] {
        const char* dir = std::getenv("GPTOSS_TINY_MODEL");
        REQUIRE_MESSAGE(dir != nullptr, "GPTOSS_TINY_MODEL is not set (run through ctest)");
        gptoss_model_params params = gptoss_model_default_params();
        params.device = GPTOSS_DEVICE_CPU;
        gptoss_model* m = nullptr;
        const gptoss_status status = gptoss_load(dir, &params, &m);
        INFO(std::string(gptoss_last_error()));
        REQUIRE(status == GPTOSS_OK);
        return m;
    }();
    return model;
}

// n ordinary-text ids (below the special range), the same for the same seed.
inline std::vector<int32_t> prompt_of(size_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = int32_t(rng.next_u64() % 199998);
    return p;
}

}  // namespace gptoss::test
