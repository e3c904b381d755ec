// tokenizer/openai-json.cpp - the OpenAI Chat Completions shapes over the public API (see
// openai-json.h). Built as the static library gptoss_openai, not into libgptoss: it includes
// gptoss.h only, so it is a customer of the API like the tools that use it.
#include "tokenizer/openai-json.h"

#include "tokenizer/json-dom.h"

#include <simdjson.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

namespace gptoss::openai {

// --- JSON text -------------------------------------------------------------------------------

// Appends `s` as a JSON string. Invalid UTF-8 (a cancelled turn can end inside a character)
// becomes U+FFFD, so the output always parses.
void json_string(std::string& out, std::string_view s) {
    out += '"';
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (c < 0x80) {
            switch (c) {
                case '"': out += "\\\""; break;
                case '\\': out += "\\\\"; break;
                case '\n': out += "\\n"; break;
                case '\r': out += "\\r"; break;
                case '\t': out += "\\t"; break;
                case '\b': out += "\\b"; break;
                case '\f': out += "\\f"; break;
                default:
                    if (c < 0x20) {
                        char buf[8];
                        std::snprintf(buf, sizeof buf, "\\u%04x", c);
                        out += buf;
                    } else {
                        out += char(c);
                    }
            }
            ++i;
            continue;
        }
        size_t len = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
        bool ok = len != 0 && i + len <= s.size();
        uint32_t cp = 0;
        if (ok) {
            cp = c & (0x7f >> len);
            for (size_t k = 1; k < len && ok; ++k) {
                unsigned char cc = static_cast<unsigned char>(s[i + k]);
                if ((cc & 0xc0) != 0x80) ok = false;
                cp = (cp << 6) | (cc & 0x3f);
            }
            // Overlong forms, surrogates and values beyond U+10FFFF are not UTF-8 either.
            static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
            if (ok && (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))) ok = false;
        }
        if (ok) {
            out.append(s.data() + i, len);
            i += len;
        } else {
            out += "\xef\xbf\xbd";
            ++i;
        }
    }
    out += '"';
}

std::string json_str(std::string_view s) {
    std::string out;
    json_string(out, s);
    return out;
}

// --- conversations ---------------------------------------------------------------------------

bool parse_effort(std::string_view s, gptoss_reasoning_effort* out) {
    if (s == "low") *out = GPTOSS_REASONING_LOW;
    else if (s == "medium") *out = GPTOSS_REASONING_MEDIUM;
    else if (s == "high") *out = GPTOSS_REASONING_HIGH;
    else return false;
    return true;
}

const char* effort_name(gptoss_reasoning_effort e) {
    switch (e) {
        case GPTOSS_REASONING_LOW: return "low";
        case GPTOSS_REASONING_HIGH: return "high";
        default: return "medium";
    }
}

namespace {

std::optional<std::string> opt(const char* s) {
    if (!s) return std::nullopt;
    return std::string(s);
}

}  // namespace

Message copy_message(const gptoss_message& m) {
    Message out;
    out.role = m.role;
    out.channel = m.channel;
    out.content = m.content ? m.content : "";
    out.author = opt(m.author);
    out.recipient = opt(m.recipient);
    out.content_type = opt(m.content_type);
    return out;
}

bool parse_conversation(const std::string& json, const std::string& what, ParsedConversation& out, std::string& err) {
    gptoss_conversation* conv = nullptr;
    gptoss_status st = gptoss_conversation_parse_json(json.data(), json.size(), &conv);
    if (st != GPTOSS_OK) {
        err = what + ": " + gptoss_last_error();
        return false;
    }
    const gptoss_chat_request* req = gptoss_conversation_get_request(conv);
    Conversation& c = out.conversation;
    c.instructions = opt(req->instructions);
    out.has_instructions = req->instructions != nullptr;
    c.effort = req->reasoning_effort;
    c.tool_choice = req->tool_choice;
    c.tool_choice_name = req->tool_choice_name ? req->tool_choice_name : "";
    c.response_format = req->response_format;
    c.response_format_name = req->response_format_name ? req->response_format_name : "";
    c.response_format_description = req->response_format_description ? req->response_format_description : "";
    c.response_format_schema = req->response_format_schema ? req->response_format_schema : "";
    c.max_reasoning_tokens = req->max_reasoning_tokens;
    for (size_t i = 0; i < req->n_messages; ++i) c.messages.push_back(copy_message(req->messages[i]));
    for (size_t i = 0; i < req->n_tools; ++i) {
        const gptoss_tool& t = req->tools[i];
        c.tools.push_back({t.name ? t.name : "", t.description ? t.description : "", opt(t.parameters)});
    }
    gptoss_conversation_free(conv);
    return true;
}

std::string function_name(const std::string& recipient) {
    const std::string prefix = "functions.";
    return recipient.rfind(prefix, 0) == 0 ? recipient.substr(prefix.size()) : recipient;
}

namespace {

// One OpenAI-shaped assistant message, assembled from consecutive Harmony assistant messages.
struct OpenAIAssistant {
    std::string reasoning, content;
    bool has_reasoning = false, has_content = false;
    struct Call { std::string id, name, arguments; };
    std::vector<Call> calls;
    bool empty() const { return !has_reasoning && !has_content && calls.empty(); }
};

void write_assistant(std::string& out, const OpenAIAssistant& a) {
    out += "{\"role\":\"assistant\"";
    if (a.has_reasoning) { out += ",\"reasoning_content\":"; json_string(out, a.reasoning); }
    out += ",\"content\":";
    if (a.has_content || a.calls.empty()) json_string(out, a.content);
    else out += "null";
    if (!a.calls.empty()) {
        out += ",\"tool_calls\":[";
        for (size_t i = 0; i < a.calls.size(); ++i) {
            if (i) out += ",";
            out += "{\"id\":" + json_str(a.calls[i].id) + ",\"type\":\"function\",\"function\":{\"name\":" +
                   json_str(a.calls[i].name) + ",\"arguments\":" + json_str(a.calls[i].arguments) + "}}";
        }
        out += "]";
    }
    out += "}";
}

}  // namespace

// Writes the "messages" array in the OpenAI Chat Completions shape that
// gptoss_conversation_parse_json reads back. Consecutive Harmony assistant messages merge into
// one OpenAI message in the order analysis, text, tool calls; a message that would break that
// order starts a new one. Tool results carry the id of the call they answer.
std::string messages_json(const Conversation& c) {
    std::string out = "[";
    bool first = true;
    auto sep = [&]() { if (!first) out += ",\n    "; first = false; };
    if (c.instructions) {
        sep();
        out += "{\"role\":\"developer\",\"content\":" + json_str(*c.instructions) + "}";
    }
    int next_call_id = 1;
    std::vector<std::pair<std::string, std::string>> open_calls;  // (name, id) awaiting a result
    OpenAIAssistant pending;
    int pending_rank = -1;
    auto flush = [&]() {
        if (!pending.empty()) { sep(); write_assistant(out, pending); }
        pending = OpenAIAssistant();
        pending_rank = -1;
    };
    for (const Message& m : c.messages) {
        if (m.role == GPTOSS_ROLE_ASSISTANT) {
            int rank = m.recipient ? 2 : m.channel == GPTOSS_CHANNEL_ANALYSIS ? 0 : 1;
            if (rank < pending_rank || (rank == pending_rank && rank != 2)) flush();
            pending_rank = rank;
            if (rank == 0) { pending.reasoning = m.content; pending.has_reasoning = true; }
            else if (rank == 1) { pending.content = m.content; pending.has_content = true; }
            else {
                std::string id = "call_" + std::to_string(next_call_id++);
                std::string name = function_name(*m.recipient);
                pending.calls.push_back({id, name, m.content});
                open_calls.emplace_back(name, id);
            }
            continue;
        }
        flush();
        sep();
        if (m.role == GPTOSS_ROLE_USER) {
            out += "{\"role\":\"user\",\"content\":" + json_str(m.content) + "}";
        } else {
            std::string name = function_name(m.author.value_or(""));
            std::string id;
            for (auto it = open_calls.begin(); it != open_calls.end(); ++it) {
                if (it->first == name) { id = it->second; open_calls.erase(it); break; }
            }
            out += "{\"role\":\"tool\"";
            if (!id.empty()) out += ",\"tool_call_id\":" + json_str(id);
            out += ",\"name\":" + json_str(name) + ",\"content\":" + json_str(m.content) + "}";
        }
    }
    flush();
    out += "]";
    return out;
}

std::string tools_json(const std::vector<Tool>& tools) {
    std::string out = "[";
    for (size_t i = 0; i < tools.size(); ++i) {
        if (i) out += ",\n    ";
        out += "{\"type\":\"function\",\"function\":{\"name\":" + json_str(tools[i].name) +
               ",\"description\":" + json_str(tools[i].description);
        // The schema is JSON text already; it was validated by the parser that produced it.
        if (tools[i].parameters) out += ",\"parameters\":" + *tools[i].parameters;
        out += "}}";
    }
    out += "]";
    return out;
}

// The body shared by /save and --json: a valid input for --conversation and /load.
// The request's constrained-decoding fields as OpenAI JSON members (each ",\n  ..."), nothing
// for the defaults: tool_choice, response_format and vLLM's thinking_token_budget.
static std::string constraint_fields_json(const Conversation& c) {
    std::string out;
    switch (c.tool_choice) {
        case GPTOSS_TOOL_CHOICE_NONE: out += ",\n  \"tool_choice\": \"none\""; break;
        case GPTOSS_TOOL_CHOICE_REQUIRED: out += ",\n  \"tool_choice\": \"required\""; break;
        case GPTOSS_TOOL_CHOICE_NAMED:
            out += ",\n  \"tool_choice\": {\"type\":\"function\",\"function\":{\"name\":" + json_str(c.tool_choice_name) + "}}";
            break;
        default: break;
    }
    if (c.response_format == GPTOSS_RESPONSE_FORMAT_JSON_OBJECT) {
        out += ",\n  \"response_format\": {\"type\":\"json_object\"}";
    } else if (c.response_format == GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA) {
        out += ",\n  \"response_format\": {\"type\":\"json_schema\",\"json_schema\":{\"name\":" + json_str(c.response_format_name);
        if (!c.response_format_description.empty()) out += ",\"description\":" + json_str(c.response_format_description);
        out += ",\"schema\":" + c.response_format_schema + "}}";  // the schema's own JSON text
    }
    if (c.max_reasoning_tokens != UINT32_MAX)
        out += ",\n  \"thinking_token_budget\": " + std::to_string(c.max_reasoning_tokens);
    return out;
}

std::string conversation_json_fields(const Conversation& c) {
    std::string out = "  \"reasoning_effort\": " + json_str(effort_name(c.effort)) + ",\n";
    out += "  \"messages\": " + messages_json(c);
    if (!c.tools.empty()) out += ",\n  \"tools\": " + tools_json(c.tools);
    return out + constraint_fields_json(c);
}

const char* stop_reason_name(gptoss_stop_reason r) {
    switch (r) {
        case GPTOSS_STOP_RETURN: return "return";
        case GPTOSS_STOP_CALL: return "call";
        case GPTOSS_STOP_TOKEN: return "stop token";
        case GPTOSS_STOP_STRING: return "stop string";
        case GPTOSS_STOP_MAX_TOKENS: return "max tokens";
        case GPTOSS_STOP_CONTEXT_FULL: return "context full";
        case GPTOSS_STOP_CANCELLED: return "cancelled";
    }
    return "unknown";
}

const char* finish_reason(gptoss_stop_reason r) {
    switch (r) {
        case GPTOSS_STOP_CALL: return "tool_calls";
        case GPTOSS_STOP_MAX_TOKENS:
        case GPTOSS_STOP_CONTEXT_FULL: return "length";
        case GPTOSS_STOP_CANCELLED: return "cancelled";
        default: return "stop";
    }
}

// --- requests --------------------------------------------------------------------------------

std::string error_json(const Error& error, const char* type, const char* code) {
    std::string out = "{\"error\":{\"message\":" + json_str(error.message) + ",\"type\":" + json_str(type) +
                      ",\"param\":" + (error.param.empty() ? std::string("null") : json_str(error.param)) +
                      ",\"code\":" + (code && *code ? json_str(code) : std::string("null")) + "}}";
    return out;
}

const char* CompletionRequest::keep(std::string text) {
    strings_->push_back(std::move(text));
    return strings_->back().c_str();
}

gptoss_sampling_params CompletionRequest::sampling() const {
    gptoss_sampling_params p = gptoss_sampling_default_params();
    p.temperature = temperature;
    p.top_p = top_p;
    p.seed = seed;
    p.max_tokens = max_tokens;
    stop_ptrs_.clear();
    for (const std::string& s : stop) stop_ptrs_.push_back(s.c_str());
    p.stop_strings = stop_ptrs_.empty() ? nullptr : stop_ptrs_.data();
    p.n_stop_strings = stop_ptrs_.size();
    return p;
}

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

using json::type_name;

bool fail(Error* error, std::string param, std::string message) {
    error->message = param.empty() ? message : param + ": " + message;
    error->param = std::move(param);
    return false;
}

bool wrong_type(Error* error, const std::string& param, const char* expected, element e) {
    return fail(error, param, std::string("expected ") + expected + ", found " + type_name(e));
}

// The field `key` of `object`, if present and not null.
// A member that is present and not null (OpenAI clients send null for "not set").
bool field(element object, const char* key, element* out) {
    return json::field(object, key, out) && out->type() != element_type::NULL_VALUE;
}

bool number(element e, const std::string& param, double* out, Error* error) {
    if (e.get_double().get(*out) != simdjson::SUCCESS) return wrong_type(error, param, "a number", e);
    return true;
}

bool boolean(element e, const std::string& param, bool* out, Error* error) {
    if (e.get_bool().get(*out) != simdjson::SUCCESS) return wrong_type(error, param, "a boolean", e);
    return true;
}

bool string(element e, const std::string& param, std::string* out, Error* error) {
    std::string_view s;
    if (e.get_string().get(s) != simdjson::SUCCESS) return wrong_type(error, param, "a string", e);
    out->assign(s);
    return true;
}

// A count the API takes as an integer >= 1 (max_tokens, n).
bool count(element e, const std::string& param, uint64_t* out, Error* error) {
    int64_t v = 0;
    if (e.type() == element_type::UINT64) {
        *out = e.get_uint64().value();
        return true;
    }
    if (e.get_int64().get(v) != simdjson::SUCCESS) return wrong_type(error, param, "an integer", e);
    if (v < 1) return fail(error, param, std::to_string(v) + " is less than 1");
    *out = uint64_t(v);
    return true;
}

bool parse_sampling(element root, CompletionRequest* out, Error* error) {
    element e;
    double v = 0;
    if (field(root, "temperature", &e)) {
        if (!number(e, "temperature", &v, error)) return false;
        if (!(v >= 0 && v <= 2)) return fail(error, "temperature", std::to_string(v) + " is outside [0, 2]");
        out->temperature = float(v);
    }
    if (field(root, "top_p", &e)) {
        if (!number(e, "top_p", &v, error)) return false;
        if (!(v > 0 && v <= 1)) return fail(error, "top_p", std::to_string(v) + " is outside (0, 1]");
        out->top_p = float(v);
    }
    for (const char* key : {"max_tokens", "max_completion_tokens"}) {  // the newer name wins
        uint64_t n = 0;
        if (!field(root, key, &e)) continue;
        if (!count(e, key, &n, error)) return false;
        if (n > UINT32_MAX) return fail(error, key, std::to_string(n) + " is too large");
        out->max_tokens = uint32_t(n);
    }
    if (field(root, "seed", &e)) {
        int64_t s = 0;
        if (e.type() == element_type::UINT64) out->seed = e.get_uint64().value();
        else if (e.get_int64().get(s) == simdjson::SUCCESS) out->seed = uint64_t(s);
        else return wrong_type(error, "seed", "an integer", e);
    }
    if (field(root, "stop", &e)) {
        if (e.type() == element_type::STRING) {
            out->stop.emplace_back(e.get_string().value());
        } else if (e.type() == element_type::ARRAY) {
            size_t i = 0;
            for (element s : e.get_array()) {
                const std::string at = "stop[" + std::to_string(i++) + "]";
                std::string text;
                if (!string(s, at, &text, error)) return false;
                out->stop.push_back(std::move(text));
            }
        } else {
            return wrong_type(error, "stop", "a string or an array of strings", e);
        }
        for (size_t i = 0; i < out->stop.size(); ++i)
            if (out->stop[i].empty())
                return fail(error, e.type() == element_type::STRING ? "stop" : "stop[" + std::to_string(i) + "]",
                            "empty");
    }
    return true;
}

// tool_choice: "auto" | "none" | "required" | {"type":"function","function":{"name":NAME}}.
bool parse_tool_choice(element root, CompletionRequest* out, Error* error) {
    element e, function, name_e;
    if (!field(root, "tool_choice", &e)) return true;
    if (e.type() == element_type::OBJECT) {
        std::string name;
        if (!field(e, "function", &function)) return fail(error, "tool_choice.function", "missing");
        if (function.type() != element_type::OBJECT) return wrong_type(error, "tool_choice.function", "an object", function);
        if (!field(function, "name", &name_e)) return fail(error, "tool_choice.function.name", "missing");
        if (!string(name_e, "tool_choice.function.name", &name, error)) return false;
        out->chat.tool_choice = GPTOSS_TOOL_CHOICE_NAMED;
        out->chat.tool_choice_name = out->keep(std::move(name));
        return true;
    }
    std::string choice;
    if (!string(e, "tool_choice", &choice, error)) return false;
    if (choice == "none") out->chat.tool_choice = GPTOSS_TOOL_CHOICE_NONE;
    else if (choice == "required") out->chat.tool_choice = GPTOSS_TOOL_CHOICE_REQUIRED;
    else if (choice != "auto")
        return fail(error, "tool_choice", "\"" + choice + "\" is not \"auto\", \"none\", \"required\" or a function");
    return true;
}

// response_format: {"type":"text"} | {"type":"json_object"} |
// {"type":"json_schema","json_schema":{"name":...,"description":...,"schema":{...}}}.
bool parse_response_format(element root, CompletionRequest* out, Error* error) {
    element e, type_e, js, v;
    std::string type, text;
    if (!field(root, "response_format", &e)) return true;
    if (e.type() != element_type::OBJECT) return wrong_type(error, "response_format", "an object", e);
    if (!field(e, "type", &type_e)) return fail(error, "response_format.type", "missing");
    if (!string(type_e, "response_format.type", &type, error)) return false;
    gptoss_chat_request& c = out->chat;
    if (type == "text") return true;
    if (type == "json_object") {
        c.response_format = GPTOSS_RESPONSE_FORMAT_JSON_OBJECT;
        return true;
    }
    if (type != "json_schema")
        return fail(error, "response_format.type", "\"" + type + "\" is not \"text\", \"json_object\" or \"json_schema\"");
    if (!field(e, "json_schema", &js)) return fail(error, "response_format.json_schema", "missing");
    if (js.type() != element_type::OBJECT) return wrong_type(error, "response_format.json_schema", "an object", js);
    c.response_format = GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA;
    if (!field(js, "name", &v)) return fail(error, "response_format.json_schema.name", "missing");
    if (!string(v, "response_format.json_schema.name", &text, error)) return false;
    c.response_format_name = out->keep(text);
    if (field(js, "description", &v)) {
        if (!string(v, "response_format.json_schema.description", &text, error)) return false;
        c.response_format_description = out->keep(text);
    }
    if (!field(js, "schema", &v)) return fail(error, "response_format.json_schema.schema", "missing");
    if (v.type() != element_type::OBJECT) return wrong_type(error, "response_format.json_schema.schema", "an object", v);
    c.response_format_schema = out->keep(simdjson::minify(v));
    return true;
}

// What the server cannot honour is refused, never silently ignored.
bool parse_unsupported(element root, Error* error) {
    element e;
    if (field(root, "n", &e)) {
        uint64_t n = 0;
        if (!count(e, "n", &n, error)) return false;
        if (n != 1) return fail(error, "n", "only 1 choice per request is supported");
    }
    bool flag = false;
    if (field(root, "logprobs", &e)) {
        if (!boolean(e, "logprobs", &flag, error)) return false;
        if (flag) return fail(error, "logprobs", "log probabilities are not supported");
    }
    for (const char* key : {"frequency_penalty", "presence_penalty"}) {
        double v = 0;
        if (!field(root, key, &e)) continue;
        if (!number(e, key, &v, error)) return false;
        if (v != 0) return fail(error, key, "penalties are not supported (only 0)");
    }
    return true;
}

bool parse_stream(element root, CompletionRequest* out, Error* error) {
    element e, usage;
    if (field(root, "stream", &e) && !boolean(e, "stream", &out->stream, error)) return false;
    if (field(root, "stream_options", &e)) {
        if (e.type() != element_type::OBJECT) return wrong_type(error, "stream_options", "an object", e);
        if (field(e, "include_usage", &usage) &&
            !boolean(usage, "stream_options.include_usage", &out->include_usage, error))
            return false;
    }
    return true;
}

// The library reports "messages[3].content: expected a string"; the part before ": " names the
// field when it is a JSON path (the library has no structured error field).
Error library_error(const char* message) {
    Error error{message, ""};
    const char* colon = std::strstr(message, ": ");
    if (colon != nullptr) {
        std::string path(message, size_t(colon - message));
        const bool is_path = !path.empty() && path.find(' ') == std::string::npos && path != "json" &&
                             path.rfind("gptoss_", 0) != 0;
        if (is_path) error.param = path;
    }
    return error;
}

}  // namespace

bool parse_completion_request(const char* json, size_t len, CompletionRequest* out, Error* error) {
    *out = CompletionRequest();
    simdjson::dom::parser parser;
    simdjson::padded_string padded(json, len);
    element root;
    const simdjson::error_code code = parser.parse(padded).get(root);
    if (code != simdjson::SUCCESS)
        return fail(error, "", std::string("the body is not valid JSON (") + simdjson::error_message(code) + ")");
    if (root.type() != element_type::OBJECT) return fail(error, "", std::string("the body is ") + type_name(root) +
                                                                      ", expected a JSON object");
    element e;
    if (field(root, "model", &e) && !string(e, "model", &out->model, error)) return false;
    if (!parse_sampling(root, out, error) || !parse_unsupported(root, error) || !parse_stream(root, out, error))
        return false;

    gptoss_conversation* conversation = nullptr;
    if (gptoss_conversation_parse_json(json, len, &conversation) != GPTOSS_OK) {
        *error = library_error(gptoss_last_error());
        return false;
    }
    out->conversation.reset(conversation, gptoss_conversation_free);
    gptoss_chat_request& c = out->chat;
    c = *gptoss_conversation_get_request(conversation);
    if (c.n_messages == 0) return fail(error, "messages", "empty, expected at least one message");
    if (!parse_tool_choice(root, out, error) || !parse_response_format(root, out, error)) return false;
    if (c.tool_choice == GPTOSS_TOOL_CHOICE_NAMED) {
        bool found = false;
        for (size_t i = 0; i < c.n_tools && !found; ++i) found = std::strcmp(c.tools[i].name, c.tool_choice_name) == 0;
        if (!found)
            return fail(error, "tool_choice.function.name", "\"" + std::string(c.tool_choice_name) + "\" is not in tools");
    }
    if (c.tool_choice == GPTOSS_TOOL_CHOICE_REQUIRED && c.n_tools == 0)
        return fail(error, "tool_choice", "\"required\" needs tools");
    return true;
}

Error request_error(const CompletionRequest& request, gptoss_status status, const std::string& message) {
    const gptoss_chat_request& c = request.chat;
    if (status == GPTOSS_ERR_UNSUPPORTED && c.tool_choice != GPTOSS_TOOL_CHOICE_AUTO)
        return {"tool_choice: not supported by this libgptoss (" + message + ")", "tool_choice"};
    if (status == GPTOSS_ERR_UNSUPPORTED && c.response_format != GPTOSS_RESPONSE_FORMAT_TEXT)
        return {"response_format: not supported by this libgptoss (" + message + ")", "response_format"};
    static const std::pair<const char*, const char*> kFields[] = {
        {"tool_choice_name", "tool_choice.function.name"},
        {"tool_choice", "tool_choice"},
        {"response_format_schema", "response_format.json_schema.schema"},
        {"response_format_name", "response_format.json_schema.name"},
        {"response_format_description", "response_format.json_schema.description"},
        {"response_format", "response_format"},
    };
    std::string text = message;
    if (text.rfind("request.", 0) == 0) text.erase(0, 8);
    for (const auto& [name, path] : kFields) {
        const size_t n = std::strlen(name);
        if (text.compare(0, n, name) != 0) continue;
        if (text.size() > n && text[n] != ':' && text[n] != '.' && text[n] != '[' && text[n] != ' ' && text[n] != '/') continue;
        Error e = library_error(text.c_str());
        e.message = path + text.substr(n);
        e.param = std::string(path) + (e.param.size() > n ? e.param.substr(n) : "");
        return e;
    }
    return {message, ""};
}

// --- replies ---------------------------------------------------------------------------------

Reply reply_from_result(const gptoss_chat_result& result, const std::function<std::string()>& new_id) {
    Reply reply;
    for (size_t i = 0; i < result.n_messages; ++i) {
        const gptoss_message& m = result.messages[i];
        const char* content = m.content ? m.content : "";
        if (m.recipient) {
            reply.calls.push_back({new_id(), function_name(m.recipient), content});
        } else if (m.channel == GPTOSS_CHANNEL_ANALYSIS) {
            if (!reply.reasoning.empty()) reply.reasoning += "\n";
            reply.reasoning += content;
        } else {
            reply.content += content;
        }
    }
    return reply;
}

std::string usage_json(const Usage& u) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "{\"prompt_tokens\":%u,\"completion_tokens\":%u,\"total_tokens\":%u,"
                  "\"prompt_tokens_details\":{\"cached_tokens\":%u}}",
                  u.prompt_tokens, u.completion_tokens, u.prompt_tokens + u.completion_tokens, u.cached_tokens);
    return buf;
}

const char* reply_finish_reason(gptoss_stop_reason stop, const Reply& reply) {
    if (stop == GPTOSS_STOP_MAX_TOKENS || stop == GPTOSS_STOP_CONTEXT_FULL) return "length";
    if (!reply.calls.empty()) return "tool_calls";
    return "stop";
}

namespace {

std::string tool_calls_json(const std::vector<ToolCall>& calls) {
    std::string out = "[";
    for (size_t i = 0; i < calls.size(); ++i) {
        if (i) out += ",";
        out += "{\"id\":" + json_str(calls[i].id) + ",\"type\":\"function\",\"function\":{\"name\":" +
               json_str(calls[i].name) + ",\"arguments\":" + json_str(calls[i].arguments) + "}}";
    }
    return out + "]";
}

Usage usage_of(const gptoss_chat_result& r) { return {r.n_prompt_tokens, r.n_completion_tokens, r.n_cached_tokens}; }

}  // namespace

std::string completion_json(const std::string& id, int64_t created, const std::string& model, const Reply& reply,
                            const char* finish_reason, const Usage& usage) {
    std::string message = "{\"role\":\"assistant\",\"content\":";
    message += reply.content.empty() && !reply.calls.empty() ? "null" : json_str(reply.content);
    if (!reply.reasoning.empty()) message += ",\"reasoning_content\":" + json_str(reply.reasoning);
    if (!reply.calls.empty()) message += ",\"tool_calls\":" + tool_calls_json(reply.calls);
    message += "}";
    return "{\"id\":" + json_str(id) + ",\"object\":\"chat.completion\",\"created\":" + std::to_string(created) +
           ",\"model\":" + json_str(model) + ",\"choices\":[{\"index\":0,\"message\":" + message +
           ",\"logprobs\":null,\"finish_reason\":" + json_str(finish_reason) + "}],\"usage\":" + usage_json(usage) +
           "}";
}

// --- streaming -------------------------------------------------------------------------------

StreamMapper::StreamMapper(std::string id, int64_t created, std::string model, bool include_usage,
                           std::function<std::string()> new_id)
    : id_(std::move(id)), model_(std::move(model)), created_(created), include_usage_(include_usage),
      new_id_(std::move(new_id)) {}

std::string StreamMapper::chunk(const std::string& delta, const char* finish_reason) const {
    std::string out = "data: {\"id\":" + json_str(id_) + ",\"object\":\"chat.completion.chunk\",\"created\":" +
                      std::to_string(created_) + ",\"model\":" + json_str(model_) +
                      ",\"choices\":[{\"index\":0,\"delta\":" + delta + ",\"logprobs\":null,\"finish_reason\":" +
                      (finish_reason ? json_str(finish_reason) : std::string("null")) + "}]";
    if (include_usage_) out += ",\"usage\":null";
    return out + "}\n\n";
}

std::string StreamMapper::first_chunk() { return chunk("{\"role\":\"assistant\",\"content\":\"\"}"); }

std::string StreamMapper::delta(Part part, std::string_view text) {
    if (text.empty()) return "";
    switch (part) {
    case Part::Reasoning:
        streamed_.reasoning += text;
        return chunk("{\"reasoning_content\":" + json_str(text) + "}");
    case Part::Content:
        streamed_.content += text;
        return chunk("{\"content\":" + json_str(text) + "}");
    case Part::Call:
        streamed_.calls.back().arguments += text;
        return chunk("{\"tool_calls\":[{\"index\":" + std::to_string(streamed_.calls.size() - 1) +
                     ",\"function\":{\"arguments\":" + json_str(text) + "}}]}");
    case Part::None: break;
    }
    return "";
}

std::string StreamMapper::call_start(std::string id, const std::string& name) {
    streamed_.calls.push_back({std::move(id), name, ""});
    const ToolCall& c = streamed_.calls.back();
    return chunk("{\"tool_calls\":[{\"index\":" + std::to_string(streamed_.calls.size() - 1) +
                 ",\"id\":" + json_str(c.id) + ",\"type\":\"function\",\"function\":{\"name\":" + json_str(c.name) +
                 ",\"arguments\":\"\"}}]}");
}

std::string StreamMapper::on_event(const gptoss_event& event) {
    if (event.channel == GPTOSS_CHANNEL_NONE && event.recipient == nullptr) {
        // A header token (no text), or text of a message without a channel: held back for finish().
        part_ = Part::None;
        return "";
    }
    const Part part = event.recipient ? Part::Call : event.channel == GPTOSS_CHANNEL_ANALYSIS ? Part::Reasoning
                                                                                              : Part::Content;
    std::string out;
    if (part != part_) {  // a new message
        if (part == Part::Call) out += call_start(new_id_(), function_name(event.recipient));
        if (part == Part::Reasoning && !streamed_.reasoning.empty()) out += delta(part, "\n");
        part_ = part;
    }
    out += delta(part, std::string_view(event.text ? event.text : "", event.text ? event.text_len : 0));
    return out;
}

std::string StreamMapper::finish(const gptoss_chat_result& result, Reply* reply_out) {
    size_t k = 0;
    Reply full = reply_from_result(result, [&] { return k < streamed_.calls.size() ? streamed_.calls[k++].id : new_id_(); });
    // The rest of each part, where what was streamed is a prefix of it (see the header).
    auto rest = [](const std::string& whole, const std::string& sent) -> std::string_view {
        if (whole.size() < sent.size() || whole.compare(0, sent.size(), sent) != 0) return {};
        return std::string_view(whole).substr(sent.size());
    };
    std::string out = delta(Part::Reasoning, rest(full.reasoning, streamed_.reasoning));
    out += delta(Part::Content, rest(full.content, streamed_.content));
    for (size_t i = 0; i < full.calls.size(); ++i) {
        if (i >= streamed_.calls.size()) {
            out += call_start(full.calls[i].id, full.calls[i].name);
        } else if (streamed_.calls[i].name != full.calls[i].name || i + 1 != streamed_.calls.size()) {
            continue;  // only the last streamed call can still grow
        }
        out += delta(Part::Call, rest(full.calls[i].arguments, streamed_.calls[i].arguments));
    }
    out += chunk("{}", reply_finish_reason(result.stop_reason, full));
    if (include_usage_)
        out += "data: {\"id\":" + json_str(id_) + ",\"object\":\"chat.completion.chunk\",\"created\":" +
               std::to_string(created_) + ",\"model\":" + json_str(model_) + ",\"choices\":[],\"usage\":" +
               usage_json(usage_of(result)) + "}\n\n";
    out += "data: [DONE]\n\n";
    part_ = Part::None;
    if (reply_out) *reply_out = std::move(full);
    return out;
}

}  // namespace gptoss::openai
