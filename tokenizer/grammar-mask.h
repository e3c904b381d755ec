// tokenizer/grammar-mask.h - which tokens a schema matcher state allows next: a bitmask over the
// vocabulary (bit t of word t/32 set = token t allowed), for constrained decoding.
// TokenTable (one per tokenizer, built once, ~0.3 s, ~40 MB) holds every ordinary token's bytes
// in a trie, so tokens that share a prefix share the matcher steps for it: a mask is a depth-
// first walk that stops at the first byte the state rejects. Inside a plain string (no format,
// no pending escape) the "plain" tokens (no quote, backslash or control byte; whole UTF-8
// characters) are all allowed up to the string's remaining length: those come from precomputed
// masks by character count, and the walk visits only subtrees holding other tokens. A
// MaskCache keeps the masks of the last states seen (bounded: kCacheEntries masks of V/8
// bytes), so a state that recurs (the inside of a long string, the same key position) costs a
// copy. Special tokens are never allowed by the walk; the caller adds its end tokens.
#pragma once

#include "tokenizer/json-schema.h"
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace gptoss {
namespace schema {

class TokenTable {
public:
    // The table for `tokenizer` (built on first use, then shared; keyed by the tokenizer's address,
    // so the tokenizer must outlive every user of the table).
    static std::shared_ptr<const TokenTable> get(const Tokenizer& tokenizer);
    explicit TokenTable(const Tokenizer& tokenizer);

    uint32_t n_vocab() const { return n_vocab_; }
    uint32_t n_words() const { return (n_vocab_ + 31) / 32; }

    struct Node {
        uint32_t first_child;   // children are nodes [first_child, first_child + n_children)
        uint32_t n_children;
        int32_t token;          // the token whose bytes end here, or -1
        uint8_t byte;           // the edge byte into this node
        bool has_nonplain;      // the subtree holds a token outside the plain masks
    };
    const std::vector<Node>& trie() const { return trie_; }   // node 0 is the root
    // Plain tokens of at most r characters (every plain token once r >= the longest one), or
    // NULL for the lengths between the precomputed buckets and the longest plain token.
    const uint32_t* plain_upto(uint32_t r) const;

private:
    uint32_t build(const std::vector<int32_t>& sorted, const std::vector<std::string_view>& bytes, uint32_t lo,
                   uint32_t hi, uint32_t depth, uint32_t node);
    uint32_t n_vocab_ = 0;
    std::vector<Node> trie_;
    std::vector<bool> plain_;
    std::vector<std::vector<uint32_t>> plain_by_chars_;  // [r]: plain tokens of <= r characters
    std::vector<uint32_t> plain_all_;
    uint32_t max_plain_chars_ = 0;
};

// Computes masks for states of one grammar, with a bounded cache. Not thread-safe.
class MaskCache {
public:
    static constexpr size_t kCacheEntries = 32;
    MaskCache(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTable> table);
    // Writes table.n_words() words to `bits`: the ordinary tokens whose bytes `state` accepts.
    void mask(const State& state, uint32_t* bits);
    uint64_t hits() const { return hits_; }
    uint64_t misses() const { return misses_; }

private:
    void walk(uint32_t node, uint32_t depth, bool only_nonplain, uint32_t* bits);
    std::shared_ptr<const Grammar> grammar_;
    std::shared_ptr<const TokenTable> table_;
    std::vector<State> stack_;   // stack_[d]: the state after the first d bytes of the current path
    std::list<std::pair<std::string, std::vector<uint32_t>>> lru_;
    std::unordered_map<std::string, std::list<std::pair<std::string, std::vector<uint32_t>>>::iterator> index_;
    uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace schema
}  // namespace gptoss
