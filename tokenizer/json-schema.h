// tokenizer/json-schema.h - JSON Schema → a pushdown automaton over bytes, for constrained
// decoding (issue 14). compile() turns a schema of the supported subset into a Grammar: a graph
// of nodes (literal sets for enum/const/null/booleans, numbers, strings, objects, arrays) and
// "choices" (unions: type arrays, anyOf/oneOf, nullable, $ref targets). A Matcher walks bytes
// through it: its State is a small set of threads (one per union alternative still alive), each
// a stack of 24-byte Frames, so a state can be copied, compared and hashed cheaply, which the
// token mask (grammar-mask.h) relies on. The language accepted is a subset of the documents
// the schema validates: object members come in the schema's declared order (required ones
// always, optional ones may be skipped); other keys only where additionalProperties is true or
// a schema (or the object declares no properties), as [A-Za-z0-9_-]+; numbers at most 15
// integer and 15 fraction digits; no \u escapes of surrogates; at most kMaxWhitespace bytes of
// whitespace at each place JSON allows it, so a model cannot stall in spaces. oneOf compiles
// like anyOf, and only where the compiler proves its branches disjoint (nothing one generates
// validates another: different types, disjoint enums, a discriminating required property), so
// that exactly one branch matches; else INVALID_ARGUMENT ("/oneOf: branches 0 and 1 may both
// match a value ... use anyOf"). Anything else fails with INVALID_ARGUMENT naming the keyword
// and its JSON pointer. CPU only; no dependency besides simdjson.
#pragma once

#include "gptoss.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gptoss {
namespace schema {

constexpr uint32_t kMaxWhitespace = 16;   // bytes of whitespace allowed at one place
constexpr uint32_t kMaxDepth = 48;        // frames in one thread (nesting of values + 1)
constexpr uint32_t kMaxThreads = 32;      // union alternatives alive at once
constexpr uint32_t kMaxProperties = 32;   // declared properties of one object

enum class Kind : uint8_t { Root, Literal, Number, String, Object, Array };

struct Node {
    Kind kind = Kind::Literal;
    uint8_t first[32] = {};                // bytes a value of this node can start with (bitset)
    // Literal: canonical JSON texts, sorted, unique (enum, const, null, true, false).
    std::vector<std::string> literals;
    // Number
    bool integer = false;
    // String: lengths in code points; `format` a fixed template ('d' digit, 'h' hex digit, other
    // bytes literal), empty for none.
    uint32_t min_length = 0, max_length = UINT32_MAX;
    std::string format;
    // Object: declared properties in order; next_required[i] = first required index >= i (or
    // props.size()); extra: the choice for other keys, -1 for none.
    struct Property {
        std::string name;                  // as written between the quotes (needs no escaping)
        uint32_t value = 0;                // choice id
        bool required = false;
    };
    std::vector<Property> props;
    std::vector<uint32_t> next_required;
    int32_t extra = -1;
    // Array: items i < prefix.size() use prefix[i], later ones `items` (-1: none allowed).
    std::vector<uint32_t> prefix;
    int32_t items = -1;
    uint32_t min_items = 0, max_items = UINT32_MAX;
};

struct Grammar {
    std::vector<Node> nodes;
    std::vector<std::vector<uint32_t>> choices;  // choice id → node ids (flattened)
    uint32_t root = 0;                           // choice id of the document
};

// Compiles `schema_json`. `where` prefixes error messages ("json_schema", "tools[0].parameters").
// Errors (INVALID_ARGUMENT): not JSON; "where: /properties/a/pattern: unsupported keyword
// \"pattern\""; a malformed keyword ("/required: expected an array of strings"); an
// unresolvable $ref; a schema no document can match (false, an empty enum).
[[nodiscard]] gptoss_status compile(std::string_view schema_json, const std::string& where,
                                    std::shared_ptr<const Grammar>* out);

// One position in a stack: which node, and where inside it. Plain bytes (no padding), so
// states compare and hash with memcmp.
struct Frame {
    uint32_t node;    // node id, or kRootNode
    uint8_t st;       // the node kind's sub-state
    uint8_t ws;       // whitespace bytes taken at the current place
    uint16_t pos;     // literal/key byte position, hex digits or UTF-8 bytes left
    uint32_t count;   // literal range start | digits | code points | next property | items
    uint32_t aux;     // literal range end | UTF-8 byte range | object member and flags
    uint64_t alive;   // object key: declared properties still matching
};
static_assert(sizeof(Frame) == 24, "Frame must have no padding");
constexpr uint32_t kRootNode = UINT32_MAX;

// A matcher state: threads[i] = frames[ends[i-1] .. ends[i]). No threads: dead.
struct State {
    std::vector<Frame> frames;
    std::vector<uint32_t> ends;
    bool operator==(const State& other) const;
    std::string key() const;  // bytes for hashing / map keys
};

// The initial state (whitespace, then the document).
State initial_state(const Grammar& grammar);
// Advances `in` by byte `b` into *out (reusing its storage). Returns false (and leaves *out
// empty) if no thread accepts `b`.
bool step(const Grammar& grammar, const State& in, uint8_t b, State* out);
// True when the document is complete in some thread (trailing whitespace allowed).
bool can_finish(const Grammar& grammar, const State& state);
// True when the state is in a string's characters with no format, no pending escape or UTF-8
// byte, in its only thread: where grammar-mask.h's fast path applies. *remaining receives how
// many more code points the string may take.
bool in_plain_string(const Grammar& grammar, const State& state, uint32_t* remaining);

// Convenience wrapper for tests and for the engine's bookkeeping.
class Matcher {
public:
    explicit Matcher(std::shared_ptr<const Grammar> grammar);
    // Takes all of `bytes` or, if one is rejected, none (returns false, state unchanged).
    bool advance(std::string_view bytes);
    bool can_finish() const { return schema::can_finish(*grammar_, state_); }
    const State& state() const { return state_; }
    const Grammar& grammar() const { return *grammar_; }
    const std::shared_ptr<const Grammar>& grammar_ptr() const { return grammar_; }

private:
    std::shared_ptr<const Grammar> grammar_;
    State state_, scratch_;
};

// The JSON text without insignificant whitespace (key order kept), for rendering a schema.
// INVALID_ARGUMENT naming `where` if it is not JSON.
[[nodiscard]] gptoss_status minify_json(std::string_view json, const std::string& where, std::string* out);

// Fuzz entry point (tests/fuzz): compiles `data` as a schema and, if it compiles, drives a
// matcher with the bytes after the first NUL. Never crashes on any input.
void fuzz_one(const uint8_t* data, size_t size);

}  // namespace schema
}  // namespace gptoss
