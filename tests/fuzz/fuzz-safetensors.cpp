// tests/fuzz/fuzz-safetensors.cpp - one safetensors shard through check_safetensors_shard:
// header length, JSON header, dtypes, shapes, data_offsets (reversed, overlapping, with gaps,
// beyond the file), alignment. Input: the JSON header followed by 4 bytes giving the data
// region's size (little-endian, at most 1 MiB; the region is zeros), so that mutations of the
// header keep a consistent header length; an input starting with 0xFF is the whole file instead.
#include "tests/fuzz/fuzz-common.h"

#include <cstring>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<uint8_t> file;
    if (size > 0 && data[0] == 0xFF) {
        file.assign(data + 1, data + size);
    } else {
        if (size < 4) return 0;
        const size_t json_len = size - 4;
        uint32_t region = 0;
        std::memcpy(&region, data + json_len, 4);
        region &= (1u << 20) - 1;
        file.resize(8 + json_len + region);
        const uint64_t n = json_len;
        for (int i = 0; i < 8; ++i) file[i] = uint8_t(n >> (8 * i));
        std::memcpy(file.data() + 8, data, json_len);
    }
    std::vector<std::string> names;
    const gptoss_status status = gptoss::check_safetensors_shard("model.safetensors", file.data(), file.size(), &names);
    fuzz_check_status(status);
    if (status == GPTOSS_OK && names.empty() && size > 4 && data[0] != 0xFF && file.size() > 8 + (size - 4))
        fuzz_fail("an accepted shard whose data region belongs to no tensor");
    return 0;
}
