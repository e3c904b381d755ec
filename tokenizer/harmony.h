// tokenizer/harmony.h - the Harmony chat format (HARMONY.md §2): a renderer that turns a
// conversation into tokens byte-identical to openai/harmony v0.0.8 (src/encoding.rs), and a
// lenient token-at-a-time parser that turns model output back into messages.
// CPU only; depends on tokenizer/ alone. Message text is always encoded as plain text
// (allow_special=false), so a user typing "<|end|>" cannot inject a token; only the renderer
// emits special ids. The parser never fails: what it cannot place stays in the raw text.
#pragma once

#include "gptoss.h"
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace gptoss {
namespace harmony {

// Special ids of o200k_harmony (HARMONY.md §1.2).
constexpr int32_t kStartOfText = 199998;
constexpr int32_t kEndOfText = 199999;   // HF pad/eos; a sampling stop in gptoss_chat
constexpr int32_t kReturn = 200002;      // end of the final answer
constexpr int32_t kConstrain = 200003;   // "<|constrain|>json" in a header
constexpr int32_t kChannel = 200005;
constexpr int32_t kStart = 200006;
constexpr int32_t kEnd = 200007;
constexpr int32_t kMessage = 200008;
constexpr int32_t kCall = 200012;        // end of a tool call

enum class Role { System, Developer, User, Assistant, Tool };
const char* role_name(Role role);

// One message as openai/harmony holds it. Empty strings mean "absent".
struct Message {
    Role role = Role::User;
    std::string name;          // tool messages: the tool ("functions.get_weather"), required
    std::string recipient;     // "functions.get_weather", "assistant", ...; "all" is not rendered
    std::string channel;       // "analysis", "commentary", "final", or any other name
    std::string content_type;  // "<|constrain|>json" renders " " + <|constrain|> + "json";
                               // anything else renders as " " + text
    std::string content;
};

// A function tool. `parameters` is JSON Schema text; empty when has_parameters is false.
struct ToolDef {
    std::string name;
    std::string description;
    bool has_parameters = false;
    std::string parameters;
};

struct ToolNamespace {
    std::string name;                // "functions", "browser", "python"
    bool has_description = false;
    std::string description;
    std::vector<ToolDef> tools;
};

// SystemContent (HARMONY.md §2.2). Defaults are SystemContent::new().
struct SystemSpec {
    std::string identity = "You are ChatGPT, a large language model trained by OpenAI.";
    std::string knowledge_cutoff = "2024-06";  // empty: omitted
    std::string current_date;                  // empty: omitted
    std::string reasoning = "medium";          // "low", "medium", "high"; empty: omitted
    std::vector<std::string> channels = {"analysis", "commentary", "final"};
    bool channel_required = true;
    std::vector<ToolNamespace> namespaces;     // built-in tools (browser, python)
};

// A structured-output format: rendered at the end of the developer message as
// "# Response Formats\n\n## {name}\n\n// {description}\n{schema}" (openai/harmony docs/format.md,
// "Structured output"; the "// {description}" line only when there is one).
struct ResponseFormat {
    std::string name;
    std::string description;
    std::string schema;                        // JSON text, rendered as given
};

// DeveloperContent (HARMONY.md §2.3).
struct DeveloperSpec {
    bool has_instructions = false;
    std::string instructions;
    std::vector<ToolNamespace> namespaces;     // normally one: "functions"
    std::vector<ResponseFormat> response_formats;
};

// How earlier chain of thought is treated (HARMONY.md §2.8).
enum class CotDrop {
    Keep,          // render every analysis message
    Finished,      // rule 1 (gptoss_chat default): drop an analysis message when a later
                   // assistant message is on `final`, i.e. its turn has ended
    HarmonyExact,  // rule 2, openai/harmony auto_drop_analysis: if the last assistant message
                   // is final, drop analysis before the first final message
    All,           // drop every analysis message: the prompt as the next turn will render it
                   // once this one ends in a final answer (where turn-to-turn reuse diverges)
};

struct Conversation {
    bool has_system = false;
    SystemSpec system;
    bool has_developer = false;
    DeveloperSpec developer;
    std::vector<Message> messages;
};

// A rendered prompt: ordinary text pieces, each encoded on its own (as harmony does), and
// special ids.
struct Piece {
    int32_t special = -1;  // a special id, or -1 for text
    std::string text;
};

struct RenderOptions {
    CotDrop cot_drop = CotDrop::Finished;
    bool completion = true;  // append "<|start|>assistant" (render_conversation_for_completion)
};

// Renders `conversation` into pieces. Fails with INVALID_ARGUMENT on a tool message without a
// name or a tool whose parameters are not valid JSON Schema (the message names the field).
[[nodiscard]] gptoss_status render(const Conversation& conversation, const RenderOptions& options,
                                   std::vector<Piece>* out);
// The pieces as text, special tokens spelled by name.
std::string pieces_text(const std::vector<Piece>& pieces);
// The pieces as token ids: text encoded with allow_special=false.
[[nodiscard]] gptoss_status pieces_tokens(const Tokenizer& tokenizer, const std::vector<Piece>& pieces,
                                          std::vector<int32_t>* out);

// The "# Tools" section for namespaces in the given order is sorted by name first (harmony keeps
// them in a BTreeMap). Exposed for tests.
[[nodiscard]] gptoss_status render_tools_section(const std::vector<ToolNamespace>& namespaces,
                                                 std::string* out);
// JSON Schema → harmony's TypeScript-like type text (json_schema_to_typescript). `where` names
// the schema in error messages ("tools[0].parameters"). Fails with INVALID_ARGUMENT if the text
// is not JSON or a keyword has the wrong type (e.g. "properties" not an object).
[[nodiscard]] gptoss_status schema_to_typescript(std::string_view schema_json, const std::string& where,
                                                 std::string* out);

// The built-in browser and python namespaces, verbatim as openai/harmony v0.0.8 renders them.
ToolNamespace browser_namespace();
ToolNamespace python_namespace();

// ---------------------------------------------------------------------------
// Streaming parser (HARMONY.md §2.10, API.md §7).

struct ParsedMessage {
    Role role = Role::Assistant;
    std::string name;          // tool messages: the author ("browser.search")
    std::string recipient;
    std::string channel;
    std::string content_type;  // as written: "<|constrain|>json", "code", ...
    std::string content;       // valid UTF-8
    int32_t end_token = -1;    // <|end|>, <|return|>, <|call|>, <|endoftext|>; -1: output ended
    bool header_clean = true;  // false when the lenient rules had to repair the header
};

// Consumes tokens one at a time. Never fails: malformed headers are repaired where the intent
// is clear (recipient in the role or channel part, missing space before <|constrain|>, doubled
// or stray <|channel|>, a missing <|start|>), unknown or reserved ids in content are skipped,
// and text that fits nowhere is dropped from the messages (it stays in the raw output).
class StreamParser {
public:
    // `tokenizer` must outlive the parser. With `assistant_started`, the output continues a
    // prompt that ended in "<|start|>assistant", so the first header has role assistant.
    StreamParser(const Tokenizer& tokenizer, bool assistant_started);

    // Feeds one token. *delta receives the content text this token completed (valid UTF-8,
    // often empty).
    void push(int32_t token, std::string* delta);
    // Ends the output: closes an open message (a header cut off by the end of output becomes a
    // message only if it holds text besides its channel).
    void finish(std::string* delta);

    const std::vector<ParsedMessage>& messages() const { return messages_; }
    // True while inside a message's content; then current() describes that message.
    bool in_content() const { return state_ == State::Content; }
    const ParsedMessage& current() const { return current_; }

private:
    enum class State { ExpectStart, Header, Content };
    void begin_header(bool role_known);
    void close_header_as_message(int32_t end_token);
    void open_content();
    void close_content(int32_t end_token, std::string* delta);

    const Tokenizer& tokenizer_;
    State state_;
    bool role_known_;          // the header's role was given by "<|start|>assistant" in the prompt
    std::vector<int32_t> header_tokens_;
    ParsedMessage current_;
    Utf8StreamDecoder utf8_;
    std::vector<ParsedMessage> messages_;
};

// One chat turn's streaming (what gptoss_chat does per sampled token): feeds the parser,
// describes each token as a gptoss_event (channel and recipient of the message it belongs to,
// content text as valid UTF-8), and matches stop strings against final-channel text, holding
// back text that could be the start of one so that no event and no message ever contains a
// stop string.
class ChatStream {
public:
    ChatStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings);
    // Feeds one token and fills *event (struct_size, token, text, channel, recipient; the
    // pointers live until the next push). Returns true when a stop string has just appeared.
    bool push(int32_t token, gptoss_event* event);
    // Ends the output. Then messages() holds the turn, the final message cut before the stop string.
    void finish();
    std::vector<ParsedMessage> messages() const;

private:
    bool match(const std::string& delta, bool message_closed, std::string* emit);
    bool cut_header_message(size_t index);
    StreamParser parser_;
    std::vector<std::string> stops_;
    std::string delta_, text_, recipient_;
    std::string final_;          // the current final message's text so far
    size_t final_emitted_ = 0;   // bytes of final_ already in events
    size_t cut_message_ = SIZE_MAX, cut_at_ = 0;
};

// Parses a header's text (specials spelled by name) into `out`'s role/name/recipient/channel/
// content_type, following harmony's rules and repairing what they would reject. With
// `role_known`, the role is assistant. Returns the words that fit nowhere (normally "").
std::string parse_header(std::string_view text, bool role_known, ParsedMessage* out);

}  // namespace harmony
}  // namespace gptoss
