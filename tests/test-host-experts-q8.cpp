// tests/test-host-experts-q8.cpp - the int8-activation path of the host experts
// (cpu/host_experts_q8.h, issue 16) on every kernel this CPU has ("avx2", "avx512-vnni"; the
// first case prints which ran). Oracles, all independent of the kernels:
// - the quantized row, decoded through layout_offset, is within half a step (d/2) of x per element,
//   and its stored 12·Σq and d/2 are what the definition gives;
// - a kernel row equals, up to fp32 rounding (a bound derived below), the exact (double) sum of
//   2^(s-127) · E2M1(code) · q · d over the row — the quantized math done by hand;
// - the same row is within Σ|w|·d/2 (the activations' rounding) + an fp32 bound of the reference
//   dequantization (cpu::mxfp4_dequant_row) dotted with the unquantized x;
// - rows with a scale byte 0 or ≥ 253 are handed back as exact rows, never computed;
// - end to end, host_moe_experts_q8 is within a relative L2 error of 3e-2 of the reference
//   composition (matmul_mxfp4, swiglu, bf16 rounding, matmul_mxfp4), is reproducible bit for bit,
//   gives a token the same bits alone or among others, and falls back to the float path bit for
//   bit when an activation is not finite.
// test-host-experts-q8-simde is this file with the intrinsics emulated by SIMDe (CI runs both kernels).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "cpu/host_experts.h"
#include "cpu/host_experts_q8.h"
#include "cpu/reference.h"
#include "gptoss-internal.h"

#include <cmath>
#include <limits>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace gptoss;
namespace q8 = gptoss::cpu::host_q8;

namespace {

const char* const kKernels[] = {"avx2", "avx512-vnni"};

// Permuted layout of host_experts.cpp: xp[perm(k)] = x[k].
uint32_t perm(uint32_t k) { return (k & ~31u) | ((k & 1u) << 4) | ((k & 31u) >> 1); }

std::vector<float> permuted(const std::vector<float>& x) {
    std::vector<float> p(x.size());
    for (uint32_t k = 0; k < x.size(); k++) p[perm(k)] = x[k];
    return p;
}

// The quantized value of natural element k of a row, and its block's d/2, read back through the layout.
struct Decoded {
    std::vector<int> q;
    std::vector<float> half_d;
    std::vector<int32_t> corr;
};
Decoded decode(const uint8_t* row, uint32_t k) {
    Decoded d;
    const uint32_t nb = k / 32;
    d.q.resize(k);
    d.half_d.resize(nb);
    d.corr.resize(nb);
    for (uint32_t b = 0; b < nb; b++) {
        const uint8_t* g = row + size_t(b / 8) * q8::kGroupBytes;
        uint32_t lane = 0;
        while (q8::kBlockOrder[lane] != b % 8) lane++;
        for (uint32_t e = 0; e < 32; e++) d.q[b * 32 + e] = int8_t(g[q8::layout_offset(lane, e)]);
        std::memcpy(&d.corr[b], g + 256 + lane * 4, 4);
        std::memcpy(&d.half_d[b], g + 288 + lane * 4, 4);
    }
    return d;
}

std::vector<float> random_x(uint32_t k, float amp, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-amp, amp);
    std::vector<float> x(k);
    for (float& v : x) v = bf16_to_f32(f32_to_bf16(u(rng)));
    return x;
}

struct Rows {
    uint32_t N, K;
    std::vector<uint8_t> blocks, scales;
    q8::Mat mat() const { return {blocks.data(), scales.data(), K / 32}; }
};
Rows random_rows(uint32_t N, uint32_t K, std::mt19937& rng, uint8_t s_lo = 118, uint8_t s_span = 13) {
    Rows r{N, K, std::vector<uint8_t>(size_t(N) * K / 2), std::vector<uint8_t>(size_t(N) * K / 32)};
    for (uint8_t& b : r.blocks) b = uint8_t(rng());
    for (uint8_t& s : r.scales) s = uint8_t(s_lo + rng() % s_span);
    return r;
}

// Runs a kernel over all rows for the n inputs; returns the outputs [n][N] and the exact rows.
std::vector<std::vector<float>> run_rows(q8::RowsFn f, const Rows& m, const std::vector<std::vector<uint8_t>>& xq,
                                         std::vector<uint32_t>* exact) {
    const uint32_t n = uint32_t(xq.size());
    std::vector<std::vector<float>> out(n, std::vector<float>(m.N, -12345.0f));
    const uint8_t* xs[4];
    for (uint32_t j = 0; j < n; j++) xs[j] = xq[j].data();
    for (uint32_t r0 = 0; r0 < m.N; r0 += 32) {
        const uint32_t r1 = std::min(m.N, r0 + 32);
        float* outs[4];
        for (uint32_t j = 0; j < n; j++) outs[j] = out[j].data() + r0;
        uint32_t ex[32], n_ex = 0;
        f(m.mat(), r0, r1, xs, n, outs, ex, &n_ex);
        for (uint32_t i = 0; i < n_ex; i++) exact->push_back(ex[i]);
    }
    return out;
}

bool row_exact(const Rows& m, uint32_t r) {
    for (uint32_t b = 0; b < m.K / 32; b++) {
        const uint8_t s = m.scales[size_t(r) * m.K / 32 + b];
        if (s == 0 || s >= 253) return true;
    }
    return false;
}

// Checks one kernel on rows m against both oracles for inputs xs (natural order).
void check_rows(const char* name, q8::RowsFn f, const Rows& m, const std::vector<std::vector<float>>& xs) {
    std::vector<std::vector<uint8_t>> xq;
    std::vector<Decoded> dec;
    for (const auto& x : xs) {
        xq.emplace_back(q8::row_bytes(m.K));
        REQUIRE(q8::quantize_row(permuted(x).data(), m.K, xq.back().data()));
        dec.push_back(decode(xq.back().data(), m.K));
    }
    std::vector<uint32_t> exact;
    const auto out = run_rows(f, m, xq, &exact);
    size_t n_exact_expected = 0;
    for (uint32_t r = 0; r < m.N; r++) n_exact_expected += row_exact(m, r) ? 1 : 0;
    CHECK_MESSAGE(exact.size() == n_exact_expected, name << ": rows handed back as exact");
    const uint32_t nb = m.K / 32, ng = (nb + 7) / 8;
    std::vector<float> w(m.K);
    size_t bad = 0;
    for (uint32_t r = 0; r < m.N; r++) {
        if (row_exact(m, r)) continue;
        cpu::mxfp4_dequant_row(m.blocks.data(), m.scales.data(), m.K, r, w.data());
        for (size_t j = 0; j < xs.size(); j++) {
            // The quantized math by hand, in double: exact up to the final rounding.
            double model = 0, model_abs = 0, quant_bound = 0, abs_sum = 0;
            for (uint32_t b = 0; b < nb; b++) {
                double blk = 0;
                for (uint32_t e = 0; e < 32; e++) {
                    const uint32_t k = b * 32 + e;
                    blk += double(w[k]) * dec[j].q[k] * 2.0 * dec[j].half_d[b];
                    quant_bound += std::fabs(double(w[k])) * dec[j].half_d[b];
                    abs_sum += std::fabs(double(w[k]) * xs[j][k]);
                }
                model += blk;
                model_abs += std::fabs(blk);
            }
            // fp32: d/2 is rounded (2^-24 relative, twice with the product), each of a lane's ng
            // additions and the 3-level lane reduction: (ng + 6) · 2^-24 of Σ|terms|.
            const double fp32_bound = double(ng + 6) * std::ldexp(1.0, -24) * 1.01 * model_abs + 1e-30;
            const double got = out[j][r];
            if (!(std::fabs(got - model) <= fp32_bound) && bad++ < 5)
                std::printf("  %s row %u input %zu: got %.9g, quantized math %.9g (bound %.3g)\n", name, r, j, got,
                            model, fp32_bound);
            // Against the reference dequantization (cpu::mxfp4_dequant_row) dotted in double with
            // the unquantized x: the activations' rounding plus both sides' fp32 error.
            const double ref_bound = quant_bound * 1.0001 + fp32_bound + double(m.K / 8 + 8) * std::ldexp(1.0, -24) * abs_sum;
            double exact_dot = 0;
            for (uint32_t k = 0; k < m.K; k++) exact_dot += double(w[k]) * xs[j][k];
            if (!(std::fabs(got - exact_dot) <= ref_bound) && bad++ < 5)
                std::printf("  %s row %u input %zu: got %.9g, reference %.9g (bound %.3g)\n", name, r, j, got, exact_dot,
                            ref_bound);
        }
    }
    CHECK_MESSAGE(bad == 0, name << ": " << bad << " rows outside the bounds");
}

}  // namespace

TEST_CASE("int8 kernels on this CPU: which run here") {
    std::printf("host experts int8 kernels:");
    for (const char* k : kKernels)
        std::printf(" %s %s;", k, q8::rows_fn_named(k) ? "runs" : "SKIPPED (this CPU or build lacks it)");
    std::printf(" host_moe_experts runs: %s\n", cpu::host_moe_path_name());
    CHECK(cpu::host_moe_path_name() != nullptr);
}

TEST_CASE("quantize_row: every element within d/2, 12·Σq and d/2 as defined, zero rows, non-finite refused") {
    std::mt19937 rng(5);
    for (uint32_t k : {32u, 96u, 256u, 288u, 2880u}) {
        std::vector<float> x = random_x(k, 3.0f, rng);
        for (uint32_t i = 0; i < 32 && i < k; i++) x[i] = 0.0f;  // an all-zero block
        std::vector<uint8_t> row(q8::row_bytes(k));
        REQUIRE(q8::quantize_row(permuted(x).data(), k, row.data()));
        const Decoded d = decode(row.data(), k);
        size_t bad = 0;
        for (uint32_t b = 0; b < k / 32; b++) {
            float amax = 0;
            int32_t sum = 0;
            for (uint32_t e = 0; e < 32; e++) amax = std::max(amax, std::fabs(x[b * 32 + e]));
            for (uint32_t e = 0; e < 32; e++) {
                const int q = d.q[b * 32 + e];
                sum += q;
                const double err = std::fabs(double(x[b * 32 + e]) - 2.0 * d.half_d[b] * q);
                if (q < -127 || q > 127 || err > double(d.half_d[b]) * 1.0001 + 1e-30) bad++;
            }
            if (d.corr[b] != 12 * sum) bad++;
            if (d.half_d[b] != amax / 127.0f * 0.5f) bad++;
        }
        CHECK_MESSAGE(bad == 0, "k = " << k);
    }
    std::vector<float> x = random_x(64, 1.0f, rng);
    std::vector<uint8_t> row(q8::row_bytes(64));
    x[40] = std::numeric_limits<float>::infinity();
    CHECK_FALSE(q8::quantize_row(permuted(x).data(), 64, row.data()));
    x[40] = std::nanf("");
    CHECK_FALSE(q8::quantize_row(permuted(x).data(), 64, row.data()));
}

TEST_CASE("quantize_row: q = nearbyint(x · 127 / amax) exactly, ties to even (v16's rounding without the libm call)") {
    std::mt19937 rng(6);
    const uint32_t k = 2880;
    std::vector<float> x = random_x(k, 3.0f, rng);
    // Ties: blocks whose amax is 127, so x · 127 / amax = x, holding every half-integer in ±126.5.
    for (uint32_t b = 0; b < 8; b++) {
        x[b * 32] = 127.0f;
        for (uint32_t e = 1; e < 32; e++) x[b * 32 + e] = float(int(rng() % 253) - 126) + 0.5f * float(rng() % 2);
    }
    x[8 * 32 + 3] = -0.0f;
    std::vector<uint8_t> row(q8::row_bytes(k));
    REQUIRE(q8::quantize_row(permuted(x).data(), k, row.data()));
    const Decoded d = decode(row.data(), k);
    size_t bad = 0, ties = 0;
    for (uint32_t b = 0; b < k / 32; b++) {
        float amax = 0;
        for (uint32_t e = 0; e < 32; e++) amax = std::max(amax, std::fabs(x[b * 32 + e]));
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (uint32_t e = 0; e < 32; e++) {
            const float v = x[b * 32 + e] * inv;
            ties += v - std::floor(v) == 0.5f ? 1 : 0;
            const int want = int(std::min(127.0f, std::max(-127.0f, std::nearbyint(v))));
            bad += d.q[b * 32 + e] == want ? 0 : 1;
        }
    }
    CHECK(bad == 0);
    CHECK(ties > 50);  // the half-integers above are there
}

TEST_CASE("quantize_block: the SIMD path writes the portable loop's bytes (ties, zeros, tiny and huge blocks, non-finite)") {
    std::mt19937 rng(7);
    const uint32_t k = 32 * 64;
    std::vector<float> x = random_x(k, 3.0f, rng);
    for (uint32_t e = 0; e < 32; e++) x[e] = 0.0f;                                          // block 0: zeros
    for (uint32_t e = 0; e < 32; e++) x[32 + e] = float(int(e) - 16) + 0.5f;                // ties
    x[32] = 127.0f;
    for (uint32_t e = 0; e < 32; e++) x[64 + e] = std::ldexp(float(int(e % 7) - 3), -140);  // denormals: 127 / amax = inf
    for (uint32_t e = 0; e < 32; e++) x[96 + e] = std::ldexp(float(int(e) - 15), 100);      // huge
    x[128 + 5] = -0.0f;
    const std::vector<float> xp = permuted(x);
    std::vector<uint8_t> a(q8::row_bytes(k), 0), b(q8::row_bytes(k), 0);
    for (uint32_t blk = 0; blk < k / 32; blk++) {
        REQUIRE(q8::quantize_block(xp.data(), blk, a.data()));
        REQUIRE(q8::quantize_block_scalar(xp.data(), blk, b.data()));
    }
    CHECK(std::memcmp(a.data(), b.data(), a.size()) == 0);
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), std::nanf("")}) {
        std::vector<float> y = x;
        y[200] = bad;
        const std::vector<float> yp = permuted(y);
        CHECK_FALSE(q8::quantize_block(yp.data(), 200 / 32, a.data()));
        CHECK_FALSE(q8::quantize_block_scalar(yp.data(), 200 / 32, b.data()));
    }
}

TEST_CASE("int8 rows: all codes, realistic scales, K = 32·{1, 7, 8, 9, 90}, 1..4 inputs") {
    std::mt19937 rng(11);
    for (const char* name : kKernels) {
        const q8::RowsFn f = q8::rows_fn_named(name);
        if (!f) continue;
        for (uint32_t K : {32u, 224u, 256u, 288u, 2880u})
            for (uint32_t n : {1u, 2u, 3u, 4u}) {
                const Rows m = random_rows(K == 2880 ? 40 : 70, K, rng);
                std::vector<std::vector<float>> xs;
                for (uint32_t j = 0; j < n; j++) xs.push_back(random_x(K, j == 1 ? 100.0f : 2.0f, rng));
                INFO(name << " K=" << K << " n=" << n);
                check_rows(name, f, m, xs);
            }
    }
}

TEST_CASE("int8 rows: scale bytes 1..236 everywhere; 0 and 253..255 hand the row back") {
    std::mt19937 rng(12);
    for (const char* name : kKernels) {
        const q8::RowsFn f = q8::rows_fn_named(name);
        if (!f) continue;
        // (Up to 236, as test-host-experts: beyond it a row's true sum can pass FLT_MAX, where the
        // fp32 reference overflows too.)
        Rows m = random_rows(64, 288, rng, 1, 236);
        m.scales[3 * 9 + 4] = 0;
        m.scales[10 * 9 + 8] = 253;  // the last block of a partial group
        m.scales[20 * 9 + 0] = 255;
        check_rows(name, f, m, {random_x(288, 1.0f, rng), random_x(288, 1e-20f, rng)});
    }
}

TEST_CASE("host_moe_experts_q8 against the reference composition; reproducible; token-independent; non-finite → float path") {
    std::mt19937 rng(13);
    const uint32_t E = 6, H = 288, I = 320, T = 5, K = 3;
    cpu::MoeWeights w{};
    Rows gu = random_rows(E * 2 * I, H, rng), dn = random_rows(E * H, I, rng);
    std::vector<uint16_t> gb(size_t(E) * 2 * I), db(size_t(E) * H);
    for (uint16_t& v : gb) v = f32_to_bf16(float(int(rng() % 200) - 100) / 1000.0f);
    for (uint16_t& v : db) v = f32_to_bf16(float(int(rng() % 200) - 100) / 1000.0f);
    w = {gu.blocks.data(), gu.scales.data(), gb.data(), dn.blocks.data(), dn.scales.data(), db.data()};
    std::vector<uint16_t> x(size_t(T) * H);
    for (uint16_t& v : x) v = f32_to_bf16(std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng));
    std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 5, 0, 2, 1, 3, 4, 2, 2, 0};
    // The reference composition, per (token, slot).
    std::vector<float> ref(size_t(T) * K * H), g(2 * I), y(I), xf(H);
    for (uint32_t t = 0; t < T; t++) {
        for (uint32_t h = 0; h < H; h++) xf[h] = bf16_to_f32(x[size_t(t) * H + h]);
        for (uint32_t k = 0; k < K; k++) {
            const size_t e = size_t(ids[t * K + k]);
            cpu::matmul_mxfp4(xf.data(), gu.blocks.data() + e * 2 * I * H / 2, gu.scales.data() + e * 2 * I * H / 32,
                              gb.data() + e * 2 * I, 1, H, 2 * I, g.data());
            cpu::swiglu(g.data(), 1, I, 7.0f, y.data());
            for (float& v : y) v = bf16_to_f32(f32_to_bf16(v));
            cpu::matmul_mxfp4(y.data(), dn.blocks.data() + e * H * I / 2, dn.scales.data() + e * H * I / 32,
                              db.data() + e * H, 1, I, H, ref.data() + (size_t(t) * K + k) * H);
        }
    }
    for (const char* name : kKernels) {
        if (!q8::rows_fn_named(name)) continue;
        INFO(name);
        std::vector<float> out(ref.size()), again(ref.size()), alone(size_t(K) * H);
        REQUIRE(cpu::host_moe_experts_q8(name, x.data(), T, H, I, w, ids.data(), K, 7.0f, out.data()));
        double num = 0, den = 0;
        for (size_t i = 0; i < ref.size(); i++) num += (out[i] - ref[i]) * double(out[i] - ref[i]), den += double(ref[i]) * ref[i];
        std::printf("  %s: relative L2 error against the reference composition %.3g\n", name, std::sqrt(num / den));
        // Not a derived bound: with random weights the swiglu outputs are heavy-tailed (most near
        // 0, a few near the clamp), so y's per-block int8 step is large against most of its
        // elements; 2.2e-2 measured here (avx2). The rows cases above hold the rigorous bounds.
        CHECK(std::sqrt(num / den) < 3e-2);
        REQUIRE(cpu::host_moe_experts_q8(name, x.data(), T, H, I, w, ids.data(), K, 7.0f, again.data()));
        CHECK(std::memcmp(out.data(), again.data(), out.size() * sizeof(float)) == 0);
        REQUIRE(cpu::host_moe_experts_q8(name, x.data() + 3 * H, 1, H, I, w, ids.data() + 3 * K, K, 7.0f, alone.data()));
        CHECK(std::memcmp(alone.data(), out.data() + size_t(3) * K * H, alone.size() * sizeof(float)) == 0);
        // A non-finite activation: the whole call takes the float path.
        std::vector<uint16_t> xbad = x;
        xbad[7] = f32_to_bf16(std::numeric_limits<float>::infinity());
        std::vector<float> qbad(ref.size()), fbad(ref.size());
        REQUIRE(cpu::host_moe_experts_q8(name, xbad.data(), T, H, I, w, ids.data(), K, 7.0f, qbad.data()));
        cpu::host_moe_experts_simd(cpu::host_simd_selected(), xbad.data(), T, H, I, w, ids.data(), K, 7.0f, fbad.data());
        CHECK(std::memcmp(qbad.data(), fbad.data(), qbad.size() * sizeof(float)) == 0);
    }
}
