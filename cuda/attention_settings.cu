// cuda/attention_settings.cu - the decode attention's process settings (kernels.h): which split
// runs (tensor-core or FMA), its stages, the shortest split and the split rule, the sliding window
// in one split, the head-major grid, the staged and the two-pass partial merges, and the split
// rule's ramp. Each is read from its GPTOSS_DECODE_ATTN_* environment variable on first use unless a
// setter chose it first (tests, benchmarks); attention.cu's launchers copy them into AttentionArgs.
// Host code only; the measurements behind each default are in bench/NOTES.md (v15-v44).
#include "cuda/common.cuh"
#include "cuda/kernels.h"

#include <atomic>
#include <cstdlib>

namespace gptoss {
namespace cuda {

namespace {
OnSwitch g_decode_attention_mma("GPTOSS_DECODE_ATTN_MMA");
OnSwitch g_decode_attention_window_whole("GPTOSS_DECODE_ATTN_WINDOW_WHOLE");
OnSwitch g_decode_attention_head_major("GPTOSS_DECODE_ATTN_HEAD_MAJOR");
OnSwitch g_decode_attention_merge_staged("GPTOSS_DECODE_ATTN_MERGE_STAGED");
OnSwitch g_decode_attention_merge_two_pass("GPTOSS_DECODE_ATTN_MERGE_2PASS");
OnSwitch g_decode_attention_split_ramp("GPTOSS_DECODE_ATTN_SPLIT_RAMP");
}  // namespace

bool decode_attention_mma() { return g_decode_attention_mma.on(); }
void set_decode_attention_mma(bool on) { g_decode_attention_mma.set(on); }
bool decode_attention_window_whole() { return g_decode_attention_window_whole.on(); }
void set_decode_attention_window_whole(bool on) { g_decode_attention_window_whole.set(on); }
bool decode_attention_head_major() { return g_decode_attention_head_major.on(); }
void set_decode_attention_head_major(bool on) { g_decode_attention_head_major.set(on); }
bool decode_attention_merge_staged() { return g_decode_attention_merge_staged.on(); }
void set_decode_attention_merge_staged(bool on) { g_decode_attention_merge_staged.set(on); }
bool decode_attention_merge_two_pass() { return g_decode_attention_merge_two_pass.on(); }
void set_decode_attention_merge_two_pass(bool on) { g_decode_attention_merge_two_pass.set(on); }
bool decode_attention_split_ramp() { return g_decode_attention_split_ramp.on(); }
void set_decode_attention_split_ramp(bool on) { g_decode_attention_split_ramp.set(on); }

namespace {
std::atomic<int> g_decode_attention_stages{-1};  // GPTOSS_DECODE_ATTN_STAGES=1|2
}  // namespace

int decode_attention_stages() {
    return setting(g_decode_attention_stages, [] {
        const char* s = std::getenv("GPTOSS_DECODE_ATTN_STAGES");
        return s && *s && std::atoi(s) == 1 ? 1 : 2;
    });
}

void set_decode_attention_stages(int stages) { g_decode_attention_stages.store(stages == 1 ? 1 : 2); }

namespace {
std::atomic<int> g_decode_attention_split{-1};  // GPTOSS_DECODE_ATTN_SPLIT
// 256-key shortest splits: +4 % decode at 8 192 keys on an H200, level at 0 / 2 048 / 32 768
// against 128 (bench/NOTES.md "v26"); 512 loses at 2 048.
constexpr long kDefaultDecodeSplit = 256;
uint32_t split_keys(long v) {  // a power of two in [kAttentionSplit, 4096]
    uint32_t len = kAttentionSplit;
    while (len < 4096 && long(len) * 2 <= v) len *= 2;
    return len;
}
}  // namespace

uint32_t decode_attention_split_min() {
    return uint32_t(setting(g_decode_attention_split, [] {
        const char* s = std::getenv("GPTOSS_DECODE_ATTN_SPLIT");
        return int(split_keys(s && *s ? std::atol(s) : kDefaultDecodeSplit));
    }));
}

void set_decode_attention_split_min(uint32_t keys) { g_decode_attention_split.store(int(split_keys(long(keys)))); }

namespace {
std::atomic<int> g_decode_attention_max_splits{-1};  // GPTOSS_DECODE_ATTN_MAX_SPLITS = 0|16|32|64|128
int max_splits_choice(long v) { return v <= 0 ? 0 : v <= 16 ? 16 : v <= 32 ? 32 : v <= 64 ? 64 : int(kMaxDecodeSplits); }
}  // namespace
uint32_t decode_attention_max_splits() {
    return uint32_t(setting(g_decode_attention_max_splits, [] {
        const char* s = std::getenv("GPTOSS_DECODE_ATTN_MAX_SPLITS");
        return max_splits_choice(s && *s ? std::atol(s) : 0);
    }));
}
void set_decode_attention_max_splits(uint32_t splits) { g_decode_attention_max_splits.store(max_splits_choice(long(splits))); }

}  // namespace cuda
}  // namespace gptoss
