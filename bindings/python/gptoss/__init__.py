"""gptoss - run OpenAI's gpt-oss models from Python, through libgptoss.so (ctypes, stdlib only).

    import gptoss
    with gptoss.Model("/models/gpt-oss-20b") as model, model.session() as session:
        reply = session.chat([{"role": "user", "content": "What is 2 + 2?"}])
        print(reply.final)

Objects mirror the C API (gptoss.h): a Model is immutable and may be shared between threads;
a Session is used by one thread at a time and caches the KV of the last prompt, so pass the
whole conversation every time. Every failure raises a GptossError subclass carrying the C
status and the text of gptoss_last_error(), read on the thread that made the call.
Results are copied into Python objects at once, so they stay valid after the next call.
"""
from __future__ import annotations

import ctypes
import enum
import json
import queue
import threading
import weakref
from dataclasses import dataclass, field
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Union)

from . import _ffi
from ._ffi import CPU_MOE_AUTO, DEVICE_AUTO, DEVICE_CPU, SEED_RANDOM, LibraryNotFound, VersionMismatch, library_path

__version__ = f"{_ffi.VERSION_MAJOR}.{_ffi.VERSION_MINOR}.{_ffi.VERSION_PATCH}"

__all__ = [
    "Model", "Session", "ModelInfo", "Event", "GenerateResult", "ChatResult", "Message", "ToolCall",
    "Tool", "Stream", "Conversation", "parse_conversation_json", "Status", "Channel", "Role", "StopReason", "ReasoningEffort", "LogLevel",
    "GptossError", "InvalidArgumentError", "GptossIOError", "FormatError", "UnsupportedError",
    "OutOfMemoryError", "DeviceError", "ContextFullError", "BufferTooSmallError", "CancelledError",
    "InternalError", "LibraryNotFound", "VersionMismatch", "library_version", "library_path",
    "set_log_callback", "DEVICE_CPU", "DEVICE_AUTO", "SEED_RANDOM", "CPU_MOE_AUTO",
]


# ---------------------------------------------------------------------------
# Enums (values are gptoss.h's; unknown values from a newer library are passed through as int)

class Status(enum.IntEnum):
    OK = 0
    INVALID_ARGUMENT = 1
    IO = 2
    FORMAT = 3
    UNSUPPORTED = 4
    OUT_OF_MEMORY = 5
    DEVICE = 6
    CONTEXT_FULL = 7
    BUFFER_TOO_SMALL = 8
    CANCELLED = 9
    INTERNAL = 10


class Channel(enum.IntEnum):
    NONE = 0
    ANALYSIS = 1
    COMMENTARY = 2
    FINAL = 3


class StopReason(enum.IntEnum):
    RETURN = 0
    CALL = 1
    TOKEN = 2
    STRING = 3
    MAX_TOKENS = 4
    CONTEXT_FULL = 5
    CANCELLED = 6


class Role(enum.IntEnum):
    USER = 0
    ASSISTANT = 1
    TOOL = 2


class ReasoningEffort(enum.IntEnum):
    LOW = 0
    MEDIUM = 1
    HIGH = 2


class LogLevel(enum.IntEnum):
    DEBUG = 0
    INFO = 1
    WARN = 2
    ERROR = 3


def _enum(cls: Any, value: int) -> Any:
    try:
        return cls(value)
    except ValueError:  # a value appended by a newer library (API.md §3 rule 7)
        return value


# ---------------------------------------------------------------------------
# Errors

class GptossError(Exception):
    """A gptoss call failed. `status` is the C gptoss_status, `message` gptoss_last_error()."""

    def __init__(self, status: int, message: str):
        self.status = _enum(Status, status)
        self.message = message
        name = self.status.name if isinstance(self.status, Status) else str(status)
        super().__init__(f"{name}: {message}" if message else name)


class InvalidArgumentError(GptossError, ValueError):
    pass


class GptossIOError(GptossError, OSError):
    pass


class FormatError(GptossError):
    pass


class UnsupportedError(GptossError):
    pass


class OutOfMemoryError(GptossError, MemoryError):
    pass


class DeviceError(GptossError):
    pass


class ContextFullError(GptossError):
    pass


class BufferTooSmallError(GptossError):
    pass


class CancelledError(GptossError):
    pass


class InternalError(GptossError):
    pass


_ERRORS = {
    Status.INVALID_ARGUMENT: InvalidArgumentError, Status.IO: GptossIOError,
    Status.FORMAT: FormatError, Status.UNSUPPORTED: UnsupportedError,
    Status.OUT_OF_MEMORY: OutOfMemoryError, Status.DEVICE: DeviceError,
    Status.CONTEXT_FULL: ContextFullError, Status.BUFFER_TOO_SMALL: BufferTooSmallError,
    Status.CANCELLED: CancelledError, Status.INTERNAL: InternalError,
}


def _lib() -> ctypes.CDLL:
    return _ffi.library()


def _error(status: int) -> GptossError:
    # Called right after the failing call, on the same thread: last_error is thread-local.
    raw = _lib().gptoss_last_error()
    message = raw.decode("utf-8", "replace") if raw else ""
    return _ERRORS.get(status, GptossError)(status, message)  # type: ignore[call-overload]


def _check(status: int) -> None:
    if status != Status.OK:
        raise _error(status)


def _str(raw: Optional[bytes]) -> Optional[str]:
    return None if raw is None else raw.decode("utf-8", "replace")


def _bytes(value: Optional[str], keep: List[Any], what: str) -> Optional[bytes]:
    """`value` as a NUL-terminated UTF-8 string for C, kept alive in `keep`. A NUL inside would
    silently cut the string short on the C side, so it is an error naming the field."""
    if value is None:
        return None
    b = value.encode("utf-8")
    if b"\0" in b:
        raise InvalidArgumentError(Status.INVALID_ARGUMENT, f"{what}: contains a NUL byte at offset {b.index(0)}")
    keep.append(b)
    return b


def library_version() -> str:
    """The loaded libgptoss.so's version, "MAJOR.MINOR.PATCH"."""
    v = _lib().gptoss_version()
    return f"{v // 1000000}.{v // 1000 % 1000}.{v % 1000}"


_log_callback: Optional[Any] = None  # the ctypes thunk must outlive every library call


def set_log_callback(fn: Optional[Callable[[LogLevel, str], None]],
                     min_level: LogLevel = LogLevel.INFO) -> None:
    """Sends the library's log lines at `min_level` and above to fn(level, line); None silences.
    Not thread-safe (gptoss.h): call it before anything else. Exceptions from fn are dropped,
    because a log line may come from any thread inside the library."""
    global _log_callback
    if fn is None:
        _lib().gptoss_set_log_callback(ctypes.cast(None, _ffi.LOG_FN), None, int(min_level))
        _log_callback = None
        return

    def thunk(_user: Any, level: int, message: bytes) -> None:
        try:
            fn(_enum(LogLevel, level), message.decode("utf-8", "replace"))
        except BaseException:  # noqa: B902 - an exception must not unwind into C
            pass

    callback = _ffi.LOG_FN(thunk)
    _lib().gptoss_set_log_callback(callback, None, int(min_level))
    _log_callback = callback


# ---------------------------------------------------------------------------
# Plain result types

@dataclass(frozen=True)
class ModelInfo:
    name: str
    n_layers: int
    n_experts: int
    n_experts_per_token: int
    n_vocab: int
    max_context: int        # tokens
    weight_bytes: int       # device (or host, on the CPU backend) memory held by the weights
    device: int             # CUDA ordinal, or DEVICE_CPU
    n_cpu_moe: int = 0      # layers whose MoE experts are in host memory (the first ones)
    host_weight_bytes: int = 0  # host memory those experts hold


@dataclass(frozen=True)
class Event:
    """One sampled token while streaming. `text` is the complete UTF-8 characters this token
    finished (often ""); `channel` and `recipient` describe the message being written (chat)."""
    token: int
    text: str
    channel: Channel
    recipient: Optional[str]


@dataclass(frozen=True)
class GenerateResult:
    tokens: List[int]           # sampled tokens, including the stop token if any
    text: str                   # `tokens` as text, special tokens included
    stop_reason: StopReason
    n_prompt_tokens: int
    n_cached_tokens: int        # prompt tokens reused from the session's KV cache
    prefill_ms: float
    decode_ms: float


@dataclass
class Message:
    """One Harmony message, exactly as gptoss_message. Messages of a ChatResult are these; append
    them to the history as they are. The OpenAI dict shape is accepted wherever a Message is."""
    role: Role
    content: str = ""
    channel: Channel = Channel.NONE
    author: Optional[str] = None        # tool results: "functions.get_weather"
    recipient: Optional[str] = None     # tool calls: "functions.get_weather"
    content_type: Optional[str] = None  # tool calls: "json"


@dataclass(frozen=True)
class ToolCall:
    name: str                   # "get_weather"
    recipient: str              # "functions.get_weather"
    arguments: str              # as the model wrote it; normally JSON, not validated
    content_type: Optional[str]

    def parsed_arguments(self) -> Any:
        """`arguments` as JSON. Raises json.JSONDecodeError if the model wrote something else."""
        return json.loads(self.arguments)


@dataclass(frozen=True)
class Tool:
    """A function the model may call. `parameters` is a JSON Schema (dict or JSON text)."""
    name: str
    description: str = ""
    parameters: Union[None, str, Mapping[str, Any]] = None


@dataclass(frozen=True)
class ChatResult:
    final: str                  # the answer for the user; "" if none
    analysis: str               # chain of thought: do not show it to end users
    tool_calls: List[ToolCall]
    messages: List[Message]     # this turn, parsed
    stop_reason: StopReason
    raw: str                    # the completion as text, special tokens included
    n_prompt_tokens: int
    n_cached_tokens: int
    n_completion_tokens: int
    prefill_ms: float
    decode_ms: float


def _event(ev: Any) -> Event:
    e = ev.contents
    text = ctypes.string_at(e.text, e.text_len).decode("utf-8", "replace") if e.text_len else ""
    return Event(e.token, text, _enum(Channel, e.channel), _str(e.recipient))


def _generate_result(r: Any) -> GenerateResult:
    text = ctypes.string_at(r.text, r.text_len).decode("utf-8", "replace") if r.text_len else ""
    return GenerateResult([r.tokens[i] for i in range(r.n_tokens)], text,
                          _enum(StopReason, r.stop_reason), r.n_prompt_tokens, r.n_cached_tokens,
                          r.prefill_ms, r.decode_ms)


def _message(m: Any) -> Message:
    return Message(_enum(Role, m.role), _str(m.content) or "", _enum(Channel, m.channel),
                   _str(m.author), _str(m.recipient), _str(m.content_type))


def _chat_result(r: Any) -> ChatResult:
    calls = [ToolCall(_str(c.name) or "", _str(c.recipient) or "", _str(c.arguments) or "",
                      _str(c.content_type)) for c in r.tool_calls[:r.n_tool_calls]]
    messages = [_message(m) for m in r.messages[:r.n_messages]]
    return ChatResult(_str(r.final) or "", _str(r.analysis) or "", calls, messages,
                      _enum(StopReason, r.stop_reason), _str(r.raw) or "", r.n_prompt_tokens,
                      r.n_cached_tokens, r.n_completion_tokens, r.prefill_ms, r.decode_ms)


# ---------------------------------------------------------------------------
# OpenAI Chat Completions shapes -> Harmony messages

MessageLike = Union[Message, Mapping[str, Any]]
ToolLike = Union[Tool, Mapping[str, Any]]


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidArgumentError(Status.INVALID_ARGUMENT,
                                           f"{where}.content[{i}]: expected {{\"type\": \"text\", \"text\": str}}")
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidArgumentError(Status.INVALID_ARGUMENT,
                               f"{where}.content: expected a string or a list of text parts, found {type(content).__name__}")


def convert_messages(messages: Iterable[MessageLike]) -> "tuple[List[Message], Optional[str]]":
    """Converts OpenAI-shaped dicts (and Message objects, passed through) to Harmony messages.
    Returns (messages, instructions): system and developer messages become the instructions.
    Assistant dicts map to up to three messages: "reasoning_content"/"thinking" on the analysis
    channel, each of "tool_calls" on commentary to functions.NAME (content type json), then
    "content" on the final channel. Tool dicts take their author from "name", or from the
    tool call whose "id" matches "tool_call_id". Raises InvalidArgumentError naming the field."""
    out: List[Message] = []
    instructions: List[str] = []
    call_names: Dict[str, str] = {}
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(m, Message):
            out.append(m)
            continue
        if not isinstance(m, Mapping):
            raise InvalidArgumentError(Status.INVALID_ARGUMENT,
                                       f"{where}: expected a dict or gptoss.Message, found {type(m).__name__}")
        role = m.get("role")
        if role in ("system", "developer"):
            instructions.append(_content_text(m.get("content"), where))
        elif role == "user":
            out.append(Message(Role.USER, _content_text(m.get("content"), where), Channel.NONE))
        elif role == "assistant":
            thinking = m.get("reasoning_content", m.get("thinking"))
            if thinking:
                out.append(Message(Role.ASSISTANT, _content_text(thinking, where), Channel.ANALYSIS))
            for j, call in enumerate(m.get("tool_calls") or []):
                fn = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    raise InvalidArgumentError(Status.INVALID_ARGUMENT,
                                               f"{where}.tool_calls[{j}].function.name: expected a string")
                args = fn.get("arguments", "{}")
                if not isinstance(args, str):
                    args = json.dumps(args)
                if isinstance(call.get("id"), str):
                    call_names[call["id"]] = fn["name"]
                out.append(Message(Role.ASSISTANT, args, Channel.COMMENTARY,
                                   recipient="functions." + fn["name"], content_type="json"))
            content = _content_text(m.get("content"), where)
            if content:
                out.append(Message(Role.ASSISTANT, content, Channel.FINAL))
        elif role == "tool":
            name = m.get("name") or call_names.get(m.get("tool_call_id", ""))
            if not isinstance(name, str):
                raise InvalidArgumentError(Status.INVALID_ARGUMENT,
                                           f"{where}: a tool message needs \"name\" or a \"tool_call_id\" "
                                           "matching an earlier tool call")
            author = name if name.startswith("functions.") else "functions." + name
            out.append(Message(Role.TOOL, _content_text(m.get("content"), where), Channel.COMMENTARY,
                               author=author))
        else:
            raise InvalidArgumentError(Status.INVALID_ARGUMENT,
                                       f"{where}.role: expected system, developer, user, assistant or tool, "
                                       f"found {role!r}")
    return out, ("\n\n".join(instructions) if instructions else None)


def convert_tools(tools: Iterable[ToolLike]) -> List[Tool]:
    """Accepts Tool objects, {"type": "function", "function": {...}} and {"name", ...} dicts."""
    out = []
    for i, t in enumerate(tools):
        if isinstance(t, Tool):
            out.append(t)
            continue
        fn = t.get("function", t) if isinstance(t, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise InvalidArgumentError(Status.INVALID_ARGUMENT, f"tools[{i}].function.name: expected a string")
        out.append(Tool(fn["name"], fn.get("description") or "", fn.get("parameters")))
    return out


def _effort(value: Union[None, str, int]) -> Optional[int]:
    if value is None or isinstance(value, int):
        return value
    try:
        return int(ReasoningEffort[value.upper()])
    except KeyError:
        raise InvalidArgumentError(Status.INVALID_ARGUMENT,
                                   f"reasoning_effort: expected low, medium or high, found {value!r}") from None


@dataclass
class Conversation:
    """A chat request as the library's OpenAI mapping reads it (parse_conversation_json).
    Pass it on as session.chat(c.messages, tools=c.tools, **c.options()) (or model.render).
    tool_choice / response_format are in OpenAI's JSON shapes (None: "auto" / text);
    max_reasoning_tokens is the body's thinking_token_budget (None: no bound)."""
    messages: List[Message]
    tools: List[Tool]
    instructions: Optional[str]
    reasoning_effort: ReasoningEffort
    current_date: Optional[str]
    keep_analysis: bool
    tool_choice: Union[None, str, Dict[str, Any]] = None
    response_format: Optional[Dict[str, Any]] = None
    constrain_tool_arguments: bool = True
    max_reasoning_tokens: Optional[int] = None

    def options(self) -> Dict[str, Any]:
        return {"instructions": self.instructions, "reasoning_effort": int(self.reasoning_effort),
                "current_date": self.current_date, "keep_analysis": self.keep_analysis,
                "tool_choice": self.tool_choice, "response_format": self.response_format,
                "constrain_tool_arguments": self.constrain_tool_arguments,
                "max_reasoning_tokens": self.max_reasoning_tokens}


def _tool_choice_of(r: Any) -> Union[None, str, Dict[str, Any]]:
    """A gptoss_chat_request's tool_choice in OpenAI's JSON shape (None for "auto")."""
    if r.tool_choice == 1:
        return "none"
    if r.tool_choice == 2:
        return "required"
    if r.tool_choice == 3:
        return {"type": "function", "function": {"name": _str(r.tool_choice_name)}}
    return None


def _response_format_of(r: Any) -> Optional[Dict[str, Any]]:
    """A gptoss_chat_request's response_format in OpenAI's JSON shape (None for text)."""
    if r.response_format == 1:
        return {"type": "json_object"}
    if r.response_format != 2:
        return None
    spec: Dict[str, Any] = {"name": _str(r.response_format_name)}
    if r.response_format_description:
        spec["description"] = _str(r.response_format_description)
    spec["schema"] = json.loads(_str(r.response_format_schema) or "null")
    return {"type": "json_schema", "json_schema": spec}


def parse_conversation_json(body: Union[str, bytes, Mapping[str, Any]]) -> Conversation:
    """Parses an OpenAI Chat Completions request body (JSON text, or a dict that is serialized
    first) with the library's own mapping, gptoss_conversation_parse_json. Raises
    InvalidArgumentError naming the field, e.g. "messages[3].role"."""
    if isinstance(body, Mapping):
        body = json.dumps(body)
    data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    lib = _lib()
    handle = ctypes.c_void_p()
    _check(lib.gptoss_conversation_parse_json(data, len(data), ctypes.byref(handle)))
    try:
        r = lib.gptoss_conversation_get_request(handle).contents
        return Conversation(
            [_message(m) for m in r.messages[:r.n_messages]],
            [Tool(_str(t.name) or "", _str(t.description) or "", _str(t.parameters)) for t in r.tools[:r.n_tools]],
            _str(r.instructions), _enum(ReasoningEffort, r.reasoning_effort), _str(r.current_date),
            bool(r.keep_analysis), _tool_choice_of(r), _response_format_of(r), bool(r.constrain_tool_arguments),
            None if r.max_reasoning_tokens == 2**32 - 1 else int(r.max_reasoning_tokens))
    finally:
        lib.gptoss_conversation_free(handle)


# ---------------------------------------------------------------------------
# Model

class Model:
    """The weights and tokenizer of one checkpoint. Immutable once loaded; safe to share
    between threads. Use as a context manager, or call close(); sessions created from it keep
    the underlying C model alive, so closing order does not matter."""

    def __init__(self, path: str, device: Union[str, int] = "auto",
                 progress: Optional[Callable[[float], Optional[bool]]] = None,
                 n_cpu_moe: Union[int, str] = 0, gpu_memory_budget: int = 0, fit_context: int = 0):
        """Loads the checkpoint directory `path` (config.json, tokenizer.json, safetensors).
        `device` is "auto" (GPU 0 if present, else CPU), "cpu", "cuda", "cuda:N" or an ordinal.
        `progress(fraction)` may return False to cancel (raises CancelledError).
        `n_cpu_moe`: layers (the first N) whose MoE experts stay in host memory, or "auto" to
        fit `gpu_memory_budget` bytes (0: the GPU's free memory) with room for a session of
        `fit_context` tokens (0: 32768); see gptoss_model_params in gptoss.h."""
        lib = _lib()
        self._handle: Optional[int] = None
        params = _ffi.ModelParams()
        lib.gptoss_model_params_init(ctypes.byref(params), ctypes.sizeof(params))
        params.device = self._device(device)
        if n_cpu_moe == "auto":
            params.n_cpu_moe = _ffi.CPU_MOE_AUTO
        elif isinstance(n_cpu_moe, int) and not isinstance(n_cpu_moe, bool):
            params.n_cpu_moe = n_cpu_moe
        else:
            raise InvalidArgumentError(Status.INVALID_ARGUMENT,
                                       f"n_cpu_moe: expected a number of layers or \"auto\", found {n_cpu_moe!r}")
        params.gpu_memory_budget = gpu_memory_budget
        params.fit_context = fit_context
        error: List[BaseException] = []
        if progress is not None:
            def thunk(_user: Any, fraction: float) -> bool:
                try:
                    return progress(fraction) is not False
                except BaseException as e:  # noqa: B902 - re-raised after the C call returns
                    error.append(e)
                    return False
            params.progress = _ffi.PROGRESS_FN(thunk)
        out = ctypes.c_void_p()
        status = lib.gptoss_load(_bytes(str(path), [], "model_dir"), ctypes.byref(params), ctypes.byref(out))
        if error:
            raise error[0]
        _check(status)
        self._handle = out.value

    @staticmethod
    def _device(device: Union[str, int]) -> int:
        if isinstance(device, int):
            return device
        if device == "auto":
            return DEVICE_AUTO
        if device == "cpu":
            return DEVICE_CPU
        if device == "cuda":
            return 0
        if device.startswith("cuda:") and device[5:].isdigit():
            return int(device[5:])
        raise InvalidArgumentError(Status.INVALID_ARGUMENT,
                                   f"device: expected auto, cpu, cuda, cuda:N or an int, found {device!r}")

    @property
    def handle(self) -> int:
        if self._handle is None:
            raise InvalidArgumentError(Status.INVALID_ARGUMENT, "model: used after close()")
        return self._handle

    def close(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            _lib().gptoss_model_free(handle)

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass

    @property
    def info(self) -> ModelInfo:
        info = _ffi.ModelInfo()
        info.struct_size = ctypes.sizeof(info)
        _check(_lib().gptoss_model_get_info(self.handle, ctypes.byref(info)))
        return ModelInfo(_str(info.name) or "", info.n_layers, info.n_experts, info.n_experts_per_token,
                         info.n_vocab, info.max_context, info.weight_bytes, info.device, info.n_cpu_moe,
                         info.host_weight_bytes)

    def tokenize(self, text: str, allow_special: bool = False) -> List[int]:
        """Token ids of `text`. Text spelling a special token ("<|start|>") becomes that token
        only with allow_special=True; keep it False for untrusted input."""
        data = text.encode("utf-8")
        lib = _lib()
        capacity = len(data) + 1  # byte-level BPE never yields more tokens than bytes
        while True:
            buf = (ctypes.c_int32 * capacity)()
            n = ctypes.c_size_t()
            status = lib.gptoss_tokenize(self.handle, data, len(data), allow_special, buf, capacity,
                                         ctypes.byref(n))
            if status == Status.BUFFER_TOO_SMALL and n.value > capacity:
                capacity = n.value
                continue
            _check(status)
            return list(buf[:n.value])

    def detokenize_bytes(self, tokens: Sequence[int]) -> bytes:
        """The bytes of `tokens`; special tokens appear as their names. May end inside a
        multi-byte character."""
        lib = _lib()
        ids = (ctypes.c_int32 * max(len(tokens), 1))(*tokens)
        capacity = 16 * len(tokens) + 1
        while True:
            buf = ctypes.create_string_buffer(capacity)
            n = ctypes.c_size_t()
            status = lib.gptoss_detokenize(self.handle, ids, len(tokens), buf, capacity, ctypes.byref(n))
            if status == Status.BUFFER_TOO_SMALL and n.value + 1 > capacity:
                capacity = n.value + 1
                continue
            _check(status)
            return buf.raw[:n.value]

    def detokenize(self, tokens: Sequence[int]) -> str:
        """`tokens` as text; an incomplete trailing character becomes U+FFFD."""
        return self.detokenize_bytes(tokens).decode("utf-8", "replace")

    def render(self, messages: Iterable[MessageLike], tools: Optional[Iterable[ToolLike]] = None,
               instructions: Optional[str] = None, reasoning_effort: Union[None, str, int] = None,
               current_date: Optional[str] = None, keep_analysis: bool = False,
               tool_choice: Union[None, str, Dict[str, Any]] = None,
               response_format: Optional[Dict[str, Any]] = None, constrain_tool_arguments: bool = True,
               max_reasoning_tokens: Optional[int] = None) -> List[int]:
        """The Harmony prompt tokens chat() would send, up to and including <|start|>assistant
        (response_format adds the developer message's "# Response Formats" section; the other
        constraint arguments are checked as chat() checks them)."""
        keep: List[Any] = []
        request = _request(messages, tools, instructions, reasoning_effort, current_date,
                           keep_analysis, keep)
        _constraints(request, tool_choice, response_format, constrain_tool_arguments, keep)
        _reasoning_budget(request, max_reasoning_tokens)
        lib = _lib()
        capacity = 1024
        while True:
            buf = (ctypes.c_int32 * capacity)()
            n = ctypes.c_size_t()
            status = lib.gptoss_chat_render(self.handle, ctypes.byref(request), buf, capacity, ctypes.byref(n))
            if status == Status.BUFFER_TOO_SMALL and n.value > capacity:
                capacity = n.value
                continue
            _check(status)
            return list(buf[:n.value])

    def session(self, max_context: Optional[int] = None, max_batch: Optional[int] = None) -> "Session":
        return Session(self, max_context=max_context, max_batch=max_batch)


def _request(messages: Iterable[MessageLike], tools: Optional[Iterable[ToolLike]],
             instructions: Optional[str], reasoning_effort: Union[None, str, int],
             current_date: Optional[str], keep_analysis: bool, keep: List[Any]) -> Any:
    """Builds a gptoss_chat_request; everything it points to is appended to `keep`."""
    msgs, system = convert_messages(messages)
    if instructions is not None and system is not None:
        instructions = instructions + "\n\n" + system
    elif instructions is None:
        instructions = system
    lib = _lib()
    request = _ffi.ChatRequest()
    lib.gptoss_chat_request_init(ctypes.byref(request), ctypes.sizeof(request))
    c_msgs = (_ffi.Message * max(len(msgs), 1))()
    for i, m in enumerate(msgs):
        c_msgs[i].role = int(m.role)
        c_msgs[i].channel = int(m.channel)
        c_msgs[i].content = _bytes(m.content, keep, f"messages[{i}].content")
        c_msgs[i].author = _bytes(m.author, keep, f"messages[{i}].author")
        c_msgs[i].recipient = _bytes(m.recipient, keep, f"messages[{i}].recipient")
        c_msgs[i].content_type = _bytes(m.content_type, keep, f"messages[{i}].content_type")
    keep.append(c_msgs)
    request.messages = c_msgs
    request.n_messages = len(msgs)
    tool_list = convert_tools(tools or [])
    if tool_list:
        c_tools = (_ffi.Tool * len(tool_list))()
        for i, t in enumerate(tool_list):
            c_tools[i].name = _bytes(t.name, keep, f"tools[{i}].name")
            c_tools[i].description = _bytes(t.description, keep, f"tools[{i}].description")
            params = t.parameters
            if params is not None and not isinstance(params, str):
                params = json.dumps(params)
            c_tools[i].parameters = _bytes(params, keep, f"tools[{i}].parameters")
        keep.append(c_tools)
        request.tools = c_tools
        request.n_tools = len(tool_list)
    request.instructions = _bytes(instructions, keep, "instructions")
    effort = _effort(reasoning_effort)
    if effort is not None:
        request.reasoning_effort = effort
    request.current_date = _bytes(current_date, keep, "current_date")
    request.keep_analysis = bool(keep_analysis)
    return request


def _constraints(request: Any, tool_choice: Union[None, str, Dict[str, Any]],
                 response_format: Optional[Dict[str, Any]], constrain_tool_arguments: bool,
                 keep: List[Any]) -> None:
    """Sets constrained decoding on a gptoss_chat_request. tool_choice: "auto", "none",
    "required", a function name, or OpenAI's {"type": "function", "function": {"name": ...}};
    response_format: OpenAI's {"type": "text" | "json_object"} or {"type": "json_schema",
    "json_schema": {"name", "description"?, "schema"}} (schema a dict or JSON text)."""
    request.constrain_tool_arguments = bool(constrain_tool_arguments)
    if isinstance(tool_choice, dict):
        tool_choice = (tool_choice.get("function") or {}).get("name")
        if not isinstance(tool_choice, str):
            raise InvalidArgumentError(Status.INVALID_ARGUMENT, "tool_choice.function.name: expected a string")
        request.tool_choice = 3
        request.tool_choice_name = _bytes(tool_choice, keep, "tool_choice")
    elif tool_choice is not None and tool_choice != "auto":
        named = {"none": 1, "required": 2}
        request.tool_choice = named.get(tool_choice, 3)
        if tool_choice not in named:
            request.tool_choice_name = _bytes(tool_choice, keep, "tool_choice")
    if response_format is None:
        return
    kind = response_format.get("type")
    if kind == "json_object":
        request.response_format = 1
    elif kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema")
        if schema is not None and not isinstance(schema, str):
            schema = json.dumps(schema)
        request.response_format = 2
        request.response_format_name = _bytes(spec.get("name"), keep, "response_format.json_schema.name")
        request.response_format_description = _bytes(spec.get("description"), keep,
                                                     "response_format.json_schema.description")
        request.response_format_schema = _bytes(schema, keep, "response_format.json_schema.schema")
    elif kind != "text":
        raise InvalidArgumentError(Status.INVALID_ARGUMENT,
                                   f"response_format.type: {kind!r} is not text, json_object or json_schema")


def _reasoning_budget(request: Any, max_reasoning_tokens: Optional[int]) -> None:
    """Sets max_reasoning_tokens on a gptoss_chat_request (None: no bound)."""
    if max_reasoning_tokens is None:
        return
    if not 0 <= max_reasoning_tokens < 2**32 - 1:
        raise InvalidArgumentError(Status.INVALID_ARGUMENT,
                                   f"max_reasoning_tokens: {max_reasoning_tokens} is not in [0, 2**32 - 2]")
    request.max_reasoning_tokens = max_reasoning_tokens


def _sampling(temperature: Optional[float], top_p: Optional[float], top_k: Optional[int],
              seed: Optional[int], max_tokens: Optional[int], stop_tokens: Optional[Sequence[int]],
              stop_strings: Optional[Sequence[str]], keep: List[Any]) -> Any:
    """A gptoss_sampling_params with the library's defaults for every argument left None."""
    params = _ffi.SamplingParams()
    _lib().gptoss_sampling_params_init(ctypes.byref(params), ctypes.sizeof(params))
    if temperature is not None:
        params.temperature = temperature
    if top_p is not None:
        params.top_p = top_p
    if top_k is not None:
        params.top_k = top_k
    if seed is not None:
        if not 0 <= seed < 2**64:
            raise InvalidArgumentError(Status.INVALID_ARGUMENT, f"seed: expected 0 <= seed < 2**64, found {seed}")
        params.seed = seed
    if max_tokens is not None:
        params.max_tokens = max_tokens
    if stop_tokens is not None:
        arr = (ctypes.c_int32 * max(len(stop_tokens), 1))(*stop_tokens)
        keep.append(arr)
        params.stop_tokens = arr
        params.n_stop_tokens = len(stop_tokens)
    if stop_strings is not None:
        arr2 = (ctypes.c_char_p * max(len(stop_strings), 1))(*[_bytes(s, keep, f"stop_strings[{i}]") for i, s in enumerate(stop_strings)])
        keep.append(arr2)
        params.stop_strings = arr2
        params.n_stop_strings = len(stop_strings)
    return params


# ---------------------------------------------------------------------------
# Streaming

class _StreamState:
    """What the worker thread shares with its Stream. The worker holds no reference to the Stream
    itself, so an abandoned Stream is collected, and its __del__ stops the generation."""

    def __init__(self, busy: threading.Lock):
        self.queue: "queue.Queue[tuple[str, Any]]" = queue.Queue()
        self.resume = threading.Semaphore(0)
        self.cancel = False
        self.busy = busy

    def run(self, call: Callable[[Callable[[Event], bool]], Any]) -> None:
        def on_event(event: Event) -> bool:
            self.queue.put(("event", event))
            self.resume.acquire()
            return not self.cancel
        try:
            self.queue.put(("done", call(on_event)))
        except BaseException as e:  # noqa: B902 - handed to the iterating thread
            self.queue.put(("error", e))
        finally:
            self.busy.release()


class Stream:
    """An iterator of Events from a generate() or chat() running on a worker thread.

    The C call runs in lockstep with the iteration: it is paused inside its event callback until
    the next event is asked for, so breaking out of the loop and calling close() (or leaving a
    `with` block) stops generation right after the last event seen, exactly like a callback
    returning false. After the iteration ends, `result` holds the GenerateResult or ChatResult
    (stop_reason CANCELLED if it was stopped). Errors of the C call are raised from the
    iteration. The session accepts no other call until the stream is finished or closed."""

    def __init__(self, busy: threading.Lock, call: Callable[[Callable[[Event], bool]], Any]):
        self._state = _StreamState(busy)
        self._thread = threading.Thread(target=self._state.run, args=(call,), name="gptoss-stream",
                                        daemon=True)
        self._started = False
        self._done = False
        self._result: Any = None

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> Event:
        if self._done:
            raise StopIteration
        if not self._started:
            self._started = True
            self._thread.start()
        else:
            self._state.resume.release()
        kind, value = self._state.queue.get()
        if kind == "event":
            return value
        self._done = True
        self._thread.join()
        if kind == "error":
            raise value
        self._result = value
        raise StopIteration

    def close(self) -> None:
        """Stops generation after the last event seen and waits for the call to return."""
        if self._done:
            return
        if not self._started:
            self._done = True
            self._state.busy.release()
            return
        self._state.cancel = True
        if threading.current_thread() is self._thread:
            # Collected on the worker itself (inside a callback): draining here would wait for
            # this very thread, so just let the call stop at its next event.
            self._state.resume.release()
            return
        try:
            for _ in self:
                pass
        except GptossError:
            pass

    @property
    def result(self) -> Any:
        """The call's result; reading it first consumes any events not yet iterated."""
        for _ in self:
            pass
        return self._result

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


# ---------------------------------------------------------------------------
# Session

class Session:
    """Working memory (KV cache, scratch, last result) for one generation at a time. Use from one
    thread at a time; cancel() is the exception and works from any thread. The session is a
    cache, not a conversation: pass the whole prompt or conversation to every call."""

    def __init__(self, model: Model, max_context: Optional[int] = None, max_batch: Optional[int] = None):
        """`max_context` in tokens (None: the model's maximum); `max_batch` prompt tokens per step."""
        lib = _lib()
        self._handle: Optional[int] = None
        self.model = model
        self._busy = threading.Lock()          # one call (or open Stream) at a time
        self._handle_lock = threading.Lock()   # cancel() never races with close()
        self._stream: Optional["weakref.ref[Stream]"] = None
        params = _ffi.SessionParams()
        lib.gptoss_session_params_init(ctypes.byref(params), ctypes.sizeof(params))
        if max_context is not None:
            params.max_context = max_context
        if max_batch is not None:
            params.max_batch = max_batch
        out = ctypes.c_void_p()
        _check(lib.gptoss_session_create(model.handle, ctypes.byref(params), ctypes.byref(out)))
        self._handle = out.value

    def close(self) -> None:
        """Frees the session, cancelling a stream still open on it first."""
        if getattr(self, "_handle", None) is None:
            return
        stream = self._stream() if self._stream is not None else None
        if stream is not None:
            stream.close()
        self.cancel()
        with self._busy:  # waits for a running call to return
            with self._handle_lock:
                handle, self._handle = self._handle, None
        if handle is not None:
            _lib().gptoss_session_free(handle)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def cancel(self) -> None:
        """Asks a running generate/chat to stop before its next token (it then returns with
        stop_reason CANCELLED). Safe from any thread; does nothing if nothing is running."""
        with self._handle_lock:
            if self._handle is not None:
                _lib().gptoss_session_cancel(self._handle)

    def _enter(self) -> int:
        if self._handle is None:
            raise InvalidArgumentError(Status.INVALID_ARGUMENT, "session: used after close()")
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("gptoss: session is already running a call or an open Stream; "
                               "use one session per thread")
        return self._handle

    def _run(self, call: Callable[[int, Optional[Callable[[Event], bool]]], Any], stream: bool,
             on_event: Optional[Callable[[Event], Optional[bool]]]) -> Any:
        if stream and on_event is not None:
            raise InvalidArgumentError(Status.INVALID_ARGUMENT,
                                       "on_event: not used with stream=True; iterate the stream instead")
        handle = self._enter()
        if stream:
            s = Stream(self._busy, lambda cb: call(handle, cb))
            self._stream = weakref.ref(s)
            return s
        try:
            return call(handle, None if on_event is None else (lambda e: on_event(e) is not False))
        finally:
            self._busy.release()

    @staticmethod
    def _callback(on_event: Optional[Callable[[Event], bool]], error: List[BaseException]) -> Any:
        if on_event is None:
            return ctypes.cast(None, _ffi.EVENT_FN)

        def thunk(_user: Any, ev: Any) -> bool:
            try:
                return bool(on_event(_event(ev)))
            except BaseException as e:  # noqa: B902 - re-raised after the C call returns
                error.append(e)
                return False
        return _ffi.EVENT_FN(thunk)

    def generate(self, tokens: Sequence[int], *, temperature: Optional[float] = None,
                 top_p: Optional[float] = None, top_k: Optional[int] = None, seed: Optional[int] = None,
                 max_tokens: Optional[int] = None, stop_tokens: Optional[Sequence[int]] = None,
                 stop_strings: Optional[Sequence[str]] = None, stream: bool = False,
                 on_event: Optional[Callable[[Event], Optional[bool]]] = None,
                 json_schema: Union[None, str, Dict[str, Any]] = None
                 ) -> Union[GenerateResult, Stream]:
        """Continues the whole prompt `tokens`. Arguments left None take the library's defaults
        (temperature 1.0, top_p 1.0, top_k off, random seed, no token limit, stop at <|return|>
        or <|call|>). json_schema (a dict or JSON text) constrains the output to one JSON document
        matching it, then a stop token. With stream=True returns a Stream of Events; otherwise the GenerateResult,
        calling on_event(event) per token if given (return False from it to stop).
        Raises ContextFullError if the prompt does not fit; the session is then unchanged."""
        keep: List[Any] = []  # built here, so bad arguments raise before anything runs
        params = _sampling(temperature, top_p, top_k, seed, max_tokens, stop_tokens, stop_strings, keep)
        if json_schema is not None:
            params.json_schema = _bytes(json_schema if isinstance(json_schema, str) else json.dumps(json_schema),
                                        keep, "json_schema")
        prompt = (ctypes.c_int32 * max(len(tokens), 1))(*tokens)
        n_prompt = len(tokens)

        # `_keep` holds the buffers `params` points to until a streamed call has run.
        def call(handle: int, cb: Optional[Callable[[Event], bool]], _keep: List[Any] = keep) -> GenerateResult:
            error: List[BaseException] = []
            callback = self._callback(cb, error)
            out = ctypes.POINTER(_ffi.GenerateResult)()
            status = _lib().gptoss_generate(handle, prompt, n_prompt, ctypes.byref(params), callback,
                                            None, ctypes.byref(out))
            if error:
                raise error[0]
            _check(status)
            return _generate_result(out.contents)
        return self._run(call, stream, on_event)

    def chat(self, messages: Iterable[MessageLike], *, tools: Optional[Iterable[ToolLike]] = None,
             instructions: Optional[str] = None, reasoning_effort: Union[None, str, int] = None,
             current_date: Optional[str] = None, keep_analysis: bool = False,
             temperature: Optional[float] = None, top_p: Optional[float] = None,
             top_k: Optional[int] = None, seed: Optional[int] = None, max_tokens: Optional[int] = None,
             stop_strings: Optional[Sequence[str]] = None, stream: bool = False,
             on_event: Optional[Callable[[Event], Optional[bool]]] = None,
             tool_choice: Union[None, str, Dict[str, Any]] = None,
             response_format: Optional[Dict[str, Any]] = None,
             constrain_tool_arguments: bool = True,
             max_reasoning_tokens: Optional[int] = None) -> Union[ChatResult, Stream]:
        """Generates the assistant's next turn for the conversation `messages` (OpenAI dicts or
        Messages, oldest first) and parses it. `tools` are OpenAI function tools or Tool objects;
        `reasoning_effort` is "low", "medium" (the default) or "high". Sampling and streaming
        arguments as for generate(); events carry the channel and recipient being written.
        Constrained decoding: tool_choice ("auto", "none", "required", a function name or OpenAI's
        dict), response_format (OpenAI's dict: json_object or json_schema), and tool-call
        arguments held to their tool's schema unless constrain_tool_arguments=False.
        max_reasoning_tokens (vLLM's thinking_token_budget): the analysis takes at most this many
        tokens, then the answer is forced (0: no analysis); None: no bound."""
        keep: List[Any] = []  # built here, so bad arguments raise before anything runs
        request = _request(messages, tools, instructions, reasoning_effort, current_date, keep_analysis, keep)
        _constraints(request, tool_choice, response_format, constrain_tool_arguments, keep)
        _reasoning_budget(request, max_reasoning_tokens)
        params = _sampling(temperature, top_p, top_k, seed, max_tokens, None, stop_strings, keep)

        # `_keep` holds the strings and arrays `request` points to until a streamed call has run.
        def call(handle: int, cb: Optional[Callable[[Event], bool]], _keep: List[Any] = keep) -> ChatResult:
            error: List[BaseException] = []
            callback = self._callback(cb, error)
            out = ctypes.POINTER(_ffi.ChatResult)()
            status = _lib().gptoss_chat(handle, ctypes.byref(request), ctypes.byref(params), callback,
                                        None, ctypes.byref(out))
            if error:
                raise error[0]
            _check(status)
            return _chat_result(out.contents)
        return self._run(call, stream, on_event)
