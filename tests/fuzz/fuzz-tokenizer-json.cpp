// tests/fuzz/fuzz-tokenizer-json.cpp - tokenizer.json text through Tokenizer::parse_hf_json (run
// with -max_len, see run.sh: the real file is 27 MB, mutations of small files reach every
// branch of the parser before the rank check).
#include "tests/fuzz/fuzz-common.h"

#include <simdjson.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    simdjson::padded_string json(reinterpret_cast<const char*>(data), size);
    std::unique_ptr<gptoss::Tokenizer> tokenizer;
    const gptoss_status status =
        gptoss::Tokenizer::parse_hf_json("tokenizer.json", json.data(), json.size(), json.size() + simdjson::SIMDJSON_PADDING, &tokenizer);
    fuzz_check_status(status);
    if ((status == GPTOSS_OK) != (tokenizer != nullptr)) fuzz_fail("status and tokenizer disagree");
    return 0;
}
