// Package gptoss runs OpenAI's gpt-oss models through libgptoss.so (cgo).
//
//	model, err := gptoss.Load("/models/gpt-oss-20b", gptoss.WithDevice(gptoss.DeviceAuto))
//	if err != nil { log.Fatal(err) }
//	defer model.Close()
//	session, err := model.NewSession(gptoss.SessionParams{})
//	if err != nil { log.Fatal(err) }
//	defer session.Close()
//	req := &gptoss.ChatRequest{Messages: []gptoss.Message{gptoss.UserMessage("What is 2 + 2?")}}
//	reply, err := session.Chat(req, gptoss.DefaultSampling(), nil)
//	if err != nil { log.Fatal(err) }
//	fmt.Println(reply.Final)
//
// The types follow gptoss.h: a Model is immutable and safe for concurrent use; a Session is
// used by one goroutine at a time (Cancel excepted). Close releases the C objects; finalizers
// are only a safety net. Every failure is an *Error carrying the C status and the library's
// message, which each C helper copies inside the same C call (see shim.h for why). Results are
// copied into Go values at once. Build with CGO_LDFLAGS="-L<dir of libgptoss.so>
// -Wl,-rpath,<dir>"; the header is found in the repository root.
package gptoss

/*
#cgo CFLAGS: -I${SRCDIR}/../..
#cgo LDFLAGS: -lgptoss
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"runtime/cgo"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The header version this binding mirrors. Before 1.0 every minor version may change the ABI
// (API.md §3), so major and minor must both match the library's.
const (
	VersionMajor = 0
	VersionMinor = 1
	VersionPatch = 0
)

// Status is the C gptoss_status of a failure.
type Status int

const (
	StatusOK              Status = 0
	StatusInvalidArgument Status = 1
	StatusIO              Status = 2
	StatusFormat          Status = 3
	StatusUnsupported     Status = 4
	StatusOutOfMemory     Status = 5
	StatusDevice          Status = 6
	StatusContextFull     Status = 7
	StatusBufferTooSmall  Status = 8
	StatusCancelled       Status = 9
	StatusInternal        Status = 10
)

// String is gptoss_status_string: a short, static description.
func (s Status) String() string {
	return C.GoString(C.gptoss_status_string(C.gptoss_status(s)))
}

// Error is a failed gptoss call: the status and the library's message (gptoss_last_error).
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return "gptoss: " + e.Status.String() + ": " + e.Message }

// Is makes errors.Is(err, &gptoss.Error{Status: gptoss.StatusIO}) match on the status alone.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Message == "" && t.Status == e.Status
}

// takeError turns a status and the message a shim copied into an error, freeing the copy.
func takeError(status C.gptoss_status, message *C.char) error {
	if message != nil {
		defer C.free(unsafe.Pointer(message))
	}
	if status == C.GPTOSS_OK {
		return nil
	}
	return &Error{Status: Status(status), Message: C.GoString(message)}
}

func invalid(format string, args ...interface{}) error {
	return &Error{Status: StatusInvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// LibraryVersion is the loaded library's version.
func LibraryVersion() (major, minor, patch int) {
	v := int(C.gptoss_version())
	return v / 1000000, v / 1000 % 1000, v % 1000
}

var versionOnce struct {
	sync.Once
	err error
}

// CheckVersion reports an *Error (StatusUnsupported) if the loaded library is not the version
// this package mirrors. Load calls it.
func CheckVersion() error {
	versionOnce.Do(func() { versionOnce.err = versionCompatible(LibraryVersion()) })
	return versionOnce.err
}

// versionCompatible is nil if a library of this version matches what the package mirrors.
func versionCompatible(major, minor, patch int) error {
	if major == VersionMajor && minor == VersionMinor {
		return nil
	}
	return &Error{StatusUnsupported, fmt.Sprintf(
		"libgptoss is version %d.%d.%d, this binding needs %d.%d.x", major, minor, patch, VersionMajor, VersionMinor)}
}

// ---------------------------------------------------------------------------
// Enums

// Device selects where a model runs: a CUDA ordinal (>= 0), DeviceCPU or DeviceAuto.
type Device int32

const (
	DeviceCPU  Device = -1 // the CPU reference backend (slow)
	DeviceAuto Device = -2 // CUDA device 0 if present, else the CPU
)

type Channel int

const (
	ChannelNone       Channel = 0
	ChannelAnalysis   Channel = 1 // chain of thought
	ChannelCommentary Channel = 2 // tool calls and preambles
	ChannelFinal      Channel = 3 // the answer for the user
)

type StopReason int

const (
	StopReturn      StopReason = 0 // sampled <|return|>
	StopCall        StopReason = 1 // sampled <|call|>: a tool call
	StopToken       StopReason = 2 // sampled another stop token
	StopString      StopReason = 3 // produced a stop string
	StopMaxTokens   StopReason = 4
	StopContextFull StopReason = 5
	StopCancelled   StopReason = 6 // the callback returned false, or Cancel
)

type Role int

const (
	RoleUser      Role = 0
	RoleAssistant Role = 1
	RoleTool      Role = 2
)

// ReasoningEffort differs from the C enum by one so that its zero value means "the library's
// default" (medium), as Go zero values should.
type ReasoningEffort int

const (
	ReasoningDefault ReasoningEffort = 0
	ReasoningLow     ReasoningEffort = 1
	ReasoningMedium  ReasoningEffort = 2
	ReasoningHigh    ReasoningEffort = 3
)

// SeedRandom asks for a fresh random seed.
const SeedRandom = ^uint64(0)

// ---------------------------------------------------------------------------
// C memory for requests. cgo forbids C memory holding Go pointers, so every string and array a
// request points to is copied into C memory that lives until free().

type cArena struct{ ptrs []unsafe.Pointer }

func (a *cArena) alloc(size uintptr) unsafe.Pointer {
	p := C.calloc(1, C.size_t(size))
	if p == nil {
		panic("gptoss: out of memory")
	}
	a.ptrs = append(a.ptrs, p)
	return p
}

func (a *cArena) str(s, what string) (*C.char, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return nil, invalid("%s: contains a NUL byte at offset %d", what, strings.IndexByte(s, 0))
	}
	p := C.CString(s)
	a.ptrs = append(a.ptrs, unsafe.Pointer(p))
	return p, nil
}

func (a *cArena) optStr(s, what string) (*C.char, error) {
	if s == "" {
		return nil, nil
	}
	return a.str(s, what)
}

func (a *cArena) free() {
	for _, p := range a.ptrs {
		C.free(p)
	}
	a.ptrs = nil
}

// ---------------------------------------------------------------------------
// Model

// Model is the weights and tokenizer of one checkpoint: immutable, safe for concurrent use.
type Model struct {
	mu  sync.RWMutex // Close waits for calls in flight
	ptr *C.gptoss_model
}

// ModelInfo is what Model.Info reports.
type ModelInfo struct {
	Name             string
	NLayers          uint32
	NExperts         uint32
	NExpertsPerToken uint32
	NVocab           uint32
	MaxContext       uint32 // tokens
	WeightBytes      uint64
	Device           Device
	NCPUMoE          uint32 // layers whose MoE experts are in host memory (the first ones)
	HostWeightBytes  uint64 // host memory those experts hold
}

// CPUMoEAuto for WithCPUMoE: the fewest layers that fit the GPU memory budget.
const CPUMoEAuto = -1

type loadOptions struct {
	device          Device
	progress        func(fraction float32) bool
	nCPUMoE         int32
	gpuMemoryBudget uint64
	fitContext      uint32
}

// WithCPUMoE keeps the MoE experts of the first n layers in host memory (CPUMoEAuto: as few as
// fit the budget), for GPUs smaller than the model (gptoss_model_params.n_cpu_moe).
func WithCPUMoE(n int32) LoadOption { return func(o *loadOptions) { o.nCPUMoE = n } }

// WithGPUMemoryBudget caps the GPU memory of the model and its sessions at bytes (0: the
// device's free memory); fitContext is the KV cache, in tokens, CPUMoEAuto leaves room for
// (0: 32768).
func WithGPUMemoryBudget(bytes uint64, fitContext uint32) LoadOption {
	return func(o *loadOptions) { o.gpuMemoryBudget = bytes; o.fitContext = fitContext }
}

// LoadOption configures Load.
type LoadOption func(*loadOptions)

// WithDevice picks the device (default DeviceAuto).
func WithDevice(d Device) LoadOption { return func(o *loadOptions) { o.device = d } }

// WithProgress calls fn(fraction) as loading proceeds; returning false cancels the load
// (an *Error with StatusCancelled).
func WithProgress(fn func(fraction float32) bool) LoadOption {
	return func(o *loadOptions) { o.progress = fn }
}

// Load loads the checkpoint directory dir (config.json, tokenizer.json, safetensors).
func Load(dir string, opts ...LoadOption) (*Model, error) {
	if err := CheckVersion(); err != nil {
		return nil, err
	}
	o := loadOptions{device: DeviceAuto}
	for _, opt := range opts {
		opt(&o)
	}
	var arena cArena
	defer arena.free()
	cdir, err := arena.str(dir, "model_dir")
	if err != nil {
		return nil, err
	}
	var handle cgo.Handle
	var state *progressState
	if o.progress != nil {
		state = &progressState{fn: o.progress}
		handle = cgo.NewHandle(state)
		defer handle.Delete()
	}
	var ptr *C.gptoss_model
	var msg *C.char
	status := C.gogptoss_load(cdir, C.int32_t(o.device), C.uintptr_t(handle), C.int32_t(o.nCPUMoE),
		C.uint64_t(o.gpuMemoryBudget), C.uint32_t(o.fitContext), &ptr, &msg)
	err = takeError(status, msg)
	if state != nil && state.panic != nil {
		if ptr != nil {
			C.gptoss_model_free(ptr)
		}
		panic(state.panic)
	}
	if err != nil {
		return nil, err
	}
	m := &Model{ptr: ptr}
	runtime.SetFinalizer(m, (*Model).Close)
	return m, nil
}

// Close releases the model. Sessions created from it keep working; the C model is freed
// when the last of them is closed. Closing twice is a no-op.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ptr != nil {
		C.gptoss_model_free(m.ptr)
		m.ptr = nil
		runtime.SetFinalizer(m, nil)
	}
	return nil
}

// use runs fn with the live handle, holding the model open for the duration.
func (m *Model) use(fn func(*C.gptoss_model) error) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.ptr == nil {
		return invalid("model: used after Close")
	}
	return fn(m.ptr)
}

// Info describes the loaded checkpoint.
func (m *Model) Info() (ModelInfo, error) {
	var info ModelInfo
	err := m.use(func(p *C.gptoss_model) error {
		var ci C.gptoss_model_info
		ci.struct_size = C.uint32_t(unsafe.Sizeof(ci))
		var msg *C.char
		if err := takeError(C.gogptoss_model_get_info(p, &ci, &msg), msg); err != nil {
			return err
		}
		info = ModelInfo{C.GoString(ci.name), uint32(ci.n_layers), uint32(ci.n_experts),
			uint32(ci.n_experts_per_token), uint32(ci.n_vocab), uint32(ci.max_context),
			uint64(ci.weight_bytes), Device(ci.device), uint32(ci.n_cpu_moe), uint64(ci.host_weight_bytes)}
		return nil
	})
	return info, err
}

// Tokenize converts text to token ids. Text spelling a special token ("<|start|>") becomes that
// token only if allowSpecial; keep it false for untrusted input.
func (m *Model) Tokenize(text string, allowSpecial bool) ([]int32, error) {
	var tokens []int32
	err := m.use(func(p *C.gptoss_model) error {
		ctext := C.CBytes([]byte(text))
		defer C.free(ctext)
		capacity := len(text) + 1 // byte-level BPE: never more tokens than bytes
		for {
			buf := make([]int32, capacity)
			var n C.size_t
			var msg *C.char
			status := C.gogptoss_tokenize(p, (*C.char)(ctext), C.size_t(len(text)), C.bool(allowSpecial),
				(*C.int32_t)(unsafe.Pointer(&buf[0])), C.size_t(capacity), &n, &msg)
			if status == C.GPTOSS_ERR_BUFFER_TOO_SMALL && int(n) > capacity {
				C.free(unsafe.Pointer(msg))
				capacity = int(n)
				continue
			}
			if err := takeError(status, msg); err != nil {
				return err
			}
			tokens = buf[:n]
			return nil
		}
	})
	return tokens, err
}

// DetokenizeBytes converts token ids to bytes; special tokens appear as their names. The bytes
// may end inside a multi-byte character.
func (m *Model) DetokenizeBytes(tokens []int32) ([]byte, error) {
	var text []byte
	err := m.use(func(p *C.gptoss_model) error {
		ids := make([]int32, len(tokens)+1)
		copy(ids, tokens)
		capacity := 16*len(tokens) + 1
		for {
			buf := make([]byte, capacity)
			var n C.size_t
			var msg *C.char
			status := C.gogptoss_detokenize(p, (*C.int32_t)(unsafe.Pointer(&ids[0])), C.size_t(len(tokens)),
				(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(capacity), &n, &msg)
			if status == C.GPTOSS_ERR_BUFFER_TOO_SMALL && int(n)+1 > capacity {
				C.free(unsafe.Pointer(msg))
				capacity = int(n) + 1
				continue
			}
			if err := takeError(status, msg); err != nil {
				return err
			}
			text = buf[:n]
			return nil
		}
	})
	return text, err
}

// Detokenize converts token ids to a string (which may end in an incomplete character).
func (m *Model) Detokenize(tokens []int32) (string, error) {
	b, err := m.DetokenizeBytes(tokens)
	return string(b), err
}

// Render returns the Harmony prompt tokens Chat would send, up to <|start|>assistant.
func (m *Model) Render(req *ChatRequest) ([]int32, error) {
	var tokens []int32
	err := m.use(func(p *C.gptoss_model) error {
		var arena cArena
		defer arena.free()
		creq, err := req.toC(&arena)
		if err != nil {
			return err
		}
		capacity := 1024
		for {
			buf := make([]int32, capacity)
			var n C.size_t
			var msg *C.char
			status := C.gogptoss_chat_render(p, creq, (*C.int32_t)(unsafe.Pointer(&buf[0])), C.size_t(capacity), &n, &msg)
			if status == C.GPTOSS_ERR_BUFFER_TOO_SMALL && int(n) > capacity {
				C.free(unsafe.Pointer(msg))
				capacity = int(n)
				continue
			}
			if err := takeError(status, msg); err != nil {
				return err
			}
			tokens = buf[:n]
			return nil
		}
	})
	return tokens, err
}

// ---------------------------------------------------------------------------
// Sessions

// SessionParams sizes a session; zero fields take the library's defaults.
type SessionParams struct {
	MaxContext uint32 // tokens; 0: the model's maximum
	MaxBatch   uint32 // prompt tokens per step; 0: chosen by the library
}

// Session is working memory for one generation at a time. Use it from one goroutine at a
// time; Cancel may be called from any goroutine. The session is a cache, not a conversation:
// pass the whole prompt or conversation every time.
type Session struct {
	mu   sync.RWMutex // calls and Cancel hold it shared; Close exclusively
	busy atomic.Bool
	ptr  *C.gptoss_session
}

// NewSession creates a session on the model.
func (m *Model) NewSession(params SessionParams) (*Session, error) {
	var s *Session
	err := m.use(func(p *C.gptoss_model) error {
		var ptr *C.gptoss_session
		var msg *C.char
		status := C.gogptoss_session_create(p, C.uint32_t(params.MaxContext), C.uint32_t(params.MaxBatch), &ptr, &msg)
		if err := takeError(status, msg); err != nil {
			return err
		}
		s = &Session{ptr: ptr}
		runtime.SetFinalizer(s, (*Session).Close)
		return nil
	})
	return s, err
}

// Close frees the session, waiting for a call in flight to return. Closing twice is a no-op.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr != nil {
		C.gptoss_session_free(s.ptr)
		s.ptr = nil
		runtime.SetFinalizer(s, nil)
	}
	return nil
}

// Cancel asks a running Generate or Chat to stop before its next token; it then returns with
// StopCancelled. Safe from any goroutine, including the event callback; a no-op when idle.
func (s *Session) Cancel() {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.ptr != nil {
		C.gptoss_session_cancel(s.ptr)
	}
}

func (s *Session) run(fn func(*C.gptoss_session) error) error {
	if !s.busy.CompareAndSwap(false, true) {
		return invalid("session: already running a call; use one session per goroutine")
	}
	defer s.busy.Store(false)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.ptr == nil {
		return invalid("session: used after Close")
	}
	return fn(s.ptr)
}

// Sampling holds the sampling settings. Start from DefaultSampling(), which has the library's
// defaults; a zero Sampling means greedy decoding with seed 0.
type Sampling struct {
	Temperature float32 // 0 = greedy
	TopP        float32
	TopK        uint32  // 0 = off
	Seed        uint64  // SeedRandom for a fresh one
	MaxTokens   uint32  // 0 = until a stop or a full context
	StopTokens  []int32 // nil: the library's default (<|return|>, <|call|>); ignored by Chat
	StopStrings []string
	// JSONSchema, for Generate: the output is one JSON document matching this JSON Schema,
	// then a stop token (constrained decoding). "" for none; ignored by Chat (see ResponseFormat).
	JSONSchema string
}

// DefaultSampling returns the library's defaults (gptoss_sampling_params_init).
func DefaultSampling() Sampling {
	var p C.gptoss_sampling_params
	C.gptoss_sampling_params_init(&p, C.size_t(unsafe.Sizeof(p)))
	return Sampling{Temperature: float32(p.temperature), TopP: float32(p.top_p), TopK: uint32(p.top_k),
		Seed: uint64(p.seed), MaxTokens: uint32(p.max_tokens)}
}

func (s *Sampling) toC(a *cArena) (*C.gptoss_sampling_params, error) {
	p := (*C.gptoss_sampling_params)(a.alloc(unsafe.Sizeof(C.gptoss_sampling_params{})))
	C.gptoss_sampling_params_init(p, C.size_t(unsafe.Sizeof(*p)))
	p.temperature = C.float(s.Temperature)
	p.top_p = C.float(s.TopP)
	p.top_k = C.uint32_t(s.TopK)
	p.seed = C.uint64_t(s.Seed)
	p.max_tokens = C.uint32_t(s.MaxTokens)
	if s.StopTokens != nil {
		arr := unsafe.Slice((*C.int32_t)(a.alloc(uintptr(len(s.StopTokens)+1)*4)), len(s.StopTokens)+1)
		for i, t := range s.StopTokens {
			arr[i] = C.int32_t(t)
		}
		p.stop_tokens = &arr[0]
		p.n_stop_tokens = C.size_t(len(s.StopTokens))
	}
	if len(s.StopStrings) > 0 {
		arr := unsafe.Slice((**C.char)(a.alloc(uintptr(len(s.StopStrings))*unsafe.Sizeof((*C.char)(nil)))), len(s.StopStrings))
		for i, str := range s.StopStrings {
			c, err := a.str(str, fmt.Sprintf("stop_strings[%d]", i))
			if err != nil {
				return nil, err
			}
			arr[i] = c
		}
		p.stop_strings = &arr[0]
		p.n_stop_strings = C.size_t(len(s.StopStrings))
	}
	var err error
	if p.json_schema, err = a.optStr(s.JSONSchema, "json_schema"); err != nil {
		return nil, err
	}
	return p, nil
}

// Event is one sampled token, passed to the callback of Generate or Chat.
type Event struct {
	Token     int32
	Text      string  // the complete UTF-8 characters this token finished; often ""
	Channel   Channel // chat: the channel of the message being written
	Recipient string  // chat: "functions.NAME" while writing a tool call, else ""
}

// GenerateResult is what Generate returns.
type GenerateResult struct {
	Tokens        []int32 // sampled tokens, including the stop token if any
	Text          string  // Tokens as text, special tokens included
	StopReason    StopReason
	NPromptTokens uint32
	NCachedTokens uint32 // prompt tokens reused from the session's KV cache
	PrefillMs     float64
	DecodeMs      float64
}

// withEvents runs call with a cgo handle for onEvent (0 if nil), re-raising a callback panic.
func withEvents(onEvent func(Event) bool, call func(handle C.uintptr_t) error) error {
	if onEvent == nil {
		return call(0)
	}
	state := &eventState{fn: onEvent}
	handle := cgo.NewHandle(state)
	defer handle.Delete()
	err := call(C.uintptr_t(handle))
	if state.panic != nil {
		panic(state.panic)
	}
	return err
}

// Generate continues the whole prompt. onEvent, if not nil, is called for every sampled token
// on the calling goroutine; returning false stops generation (StopCancelled). If the prompt
// does not fit, the error has StatusContextFull and the session is unchanged.
func (s *Session) Generate(prompt []int32, sampling Sampling, onEvent func(Event) bool) (*GenerateResult, error) {
	var result *GenerateResult
	err := s.run(func(p *C.gptoss_session) error {
		var arena cArena
		defer arena.free()
		cs, err := sampling.toC(&arena)
		if err != nil {
			return err
		}
		cprompt := (*C.int32_t)(arena.alloc(uintptr(len(prompt)+1) * 4))
		copy(unsafe.Slice((*int32)(unsafe.Pointer(cprompt)), len(prompt)), prompt)
		return withEvents(onEvent, func(handle C.uintptr_t) error {
			var out *C.gptoss_generate_result
			var msg *C.char
			status := C.gogptoss_generate(p, cprompt, C.size_t(len(prompt)), cs, handle, &out, &msg)
			if err := takeError(status, msg); err != nil {
				return err
			}
			r := &GenerateResult{StopReason: StopReason(out.stop_reason), NPromptTokens: uint32(out.n_prompt_tokens),
				NCachedTokens: uint32(out.n_cached_tokens), PrefillMs: float64(out.prefill_ms), DecodeMs: float64(out.decode_ms)}
			if out.n_tokens > 0 {
				r.Tokens = append([]int32(nil), unsafe.Slice((*int32)(unsafe.Pointer(out.tokens)), int(out.n_tokens))...)
			}
			if out.text_len > 0 {
				r.Text = C.GoStringN(out.text, C.int(out.text_len))
			}
			result = r
			return nil
		})
	})
	return result, err
}

// ---------------------------------------------------------------------------
// Chat

// Message is one Harmony message (gptoss_message). ChatResult.Messages are these; append them
// to the history as they are.
type Message struct {
	Role        Role
	Channel     Channel // assistant: required; tool: ChannelCommentary; user: ChannelNone
	Content     string
	Author      string // tool results: "functions.get_weather"
	Recipient   string // tool calls: "functions.get_weather"
	ContentType string // tool calls: "json"
}

// UserMessage is a user turn.
func UserMessage(content string) Message { return Message{Role: RoleUser, Content: content} }

// ToolResultMessage is the result of calling functions.name.
func ToolResultMessage(name, content string) Message {
	return Message{Role: RoleTool, Channel: ChannelCommentary, Content: content, Author: "functions." + name}
}

// Tool is a function the model may call.
type Tool struct {
	Name        string // "get_weather"; called as functions.get_weather
	Description string
	Parameters  string // JSON Schema of the arguments; "" if none
}

// ChatRequest is a conversation to continue.
type ChatRequest struct {
	Messages        []Message // oldest first
	Instructions    string    // the developer message; "" for none
	Tools           []Tool
	ReasoningEffort ReasoningEffort // ReasoningDefault (zero): medium
	CurrentDate     string          // "YYYY-MM-DD"; "" to omit
	KeepAnalysis    bool
	// Constrained decoding. ToolChoice: "" or "auto" (the model decides), "none" (no tool
	// call), "required" (the reply is a call to one of Tools) or a function name (a call to it).
	ToolChoice string
	// FreeToolArguments: true leaves tool-call arguments unconstrained (by default they match
	// their tool's Parameters schema).
	FreeToolArguments bool
	ResponseFormat    *ResponseFormat // nil: free text
	// MaxReasoningTokens (vLLM's thinking_token_budget): nil, no bound; else the analysis takes at
	// most this many tokens, then the answer is forced (0: no analysis). See gptoss.h.
	MaxReasoningTokens *uint32
}

// ResponseFormat is OpenAI's response_format: Type "json_object" (any JSON object) or
// "json_schema" (Schema, a JSON Schema; Name required; rendered as Harmony's "# Response
// Formats" section). The final-channel message is constrained to it.
type ResponseFormat struct {
	Type        string
	Name        string
	Description string
	Schema      string
}

// ChatRequestFromJSON parses an OpenAI Chat Completions request body with the library's own
// mapping (gptoss_conversation_parse_json): "messages" (system/developer become Instructions;
// assistant "reasoning_content", "tool_calls" and "content"; tool "tool_call_id" or "name"),
// "tools" and "reasoning_effort". Other fields are ignored. A malformed body is an *Error
// with StatusInvalidArgument naming the field, e.g. "messages[3].role".
func ChatRequestFromJSON(body []byte) (*ChatRequest, error) {
	cbody := C.CBytes(body)
	defer C.free(cbody)
	var conv *C.gptoss_conversation
	var msg *C.char
	if err := takeError(C.gogptoss_conversation_parse_json((*C.char)(cbody), C.size_t(len(body)), &conv, &msg), msg); err != nil {
		return nil, err
	}
	defer C.gptoss_conversation_free(conv)
	r := C.gptoss_conversation_get_request(conv)
	req := &ChatRequest{Instructions: goStr(r.instructions), CurrentDate: goStr(r.current_date),
		ReasoningEffort: ReasoningEffort(r.reasoning_effort) + 1, KeepAnalysis: bool(r.keep_analysis),
		FreeToolArguments: !bool(r.constrain_tool_arguments)}
	if r.max_reasoning_tokens != C.UINT32_MAX {
		budget := uint32(r.max_reasoning_tokens)
		req.MaxReasoningTokens = &budget
	}
	switch r.tool_choice {
	case C.GPTOSS_TOOL_CHOICE_NONE:
		req.ToolChoice = "none"
	case C.GPTOSS_TOOL_CHOICE_REQUIRED:
		req.ToolChoice = "required"
	case C.GPTOSS_TOOL_CHOICE_NAMED:
		req.ToolChoice = goStr(r.tool_choice_name)
	}
	switch r.response_format {
	case C.GPTOSS_RESPONSE_FORMAT_JSON_OBJECT:
		req.ResponseFormat = &ResponseFormat{Type: "json_object"}
	case C.GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA:
		req.ResponseFormat = &ResponseFormat{Type: "json_schema", Name: goStr(r.response_format_name),
			Description: goStr(r.response_format_description), Schema: goStr(r.response_format_schema)}
	}
	if r.n_messages > 0 {
		for _, m := range unsafe.Slice(r.messages, int(r.n_messages)) {
			req.Messages = append(req.Messages, messageFromC(&m))
		}
	}
	if r.n_tools > 0 {
		for _, t := range unsafe.Slice(r.tools, int(r.n_tools)) {
			req.Tools = append(req.Tools, Tool{goStr(t.name), goStr(t.description), goStr(t.parameters)})
		}
	}
	return req, nil
}

func messageFromC(m *C.gptoss_message) Message {
	return Message{Role(m.role), Channel(m.channel), goStr(m.content), goStr(m.author), goStr(m.recipient),
		goStr(m.content_type)}
}

func (r *ChatRequest) toC(ar *cArena) (*C.gptoss_chat_request, error) {
	req := (*C.gptoss_chat_request)(ar.alloc(unsafe.Sizeof(C.gptoss_chat_request{})))
	C.gptoss_chat_request_init(req, C.size_t(unsafe.Sizeof(*req)))
	var err error
	if len(r.Messages) > 0 {
		msgs := unsafe.Slice((*C.gptoss_message)(ar.alloc(uintptr(len(r.Messages))*unsafe.Sizeof(C.gptoss_message{}))), len(r.Messages))
		for i, m := range r.Messages {
			msgs[i].role = C.gptoss_role(m.Role)
			msgs[i].channel = C.gptoss_channel(m.Channel)
			if msgs[i].content, err = ar.str(m.Content, fmt.Sprintf("messages[%d].content", i)); err != nil {
				return nil, err
			}
			if msgs[i].author, err = ar.optStr(m.Author, fmt.Sprintf("messages[%d].author", i)); err != nil {
				return nil, err
			}
			if msgs[i].recipient, err = ar.optStr(m.Recipient, fmt.Sprintf("messages[%d].recipient", i)); err != nil {
				return nil, err
			}
			if msgs[i].content_type, err = ar.optStr(m.ContentType, fmt.Sprintf("messages[%d].content_type", i)); err != nil {
				return nil, err
			}
		}
		req.messages = &msgs[0]
		req.n_messages = C.size_t(len(r.Messages))
	}
	if len(r.Tools) > 0 {
		tools := unsafe.Slice((*C.gptoss_tool)(ar.alloc(uintptr(len(r.Tools))*unsafe.Sizeof(C.gptoss_tool{}))), len(r.Tools))
		for i, t := range r.Tools {
			if tools[i].name, err = ar.str(t.Name, fmt.Sprintf("tools[%d].name", i)); err != nil {
				return nil, err
			}
			if tools[i].description, err = ar.str(t.Description, fmt.Sprintf("tools[%d].description", i)); err != nil {
				return nil, err
			}
			if tools[i].parameters, err = ar.optStr(t.Parameters, fmt.Sprintf("tools[%d].parameters", i)); err != nil {
				return nil, err
			}
		}
		req.tools = &tools[0]
		req.n_tools = C.size_t(len(r.Tools))
	}
	if req.instructions, err = ar.optStr(r.Instructions, "instructions"); err != nil {
		return nil, err
	}
	if req.current_date, err = ar.optStr(r.CurrentDate, "current_date"); err != nil {
		return nil, err
	}
	if r.ReasoningEffort != ReasoningDefault {
		req.reasoning_effort = C.gptoss_reasoning_effort(r.ReasoningEffort - 1)
	}
	req.keep_analysis = C.bool(r.KeepAnalysis)
	req.constrain_tool_arguments = C.bool(!r.FreeToolArguments)
	if r.MaxReasoningTokens != nil {
		if *r.MaxReasoningTokens == math.MaxUint32 {
			return nil, &Error{Status: StatusInvalidArgument, Message: "max_reasoning_tokens: 4294967295 is reserved for no bound (use nil)"}
		}
		req.max_reasoning_tokens = C.uint32_t(*r.MaxReasoningTokens)
	}
	switch r.ToolChoice {
	case "", "auto":
	case "none":
		req.tool_choice = C.GPTOSS_TOOL_CHOICE_NONE
	case "required":
		req.tool_choice = C.GPTOSS_TOOL_CHOICE_REQUIRED
	default:
		req.tool_choice = C.GPTOSS_TOOL_CHOICE_NAMED
		if req.tool_choice_name, err = ar.str(r.ToolChoice, "tool_choice"); err != nil {
			return nil, err
		}
	}
	if f := r.ResponseFormat; f != nil {
		switch f.Type {
		case "", "text":
		case "json_object":
			req.response_format = C.GPTOSS_RESPONSE_FORMAT_JSON_OBJECT
		case "json_schema":
			req.response_format = C.GPTOSS_RESPONSE_FORMAT_JSON_SCHEMA
			if req.response_format_name, err = ar.optStr(f.Name, "response_format.name"); err != nil {
				return nil, err
			}
			if req.response_format_description, err = ar.optStr(f.Description, "response_format.description"); err != nil {
				return nil, err
			}
			if req.response_format_schema, err = ar.optStr(f.Schema, "response_format.schema"); err != nil {
				return nil, err
			}
		default:
			return nil, &Error{Status: StatusInvalidArgument,
				Message: fmt.Sprintf("response_format.type: %q is not text, json_object or json_schema", f.Type)}
		}
	}
	return req, nil
}

// ToolCall is a tool call the model made.
type ToolCall struct {
	Name        string // "get_weather"
	Recipient   string // "functions.get_weather"
	Arguments   string // as written; normally JSON; not validated
	ContentType string
}

// ChatResult is what Chat returns.
type ChatResult struct {
	Final             string // the answer for the user; "" if none
	Analysis          string // chain of thought; do not show it to end users
	ToolCalls         []ToolCall
	Messages          []Message // this turn, parsed
	StopReason        StopReason
	Raw               string // the completion as text, special tokens included
	NPromptTokens     uint32
	NCachedTokens     uint32
	NCompletionTokens uint32
	PrefillMs         float64
	DecodeMs          float64
}

func goStr(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// Chat generates the assistant's next turn for req and parses it. onEvent, if not nil, gets
// every sampled token with the channel and recipient being written; returning false stops.
func (s *Session) Chat(req *ChatRequest, sampling Sampling, onEvent func(Event) bool) (*ChatResult, error) {
	var result *ChatResult
	err := s.run(func(p *C.gptoss_session) error {
		var arena cArena
		defer arena.free()
		creq, err := req.toC(&arena)
		if err != nil {
			return err
		}
		cs, err := sampling.toC(&arena)
		if err != nil {
			return err
		}
		return withEvents(onEvent, func(handle C.uintptr_t) error {
			var out *C.gptoss_chat_result
			var msg *C.char
			if err := takeError(C.gogptoss_chat(p, creq, cs, handle, &out, &msg), msg); err != nil {
				return err
			}
			r := &ChatResult{Final: goStr(out.final), Analysis: goStr(out.analysis),
				StopReason: StopReason(out.stop_reason), Raw: goStr(out.raw),
				NPromptTokens: uint32(out.n_prompt_tokens), NCachedTokens: uint32(out.n_cached_tokens),
				NCompletionTokens: uint32(out.n_completion_tokens), PrefillMs: float64(out.prefill_ms),
				DecodeMs: float64(out.decode_ms)}
			if out.n_tool_calls > 0 {
				for _, c := range unsafe.Slice(out.tool_calls, int(out.n_tool_calls)) {
					r.ToolCalls = append(r.ToolCalls, ToolCall{goStr(c.name), goStr(c.recipient), goStr(c.arguments), goStr(c.content_type)})
				}
			}
			if out.n_messages > 0 {
				for _, m := range unsafe.Slice(out.messages, int(out.n_messages)) {
					r.Messages = append(r.Messages, messageFromC(&m))
				}
			}
			result = r
			return nil
		})
	})
	return result, err
}
