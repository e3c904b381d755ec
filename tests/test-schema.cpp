// tests/test-schema.cpp - the JSON Schema compiler and matcher (tokenizer/json-schema.*) and the
// token masks (tokenizer/grammar-mask.*): documents each schema must accept and reject, errors
// that name the keyword and its JSON pointer, and masks computed through the trie (with the
// plain-string fast path and the cache) equal to a brute-force check of every token of the
// real o200k_harmony vocabulary, state by state along documents and random walks.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "tests/test-util.h"

#include "gptoss-internal.h"
#include "tokenizer/grammar-mask.h"
#include "tokenizer/json-schema.h"
#include "tokenizer/tokenizer.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace s = gptoss::schema;

namespace {

using gptoss::test::real_tokenizer;

std::shared_ptr<const s::Grammar> compile_ok(const std::string& schema) {
    std::shared_ptr<const s::Grammar> g;
    const gptoss_status status = s::compile(schema, "json_schema", &g);
    INFO(schema << ": " << gptoss_last_error());
    REQUIRE(status == GPTOSS_OK);
    return g;
}

bool accepts(const std::shared_ptr<const s::Grammar>& g, const std::string& doc) {
    s::Matcher m(g);
    return m.advance(doc) && m.can_finish();
}

std::string compile_error(const std::string& schema) {
    std::shared_ptr<const s::Grammar> g;
    const gptoss_status status = s::compile(schema, "json_schema", &g);
    REQUIRE_MESSAGE(status == GPTOSS_ERR_INVALID_ARGUMENT, schema);
    return gptoss_last_error();
}
const char* kWeather = R"({"type":"object","properties":{
  "city":{"type":"string","minLength":1,"maxLength":40},
  "unit":{"type":"string","enum":["celsius","fahrenheit"]},
  "days":{"type":"integer"},
  "hourly":{"type":"boolean"},
  "tags":{"type":"array","items":{"type":"string","maxLength":8},"maxItems":3}},
  "required":["city","unit"],"additionalProperties":false})";

}  // namespace

TEST_CASE("scalars, enums and unions accept exactly their documents") {
    auto g = compile_ok(R"({"type":"integer"})");
    for (const char* ok : {"0", "-7", "123", " 42 ", "999999999999999"}) CHECK_MESSAGE(accepts(g, ok), ok);
    for (const char* bad : {"01", "1.5", "1e3", "-", "", "\"1\"", "1 2", "1234567890123456"})
        CHECK_MESSAGE(!accepts(g, bad), bad);
    g = compile_ok(R"({"type":"number"})");
    for (const char* ok : {"0", "-0.5", "1e3", "2.5E-7", "10"}) CHECK_MESSAGE(accepts(g, ok), ok);
    for (const char* ok : {"1e99", "-999999999999999.5e-99"}) CHECK_MESSAGE(accepts(g, ok), ok);
    // A 3-digit exponent could overflow a double (38881e475 parses as Infinity in JSON.parse).
    for (const char* bad : {"1.", ".5", "1e", "+1", "0x1", "38881e475", "1e100"}) CHECK_MESSAGE(!accepts(g, bad), bad);
    g = compile_ok(R"({"enum":["a","ab",1,12,null,{"k":[true]}]})");
    for (const char* ok : {"\"a\"", "\"ab\"", "1", "12", "null", "{\"k\":[true]}"}) CHECK_MESSAGE(accepts(g, ok), ok);
    for (const char* bad : {"\"abc\"", "2", "123", "\"b\"", "true"}) CHECK_MESSAGE(!accepts(g, bad), bad);
    g = compile_ok(R"({"type":["string","null"],"maxLength":3})");
    for (const char* ok : {"null", "\"\"", "\"abc\"", "\"\\u00e9\\n\"", "\"h\xC3\xA9!\""}) CHECK_MESSAGE(accepts(g, ok), ok);
    for (const char* bad : {"\"abcd\"", "\"\\ud800\"", "\"\\x\"", "\"a\nb\"", "\"\xC3\"", "nul"})
        CHECK_MESSAGE(!accepts(g, bad), bad);
    g = compile_ok(R"({"anyOf":[{"type":"object","properties":{"a":{"const":1}},"required":["a"]},
                               {"type":"object","properties":{"a":{"const":2}, "b":{"type":"boolean"}},"required":["a","b"]}]})");
    CHECK(accepts(g, R"({"a":1})"));
    CHECK(accepts(g, R"({"a": 2, "b": false})"));
    CHECK(!accepts(g, R"({"a":2})"));
    CHECK(!accepts(g, R"({"a":1,"b":true})"));
    g = compile_ok(R"({"type":"string","format":"date-time"})");
    CHECK(accepts(g, "\"2024-05-17T13:45:00Z\""));
    CHECK(!accepts(g, "\"2024-13-17T13:45:00Z\""));
    g = compile_ok(R"({"type":"string","format":"uuid"})");
    CHECK(accepts(g, "\"0123abcd-0000-ffff-1234-0123456789ab\""));
}

TEST_CASE("objects: declared order, required members, additionalProperties, bounded whitespace") {
    auto g = compile_ok(kWeather);
    CHECK(accepts(g, R"({"city":"Paris","unit":"celsius"})"));
    CHECK(accepts(g, R"({ "city" : "Paris" , "unit":"fahrenheit", "days": 3, "hourly": true, "tags": ["a","b"] })"));
    CHECK(accepts(g, "{\n  \"city\": \"P\",\n  \"unit\": \"celsius\",\n  \"tags\": []\n}"));
    CHECK(!accepts(g, R"({"unit":"celsius","city":"Paris"})"));         // order
    CHECK(!accepts(g, R"({"city":"Paris"})"));                          // required unit
    CHECK(!accepts(g, R"({"city":"","unit":"celsius"})"));              // minLength
    CHECK(!accepts(g, R"({"city":"P","unit":"celsius","x":1})"));       // additionalProperties false
    CHECK(!accepts(g, R"({"city":"P","unit":"celsius","tags":["a","b","c","d"]})"));  // maxItems
    CHECK(!accepts(g, R"({"city":"P","unit":"celsius",})"));
    CHECK(!accepts(g, "{" + std::string(17, ' ') + "\"city\":\"P\",\"unit\":\"celsius\"}"));  // whitespace bound
    g = compile_ok(R"({"type":"object"})");
    CHECK(accepts(g, R"({"any_key":[1,{"x":null}],"k2":"v"})"));
    CHECK(accepts(g, "{}"));
    g = compile_ok(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}})");
    CHECK(accepts(g, R"({"a":1,"b":"x"})"));
    CHECK(accepts(g, R"({"b":"x"})"));
    CHECK(!accepts(g, R"({"b":1})"));
    CHECK(!accepts(g, R"({"b":"x","a":"y"})"));   // a declared key must take its own schema
}

TEST_CASE("arrays, prefixItems, $ref recursion, nullable") {
    auto g = compile_ok(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false,"minItems":1})");
    CHECK(accepts(g, R"(["a"])"));
    CHECK(accepts(g, R"(["a", 2])"));
    CHECK(!accepts(g, R"([])"));
    CHECK(!accepts(g, R"(["a",2,3])"));
    CHECK(!accepts(g, R"([2])"));
    g = compile_ok(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
        "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},
        "$ref":"#/$defs/node"})");
    CHECK(accepts(g, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
    CHECK(!accepts(g, R"({"v":1,"kids":[{"w":2}]})"));
    g = compile_ok(R"({"type":"integer","nullable":true})");
    CHECK(accepts(g, "null"));
    CHECK(accepts(g, "5"));
    g = compile_ok("{}");
    for (const char* ok : {"1", "\"s\"", "[1,[2,{}]]", "{\"a\":{\"b\":null}}", "true"}) CHECK_MESSAGE(accepts(g, ok), ok);
}

TEST_CASE("unsupported keywords and malformed schemas: errors name the keyword and its path") {
    CHECK(compile_error(R"({"type":"object","properties":{"a":{"type":"string","pattern":"^x"}}})")
              .find("json_schema: /properties/a/pattern: unsupported keyword \"pattern\"") != std::string::npos);
    CHECK(compile_error(R"({"type":"integer","minimum":3})").find("/minimum: unsupported keyword") != std::string::npos);
    CHECK(compile_error(R"({"$ref":"#/$defs/missing"})").find("/$ref: \"#/$defs/missing\" points at nothing") !=
          std::string::npos);
    CHECK(compile_error(R"({"$ref":"http://x/y"})").find("only local references") != std::string::npos);
    CHECK(compile_error(R"({"type":"strin"})").find("/type: unknown type \"strin\"") != std::string::npos);
    CHECK(compile_error(R"({"type":"object","required":"a"})").find("/required: expected an array") != std::string::npos);
    CHECK(compile_error(R"({"enum":[]})").find("empty enum") != std::string::npos);
    CHECK(compile_error("false").find("matches nothing") != std::string::npos);
    CHECK(compile_error("{\"type\":").find("not valid JSON") != std::string::npos);
    CHECK(compile_error(R"({"type":"string","format":"email"})").find("unsupported format \"email\"") != std::string::npos);
    CHECK(compile_error(R"({"type":"array","minItems":3,"prefixItems":[{}],"items":false})").find("minItems") !=
          std::string::npos);
}

TEST_CASE("oneOf: compiled only when its branches are provably disjoint, else refused naming the path") {
    // Accepted: different JSON types; a discriminator (a property one branch requires, with
    // different const/enum values in the other, also through $ref); disjoint enums; integer vs
    // string; a branch's required key that the other's additionalProperties:false forbids.
    auto g = compile_ok(R"({"oneOf":[{"type":"string"},{"type":"integer"},{"type":"null"}]})");
    CHECK(accepts(g, "\"x\""));
    CHECK(accepts(g, "3"));
    CHECK(accepts(g, "null"));
    CHECK_FALSE(accepts(g, "true"));
    g = compile_ok(R"({"$defs":{
        "circle":{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number"}},"required":["kind","r"]},
        "square":{"type":"object","properties":{"kind":{"enum":["square","box"]},"side":{"type":"integer"}},"required":["kind"]}},
      "type":"object","properties":{"shape":{"oneOf":[{"$ref":"#/$defs/circle"},{"$ref":"#/$defs/square"}]}},
      "required":["shape"]})");
    CHECK(accepts(g, R"({"shape":{"kind":"circle","r":1.5}})"));
    CHECK(accepts(g, R"({"shape":{"kind":"box"}})"));
    CHECK_FALSE(accepts(g, R"({"shape":{"kind":"circle"}})"));
    CHECK_FALSE(accepts(g, R"({"shape":{"kind":"triangle"}})"));
    g = compile_ok(R"({"oneOf":[{"enum":["a","b",1]},{"enum":["c",2.5]},{"type":"boolean"}]})");
    CHECK(accepts(g, "\"b\""));
    CHECK(accepts(g, "2.5"));
    CHECK(accepts(g, "false"));
    compile_ok(R"({"oneOf":[{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false},
                            {"type":"object","properties":{"b":{"type":"string"}},"required":["b"],"additionalProperties":false}]})");
    compile_ok(R"({"oneOf":[{"type":"array","items":{"type":"string"}},{"type":"object"}]})");
    // Only one branch requires the discriminator: the other never writes another value for it.
    g = compile_ok(R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},"additionalProperties":false},
                                {"type":"object","properties":{"kind":{"const":"b"}},"required":["kind"]}]})");
    CHECK(accepts(g, R"({"x":1})"));
    CHECK(accepts(g, R"({"kind":"b"})"));
    // b requires a key a never writes, and a forbids it.
    compile_ok(R"({"oneOf":[{"type":"object","properties":{"x":{"type":"integer"}},"additionalProperties":false},
                            {"type":"object","properties":{"y":{"type":"integer"}},"required":["y"]}]})");
    compile_ok(R"({"type":"string","nullable":true,"maxLength":3})");
    compile_ok(R"({"oneOf":[{"type":"string"},{"type":"integer"}],"nullable":true})");
    // A nested oneOf inside a discriminated branch.
    compile_ok(R"({"oneOf":[{"type":"object","properties":{"t":{"const":1},"v":{"oneOf":[{"type":"string"},{"type":"boolean"}]}},"required":["t"]},
                            {"type":"object","properties":{"t":{"const":2}},"required":["t"]}]})");

    // Refused: a value may match two branches (ajv would reject it under oneOf).
    struct Case {
        const char* schema;
        const char* error;
    } cases[] = {
        // integer values are numbers
        {R"({"oneOf":[{"type":"number"},{"type":"integer"}]})", "/oneOf: branches 0 and 1 may both match"},
        // same type, nothing tells them apart
        {R"({"type":"object","properties":{"x":{"oneOf":[{"type":"string","maxLength":3},{"type":"string","minLength":2}]}}})",
         "/properties/x/oneOf: branches 0 and 1 may both match a value, which oneOf forbids; use anyOf"},
        // the discriminator is not required: {} matches both branches' schemas
        {R"({"oneOf":[{"type":"object","properties":{"k":{"const":"a"}}},{"type":"object","properties":{"k":{"const":"b"}}}]})",
         "/oneOf: branches 0 and 1 may both match"},
        // {"y":1} validates both: the first branch allows other keys
        {R"({"oneOf":[{"type":"object","properties":{"x":{"type":"integer"}}},
                      {"type":"object","properties":{"y":{"type":"integer"}},"required":["y"]}]})", "may both match"},
        // a is open (additionalProperties true): it may write the key b requires
        {R"({"oneOf":[{"type":"object","properties":{"x":{"type":"integer"}},"additionalProperties":true},
                      {"type":"object","properties":{"y":{"type":"integer"}},"required":["y"]}]})", "may both match"},
        // no "type": a string validates both branches' schemas
        {R"({"oneOf":[{"type":"string"},{"properties":{"k":{"const":"b"}},"required":["k"]}]})",
         "/oneOf: branches 0 and 1 may both match"},
        // overlapping enums (1 and 1.0 are equal in JSON Schema)
        {R"({"oneOf":[{"enum":["a",1]},{"enum":[1.0,"b"]}]})", "/oneOf: branches 0 and 1 may both match"},
        // the third branch overlaps the first
        {R"({"oneOf":[{"type":"string"},{"type":"boolean"},{"type":["string","null"]}]})", "branches 0 and 2 may both match"},
        // an empty schema matches everything
        {R"({"oneOf":[{"type":"string"},{}]})", "branches 0 and 1 may both match"},
        // nullable adds null, which a branch matches too
        {R"({"oneOf":[{"type":"string"},{"type":"null"}],"nullable":true})", "/oneOf: branch 1 may match null"},
        // recursion: not provable within the depth bound
        {R"({"$defs":{"t":{"oneOf":[{"$ref":"#/$defs/t"},{"type":"string"}]}},"$ref":"#/$defs/t"})", "may both match"},
        // unions of unions: the work bound ends the proof quickly
        {R"({"$defs":{"t":{"anyOf":[{"$ref":"#/$defs/t"},{"$ref":"#/$defs/t"},{"$ref":"#/$defs/t"}]}},
            "oneOf":[{"$ref":"#/$defs/t"},{"$ref":"#/$defs/t"}]})", "may both match"},
    };
    for (const Case& c : cases) {
        const std::string error = compile_error(c.schema);
        CHECK_MESSAGE(error.find(c.error) != std::string::npos, c.schema << " → " << error);
        CHECK_MESSAGE(error.rfind("json_schema: ", 0) == 0, error);
    }
    // anyOf keeps accepting overlapping branches.
    g = compile_ok(R"({"anyOf":[{"type":"number"},{"type":"integer"}]})");
    CHECK(accepts(g, "1.5"));
}

namespace {

// Every ordinary token the matcher accepts from `state`, the slow way.
std::vector<uint32_t> brute_mask(const s::Grammar& g, const s::State& state, const gptoss::Tokenizer& tok) {
    std::vector<uint32_t> bits((tok.n_vocab() + 31) / 32, 0);
    s::State a, b;
    for (uint32_t t = 0; t < tok.n_vocab(); ++t) {
        if (tok.is_special(int32_t(t))) continue;
        const std::string_view bytes = tok.token_bytes(int32_t(t));
        if (bytes.empty()) continue;
        a = state;
        bool ok = true;
        for (unsigned char c : bytes) {
            if (!s::step(g, a, c, &b)) { ok = false; break; }
            std::swap(a, b);
        }
        if (ok) bits[t / 32] |= 1u << (t % 32);
    }
    return bits;
}

}  // namespace

TEST_CASE("token masks equal a brute-force check of the whole vocabulary") {
    const gptoss::Tokenizer& tok = real_tokenizer();
    const auto t0 = std::chrono::steady_clock::now();
    auto table = s::TokenTable::get(tok);
    MESSAGE("token table: " << table->trie().size() << " trie nodes, "
                            << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()
                            << " ms");
    struct Case { const char* schema; const char* doc; };
    const Case cases[] = {
        {kWeather, "{\"city\": \"Pa\\\"ri\\u00e9s h\xC3\xA9\", \"unit\":\"celsius\", \"tags\":[\"abc\"]}"},
        {R"({"type":"object"})", R"({"k_1":[1.5e3,{"x":"y"}],"b":true})"},
        {R"({"anyOf":[{"type":"string","maxLength":70},{"type":"integer"},{"enum":["alpha","beta"]}]})", R"("alph")"},
    };
    for (const Case& c : cases) {
        auto g = compile_ok(c.schema);
        s::MaskCache cache(g, table);
        s::Matcher m(g);
        std::vector<uint32_t> bits(table->n_words());
        const std::string doc = c.doc;
        for (size_t i = 0; i <= doc.size(); ++i) {
            cache.mask(m.state(), bits.data());
            const std::vector<uint32_t> expect = brute_mask(*g, m.state(), tok);
            size_t n_allowed = 0;
            for (uint32_t w : expect) n_allowed += size_t(__builtin_popcount(w));
            INFO("schema " << c.schema << " after " << doc.substr(0, i) << ": " << n_allowed << " allowed");
            REQUIRE(bits == expect);
            // The same state again comes from the cache.
            const uint64_t hits = cache.hits();
            std::vector<uint32_t> again(bits.size());
            cache.mask(m.state(), again.data());
            REQUIRE(cache.hits() == hits + 1);
            REQUIRE(again == expect);
            if (i < doc.size()) REQUIRE(m.advance(doc.substr(i, 1)));
        }
        CHECK(m.can_finish());
    }
}

TEST_CASE("random token walks under the mask always end in a valid document") {
    const gptoss::Tokenizer& tok = real_tokenizer();
    auto table = s::TokenTable::get(tok);
    auto g = compile_ok(kWeather);
    s::MaskCache cache(g, table);
    std::vector<uint32_t> bits(table->n_words());
    gptoss::Rng rng(7);
    int finished = 0;
    double mask_ms = 0;
    int steps = 0;
    for (int seed = 0; seed < 20; ++seed) {
        s::Matcher m(g);
        std::string text;
        for (int step = 0; step < 400; ++step) {
            const auto t0 = std::chrono::steady_clock::now();
            cache.mask(m.state(), bits.data());
            mask_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            steps++;
            std::vector<int32_t> allowed;
            for (uint32_t t = 0; t < tok.n_vocab(); ++t)
                if ((bits[t / 32] >> (t % 32)) & 1) allowed.push_back(int32_t(t));
            // Prefer closing when possible half the time, so walks end.
            if (m.can_finish() && rng.next_double() < 0.5) break;
            INFO("text so far: " << text);
            if (allowed.empty()) {  // only the end tokens are left
                REQUIRE(m.can_finish());
                break;
            }
            const int32_t t = allowed[size_t(rng.next_double() * double(allowed.size()))];
            REQUIRE(m.advance(tok.token_bytes(t)));
            text += tok.token_bytes(t);
        }
        if (m.can_finish()) finished++;
        // Re-check the text from scratch: the matcher accepts the prefix it produced.
        s::Matcher check(g);
        CHECK(check.advance(text));
    }
    MESSAGE(finished << "/20 walks finished; mean mask " << mask_ms / steps << " ms over " << steps << " steps");
    CHECK(finished > 0);
}

TEST_CASE("schema compile time is small") {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 100; ++i) compile_ok(kWeather);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 100;
    MESSAGE("compile: " << ms << " ms per schema");
    CHECK(ms < 20);
}

TEST_CASE("fuzz entry point survives malformed input") {
    using namespace std::string_literals;
    const std::string inputs[] = {"{\"type\":\"object\"}\0{\"a\":1}"s, "{\"$ref\":\"#\"}\0[[[["s, "\xff\xfe"s, "{}"s,
                                  "{\"anyOf\":[{\"$ref\":\"#\"}]}\0\"x\""s};
    for (const std::string& in : inputs) s::fuzz_one(reinterpret_cast<const uint8_t*>(in.data()), in.size());
}
