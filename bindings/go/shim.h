// shim.h - C helpers for the Go binding. Each gogptoss_* wrapper makes one gptoss call and,
// on failure, copies gptoss_last_error() into *error_out (malloc'd; the Go side frees it)
// within the same C call. A goroutine may move to another OS thread between two cgo calls,
// and the message is thread-local, so reading it in a second cgo call could return another
// thread's text (API.md §1). Callbacks reach Go through a cgo.Handle passed as user_data.
#ifndef GPTOSS_GO_SHIM_H
#define GPTOSS_GO_SHIM_H

#include <stdint.h>
#include <stdlib.h>

#include "gptoss.h"

gptoss_status gogptoss_load(const char* model_dir, int32_t device, uintptr_t progress, int32_t n_cpu_moe,
                            uint64_t gpu_memory_budget, uint32_t fit_context, gptoss_model** model_out,
                            char** error_out);
gptoss_status gogptoss_model_get_info(const gptoss_model* model, gptoss_model_info* info, char** error_out);
gptoss_status gogptoss_tokenize(const gptoss_model* model, const char* text, size_t text_len, bool allow_special,
                                int32_t* tokens, size_t capacity, size_t* n_tokens_out, char** error_out);
gptoss_status gogptoss_detokenize(const gptoss_model* model, const int32_t* tokens, size_t n_tokens, char* text,
                                  size_t capacity, size_t* text_len_out, char** error_out);
gptoss_status gogptoss_session_create(gptoss_model* model, uint32_t max_context, uint32_t max_batch,
                                      gptoss_session** session_out, char** error_out);
gptoss_status gogptoss_generate(gptoss_session* session, const int32_t* prompt, size_t n_prompt,
                                const gptoss_sampling_params* sampling, uintptr_t on_event,
                                const gptoss_generate_result** result_out, char** error_out);
gptoss_status gogptoss_chat_render(const gptoss_model* model, const gptoss_chat_request* request, int32_t* tokens,
                                   size_t capacity, size_t* n_tokens_out, char** error_out);
gptoss_status gogptoss_chat(gptoss_session* session, const gptoss_chat_request* request,
                            const gptoss_sampling_params* sampling, uintptr_t on_event,
                            const gptoss_chat_result** result_out, char** error_out);
gptoss_status gogptoss_conversation_parse_json(const char* json, size_t json_len,
                                              gptoss_conversation** conversation_out, char** error_out);

#endif
