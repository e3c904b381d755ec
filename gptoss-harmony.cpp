// gptoss-harmony.cpp - the chat entry points of gptoss.h: gptoss_chat_request_init,
// gptoss_chat_render, gptoss_chat and gptoss_conversation_*.
// A request is validated and turned into a harmony::Conversation (tokenizer/harmony.h), rendered
// as openai/harmony does with the default CoT rule (HARMONY.md §2.8 rule 1), then generated with
// session_generate (stops: <|return|>, <|call|>, <|endoftext|>, never <|end|>) while the
// streaming parser turns tokens into events and messages. The result is built in a fresh
// ChatResult and swapped into session->chat_result, keeping the previous one alive for one more
// call so a request may point into it (API.md §2).
#include "gptoss-internal.h"
#include "tokenizer/chat-json.h"
#include "tokenizer/harmony.h"
#include "tokenizer/json-schema.h"
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <exception>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace gptoss {
namespace {

namespace h = harmony;

const char* channel_name(gptoss_channel channel) {
    switch (channel) {
    case GPTOSS_CHANNEL_ANALYSIS: return "analysis";
    case GPTOSS_CHANNEL_COMMENTARY: return "commentary";
    case GPTOSS_CHANNEL_FINAL: return "final";
    case GPTOSS_CHANNEL_NONE: break;
    }
    return "";
}

gptoss_channel channel_enum(const std::string& channel) {
    if (channel == "analysis") return GPTOSS_CHANNEL_ANALYSIS;
    if (channel == "commentary") return GPTOSS_CHANNEL_COMMENTARY;
    if (channel == "final") return GPTOSS_CHANNEL_FINAL;
    return GPTOSS_CHANNEL_NONE;  // unknown channel names have no enum value
}

gptoss_status check_text(const char* text, const std::string& where) {
    const size_t len = std::strlen(text);
    const size_t bad = first_invalid_utf8(text, len);
    if (bad < len) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: invalid UTF-8 at byte %zu", where.c_str(), bad);
    return GPTOSS_OK;
}

// Header words (author, recipient, content type) are split on whitespace by every parser.
gptoss_status check_word(const char* text, const std::string& where) {
    GPTOSS_TRY(check_text(text, where));
    if (text[0] == '\0') return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: empty", where.c_str());
    for (const char* p = text; *p; ++p)
        if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\f' || *p == '\v')
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: \"%s\" contains whitespace", where.c_str(), text);
    return GPTOSS_OK;
}

// The value a C caller stored in an enum field. Read through memcpy: a value outside the
// enumerators (7 in a gptoss_role) is undefined behaviour to load as the C++ enum type.
template <typename E>
int enum_value(const E& field) {
    static_assert(sizeof(E) == sizeof(int), "C enums are int-sized");
    int value;
    std::memcpy(&value, &field, sizeof value);
    return value;
}

// tool_choice and response_format: checked, and the response format's developer section added.
gptoss_status check_constraints(const gptoss_chat_request& in, h::Conversation* c) {
    const int choice = enum_value(in.tool_choice);
    if (choice < GPTOSS_TOOL_CHOICE_AUTO || choice > GPTOSS_TOOL_CHOICE_NAMED)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "request.tool_choice: %d is not AUTO, NONE, REQUIRED or NAMED", choice);
    if (choice == GPTOSS_TOOL_CHOICE_REQUIRED && in.n_tools == 0)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "request.tool_choice: REQUIRED with no tools");
    if (choice == GPTOSS_TOOL_CHOICE_NAMED) {
        if (in.tool_choice_name == nullptr)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "request.tool_choice_name: NULL with tool_choice NAMED");
        bool found = false;
        for (size_t i = 0; i < in.n_tools && !found; ++i)
            found = in.tools[i].name != nullptr && std::strcmp(in.tools[i].name, in.tool_choice_name) == 0;
        if (!found)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "request.tool_choice_name: \"%s\" is not one of the tools",
                        in.tool_choice_name);
    }
    const int format = enum_value(in.response_format);
    if (format < GPTOSS_RESPONSE_FORMAT_TEXT || format > GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "request.response_format: %d is not TEXT, JSON_OBJECT or JSON_SCHEMA",
                    format);
    if (format != GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA) return GPTOSS_OK;
    if (in.response_format_name == nullptr || in.response_format_name[0] == '\0')
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "request.response_format_name: NULL or empty with response_format JSON_SCHEMA");
    if (in.response_format_schema == nullptr)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "request.response_format_schema: NULL with response_format JSON_SCHEMA");
    GPTOSS_TRY(check_text(in.response_format_name, "request.response_format_name"));
    GPTOSS_TRY(check_text(in.response_format_schema, "request.response_format_schema"));
    h::ResponseFormat f;
    f.name = in.response_format_name;
    if (in.response_format_description != nullptr) {
        GPTOSS_TRY(check_text(in.response_format_description, "request.response_format_description"));
        f.description = in.response_format_description;
    }
    GPTOSS_TRY(schema::minify_json(in.response_format_schema, "request.response_format_schema", &f.schema));
    c->has_developer = true;
    c->developer.response_formats.push_back(std::move(f));
    return GPTOSS_OK;
}

// The constraints gptoss_chat applies for `in` (already checked by check_constraints).
gptoss_status chat_constraint(gptoss_model* model, const gptoss_chat_request& in,
                              std::shared_ptr<TokenConstraint>* out) {
    ChatConstraintSpec spec;
    std::vector<std::string> where;
    for (size_t i = 0; i < in.n_tools; ++i) {
        if (in.constrain_tool_arguments && in.tools[i].parameters != nullptr) {
            spec.tool_schemas.emplace_back(in.tools[i].name, in.tools[i].parameters);
            where.push_back("tools[" + std::to_string(i) + "].parameters");
        }
        if (in.tool_choice == GPTOSS_TOOL_CHOICE_REQUIRED) spec.forced.push_back(in.tools[i].name);
    }
    if (in.tool_choice == GPTOSS_TOOL_CHOICE_NAMED) spec.forced.push_back(in.tool_choice_name);
    spec.forbid_calls = in.tool_choice == GPTOSS_TOOL_CHOICE_NONE;
    if (in.response_format == GPTOSS_RESPONSE_FORMAT_JSON_OBJECT) spec.response_schema = "{\"type\":\"object\"}";
    if (in.response_format == GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA) spec.response_schema = in.response_format_schema;
    spec.shaped = in.response_format != GPTOSS_RESPONSE_FORMAT_TEXT || in.max_reasoning_tokens != UINT32_MAX;
    spec.max_reasoning_tokens = in.max_reasoning_tokens;
    for (size_t i = 0; i < in.n_tools && in.tool_choice == GPTOSS_TOOL_CHOICE_AUTO; ++i) spec.callable.push_back(in.tools[i].name);
    return make_chat_constraint(model, spec, where, "request.response_format_schema", out);
}

// request.tools as the developer message's "functions" namespace.
gptoss_status build_tools(const gptoss_chat_request& in, h::Conversation* c) {
    h::ToolNamespace ns;
    ns.name = "functions";
    for (size_t i = 0; i < in.n_tools; ++i) {
        const gptoss_tool& t = in.tools[i];
        const std::string at = "tools[" + std::to_string(i) + "]";
        if (t.name == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.name: NULL", at.c_str());
        GPTOSS_TRY(check_word(t.name, at + ".name"));
        h::ToolDef def;
        def.name = t.name;
        if (t.description != nullptr) {
            GPTOSS_TRY(check_text(t.description, at + ".description"));
            def.description = t.description;
        }
        if (t.parameters != nullptr) {
            GPTOSS_TRY(check_text(t.parameters, at + ".parameters"));
            std::string ignored;
            GPTOSS_TRY(h::schema_to_typescript(t.parameters, at + ".parameters", &ignored));
            def.has_parameters = true;
            def.parameters = t.parameters;
        }
        ns.tools.push_back(std::move(def));
    }
    c->has_developer = true;
    c->developer.namespaces.push_back(std::move(ns));
    return GPTOSS_OK;
}

// The role-specific part of message `at` (its content, channel and words already checked):
// an assistant message records its recipient in *called; a tool message must answer one of them.
gptoss_status build_message(const gptoss_message& m, const std::string& at, std::vector<std::string>* called,
                            h::Message* out_m) {
    const int role = enum_value(m.role);
    switch (role) {
    case GPTOSS_ROLE_USER:
        out_m->role = h::Role::User;
        return GPTOSS_OK;
    case GPTOSS_ROLE_ASSISTANT:
        out_m->role = h::Role::Assistant;
        // NONE renders no channel: the model does write such messages, and a result's
        // messages must render back as they were parsed.
        out_m->channel = channel_name(m.channel);
        if (m.recipient != nullptr) {
            out_m->recipient = m.recipient;
            called->push_back(m.recipient);
        }
        if (m.content_type != nullptr)
            // "json" is the documented shorthand for what the model writes: <|constrain|>json.
            out_m->content_type = std::strcmp(m.content_type, "json") == 0 ? "<|constrain|>json" : m.content_type;
        return GPTOSS_OK;
    case GPTOSS_ROLE_TOOL:
        out_m->role = h::Role::Tool;
        if (m.author == nullptr)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                        "%s.author: NULL; a tool message needs the tool's name, e.g. \"functions.get_weather\"",
                        at.c_str());
        GPTOSS_TRY(check_word(m.author, at + ".author"));
        if (std::find(called->begin(), called->end(), m.author) == called->end())
            return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                        "%s: a result from \"%s\" answers no earlier tool call (no assistant message before it "
                        "has recipient \"%s\")",
                        at.c_str(), m.author, m.author);
        out_m->name = m.author;
        out_m->channel = channel_name(m.channel);
        out_m->recipient = m.recipient != nullptr ? m.recipient : "assistant";
        if (m.content_type != nullptr) out_m->content_type = m.content_type;
        return GPTOSS_OK;
    default:
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.role: %d is not USER, ASSISTANT or TOOL", at.c_str(), role);
    }
}

// request.messages, checked, into c->messages.
gptoss_status build_messages(const gptoss_chat_request& in, h::Conversation* c) {
    std::vector<std::string> called;  // recipients of the tool calls so far
    for (size_t i = 0; i < in.n_messages; ++i) {
        const gptoss_message& m = in.messages[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        if (m.content == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.content: NULL", at.c_str());
        GPTOSS_TRY(check_text(m.content, at + ".content"));
        const int channel = enum_value(m.channel);
        if (channel < GPTOSS_CHANNEL_NONE || channel > GPTOSS_CHANNEL_FINAL)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.channel: %d is not a gptoss_channel", at.c_str(), channel);
        if (m.recipient != nullptr) GPTOSS_TRY(check_word(m.recipient, at + ".recipient"));
        if (m.content_type != nullptr) GPTOSS_TRY(check_word(m.content_type, at + ".content_type"));
        h::Message out_m;
        out_m.content = m.content;
        GPTOSS_TRY(build_message(m, at, &called, &out_m));
        c->messages.push_back(std::move(out_m));
    }
    return GPTOSS_OK;
}

// Validates `in` (already read with read_params) and builds the conversation gptoss_chat renders.
gptoss_status build_conversation(const gptoss_chat_request& in, h::Conversation* out) {
    if (in.n_messages > 0 && in.messages == nullptr)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "request.messages: NULL with n_messages %zu", in.n_messages);
    if (in.n_tools > 0 && in.tools == nullptr)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "request.tools: NULL with n_tools %zu", in.n_tools);
    const int effort = enum_value(in.reasoning_effort);
    if (effort < GPTOSS_REASONING_LOW || effort > GPTOSS_REASONING_HIGH)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "request.reasoning_effort: %d is not LOW, MEDIUM or HIGH", effort);
    h::Conversation c;
    c.has_system = true;
    static const char* efforts[] = {"low", "medium", "high"};
    c.system.reasoning = efforts[effort];
    if (in.current_date != nullptr) {
        GPTOSS_TRY(check_text(in.current_date, "request.current_date"));
        c.system.current_date = in.current_date;
    }
    if (in.instructions != nullptr) {
        GPTOSS_TRY(check_text(in.instructions, "request.instructions"));
        c.has_developer = true;
        c.developer.has_instructions = true;
        c.developer.instructions = in.instructions;
    }
    if (in.n_tools > 0) GPTOSS_TRY(build_tools(in, &c));
    GPTOSS_TRY(check_constraints(in, &c));
    GPTOSS_TRY(build_messages(in, &c));
    *out = std::move(c);
    return GPTOSS_OK;
}

gptoss_status read_request(const gptoss_chat_request* request, gptoss_chat_request* out) {
    if (request == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "request: NULL");
    gptoss_chat_request_init(out, sizeof *out);
    return read_params(request, out, "gptoss_chat_request");
}

// Renders the request. With `reuse_hint`, also stores where the next turn's prompt will
// diverge from this one if this turn ends in a final answer: CoT dropping then removes the
// analysis this prompt still carries (an unfinished tool loop's), so the next prompt shares
// only the tokens before the first such message. n_prompt when nothing would be dropped.
gptoss_status render_request(const gptoss_model* model, const gptoss_chat_request& request,
                             std::vector<int32_t>* tokens, uint32_t* reuse_hint = nullptr) {
    if (model->tokenizer == nullptr)
        return fail(GPTOSS_ERR_UNSUPPORTED, "chat: the model has no tokenizer (tokenizer.json missing from its directory)");
    h::Conversation conversation;
    GPTOSS_TRY(build_conversation(request, &conversation));
    h::RenderOptions options;
    options.cot_drop = request.keep_analysis ? h::CotDrop::Keep : h::CotDrop::Finished;
    std::vector<h::Piece> pieces;
    GPTOSS_TRY(h::render(conversation, options, &pieces));
    GPTOSS_TRY(h::pieces_tokens(*model->tokenizer, pieces, tokens));
    if (reuse_hint == nullptr) return GPTOSS_OK;
    *reuse_hint = uint32_t(tokens->size());
    if (request.keep_analysis) return GPTOSS_OK;
    options.cot_drop = h::CotDrop::All;
    std::vector<int32_t> finished;
    GPTOSS_TRY(h::render(conversation, options, &pieces));
    GPTOSS_TRY(h::pieces_tokens(*model->tokenizer, pieces, &finished));
    size_t common = 0;
    while (common < finished.size() && common < tokens->size() && finished[common] == (*tokens)[common]) ++common;
    *reuse_hint = uint32_t(common);
    return GPTOSS_OK;
}

// session_generate snapshots the sliding-window rings at the end of the prefill (API.md §6).
// When GenerateOptions grows a `snapshot_at` position (asked of gptoss.cpp: snapshot there
// instead), pass the reuse hint, so the turn after a tool loop's final answer can restart
// where CoT dropping makes it diverge; until then this compiles to nothing.
template <typename T, typename = void>
struct HasSnapshotAt : std::false_type {};
template <typename T>
struct HasSnapshotAt<T, std::void_t<decltype(std::declval<T&>().snapshot_at)>> : std::true_type {};
template <typename T>
void set_snapshot_at(T* options, uint32_t position) {
    if constexpr (HasSnapshotAt<T>::value) options->snapshot_at = position;
    else (void)options, (void)position;
}

// Storage behind one gptoss_chat_result; lives in session->chat_result.
struct ChatResult {
    gptoss_chat_result result{};
    std::deque<std::string> strings;
    std::vector<gptoss_message> messages;
    std::vector<gptoss_tool_call> tool_calls;
    const char* keep(std::string text) {
        strings.push_back(std::move(text));
        return strings.back().c_str();
    }
};

// One parsed message of the completion into r: the assistant's messages become result
// messages, those with a recipient also tool calls; final and analysis text are collected. What
// the model writes in another role (a hallucinated tool result or user turn) stays in raw only,
// so that appending result->messages to the history is always a valid request.
void keep_message(const h::ParsedMessage& m, ChatResult& r, std::string* final_text, std::string* analysis_text) {
    if (!m.header_clean || m.role != h::Role::Assistant)
        log(GPTOSS_LOG_DEBUG, "chat: %s message (role %s, channel \"%s\", recipient \"%s\")%s; raw keeps the text",
            m.header_clean ? "kept out a" : "repaired the header of a", h::role_name(m.role), m.channel.c_str(),
            m.recipient.c_str(), m.role != h::Role::Assistant ? " not from the assistant" : "");
    if (m.role != h::Role::Assistant) return;
    gptoss_message out{};
    out.role = GPTOSS_ROLE_ASSISTANT;
    out.channel = channel_enum(m.channel);
    out.content = r.keep(m.content);
    out.recipient = m.recipient.empty() ? nullptr : r.keep(m.recipient);
    out.content_type = m.content_type.empty() ? nullptr : r.keep(m.content_type);
    r.messages.push_back(out);
    if (!m.recipient.empty()) {
        gptoss_tool_call call{};
        const size_t dot = m.recipient.find('.');
        call.name = r.keep(dot == std::string::npos ? m.recipient : m.recipient.substr(dot + 1));
        call.recipient = out.recipient;
        call.arguments = out.content;
        std::string type = m.content_type;
        if (type.compare(0, 13, "<|constrain|>") == 0) type.erase(0, 13);
        call.content_type = type.empty() ? nullptr : r.keep(type);
        r.tool_calls.push_back(call);
    } else if (m.channel == "final") {
        *final_text += m.content;
    } else if (m.channel == "analysis") {
        if (!analysis_text->empty()) *analysis_text += "\n";
        *analysis_text += m.content;
    }
}

// gptoss_chat's result (API.md §2) from the completion's parsed messages and tokens.
gptoss_status build_chat_result(const std::vector<h::ParsedMessage>& messages, const Tokenizer& tokenizer,
                                const GenerateOutput& output, ChatResult* storage) {
    ChatResult& r = *storage;
    std::string final_text, analysis_text;
    for (const h::ParsedMessage& m : messages) keep_message(m, r, &final_text, &analysis_text);
    // raw: the completion with specials spelled out, as valid UTF-8.
    std::string raw_bytes, raw;
    GPTOSS_TRY(tokenizer.decode(output.tokens.data(), output.tokens.size(), &raw_bytes));
    Utf8StreamDecoder utf8;
    utf8.push(raw_bytes, &raw);
    utf8.flush(&raw);
    gptoss_chat_result& res = r.result;
    res.struct_size = sizeof res;
    res.final = r.keep(final_text);
    res.analysis = r.keep(analysis_text);
    res.tool_calls = r.tool_calls.empty() ? nullptr : r.tool_calls.data();
    res.n_tool_calls = r.tool_calls.size();
    res.messages = r.messages.empty() ? nullptr : r.messages.data();
    res.n_messages = r.messages.size();
    res.stop_reason = output.stop_reason;
    res.raw = r.keep(raw);
    res.n_prompt_tokens = output.n_prompt_tokens;
    res.n_cached_tokens = output.n_cached_tokens;
    res.n_completion_tokens = uint32_t(output.tokens.size());
    res.prefill_ms = output.prefill_ms;
    res.decode_ms = output.decode_ms;
    return GPTOSS_OK;
}

}  // namespace

gptoss_status render_request_text(const gptoss_chat_request& request, std::string* out) {
    h::Conversation conversation;
    GPTOSS_TRY(build_conversation(request, &conversation));
    h::RenderOptions options;
    options.cot_drop = request.keep_analysis ? h::CotDrop::Keep : h::CotDrop::Finished;
    std::vector<h::Piece> pieces;
    GPTOSS_TRY(h::render(conversation, options, &pieces));
    *out = h::pieces_text(pieces);
    return GPTOSS_OK;
}

// The extern "C" functions sit inside namespace gptoss only for name lookup; C linkage gives
// them their plain gptoss_* symbols.
extern "C" {

GPTOSS_API void gptoss_chat_request_init(gptoss_chat_request* request, size_t struct_size) {
    if (request == nullptr || struct_size < sizeof(uint32_t)) return;
    gptoss_chat_request defaults;
    std::memset(&defaults, 0, sizeof defaults);
    defaults.reasoning_effort = GPTOSS_REASONING_MEDIUM;
    defaults.constrain_tool_arguments = true;
    defaults.max_reasoning_tokens = UINT32_MAX;
    std::memset(request, 0, struct_size);
    std::memcpy(request, &defaults, std::min(struct_size, sizeof defaults));
    const uint32_t size32 = uint32_t(std::min<size_t>(struct_size, UINT32_MAX));
    std::memcpy(request, &size32, sizeof size32);
}

GPTOSS_API gptoss_status gptoss_chat_render(const gptoss_model* model, const gptoss_chat_request* request,
                                            int32_t* tokens, size_t capacity, size_t* n_tokens_out) {
    return guarded("gptoss_chat_render", [&]() -> gptoss_status {
        if (model == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_chat_render: model is NULL");
        if (n_tokens_out == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_chat_render: n_tokens_out is NULL");
        if (tokens == nullptr && capacity > 0)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_chat_render: tokens is NULL but capacity is %zu", capacity);
        gptoss_chat_request req;
        GPTOSS_TRY(read_request(request, &req));
        std::vector<int32_t> rendered;
        GPTOSS_TRY(render_request(model, req, &rendered));
        *n_tokens_out = rendered.size();
        if (rendered.size() > capacity)
            return fail(GPTOSS_ERR_BUFFER_TOO_SMALL, "gptoss_chat_render: %zu tokens do not fit capacity %zu",
                        rendered.size(), capacity);
        std::copy(rendered.begin(), rendered.end(), tokens);
        return GPTOSS_OK;
    });
}

GPTOSS_API gptoss_status gptoss_chat(gptoss_session* session, const gptoss_chat_request* request,
                                     const gptoss_sampling_params* sampling, gptoss_event_fn on_event, void* user_data,
                                     const gptoss_chat_result** result_out) {
    if (result_out != nullptr) *result_out = nullptr;
    if (session == nullptr)
        return guarded("gptoss_chat", [] { return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_chat: session is NULL"); });
    session->cancel_requested.store(false);
    session->running.store(true);
    const gptoss_status status = guarded("gptoss_chat", [&]() -> gptoss_status {
        if (result_out == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_chat: result_out is NULL");
        gptoss_chat_request req;
        GPTOSS_TRY(read_request(request, &req));
        std::vector<int32_t> prompt;
        uint32_t reuse_hint = 0;
        GPTOSS_TRY(render_request(session->model, req, &prompt, &reuse_hint));
        const Tokenizer& tokenizer = *session->model->tokenizer;

        gptoss_sampling_params params;
        gptoss_sampling_params_init(&params, sizeof params);
        if (sampling != nullptr) GPTOSS_TRY(read_params(sampling, &params, "gptoss_sampling_params"));
        GenerateOptions options;
        GPTOSS_TRY(make_generate_options(params, &options));
        // <|end|> closes every analysis message, so it must never stop sampling (HARMONY.md §2.7).
        options.stop_tokens = {h::kReturn, h::kCall, h::kEndOfText};
        GPTOSS_TRY(chat_constraint(session->model, req, &options.constraint));
        set_snapshot_at(&options, reuse_hint);

        h::ChatStream stream(tokenizer,
                             std::vector<std::string>(params.stop_strings, params.stop_strings + params.n_stop_strings));
        options.on_token = [&](int32_t token) -> int {
            gptoss_event event;
            const bool stop = stream.push(token, &event);
            if (on_event != nullptr && !on_event(user_data, &event)) return GPTOSS_STOP_CANCELLED;
            return stop ? GPTOSS_STOP_STRING : kContinue;
        };
        GenerateOutput output;
        GPTOSS_TRY(session_generate(session, prompt.data(), prompt.size(), options, &output));
        stream.finish();

        // Build the new result, then swap (API.md §2).
        auto storage = std::make_shared<ChatResult>();
        GPTOSS_TRY(build_chat_result(stream.messages(), tokenizer, output, storage.get()));
        gptoss_chat_result& res = storage->result;
        session->chat_result_previous = std::move(session->chat_result);
        session->chat_result = storage;
        *result_out = &res;
        return GPTOSS_OK;
    });
    session->running.store(false);
    return status;
}

GPTOSS_API gptoss_status gptoss_conversation_parse_json(const char* json, size_t json_len,
                                                        gptoss_conversation** conversation_out) {
    if (conversation_out != nullptr) *conversation_out = nullptr;
    return guarded("gptoss_conversation_parse_json", [&]() -> gptoss_status {
        if (conversation_out == nullptr)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_conversation_parse_json: conversation_out is NULL");
        if (json == nullptr && json_len > 0)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "gptoss_conversation_parse_json: json is NULL but json_len is %zu",
                        json_len);
        std::unique_ptr<gptoss_conversation> conversation(new gptoss_conversation());
        GPTOSS_TRY(parse_chat_completions_json(json == nullptr ? "" : json, json_len, &conversation->storage));
        *conversation_out = conversation.release();
        return GPTOSS_OK;
    });
}

GPTOSS_API const gptoss_chat_request* gptoss_conversation_get_request(const gptoss_conversation* conversation) {
    return conversation == nullptr ? nullptr : &conversation->storage.request;
}

GPTOSS_API void gptoss_conversation_free(gptoss_conversation* conversation) { delete conversation; }

}  // extern "C"

}  // namespace gptoss
