// test-openai-json.cpp - the OpenAI Chat Completions mapping shared by gptoss-chat and
// gptoss-server (tokenizer/openai-json.h): gptoss-chat's conversation JSON stays byte for byte
// what it was; request bodies give the sampling parameters they say and bad ones an error naming
// the field; and a stream's chunks, added up the way the OpenAI SDKs add them up, give exactly
// the non-streamed reply of the same turn. Turns are real Harmony text run through the library's
// own streaming parser (harmony::ChatStream, what gptoss_chat feeds its events from), and a
// real gptoss_chat call on the tiny model.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "tokenizer/openai-json.h"

#include "tokenizer/harmony.h"
#include "tokenizer/tokenizer.h"

#include <simdjson.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace o = gptoss::openai;
namespace h = gptoss::harmony;

namespace {

o::CompletionRequest parse_ok(const std::string& body) {
    o::CompletionRequest req;
    o::Error err;
    const bool ok = o::parse_completion_request(body.data(), body.size(), &req, &err);
    INFO("body: " << body << "\nerror: " << err.message);
    REQUIRE(ok);
    return req;
}

o::Error parse_error(const std::string& body) {
    o::CompletionRequest req;
    o::Error err;
    const bool ok = o::parse_completion_request(body.data(), body.size(), &req, &err);
    INFO("body: " << body);
    REQUIRE_FALSE(ok);
    return err;
}

const std::string kUser = R"("messages":[{"role":"user","content":"hi"}])";

}  // namespace

TEST_CASE("gptoss-chat's conversation JSON is byte for byte what it was before the move") {
    // Expected text: what gptoss-chat --json printed before the code moved here.
    const std::string in = R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"weather in Paris? \u00e9"},
{"role":"assistant","reasoning_content":"need tool","content":"Let me check.","tool_calls":[{"id":"x1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
{"role":"tool","tool_call_id":"x1","content":"sunny"},{"role":"assistant","content":"It is sunny."}],
"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"reasoning_effort":"low"})";
    o::ParsedConversation parsed;
    std::string err;
    REQUIRE_MESSAGE(o::parse_conversation(in, "in", parsed, err), err);
    const std::string want =
        "  \"reasoning_effort\": \"low\",\n"
        "  \"messages\": [{\"role\":\"developer\",\"content\":\"Be brief.\"},\n"
        "    {\"role\":\"user\",\"content\":\"weather in Paris? \xc3\xa9\"},\n"
        "    {\"role\":\"assistant\",\"reasoning_content\":\"need tool\",\"content\":\"Let me check.\",\"tool_calls\":"
        "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
        "\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},\n"
        "    {\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"name\":\"get_weather\",\"content\":\"sunny\"},\n"
        "    {\"role\":\"assistant\",\"content\":\"It is sunny.\"}],\n"
        "  \"tools\": [{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]";
    CHECK(o::conversation_json_fields(parsed.conversation) == want);
    // And it reads back as the same conversation.
    o::ParsedConversation again;
    REQUIRE_MESSAGE(o::parse_conversation("{\n" + want + "\n}", "again", again, err), err);
    CHECK(o::conversation_json_fields(again.conversation) == want);
}

TEST_CASE("the conversation JSON keeps tool_choice, response_format and thinking_token_budget (gptoss-chat /save)") {
    const std::string tools = R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])";
    const std::string bodies[] = {
        "{" + kUser + "," + tools + R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}},)"
            R"("response_format":{"type":"json_schema","json_schema":{"name":"w","description":"d \"q\"",)"
            R"("schema":{"type":"object","properties":{"a":{"enum":[1,2]}}}}},"thinking_token_budget":12})",
        "{" + kUser + "," + tools + R"(,"tool_choice":"required","response_format":{"type":"json_object"}})",
        "{" + kUser + R"(,"tool_choice":"none","thinking_token_budget":0})",
    };
    for (const std::string& body : bodies) {
        INFO(body);
        o::ParsedConversation first, again;
        std::string err;
        REQUIRE_MESSAGE(o::parse_conversation(body, "body", first, err), err);
        const std::string saved = o::conversation_json_fields(first.conversation);
        REQUIRE_MESSAGE(o::parse_conversation("{\n" + saved + "\n}", "saved", again, err), err);
        const o::Conversation &a = first.conversation, &b = again.conversation;
        CHECK(b.tool_choice == a.tool_choice);
        CHECK(b.tool_choice_name == a.tool_choice_name);
        CHECK(b.response_format == a.response_format);
        CHECK(b.response_format_name == a.response_format_name);
        CHECK(b.response_format_description == a.response_format_description);
        CHECK(b.response_format_schema == a.response_format_schema);
        CHECK(b.max_reasoning_tokens == a.max_reasoning_tokens);
        CHECK(o::conversation_json_fields(b) == saved);
    }
    // The first body's values, so that the round trip is not of defaults.
    o::ParsedConversation p;
    std::string err;
    REQUIRE(o::parse_conversation(bodies[0], "body", p, err));
    CHECK(p.conversation.tool_choice == GPTOSS_TOOL_CHOICE_NAMED);
    CHECK(p.conversation.tool_choice_name == "get_weather");
    CHECK(p.conversation.response_format == GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA);
    CHECK(p.conversation.response_format_description == "d \"q\"");
    CHECK(p.conversation.max_reasoning_tokens == 12);
}

TEST_CASE("json_string escapes control characters and replaces invalid UTF-8 with U+FFFD") {
    CHECK(o::json_str(std::string("a\"\\\n\t\x01", 6)) == "\"a\\\"\\\\\\n\\t\\u0001\"");
    CHECK(o::json_str("caf\xc3") == "\"caf\xef\xbf\xbd\"");      // cut-off character
    CHECK(o::json_str("\xed\xa0\x80") == "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");  // a surrogate
}

TEST_CASE("a request body gives the sampling parameters it says, and defaults otherwise") {
    o::CompletionRequest d = parse_ok("{" + kUser + "}");
    gptoss_sampling_params sp = d.sampling();
    CHECK(sp.temperature == 1.0f);
    CHECK(sp.top_p == 1.0f);
    CHECK(sp.max_tokens == 0);
    CHECK(sp.seed == GPTOSS_SEED_RANDOM);
    CHECK(sp.n_stop_strings == 0);
    CHECK_FALSE(d.stream);
    CHECK(d.chat.n_messages == 1);

    o::CompletionRequest r = parse_ok("{" + kUser + R"(,"model":"m","temperature":0.5,"top_p":0.9,"max_tokens":7,
        "max_completion_tokens":9,"seed":-3,"stop":["a","bc"],"stream":true,"stream_options":{"include_usage":true},
        "n":1,"tool_choice":"auto","response_format":{"type":"text"},"logprobs":false,"presence_penalty":0,
        "user":"ignored","reasoning_effort":"high"})");
    sp = r.sampling();
    CHECK(r.model == "m");
    CHECK(sp.temperature == 0.5f);
    CHECK(sp.top_p == doctest::Approx(0.9));
    CHECK(sp.max_tokens == 9);  // max_completion_tokens wins
    CHECK(sp.seed == uint64_t(int64_t(-3)));
    REQUIRE(sp.n_stop_strings == 2);
    CHECK(std::string(sp.stop_strings[1]) == "bc");
    CHECK(r.stream);
    CHECK(r.include_usage);
    CHECK(r.chat.reasoning_effort == GPTOSS_REASONING_HIGH);
    CHECK(parse_ok("{" + kUser + R"(,"stop":"x"})").stop == std::vector<std::string>{"x"});
}

TEST_CASE("tool_choice none keeps the tools in the prompt and forbids calls") {
    const std::string tools = R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
    CHECK(parse_ok("{" + kUser + tools + "}").chat.n_tools == 1);
    CHECK(parse_ok("{" + kUser + tools + R"(,"tool_choice":"auto"})").chat.tool_choice == GPTOSS_TOOL_CHOICE_AUTO);
    o::CompletionRequest none = parse_ok("{" + kUser + tools + R"(,"tool_choice":"none"})");
    CHECK(none.chat.n_tools == 1);
    CHECK(none.chat.tool_choice == GPTOSS_TOOL_CHOICE_NONE);
}

TEST_CASE("tool_choice and response_format become the request's constraint fields") {
    const std::string tools = R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
    CHECK(parse_ok("{" + kUser + tools + "}").chat.tool_choice == GPTOSS_TOOL_CHOICE_AUTO);
    CHECK(parse_ok("{" + kUser + tools + R"(,"tool_choice":"required"})").chat.tool_choice == GPTOSS_TOOL_CHOICE_REQUIRED);
    o::CompletionRequest named = parse_ok("{" + kUser + tools + R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})");
    CHECK(named.chat.tool_choice == GPTOSS_TOOL_CHOICE_NAMED);
    CHECK(std::string(named.chat.tool_choice_name) == "f");
    o::CompletionRequest copy = named;  // copies keep the strings alive
    named = o::CompletionRequest();
    CHECK(std::string(copy.chat.tool_choice_name) == "f");
    CHECK(parse_ok("{" + kUser + R"(,"response_format":{"type":"text"}})").chat.response_format == GPTOSS_RESPONSE_FORMAT_TEXT);
    CHECK(parse_ok("{" + kUser + R"(,"response_format":{"type":"json_object"}})").chat.response_format ==
          GPTOSS_RESPONSE_FORMAT_JSON_OBJECT);
    o::CompletionRequest js = parse_ok("{" + kUser + R"(,"response_format":{"type":"json_schema","json_schema":
        {"name":"answer","description":"The answer","strict":true,"schema":{"type":"object", "properties":{"a":{"type":"integer"}}}}}})");
    CHECK(js.chat.response_format == GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA);
    CHECK(std::string(js.chat.response_format_name) == "answer");
    CHECK(std::string(js.chat.response_format_description) == "The answer");
    CHECK(std::string(js.chat.response_format_schema) == R"({"type":"object","properties":{"a":{"type":"integer"}}})");
    CHECK(js.chat.max_reasoning_tokens == UINT32_MAX);  // no bound unless asked
}

TEST_CASE("thinking_token_budget (vLLM's name) becomes max_reasoning_tokens") {
    CHECK(parse_ok("{" + kUser + R"(,"thinking_token_budget":0})").chat.max_reasoning_tokens == 0);
    CHECK(parse_ok("{" + kUser + R"(,"thinking_token_budget":512})").chat.max_reasoning_tokens == 512);
    CHECK(parse_ok("{" + kUser + R"(,"thinking_token_budget":null})").chat.max_reasoning_tokens == UINT32_MAX);
    for (const char* bad : {"-1", "1.5", "\"8\"", "4294967295"}) {
        const o::Error e = parse_error("{" + kUser + ",\"thinking_token_budget\":" + bad + "}");
        CHECK_MESSAGE(e.message.find("thinking_token_budget: expected an integer in [0, 4294967294]") != std::string::npos,
                      bad << ": " << e.message);
        CHECK(e.param == "thinking_token_budget");
    }
}

TEST_CASE("the library's refusals of a request name the body's field") {
    o::CompletionRequest named = parse_ok("{" + kUser + R"(,"tools":[{"type":"function","function":{"name":"f"}}],
        "tool_choice":{"type":"function","function":{"name":"f"}}})");
    o::Error e = o::request_error(named, GPTOSS_ERR_UNSUPPORTED, "request.tool_choice/response_format: not implemented yet");
    CHECK(e.param == "tool_choice");
    CHECK(e.message.find("not implemented yet") != std::string::npos);
    o::CompletionRequest js = parse_ok("{" + kUser + R"(,"response_format":{"type":"json_object"}})");
    CHECK(o::request_error(js, GPTOSS_ERR_UNSUPPORTED, "x").param == "response_format");
    e = o::request_error(js, GPTOSS_ERR_INVALID_ARGUMENT, "response_format_schema: /properties/a/pattern: unsupported keyword");
    CHECK(e.param == "response_format.json_schema.schema");
    CHECK(e.message == "response_format.json_schema.schema: /properties/a/pattern: unsupported keyword");
    e = o::request_error(named, GPTOSS_ERR_INVALID_ARGUMENT, "request.tool_choice_name: \"g\" is not in tools");
    CHECK(e.param == "tool_choice.function.name");
    // Harmony message indices are not the body's: no param.
    e = o::request_error(named, GPTOSS_ERR_INVALID_ARGUMENT, "messages[3].content: invalid UTF-8 at byte 5");
    CHECK(e.param.empty());
    CHECK(e.message == "messages[3].content: invalid UTF-8 at byte 5");
}

TEST_CASE("a bad request names the field, as a JSON path, in the message and in param") {
    struct Case { std::string body, param, says; };
    const std::vector<Case> cases = {
        {"{", "", "not valid JSON"},
        {"[1]", "", "expected a JSON object"},
        {R"({"messages":[]})", "messages", "empty"},
        {R"({"model":"m"})", "messages", "missing"},
        {"{" + kUser + R"(,"temperature":"hot"})", "temperature", "expected a number, found a string"},
        {"{" + kUser + R"(,"temperature":3})", "temperature", "outside [0, 2]"},
        {"{" + kUser + R"(,"top_p":0})", "top_p", "outside (0, 1]"},
        {"{" + kUser + R"(,"max_tokens":0})", "max_tokens", "less than 1"},
        {"{" + kUser + R"(,"max_completion_tokens":1.5})", "max_completion_tokens", "expected an integer"},
        {"{" + kUser + R"(,"seed":"x"})", "seed", "expected an integer"},
        {"{" + kUser + R"(,"stop":["a",""]})", "stop[1]", "empty"},
        {"{" + kUser + R"(,"stop":["a",2]})", "stop[1]", "expected a string, found a number"},
        {"{" + kUser + R"(,"stop":{}})", "stop", "a string or an array of strings"},
        {"{" + kUser + R"(,"stream":"yes"})", "stream", "expected a boolean"},
        {"{" + kUser + R"(,"stream_options":{"include_usage":1}})", "stream_options.include_usage", "expected a boolean"},
        {"{" + kUser + R"(,"n":2})", "n", "only 1 choice"},
        {"{" + kUser + R"(,"tool_choice":"required"})", "tool_choice", "needs tools"},
        {"{" + kUser + R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})", "tool_choice.function.name", "not in tools"},
        {"{" + kUser + R"(,"tool_choice":{"type":"function","function":{}}})", "tool_choice.function.name", "missing"},
        {"{" + kUser + R"(,"tool_choice":{"type":"function"}})", "tool_choice.function", ""},
        {"{" + kUser + R"(,"tool_choice":"sometimes"})", "tool_choice", "\"sometimes\""},
        {"{" + kUser + R"(,"response_format":{"type":"yaml"}})", "response_format.type", "\"yaml\""},
        {"{" + kUser + R"(,"response_format":"json"})", "response_format", "expected an object"},
        {"{" + kUser + R"(,"response_format":{"type":"json_schema"}})", "response_format.json_schema", ""},
        {"{" + kUser + R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{}}}})",
         "response_format.json_schema.name", "missing"},
        {"{" + kUser + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":[]}}})",
         "response_format.json_schema.schema", "object"},
        {"{" + kUser + R"(,"logprobs":true})", "logprobs", "not supported"},
        {"{" + kUser + R"(,"frequency_penalty":0.5})", "frequency_penalty", "not supported"},
        // From the library's parser: the path is taken from its message.
        {R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":5}]})", "messages[1].content",
         "expected a string"},
        {R"({"messages":[{"role":"robot","content":"a"}]})", "messages[0].role", "unknown role"},
        {R"({"messages":[{"role":"tool","tool_call_id":"nope","content":"a"}]})", "messages[0].tool_call_id",
         "matches no tool_calls"},
        {"{" + kUser + R"(,"reasoning_effort":"max"})", "reasoning_effort", "not low, medium or high"},
        {"{" + kUser + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"properties":3}}}]})",
         "tools[0].function.parameters.properties", ""},
    };
    for (const Case& c : cases) {
        const o::Error e = parse_error(c.body);
        INFO("body: " << c.body << "\nmessage: " << e.message);
        CHECK(e.param == c.param);
        CHECK(e.message.find(c.says) != std::string::npos);
        if (!c.param.empty()) CHECK(e.message.rfind(c.param + ": ", 0) == 0);
    }
    // The error object is OpenAI's shape; an empty param is null.
    const std::string j = o::error_json({"x: bad", "x"});
    CHECK(j == R"({"error":{"message":"x: bad","type":"invalid_request_error","param":"x","code":null}})");
    CHECK(o::error_json({"no", ""}, "authentication_error", "invalid_api_key") ==
          R"({"error":{"message":"no","type":"authentication_error","param":null,"code":"invalid_api_key"}})");
}

// --- replies and streams ---------------------------------------------------------------------

namespace {

const gptoss::Tokenizer& tokenizer() {
    static std::unique_ptr<gptoss::Tokenizer> t = [] {
        const char* dir = std::getenv("GPTOSS_TOKENIZER_DIR");
        REQUIRE_MESSAGE(dir != nullptr, "GPTOSS_TOKENIZER_DIR is not set (run through ctest)");
        std::unique_ptr<gptoss::Tokenizer> out;
        REQUIRE(gptoss::Tokenizer::load_hf_json(std::string(dir) + "/tokenizer.json", &out) == GPTOSS_OK);
        return out;
    }();
    return *t;
}

// A gptoss_chat_result over parsed messages, built as gptoss_chat builds it.
struct FakeResult {
    std::vector<h::ParsedMessage> parsed;
    std::vector<gptoss_message> messages;
    gptoss_chat_result result{};
    FakeResult(std::vector<h::ParsedMessage> p, gptoss_stop_reason stop) : parsed(std::move(p)) {
        for (const h::ParsedMessage& m : parsed) {
            if (m.role != h::Role::Assistant) continue;
            gptoss_message g{};
            g.role = GPTOSS_ROLE_ASSISTANT;
            g.channel = m.channel == "analysis" ? GPTOSS_CHANNEL_ANALYSIS : m.channel == "commentary" ? GPTOSS_CHANNEL_COMMENTARY
                      : m.channel == "final" ? GPTOSS_CHANNEL_FINAL : GPTOSS_CHANNEL_NONE;
            g.content = m.content.c_str();
            g.recipient = m.recipient.empty() ? nullptr : m.recipient.c_str();
            messages.push_back(g);
        }
        result.struct_size = sizeof result;
        result.messages = messages.data();
        result.n_messages = messages.size();
        result.stop_reason = stop;
        result.n_prompt_tokens = 10;
        result.n_cached_tokens = 4;
        result.n_completion_tokens = 6;
    }
};

std::function<std::string()> counter_ids() {
    auto n = std::make_shared<int>(0);
    return [n] { return "call_" + std::to_string(++*n); };
}

// What an OpenAI SDK makes of a stream: the concatenated deltas of choices[0].
struct Accumulated {
    std::string role, reasoning, content, finish_reason, usage;
    bool has_content = false;
    std::map<int64_t, o::ToolCall> calls;
    int chunks = 0;
    bool done = false;
};

void accumulate(const std::string& sse, Accumulated* acc) {
    size_t pos = 0;
    simdjson::dom::parser parser;
    while (pos < sse.size()) {
        const size_t end = sse.find("\n\n", pos);
        REQUIRE_MESSAGE(end != std::string::npos, "an event does not end with a blank line: " << sse.substr(pos));
        const std::string event = sse.substr(pos, end - pos);
        pos = end + 2;
        REQUIRE(event.rfind("data: ", 0) == 0);
        const std::string data = event.substr(6);
        CHECK_FALSE(acc->done);
        if (data == "[DONE]") { acc->done = true; continue; }
        ++acc->chunks;
        simdjson::dom::element chunk;
        REQUIRE_MESSAGE(parser.parse(data).get(chunk) == simdjson::SUCCESS, data);
        CHECK(std::string_view(chunk["object"].get_string().value()) == "chat.completion.chunk");
        simdjson::dom::array choices = chunk["choices"].get_array().value();
        if (choices.size() == 0) {
            acc->usage = simdjson::minify(chunk["usage"]);
            continue;
        }
        simdjson::dom::element c = choices.at(0).value();
        if (c["finish_reason"].is_string()) acc->finish_reason = std::string(c["finish_reason"].get_string().value());
        simdjson::dom::object delta = c["delta"].get_object().value();
        std::string_view s;
        if (delta["role"].get_string().get(s) == simdjson::SUCCESS) acc->role = s;
        if (delta["reasoning_content"].get_string().get(s) == simdjson::SUCCESS) acc->reasoning += s;
        if (delta["content"].get_string().get(s) == simdjson::SUCCESS) { acc->content += s; }
        simdjson::dom::array calls;
        if (delta["tool_calls"].get_array().get(calls) == simdjson::SUCCESS) {
            for (simdjson::dom::element call : calls) {
                o::ToolCall& t = acc->calls[call["index"].get_int64().value()];
                if (call["id"].get_string().get(s) == simdjson::SUCCESS) t.id = s;
                if (call["function"]["name"].get_string().get(s) == simdjson::SUCCESS) t.name += s;
                if (call["function"]["arguments"].get_string().get(s) == simdjson::SUCCESS) t.arguments += s;
            }
        }
    }
}

struct StreamRun {
    std::string live;      // chunks sent while tokens arrived
    Accumulated acc;
    o::Reply reply;        // the non-streamed reply of the same turn
    std::string completion;
};

StreamRun stream_text(const std::string& harmony_text, std::vector<std::string> stops = {},
                      gptoss_stop_reason stop = GPTOSS_STOP_RETURN) {
    std::vector<int32_t> tokens;
    REQUIRE(tokenizer().encode(harmony_text.data(), harmony_text.size(), true, &tokens) == GPTOSS_OK);
    h::ChatStream stream(tokenizer(), std::move(stops));
    o::StreamMapper mapper("chatcmpl-1", 123, "gpt-oss", true, counter_ids());
    StreamRun run;
    std::string sse = mapper.first_chunk();
    for (int32_t t : tokens) {
        gptoss_event e;
        const bool stopped = stream.push(t, &e);
        const std::string out = mapper.on_event(e);
        run.live += out;
        sse += out;
        if (stopped) { stop = GPTOSS_STOP_STRING; break; }
    }
    stream.finish();
    FakeResult result(stream.messages(), stop);
    sse += mapper.finish(result.result);
    accumulate(sse, &run.acc);
    run.reply = o::reply_from_result(result.result, counter_ids());
    run.completion = o::completion_json("chatcmpl-1", 123, "gpt-oss", run.reply,
                                        o::reply_finish_reason(stop, run.reply), {10, 6, 4});
    return run;
}

void check_sums_to_reply(const StreamRun& run) {
    const Accumulated& a = run.acc;
    CHECK(a.done);
    CHECK(a.role == "assistant");
    CHECK(a.reasoning == run.reply.reasoning);
    CHECK(a.content == run.reply.content);
    REQUIRE(a.calls.size() == run.reply.calls.size());
    for (size_t i = 0; i < run.reply.calls.size(); ++i) {
        CHECK(a.calls.at(int64_t(i)).id == run.reply.calls[i].id);
        CHECK(a.calls.at(int64_t(i)).name == run.reply.calls[i].name);
        CHECK(a.calls.at(int64_t(i)).arguments == run.reply.calls[i].arguments);
    }
    CHECK(a.usage == R"({"prompt_tokens":10,"completion_tokens":6,"total_tokens":16,"prompt_tokens_details":{"cached_tokens":4}})");
}

}  // namespace

TEST_CASE("an answer streams its reasoning and content as they come, and adds up to the reply") {
    StreamRun run = stream_text(
        "<|channel|>analysis<|message|>Two and two.<|end|><|start|>assistant<|channel|>analysis<|message|>Four."
        "<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>");
    check_sums_to_reply(run);
    CHECK(run.reply.reasoning == "Two and two.\nFour.");
    CHECK(run.reply.content == "It is 4.");
    CHECK(run.acc.finish_reason == "stop");
    // Streamed while generating, not at the end.
    Accumulated live;
    accumulate(run.live, &live);
    CHECK(live.reasoning == run.reply.reasoning);
    CHECK(live.content == run.reply.content);
    CHECK(run.completion.find(R"("message":{"role":"assistant","content":"It is 4.","reasoning_content":"Two and two.\nFour."})") !=
          std::string::npos);
    CHECK(run.completion.find(R"("finish_reason":"stop"}],"usage":{"prompt_tokens":10,)") != std::string::npos);
}

TEST_CASE("a tool call streams as OpenAI streams it: index, id, name, then argument deltas") {
    StreamRun run = stream_text(
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary<|message|>"
        "Checking.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
        "<|message|>{\"city\":\"Paris\"}<|call|>",
        {}, GPTOSS_STOP_CALL);
    check_sums_to_reply(run);
    REQUIRE(run.reply.calls.size() == 1);
    CHECK(run.reply.calls[0].name == "get_weather");
    CHECK(run.reply.calls[0].arguments == "{\"city\":\"Paris\"}");
    CHECK(run.reply.content == "Checking.");
    CHECK(run.acc.finish_reason == "tool_calls");
    CHECK(run.live.find(R"("tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}])") !=
          std::string::npos);
    CHECK(run.live.find(R"("tool_calls":[{"index":0,"function":{"arguments":)") != std::string::npos);
    CHECK(run.completion.find(R"("content":"Checking.","reasoning_content":"Need the weather.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}])") !=
          std::string::npos);
}

TEST_CASE("two calls to the same function are two tool calls with indices 0 and 1") {
    StreamRun run = stream_text(
        "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|end|>"
        "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{\"x\":1}<|call|>",
        {}, GPTOSS_STOP_CALL);
    check_sums_to_reply(run);
    REQUIRE(run.reply.calls.size() == 2);
    CHECK(run.reply.calls[1].arguments == "{\"x\":1}");
    CHECK(run.acc.calls.at(1).id == "call_2");
}

TEST_CASE("text the parser only makes a message at the end (a cut-off header) arrives before the last chunk") {
    StreamRun run = stream_text("just some words with no header at all", {}, GPTOSS_STOP_MAX_TOKENS);
    check_sums_to_reply(run);
    CHECK_FALSE(run.reply.content.empty());
    CHECK(run.live.empty());
    CHECK(run.acc.finish_reason == "length");
}

TEST_CASE("a stop string ends the stream without its text, and the deltas still add up") {
    StreamRun run = stream_text("<|channel|>final<|message|>one two STOP three<|return|>", {"STOP"});
    check_sums_to_reply(run);
    CHECK(run.reply.content == "one two ");
    CHECK(run.acc.finish_reason == "stop");
}

TEST_CASE("a real gptoss_chat stream on the tiny model adds up to its result") {
    const char* dir = std::getenv("GPTOSS_TINY_MODEL");
    REQUIRE_MESSAGE(dir != nullptr, "GPTOSS_TINY_MODEL is not set (run through ctest)");
    gptoss_model_params mp = gptoss_model_default_params();
    mp.device = GPTOSS_DEVICE_CPU;
    gptoss_model* model = nullptr;
    REQUIRE(gptoss_load(dir, &mp, &model) == GPTOSS_OK);
    gptoss_session* session = nullptr;
    REQUIRE(gptoss_session_create(model, nullptr, &session) == GPTOSS_OK);
    o::CompletionRequest req = parse_ok(R"({"messages":[{"role":"user","content":"hello"}],"max_tokens":24,"seed":5,
                                          "stream":true,"stream_options":{"include_usage":true}})");
    o::StreamMapper mapper("chatcmpl-2", 1, "tiny", req.include_usage, counter_ids());
    std::string sse = mapper.first_chunk();
    struct Ctx { o::StreamMapper* m; std::string* out; } ctx{&mapper, &sse};
    gptoss_sampling_params sp = req.sampling();
    const gptoss_chat_result* result = nullptr;
    REQUIRE(gptoss_chat(session, &req.chat, &sp,
                        [](void* u, const gptoss_event* e) {
                            auto* c = static_cast<Ctx*>(u);
                            *c->out += c->m->on_event(*e);
                            return true;
                        },
                        &ctx, &result) == GPTOSS_OK);
    sse += mapper.finish(*result);
    Accumulated acc;
    accumulate(sse, &acc);
    const o::Reply reply = o::reply_from_result(*result, counter_ids());
    CHECK(acc.reasoning == reply.reasoning);
    CHECK(acc.content == reply.content);
    CHECK(acc.calls.size() == reply.calls.size());
    CHECK(acc.finish_reason == o::reply_finish_reason(result->stop_reason, reply));
    CHECK(acc.usage.find("\"completion_tokens\":" + std::to_string(result->n_completion_tokens) + ",") !=
          std::string::npos);
    gptoss_session_free(session);
    gptoss_model_free(model);
}
