// tests/test-fuzz-regressions.cpp - every input the fuzzers of tests/fuzz/ found a problem with,
// as a plain unit test that runs in every build (the fuzzers only build with clang). Each case
// names the fuzzer, what went wrong and the fix; the inputs are the crash artifacts, reduced.
// Oracles: the documented contract (messages are printable UTF-8 naming the field; stop strings
// never reach final text) checked on the exact input, not the code's own output.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "gptoss-internal.h"
#include "tokenizer/chat-json.h"
#include "tokenizer/harmony.h"
#include "tokenizer/tokenizer.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace h = gptoss::harmony;

const gptoss::Tokenizer& tokenizer() {
    static std::unique_ptr<gptoss::Tokenizer> t = [] {
        const char* dir = std::getenv("GPTOSS_TOKENIZER_DIR");
        REQUIRE_MESSAGE(dir != nullptr, "GPTOSS_TOKENIZER_DIR is not set (run through ctest)");
        std::unique_ptr<gptoss::Tokenizer> loaded;
        REQUIRE(gptoss::Tokenizer::load_hf_json(std::string(dir) + "/tokenizer.json", &loaded) == GPTOSS_OK);
        return loaded;
    }();
    return *t;
}

std::vector<int32_t> encode_special(const std::string& text) {
    std::vector<int32_t> ids;
    REQUIRE(tokenizer().encode(text.data(), text.size(), true, &ids) == GPTOSS_OK);
    return ids;
}

// The message of the last failure, which must be printable UTF-8.
std::string last_error() {
    const std::string message = gptoss_last_error();
    CHECK(gptoss::first_invalid_utf8(message.data(), message.size()) == message.size());
    for (unsigned char c : message) CHECK_MESSAGE((c >= 0x20 && c != 0x7f), "control character in: " << message);
    return message;
}

}  // namespace

// fuzz-config, fuzz-safetensors, fuzz-index, fuzz-conversation: messages quoted input bytes raw
// (a tab, DEL or invalid UTF-8 from a file went to the terminal as is). Fix: fail() escapes
// control characters and invalid UTF-8 as \xNN.
TEST_CASE("escape_nonprintable keeps printable UTF-8 and escapes the rest") {
    CHECK(gptoss::escape_nonprintable("plain é 日本 🙂") == "plain é 日本 🙂");
    CHECK(gptoss::escape_nonprintable(std::string("a\x01" "b\x7f" "c\n", 6)) == "a\\x01b\\x7fc\\x0a");
    CHECK(gptoss::escape_nonprintable("\xff\xc3(") == "\\xff\\xc3(");           // invalid, cut sequence
    CHECK(gptoss::escape_nonprintable("x\xe2\x82") == "x\\xe2\\x82");          // truncated at the end
    CHECK(gptoss::escape_nonprintable("\xc0\xaf") == "\\xc0\\xaf");            // overlong '/'
    CHECK(gptoss::escape_nonprintable("\xed\xa0\x80") == "\\xed\\xa0\\x80");   // surrogate
}

TEST_CASE("fuzz-config: a control character in layer_types is escaped in the message") {
    const std::string json = R"({"num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
        "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 201088, "sliding_window": 128, "max_position_embeddings": 4096,
        "layer_types": ["sliding_attention", "full_\u0001attention"]})";
    gptoss::Config c;
    REQUIRE(gptoss::parse_config_json("config.json", json.data(), json.size(), &c) == GPTOSS_ERR_FORMAT);
    const std::string message = last_error();
    CHECK(message.find("layer_types[1]") != std::string::npos);
    CHECK(message.find("\"full_\\x01attention\"") != std::string::npos);
}

// fuzz-config (timeout): "num_hidden_layers": 20e8 and no layer_types built the default
// alternating pattern of 2e9 layers (minutes; the loader would then size per-layer lists by it).
// Fix: check_config bounds the count (kMaxLayers, 1024) before anything is sized by it.
TEST_CASE("fuzz-config: two billion layers are refused at once, naming the field") {
    const std::string json = R"({"num_hidden_layers": 20e8, "num_local_experts": 32, "hidden_size": 2880,
        "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "vocab_size": 201088, "sliding_window": 128, "max_position_embeddings": 131, "experts_per_token": 4})";
    gptoss::Config c;
    REQUIRE(gptoss::parse_config_json("config.json", json.data(), json.size(), &c) == GPTOSS_ERR_FORMAT);
    CHECK(last_error() == "config.json: field num_hidden_layers is 2000000000, expected at most 1024");
    const std::string ok = R"({"num_hidden_layers": 1024, "num_local_experts": 4, "num_experts_per_tok": 2,
        "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 1000, "sliding_window": 128, "max_position_embeddings": 4096})";
    REQUIRE(gptoss::parse_config_json("config.json", ok.data(), ok.size(), &c) == GPTOSS_OK);
    CHECK(c.layer_sliding.size() == 1024);
}

TEST_CASE("fuzz-safetensors: a tensor name with DEL or a tab is escaped in the message") {
    // The name as JSON text, and as the message must show it.
    const std::vector<std::pair<std::string, std::string>> names = {{"\x7f_metadata__", "\\x7f_metadata__"},
                                                                    {"a\\tb", "a\\x09b"}};
    for (const auto& [json_name, shown] : names) {
        const std::string header = "{\"" + json_name + "\": {\"format\": \"pt\"}}";
        std::vector<uint8_t> file(8 + header.size());
        for (int i = 0; i < 8; ++i) file[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
        std::memcpy(file.data() + 8, header.data(), header.size());
        REQUIRE(gptoss::check_safetensors_shard("model.safetensors", file.data(), file.size(), nullptr) ==
                GPTOSS_ERR_FORMAT);
        const std::string message = last_error();
        CHECK(message.find("tensor " + shown + ":") != std::string::npos);
        CHECK(message.find("dtype is missing") != std::string::npos);
    }
}

TEST_CASE("fuzz-index: a newline in a weight_map key is escaped in the message") {
    const std::string json = R"({"metadata": {"total_size": 123}, "weight_map": {"mod\ns.weight": ""}})";
    std::vector<std::string> shards;
    std::map<std::string, std::string> map;
    REQUIRE(gptoss::read_safetensors_index("model.safetensors.index.json", json.data(), json.size(), &shards, &map) ==
            GPTOSS_ERR_FORMAT);
    CHECK(last_error().find("weight_map entry mod\\x0as.weight") != std::string::npos);
}

TEST_CASE("fuzz-conversation: a DEL in a role is escaped in the message") {
    const std::string json = "{\"messages\": [{\"role\": \"to\x7fl\", \"content\": \"orphan\"}]}";
    gptoss::ChatRequestStorage storage;
    REQUIRE(gptoss::parse_chat_completions_json(json.data(), json.size(), &storage) == GPTOSS_ERR_INVALID_ARGUMENT);
    const std::string message = last_error();
    CHECK(message.find("messages[0].role") != std::string::npos);
    CHECK(message.find("to\\x7fl") != std::string::npos);
}

// fuzz-harmony: stop strings were matched only in messages whose header said role assistant,
// but every final-channel message without a recipient streams as final text and becomes
// gptoss_chat_result.final; a stray "<|start|>user<|channel|>final" showed the stop string.
TEST_CASE("fuzz-harmony: a stop string is cut from a final message whatever role its header names") {
    const std::vector<int32_t> tokens = encode_special(
        "<|channel|>analysis<|message|>think<|end|><|start|>user<|channel|>final<|message|>2 + 2 equals 4. more<|end|>");
    h::ChatStream stream(tokenizer(), {"4."});
    std::string final_text;
    bool stopped = false;
    for (int32_t t : tokens) {
        gptoss_event event;
        stopped = stream.push(t, &event);
        if (event.channel == GPTOSS_CHANNEL_FINAL) final_text.append(event.text, event.text_len);
        if (stopped) break;
    }
    stream.finish();
    CHECK(stopped);
    CHECK(final_text == "2 + 2 equals ");
    const std::vector<h::ParsedMessage> messages = stream.messages();
    REQUIRE(messages.size() == 2);
    CHECK(messages[1].channel == "final");
    CHECK(messages[1].content == "2 + 2 equals ");
}

// fuzz-harmony: a header closed without <|message|> becomes a message made of the header's
// words (harmony's non-strict mode); that final message showed a stop string, since only
// streamed content was matched (regressions/harmony/harmony-crash-e1279a54…).
TEST_CASE("fuzz-harmony: a stop string is cut from a final message made of header words") {
    for (const char* end : {"<|return|>", ""}) {  // closed by a stop token, or by the end of output
        const std::vector<int32_t> tokens = encode_special(
            std::string("<|channel|>final<|message|>first<|end|><|start|>assistant<|channel|>final 2 + 2 equals 4. more") + end);
        h::ChatStream stream(tokenizer(), {"4."});
        bool stopped = false;
        for (int32_t t : tokens) {
            gptoss_event event;
            stopped = stream.push(t, &event);
            if (stopped) break;
        }
        stream.finish();
        CHECK(stopped == (end[0] != 0));
        const std::vector<h::ParsedMessage> messages = stream.messages();
        REQUIRE(messages.size() == 2);
        CHECK(messages[1].channel == "final");
        CHECK(messages[1].content.find("4.") == std::string::npos);
        CHECK(messages[1].content.find("equals") != std::string::npos);
    }
}

// fuzz-harmony: a stop string that is not UTF-8 can match inside a character of the (valid
// UTF-8) output, and the text held back for it then split "é" into "\xc3" | "\xa9". Fix: such a
// stop string is INVALID_ARGUMENT (gptoss.h), as for every other string the API takes.
TEST_CASE("fuzz-harmony: a stop string that is not valid UTF-8 is INVALID_ARGUMENT") {
    for (const char* bad : {"\xa9x", "ok\xc3", "\xff"}) {
        const char* stops[] = {"fine", bad};
        gptoss_sampling_params params = gptoss_sampling_default_params();
        params.stop_strings = stops;
        params.n_stop_strings = 2;
        gptoss::GenerateOptions options;
        REQUIRE(gptoss::make_generate_options(params, &options) == GPTOSS_ERR_INVALID_ARGUMENT);
        CHECK(last_error().find("sampling.stop_strings[1]: invalid UTF-8 at byte") != std::string::npos);
    }
    const char* good[] = {"é", "日本"};
    gptoss_sampling_params params = gptoss_sampling_default_params();
    params.stop_strings = good;
    params.n_stop_strings = 2;
    gptoss::GenerateOptions options;
    CHECK(gptoss::make_generate_options(params, &options) == GPTOSS_OK);
}

// fuzz-tokenizer (an oracle fix, not a library bug): "<|reserved_200018|>" is another name of
// <|endofprompt|> (tokenizer.h), so decode(encode(text)) gives the token's own name back.
TEST_CASE("fuzz-tokenizer: the alias of 200018 encodes to it and decodes to its name") {
    const std::vector<int32_t> ids = encode_special("<|reserved_200018|>");
    REQUIRE(ids == std::vector<int32_t>{200018});
    std::string text;
    REQUIRE(tokenizer().decode(ids.data(), ids.size(), &text) == GPTOSS_OK);
    CHECK(text == "<|endofprompt|>");
}
