// abi-dump.c - prints sizeof, alignof and every field offset of gptoss.h's public structs, as
// the C compiler lays them out. Each binding's ABI test compares its own struct mirror with
// this output, so a field added, reordered or retyped in gptoss.h fails the bindings' tests
// instead of corrupting memory at run time.
// Output: one JSON object {"struct": {"size": N, "align": N, "fields": {"field": offset}}}
// by default; with --text, lines "struct size N", "struct align N", "struct.field offset",
// which the Rust and Go tests read without a JSON parser.
#include "gptoss.h"

#include <stdalign.h>
#include <stdio.h>
#include <string.h>

static int text_mode = 0;
static int first_struct = 1;
static int first_field = 1;
static const char* current = "";

static void begin(const char* name, size_t size, size_t align) {
    current = name;
    if (text_mode) {
        printf("%s size %zu\n%s align %zu\n", name, size, name, align);
        return;
    }
    printf("%s\n  \"%s\": {\"size\": %zu, \"align\": %zu, \"fields\": {", first_struct ? "{" : ",", name,
           size, align);
    first_struct = 0;
    first_field = 1;
}

static void field(const char* name, size_t offset) {
    if (text_mode) {
        printf("%s.%s %zu\n", current, name, offset);
        return;
    }
    printf("%s\"%s\": %zu", first_field ? "" : ", ", name, offset);
    first_field = 0;
}

static void end(void) {
    if (!text_mode) printf("}}");
}

#define BEGIN(T) begin(#T, sizeof(T), alignof(T))
#define FIELD(T, f) field(#f, offsetof(T, f))

int main(int argc, char** argv) {
    text_mode = argc > 1 && strcmp(argv[1], "--text") == 0;

    BEGIN(gptoss_model_params);
    FIELD(gptoss_model_params, struct_size);
    FIELD(gptoss_model_params, device);
    FIELD(gptoss_model_params, progress);
    FIELD(gptoss_model_params, progress_user_data);
    FIELD(gptoss_model_params, max_decode_batch);
    FIELD(gptoss_model_params, devices);
    FIELD(gptoss_model_params, n_devices);
    FIELD(gptoss_model_params, n_cpu_moe);
    FIELD(gptoss_model_params, gpu_memory_budget);
    FIELD(gptoss_model_params, fit_context);
    FIELD(gptoss_model_params, batch_invariant);
    end();

    BEGIN(gptoss_model_info);
    FIELD(gptoss_model_info, struct_size);
    FIELD(gptoss_model_info, name);
    FIELD(gptoss_model_info, n_layers);
    FIELD(gptoss_model_info, n_experts);
    FIELD(gptoss_model_info, n_experts_per_token);
    FIELD(gptoss_model_info, n_vocab);
    FIELD(gptoss_model_info, max_context);
    FIELD(gptoss_model_info, weight_bytes);
    FIELD(gptoss_model_info, device);
    FIELD(gptoss_model_info, n_cpu_moe);
    FIELD(gptoss_model_info, host_weight_bytes);
    end();

    BEGIN(gptoss_session_params);
    FIELD(gptoss_session_params, struct_size);
    FIELD(gptoss_session_params, max_context);
    FIELD(gptoss_session_params, max_batch);
    end();

    BEGIN(gptoss_sampling_params);
    FIELD(gptoss_sampling_params, struct_size);
    FIELD(gptoss_sampling_params, temperature);
    FIELD(gptoss_sampling_params, top_p);
    FIELD(gptoss_sampling_params, top_k);
    FIELD(gptoss_sampling_params, seed);
    FIELD(gptoss_sampling_params, max_tokens);
    FIELD(gptoss_sampling_params, stop_tokens);
    FIELD(gptoss_sampling_params, n_stop_tokens);
    FIELD(gptoss_sampling_params, stop_strings);
    FIELD(gptoss_sampling_params, n_stop_strings);
    FIELD(gptoss_sampling_params, json_schema);
    end();

    BEGIN(gptoss_event);
    FIELD(gptoss_event, struct_size);
    FIELD(gptoss_event, token);
    FIELD(gptoss_event, text);
    FIELD(gptoss_event, text_len);
    FIELD(gptoss_event, channel);
    FIELD(gptoss_event, recipient);
    end();

    BEGIN(gptoss_generate_result);
    FIELD(gptoss_generate_result, struct_size);
    FIELD(gptoss_generate_result, tokens);
    FIELD(gptoss_generate_result, n_tokens);
    FIELD(gptoss_generate_result, text);
    FIELD(gptoss_generate_result, text_len);
    FIELD(gptoss_generate_result, stop_reason);
    FIELD(gptoss_generate_result, n_prompt_tokens);
    FIELD(gptoss_generate_result, n_cached_tokens);
    FIELD(gptoss_generate_result, prefill_ms);
    FIELD(gptoss_generate_result, decode_ms);
    end();

    BEGIN(gptoss_message);
    FIELD(gptoss_message, role);
    FIELD(gptoss_message, channel);
    FIELD(gptoss_message, content);
    FIELD(gptoss_message, author);
    FIELD(gptoss_message, recipient);
    FIELD(gptoss_message, content_type);
    end();

    BEGIN(gptoss_tool);
    FIELD(gptoss_tool, name);
    FIELD(gptoss_tool, description);
    FIELD(gptoss_tool, parameters);
    end();

    BEGIN(gptoss_chat_request);
    FIELD(gptoss_chat_request, struct_size);
    FIELD(gptoss_chat_request, messages);
    FIELD(gptoss_chat_request, n_messages);
    FIELD(gptoss_chat_request, instructions);
    FIELD(gptoss_chat_request, tools);
    FIELD(gptoss_chat_request, n_tools);
    FIELD(gptoss_chat_request, reasoning_effort);
    FIELD(gptoss_chat_request, current_date);
    FIELD(gptoss_chat_request, keep_analysis);
    FIELD(gptoss_chat_request, tool_choice);
    FIELD(gptoss_chat_request, tool_choice_name);
    FIELD(gptoss_chat_request, constrain_tool_arguments);
    FIELD(gptoss_chat_request, response_format);
    FIELD(gptoss_chat_request, response_format_name);
    FIELD(gptoss_chat_request, response_format_description);
    FIELD(gptoss_chat_request, response_format_schema);
    FIELD(gptoss_chat_request, max_reasoning_tokens);
    end();

    BEGIN(gptoss_tool_call);
    FIELD(gptoss_tool_call, name);
    FIELD(gptoss_tool_call, recipient);
    FIELD(gptoss_tool_call, arguments);
    FIELD(gptoss_tool_call, content_type);
    end();

    BEGIN(gptoss_chat_result);
    FIELD(gptoss_chat_result, struct_size);
    FIELD(gptoss_chat_result, final);
    FIELD(gptoss_chat_result, analysis);
    FIELD(gptoss_chat_result, tool_calls);
    FIELD(gptoss_chat_result, n_tool_calls);
    FIELD(gptoss_chat_result, messages);
    FIELD(gptoss_chat_result, n_messages);
    FIELD(gptoss_chat_result, stop_reason);
    FIELD(gptoss_chat_result, raw);
    FIELD(gptoss_chat_result, n_prompt_tokens);
    FIELD(gptoss_chat_result, n_cached_tokens);
    FIELD(gptoss_chat_result, n_completion_tokens);
    FIELD(gptoss_chat_result, prefill_ms);
    FIELD(gptoss_chat_result, decode_ms);
    end();

    if (!text_mode) printf("\n}\n");
    return 0;
}
