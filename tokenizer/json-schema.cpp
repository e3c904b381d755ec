// tokenizer/json-schema.cpp - the JSON Schema compiler and the byte-level pushdown matcher
// behind constrained decoding (json-schema.h describes the accepted language).
// Compiler: one pass over the schema with simdjson's DOM; $ref targets are compiled once each
// (memoised by JSON pointer), so recursive schemas become cycles in the node graph; choices are
// flattened at the end. Matcher: step() advances every thread by one byte; a frame either takes
// the byte, rejects it, finishes (pops) and hands the byte to its parent (numbers and literals
// end lazily, at the first byte that cannot continue them), or pushes a child value, forking
// the thread once per union alternative whose first byte fits.
#include "tokenizer/json-schema.h"

#include "gptoss-internal.h"
#include "tokenizer/json-dom.h"

#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

namespace gptoss {
namespace schema {

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

// Template classes for string formats (bytes below 0x20 never appear in JSON strings raw).
constexpr char kDigit = 1, kDigit01 = 2, kDigit02 = 3, kDigit05 = 5, kDigit18 = 6, kDigit19 = 7, kHex = 10;

bool class_accepts(char cls, uint8_t b) {
    switch (cls) {
    case kDigit: return b >= '0' && b <= '9';
    case kDigit01: return b == '0' || b == '1';
    case kDigit02: return b >= '0' && b <= '2';
    case kDigit05: return b >= '0' && b <= '5';
    case kDigit18: return b >= '1' && b <= '8';
    case kDigit19: return b >= '1' && b <= '9';
    case kHex: return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f');
    default: return uint8_t(cls) == b;
    }
}

// Formats as fixed templates that accept only valid values: months 01-09, days x1-x8 (valid in
// every month), hours 00-19.
std::string format_template(std::string_view format) {
    const std::string d(1, kDigit), hex(1, kHex);
    const std::string date = d + d + d + d + "-0" + std::string(1, kDigit19) + "-" + std::string(1, kDigit02) +
                             std::string(1, kDigit18);
    const std::string time = std::string(1, kDigit01) + d + ":" + std::string(1, kDigit05) + d + ":" +
                             std::string(1, kDigit05) + d + "Z";
    if (format == "date") return date;
    if (format == "time") return time;
    if (format == "date-time") return date + "T" + time;
    if (format == "uuid") {
        auto h = [&](int n) { return std::string(size_t(n), kHex); };
        return h(8) + "-" + h(4) + "-" + h(4) + "-" + h(4) + "-" + h(12);
    }
    return "";
}

void set_first(Node* node, uint8_t b) { node->first[b >> 3] |= uint8_t(1u << (b & 7)); }
bool has_first(const Node& node, uint8_t b) { return (node.first[b >> 3] >> (b & 7)) & 1u; }

enum TypeBit : uint32_t {
    kNull = 1, kBoolean = 2, kInteger = 4, kNumber = 8, kString = 16, kObject = 32, kArray = 64, kAllTypes = 127
};

uint32_t type_bit(std::string_view name) {
    if (name == "null") return kNull;
    if (name == "boolean") return kBoolean;
    if (name == "integer") return kInteger;
    if (name == "number") return kNumber;
    if (name == "string") return kString;
    if (name == "object") return kObject;
    if (name == "array") return kArray;
    return 0;
}

uint32_t value_types(element e) {
    switch (e.type()) {
    case element_type::NULL_VALUE: return kNull;
    case element_type::BOOL: return kBoolean;
    case element_type::INT64:
    case element_type::UINT64: return kInteger | kNumber;
    case element_type::DOUBLE: return kNumber;
    case element_type::STRING: return kString;
    case element_type::OBJECT: return kObject;
    case element_type::ARRAY: return kArray;
    }
    return 0;
}

const std::set<std::string_view>& annotations() {
    static const std::set<std::string_view> s = {"title",   "description", "default",  "examples",  "$schema",
                                                 "$id",     "$comment",    "deprecated", "readOnly", "writeOnly",
                                                 "$defs",   "definitions", "strict"};
    return s;
}

const std::set<std::string_view>& supported() {
    static const std::set<std::string_view> s = {
        "type",  "enum",       "const",       "anyOf",    "oneOf",    "allOf",     "$ref",      "nullable",
        "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
        "minLength", "maxLength", "format"};
    return s;
}

// oneOf exactness: a value must match exactly one branch, so the compiler accepts a oneOf only
// when it can prove that nothing branch i generates validates branch j (for every i != j); then
// oneOf and anyOf admit the same documents. excludes(a, b) proves "no document the compiler
// generates for a validates b" from a's generated language (types inferred from keywords,
// required properties always present) and b's full validation semantics (no "type": any type;
// undeclared keys checked against additionalProperties). Sufficient rules, else "not proven":
// the JSON types cannot meet (integer and number always meet); two finite enum/const sets share
// no value; or a property a requires has, in b, a schema (declared, or additionalProperties,
// false included) that excludes a's value for it (a discriminator: {"kind":{"const":"circle"}});
// or, where a writes only its declared keys, a key b requires is one a never writes or writes
// only with values b's schema for it excludes.
// Unions are checked branch by branch. Depth- and work-limited (recursive $refs and unions of
// unions could otherwise take exponential time), ending as "not proven".
class OneOfCheck {
public:
    explicit OneOfCheck(element root) : root_(root) {}

    bool excludes(element a, element b, int depth = 0) const {
        if (depth > 24 || ++steps_ > kMaxSteps || !resolve(&a) || !resolve(&b)) return false;
        const uint32_t ta = types(a, true, depth), tb = types(b, false, depth);
        uint32_t common = ta & tb;
        if ((ta & (kInteger | kNumber)) && (tb & (kInteger | kNumber))) common |= kNumber;
        if (common == 0) return true;
        std::vector<element> branches;
        bool nullable = false;
        if (union_of(a, &branches, &nullable)) {
            if (nullable && (tb & kNull)) return false;
            for (element x : branches)
                if (!excludes(x, b, depth + 1)) return false;
            return true;
        }
        if (union_of(b, &branches, &nullable)) {
            if (nullable && (ta & kNull)) return false;
            for (element x : branches)
                if (!excludes(a, x, depth + 1)) return false;
            return true;
        }
        std::vector<element> va, vb;
        const bool fa = finite(a, &va), fb = finite(b, &vb);
        if (fa && fb) {
            for (element x : va)
                for (element y : vb)
                    if (may_equal(x, y)) return false;
            return true;
        }
        if (fa || fb || (common & ~uint32_t(kObject)) != 0) return false;
        // Objects: a discriminating property, required by a (always generated) or by b (then a
        // document of a without it fails b, and one with it holds a's declared value).
        for (std::string_view name : required_names(a)) {
            element pa, pb;
            if (declared(a, name, &pa) && value_schema(b, name, &pb) && excludes(pa, pb, depth + 1)) return true;
        }
        if (!closed(a)) return false;
        for (std::string_view name : required_names(b)) {
            element pa, pb;
            if (!declared(a, name, &pa)) return true;  // a never writes the key b requires
            if (value_schema(b, name, &pb) && excludes(pa, pb, depth + 1)) return true;
        }
        return false;
    }

private:
    // Follows $ref and allOf-of-one; false if it cannot.
    bool resolve(element* s) const {
        for (int i = 0; i < 32; ++i) {
            element v;
            simdjson::dom::array arr;
            std::string_view ref;
            if (s->type() != element_type::OBJECT) return true;
            if (json::field(*s, "$ref", &v)) {
                if (v.get_string().get(ref) != simdjson::SUCCESS || ref.empty() || ref[0] != '#') return false;
                if (ref.size() == 1) *s = root_;
                else if (root_.at_pointer(ref.substr(1)).get(*s) != simdjson::SUCCESS) return false;
            } else if (json::field(*s, "allOf", &v) && v.get_array().get(arr) == simdjson::SUCCESS && arr.size() == 1) {
                *s = arr.at(0).value();
            } else {
                return true;
            }
        }
        return false;
    }

    static std::vector<std::string_view> required_names(element s) {
        std::vector<std::string_view> out;
        element v;
        simdjson::dom::array arr;
        std::string_view name;
        if (json::field(s, "required", &v) && v.get_array().get(arr) == simdjson::SUCCESS)
            for (element n : arr)
                if (n.get_string().get(name) == simdjson::SUCCESS) out.push_back(name);
        return out;
    }
    static bool declared(element s, std::string_view name, element* out) {
        element props;
        return json::field(s, "properties", &props) && props.type() == element_type::OBJECT &&
               json::field(props, name, out);
    }
    // The schema b holds the value of key `name` to: its declared property, else its
    // additionalProperties (false included); false if none.
    static bool value_schema(element s, std::string_view name, element* out) {
        return declared(s, name, out) || json::field(s, "additionalProperties", out);
    }
    // The compiler writes no keys but the declared ones: additionalProperties false, or absent
    // beside declared properties.
    static bool closed(element s) {
        element v, props;
        bool allowed = true;
        if (json::field(s, "additionalProperties", &v)) return v.get_bool().get(allowed) == simdjson::SUCCESS && !allowed;
        return json::field(s, "properties", &props);
    }

    static bool is_true(element v) {
        bool b = false;
        return v.get_bool().get(b) == simdjson::SUCCESS && b;
    }

    static bool union_of(element s, std::vector<element>* branches, bool* nullable) {
        element v;
        simdjson::dom::array arr;
        if (s.type() != element_type::OBJECT) return false;
        if (!json::field(s, "anyOf", &v) && !json::field(s, "oneOf", &v)) return false;
        if (v.get_array().get(arr) != simdjson::SUCCESS) return false;
        branches->clear();
        for (element x : arr) branches->push_back(x);
        *nullable = json::field(s, "nullable", &v) && is_true(v);
        return true;
    }

    static uint32_t declared_types(element s) {
        element v;
        std::string_view name;
        simdjson::dom::array arr;
        uint32_t t = 0;
        if (!json::field(s, "type", &v)) return 0;
        if (v.get_string().get(name) == simdjson::SUCCESS) return type_bit(name);
        if (v.get_array().get(arr) == simdjson::SUCCESS)
            for (element x : arr)
                if (x.get_string().get(name) == simdjson::SUCCESS) t |= type_bit(name);
        return t;
    }

    // enum/const values (those of the declared type, when one is declared).
    static bool finite(element s, std::vector<element>* values) {
        if (s.type() != element_type::OBJECT) return false;
        element v;
        simdjson::dom::array arr;
        bool any = false;
        if (json::field(s, "const", &v)) {
            values->push_back(v);
            any = true;
        }
        if (json::field(s, "enum", &v) && v.get_array().get(arr) == simdjson::SUCCESS) {
            for (element x : arr) values->push_back(x);
            any = true;
        }
        const uint32_t t = declared_types(s);
        if (t != 0)
            values->erase(std::remove_if(values->begin(), values->end(),
                                         [&](element x) { return (value_types(x) & (t | kNull)) == 0; }),
                          values->end());
        return any;
    }

    // Two JSON values that may be equal under JSON Schema's equality (numbers by value; objects
    // and arrays always "may").
    static bool may_equal(element x, element y) {
        const uint32_t tx = value_types(x), ty = value_types(y);
        if ((tx & kNumber) && (ty & kNumber)) {
            double dx = 0, dy = 0;
            if (x.get_double().get(dx) != simdjson::SUCCESS || y.get_double().get(dy) != simdjson::SUCCESS) return true;
            return dx == dy;
        }
        if ((tx | ty) & (kObject | kArray)) return (tx & ty) != 0;
        return simdjson::minify(x) == simdjson::minify(y);
    }

    // The JSON types s can hold: what the compiler generates for it (`generated`), or what
    // validates against it.
    uint32_t types(element s, bool generated, int depth) const {
        bool b = false;
        if (s.get_bool().get(b) == simdjson::SUCCESS) return b ? uint32_t(kAllTypes) : 0u;
        if (s.type() != element_type::OBJECT || depth > 24 || ++steps_ > kMaxSteps) return kAllTypes;
        element v;
        const bool nullable = json::field(s, "nullable", &v) && is_true(v);
        std::vector<element> branches, values;
        bool union_nullable = false;
        if (union_of(s, &branches, &union_nullable)) {
            uint32_t t = union_nullable ? uint32_t(kNull) : 0u;
            for (element x : branches) t |= resolve(&x) ? types(x, generated, depth + 1) : kAllTypes;
            return t;
        }
        if (finite(s, &values)) {
            uint32_t t = 0;
            for (element x : values) t |= value_types(x);
            return t;
        }
        uint32_t t = declared_types(s);
        if (t == 0 && generated) {
            for (const char* k : {"properties", "required", "additionalProperties"})
                if (json::field(s, k, &v)) t |= kObject;
            for (const char* k : {"items", "prefixItems", "minItems", "maxItems"})
                if (json::field(s, k, &v)) t |= kArray;
            for (const char* k : {"minLength", "maxLength", "format"})
                if (json::field(s, k, &v)) t |= kString;
        }
        if (t == 0) return kAllTypes;
        return t | (nullable ? uint32_t(kNull) : 0u);
    }

    static constexpr uint32_t kMaxSteps = 20000;
    element root_;
    mutable uint32_t steps_ = 0;
};

class Compiler {
public:
    Compiler(element root, std::string where) : root_(root), where_(std::move(where)) {}

    gptoss_status run(Grammar* out) {
        uint32_t root = 0;
        GPTOSS_TRY(compile(root_, "", &root));
        // Flatten choices: entries >= 0 are nodes, < 0 are -(choice + 1).
        out->choices.resize(raw_.size());
        for (uint32_t c = 0; c < raw_.size(); ++c) {
            std::vector<bool> seen(raw_.size(), false);
            flatten(c, &seen, &out->choices[c]);
            if (out->choices[c].empty())
                return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: %s: no document can match this schema", where_.c_str(),
                            choice_path_[c].empty() ? "/" : choice_path_[c].c_str());
        }
        out->nodes = std::move(nodes_);
        out->root = root;
        return GPTOSS_OK;
    }

private:
    gptoss_status error(const std::string& path, const char* format, ...) __attribute__((format(printf, 3, 4))) {
        char text[512];
        va_list args;
        va_start(args, format);
        vsnprintf(text, sizeof text, format, args);
        va_end(args);
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: %s: %s", where_.c_str(), path.empty() ? "/" : path.c_str(), text);
    }

    uint32_t new_choice(const std::string& path) {
        raw_.emplace_back();
        choice_path_.push_back(path);
        return uint32_t(raw_.size() - 1);
    }
    uint32_t add_node(Node node) {
        nodes_.push_back(std::move(node));
        return uint32_t(nodes_.size() - 1);
    }

    void flatten(uint32_t c, std::vector<bool>* seen, std::vector<uint32_t>* out) {
        if ((*seen)[c]) return;
        (*seen)[c] = true;
        for (int64_t e : raw_[c]) {
            if (e >= 0) {
                if (std::find(out->begin(), out->end(), uint32_t(e)) == out->end()) out->push_back(uint32_t(e));
            } else {
                flatten(uint32_t(-e - 1), seen, out);
            }
        }
    }

    static std::string child(const std::string& path, std::string_view key) {
        std::string k;
        for (char ch : key) k += ch == '~' ? std::string("~0") : ch == '/' ? std::string("~1") : std::string(1, ch);
        return path + "/" + k;
    }

    gptoss_status get_count(element e, const std::string& path, uint32_t* out) {
        uint64_t v = 0;
        int64_t s = 0;
        if (e.get_uint64().get(v) == simdjson::SUCCESS) {
        } else if (e.get_int64().get(s) == simdjson::SUCCESS || e.type() == element_type::DOUBLE) {
            return error(path, "expected a non-negative integer");
        } else {
            return error(path, "expected a non-negative integer");
        }
        *out = uint32_t(std::min<uint64_t>(v, UINT32_MAX - 1));
        return GPTOSS_OK;
    }

    uint32_t any_choice() {
        if (any_ >= 0) return uint32_t(any_);
        const uint32_t c = new_choice("");
        any_ = c;
        std::vector<int64_t> alts;
        alts.push_back(literal_node({"false", "null", "true"}));
        alts.push_back(number_node(false));
        Node s;
        s.kind = Kind::String;
        set_first(&s, '"');
        alts.push_back(add_node(std::move(s)));
        Node o;
        o.kind = Kind::Object;
        o.extra = int32_t(c);
        o.next_required = {0};
        set_first(&o, '{');
        alts.push_back(add_node(std::move(o)));
        Node a;
        a.kind = Kind::Array;
        a.items = int32_t(c);
        set_first(&a, '[');
        alts.push_back(add_node(std::move(a)));
        raw_[c] = alts;
        return c;
    }

    uint32_t literal_node(std::vector<std::string> literals) {
        std::sort(literals.begin(), literals.end());
        literals.erase(std::unique(literals.begin(), literals.end()), literals.end());
        Node n;
        n.kind = Kind::Literal;
        for (const std::string& l : literals) set_first(&n, uint8_t(l[0]));
        n.literals = std::move(literals);
        return add_node(std::move(n));
    }

    uint32_t number_node(bool integer) {
        Node n;
        n.kind = Kind::Number;
        n.integer = integer;
        set_first(&n, '-');
        for (uint8_t b = '0'; b <= '9'; ++b) set_first(&n, b);
        return add_node(std::move(n));
    }

    // A oneOf whose branches the compiler cannot prove disjoint (OneOfCheck) fails, naming them.
    gptoss_status check_one_of(simdjson::dom::array branches, bool nullable, const std::string& path) {
        const OneOfCheck check(root_);
        std::vector<element> b;
        for (element x : branches) b.push_back(x);
        for (size_t i = 0; i < b.size(); ++i)
            for (size_t j = 0; j < b.size(); ++j)
                if (i != j && !check.excludes(b[i], b[j]))
                    return error(path, "branches %zu and %zu may both match a value, which oneOf forbids; use anyOf, or "
                                 "make them disjoint (different types, or a property each requires with different "
                                 "const/enum values)", std::min(i, j), std::max(i, j));
        if (nullable) {
            // The null that "nullable" adds must match no branch.
            simdjson::dom::parser parser;
            element null_schema;
            if (parser.parse(std::string_view("{\"type\":\"null\"}")).get(null_schema) != simdjson::SUCCESS)
                return error(path, "internal error");
            for (size_t i = 0; i < b.size(); ++i)
                if (!check.excludes(null_schema, b[i]))
                    return error(path, "branch %zu may match null, which \"nullable\" adds too; oneOf forbids both", i);
        }
        return GPTOSS_OK;
    }

    gptoss_status compile(element e, const std::string& path, uint32_t* out);
    gptoss_status keywords(element e, const std::string& path, std::set<std::string_view>* present);
    gptoss_status compile_alternatives(element e, const std::string& path, const char* key,
                                       const std::set<std::string_view>& present, bool nullable, uint32_t* out);
    gptoss_status compile_typed(element e, const std::string& path, uint32_t types, uint32_t* out);
    gptoss_status type_keyword(element e, const std::string& path, uint32_t* types);
    gptoss_status compile_ref(element schema, const std::string& path, uint32_t* out);
    gptoss_status compile_enum(element schema, const std::string& path, uint32_t types, bool nullable, uint32_t* out);
    gptoss_status string_node(element schema, const std::string& path, uint32_t* out);
    gptoss_status object_node(element schema, const std::string& path, uint32_t* out);
    gptoss_status object_properties(element props_value, const std::string& path, Node* n);
    gptoss_status object_required(element required, const std::string& path, Node* n);
    gptoss_status array_node(element schema, const std::string& path, uint32_t* out);

    element root_;
    std::string where_;
    std::vector<Node> nodes_;
    std::vector<std::vector<int64_t>> raw_;
    std::vector<std::string> choice_path_;
    std::map<std::string, uint32_t> refs_;  // JSON pointer → choice
    int64_t any_ = -1;
    uint32_t depth_ = 0;
};

using json::field;

// The keywords of schema object e that are not annotations into *present; an unsupported one
// is an error.
gptoss_status Compiler::keywords(element e, const std::string& path, std::set<std::string_view>* present) {
    simdjson::dom::object object;
    if (e.get_object().get(object) != simdjson::SUCCESS) return error(path, "expected a schema object");
    for (auto kv : object) {
        if (annotations().count(kv.key)) continue;
        if (!supported().count(kv.key)) return error(child(path, kv.key), "unsupported keyword \"%.*s\"",
                                                     int(kv.key.size()), kv.key.data());
        present->insert(kv.key);
    }
    return GPTOSS_OK;
}

// anyOf / oneOf (key): a choice of the branches (oneOf: proven disjoint), plus null when nullable.
gptoss_status Compiler::compile_alternatives(element e, const std::string& path, const char* key,
                                             const std::set<std::string_view>& present, bool nullable, uint32_t* out) {
    for (std::string_view other : present)
        if (other != key && other != "nullable")
            return error(child(path, other), "keyword \"%.*s\" beside \"%s\" is not supported", int(other.size()),
                         other.data(), key);
    element v;
    field(e, key, &v);
    simdjson::dom::array arr;
    if (v.get_array().get(arr) != simdjson::SUCCESS || arr.size() == 0)
        return error(child(path, key), "expected a non-empty array of schemas");
    const uint32_t c = new_choice(path);
    size_t i = 0;
    for (element alt : arr) {
        uint32_t a = 0;
        GPTOSS_TRY(compile(alt, child(child(path, key), std::to_string(i++)), &a));
        raw_[c].push_back(-int64_t(a) - 1);
    }
    if (std::string_view(key) == "oneOf") GPTOSS_TRY(check_one_of(arr, nullable, child(path, key)));
    if (nullable) raw_[c].push_back(literal_node({"null"}));
    *out = c;
    return GPTOSS_OK;
}

// The "type" keyword of e as type bits (0: absent).
gptoss_status Compiler::type_keyword(element e, const std::string& path, uint32_t* types) {
    element v;
    *types = 0;
    if (!field(e, "type", &v)) return GPTOSS_OK;
    std::string_view name;
    simdjson::dom::array arr;
    if (v.get_string().get(name) == simdjson::SUCCESS) {
        *types = type_bit(name);
        if (*types == 0) return error(child(path, "type"), "unknown type \"%.*s\"", int(name.size()), name.data());
    } else if (v.get_array().get(arr) == simdjson::SUCCESS) {
        for (element t : arr) {
            if (t.get_string().get(name) != simdjson::SUCCESS || type_bit(name) == 0)
                return error(child(path, "type"), "expected type names");
            *types |= type_bit(name);
        }
        if (*types == 0) return error(child(path, "type"), "empty type array");
    } else {
        return error(child(path, "type"), "expected a string or an array of strings");
    }
    return GPTOSS_OK;
}

// With no "type": the types the keywords describe (a subset of what validates), or 0.
uint32_t implied_types(const std::set<std::string_view>& present) {
    uint32_t types = 0;
    if (present.count("properties") || present.count("required") || present.count("additionalProperties"))
        types |= kObject;
    if (present.count("items") || present.count("prefixItems") || present.count("minItems") || present.count("maxItems"))
        types |= kArray;
    if (present.count("minLength") || present.count("maxLength") || present.count("format")) types |= kString;
    return types;
}

// A choice of one node per type in `types`.
gptoss_status Compiler::compile_typed(element e, const std::string& path, uint32_t types, uint32_t* out) {
    const uint32_t c = new_choice(path);
    if (types & kNull) raw_[c].push_back(literal_node({"null"}));
    if (types & kBoolean) raw_[c].push_back(literal_node({"false", "true"}));
    if (types & kNumber) raw_[c].push_back(number_node(false));
    else if (types & kInteger) raw_[c].push_back(number_node(true));
    uint32_t n = 0;
    if (types & kString) {
        GPTOSS_TRY(string_node(e, path, &n));
        raw_[c].push_back(n);
    }
    if (types & kObject) {
        GPTOSS_TRY(object_node(e, path, &n));
        raw_[c].push_back(n);
    }
    if (types & kArray) {
        GPTOSS_TRY(array_node(e, path, &n));
        raw_[c].push_back(n);
    }
    *out = c;
    return GPTOSS_OK;
}

gptoss_status Compiler::compile(element e, const std::string& path, uint32_t* out) {
    if (++depth_ > 64) return error(path, "schema nested deeper than 64 levels");
    struct Leave {
        uint32_t* d;
        ~Leave() { --*d; }
    } leave{&depth_};
    bool b = false;
    if (e.get_bool().get(b) == simdjson::SUCCESS) {
        if (!b) return error(path, "the schema false matches nothing");
        *out = any_choice();
        return GPTOSS_OK;
    }
    if (e.type() != element_type::OBJECT) return error(path, "expected a schema (an object or a boolean)");
    std::set<std::string_view> present;
    GPTOSS_TRY(keywords(e, path, &present));
    element v;
    if (present.count("$ref")) {
        if (present.size() > 1)
            return error(path, "keywords beside \"$ref\" are not supported (only annotations may sit next to it)");
        return compile_ref(e, path, out);
    }
    if (present.count("allOf")) {
        field(e, "allOf", &v);
        simdjson::dom::array arr;
        if (v.get_array().get(arr) != simdjson::SUCCESS || arr.size() != 1 || present.size() > 1)
            return error(child(path, "allOf"), "only an allOf of one schema, with no other keywords, is supported");
        return compile(arr.at(0).value(), child(child(path, "allOf"), "0"), out);
    }
    bool nullable = false;
    if (field(e, "nullable", &v) && v.get_bool().get(nullable) != simdjson::SUCCESS)
        return error(child(path, "nullable"), "expected a boolean");
    for (const char* key : {"anyOf", "oneOf"})
        if (present.count(key)) return compile_alternatives(e, path, key, present, nullable, out);
    uint32_t types = 0;
    GPTOSS_TRY(type_keyword(e, path, &types));
    if (present.count("enum") || present.count("const")) return compile_enum(e, path, types, nullable, out);
    if (types == 0) {
        types = implied_types(present);
        if (types == 0) {
            if (!nullable) {
                *out = any_choice();
                return GPTOSS_OK;
            }
            types = kAllTypes;
        }
    }
    if (nullable) types |= kNull;
    return compile_typed(e, path, types, out);
}

gptoss_status Compiler::compile_ref(element schema, const std::string& path, uint32_t* out) {
    element v;
    field(schema, "$ref", &v);
    std::string_view ref;
    if (v.get_string().get(ref) != simdjson::SUCCESS) return error(child(path, "$ref"), "expected a string");
    if (ref.empty() || ref[0] != '#')
        return error(child(path, "$ref"), "only local references (\"#/$defs/Name\") are supported, found \"%.*s\"",
                     int(ref.size()), ref.data());
    const std::string pointer(ref.substr(1));
    auto it = refs_.find(pointer);
    if (it != refs_.end()) {
        *out = it->second;
        return GPTOSS_OK;
    }
    element target;
    if (pointer.empty()) {
        target = root_;
    } else if (root_.at_pointer(pointer).get(target) != simdjson::SUCCESS) {
        return error(child(path, "$ref"), "\"%.*s\" points at nothing", int(ref.size()), ref.data());
    }
    // Reserve the choice first, so a schema that refers to itself becomes a cycle.
    const uint32_t c = new_choice(pointer);
    refs_[pointer] = c;
    uint32_t inner = 0;
    GPTOSS_TRY(compile(target, pointer, &inner));
    raw_[c].push_back(-int64_t(inner) - 1);
    *out = c;
    return GPTOSS_OK;
}

gptoss_status Compiler::compile_enum(element schema, const std::string& path, uint32_t types, bool nullable,
                                     uint32_t* out) {
    for (std::string_view other : {"properties", "items", "prefixItems", "additionalProperties", "required",
                                   "minItems", "maxItems", "format"}) {
        element ignored;
        if (field(schema, other, &ignored))
            return error(child(path, other), "keyword \"%.*s\" beside enum/const is not supported", int(other.size()),
                         other.data());
    }
    uint32_t min_length = 0, max_length = UINT32_MAX;
    element v;
    if (field(schema, "minLength", &v)) GPTOSS_TRY(get_count(v, child(path, "minLength"), &min_length));
    if (field(schema, "maxLength", &v)) GPTOSS_TRY(get_count(v, child(path, "maxLength"), &max_length));
    std::vector<element> values;
    if (field(schema, "const", &v)) values.push_back(v);
    if (field(schema, "enum", &v)) {
        simdjson::dom::array arr;
        if (v.get_array().get(arr) != simdjson::SUCCESS) return error(child(path, "enum"), "expected an array");
        for (element x : arr) values.push_back(x);
        if (values.empty()) return error(child(path, "enum"), "an empty enum matches nothing");
    }
    if (types != 0 && nullable) types |= kNull;
    std::vector<std::string> literals;
    for (element x : values) {
        if (types != 0 && (value_types(x) & types) == 0) continue;
        std::string_view s;
        if (x.get_string().get(s) == simdjson::SUCCESS) {
            size_t cps = 0;
            for (unsigned char ch : s) cps += (ch & 0xC0) != 0x80;
            if (cps < min_length || cps > max_length) continue;
        }
        literals.push_back(simdjson::minify(x));
    }
    if (nullable && types == 0) literals.push_back("null");
    if (literals.empty()) return error(path, "no value of enum/const matches the schema's type");
    const uint32_t c = new_choice(path);
    raw_[c].push_back(literal_node(std::move(literals)));
    *out = c;
    return GPTOSS_OK;
}

gptoss_status Compiler::string_node(element schema, const std::string& path, uint32_t* out) {
    Node n;
    n.kind = Kind::String;
    set_first(&n, '"');
    element v;
    if (field(schema, "minLength", &v)) GPTOSS_TRY(get_count(v, child(path, "minLength"), &n.min_length));
    if (field(schema, "maxLength", &v)) GPTOSS_TRY(get_count(v, child(path, "maxLength"), &n.max_length));
    if (n.min_length > n.max_length) return error(path, "minLength %u > maxLength %u", n.min_length, n.max_length);
    if (field(schema, "format", &v)) {
        std::string_view format;
        if (v.get_string().get(format) != simdjson::SUCCESS) return error(child(path, "format"), "expected a string");
        n.format = format_template(format);
        if (n.format.empty())
            return error(child(path, "format"), "unsupported format \"%.*s\" (supported: date, time, date-time, uuid)",
                         int(format.size()), format.data());
        if (n.format.size() < n.min_length || n.format.size() > n.max_length)
            return error(path, "format \"%.*s\" contradicts minLength/maxLength", int(format.size()), format.data());
    }
    *out = add_node(std::move(n));
    return GPTOSS_OK;
}

// "properties": each compiled in order into n->props (names that need escaping in JSON are not
// supported).
gptoss_status Compiler::object_properties(element props_value, const std::string& path, Node* n) {
    simdjson::dom::object props;
    if (props_value.get_object().get(props) != simdjson::SUCCESS) return error(child(path, "properties"), "expected an object");
    for (auto kv : props) {
        const std::string at = child(child(path, "properties"), kv.key);
        for (unsigned char ch : kv.key)
            if (ch == '"' || ch == '\\' || ch < 0x20)
                return error(at, "property names that need escaping in JSON are not supported");
        Node::Property p;
        p.name = std::string(kv.key);
        GPTOSS_TRY(compile(kv.value, at, &p.value));
        n->props.push_back(std::move(p));
    }
    return GPTOSS_OK;
}

// "required": marks the named properties; a name not declared becomes a property of any value.
gptoss_status Compiler::object_required(element required, const std::string& path, Node* n) {
    simdjson::dom::array arr;
    if (required.get_array().get(arr) != simdjson::SUCCESS) return error(child(path, "required"), "expected an array of strings");
    for (element r : arr) {
        std::string_view name;
        if (r.get_string().get(name) != simdjson::SUCCESS) return error(child(path, "required"), "expected an array of strings");
        auto it = std::find_if(n->props.begin(), n->props.end(), [&](const Node::Property& p) { return p.name == name; });
        if (it == n->props.end()) {
            // Required but not declared: any value.
            for (unsigned char ch : name)
                if (ch == '"' || ch == '\\' || ch < 0x20)
                    return error(child(path, "required"), "property names that need escaping are not supported");
            Node::Property p;
            p.name = std::string(name);
            p.value = any_choice();
            n->props.push_back(std::move(p));
            it = n->props.end() - 1;
        }
        it->required = true;
    }
    return GPTOSS_OK;
}

gptoss_status Compiler::object_node(element schema, const std::string& path, uint32_t* out) {
    Node n;
    n.kind = Kind::Object;
    set_first(&n, '{');
    element v;
    const bool has_properties = field(schema, "properties", &v);
    if (has_properties) GPTOSS_TRY(object_properties(v, path, &n));
    if (field(schema, "required", &v)) GPTOSS_TRY(object_required(v, path, &n));
    if (n.props.size() > kMaxProperties)
        return error(child(path, "properties"), "%zu properties; at most %u are supported", n.props.size(), kMaxProperties);
    bool additional_given = false;
    if (field(schema, "additionalProperties", &v)) {
        additional_given = true;
        bool allowed = true;
        if (v.get_bool().get(allowed) == simdjson::SUCCESS) {
            if (allowed) n.extra = int32_t(any_choice());
        } else {
            uint32_t c = 0;
            GPTOSS_TRY(compile(v, child(path, "additionalProperties"), &c));
            n.extra = int32_t(c);
        }
    }
    // Absent additionalProperties: other keys validate, but are generated only for an object
    // that declares no properties ({"type":"object"} means any object).
    if (!additional_given && !has_properties) n.extra = int32_t(any_choice());
    n.next_required.assign(n.props.size() + 1, uint32_t(n.props.size()));
    for (size_t i = n.props.size(); i-- > 0;)
        n.next_required[i] = n.props[i].required ? uint32_t(i) : n.next_required[i + 1];
    *out = add_node(std::move(n));
    return GPTOSS_OK;
}

gptoss_status Compiler::array_node(element schema, const std::string& path, uint32_t* out) {
    Node n;
    n.kind = Kind::Array;
    set_first(&n, '[');
    element v;
    if (field(schema, "prefixItems", &v)) {
        simdjson::dom::array arr;
        if (v.get_array().get(arr) != simdjson::SUCCESS) return error(child(path, "prefixItems"), "expected an array");
        size_t i = 0;
        for (element item : arr) {
            uint32_t c = 0;
            GPTOSS_TRY(compile(item, child(child(path, "prefixItems"), std::to_string(i++)), &c));
            n.prefix.push_back(c);
        }
    }
    n.items = int32_t(any_choice());
    if (field(schema, "items", &v)) {
        bool allowed = true;
        if (v.get_bool().get(allowed) == simdjson::SUCCESS) {
            if (!allowed) n.items = -1;
        } else if (v.type() == element_type::ARRAY) {
            return error(child(path, "items"), "an array of schemas (draft 4 tuples) is not supported; use prefixItems");
        } else {
            uint32_t c = 0;
            GPTOSS_TRY(compile(v, child(path, "items"), &c));
            n.items = int32_t(c);
        }
    }
    if (field(schema, "minItems", &v)) GPTOSS_TRY(get_count(v, child(path, "minItems"), &n.min_items));
    if (field(schema, "maxItems", &v)) GPTOSS_TRY(get_count(v, child(path, "maxItems"), &n.max_items));
    if (n.items < 0) n.max_items = std::min<uint32_t>(n.max_items, uint32_t(n.prefix.size()));
    if (n.min_items > n.max_items) return error(path, "minItems %u exceeds the items allowed (%u)", n.min_items, n.max_items);
    *out = add_node(std::move(n));
    return GPTOSS_OK;
}

// ---------------------------------------------------------------------------
// Matcher

enum Act { kConsume, kConsumeDone, kReject, kPop, kPush };

bool is_ws(uint8_t b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }

// Root states
enum : uint8_t { kRootBefore = 0, kRootAfter = 1 };
// Number states
enum : uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };
// At most 15 integer digits and a 2-digit exponent: every number the grammar admits is finite as an
// IEEE double (< 1e15 · 1e99), so validators that parse to double (ajv: JSON.parse) accept it.
// A 3-digit exponent let the model write 38881e475 = Infinity (found by tests/test-schema-ajv.sh).
constexpr uint32_t kMaxIntDigits = 15, kMaxFracDigits = 15, kMaxExpDigits = 2;
// String states
enum : uint8_t { kStrOpen, kStrChars, kStrEsc, kStrHex, kStrUtf8 };
// Object states; aux = member << 8 | flags
enum : uint8_t { kObjOpen, kObjKeyStart, kObjKey, kObjColon, kObjValue, kObjAfter };
constexpr uint32_t kFlagExtraAlive = 1, kFlagAfterComma = 2;
constexpr uint32_t kMemberExtra = 0xFFFF;
// Array states
enum : uint8_t { kArrOpen, kArrFirst, kArrAfter, kArrNext };

bool is_key_char(uint8_t b) {
    return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') || b == '_' || b == '-';
}

Frame init_frame(const Grammar& g, uint32_t node) {
    Frame f;
    std::memset(&f, 0, sizeof f);
    f.node = node;
    if (node != kRootNode && g.nodes[node].kind == Kind::Literal) f.aux = uint32_t(g.nodes[node].literals.size());
    return f;
}

// Whitespace at a place that allows it: consumed while under the bound.
Act take_ws(Frame& f) {
    if (f.ws >= kMaxWhitespace) return kReject;
    f.ws++;
    return kConsume;
}

Act step_literal(const Node& n, Frame& f, uint8_t b) {
    uint32_t lo = f.count, hi = f.aux;
    bool complete = false;
    uint32_t new_lo = hi, new_hi = hi;
    for (uint32_t i = lo; i < hi; ++i) {
        const std::string& l = n.literals[i];
        if (l.size() == f.pos) complete = true;
        else if (uint8_t(l[f.pos]) == b) {
            if (new_lo == hi) new_lo = i;
            new_hi = i + 1;
        }
    }
    if (new_lo == new_hi) return complete ? kPop : kReject;
    f.count = new_lo;
    f.aux = new_hi;
    f.pos++;
    // Done when the only candidate left ends here.
    if (new_hi - new_lo == 1 && n.literals[new_lo].size() == f.pos) return kConsumeDone;
    return kConsume;
}

bool literal_can_end(const Node& n, const Frame& f) {
    for (uint32_t i = f.count; i < f.aux; ++i)
        if (n.literals[i].size() == f.pos) return true;
    return false;
}

Act step_number(const Node& n, Frame& f, uint8_t b) {
    const bool digit = b >= '0' && b <= '9';
    switch (f.st) {
    case kNumStart:
        if (b == '-') { f.st = kNumMinus; return kConsume; }
        [[fallthrough]];
    case kNumMinus:
        if (b == '0') { f.st = kNumZero; return kConsume; }
        if (digit) { f.st = kNumInt; f.count = 1; return kConsume; }
        return kReject;
    case kNumZero:
    case kNumInt:
        if (digit && f.st == kNumInt && f.count < kMaxIntDigits) { f.count++; return kConsume; }
        if (!n.integer && b == '.') { f.st = kNumDot; return kConsume; }
        if (!n.integer && (b == 'e' || b == 'E')) { f.st = kNumE; return kConsume; }
        return kPop;
    case kNumDot:
        if (digit) { f.st = kNumFrac; f.count = 1; return kConsume; }
        return kReject;
    case kNumFrac:
        if (digit && f.count < kMaxFracDigits) { f.count++; return kConsume; }
        if (b == 'e' || b == 'E') { f.st = kNumE; return kConsume; }
        return kPop;
    case kNumE:
        if (b == '+' || b == '-') { f.st = kNumESign; return kConsume; }
        [[fallthrough]];
    case kNumESign:
        if (digit) { f.st = kNumExp; f.count = 1; return kConsume; }
        return kReject;
    case kNumExp:
        if (digit && f.count < kMaxExpDigits) { f.count++; return kConsume; }
        return kPop;
    }
    return kReject;
}

bool number_can_end(const Frame& f) {
    return f.st == kNumZero || f.st == kNumInt || f.st == kNumFrac || f.st == kNumExp;
}

Act step_string(const Node& n, Frame& f, uint8_t b) {
    switch (f.st) {
    case kStrOpen:
        if (b != '"') return kReject;
        f.st = kStrChars;
        return kConsume;
    case kStrChars:
        if (!n.format.empty()) {
            if (f.count == n.format.size()) return b == '"' ? kConsumeDone : kReject;
            if (!class_accepts(n.format[f.count], b)) return kReject;
            f.count++;
            return kConsume;
        }
        if (b == '"') return f.count >= n.min_length ? kConsumeDone : kReject;
        if (b < 0x20 || f.count >= n.max_length) return kReject;
        if (b == '\\') { f.st = kStrEsc; f.count++; return kConsume; }
        if (b < 0x80) { f.count++; return kConsume; }
        {
            uint32_t more = 0, lo = 0x80, hi = 0xBF;
            if (b >= 0xC2 && b <= 0xDF) more = 1;
            else if (b == 0xE0) { more = 2; lo = 0xA0; }
            else if (b == 0xED) { more = 2; hi = 0x9F; }
            else if (b >= 0xE1 && b <= 0xEF) more = 2;
            else if (b == 0xF0) { more = 3; lo = 0x90; }
            else if (b >= 0xF1 && b <= 0xF3) more = 3;
            else if (b == 0xF4) { more = 3; hi = 0x8F; }
            else return kReject;
            f.st = kStrUtf8;
            f.pos = uint16_t(more);
            f.aux = lo | hi << 8;
            f.count++;
            return kConsume;
        }
    case kStrUtf8:
        if (b < (f.aux & 0xFF) || b > (f.aux >> 8)) return kReject;
        f.aux = 0x80 | 0xBF << 8;
        if (--f.pos == 0) f.st = kStrChars;
        return kConsume;
    case kStrEsc:
        if (b == 'u') { f.st = kStrHex; f.pos = 4; f.aux = 0; return kConsume; }
        if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't') {
            f.st = kStrChars;
            return kConsume;
        }
        return kReject;
    case kStrHex: {
        const bool hex = (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
        if (!hex) return kReject;
        if (f.pos == 4 && (b == 'd' || b == 'D')) f.aux = 1;            // D800-DFFF: surrogates
        else if (f.pos == 3 && f.aux == 1 && !(b >= '0' && b <= '7')) return kReject;
        if (--f.pos == 0) f.st = kStrChars;
        return kConsume;
    }
    }
    return kReject;
}

// Object, at a key's opening quote (after '{' or ','): '}' may close it once every required key
// is in; else the key starts. Low 32 bits of alive: the declared keys allowed here still matching
// ([count, next_required[count]]); high 32: every declared key still matching (an extra key must
// differ from all of them).
inline Act object_key_start(const Node& n, Frame& f, uint8_t b, bool done_required) {
    const uint32_t np = uint32_t(n.props.size());
    if (is_ws(b)) return take_ws(f);
    if (b == '}' && !(f.aux & kFlagAfterComma) && done_required) return kConsumeDone;
    uint64_t allowed = 0;
    for (uint32_t j = f.count; j < np && j <= n.next_required[f.count]; ++j) allowed |= uint64_t(1) << j;
    if (b != '"' || (allowed == 0 && n.extra < 0)) return kReject;
    const uint64_t all = np == 32 ? 0xFFFFFFFFull : ((uint64_t(1) << np) - 1);
    f.st = kObjKey;
    f.pos = 0;
    f.alive = allowed | all << 32;
    f.aux = (f.aux & ~kFlagExtraAlive) | (n.extra >= 0 ? kFlagExtraAlive : 0);
    return kConsume;
}

// Object, inside a key: the closing quote picks the declared key still alive at this length (or an
// extra key that equals none of them), any other byte narrows the alive keys.
inline Act object_key(const Node& n, Frame& f, uint8_t b) {
    const uint32_t np = uint32_t(n.props.size());
    if (b == '"') {
        bool declared = false;
        for (uint32_t j = 0; j < np; ++j) {
            if (n.props[j].name.size() != f.pos) continue;
            if ((f.alive >> j) & 1) {
                f.count = j + 1;
                f.aux = j << 8;
                f.st = kObjColon;
                f.ws = 0;
                return kConsume;
            }
            if ((f.alive >> (32 + j)) & 1) declared = true;
        }
        if ((f.aux & kFlagExtraAlive) && f.pos > 0 && !declared) {
            f.aux = kMemberExtra << 8;
            f.st = kObjColon;
            f.ws = 0;
            return kConsume;
        }
        return kReject;
    }
    uint64_t alive = 0;
    for (uint32_t j = 0; j < np; ++j) {
        if (n.props[j].name.size() <= f.pos || uint8_t(n.props[j].name[f.pos]) != b) continue;
        alive |= f.alive & ((uint64_t(1) << j) | (uint64_t(1) << (32 + j)));
    }
    f.alive = alive;
    if (!is_key_char(b)) f.aux &= ~kFlagExtraAlive;
    if ((alive & 0xFFFFFFFFull) == 0 && !(f.aux & kFlagExtraAlive)) return kReject;
    f.pos++;
    return kConsume;
}

// Object: keys come from the declared properties [count, next_required[count]] in order, or
// are other keys (extra) when allowed.
Act step_object(const Node& n, Frame& f, uint8_t b, uint32_t* push) {
    const uint32_t np = uint32_t(n.props.size());
    const bool done_required = n.next_required[f.count] == np;
    switch (f.st) {
    case kObjOpen:
        if (b != '{') return kReject;
        f.st = kObjKeyStart;
        f.ws = 0;
        return kConsume;
    case kObjKeyStart:
        return object_key_start(n, f, b, done_required);
    case kObjKey:
        return object_key(n, f, b);
    case kObjColon:
        if (is_ws(b)) return take_ws(f);
        if (b != ':') return kReject;
        f.st = kObjValue;
        f.ws = 0;
        return kConsume;
    case kObjValue: {
        if (is_ws(b)) return take_ws(f);
        const uint32_t member = f.aux >> 8;
        *push = member == kMemberExtra ? uint32_t(n.extra) : n.props[member].value;
        f.st = kObjAfter;
        f.ws = 0;
        return kPush;
    }
    case kObjAfter:
        if (is_ws(b)) return take_ws(f);
        if (b == '}') return done_required ? kConsumeDone : kReject;
        if (b == ',' && (f.count < np || n.extra >= 0)) {
            f.st = kObjKeyStart;
            f.aux = kFlagAfterComma;
            f.ws = 0;
            return kConsume;
        }
        return kReject;
    }
    return kReject;
}

int32_t item_choice(const Node& n, uint32_t i) {
    if (i >= n.max_items) return -1;
    return i < n.prefix.size() ? int32_t(n.prefix[i]) : n.items;
}

Act step_array(const Node& n, Frame& f, uint8_t b, uint32_t* push) {
    switch (f.st) {
    case kArrOpen:
        if (b != '[') return kReject;
        f.st = kArrFirst;
        f.ws = 0;
        return kConsume;
    case kArrFirst:
    case kArrNext: {
        if (is_ws(b)) return take_ws(f);
        if (b == ']' && f.st == kArrFirst) return n.min_items == 0 ? kConsumeDone : kReject;
        const int32_t c = item_choice(n, f.count);
        if (c < 0) return kReject;
        *push = uint32_t(c);
        f.count++;
        f.st = kArrAfter;
        f.ws = 0;
        return kPush;
    }
    case kArrAfter:
        if (is_ws(b)) return take_ws(f);
        if (b == ']') return f.count >= n.min_items ? kConsumeDone : kReject;
        if (b == ',' && item_choice(n, f.count) >= 0) {
            f.st = kArrNext;
            f.ws = 0;
            return kConsume;
        }
        return kReject;
    }
    return kReject;
}

Act step_frame(const Grammar& g, Frame& f, uint8_t b, uint32_t* push) {
    if (f.node == kRootNode) {
        if (is_ws(b)) return take_ws(f);
        if (f.st == kRootAfter) return kReject;
        f.st = kRootAfter;
        f.ws = 0;
        *push = g.root;
        return kPush;
    }
    const Node& n = g.nodes[f.node];
    switch (n.kind) {
    case Kind::Literal: return step_literal(n, f, b);
    case Kind::Number: return step_number(n, f, b);
    case Kind::String: return step_string(n, f, b);
    case Kind::Object: return step_object(n, f, b, push);
    case Kind::Array: return step_array(n, f, b, push);
    case Kind::Root: break;
    }
    return kReject;
}

void emit(const std::vector<Frame>& t, State* out) {
    if (out->ends.size() >= kMaxThreads) return;
    out->frames.insert(out->frames.end(), t.begin(), t.end());
    out->ends.push_back(uint32_t(out->frames.size()));
}

// Advances one thread (owned copy `t`) by `b`, appending the resulting threads to *out.
void step_thread(const Grammar& g, std::vector<Frame>& t, uint8_t b, State* out) {
    for (;;) {
        if (t.empty()) return;
        uint32_t push = 0;
        const Act act = step_frame(g, t.back(), b, &push);
        switch (act) {
        case kConsume: emit(t, out); return;
        case kReject: return;
        case kConsumeDone: t.pop_back(); emit(t, out); return;
        case kPop: t.pop_back(); continue;
        case kPush: {
            if (t.size() >= kMaxDepth) return;
            const std::vector<uint32_t>& alts = g.choices[push];
            uint32_t fits = 0, last = 0;
            for (uint32_t a : alts)
                if (has_first(g.nodes[a], b)) { fits++; last = a; }
            if (fits == 0) return;
            if (fits > 1) {
                for (uint32_t a : alts) {
                    if (!has_first(g.nodes[a], b) || a == last) continue;
                    std::vector<Frame> copy = t;
                    copy.push_back(init_frame(g, a));
                    step_thread(g, copy, b, out);
                }
            }
            t.push_back(init_frame(g, last));
            continue;
        }
        }
    }
}

void dedupe(State* s) {
    if (s->ends.size() < 2) return;
    std::vector<std::string> keys;
    uint32_t begin = 0;
    for (uint32_t e : s->ends) {
        keys.emplace_back(reinterpret_cast<const char*>(s->frames.data() + begin), (e - begin) * sizeof(Frame));
        begin = e;
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    s->frames.clear();
    s->ends.clear();
    for (const std::string& k : keys) {
        const size_t n = k.size() / sizeof(Frame);
        const size_t at = s->frames.size();
        s->frames.resize(at + n);
        std::memcpy(s->frames.data() + at, k.data(), k.size());
        s->ends.push_back(uint32_t(s->frames.size()));
    }
}

}  // namespace

bool State::operator==(const State& o) const {
    return ends == o.ends && frames.size() == o.frames.size() &&
           std::memcmp(frames.data(), o.frames.data(), frames.size() * sizeof(Frame)) == 0;
}

std::string State::key() const {
    std::string k(reinterpret_cast<const char*>(ends.data()), ends.size() * sizeof(uint32_t));
    k.append(reinterpret_cast<const char*>(frames.data()), frames.size() * sizeof(Frame));
    return k;
}

gptoss_status compile(std::string_view schema_json, const std::string& where, std::shared_ptr<const Grammar>* out) {
    simdjson::dom::parser parser;
    simdjson::padded_string padded(schema_json.data(), schema_json.size());
    element root;
    const simdjson::error_code error = parser.parse(padded).get(root);
    if (error != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: not valid JSON (%s)", where.c_str(), simdjson::error_message(error));
    auto grammar = std::make_shared<Grammar>();
    Compiler compiler(root, where);
    GPTOSS_TRY(compiler.run(grammar.get()));
    *out = std::move(grammar);
    return GPTOSS_OK;
}

gptoss_status minify_json(std::string_view json, const std::string& where, std::string* out) {
    simdjson::dom::parser parser;
    simdjson::padded_string padded(json.data(), json.size());
    element root;
    const simdjson::error_code error = parser.parse(padded).get(root);
    if (error != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: not valid JSON (%s)", where.c_str(), simdjson::error_message(error));
    *out = simdjson::minify(root);
    return GPTOSS_OK;
}

State initial_state(const Grammar& grammar) {
    State s;
    s.frames.push_back(init_frame(grammar, kRootNode));
    s.ends.push_back(1);
    return s;
}

bool step(const Grammar& grammar, const State& in, uint8_t b, State* out) {
    out->frames.clear();
    out->ends.clear();
    thread_local std::vector<Frame> t;
    uint32_t begin = 0;
    for (uint32_t e : in.ends) {
        t.assign(in.frames.begin() + begin, in.frames.begin() + e);
        step_thread(grammar, t, b, out);
        begin = e;
    }
    dedupe(out);
    return !out->ends.empty();
}

bool can_finish(const Grammar& g, const State& state) {
    uint32_t begin = 0;
    for (uint32_t e : state.ends) {
        bool ok = true;
        for (uint32_t i = e; i-- > begin && ok;) {
            const Frame& f = state.frames[i];
            if (f.node == kRootNode) { ok = f.st == kRootAfter; break; }
            const Node& n = g.nodes[f.node];
            if (n.kind == Kind::Literal) ok = literal_can_end(n, f);
            else if (n.kind == Kind::Number) ok = number_can_end(f);
            else ok = false;
        }
        if (ok) return true;
        begin = e;
    }
    return false;
}

bool in_plain_string(const Grammar& g, const State& state, uint32_t* remaining) {
    if (state.ends.size() != 1) return false;
    const Frame& f = state.frames.back();
    if (f.node == kRootNode) return false;
    const Node& n = g.nodes[f.node];
    if (n.kind != Kind::String || f.st != kStrChars || !n.format.empty()) return false;
    *remaining = n.max_length - std::min(n.max_length, f.count);
    return true;
}

Matcher::Matcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), state_(initial_state(*grammar_)) {}

bool Matcher::advance(std::string_view bytes) {
    State a = state_;
    for (unsigned char b : bytes) {
        if (!step(*grammar_, a, b, &scratch_)) return false;
        std::swap(a, scratch_);
    }
    state_ = std::move(a);
    return true;
}

void fuzz_one(const uint8_t* data, size_t size) {
    const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
    const size_t schema_len = nul != nullptr ? size_t(nul - data) : size;
    std::shared_ptr<const Grammar> grammar;
    if (compile(std::string_view(reinterpret_cast<const char*>(data), schema_len), "fuzz", &grammar) != GPTOSS_OK) return;
    Matcher m(grammar);
    for (size_t i = schema_len + 1; i < size; ++i)
        if (!m.advance(std::string_view(reinterpret_cast<const char*>(data + i), 1))) break;
    (void)m.can_finish();
}

}  // namespace schema
}  // namespace gptoss
