// gptoss-loader.cpp - config.json and safetensors checkpoints in Hugging Face layout, our own
// reader (no safetensors library). Implements load_config and load_checkpoint of
// gptoss-internal.h; layout and tensor table: ../shared/MODEL.md §Checkpoint layout.
// Invariants: every tensor the engine uses was checked for dtype, shape (against config.json),
// alignment and bounds; the data regions of every shard are covered exactly once; weights are
// never copied (Tensor::data points into a read-only private mapping that the Checkpoint owns);
// a failed load unmaps and frees everything before it returns.
#include "gptoss-internal.h"

#include <simdjson.h>  // defines: simdjson::dom::parser, element, padded_string

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace gptoss {

// ---------------------------------------------------------------------------
// Files

// A whole file mapped read-only. Closing the descriptor right after mmap is fine: the mapping
// keeps the file alive.
struct MappedFile {
    std::string path;   // as opened, for messages
    std::string name;   // file name alone
    const uint8_t* data = nullptr;
    size_t size = 0;
    bool mapped = false;  // false: a view of memory someone else owns (check_safetensors_shard)
    MappedFile() = default;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    ~MappedFile() {
        if (mapped && data != nullptr && size > 0) munmap(const_cast<uint8_t*>(data), size);
    }
};

Checkpoint::Checkpoint() = default;
Checkpoint::~Checkpoint() = default;

namespace {

std::string join_path(const std::string& dir, const std::string& name) {
    if (dir.empty() || dir.back() == '/') return dir + name;
    return dir + "/" + name;
}

std::string base_name(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool file_exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

gptoss_status map_file(const std::string& path, std::unique_ptr<MappedFile>* out) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(GPTOSS_ERR_IO, "%s: cannot open: %s", path.c_str(), strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(GPTOSS_ERR_IO, "%s: not a regular file", path.c_str());
    }
    auto file = std::make_unique<MappedFile>();
    file->path = path;
    file->name = base_name(path);
    file->size = size_t(st.st_size);
    if (file->size > 0) {
        void* p = mmap(nullptr, file->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            close(fd);
            return fail(err == ENOMEM ? GPTOSS_ERR_OUT_OF_MEMORY : GPTOSS_ERR_IO,
                        "%s: mmap of %zu bytes failed: %s", path.c_str(), file->size, strerror(err));
        }
        file->data = static_cast<const uint8_t*>(p);
        file->mapped = true;
    }
    close(fd);
    *out = std::move(file);
    return GPTOSS_OK;
}

// Reads a small JSON file (config, index) whole.
gptoss_status read_json_file(const std::string& path, simdjson::padded_string* text) {
    if (simdjson::padded_string::load(path).get(*text) != simdjson::SUCCESS) {
        if (!file_exists(path)) return fail(GPTOSS_ERR_IO, "%s: file not found", path.c_str());
        return fail(GPTOSS_ERR_IO, "%s: cannot read", path.c_str());
    }
    return GPTOSS_OK;
}

// Parses JSON text into `parser`'s document (`path` names it in messages).
gptoss_status parse_json_text(const std::string& path, const simdjson::padded_string& text,
                              simdjson::dom::parser* parser, simdjson::dom::element* root) {
    const auto error = parser->parse(text).get(*root);
    if (error != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_FORMAT, "%s: not valid JSON: %s", path.c_str(),
                    simdjson::error_message(error));
    return GPTOSS_OK;
}

gptoss_status parse_json_file(const std::string& path, simdjson::dom::parser* parser,
                              simdjson::dom::element* root) {
    simdjson::padded_string text;
    GPTOSS_TRY(read_json_file(path, &text));
    return parse_json_text(path, text, parser, root);
}

// ---------------------------------------------------------------------------
// config.json

// Reads a required non-negative integer field that fits in uint32_t. Accepts 32.0 (an integral
// double), which some exporters write.
gptoss_status get_u32(const std::string& path, simdjson::dom::object obj, const char* field,
                      bool required, uint32_t* out) {
    simdjson::dom::element value;
    if (obj.at_key(field).get(value) != simdjson::SUCCESS || value.is_null()) {
        if (!required) return GPTOSS_OK;
        return fail(GPTOSS_ERR_FORMAT, "%s: field %s is missing", path.c_str(), field);
    }
    uint64_t u = 0;
    double d = 0;
    if (value.get_uint64().get(u) == simdjson::SUCCESS) {
    } else if (value.get_double().get(d) == simdjson::SUCCESS && d >= 0 && d == std::floor(d) &&
               d <= 4294967295.0) {
        u = uint64_t(d);
    } else {
        return fail(GPTOSS_ERR_FORMAT, "%s: field %s must be a non-negative integer", path.c_str(),
                    field);
    }
    if (u > UINT32_MAX)
        return fail(GPTOSS_ERR_FORMAT, "%s: field %s is %" PRIu64 ", expected at most %u",
                    path.c_str(), field, u, UINT32_MAX);
    *out = uint32_t(u);
    return GPTOSS_OK;
}

gptoss_status get_float(const std::string& path, simdjson::dom::object obj, const char* field,
                        float* out) {
    simdjson::dom::element value;
    if (obj.at_key(field).get(value) != simdjson::SUCCESS || value.is_null()) return GPTOSS_OK;
    double d = 0;
    if (value.get_double().get(d) != simdjson::SUCCESS || !std::isfinite(d))
        return fail(GPTOSS_ERR_FORMAT, "%s: field %s must be a finite number", path.c_str(), field);
    *out = float(d);
    return GPTOSS_OK;
}

gptoss_status get_bool(const std::string& path, simdjson::dom::object obj, const char* field,
                       bool* out) {
    simdjson::dom::element value;
    if (obj.at_key(field).get(value) != simdjson::SUCCESS || value.is_null()) return GPTOSS_OK;
    if (value.get_bool().get(*out) != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_FORMAT, "%s: field %s must be true or false", path.c_str(), field);
    return GPTOSS_OK;
}

// eos_token_id is an integer or an array of integers; appends the ids not yet present.
gptoss_status read_eos(const std::string& path, simdjson::dom::object obj,
                       std::vector<int32_t>* ids) {
    simdjson::dom::element value;
    if (obj.at_key("eos_token_id").get(value) != simdjson::SUCCESS || value.is_null())
        return GPTOSS_OK;
    std::vector<simdjson::dom::element> items;
    simdjson::dom::array array;
    if (value.get_array().get(array) == simdjson::SUCCESS) {
        for (simdjson::dom::element item : array) items.push_back(item);
    } else {
        items.push_back(value);
    }
    for (simdjson::dom::element item : items) {
        int64_t id = 0;
        if (item.get_int64().get(id) != simdjson::SUCCESS || id < 0 || id > INT32_MAX)
            return fail(GPTOSS_ERR_FORMAT, "%s: field eos_token_id must hold non-negative integers",
                        path.c_str());
        if (std::find(ids->begin(), ids->end(), int32_t(id)) == ids->end())
            ids->push_back(int32_t(id));
    }
    return GPTOSS_OK;
}

gptoss_status parse_rope(const std::string& path, simdjson::dom::object rope, Config* c) {
    std::string_view type;
    simdjson::dom::element value;
    if (rope.at_key("rope_type").get(value) == simdjson::SUCCESS ||
        rope.at_key("type").get(value) == simdjson::SUCCESS) {
        if (value.get_string().get(type) != simdjson::SUCCESS)
            return fail(GPTOSS_ERR_FORMAT, "%s: field rope_scaling.rope_type must be a string",
                        path.c_str());
    }
    if (type == "default") return get_float(path, rope, "rope_theta", &c->rope_theta);
    if (type != "yarn")
        return fail(GPTOSS_ERR_FORMAT, "%s: field rope_scaling.rope_type is \"%.*s\", expected \"yarn\"",
                    path.c_str(), int(type.size()), type.data());
    GPTOSS_TRY(get_float(path, rope, "rope_theta", &c->rope_theta));  // transformers 5 keeps it here
    GPTOSS_TRY(get_float(path, rope, "factor", &c->rope_factor));
    GPTOSS_TRY(get_float(path, rope, "beta_fast", &c->rope_beta_fast));
    GPTOSS_TRY(get_float(path, rope, "beta_slow", &c->rope_beta_slow));
    GPTOSS_TRY(get_u32(path, rope, "original_max_position_embeddings", false,
                       &c->rope_original_max_context));
    GPTOSS_TRY(get_bool(path, rope, "truncate", &c->rope_truncate));
    if (!(c->rope_factor >= 1.0f))
        return fail(GPTOSS_ERR_FORMAT, "%s: field rope_scaling.factor is %g, expected >= 1",
                    path.c_str(), double(c->rope_factor));
    if (c->rope_original_max_context == 0)
        return fail(GPTOSS_ERR_FORMAT,
                    "%s: field rope_scaling.original_max_position_embeddings is 0, expected > 0",
                    path.c_str());
    return GPTOSS_OK;
}

// The most layers a config may declare: gpt-oss has 24 (20b) and 36 (120b). The bound comes
// before anything sized by the layer count (the default layer_types, the per-layer tensor
// lists): a config that claimed 2e9 layers looped for minutes (fuzz-config).
constexpr uint32_t kMaxLayers = 1024;

gptoss_status check_config(const std::string& path, const Config& c) {
    const struct { const char* field; uint32_t value; } positive[] = {
        {"num_hidden_layers", c.n_layers},     {"num_local_experts", c.n_experts},
        {"num_experts_per_tok", c.n_experts_per_token},
        {"hidden_size", c.hidden},             {"intermediate_size", c.intermediate},
        {"num_attention_heads", c.n_heads},    {"num_key_value_heads", c.n_kv_heads},
        {"head_dim", c.head_dim},              {"vocab_size", c.vocab},
        {"sliding_window", c.sliding_window},  {"max_position_embeddings", c.max_context},
    };
    for (const auto& p : positive)
        if (p.value == 0) return fail(GPTOSS_ERR_FORMAT, "%s: field %s is 0, expected > 0", path.c_str(), p.field);
    if (c.n_layers > kMaxLayers)
        return fail(GPTOSS_ERR_FORMAT, "%s: field num_hidden_layers is %u, expected at most %u", path.c_str(),
                    c.n_layers, kMaxLayers);
    if (c.hidden % 32 != 0)
        return fail(GPTOSS_ERR_FORMAT, "%s: field hidden_size is %u, expected a multiple of 32 (MXFP4 blocks)",
                    path.c_str(), c.hidden);
    if (c.intermediate % 32 != 0)
        return fail(GPTOSS_ERR_FORMAT,
                    "%s: field intermediate_size is %u, expected a multiple of 32 (MXFP4 blocks)",
                    path.c_str(), c.intermediate);
    if (c.n_heads % c.n_kv_heads != 0)
        return fail(GPTOSS_ERR_FORMAT,
                    "%s: field num_attention_heads is %u, expected a multiple of num_key_value_heads (%u)",
                    path.c_str(), c.n_heads, c.n_kv_heads);
    if (c.head_dim % 2 != 0)
        return fail(GPTOSS_ERR_FORMAT, "%s: field head_dim is %u, expected an even number (RoPE pairs)",
                    path.c_str(), c.head_dim);
    if (c.n_experts_per_token > c.n_experts)
        return fail(GPTOSS_ERR_FORMAT,
                    "%s: field num_experts_per_tok is %u, expected at most num_local_experts (%u)",
                    path.c_str(), c.n_experts_per_token, c.n_experts);
    if (c.vocab > uint32_t(INT32_MAX))
        return fail(GPTOSS_ERR_FORMAT, "%s: field vocab_size is %u, expected at most %d", path.c_str(),
                    c.vocab, INT32_MAX);
    if (!(c.rms_norm_eps > 0.0f))
        return fail(GPTOSS_ERR_FORMAT, "%s: field rms_norm_eps is %g, expected > 0", path.c_str(),
                    double(c.rms_norm_eps));
    if (!(c.rope_theta > 1.0f))
        return fail(GPTOSS_ERR_FORMAT, "%s: field rope_theta is %g, expected > 1", path.c_str(),
                    double(c.rope_theta));
    if (!(c.swiglu_limit > 0.0f))
        return fail(GPTOSS_ERR_FORMAT, "%s: field swiglu_limit is %g, expected > 0", path.c_str(),
                    double(c.swiglu_limit));
    return GPTOSS_OK;
}

// rope_scaling (transformers 4) or rope_parameters (transformers 5); absent means plain RoPE.
gptoss_status parse_rope_field(const std::string& path, simdjson::dom::object obj, Config* c) {
    simdjson::dom::element rope;
    const char* rope_field = "rope_scaling";
    bool have_rope = obj.at_key(rope_field).get(rope) == simdjson::SUCCESS && !rope.is_null();
    if (!have_rope) {
        rope_field = "rope_parameters";
        have_rope = obj.at_key(rope_field).get(rope) == simdjson::SUCCESS && !rope.is_null();
    }
    if (!have_rope) return GPTOSS_OK;
    simdjson::dom::object rope_obj;
    if (rope.get_object().get(rope_obj) != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_FORMAT, "%s: field %s must be an object", path.c_str(), rope_field);
    return parse_rope(path, rope_obj, c);
}

// layer_types into c->layer_sliding; transformers' default alternates sliding (even layers)
// and full (odd layers).
gptoss_status parse_layer_types(const std::string& path, simdjson::dom::object obj, Config* c) {
    simdjson::dom::element types;
    if (obj.at_key("layer_types").get(types) != simdjson::SUCCESS || types.is_null()) {
        for (uint32_t l = 0; l < c->n_layers; ++l) c->layer_sliding.push_back(l % 2 == 0);
        return GPTOSS_OK;
    }
    simdjson::dom::array array;
    if (types.get_array().get(array) != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_FORMAT, "%s: field layer_types must be an array of strings", path.c_str());
    size_t i = 0;
    for (simdjson::dom::element item : array) {
        std::string_view type;
        if (item.get_string().get(type) != simdjson::SUCCESS)
            return fail(GPTOSS_ERR_FORMAT, "%s: field layer_types[%zu] must be a string", path.c_str(), i);
        if (type == "sliding_attention") {
            c->layer_sliding.push_back(true);
        } else if (type == "full_attention") {
            c->layer_sliding.push_back(false);
        } else {
            return fail(GPTOSS_ERR_FORMAT,
                        "%s: field layer_types[%zu] is \"%.*s\", expected \"sliding_attention\" or \"full_attention\"",
                        path.c_str(), i, int(type.size()), type.data());
        }
        ++i;
    }
    if (c->layer_sliding.size() != c->n_layers)
        return fail(GPTOSS_ERR_FORMAT, "%s: field layer_types has %zu entries, expected num_hidden_layers (%u)",
                    path.c_str(), c->layer_sliding.size(), c->n_layers);
    return GPTOSS_OK;
}

}  // namespace

gptoss_status parse_config_json(const std::string& path, const char* json, size_t len, Config* out) {
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    GPTOSS_TRY(parse_json_text(path, simdjson::padded_string(json, len), &parser, &root));
    simdjson::dom::object obj;
    if (root.get_object().get(obj) != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_FORMAT, "%s: expected a JSON object at the top level", path.c_str());

    Config c;
    GPTOSS_TRY(get_u32(path, obj, "num_hidden_layers", true, &c.n_layers));
    GPTOSS_TRY(get_u32(path, obj, "num_local_experts", true, &c.n_experts));
    // OpenAI's original config calls it experts_per_token; Hugging Face num_experts_per_tok.
    if (obj.at_key("num_experts_per_tok").error() == simdjson::SUCCESS ||
        obj.at_key("experts_per_token").error() != simdjson::SUCCESS) {
        GPTOSS_TRY(get_u32(path, obj, "num_experts_per_tok", true, &c.n_experts_per_token));
    } else {
        GPTOSS_TRY(get_u32(path, obj, "experts_per_token", true, &c.n_experts_per_token));
    }
    GPTOSS_TRY(get_u32(path, obj, "hidden_size", true, &c.hidden));
    GPTOSS_TRY(get_u32(path, obj, "intermediate_size", true, &c.intermediate));
    GPTOSS_TRY(get_u32(path, obj, "num_attention_heads", true, &c.n_heads));
    GPTOSS_TRY(get_u32(path, obj, "num_key_value_heads", true, &c.n_kv_heads));
    GPTOSS_TRY(get_u32(path, obj, "head_dim", true, &c.head_dim));
    GPTOSS_TRY(get_u32(path, obj, "vocab_size", true, &c.vocab));
    GPTOSS_TRY(get_u32(path, obj, "sliding_window", true, &c.sliding_window));
    GPTOSS_TRY(get_u32(path, obj, "max_position_embeddings", true, &c.max_context));
    GPTOSS_TRY(get_float(path, obj, "rms_norm_eps", &c.rms_norm_eps));
    GPTOSS_TRY(get_float(path, obj, "rope_theta", &c.rope_theta));
    GPTOSS_TRY(get_float(path, obj, "swiglu_limit", &c.swiglu_limit));

    GPTOSS_TRY(parse_rope_field(path, obj, &c));
    GPTOSS_TRY(check_config(path, c));  // first: it bounds the layer count
    GPTOSS_TRY(parse_layer_types(path, obj, &c));

    // End-of-sequence ids: config.json first, then generation_config.json (load_config).
    GPTOSS_TRY(read_eos(path, obj, &c.eos_token_ids));
    *out = std::move(c);
    return GPTOSS_OK;
}

gptoss_status load_config(const std::string& dir, Config* out) {
    struct stat st;
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        return fail(GPTOSS_ERR_IO, "%s: model directory not found", dir.c_str());
    const std::string path = join_path(dir, "config.json");
    simdjson::padded_string text;
    GPTOSS_TRY(read_json_file(path, &text));
    Config c;
    GPTOSS_TRY(parse_config_json(path, text.data(), text.size(), &c));
    const std::string gen_path = join_path(dir, "generation_config.json");
    if (file_exists(gen_path)) {
        simdjson::dom::parser gen_parser;
        simdjson::dom::element gen_root;
        GPTOSS_TRY(parse_json_file(gen_path, &gen_parser, &gen_root));
        simdjson::dom::object gen_obj;
        if (gen_root.get_object().get(gen_obj) != simdjson::SUCCESS)
            return fail(GPTOSS_ERR_FORMAT, "%s: expected a JSON object at the top level",
                        gen_path.c_str());
        GPTOSS_TRY(read_eos(gen_path, gen_obj, &c.eos_token_ids));
    }
    *out = std::move(c);
    return GPTOSS_OK;
}

// ---------------------------------------------------------------------------
// safetensors

namespace {

// A tensor found in a shard's header, before it is matched against what the model expects.
struct FoundTensor {
    Tensor tensor;
    const MappedFile* file = nullptr;
    bool used = false;
};

const char* dtype_name(DType dtype) {
    switch (dtype) {
        case DType::BF16: return "BF16";
        case DType::F32: return "F32";
        case DType::U8: return "U8";
    }
    return "?";
}

uint64_t dtype_size(DType dtype) {
    switch (dtype) {
        case DType::BF16: return 2;
        case DType::F32: return 4;
        case DType::U8: return 1;
    }
    return 1;
}

std::string shape_string(const std::vector<uint64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i > 0) s += ", ";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

// Parses one shard: header length, JSON header, every entry's dtype/shape/offsets, then
// checks that the entries tile the data region exactly (no overlap, no gap, nothing beyond).
// The dtype and shape of one header entry into *t (its name already set); *n_elements.
gptoss_status parse_dtype_shape(const char* path, simdjson::dom::object entry, Tensor* t, uint64_t* n_elements) {
    const char* name = t->name.c_str();
    std::string_view dtype_text;
    if (entry.at_key("dtype").get_string().get(dtype_text) != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s: dtype is missing or not a string", path, name);
    if (dtype_text == "BF16") {
        t->dtype = DType::BF16;
    } else if (dtype_text == "F32") {
        t->dtype = DType::F32;
    } else if (dtype_text == "U8") {
        t->dtype = DType::U8;
    } else {
        return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s has dtype %.*s, expected one of BF16, F32, U8", path, name,
                    int(dtype_text.size()), dtype_text.data());
    }
    simdjson::dom::array shape;
    if (entry.at_key("shape").get_array().get(shape) != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s: shape is missing or not an array", path, name);
    *n_elements = 1;
    for (simdjson::dom::element dim : shape) {
        uint64_t d = 0;
        if (dim.get_uint64().get(d) != simdjson::SUCCESS)
            return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s: shape holds a non-integer", path, name);
        if (d != 0 && *n_elements > UINT64_MAX / 16 / d)
            return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s: shape %s overflows", path, name,
                        shape_string(t->shape).c_str());
        *n_elements *= d;
        t->shape.push_back(d);
    }
    return GPTOSS_OK;
}

// The data_offsets [*begin, *end) of one header entry, relative to the data region that starts
// after the header_len-byte header: in the region, the size of t's dtype and shape, aligned to
// its elements. Sets t->n_bytes.
gptoss_status parse_offsets(const char* path, simdjson::dom::object entry, uint64_t header_len, uint64_t region_size,
                            uint64_t n_elements, Tensor* t, uint64_t* begin, uint64_t* end) {
    const char* name = t->name.c_str();
    simdjson::dom::array offsets;
    if (entry.at_key("data_offsets").get_array().get(offsets) != simdjson::SUCCESS || offsets.size() != 2 ||
        offsets.at(0).get_uint64().get(*begin) != simdjson::SUCCESS ||
        offsets.at(1).get_uint64().get(*end) != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s: data_offsets must be an array of two non-negative integers",
                    path, name);
    const uint64_t b = *begin, e = *end;
    if (b > e)
        return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] are reversed", path,
                    name, b, e);
    if (e > region_size)
        return fail(GPTOSS_ERR_FORMAT,
                    "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] lie outside the data "
                    "region (%" PRIu64 " bytes after the header; file truncated?)",
                    path, name, b, e, region_size);
    t->n_bytes = n_elements * dtype_size(t->dtype);
    if (e - b != t->n_bytes)
        return fail(GPTOSS_ERR_FORMAT,
                    "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64
                    " bytes, expected %" PRIu64 " for %s %s",
                    path, name, b, e, e - b, t->n_bytes, dtype_name(t->dtype), shape_string(t->shape).c_str());
    // The backends read bf16/f32 through typed pointers; safetensors writers align data.
    const uint64_t file_offset = 8 + header_len + b;
    if (file_offset % dtype_size(t->dtype) != 0)
        return fail(GPTOSS_ERR_FORMAT,
                    "%s: tensor %s: data at file offset %" PRIu64 " is not aligned to its %" PRIu64 "-byte elements",
                    path, name, file_offset, dtype_size(t->dtype));
    return GPTOSS_OK;
}

// A tensor's bytes [begin, end) in the data region.
struct Range {
    uint64_t begin, end;
    const std::string* name;
};

// The ranges must tile the data region: sorted by start, each begins where the previous ended
// (empty tensors occupy nothing), and the last ends at region_size.
gptoss_status check_tiling(const char* path, std::vector<Range>* ranges, uint64_t region_size) {
    std::sort(ranges->begin(), ranges->end(), [](const Range& a, const Range& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t covered = 0;
    const std::string* previous = nullptr;
    for (const Range& r : *ranges) {
        if (r.begin == r.end) continue;
        if (r.begin < covered)
            return fail(GPTOSS_ERR_FORMAT,
                        "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                        "] overlap tensor %s (which ends at %" PRIu64 ")",
                        path, r.name->c_str(), r.begin, r.end, previous->c_str(), covered);
        if (r.begin > covered)
            return fail(GPTOSS_ERR_FORMAT, "%s: data region bytes [%" PRIu64 ", %" PRIu64 ") belong to no tensor",
                        path, covered, r.begin);
        covered = r.end;
        previous = r.name;
    }
    if (covered != region_size)
        return fail(GPTOSS_ERR_FORMAT, "%s: data region bytes [%" PRIu64 ", %" PRIu64 ") belong to no tensor", path,
                    covered, region_size);
    return GPTOSS_OK;
}

// The 8-byte header length and the JSON header object of a shard.
gptoss_status parse_header(const MappedFile& file, simdjson::dom::parser* parser, uint64_t* header_len,
                           simdjson::dom::object* obj) {
    const char* path = file.path.c_str();
    if (file.size < 8)
        return fail(GPTOSS_ERR_FORMAT, "%s: truncated safetensors file: %zu bytes, shorter than the 8-byte header length",
                    path, file.size);
    *header_len = 0;
    for (int i = 7; i >= 0; --i) *header_len = (*header_len << 8) | file.data[i];  // little-endian
    if (*header_len > file.size - 8)
        return fail(GPTOSS_ERR_FORMAT, "%s: header length %" PRIu64 " goes beyond the end of the file (%zu bytes)", path,
                    *header_len, file.size);
    simdjson::dom::element root;
    simdjson::padded_string header(reinterpret_cast<const char*>(file.data + 8), size_t(*header_len));
    const auto error = parser->parse(header).get(root);
    if (error != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_FORMAT, "%s: safetensors header is not valid JSON: %s", path,
                    simdjson::error_message(error));
    if (root.get_object().get(*obj) != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_FORMAT, "%s: safetensors header is not a JSON object", path);
    return GPTOSS_OK;
}

gptoss_status parse_shard(const MappedFile& file, std::map<std::string, FoundTensor>* found) {
    const char* path = file.path.c_str();
    simdjson::dom::parser parser;
    uint64_t header_len = 0;
    simdjson::dom::object obj;
    GPTOSS_TRY(parse_header(file, &parser, &header_len, &obj));
    const uint8_t* region = file.data + 8 + header_len;
    const uint64_t region_size = file.size - 8 - header_len;
    std::vector<Range> ranges;
    for (auto field : obj) {
        const std::string name(field.key);
        if (name == "__metadata__") continue;
        simdjson::dom::object entry;
        if (field.value.get_object().get(entry) != simdjson::SUCCESS)
            return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s: header entry is not an object", path, name.c_str());
        Tensor t;
        t.name = name;
        uint64_t n_elements = 0, begin = 0, end = 0;
        GPTOSS_TRY(parse_dtype_shape(path, entry, &t, &n_elements));
        GPTOSS_TRY(parse_offsets(path, entry, header_len, region_size, n_elements, &t, &begin, &end));
        t.data = region + begin;
        FoundTensor f;
        f.tensor = std::move(t);
        f.file = &file;
        auto inserted = found->emplace(name, std::move(f));
        if (!inserted.second)
            return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s appears again (already in %s)", path, name.c_str(),
                        inserted.first->second.file->path.c_str());
        ranges.push_back({begin, end, &inserted.first->first});
    }
    return check_tiling(path, &ranges, region_size);
}

// Reads model.safetensors.index.json: the shard file names (in order of first appearance) and
// which shard each tensor lives in.
gptoss_status parse_index(const std::string& path, const simdjson::padded_string& text,
                          std::vector<std::string>* shards, std::map<std::string, std::string>* weight_map) {
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    GPTOSS_TRY(parse_json_text(path, text, &parser, &root));
    simdjson::dom::object map;
    if (root.at_key("weight_map").get_object().get(map) != simdjson::SUCCESS)
        return fail(GPTOSS_ERR_FORMAT, "%s: field weight_map is missing or not an object",
                    path.c_str());
    for (auto field : map) {
        std::string_view shard;
        if (field.value.get_string().get(shard) != simdjson::SUCCESS)
            return fail(GPTOSS_ERR_FORMAT, "%s: weight_map entry %.*s is not a file name",
                        path.c_str(), int(field.key.size()), field.key.data());
        if (shard.empty() || shard.find('/') != std::string_view::npos || shard == "." || shard == "..")
            return fail(GPTOSS_ERR_FORMAT, "%s: weight_map entry %.*s names \"%.*s\", expected a file "
                        "name in the model directory",
                        path.c_str(), int(field.key.size()), field.key.data(), int(shard.size()),
                        shard.data());
        std::string name(shard);
        if (std::find(shards->begin(), shards->end(), name) == shards->end()) shards->push_back(name);
        (*weight_map)[std::string(field.key)] = name;
    }
    if (shards->empty())
        return fail(GPTOSS_ERR_FORMAT, "%s: weight_map is empty", path.c_str());
    return GPTOSS_OK;
}

// Matches one expected tensor against what the shards hold.
class Binder {
public:
    Binder(std::map<std::string, FoundTensor>* found, const std::string& dir)
        : found_(found), dir_(dir) {}

    gptoss_status bind(const std::string& name, std::vector<uint64_t> shape, DType dtype,
                       Tensor* out, bool allow_f32 = false) {
        auto it = found_->find(name);
        if (it == found_->end())
            return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s is missing from the checkpoint", dir_.c_str(),
                        name.c_str());
        FoundTensor& f = it->second;
        const char* file = f.file->path.c_str();
        if (f.tensor.dtype != dtype && !(allow_f32 && f.tensor.dtype == DType::F32))
            return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s has dtype %s, expected %s%s", file,
                        name.c_str(), dtype_name(f.tensor.dtype), dtype_name(dtype),
                        allow_f32 ? " or F32" : "");
        if (f.tensor.shape != shape)
            return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s has shape %s, config.json implies %s", file,
                        name.c_str(), shape_string(f.tensor.shape).c_str(),
                        shape_string(shape).c_str());
        f.used = true;
        *out = f.tensor;
        return GPTOSS_OK;
    }

private:
    std::map<std::string, FoundTensor>* found_;
    std::string dir_;
};

// Progress: mapping and checking the shards is the first half, binding the layers the second
// (API.md §5: at least once per shard and once per layer).
gptoss_status report(const ProgressFn& progress, float fraction, const std::string& dir) {
    if (progress && !progress(fraction))
        return fail(GPTOSS_ERR_CANCELLED, "%s: loading cancelled by the progress callback", dir.c_str());
    return GPTOSS_OK;
}

gptoss_status bind_weights(const Config& c, std::map<std::string, FoundTensor>* found,
                           const std::string& dir, const ProgressFn& progress, Weights* w) {
    Binder b(found, dir);
    // Community re-exports with bf16 experts ("gate_up_proj" without _blocks/_scales) would
    // otherwise fail as a missing tensor, which hides what is really going on.
    if (found->count("model.layers.0.mlp.experts.gate_up_proj_blocks") == 0 &&
        found->count("model.layers.0.mlp.experts.gate_up_proj") != 0)
        return fail(GPTOSS_ERR_UNSUPPORTED,
                    "%s: tensor model.layers.0.mlp.experts.gate_up_proj holds dequantized experts; gptoss "
                    "reads the MXFP4 experts (gate_up_proj_blocks/_scales) of the official release",
                    dir.c_str());
    const uint64_t H = c.hidden, I = c.intermediate, E = c.n_experts, V = c.vocab;
    const uint64_t QD = uint64_t(c.n_heads) * c.head_dim, GD = uint64_t(c.n_kv_heads) * c.head_dim;
    GPTOSS_TRY(b.bind("model.embed_tokens.weight", {V, H}, DType::BF16, &w->embed));
    w->layers.resize(c.n_layers);
    for (uint32_t l = 0; l < c.n_layers; ++l) {
        LayerWeights& L = w->layers[l];
        L.sliding = c.layer_sliding[l];
        const std::string p = "model.layers." + std::to_string(l) + ".";
        GPTOSS_TRY(b.bind(p + "input_layernorm.weight", {H}, DType::BF16, &L.attn_norm));
        GPTOSS_TRY(b.bind(p + "self_attn.q_proj.weight", {QD, H}, DType::BF16, &L.q_weight));
        GPTOSS_TRY(b.bind(p + "self_attn.q_proj.bias", {QD}, DType::BF16, &L.q_bias));
        GPTOSS_TRY(b.bind(p + "self_attn.k_proj.weight", {GD, H}, DType::BF16, &L.k_weight));
        GPTOSS_TRY(b.bind(p + "self_attn.k_proj.bias", {GD}, DType::BF16, &L.k_bias));
        GPTOSS_TRY(b.bind(p + "self_attn.v_proj.weight", {GD, H}, DType::BF16, &L.v_weight));
        GPTOSS_TRY(b.bind(p + "self_attn.v_proj.bias", {GD}, DType::BF16, &L.v_bias));
        GPTOSS_TRY(b.bind(p + "self_attn.o_proj.weight", {H, QD}, DType::BF16, &L.o_weight));
        GPTOSS_TRY(b.bind(p + "self_attn.o_proj.bias", {H}, DType::BF16, &L.o_bias));
        GPTOSS_TRY(b.bind(p + "self_attn.sinks", {c.n_heads}, DType::BF16, &L.sinks, /*allow_f32=*/true));
        GPTOSS_TRY(b.bind(p + "post_attention_layernorm.weight", {H}, DType::BF16, &L.mlp_norm));
        GPTOSS_TRY(b.bind(p + "mlp.router.weight", {E, H}, DType::BF16, &L.router_weight));
        GPTOSS_TRY(b.bind(p + "mlp.router.bias", {E}, DType::BF16, &L.router_bias));
        GPTOSS_TRY(b.bind(p + "mlp.experts.gate_up_proj_blocks", {E, 2 * I, H / 32, 16}, DType::U8,
                          &L.gate_up_blocks));
        GPTOSS_TRY(b.bind(p + "mlp.experts.gate_up_proj_scales", {E, 2 * I, H / 32}, DType::U8,
                          &L.gate_up_scales));
        GPTOSS_TRY(b.bind(p + "mlp.experts.gate_up_proj_bias", {E, 2 * I}, DType::BF16, &L.gate_up_bias));
        GPTOSS_TRY(b.bind(p + "mlp.experts.down_proj_blocks", {E, H, I / 32, 16}, DType::U8,
                          &L.down_blocks));
        GPTOSS_TRY(b.bind(p + "mlp.experts.down_proj_scales", {E, H, I / 32}, DType::U8,
                          &L.down_scales));
        GPTOSS_TRY(b.bind(p + "mlp.experts.down_proj_bias", {E, H}, DType::BF16, &L.down_bias));
        GPTOSS_TRY(report(progress, 0.5f + 0.5f * float(l + 1) / float(c.n_layers + 1), dir));
    }
    GPTOSS_TRY(b.bind("model.norm.weight", {H}, DType::BF16, &w->norm));
    GPTOSS_TRY(b.bind("lm_head.weight", {V, H}, DType::BF16, &w->lm_head));
    return GPTOSS_OK;
}

}  // namespace

static const char* const kIndexName = "model.safetensors.index.json";

// The checkpoint's shards: those model.safetensors.index.json names (and its tensor -> shard map
// into *weight_map), else the single model.safetensors. IO error naming dir when neither exists.
static gptoss_status list_shards(const std::string& dir, std::vector<std::string>* shards,
                                 std::map<std::string, std::string>* weight_map) {
    const std::string index_path = join_path(dir, kIndexName);
    if (file_exists(index_path)) {
        simdjson::padded_string text;
        GPTOSS_TRY(read_json_file(index_path, &text));
        return parse_index(index_path, text, shards, weight_map);
    }
    if (file_exists(join_path(dir, "model.safetensors"))) {
        shards->push_back("model.safetensors");
        return GPTOSS_OK;
    }
    return fail(GPTOSS_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json found", dir.c_str());
}

// Every tensor the index names must be in the shard it names (FORMAT error naming both).
static gptoss_status check_index(const std::string& dir, const std::map<std::string, std::string>& weight_map,
                                 const std::map<std::string, FoundTensor>& found) {
    for (const auto& entry : weight_map) {
        auto it = found.find(entry.first);
        if (it == found.end())
            return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s, listed in %s, is absent from it",
                        join_path(dir, entry.second).c_str(), entry.first.c_str(), kIndexName);
        if (it->second.file->name != entry.second)
            return fail(GPTOSS_ERR_FORMAT, "%s: tensor %s, listed in %s for %s, is in %s instead",
                        join_path(dir, entry.second).c_str(), entry.first.c_str(), kIndexName,
                        entry.second.c_str(), it->second.file->name.c_str());
    }
    return GPTOSS_OK;
}

gptoss_status load_checkpoint(const std::string& dir, const ProgressFn& progress,
                              std::unique_ptr<Checkpoint>* out) {
    // Built locally and handed over only on success: any early return unmaps everything.
    auto checkpoint = std::make_unique<Checkpoint>();
    GPTOSS_TRY(load_config(dir, &checkpoint->config));
    std::vector<std::string> shards;
    std::map<std::string, std::string> weight_map;
    GPTOSS_TRY(list_shards(dir, &shards, &weight_map));

    std::map<std::string, FoundTensor> found;
    for (size_t i = 0; i < shards.size(); ++i) {
        const std::string path = join_path(dir, shards[i]);
        if (!file_exists(path))
            return fail(GPTOSS_ERR_IO, "%s: shard %s named by %s is missing", path.c_str(), shards[i].c_str(),
                        kIndexName);
        std::unique_ptr<MappedFile> file;
        GPTOSS_TRY(map_file(path, &file));
        const MappedFile& mapped = *file;
        checkpoint->files.push_back(std::move(file));
        GPTOSS_TRY(parse_shard(mapped, &found));
        GPTOSS_TRY(report(progress, 0.5f * float(i + 1) / float(shards.size()), dir));
    }
    GPTOSS_TRY(check_index(dir, weight_map, found));

    GPTOSS_TRY(bind_weights(checkpoint->config, &found, dir, progress, &checkpoint->weights));
    uint64_t total = 0;
    for (const auto& entry : found) {
        total += entry.second.tensor.n_bytes;
        if (!entry.second.used)
            log(GPTOSS_LOG_WARN, "%s: unexpected tensor %s (%s %s) ignored",
                entry.second.file->path.c_str(), entry.first.c_str(),
                dtype_name(entry.second.tensor.dtype), shape_string(entry.second.tensor.shape).c_str());
    }
    checkpoint->total_bytes = total;
    GPTOSS_TRY(report(progress, 1.0f, dir));
    *out = std::move(checkpoint);
    return GPTOSS_OK;
}

// The fuzzers' seams (gptoss-internal.h): the same parsers, on bytes in memory.
gptoss_status check_safetensors_shard(const std::string& path, const uint8_t* data, size_t size,
                                      std::vector<std::string>* names) {
    MappedFile view;  // not mapped: the destructor leaves `data` alone
    view.path = path;
    view.name = base_name(path);
    view.data = data;
    view.size = size;
    std::map<std::string, FoundTensor> found;
    GPTOSS_TRY(parse_shard(view, &found));
    if (names != nullptr)
        for (const auto& entry : found) names->push_back(entry.first);
    return GPTOSS_OK;
}

gptoss_status read_safetensors_index(const std::string& path, const char* json, size_t len,
                                     std::vector<std::string>* shards,
                                     std::map<std::string, std::string>* weight_map) {
    return parse_index(path, simdjson::padded_string(json, len), shards, weight_map);
}

}  // namespace gptoss
