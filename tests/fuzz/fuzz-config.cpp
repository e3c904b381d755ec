// tests/fuzz/fuzz-config.cpp - config.json text through parse_config_json, the checks
// load_config applies. An accepted config must satisfy what the backends rely on.
#include "tests/fuzz/fuzz-common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    gptoss::Config c;
    const gptoss_status status = gptoss::parse_config_json("config.json", reinterpret_cast<const char*>(data), size, &c);
    fuzz_check_status(status);
    if (status != GPTOSS_OK) return 0;
    if (c.layer_sliding.size() != c.n_layers) fuzz_fail("layer_types does not cover every layer");
    if (c.n_layers == 0 || c.hidden == 0 || c.vocab == 0 || c.head_dim == 0 || c.n_kv_heads == 0 ||
        c.n_heads % c.n_kv_heads != 0 || c.n_experts_per_token == 0 || c.n_experts_per_token > c.n_experts)
        fuzz_fail("an accepted config with an impossible shape");
    return 0;
}
