// tests/fuzz/fuzz-schema.cpp - constrained decoding's schema compiler and matcher
// (tokenizer/json-schema.h): the input is a JSON Schema, then a NUL, then bytes fed to a
// matcher of the compiled schema one at a time (schema::fuzz_one is the same drive without the
// checks). Contracts: a rejected schema leaves a printable message; step() succeeds exactly when
// the state keeps a thread; a state never holds more than kMaxThreads threads or a thread deeper
// than kMaxDepth frames; a rejected byte leaves the matcher's state unchanged.
#include "tests/fuzz/fuzz-common.h"
#include "tokenizer/json-schema.h"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    namespace s = gptoss::schema;
    const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
    const size_t schema_len = nul != nullptr ? size_t(nul - data) : size;
    std::shared_ptr<const s::Grammar> grammar;
    const gptoss_status status =
        s::compile(std::string_view(reinterpret_cast<const char*>(data), schema_len), "json_schema", &grammar);
    fuzz_check_status(status);
    if (status != GPTOSS_OK) return 0;
    s::Matcher m(grammar);
    s::State next;
    for (size_t i = schema_len + 1; i < size; ++i) {
        const s::State before = m.state();
        const bool stepped = s::step(*grammar, before, data[i], &next);
        if (stepped != !next.ends.empty()) fuzz_fail("step() result disagrees with its state");
        if (next.ends.size() > s::kMaxThreads) fuzz_fail("more threads than kMaxThreads");
        uint32_t begin = 0;
        for (uint32_t e : next.ends) {
            if (e - begin > s::kMaxDepth + 1) fuzz_fail("a thread deeper than kMaxDepth");
            begin = e;
        }
        const bool advanced = m.advance(std::string_view(reinterpret_cast<const char*>(data + i), 1));
        if (advanced != stepped) fuzz_fail("Matcher::advance disagrees with step()");
        if (!advanced) {
            if (!(m.state() == before)) fuzz_fail("a rejected byte changed the state");
            break;
        }
    }
    (void)m.can_finish();
    return 0;
}
