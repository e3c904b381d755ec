// gptoss-constraint.cpp - constrained decoding in the engine (issue 14): the TokenConstraints
// the generation loop consults before each token (gptoss-internal.h).
//   JsonConstraint   gptoss_generate's json_schema: one JSON document from the first token, then
//                    an end token. A schema matcher (tokenizer/json-schema.h) advanced by each
//                    sampled token's bytes; masks from tokenizer/grammar-mask.h.
//   ChatConstraint   gptoss_chat: follows the turn with Harmony's streaming parser and switches a
//                    JsonConstraint on for the content of a tool call to a function with a schema
//                    (until <|call|>) and of a final-channel message under response_format (until
//                    <|return|>); forces the first header for tool_choice required/named; keeps
//                    '=' out of headers (no recipient) and <|call|> out for tool_choice none. The
//                    analysis text is never held to a schema; where nothing applies, mask() answers
//                    "no mask" and the step costs nothing.
//                    Under response_format JSON_* or a reasoning budget (request.max_reasoning_tokens)
//                    it also enforces the turn's shape, because a request for structured output is
//                    answered by its final message (what an OpenAI/vLLM client reads as `content`):
//                    every header is forced to one of analysis (the first message only, while the
//                    budget is not 0), final, or a call to a callable tool; the analysis takes only
//                    ordinary tokens, then <|end|> (forced once it has taken the budget); after it
//                    "<|start|>assistant" and the final or call header are forced. So a model that
//                    never leaves its analysis by itself (the tiny random model) still answers, and
//                    one that does is not changed except that it cannot write a preamble or a second
//                    analysis message. max_tokens still counts every token (OpenAI's rule: a turn cut
//                    by it ends in MAX_TOKENS, possibly before the answer); no room is reserved,
//                    because the answer's length is not known in advance.
#include "gptoss-internal.h"
#include "tokenizer/grammar-mask.h"
#include "tokenizer/harmony.h"
#include "tokenizer/json-schema.h"
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace gptoss {
namespace {

namespace h = harmony;

void set_bit(uint32_t* bits, uint32_t n_words, int32_t token) {
    if (token >= 0 && uint32_t(token) / 32 < n_words) bits[token / 32] |= 1u << (token % 32);
}

// One JSON document, then one of the end tokens.
class JsonConstraint final : public TokenConstraint {
public:
    JsonConstraint(const Tokenizer& tokenizer, std::shared_ptr<const schema::Grammar> grammar,
                   std::shared_ptr<const schema::TokenTable> table, std::vector<int32_t> end_tokens)
        : tokenizer_(tokenizer), matcher_(grammar), cache_(grammar, std::move(table)), end_(std::move(end_tokens)) {}

    bool mask(uint32_t* bits, uint32_t n_words) override {
        const uint32_t words = std::min(n_words, uint32_t(scratch_size()));
        scratch_.resize(scratch_size());
        cache_.mask(matcher_.state(), scratch_.data());
        std::memcpy(bits, scratch_.data(), words * sizeof(uint32_t));
        std::memset(bits + words, 0, (n_words - words) * sizeof(uint32_t));
        bool any = false;
        for (uint32_t i = 0; i < words && !any; ++i) any = bits[i] != 0;
        // Complete (or, defensively, stuck): the end tokens.
        if (matcher_.can_finish() || !any)
            for (int32_t t : end_) set_bit(bits, n_words, t);
        return true;
    }

    void accept(int32_t token) override {
        if (std::find(end_.begin(), end_.end(), token) != end_.end()) return;
        if (token >= 0 && uint32_t(token) < tokenizer_.n_vocab() && !tokenizer_.is_special(token))
            (void)matcher_.advance(tokenizer_.token_bytes(token));
    }

private:
    size_t scratch_size() const { return (tokenizer_.n_vocab() + 31) / 32; }
    const Tokenizer& tokenizer_;
    schema::Matcher matcher_;
    schema::MaskCache cache_;
    std::vector<int32_t> end_;
    std::vector<uint32_t> scratch_;
};

class ChatConstraint final : public TokenConstraint {
public:
    ChatConstraint(const Tokenizer& tokenizer, std::shared_ptr<const schema::TokenTable> table)
        : tokenizer_(tokenizer), table_(std::move(table)), parser_(tokenizer, /*assistant_started=*/true) {}

    std::map<std::string, std::shared_ptr<const schema::Grammar>> tools;   // name → grammar
    std::shared_ptr<const schema::Grammar> response;
    bool forbid_calls = false;
    std::vector<std::vector<int32_t>> forced;  // candidate header token sequences
    std::vector<std::string> forced_names;
    // The turn's shape (see the file comment); headers without the leading "<|start|>assistant".
    bool shaped = false;
    uint32_t reasoning_budget = UINT32_MAX;     // analysis content tokens; 0: no analysis message
    std::vector<int32_t> start_assistant;        // "<|start|>assistant"
    std::vector<int32_t> analysis_header;
    std::vector<std::vector<int32_t>> answer_headers;  // final, then the callable tools' calls

    void start() {
        if (!forced.empty()) {
            force(forced);
        } else if (shaped) {
            std::vector<std::vector<int32_t>> first = answer_headers;
            if (reasoning_budget > 0) first.push_back(analysis_header);
            force(std::move(first));
        }
        if (shaped) {
            ordinary_.assign(table_->n_words(), 0);
            for (uint32_t t = 0; t < tokenizer_.n_vocab(); ++t)
                if (!tokenizer_.is_special(int32_t(t)) || int32_t(t) == h::kEnd) ordinary_[t / 32] |= 1u << (t % 32);
        }
        if (forbid_calls) {
            no_recipient_.assign(table_->n_words(), 0);
            for (uint32_t t = 0; t < tokenizer_.n_vocab(); ++t) {
                const bool special = tokenizer_.is_special(int32_t(t));
                if (special ? int32_t(t) == h::kCall : tokenizer_.token_bytes(int32_t(t)).find('=') != std::string_view::npos)
                    continue;
                no_recipient_[t / 32] |= 1u << (t % 32);
            }
        }
    }

    bool mask(uint32_t* bits, uint32_t n_words) override {
        if (forcing_) {
            std::memset(bits, 0, n_words * sizeof(uint32_t));
            for (size_t i = 0; i < forcing_seqs_.size(); ++i)
                if (forced_alive_[i] && forced_pos_ < forcing_seqs_[i].size())
                    set_bit(bits, n_words, forcing_seqs_[i][forced_pos_]);
            return true;
        }
        if (json_) return json_->mask(bits, n_words);
        if (in_analysis_) {
            // Ordinary tokens and <|end|>; only <|end|> once the budget is spent.
            std::memset(bits, 0, n_words * sizeof(uint32_t));
            if (analysis_tokens_ >= reasoning_budget) {
                set_bit(bits, n_words, h::kEnd);
                return true;
            }
            const uint32_t words = std::min<uint32_t>(n_words, uint32_t(ordinary_.size()));
            std::memcpy(bits, ordinary_.data(), words * sizeof(uint32_t));
            return true;
        }
        if (forbid_calls) {
            const uint32_t words = std::min<uint32_t>(n_words, uint32_t(no_recipient_.size()));
            if (parser_.in_content()) {
                // Content: anything but <|call|>.
                std::memset(bits, 0xFF, n_words * sizeof(uint32_t));
                bits[h::kCall / 32] &= ~(1u << (h::kCall % 32));
                return true;
            }
            std::memcpy(bits, no_recipient_.data(), words * sizeof(uint32_t));
            std::memset(bits + words, 0, (n_words - words) * sizeof(uint32_t));
            return true;
        }
        return false;
    }

    void accept(int32_t token) override {
        if (forcing_) {
            for (size_t i = 0; i < forcing_seqs_.size(); ++i)
                if (forced_alive_[i] && (forced_pos_ >= forcing_seqs_[i].size() || forcing_seqs_[i][forced_pos_] != token))
                    forced_alive_[i] = false;
            forced_pos_++;
            for (size_t i = 0; i < forcing_seqs_.size(); ++i)
                if (forced_alive_[i] && forced_pos_ == forcing_seqs_[i].size()) forcing_ = false;
        }
        const bool was_content = parser_.in_content();
        std::string delta;
        parser_.push(token, &delta);
        if (json_ && (!parser_.in_content() || tokenizer_.is_special(token))) {
            json_.reset();
        } else if (json_) {
            json_->accept(token);
        }
        if (in_analysis_ && parser_.in_content()) analysis_tokens_++;
        if (in_analysis_ && !parser_.in_content()) {
            // The analysis closed (<|end|>): the answer's header follows.
            in_analysis_ = false;
            std::vector<std::vector<int32_t>> next;
            for (const std::vector<int32_t>& header : answer_headers) {
                next.push_back(start_assistant);
                next.back().insert(next.back().end(), header.begin(), header.end());
            }
            force(std::move(next));
        }
        if (!was_content && parser_.in_content()) open(parser_.current());
    }

private:
    void force(std::vector<std::vector<int32_t>> candidates) {
        forcing_seqs_ = std::move(candidates);
        forcing_ = !forcing_seqs_.empty();
        forced_alive_.assign(forcing_seqs_.size(), true);
        forced_pos_ = 0;
    }

    void open(const h::ParsedMessage& m) {
        json_.reset();
        in_analysis_ = shaped && m.channel == "analysis" && m.recipient.empty();
        const std::string prefix = "functions.";
        if (m.recipient.compare(0, prefix.size(), prefix) == 0) {
            auto it = tools.find(m.recipient.substr(prefix.size()));
            if (it != tools.end()) json_ = std::make_unique<JsonConstraint>(tokenizer_, it->second, table_, std::vector<int32_t>{h::kCall});
        } else if (m.recipient.empty() && m.channel == "final" && response) {
            json_ = std::make_unique<JsonConstraint>(tokenizer_, response, table_, std::vector<int32_t>{h::kReturn});
        }
    }

    const Tokenizer& tokenizer_;
    std::shared_ptr<const schema::TokenTable> table_;
    h::StreamParser parser_;
    std::unique_ptr<JsonConstraint> json_;
    bool forcing_ = false;
    std::vector<std::vector<int32_t>> forcing_seqs_;  // what is being forced now
    std::vector<bool> forced_alive_;
    size_t forced_pos_ = 0;
    std::vector<uint32_t> no_recipient_;
    std::vector<uint32_t> ordinary_;      // shaped: ordinary tokens and <|end|>
    bool in_analysis_ = false;            // shaped: in the analysis message's content
    uint32_t analysis_tokens_ = 0;
};

// `text` as tokens after `lead` specials; "<|channel|>" TEXT "<|message|>" style headers.
gptoss_status header_tokens(const Tokenizer& tokenizer, std::vector<int32_t> lead, const std::string& text,
                            std::vector<int32_t> tail, std::vector<int32_t>* out) {
    *out = std::move(lead);
    GPTOSS_TRY(tokenizer.encode(text.data(), text.size(), false, out));
    out->insert(out->end(), tail.begin(), tail.end());
    return GPTOSS_OK;
}

// "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>", as the model writes it.
gptoss_status call_header(const Tokenizer& tokenizer, const std::string& name, std::vector<int32_t>* out) {
    GPTOSS_TRY(header_tokens(tokenizer, {h::kChannel}, "commentary to=functions." + name, {}, out));
    GPTOSS_TRY(tokenizer.encode(" ", 1, false, out));
    out->push_back(h::kConstrain);
    GPTOSS_TRY(tokenizer.encode("json", 4, false, out));
    out->push_back(h::kMessage);
    return GPTOSS_OK;
}

}  // namespace

// The model's token table, built on first use and kept as long as the model.
static std::shared_ptr<const schema::TokenTable> model_table(gptoss_model* model) {
    std::lock_guard<std::mutex> lock(model->mutex);
    if (!model->token_table) model->token_table = schema::TokenTable::get(*model->tokenizer);
    return std::static_pointer_cast<const schema::TokenTable>(model->token_table);
}

gptoss_status make_json_constraint(gptoss_model* model, std::string_view schema_text, const std::string& where,
                                   std::vector<int32_t> end_tokens, std::shared_ptr<TokenConstraint>* out) {
    std::shared_ptr<const schema::Grammar> grammar;
    GPTOSS_TRY(schema::compile(schema_text, where, &grammar));
    *out = std::make_shared<JsonConstraint>(*model->tokenizer, std::move(grammar), model_table(model),
                                            std::move(end_tokens));
    return GPTOSS_OK;
}

gptoss_status make_chat_constraint(gptoss_model* model, const ChatConstraintSpec& spec,
                                   const std::vector<std::string>& tool_where, const std::string& response_where,
                                   std::shared_ptr<TokenConstraint>* out) {
    out->reset();
    if (spec.tool_schemas.empty() && spec.forced.empty() && !spec.forbid_calls && spec.response_schema.empty() &&
        !spec.shaped)
        return GPTOSS_OK;
    const Tokenizer& tokenizer = *model->tokenizer;
    auto c = std::make_shared<ChatConstraint>(tokenizer, model_table(model));
    for (size_t i = 0; i < spec.tool_schemas.size(); ++i) {
        std::shared_ptr<const schema::Grammar> g;
        GPTOSS_TRY(schema::compile(spec.tool_schemas[i].second, i < tool_where.size() ? tool_where[i] : "tool", &g));
        c->tools[spec.tool_schemas[i].first] = std::move(g);
    }
    if (!spec.response_schema.empty()) GPTOSS_TRY(schema::compile(spec.response_schema, response_where, &c->response));
    c->forbid_calls = spec.forbid_calls;
    for (const std::string& name : spec.forced) {
        std::vector<int32_t> seq;
        GPTOSS_TRY(call_header(tokenizer, name, &seq));
        c->forced.push_back(std::move(seq));
        c->forced_names.push_back(name);
    }
    if (spec.shaped) {
        c->shaped = true;
        c->reasoning_budget = spec.max_reasoning_tokens;
        GPTOSS_TRY(header_tokens(tokenizer, {h::kStart}, "assistant", {}, &c->start_assistant));
        GPTOSS_TRY(header_tokens(tokenizer, {h::kChannel}, "analysis", {h::kMessage}, &c->analysis_header));
        c->answer_headers.emplace_back();
        GPTOSS_TRY(header_tokens(tokenizer, {h::kChannel}, "final", {h::kMessage}, &c->answer_headers.back()));
        for (const std::string& name : spec.callable) {
            c->answer_headers.emplace_back();
            GPTOSS_TRY(call_header(tokenizer, name, &c->answer_headers.back()));
        }
    }
    c->start();
    *out = std::move(c);
    return GPTOSS_OK;
}

}  // namespace gptoss
