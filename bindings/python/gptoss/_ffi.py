# _ffi.py - the ctypes mirror of gptoss.h: struct layouts, function signatures, and finding
# libgptoss.so. Every Structure here must match the C layout byte for byte; tests/test_abi.py
# compares sizeof/offsetof of each one with what the C compiler printed (bindings/abi).
# C enums are mirrored as c_int (gcc and clang give them int size on every ABI we target);
# bool as c_bool; size_t as c_size_t. Nothing in this module raises for a missing library
# until library() is first called, so `import gptoss` always works for help() and docs.
from __future__ import annotations

import ctypes
import glob
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char_p, c_double, c_float, c_int,
                    c_int32, c_size_t, c_uint32, c_uint64, c_void_p)
from typing import List, Optional

# The header version this binding mirrors. Before 1.0 every minor version may break the ABI
# (API.md §3), so major and minor must both match; patch releases are compatible.
VERSION_MAJOR = 0
VERSION_MINOR = 1
VERSION_PATCH = 0

DEVICE_CPU = -1
DEVICE_AUTO = -2
CPU_MOE_AUTO = -1
SEED_RANDOM = 2**64 - 1

PROGRESS_FN = CFUNCTYPE(c_bool, c_void_p, c_float)
LOG_FN = CFUNCTYPE(None, c_void_p, c_int, c_char_p)


class ModelParams(Structure):
    _fields_ = [("struct_size", c_uint32), ("device", c_int32), ("progress", PROGRESS_FN),
                ("progress_user_data", c_void_p), ("max_decode_batch", c_uint32),
                ("devices", POINTER(c_int32)), ("n_devices", c_size_t),
                ("n_cpu_moe", c_int32), ("gpu_memory_budget", c_uint64), ("fit_context", c_uint32),
                ("batch_invariant", c_int32)]


class ModelInfo(Structure):
    _fields_ = [("struct_size", c_uint32), ("name", c_char_p), ("n_layers", c_uint32),
                ("n_experts", c_uint32), ("n_experts_per_token", c_uint32), ("n_vocab", c_uint32),
                ("max_context", c_uint32), ("weight_bytes", c_uint64), ("device", c_int32),
                ("n_cpu_moe", c_uint32), ("host_weight_bytes", c_uint64)]


class SessionParams(Structure):
    _fields_ = [("struct_size", c_uint32), ("max_context", c_uint32), ("max_batch", c_uint32)]


class SamplingParams(Structure):
    _fields_ = [("struct_size", c_uint32), ("temperature", c_float), ("top_p", c_float),
                ("top_k", c_uint32), ("seed", c_uint64), ("max_tokens", c_uint32),
                ("stop_tokens", POINTER(c_int32)), ("n_stop_tokens", c_size_t),
                ("stop_strings", POINTER(c_char_p)), ("n_stop_strings", c_size_t),
                ("json_schema", c_char_p)]


class Event(Structure):
    _fields_ = [("struct_size", c_uint32), ("token", c_int32), ("text", c_void_p),
                ("text_len", c_size_t), ("channel", c_int), ("recipient", c_char_p)]


EVENT_FN = CFUNCTYPE(c_bool, c_void_p, POINTER(Event))


class GenerateResult(Structure):
    _fields_ = [("struct_size", c_uint32), ("tokens", POINTER(c_int32)), ("n_tokens", c_size_t),
                ("text", c_void_p), ("text_len", c_size_t), ("stop_reason", c_int),
                ("n_prompt_tokens", c_uint32), ("n_cached_tokens", c_uint32),
                ("prefill_ms", c_double), ("decode_ms", c_double)]


class Message(Structure):
    _fields_ = [("role", c_int), ("channel", c_int), ("content", c_char_p), ("author", c_char_p),
                ("recipient", c_char_p), ("content_type", c_char_p)]


class Tool(Structure):
    _fields_ = [("name", c_char_p), ("description", c_char_p), ("parameters", c_char_p)]


class ChatRequest(Structure):
    _fields_ = [("struct_size", c_uint32), ("messages", POINTER(Message)), ("n_messages", c_size_t),
                ("instructions", c_char_p), ("tools", POINTER(Tool)), ("n_tools", c_size_t),
                ("reasoning_effort", c_int), ("current_date", c_char_p), ("keep_analysis", c_bool),
                ("tool_choice", c_int), ("tool_choice_name", c_char_p),
                ("constrain_tool_arguments", c_bool), ("response_format", c_int),
                ("response_format_name", c_char_p), ("response_format_description", c_char_p),
                ("response_format_schema", c_char_p), ("max_reasoning_tokens", c_uint32)]


class ToolCall(Structure):
    _fields_ = [("name", c_char_p), ("recipient", c_char_p), ("arguments", c_char_p),
                ("content_type", c_char_p)]


class ChatResult(Structure):
    _fields_ = [("struct_size", c_uint32), ("final", c_char_p), ("analysis", c_char_p),
                ("tool_calls", POINTER(ToolCall)), ("n_tool_calls", c_size_t),
                ("messages", POINTER(Message)), ("n_messages", c_size_t), ("stop_reason", c_int),
                ("raw", c_char_p), ("n_prompt_tokens", c_uint32), ("n_cached_tokens", c_uint32),
                ("n_completion_tokens", c_uint32), ("prefill_ms", c_double), ("decode_ms", c_double)]


# Every mirrored struct, by its C name, for the ABI test.
STRUCTS = {
    "gptoss_model_params": ModelParams,
    "gptoss_model_info": ModelInfo,
    "gptoss_session_params": SessionParams,
    "gptoss_sampling_params": SamplingParams,
    "gptoss_event": Event,
    "gptoss_generate_result": GenerateResult,
    "gptoss_message": Message,
    "gptoss_tool": Tool,
    "gptoss_chat_request": ChatRequest,
    "gptoss_tool_call": ToolCall,
    "gptoss_chat_result": ChatResult,
}

_p = POINTER
_SIGNATURES = {
    # name: (restype, argtypes)
    "gptoss_status_string": (c_char_p, [c_int]),
    "gptoss_last_error": (c_char_p, []),
    "gptoss_version": (c_uint32, []),
    "gptoss_set_log_callback": (None, [LOG_FN, c_void_p, c_int]),
    "gptoss_model_params_init": (None, [_p(ModelParams), c_size_t]),
    "gptoss_load": (c_int, [c_char_p, _p(ModelParams), _p(c_void_p)]),
    "gptoss_model_free": (None, [c_void_p]),
    "gptoss_model_get_info": (c_int, [c_void_p, _p(ModelInfo)]),
    "gptoss_tokenize": (c_int, [c_void_p, c_char_p, c_size_t, c_bool, _p(c_int32), c_size_t,
                                _p(c_size_t)]),
    "gptoss_detokenize": (c_int, [c_void_p, _p(c_int32), c_size_t, c_void_p, c_size_t, _p(c_size_t)]),
    "gptoss_session_params_init": (None, [_p(SessionParams), c_size_t]),
    "gptoss_session_create": (c_int, [c_void_p, _p(SessionParams), _p(c_void_p)]),
    "gptoss_session_free": (None, [c_void_p]),
    "gptoss_session_cancel": (None, [c_void_p]),
    "gptoss_sampling_params_init": (None, [_p(SamplingParams), c_size_t]),
    "gptoss_generate": (c_int, [c_void_p, _p(c_int32), c_size_t, _p(SamplingParams), EVENT_FN,
                                c_void_p, _p(_p(GenerateResult))]),
    "gptoss_chat_request_init": (None, [_p(ChatRequest), c_size_t]),
    "gptoss_chat_render": (c_int, [c_void_p, _p(ChatRequest), _p(c_int32), c_size_t, _p(c_size_t)]),
    "gptoss_chat": (c_int, [c_void_p, _p(ChatRequest), _p(SamplingParams), EVENT_FN, c_void_p,
                            _p(_p(ChatResult))]),
    "gptoss_conversation_parse_json": (c_int, [c_char_p, c_size_t, _p(c_void_p)]),
    "gptoss_conversation_get_request": (_p(ChatRequest), [c_void_p]),
    "gptoss_conversation_free": (None, [c_void_p]),
}


class LibraryNotFound(OSError):
    """libgptoss.so could not be loaded from any of the places searched."""


def candidate_paths() -> List[str]:
    """Where the library is looked for, in order: $GPTOSS_LIBRARY (a file), next to this
    package (as a wheel that bundles it installs it), then the dynamic loader's own search
    (LD_LIBRARY_PATH, rpath, ldconfig) by soname."""
    paths = []
    env = os.environ.get("GPTOSS_LIBRARY")
    if env:
        paths.append(env)
    here = os.path.dirname(os.path.abspath(__file__))
    paths.extend(sorted(glob.glob(os.path.join(here, "libgptoss.so*"))))
    paths.extend([f"libgptoss.so.{VERSION_MAJOR}", "libgptoss.so"])
    return paths


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def _open() -> ctypes.CDLL:
    errors = []
    for path in candidate_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        global _lib_path
        _lib_path = path
        return lib
    raise LibraryNotFound("gptoss: cannot load libgptoss.so; set GPTOSS_LIBRARY to its path. Tried: "
                          + "; ".join(errors))


class VersionMismatch(ImportError):
    """The loaded libgptoss.so is not the version this binding mirrors."""


def library() -> ctypes.CDLL:
    """The loaded library with every signature declared and its version checked.
    Raises LibraryNotFound or VersionMismatch."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        lib = _open()
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        version = lib.gptoss_version()
        major, minor = version // 1000000, version // 1000 % 1000
        if (major, minor) != (VERSION_MAJOR, VERSION_MINOR):
            raise VersionMismatch(
                f"gptoss: {_lib_path} is version {major}.{minor}.{version % 1000}, this binding "
                f"needs {VERSION_MAJOR}.{VERSION_MINOR}.x")
        _lib = lib
        return lib


def library_path() -> Optional[str]:
    """The path or soname the library was loaded from, once library() has succeeded."""
    return _lib_path
