// tokenizer/harmony.cpp - Harmony renderer and streaming parser (see harmony.h).
// Follows openai/harmony v0.0.8 src/encoding.rs (HARMONY.md §2): rendering is segment-wise
// (every text piece encoded on its own with encode_ordinary, special tokens as single ids),
// JSON Schema becomes harmony's TypeScript-like text with its quirks kept, and the parser is
// harmony's state machine made lenient (HARMONY.md §2.10, API.md §7): it never fails.
#include "tokenizer/harmony.h"

#include "gptoss-internal.h"

#include <simdjson.h>

#include <algorithm>
#include <cstring>

namespace gptoss {
namespace harmony {

const char* role_name(Role role) {
    switch (role) {
    case Role::System: return "system";
    case Role::Developer: return "developer";
    case Role::User: return "user";
    case Role::Assistant: return "assistant";
    case Role::Tool: return "tool";
    }
    return "user";
}

namespace {

constexpr std::string_view kConstrainText = "<|constrain|>";
constexpr std::string_view kChannelText = "<|channel|>";

// Rust's str::lines(): split on '\n', drop one trailing '\r' per line, no final empty line.
std::vector<std::string> rust_lines(std::string_view text) {
    std::vector<std::string> lines;
    size_t start = 0;
    while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string_view::npos) end = text.size();
        std::string_view line = text.substr(start, end - start);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        lines.emplace_back(line);
        start = end + 1;
    }
    return lines;
}

std::string join(const std::vector<std::string>& parts, std::string_view separator) {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
        if (i) out += separator;
        out += parts[i];
    }
    return out;
}

// ---------------------------------------------------------------------------
// JSON Schema → TypeScript (harmony json_schema_to_typescript)

using simdjson::dom::element;
using simdjson::dom::element_type;

bool get_field(element schema, const char* key, element* out) {
    if (schema.type() != element_type::OBJECT) return false;
    return schema.get_object()[key].get(*out) == simdjson::SUCCESS;
}

bool is_enum(element schema) {
    element e;
    if (!get_field(schema, "enum", &e) || e.type() != element_type::ARRAY) return false;
    return e.get_array().size() > 0;
}

bool is_nullable(element schema) {
    element e;
    return get_field(schema, "nullable", &e) && e.type() == element_type::BOOL && e.get_bool().value();
}

std::string_view string_of(element e) {
    std::string_view s;
    if (e.get_string().get(s) != simdjson::SUCCESS) return {};
    return s;
}

// "default: ..." as harmony formats it: a non-enum string quoted, an enum string bare, any
// other value as compact JSON (serde_json's Display).
std::string default_comment(element owner, element value) {
    if (value.type() == element_type::STRING) {
        if (!is_enum(owner)) return "default: \"" + std::string(string_of(value)) + "\"";
        return "default: " + std::string(string_of(value));
    }
    return "default: " + simdjson::minify(value);
}

// Checks the keywords the renderer reads, so a malformed schema fails with a message naming
// the keyword instead of rendering as "any".
gptoss_status validate_schema(element schema, const std::string& where) {
    if (schema.type() == element_type::BOOL) return GPTOSS_OK;  // true/false schemas: "any"
    if (schema.type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected a JSON Schema object", where.c_str());
    for (auto field : schema.get_object()) {
        const std::string key(field.key);
        const element value = field.value;
        const std::string at = where + "." + key;
        if (key == "type") {
            if (value.type() == element_type::STRING) continue;
            if (value.type() != element_type::ARRAY)
                return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected a string or an array of strings", at.c_str());
            for (element t : value.get_array())
                if (t.type() != element_type::STRING)
                    return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected an array of strings, found %s",
                                at.c_str(), simdjson::minify(t).c_str());
        } else if (key == "properties") {
            if (value.type() != element_type::OBJECT)
                return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected an object", at.c_str());
            for (auto property : value.get_object())
                GPTOSS_TRY(validate_schema(property.value, at + "." + std::string(property.key)));
        } else if (key == "required") {
            if (value.type() != element_type::ARRAY)
                return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected an array of strings", at.c_str());
            for (element r : value.get_array())
                if (r.type() != element_type::STRING)
                    return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected an array of strings, found %s",
                                at.c_str(), simdjson::minify(r).c_str());
        } else if (key == "items") {
            GPTOSS_TRY(validate_schema(value, at));
        } else if (key == "oneOf" || key == "anyOf" || key == "allOf") {
            if (value.type() != element_type::ARRAY)
                return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected an array of schemas", at.c_str());
            size_t i = 0;
            for (element v : value.get_array()) GPTOSS_TRY(validate_schema(v, at + "[" + std::to_string(i++) + "]"));
        } else if (key == "enum" || key == "examples") {
            if (value.type() != element_type::ARRAY)
                return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected an array", at.c_str());
        } else if (key == "description" || key == "title") {
            if (value.type() != element_type::STRING)
                return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected a string", at.c_str());
        }
    }
    return GPTOSS_OK;
}

std::string to_typescript(element schema, const std::string& indent);

// One oneOf variant: its type (with " | null" if nullable) and the trailing comments.
std::string variant_type(element variant, const std::string& indent) {
    std::string type = to_typescript(variant, indent + "   ");
    if (is_nullable(variant) && type.find("null") == std::string::npos) type += " | null";
    return type;
}

// A property's comment lines above it: its title, its description (unless it has oneOf, whose
// variants carry theirs) and its string examples.
std::string property_comments(element val, bool has_one_of, const std::string& indent) {
    std::string out;
    element e;
    if (get_field(val, "title", &e) && e.type() == element_type::STRING)
        out += indent + "// " + std::string(string_of(e)) + "\n" + indent + "//\n";
    if (!has_one_of && get_field(val, "description", &e) && e.type() == element_type::STRING)
        out += indent + "// " + std::string(string_of(e)) + "\n";
    if (get_field(val, "examples", &e) && e.type() == element_type::ARRAY && e.get_array().size() > 0) {
        out += indent + "// Examples:\n";
        for (element ex : e.get_array())
            if (ex.type() == element_type::STRING) out += indent + "// - \"" + std::string(string_of(ex)) + "\"\n";
    }
    return out;
}

// A property with oneOf: "key?:" then one " | type // comments" line per variant. A
// property-level description equal to the first variant's is printed once, as the first
// variant's trailing comment.
std::string one_of_property(element val, element one_of, const std::string& key, const char* optional,
                            const std::string& indent) {
    std::string out;
    element e;
    bool has_property_desc = false;
    std::string_view property_desc;
    if (get_field(val, "description", &e) && e.type() == element_type::STRING) {
        has_property_desc = true;
        property_desc = string_of(e);
    }
    bool skip_property_desc = false;
    if (has_property_desc) {
        for (element first : one_of.get_array()) {
            element d;
            if (get_field(first, "description", &d) && d.type() == element_type::STRING &&
                string_of(d) == property_desc)
                skip_property_desc = true;
            break;
        }
    }
    bool desc_above = false;
    if (!skip_property_desc && has_property_desc) {
        out += indent + "// " + std::string(property_desc) + "\n";
        desc_above = true;
    }
    if (get_field(val, "default", &e)) out += indent + "// " + default_comment(val, e) + "\n";
    out += indent + key + optional + ":\n";
    size_t i = 0;
    for (element variant : one_of.get_array()) {
        out += indent + " | " + variant_type(variant, indent);
        std::vector<std::string> comments;
        element d;
        if (!(i == 0 && desc_above) && get_field(variant, "description", &d) && d.type() == element_type::STRING &&
            !(has_property_desc && string_of(d) == property_desc))
            comments.emplace_back(string_of(d));
        if (get_field(variant, "default", &d)) comments.push_back(default_comment(variant, d));
        if (!comments.empty()) out += " // " + join(comments, " ");
        out += "\n";
        ++i;
    }
    return out + indent + ",\n";
}

std::string object_to_typescript(element schema, const std::string& indent) {
    std::string out;
    element e;
    if (get_field(schema, "description", &e) && e.type() == element_type::STRING)
        out += indent + "// " + std::string(string_of(e)) + "\n";
    out += "{\n";
    element properties;
    if (get_field(schema, "properties", &properties) && properties.type() == element_type::OBJECT) {
        std::vector<std::string_view> required;
        element r;
        if (get_field(schema, "required", &r) && r.type() == element_type::ARRAY)
            for (element name : r.get_array()) required.push_back(string_of(name));
        for (auto field : properties.get_object()) {
            const std::string key(field.key);
            const element val = field.value;
            const bool is_required = std::find(required.begin(), required.end(), field.key) != required.end();
            const char* optional = is_required ? "" : "?";
            element one_of;
            const bool has_one_of = get_field(val, "oneOf", &one_of);
            out += property_comments(val, has_one_of, indent);
            if (has_one_of && one_of.type() == element_type::ARRAY) {
                out += one_of_property(val, one_of, key, optional, indent);
                continue;
            }
            out += indent + key + optional + ": ";
            std::string type = to_typescript(val, indent + "    ");
            if (is_nullable(val) && type.find("null") == std::string::npos) type += " | null";
            out += type + ",";
            if (!has_one_of && get_field(val, "default", &e)) out += " // " + default_comment(val, e);
            out += "\n";
        }
    }
    out += indent + "}";
    return out;
}

std::string to_typescript(element schema, const std::string& indent) {
    element e;
    if (get_field(schema, "oneOf", &e) && e.type() == element_type::ARRAY) {
        std::string out;
        for (element variant : e.get_array()) {
            out += "\n" + indent + " | " + variant_type(variant, indent);
            std::vector<std::string> comments;
            element d;
            if (get_field(variant, "description", &d) && d.type() == element_type::STRING)
                comments.emplace_back(string_of(d));
            if (get_field(variant, "default", &d)) comments.push_back(default_comment(variant, d));
            if (!comments.empty()) out += " // " + join(comments, " ");
        }
        return out;
    }
    if (get_field(schema, "type", &e) && e.type() == element_type::ARRAY) {
        std::vector<std::string> types;
        for (element t : e.get_array()) {
            if (t.type() != element_type::STRING) continue;
            const std::string_view name = string_of(t);
            types.emplace_back(name == "integer" ? "number" : name);
        }
        if (!types.empty()) return join(types, " | ");
    }
    if (get_field(schema, "type", &e) && e.type() == element_type::STRING) {
        const std::string_view type = string_of(e);
        if (type == "object") return object_to_typescript(schema, indent);
        if (type == "string") {
            element values;
            if (get_field(schema, "enum", &values) && values.type() == element_type::ARRAY) {
                std::vector<std::string> quoted;
                for (element v : values.get_array())
                    if (v.type() == element_type::STRING) quoted.push_back("\"" + std::string(string_of(v)) + "\"");
                if (!quoted.empty()) return join(quoted, " | ");
            }
            return "string";
        }
        if (type == "number" || type == "integer") return "number";
        if (type == "boolean") return "boolean";
        if (type == "array") {
            element items;
            if (get_field(schema, "items", &items)) return to_typescript(items, indent) + "[]";
            return "Array<any>";
        }
    }
    return "any";
}

// ---------------------------------------------------------------------------
// System and developer text

std::string system_text(const SystemSpec& sys, bool has_function_tools, std::string* error_where,
                        gptoss_status* status) {
    std::vector<std::string> sections;
    std::vector<std::string> top;
    if (!sys.identity.empty()) top.push_back(sys.identity);
    if (!sys.knowledge_cutoff.empty()) top.push_back("Knowledge cutoff: " + sys.knowledge_cutoff);
    if (!sys.current_date.empty()) top.push_back("Current date: " + sys.current_date);
    if (!top.empty()) sections.push_back(join(top, "\n"));
    if (!sys.reasoning.empty()) sections.push_back("Reasoning: " + sys.reasoning);
    if (!sys.namespaces.empty()) {
        std::string tools;
        *status = render_tools_section(sys.namespaces, &tools);
        if (*status != GPTOSS_OK) {
            *error_where = "system";
            return {};
        }
        sections.push_back(tools);
    }
    if (!sys.channels.empty()) {
        std::string header = "# Valid channels: " + join(sys.channels, ", ") + ".";
        if (sys.channel_required) header += " Channel must be included for every message.";
        if (has_function_tools) header += "\nCalls to these tools must go to the commentary channel: 'functions'.";
        sections.push_back(header);
    }
    *status = GPTOSS_OK;
    return join(sections, "\n\n");
}

void add_text(std::vector<Piece>* out, std::string text) {
    Piece piece;
    piece.text = std::move(text);
    out->push_back(std::move(piece));
}

void add_special(std::vector<Piece>* out, int32_t id) {
    Piece piece;
    piece.special = id;
    out->push_back(std::move(piece));
}

// One message: <|start|>{header}<|message|>{content}{<|end|> or <|call|>}.
gptoss_status render_message(const Message& m, const std::string& content, size_t index,
                             std::vector<Piece>* out) {
    add_special(out, kStart);
    if (m.role == Role::Tool) {
        if (m.name.empty())
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "messages[%zu]: a tool message needs the tool's name", index);
        add_text(out, m.name);
    } else {
        add_text(out, role_name(m.role));
        if (!m.name.empty()) add_text(out, ":" + m.name);
    }
    if (!m.recipient.empty() && m.recipient != "all") add_text(out, " to=" + m.recipient);
    if (!m.channel.empty()) {
        add_special(out, kChannel);
        add_text(out, m.channel);
    }
    if (!m.content_type.empty()) {
        if (m.content_type.compare(0, kConstrainText.size(), kConstrainText) == 0) {
            add_text(out, " ");
            add_special(out, kConstrain);
            if (m.content_type.size() > kConstrainText.size()) add_text(out, m.content_type.substr(kConstrainText.size()));
        } else {
            add_text(out, " " + m.content_type);
        }
    }
    add_special(out, kMessage);
    if (!content.empty()) add_text(out, content);
    add_special(out, m.role == Role::Assistant && !m.recipient.empty() ? kCall : kEnd);
    return GPTOSS_OK;
}

bool has_function_tools(const std::vector<ToolNamespace>& namespaces) {
    for (const ToolNamespace& ns : namespaces)
        if (ns.name == "functions" && !ns.tools.empty()) return true;
    return false;
}

}  // namespace

gptoss_status schema_to_typescript(std::string_view schema_json, const std::string& where, std::string* out) {
    simdjson::dom::parser parser;
    simdjson::padded_string padded(schema_json.data(), schema_json.size());
    element root;
    const simdjson::error_code error = parser.parse(padded).get(root);
    if (error != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: not valid JSON (%s)", where.c_str(), simdjson::error_message(error));
    if (root.type() != element_type::OBJECT)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: expected a JSON Schema object", where.c_str());
    GPTOSS_TRY(validate_schema(root, where));
    *out = to_typescript(root, "");
    return GPTOSS_OK;
}

gptoss_status render_tools_section(const std::vector<ToolNamespace>& namespaces, std::string* out) {
    std::vector<const ToolNamespace*> sorted;
    for (const ToolNamespace& ns : namespaces) sorted.push_back(&ns);
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const ToolNamespace* a, const ToolNamespace* b) { return a->name < b->name; });
    std::vector<std::string> sections = {"# Tools"};
    for (const ToolNamespace* ns : sorted) {
        std::vector<std::string> lines = {"## " + ns->name + "\n"};
        if (ns->has_description)
            for (const std::string& line : rust_lines(ns->description))
                lines.push_back(ns->tools.empty() ? line : "// " + line);
        if (!ns->tools.empty()) {
            lines.push_back("namespace " + ns->name + " {\n");
            for (size_t i = 0; i < ns->tools.size(); ++i) {
                const ToolDef& tool = ns->tools[i];
                for (const std::string& line : rust_lines(tool.description)) lines.push_back("// " + line);
                if (tool.has_parameters) {
                    std::string type;
                    GPTOSS_TRY(schema_to_typescript(tool.parameters, "tools[" + std::to_string(i) + "].parameters", &type));
                    lines.push_back("type " + tool.name + " = (_: " + type + ") => any;\n");
                } else {
                    lines.push_back("type " + tool.name + " = () => any;\n");
                }
            }
            lines.push_back("} // namespace " + ns->name);
        }
        sections.push_back(join(lines, "\n"));
    }
    *out = join(sections, "\n\n");
    return GPTOSS_OK;
}

namespace {

// The developer message's text: instructions, the tools section, the response formats.
gptoss_status developer_text(const DeveloperSpec& dev, std::string* out) {
    std::vector<std::string> sections;
    if (dev.has_instructions) {
        sections.push_back("# Instructions");
        sections.push_back(dev.instructions);
    }
    if (!dev.namespaces.empty()) {
        std::string tools;
        GPTOSS_TRY(render_tools_section(dev.namespaces, &tools));
        sections.push_back(tools);
    }
    if (!dev.response_formats.empty()) {
        sections.push_back("# Response Formats");
        for (const ResponseFormat& f : dev.response_formats) {
            sections.push_back("## " + f.name);
            sections.push_back(f.description.empty() ? f.schema : "// " + f.description + "\n" + f.schema);
        }
    }
    *out = join(sections, "\n\n");
    return GPTOSS_OK;
}

// Which messages' chain of thought (analysis channel) the rendering drops, per options.cot_drop.
std::vector<bool> dropped_analysis(const std::vector<Message>& messages, CotDrop cot_drop) {
    std::vector<bool> drop(messages.size(), false);
    if (cot_drop == CotDrop::All) {
        for (size_t i = 0; i < messages.size(); ++i) drop[i] = messages[i].channel == "analysis";
    } else if (cot_drop == CotDrop::Finished) {
        bool later_final = false;
        for (size_t i = messages.size(); i-- > 0;) {
            if (messages[i].channel == "analysis" && later_final) drop[i] = true;
            if (messages[i].role == Role::Assistant && messages[i].channel == "final") later_final = true;
        }
    } else if (cot_drop == CotDrop::HarmonyExact) {
        bool last_assistant_is_final = false;
        for (size_t i = messages.size(); i-- > 0;) {
            if (messages[i].role == Role::Assistant) {
                last_assistant_is_final = messages[i].channel == "final";
                break;
            }
        }
        size_t first_final = messages.size();
        for (size_t i = 0; i < messages.size(); ++i) {
            if (messages[i].channel == "final") {
                first_final = i;
                break;
            }
        }
        if (last_assistant_is_final)
            for (size_t i = 0; i < first_final; ++i)
                if (messages[i].channel == "analysis") drop[i] = true;
    }
    return drop;
}

}  // namespace

gptoss_status render(const Conversation& conversation, const RenderOptions& options, std::vector<Piece>* out) {
    std::vector<Piece> pieces;
    const bool function_tools = conversation.has_developer && has_function_tools(conversation.developer.namespaces);
    if (conversation.has_system) {
        std::string where;
        gptoss_status status = GPTOSS_OK;
        const std::string text = system_text(conversation.system, function_tools, &where, &status);
        GPTOSS_TRY(status);
        Message m;
        m.role = Role::System;
        GPTOSS_TRY(render_message(m, text, 0, &pieces));
    }
    if (conversation.has_developer) {
        std::string text;
        GPTOSS_TRY(developer_text(conversation.developer, &text));
        Message m;
        m.role = Role::Developer;
        GPTOSS_TRY(render_message(m, text, 0, &pieces));
    }
    const std::vector<Message>& messages = conversation.messages;
    const std::vector<bool> drop = dropped_analysis(messages, options.cot_drop);
    for (size_t i = 0; i < messages.size(); ++i) {
        if (drop[i]) continue;
        GPTOSS_TRY(render_message(messages[i], messages[i].content, i, &pieces));
    }
    if (options.completion) {
        add_special(&pieces, kStart);
        add_text(&pieces, "assistant");
    }
    *out = std::move(pieces);
    return GPTOSS_OK;
}

std::string pieces_text(const std::vector<Piece>& pieces) {
    std::string text;
    for (const Piece& piece : pieces) {
        switch (piece.special) {
        case -1: text += piece.text; break;
        case kReturn: text += "<|return|>"; break;
        case kConstrain: text += "<|constrain|>"; break;
        case kChannel: text += "<|channel|>"; break;
        case kStart: text += "<|start|>"; break;
        case kEnd: text += "<|end|>"; break;
        case kMessage: text += "<|message|>"; break;
        case kCall: text += "<|call|>"; break;
        default: text += "<|reserved_" + std::to_string(piece.special) + "|>"; break;
        }
    }
    return text;
}

gptoss_status pieces_tokens(const Tokenizer& tokenizer, const std::vector<Piece>& pieces, std::vector<int32_t>* out) {
    std::vector<int32_t> tokens;
    for (const Piece& piece : pieces) {
        if (piece.special >= 0) {
            tokens.push_back(piece.special);
        } else {
            GPTOSS_TRY(tokenizer.encode(piece.text.data(), piece.text.size(), /*allow_special=*/false, &tokens));
        }
    }
    *out = std::move(tokens);
    return GPTOSS_OK;
}

// ---------------------------------------------------------------------------
// Built-in tools. The text is openai/harmony v0.0.8's (test-data/test_browser_and_python_tool.txt);
// the browser functions are expressed as JSON Schema so they go through the same renderer.

ToolNamespace browser_namespace() {
    ToolNamespace ns;
    ns.name = "browser";
    ns.has_description = true;
    ns.description =
        "Tool for browsing.\n"
        "The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\n"
        "Cite information from the tool using the following format:\n"
        "`\xE3\x80\x90{cursor}\xE2\x80\xA0L{line_start}(-L{line_end})?\xE3\x80\x91`, for example: "
        "`\xE3\x80\x90" "6\xE2\x80\xA0L9-L11\xE3\x80\x91` or `\xE3\x80\x90" "8\xE2\x80\xA0L3\xE3\x80\x91`.\n"
        "Do not quote more than 10 words directly from the tool output.\n"
        "sources=web (default: web)";
    ToolDef search;
    search.name = "search";
    search.description = "Searches for information related to `query` and displays `topn` results.";
    search.has_parameters = true;
    search.parameters =
        R"({"type":"object","properties":{"query":{"type":"string"},"topn":{"type":"number","default":10},)"
        R"("source":{"type":"string"}},"required":["query"]})";
    ToolDef open;
    open.name = "open";
    open.description =
        "Opens the link `id` from the page indicated by `cursor` starting at line number `loc`, showing `num_lines` lines.\n"
        "Valid link ids are displayed with the formatting: `\xE3\x80\x90{id}\xE2\x80\xA0.*\xE3\x80\x91`.\n"
        "If `cursor` is not provided, the most recent page is implied.\n"
        "If `id` is a string, it is treated as a fully qualified URL associated with `source`.\n"
        "If `loc` is not provided, the viewport will be positioned at the beginning of the document or centered on "
        "the most relevant passage, if available.\n"
        "Use this function without `id` to scroll to a new location of an opened page.";
    open.has_parameters = true;
    open.parameters =
        R"({"type":"object","properties":{"id":{"type":["number","string"],"default":-1},)"
        R"("cursor":{"type":"number","default":-1},"loc":{"type":"number","default":-1},)"
        R"("num_lines":{"type":"number","default":-1},"view_source":{"type":"boolean","default":false},)"
        R"("source":{"type":"string"}}})";
    ToolDef find;
    find.name = "find";
    find.description = "Finds exact matches of `pattern` in the current page, or the page given by `cursor`.";
    find.has_parameters = true;
    find.parameters =
        R"({"type":"object","properties":{"pattern":{"type":"string"},"cursor":{"type":"number","default":-1}},)"
        R"("required":["pattern"]})";
    ns.tools = {search, open, find};
    return ns;
}

ToolNamespace python_namespace() {
    ToolNamespace ns;
    ns.name = "python";
    ns.has_description = true;
    ns.description =
        "Use this tool to execute Python code in your chain of thought. The code will not be shown to the user. "
        "This tool should be used for internal reasoning, but not for code that is intended to be visible to the "
        "user (e.g. when creating plots, tables, or files).\n\n"
        "When you send a message containing Python code to python, it will be executed in a stateful Jupyter "
        "notebook environment. python will respond with the output of the execution or time out after 120.0 "
        "seconds. The drive at '/mnt/data' can be used to save and persist user files. Internet access for this "
        "session is UNKNOWN. Depends on the cluster.";
    return ns;
}

// ---------------------------------------------------------------------------
// Parser

namespace {

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

bool parse_role(std::string_view word, Role* role) {
    static const Role roles[] = {Role::System, Role::Developer, Role::User, Role::Assistant, Role::Tool};
    for (Role r : roles)
        if (word == role_name(r)) {
            *role = r;
            return true;
        }
    return false;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// A content type is a word like "json", "code" or "<|constrain|>json"; junk such as "?" is not.
bool looks_like_content_type(std::string_view word) {
    if (starts_with(word, kConstrainText)) return true;
    for (char c : word)
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
    return false;
}

// Splits a header into channel and words (HARMONY.md §2.10 steps 1-2), repairing: every
// <|channel|> is removed and the last non-empty value wins (gpt-oss-20b sometimes writes a
// stray "<|channel|>commentary" before the real one); other special spellings are blanked;
// a missing space before <|constrain|> is inserted and "<|constrain|> json" is rejoined.
std::vector<std::string> header_words(std::string_view text, ParsedMessage* out) {
    std::string s(text);
    int n_channels = 0;
    for (;;) {
        const size_t at = s.find(kChannelText);
        if (at == std::string::npos) break;
        const size_t value_begin = at + kChannelText.size();
        size_t value_end = value_begin;
        while (value_end < s.size() && !is_ascii_space(s[value_end]) && s[value_end] != '<') ++value_end;
        if (value_end > value_begin) out->channel = s.substr(value_begin, value_end - value_begin);
        else out->header_clean = false;
        ++n_channels;
        s.replace(at, value_end - at, " ");
    }
    if (n_channels > 1) out->header_clean = false;
    // Other special-token spellings have no place in a header.
    for (size_t at = s.find("<|"); at != std::string::npos; at = s.find("<|", at + 1)) {
        const size_t end = s.find("|>", at + 2);
        if (end == std::string::npos) break;
        if (std::string_view(s).substr(at, end + 2 - at) == kConstrainText) {
            s.insert(at, " ");
            ++at;
            continue;
        }
        s.replace(at, end + 2 - at, " ");
        out->header_clean = false;
    }
    std::vector<std::string> words;
    size_t i = 0;
    while (i < s.size()) {
        while (i < s.size() && is_ascii_space(s[i])) ++i;
        size_t j = i;
        while (j < s.size() && !is_ascii_space(s[j])) ++j;
        if (j > i) words.push_back(s.substr(i, j - i));
        i = j;
    }
    for (size_t w = 0; w + 1 < words.size(); ++w) {
        if (words[w] == kConstrainText) {
            words[w] += words[w + 1];
            words.erase(words.begin() + long(w) + 1);
            out->header_clean = false;
        }
    }
    return words;
}

// Role from the first word (steps 3-4). Returns the index of the first word after the role.
size_t header_role(const std::vector<std::string>& words, bool role_known, ParsedMessage* out) {
    out->role = Role::Assistant;
    if (role_known) return !words.empty() && words[0] == "assistant" ? 1 : 0;
    if (words.empty()) {
        out->header_clean = false;  // "<|start|><|message|>": assume the assistant
        return 0;
    }
    Role role;
    if (parse_role(words[0], &role)) {
        out->role = role;
        return 1;
    }
    if (starts_with(words[0], "to=")) {
        out->header_clean = false;  // the role is missing, the recipient is there
        return 0;
    }
    out->role = Role::Tool;  // "<|start|>functions.get_weather to=assistant"
    out->name = words[0];
    return 1;
}

}  // namespace

std::string parse_header(std::string_view text, bool role_known, ParsedMessage* out) {
    std::vector<std::string> words = header_words(text, out);
    std::vector<std::string> rest(words.begin() + long(header_role(words, role_known, out)), words.end());
    // Step 5: [recipient] [content_type], either may carry "to=".
    if (!rest.empty()) {
        const size_t n = rest.size();
        std::string last = rest.back();
        if (starts_with(last, "to=")) {
            rest.pop_back();
            out->recipient = last.substr(3);
        } else if (n == 1 && !starts_with(last, kConstrainText)) {
            rest.pop_back();
            out->recipient = last;
        } else if (looks_like_content_type(last)) {
            rest.pop_back();
            out->content_type = last;
            if (!rest.empty()) {
                // Harmony takes the word before the content type; an explicit "to=" word
                // elsewhere is the better guess when junk sits in between.
                size_t pick = rest.size() - 1;
                for (size_t k = rest.size(); k-- > 0;)
                    if (starts_with(rest[k], "to=")) {
                        pick = k;
                        break;
                    }
                const std::string recipient = rest[pick];
                rest.erase(rest.begin() + long(pick));
                out->recipient = starts_with(recipient, "to=") ? recipient.substr(3) : recipient;
            }
        }
    }
    if (!rest.empty()) {
        out->header_clean = false;
        // Extra words: keep a "to=" recipient if one is hiding among them.
        for (const std::string& w : rest)
            if (out->recipient.empty() && starts_with(w, "to=")) out->recipient = w.substr(3);
    }
    std::string leftover;
    for (const std::string& w : rest) {
        if (starts_with(w, "to=")) continue;
        if (!leftover.empty()) leftover += ' ';
        leftover += w;
    }
    return leftover;
}

StreamParser::StreamParser(const Tokenizer& tokenizer, bool assistant_started)
    : tokenizer_(tokenizer),
      state_(assistant_started ? State::Header : State::ExpectStart),
      role_known_(assistant_started) {}

void StreamParser::begin_header(bool role_known) {
    state_ = State::Header;
    role_known_ = role_known;
    header_tokens_.clear();
}

// Decodes header tokens to text; ids that do not exist are skipped.
static std::string decode_header(const Tokenizer& tokenizer, const std::vector<int32_t>& tokens) {
    std::string text;
    for (int32_t t : tokens)
        if (t >= 0 && uint32_t(t) < tokenizer.n_vocab()) text += tokenizer.token_bytes(t);
    return text;
}

void StreamParser::open_content() {
    current_ = ParsedMessage();
    const std::string header = decode_header(tokenizer_, header_tokens_);
    const std::string leftover = parse_header(header, role_known_, &current_);
    header_tokens_.clear();
    role_known_ = false;
    state_ = State::Content;
    utf8_ = Utf8StreamDecoder();
    (void)leftover;  // repaired away; the text is still in the raw output
}

// A header that ended without <|message|>: as harmony's non-strict mode does, the words after
// the role become the content (`<|channel|>commentary Hello<|end|>` → commentary "Hello").
// At the end of output (end_token -1) only a header holding such text becomes a message, so a
// header cut off mid-way ("<|start|>assistant<|channel|>fin") leaves no empty message.
void StreamParser::close_header_as_message(int32_t end_token) {
    if (!header_tokens_.empty()) {
        ParsedMessage m;
        const std::string header = decode_header(tokenizer_, header_tokens_);
        std::vector<std::string> words = header_words(header, &m);
        const size_t first = header_role(words, role_known_, &m);
        for (size_t i = first; i < words.size(); ++i) {
            if (!m.content.empty()) m.content += ' ';
            m.content += words[i];
        }
        m.end_token = end_token;
        m.header_clean = false;
        // The header text came from token bytes and may be cut inside a character.
        std::string valid;
        Utf8StreamDecoder decoder;
        decoder.push(m.content, &valid);
        decoder.flush(&valid);
        m.content = std::move(valid);
        if (end_token >= 0 || !m.content.empty()) messages_.push_back(std::move(m));
    }
    header_tokens_.clear();
    role_known_ = false;
    state_ = State::ExpectStart;
}

void StreamParser::close_content(int32_t end_token, std::string* delta) {
    std::string tail;
    utf8_.flush(&tail);
    current_.content += tail;
    delta->append(tail);
    current_.end_token = end_token;
    messages_.push_back(std::move(current_));
    current_ = ParsedMessage();
    state_ = State::ExpectStart;
}

void StreamParser::push(int32_t token, std::string* delta) {
    delta->clear();
    const bool exists = token >= 0 && uint32_t(token) < tokenizer_.n_vocab();
    const bool special = exists && tokenizer_.is_special(token);
    const bool closes = token == kEnd || token == kReturn || token == kCall || token == kEndOfText;
    switch (state_) {
    case State::ExpectStart:
        if (token == kStart) {
            begin_header(/*role_known=*/false);
        } else if (token == kChannel) {
            // "<|start|>assistant" left out between messages: assume the assistant goes on.
            begin_header(/*role_known=*/true);
            header_tokens_.push_back(token);
        } else if (token == kMessage) {
            begin_header(/*role_known=*/true);
            open_content();
        }
        // Anything else between messages (stray text, a second stop token) belongs to no message.
        break;
    case State::Header:
        if (token == kMessage) {
            open_content();
        } else if (token == kStart) {
            begin_header(/*role_known=*/false);  // a new message begins; the broken header is dropped
        } else if (token == kEndOfText) {
            close_header_as_message(-1);
        } else if (closes) {
            close_header_as_message(token);
        } else if (exists) {
            header_tokens_.push_back(token);
        }
        break;
    case State::Content:
        if (closes) {
            close_content(token, delta);
        } else if (token == kStart) {
            close_content(-1, delta);  // <|end|> left out
            begin_header(/*role_known=*/false);
        } else if (token == kChannel) {
            close_content(-1, delta);  // "<|end|><|start|>assistant" left out
            begin_header(/*role_known=*/true);
            header_tokens_.push_back(token);
        } else if (exists && !special) {
            std::string piece;
            utf8_.push(tokenizer_.token_bytes(token), &piece);
            current_.content += piece;
            delta->append(piece);
        }
        // Reserved, unknown or misplaced special ids inside content are skipped.
        break;
    }
}

void StreamParser::finish(std::string* delta) {
    delta->clear();
    if (state_ == State::Header) close_header_as_message(-1);
    else if (state_ == State::Content) close_content(-1, delta);
}

// ---------------------------------------------------------------------------
// Chat streaming

static gptoss_channel channel_enum(const std::string& channel) {
    if (channel == "analysis") return GPTOSS_CHANNEL_ANALYSIS;
    if (channel == "commentary") return GPTOSS_CHANNEL_COMMENTARY;
    if (channel == "final") return GPTOSS_CHANNEL_FINAL;
    return GPTOSS_CHANNEL_NONE;
}

ChatStream::ChatStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings)
    : parser_(tokenizer, /*assistant_started=*/true), stops_(std::move(stop_strings)) {
    stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

// Appends `delta` to the final message's text; *emit gets what may be shown now: everything
// but a tail that could still become a stop string (all of it once the message closed).
bool ChatStream::match(const std::string& delta, bool message_closed, std::string* emit) {
    const size_t from = final_.size();
    final_ += delta;
    size_t found = std::string::npos;
    for (const std::string& s : stops_) {
        const size_t at = final_.find(s, from >= s.size() ? from - s.size() + 1 : 0);
        if (at != std::string::npos) found = std::min(found, at);
    }
    size_t upto = final_.size();
    if (found != std::string::npos) {
        upto = found;
    } else if (!message_closed) {
        size_t hold = 0;
        for (const std::string& s : stops_)
            for (size_t k = std::min(s.size() - 1, final_.size()); k > hold; --k)
                if (final_.compare(final_.size() - k, k, s, 0, k) == 0) {
                    hold = k;
                    break;
                }
        upto = final_.size() - hold;
    }
    *emit = upto > final_emitted_ ? final_.substr(final_emitted_, upto - final_emitted_) : std::string();
    final_emitted_ = std::max(final_emitted_, upto);
    if (found != std::string::npos) {
        cut_at_ = found;
        return true;
    }
    if (message_closed) {
        final_.clear();
        final_emitted_ = 0;
    }
    return false;
}

bool ChatStream::push(int32_t token, gptoss_event* event) {
    const bool was_content = parser_.in_content();
    const size_t n_before = parser_.messages().size();
    const ParsedMessage before = was_content ? parser_.current() : ParsedMessage();
    parser_.push(token, &delta_);
    const bool closed = parser_.messages().size() != n_before;
    bool stop = false;
    // Stop strings match the text that becomes gptoss_chat_result.final: every final-channel
    // message without a recipient, whatever role its header names (the model's output is
    // untrusted; a stray "<|start|>user<|channel|>final" still streams as final text).
    if (was_content && !stops_.empty() && before.channel == "final" && before.recipient.empty()) {
        stop = match(delta_, closed, &text_);
        if (stop) cut_message_ = n_before;
    } else {
        text_ = delta_;
        if (closed) stop = cut_header_message(n_before);
    }
    // The message this token belongs to: the one it continued or closed, or the one whose
    // header it completed; a token inside a header belongs to no known channel yet.
    const bool known = was_content || parser_.in_content();
    const ParsedMessage& m = was_content ? before : parser_.current();
    recipient_ = known ? m.recipient : std::string();
    std::memset(event, 0, sizeof *event);
    event->struct_size = sizeof *event;
    event->token = token;
    event->text = text_.c_str();
    event->text_len = text_.size();
    event->channel = known ? channel_enum(m.channel) : GPTOSS_CHANNEL_NONE;
    event->recipient = recipient_.empty() ? nullptr : recipient_.c_str();
    return stop;
}

// A header closed without <|message|> becomes a message whose content is the header's words
// (StreamParser::close_header_as_message); no event showed them, so a final one is cut at its
// first stop string here. Returns true when it held one.
bool ChatStream::cut_header_message(size_t index) {
    const std::vector<ParsedMessage>& messages = parser_.messages();
    if (stops_.empty() || cut_message_ != SIZE_MAX || index >= messages.size()) return false;
    const ParsedMessage& m = messages[index];
    if (m.channel != "final" || !m.recipient.empty()) return false;
    size_t found = std::string::npos;
    for (const std::string& s : stops_) found = std::min(found, m.content.find(s));
    if (found == std::string::npos) return false;
    cut_message_ = index;
    cut_at_ = found;
    return true;
}

// The end of output closes an open message: the rest of its text (bytes held back as an
// unfinished character) is matched too, as is a header that closes as a message.
void ChatStream::finish() {
    const bool was_content = parser_.in_content();
    const size_t n_before = parser_.messages().size();
    const ParsedMessage before = was_content ? parser_.current() : ParsedMessage();
    parser_.finish(&delta_);
    if (cut_message_ != SIZE_MAX || parser_.messages().size() == n_before) return;
    if (!was_content) {
        cut_header_message(n_before);
    } else if (!stops_.empty() && before.channel == "final" && before.recipient.empty()) {
        if (match(delta_, /*message_closed=*/true, &text_)) cut_message_ = n_before;
    }
}

std::vector<ParsedMessage> ChatStream::messages() const {
    std::vector<ParsedMessage> out = parser_.messages();
    if (cut_message_ < out.size() && cut_at_ <= out[cut_message_].content.size()) out[cut_message_].content.resize(cut_at_);
    return out;
}

}  // namespace harmony
}  // namespace gptoss
