// tests/fuzz/fuzz-tokenizer.cpp - the real o200k_harmony tokenizer on arbitrary bytes. Byte 0
// picks allow_special; the rest is text. Oracles: encode accepts exactly the valid UTF-8 texts
// (else INVALID_ARGUMENT, output unchanged), decode(encode(text)) == text (with specials: the
// same ids again, as aliases decode to the token's name), and the same bytes
// read as token ids decode (ids out of range: INVALID_ARGUMENT) into pieces that
// Utf8StreamDecoder turns into valid UTF-8.
#include "tests/fuzz/fuzz-common.h"

#include <cstring>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const gptoss::Tokenizer& tokenizer = fuzz_tokenizer();
    if (size == 0) return 0;
    const bool allow_special = data[0] & 1;
    const char* text = reinterpret_cast<const char*>(data + 1);
    const size_t len = size - 1;
    std::vector<int32_t> tokens = {7};
    const gptoss_status status = tokenizer.encode(text, len, allow_special, &tokens);
    fuzz_check_status(status);
    const bool valid = fuzz_valid_utf8(std::string_view(text, len));
    if ((status == GPTOSS_OK) != valid) fuzz_fail("encode's status disagrees with UTF-8 validity");
    if (status != GPTOSS_OK) {
        if (tokens.size() != 1) fuzz_fail("a failed encode changed its output");
    } else {
        std::string back;
        fuzz_check_status(tokenizer.decode(tokens.data() + 1, tokens.size() - 1, &back));
        if (!allow_special) {
            if (back != std::string_view(text, len)) fuzz_fail("decode(encode(text)) != text", back);
        } else {
            // Aliases ("<|reserved_200018|>" is <|endofprompt|>) decode to the token's own name,
            // so the text may differ; its ids may not.
            std::vector<int32_t> again = {7};
            fuzz_check_status(tokenizer.encode(back.data(), back.size(), true, &again));
            if (again != tokens) fuzz_fail("encode(decode(encode(text))) != encode(text)", back);
        }
    }

    // The same bytes as ids: mostly in range (modulo a bit more than the vocabulary).
    std::vector<int32_t> ids(len / 4);
    for (size_t i = 0; i < ids.size(); ++i) {
        uint32_t v;
        std::memcpy(&v, text + 4 * i, 4);
        ids[i] = (v & 0x80000000u) ? int32_t(v) : int32_t(v % (tokenizer.n_vocab() + 16));
    }
    std::string bytes;
    const gptoss_status decoded = tokenizer.decode(ids.data(), ids.size(), &bytes);
    fuzz_check_status(decoded);
    if (decoded != GPTOSS_OK) return 0;
    gptoss::Utf8StreamDecoder stream;
    std::string out;
    for (int32_t id : ids) stream.push(tokenizer.token_bytes(id), &out);
    stream.flush(&out);
    if (!fuzz_valid_utf8(out)) fuzz_fail("Utf8StreamDecoder produced invalid UTF-8");
    return 0;
}
