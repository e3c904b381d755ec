// tests/test-kernels-batch.cu - batched decode on the GPU (cuda/batch_decode.h, issue 13): one
// CudaBackend::decode_batch step over N sessions, each at its own position (some past the
// 128-key sliding window, some past 2048 keys), against (a) the same item run alone through
// decode_batch (N = 1): bit for bit, for N = 1, 3, 8, 12, 17, 64, 70 (the attention's CTAs take 1, 2
// or all of a kv head's splits as N grows: partials merged by the last CTA against one CTA's own
// fold), in another order too, and over
// several consecutive steps (K/V written by batched steps read by later ones); (b) the CPU
// reference backend (the oracle), within the bf16 tolerance, on the tiny checkpoint with router
// biases that keep the top-4 away from near-ties. Also: bad items fail alone with their own
// message, a prompt chunk in the batch equals forward() alone, and the sliding window's 4-warp
// CTAs agree with the 8-warp form within the bf16 tolerance; positions past 4 300 keys (longer
// splits) against the CPU too. Sets GPTOSS_CUDA_DECODE_BATCH=1
// (the default) in case the environment turned it off.
#include "tests/kernel-test-util.cuh"

#include "cuda/batch_decode.h"

#include <cstdlib>
#include <memory>

namespace {

constexpr uint32_t kV = 201088;

Backend& gpu() {
    static std::unique_ptr<Checkpoint> ck = load_tiny();
    static std::unique_ptr<Backend> b = [] {
        std::unique_ptr<Backend> out;
        OK(create_cuda_backend(*ck, 0, {}, &out));
        return out;
    }();
    return *b;
}

// Mixed positions: 0, inside the first window, at and past 128 (sliding ring wraps), windows across
// a 512-key split boundary (520, 2048, 2100), past 2048.
uint32_t position_of(uint32_t i) {
    static const uint32_t kPos[] = {0, 1, 5, 127, 128, 129, 200, 300, 64, 2047, 2048, 2100, 17, 250, 520};
    return kPos[i % (sizeof(kPos) / sizeof(kPos[0]))];
}

struct Stream {
    std::unique_ptr<BackendSession> s;
    std::vector<int32_t> toks;
    uint32_t pos = 0;
};

// A session of max_context positions holding the K/V of toks[0, pos) (prefilled in chunks of at
// most 256).
Stream make_stream(Backend& b, uint32_t pos, uint64_t seed, uint32_t max_context = 2304) {
    Stream st;
    OK(b.create_session(max_context, 256, &st.s));
    st.toks = prompt(pos + 16, seed);
    for (uint32_t p = 0; p < pos; p += 256) OK(st.s->forward(st.toks.data() + p, std::min(256u, pos - p), p));
    st.pos = pos;
    return st;
}

DecodeItem item_of(Stream& st) {
    DecodeItem it;
    it.session = st.s.get();
    it.tokens = st.toks.data() + st.pos;
    it.n = 1;
    it.pos = st.pos;
    return it;
}

// Runs one step over the streams in `order`; every item must succeed. Returns the logits by stream.
std::vector<std::vector<float>> step(Backend& b, std::vector<Stream>& streams, const std::vector<uint32_t>& order) {
    std::vector<DecodeItem> items;
    for (uint32_t i : order) items.push_back(item_of(streams[i]));
    std::vector<DecodeItem*> ptrs;
    for (DecodeItem& it : items) ptrs.push_back(&it);
    b.decode_batch(ptrs.data(), uint32_t(ptrs.size()), false);
    for (const DecodeItem& it : items) {
        INFO(it.error);
        REQUIRE(it.status == GPTOSS_OK);
    }
    std::vector<std::vector<float>> out(streams.size());
    for (uint32_t i : order) out[i] = logits_of(streams[i].s.get());
    return out;
}

std::vector<uint32_t> iota(uint32_t n) {
    std::vector<uint32_t> v(n);
    for (uint32_t i = 0; i < n; ++i) v[i] = i;
    return v;
}

}  // namespace

TEST_CASE("a batched step's logits per item equal the item alone, bit for bit, N = 1, 3, 8, 12, 17, 64, 70") {
    REQUIRE(cuda::batch_decode_enabled());
    Backend& b = gpu();
    for (uint32_t n : {1u, 3u, 8u, 12u, 17u, 64u, 70u}) {  // 12: QKV / O at nb 2, lm_head dense; 70: two 64-column tiles, no graph
        CAPTURE(n);
        std::vector<Stream> streams;
        for (uint32_t i = 0; i < n; ++i) streams.push_back(make_stream(b, position_of(i * 7 + n), 100 + i));
        const auto batched = step(b, streams, iota(n));
        for (uint32_t i = 0; i < n; ++i) {
            CAPTURE(i);
            CAPTURE(streams[i].pos);
            const auto alone = step(b, streams, {i});
            CHECK(std::memcmp(alone[i].data(), batched[i].data(), kV * 4) == 0);
        }
        if (n >= 3) {  // another order: the same bits
            std::vector<uint32_t> rev = iota(n);
            std::reverse(rev.begin(), rev.end());
            const auto reversed = step(b, streams, rev);
            for (uint32_t i = 0; i < n; ++i) CHECK(std::memcmp(reversed[i].data(), batched[i].data(), kV * 4) == 0);
        }
    }
}

TEST_CASE("the batched attention's bits do not depend on how many splits a CTA takes") {
    // Positions past 2048 (5 splits of 512 keys) and across a split boundary; group 1 stores every
    // split's partial for the last CTA to merge, 2 and 4 mix both, 8 folds all in one CTA. 66
    // sessions: steps of more than 64 run without a captured graph, which would keep the group of
    // its capture.
    Backend& b = gpu();
    constexpr uint32_t kN = 66;
    std::vector<Stream> streams;
    const uint32_t pos[] = {2100, 2048, 2047, 520, 1030, 5, 1500};
    for (uint32_t i = 0; i < kN; ++i) streams.push_back(make_stream(b, pos[i % 7], 300 + i));
    cuda::set_batch_attention_group(1);
    const auto want = step(b, streams, iota(kN));
    for (uint32_t group : {2u, 4u, 8u, 0u}) {
        CAPTURE(group);
        cuda::set_batch_attention_group(group);
        const auto got = step(b, streams, iota(kN));
        for (uint32_t i = 0; i < kN; ++i) {
            CAPTURE(i);
            CHECK(std::memcmp(got[i].data(), want[i].data(), kV * 4) == 0);
        }
    }
    cuda::set_batch_attention_group(0);
}

TEST_CASE("the batched sliding window in 4-warp CTAs agrees with the 8-warp form within bf16 tolerance") {
    // The two forms split the window's keys between warps differently (other bits); 66 sessions, so
    // no captured graph keeps the form of its capture. Positions at and past the 128-key window's
    // edges and across the sliding ring's wrap; the router biased away from near-ties
    // (load_biased_checkpoint).
    // (The default form against the CPU oracle: "batched decode matches the CPU backend".)
    const BiasedCheckpoint t = load_biased_checkpoint(tiny_dir());
    std::unique_ptr<Backend> g;
    OK(create_cuda_backend(*t.ck, 0, {}, &g));
    Backend& b = *g;
    constexpr uint32_t kN = 66;
    std::vector<Stream> streams;
    for (uint32_t i = 0; i < kN; ++i) streams.push_back(make_stream(b, position_of(i), 700 + i));
    cuda::set_batch_attention_window_warps(8);
    const auto want = step(b, streams, iota(kN));
    cuda::set_batch_attention_window_warps(4);
    const auto got = step(b, streams, iota(kN));
    cuda::set_batch_attention_window_warps(0);
    size_t differ = 0;
    for (uint32_t i = 0; i < kN; ++i) {
        expect_logits_close(got[i], want[i], "position " + std::to_string(streams[i].pos));
        differ += std::memcmp(got[i].data(), want[i].data(), kV * 4) != 0;
    }
    MESSAGE(differ << " of " << kN << " sessions' logits differ in some bits between the two forms");
    CHECK(differ > 0);  // the setting did switch kernels
}

TEST_CASE("consecutive batched steps equal the same sessions stepped alone (K/V of batched steps reused)") {
    Backend& b = gpu();
    const uint32_t n = 8;
    std::vector<Stream> together, apart;
    for (uint32_t i = 0; i < n; ++i) {
        together.push_back(make_stream(b, position_of(i + 3), 300 + i));
        apart.push_back(make_stream(b, position_of(i + 3), 300 + i));
    }
    for (int s = 0; s < 6; ++s) {
        CAPTURE(s);
        const auto t = step(b, together, iota(n));
        for (uint32_t i = 0; i < n; ++i) {
            const auto a = step(b, apart, {i});
            CHECK(std::memcmp(a[i].data(), t[i].data(), kV * 4) == 0);
            ++together[i].pos;
            ++apart[i].pos;
        }
    }
}

TEST_CASE("batched decode matches the CPU backend within bf16 tolerance") {
    const BiasedCheckpoint t = load_biased_checkpoint(tiny_dir());
    std::unique_ptr<Backend> g, c;
    OK(create_cuda_backend(*t.ck, 0, {}, &g));
    OK(create_cpu_backend(*t.ck, &c));
    const uint32_t n = 8;
    const uint32_t pos[n] = {0, 127, 128, 129, 300, 520, 2048, 2100};
    std::vector<Stream> gs, cs;
    for (uint32_t i = 0; i < n; ++i) {
        gs.push_back(make_stream(*g, pos[i], 500 + i));
        cs.push_back(make_stream(*c, pos[i], 500 + i));
    }
    for (int s = 0; s < 2; ++s) {
        const auto gl = step(*g, gs, iota(n));
        const auto cl = step(*c, cs, iota(n));
        for (uint32_t i = 0; i < n; ++i) {
            expect_logits_close(gl[i], cl[i], "position " + std::to_string(gs[i].pos));
            ++gs[i].pos;
            ++cs[i].pos;
        }
    }
}

// Past ~4 300 keys the batched step's splits grow with the position (kernels.h batch_split_len:
// 768 keys at 4 400, 1 024 at 8 200): against the CPU backend, and each item alone bit for bit.
TEST_CASE("batched decode at long positions (longer splits) matches the CPU backend and the item alone") {
    CHECK(cuda::batch_split_len(4400) == 768);
    CHECK(cuda::batch_split_len(8200) == 1024);
    const BiasedCheckpoint t = load_biased_checkpoint(tiny_dir());
    std::unique_ptr<Backend> g, c;
    OK(create_cuda_backend(*t.ck, 0, {}, &g));
    OK(create_cpu_backend(*t.ck, &c));
    const uint32_t n = 3;
    const uint32_t pos[n] = {4400, 6655, 8200};
    std::vector<Stream> gs, cs;
    for (uint32_t i = 0; i < n; ++i) {
        gs.push_back(make_stream(*g, pos[i], 700 + i, 8448));
        cs.push_back(make_stream(*c, pos[i], 700 + i, 8448));
    }
    const auto gl = step(*g, gs, iota(n));
    const auto cl = step(*c, cs, iota(n));
    for (uint32_t i = 0; i < n; ++i) {
        expect_logits_close(gl[i], cl[i], "position " + std::to_string(gs[i].pos));
        const auto alone = step(*g, gs, {i});
        CHECK(std::memcmp(alone[i].data(), gl[i].data(), kV * 4) == 0);
    }
}

TEST_CASE("a bad item fails alone with its own message; a prompt chunk in the step equals forward() alone") {
    Backend& b = gpu();
    std::vector<Stream> streams;
    for (uint32_t i = 0; i < 4; ++i) streams.push_back(make_stream(b, position_of(i + 5), 700 + i));
    const auto alone = [&] {
        std::vector<std::vector<float>> out(4);
        for (uint32_t i : {0u, 3u}) out[i] = step(b, streams, {i})[i];
        return out;
    }();
    Stream chunk_a = make_stream(b, 40, 800), chunk_b = make_stream(b, 40, 800);
    OK(chunk_b.s->forward(chunk_b.toks.data() + 40, 9, 40));
    const auto chunk_ref = logits_of(chunk_b.s.get());

    std::vector<DecodeItem> items{item_of(streams[0]), item_of(streams[1]), item_of(streams[2]), item_of(streams[3])};
    const int32_t bad_token = -5;
    items[1].tokens = &bad_token;
    items[2].pos = 2304;  // the session's max_context
    DecodeItem chunk = item_of(chunk_a);
    chunk.prefill = true;
    chunk.n = 9;
    items.push_back(chunk);
    std::vector<DecodeItem*> ptrs;
    for (DecodeItem& it : items) ptrs.push_back(&it);
    b.decode_batch(ptrs.data(), uint32_t(ptrs.size()), false);
    CHECK(items[0].status == GPTOSS_OK);
    CHECK(items[3].status == GPTOSS_OK);
    CHECK(items[4].status == GPTOSS_OK);
    CHECK(items[1].status == GPTOSS_ERR_INVALID_ARGUMENT);
    CHECK(items[1].error.find("-5") != std::string::npos);
    CHECK(items[2].status == GPTOSS_ERR_CONTEXT_FULL);
    CHECK(items[2].error.find("max_context") != std::string::npos);
    for (uint32_t i : {0u, 3u})
        CHECK(std::memcmp(logits_of(streams[i].s.get()).data(), alone[i].data(), kV * 4) == 0);
    CHECK(std::memcmp(logits_of(chunk_a.s.get()).data(), chunk_ref.data(), kV * 4) == 0);
}

int main(int argc, char** argv) {
    setenv("GPTOSS_CUDA_DECODE_BATCH", "1", 1);
    return run_kernel_tests(argc, argv, "the batched decode tests (test-kernels-batch)");
}
