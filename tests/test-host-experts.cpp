// tests/test-host-experts.cpp - cpu::host_moe_experts (cpu/host_experts.h, issue 16) on every
// SIMD path this CPU has (scalar always, avx2 and avx512 where present; the first test case
// prints which ran and which were skipped) against an oracle composed from the reference ops of
// cpu/reference.h: x widened from bf16, cpu::matmul_mxfp4 (gate_up), cpu::swiglu, bf16
// rounding, cpu::matmul_mxfp4 (down). Tolerances are worst-case bounds, not fudge factors:
// both sides sum the same fp32 products in different orders, so each result is within
// d·2^-24 of the row's abs-sum Σ|x·w| + |b| of the exact sum (d: the deeper summation tree of
// the two, ~1e-5 relative for H = 2880), plus 2^-150 per op where products underflow; the
// swiglu output is rounded to bf16 on both sides, and where the gate_up difference can move it
// across a bf16 rounding boundary, the possible flip (one bf16 step of that y) times |w| is
// added. Rows holding a block scale ≥ 253 (reference dequantizes to inf) must match the
// reference's inf/NaN exactly. Also: results are bit-identical with 1 thread and with a pool of
// 5, and a token's outputs do not depend on the other tokens of the call. test-host-experts-simde
// is this file built with the kernels' intrinsics emulated by SIMDe, so CI runs every path.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "cpu/host_experts.h"
#include "cpu/host_experts_profile.h"
#include "cpu/reference.h"
#include "gptoss-internal.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace gptoss;
using cpu::HostSimd;

namespace {

float kLimit = 7.0f;  // gpt-oss swiglu_limit (one test raises it)

std::vector<HostSimd> supported_paths() {
    std::vector<HostSimd> v;
    for (HostSimd s : {HostSimd::scalar, HostSimd::avx2, HostSimd::avx512})
        if (cpu::host_simd_supported(s)) v.push_back(s);
    return v;
}

// One layer's experts in the checkpoint layout. Bytes and scales come from the callbacks
// (expert, row, block[, byte]) so each test shapes what it needs.
struct Experts {
    uint32_t E, H, I;
    std::vector<uint8_t> gu_blocks, gu_scales, d_blocks, d_scales;
    std::vector<uint16_t> gu_bias, d_bias;
    cpu::MoeWeights view() const {
        return {gu_blocks.data(), gu_scales.data(), gu_bias.data(), d_blocks.data(), d_scales.data(), d_bias.data()};
    }
};

using ByteFn = std::function<uint8_t(uint32_t e, uint32_t row, uint32_t blk, uint32_t i)>;
using ScaleFn = std::function<uint8_t(uint32_t e, uint32_t row, uint32_t blk)>;

void fill(uint32_t E, uint32_t N, uint32_t Kdim, const ByteFn& byte, const ScaleFn& scale, std::vector<uint8_t>& blocks,
          std::vector<uint8_t>& scales) {
    const uint32_t nb = Kdim / 32;
    blocks.resize(size_t(E) * N * nb * 16);
    scales.resize(size_t(E) * N * nb);
    for (uint32_t e = 0; e < E; e++)
        for (uint32_t r = 0; r < N; r++)
            for (uint32_t b = 0; b < nb; b++) {
                const size_t at = (size_t(e) * N + r) * nb + b;
                scales[at] = scale(e, r, b);
                for (uint32_t i = 0; i < 16; i++) blocks[at * 16 + i] = byte(e, r, b, i);
            }
}

std::vector<uint16_t> random_bf16(size_t n, float amplitude, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-amplitude, amplitude);
    std::vector<uint16_t> v(n);
    for (uint16_t& x : v) x = f32_to_bf16(u(rng));
    return v;
}

Experts make_experts(uint32_t E, uint32_t H, uint32_t I, std::mt19937& rng, const ByteFn& gu_byte,
                     const ScaleFn& gu_scale, const ByteFn& d_byte, const ScaleFn& d_scale) {
    Experts x{E, H, I, {}, {}, {}, {}, {}, {}};
    fill(E, 2 * I, H, gu_byte, gu_scale, x.gu_blocks, x.gu_scales);
    fill(E, H, I, d_byte, d_scale, x.d_blocks, x.d_scales);
    x.gu_bias = random_bf16(size_t(E) * 2 * I, 0.5f, rng);
    x.d_bias = random_bf16(size_t(E) * H, 0.5f, rng);
    return x;
}

ByteFn random_bytes(std::mt19937& rng) {
    return [&rng](uint32_t, uint32_t, uint32_t, uint32_t) { return uint8_t(rng() & 0xff); };
}
// Realistic scales: 2^-9 .. 2^3.
ScaleFn random_scales(std::mt19937& rng) {
    return [&rng](uint32_t, uint32_t, uint32_t) { return uint8_t(118 + rng() % 13); };
}

// Error-bound helpers. gamma: the relative bound on the difference of two fp32 summation
// orders of n products: depth of the reference's dot (n/8 serial + 3 pairwise + bias) plus
// the kernels' (≤ 8 partial sums of 4 per block or a 4-deep chain, a scale product, n/32
// block sums, 3-4 lanes reductions, bias: n/32 + 40 covers every path), each step ≤ 2^-24.
double gamma(uint32_t n) { return double(n / 8 + 4 + n / 32 + 40) * std::ldexp(1.0, -24) * 1.01; }
// Ops whose products may underflow: each loses at most 2^-150 absolute.
double underflow_floor(uint32_t n) { return double(2 * n + n / 32 + 64) * std::ldexp(1.0, -149); }

bool row_is_exact(const uint8_t* scales, uint32_t nb) {
    for (uint32_t b = 0; b < nb; b++)
        if (scales[b] >= 253) return true;
    return false;
}

// swiglu's extreme value over gate in [g0, g1], up in [u0, u1] (doubles): (clamp(up) + 1) is
// monotone, glu(min(gate, limit)) = g·sigmoid(1.702 g) has one minimum (g ≈ -0.7512), so the
// extremes are among the corner products with glu at the ends and at that minimum.
double glu(double g) {
    g = std::min(g, double(kLimit));
    return g / (1.0 + std::exp(-1.702 * g));
}
double swiglu_min_max(double g0, double g1, double u0, double u1, bool want_max) {
    const double clamp_lo = -double(kLimit), clamp_hi = double(kLimit);
    const double f[2] = {std::min(std::max(u0, clamp_lo), clamp_hi) + 1.0, std::min(std::max(u1, clamp_lo), clamp_hi) + 1.0};
    double gl[3] = {glu(g0), glu(g1), glu(g0)};
    const double g_star = -0.751154;  // argmin of g·sigmoid(1.702 g)
    if (g0 < g_star && g_star < g1) gl[2] = glu(g_star);
    double best = want_max ? -1e300 : 1e300;
    for (double a : f)
        for (double b : gl) best = want_max ? std::max(best, a * b) : std::min(best, a * b);
    return best;
}
double swiglu_range(double g0, double g1, double u0, double u1) {
    return std::max(std::fabs(swiglu_min_max(g0, g1, u0, u1, false)), std::fabs(swiglu_min_max(g0, g1, u0, u1, true)));
}

// The oracle: out [T, K, H] and the allowed error of each element.
struct Oracle {
    std::vector<float> out;
    std::vector<double> tol;
};

// One expert's MXFP4 matrix [N, Kdim] in the checkpoint layout.
struct Matrix {
    const uint8_t* blocks;
    const uint8_t* scales;
    const uint16_t* bias;
    uint32_t N, Kdim;
};

// out = the reference's matmul_mxfp4 of one input row; err[n] = how far a kernel's result may
// be from it (0 for rows the kernels compute in the reference's exact order).
void reference_row_bounds(const Matrix& m, const float* in, float* out, double* err) {
    const uint32_t nb = m.Kdim / 32;
    cpu::matmul_mxfp4(in, m.blocks, m.scales, m.bias, 1, m.Kdim, m.N, out);
    std::vector<float> wrow(m.Kdim);
    for (uint32_t n = 0; n < m.N; n++) {
        err[n] = 0;
        if (row_is_exact(m.scales + size_t(n) * nb, nb)) continue;
        cpu::mxfp4_dequant_row(m.blocks, m.scales, m.Kdim, n, wrow.data());
        double abs_sum = std::fabs(bf16_to_f32(m.bias[n]));
        for (uint32_t k = 0; k < m.Kdim; k++) abs_sum += std::fabs(double(in[k]) * wrow[k]);
        err[n] = gamma(m.Kdim) * abs_sum + underflow_floor(m.Kdim);
    }
}

// The kernel's gate and up lie within eg of ours; swiglu over those intervals (clamps, and glu's
// one minimum at g ≈ -0.75) bounds the kernel's fp32 y, and rounding is monotone, so its bf16 y
// lies between round(y_min) and round(y_max): dy[i] = the largest step from our bf16 y.
void swiglu_flip_bounds(const float* g, const double* eg, const float* ybf, uint32_t I, double* dy) {
    for (uint32_t i = 0; i < I; i++) {
        const double gate = g[2 * i], up = g[2 * i + 1], eg_gate = eg[2 * i], eg_up = eg[2 * i + 1];
        dy[i] = 0;
        if (eg_gate == 0 && eg_up == 0) continue;
        const double g0 = gate - eg_gate, g1 = gate + eg_gate, u0 = up - eg_up, u1 = up + eg_up;
        const double slack = 8 * std::ldexp(1.0, -24) * swiglu_range(g0, g1, u0, u1) + std::ldexp(1.0, -140);
        const double lo = bf16_to_f32(f32_to_bf16(float(swiglu_min_max(g0, g1, u0, u1, false) - slack)));
        const double hi = bf16_to_f32(f32_to_bf16(float(swiglu_min_max(g0, g1, u0, u1, true) + slack)));
        dy[i] = std::max(std::fabs(lo - ybf[i]), std::fabs(hi - ybf[i]));
    }
}

// The down projection's bound per output: the summation-order bound plus, for each y that may
// round the other way, that step times |w|.
void down_bounds(const Matrix& m, const float* ybf, const double* dy, double* tol) {
    std::vector<float> wrow(m.Kdim);
    for (uint32_t h = 0; h < m.N; h++) {
        cpu::mxfp4_dequant_row(m.blocks, m.scales, m.Kdim, h, wrow.data());
        double abs_sum = std::fabs(bf16_to_f32(m.bias[h])), flips = 0;
        for (uint32_t i = 0; i < m.Kdim; i++) {
            abs_sum += std::fabs(double(ybf[i]) * wrow[i]);
            if (dy[i] > 0 && wrow[i] != 0) flips += dy[i] * std::fabs(wrow[i]);
        }
        tol[h] = gamma(m.Kdim) * abs_sum + underflow_floor(m.Kdim) + flips;
    }
}

Oracle oracle(const Experts& w, const std::vector<uint16_t>& x, uint32_t T, const std::vector<int32_t>& experts,
              uint32_t K) {
    const uint32_t H = w.H, I = w.I, nbH = H / 32, nbI = I / 32;
    Oracle o;
    o.out.assign(size_t(T) * K * H, 0.0f);
    o.tol.assign(size_t(T) * K * H, 0.0);
    std::vector<float> xf(H), g(2 * I), y(I), ybf(I);
    std::vector<double> eg(2 * I), dy(I);
    for (uint32_t t = 0; t < T; t++) {
        for (uint32_t h = 0; h < H; h++) xf[h] = bf16_to_f32(x[size_t(t) * H + h]);
        for (uint32_t k = 0; k < K; k++) {
            const size_t e = size_t(experts[size_t(t) * K + k]);
            const Matrix gu{w.gu_blocks.data() + e * 2 * I * nbH * 16, w.gu_scales.data() + e * 2 * I * nbH,
                            w.gu_bias.data() + e * 2 * I, 2 * I, H};
            const Matrix down{w.d_blocks.data() + e * H * nbI * 16, w.d_scales.data() + e * H * nbI,
                              w.d_bias.data() + e * H, H, I};
            reference_row_bounds(gu, xf.data(), g.data(), eg.data());
            cpu::swiglu(g.data(), 1, I, kLimit, y.data());
            for (uint32_t i = 0; i < I; i++) ybf[i] = bf16_to_f32(f32_to_bf16(y[i]));
            swiglu_flip_bounds(g.data(), eg.data(), ybf.data(), I, dy.data());
            const size_t base = (size_t(t) * K + k) * H;
            cpu::matmul_mxfp4(ybf.data(), down.blocks, down.scales, down.bias, 1, I, H, o.out.data() + base);
            down_bounds(down, ybf.data(), dy.data(), o.tol.data() + base);
        }
    }
    return o;
}

// Compares got with the oracle: non-finite reference values must match in kind (NaN, or the
// same infinity); finite ones must be finite and within the bound. Returns the mismatch count
// and prints the first few.
size_t compare(const Oracle& o, const std::vector<float>& got, const char* what, double* worst_ratio = nullptr) {
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const float r = o.out[i], v = got[i];
        bool ok;
        if (std::isnan(r)) ok = std::isnan(v);
        else if (std::isinf(r)) ok = v == r;
        else {
            const double err = std::fabs(double(v) - double(r));
            ok = std::isfinite(v) && err <= o.tol[i];
            if (std::isfinite(v) && o.tol[i] > 0) worst = std::max(worst, err / o.tol[i]);
        }
        if (!ok && bad++ < 5)
            std::printf("  %s: element %zu: got %.9g, reference %.9g, allowed error %.3g\n", what, i, double(v),
                        double(r), o.tol[i]);
    }
    if (worst_ratio) *worst_ratio = worst;
    return bad;
}

std::vector<float> run(HostSimd simd, const Experts& w, const std::vector<uint16_t>& x, uint32_t T,
                       const std::vector<int32_t>& experts, uint32_t K) {
    std::vector<float> out(size_t(T) * K * w.H, -12345.0f);
    cpu::host_moe_experts_simd(simd, x.data(), T, w.H, w.I, w.view(), experts.data(), K, kLimit, out.data());
    return out;
}

// Checks every supported path against the oracle; returns the number of mismatches.
size_t check_all_paths(const Experts& w, const std::vector<uint16_t>& x, uint32_t T, const std::vector<int32_t>& experts,
                       uint32_t K, const std::string& what) {
    const Oracle o = oracle(w, x, T, experts, K);
    size_t bad = 0;
    for (HostSimd s : supported_paths()) {
        const std::string name = what + " [" + cpu::host_simd_name(s) + "]";
        double worst = 0;
        const size_t b = compare(o, run(s, w, x, T, experts, K), name.c_str(), &worst);
        INFO(name << ": worst error / bound " << worst);
        CHECK_MESSAGE(b == 0, name << ": " << b << " elements outside the bound");
        bad += b;
    }
    return bad;
}

std::vector<int32_t> random_experts(uint32_t T, uint32_t K, uint32_t E, std::mt19937& rng, bool distinct = true) {
    std::vector<int32_t> ids(size_t(T) * K);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t k = 0; k < K; k++) {
            int32_t e;
            bool again;
            do {
                e = int32_t(rng() % E);
                again = false;
                if (distinct)
                    for (uint32_t j = 0; j < k; j++) again |= ids[size_t(t) * K + j] == e;
            } while (again);
            ids[size_t(t) * K + k] = e;
        }
    return ids;
}

}  // namespace

TEST_CASE("SIMD paths on this CPU: which run here") {
    std::printf("host experts SIMD paths:");
    for (HostSimd s : {HostSimd::scalar, HostSimd::avx2, HostSimd::avx512})
        std::printf(" %s %s;", cpu::host_simd_name(s),
                    cpu::host_simd_supported(s) ? "runs" : "SKIPPED (this CPU or build lacks it)");
    std::printf(" selected: %s\n", cpu::host_simd_name(cpu::host_simd_selected()));
#ifdef GPTOSS_HOST_SIMDE
    std::printf("  (test-host-experts-simde: the avx2 and avx512 paths run emulated by SIMDe)\n");
#endif
    CHECK(cpu::host_simd_supported(HostSimd::scalar));
    CHECK(cpu::host_simd_supported(cpu::host_simd_selected()));
}

TEST_CASE("all 16 E2M1 codes in both nibbles, every byte value, against the reference") {
    std::mt19937 rng(1);
    const uint32_t E = 4, H = 96, I = 160, T = 3, K = 2;
    // Byte (row, block, i) walks all 256 values, so each code meets each code in the other
    // nibble and each element position.
    const ByteFn walk = [](uint32_t e, uint32_t r, uint32_t b, uint32_t i) {
        return uint8_t((e * 37 + r * 11 + b * 16 + i) & 0xff);
    };
    const Experts w = make_experts(E, H, I, rng, walk, random_scales(rng), walk, random_scales(rng));
    bool low_seen[16] = {}, high_seen[16] = {};
    for (uint8_t b : w.gu_blocks) low_seen[b & 15] = high_seen[b >> 4] = true;
    for (int c = 0; c < 16; c++) REQUIRE((low_seen[c] && high_seen[c]));
    const std::vector<uint16_t> x = random_bf16(size_t(T) * H, 2.0f, rng);
    CHECK(check_all_paths(w, x, T, random_experts(T, K, E, rng), K, "codes") == 0);
}

TEST_CASE("E8M0 scales 0..236 row by row, in gate_up and in down") {
    std::mt19937 rng(2);
    const uint32_t E = 3, H = 160, I = 160, T = 1, K = 3;
    // Each row one scale, the rows of the three experts walking 0..236 (2^-127 .. 2^109: the
    // largest whose sums stay finite here, |y| ≤ 56), so a wrong scale anywhere moves a whole
    // row by a power of two; biases are zero so that tiny rows are not hidden behind them.
    // 237..255 are the next test's.
    const ScaleFn gu_by_pair = [](uint32_t e, uint32_t r, uint32_t) { return uint8_t((e * 160 + r / 2) * 7 % 237); };
    const ScaleFn d_by_row = [](uint32_t e, uint32_t r, uint32_t) { return uint8_t((e * 160 + r) * 7 % 237); };
    const ScaleFn every_block = [](uint32_t e, uint32_t r, uint32_t b) { return uint8_t((r * 7 + b * 29 + e) % 237); };
    const ScaleFn one = [](uint32_t, uint32_t, uint32_t) { return uint8_t(127); };
    // Down row h = 1.0 · y[h]: each output shows one swiglu output, so one gate_up pair's scale.
    const ByteFn one_hot = [](uint32_t, uint32_t h, uint32_t b, uint32_t i) {
        return uint8_t(b * 32 + 2 * i == h ? 0x02 : b * 32 + 2 * i + 1 == h ? 0x20 : 0x00);
    };
    const std::vector<int32_t> ids{2, 0, 1};
    auto zero_biases = [](Experts& w) {
        std::fill(w.gu_bias.begin(), w.gu_bias.end(), 0);
        std::fill(w.d_bias.begin(), w.d_bias.end(), 0);
    };
    SUBCASE("gate_up") {
        Experts w = make_experts(E, H, I, rng, random_bytes(rng), gu_by_pair, one_hot, one);
        zero_biases(w);
        const std::vector<uint16_t> x = random_bf16(size_t(T) * H, 2.0f, rng);
        CHECK(check_all_paths(w, x, T, ids, K, "gate_up scales") == 0);
    }
    SUBCASE("down") {
        Experts w = make_experts(E, H, I, rng, random_bytes(rng), random_scales(rng), random_bytes(rng), d_by_row);
        zero_biases(w);
        const std::vector<uint16_t> x = random_bf16(size_t(T) * H, 2.0f, rng);
        CHECK(check_all_paths(w, x, T, ids, K, "down scales") == 0);
    }
    SUBCASE("mixed within rows") {
        const Experts w =
            make_experts(E, H, I, rng, random_bytes(rng), every_block, random_bytes(rng), every_block);
        const std::vector<uint16_t> x = random_bf16(size_t(T) * H, 2.0f, rng);
        CHECK(check_all_paths(w, x, T, ids, K, "mixed scales") == 0);
    }
}

TEST_CASE("scales 253..255 (inf in the reference's dequantization): same inf/NaN as the reference") {
    std::mt19937 rng(3);
    const uint32_t E = 2, H = 96, I = 96, T = 2, K = 2;
    // One row in five has one block at 253, 254 or 255; x is small (|x| ≤ 2^-10) so the
    // remaining finite sums cannot overflow in one order and not in another.
    const ScaleFn extreme = [](uint32_t, uint32_t r, uint32_t b) {
        return uint8_t(r % 5 == 0 && b == r % 3 ? 253 + (r / 5) % 3 : 118 + (r + b) % 13);
    };
    // Rows 5 apart from those: the extreme block's codes all nonzero (±inf, no 0·inf).
    const ByteFn bytes = [&rng](uint32_t, uint32_t r, uint32_t, uint32_t) {
        const uint8_t b = uint8_t(rng() & 0xff);
        return r % 10 == 5 ? uint8_t(b | 0x11) : b;
    };
    SUBCASE("down") {
        const Experts w = make_experts(E, H, I, rng, random_bytes(rng), random_scales(rng), bytes, extreme);
        const std::vector<uint16_t> x = random_bf16(size_t(T) * H, 2.0f, rng);
        CHECK(check_all_paths(w, x, T, {0, 1, 1, 0}, K, "down extremes") == 0);
    }
    SUBCASE("gate_up") {
        const Experts w = make_experts(E, H, I, rng, bytes, extreme, random_bytes(rng), random_scales(rng));
        const std::vector<uint16_t> x = random_bf16(size_t(T) * H, 1.0f / 1024, rng);
        CHECK(check_all_paths(w, x, T, {0, 1, 1, 0}, K, "gate_up extremes") == 0);
    }
    SUBCASE("finite weights give no NaN or inf") {
        const ScaleFn top = [](uint32_t, uint32_t r, uint32_t) { return uint8_t(r % 2 ? 236 : 126); };
        const Experts w = make_experts(E, H, I, rng, random_bytes(rng), random_scales(rng), random_bytes(rng), top);
        const std::vector<uint16_t> x = random_bf16(size_t(T) * H, 2.0f, rng);
        for (HostSimd s : supported_paths()) {
            const std::vector<float> out = run(s, w, x, T, {0, 1, 1, 0}, K);
            CHECK(std::all_of(out.begin(), out.end(), [](float v) { return std::isfinite(v); }));
        }
    }
}

TEST_CASE("huge activations (|x| up to 2^120) and a huge swiglu limit stay as finite as in the reference") {
    std::mt19937 rng(7);
    const uint32_t E = 2, H = 96, I = 96, T = 2, K = 2;
    // Scales 2^-27..2^-17 keep the reference's sums finite; the avx2 path's weights carry 2^25,
    // so it must hand such inputs to a loop that does not.
    const ScaleFn small = [&rng](uint32_t, uint32_t, uint32_t) { return uint8_t(100 + rng() % 11); };
    SUBCASE("x") {
        const Experts w = make_experts(E, H, I, rng, random_bytes(rng), small, random_bytes(rng), random_scales(rng));
        std::vector<uint16_t> x = random_bf16(size_t(T) * H, 2.0f, rng);
        for (uint16_t& v : x) v = f32_to_bf16(std::ldexp(bf16_to_f32(v), 90 + int(rng() % 31)));
        CHECK(check_all_paths(w, x, T, {0, 1, 1, 0}, K, "huge x") == 0);
    }
    SUBCASE("y") {
        // gate_up scales 2^48: |gate|, |up| up to ~2^55, y = (up + 1) · glu(gate) up to ~2^110.
        const ScaleFn big = [](uint32_t, uint32_t, uint32_t) { return uint8_t(175); };
        const Experts w = make_experts(E, H, I, rng, random_bytes(rng), big, random_bytes(rng), small);
        const std::vector<uint16_t> x = random_bf16(size_t(T) * H, 2.0f, rng);
        kLimit = 1e30f;
        CHECK(check_all_paths(w, x, T, {0, 1, 1, 0}, K, "huge y") == 0);
        kLimit = 7.0f;
    }
}

TEST_CASE("odd shapes: H, I = 32·odd; T = 1, 3, 17; K = 1..4; E up to 32; repeated experts") {
    std::mt19937 rng(4);
    struct Shape {
        uint32_t E, H, I;
    };
    for (const Shape sh : {Shape{32, 96, 160}, Shape{4, 160, 96}, Shape{3, 32, 224}, Shape{8, 224, 32}}) {
        const Experts w =
            make_experts(sh.E, sh.H, sh.I, rng, random_bytes(rng), random_scales(rng), random_bytes(rng), random_scales(rng));
        for (uint32_t T : {1u, 3u, 17u})
            for (uint32_t K = 1; K <= std::min(4u, sh.E); K++) {
                const std::vector<uint16_t> x = random_bf16(size_t(T) * sh.H, 2.0f, rng);
                const std::string what = "E=" + std::to_string(sh.E) + " H=" + std::to_string(sh.H) +
                                         " I=" + std::to_string(sh.I) + " T=" + std::to_string(T) +
                                         " K=" + std::to_string(K);
                CHECK(check_all_paths(w, x, T, random_experts(T, K, sh.E, rng), K, what) == 0);
            }
    }
    // The same expert twice for one token (two pairs, one group) is computed twice alike.
    const Experts w = make_experts(4, 96, 96, rng, random_bytes(rng), random_scales(rng), random_bytes(rng),
                                   random_scales(rng));
    const std::vector<uint16_t> x = random_bf16(3 * 96, 2.0f, rng);
    CHECK(check_all_paths(w, x, 3, {2, 2, 0, 1, 3, 3}, 2, "repeated within a token") == 0);
}

TEST_CASE("the real shape: H = I = 2880") {
    std::mt19937 rng(5);
    const uint32_t E = 4, H = 2880, I = 2880, T = 3, K = 4;
    const Experts w = make_experts(E, H, I, rng, random_bytes(rng), random_scales(rng), random_bytes(rng), random_scales(rng));
    const std::vector<uint16_t> x = random_bf16(size_t(T) * H, 2.0f, rng);
    CHECK(check_all_paths(w, x, T, random_experts(T, K, E, rng), K, "2880") == 0);
}

TEST_CASE("bit-identical with 1 thread and with a pool of 5; a token's outputs do not depend on the others") {
    std::mt19937 rng(6);
    const uint32_t E = 8, H = 160, I = 224, T = 17, K = 4;
    const Experts w = make_experts(E, H, I, rng, random_bytes(rng), random_scales(rng), random_bytes(rng), random_scales(rng));
    const std::vector<uint16_t> x = random_bf16(size_t(T) * H, 2.0f, rng);
    const std::vector<int32_t> ids = random_experts(T, K, E, rng);
    cpu::host_moe_reserve(64, 4, 2880, 2880);  // larger than every call here: no call allocates
    for (HostSimd s : supported_paths()) {
        INFO("path " << cpu::host_simd_name(s));
        const std::vector<float> alone = run(s, w, x, T, ids, K);  // no pool: the calling thread only
        std::vector<float> pooled, one;
        {
            setenv("GPTOSS_THREADS", "5", 1);
            cpu::PoolHold hold;
            pooled = run(s, w, x, T, ids, K);
        }
        {
            setenv("GPTOSS_THREADS", "1", 1);
            cpu::PoolHold hold;
            one = run(s, w, x, T, ids, K);
        }
        unsetenv("GPTOSS_THREADS");
        CHECK(std::memcmp(alone.data(), pooled.data(), alone.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(alone.data(), one.data(), alone.size() * sizeof(float)) == 0);
        // Token 5 alone (T = 1) gives the same bits as inside the call of 17.
        const std::vector<uint16_t> x5(x.begin() + 5 * H, x.begin() + 6 * H);
        const std::vector<int32_t> ids5(ids.begin() + 5 * K, ids.begin() + 6 * K);
        const std::vector<float> single = run(s, w, x5, 1, ids5, K);
        CHECK(std::memcmp(single.data(), alone.data() + size_t(5) * K * H, single.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("measure_host_read_gbps returns a positive rate") {
    const double gbps = cpu::measure_host_read_gbps(size_t(64) << 20);
    CHECK(gbps > 0.0);
    CHECK(std::isfinite(gbps));
}

TEST_CASE("work splits (HostMoeTuning): every split gives the same bits; odd row counts, threads > rows, one thread") {
    std::mt19937 rng(8);
    // gate_up 320 rows = 5 int8 units of 64 (10 float units of 32), down 96 rows = 3 units: fewer
    // units than pool threads, and ranges that do not divide them evenly.
    const uint32_t E = 5, H = 96, I = 160, K = 3;
    const Experts w = make_experts(E, H, I, rng, random_bytes(rng), random_scales(rng), random_bytes(rng), random_scales(rng));
    const cpu::HostMoeTuning saved = cpu::host_moe_tuning();
    const cpu::HostMoeTuning v13{0, 0, false};
    const std::vector<cpu::HostMoeTuning> tunings = {{1, 0, false}, {1, 256, false}, {2, 2048, true},
                                                     {3, 64, true}, {64, 65536, true}, {1, 0, true},
                                                     {2, 2048, true, 0, 256}, {4, 4096, true, 1, 1024},
                                                     {1, 8, true, 2, 1}};
    std::vector<std::string> q8_kernels;
    for (const char* k : {"avx2", "avx512-vnni"}) {
        std::vector<float> probe(size_t(K) * H);
        const std::vector<uint16_t> x1 = random_bf16(H, 1.0f, rng);
        const std::vector<int32_t> ids1{0, 1, 2};
        if (cpu::host_moe_experts_q8(k, x1.data(), 1, H, I, w.view(), ids1.data(), K, kLimit, probe.data()))
            q8_kernels.push_back(k);
    }
    for (uint32_t T : {1u, 3u, 17u}) {
        const std::vector<uint16_t> x = random_bf16(size_t(T) * H, 2.0f, rng);
        const std::vector<int32_t> ids = random_experts(T, K, E, rng);
        // Each path's (float, then each int8 kernel's) v13 bits, on the calling thread.
        cpu::host_moe_set_tuning(v13);
        std::vector<std::vector<float>> want;
        for (HostSimd s : supported_paths()) want.push_back(run(s, w, x, T, ids, K));
        for (const std::string& k : q8_kernels) {
            want.emplace_back(size_t(T) * K * H);
            REQUIRE(cpu::host_moe_experts_q8(k.c_str(), x.data(), T, H, I, w.view(), ids.data(), K, kLimit,
                                             want.back().data()));
        }
        for (unsigned threads : {1u, 3u, 7u}) {
            setenv("GPTOSS_THREADS", std::to_string(threads).c_str(), 1);
            cpu::PoolHold hold;
            REQUIRE(cpu::parallel_threads() == threads);
            for (const cpu::HostMoeTuning& t : tunings) {
                cpu::host_moe_set_tuning(t);
                INFO("T=" << T << " threads=" << threads << " ranges/thread=" << t.ranges_per_thread
                          << " prefetch=" << t.prefetch_bytes << " one_pass=" << t.one_pass);
                size_t at = 0;
                for (HostSimd s : supported_paths()) {
                    const std::vector<float> got = run(s, w, x, T, ids, K);
                    CHECK_MESSAGE(std::memcmp(got.data(), want[at++].data(), got.size() * sizeof(float)) == 0,
                                  cpu::host_simd_name(s));
                }
                for (const std::string& k : q8_kernels) {
                    std::vector<float> got(size_t(T) * K * H);
                    REQUIRE(cpu::host_moe_experts_q8(k.c_str(), x.data(), T, H, I, w.view(), ids.data(), K, kLimit,
                                                     got.data()));
                    CHECK_MESSAGE(std::memcmp(got.data(), want[at++].data(), got.size() * sizeof(float)) == 0, k);
                }
            }
            // And against the oracle under one of the new splits, not only against v13's bits.
            cpu::host_moe_set_tuning(tunings[2]);
            CHECK(check_all_paths(w, x, T, ids, K, "split T=" + std::to_string(T)) == 0);
        }
        unsetenv("GPTOSS_THREADS");
    }
    cpu::host_moe_set_tuning(saved);
}

TEST_CASE("host_weights_alloc: 2 MiB-aligned, usable, either page advice") {
    for (bool huge : {true, false}) {
        const size_t n = (size_t(3) << 20) + 5;
        auto* p = static_cast<uint8_t*>(cpu::host_weights_alloc(n, huge));
        REQUIRE(p != nullptr);
        CHECK(reinterpret_cast<uintptr_t>(p) % (size_t(2) << 20) == 0);
        std::memset(p, 0x5a, n);
        CHECK(p[n - 1] == 0x5a);
        cpu::host_weights_free(p);
    }
}

TEST_CASE("the experts pass's timer (host_experts_profile): T = 1 calls only, every weight byte counted once") {
    std::mt19937 rng(12);
    const uint32_t E = 6, H = 96, I = 160, K = 4;
    const Experts w = make_experts(E, H, I, rng, random_bytes(rng), random_scales(rng), random_bytes(rng), random_scales(rng));
    const std::vector<uint16_t> x = random_bf16(size_t(2) * H, 1.0f, rng);
    const std::vector<int32_t> ids{0, 3, 4, 5, 1, 2, 3, 4};  // token 0: 4 distinct experts
    const uint64_t per_call = uint64_t(K) * (2 * I * (H / 32) + H * (I / 32)) * 17;  // blocks + scales
    setenv("GPTOSS_THREADS", "3", 1);
    cpu::PoolHold hold;
    cpu::pool_set_caller_spin(500);  // the caller's spin too: same bits, same bytes
    std::vector<float> off(size_t(K) * H), on(size_t(K) * H), two(size_t(2) * K * H);
    cpu::host_profile::set_on(false);
    cpu::host_moe_experts(x.data(), 1, H, I, w.view(), ids.data(), K, kLimit, off.data());
    cpu::host_profile::reset();
    CHECK(cpu::host_profile::report().empty());
    cpu::host_profile::set_on(true);
    for (int i = 0; i < 3; i++) cpu::host_moe_experts(x.data(), 1, H, I, w.view(), ids.data(), K, kLimit, on.data());
    cpu::host_moe_experts(x.data(), 2, H, I, w.view(), ids.data(), K, kLimit, two.data());  // T = 2: not recorded
    cpu::host_profile::set_on(false);
    cpu::pool_set_caller_spin(0);
    CHECK(cpu::host_profile::calls() == 3);
    CHECK(cpu::host_profile::bytes() == 3 * per_call);
    CHECK(std::memcmp(on.data(), off.data(), on.size() * sizeof(float)) == 0);
    const std::string line = cpu::host_profile::report();
    MESSAGE(line);
    CHECK(line.find("3 calls at T = 1") != std::string::npos);
    cpu::host_profile::reset();
    CHECK(cpu::host_profile::calls() == 0);
    unsetenv("GPTOSS_THREADS");
}
