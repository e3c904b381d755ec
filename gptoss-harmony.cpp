// gptoss-harmony.cpp - the chat entry points of gptoss.h: gptoss_chat_request_init,
// gptoss_chat_render, gptoss_chat and the gptoss_conversation_* JSON functions.
// Rendering and parsing live in tokenizer/harmony.*; this file validates requests, drives
// session_generate and owns the chat result stored in gptoss_session::chat_result.
// First version: every function exists so the library links; the real ones follow.
#include "gptoss-internal.h"

#include <cstring>

extern "C" {

GPTOSS_API void gptoss_chat_request_init(gptoss_chat_request* request, size_t struct_size) {
    if (request == nullptr) return;
    gptoss_chat_request defaults{};
    defaults.struct_size = uint32_t(sizeof(gptoss_chat_request));
    defaults.reasoning_effort = GPTOSS_REASONING_MEDIUM;
    const size_t n = struct_size < sizeof defaults ? struct_size : sizeof defaults;
    std::memcpy(request, &defaults, n);
    if (n >= sizeof(uint32_t)) request->struct_size = uint32_t(n);
}

GPTOSS_API gptoss_status gptoss_chat_render(const gptoss_model*, const gptoss_chat_request*,
                                            int32_t*, size_t, size_t*) {
    return gptoss::fail(GPTOSS_ERR_UNSUPPORTED, "gptoss_chat_render: not implemented yet");
}

GPTOSS_API gptoss_status gptoss_chat(gptoss_session*, const gptoss_chat_request*,
                                     const gptoss_sampling_params*, gptoss_event_fn, void*,
                                     const gptoss_chat_result** result_out) {
    if (result_out != nullptr) *result_out = nullptr;
    return gptoss::fail(GPTOSS_ERR_UNSUPPORTED, "gptoss_chat: not implemented yet");
}

GPTOSS_API gptoss_status gptoss_conversation_parse_json(const char*, size_t,
                                                        gptoss_conversation** conversation_out) {
    if (conversation_out != nullptr) *conversation_out = nullptr;
    return gptoss::fail(GPTOSS_ERR_UNSUPPORTED, "gptoss_conversation_parse_json: not implemented yet");
}

GPTOSS_API const gptoss_chat_request* gptoss_conversation_get_request(const gptoss_conversation*) {
    return nullptr;
}

GPTOSS_API void gptoss_conversation_free(gptoss_conversation*) {}

}  // extern "C"
