// tools/cli-args.h - command-line helpers shared by the programs in tools/ (gptoss-chat,
// gptoss-server): the usage error that names the program and points at --help (exit status 2),
// and strict number/device parsers (plain decimal digits, no sign or spaces, in range, else
// false so the caller can name the option). Header-only: each tool is one translation unit.
#pragma once

#include "gptoss.h"

#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace gptoss::cli {

// Prints "PROGRAM: <message>" and the --help hint on stderr, then exits with status 2.
[[noreturn]] inline void usage_error(const char* program, const char* format, ...) {
    std::fprintf(stderr, "%s: ", program);
    va_list args;
    va_start(args, format);
    std::vfprintf(stderr, format, args);
    va_end(args);
    std::fprintf(stderr, "\n(run %s --help for the options)\n", program);
    std::exit(2);
}

inline bool parse_u64(const std::string& s, uint64_t* out) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
    errno = 0;
    const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
    if (errno != 0) return false;  // more than 2^64 - 1
    *out = v;
    return true;
}

inline bool parse_u32(const std::string& s, uint32_t* out) {
    uint64_t v = 0;
    if (!parse_u64(s, &v) || v > UINT32_MAX) return false;
    *out = uint32_t(v);
    return true;
}

// A finite float in any strtof syntax ("0.7", "1e-3").
inline bool parse_float(const std::string& s, float* out) {
    if (s.empty()) return false;
    errno = 0;
    char* end = nullptr;
    const float v = std::strtof(s.c_str(), &end);
    if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
    *out = v;
    return true;
}

// "cpu", "auto" or a CUDA ordinal 0..1024 → gptoss_model_params.device.
inline bool parse_device(const std::string& s, int32_t* out) {
    if (s == "cpu") { *out = GPTOSS_DEVICE_CPU; return true; }
    if (s == "auto") { *out = GPTOSS_DEVICE_AUTO; return true; }
    uint32_t n = 0;
    if (!parse_u32(s, &n) || n > 1024) return false;
    *out = int32_t(n);
    return true;
}

// "auto" or a layer count 0..1024 → gptoss_model_params.n_cpu_moe (the model checks the count).
inline bool parse_cpu_moe(const std::string& s, int32_t* out) {
    if (s == "auto") { *out = GPTOSS_CPU_MOE_AUTO; return true; }
    uint32_t n = 0;
    if (!parse_u32(s, &n) || n > 1024) return false;
    *out = int32_t(n);
    return true;
}

// "on" or "off" → gptoss_model_params.batch_invariant (GPTOSS_BATCH_INVARIANT_ON / _OFF).
inline bool parse_batch_invariant(const std::string& s, int32_t* out) {
    if (s != "on" && s != "off") return false;
    *out = s == "on" ? GPTOSS_BATCH_INVARIANT_ON : GPTOSS_BATCH_INVARIANT_OFF;
    return true;
}

// Bytes: digits with an optional binary suffix K, M, G or T (24G = 24 GiB) → *out.
inline bool parse_bytes(const std::string& s, uint64_t* out) {
    if (s.empty()) return false;
    int shift = 0;
    std::string digits = s;
    const char last = s.back();
    if (last == 'K' || last == 'M' || last == 'G' || last == 'T') {
        shift = last == 'K' ? 10 : last == 'M' ? 20 : last == 'G' ? 30 : 40;
        digits.pop_back();
    }
    uint64_t v = 0;
    if (!parse_u64(digits, &v) || (shift > 0 && v > (UINT64_MAX >> shift))) return false;
    *out = v << shift;
    return true;
}

}  // namespace gptoss::cli
