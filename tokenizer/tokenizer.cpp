// tokenizer/tokenizer.cpp - the o200k_harmony tokenizer (HARMONY.md §1).
// Placeholder so the library links while the real implementation lands: every loader fails
// with UNSUPPORTED, so no Tokenizer object can exist yet.
#include "tokenizer/tokenizer.h"

#include "gptoss-internal.h"

namespace gptoss {

gptoss_status Tokenizer::load_hf_json(const std::string& path, std::unique_ptr<Tokenizer>* out) {
    out->reset();
    return fail(GPTOSS_ERR_UNSUPPORTED, "%s: tokenizer not implemented yet", path.c_str());
}

gptoss_status Tokenizer::load_tiktoken(const std::string& path, std::unique_ptr<Tokenizer>* out) {
    out->reset();
    return fail(GPTOSS_ERR_UNSUPPORTED, "%s: tokenizer not implemented yet", path.c_str());
}

void Utf8StreamDecoder::push(std::string_view bytes, std::string* out) {
    pending_.append(bytes.data(), bytes.size());
    out->append(pending_);
    pending_.clear();
}

void Utf8StreamDecoder::flush(std::string* out) {
    out->append(pending_);
    pending_.clear();
}

}  // namespace gptoss
