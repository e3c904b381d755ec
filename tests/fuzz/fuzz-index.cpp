// tests/fuzz/fuzz-index.cpp - model.safetensors.index.json through read_safetensors_index. An
// accepted index names only plain files of the model directory, each tensor's shard among them.
#include "tests/fuzz/fuzz-common.h"

#include <algorithm>
#include <map>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<std::string> shards;
    std::map<std::string, std::string> weight_map;
    const gptoss_status status = gptoss::read_safetensors_index("model.safetensors.index.json",
                                                                reinterpret_cast<const char*>(data), size, &shards, &weight_map);
    fuzz_check_status(status);
    if (status != GPTOSS_OK) return 0;
    if (shards.empty()) fuzz_fail("an accepted index without shards");
    for (const std::string& s : shards)
        if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos || s.find('\0') != std::string::npos)
            fuzz_fail("a shard name outside the model directory", s);
    for (const auto& entry : weight_map)
        if (std::find(shards.begin(), shards.end(), entry.second) == shards.end())
            fuzz_fail("a tensor in a shard not listed", entry.first);
    return 0;
}
