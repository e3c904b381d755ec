// tests/test-loader.cpp - the checkpoint loader (gptoss-loader.cpp) on good and bad input: one
// TEST_CASE per bad input of issue 2's list that concerns loading, each checking the status AND
// that gptoss_last_error() names the file, tensor or field at fault. Every case writes a small
// checkpoint with gptoss-synth (vocab 1024, 2 layers: ~0.6 MB, milliseconds) into its own temp
// directory, then corrupts it byte-exactly through a minimal safetensors editor below. Runs
// under ASan/LSan in `make test`, so a leak or a stray mapping after a failed load fails it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "gptoss-internal.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

std::string env(const char* name) {
    const char* v = std::getenv(name);
    REQUIRE_MESSAGE(v != nullptr, name << " is not set (run through ctest)");
    return v;
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot open " << path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    REQUIRE_MESSAGE(out.good(), "cannot create " << path);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    REQUIRE(out.good());
}

bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

// A small synthetic checkpoint in a fresh temp directory, removed at scope exit.
struct Checkpoint {
    std::string dir;
    explicit Checkpoint(const std::string& extra_args = "") {
        char tmpl[] = "/tmp/gptoss-test-loader-XXXXXX";
        REQUIRE(mkdtemp(tmpl) != nullptr);
        dir = tmpl;
        const std::string cmd = env("GPTOSS_BUILD_DIR") + "/gptoss-synth --preset tiny --seed 3 --vocab 1024 --layers 2 " +
                                extra_args + " --out " + dir + " >/dev/null 2>&1";
        INFO(cmd);
        REQUIRE(std::system(cmd.c_str()) == 0);
    }
    ~Checkpoint() {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
    }
    std::string path(const std::string& name) const { return dir + "/" + name; }
    std::string single() const { return path("model.safetensors"); }
};

// A safetensors file split into its JSON header text and its data region.
struct Safetensors {
    std::string header;
    std::string data;

    static Safetensors read(const std::string& path) {
        const std::string bytes = read_file(path);
        REQUIRE(bytes.size() >= 8);
        uint64_t n = 0;
        for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
        REQUIRE(8 + n <= bytes.size());
        return {bytes.substr(8, n), bytes.substr(8 + n)};
    }
    void write(const std::string& path) const {
        std::string h = header;
        while (h.size() % 8 != 0) h += ' ';
        std::string bytes(8, '\0');
        for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint8_t(uint64_t(h.size()) >> (8 * i)));
        write_file(path, bytes + h + data);
    }
    // Replaces the value of `field` ("dtype", "shape" or "data_offsets") in `tensor`'s entry.
    // gptoss-synth writes compact JSON: "NAME":{"dtype":"BF16","shape":[..],"data_offsets":[a,b]}.
    void set(const std::string& tensor, const std::string& field, const std::string& value) {
        const size_t entry = header.find("\"" + tensor + "\":{");
        REQUIRE_MESSAGE(entry != std::string::npos, tensor << " not in header");
        const size_t key = header.find("\"" + field + "\":", entry);
        REQUIRE(key != std::string::npos);
        const size_t begin = key + field.size() + 3;
        size_t end = begin;
        if (header[begin] == '[') end = header.find(']', begin) + 1;
        else end = header.find('"', begin + 1) + 1;
        header.replace(begin, end - begin, value);
    }
    std::string get(const std::string& tensor, const std::string& field) const {
        const size_t entry = header.find("\"" + tensor + "\":{");
        REQUIRE(entry != std::string::npos);
        const size_t begin = header.find("\"" + field + "\":", entry) + field.size() + 3;
        const size_t end = header[begin] == '[' ? header.find(']', begin) + 1 : header.find('"', begin + 1) + 1;
        return header.substr(begin, end - begin);
    }
    void rename(const std::string& from, const std::string& to) {
        const size_t entry = header.find("\"" + from + "\":{");
        REQUIRE(entry != std::string::npos);
        header.replace(entry, from.size() + 2, "\"" + to + "\"");
    }
    // Appends a tensor at the end of the data region.
    void add(const std::string& name, const std::string& dtype, const std::string& shape, const std::string& bytes) {
        const size_t close = header.rfind('}');
        header.insert(close, ",\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
                                 ",\"data_offsets\":[" + std::to_string(data.size()) + "," +
                                 std::to_string(data.size() + bytes.size()) + "]}");
        data += bytes;
    }
};

// gptoss_load on the CPU; returns the status and leaves the message in *error.
gptoss_status load(const std::string& dir, std::string* error) {
    gptoss_model_params params = gptoss_model_default_params();
    params.device = GPTOSS_DEVICE_CPU;
    gptoss_model* model = reinterpret_cast<gptoss_model*>(uintptr_t(1));  // must become NULL on failure
    const gptoss_status status = gptoss_load(dir.c_str(), &params, &model);
    *error = gptoss_last_error();
    if (status == GPTOSS_OK) {
        CHECK(model != nullptr);
        gptoss_model_free(model);
    } else {
        CHECK(model == nullptr);
    }
    return status;
}

// Expects gptoss_load to fail with `status` and a message containing every one of `needles`.
void expect_failure(const std::string& dir, gptoss_status status, std::vector<std::string> needles) {
    std::string error;
    const gptoss_status got = load(dir, &error);
    INFO("last_error: " << error);
    CHECK(got == status);
    for (const std::string& needle : needles) {
        INFO("expected the message to name: " << needle);
        CHECK(contains(error, needle));
    }
}

// Rewrites config.json with `from` replaced by `to` (exactly one occurrence must exist).
void edit_config(const Checkpoint& c, const std::string& from, const std::string& to) {
    std::string text = read_file(c.path("config.json"));
    const size_t at = text.find(from);
    REQUIRE_MESSAGE(at != std::string::npos, from << " not in config.json");
    text.replace(at, from.size(), to);
    write_file(c.path("config.json"), text);
}

// Lines of /proc/self/maps that map a file under `dir`.
size_t mappings_under(const std::string& dir) {
    std::ifstream maps("/proc/self/maps");
    size_t n = 0;
    for (std::string line; std::getline(maps, line);)
        if (contains(line, dir)) ++n;
    return n;
}

const char* kLayerNorm0 = "model.layers.0.input_layernorm.weight";
const char* kPostNorm0 = "model.layers.0.post_attention_layernorm.weight";
const char* kRouter1 = "model.layers.1.mlp.router.weight";

}  // namespace

// ---------------------------------------------------------------------------
// Good input

TEST_CASE("load_config reads every field of a gpt-oss config.json") {
    Checkpoint c("--single-file");
    gptoss::Config config;
    REQUIRE(gptoss::load_config(c.dir, &config) == GPTOSS_OK);
    CHECK(config.n_layers == 2);
    CHECK(config.n_experts == 8);
    CHECK(config.n_experts_per_token == 4);
    CHECK(config.hidden == 64);
    CHECK(config.intermediate == 64);
    CHECK(config.n_heads == 4);
    CHECK(config.n_kv_heads == 2);
    CHECK(config.head_dim == 64);
    CHECK(config.vocab == 1024);
    CHECK(config.sliding_window == 128);
    CHECK(config.max_context == 131072);
    CHECK(config.rms_norm_eps == 1e-5f);
    CHECK(config.rope_theta == 150000.0f);
    CHECK(config.rope_factor == 32.0f);
    CHECK(config.rope_beta_fast == 32.0f);
    CHECK(config.rope_beta_slow == 1.0f);
    CHECK(config.rope_original_max_context == 4096);
    CHECK(config.rope_truncate == false);
    CHECK(config.swiglu_limit == 7.0f);
    CHECK(config.layer_sliding == std::vector<bool>{true, false});
}

TEST_CASE("eos ids come from config.json and generation_config.json, without duplicates") {
    Checkpoint c("--single-file --vocab 201088 --hidden 32 --intermediate 32");
    gptoss::Config config;
    REQUIRE(gptoss::load_config(c.dir, &config) == GPTOSS_OK);
    CHECK(config.eos_token_ids == std::vector<int32_t>{200002, 199999, 200012});
    std::filesystem::remove(c.path("generation_config.json"));
    REQUIRE(gptoss::load_config(c.dir, &config) == GPTOSS_OK);
    CHECK(config.eos_token_ids == std::vector<int32_t>{200002});
}

TEST_CASE("a sharded checkpoint and a single file load the same tensors, pointing into the mapping") {
    Checkpoint sharded("--shard-bytes 200000");
    Checkpoint single("--single-file");
    std::vector<std::string> shards;
    for (const auto& e : std::filesystem::directory_iterator(sharded.dir))
        if (e.path().extension() == ".safetensors") shards.push_back(e.path().filename());
    REQUIRE(shards.size() >= 3);  // really sharded
    std::unique_ptr<gptoss::Checkpoint> a, b;
    std::vector<float> calls;
    REQUIRE(gptoss::load_checkpoint(sharded.dir, [&](float f) { calls.push_back(f); return true; }, &a) == GPTOSS_OK);
    CHECK(calls.size() >= shards.size() + 2);  // at least once per shard and once per layer
    CHECK(std::is_sorted(calls.begin(), calls.end()));
    CHECK(calls.back() == 1.0f);
    REQUIRE(gptoss::load_checkpoint(single.dir, {}, &b) == GPTOSS_OK);
    CHECK(a->files.size() == shards.size());
    CHECK(b->files.size() == 1);
    CHECK(a->total_bytes == b->total_bytes);
    const gptoss::Tensor& ta = a->weights.layers[1].down_blocks;
    const gptoss::Tensor& tb = b->weights.layers[1].down_blocks;
    REQUIRE(ta.n_bytes == tb.n_bytes);
    CHECK(std::memcmp(ta.data, tb.data, ta.n_bytes) == 0);
    CHECK(std::memcmp(a->weights.lm_head.data, b->weights.lm_head.data, b->weights.lm_head.n_bytes) == 0);
    // No copies: the tensors point into the mapping of model.safetensors.
    const uintptr_t lm_head = reinterpret_cast<uintptr_t>(b->weights.lm_head.data);
    bool inside = false;
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) {
        if (!contains(line, single.single())) continue;
        const uintptr_t start = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
        const uintptr_t end = std::stoull(line.substr(line.find('-') + 1), nullptr, 16);
        inside |= lm_head >= start && lm_head + b->weights.lm_head.n_bytes <= end;
    }
    CHECK(inside);
    CHECK(mappings_under(single.dir) == 1);
}

TEST_CASE("sinks may be stored as F32") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    const std::string name = "model.layers.0.self_attn.sinks";
    st.rename(name, "unused.sinks");  // its BF16 bytes stay (and warn as an extra tensor)
    st.add(name, "F32", "[4]", std::string("\0\0\x80\x3f\0\0\0\x40\0\0\0\0\0\0\x80\xbf", 16));  // 1, 2, 0, -1
    st.write(c.single());
    std::unique_ptr<gptoss::Checkpoint> ckpt;
    INFO(gptoss_last_error());
    REQUIRE(gptoss::load_checkpoint(c.dir, {}, &ckpt) == GPTOSS_OK);
    const gptoss::Tensor& sinks = ckpt->weights.layers[0].sinks;
    CHECK(sinks.dtype == gptoss::DType::F32);
    CHECK(static_cast<const float*>(sinks.data)[3] == -1.0f);
}

// ---------------------------------------------------------------------------
// Bad input: directory and config.json

TEST_CASE("missing directory is IO naming the directory") {
    expect_failure("/nonexistent/gptoss-model", GPTOSS_ERR_IO, {"/nonexistent/gptoss-model"});
}

TEST_CASE("missing config.json is IO naming config.json") {
    Checkpoint c;
    std::filesystem::remove(c.path("config.json"));
    expect_failure(c.dir, GPTOSS_ERR_IO, {c.path("config.json")});
}

TEST_CASE("config.json that is not JSON is FORMAT naming config.json") {
    Checkpoint c;
    write_file(c.path("config.json"), "{\"num_hidden_layers\": 2,,}");
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.path("config.json"), "not valid JSON"});
}

TEST_CASE("config.json with a missing field is FORMAT naming the field") {
    Checkpoint c;
    edit_config(c, "\"num_local_experts\"", "\"num_local_experts_renamed\"");
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {"config.json", "num_local_experts", "missing"});
}

TEST_CASE("config.json with heads not divisible by kv heads is FORMAT") {
    Checkpoint c;
    edit_config(c, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {"config.json", "num_attention_heads", "num_key_value_heads"});
}

TEST_CASE("config.json with hidden_size not a multiple of 32 is FORMAT") {
    Checkpoint c;
    edit_config(c, "\"hidden_size\": 64", "\"hidden_size\": 48");
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {"config.json", "hidden_size", "48", "multiple of 32"});
}

TEST_CASE("config.json with intermediate_size not a multiple of 32 is FORMAT") {
    Checkpoint c;
    edit_config(c, "\"intermediate_size\": 64", "\"intermediate_size\": 80");
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {"config.json", "intermediate_size", "80", "multiple of 32"});
}

TEST_CASE("config.json with an odd head_dim is FORMAT") {
    Checkpoint c;
    edit_config(c, "\"head_dim\": 64", "\"head_dim\": 63");
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {"config.json", "head_dim", "63"});
}

TEST_CASE("config.json with an unknown layer type is FORMAT naming the entry") {
    Checkpoint c;
    edit_config(c, "\"full_attention\"", "\"local_attention\"");
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {"config.json", "layer_types[1]", "local_attention"});
}

TEST_CASE("config.json with layer_types not matching num_hidden_layers is FORMAT") {
    Checkpoint c;
    edit_config(c, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {"config.json", "layer_types", "num_hidden_layers"});
}

TEST_CASE("config.json with a non-yarn rope_scaling is FORMAT naming rope_type") {
    Checkpoint c;
    edit_config(c, "\"rope_type\": \"yarn\"", "\"rope_type\": \"dynamic\"");
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {"config.json", "rope_type", "dynamic"});
}

// ---------------------------------------------------------------------------
// Bad input: shards and the index

TEST_CASE("no weights at all is IO naming the directory") {
    Checkpoint c("--single-file");
    std::filesystem::remove(c.single());
    expect_failure(c.dir, GPTOSS_ERR_IO, {c.dir, "model.safetensors"});
}

TEST_CASE("a shard named by the index but missing is IO naming the shard") {
    Checkpoint c("--shard-bytes 200000");
    const std::string shard = "model-00002-of-00003.safetensors";
    REQUIRE(std::filesystem::exists(c.path(shard)));
    std::filesystem::remove(c.path(shard));
    expect_failure(c.dir, GPTOSS_ERR_IO, {shard, "model.safetensors.index.json"});
}

TEST_CASE("a tensor listed in the index but absent from its shard is FORMAT naming both") {
    Checkpoint c("--shard-bytes 200000");
    std::string index = read_file(c.path("model.safetensors.index.json"));
    const std::string entry = "\"lm_head.weight\": \"";
    const size_t at = index.find(entry);
    REQUIRE(at != std::string::npos);
    index.insert(at, "\"model.layers.0.mlp.bogus\": \"model-00001-of-00003.safetensors\",\n    ");
    write_file(c.path("model.safetensors.index.json"), index);
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {"model.layers.0.mlp.bogus", "model-00001-of-00003.safetensors"});
}

TEST_CASE("a tensor the index places in another shard is FORMAT naming both shards") {
    Checkpoint c("--shard-bytes 200000");
    std::string index = read_file(c.path("model.safetensors.index.json"));
    const std::string entry = "\"lm_head.weight\": \"model-00003-of-00003.safetensors\"";
    const size_t at = index.find(entry);
    REQUIRE(at != std::string::npos);
    index.replace(at, entry.size(), "\"lm_head.weight\": \"model-00001-of-00003.safetensors\"");
    write_file(c.path("model.safetensors.index.json"), index);
    expect_failure(c.dir, GPTOSS_ERR_FORMAT,
                   {"lm_head.weight", "model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"});
}

TEST_CASE("a tensor in two shards is FORMAT naming it") {
    Checkpoint c("--shard-bytes 200000");
    Safetensors first = Safetensors::read(c.path("model-00001-of-00003.safetensors"));
    first.add("lm_head.weight", "U8", "[2]", std::string(2, '\0'));
    first.write(c.path("model-00001-of-00003.safetensors"));
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {"lm_head.weight", "appears again"});
}

// ---------------------------------------------------------------------------
// Bad input: safetensors files

TEST_CASE("a file shorter than the 8-byte header length is FORMAT naming the file") {
    Checkpoint c("--single-file");
    write_file(c.single(), "\x10\0\0");
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.single(), "truncated"});
}

TEST_CASE("a truncated safetensors file is FORMAT naming the file and a tensor past the end") {
    Checkpoint c("--single-file");
    const std::string bytes = read_file(c.single());
    write_file(c.single(), bytes.substr(0, bytes.size() - 1000));
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.single(), "data_offsets", "outside the data region"});
}

TEST_CASE("a header length beyond the file is FORMAT naming the file and the length") {
    Checkpoint c("--single-file");
    std::string bytes = read_file(c.single());
    const uint64_t too_long = bytes.size();
    for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint8_t(too_long >> (8 * i)));
    write_file(c.single(), bytes);
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.single(), "header length " + std::to_string(too_long)});
}

TEST_CASE("a header that is not JSON is FORMAT naming the file") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    st.header[st.header.find("\"dtype\"") + 3] = '\x01';  // a control character inside a string
    st.write(c.single());
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.single(), "not valid JSON"});
}

TEST_CASE("an unknown dtype is FORMAT naming the tensor and the dtype") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    st.set(kLayerNorm0, "dtype", "\"F16\"");
    st.write(c.single());
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.single(), kLayerNorm0, "F16"});
}

TEST_CASE("a wrong dtype is FORMAT naming the tensor, expected and found") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    st.set(kLayerNorm0, "dtype", "\"U8\"");
    st.set(kLayerNorm0, "shape", "[128]");  // same bytes, so only the dtype is wrong
    st.write(c.single());
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.single(), kLayerNorm0, "U8", "expected BF16"});
}

TEST_CASE("a wrong shape is FORMAT naming the file, tensor, found and expected shapes") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    REQUIRE(st.get(kRouter1, "shape") == "[8,64]");
    st.set(kRouter1, "shape", "[4,128]");  // same number of bytes
    st.write(c.single());
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.single(), kRouter1, "[4, 128]", "[8, 64]"});
}

TEST_CASE("a shape that disagrees with the byte span is FORMAT naming the tensor") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    st.set(kLayerNorm0, "shape", "[65]");
    st.write(c.single());
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.single(), kLayerNorm0, "[65]"});
}

TEST_CASE("data offsets outside the file are FORMAT naming the tensor") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    const size_t end = st.data.size();
    st.set(kLayerNorm0, "data_offsets", "[" + std::to_string(end) + "," + std::to_string(end + 128) + "]");
    st.write(c.single());
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.single(), kLayerNorm0, std::to_string(end + 128)});
}

TEST_CASE("overlapping data offsets are FORMAT naming both tensors") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    st.set(kPostNorm0, "data_offsets", st.get(kLayerNorm0, "data_offsets"));  // both [H] bf16
    st.write(c.single());
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.single(), kLayerNorm0, kPostNorm0, "overlap"});
}

TEST_CASE("data bytes that belong to no tensor are FORMAT naming the byte range") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    st.data += std::string(64, '\0');
    st.write(c.single());
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.single(), "belong to no tensor", std::to_string(st.data.size())});
}

TEST_CASE("misaligned bf16 data is FORMAT naming the file offset") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    // Prepend a 1-byte U8 tensor and shift every other tensor by one byte: the tiling stays
    // exact, but every BF16 tensor now starts at an odd file offset.
    std::string header = st.header;
    for (size_t pos = header.find("\"data_offsets\":["); pos != std::string::npos;) {
        const size_t begin = pos + 16, comma = header.find(',', begin), close = header.find(']', comma);
        const uint64_t from = std::stoull(header.substr(begin, comma - begin)) + 1;
        const uint64_t to = std::stoull(header.substr(comma + 1, close - comma - 1)) + 1;
        const std::string value = std::to_string(from) + "," + std::to_string(to);
        header.replace(begin, close - begin, value);
        pos = header.find("\"data_offsets\":[", begin + value.size());
    }
    st.header = "{\"pad\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}," + header.substr(1);
    st.data = std::string(1, '\0') + st.data;
    st.write(c.single());
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {c.single(), "not aligned"});
}

TEST_CASE("a missing tensor is FORMAT naming the tensor") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    st.rename("model.norm.weight", "model.norm.weight_renamed");
    st.write(c.single());
    expect_failure(c.dir, GPTOSS_ERR_FORMAT, {"model.norm.weight", "missing"});
}

TEST_CASE("a checkpoint with dequantized bf16 experts is UNSUPPORTED, saying so") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    st.rename("model.layers.0.mlp.experts.gate_up_proj_blocks", "model.layers.0.mlp.experts.gate_up_proj");
    st.write(c.single());
    expect_failure(c.dir, GPTOSS_ERR_UNSUPPORTED, {"model.layers.0.mlp.experts.gate_up_proj", "MXFP4"});
}

namespace {
std::vector<std::string> g_warnings;
void collect(void*, gptoss_log_level level, const char* message) {
    if (level == GPTOSS_LOG_WARN) g_warnings.emplace_back(message);
}
}  // namespace

TEST_CASE("an extra unexpected tensor is a warning naming it, and the model loads") {
    Checkpoint c("--single-file");
    Safetensors st = Safetensors::read(c.single());
    st.add("model.layers.0.mlp.experts.extra_scale", "BF16", "[2]", std::string(4, '\0'));
    st.write(c.single());
    g_warnings.clear();
    gptoss_set_log_callback(collect, nullptr, GPTOSS_LOG_WARN);
    std::string error;
    const gptoss_status status = load(c.dir, &error);
    gptoss_set_log_callback(nullptr, nullptr, GPTOSS_LOG_WARN);
    INFO(error);
    CHECK(status == GPTOSS_OK);
    bool named = false;
    for (const std::string& w : g_warnings) named |= contains(w, "model.layers.0.mlp.experts.extra_scale");
    CHECK(named);
}

// ---------------------------------------------------------------------------
// The public entry point and cleanup

TEST_CASE("gptoss_load with NULL arguments is INVALID_ARGUMENT naming the argument") {
    Checkpoint c("--single-file");
    gptoss_model* model = reinterpret_cast<gptoss_model*>(uintptr_t(1));
    CHECK(gptoss_load(nullptr, nullptr, &model) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(contains(gptoss_last_error(), "model_dir"));
    CHECK(model == nullptr);
    CHECK(gptoss_load(c.dir.c_str(), nullptr, nullptr) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(contains(gptoss_last_error(), "model_out"));
}

TEST_CASE("gptoss_model_params with a larger struct_size and a non-zero tail is UNSUPPORTED") {
    Checkpoint c("--single-file");
    struct Bigger {
        gptoss_model_params params;
        uint64_t future_field;
    } bigger;
    gptoss_model_params_init(&bigger.params, sizeof bigger);
    CHECK(bigger.future_field == 0);  // init zeroes the part it does not know
    bigger.params.device = GPTOSS_DEVICE_CPU;
    gptoss_model* model = nullptr;
    // A zero tail is fine...
    REQUIRE(gptoss_load(c.dir.c_str(), &bigger.params, &model) == GPTOSS_OK);
    gptoss_model_free(model);
    // ...a non-zero one is a field this library does not know.
    bigger.future_field = 1;
    model = reinterpret_cast<gptoss_model*>(uintptr_t(1));
    CHECK(gptoss_load(c.dir.c_str(), &bigger.params, &model) == GPTOSS_ERR_UNSUPPORTED);
    CHECK(model == nullptr);
    CHECK(contains(gptoss_last_error(), "struct_size") + contains(gptoss_last_error(), "byte") > 0);
}

TEST_CASE("a progress callback returning false cancels the load") {
    Checkpoint c("--shard-bytes 200000");
    std::unique_ptr<gptoss::Checkpoint> ckpt;
    int calls = 0;
    CHECK(gptoss::load_checkpoint(c.dir, [&](float) { return ++calls < 2; }, &ckpt) == GPTOSS_ERR_CANCELLED);
    CHECK(calls == 2);
    CHECK(ckpt == nullptr);
    CHECK(contains(gptoss_last_error(), "cancelled"));
    CHECK(mappings_under(c.dir) == 0);
}

TEST_CASE("a failed load leaves no file mapped") {
    Checkpoint c("--shard-bytes 200000");
    // The last shard is bad, so the first ones were mapped before the failure.
    Safetensors last = Safetensors::read(c.path("model-00003-of-00003.safetensors"));
    last.set("lm_head.weight", "dtype", "\"I64\"");
    last.write(c.path("model-00003-of-00003.safetensors"));
    std::unique_ptr<gptoss::Checkpoint> ckpt;
    CHECK(gptoss::load_checkpoint(c.dir, {}, &ckpt) == GPTOSS_ERR_FORMAT);
    CHECK(contains(gptoss_last_error(), "I64"));
    CHECK(ckpt == nullptr);
    CHECK(mappings_under(c.dir) == 0);
    // And a good load maps every shard, which the check above would have seen.
    Checkpoint good("--shard-bytes 200000");
    REQUIRE(gptoss::load_checkpoint(good.dir, {}, &ckpt) == GPTOSS_OK);
    CHECK(mappings_under(good.dir) == 3);
}
