// tests/test-kernels-attn.cu - prefill attention on tensor cores (cuda/attention_prefill.cu)
// against the CPU reference cpu::attention on seeded random inputs: sinks, GQA (8 and 4 query
// heads per kv head), causal and 128-token sliding masks at the window edges 127/128/129, a
// cached prefix in a ring of 128 slots (also a chunk longer than the ring), depth > 64k, peaked
// scores; a prompt prefilled in chunks gives the bits of one whole prefill; bad arguments fail
// with a status. The reference takes q rounded to bf16 (the kernel's contract: q/8 is an exact
// scale, then bf16), so what remains is the bf16 rounding of the softmax weights and of the
// output: |got − ref| <= 2e-3 + 8e-3·|ref|. Without a CUDA device it exits 77 (skipped).
#include "tests/kernel-test-util.cuh"

namespace {

float uniform(Rng& r, float a) { return float((r.next_double() * 2.0 - 1.0) * a); }

// Keys/values of positions [0, pos0 + T) (bf16 [pos0 + T, G, D]); the chunk's queries q fp32
// [T, Q, D]. run() puts positions < pos0 in a cache ring of `slots` (later positions overwrite
// earlier ones) and the chunk's keys in k_new/v_new, as the engine does.
struct Case {
    uint32_t Q, G, D = 64;
    uint32_t pos0, T, window, slots;
    std::vector<uint16_t> k, v;
    std::vector<float> q, sinks;
    Case(uint32_t pos0_, uint32_t T_, uint32_t window_, uint32_t slots_, uint64_t seed, float q_amp = 1.5f,
         uint32_t Q_ = 16, uint32_t G_ = 2)
        : Q(Q_), G(G_), pos0(pos0_), T(T_), window(window_), slots(slots_) {
        Rng r(seed);
        const size_t n = size_t(pos0 + T) * G * D;
        k.resize(n);
        v.resize(n);
        for (auto& x : k) x = f32_to_bf16(uniform(r, 1.0f));
        for (auto& x : v) x = f32_to_bf16(uniform(r, 1.0f));
        q.resize(size_t(T) * Q * D);
        for (auto& x : q) x = uniform(r, q_amp);
        sinks.resize(Q);
        for (auto& x : sinks) x = uniform(r, 5.0f);
    }
    // The same keys, sinks and window; the queries of positions [p0, p0 + n) only.
    Case slice(uint32_t p0, uint32_t n) const {
        Case c = *this;
        c.pos0 = p0;
        c.T = n;
        c.k.resize(size_t(p0 + n) * G * D);
        c.v.resize(size_t(p0 + n) * G * D);
        c.q.assign(q.begin() + size_t(p0 - pos0) * Q * D, q.begin() + size_t(p0 - pos0 + n) * Q * D);
        return c;
    }
    std::vector<float> reference() const {
        std::vector<float> out(size_t(T) * Q * D), qr(q);
        for (float& x : qr) x = bf16_to_f32(f32_to_bf16(x));
        // Only the keys some query can see (keeps the depth > 64k case small).
        const uint32_t kv0 = window && pos0 + 1 > window ? pos0 + 1 - window : 0;
        const auto kf = widen(std::vector<uint16_t>(k.begin() + size_t(kv0) * G * D, k.end()));
        const auto vf = widen(std::vector<uint16_t>(v.begin() + size_t(kv0) * G * D, v.end()));
        cpu::attention(qr.data(), T, pos0, Q, G, D, kf.data(), vf.data(), pos0 + T - kv0, kv0, window, sinks.data(),
                       out.data());
        return out;
    }
    // Prefill on the GPU; bf16 outputs in the permuted row layout.
    std::vector<uint16_t> run() const {
        const size_t row = size_t(G) * D;
        std::vector<uint16_t> kc(size_t(slots) * row, 0), vc(size_t(slots) * row, 0);
        for (uint32_t p = 0; p < pos0; ++p) {
            std::copy_n(&k[p * row], row, &kc[(p % slots) * row]);
            std::copy_n(&v[p * row], row, &vc[(p % slots) * row]);
        }
        Dev<uint16_t> kcd(kc), vcd(vc), kn(std::vector<uint16_t>(k.begin() + pos0 * row, k.end())),
            vn(std::vector<uint16_t>(v.begin() + pos0 * row, v.end())), out(size_t(T) * Q * D);
        Dev<float> qd(q), sd(sinks);
        Dev<cuda::StepInfo> step(std::vector<cuda::StepInfo>{cuda::StepInfo{int32_t(pos0), int32_t(T)}});
        cuda::AttentionArgs a;
        a.q = qd.p; a.k_new = kn.p; a.v_new = vn.p; a.k_cache = kcd.p; a.v_cache = vcd.p; a.slots = slots;
        a.window = window; a.sinks = sd.p; a.step = step.p; a.T = T; a.Q = Q; a.G = G; a.D = D; a.out = out.p;
        OK(cuda::attention_prefill(a, nullptr));
        return out.get();
    }
    std::string name() const {
        return "Q " + std::to_string(Q) + " G " + std::to_string(G) + " pos0 " + std::to_string(pos0) + " T " +
               std::to_string(T) + " window " + std::to_string(window) + " slots " + std::to_string(slots);
    }
};

void check_against_reference(const Case& c) {
    const auto got = unpermuted_rows(c.run(), c.T, c.Q * c.D);
    expect_close(got, c.reference(), 2e-3f, 8e-3f, c.name());
}

struct P {
    uint32_t pos0, T, window, slots;
};

TEST_CASE("prefill attention matches cpu::attention: sinks, GQA, causal and window edges 127/128/129") {
    for (P p : {P{0, 1, 0, 1024}, P{0, 2, 128, 128}, P{0, 127, 128, 128}, P{0, 128, 128, 128}, P{0, 129, 128, 128},
                P{0, 300, 0, 1024}, P{0, 300, 128, 128}, P{0, 17, 0, 64}}) {
        check_against_reference(Case(p.pos0, p.T, p.window, p.slots, 50 + p.pos0 + p.T + p.window));
    }
}

TEST_CASE("prefill attention over a cached prefix: ring of 128 slots, a chunk longer than the ring, odd offsets") {
    for (P p : {P{126, 3, 128, 128}, P{127, 1, 128, 128}, P{128, 1, 128, 128}, P{129, 1, 128, 128},
                P{200, 50, 128, 128}, P{1000, 300, 128, 128}, P{63, 70, 0, 1024}, P{600, 40, 0, 1024},
                P{191, 130, 128, 128}, P{700, 1, 0, 1024}}) {
        check_against_reference(Case(p.pos0, p.T, p.window, p.slots, 90 + p.pos0 + p.T + p.window));
    }
}

TEST_CASE("prefill attention at depth > 64k (full and sliding layers)") {
    for (P p : {P{70000, 17, 0, 70017}, P{65530, 40, 0, 65570}, P{70000, 17, 128, 128}}) {
        check_against_reference(Case(p.pos0, p.T, p.window, p.slots, 7 + p.pos0 + p.T + p.window));
    }
}

TEST_CASE("prefill attention: the 64 heads / 8 kv heads of gpt-oss, and 4 query heads per kv head") {
    check_against_reference(Case(100, 40, 0, 1024, 11, 1.5f, 64, 8));
    check_against_reference(Case(100, 40, 128, 128, 12, 1.5f, 64, 8));
    check_against_reference(Case(30, 70, 0, 1024, 13, 1.5f, 8, 2));
    check_against_reference(Case(150, 33, 128, 128, 14, 1.5f, 8, 2));
}

TEST_CASE("prefill attention with peaked scores (bf16 rounding of the weights is the only difference)") {
    for (P p : {P{0, 200, 0, 1024}, P{0, 200, 128, 128}, P{300, 64, 0, 1024}}) {
        check_against_reference(Case(p.pos0, p.T, p.window, p.slots, 300 + p.pos0 + p.window, 40.0f));
    }
}

TEST_CASE("prefill attention is chunk-invariant: chunks give the bits of one whole prefill") {
    for (uint32_t window : {0u, 128u}) {
        const Case whole(0, 700, window, window ? 128 : 1024, 4242 + window);
        const auto all = whole.run();
        const size_t n = size_t(whole.Q) * whole.D;
        uint32_t pos = 0;
        for (uint32_t len : {1u, 15u, 17u, 64u, 3u, 129u, 200u, 1u, 270u}) {
            const auto got = whole.slice(pos, len).run();
            INFO("window " << window << " chunk at " << pos << " of " << len);
            CHECK(std::memcmp(got.data(), all.data() + pos * n, got.size() * 2) == 0);
            pos += len;
        }
        REQUIRE(pos == whole.T);
    }
}

TEST_CASE("prefill attention rejects a cache of 0 slots, head_dim != 64 and > 8 heads per kv head; T = 0 is a no-op") {
    cuda::AttentionArgs a;
    a.T = 4; a.Q = 16; a.G = 2; a.D = 64; a.slots = 0;
    Dev<uint16_t> dummy(16);
    a.k_new = a.v_new = dummy.p;
    CHECK(cuda::attention_prefill(a, nullptr) == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(std::string(gptoss_last_error()).find("0 slots") != std::string::npos);
    a.slots = 16;
    a.D = 128;
    CHECK(cuda::attention_prefill(a, nullptr) == GPTOSS_ERR_UNSUPPORTED);
    a.D = 64;
    a.Q = 32;
    CHECK(cuda::attention_prefill(a, nullptr) == GPTOSS_ERR_UNSUPPORTED);
    a.Q = 16;
    a.T = 0;
    CHECK(cuda::attention_prefill(a, nullptr) == GPTOSS_OK);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

}  // namespace

int main(int argc, char** argv) { return run_kernel_tests(argc, argv, "the prefill attention tests (test-kernels-attn)"); }
