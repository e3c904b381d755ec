// tokenizer/chat-json.h - the one place that maps an OpenAI Chat Completions request body to a
// gptoss_chat_request (used by gptoss_conversation_parse_json, hence by gptoss-tokenize --chat,
// the CLI and any HTTP server). The mapping is written out in gptoss.h above
// gptoss_conversation_parse_json. Errors name the JSON field ("messages[3].tool_calls[0]
// .function.arguments: expected a string").
#pragma once

#include "gptoss.h"

#include <deque>
#include <string>
#include <vector>

namespace gptoss {

// A gptoss_chat_request together with everything it points to.
struct ChatRequestStorage {
    gptoss_chat_request request{};
    std::deque<std::string> strings;  // a deque: growing it never moves the strings
    std::vector<gptoss_message> messages;
    std::vector<gptoss_tool> tools;
    const char* keep(std::string text) {
        strings.push_back(std::move(text));
        return strings.back().c_str();
    }
};

// Parses `len` bytes of JSON into *out (request.messages/tools point into *out, which must not
// be copied afterwards). Fails with INVALID_ARGUMENT naming the field.
[[nodiscard]] gptoss_status parse_chat_completions_json(const char* json, size_t len, ChatRequestStorage* out);

// Byte offset of the first invalid UTF-8 sequence in `text`, or `len` if it is all valid
// (overlong forms, surrogates and code points above U+10FFFF are invalid).
size_t first_invalid_utf8(const char* text, size_t len);

}  // namespace gptoss

struct gptoss_conversation {
    gptoss::ChatRequestStorage storage;
};
