// cpu/host_experts_profile.cpp - the host experts pass's timer (cpu/host_experts_profile.h).
// One call at a time (host_moe_experts holds its scratch lock): each pool thread claims a slot
// the first time it runs an item of the current call and writes only that slot; call_end reads
// the slots after parallel_for's join, which orders those writes before it.
#include "cpu/host_experts_profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace gptoss {
namespace cpu {
namespace host_profile {

namespace {

constexpr uint32_t kSlots = 256;  // threads recorded per call (more are ignored)

struct Slot {
    int64_t first, last, work, wait;
    uint64_t bytes;
};

struct State {
    std::atomic<int> forced{-1};  // set_on: -1 = the environment decides
    std::atomic<uint64_t> call{0};
    std::atomic<uint32_t> next_slot{0};
    Slot slots[kSlots];
    int64_t entry = 0, dispatched = 0, quant = 0;
    // Sums over recorded calls (µs), and the call times for the percentiles.
    double prep = 0, quant_sum = 0, wake_mean = 0, wake_max = 0, work = 0, wait = 0, spread = 0, join = 0,
           span = 0, total = 0, threads = 0, bytes_min = 0, bytes_max = 0, rate = 0;
    uint64_t n = 0, all_bytes = 0;
    std::vector<float> totals;
};
State g;

thread_local uint64_t tl_call = 0;
thread_local uint32_t tl_slot = 0;

}  // namespace

bool on() {
    static const bool env = [] {
        const char* v = std::getenv("GPTOSS_HOST_MOE_TIMING");
        return v != nullptr && *v != 0 && std::strcmp(v, "0") != 0;
    }();
    const int forced = g.forced.load(std::memory_order_relaxed);
    return forced < 0 ? env : forced != 0;
}

void set_on(bool on) { g.forced.store(on ? 1 : 0, std::memory_order_relaxed); }

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

void call_begin() {
    g.entry = now_ns();
    g.quant = 0;
    g.next_slot.store(0, std::memory_order_relaxed);
    g.call.fetch_add(1, std::memory_order_relaxed);
}

void quantized(int64_t ns) { g.quant = ns; }

void dispatch() { g.dispatched = now_ns(); }

void item(int64_t t0, int64_t t1, uint64_t bytes, int64_t wait_ns) {
    const uint64_t call = g.call.load(std::memory_order_relaxed);
    if (tl_call != call) {
        tl_call = call;
        tl_slot = g.next_slot.fetch_add(1, std::memory_order_relaxed);
        if (tl_slot < kSlots) g.slots[tl_slot] = Slot{t0, t1, 0, 0, 0};
    }
    if (tl_slot >= kSlots) return;
    Slot& s = g.slots[tl_slot];
    s.last = t1;
    s.work += t1 - t0;
    s.wait += wait_ns;
    s.bytes += bytes;
}

void call_end() {
    const int64_t ret = now_ns();
    const uint32_t n = std::min(kSlots, g.next_slot.load(std::memory_order_relaxed));
    if (n == 0) return;
    int64_t last_max = INT64_MIN, last_min = INT64_MAX, wake_max = 0;
    double wake = 0, work = 0, wait = 0, rate = 0;
    uint64_t bmin = UINT64_MAX, bmax = 0, bsum = 0;
    for (uint32_t i = 0; i < n; i++) {
        const Slot& s = g.slots[i];
        last_max = std::max(last_max, s.last);
        last_min = std::min(last_min, s.last);
        wake_max = std::max(wake_max, s.first - g.dispatched);
        wake += double(s.first - g.dispatched);
        work += double(s.work);
        wait += double(s.wait);
        if (s.work - s.wait > 0) rate += double(s.bytes) / double(s.work - s.wait);  // GB/s
        bmin = std::min(bmin, s.bytes);
        bmax = std::max(bmax, s.bytes);
        bsum += s.bytes;
    }
    g.prep += 1e-3 * double(g.dispatched - g.entry);
    g.quant_sum += 1e-3 * double(g.quant);
    g.wake_mean += 1e-3 * wake / n;
    g.wake_max += 1e-3 * double(wake_max);
    g.work += 1e-3 * work / n;
    g.wait += 1e-3 * wait / n;
    g.rate += rate / n;
    g.spread += 1e-3 * double(last_max - last_min);
    g.join += 1e-3 * double(ret - last_max);
    g.span += 1e-3 * double(last_max - g.dispatched);
    g.total += 1e-3 * double(ret - g.entry);
    g.threads += n;
    g.bytes_min += 1e-6 * double(bmin);
    g.bytes_max += 1e-6 * double(bmax);
    g.all_bytes += bsum;
    g.n++;
    if (g.totals.size() < (size_t(1) << 20)) g.totals.push_back(float(1e-3 * double(ret - g.entry)));
}

std::string report() {
    if (g.n == 0) return "";
    const double a = 1.0 / double(g.n);
    std::vector<float> t = g.totals;
    std::sort(t.begin(), t.end());
    auto pct = [&](double p) { return t.empty() ? 0.0 : double(t[std::min(t.size() - 1, size_t(p * t.size()))]); };
    char line[1024];
    std::snprintf(line, sizeof line,
                  "host-moe experts pass (%llu calls at T = 1, µs per call, means): total %.1f (p50 %.1f, p90 %.1f, "
                  "p99 %.1f) = prep %.1f (of it int8 quantization of x %.1f) + span %.1f (dispatch -> last item "
                  "end) + join %.1f (last item end -> caller returns); threads %.1f, wake %.1f mean / %.1f max "
                  "(dispatch -> a thread's first item), work %.1f per thread (of it waiting for gate_up %.1f), "
                  "last-item-end spread %.1f; weight MB per thread %.2f min / %.2f max (%.1f MB per call), "
                  "%.2f GB/s per thread while working",
                  static_cast<unsigned long long>(g.n), g.total * a, pct(0.5), pct(0.9), pct(0.99), g.prep * a,
                  g.quant_sum * a, g.span * a, g.join * a, g.threads * a, g.wake_mean * a, g.wake_max * a, g.work * a,
                  g.wait * a, g.spread * a, g.bytes_min * a, g.bytes_max * a, 1e-6 * double(g.all_bytes) * a,
                  g.rate * a);
    return line;
}

void reset() {
    const int forced = g.forced.load();
    g.prep = g.quant_sum = g.wake_mean = g.wake_max = g.work = g.wait = g.spread = g.join = g.span = g.total =
        g.threads = g.bytes_min = g.bytes_max = g.rate = 0;
    g.n = g.all_bytes = 0;
    g.totals.clear();
    g.forced.store(forced);
}

uint64_t calls() { return g.n; }
uint64_t bytes() { return g.all_bytes; }

}  // namespace host_profile
}  // namespace cpu
}  // namespace gptoss
