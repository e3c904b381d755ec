#!/usr/bin/env python3
"""gptoss-server-load.py - N concurrent streamed chat completions against a running gptoss-server
(or any OpenAI-compatible server) for a fixed time, with the server's memory sampled as it runs.

Each of --streams threads sends POST /v1/chat/completions with "stream": true and
stream_options.include_usage, reads the server-sent events to the final "data: [DONE]", and starts
the next request, until --seconds have passed. Prompts vary per request (a counter in the text,
some long, some asking for a tool call with tool_choice "required"), so prefix reuse and the
batched decode both see mixed work. Counted: requests, completion tokens (from the usage chunk),
failures (HTTP status other than 200, a stream without [DONE], an "error" object, a socket error).
Every --sample seconds: the server's resident memory (/proc/PID/status VmRSS, with --pid) and the
GPU's used memory (nvidia-smi, if present). Exit 1 on any failure or when memory grew by more than
--max-growth-mib from the first quarter's peak to the last quarter's. Python standard library only.

  tools/gptoss-server-load.py --url http://127.0.0.1:8080 --streams 64 --seconds 240 --pid PID
"""
import argparse
import http.client
import json
import subprocess
import sys
import threading
import time
import urllib.parse


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def gpu_used_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        return float(out[0]) if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city"]}}}]


def request_body(i, max_tokens):
    kind = i % 4
    text = f"Request {i}: write a short note about the number {i}."
    body = {"model": "gptoss", "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": max_tokens, "temperature": 1.0, "seed": i}
    if kind == 1:  # a long prompt
        text += " Context: " + " ".join(f"item-{j}" for j in range(600))
    body["messages"] = [{"role": "user", "content": text}]
    if kind == 2:
        body["tools"] = TOOLS
        body["tool_choice"] = "required"
    return body


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0
        self.tokens = 0
        self.failures = []
        self.ttft = []
        self.duration = []


def one_request(url, key, body, stats):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=300)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    t0 = time.monotonic()
    first = None
    tokens = None
    done = False
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            return f"HTTP {resp.status}: {resp.read()[:300]!r}"
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                return f"error object: {data[:300]}"
            if first is None and chunk.get("choices"):  # the first chunk that carries generated text
                d = chunk["choices"][0].get("delta") or {}
                if d.get("content") or d.get("reasoning_content") or d.get("tool_calls"):
                    first = time.monotonic() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"].get("completion_tokens")
        if not done:
            return "stream ended without [DONE]"
        if tokens is None:
            return "no usage chunk"
    except (OSError, http.client.HTTPException, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    with stats.lock:
        stats.requests += 1
        stats.tokens += tokens
        if first is not None:
            stats.ttft.append(first)
        stats.duration.append(time.monotonic() - t0)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--key", default="")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=240)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--pid", type=int, default=0, help="server process for the RSS samples")
    ap.add_argument("--sample", type=float, default=10)
    ap.add_argument("--max-growth-mib", type=float, default=256)
    a = ap.parse_args()
    if a.streams < 1 or a.seconds <= 0:
        sys.exit("gptoss-server-load: --streams must be >= 1 and --seconds > 0")

    stats = Stats()
    t0 = time.monotonic()
    stop_at = time.monotonic() + a.seconds
    counter = [0]
    counter_lock = threading.Lock()

    def worker():
        while time.monotonic() < stop_at:
            with counter_lock:
                i = counter[0]
                counter[0] += 1
            started = time.monotonic() - t0
            err = one_request(a.url, a.key, request_body(i, a.max_tokens), stats)
            if err:
                with stats.lock:
                    stats.failures.append(f"request {i} (sent at {started:.1f} s, failed at "
                                          f"{time.monotonic() - t0:.1f} s): {err}")

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(a.streams)]
    for t in threads:
        t.start()
    samples = []
    while any(t.is_alive() for t in threads):
        samples.append((time.monotonic() - t0, rss_mib(a.pid) if a.pid else None, gpu_used_mib()))
        s = samples[-1]
        with stats.lock:
            print(f"t={s[0]:6.1f}s requests={stats.requests} tokens={stats.tokens} failures={len(stats.failures)}"
                  f" rss={s[1] if s[1] is None else round(s[1], 1)} MiB gpu={s[2]} MiB", flush=True)
        for t in threads:
            t.join(timeout=a.sample / len(threads))
    wall = time.monotonic() - t0

    def pct(values, q):
        v = sorted(values)
        return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")
    print(f"summary: {a.streams} streams, {wall:.1f} s, {stats.requests} requests, {stats.tokens} completion tokens"
          f" = {stats.tokens / wall:.1f} tok/s aggregate, TTFT p50 {pct(stats.ttft, 0.5):.3f} s"
          f" p99 {pct(stats.ttft, 0.99):.3f} s, request time p50 {pct(stats.duration, 0.5):.3f} s"
          f" p99 {pct(stats.duration, 0.99):.3f} s, failures {len(stats.failures)}")
    for f in stats.failures[:20]:
        print("  FAIL", f)
    bad = bool(stats.failures)
    for col, name in ((1, "server RSS"), (2, "GPU memory")):
        vals = [s[col] for s in samples if s[col] is not None]
        if len(vals) >= 4:
            q = len(vals) // 4
            first, last = max(vals[:q]), max(vals[-q:])
            print(f"{name}: first-quarter peak {first:.1f} MiB, last-quarter peak {last:.1f} MiB,"
                  f" growth {last - first:+.1f} MiB")
            if last - first > a.max_growth_mib:
                print(f"FAIL: {name} grew by more than {a.max_growth_mib} MiB")
                bad = True
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
