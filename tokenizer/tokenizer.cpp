// tokenizer/tokenizer.cpp - the o200k_harmony tokenizer: exactly the ids of OpenAI's tiktoken
// (HARMONY.md §1). Three stages:
//   pre-tokenizer  the o200k split pattern as a hand-written scanner (no regex library): the
//                  seven alternatives tried leftmost-first with the backtracking outcome of
//                  fancy-regex, over the code point classes of tokenizer/unicode.h;
//   BPE            tiktoken's rule (merge the adjacent pair whose concatenated bytes have the
//                  lowest rank, leftmost on ties): a scan for short pieces, a tournament tree
//                  for long ones;
//   specials       recognised only when the caller allows them (tiktoken's allowed_special).
// Invariants: ranks 0..199997 are o200k_base, 199998..201087 special; every single byte has a
// rank (checked at load), so every piece encodes. The object is immutable after loading.
#include "tokenizer/tokenizer.h"

#include "gptoss-internal.h"
#include "tokenizer/unicode.h"

#include <simdjson.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <unordered_map>

namespace gptoss {

namespace {

constexpr uint32_t kNumRanks = 199998;     // o200k_base ordinary tokens
constexpr uint32_t kNumVocab = 201088;     // + specials 199998..201087
constexpr uint32_t kNoRank = 0xffffffffu;

// The o200k pre-tokenizer pattern (HARMONY.md §1.3), as tokenizer.json spells it. The
// scanner below implements exactly this; a tokenizer.json with another pattern is refused.
constexpr const char kO200kPattern[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Names of the o200k_harmony special tokens (tiktoken o200k_harmony, harmony
// public_encodings.rs); every other id in 199998..201087 is "<|reserved_<id>|>".
struct NamedSpecial {
    int32_t id;
    const char* name;
};
constexpr NamedSpecial kHarmonySpecials[] = {
    {199998, "<|startoftext|>"}, {199999, "<|endoftext|>"}, {200002, "<|return|>"},
    {200003, "<|constrain|>"},   {200005, "<|channel|>"},   {200006, "<|start|>"},
    {200007, "<|end|>"},         {200008, "<|message|>"},   {200012, "<|call|>"},
    {200018, "<|endofprompt|>"},
};

// ---------------------------------------------------------------------------
// UTF-8

// Checks the UTF-8 sequence at s[0..avail) (avail >= 1) against Unicode Table 3-7.
// Returns 1 for a complete character, 0 for a valid but incomplete prefix (all `avail`
// bytes), -1 for an invalid sequence; *length is the character's length, the prefix
// length, or the maximal invalid subpart's length (>= 1), respectively.
int utf8_check(const uint8_t* s, size_t avail, size_t* length) {
    const uint8_t b0 = s[0];
    if (b0 < 0x80) {
        *length = 1;
        return 1;
    }
    size_t len;
    uint8_t lo = 0x80, hi = 0xbf;
    if (b0 >= 0xc2 && b0 <= 0xdf) {
        len = 2;
    } else if (b0 >= 0xe0 && b0 <= 0xef) {
        len = 3;
        if (b0 == 0xe0) lo = 0xa0;
        if (b0 == 0xed) hi = 0x9f;  // no surrogates
    } else if (b0 >= 0xf0 && b0 <= 0xf4) {
        len = 4;
        if (b0 == 0xf0) lo = 0x90;
        if (b0 == 0xf4) hi = 0x8f;  // <= U+10FFFF
    } else {
        *length = 1;
        return -1;
    }
    for (size_t k = 1; k < len; k++) {
        if (k >= avail) {
            *length = k;
            return 0;
        }
        const uint8_t lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xbf;
        if (s[k] < lo_k || s[k] > hi_k) {
            *length = k;
            return -1;
        }
    }
    *length = len;
    return 1;
}

// Byte offset of the first invalid sequence in s[0..n) (a truncated one included), or n.
size_t utf8_first_invalid(const uint8_t* s, size_t n) {
    size_t i = 0;
    while (i < n) {
        // Eight ASCII bytes at a time: most text is mostly ASCII.
        while (i + 8 <= n) {
            uint64_t w;
            std::memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len;
        if (utf8_check(s + i, n - i, &len) != 1) return i;
        i += len;
    }
    return n;
}

// Decodes the (valid) character at s; *len gets its byte length.
inline uint32_t utf8_decode(const uint8_t* s, size_t* len) {
    const uint8_t b0 = s[0];
    if (b0 < 0x80) {
        *len = 1;
        return b0;
    }
    if (b0 < 0xe0) {
        *len = 2;
        return (uint32_t(b0 & 0x1f) << 6) | (s[1] & 0x3f);
    }
    if (b0 < 0xf0) {
        *len = 3;
        return (uint32_t(b0 & 0x0f) << 12) | (uint32_t(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
    }
    *len = 4;
    return (uint32_t(b0 & 0x07) << 18) | (uint32_t(s[1] & 0x3f) << 12) |
           (uint32_t(s[2] & 0x3f) << 6) | (s[3] & 0x3f);
}

// ---------------------------------------------------------------------------
// Pre-tokenizer: the o200k pattern as a scanner over valid UTF-8.

// The classes of one character plus two ASCII facts the pattern tests by value.
enum : uint8_t { kIsCrLf = 32, kIsAsciiSpace = 64 };

struct Scanner {
    const uint8_t* s;
    size_t n;

    // Flags of the character at i (< n); *len gets its byte length.
    inline uint8_t at(size_t i, size_t* len) const {
        const uint8_t b = s[i];
        if (b < 0x80) {
            *len = 1;
            return kAsciiFlags[b];
        }
        return unicode_flags(utf8_decode(s + i, len));
    }
    static const uint8_t* const kAsciiFlags;

    // [^\r\n\p{L}\p{N}]
    static bool is_prefix(uint8_t f) { return !(f & (kUniLetter | kUniNumber | kIsCrLf)); }
    // [^\s\p{L}\p{N}]
    static bool is_punct(uint8_t f) { return !(f & (kUniLetter | kUniNumber | kUniSpace)); }

    // (?i:'s|'t|'re|'ve|'m|'ll|'d)? at e: the end after the optional contraction.
    size_t contraction(size_t e) const {
        if (e + 1 >= n || s[e] != '\'') return e;
        const uint8_t c = s[e + 1] | 0x20;  // ASCII lower case (only letters matter below)
        if (c == 's' || c == 't' || c == 'm' || c == 'd') return e + 2;  // (bytes >= 0x80 stay >= 0x80)
        // Unicode simple case folding maps U+017F LATIN SMALL LETTER LONG S to 's'.
        if (s[e + 1] == 0xc5 && e + 2 < n && s[e + 2] == 0xbf) return e + 3;
        if (e + 2 >= n || s[e + 1] >= 0x80) return e;
        const uint8_t c2 = s[e + 2] | 0x20;
        if ((c == 'r' && c2 == 'e') || (c == 'v' && c2 == 'e') || (c == 'l' && c2 == 'l')) return e + 3;
        return e;
    }

    // Branches 1 and 2 at i; returns the end, or 0 if neither matches (a match is never empty).
    size_t word(size_t i, uint8_t f0, size_t len0) const {
        // Branch 1: P? U* W+ C?. P? is greedy, so first with the prefix, then without.
        for (int with_prefix = 1; with_prefix >= 0; with_prefix--) {
            size_t j = i;
            if (with_prefix) {
                if (!is_prefix(f0)) continue;
                j += len0;
            }
            // U* takes the longest run; if no W follows, it gives characters back until W+
            // can start on one, so W+ then starts at the last W inside the run.
            size_t u = j, last_w_end = 0, len = 0;
            uint8_t f = 0;
            while (u < n) {
                f = at(u, &len);
                if (!(f & kUniUpper)) break;
                if (f & kUniLower) last_w_end = u + len;
                u += len;
            }
            if (u < n && (f & kUniLower)) {
                size_t e = u + len;
                while (e < n && (at(e, &len) & kUniLower)) e += len;
                return contraction(e);
            }
            if (last_w_end) return contraction(last_w_end);
        }
        // Branch 2: P? U+ W* C?.
        for (int with_prefix = 1; with_prefix >= 0; with_prefix--) {
            size_t j = i, len = 0;
            if (with_prefix) {
                if (!is_prefix(f0)) continue;
                j += len0;
            }
            if (j >= n || !(at(j, &len) & kUniUpper)) continue;
            size_t e = j + len;
            while (e < n && (at(e, &len) & kUniUpper)) e += len;
            while (e < n && (at(e, &len) & kUniLower)) e += len;
            return contraction(e);
        }
        return 0;
    }

    // The end of the piece that starts at i (< n).
    size_t next(size_t i) const {
        size_t len0, len;
        const uint8_t f0 = at(i, &len0);
        if (f0 & (kUniUpper | kUniLower) || is_prefix(f0)) {
            const size_t e = word(i, f0, len0);
            if (e) return e;
        }
        if (f0 & kUniNumber) {  // branch 3: \p{N}{1,3}
            size_t e = i + len0;
            for (int k = 1; k < 3 && e < n && (at(e, &len) & kUniNumber); k++) e += len;
            return e;
        }
        // Branch 4: " ?[^\s\p{L}\p{N}]+[\r\n/]*".
        size_t j = n;
        if (is_punct(f0)) {
            j = i;
        } else if ((f0 & kIsAsciiSpace) && i + 1 < n && is_punct(at(i + 1, &len))) {
            j = i + 1;
        }
        if (j < n) {
            size_t e = j;
            while (e < n && is_punct(at(e, &len))) e += len;
            while (e < n && (s[e] == '\r' || s[e] == '\n' || s[e] == '/')) e++;
            return e;
        }
        // Branches 5-7 over the whitespace run at i.
        size_t e = i, last_start = i, last_crlf_end = 0;
        while (e < n) {
            const uint8_t f = at(e, &len);
            if (!(f & kUniSpace)) break;
            if (f & kIsCrLf) last_crlf_end = e + len;
            last_start = e;
            e += len;
        }
        if (e == i) return i + len0;            // unreachable: every class is covered above
        if (last_crlf_end) return last_crlf_end;  // 5: \s*[\r\n]+ ends at the last CR/LF
        if (e == n) return n;                   // 6: \s+(?!\S) at the end of the text
        if (last_start > i) return last_start;  // 6: give back the last space
        return e;                               // 7: \s+ (a single character here)
    }
};

struct AsciiFlagTable {
    uint8_t flags[128];
    AsciiFlagTable() {
        for (uint32_t c = 0; c < 128; c++) flags[c] = unicode_flags(c);
        flags[uint8_t('\r')] |= kIsCrLf;
        flags[uint8_t('\n')] |= kIsCrLf;
        flags[uint8_t(' ')] |= kIsAsciiSpace;
    }
};
const AsciiFlagTable kAsciiFlagTable;
const uint8_t* const Scanner::kAsciiFlags = kAsciiFlagTable.flags;

// ---------------------------------------------------------------------------
// Hashing of byte strings

inline uint64_t mix64(uint64_t x) {
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    return x;
}

// The first min(n, 8) bytes of p as a little-endian word, zero padded, without reading past
// p + n (overlapping loads instead of a variable-length copy).
inline uint64_t load_head(const uint8_t* p, size_t n) {
    if (n >= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        return w;
    }
    if (n >= 4) {
        uint32_t lo, hi;
        std::memcpy(&lo, p, 4);
        std::memcpy(&hi, p + n - 4, 4);
        return uint64_t(lo) | uint64_t(hi) << (8 * (n - 4));
    }
    if (n == 0) return 0;
    return uint64_t(p[0]) | uint64_t(p[n / 2]) << (8 * (n / 2)) | uint64_t(p[n - 1]) << (8 * (n - 1));
}

// Hash of n bytes whose head (load_head) is `head`.
inline uint64_t hash_bytes(const uint8_t* p, size_t n, uint64_t head) {
    uint64_t h = (head ^ (uint64_t(n) * 0xff51afd7ed558ccdull)) * 0xc4ceb9fe1a85ec53ull;
    for (size_t i = 8; i < n; i += 8) {
        h ^= h >> 29;
        h = (h ^ load_head(p + i, std::min<size_t>(8, n - i))) * 0xc4ceb9fe1a85ec53ull;
    }
    return mix64(h);
}

inline uint64_t hash_bytes(const uint8_t* p, size_t n) { return hash_bytes(p, n, load_head(p, n)); }

// A per-thread cache of the ids of recent short pieces; direct mapped. Entries name the
// tokenizer they belong to by a serial number, so a freed and reallocated tokenizer never
// sees another's entries. Per thread, so encode needs no lock and the Tokenizer stays const.
struct PieceCache {
    static constexpr size_t kSlots = 4096;  // 256 KB: stays in L2, unlike the 8 MB rank table
    static constexpr size_t kMaxBytes = 24;
    static constexpr size_t kMaxIds = 8;
    struct alignas(64) Slot {
        uint64_t head = 0;      // load_head() of the piece
        uint32_t owner = 0;     // serial of the tokenizer that wrote it; 0: empty
        uint8_t n_bytes = 0;
        uint8_t n_ids = 0;
        uint8_t rest[kMaxBytes - 8] = {};  // bytes 8.. of the piece
        int32_t ids[kMaxIds] = {};
    };
    Slot slots[kSlots];

    // The cache of the calling thread, created on first use and freed when the thread exits.
    static PieceCache* get() {
        thread_local std::unique_ptr<PieceCache> cache;
        if (!cache) cache = std::make_unique<PieceCache>();
        return cache.get();
    }
};

std::atomic<uint32_t> g_tokenizer_serial{1};

// ---------------------------------------------------------------------------
// The tokenizer

class O200kTokenizer final : public Tokenizer {
public:
    O200kTokenizer() : serial_(g_tokenizer_serial.fetch_add(1)) {}

    // Builds from `blob` holding the bytes of rank r at [offsets[r], offsets[r+1]) for
    // r < kNumRanks, plus the special names `specials` (id → name; ids without a name get
    // "<|reserved_<id>|>"). `source` names the file in messages.
    gptoss_status build(std::string blob, std::vector<uint32_t> offsets,
                        const std::vector<std::pair<int32_t, std::string>>& specials,
                        const std::string& source);
    gptoss_status build_rank_table(const std::string& source);
    gptoss_status build_direct_ranks(const std::string& source);
    gptoss_status build_special_ids(const std::string& source);

    gptoss_status encode(const char* text, size_t len, bool allow_special,
                         std::vector<int32_t>* out) const override;
    gptoss_status decode(const int32_t* tokens, size_t n, std::string* out) const override;
    std::string_view token_bytes(int32_t id) const override {
        return std::string_view(blob_.data() + offsets_[id], offsets_[id + 1] - offsets_[id]);
    }
    bool is_special(int32_t id) const override { return id >= int32_t(kNumRanks) && id < int32_t(kNumVocab); }
    int32_t special_id(std::string_view name) const override {
        auto it = special_ids_.find(name);
        return it == special_ids_.end() ? -1 : it->second;
    }
    uint32_t n_vocab() const override { return kNumVocab; }

private:
    // A slot holds the first 8 bytes and the length of its token, so the lookup of a token of
    // up to 8 bytes (most of them) touches one cache line and nothing else.
    struct Slot {
        uint64_t head;  // load_head() of the token's bytes
        uint32_t rank;  // kNoRank: empty
        uint32_t n;     // byte length
    };

    uint32_t rank_of(const uint8_t* p, size_t n) const {
        if (n <= 2) return n == 2 ? pair_rank_[size_t(p[0]) << 8 | p[1]] : byte_rank_[p[0]];
        if (n > max_token_bytes_) return kNoRank;
        const uint64_t head = load_head(p, n);
        const uint64_t h = hash_bytes(p, n, head);
        for (size_t i = size_t(h) & mask_;; i = (i + 1) & mask_) {
            const Slot& slot = table_[i];
            if (slot.rank == kNoRank) return kNoRank;
            if (slot.head == head && slot.n == n &&
                (n <= 8 || std::memcmp(blob_.data() + offsets_[slot.rank] + 8, p + 8, n - 8) == 0))
                return slot.rank;
        }
    }

    void encode_ordinary(const uint8_t* s, size_t n, std::vector<int32_t>* out) const;
    void encode_piece(const uint8_t* p, size_t n, PieceCache* cache, std::vector<int32_t>* out) const;
    void merge_short(const uint8_t* p, size_t n, std::vector<int32_t>* out) const;
    void merge_long(const uint8_t* p, size_t n, std::vector<int32_t>* out) const;

    std::string blob_;                // bytes of every id, specials as their names
    std::vector<uint32_t> offsets_;   // [kNumVocab + 1]
    std::vector<Slot> table_;         // open addressing, linear probing; ordinary ranks only
    // Ranks of all 1- and 2-byte strings, direct: BPE starts from byte pairs, and this 256 KB
    // table answers those lookups without hashing into the 8 MB one.
    uint32_t byte_rank_[256];
    std::vector<uint32_t> pair_rank_;  // [65536], index byte0 << 8 | byte1
    size_t mask_ = 0;
    size_t max_token_bytes_ = 0;
    size_t max_special_bytes_ = 0;
    std::unordered_map<std::string_view, int32_t> special_ids_;  // keys point into blob_
    std::string alias_200018_ = "<|reserved_200018|>";
    uint32_t serial_;
};

gptoss_status O200kTokenizer::build(std::string blob, std::vector<uint32_t> offsets,
                                    const std::vector<std::pair<int32_t, std::string>>& specials,
                                    const std::string& source) {
    std::vector<std::string> names(kNumVocab - kNumRanks);
    for (const auto& [id, name] : specials) names[size_t(id) - kNumRanks] = name;
    for (uint32_t id = kNumRanks; id < kNumVocab; id++) {
        std::string& name = names[id - kNumRanks];
        if (name.empty()) name = "<|reserved_" + std::to_string(id) + "|>";
        blob.append(name);
        offsets.push_back(uint32_t(blob.size()));
    }
    blob_ = std::move(blob);
    offsets_ = std::move(offsets);

    GPTOSS_TRY(build_rank_table(source));
    GPTOSS_TRY(build_direct_ranks(source));
    return build_special_ids(source);
}

// The hash table of the ordinary ranks (a rank without bytes, or two ranks with the same bytes,
// are FORMAT errors naming `source`).
gptoss_status O200kTokenizer::build_rank_table(const std::string& source) {
    size_t capacity = 1;
    while (capacity < 2 * size_t(kNumRanks)) capacity <<= 1;
    table_.assign(capacity, Slot{0, kNoRank, 0});
    mask_ = capacity - 1;
    // Hashes first, then inserts with the slot of a later rank prefetched: the table is 4 MB
    // and each insert is a cache miss, which otherwise dominates the load time.
    std::vector<uint64_t> hashes(kNumRanks);
    for (uint32_t r = 0; r < kNumRanks; r++) {
        const size_t n = offsets_[r + 1] - offsets_[r];
        if (n == 0) return fail(GPTOSS_ERR_FORMAT, "%s: rank %u has no bytes", source.c_str(), r);
        max_token_bytes_ = std::max(max_token_bytes_, n);
        hashes[r] = hash_bytes(reinterpret_cast<const uint8_t*>(blob_.data()) + offsets_[r], n);
    }
    constexpr uint32_t kAhead = 16;
    for (uint32_t r = 0; r < kNumRanks; r++) {
        if (r + kAhead < kNumRanks) __builtin_prefetch(&table_[size_t(hashes[r + kAhead]) & mask_], 1);
        const uint8_t* p = reinterpret_cast<const uint8_t*>(blob_.data()) + offsets_[r];
        const size_t n = offsets_[r + 1] - offsets_[r];
        const uint64_t head = load_head(p, n);
        size_t i = size_t(hashes[r]) & mask_;
        for (;; i = (i + 1) & mask_) {
            const Slot& slot = table_[i];
            if (slot.rank == kNoRank) break;
            if (slot.head == head && slot.n == n && std::memcmp(blob_.data() + offsets_[slot.rank], p, n) == 0)
                return fail(GPTOSS_ERR_FORMAT, "%s: ranks %u and %u have the same bytes", source.c_str(),
                            slot.rank, r);
        }
        table_[i] = Slot{head, r, uint32_t(n)};
    }
    return GPTOSS_OK;
}

// The direct tables of 1- and 2-byte ranks; every single byte must have a rank (else every byte
// string could not encode: a FORMAT error naming `source`).
gptoss_status O200kTokenizer::build_direct_ranks(const std::string& source) {
    std::fill(std::begin(byte_rank_), std::end(byte_rank_), kNoRank);
    pair_rank_.assign(65536, kNoRank);
    for (uint32_t r = 0; r < kNumRanks; r++) {
        const uint8_t* p = reinterpret_cast<const uint8_t*>(blob_.data()) + offsets_[r];
        const size_t n = offsets_[r + 1] - offsets_[r];
        if (n == 1) byte_rank_[p[0]] = r;
        if (n == 2) pair_rank_[size_t(p[0]) << 8 | p[1]] = r;
    }
    for (int b = 0; b < 256; b++) {
        const uint8_t byte = uint8_t(b);
        if (rank_of(&byte, 1) == kNoRank)
            return fail(GPTOSS_ERR_FORMAT, "%s: no rank for the single byte 0x%02x, expected all 256",
                        source.c_str(), b);
    }
    return GPTOSS_OK;
}

// The special tokens by name (a name used twice is a FORMAT error naming `source`).
gptoss_status O200kTokenizer::build_special_ids(const std::string& source) {
    for (uint32_t id = kNumRanks; id < kNumVocab; id++) {
        const std::string_view name = token_bytes(int32_t(id));
        max_special_bytes_ = std::max(max_special_bytes_, name.size());
        if (!special_ids_.emplace(name, int32_t(id)).second)
            return fail(GPTOSS_ERR_FORMAT, "%s: special token %s is used twice (id %u)", source.c_str(),
                        std::string(name).c_str(), id);
    }
    // tiktoken's o200k_harmony knows 200018 by both names; text may spell either.
    special_ids_.emplace(alias_200018_, 200018);
    max_special_bytes_ = std::max(max_special_bytes_, alias_200018_.size());
    return GPTOSS_OK;
}

// ---------------------------------------------------------------------------
// BPE

// tiktoken's rule by direct scan: O(n·m) for n bytes and m merges, the fastest for the short
// pieces that are nearly all of real text.
void O200kTokenizer::merge_short(const uint8_t* p, size_t n, std::vector<int32_t>* out) const {
    constexpr size_t kMax = 128;
    uint32_t start[kMax + 1];   // part k spans [start[k], start[k+1])
    uint32_t pair[kMax];        // rank of part k joined with part k+1, or kNoRank
    uint32_t token[kMax];       // rank of part k
    size_t parts = n;
    for (size_t k = 0; k < n; k++) {
        start[k] = uint32_t(k);
        token[k] = rank_of(p + k, 1);
        pair[k] = k + 1 < n ? rank_of(p + k, 2) : kNoRank;
    }
    start[n] = uint32_t(n);
    while (parts > 1) {
        size_t best = 0;
        uint32_t best_rank = kNoRank;
        for (size_t k = 0; k + 1 < parts; k++) {
            if (pair[k] < best_rank) {
                best_rank = pair[k];
                best = k;
            }
        }
        if (best_rank == kNoRank) break;
        // Join parts best and best+1, then refresh the two pairs that changed.
        token[best] = best_rank;
        for (size_t k = best + 1; k + 1 < parts; k++) {
            start[k] = start[k + 1];
            pair[k] = pair[k + 1];
            token[k] = token[k + 1];
        }
        start[parts - 1] = start[parts];
        parts--;
        pair[best] = best + 1 < parts ? rank_of(p + start[best], start[best + 2] - start[best]) : kNoRank;
        if (best > 0) pair[best - 1] = rank_of(p + start[best - 1], start[best + 1] - start[best - 1]);
    }
    for (size_t k = 0; k < parts; k++) out->push_back(int32_t(token[k]));
}

// The same rule in O(n log n) for long pieces. Parts form a linked list; the candidate pair
// of each part sits at its start position in a tournament tree (a min segment tree) keyed by
// rank << 40 | start, so the root is the lowest rank with ties to the leftmost pair. Unlike a
// heap with lazy deletion it holds no stale entries, and an update walks one leaf-to-root path
// whose upper part stays in cache. Positions are size_t and starts get 40 bits of the key, so
// a piece may exceed 4 GB.
void O200kTokenizer::merge_long(const uint8_t* p, size_t n, std::vector<int32_t>* out) const {
    constexpr uint64_t kNone = ~uint64_t(0);
    // Part k (k = its start byte) is alive while next[k] != 0; it spans [k, next[k]).
    std::vector<size_t> next(n), prev(n);
    std::vector<uint32_t> token(n);
    size_t leaves = 1;
    while (leaves < n) leaves <<= 1;
    std::vector<uint64_t> tree(2 * leaves, kNone);
    auto key = [](uint32_t rank, size_t k) { return rank == kNoRank ? kNone : uint64_t(rank) << 40 | k; };
    for (size_t k = 0; k < n; k++) {
        next[k] = k + 1;
        prev[k] = k - 1;  // wraps for k == 0; never read there
        token[k] = rank_of(p + k, 1);
        if (k + 1 < n) tree[leaves + k] = key(rank_of(p + k, 2), k);
    }
    for (size_t i = leaves - 1; i >= 1; i--) tree[i] = std::min(tree[2 * i], tree[2 * i + 1]);
    auto update = [&](size_t k, uint64_t value) {
        size_t i = leaves + k;
        tree[i] = value;
        for (i >>= 1; i >= 1; i >>= 1) {
            const uint64_t m = std::min(tree[2 * i], tree[2 * i + 1]);
            if (tree[i] == m) break;  // the ancestors are unchanged too
            tree[i] = m;
        }
    };
    auto refresh = [&](size_t k) {  // part k's pair with its successor changed
        const size_t succ = next[k];
        update(k, succ < n ? key(rank_of(p + k, next[succ] - k), k) : kNone);
    };
    while (tree[1] != kNone) {
        const size_t k = size_t(tree[1] & ((uint64_t(1) << 40) - 1));
        const uint32_t rank = uint32_t(tree[1] >> 40);
        const size_t succ = next[k];
        token[k] = rank;
        next[k] = next[succ];
        next[succ] = 0;
        if (next[k] < n) prev[next[k]] = k;
        update(succ, kNone);
        refresh(k);
        if (k > 0) refresh(prev[k]);
    }
    for (size_t k = 0; k < n; k = next[k]) out->push_back(int32_t(token[k]));
}

void O200kTokenizer::encode_piece(const uint8_t* p, size_t n, PieceCache* cache, std::vector<int32_t>* out) const {
    if (n > PieceCache::kMaxBytes) {
        const uint32_t whole = rank_of(p, n);
        if (whole != kNoRank) out->push_back(int32_t(whole));  // tiktoken's fast path
        else if (n <= 128) merge_short(p, n, out);
        else merge_long(p, n, out);
        return;
    }
    // Short pieces, nearly all of them, go through the cache first: most text repeats a small
    // set of pieces, and the cache is far smaller than the rank table.
    const uint64_t head = load_head(p, n);
    const uint64_t h = hash_bytes(p, n, head);
    PieceCache::Slot& slot = cache->slots[(h >> 40) & (PieceCache::kSlots - 1)];
    if (slot.owner == serial_ && slot.head == head && slot.n_bytes == n &&
        (n <= 8 || std::memcmp(slot.rest, p + 8, n - 8) == 0)) {
        if (slot.n_ids == 1) out->push_back(slot.ids[0]);
        else out->insert(out->end(), slot.ids, slot.ids + slot.n_ids);
        return;
    }
    const size_t before = out->size();
    const uint32_t whole = rank_of(p, n);
    if (whole != kNoRank) out->push_back(int32_t(whole));
    else merge_short(p, n, out);
    const size_t n_ids = out->size() - before;
    if (n_ids <= PieceCache::kMaxIds) {
        slot.owner = serial_;
        slot.head = head;
        slot.n_bytes = uint8_t(n);
        slot.n_ids = uint8_t(n_ids);
        if (n > 8) std::memcpy(slot.rest, p + 8, n - 8);
        std::copy(out->begin() + before, out->end(), slot.ids);
    }
}

void O200kTokenizer::encode_ordinary(const uint8_t* s, size_t n, std::vector<int32_t>* out) const {
    PieceCache* cache = PieceCache::get();
    const Scanner scanner{s, n};
    for (size_t i = 0; i < n;) {
        const size_t e = scanner.next(i);
        encode_piece(s + i, e - i, cache, out);
        i = e;
    }
}

gptoss_status O200kTokenizer::encode(const char* text, size_t len, bool allow_special,
                                     std::vector<int32_t>* out) const {
    const uint8_t* s = reinterpret_cast<const uint8_t*>(text);
    if (len == 0) return GPTOSS_OK;
    const size_t bad = utf8_first_invalid(s, len);
    if (bad != len)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT,
                    "text: invalid UTF-8 at byte offset %zu (byte 0x%02x), expected valid UTF-8", bad, s[bad]);
    out->reserve(out->size() + len / 4 + 8);
    if (!allow_special) {
        encode_ordinary(s, len, out);
        return GPTOSS_OK;
    }
    // tiktoken: find the leftmost special token, encode the text before it on its own (the
    // pattern never runs across a special token), emit its id, go on after it. All names have
    // the form "<|...|>" with no "|>" inside, so a name can only end at the first "|>".
    size_t done = 0;
    for (size_t k = 0; k + 1 < len;) {
        const void* hit = std::memchr(s + k, '<', len - k - 1);
        if (!hit) break;
        k = size_t(static_cast<const uint8_t*>(hit) - s);
        if (s[k + 1] != '|') {
            k++;
            continue;
        }
        size_t e = k + 2;
        const size_t limit = std::min(len, k + max_special_bytes_);
        while (e + 1 < limit && !(s[e] == '|' && s[e + 1] == '>')) e++;
        if (e + 1 < limit) {
            const int32_t id = special_id(std::string_view(text + k, e + 2 - k));
            if (id >= 0) {
                encode_ordinary(s + done, k - done, out);
                out->push_back(id);
                done = k = e + 2;
                continue;
            }
        }
        k++;
    }
    encode_ordinary(s + done, len - done, out);
    return GPTOSS_OK;
}

gptoss_status O200kTokenizer::decode(const int32_t* tokens, size_t n, std::string* out) const {
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || uint32_t(tokens[i]) >= kNumVocab)
            return fail(GPTOSS_ERR_INVALID_ARGUMENT, "tokens[%zu]: id %d is out of range, expected 0..%u", i,
                        tokens[i], kNumVocab - 1);
        bytes += offsets_[tokens[i] + 1] - offsets_[tokens[i]];
    }
    out->reserve(out->size() + bytes);
    for (size_t i = 0; i < n; i++) out->append(token_bytes(tokens[i]));
    return GPTOSS_OK;
}

// ---------------------------------------------------------------------------
// Loading

bool read_file(const std::string& path, std::string* out) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    bool ok = std::fseek(f, 0, SEEK_END) == 0;
    const long size = ok ? std::ftell(f) : -1;
    ok = ok && size >= 0 && std::fseek(f, 0, SEEK_SET) == 0;
    if (ok) {
        out->resize(size_t(size));
        ok = std::fread(out->data(), 1, out->size(), f) == out->size();
    }
    std::fclose(f);
    return ok;
}

// Byte-level BPE keys spell each byte as one character (GPT-2's bytes_to_unicode): the
// printable bytes ! .. ~, ¡ .. ¬, ® .. ÿ as themselves, the other 68 bytes as U+0100.. in
// byte order. Returns the byte for code point cp, or -1.
struct ByteLevelAlphabet {
    int16_t byte_of[0x144];
    ByteLevelAlphabet() {
        std::fill(std::begin(byte_of), std::end(byte_of), int16_t(-1));
        int extra = 0;
        for (int b = 0; b < 256; b++) {
            const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
            byte_of[printable ? b : 0x100 + extra++] = int16_t(b);
        }
    }
};
const ByteLevelAlphabet kByteLevel;

// The pieces a loader collects before build(): bytes per rank, in any order.
struct RankCollector {
    std::string bytes;
    std::vector<uint32_t> start, length;  // per rank; length kNoRank: not seen yet
    RankCollector() : start(kNumRanks), length(kNumRanks, kNoRank) {}

    // Records the bytes of `rank`; `where` names the entry in a message and is only called
    // on failure (building a string per entry would dominate the load time).
    template <typename Where>
    gptoss_status add(uint64_t rank, std::string_view token, const Where& where) {
        if (rank >= kNumRanks)
            return fail(GPTOSS_ERR_FORMAT, "%s: rank %llu is out of range, expected 0..%u", where().c_str(),
                        (unsigned long long)rank, kNumRanks - 1);
        if (length[rank] != kNoRank)
            return fail(GPTOSS_ERR_FORMAT, "%s: rank %llu appears twice", where().c_str(), (unsigned long long)rank);
        start[rank] = uint32_t(bytes.size());
        length[rank] = uint32_t(token.size());
        bytes.append(token);
        return GPTOSS_OK;
    }

    gptoss_status finish(const std::string& source, std::string* blob, std::vector<uint32_t>* offsets) {
        offsets->clear();
        offsets->reserve(kNumVocab + 1);
        offsets->push_back(0);
        blob->reserve(bytes.size() + 24 * (kNumVocab - kNumRanks));
        for (uint32_t r = 0; r < kNumRanks; r++) {
            if (length[r] == kNoRank)
                return fail(GPTOSS_ERR_FORMAT, "%s: rank %u is missing, expected every rank 0..%u", source.c_str(),
                            r, kNumRanks - 1);
            blob->append(bytes, start[r], length[r]);
            offsets->push_back(uint32_t(blob->size()));
        }
        return GPTOSS_OK;
    }
};

// A read-only file mapping followed by at least simdjson::SIMDJSON_PADDING readable zero bytes, which
// simdjson needs past the end. Mapping instead of reading saves a 28 MB copy at load: an
// anonymous reservation is made first and the file mapped over its start, so the padding is
// anonymous memory even when the file ends exactly at a page boundary.
class PaddedMapping {
public:
    ~PaddedMapping() {
        if (base_ != MAP_FAILED) munmap(base_, reserved_);
    }
    // Returns false with errno set.
    bool open(const std::string& path) {
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return false;
        struct stat st;
        bool ok = fstat(fd, &st) == 0;
        if (ok && !S_ISREG(st.st_mode)) {
            errno = EISDIR;
            ok = false;
        }
        if (ok) {
            size_ = size_t(st.st_size);
            reserved_ = size_ + simdjson::SIMDJSON_PADDING + 4096;
            base_ = mmap(nullptr, reserved_, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            ok = base_ != MAP_FAILED;
            if (ok && size_ > 0)
                ok = mmap(base_, size_, PROT_READ, MAP_PRIVATE | MAP_FIXED | MAP_POPULATE, fd, 0) != MAP_FAILED;
        }
        const int saved = errno;
        ::close(fd);
        errno = saved;
        return ok;
    }
    const char* data() const { return static_cast<const char*>(base_); }
    size_t size() const { return size_; }
    size_t capacity() const { return reserved_; }

private:
    void* base_ = MAP_FAILED;
    size_t size_ = 0, reserved_ = 0;
};

using simdjson::ondemand::object;

gptoss_status json_error(const std::string& path, const char* where, simdjson::error_code error) {
    return fail(GPTOSS_ERR_FORMAT, "%s: %s: %s", path.c_str(), where, simdjson::error_message(error));
}

gptoss_status parse_vocab(const std::string& path, object vocab, RankCollector* ranks) {
    std::string token;
    for (auto field : vocab) {
        std::string_view key;
        uint64_t rank = 0;
        if (auto error = field.unescaped_key().get(key)) return json_error(path, "model.vocab", error);
        if (auto error = field.value().get_uint64().get(rank)) {
            return fail(GPTOSS_ERR_FORMAT, "%s: model.vocab[\"%.*s\"]: expected a non-negative integer rank (%s)",
                        path.c_str(), int(key.size()), key.data(), simdjson::error_message(error));
        }
        token.clear();
        const uint8_t* k = reinterpret_cast<const uint8_t*>(key.data());
        for (size_t i = 0; i < key.size();) {
            size_t len;
            int b = -1;
            if (utf8_check(k + i, key.size() - i, &len) == 1) {
                const uint32_t cp = utf8_decode(k + i, &len);
                if (cp < 0x144) b = kByteLevel.byte_of[cp];
            }
            if (b < 0)
                return fail(GPTOSS_ERR_FORMAT,
                            "%s: model.vocab[\"%.*s\"]: character at byte %zu is outside the byte-level alphabet",
                            path.c_str(), int(key.size()), key.data(), i);
            token.push_back(char(b));
            i += len;
        }
        GPTOSS_TRY(ranks->add(rank, token, [&] {
            return path + ": model.vocab[\"" + std::string(key.substr(0, 40)) + "\"]";
        }));
    }
    return GPTOSS_OK;
}

gptoss_status parse_pre_tokenizer(const std::string& path, object pre, bool* found_split) {
    // Accepts a Split with the o200k pattern, alone or inside a Sequence (beside ByteLevel).
    std::string_view type;
    if (auto error = pre["type"].get_string().get(type)) return json_error(path, "pre_tokenizer.type", error);
    if (type == "Sequence") {
        simdjson::ondemand::array list;
        if (auto error = pre["pretokenizers"].get_array().get(list))
            return json_error(path, "pre_tokenizer.pretokenizers", error);
        for (auto item : list) {
            object inner;
            if (auto error = item.get_object().get(inner)) return json_error(path, "pre_tokenizer.pretokenizers", error);
            std::string_view inner_type;
            if (auto error = inner["type"].get_string().get(inner_type))
                return json_error(path, "pre_tokenizer.pretokenizers[].type", error);
            if (inner_type == "ByteLevel") continue;
            GPTOSS_TRY(parse_pre_tokenizer(path, inner, found_split));
        }
        return GPTOSS_OK;
    }
    if (type != "Split")
        return fail(GPTOSS_ERR_FORMAT, "%s: pre_tokenizer: type \"%.*s\" is not supported, expected a Split with the "
                    "o200k pattern", path.c_str(), int(type.size()), type.data());
    std::string_view pattern;
    if (auto error = pre["pattern"]["Regex"].get_string().get(pattern))
        return json_error(path, "pre_tokenizer.pattern.Regex", error);
    if (pattern != kO200kPattern)
        return fail(GPTOSS_ERR_FORMAT, "%s: pre_tokenizer.pattern.Regex: not the o200k pattern (found \"%.*s\")",
                    path.c_str(), std::min(int(pattern.size()), 60), pattern.data());
    *found_split = true;
    return GPTOSS_OK;
}

gptoss_status parse_added_tokens(const std::string& path, simdjson::ondemand::array list,
                                 std::vector<std::pair<int32_t, std::string>>* specials) {
    size_t index = 0;
    for (auto item : list) {
        object token;
        uint64_t id = 0;
        std::string_view content;
        if (auto error = item.get_object().get(token)) return json_error(path, "added_tokens[]", error);
        if (auto error = token["id"].get_uint64().get(id))
            return fail(GPTOSS_ERR_FORMAT, "%s: added_tokens[%zu].id: %s", path.c_str(), index,
                        simdjson::error_message(error));
        if (auto error = token["content"].get_string().get(content))
            return fail(GPTOSS_ERR_FORMAT, "%s: added_tokens[%zu].content: %s", path.c_str(), index,
                        simdjson::error_message(error));
        if (id < kNumRanks || id >= kNumVocab)
            return fail(GPTOSS_ERR_FORMAT, "%s: added_tokens[%zu]: id %llu is out of range, expected %u..%u",
                        path.c_str(), index, (unsigned long long)id, kNumRanks, kNumVocab - 1);
        // The special-token scan relies on this shape (see O200kTokenizer::encode).
        const bool shaped = content.size() >= 5 && content.substr(0, 2) == "<|" &&
                            content.substr(content.size() - 2) == "|>" &&
                            content.substr(2, content.size() - 4).find("|>") == std::string_view::npos;
        if (!shaped)
            return fail(GPTOSS_ERR_FORMAT, "%s: added_tokens[%zu]: content \"%.*s\" is not of the form <|name|>",
                        path.c_str(), index, int(content.size()), content.data());
        for (const auto& [other, name] : *specials) {
            if (other == int32_t(id))
                return fail(GPTOSS_ERR_FORMAT, "%s: added_tokens[%zu]: id %llu appears twice", path.c_str(), index,
                            (unsigned long long)id);
        }
        specials->emplace_back(int32_t(id), std::string(content));
        index++;
    }
    return GPTOSS_OK;
}

// tokenizer.json's "model": type "BPE" and its vocab (into *ranks, *have_vocab set); merges are
// not needed, tiktoken's rule uses ranks alone (HARMONY.md §1.4).
gptoss_status parse_model(const std::string& path, object model, RankCollector* ranks, bool* have_vocab) {
    for (auto model_field : model) {
        std::string_view model_key;
        if (auto error = model_field.unescaped_key().get(model_key)) return json_error(path, "model", error);
        if (model_key == "type") {
            std::string_view type;
            if (auto error = model_field.value().get_string().get(type)) return json_error(path, "model.type", error);
            if (type != "BPE")
                return fail(GPTOSS_ERR_FORMAT, "%s: model.type is \"%.*s\", expected \"BPE\"", path.c_str(),
                            int(type.size()), type.data());
        } else if (model_key == "vocab") {
            object vocab;
            if (auto error = model_field.value().get_object().get(vocab)) return json_error(path, "model.vocab", error);
            GPTOSS_TRY(parse_vocab(path, vocab, ranks));
            *have_vocab = true;
        }
    }
    return GPTOSS_OK;
}

// One line of a .tiktoken file: "<base64 bytes> <decimal rank>" into *token and *rank; false when
// it is not of that form.
bool parse_tiktoken_line(std::string_view line, std::string* token, uint64_t* rank) {
    static const struct Base64 {
        int8_t value[256];
        Base64() {
            std::fill(std::begin(value), std::end(value), int8_t(-1));
            const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            for (int i = 0; i < 64; i++) value[uint8_t(alphabet[i])] = int8_t(i);
        }
    } base64;
    const size_t space = line.find(' ');
    bool ok = space != std::string_view::npos && space > 0 && space % 4 == 0 && space + 1 < line.size();
    // base64 with '=' padding, then a decimal rank.
    token->clear();
    *rank = 0;
    for (size_t i = 0; ok && i < space; i += 4) {
        uint32_t acc = 0;
        int pad = 0;
        for (size_t j = 0; j < 4; j++) {
            const char c = line[i + j];
            if (c == '=' && i + 4 == space && j >= 2) {
                pad++;
                acc <<= 6;
            } else if (pad == 0 && base64.value[uint8_t(c)] >= 0) {
                acc = acc << 6 | uint32_t(base64.value[uint8_t(c)]);
            } else {
                ok = false;
            }
        }
        token->push_back(char(acc >> 16));
        if (pad < 2) token->push_back(char(acc >> 8));
        if (pad < 1) token->push_back(char(acc));
    }
    for (size_t i = space + 1; ok && i < line.size(); i++) {
        ok = line[i] >= '0' && line[i] <= '9' && *rank < kNumVocab;
        *rank = *rank * 10 + uint64_t(line[i] - '0');
    }
    return ok;
}

}  // namespace

// ---------------------------------------------------------------------------
// Public entry points

gptoss_status Tokenizer::load_hf_json(const std::string& path, std::unique_ptr<Tokenizer>* out) {
    out->reset();
    PaddedMapping json;
    if (!json.open(path))
        return fail(GPTOSS_ERR_IO, "%s: cannot read the tokenizer (%s)", path.c_str(), std::strerror(errno));
    return parse_hf_json(path, json.data(), json.size(), json.capacity(), out);
}

gptoss_status Tokenizer::parse_hf_json(const std::string& path, const char* json, size_t len, size_t capacity,
                                       std::unique_ptr<Tokenizer>* out) {
    out->reset();
    if (capacity < len + simdjson::SIMDJSON_PADDING)
        return fail(GPTOSS_ERR_INVALID_ARGUMENT, "%s: the JSON buffer lacks simdjson's padding", path.c_str());
    simdjson::ondemand::parser parser;
    simdjson::ondemand::document doc;
    object root;
    if (auto error = parser.iterate(json, len, capacity).get(doc))
        return json_error(path, "not JSON", error);
    if (auto error = doc.get_object().get(root)) return json_error(path, "expected a JSON object", error);

    RankCollector ranks;
    std::vector<std::pair<int32_t, std::string>> specials;
    bool have_model = false, have_vocab = false, have_split = false;
    for (auto field : root) {
        std::string_view key;
        if (auto error = field.unescaped_key().get(key)) return json_error(path, "not JSON", error);
        if (key == "added_tokens") {
            simdjson::ondemand::array list;
            if (auto error = field.value().get_array().get(list)) return json_error(path, "added_tokens", error);
            GPTOSS_TRY(parse_added_tokens(path, list, &specials));
        } else if (key == "pre_tokenizer") {
            object pre;
            if (auto error = field.value().get_object().get(pre)) return json_error(path, "pre_tokenizer", error);
            GPTOSS_TRY(parse_pre_tokenizer(path, pre, &have_split));
        } else if (key == "model") {
            have_model = true;
            object model;
            if (auto error = field.value().get_object().get(model)) return json_error(path, "model", error);
            GPTOSS_TRY(parse_model(path, model, &ranks, &have_vocab));
        }
    }
    if (!have_model) return fail(GPTOSS_ERR_FORMAT, "%s: no \"model\" object", path.c_str());
    if (!have_vocab) return fail(GPTOSS_ERR_FORMAT, "%s: model has no \"vocab\" object", path.c_str());
    if (!have_split)
        return fail(GPTOSS_ERR_FORMAT, "%s: pre_tokenizer: no Split with the o200k pattern", path.c_str());

    std::string blob;
    std::vector<uint32_t> offsets;
    GPTOSS_TRY(ranks.finish(path, &blob, &offsets));
    auto tokenizer = std::make_unique<O200kTokenizer>();
    GPTOSS_TRY(tokenizer->build(std::move(blob), std::move(offsets), specials, path));
    *out = std::move(tokenizer);
    return GPTOSS_OK;
}

gptoss_status Tokenizer::load_tiktoken(const std::string& path, std::unique_ptr<Tokenizer>* out) {
    out->reset();
    std::string text;
    if (!read_file(path, &text))
        return fail(GPTOSS_ERR_IO, "%s: cannot read the tokenizer (%s)", path.c_str(), std::strerror(errno));
    RankCollector ranks;
    std::string token;
    size_t line_no = 0;
    for (size_t pos = 0; pos < text.size();) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        std::string_view line(text.data() + pos, end - pos);
        pos = end + 1;
        line_no++;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty()) continue;
        uint64_t rank = 0;
        const bool ok = parse_tiktoken_line(line, &token, &rank);
        if (!ok)
            return fail(GPTOSS_ERR_FORMAT, "%s: line %zu: expected \"<base64 bytes> <rank>\", found \"%.*s\"",
                        path.c_str(), line_no, std::min(int(line.size()), 60), line.data());
        GPTOSS_TRY(ranks.add(rank, token, [&] { return path + ": line " + std::to_string(line_no); }));
    }
    std::string blob;
    std::vector<uint32_t> offsets;
    GPTOSS_TRY(ranks.finish(path, &blob, &offsets));
    std::vector<std::pair<int32_t, std::string>> specials;
    for (const NamedSpecial& s : kHarmonySpecials) specials.emplace_back(s.id, s.name);
    auto tokenizer = std::make_unique<O200kTokenizer>();
    GPTOSS_TRY(tokenizer->build(std::move(blob), std::move(offsets), specials, path));
    *out = std::move(tokenizer);
    return GPTOSS_OK;
}

// ---------------------------------------------------------------------------
// Streaming UTF-8

void Utf8StreamDecoder::push(std::string_view bytes, std::string* out) {
    pending_.append(bytes.data(), bytes.size());
    const uint8_t* s = reinterpret_cast<const uint8_t*>(pending_.data());
    const size_t n = pending_.size();
    size_t i = 0;
    while (i < n) {
        size_t len;
        const int status = utf8_check(s + i, n - i, &len);
        if (status == 0) break;  // incomplete: wait for the bytes that finish it
        if (status > 0) out->append(pending_, i, len);
        else out->append("\xEF\xBF\xBD");  // U+FFFD for the maximal invalid subpart
        i += len;
    }
    pending_.erase(0, i);
}

void Utf8StreamDecoder::flush(std::string* out) {
    if (!pending_.empty()) out->append("\xEF\xBF\xBD");
    pending_.clear();
}

}  // namespace gptoss
