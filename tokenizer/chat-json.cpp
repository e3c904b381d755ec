// tokenizer/chat-json.cpp - OpenAI Chat Completions request body → gptoss_chat_request (see
// chat-json.h). System and developer messages become the instructions; assistant
// reasoning_content/thinking becomes an analysis message, content a final message (a preamble
// on commentary when tool_calls follow), each tool call a commentary message to
// functions.NAME with content type json; tool messages find their function through
// tool_call_id (or name). Parsed with simdjson's DOM, which also rejects invalid UTF-8.
#include "tokenizer/chat-json.h"

#include "gptoss-internal.h"
#include "tokenizer/harmony.h"
#include "tokenizer/json-dom.h"

#include <simdjson.h>

#include <map>

namespace gptoss {

size_t first_invalid_utf8(const char* text, size_t len) {
    const unsigned char* s = reinterpret_cast<const unsigned char*>(text);
    size_t i = 0;
    while (i < len) {
        const unsigned char c = s[i];
        size_t n;
        uint32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 4;
            cp = c & 0x07;
        } else {
            return i;
        }
        if (i + n > len) return i;
        for (size_t k = 1; k < n; ++k) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += n;
    }
    return len;
}

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

using json::type_name;
using json::field;


gptoss_status get_string(element e, const std::string& where, std::string* out) {
    std::string_view s;
    if (e.get_string().get(s) != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected a string, found %s", where.c_str(), type_name(e));
    out->assign(s);
    return GPTOSS_OK;
}

// "content": a string, null, or an array of {"type":"text","text":...} parts (concatenated).
gptoss_status get_content(element message, const std::string& where, bool* present, std::string* out) {
    out->clear();
    element content;
    *present = field(message, "content", &content) && content.type() != element_type::NULL_VALUE;
    if (!*present) return GPTOSS_OK;
    const std::string at = where + ".content";
    if (content.type() == element_type::STRING) return get_string(content, at, out);
    if (content.type() != element_type::ARRAY)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected a string or an array of text parts, found %s",
                    at.c_str(), type_name(content));
    simdjson::dom::array parts = content.get_array().value();
    size_t j = 0;
    for (element part : parts) {
        const std::string part_at = at + "[" + std::to_string(j++) + "]";
        if (part.type() != element_type::OBJECT)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected an object, found %s", part_at.c_str(), type_name(part));
        element type, text;
        std::string type_text;
        if (!field(part, "type", &type)) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.type: missing", part_at.c_str());
        GPTOSS_TRY(get_string(type, part_at + ".type", &type_text));
        if (type_text != "text")
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.type: \"%s\" is not supported, expected \"text\"",
                        part_at.c_str(), type_text.c_str());
        if (!field(part, "text", &text)) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.text: missing", part_at.c_str());
        std::string piece;
        GPTOSS_TRY(get_string(text, part_at + ".text", &piece));
        *out += piece;
    }
    return GPTOSS_OK;
}

// "tool_choice": "auto" | "none" | "required" | {"type":"function","function":{"name":...}}.
gptoss_status parse_tool_choice(element e, ChatRequestStorage* out) {
    element inner, v;
    std::string choice;
    if (e.type() == element_type::STRING) {
        GPTOSS_TRY(get_string(e, "tool_choice", &choice));
        if (choice == "auto") out->request.tool_choice = GPTOSS_TOOL_CHOICE_AUTO;
        else if (choice == "none") out->request.tool_choice = GPTOSS_TOOL_CHOICE_NONE;
        else if (choice == "required") out->request.tool_choice = GPTOSS_TOOL_CHOICE_REQUIRED;
        else
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "tool_choice: \"%s\" is not auto, none or required",
                        choice.c_str());
        return GPTOSS_OK;
    }
    if (e.type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "tool_choice: expected a string or an object, found %s", type_name(e));
    if (!field(e, "function", &inner))
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "tool_choice.function: missing (an object with a name)");
    if (inner.type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "tool_choice.function: expected an object with a name, found %s",
                    type_name(inner));
    if (!field(inner, "name", &v)) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "tool_choice.function.name: missing");
    GPTOSS_TRY(get_string(v, "tool_choice.function.name", &choice));
    out->request.tool_choice = GPTOSS_TOOL_CHOICE_NAMED;
    out->request.tool_choice_name = out->keep(choice);
    return GPTOSS_OK;
}

// "response_format": {"type":"text"|"json_object"} | {"type":"json_schema","json_schema":
// {"name", "description"?, "schema"}} (constrained decoding, README "Structured output").
gptoss_status parse_response_format(element e, ChatRequestStorage* out) {
    element inner, v;
    if (e.type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "response_format: expected an object, found %s", type_name(e));
    std::string type;
    if (!field(e, "type", &v)) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "response_format.type: missing");
    GPTOSS_TRY(get_string(v, "response_format.type", &type));
    if (type == "text") return GPTOSS_OK;
    if (type == "json_object") {
        out->request.response_format = GPTOSS_RESPONSE_FORMAT_JSON_OBJECT;
        return GPTOSS_OK;
    }
    if (type != "json_schema")
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "response_format.type: \"%s\" is not text, json_object or json_schema",
                    type.c_str());
    if (!field(e, "json_schema", &inner))
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "response_format.json_schema: missing (type json_schema needs it)");
    if (inner.type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "response_format.json_schema: expected an object, found %s",
                    type_name(inner));
    std::string name, description;
    if (!field(inner, "name", &v)) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "response_format.json_schema.name: missing");
    GPTOSS_TRY(get_string(v, "response_format.json_schema.name", &name));
    if (field(inner, "description", &v) && v.type() != element_type::NULL_VALUE)
        GPTOSS_TRY(get_string(v, "response_format.json_schema.description", &description));
    if (!field(inner, "schema", &v))
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "response_format.json_schema.schema: missing");
    if (v.type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                    "response_format.json_schema.schema: expected an object (a JSON Schema), found %s", type_name(v));
    out->request.response_format = GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA;
    out->request.response_format_name = out->keep(name);
    if (!description.empty()) out->request.response_format_description = out->keep(description);
    out->request.response_format_schema = out->keep(simdjson::minify(v));
    return GPTOSS_OK;
}

// tool_choice and response_format, each absent or null for its default.
gptoss_status parse_constraints(element root, ChatRequestStorage* out) {
    element e;
    if (field(root, "tool_choice", &e) && e.type() != element_type::NULL_VALUE) GPTOSS_TRY(parse_tool_choice(e, out));
    if (field(root, "response_format", &e) && e.type() != element_type::NULL_VALUE)
        GPTOSS_TRY(parse_response_format(e, out));
    return GPTOSS_OK;
}

gptoss_message make_message(gptoss_role role, gptoss_channel channel) {
    gptoss_message m{};
    m.role = role;
    m.channel = channel;
    return m;
}

// Messages are collected with their strings first; pointers into the storage are made at the end.
struct Pending {
    gptoss_message message;
    std::string content, author, recipient, content_type;
};
struct Messages {
    std::vector<Pending> pending;
    std::string instructions;
    bool has_instructions = false;
    std::map<std::string, std::string> call_names;  // tool_call id → function name
};

// One entry of an assistant message's tool_calls: a commentary message to functions.NAME.
gptoss_status parse_tool_call(element call, const std::string& at, Messages* st) {
    if (call.type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected an object, found %s", at.c_str(), type_name(call));
    element function, name_e, args_e, id_e;
    if (!field(call, "function", &function)) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.function: missing", at.c_str());
    if (function.type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.function: expected an object, found %s", at.c_str(),
                    type_name(function));
    std::string name, arguments;
    if (!field(function, "name", &name_e))
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.function.name: missing", at.c_str());
    GPTOSS_TRY(get_string(name_e, at + ".function.name", &name));
    if (name.empty()) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.function.name: empty", at.c_str());
    if (!field(function, "arguments", &args_e))
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.function.arguments: missing", at.c_str());
    GPTOSS_TRY(get_string(args_e, at + ".function.arguments", &arguments));
    if (field(call, "id", &id_e)) {
        std::string id;
        GPTOSS_TRY(get_string(id_e, at + ".id", &id));
        st->call_names[id] = name;
    }
    st->pending.push_back(
        {make_message(GPTOSS_ROLE_ASSISTANT, GPTOSS_CHANNEL_COMMENTARY), arguments, "", "functions." + name, "json"});
    return GPTOSS_OK;
}

// An assistant message: its reasoning (analysis), then its content (final, or a commentary
// preamble when tool calls follow), then its tool calls.
gptoss_status parse_assistant(element m, const std::string& at, bool has_content, const std::string& content,
                              Messages* st) {
    for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
        element r;
        if (!field(m, key, &r) || r.type() == element_type::NULL_VALUE) continue;
        std::string analysis;
        GPTOSS_TRY(get_string(r, at + "." + key, &analysis));
        if (!analysis.empty())
            st->pending.push_back({make_message(GPTOSS_ROLE_ASSISTANT, GPTOSS_CHANNEL_ANALYSIS), analysis, "", "", ""});
        break;
    }
    element calls;
    const bool has_calls = field(m, "tool_calls", &calls) && calls.type() != element_type::NULL_VALUE;
    if (has_calls && calls.type() != element_type::ARRAY)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.tool_calls: expected an array, found %s", at.c_str(),
                    type_name(calls));
    // Clients often send "tool_calls": [] on a plain answer.
    if (!has_calls || calls.get_array().size() == 0) {
        st->pending.push_back({make_message(GPTOSS_ROLE_ASSISTANT, GPTOSS_CHANNEL_FINAL), content, "", "", ""});
        return GPTOSS_OK;
    }
    if (has_content && !content.empty())  // text before tool calls is a preamble
        st->pending.push_back({make_message(GPTOSS_ROLE_ASSISTANT, GPTOSS_CHANNEL_COMMENTARY), content, "", "", ""});
    // A named array: a temporary simdjson_result would die before the loop (its value() is a reference).
    const simdjson::dom::array call_array = calls.get_array().value();
    size_t k = 0;
    for (element call : call_array)
        GPTOSS_TRY(parse_tool_call(call, at + ".tool_calls[" + std::to_string(k++) + "]", st));
    return GPTOSS_OK;
}

// A tool message: its function comes from tool_call_id (an earlier assistant tool call) or name.
gptoss_status parse_tool_message(element m, const std::string& at, const std::string& content, Messages* st) {
    std::string name;
    element id_e, name_e;
    if (field(m, "tool_call_id", &id_e)) {
        std::string id;
        GPTOSS_TRY(get_string(id_e, at + ".tool_call_id", &id));
        auto it = st->call_names.find(id);
        if (it == st->call_names.end())
            return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                        "%s.tool_call_id: \"%s\" matches no tool_calls[].id of an earlier assistant message", at.c_str(),
                        id.c_str());
        name = it->second;
    } else if (field(m, "name", &name_e)) {
        GPTOSS_TRY(get_string(name_e, at + ".name", &name));
    } else {
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: a tool message needs tool_call_id (or name)", at.c_str());
    }
    st->pending.push_back({make_message(GPTOSS_ROLE_TOOL, GPTOSS_CHANNEL_COMMENTARY), content,
                           name.find('.') == std::string::npos ? "functions." + name : name, "", ""});
    return GPTOSS_OK;
}

gptoss_status parse_message(element m, const std::string& at, Messages* st) {
    if (m.type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected an object, found %s", at.c_str(), type_name(m));
    element role_e;
    std::string role;
    if (!field(m, "role", &role_e)) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.role: missing", at.c_str());
    GPTOSS_TRY(get_string(role_e, at + ".role", &role));
    bool has_content = false;
    std::string content;
    GPTOSS_TRY(get_content(m, at, &has_content, &content));
    if (role == "system" || role == "developer") {
        if (st->has_instructions) st->instructions += "\n\n";
        st->instructions += content;
        st->has_instructions = true;
        return GPTOSS_OK;
    }
    if (role == "assistant") return parse_assistant(m, at, has_content, content, st);
    if (role != "user" && role != "tool")
        return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                    "%s.role: unknown role \"%s\", expected system, developer, user, assistant or tool", at.c_str(),
                    role.c_str());
    if (!has_content) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.content: missing", at.c_str());
    if (role == "tool") return parse_tool_message(m, at, content, st);
    st->pending.push_back({make_message(GPTOSS_ROLE_USER, GPTOSS_CHANNEL_NONE), content, "", "", ""});
    return GPTOSS_OK;
}

// One entry of tools: a function with its name, description and JSON Schema parameters.
gptoss_status parse_tool(element t, const std::string& at, ChatRequestStorage* out) {
    if (t.type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected an object, found %s", at.c_str(), type_name(t));
    element type_e, function, e;
    if (field(t, "type", &type_e)) {
        std::string type;
        GPTOSS_TRY(get_string(type_e, at + ".type", &type));
        if (type != "function")
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.type: \"%s\" is not supported, expected \"function\"",
                        at.c_str(), type.c_str());
    }
    if (!field(t, "function", &function)) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.function: missing", at.c_str());
    if (function.type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.function: expected an object, found %s", at.c_str(),
                    type_name(function));
    gptoss_tool tool{};
    std::string name, description;
    if (!field(function, "name", &e)) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s.function.name: missing", at.c_str());
    GPTOSS_TRY(get_string(e, at + ".function.name", &name));
    if (field(function, "description", &e) && e.type() != element_type::NULL_VALUE)
        GPTOSS_TRY(get_string(e, at + ".function.description", &description));
    tool.name = out->keep(name);
    tool.description = out->keep(description);
    if (field(function, "parameters", &e) && e.type() != element_type::NULL_VALUE) {
        std::string schema = simdjson::minify(e);
        std::string ignored;
        GPTOSS_TRY(harmony::schema_to_typescript(schema, at + ".function.parameters", &ignored));
        tool.parameters = out->keep(std::move(schema));
    }
    out->tools.push_back(tool);
    return GPTOSS_OK;
}

// reasoning_effort, the constraints (parse_constraints) and thinking_token_budget, in that order.
gptoss_status parse_options(element root, ChatRequestStorage* out) {
    element e;
    if (field(root, "reasoning_effort", &e) && e.type() != element_type::NULL_VALUE) {
        std::string value;
        GPTOSS_TRY(get_string(e, "reasoning_effort", &value));
        if (value == "low") out->request.reasoning_effort = GPTOSS_REASONING_LOW;
        else if (value == "medium") out->request.reasoning_effort = GPTOSS_REASONING_MEDIUM;
        else if (value == "high") out->request.reasoning_effort = GPTOSS_REASONING_HIGH;
        else
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "reasoning_effort: \"%s\" is not low, medium or high", value.c_str());
    }
    GPTOSS_TRY(parse_constraints(root, out));
    // vLLM's name for a reasoning budget (gptoss_chat_request.max_reasoning_tokens).
    if (field(root, "thinking_token_budget", &e) && e.type() != element_type::NULL_VALUE) {
        uint64_t budget = 0;
        if (e.get_uint64().get(budget) != simdjson::SUCCESS || budget >= UINT32_MAX)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "thinking_token_budget: expected an integer in [0, %u], found %s",
                        UINT32_MAX - 1, simdjson::minify(e).c_str());
        out->request.max_reasoning_tokens = uint32_t(budget);
    }
    return GPTOSS_OK;
}

// The body parsed into its root object, or an error naming what is wrong with it.
gptoss_status parse_root(const char* json, size_t len, simdjson::dom::parser* parser, element* root) {
    if (json == nullptr) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "json: NULL");
    const size_t bad = first_invalid_utf8(json, len);
    if (bad < len) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "json: invalid UTF-8 at byte %zu", bad);
    simdjson::padded_string padded(json, len);
    const simdjson::error_code error = parser->parse(padded).get(*root);
    if (error != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "json: not valid JSON (%s)", simdjson::error_message(error));
    if (root->type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "json: expected an object (a Chat Completions request body), found %s",
                    type_name(*root));
    return GPTOSS_OK;
}

}  // namespace

gptoss_status parse_chat_completions_json(const char* json, size_t len, ChatRequestStorage* out) {
    *out = ChatRequestStorage();
    gptoss_chat_request_init(&out->request, sizeof out->request);
    simdjson::dom::parser parser;
    element root;
    GPTOSS_TRY(parse_root(json, len, &parser, &root));

    Messages st;
    element messages;
    if (!field(root, "messages", &messages)) return fail(GPTOSS_ERR_INVALID_ARGUMENT, "messages: missing");
    if (messages.type() != element_type::ARRAY)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "messages: expected an array, found %s", type_name(messages));
    const simdjson::dom::array message_array = messages.get_array().value();
    size_t i = 0;
    for (element m : message_array)
        GPTOSS_TRY(parse_message(m, "messages[" + std::to_string(i++) + "]", &st));

    element tools;
    if (field(root, "tools", &tools) && tools.type() != element_type::NULL_VALUE) {
        if (tools.type() != element_type::ARRAY)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "tools: expected an array, found %s", type_name(tools));
        const simdjson::dom::array tool_array = tools.get_array().value();
        size_t k = 0;
        for (element t : tool_array)
            GPTOSS_TRY(parse_tool(t, "tools[" + std::to_string(k++) + "]", out));
    }
    GPTOSS_TRY(parse_options(root, out));

    for (Pending& p : st.pending) {
        gptoss_message m = p.message;
        m.content = out->keep(std::move(p.content));
        m.author = p.author.empty() ? nullptr : out->keep(std::move(p.author));
        m.recipient = p.recipient.empty() ? nullptr : out->keep(std::move(p.recipient));
        m.content_type = p.content_type.empty() ? nullptr : out->keep(std::move(p.content_type));
        out->messages.push_back(m);
    }
    if (st.has_instructions) out->request.instructions = out->keep(std::move(st.instructions));
    out->request.messages = out->messages.data();
    out->request.n_messages = out->messages.size();
    out->request.tools = out->tools.data();
    out->request.n_tools = out->tools.size();
    return GPTOSS_OK;
}

}  // namespace gptoss
