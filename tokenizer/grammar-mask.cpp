// tokenizer/grammar-mask.cpp - token masks from matcher states (grammar-mask.h): the token trie,
// the plain-string masks and the cached depth-first walk.
#include "tokenizer/grammar-mask.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

namespace gptoss {
namespace schema {

namespace {

// A whole number of complete, valid UTF-8 characters with no byte a JSON string must escape;
// *chars receives the character count.
bool plain_bytes(std::string_view s, uint32_t* chars) {
    uint32_t n = 0;
    for (size_t i = 0; i < s.size();) {
        const uint8_t b = uint8_t(s[i]);
        if (b < 0x20 || b == '"' || b == '\\') return false;
        size_t len = 1;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b < 0x80) len = 1;
        else if (b >= 0xC2 && b <= 0xDF) len = 2;
        else if (b == 0xE0) { len = 3; lo = 0xA0; }
        else if (b == 0xED) { len = 3; hi = 0x9F; }
        else if (b >= 0xE1 && b <= 0xEF) len = 3;
        else if (b == 0xF0) { len = 4; lo = 0x90; }
        else if (b >= 0xF1 && b <= 0xF3) len = 4;
        else if (b == 0xF4) { len = 4; hi = 0x8F; }
        else return false;
        if (i + len > s.size()) return false;
        for (size_t k = 1; k < len; ++k) {
            const uint8_t c = uint8_t(s[i + k]);
            if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return false;
        }
        i += len;
        n++;
    }
    *chars = n;
    return !s.empty();
}

constexpr uint32_t kPlainBuckets = 64;  // exact masks for remaining lengths below this

}  // namespace

std::shared_ptr<const TokenTable> TokenTable::get(const Tokenizer& tokenizer) {
    static std::mutex mutex;
    static std::map<const Tokenizer*, std::weak_ptr<const TokenTable>> tables;
    std::lock_guard<std::mutex> lock(mutex);
    std::shared_ptr<const TokenTable> table = tables[&tokenizer].lock();
    if (!table) {
        table = std::make_shared<const TokenTable>(tokenizer);
        tables[&tokenizer] = table;
    }
    return table;
}

TokenTable::TokenTable(const Tokenizer& tokenizer) : n_vocab_(tokenizer.n_vocab()) {
    std::vector<std::string_view> bytes(n_vocab_);
    std::vector<int32_t> sorted;
    plain_.assign(n_vocab_, false);
    std::vector<uint32_t> chars(n_vocab_, 0);
    uint32_t max_chars = 0;
    for (uint32_t t = 0; t < n_vocab_; ++t) {
        if (tokenizer.is_special(int32_t(t))) continue;
        bytes[t] = tokenizer.token_bytes(int32_t(t));
        if (bytes[t].empty()) continue;
        sorted.push_back(int32_t(t));
        uint32_t c = 0;
        if (plain_bytes(bytes[t], &c)) {
            plain_[t] = true;
            chars[t] = c;
            max_chars = std::max(max_chars, c);
        }
    }
    std::sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) { return bytes[a] < bytes[b]; });
    trie_.reserve(sorted.size() * 2);
    trie_.push_back(Node{0, 0, -1, 0, false});
    build(sorted, bytes, 0, uint32_t(sorted.size()), 0, 0);
    // plain_by_chars_[r]: plain tokens of <= r characters, r < kPlainBuckets; plain_all_: all.
    max_plain_chars_ = max_chars;
    const uint32_t words = n_words();
    plain_by_chars_.assign(std::min(max_chars, kPlainBuckets - 1) + 1, std::vector<uint32_t>(words, 0));
    plain_all_.assign(words, 0);
    for (uint32_t t = 0; t < n_vocab_; ++t) {
        if (!plain_[t]) continue;
        plain_all_[t / 32] |= 1u << (t % 32);
        for (uint32_t r = chars[t]; r < plain_by_chars_.size(); ++r) plain_by_chars_[r][t / 32] |= 1u << (t % 32);
    }
}

// Children of `node` from sorted[lo, hi), whose first `depth` bytes are the node's path.
uint32_t TokenTable::build(const std::vector<int32_t>& sorted, const std::vector<std::string_view>& bytes,
                           uint32_t lo, uint32_t hi, uint32_t depth, uint32_t node) {
    bool nonplain = false;
    if (lo < hi && bytes[sorted[lo]].size() == depth) {
        trie_[node].token = sorted[lo];
        nonplain = !plain_[sorted[lo]];
        lo++;
    }
    // Group the rest by the byte at `depth`.
    std::vector<std::pair<uint32_t, uint32_t>> groups;
    for (uint32_t i = lo; i < hi;) {
        const uint8_t b = uint8_t(bytes[sorted[i]][depth]);
        uint32_t j = i + 1;
        while (j < hi && uint8_t(bytes[sorted[j]][depth]) == b) j++;
        groups.emplace_back(i, j);
        i = j;
    }
    const uint32_t first = uint32_t(trie_.size());
    trie_[node].first_child = first;
    trie_[node].n_children = uint32_t(groups.size());
    for (const auto& g : groups) trie_.push_back(Node{0, 0, -1, uint8_t(bytes[sorted[g.first]][depth]), false});
    for (uint32_t k = 0; k < groups.size(); ++k)
        if (build(sorted, bytes, groups[k].first, groups[k].second, depth + 1, first + k)) nonplain = true;
    trie_[node].has_nonplain = nonplain;
    return nonplain;
}

const uint32_t* TokenTable::plain_upto(uint32_t r) const {
    if (r >= max_plain_chars_) return plain_all_.data();
    if (r < plain_by_chars_.size()) return plain_by_chars_[r].data();
    return nullptr;
}

MaskCache::MaskCache(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTable> table)
    : grammar_(std::move(grammar)), table_(std::move(table)) {}

void MaskCache::walk(uint32_t node, uint32_t depth, bool only_nonplain, uint32_t* bits) {
    const TokenTable::Node& n = table_->trie()[node];
    if (stack_.size() < depth + 2) stack_.resize(depth + 2);
    for (uint32_t c = n.first_child; c < n.first_child + n.n_children; ++c) {
        const TokenTable::Node& ch = table_->trie()[c];
        if (only_nonplain && !ch.has_nonplain) continue;
        if (!step(*grammar_, stack_[depth], ch.byte, &stack_[depth + 1])) continue;
        if (ch.token >= 0) bits[ch.token / 32] |= 1u << (ch.token % 32);
        if (ch.n_children > 0) walk(c, depth + 1, only_nonplain, bits);
    }
}

void MaskCache::mask(const State& state, uint32_t* bits) {
    const uint32_t words = table_->n_words();
    std::string key = state.key();
    auto it = index_.find(key);
    if (it != index_.end()) {
        hits_++;
        lru_.splice(lru_.begin(), lru_, it->second);
        std::memcpy(bits, it->second->second.data(), words * sizeof(uint32_t));
        return;
    }
    misses_++;
    uint32_t remaining = 0;
    const uint32_t* plain = in_plain_string(*grammar_, state, &remaining) ? table_->plain_upto(remaining) : nullptr;
    const bool fast = plain != nullptr;
    if (fast) std::memcpy(bits, plain, words * sizeof(uint32_t));
    else std::memset(bits, 0, words * sizeof(uint32_t));
    if (stack_.empty()) stack_.resize(1);
    stack_[0] = state;
    walk(0, 0, fast, bits);
    if (lru_.size() >= kCacheEntries) {
        index_.erase(lru_.back().first);
        lru_.pop_back();
    }
    lru_.emplace_front(key, std::vector<uint32_t>(bits, bits + words));
    index_[std::move(key)] = lru_.begin();
}

}  // namespace schema
}  // namespace gptoss
