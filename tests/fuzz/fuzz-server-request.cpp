// tests/fuzz/fuzz-server-request.cpp - a POST /v1/chat/completions body as gptoss-server reads it
// (openai::parse_completion_request), then rendered as gptoss_chat would (render_request_text)
// and its sampling parameters checked (make_generate_options). A rejected body names what was
// wrong in valid UTF-8, and its error JSON is valid UTF-8 too.
#include "tests/fuzz/fuzz-common.h"
#include "tokenizer/openai-json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    gptoss::openai::CompletionRequest request;
    gptoss::openai::Error error;
    if (!gptoss::openai::parse_completion_request(reinterpret_cast<const char*>(data), size, &request, &error)) {
        if (error.message.empty()) fuzz_fail("a rejected request without a message");
        if (!fuzz_valid_utf8(gptoss::openai::error_json(error))) fuzz_fail("error JSON is not UTF-8", error.message);
        return 0;
    }
    std::string text;
    fuzz_check_status(gptoss::render_request_text(request.chat, &text));
    gptoss::GenerateOptions options;
    fuzz_check_status(gptoss::make_generate_options(request.sampling(), &options));
    return 0;
}
