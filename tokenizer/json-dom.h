// tokenizer/json-dom.h - helpers over simdjson's DOM shared by the JSON readers (chat-json,
// json-schema, openai-json): the name of a value's type as error messages print it ("an array",
// "null", ...) and a member lookup that reports whether the key is present (a null member
// counts as present). Header-only, so gptoss_openai (outside libgptoss) can use it too.
#pragma once

#include <simdjson.h>

#include <string_view>

namespace gptoss::json {

inline const char* type_name(simdjson::dom::element e) {
    using simdjson::dom::element_type;
    switch (e.type()) {
    case element_type::ARRAY: return "an array";
    case element_type::OBJECT: return "an object";
    case element_type::INT64:
    case element_type::UINT64:
    case element_type::DOUBLE: return "a number";
    case element_type::STRING: return "a string";
    case element_type::BOOL: return "a boolean";
    case element_type::NULL_VALUE: return "null";
    }
    return "a value";
}

// `object`[key] into *out; false when object is not an object or has no such key.
inline bool field(simdjson::dom::element object, std::string_view key, simdjson::dom::element* out) {
    return object.get_object()[key].get(*out) == simdjson::SUCCESS;
}

}  // namespace gptoss::json
