// tests/fuzz/fuzz-harmony.cpp - the Harmony streaming parser and gptoss_chat's ChatStream (stop
// strings) on arbitrary token streams: the model's output is untrusted too. Input: byte 0 =
// flags (bit 0: the prompt ended in "<|start|>assistant" for the bare parser; bits 1-2: number
// of stop strings), then each stop string as a length byte (low 3 bits) and its bytes, then the
// tokens as 4-byte little-endian words modulo the vocabulary. Stop strings go through the same
// check as gptoss_chat's (make_generate_options); rejected ones end the input there.
// Oracles: every event's text and every message's content is valid UTF-8; no final message and
// no run of final-channel event text (what becomes gptoss_chat_result.final) holds a stop string.
#include "tests/fuzz/fuzz-common.h"
#include "tokenizer/harmony.h"

#include <cstring>
#include <vector>

namespace h = gptoss::harmony;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const gptoss::Tokenizer& tokenizer = fuzz_tokenizer();
    if (size == 0) return 0;
    const bool assistant_started = data[0] & 1;
    const int n_stops = (data[0] >> 1) & 3;
    size_t at = 1;
    std::vector<std::string> stops;
    for (int i = 0; i < n_stops && at < size; ++i) {
        const size_t want = data[at++] & 7;
        const size_t len = std::min(want, size - at);
        stops.emplace_back(reinterpret_cast<const char*>(data + at), len);
        at += len;
    }
    std::vector<const char*> stop_ptrs;
    for (const std::string& s : stops) stop_ptrs.push_back(s.c_str());
    gptoss_sampling_params params = gptoss_sampling_default_params();
    params.stop_strings = stop_ptrs.data();
    params.n_stop_strings = stop_ptrs.size();
    gptoss::GenerateOptions options;
    const gptoss_status status = gptoss::make_generate_options(params, &options);
    fuzz_check_status(status);
    if (status != GPTOSS_OK) return 0;

    std::vector<int32_t> tokens;
    for (; at + 4 <= size; at += 4) {
        uint32_t v;
        std::memcpy(&v, data + at, 4);
        tokens.push_back(int32_t(v % tokenizer.n_vocab()));
    }

    h::StreamParser parser(tokenizer, assistant_started);
    std::string delta;
    for (int32_t t : tokens) {
        parser.push(t, &delta);
        if (!fuzz_valid_utf8(delta)) fuzz_fail("parser delta is not UTF-8");
    }
    parser.finish(&delta);
    for (const h::ParsedMessage& m : parser.messages())
        if (!fuzz_valid_utf8(m.content)) fuzz_fail("parsed content is not UTF-8");

    h::ChatStream stream(tokenizer, stops);
    std::string final_run;  // final-channel event text since the last non-final event
    for (int32_t t : tokens) {
        gptoss_event event;
        const bool stop = stream.push(t, &event);
        const std::string_view text(event.text, event.text_len);
        if (!fuzz_valid_utf8(text)) fuzz_fail("event text is not UTF-8", text);
        // Final answer text: the final channel without a recipient; a header in between (its
        // tokens have channel NONE) starts a new message.
        if (event.channel == GPTOSS_CHANNEL_FINAL && event.recipient == nullptr) final_run.append(text);
        else final_run.clear();
        for (const std::string& s : stops)
            if (!s.empty() && final_run.find(s) != std::string::npos) fuzz_fail("events showed a stop string", s);
        if (stop) break;  // gptoss_chat samples no further
    }
    stream.finish();
    for (const h::ParsedMessage& m : stream.messages()) {
        if (!fuzz_valid_utf8(m.content)) fuzz_fail("chat message content is not UTF-8");
        if (m.channel == "final" && m.recipient.empty())
            for (const std::string& s : stops)
                if (!s.empty() && m.content.find(s) != std::string::npos) fuzz_fail("a final message holds a stop string", s);
    }
    return 0;
}
