# test_gptoss.py - the Python binding's promises, checked against the C library itself.
# Run by ctest as `python3 -m unittest discover -s tests -t .` in bindings/python, with
# GPTOSS_LIBRARY (libgptoss.so), GPTOSS_TINY_MODEL (the synthetic checkpoint, CPU backend),
# GPTOSS_ABI_DUMP and GPTOSS_GENERATE_REF (the C oracles in bindings/abi) in the environment.
# Oracles: struct layouts come from the C compiler (abi-dump), seeded tokens and error texts from
# a C program calling gptoss.h directly (generate-ref), token texts from gptoss_detokenize, and
# the OpenAI-dict conversion from the library's own JSON parser (gptoss_conversation_parse_json).
from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
from typing import Callable, Dict, List

import gptoss
from gptoss import _ffi

MODEL = os.environ.get("GPTOSS_TINY_MODEL", "")
PROMPT = "The quick brown fox"
SEED = 1234
N_TOKENS = 12

CHAT_STOP_TOKENS = [200002, 200012, 199999]  # <|return|>, <|call|>, <|endoftext|>: what gptoss_chat stops at

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Gets the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def need_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise unittest.SkipTest(f"{name} is not set (run through ctest)")
    return value


def generate_ref(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([need_env("GPTOSS_GENERATE_REF"), *args], capture_output=True, text=True)


class AbiTest(unittest.TestCase):
    def test_every_struct_mirror_matches_c_layout(self) -> None:
        dump = json.loads(subprocess.check_output([need_env("GPTOSS_ABI_DUMP")], text=True))
        self.assertEqual(set(dump), set(_ffi.STRUCTS), "structs mirrored vs structs in gptoss.h")
        for name, c in dump.items():
            py = _ffi.STRUCTS[name]
            with self.subTest(struct=name):
                self.assertEqual(ctypes.sizeof(py), c["size"], f"sizeof({name})")
                self.assertEqual(ctypes.alignment(py), c["align"], f"alignof({name})")
                self.assertEqual([f[0] for f in py._fields_], list(c["fields"]), f"fields of {name}")
                for field, offset in c["fields"].items():
                    self.assertEqual(getattr(py, field).offset, offset, f"offsetof({name}, {field})")


class LibraryTest(unittest.TestCase):
    def test_loaded_library_version_is_the_one_mirrored(self) -> None:
        self.assertEqual(gptoss.library_version().split(".")[:2], gptoss.__version__.split(".")[:2])

    def _python(self, code: str, env: Dict[str, str], cwd: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd)

    def test_a_library_of_another_minor_version_is_refused_at_load(self) -> None:
        need_env("GPTOSS_LIBRARY")
        code = ("import gptoss, gptoss._ffi as f\nf.VERSION_MINOR += 1\n"
                "try:\n    gptoss.library_version()\nexcept gptoss.VersionMismatch as e:\n    print('refused:', e)\n")
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        r = self._python(code, dict(os.environ, PYTHONPATH=here), here)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("refused:", r.stdout)
        self.assertIn("this binding needs 0.2.x", r.stdout)

    def test_pip_installs_offline_and_finds_the_bundled_library(self) -> None:
        library = need_env("GPTOSS_LIBRARY")
        if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
            self.skipTest("pip is not available")
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "src")
            shutil.copytree(here, src, ignore=shutil.ignore_patterns("__pycache__", "tests"))
            shutil.copy(library, os.path.join(src, "gptoss", "libgptoss.so"))
            site = os.path.join(tmp, "site")
            r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-cache-dir",
                                "--disable-pip-version-check", "--target", site, src],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            env = {k: v for k, v in os.environ.items() if k not in ("GPTOSS_LIBRARY", "LD_LIBRARY_PATH")}
            env["PYTHONPATH"] = site
            r = self._python("import gptoss; print(gptoss.library_version()); print(gptoss.library_path())", env, tmp)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.split(), [gptoss.library_version(),
                                                os.path.join(site, "gptoss", "libgptoss.so")])

    def test_build_backend_version_is_the_package_version(self) -> None:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        sys.path.insert(0, os.path.join(here, "_build"))
        try:
            import gptoss_build
        finally:
            sys.path.pop(0)
        self.assertEqual(gptoss_build.VERSION, gptoss.__version__)


class ModelTest(unittest.TestCase):
    model: gptoss.Model

    @classmethod
    def setUpClass(cls) -> None:
        need_env("GPTOSS_TINY_MODEL")
        cls.model = gptoss.Model(MODEL, device="cpu")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.model.close()

    def test_bad_model_directory_raises_with_the_c_message(self) -> None:
        bad = os.path.join(tempfile.gettempdir(), "gptoss-no-such-model")
        with self.assertRaises(gptoss.GptossError) as caught:
            gptoss.Model(bad, device="cpu")
        err = caught.exception
        ref = generate_ref(bad, "0", "1", "x")
        self.assertEqual(ref.returncode, 1)
        # generate-ref prints "generate-ref: gptoss_load: <status string>: <gptoss_last_error()>"
        self.assertEqual(ref.stderr.strip().split(": ", 3)[3], err.message)
        self.assertIn(bad, err.message)
        self.assertIsInstance(err.status, gptoss.Status)
        self.assertIs(type(err), gptoss._ERRORS[err.status])
        self.assertIn(err.message, str(err))

    def test_progress_reports_fractions_and_false_cancels_the_load(self) -> None:
        fractions: List[float] = []
        gptoss.Model(MODEL, device="cpu", progress=fractions.append).close()
        self.assertTrue(fractions)
        self.assertTrue(all(0.0 <= f <= 1.0 for f in fractions), fractions)
        with self.assertRaises(gptoss.CancelledError) as caught:
            gptoss.Model(MODEL, device="cpu", progress=lambda f: False)
        self.assertEqual(caught.exception.status, gptoss.Status.CANCELLED)

    def test_n_cpu_moe_is_checked_against_the_model_and_reported(self) -> None:
        with self.assertRaises(gptoss.InvalidArgumentError) as caught:
            gptoss.Model(MODEL, device="cpu", n_cpu_moe=99)  # the tiny model has 4 layers
        self.assertIn("params.n_cpu_moe: 99", caught.exception.message)
        with self.assertRaises(gptoss.InvalidArgumentError):
            gptoss.Model(MODEL, device="cpu", n_cpu_moe="some")  # type: ignore[arg-type]
        with gptoss.Model(MODEL, device="cpu", n_cpu_moe="auto", gpu_memory_budget=1 << 30) as m:
            info = m.info
            self.assertEqual(info.n_cpu_moe, 0)  # the CPU backend holds everything in host memory
            self.assertEqual(info.host_weight_bytes, 0)

    def test_log_callback_receives_lines_until_silenced(self) -> None:
        # The library logs every recorded error at DEBUG, so a failed load produces a line.
        bad = os.path.join(tempfile.gettempdir(), "gptoss-no-such-model")
        lines: List[tuple] = []
        gptoss.set_log_callback(lambda level, line: lines.append((level, line)), gptoss.LogLevel.DEBUG)
        try:
            with self.assertRaises(gptoss.GptossError) as caught:
                gptoss.Model(bad, device="cpu")
        finally:
            gptoss.set_log_callback(None)
        self.assertTrue(any(caught.exception.message in line for _, line in lines), lines)
        self.assertTrue(all(isinstance(level, gptoss.LogLevel) and not line.endswith("\n") for level, line in lines))
        n = len(lines)
        with self.assertRaises(gptoss.GptossError):
            gptoss.Model(bad, device="cpu")
        self.assertEqual(len(lines), n)

    def test_info_describes_the_loaded_checkpoint(self) -> None:
        with open(os.path.join(MODEL, "config.json")) as f:
            config = json.load(f)
        info = self.model.info
        self.assertEqual(info.device, gptoss.DEVICE_CPU)
        self.assertEqual(info.n_layers, config["num_hidden_layers"])
        self.assertEqual(info.n_experts, config["num_local_experts"])
        self.assertEqual(info.n_vocab, config["vocab_size"])

    def test_tokenize_round_trip(self) -> None:
        text = "Hello, wörld! 你好 🦊 <|start|>"
        tokens = self.model.tokenize(text)
        self.assertGreater(len(tokens), 5)
        self.assertEqual(self.model.detokenize(tokens), text)
        self.assertEqual(self.model.tokenize(""), [])

    def test_special_tokens_only_with_allow_special(self) -> None:
        self.assertEqual(len(self.model.tokenize("<|start|>", allow_special=True)), 1)
        self.assertGreater(len(self.model.tokenize("<|start|>")), 1)

    def test_detokenize_of_an_out_of_range_id_raises_invalid_argument(self) -> None:
        with self.assertRaises(gptoss.InvalidArgumentError) as caught:
            self.model.detokenize([1, 2**30])
        self.assertTrue(caught.exception.message)

    def test_generate_with_a_seed_gives_the_c_api_tokens(self) -> None:
        ref = generate_ref(MODEL, str(SEED), str(N_TOKENS), PROMPT)
        self.assertEqual(ref.returncode, 0, ref.stderr)
        lines = {line.split(" ")[0]: [int(x) for x in line.split(" ")[1:]] for line in ref.stdout.splitlines()}
        prompt = self.model.tokenize(PROMPT)
        self.assertEqual(prompt, lines["prompt"])
        with self.model.session() as session:
            result = session.generate(prompt, seed=SEED, max_tokens=N_TOKENS)
        self.assertEqual(result.tokens, lines["tokens"])
        self.assertEqual(int(result.stop_reason), lines["stop_reason"][0])
        self.assertEqual(result.n_prompt_tokens, len(prompt))
        self.assertEqual(result.text, self.model.detokenize(result.tokens))

    def test_streamed_events_are_the_generated_tokens(self) -> None:
        prompt = self.model.tokenize(PROMPT)
        with self.model.session() as session:
            stream = session.generate(prompt, seed=SEED, max_tokens=N_TOKENS, stream=True)
            events = list(stream)
            result = stream.result
        self.assertIsInstance(result, gptoss.GenerateResult)
        self.assertEqual([e.token for e in events], result.tokens)
        self.assertTrue(all(isinstance(e, gptoss.Event) for e in events))

    def test_returning_false_from_the_callback_cancels(self) -> None:
        prompt = self.model.tokenize(PROMPT)
        seen: List[int] = []

        def on_event(event: gptoss.Event) -> bool:
            seen.append(event.token)
            return len(seen) < 3

        with self.model.session() as session:
            result = session.generate(prompt, seed=SEED, max_tokens=N_TOKENS, on_event=on_event)
        self.assertEqual(result.stop_reason, gptoss.StopReason.CANCELLED)
        self.assertEqual(result.tokens, seen)
        self.assertEqual(len(seen), 3)

    def test_closing_a_stream_cancels_after_the_last_event_seen(self) -> None:
        prompt = self.model.tokenize(PROMPT)
        with self.model.session() as session:
            stream = session.generate(prompt, seed=SEED, max_tokens=N_TOKENS, stream=True)
            first = [next(stream), next(stream)]
            stream.close()
            self.assertEqual(stream.result.stop_reason, gptoss.StopReason.CANCELLED)
            self.assertEqual(stream.result.tokens, [e.token for e in first])
            # The session is free again once the stream is closed.
            self.assertEqual(len(session.generate(prompt, seed=SEED, max_tokens=2).tokens), 2)

    def test_an_abandoned_stream_releases_the_session(self) -> None:
        prompt = self.model.tokenize(PROMPT)
        with self.model.session() as session:
            stream = session.generate(prompt, seed=SEED, max_tokens=N_TOKENS, stream=True)
            next(stream)
            del stream
            gc.collect()
            self.assertEqual(len(session.generate(prompt, seed=SEED, max_tokens=2).tokens), 2)

    def test_an_exception_in_the_callback_propagates_and_stops_generation(self) -> None:
        def on_event(event: gptoss.Event) -> bool:
            raise KeyError("from callback")

        with self.model.session() as session:
            with self.assertRaises(KeyError):
                session.generate(self.model.tokenize(PROMPT), max_tokens=N_TOKENS, on_event=on_event)

    def test_a_session_refuses_a_second_call_while_a_stream_is_open(self) -> None:
        prompt = self.model.tokenize(PROMPT)
        with self.model.session() as session:
            stream = session.generate(prompt, seed=SEED, max_tokens=N_TOKENS, stream=True)
            next(stream)
            with self.assertRaises(RuntimeError):
                session.generate(prompt, max_tokens=1)
            stream.close()

    def test_a_prompt_longer_than_the_context_raises_context_full(self) -> None:
        prompt = self.model.tokenize(PROMPT * 8)
        with self.model.session(max_context=16) as session:
            with self.assertRaises(gptoss.ContextFullError) as caught:
                session.generate(prompt, max_tokens=1)
        self.assertEqual(caught.exception.status, gptoss.Status.CONTEXT_FULL)
        self.assertTrue(caught.exception.message)

    def test_sessions_on_two_threads_match_one_thread(self) -> None:
        prompt = self.model.tokenize(PROMPT)
        with self.model.session() as session:
            expected = session.generate(prompt, seed=SEED, max_tokens=4).tokens
        results: Dict[int, List[int]] = {}

        def work(i: int) -> None:
            with self.model.session() as s:
                results[i] = s.generate(prompt, seed=SEED, max_tokens=4).tokens

        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(results, {0: expected, 1: expected})

    def test_malformed_messages_raise_invalid_argument_naming_the_field(self) -> None:
        cases = [
            ([{"role": "robot", "content": "x"}], "messages[0].role"),
            ([{"role": "user", "content": 5}], "messages[0].content"),
            ([{"role": "tool", "content": "x"}], "messages[0]"),
            ([{"role": "assistant", "tool_calls": [{"function": {}}]}], "messages[0].tool_calls[0].function.name"),
            ([{"role": "user", "content": "ok"}, {"role": "user", "content": "bad\0"}], "messages[1].content"),
        ]
        with self.model.session() as session:
            for messages, where in cases:
                with self.subTest(where=where):
                    with self.assertRaises(gptoss.InvalidArgumentError) as caught:
                        session.chat(messages, max_tokens=1)
                    self.assertTrue(caught.exception.message.startswith(where), caught.exception.message)
            with self.assertRaises(gptoss.InvalidArgumentError):
                session.chat([{"role": "user", "content": "x"}], reasoning_effort="extreme")

    def test_a_session_outlives_its_closed_model(self) -> None:
        model = gptoss.Model(MODEL, device="cpu")
        prompt = model.tokenize(PROMPT)
        session = model.session()
        model.close()
        del model
        gc.collect()
        with session:
            self.assertEqual(len(session.generate(prompt, seed=SEED, max_tokens=2).tokens), 2)

    def test_used_after_close_raises(self) -> None:
        session = self.model.session()
        session.close()
        session.close()  # twice is fine
        with self.assertRaises(gptoss.InvalidArgumentError):
            session.generate([1], max_tokens=1)


def skip_if_not_implemented(call: Callable[[], object]) -> None:
    """The library lands piece by piece: a C function still answering UNSUPPORTED "not
    implemented yet" makes the tests that need it report SKIPPED instead of failing."""
    try:
        call()
    except gptoss.UnsupportedError as e:
        if "not implemented" in e.message:
            raise unittest.SkipTest(e.message) from None
        raise


class ChatTest(unittest.TestCase):
    model: gptoss.Model

    @classmethod
    def setUpClass(cls) -> None:
        need_env("GPTOSS_TINY_MODEL")
        cls.model = gptoss.Model(MODEL, device="cpu")
        try:
            with cls.model.session() as session:
                skip_if_not_implemented(lambda: session.chat([{"role": "user", "content": "x"}], max_tokens=1))
        except unittest.SkipTest:
            cls.model.close()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.model.close()

    CONVERSATION = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "reasoning_content": "Need the weather tool.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"sunny\": true}"},
        {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "tomorrow?"}]},
    ]

    def test_openai_dicts_render_as_the_library_json_parser_renders_them(self) -> None:
        body = {"messages": self.CONVERSATION, "tools": [WEATHER_TOOL], "reasoning_effort": "high"}
        conversation = gptoss.parse_conversation_json(json.dumps(body))
        self.assertEqual(conversation.reasoning_effort, gptoss.ReasoningEffort.HIGH)
        self.assertEqual(conversation.instructions, "Answer briefly.")
        expected = self.model.render(conversation.messages, tools=conversation.tools, **conversation.options())
        got = self.model.render(self.CONVERSATION, tools=[WEATHER_TOOL], reasoning_effort="high")
        self.assertEqual(self.model.detokenize(got), self.model.detokenize(expected))
        self.assertEqual(got, expected)

    def test_constrained_decoding_json_schema_and_forced_tool_call(self) -> None:
        schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
                  "required": ["n", "ok"], "additionalProperties": False}
        prompt = self.model.tokenize("<|start|>user<|message|>x<|end|><|start|>assistant", allow_special=True)
        with self.model.session() as session:
            result = session.generate(prompt, seed=3, max_tokens=400, json_schema=schema)
            self.assertIn(result.stop_reason, (gptoss.StopReason.RETURN, gptoss.StopReason.CALL))
            doc = json.loads(result.text[:result.text.rindex("<|")])
            self.assertEqual(sorted(doc), ["n", "ok"])
            reply = session.chat([{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL], seed=1,
                                 max_tokens=400, tool_choice={"type": "function", "function": {"name": "get_weather"}})
            self.assertEqual(len(reply.tool_calls), 1)
            self.assertEqual(reply.tool_calls[0].name, "get_weather")
            self.assertIsInstance(json.loads(reply.tool_calls[0].arguments), dict)
            with self.assertRaises(gptoss.InvalidArgumentError) as caught:
                session.generate(prompt, json_schema={"type": "string", "pattern": "x"})
            self.assertIn("/pattern", caught.exception.message)

    def test_response_format_answers_with_a_reasoning_budget(self) -> None:
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                  "additionalProperties": False}
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        with self.model.session() as session:
            for budget in (0, 3):
                reply = session.chat([{"role": "user", "content": "Ok?"}], seed=2, max_tokens=200,
                                     response_format=fmt, max_reasoning_tokens=budget)
                self.assertEqual(reply.stop_reason, gptoss.StopReason.RETURN, reply.raw)
                self.assertIn(json.loads(reply.final), ({"ok": True}, {"ok": False}))
                self.assertLessEqual(len(reply.messages), 2 if budget else 1)
            with self.assertRaises(gptoss.InvalidArgumentError):
                session.chat([{"role": "user", "content": "Ok?"}], max_reasoning_tokens=-1)

    def test_a_json_conversation_keeps_its_constraints_and_passes_them_on(self) -> None:
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "description": "d", "schema": schema}}
        body = {"messages": [{"role": "user", "content": "Ok?"}], "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "response_format": fmt, "thinking_token_budget": 3}
        c = gptoss.parse_conversation_json(body)
        self.assertEqual(c.tool_choice, body["tool_choice"])
        self.assertEqual(c.response_format, fmt)
        self.assertEqual(c.max_reasoning_tokens, 3)
        self.assertTrue(c.constrain_tool_arguments)
        plain = gptoss.parse_conversation_json({"messages": body["messages"], "tool_choice": "none"})
        self.assertEqual((plain.tool_choice, plain.response_format, plain.max_reasoning_tokens), ("none", None, None))
        # options() carries them: the render has the Response Formats section, as chat() sends it.
        rendered = self.model.detokenize(self.model.render(c.messages, tools=c.tools, **c.options()))
        self.assertIn("# Response Formats", rendered)
        self.assertNotIn("# Response Formats", self.model.detokenize(self.model.render(c.messages, tools=c.tools)))
        with self.model.session() as session:
            reply = session.chat(c.messages, tools=c.tools, seed=1, max_tokens=300, **c.options())
            self.assertEqual(len(reply.tool_calls), 1)
            self.assertEqual(reply.tool_calls[0].name, "get_weather")

    def test_malformed_json_conversation_raises_invalid_argument_naming_the_field(self) -> None:
        with self.assertRaises(gptoss.InvalidArgumentError) as caught:
            gptoss.parse_conversation_json({"messages": [{"role": "robot", "content": "x"}]})
        self.assertIn("messages[0]", caught.exception.message)

    def test_chat_with_a_tool_streams_the_turn_it_returns(self) -> None:
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        with self.model.session() as session:
            stream = session.chat(messages, tools=[WEATHER_TOOL], reasoning_effort="low", seed=SEED,
                                  max_tokens=24, stream=True)
            events = list(stream)
            result = stream.result
            again = session.chat(messages, tools=[WEATHER_TOOL], reasoning_effort="low", seed=SEED, max_tokens=24)
        self.assertIsInstance(result, gptoss.ChatResult)
        self.assertEqual(len(events), result.n_completion_tokens)
        tokens = [e.token for e in events]
        # The same prompt, seed and stop tokens through gptoss_generate give the same tokens.
        with self.model.session() as plain:
            prompt = self.model.render(messages, tools=[WEATHER_TOOL], reasoning_effort="low")
            generated = plain.generate(prompt, seed=SEED, max_tokens=24, stop_tokens=CHAT_STOP_TOKENS)
        self.assertEqual(tokens, generated.tokens)
        try:  # raw is the tokens as text; compared exactly when the bytes are valid UTF-8
            self.assertEqual(result.raw, self.model.detokenize_bytes(tokens).decode("utf-8"))
        except UnicodeDecodeError:
            pass
        self.assertEqual(again.raw, result.raw)  # streaming does not change the output
        self.assertGreater(again.n_cached_tokens, 0)  # the second call reused the first's prompt
        self.assertEqual(result.n_prompt_tokens, len(self.model.render(messages, tools=[WEATHER_TOOL],
                                                                        reasoning_effort="low")))
        for e in events:
            self.assertIsInstance(e.channel, gptoss.Channel)

    def test_the_readme_example_runs(self) -> None:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with open(os.path.join(here, "README.md")) as f:
            readme = f.read()
        code = readme.split("```python\n", 1)[1].split("```", 1)[0]
        path = 'gptoss.Model("/models/gpt-oss-20b")'
        self.assertIn(path, code)
        code = code.replace(path, f"gptoss.Model({MODEL!r}, device='cpu')")
        self.assertIn("max_tokens=256", code)
        code = code.replace("max_tokens=256", "max_tokens=16")  # the tiny model on the CPU is slow
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=here))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(any(f"\n {name} " in r.stdout for name in gptoss.StopReason.__members__), r.stdout)

    def test_returning_false_from_the_chat_callback_cancels(self) -> None:
        seen: List[gptoss.Event] = []
        with self.model.session() as session:
            result = session.chat([{"role": "user", "content": "Hi"}], seed=SEED, max_tokens=24,
                                  on_event=lambda e: seen.append(e) or len(seen) < 2)
        self.assertEqual(result.stop_reason, gptoss.StopReason.CANCELLED)
        self.assertEqual(result.n_completion_tokens, 2)

    def test_result_messages_can_be_appended_to_the_history(self) -> None:
        history: List[gptoss.MessageLike] = [{"role": "user", "content": "Hi"}]
        with self.model.session() as session:
            result = session.chat(history, seed=SEED, max_tokens=24)
            history.extend(result.messages)
            history.append({"role": "user", "content": "Again"})
            try:
                second = session.chat(history, seed=SEED, max_tokens=4)
            except gptoss.InvalidArgumentError as e:
                self.fail(f"gptoss.h: a result's messages can be appended to the history as they are, "
                          f"but the library rejected {result.messages}: {e}")
        self.assertGreater(second.n_prompt_tokens, result.n_prompt_tokens)
        for m in result.messages:
            self.assertIsInstance(m, gptoss.Message)


if __name__ == "__main__":
    unittest.main()
