// tests/fuzz/fuzz-conversation.cpp - an OpenAI Chat Completions request body through
// gptoss_conversation_parse_json's parser and then the Harmony renderer (render_request_text,
// the checks of gptoss_chat_render without a model). An accepted body must render, or fail with
// a message; the rendering of valid UTF-8 input is valid UTF-8.
#include "tests/fuzz/fuzz-common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    gptoss::ChatRequestStorage storage;
    const gptoss_status status =
        gptoss::parse_chat_completions_json(reinterpret_cast<const char*>(data), size, &storage);
    fuzz_check_status(status);
    if (status != GPTOSS_OK) return 0;
    std::string text;
    const gptoss_status rendered = gptoss::render_request_text(storage.request, &text);
    fuzz_check_status(rendered);
    if (rendered == GPTOSS_OK && !fuzz_valid_utf8(text)) fuzz_fail("the rendering is not UTF-8");
    return 0;
}
