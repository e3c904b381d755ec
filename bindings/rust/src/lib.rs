//! gptoss - run OpenAI's gpt-oss models from Rust, through libgptoss.so.
//!
//! ```no_run
//! use gptoss::{ChatRequest, Device, Message, Model, ReasoningEffort, Sampling, Tool};
//!
//! let model = Model::load("/models/gpt-oss-20b", Device::Auto)?;
//! let mut session = model.session(Default::default())?;
//! let request = ChatRequest::new(vec![Message::user("What is the weather in Paris?")])
//!     .tool(Tool::new("get_weather", "Current weather", Some(r#"{"type":"object","properties":{"city":{"type":"string"}}}"#)))
//!     .reasoning_effort(ReasoningEffort::Low);
//! let reply = session.chat_streaming(&request, &Sampling::new().max_tokens(256), |event| {
//!     print!("{}", event.text); // &str: the library guarantees UTF-8 in streamed text
//!     true                      // false stops generation (StopReason::Cancelled)
//! })?;
//! println!("\n{:?} {:?}", reply.stop_reason, reply.tool_calls);
//! # Ok::<(), gptoss::Error>(())
//! ```
//!
//! The safe API mirrors gptoss.h: a [`Model`] is immutable and `Send + Sync`; a [`Session`]
//! is `Send` but not `Sync` (one thread at a time), and its calls take `&mut self`, so a
//! streaming closure cannot re-enter it. [`Session::canceller`] gives a handle that may cancel
//! from any thread. Results are copied into owned Rust values at once. Every failure is an
//! [`Error`] carrying the C status and the text of `gptoss_last_error()`.

pub mod sys;

use std::any::Any;
use std::ffi::{c_void, CStr, CString};
use std::fmt;
use std::os::raw::c_char;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::{Arc, OnceLock};

// ---------------------------------------------------------------------------
// Errors

/// The C `gptoss_status` of a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    InvalidArgument,
    Io,
    Format,
    Unsupported,
    OutOfMemory,
    Device,
    ContextFull,
    BufferTooSmall,
    Cancelled,
    Internal,
    /// A status this crate does not know (a newer library).
    Other(i32),
}

impl Status {
    fn from_raw(raw: sys::gptoss_status) -> Status {
        match raw {
            sys::GPTOSS_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::GPTOSS_ERR_IO => Status::Io,
            sys::GPTOSS_ERR_FORMAT => Status::Format,
            sys::GPTOSS_ERR_UNSUPPORTED => Status::Unsupported,
            sys::GPTOSS_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::GPTOSS_ERR_DEVICE => Status::Device,
            sys::GPTOSS_ERR_CONTEXT_FULL => Status::ContextFull,
            sys::GPTOSS_ERR_BUFFER_TOO_SMALL => Status::BufferTooSmall,
            sys::GPTOSS_ERR_CANCELLED => Status::Cancelled,
            sys::GPTOSS_ERR_INTERNAL => Status::Internal,
            other => Status::Other(other),
        }
    }

    /// The C enum value.
    pub fn raw(self) -> i32 {
        match self {
            Status::InvalidArgument => sys::GPTOSS_ERR_INVALID_ARGUMENT,
            Status::Io => sys::GPTOSS_ERR_IO,
            Status::Format => sys::GPTOSS_ERR_FORMAT,
            Status::Unsupported => sys::GPTOSS_ERR_UNSUPPORTED,
            Status::OutOfMemory => sys::GPTOSS_ERR_OUT_OF_MEMORY,
            Status::Device => sys::GPTOSS_ERR_DEVICE,
            Status::ContextFull => sys::GPTOSS_ERR_CONTEXT_FULL,
            Status::BufferTooSmall => sys::GPTOSS_ERR_BUFFER_TOO_SMALL,
            Status::Cancelled => sys::GPTOSS_ERR_CANCELLED,
            Status::Internal => sys::GPTOSS_ERR_INTERNAL,
            Status::Other(raw) => raw,
        }
    }
}

/// A failed gptoss call: the status and the library's message (`gptoss_last_error()`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    /// Reads gptoss_last_error() right after the failing call; it is thread-local, and a Rust
    /// call never moves threads between the two.
    fn last(raw: sys::gptoss_status) -> Error {
        let message = unsafe { cstr(sys::gptoss_last_error()) }.unwrap_or_default();
        Error { status: Status::from_raw(raw), message }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = unsafe { cstr(sys::gptoss_status_string(self.status.raw())) }.unwrap_or_default();
        write!(f, "gptoss: {}: {}", name, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn check(raw: sys::gptoss_status) -> Result<()> {
    if raw == sys::GPTOSS_OK {
        Ok(())
    } else {
        Err(Error::last(raw))
    }
}

/// Copies a borrowed C string; NULL becomes None. Invalid UTF-8 (never produced by the library
/// in text it promises to be UTF-8) is replaced rather than trusted.
unsafe fn cstr(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        Some(CStr::from_ptr(p).to_string_lossy().into_owned())
    }
}

fn cstring(value: &str, what: &str) -> Result<CString> {
    CString::new(value).map_err(|e| {
        Error::new(Status::InvalidArgument, format!("{what}: contains a NUL byte at offset {}", e.nul_position()))
    })
}

fn opt_cstring(value: &Option<String>, what: &str) -> Result<Option<CString>> {
    value.as_deref().map(|v| cstring(v, what)).transpose()
}

fn opt_ptr(value: &Option<CString>) -> *const c_char {
    value.as_ref().map_or(ptr::null(), |c| c.as_ptr())
}

// ---------------------------------------------------------------------------
// Version

/// The version of libgptoss.so as loaded: (major, minor, patch).
pub fn library_version() -> (u32, u32, u32) {
    let v = unsafe { sys::gptoss_version() };
    (v / 1_000_000, v / 1000 % 1000, v % 1000)
}

/// Checks once that the loaded library is the version `sys` mirrors. Before 1.0 every minor
/// version may change the ABI (API.md §3), so major and minor must both match.
pub fn check_version() -> Result<()> {
    static CHECKED: OnceLock<Result<()>> = OnceLock::new();
    CHECKED.get_or_init(|| version_compatible(library_version())).clone()
}

/// Ok if a library of version `(major, minor, patch)` matches what `sys` mirrors.
fn version_compatible((major, minor, patch): (u32, u32, u32)) -> Result<()> {
    if (major, minor) == (sys::GPTOSS_VERSION_MAJOR, sys::GPTOSS_VERSION_MINOR) {
        return Ok(());
    }
    Err(Error::new(
        Status::Unsupported,
        format!(
            "libgptoss is version {major}.{minor}.{patch}, this binding needs {}.{}.x",
            sys::GPTOSS_VERSION_MAJOR,
            sys::GPTOSS_VERSION_MINOR
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_major_and_minor_version_is_accepted() {
        let (major, minor) = (sys::GPTOSS_VERSION_MAJOR, sys::GPTOSS_VERSION_MINOR);
        assert_eq!(version_compatible((major, minor, 0)), Ok(()));
        assert_eq!(version_compatible((major, minor, 7)), Ok(()));
        let err = version_compatible((major, minor + 1, 0)).unwrap_err();
        assert_eq!(err.status, Status::Unsupported);
        assert!(err.message.contains(&format!("this binding needs {major}.{minor}.x")), "{}", err.message);
        assert!(version_compatible((major + 1, minor, 0)).is_err());
    }
}

// ---------------------------------------------------------------------------
// Enums

/// Where a model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// CUDA device 0 if one exists, else the CPU.
    Auto,
    /// The CPU reference backend (slow; for tests and machines without a GPU).
    Cpu,
    /// A CUDA device ordinal.
    Cuda(u32),
}

impl Device {
    fn raw(self) -> i32 {
        match self {
            Device::Auto => sys::GPTOSS_DEVICE_AUTO,
            Device::Cpu => sys::GPTOSS_DEVICE_CPU,
            Device::Cuda(n) => n as i32,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Channel {
    None,
    /// Chain of thought.
    Analysis,
    /// Tool calls and preambles.
    Commentary,
    /// The answer for the user.
    Final,
    Other(i32),
}

impl Channel {
    fn from_raw(raw: sys::gptoss_channel) -> Channel {
        match raw {
            sys::GPTOSS_CHANNEL_NONE => Channel::None,
            sys::GPTOSS_CHANNEL_ANALYSIS => Channel::Analysis,
            sys::GPTOSS_CHANNEL_COMMENTARY => Channel::Commentary,
            sys::GPTOSS_CHANNEL_FINAL => Channel::Final,
            other => Channel::Other(other),
        }
    }
    fn raw(self) -> sys::gptoss_channel {
        match self {
            Channel::None => sys::GPTOSS_CHANNEL_NONE,
            Channel::Analysis => sys::GPTOSS_CHANNEL_ANALYSIS,
            Channel::Commentary => sys::GPTOSS_CHANNEL_COMMENTARY,
            Channel::Final => sys::GPTOSS_CHANNEL_FINAL,
            Channel::Other(raw) => raw,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// Sampled `<|return|>`: the answer is complete.
    Return,
    /// Sampled `<|call|>`: the model is calling a tool.
    Call,
    /// Sampled another stop token.
    Token,
    /// Produced one of the stop strings.
    String,
    MaxTokens,
    ContextFull,
    /// The callback returned false, or a [`Canceller`] was used.
    Cancelled,
    Other(i32),
}

impl StopReason {
    fn from_raw(raw: sys::gptoss_stop_reason) -> StopReason {
        match raw {
            sys::GPTOSS_STOP_RETURN => StopReason::Return,
            sys::GPTOSS_STOP_CALL => StopReason::Call,
            sys::GPTOSS_STOP_TOKEN => StopReason::Token,
            sys::GPTOSS_STOP_STRING => StopReason::String,
            sys::GPTOSS_STOP_MAX_TOKENS => StopReason::MaxTokens,
            sys::GPTOSS_STOP_CONTEXT_FULL => StopReason::ContextFull,
            sys::GPTOSS_STOP_CANCELLED => StopReason::Cancelled,
            other => StopReason::Other(other),
        }
    }
    /// The C enum value.
    pub fn raw(self) -> i32 {
        match self {
            StopReason::Return => sys::GPTOSS_STOP_RETURN,
            StopReason::Call => sys::GPTOSS_STOP_CALL,
            StopReason::Token => sys::GPTOSS_STOP_TOKEN,
            StopReason::String => sys::GPTOSS_STOP_STRING,
            StopReason::MaxTokens => sys::GPTOSS_STOP_MAX_TOKENS,
            StopReason::ContextFull => sys::GPTOSS_STOP_CONTEXT_FULL,
            StopReason::Cancelled => sys::GPTOSS_STOP_CANCELLED,
            StopReason::Other(raw) => raw,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Role {
    User,
    Assistant,
    Tool,
    Other(i32),
}

impl Role {
    fn from_raw(raw: sys::gptoss_role) -> Role {
        match raw {
            sys::GPTOSS_ROLE_USER => Role::User,
            sys::GPTOSS_ROLE_ASSISTANT => Role::Assistant,
            sys::GPTOSS_ROLE_TOOL => Role::Tool,
            other => Role::Other(other),
        }
    }
    fn raw(self) -> sys::gptoss_role {
        match self {
            Role::User => sys::GPTOSS_ROLE_USER,
            Role::Assistant => sys::GPTOSS_ROLE_ASSISTANT,
            Role::Tool => sys::GPTOSS_ROLE_TOOL,
            Role::Other(raw) => raw,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningEffort {
    Low,
    #[default]
    Medium,
    High,
}

impl ReasoningEffort {
    fn raw(self) -> sys::gptoss_reasoning_effort {
        match self {
            ReasoningEffort::Low => sys::GPTOSS_REASONING_LOW,
            ReasoningEffort::Medium => sys::GPTOSS_REASONING_MEDIUM,
            ReasoningEffort::High => sys::GPTOSS_REASONING_HIGH,
        }
    }
}

// ---------------------------------------------------------------------------
// Model

/// What [`Model::info`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub name: String,
    pub n_layers: u32,
    pub n_experts: u32,
    pub n_experts_per_token: u32,
    pub n_vocab: u32,
    /// Tokens.
    pub max_context: u32,
    pub weight_bytes: u64,
    /// The device it runs on.
    pub device: Device,
    /// Layers whose MoE experts are in host memory (the first ones), and the host bytes they hold.
    pub n_cpu_moe: u32,
    pub host_weight_bytes: u64,
}

/// Where the MoE experts go ([`LoadOptions::n_cpu_moe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuMoe {
    /// Every expert on the GPU.
    #[default]
    None,
    /// The experts of the first N layers in host memory.
    Layers(u32),
    /// The fewest layers that fit the GPU memory budget.
    Auto,
}

/// What [`Model::load_with_options`] takes (gptoss_model_params in gptoss.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    pub device: Device,
    /// MoE experts in host memory, for GPUs smaller than the model.
    pub n_cpu_moe: CpuMoe,
    /// Bytes of GPU memory the model and its sessions may use; 0: the device's free memory.
    pub gpu_memory_budget: u64,
    /// [`CpuMoe::Auto`]: tokens of KV cache the budget keeps room for; 0: 32768.
    pub fit_context: u32,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { device: Device::Auto, n_cpu_moe: CpuMoe::None, gpu_memory_budget: 0, fit_context: 0 }
    }
}

/// The weights and tokenizer of one checkpoint. Immutable once loaded, so it is `Send + Sync`:
/// share it between threads with `Arc<Model>` (gptoss.h's thread-safety rules).
/// Dropping it while sessions exist is fine: they keep the C model alive.
pub struct Model {
    ptr: NonNull<sys::gptoss_model>,
}

// SAFETY: gptoss.h: a model is immutable after load; every function taking a model is safe to
// call from any thread at the same time, and gptoss_model_free waits for its sessions.
unsafe impl Send for Model {}
unsafe impl Sync for Model {}

impl Drop for Model {
    fn drop(&mut self) {
        unsafe { sys::gptoss_model_free(self.ptr.as_ptr()) }
    }
}

struct ProgressState<'f> {
    f: &'f mut dyn FnMut(f32) -> bool,
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn progress_trampoline(user: *mut c_void, fraction: f32) -> bool {
    let state = &mut *(user as *mut ProgressState);
    if state.panic.is_some() {
        return false;
    }
    // A panic must not unwind into C: catch it, cancel, and resume it after the C call returns.
    match panic::catch_unwind(AssertUnwindSafe(|| (state.f)(fraction))) {
        Ok(go_on) => go_on,
        Err(payload) => {
            state.panic = Some(payload);
            false
        }
    }
}

impl Model {
    /// Loads the checkpoint directory `path` (config.json, tokenizer.json, safetensors).
    /// Fails with the library's message, naming the file or tensor, if anything is wrong, and
    /// with [`Status::Unsupported`] if libgptoss.so is not the version this crate mirrors.
    pub fn load(path: impl AsRef<Path>, device: Device) -> Result<Model> {
        Self::load_impl(path.as_ref(), &LoadOptions { device, ..LoadOptions::default() }, None)
    }

    /// As [`Model::load`], with every option of [`LoadOptions`] (experts in host memory).
    pub fn load_with_options(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Model> {
        Self::load_impl(path.as_ref(), options, None)
    }

    /// As [`Model::load`], calling `progress(fraction)` as loading proceeds; returning false
    /// cancels the load ([`Status::Cancelled`]).
    pub fn load_with_progress(
        path: impl AsRef<Path>,
        device: Device,
        mut progress: impl FnMut(f32) -> bool,
    ) -> Result<Model> {
        Self::load_impl(path.as_ref(), &LoadOptions { device, ..LoadOptions::default() }, Some(&mut progress))
    }

    fn load_impl(path: &Path, options: &LoadOptions, progress: Option<&mut dyn FnMut(f32) -> bool>) -> Result<Model> {
        check_version()?;
        let path = path.to_str().ok_or_else(|| {
            Error::new(Status::InvalidArgument, format!("model_dir: {} is not UTF-8", path.display()))
        })?;
        let c_path = cstring(path, "model_dir")?;
        let mut params = std::mem::MaybeUninit::<sys::gptoss_model_params>::zeroed();
        let mut params = unsafe {
            sys::gptoss_model_params_init(params.as_mut_ptr(), std::mem::size_of::<sys::gptoss_model_params>());
            params.assume_init()
        };
        params.device = options.device.raw();
        params.n_cpu_moe = match options.n_cpu_moe {
            CpuMoe::None => 0,
            CpuMoe::Layers(n) => i32::try_from(n).unwrap_or(i32::MAX),
            CpuMoe::Auto => sys::GPTOSS_CPU_MOE_AUTO,
        };
        params.gpu_memory_budget = options.gpu_memory_budget;
        params.fit_context = options.fit_context;
        let mut state = progress.map(|f| ProgressState { f, panic: None });
        if let Some(state) = state.as_mut() {
            params.progress = Some(progress_trampoline);
            params.progress_user_data = state as *mut ProgressState as *mut c_void;
        }
        let mut out = ptr::null_mut();
        let status = unsafe { sys::gptoss_load(c_path.as_ptr(), &params, &mut out) };
        let result = check(status);
        if let Some(payload) = state.and_then(|s| s.panic) {
            if !out.is_null() {
                unsafe { sys::gptoss_model_free(out) };
            }
            panic::resume_unwind(payload);
        }
        result?;
        let ptr = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "gptoss_load returned OK and a NULL model"))?;
        Ok(Model { ptr })
    }

    /// The raw handle, for calls this crate does not wrap. Valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::gptoss_model {
        self.ptr.as_ptr()
    }

    pub fn info(&self) -> Result<ModelInfo> {
        let mut info: sys::gptoss_model_info = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<sys::gptoss_model_info>() as u32;
        check(unsafe { sys::gptoss_model_get_info(self.ptr.as_ptr(), &mut info) })?;
        Ok(ModelInfo {
            name: unsafe { cstr(info.name) }.unwrap_or_default(),
            n_layers: info.n_layers,
            n_experts: info.n_experts,
            n_experts_per_token: info.n_experts_per_token,
            n_vocab: info.n_vocab,
            max_context: info.max_context,
            weight_bytes: info.weight_bytes,
            device: if info.device < 0 { Device::Cpu } else { Device::Cuda(info.device as u32) },
            n_cpu_moe: info.n_cpu_moe,
            host_weight_bytes: info.host_weight_bytes,
        })
    }

    /// Token ids of `text`. Text spelling a special token (`<|start|>`) becomes that token only
    /// with `allow_special`; keep it false for untrusted input.
    pub fn tokenize(&self, text: &str, allow_special: bool) -> Result<Vec<i32>> {
        let mut tokens = vec![0i32; text.len() + 1]; // byte-level BPE: never more tokens than bytes
        loop {
            let mut n = 0usize;
            let status = unsafe {
                sys::gptoss_tokenize(
                    self.ptr.as_ptr(),
                    text.as_ptr() as *const c_char,
                    text.len(),
                    allow_special,
                    tokens.as_mut_ptr(),
                    tokens.len(),
                    &mut n,
                )
            };
            if status == sys::GPTOSS_ERR_BUFFER_TOO_SMALL && n > tokens.len() {
                tokens.resize(n, 0);
                continue;
            }
            check(status)?;
            tokens.truncate(n);
            return Ok(tokens);
        }
    }

    /// The bytes of `tokens`; special tokens appear as their names. The bytes may end inside a
    /// multi-byte character, so they are not always valid UTF-8.
    pub fn detokenize_bytes(&self, tokens: &[i32]) -> Result<Vec<u8>> {
        let mut text = vec![0u8; 16 * tokens.len() + 1];
        loop {
            let mut n = 0usize;
            let status = unsafe {
                sys::gptoss_detokenize(
                    self.ptr.as_ptr(),
                    tokens.as_ptr(),
                    tokens.len(),
                    text.as_mut_ptr() as *mut c_char,
                    text.len(),
                    &mut n,
                )
            };
            if status == sys::GPTOSS_ERR_BUFFER_TOO_SMALL && n + 1 > text.len() {
                text.resize(n + 1, 0);
                continue;
            }
            check(status)?;
            text.truncate(n);
            return Ok(text);
        }
    }

    /// `tokens` as text; an incomplete trailing character becomes U+FFFD.
    pub fn detokenize(&self, tokens: &[i32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.detokenize_bytes(tokens)?).into_owned())
    }

    /// The Harmony prompt tokens [`Session::chat`] would send, up to `<|start|>assistant`.
    pub fn render(&self, request: &ChatRequest) -> Result<Vec<i32>> {
        let c = CRequest::new(request)?;
        let mut tokens = vec![0i32; 1024];
        loop {
            let mut n = 0usize;
            let status = unsafe {
                sys::gptoss_chat_render(self.ptr.as_ptr(), &c.request, tokens.as_mut_ptr(), tokens.len(), &mut n)
            };
            if status == sys::GPTOSS_ERR_BUFFER_TOO_SMALL && n > tokens.len() {
                tokens.resize(n, 0);
                continue;
            }
            check(status)?;
            tokens.truncate(n);
            return Ok(tokens);
        }
    }

    /// A new session on this model (same as [`Session::new`]).
    pub fn session(&self, params: SessionParams) -> Result<Session> {
        Session::new(self, params)
    }
}

// ---------------------------------------------------------------------------
// Sampling and events

/// Sampling settings. Every field left `None` takes the library's default: temperature 1.0,
/// top_p 1.0, top_k off, a random seed, no token limit, stop at `<|return|>` or `<|call|>`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub seed: Option<u64>,
    pub max_tokens: Option<u32>,
    /// Ignored by chat, which stops at the Harmony end tokens.
    pub stop_tokens: Option<Vec<i32>>,
    pub stop_strings: Vec<String>,
    /// Generate only: the output is one JSON document matching this JSON Schema, then a stop
    /// token (constrained decoding). Ignored by chat (see [`ChatRequest::response_format`]).
    pub json_schema: Option<String>,
}

impl Sampling {
    pub fn json_schema(mut self, v: impl Into<String>) -> Self {
        self.json_schema = Some(v.into());
        self
    }
    pub fn new() -> Sampling {
        Sampling::default()
    }
    pub fn temperature(mut self, v: f32) -> Self {
        self.temperature = Some(v);
        self
    }
    pub fn top_p(mut self, v: f32) -> Self {
        self.top_p = Some(v);
        self
    }
    pub fn top_k(mut self, v: u32) -> Self {
        self.top_k = Some(v);
        self
    }
    pub fn seed(mut self, v: u64) -> Self {
        self.seed = Some(v);
        self
    }
    pub fn max_tokens(mut self, v: u32) -> Self {
        self.max_tokens = Some(v);
        self
    }
    pub fn stop_tokens(mut self, v: Vec<i32>) -> Self {
        self.stop_tokens = Some(v);
        self
    }
    pub fn stop_string(mut self, v: impl Into<String>) -> Self {
        self.stop_strings.push(v.into());
        self
    }
}

/// The C sampling params plus the memory they point into.
struct CSampling {
    params: sys::gptoss_sampling_params,
    _stop_strings: Vec<CString>,
    _stop_string_ptrs: Vec<*const c_char>,
    _stop_tokens: Option<Vec<i32>>,
    _json_schema: Option<CString>,
}

impl CSampling {
    fn new(s: &Sampling) -> Result<CSampling> {
        let mut params = std::mem::MaybeUninit::<sys::gptoss_sampling_params>::zeroed();
        let mut params = unsafe {
            sys::gptoss_sampling_params_init(params.as_mut_ptr(), std::mem::size_of::<sys::gptoss_sampling_params>());
            params.assume_init()
        };
        if let Some(v) = s.temperature {
            params.temperature = v;
        }
        if let Some(v) = s.top_p {
            params.top_p = v;
        }
        if let Some(v) = s.top_k {
            params.top_k = v;
        }
        if let Some(v) = s.seed {
            params.seed = v;
        }
        if let Some(v) = s.max_tokens {
            params.max_tokens = v;
        }
        let stop_tokens = s.stop_tokens.clone();
        if let Some(t) = &stop_tokens {
            params.stop_tokens = t.as_ptr();
            params.n_stop_tokens = t.len();
        }
        let strings = s
            .stop_strings
            .iter()
            .enumerate()
            .map(|(i, v)| cstring(v, &format!("stop_strings[{i}]")))
            .collect::<Result<Vec<_>>>()?;
        let ptrs: Vec<*const c_char> = strings.iter().map(|c| c.as_ptr()).collect();
        if !ptrs.is_empty() {
            params.stop_strings = ptrs.as_ptr();
            params.n_stop_strings = ptrs.len();
        }
        let json_schema = opt_cstring(&s.json_schema, "json_schema")?;
        params.json_schema = opt_ptr(&json_schema);
        Ok(CSampling {
            params,
            _stop_strings: strings,
            _stop_string_ptrs: ptrs,
            _stop_tokens: stop_tokens,
            _json_schema: json_schema,
        })
    }
}

/// One sampled token, borrowed for the duration of the callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    pub token: i32,
    /// The complete UTF-8 characters this token finished; often "".
    pub text: &'a str,
    /// Chat: the channel of the message being written.
    pub channel: Channel,
    /// Chat: "functions.NAME" while writing a tool call.
    pub recipient: Option<&'a str>,
}

struct EventState<'f> {
    f: &'f mut dyn FnMut(&Event) -> bool,
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn event_trampoline(user: *mut c_void, event: *const sys::gptoss_event) -> bool {
    let state = &mut *(user as *mut EventState);
    if state.panic.is_some() || event.is_null() {
        return false;
    }
    let e = &*event;
    let bytes = if e.text.is_null() || e.text_len == 0 {
        &[][..]
    } else {
        std::slice::from_raw_parts(e.text as *const u8, e.text_len)
    };
    // gptoss.h promises UTF-8 here; if a library bug broke that, pass a lossy copy rather than UB.
    let lossy;
    let text = match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(_) => {
            lossy = String::from_utf8_lossy(bytes).into_owned();
            &lossy
        }
    };
    let recipient = if e.recipient.is_null() { None } else { CStr::from_ptr(e.recipient).to_str().ok() };
    let event = Event { token: e.token, text, channel: Channel::from_raw(e.channel), recipient };
    match panic::catch_unwind(AssertUnwindSafe(|| (state.f)(&event))) {
        Ok(go_on) => go_on,
        Err(payload) => {
            state.panic = Some(payload);
            false
        }
    }
}

// ---------------------------------------------------------------------------
// Chat request and results

/// One Harmony message (gptoss_message). The messages of a [`ChatOutput`] are these; append
/// them to the history as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    /// Assistant: required; tool: Commentary; user: None.
    pub channel: Channel,
    pub content: String,
    /// Tool results: the tool, e.g. "functions.get_weather".
    pub author: Option<String>,
    /// Tool calls: e.g. "functions.get_weather".
    pub recipient: Option<String>,
    /// Tool calls: e.g. "json".
    pub content_type: Option<String>,
}

impl Message {
    pub fn user(content: impl Into<String>) -> Message {
        Message {
            role: Role::User,
            channel: Channel::None,
            content: content.into(),
            author: None,
            recipient: None,
            content_type: None,
        }
    }
    /// An earlier assistant message on `channel`.
    pub fn assistant(channel: Channel, content: impl Into<String>) -> Message {
        Message {
            role: Role::Assistant,
            channel,
            content: content.into(),
            author: None,
            recipient: None,
            content_type: None,
        }
    }
    /// An earlier tool call: `arguments` (JSON) sent to functions.`name`.
    pub fn tool_call(name: &str, arguments: impl Into<String>) -> Message {
        Message {
            role: Role::Assistant,
            channel: Channel::Commentary,
            content: arguments.into(),
            author: None,
            recipient: Some(format!("functions.{name}")),
            content_type: Some("json".into()),
        }
    }
    /// The result of calling functions.`name`.
    pub fn tool_result(name: &str, content: impl Into<String>) -> Message {
        Message {
            role: Role::Tool,
            channel: Channel::Commentary,
            content: content.into(),
            author: Some(format!("functions.{name}")),
            recipient: None,
            content_type: None,
        }
    }
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    /// "get_weather"; the model calls it as functions.get_weather.
    pub name: String,
    pub description: String,
    /// JSON Schema of the argument object.
    pub parameters: Option<String>,
}

impl Tool {
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Option<&str>) -> Tool {
        Tool { name: name.into(), description: description.into(), parameters: parameters.map(String::from) }
    }
}

/// Which tool calls chat allows (OpenAI's tool_choice).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tool call can be opened.
    None,
    /// The reply is a call to one of the tools (its header and arguments constrained).
    Required,
    /// The reply is a call to this function.
    Named(String),
}

/// What the final answer must be (OpenAI's response_format).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ResponseFormat {
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching `schema` (JSON Schema text); rendered in the developer message as Harmony's
    /// "# Response Formats" section.
    JsonSchema { name: String, description: Option<String>, schema: String },
}

/// A conversation to continue (gptoss_chat_request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatRequest {
    /// Oldest first.
    pub messages: Vec<Message>,
    /// The developer message ("system prompt").
    pub instructions: Option<String>,
    pub tools: Vec<Tool>,
    pub reasoning_effort: ReasoningEffort,
    /// "YYYY-MM-DD" for the system message.
    pub current_date: Option<String>,
    /// Keep the analysis of turns that ended in a final answer (Harmony drops it).
    pub keep_analysis: bool,
    pub tool_choice: ToolChoice,
    /// Hold tool-call arguments to their tool's parameters schema (default true).
    pub constrain_tool_arguments: bool,
    pub response_format: ResponseFormat,
    /// At most this many analysis tokens, then the answer is forced (`Some(0)`: no analysis;
    /// vLLM's thinking_token_budget). `None` (default): no bound. `Some(u32::MAX)` is refused.
    pub max_reasoning_tokens: Option<u32>,
}

impl Default for ChatRequest {
    fn default() -> ChatRequest {
        ChatRequest {
            messages: Vec::new(),
            instructions: None,
            tools: Vec::new(),
            reasoning_effort: ReasoningEffort::default(),
            current_date: None,
            keep_analysis: false,
            tool_choice: ToolChoice::Auto,
            constrain_tool_arguments: true,
            response_format: ResponseFormat::Text,
            max_reasoning_tokens: None,
        }
    }
}

impl ChatRequest {
    pub fn new(messages: Vec<Message>) -> ChatRequest {
        ChatRequest { messages, ..Default::default() }
    }
    pub fn instructions(mut self, v: impl Into<String>) -> Self {
        self.instructions = Some(v.into());
        self
    }
    pub fn tool(mut self, v: Tool) -> Self {
        self.tools.push(v);
        self
    }
    pub fn reasoning_effort(mut self, v: ReasoningEffort) -> Self {
        self.reasoning_effort = v;
        self
    }
    pub fn tool_choice(mut self, v: ToolChoice) -> Self {
        self.tool_choice = v;
        self
    }
    pub fn response_format(mut self, v: ResponseFormat) -> Self {
        self.response_format = v;
        self
    }
    pub fn max_reasoning_tokens(mut self, v: u32) -> Self {
        self.max_reasoning_tokens = Some(v);
        self
    }
}

impl ChatRequest {
    /// Parses an OpenAI Chat Completions request body with the library's own mapping
    /// (gptoss_conversation_parse_json): "messages" (system/developer become `instructions`;
    /// assistant "reasoning_content", "tool_calls" and "content"; tool "tool_call_id" or
    /// "name"), "tools" and "reasoning_effort". Other fields are ignored. Fails with
    /// [`Status::InvalidArgument`] and a message naming the field, e.g. "messages[3].role".
    pub fn from_openai_json(json: &str) -> Result<ChatRequest> {
        let mut conversation = ptr::null_mut();
        check(unsafe {
            sys::gptoss_conversation_parse_json(json.as_ptr() as *const c_char, json.len(), &mut conversation)
        })?;
        // SAFETY: the request and its strings live until gptoss_conversation_free, below.
        let request = unsafe {
            let r = &*sys::gptoss_conversation_get_request(conversation);
            let messages = slice(r.messages, r.n_messages).iter().map(|m| message_from_c(m)).collect();
            let tools = slice(r.tools, r.n_tools)
                .iter()
                .map(|t| Tool {
                    name: cstr(t.name).unwrap_or_default(),
                    description: cstr(t.description).unwrap_or_default(),
                    parameters: cstr(t.parameters),
                })
                .collect();
            ChatRequest {
                messages,
                instructions: cstr(r.instructions),
                tools,
                reasoning_effort: match r.reasoning_effort {
                    sys::GPTOSS_REASONING_LOW => ReasoningEffort::Low,
                    sys::GPTOSS_REASONING_HIGH => ReasoningEffort::High,
                    _ => ReasoningEffort::Medium,
                },
                current_date: cstr(r.current_date),
                keep_analysis: r.keep_analysis,
                tool_choice: match r.tool_choice {
                    sys::GPTOSS_TOOL_CHOICE_NONE => ToolChoice::None,
                    sys::GPTOSS_TOOL_CHOICE_REQUIRED => ToolChoice::Required,
                    sys::GPTOSS_TOOL_CHOICE_NAMED => ToolChoice::Named(cstr(r.tool_choice_name).unwrap_or_default()),
                    _ => ToolChoice::Auto,
                },
                constrain_tool_arguments: r.constrain_tool_arguments,
                response_format: match r.response_format {
                    sys::GPTOSS_RESPONSE_FORMAT_JSON_OBJECT => ResponseFormat::JsonObject,
                    sys::GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA => ResponseFormat::JsonSchema {
                        name: cstr(r.response_format_name).unwrap_or_default(),
                        description: cstr(r.response_format_description),
                        schema: cstr(r.response_format_schema).unwrap_or_default(),
                    },
                    _ => ResponseFormat::Text,
                },
                max_reasoning_tokens: (r.max_reasoning_tokens != u32::MAX).then_some(r.max_reasoning_tokens),
            }
        };
        unsafe { sys::gptoss_conversation_free(conversation) };
        Ok(request)
    }
}

unsafe fn message_from_c(m: &sys::gptoss_message) -> Message {
    Message {
        role: Role::from_raw(m.role),
        channel: Channel::from_raw(m.channel),
        content: cstr(m.content).unwrap_or_default(),
        author: cstr(m.author),
        recipient: cstr(m.recipient),
        content_type: cstr(m.content_type),
    }
}

/// The C request plus every string and array it points into.
struct CRequest {
    request: sys::gptoss_chat_request,
    _messages: Vec<sys::gptoss_message>,
    _tools: Vec<sys::gptoss_tool>,
    _strings: Vec<Option<CString>>,
}

impl CRequest {
    fn new(r: &ChatRequest) -> Result<CRequest> {
        let mut strings = Vec::new();
        let mut keep = |s: Option<CString>| -> *const c_char {
            let p = opt_ptr(&s);
            strings.push(s); // a CString's buffer does not move when the Vec grows
            p
        };
        let mut messages = Vec::with_capacity(r.messages.len());
        for (i, m) in r.messages.iter().enumerate() {
            messages.push(sys::gptoss_message {
                role: m.role.raw(),
                channel: m.channel.raw(),
                content: keep(Some(cstring(&m.content, &format!("messages[{i}].content"))?)),
                author: keep(opt_cstring(&m.author, &format!("messages[{i}].author"))?),
                recipient: keep(opt_cstring(&m.recipient, &format!("messages[{i}].recipient"))?),
                content_type: keep(opt_cstring(&m.content_type, &format!("messages[{i}].content_type"))?),
            });
        }
        let mut tools = Vec::with_capacity(r.tools.len());
        for (i, t) in r.tools.iter().enumerate() {
            tools.push(sys::gptoss_tool {
                name: keep(Some(cstring(&t.name, &format!("tools[{i}].name"))?)),
                description: keep(Some(cstring(&t.description, &format!("tools[{i}].description"))?)),
                parameters: keep(opt_cstring(&t.parameters, &format!("tools[{i}].parameters"))?),
            });
        }
        let instructions = keep(opt_cstring(&r.instructions, "instructions")?);
        let current_date = keep(opt_cstring(&r.current_date, "current_date")?);
        let mut request = std::mem::MaybeUninit::<sys::gptoss_chat_request>::zeroed();
        let mut request = unsafe {
            sys::gptoss_chat_request_init(request.as_mut_ptr(), std::mem::size_of::<sys::gptoss_chat_request>());
            request.assume_init()
        };
        request.messages = if messages.is_empty() { ptr::null() } else { messages.as_ptr() };
        request.n_messages = messages.len();
        request.tools = if tools.is_empty() { ptr::null() } else { tools.as_ptr() };
        request.n_tools = tools.len();
        request.instructions = instructions;
        request.reasoning_effort = r.reasoning_effort.raw();
        request.current_date = current_date;
        request.keep_analysis = r.keep_analysis;
        request.constrain_tool_arguments = r.constrain_tool_arguments;
        match &r.tool_choice {
            ToolChoice::Auto => {}
            ToolChoice::None => request.tool_choice = sys::GPTOSS_TOOL_CHOICE_NONE,
            ToolChoice::Required => request.tool_choice = sys::GPTOSS_TOOL_CHOICE_REQUIRED,
            ToolChoice::Named(name) => {
                request.tool_choice = sys::GPTOSS_TOOL_CHOICE_NAMED;
                request.tool_choice_name = keep(Some(cstring(name, "tool_choice")?));
            }
        }
        match &r.response_format {
            ResponseFormat::Text => {}
            ResponseFormat::JsonObject => request.response_format = sys::GPTOSS_RESPONSE_FORMAT_JSON_OBJECT,
            ResponseFormat::JsonSchema { name, description, schema } => {
                request.response_format = sys::GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA;
                request.response_format_name = keep(Some(cstring(name, "response_format.name")?));
                request.response_format_description = keep(opt_cstring(description, "response_format.description")?);
                request.response_format_schema = keep(Some(cstring(schema, "response_format.schema")?));
            }
        }
        if let Some(budget) = r.max_reasoning_tokens {
            if budget == u32::MAX {
                return Err(Error::new(
                    Status::InvalidArgument,
                    "max_reasoning_tokens: u32::MAX is reserved for no bound (use None)",
                ));
            }
            request.max_reasoning_tokens = budget;
        }
        Ok(CRequest { request, _messages: messages, _tools: tools, _strings: strings })
    }
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// Without namespace: "get_weather".
    pub name: String,
    /// As written: "functions.get_weather".
    pub recipient: String,
    /// As written; normally JSON; not validated.
    pub arguments: String,
    pub content_type: Option<String>,
}

/// The result of [`Session::generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOutput {
    /// Sampled tokens, including the stop token if any.
    pub tokens: Vec<i32>,
    /// `tokens` as bytes, special tokens included (may end inside a character).
    pub text: Vec<u8>,
    pub stop_reason: StopReason,
    pub n_prompt_tokens: u32,
    /// Prompt tokens reused from the session's KV cache.
    pub n_cached_tokens: u32,
    pub prefill_ms: f64,
    pub decode_ms: f64,
}

/// The result of [`Session::chat`].
#[derive(Debug, Clone, PartialEq)]
pub struct ChatOutput {
    /// The answer for the user; "" if none (C: `final`).
    pub final_answer: String,
    /// Chain of thought; do not show it to end users.
    pub analysis: String,
    pub tool_calls: Vec<ToolCall>,
    /// This turn, parsed.
    pub messages: Vec<Message>,
    pub stop_reason: StopReason,
    /// The completion as text, special tokens included.
    pub raw: String,
    pub n_prompt_tokens: u32,
    pub n_cached_tokens: u32,
    pub n_completion_tokens: u32,
    pub prefill_ms: f64,
    pub decode_ms: f64,
}

unsafe fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if p.is_null() || n == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(p, n)
    }
}

// ---------------------------------------------------------------------------
// Session

/// Session sizes; `None` takes the library default (the model's maximum context).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionParams {
    /// Tokens.
    pub max_context: Option<u32>,
    /// Prompt tokens processed per step.
    pub max_batch: Option<u32>,
}

struct SessionHandle(NonNull<sys::gptoss_session>);

// SAFETY: the handle is only used for gptoss_session_cancel (any thread, any time while the
// session exists) by Canceller, and for everything else by the one Session that owns &mut.
unsafe impl Send for SessionHandle {}
unsafe impl Sync for SessionHandle {}

impl Drop for SessionHandle {
    fn drop(&mut self) {
        unsafe { sys::gptoss_session_free(self.0.as_ptr()) }
    }
}

/// Working memory for one generation at a time (KV cache, scratch, the last result). `Send`,
/// not `Sync`: use it from one thread at a time. Calls take `&mut self`. The session is a
/// cache, not a conversation: pass the whole prompt or conversation to every call.
pub struct Session {
    handle: Arc<SessionHandle>,
    _not_sync: std::marker::PhantomData<std::cell::Cell<()>>,
}

/// Cancels whatever is running on a session, from any thread. It keeps the C session alive,
/// so it stays safe to use after the [`Session`] is dropped (then it does nothing useful).
#[derive(Clone)]
pub struct Canceller {
    handle: Arc<SessionHandle>,
}

impl Canceller {
    /// Asks the running generate/chat to stop before its next token; it then returns Ok with
    /// [`StopReason::Cancelled`]. Does nothing if nothing is running.
    pub fn cancel(&self) {
        unsafe { sys::gptoss_session_cancel(self.handle.0.as_ptr()) }
    }
}

impl Session {
    pub fn new(model: &Model, params: SessionParams) -> Result<Session> {
        let mut p = std::mem::MaybeUninit::<sys::gptoss_session_params>::zeroed();
        let mut p = unsafe {
            sys::gptoss_session_params_init(p.as_mut_ptr(), std::mem::size_of::<sys::gptoss_session_params>());
            p.assume_init()
        };
        if let Some(v) = params.max_context {
            p.max_context = v;
        }
        if let Some(v) = params.max_batch {
            p.max_batch = v;
        }
        let mut out = ptr::null_mut();
        check(unsafe { sys::gptoss_session_create(model.ptr.as_ptr(), &p, &mut out) })?;
        let ptr = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "gptoss_session_create returned OK and a NULL session"))?;
        Ok(Session { handle: Arc::new(SessionHandle(ptr)), _not_sync: std::marker::PhantomData })
    }

    /// A handle that cancels this session's running call from any thread.
    pub fn canceller(&self) -> Canceller {
        Canceller { handle: self.handle.clone() }
    }

    /// The raw handle, for calls this crate does not wrap. Valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::gptoss_session {
        self.handle.0.as_ptr()
    }

    /// Continues the whole prompt `prompt`. Fails with [`Status::ContextFull`] if the prompt
    /// does not fit; the session is then unchanged.
    pub fn generate(&mut self, prompt: &[i32], sampling: &Sampling) -> Result<GenerateOutput> {
        self.generate_impl(prompt, sampling, None)
    }

    /// As [`Session::generate`], calling `on_event` for every sampled token; returning false
    /// stops generation (the result then has [`StopReason::Cancelled`]). A panic in `on_event`
    /// stops generation and resumes after the C call has returned.
    pub fn generate_streaming(
        &mut self,
        prompt: &[i32],
        sampling: &Sampling,
        mut on_event: impl FnMut(&Event) -> bool,
    ) -> Result<GenerateOutput> {
        self.generate_impl(prompt, sampling, Some(&mut on_event))
    }

    fn generate_impl(
        &mut self,
        prompt: &[i32],
        sampling: &Sampling,
        on_event: Option<&mut dyn FnMut(&Event) -> bool>,
    ) -> Result<GenerateOutput> {
        let c = CSampling::new(sampling)?;
        let mut out: *const sys::gptoss_generate_result = ptr::null();
        let mut state = on_event.map(|f| EventState { f, panic: None });
        let (fn_, user) = match state.as_mut() {
            Some(s) => {
                (Some(event_trampoline as unsafe extern "C" fn(_, _) -> bool), s as *mut EventState as *mut c_void)
            }
            None => (None, ptr::null_mut()),
        };
        let status = unsafe {
            sys::gptoss_generate(self.as_ptr(), prompt.as_ptr(), prompt.len(), &c.params, fn_, user, &mut out)
        };
        let result = check(status);
        if let Some(payload) = state.and_then(|s| s.panic) {
            panic::resume_unwind(payload);
        }
        result?;
        // SAFETY: on success `out` is valid until the next call on this session; copy it now.
        let r = unsafe { &*out };
        Ok(GenerateOutput {
            tokens: unsafe { slice(r.tokens, r.n_tokens) }.to_vec(),
            text: unsafe { slice(r.text as *const u8, r.text_len) }.to_vec(),
            stop_reason: StopReason::from_raw(r.stop_reason),
            n_prompt_tokens: r.n_prompt_tokens,
            n_cached_tokens: r.n_cached_tokens,
            prefill_ms: r.prefill_ms,
            decode_ms: r.decode_ms,
        })
    }

    /// Generates the assistant's next turn for `request` and parses it.
    pub fn chat(&mut self, request: &ChatRequest, sampling: &Sampling) -> Result<ChatOutput> {
        self.chat_impl(request, sampling, None)
    }

    /// As [`Session::chat`], calling `on_event` for every sampled token, with the channel and
    /// recipient of the message being written; returning false stops generation.
    pub fn chat_streaming(
        &mut self,
        request: &ChatRequest,
        sampling: &Sampling,
        mut on_event: impl FnMut(&Event) -> bool,
    ) -> Result<ChatOutput> {
        self.chat_impl(request, sampling, Some(&mut on_event))
    }

    fn chat_impl(
        &mut self,
        request: &ChatRequest,
        sampling: &Sampling,
        on_event: Option<&mut dyn FnMut(&Event) -> bool>,
    ) -> Result<ChatOutput> {
        let c_request = CRequest::new(request)?;
        let c_sampling = CSampling::new(sampling)?;
        let mut out: *const sys::gptoss_chat_result = ptr::null();
        let mut state = on_event.map(|f| EventState { f, panic: None });
        let (fn_, user) = match state.as_mut() {
            Some(s) => {
                (Some(event_trampoline as unsafe extern "C" fn(_, _) -> bool), s as *mut EventState as *mut c_void)
            }
            None => (None, ptr::null_mut()),
        };
        let status =
            unsafe { sys::gptoss_chat(self.as_ptr(), &c_request.request, &c_sampling.params, fn_, user, &mut out) };
        let result = check(status);
        if let Some(payload) = state.and_then(|s| s.panic) {
            panic::resume_unwind(payload);
        }
        result?;
        // SAFETY: on success `out` is valid until the next call on this session; copy it now.
        unsafe {
            let r = &*out;
            let tool_calls = slice(r.tool_calls, r.n_tool_calls)
                .iter()
                .map(|c| ToolCall {
                    name: cstr(c.name).unwrap_or_default(),
                    recipient: cstr(c.recipient).unwrap_or_default(),
                    arguments: cstr(c.arguments).unwrap_or_default(),
                    content_type: cstr(c.content_type),
                })
                .collect();
            let messages = slice(r.messages, r.n_messages).iter().map(|m| message_from_c(m)).collect();
            Ok(ChatOutput {
                final_answer: cstr(r.final_).unwrap_or_default(),
                analysis: cstr(r.analysis).unwrap_or_default(),
                tool_calls,
                messages,
                stop_reason: StopReason::from_raw(r.stop_reason),
                raw: cstr(r.raw).unwrap_or_default(),
                n_prompt_tokens: r.n_prompt_tokens,
                n_cached_tokens: r.n_cached_tokens,
                n_completion_tokens: r.n_completion_tokens,
                prefill_ms: r.prefill_ms,
                decode_ms: r.decode_ms,
            })
        }
    }
}

/// A gptoss session is not `Sync`, so this does not compile:
/// ```compile_fail
/// fn needs_sync<T: Sync>() {}
/// needs_sync::<gptoss::Session>();
/// ```
/// while `Model` is both `Send` and `Sync`, and `Session` is `Send`:
/// ```
/// fn needs_send_sync<T: Send + Sync>() {}
/// fn needs_send<T: Send>() {}
/// needs_send_sync::<gptoss::Model>();
/// needs_send::<gptoss::Session>();
/// ```
#[allow(dead_code)]
struct ThreadSafetyDocTests;
