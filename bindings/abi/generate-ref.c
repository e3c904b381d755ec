// generate-ref.c - the C API's answer to "generate with this seed", for the bindings' tests.
// Each binding generates from the same prompt with the same sampling settings and checks that
// it gets exactly these tokens, so a binding that drops the seed, mis-mirrors
// gptoss_sampling_params or mangles the prompt fails against the C library itself.
// Usage: generate-ref MODEL_DIR SEED MAX_TOKENS PROMPT_TEXT
// Loads on the CPU backend, tokenizes PROMPT_TEXT (allow_special false) and prints
//   prompt <ids...>
//   tokens <ids...>
//   stop_reason <n>
// Exits 1 with gptoss_last_error() on stderr if any call fails.
#include "gptoss.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char* what, gptoss_status status) {
    fprintf(stderr, "generate-ref: %s: %s: %s\n", what, gptoss_status_string(status), gptoss_last_error());
    return 1;
}

int main(int argc, char** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: generate-ref MODEL_DIR SEED MAX_TOKENS PROMPT_TEXT\n");
        return 2;
    }
    gptoss_model_params model_params = gptoss_model_default_params();
    model_params.device = GPTOSS_DEVICE_CPU;
    gptoss_model* model = NULL;
    gptoss_status status = gptoss_load(argv[1], &model_params, &model);
    if (status != GPTOSS_OK) return fail("gptoss_load", status);

    const char* text = argv[4];
    size_t n_prompt = 0;
    status = gptoss_tokenize(model, text, strlen(text), false, NULL, 0, &n_prompt);
    if (status != GPTOSS_OK && status != GPTOSS_ERR_BUFFER_TOO_SMALL) return fail("gptoss_tokenize", status);
    int32_t* prompt = malloc((n_prompt ? n_prompt : 1) * sizeof *prompt);
    status = gptoss_tokenize(model, text, strlen(text), false, prompt, n_prompt, &n_prompt);
    if (status != GPTOSS_OK) return fail("gptoss_tokenize", status);

    gptoss_session* session = NULL;
    status = gptoss_session_create(model, NULL, &session);
    if (status != GPTOSS_OK) return fail("gptoss_session_create", status);

    gptoss_sampling_params sampling = gptoss_sampling_default_params();
    sampling.seed = strtoull(argv[2], NULL, 10);
    sampling.max_tokens = (uint32_t)strtoul(argv[3], NULL, 10);
    const gptoss_generate_result* result = NULL;
    status = gptoss_generate(session, prompt, n_prompt, &sampling, NULL, NULL, &result);
    if (status != GPTOSS_OK) return fail("gptoss_generate", status);

    printf("prompt");
    for (size_t i = 0; i < n_prompt; i++) printf(" %" PRId32, prompt[i]);
    printf("\ntokens");
    for (size_t i = 0; i < result->n_tokens; i++) printf(" %" PRId32, result->tokens[i]);
    printf("\nstop_reason %d\n", (int)result->stop_reason);

    free(prompt);
    gptoss_session_free(session);
    gptoss_model_free(model);
    return 0;
}
