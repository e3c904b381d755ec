// tests/test-schema-engine.cpp - constrained decoding through the public API on the tiny
// random-weight checkpoint (CPU backend), which writes garbage when unconstrained: every
// gptoss_generate output under sampling.json_schema and every forced tool call's arguments
// parse (simdjson) and pass a hand-written check of the schema; tool_choice none never calls;
// response_format renders Harmony's "# Response Formats" section and constrains final messages;
// bad schemas fail with errors naming the path; the unconstrained path and old-sized structs are
// unchanged; prefix reuse and cancellation work under constraints.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "tests/test-util.h"

#include "gptoss.h"

#include <simdjson.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

using gptoss::test::tiny_model;
gptoss_session* new_session() {
    gptoss_session_params params = gptoss_session_default_params();
    params.max_context = 4096;
    gptoss_session* session = nullptr;
    REQUIRE(gptoss_session_create(tiny_model(), &params, &session) == GPTOSS_OK);
    return session;
}

const char* kWeather = R"({"type":"object","properties":{
  "city":{"type":"string","minLength":1,"maxLength":40,"description":"The city"},
  "unit":{"type":"string","enum":["celsius","fahrenheit"]},
  "days":{"type":"integer"},
  "hourly":{"type":"boolean"},
  "tags":{"type":"array","items":{"type":"string","maxLength":8},"maxItems":3}},
  "required":["city","unit"],"additionalProperties":false})";

const char* kAdd = R"({"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]})";

size_t code_points(std::string_view s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

// Independent check of kWeather on the parsed document: "" if valid, else why not.
std::string weather_violation(const std::string& text) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    if (parser.parse(text).get(doc) != simdjson::SUCCESS) return "not JSON";
    simdjson::dom::object obj;
    if (doc.get_object().get(obj) != simdjson::SUCCESS) return "not an object";
    std::set<std::string> seen;
    for (auto kv : obj) {
        const std::string key(kv.key);
        seen.insert(key);
        std::string_view s;
        if (key == "city") {
            if (kv.value.get_string().get(s) != simdjson::SUCCESS) return "city not a string";
            if (code_points(s) < 1 || code_points(s) > 40) return "city length";
        } else if (key == "unit") {
            if (kv.value.get_string().get(s) != simdjson::SUCCESS || (s != "celsius" && s != "fahrenheit")) return "unit";
        } else if (key == "days") {
            if (!kv.value.is_int64() && !kv.value.is_uint64()) return "days not an integer";
        } else if (key == "hourly") {
            if (!kv.value.is_bool()) return "hourly not a boolean";
        } else if (key == "tags") {
            simdjson::dom::array arr;
            if (kv.value.get_array().get(arr) != simdjson::SUCCESS || arr.size() > 3) return "tags";
            for (auto t : arr)
                if (t.get_string().get(s) != simdjson::SUCCESS || code_points(s) > 8) return "tag";
        } else {
            return "additional property " + key;
        }
    }
    if (!seen.count("city") || !seen.count("unit")) return "missing required";
    return "";
}

std::string add_violation(const std::string& text) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    if (parser.parse(text).get(doc) != simdjson::SUCCESS) return "not JSON";
    double a = 0, b = 0;
    if (doc["a"].get(a) != simdjson::SUCCESS) return "a";
    if (doc["b"].get(b) != simdjson::SUCCESS) return "b";
    return "";
}

std::vector<int32_t> tokenize(const char* text) {
    size_t n = 0;
    gptoss_tokenize(tiny_model(), text, std::strlen(text), true, nullptr, 0, &n);
    std::vector<int32_t> out(n);
    REQUIRE(gptoss_tokenize(tiny_model(), text, std::strlen(text), true, out.data(), n, &n) == GPTOSS_OK);
    return out;
}

gptoss_tool tools[2] = {{"get_weather", "Gets the weather.", kWeather}, {"add", "Adds.", kAdd}};

gptoss_chat_request weather_request(const gptoss_message* history) {
    gptoss_chat_request r = gptoss_chat_default_request();
    r.messages = history;
    r.n_messages = 1;
    r.tools = tools;
    r.n_tools = 2;
    return r;
}

}  // namespace

TEST_CASE("gptoss_generate with json_schema: every output is one valid document, then a stop token") {
    gptoss_session* session = new_session();
    const std::vector<int32_t> prompt = tokenize("<|start|>user<|message|>Weather?<|end|><|start|>assistant");
    int ended = 0;
    for (uint64_t seed = 0; seed < 5; ++seed) {
        gptoss_sampling_params p = gptoss_sampling_default_params();
        p.seed = seed;
        p.max_tokens = 600;
        p.json_schema = kWeather;
        const gptoss_generate_result* r = nullptr;
        INFO("seed " << seed);
        REQUIRE(gptoss_generate(session, prompt.data(), prompt.size(), &p, nullptr, nullptr, &r) == GPTOSS_OK);
        REQUIRE(r->stop_reason != GPTOSS_STOP_MAX_TOKENS);
        REQUIRE((r->stop_reason == GPTOSS_STOP_RETURN || r->stop_reason == GPTOSS_STOP_CALL));
        std::string text(r->text, r->text_len);
        const size_t cut = text.rfind("<|");
        REQUIRE(cut != std::string::npos);
        text.resize(cut);
        INFO(text);
        CHECK(weather_violation(text) == "");
        ended++;
    }
    CHECK(ended == 5);
    gptoss_session_free(session);
}

TEST_CASE("json_schema: same seed, same tokens; no schema = the unconstrained path; old struct size") {
    gptoss_session* session = new_session();
    const std::vector<int32_t> prompt = tokenize("<|start|>user<|message|>Hi<|end|><|start|>assistant");
    auto run = [&](gptoss_sampling_params p) {
        const gptoss_generate_result* r = nullptr;
        REQUIRE(gptoss_generate(session, prompt.data(), prompt.size(), &p, nullptr, nullptr, &r) == GPTOSS_OK);
        return std::vector<int32_t>(r->tokens, r->tokens + r->n_tokens);
    };
    gptoss_sampling_params p = gptoss_sampling_default_params();
    p.seed = 11;
    p.max_tokens = 40;
    const std::vector<int32_t> plain = run(p);
    // A caller built against the header before json_schema existed.
    gptoss_sampling_params old;
    std::memset(&old, 0, sizeof old);
    gptoss_sampling_params_init(&old, offsetof(gptoss_sampling_params, json_schema));
    old.seed = 11;
    old.max_tokens = 40;
    CHECK(run(old) == plain);
    p.json_schema = kAdd;
    const std::vector<int32_t> a = run(p), b = run(p);
    CHECK(a == b);
    CHECK(a != plain);
    gptoss_session_free(session);
}

TEST_CASE("bad schemas fail with INVALID_ARGUMENT naming the path") {
    gptoss_session* session = new_session();
    const std::vector<int32_t> prompt = tokenize("hello");
    gptoss_sampling_params p = gptoss_sampling_default_params();
    p.json_schema = R"({"type":"object","properties":{"a":{"type":"string","pattern":"x+"}}})";
    const gptoss_generate_result* r = nullptr;
    CHECK(gptoss_generate(session, prompt.data(), prompt.size(), &p, nullptr, nullptr, &r) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("sampling.json_schema: /properties/a/pattern: unsupported keyword") !=
          std::string::npos);
    p.json_schema = "{not json";
    CHECK(gptoss_generate(session, prompt.data(), prompt.size(), &p, nullptr, nullptr, &r) == GPTOSS_ERR_INVALID_ARGUMENT);

    gptoss_message history[1] = {{GPTOSS_ROLE_USER, GPTOSS_CHANNEL_NONE, "hi", nullptr, nullptr, nullptr}};
    gptoss_tool bad[1] = {{"f", "", R"({"type":"object","properties":{"n":{"type":"integer","minimum":0}}})"}};
    gptoss_chat_request req = gptoss_chat_default_request();
    req.messages = history;
    req.n_messages = 1;
    req.tools = bad;
    req.n_tools = 1;
    const gptoss_chat_result* cr = nullptr;
    CHECK(gptoss_chat(session, &req, nullptr, nullptr, nullptr, &cr) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("tools[0].parameters: /properties/n/minimum: unsupported keyword") !=
          std::string::npos);
    req.constrain_tool_arguments = false;  // then the schema is only rendered
    gptoss_sampling_params sp = gptoss_sampling_default_params();
    sp.max_tokens = 4;
    CHECK(gptoss_chat(session, &req, &sp, nullptr, nullptr, &cr) == GPTOSS_OK);
    req.tool_choice = GPTOSS_TOOL_CHOICE_NAMED;
    req.tool_choice_name = "nope";
    CHECK(gptoss_chat(session, &req, &sp, nullptr, nullptr, &cr) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("request.tool_choice_name: \"nope\" is not one of the tools") !=
          std::string::npos);
    req.tool_choice = GPTOSS_TOOL_CHOICE_AUTO;
    req.response_format = GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA;
    CHECK(gptoss_chat(session, &req, &sp, nullptr, nullptr, &cr) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("request.response_format_name") != std::string::npos);
    gptoss_session_free(session);
}

TEST_CASE("tool_choice named/required: the first message is a call whose arguments validate") {
    gptoss_session* session = new_session();
    gptoss_message history[1] = {{GPTOSS_ROLE_USER, GPTOSS_CHANNEL_NONE, "Weather in Paris?", nullptr, nullptr, nullptr}};
    std::set<std::string> names;
    for (uint64_t seed = 0; seed < 6; ++seed) {
        gptoss_chat_request req = weather_request(history);
        req.tool_choice = seed % 2 ? GPTOSS_TOOL_CHOICE_REQUIRED : GPTOSS_TOOL_CHOICE_NAMED;
        req.tool_choice_name = seed % 2 ? nullptr : "get_weather";
        gptoss_sampling_params p = gptoss_sampling_default_params();
        p.seed = seed;
        p.max_tokens = 600;
        const gptoss_chat_result* r = nullptr;
        REQUIRE(gptoss_chat(session, &req, &p, nullptr, nullptr, &r) == GPTOSS_OK);
        INFO("seed " << seed << ": " << r->raw);
        REQUIRE(r->stop_reason == GPTOSS_STOP_CALL);
        REQUIRE(r->n_tool_calls == 1);
        const std::string name = r->tool_calls[0].name;
        names.insert(name);
        if (seed % 2 == 0) CHECK(name == "get_weather");
        CHECK(std::string(r->tool_calls[0].recipient) == "functions." + name);
        CHECK(std::string(r->tool_calls[0].content_type) == "json");
        const std::string args = r->tool_calls[0].arguments;
        CHECK((name == "get_weather" ? weather_violation(args) : add_violation(args)) == "");
    }
    MESSAGE("REQUIRED picked: " << (names.count("add") ? "add " : "") << "get_weather");
    gptoss_session_free(session);
}

TEST_CASE("tool_choice none: no tool call over many seeds") {
    gptoss_session* session = new_session();
    gptoss_message history[1] = {{GPTOSS_ROLE_USER, GPTOSS_CHANNEL_NONE, "Weather?", nullptr, nullptr, nullptr}};
    for (uint64_t seed = 0; seed < 5; ++seed) {
        gptoss_chat_request req = weather_request(history);
        req.tool_choice = GPTOSS_TOOL_CHOICE_NONE;
        gptoss_sampling_params p = gptoss_sampling_default_params();
        p.seed = seed;
        p.max_tokens = 40;
        const gptoss_chat_result* r = nullptr;
        REQUIRE(gptoss_chat(session, &req, &p, nullptr, nullptr, &r) == GPTOSS_OK);
        CHECK(r->n_tool_calls == 0);
        CHECK(r->stop_reason != GPTOSS_STOP_CALL);
    }
    gptoss_session_free(session);
}

TEST_CASE("response_format: the developer message's Response Formats section; final messages validate") {
    gptoss_message history[1] = {{GPTOSS_ROLE_USER, GPTOSS_CHANNEL_NONE, "Weather?", nullptr, nullptr, nullptr}};
    gptoss_chat_request req = gptoss_chat_default_request();
    req.messages = history;
    req.n_messages = 1;
    req.instructions = "Be brief.";
    req.response_format = GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA;
    req.response_format_name = "weather";
    req.response_format_description = "A weather query";
    req.response_format_schema = R"({"type":"object", "properties":{"city":{"type":"string"}}})";
    size_t n = 0;
    REQUIRE(gptoss_chat_render(tiny_model(), &req, nullptr, 0, &n) == GPTOSS_ERR_BUFFER_TOO_SMALL);
    std::vector<int32_t> tokens(n);
    REQUIRE(gptoss_chat_render(tiny_model(), &req, tokens.data(), n, &n) == GPTOSS_OK);
    std::vector<char> text(n * 64 + 1);
    size_t len = 0;
    REQUIRE(gptoss_detokenize(tiny_model(), tokens.data(), n, text.data(), text.size(), &len) == GPTOSS_OK);
    const std::string rendered(text.data(), len);
    CHECK(rendered.find("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Response Formats\n\n## weather\n\n"
                        "// A weather query\n{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}<|end|>") !=
          std::string::npos);

    // Constrained final messages. The tiny model never closes its analysis by itself, so a
    // budget makes it answer: every turn ends in <|return|> with a valid final message.
    req.response_format_schema = kWeather;
    req.max_reasoning_tokens = 5;
    gptoss_session* session = new_session();
    int with_analysis = 0;
    for (uint64_t seed = 0; seed < 4; ++seed) {
        gptoss_sampling_params p = gptoss_sampling_default_params();
        p.seed = seed;
        p.max_tokens = 600;
        const gptoss_chat_result* r = nullptr;
        REQUIRE(gptoss_chat(session, &req, &p, nullptr, nullptr, &r) == GPTOSS_OK);
        INFO("seed " << seed << ": " << r->raw);
        REQUIRE(r->stop_reason == GPTOSS_STOP_RETURN);
        REQUIRE(r->n_messages >= 1);
        const gptoss_message& last = r->messages[r->n_messages - 1];
        CHECK(last.channel == GPTOSS_CHANNEL_FINAL);
        CHECK(weather_violation(r->final) == "");
        CHECK(std::string(r->final) == last.content);
        if (r->n_messages == 2) {
            with_analysis++;
            CHECK(r->messages[0].channel == GPTOSS_CHANNEL_ANALYSIS);
            CHECK(std::string(r->raw).find("<|end|><|start|>assistant<|channel|>final<|message|>") != std::string::npos);
        } else {
            CHECK(std::string(r->raw).rfind("<|channel|>final<|message|>", 0) == 0);
        }
        CHECK(r->n_messages <= 2);
    }
    MESSAGE(with_analysis << " of 4 answers came after an analysis message");
    gptoss_session_free(session);
}

namespace {

// Runs one turn, counting the tokens sampled inside analysis content (events with text or not).
struct Turn {
    const gptoss_chat_result* r = nullptr;
    int analysis_tokens = 0;
};
Turn chat_counting(gptoss_session* session, const gptoss_chat_request& req, uint64_t seed, uint32_t max_tokens) {
    gptoss_sampling_params p = gptoss_sampling_default_params();
    p.seed = seed;
    p.max_tokens = max_tokens;
    Turn t;
    auto count = [](void* user, const gptoss_event* e) {
        if (e->channel == GPTOSS_CHANNEL_ANALYSIS && e->token < 199998) ++*static_cast<int*>(user);
        return true;
    };
    REQUIRE(gptoss_chat(session, &req, &p, count, &t.analysis_tokens, &t.r) == GPTOSS_OK);
    return t;
}

}  // namespace

TEST_CASE("max_reasoning_tokens: the analysis ends at the budget and the final header follows; 0 skips it") {
    gptoss_message history[1] = {{GPTOSS_ROLE_USER, GPTOSS_CHANNEL_NONE, "Hi", nullptr, nullptr, nullptr}};
    gptoss_chat_request req = gptoss_chat_default_request();
    req.messages = history;
    req.n_messages = 1;
    gptoss_session* session = new_session();
    // Default (no bound, no response_format): the unconstrained path, same tokens as an old-sized
    // request that has no max_reasoning_tokens field.
    gptoss_chat_request old;
    std::memset(&old, 0, sizeof old);
    gptoss_chat_request_init(&old, offsetof(gptoss_chat_request, max_reasoning_tokens));
    old.messages = history;
    old.n_messages = 1;
    const std::string plain = chat_counting(session, req, 3, 20).r->raw;
    CHECK(std::string(chat_counting(session, old, 3, 20).r->raw) == plain);
    CHECK(plain.find("<|channel|>final<|message|>") == std::string::npos);  // it wanders

    for (uint32_t budget : {0u, 1u, 4u}) {
        req.max_reasoning_tokens = budget;
        for (uint64_t seed = 0; seed < 3; ++seed) {
            const Turn t = chat_counting(session, req, seed, 18);
            const std::string raw = t.r->raw;
            INFO("budget " << budget << " seed " << seed << ": " << raw);
            CHECK(t.analysis_tokens <= int(budget));
            if (raw.rfind("<|channel|>analysis<|message|>", 0) == 0) {
                CHECK(budget > 0);
                CHECK(t.analysis_tokens == int(budget));  // the tiny model never stops early
                CHECK(raw.find("<|end|><|start|>assistant<|channel|>final<|message|>") != std::string::npos);
            } else {
                CHECK(raw.rfind("<|channel|>final<|message|>", 0) == 0);
            }
        }
    }
    // With tools and tool_choice auto the answer may also be a call (then its arguments validate).
    gptoss_chat_request with_tools = weather_request(history);
    with_tools.max_reasoning_tokens = 2;
    int calls = 0;
    for (uint64_t seed : {1, 4, 7, 9}) {  // seeds whose answer is a final message, or a call
        const Turn t = chat_counting(session, with_tools, seed, 150);
        INFO("seed " << seed << ": " << t.r->raw);
        CHECK(t.analysis_tokens <= 2);
        const std::string raw = t.r->raw;
        CHECK((raw.find("<|channel|>final<|message|>") != std::string::npos ||
               raw.find("<|channel|>commentary to=functions.") != std::string::npos));
        if (t.r->stop_reason != GPTOSS_STOP_CALL) continue;  // a free final answer, cut by max_tokens
        calls++;
        REQUIRE(t.r->n_tool_calls == 1);
        const std::string name = t.r->tool_calls[0].name;
        CHECK((name == "get_weather" ? weather_violation(t.r->tool_calls[0].arguments)
                                     : add_violation(t.r->tool_calls[0].arguments)) == "");
    }
    MESSAGE(calls << " of 4 answers were calls");
    CHECK(calls > 0);
    gptoss_session_free(session);
}

TEST_CASE("constrained chat: prefix reuse gives a fresh session's tokens; cancel stops") {
    gptoss_message history[1] = {{GPTOSS_ROLE_USER, GPTOSS_CHANNEL_NONE, "Weather in Oslo?", nullptr, nullptr, nullptr}};
    gptoss_chat_request req = weather_request(history);
    req.tool_choice = GPTOSS_TOOL_CHOICE_NAMED;
    req.tool_choice_name = "get_weather";
    gptoss_sampling_params p = gptoss_sampling_default_params();
    p.seed = 5;
    p.max_tokens = 600;
    gptoss_session* a = new_session();
    gptoss_session* b = new_session();
    const gptoss_chat_result* r = nullptr;
    REQUIRE(gptoss_chat(a, &req, &p, nullptr, nullptr, &r) == GPTOSS_OK);
    const std::string first = r->raw;
    REQUIRE(gptoss_chat(a, &req, &p, nullptr, nullptr, &r) == GPTOSS_OK);
    CHECK(r->n_cached_tokens > 0);
    CHECK(std::string(r->raw) == first);
    REQUIRE(gptoss_chat(b, &req, &p, nullptr, nullptr, &r) == GPTOSS_OK);
    CHECK(std::string(r->raw) == first);
    int events = 0;
    auto stop_after_3 = [](void* user, const gptoss_event*) { return ++*static_cast<int*>(user) < 3; };
    REQUIRE(gptoss_chat(b, &req, &p, stop_after_3, &events, &r) == GPTOSS_OK);
    CHECK(r->stop_reason == GPTOSS_STOP_CANCELLED);
    CHECK(r->n_completion_tokens == 3);
    gptoss_session_free(a);
    gptoss_session_free(b);
}
