// shim.c - definitions for shim.h (see there for why every wrapper copies the error text).
// The trampolines turn the void* user_data back into the cgo.Handle the Go side passed.
#include "shim.h"

#include <string.h>

#include "_cgo_export.h"

static gptoss_status keep_error(gptoss_status status, char** error_out) {
    *error_out = status == GPTOSS_OK ? NULL : strdup(gptoss_last_error());
    return status;
}

static bool progress_trampoline(void* user_data, float fraction) {
    return goProgress((uintptr_t)user_data, fraction);
}

static bool event_trampoline(void* user_data, const gptoss_event* event) {
    return goEvent((uintptr_t)user_data, (gptoss_event*)event);
}

gptoss_status gogptoss_load(const char* model_dir, int32_t device, uintptr_t progress, int32_t n_cpu_moe,
                            uint64_t gpu_memory_budget, uint32_t fit_context, gptoss_model** model_out,
                            char** error_out) {
    gptoss_model_params params;
    gptoss_model_params_init(&params, sizeof params);
    params.device = device;
    params.n_cpu_moe = n_cpu_moe;
    params.gpu_memory_budget = gpu_memory_budget;
    params.fit_context = fit_context;
    if (progress != 0) {
        params.progress = progress_trampoline;
        params.progress_user_data = (void*)progress;
    }
    return keep_error(gptoss_load(model_dir, &params, model_out), error_out);
}

gptoss_status gogptoss_model_get_info(const gptoss_model* model, gptoss_model_info* info, char** error_out) {
    return keep_error(gptoss_model_get_info(model, info), error_out);
}

gptoss_status gogptoss_tokenize(const gptoss_model* model, const char* text, size_t text_len, bool allow_special,
                                int32_t* tokens, size_t capacity, size_t* n_tokens_out, char** error_out) {
    return keep_error(gptoss_tokenize(model, text, text_len, allow_special, tokens, capacity, n_tokens_out),
                      error_out);
}

gptoss_status gogptoss_detokenize(const gptoss_model* model, const int32_t* tokens, size_t n_tokens, char* text,
                                  size_t capacity, size_t* text_len_out, char** error_out) {
    return keep_error(gptoss_detokenize(model, tokens, n_tokens, text, capacity, text_len_out), error_out);
}

gptoss_status gogptoss_session_create(gptoss_model* model, uint32_t max_context, uint32_t max_batch,
                                      gptoss_session** session_out, char** error_out) {
    gptoss_session_params params;
    gptoss_session_params_init(&params, sizeof params);
    if (max_context != 0) params.max_context = max_context;
    if (max_batch != 0) params.max_batch = max_batch;
    return keep_error(gptoss_session_create(model, &params, session_out), error_out);
}

gptoss_status gogptoss_generate(gptoss_session* session, const int32_t* prompt, size_t n_prompt,
                                const gptoss_sampling_params* sampling, uintptr_t on_event,
                                const gptoss_generate_result** result_out, char** error_out) {
    return keep_error(gptoss_generate(session, prompt, n_prompt, sampling, on_event ? event_trampoline : NULL,
                                      (void*)on_event, result_out),
                      error_out);
}

gptoss_status gogptoss_chat_render(const gptoss_model* model, const gptoss_chat_request* request, int32_t* tokens,
                                   size_t capacity, size_t* n_tokens_out, char** error_out) {
    return keep_error(gptoss_chat_render(model, request, tokens, capacity, n_tokens_out), error_out);
}

gptoss_status gogptoss_chat(gptoss_session* session, const gptoss_chat_request* request,
                            const gptoss_sampling_params* sampling, uintptr_t on_event,
                            const gptoss_chat_result** result_out, char** error_out) {
    return keep_error(gptoss_chat(session, request, sampling, on_event ? event_trampoline : NULL, (void*)on_event,
                                  result_out),
                      error_out);
}

gptoss_status gogptoss_conversation_parse_json(const char* json, size_t json_len,
                                              gptoss_conversation** conversation_out, char** error_out) {
    return keep_error(gptoss_conversation_parse_json(json, json_len, conversation_out), error_out);
}
