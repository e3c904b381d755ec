// tokenizer/tokenizer.h - the o200k_harmony byte-level BPE tokenizer (HARMONY.md §1).
// No GPU dependency. Produces exactly the ids of OpenAI's tiktoken: ids 0..199997 are the
// o200k_base ranks, 199998..201087 special tokens (the names in the file, "<|reserved_N|>" for
// the rest; 200018 is "<|endofprompt|>"); ids >= 201088 do not exist.
// A Tokenizer is immutable after loading and safe to use from many threads at once.
// Character classes come from Unicode 16.0, as in tiktoken's regex engine (regex-syntax 0.8.5);
// characters first assigned in 17.0 are unassigned for both (tokenizer/README.md).
#pragma once

#include "gptoss.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gptoss {

class Tokenizer {
public:
    virtual ~Tokenizer() = default;

    // Loads a Hugging Face tokenizer.json (byte-level BPE vocab + merges + added tokens).
    // Fails with IO (unreadable) or FORMAT naming the entry (not JSON, other model type,
    // duplicate or missing ranks).
    [[nodiscard]] static gptoss_status load_hf_json(const std::string& path, std::unique_ptr<Tokenizer>* out);
    // The same on `len` bytes of JSON in memory (`path` names it in messages), readable up to
    // `capacity` >= len + simdjson::SIMDJSON_PADDING (64) bytes. tests/fuzz/fuzz-tokenizer-json.
    [[nodiscard]] static gptoss_status parse_hf_json(const std::string& path, const char* json, size_t len,
                                                     size_t capacity, std::unique_ptr<Tokenizer>* out);
    // Loads an o200k_base.tiktoken file (base64 bytes + rank per line) and adds the
    // o200k_harmony special tokens.
    [[nodiscard]] static gptoss_status load_tiktoken(const std::string& path, std::unique_ptr<Tokenizer>* out);

    // Appends the ids of `len` bytes of UTF-8 `text` to *out (tiktoken's encode_ordinary, or
    // encode with allowed_special="all" when `allow_special`). Special-token spellings, any
    // name of 199998..201087 including "<|reserved_200018|>", become special ids only when
    // `allow_special`. Invalid UTF-8 → INVALID_ARGUMENT naming the byte offset; *out is then
    // unchanged. Invalid bytes are rejected rather than encoded (a byte-level BPE could) because
    // accepting them silently hides caller bugs. NUL bytes are ordinary text.
    [[nodiscard]] virtual gptoss_status encode(const char* text, size_t len, bool allow_special,
                                               std::vector<int32_t>* out) const = 0;
    // Appends the bytes of `n` ids to *out (special tokens as their names). An id outside
    // [0, n_vocab()) → INVALID_ARGUMENT naming the position and id; *out is then unchanged.
    [[nodiscard]] virtual gptoss_status decode(const int32_t* tokens, size_t n, std::string* out) const = 0;

    // The bytes of one id (special tokens: their name). Precondition: 0 <= id < n_vocab().
    virtual std::string_view token_bytes(int32_t id) const = 0;
    virtual bool is_special(int32_t id) const = 0;
    // The id of a special token by name ("<|start|>"), or -1.
    virtual int32_t special_id(std::string_view name) const = 0;
    virtual uint32_t n_vocab() const = 0;  // 201088
};

// Turns a stream of token bytes into valid UTF-8 pieces: holds back an incomplete multi-byte
// sequence until the bytes that complete it arrive (API.md §7). Bytes that can never be valid
// UTF-8 are replaced by U+FFFD so the output stays valid.
class Utf8StreamDecoder {
public:
    // Appends to *out the complete characters that `bytes` finishes.
    void push(std::string_view bytes, std::string* out);
    // Appends whatever is still held back (as U+FFFD) and resets.
    void flush(std::string* out);
private:
    std::string pending_;
};

}  // namespace gptoss
