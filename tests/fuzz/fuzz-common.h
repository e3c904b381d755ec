// tests/fuzz/fuzz-common.h - what every libFuzzer target shares: the oracle for failures (a
// failing call left a non-empty message that is printable, valid UTF-8, bytes from the input
// escaped as \xNN) and the real o200k_harmony tokenizer, loaded once per process from
// $GPTOSS_TOKENIZER_DIR (default ~/.cache/gptoss/tokenizer-gptoss, as `make tokenizer-data`).
// A violated expectation calls fuzz_fail(), which prints it and aborts, so libFuzzer keeps the
// input as a crash artifact.
#pragma once

#include "gptoss-internal.h"
#include "tokenizer/chat-json.h"
#include "tokenizer/tokenizer.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

[[noreturn]] inline void fuzz_fail(const char* what, std::string_view detail = {}) {
    std::fprintf(stderr, "fuzz: %s: %.*s\n", what, int(detail.size()), detail.data());
    std::abort();
}

inline bool fuzz_valid_utf8(std::string_view s) { return gptoss::first_invalid_utf8(s.data(), s.size()) == s.size(); }

// After a call that returned `status`: on failure the message must say something, be valid
// UTF-8 and hold no control characters (bytes from the input are escaped, never copied raw).
inline void fuzz_check_status(gptoss_status status) {
    if (status == GPTOSS_OK) return;
    const std::string message = gptoss_last_error();
    if (message.empty()) fuzz_fail("a failure without a message");
    if (!fuzz_valid_utf8(message)) fuzz_fail("an error message that is not UTF-8", message);
    for (unsigned char c : message)
        if (c < 0x20 || c == 0x7f) fuzz_fail("an error message with a control character", message);
}

inline const gptoss::Tokenizer& fuzz_tokenizer() {
    static const std::unique_ptr<gptoss::Tokenizer> tokenizer = [] {
        const char* dir = std::getenv("GPTOSS_TOKENIZER_DIR");
        const char* home = std::getenv("HOME");
        std::string path = dir && *dir ? dir : std::string(home ? home : ".") + "/.cache/gptoss/tokenizer-gptoss";
        path += "/tokenizer.json";
        std::unique_ptr<gptoss::Tokenizer> t;
        if (gptoss::Tokenizer::load_hf_json(path, &t) != GPTOSS_OK) {
            std::fprintf(stderr, "fuzz: cannot load %s: %s (make tokenizer-data)\n", path.c_str(), gptoss_last_error());
            std::exit(2);
        }
        return t;
    }();
    return *tokenizer;
}
