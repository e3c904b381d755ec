/* tests/test-c.c - gptoss.h compiles as strict C99 (-std=c99 -pedantic-errors), every declared
 * function links against libgptoss.so, and the basic C-level promises hold without a model:
 * version matches the header, the *_default_* helpers work from C, NULL arguments fail cleanly
 * with a message, and *_free(NULL) is a no-op. The symbol list is checked against the header
 * by tests/test-exports.sh, so a declared-but-missing function fails here at link time.
 * Prints "N passed, M failed" as its last line. */
#include "gptoss.h"

#include <stdio.h>
#include <string.h>

static int passed = 0, failed = 0;

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (cond) {                                                         \
            passed++;                                                       \
        } else {                                                            \
            failed++;                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                   \
    } while (0)

typedef void (*any_fn)(void);

int main(void) {
    /* Every declared function, taken by address: a missing definition fails the link. */
    any_fn symbols[] = {
        (any_fn)gptoss_status_string,   (any_fn)gptoss_last_error,          (any_fn)gptoss_version,
        (any_fn)gptoss_set_log_callback, (any_fn)gptoss_model_params_init,  (any_fn)gptoss_load,
        (any_fn)gptoss_model_free,      (any_fn)gptoss_model_get_info,      (any_fn)gptoss_tokenize,
        (any_fn)gptoss_detokenize,      (any_fn)gptoss_session_params_init, (any_fn)gptoss_session_create,
        (any_fn)gptoss_session_free,    (any_fn)gptoss_session_cancel,      (any_fn)gptoss_sampling_params_init,
        (any_fn)gptoss_generate,        (any_fn)gptoss_chat_request_init,   (any_fn)gptoss_chat_render,
        (any_fn)gptoss_chat,            (any_fn)gptoss_conversation_parse_json,
        (any_fn)gptoss_conversation_get_request, (any_fn)gptoss_conversation_free,
    };
    size_t i;
    for (i = 0; i < sizeof symbols / sizeof symbols[0]; i++) CHECK(symbols[i] != NULL);

    CHECK(gptoss_version() == GPTOSS_VERSION_NUMBER);
    CHECK(gptoss_version() / 1000000 == GPTOSS_VERSION_MAJOR);
    CHECK(strcmp(gptoss_status_string(GPTOSS_ERR_OUT_OF_MEMORY), "out of memory") == 0);
    CHECK(strcmp(gptoss_last_error(), "") == 0);

    {
        gptoss_model_params mp = gptoss_model_default_params();
        gptoss_session_params sp = gptoss_session_default_params();
        gptoss_sampling_params sa = gptoss_sampling_default_params();
        gptoss_chat_request rq = gptoss_chat_default_request();
        CHECK(mp.struct_size == sizeof mp && mp.device == GPTOSS_DEVICE_AUTO);
        CHECK(sp.struct_size == sizeof sp && sp.max_context == 0);
        CHECK(sa.struct_size == sizeof sa && sa.temperature == 1.0f && sa.seed == GPTOSS_SEED_RANDOM);
        CHECK(sa.n_stop_tokens == 2 && sa.stop_tokens[0] == 200002 && sa.stop_tokens[1] == 200012);
        CHECK(rq.struct_size == sizeof rq && rq.reasoning_effort == GPTOSS_REASONING_MEDIUM);
    }
    {
        gptoss_model* model = (gptoss_model*)&passed; /* must be overwritten with NULL */
        CHECK(gptoss_load(NULL, NULL, &model) == GPTOSS_ERR_INVALID_ARGUMENT);
        CHECK(model == NULL);
        CHECK(strstr(gptoss_last_error(), "model_dir") != NULL);
        CHECK(gptoss_load("/nonexistent/gptoss-model", NULL, &model) == GPTOSS_ERR_IO);
        CHECK(model == NULL);
        CHECK(strstr(gptoss_last_error(), "/nonexistent/gptoss-model") != NULL);
    }
    gptoss_model_free(NULL);
    gptoss_session_free(NULL);
    gptoss_session_cancel(NULL);
    gptoss_conversation_free(NULL);
    CHECK(gptoss_conversation_get_request(NULL) == NULL);

    printf("test-c: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
