//! sys.rs - the raw C ABI of gptoss.h, written by hand (no bindgen). Every struct is
//! `#[repr(C)]` and must match the C layout exactly; tests/abi.rs compares size, alignment and
//! every field offset with what the C compiler printed (bindings/abi/abi-dump.c).
//! C enums are `c_int` type aliases, not Rust enums, because a newer library may return values
//! this crate does not know (API.md §3 rule 7), and an unknown Rust enum value is UB.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

pub const GPTOSS_VERSION_MAJOR: u32 = 0;
pub const GPTOSS_VERSION_MINOR: u32 = 1;
pub const GPTOSS_VERSION_PATCH: u32 = 0;
pub const GPTOSS_VERSION_NUMBER: u32 =
    GPTOSS_VERSION_MAJOR * 1_000_000 + GPTOSS_VERSION_MINOR * 1000 + GPTOSS_VERSION_PATCH;

pub type gptoss_status = c_int;
pub const GPTOSS_OK: gptoss_status = 0;
pub const GPTOSS_ERR_INVALID_ARGUMENT: gptoss_status = 1;
pub const GPTOSS_ERR_IO: gptoss_status = 2;
pub const GPTOSS_ERR_FORMAT: gptoss_status = 3;
pub const GPTOSS_ERR_UNSUPPORTED: gptoss_status = 4;
pub const GPTOSS_ERR_OUT_OF_MEMORY: gptoss_status = 5;
pub const GPTOSS_ERR_DEVICE: gptoss_status = 6;
pub const GPTOSS_ERR_CONTEXT_FULL: gptoss_status = 7;
pub const GPTOSS_ERR_BUFFER_TOO_SMALL: gptoss_status = 8;
pub const GPTOSS_ERR_CANCELLED: gptoss_status = 9;
pub const GPTOSS_ERR_INTERNAL: gptoss_status = 10;

pub type gptoss_log_level = c_int;
pub const GPTOSS_LOG_DEBUG: gptoss_log_level = 0;
pub const GPTOSS_LOG_INFO: gptoss_log_level = 1;
pub const GPTOSS_LOG_WARN: gptoss_log_level = 2;
pub const GPTOSS_LOG_ERROR: gptoss_log_level = 3;

pub type gptoss_channel = c_int;
pub const GPTOSS_CHANNEL_NONE: gptoss_channel = 0;
pub const GPTOSS_CHANNEL_ANALYSIS: gptoss_channel = 1;
pub const GPTOSS_CHANNEL_COMMENTARY: gptoss_channel = 2;
pub const GPTOSS_CHANNEL_FINAL: gptoss_channel = 3;

pub type gptoss_stop_reason = c_int;
pub const GPTOSS_STOP_RETURN: gptoss_stop_reason = 0;
pub const GPTOSS_STOP_CALL: gptoss_stop_reason = 1;
pub const GPTOSS_STOP_TOKEN: gptoss_stop_reason = 2;
pub const GPTOSS_STOP_STRING: gptoss_stop_reason = 3;
pub const GPTOSS_STOP_MAX_TOKENS: gptoss_stop_reason = 4;
pub const GPTOSS_STOP_CONTEXT_FULL: gptoss_stop_reason = 5;
pub const GPTOSS_STOP_CANCELLED: gptoss_stop_reason = 6;

pub type gptoss_role = c_int;
pub const GPTOSS_ROLE_USER: gptoss_role = 0;
pub const GPTOSS_ROLE_ASSISTANT: gptoss_role = 1;
pub const GPTOSS_ROLE_TOOL: gptoss_role = 2;

pub type gptoss_tool_choice = c_int;
pub const GPTOSS_TOOL_CHOICE_AUTO: gptoss_tool_choice = 0;
pub const GPTOSS_TOOL_CHOICE_NONE: gptoss_tool_choice = 1;
pub const GPTOSS_TOOL_CHOICE_REQUIRED: gptoss_tool_choice = 2;
pub const GPTOSS_TOOL_CHOICE_NAMED: gptoss_tool_choice = 3;
pub type gptoss_response_format = c_int;
pub const GPTOSS_RESPONSE_FORMAT_TEXT: gptoss_response_format = 0;
pub const GPTOSS_RESPONSE_FORMAT_JSON_OBJECT: gptoss_response_format = 1;
pub const GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA: gptoss_response_format = 2;
pub type gptoss_reasoning_effort = c_int;
pub const GPTOSS_REASONING_LOW: gptoss_reasoning_effort = 0;
pub const GPTOSS_REASONING_MEDIUM: gptoss_reasoning_effort = 1;
pub const GPTOSS_REASONING_HIGH: gptoss_reasoning_effort = 2;

pub const GPTOSS_DEVICE_CPU: i32 = -1;
pub const GPTOSS_DEVICE_AUTO: i32 = -2;
pub const GPTOSS_SEED_RANDOM: u64 = u64::MAX;

#[repr(C)]
pub struct gptoss_model {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct gptoss_session {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct gptoss_conversation {
    _opaque: [u8; 0],
}

pub type gptoss_log_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, level: gptoss_log_level, message: *const c_char)>;
pub type gptoss_progress_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, fraction: f32) -> bool>;
pub type gptoss_event_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, event: *const gptoss_event) -> bool>;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct gptoss_model_params {
    pub struct_size: u32,
    pub device: i32,
    pub progress: gptoss_progress_fn,
    pub progress_user_data: *mut c_void,
    pub max_decode_batch: u32,
    pub devices: *const i32,
    pub n_devices: usize,
    pub n_cpu_moe: i32,
    pub gpu_memory_budget: u64,
    pub fit_context: u32,
    pub batch_invariant: i32,
}

/// `gptoss_model_params.n_cpu_moe`: choose the split from the GPU memory budget.
pub const GPTOSS_CPU_MOE_AUTO: i32 = -1;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct gptoss_model_info {
    pub struct_size: u32,
    pub name: *const c_char,
    pub n_layers: u32,
    pub n_experts: u32,
    pub n_experts_per_token: u32,
    pub n_vocab: u32,
    pub max_context: u32,
    pub weight_bytes: u64,
    pub device: i32,
    pub n_cpu_moe: u32,
    pub host_weight_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct gptoss_session_params {
    pub struct_size: u32,
    pub max_context: u32,
    pub max_batch: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct gptoss_sampling_params {
    pub struct_size: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub seed: u64,
    pub max_tokens: u32,
    pub stop_tokens: *const i32,
    pub n_stop_tokens: usize,
    pub stop_strings: *const *const c_char,
    pub n_stop_strings: usize,
    pub json_schema: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct gptoss_event {
    pub struct_size: u32,
    pub token: i32,
    pub text: *const c_char,
    pub text_len: usize,
    pub channel: gptoss_channel,
    pub recipient: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct gptoss_generate_result {
    pub struct_size: u32,
    pub tokens: *const i32,
    pub n_tokens: usize,
    pub text: *const c_char,
    pub text_len: usize,
    pub stop_reason: gptoss_stop_reason,
    pub n_prompt_tokens: u32,
    pub n_cached_tokens: u32,
    pub prefill_ms: f64,
    pub decode_ms: f64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct gptoss_message {
    pub role: gptoss_role,
    pub channel: gptoss_channel,
    pub content: *const c_char,
    pub author: *const c_char,
    pub recipient: *const c_char,
    pub content_type: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct gptoss_tool {
    pub name: *const c_char,
    pub description: *const c_char,
    pub parameters: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct gptoss_chat_request {
    pub struct_size: u32,
    pub messages: *const gptoss_message,
    pub n_messages: usize,
    pub instructions: *const c_char,
    pub tools: *const gptoss_tool,
    pub n_tools: usize,
    pub reasoning_effort: gptoss_reasoning_effort,
    pub current_date: *const c_char,
    pub keep_analysis: bool,
    pub tool_choice: gptoss_tool_choice,
    pub tool_choice_name: *const c_char,
    pub constrain_tool_arguments: bool,
    pub response_format: gptoss_response_format,
    pub response_format_name: *const c_char,
    pub response_format_description: *const c_char,
    pub response_format_schema: *const c_char,
    pub max_reasoning_tokens: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct gptoss_tool_call {
    pub name: *const c_char,
    pub recipient: *const c_char,
    pub arguments: *const c_char,
    pub content_type: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct gptoss_chat_result {
    pub struct_size: u32,
    pub final_: *const c_char,
    pub analysis: *const c_char,
    pub tool_calls: *const gptoss_tool_call,
    pub n_tool_calls: usize,
    pub messages: *const gptoss_message,
    pub n_messages: usize,
    pub stop_reason: gptoss_stop_reason,
    pub raw: *const c_char,
    pub n_prompt_tokens: u32,
    pub n_cached_tokens: u32,
    pub n_completion_tokens: u32,
    pub prefill_ms: f64,
    pub decode_ms: f64,
}

extern "C" {
    pub fn gptoss_status_string(status: gptoss_status) -> *const c_char;
    pub fn gptoss_last_error() -> *const c_char;
    pub fn gptoss_version() -> u32;
    pub fn gptoss_set_log_callback(fn_: gptoss_log_fn, user_data: *mut c_void, min_level: gptoss_log_level);

    pub fn gptoss_model_params_init(params: *mut gptoss_model_params, struct_size: usize);
    pub fn gptoss_load(
        model_dir: *const c_char,
        params: *const gptoss_model_params,
        model_out: *mut *mut gptoss_model,
    ) -> gptoss_status;
    pub fn gptoss_model_free(model: *mut gptoss_model);
    pub fn gptoss_model_get_info(model: *const gptoss_model, info: *mut gptoss_model_info) -> gptoss_status;

    pub fn gptoss_tokenize(
        model: *const gptoss_model,
        text: *const c_char,
        text_len: usize,
        allow_special: bool,
        tokens: *mut i32,
        capacity: usize,
        n_tokens_out: *mut usize,
    ) -> gptoss_status;
    pub fn gptoss_detokenize(
        model: *const gptoss_model,
        tokens: *const i32,
        n_tokens: usize,
        text: *mut c_char,
        capacity: usize,
        text_len_out: *mut usize,
    ) -> gptoss_status;

    pub fn gptoss_session_params_init(params: *mut gptoss_session_params, struct_size: usize);
    pub fn gptoss_session_create(
        model: *mut gptoss_model,
        params: *const gptoss_session_params,
        session_out: *mut *mut gptoss_session,
    ) -> gptoss_status;
    pub fn gptoss_session_free(session: *mut gptoss_session);
    pub fn gptoss_session_cancel(session: *mut gptoss_session);

    pub fn gptoss_sampling_params_init(params: *mut gptoss_sampling_params, struct_size: usize);
    pub fn gptoss_generate(
        session: *mut gptoss_session,
        prompt: *const i32,
        n_prompt: usize,
        sampling: *const gptoss_sampling_params,
        on_event: gptoss_event_fn,
        user_data: *mut c_void,
        result_out: *mut *const gptoss_generate_result,
    ) -> gptoss_status;

    pub fn gptoss_chat_request_init(request: *mut gptoss_chat_request, struct_size: usize);
    pub fn gptoss_chat_render(
        model: *const gptoss_model,
        request: *const gptoss_chat_request,
        tokens: *mut i32,
        capacity: usize,
        n_tokens_out: *mut usize,
    ) -> gptoss_status;
    pub fn gptoss_chat(
        session: *mut gptoss_session,
        request: *const gptoss_chat_request,
        sampling: *const gptoss_sampling_params,
        on_event: gptoss_event_fn,
        user_data: *mut c_void,
        result_out: *mut *const gptoss_chat_result,
    ) -> gptoss_status;

    pub fn gptoss_conversation_parse_json(
        json: *const c_char,
        json_len: usize,
        conversation_out: *mut *mut gptoss_conversation,
    ) -> gptoss_status;
    pub fn gptoss_conversation_get_request(conversation: *const gptoss_conversation) -> *const gptoss_chat_request;
    pub fn gptoss_conversation_free(conversation: *mut gptoss_conversation);
}
