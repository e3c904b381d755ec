// tools/gptoss-tokenizer-bench.cpp - times the o200k_harmony tokenizer: load time of
// tokenizer.json (or an o200k_base.tiktoken file) and single-thread encode throughput on a
// corpus file. Prints one JSON object; optionally writes the ids (int32 little-endian) so
// tools/tokenizer-bench.py can compare them with tiktoken's. Internal tool (links the static
// library and uses tokenizer/tokenizer.h directly).
//
//   gptoss-tokenizer-bench (--tokenizer-json FILE | --tiktoken FILE) [--corpus FILE]
//                          [--repeat N] [--ids-out FILE]
#include "gptoss.h"
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool read_file(const char* path, std::string* out) {
    FILE* f = std::fopen(path, "rb");
    if (!f) return false;
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
    const bool ok = !std::ferror(f);
    std::fclose(f);
    return ok;
}

// Loads the tokenizer max(repeat, 5) times (the first also warms the page cache) and prints the
// best and median load time (the JSON object's first fields). Returns 0, or 1 after saying why.
int load_timed(const char* json_path, const char* tiktoken_path, int repeat, std::unique_ptr<gptoss::Tokenizer>* tok) {
    std::vector<double> load_ms;
    for (int r = 0; r < std::max(repeat, 5); r++) {
        const double t0 = now_s();
        const gptoss_status status = json_path ? gptoss::Tokenizer::load_hf_json(json_path, tok)
                                               : gptoss::Tokenizer::load_tiktoken(tiktoken_path, tok);
        load_ms.push_back((now_s() - t0) * 1e3);
        if (status != GPTOSS_OK) {
            std::fprintf(stderr, "gptoss-tokenizer-bench: %s\n", gptoss_last_error());
            return 1;
        }
    }
    std::sort(load_ms.begin(), load_ms.end());
    std::printf("{\"load_ms_min\": %.1f, \"load_ms_median\": %.1f", load_ms.front(), load_ms[load_ms.size() / 2]);
    return 0;
}

// Encodes the corpus `repeat` times, prints the best time's fields, writes the ids (int32) to
// ids_out when given. Returns 0, or 1 after saying why.
int encode_timed(const gptoss::Tokenizer& tok, const char* corpus_path, const char* ids_out, int repeat) {
    std::string corpus;
    if (!read_file(corpus_path, &corpus)) {
        std::fprintf(stderr, "gptoss-tokenizer-bench: cannot read %s\n", corpus_path);
        return 1;
    }
    std::vector<int32_t> ids;
    double best = 1e30;
    for (int r = 0; r < repeat; r++) {
        ids.clear();
        const double t0 = now_s();
        if (tok.encode(corpus.data(), corpus.size(), /*allow_special=*/false, &ids) != GPTOSS_OK) {
            std::fprintf(stderr, "gptoss-tokenizer-bench: %s\n", gptoss_last_error());
            return 1;
        }
        best = std::min(best, now_s() - t0);
    }
    std::printf(", \"bytes\": %zu, \"tokens\": %zu, \"encode_s\": %.4f, \"encode_mb_per_s\": %.2f", corpus.size(),
                ids.size(), best, double(corpus.size()) / best / 1e6);
    if (ids_out) {
        FILE* f = std::fopen(ids_out, "wb");
        if (!f || std::fwrite(ids.data(), sizeof(int32_t), ids.size(), f) != ids.size()) {
            std::fprintf(stderr, "gptoss-tokenizer-bench: cannot write %s\n", ids_out);
            if (f) std::fclose(f);
            return 1;
        }
        std::fclose(f);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const char* json_path = nullptr;
    const char* tiktoken_path = nullptr;
    const char* corpus_path = nullptr;
    const char* ids_out = nullptr;
    int repeat = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--tokenizer-json") json_path = argv[i + 1];
        else if (a == "--tiktoken") tiktoken_path = argv[i + 1];
        else if (a == "--corpus") corpus_path = argv[i + 1];
        else if (a == "--ids-out") ids_out = argv[i + 1];
        else if (a == "--repeat") repeat = std::max(1, std::atoi(argv[i + 1]));
        else {
            std::fprintf(stderr, "gptoss-tokenizer-bench: unknown option %s\n", a.c_str());
            return 2;
        }
    }
    if (!json_path && !tiktoken_path) {
        std::fprintf(stderr, "usage: gptoss-tokenizer-bench (--tokenizer-json FILE | --tiktoken FILE) [--corpus FILE] "
                             "[--repeat N] [--ids-out FILE]\n");
        return 2;
    }
    std::unique_ptr<gptoss::Tokenizer> tok;
    if (load_timed(json_path, tiktoken_path, repeat, &tok) != 0) return 1;
    if (corpus_path && encode_timed(*tok, corpus_path, ids_out, repeat) != 0) return 1;
    std::printf("}\n");
    return 0;
}
