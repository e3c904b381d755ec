// tools/gptoss-tokenize.cpp - text <-> o200k_harmony token ids from the command line, like
// llama.cpp's llama-tokenize. Uses only gptoss.h (links libgptoss.so). Loads the model directory
// on the CPU, which maps the weights without reading them, so it is quick on any checkpoint.
//
//   gptoss-tokenize --model DIR [--allow-special] [--count] [TEXT]   text (or stdin) -> ids
//   gptoss-tokenize --model DIR --decode [IDS]                       ids (or stdin) -> text
//   gptoss-tokenize --model DIR --chat REQUEST.json [--ids]          Harmony rendering of an
//                                                                    OpenAI Chat Completions body
#include "gptoss.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char kUsage[] =
    "usage: gptoss-tokenize --model DIR [options] [TEXT]\n"
    "  Converts TEXT (or standard input when TEXT is absent) to token ids, printed on one line.\n"
    "  --model DIR        model directory holding tokenizer.json (required)\n"
    "  --allow-special    text spelling a special token (\"<|start|>\") becomes that token\n"
    "  --count            print only the number of tokens\n"
    "  --decode           read ids (separated by spaces, commas or brackets) and print their text\n"
    "  --chat FILE        render an OpenAI Chat Completions request (JSON) in the Harmony format\n"
    "                     and print it as text, special tokens included\n"
    "  --ids              with --chat: print the ids instead of the text\n"
    "  -h, --help         show this help\n";

int fail_with(const char* what) {
    std::fprintf(stderr, "gptoss-tokenize: %s: %s\n", what, gptoss_last_error());
    return 1;
}

bool read_stream(FILE* f, std::string* out) {
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
    return !std::ferror(f);
}

bool read_file(const char* path, std::string* out) {
    FILE* f = std::fopen(path, "rb");
    if (!f) return false;
    const bool ok = read_stream(f, out);
    std::fclose(f);
    return ok;
}

// Ids separated by anything that is not a digit or '-' (so "[1, 2, 3]" works too).
bool parse_ids(const std::string& text, std::vector<int32_t>* ids) {
    size_t i = 0;
    while (i < text.size()) {
        const char c = text[i];
        if ((c >= '0' && c <= '9') || c == '-') {
            char* end = nullptr;
            errno = 0;
            const long long v = std::strtoll(text.c_str() + i, &end, 10);
            if (errno || end == text.c_str() + i || v < INT32_MIN || v > INT32_MAX) {
                std::fprintf(stderr, "gptoss-tokenize: --decode: \"%.20s\" at byte %zu is not a token id\n",
                             text.c_str() + i, i);
                return false;
            }
            ids->push_back(int32_t(v));
            i = size_t(end - text.c_str());
        } else if (c == ' ' || c == ',' || c == '\n' || c == '\r' || c == '\t' || c == '[' || c == ']') {
            i++;
        } else {
            std::fprintf(stderr, "gptoss-tokenize: --decode: unexpected character '%c' at byte %zu\n", c, i);
            return false;
        }
    }
    return true;
}

void print_ids(const std::vector<int32_t>& ids) {
    for (size_t i = 0; i < ids.size(); i++) std::printf(i ? " %d" : "%d", ids[i]);
    std::printf("\n");
}

int detokenize_and_print(const gptoss_model* model, const std::vector<int32_t>& ids) {
    size_t len = 0;
    gptoss_status status = gptoss_detokenize(model, ids.data(), ids.size(), nullptr, 0, &len);
    if (status != GPTOSS_OK && status != GPTOSS_ERR_BUFFER_TOO_SMALL) return fail_with("detokenize");
    std::vector<char> text(len + 1);
    if (gptoss_detokenize(model, ids.data(), ids.size(), text.data(), text.size(), &len) != GPTOSS_OK)
        return fail_with("detokenize");
    std::fwrite(text.data(), 1, len, stdout);
    std::printf("\n");
    return 0;
}

// Everything main reads from the command line (see kUsage).
struct TokenizeArgs {
    const char* model_dir = nullptr;
    const char* chat_file = nullptr;
    const char* text_arg = nullptr;
    bool allow_special = false, count = false, decode = false, ids_out = false;
};

// 0: go on with *t; -1: --help was printed (exit 0); 2: a bad command line (said why).
int parse_args(int argc, char** argv, TokenizeArgs* t) {
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if ((a == "--model" || a == "-m") && i + 1 < argc) t->model_dir = argv[++i];
        else if (a == "--chat" && i + 1 < argc) t->chat_file = argv[++i];
        else if (a == "--allow-special") t->allow_special = true;
        else if (a == "--count") t->count = true;
        else if (a == "--decode") t->decode = true;
        else if (a == "--ids") t->ids_out = true;
        else if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return -1;
        } else if (a.size() > 1 && a[0] == '-' && a != "--") {
            std::fprintf(stderr, "gptoss-tokenize: unknown or incomplete option %s\n%s", a.c_str(), kUsage);
            return 2;
        } else if (!t->text_arg) {
            t->text_arg = a == "--" && i + 1 < argc ? argv[++i] : argv[i];
        } else {
            std::fprintf(stderr, "gptoss-tokenize: more than one TEXT argument\n%s", kUsage);
            return 2;
        }
    }
    if (!t->model_dir) {
        std::fprintf(stderr, "gptoss-tokenize: --model DIR is required\n%s", kUsage);
        return 2;
    }
    return 0;
}

// --chat FILE: the request's Harmony rendering as a count, ids or text.
int render_chat(const gptoss_model* model, const TokenizeArgs& t) {
    std::string json;
    if (!read_file(t.chat_file, &json)) {
        std::fprintf(stderr, "gptoss-tokenize: %s: cannot read: %s\n", t.chat_file, std::strerror(errno));
        return 1;
    }
    gptoss_conversation* conversation = nullptr;
    if (gptoss_conversation_parse_json(json.data(), json.size(), &conversation) != GPTOSS_OK) {
        const int rc = fail_with(t.chat_file);
        gptoss_conversation_free(conversation);
        return rc;
    }
    const gptoss_chat_request* request = gptoss_conversation_get_request(conversation);
    size_t n = 0;
    std::vector<int32_t> ids;
    gptoss_status status = gptoss_chat_render(model, request, nullptr, 0, &n);
    if (status == GPTOSS_OK || status == GPTOSS_ERR_BUFFER_TOO_SMALL) {
        ids.resize(n);
        status = gptoss_chat_render(model, request, ids.data(), ids.size(), &n);
    }
    int rc = 0;
    if (status != GPTOSS_OK) rc = fail_with("chat render");
    else if (t.count) std::printf("%zu\n", n);
    else if (t.ids_out) print_ids(ids);
    else rc = detokenize_and_print(model, ids);
    gptoss_conversation_free(conversation);
    return rc;
}

// TEXT (or standard input) → ids, or with --decode ids → text.
int tokenize_text(const gptoss_model* model, const TokenizeArgs& t) {
    std::string input;
    if (t.text_arg) input = t.text_arg;
    else if (!read_stream(stdin, &input)) {
        std::fprintf(stderr, "gptoss-tokenize: cannot read standard input\n");
        return 1;
    }
    if (t.decode) {
        std::vector<int32_t> ids;
        return parse_ids(input, &ids) ? detokenize_and_print(model, ids) : 1;
    }
    size_t n = 0;
    gptoss_status status = gptoss_tokenize(model, input.data(), input.size(), t.allow_special, nullptr, 0, &n);
    std::vector<int32_t> ids(n);
    if (status == GPTOSS_OK || status == GPTOSS_ERR_BUFFER_TOO_SMALL)
        status = gptoss_tokenize(model, input.data(), input.size(), t.allow_special, ids.data(), ids.size(), &n);
    if (status != GPTOSS_OK) return fail_with("tokenize");
    if (t.count) std::printf("%zu\n", n);
    else print_ids(ids);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    TokenizeArgs t;
    if (const int rc = parse_args(argc, argv, &t); rc != 0) return rc < 0 ? 0 : rc;
    gptoss_model_params params = gptoss_model_default_params();
    params.device = GPTOSS_DEVICE_CPU;
    gptoss_model* model = nullptr;
    if (gptoss_load(t.model_dir, &params, &model) != GPTOSS_OK) return fail_with(t.model_dir);
    const int rc = t.chat_file ? render_chat(model, t) : tokenize_text(model, t);
    gptoss_model_free(model);
    return rc;
}
