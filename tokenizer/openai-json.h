// tokenizer/openai-json.h - the OpenAI Chat Completions shapes on top of the public API: request
// bodies → gptoss_chat_request + sampling parameters, gptoss_chat results → "chat.completion"
// objects, gptoss_event streams → "chat.completion.chunk" server-sent events, and the
// conversation JSON that gptoss-chat writes (--json, /save). It is the static library
// `gptoss_openai`, outside libgptoss: it uses only gptoss.h (messages and tools are parsed by
// gptoss_conversation_parse_json, the library's one request mapping) and simdjson for the
// remaining request fields. gptoss-chat and gptoss-server share it, so the CLI's JSON and the
// server's replies cannot drift apart. Every string written is valid JSON text: invalid UTF-8
// (a cancelled turn can end inside a character) becomes U+FFFD.
#pragma once

#include "gptoss.h"

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gptoss::openai {

// --- JSON text -------------------------------------------------------------------------------

// Appends `s` as a JSON string literal (quotes included).
void json_string(std::string& out, std::string_view s);
std::string json_str(std::string_view s);

// --- conversations as plain strings (gptoss-chat's history) ----------------------------------

struct Message {
    gptoss_role role = GPTOSS_ROLE_USER;
    gptoss_channel channel = GPTOSS_CHANNEL_NONE;
    std::string content;
    std::optional<std::string> author, recipient, content_type;
};

struct Tool {
    std::string name, description;
    std::optional<std::string> parameters;  // JSON Schema text
};

struct Conversation {
    std::optional<std::string> instructions;
    std::vector<Message> messages;
    std::vector<Tool> tools;
    gptoss_reasoning_effort effort = GPTOSS_REASONING_MEDIUM;
    // Constrained decoding asked for by the request body (tool_choice, response_format), as
    // gptoss_chat_request takes them; kept for the next turns and written back by /save.
    gptoss_tool_choice tool_choice = GPTOSS_TOOL_CHOICE_AUTO;
    std::string tool_choice_name;
    gptoss_response_format response_format = GPTOSS_RESPONSE_FORMAT_TEXT;
    std::string response_format_name, response_format_description, response_format_schema;
    uint32_t max_reasoning_tokens = UINT32_MAX;  // "thinking_token_budget"
};

// A request body parsed by gptoss_conversation_parse_json, copied into plain strings.
struct ParsedConversation {
    Conversation conversation;
    bool has_instructions = false;
};

Message copy_message(const gptoss_message& m);
// Parses a Chat Completions body (messages, tools, reasoning_effort, tool_choice, response_format). On failure stores
// "WHAT: <the library's message naming the field>" in `err`.
bool parse_conversation(const std::string& json, const std::string& what, ParsedConversation& out, std::string& err);

bool parse_effort(std::string_view s, gptoss_reasoning_effort* out);  // "low" | "medium" | "high"
const char* effort_name(gptoss_reasoning_effort e);
// "functions.get_weather" → "get_weather"; other recipients unchanged.
std::string function_name(const std::string& recipient);
const char* stop_reason_name(gptoss_stop_reason r);  // "return", "max tokens", ...
// The CLI's finish_reason: stop, length, tool_calls (on <|call|>) or cancelled.
const char* finish_reason(gptoss_stop_reason r);

// The "messages" array in the shape gptoss_conversation_parse_json reads back. Consecutive
// Harmony assistant messages merge into one OpenAI message in the order analysis, text, tool
// calls; a message that would break that order starts a new one. Tool calls get ids call_1,
// call_2, ... and tool results carry the id of the call they answer.
std::string messages_json(const Conversation& c);
std::string tools_json(const std::vector<Tool>& tools);
// "reasoning_effort", "messages" and "tools" as the lines of an object body (gptoss-chat's
// /save and --json; a valid input for --conversation).
std::string conversation_json_fields(const Conversation& c);

// --- requests (gptoss-server) ----------------------------------------------------------------

// A bad request: what was wrong, and the JSON path of the field ("messages[2].content"), or ""
// when no single field is to blame (the body is not JSON).
struct Error {
    std::string message;
    std::string param;
};

// {"error":{"message":...,"type":TYPE,"param":...,"code":CODE}} as the OpenAI API writes it
// (an empty code or param is null).
std::string error_json(const Error& error, const char* type = "invalid_request_error", const char* code = "");

// One POST /v1/chat/completions body. Copies share what `chat` points to.
struct CompletionRequest {
    std::shared_ptr<gptoss_conversation> conversation;  // owns what `chat` points to
    gptoss_chat_request chat{};
    std::string model;                                  // as sent; "" if absent
    float temperature = 1.0f;                           // OpenAI's default, and gpt-oss's
    float top_p = 1.0f;
    uint32_t max_tokens = 0;                            // 0: not given
    uint64_t seed = GPTOSS_SEED_RANDOM;
    std::vector<std::string> stop;
    bool stream = false;
    bool include_usage = false;                         // stream_options.include_usage

    // Sampling parameters for gptoss_chat; they point into this request.
    gptoss_sampling_params sampling() const;
    // Stores `text` for the life of the request (and its copies); returns it.
    const char* keep(std::string text);

private:
    mutable std::vector<const char*> stop_ptrs_;
    std::shared_ptr<std::deque<std::string>> strings_ = std::make_shared<std::deque<std::string>>();
};

// Parses and checks a request body: messages, tools, tool_choice (auto, none, required or
// {"type":"function","function":{"name":...}}), response_format (text, json_object, or
// json_schema with name, description, schema), reasoning_effort, temperature [0, 2], top_p
// (0, 1], max_tokens / max_completion_tokens (>= 1), seed, stop (a string or an array of
// strings), stream, stream_options.include_usage, n (1 only); and rejects what it cannot honour
// (logprobs, non-zero penalties) rather than ignoring it. Unknown fields are ignored.
// Returns false and fills *error (naming the field) on a bad request.
bool parse_completion_request(const char* json, size_t len, CompletionRequest* out, Error* error);

// The error for a request that gptoss_chat_render or gptoss_chat refused with `status` and
// `message` (gptoss_last_error()): the library's request fields become the request body's JSON
// paths ("tool_choice_name" → "tool_choice.function.name"); UNSUPPORTED for tool_choice or
// response_format (a library without constrained decoding) names the field that asked for it.
// The library's messages[i] index its Harmony messages, not the body's, so they name no field.
Error request_error(const CompletionRequest& request, gptoss_status status, const std::string& message);

// --- replies ---------------------------------------------------------------------------------

struct ToolCall {
    std::string id, name, arguments;
};

// The assistant's turn as one OpenAI message: analysis messages joined by "\n" as
// reasoning_content; final, commentary and channel-less text concatenated as content; every
// message with a recipient a tool call (name without the "functions." namespace).
struct Reply {
    std::string reasoning, content;
    std::vector<ToolCall> calls;
};

// `new_id` names each tool call ("call_..."); it is called once per call, in order.
Reply reply_from_result(const gptoss_chat_result& result, const std::function<std::string()>& new_id);

struct Usage {
    uint32_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

std::string usage_json(const Usage& usage);
// The API's finish_reason for a finished turn: "length" when it ran into max_tokens or the
// context (a tool call may be cut short), "tool_calls" when the reply has tool calls, else
// "stop" (a cancelled turn included).
const char* reply_finish_reason(gptoss_stop_reason stop, const Reply& reply);
// A "chat.completion" object.
std::string completion_json(const std::string& id, int64_t created, const std::string& model, const Reply& reply,
                            const char* finish_reason, const Usage& usage);

// Turns one gptoss_chat call's events into "chat.completion.chunk" server-sent events
// ("data: {...}\n\n"), as the OpenAI API streams them: a first chunk with the role, then
// reasoning_content, content and tool_calls deltas (a call's first delta carries its index, id,
// type and name with empty arguments; later ones argument text), a last chunk with the
// finish_reason, optionally a usage chunk, and "data: [DONE]".
// Events carry neither a message's role nor its index, and text the parser only turns into a
// message at the end of the output (a cut-off header) is never an event; so text of a message
// without a channel is held back, a message boundary is a run of header tokens (channel NONE,
// no text), and finish() sends whatever the parsed result holds beyond what was streamed: the
// deltas of a stream always add up to the non-streamed reply of the same turn.
class StreamMapper {
public:
    StreamMapper(std::string id, int64_t created, std::string model, bool include_usage,
                 std::function<std::string()> new_id);

    std::string first_chunk();
    // The chunks for one event; often "".
    std::string on_event(const gptoss_event& event);
    // The closing chunks, given the call's result. *reply_out (if not null) receives the reply.
    std::string finish(const gptoss_chat_result& result, Reply* reply_out = nullptr);

private:
    enum class Part { None, Reasoning, Content, Call };
    std::string chunk(const std::string& delta, const char* finish_reason = nullptr) const;
    std::string delta(Part part, std::string_view text);
    std::string call_start(std::string id, const std::string& name);

    std::string id_, model_;
    int64_t created_;
    bool include_usage_;
    std::function<std::string()> new_id_;
    Part part_ = Part::None;  // the message being streamed; None between messages
    Reply streamed_;           // what the deltas so far add up to
};

}  // namespace gptoss::openai
