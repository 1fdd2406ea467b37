"""Soak test for glmserve: a long mixed workload against a running server, with health sampling.

    python soak.py --seconds 900 --clients 8 --server-pid PID [--base http://127.0.0.1:8011]
    python soak.py --calibrate            # each bad request once, status + body (no load)

Writes into --out (default: this folder): requests.jsonl (one line per request), anomalies.jsonl (request body + what
came back + why it is suspect), health.csv (one row per sample), summary.json (counts, latencies, health deltas).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import json
import os
import random
import re
import statistics
import sys
import time
from collections import Counter, defaultdict

import aiohttp
import jsonschema
import psutil

BASE = "http://127.0.0.1:8011"
MODEL = "tiny"
MAX_MODEL_LEN = 2048
SLOW_S = 60.0

T0 = time.monotonic()
records: list[dict] = []
anomalies: list[dict] = []
soft: Counter = Counter()           # soft statistics (not failures): cache hits, determinism pairs ...
soft_examples: dict[str, list] = defaultdict(list)
inflight = 0
stop_flag = False
req_counter = 0

# ---------------------------------------------------------------------------------------------------------------
TEXTS = [
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.",
    "The old man said",
    "Once upon a time, in a land far away, there lived a",
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse,",
    "def fibonacci(n):\n    ",
    "List three colours:\n1.",
    "Q: What is the capital of France?\nA:",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "In the beginning",
    "Dear Sir,\n\nI write to inform you that",
    "Numbers: 1, 2, 3, 4,",
    "Émile wrote: «Ça va?» — 東京 🚀",
]
USER_MSGS = [
    "Hello! How are you today?", "What is the weather in Paris?", "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.", "What's 17 times 23?", "Tell me a joke about cats.",
    "Summarise the plot of Hamlet.", "Translate 'good morning' to French.", "Give me a list of three fruits.",
    "Who wrote Pride and Prejudice?", "Describe a rainy day.", "What should I cook tonight?",
]
LONG_TEXT = TEXTS[0] + " "
STOPS = [None, None, ["\n"], [" the"], ["."], [",", "\n"], "and", ["the", "a", "of", "to"]]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                     "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city", "days"], "additionalProperties": False}}}
CALC = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"},
                                                     "precise": {"type": "boolean"}},
                   "required": ["expression"], "additionalProperties": False}}}
NOARGS = {"type": "function", "function": {"name": "get_time", "description": "The current time",
                                           "parameters": {"type": "object", "properties": {}}}}
JSON_SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                                      "ok": {"type": "boolean"}}, "required": ["items", "ok"]},
    {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]},
                                      "score": {"type": "number"}}, "required": ["colour"]},
]


def tools_pick(strict: bool) -> list[dict]:
    out = []
    for t in random.sample([WEATHER, CALC, NOARGS], random.randint(1, 3)):
        t = json.loads(json.dumps(t))
        if strict:
            t["function"]["strict"] = True
        out.append(t)
    return out


def now() -> float:
    return time.monotonic() - T0


def short(x, n=1500):
    s = x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)
    return s if len(s) <= n else s[:n] + f"...(+{len(s) - n} chars)"


def anomaly(kind: str, scen: str, ep: str, body, status, resp, detail: str) -> None:
    anomalies.append({"t": round(now(), 1), "kind": kind, "scenario": scen, "endpoint": ep, "status": status,
                      "detail": detail, "body": body if not isinstance(body, (bytes, str)) else short(
                          body if isinstance(body, str) else body.decode("utf-8", "replace"), 600),
                      "response": short(resp) if resp is not None else None})


def soft_note(key: str, example=None) -> None:
    soft[key] += 1
    if example is not None and len(soft_examples[key]) < 5:
        soft_examples[key].append(example)


# ---- HTTP -------------------------------------------------------------------------------------------------------
class Res:
    def __init__(self):
        self.status = None              # int, or "timeout" / "conn_error" / "disconnected"
        self.headers = {}
        self.json = None
        self.text = ""
        self.events: list[tuple[str | None, str]] = []   # SSE (event name, data)
        self.latency = 0.0
        self.ttft = None
        self.error = None


async def sse_events(resp):
    name, data = None, []
    async for raw in resp.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":
            if data:
                yield name, "\n".join(data)
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" ") if line.startswith("data: ") or True else line[5:])
    if data:
        yield name, "\n".join(data)


async def call(sess, ep: str, scen: str, body=None, *, raw: bytes | None = None, stream: bool = False,
               timeout: float = 180.0, disconnect_after: int | None = None, method: str = "POST",
               expect_abort: bool = False) -> Res:
    global inflight, req_counter
    res = Res()
    t0 = time.monotonic()
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    inflight += 1
    req_counter += 1
    try:
        async with sess.request(method, BASE + ep, data=data, headers={"content-type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            res.status, res.headers = r.status, dict(r.headers)
            ctype = r.headers.get("content-type", "")
            if stream and r.status == 200 and "text/event-stream" in ctype:
                async for ev in sse_events(r):
                    if res.ttft is None:
                        res.ttft = time.monotonic() - t0
                    res.events.append(ev)
                    if disconnect_after is not None and len(res.events) >= disconnect_after:
                        r.close()          # drop the connection mid-stream
                        res.status = "disconnected"
                        break
            else:
                res.text = await r.text()
                try:
                    res.json = json.loads(res.text)
                except ValueError:
                    res.json = None
    except asyncio.TimeoutError:
        res.status = "timeout"
    except (aiohttp.ClientError, ConnectionError) as e:
        res.status, res.error = "conn_error", f"{type(e).__name__}: {e}"
    finally:
        inflight -= 1
    res.latency = time.monotonic() - t0
    gen = ep in ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages")
    choices = (body.get("n", 1) if isinstance(body, dict) and isinstance(body.get("n", 1), int) else 1) if gen else 0
    records.append({"t": round(now(), 2), "endpoint": ep, "scenario": scen, "stream": stream, "choices": choices,
                    "status": res.status, "latency": round(res.latency, 4),
                    "ttft": None if res.ttft is None else round(res.ttft, 4),
                    "bytes": len(res.text) if res.text else sum(len(d) for _, d in res.events)})
    if res.status == "timeout" and not expect_abort:
        anomaly("client_timeout", scen, ep, body if body is not None else raw, "timeout", None,
                f"no answer within {timeout} s")
    if res.status == "conn_error":
        anomaly("connection_error", scen, ep, body if body is not None else raw, "conn_error", None, res.error)
    if isinstance(res.status, int) and res.status >= 500:
        anomaly("5xx", scen, ep, body if body is not None else raw, res.status, res.text or res.events[-3:],
                "server error")
    if res.latency > SLOW_S:
        anomaly("slow", scen, ep, body if body is not None else raw, res.status, None,
                f"took {res.latency:.1f} s (> {SLOW_S} s)")
    return res


def check_429(res: Res, scen: str, ep: str, body) -> bool:
    """A 429 must carry Retry-After and an error body. Returns True if it was a 429 (the caller stops)."""
    if res.status != 429:
        return False
    ok_body = isinstance(res.json, dict) and ("error" in res.json)
    if not res.headers.get("Retry-After") and not res.headers.get("retry-after"):
        anomaly("429_no_retry_after", scen, ep, body, 429, res.text, "429 without Retry-After")
    if not ok_body:
        anomaly("429_bad_body", scen, ep, body, 429, res.text, "429 without an error body")
    return True


def expect_ok(res: Res, scen: str, ep: str, body) -> bool:
    """True when the answer is a 200 to validate; 429 accepted (checked); anything else flagged."""
    if res.status == 200:
        return True
    if check_429(res, scen, ep, body):
        return False
    if res.status in ("timeout", "conn_error") or (isinstance(res.status, int) and res.status >= 500):
        return False             # already flagged by call()
    anomaly("unexpected_status", scen, ep, body, res.status, res.text or res.events[-3:],
            f"expected 200, got {res.status}")
    return False


def sse_json(res: Res, scen, ep, body) -> list[dict] | None:
    """OpenAI-style stream: data JSON chunks; [DONE] last. None when malformed (flagged)."""
    out = []
    datas = [d for _, d in res.events]
    if not datas or datas[-1] != "[DONE]":
        anomaly("stream_no_done", scen, ep, body, res.status, datas[-3:], "stream does not end with [DONE]")
        return None
    for d in datas[:-1]:
        if d == "[DONE]":
            anomaly("stream_done_twice", scen, ep, body, res.status, datas[-3:], "[DONE] before the end")
            return None
        try:
            out.append(json.loads(d))
        except ValueError:
            anomaly("stream_bad_json", scen, ep, body, res.status, d, "chunk is not JSON")
            return None
    for c in out:
        if "error" in c:
            anomaly("stream_error_event", scen, ep, body, res.status, c, "error event in a 200 stream")
            return None
    return out


# ---- validators -------------------------------------------------------------------------------------------------
def check_usage(u: dict, max_total: int, scen, ep, body, resp) -> None:
    if not isinstance(u, dict):
        anomaly("usage_missing", scen, ep, body, 200, resp, "no usage")
        return
    p, c, t = u.get("prompt_tokens"), u.get("completion_tokens"), u.get("total_tokens")
    if not (isinstance(p, int) and isinstance(c, int) and isinstance(t, int)) or p <= 0 or t != p + c:
        anomaly("usage_inconsistent", scen, ep, body, 200, resp, f"usage {u}")
    if isinstance(c, int) and c > max_total:
        anomaly("usage_over_max_tokens", scen, ep, body, 200, resp, f"completion_tokens {c} > {max_total}")
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    if isinstance(p, int) and cached > p:
        anomaly("usage_cached_gt_prompt", scen, ep, body, 200, resp, f"cached {cached} > prompt {p}")
    rt = (u.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    if isinstance(c, int) and rt > c:
        anomaly("usage_reasoning_gt_completion", scen, ep, body, 200, resp, f"reasoning {rt} > completion {c}")


def stops_of(stop) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def check_stop_text(text: str, stop, finish, stop_reason, scen, ep, body, resp) -> None:
    stops = stops_of(stop)
    if stops:
        soft["cov_stop_checked"] += 1
        if stop_reason is not None:
            soft["cov_stop_reason_seen"] += 1
    for s in stops:
        if s in (text or ""):
            anomaly("stop_string_in_output", scen, ep, body, 200, resp, f"output holds stop string {s!r}")
            break
    if stop_reason is not None and stop_reason not in stops:
        anomaly("stop_reason_unknown", scen, ep, body, 200, resp, f"stop_reason {stop_reason!r} not in {stops}")
    if stop_reason is not None and finish != "stop":
        anomaly("stop_reason_without_stop", scen, ep, body, 200, resp, f"stop_reason set, finish {finish}")


def check_completion_logprobs(lp: dict, k: int, max_tokens: int, finish: str, scen, ep, body, resp) -> int:
    soft["cov_completion_logprobs_checked"] += 1
    toks = lp.get("tokens") or []
    n = len(toks)
    if not (len(lp.get("token_logprobs") or []) == len(lp.get("top_logprobs") or []) == len(
            lp.get("text_offset") or []) == n):
        anomaly("logprobs_lengths", scen, ep, body, 200, resp, "tokens / token_logprobs / top / offsets differ")
    if n > max_tokens:
        anomaly("logprobs_over_max", scen, ep, body, 200, resp, f"{n} tokens > max_tokens {max_tokens}")
    if finish == "length" and n != max_tokens:
        anomaly("length_not_max_tokens", scen, ep, body, 200, resp, f"finish length with {n} tokens != {max_tokens}")
    offs = lp.get("text_offset") or []
    if any(b < a for a, b in zip(offs, offs[1:])):
        anomaly("text_offset_decreasing", scen, ep, body, 200, resp, "text_offset not monotonic")
    for top in lp.get("top_logprobs") or []:
        if k and (not isinstance(top, dict) or len(top) > k or len(top) == 0):
            anomaly("top_logprobs_size", scen, ep, body, 200, resp, f"top_logprobs entry {top} for k={k}")
            break
    for v in lp.get("token_logprobs") or []:
        if not isinstance(v, (int, float)) or v > 1e-4:
            anomaly("logprob_positive", scen, ep, body, 200, resp, f"logprob {v}")
            break
    return n


async def sc_completion(sess, scen="completion"):
    stream = random.random() < 0.5
    n = random.choice([1, 1, 1, 2, 3])
    max_tokens = random.randint(1, 64)
    temp = random.choice([0.0, 0.0, 0.7, 1.0, 1.3])
    prompt = random.choice(TEXTS)
    if random.random() < 0.15:
        prompt = LONG_TEXT * random.randint(10, 45)          # ~300 .. 1400 tokens
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "n": n, "temperature": temp}
    if temp > 0 and random.random() < 0.8:
        body["seed"] = random.randint(0, 10**6)
    if (stop := random.choice(STOPS)) is not None:
        body["stop"] = stop
    k = None
    if random.random() < 0.4:
        k = random.randint(0, 5)
        body["logprobs"] = k
    if random.random() < 0.1 and k is None:
        body["echo"] = True
    if stream:
        body["stream"] = True
        if random.random() < 0.7:
            body["stream_options"] = {"include_usage": True}
    ep = "/v1/completions"
    res = await call(sess, ep, scen, body, stream=stream)
    if not expect_ok(res, scen, ep, body):
        return
    if not stream:
        j = res.json
        if not isinstance(j, dict) or len(j.get("choices", [])) != n:
            anomaly("bad_shape", scen, ep, body, 200, res.text, "choices count != n")
            return
        tot = 0
        for i, ch in enumerate(j["choices"]):
            if ch.get("index") != i or ch.get("finish_reason") not in ("stop", "length"):
                anomaly("bad_choice", scen, ep, body, 200, ch, "index / finish_reason")
            text = ch.get("text", "")
            if body.get("echo") and not text.startswith(prompt):
                anomaly("echo_missing", scen, ep, body, 200, ch, "echo text does not start with the prompt")
            check_stop_text(text[len(prompt):] if body.get("echo") else text, body.get("stop"),
                            ch.get("finish_reason"), ch.get("stop_reason"), scen, ep, body, ch)
            if k is not None:
                if not isinstance(ch.get("logprobs"), dict):
                    anomaly("logprobs_missing", scen, ep, body, 200, ch, "no logprobs")
                else:
                    tot += check_completion_logprobs(ch["logprobs"], k, max_tokens, ch["finish_reason"], scen, ep,
                                                     body, ch)
        check_usage(j.get("usage"), n * max_tokens, scen, ep, body, j)
        u = j.get("usage") or {}
        if k is not None and u.get("completion_tokens") != tot:
            anomaly("usage_vs_logprobs", scen, ep, body, 200, j, f"usage {u.get('completion_tokens')} != {tot} tokens")
        if n == 1 and j["choices"][0]["finish_reason"] == "length" and u.get("completion_tokens") != max_tokens:
            anomaly("length_not_max_tokens", scen, ep, body, 200, j, "finish length, completion_tokens != max_tokens")
        if temp == 0 and n == 1 and not body.get("echo") and random.random() < 0.25:
            await pair_check(sess, ep, scen, body, j["choices"][0]["text"])
        return
    chunks = sse_json(res, scen, ep, body)
    if chunks is None:
        return
    texts, finishes, ntok, usage = defaultdict(str), {}, 0, None
    for c in chunks:
        if not c.get("choices"):
            if "usage" in c and c["usage"] is not None:
                usage = c["usage"]
            continue
        if c.get("usage") is not None and c["choices"]:
            pass
        for ch in c["choices"]:
            i = ch["index"]
            if i in finishes:
                anomaly("chunk_after_finish", scen, ep, body, 200, c, f"choice {i} after its finish")
            texts[i] += ch.get("text") or ""
            if ch.get("logprobs"):
                ntok += len(ch["logprobs"].get("tokens") or [])
            if ch.get("finish_reason") is not None:
                finishes[i] = (ch["finish_reason"], ch.get("stop_reason"))
    if set(finishes) != set(range(n)):
        anomaly("stream_missing_finish", scen, ep, body, 200, chunks[-3:], f"finishes {finishes} for n={n}")
    for i, (f, sr) in finishes.items():
        if f not in ("stop", "length"):
            anomaly("bad_finish", scen, ep, body, 200, chunks[-3:], f"finish {f}")
        check_stop_text(texts[i][len(prompt):] if body.get("echo") else texts[i], body.get("stop"), f, sr, scen,
                        ep, body, texts[i])
    inc = body.get("stream_options", {}).get("include_usage")
    if inc and usage is None:
        anomaly("stream_no_usage", scen, ep, body, 200, chunks[-3:], "include_usage but no usage chunk")
    if not inc and usage is not None:
        anomaly("stream_unasked_usage", scen, ep, body, 200, chunks[-3:], "usage chunk without include_usage")
    if usage:
        soft["cov_completion_stream_usage_checked"] += 1
        check_usage(usage, n * max_tokens, scen, ep, body, usage)
        if k is not None and usage.get("completion_tokens") != ntok:
            anomaly("usage_vs_logprobs", scen, ep, body, 200, usage, f"stream usage != {ntok} logprob tokens")
        if n == 1 and finishes.get(0, ("",))[0] == "length" and usage.get("completion_tokens") != max_tokens:
            anomaly("length_not_max_tokens", scen, ep, body, 200, usage, "stream: length but != max_tokens")
    if temp == 0 and n == 1 and not body.get("echo") and random.random() < 0.25:
        b2 = {k2: v for k2, v in body.items() if k2 not in ("stream", "stream_options")}
        await pair_check(sess, ep, scen, b2, texts[0])


async def pair_check(sess, ep, scen, body, text, key=None):
    """Greedy: the same request again (non-stream) should give the same text — soft (batch composition may differ)."""
    b2 = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    r2 = await call(sess, ep, scen + "_pair", b2)
    if r2.status != 200 or not isinstance(r2.json, dict):
        return
    ch = r2.json["choices"][0]
    other = ch.get("text") if "text" in ch else (ch["message"].get("reasoning_content") or "") + "|" + (
        ch["message"].get("content") or "")
    soft_note("greedy_pairs")
    if other != text:
        soft_note("greedy_pair_mismatch", {"body": short(b2, 400), "first": short(text, 300),
                                           "second": short(other, 300)})


def chat_messages() -> list[dict]:
    msgs = []
    if random.random() < 0.3:
        msgs.append({"role": random.choice(["system", "developer"]), "content": "You are a helpful assistant."})
    msgs.append({"role": "user", "content": random.choice(USER_MSGS)})
    return msgs


def validate_chat_whole(j, body, scen, ep, max_tokens, n, *, tools=None, strict=False, forced=None,
                        fmt_schema=None, fmt=False, thinking=True, k=None) -> None:
    if not isinstance(j, dict) or len(j.get("choices", [])) != n:
        anomaly("bad_shape", scen, ep, body, 200, j, "choices count != n")
        return
    lp_total = 0
    soft["cov_chat_whole_validated"] += 1
    if k is not None:
        soft["cov_chat_logprobs_checked"] += 1
    for i, ch in enumerate(j["choices"]):
        m, f = ch.get("message") or {}, ch.get("finish_reason")
        if ch.get("index") != i or m.get("role") != "assistant" or f not in ("stop", "length", "tool_calls"):
            anomaly("bad_choice", scen, ep, body, 200, ch, "index / role / finish_reason")
            continue
        if not thinking and m.get("reasoning_content"):
            anomaly("reasoning_when_off", scen, ep, body, 200, ch, "reasoning_content with reasoning_effort none")
        check_calls(m.get("tool_calls"), f, body, scen, ep, ch, tools, strict, forced)
        if f == "tool_calls" and not m.get("tool_calls"):
            anomaly("tool_calls_finish_no_calls", scen, ep, body, 200, ch, "finish tool_calls without calls")
        if tools is None or body.get("tool_choice") == "none":
            if m.get("tool_calls"):
                anomaly("unasked_tool_calls", scen, ep, body, 200, ch, "tool_calls without tools / with none")
        if not fmt and not tools:
            check_stop_text(m.get("content") or "", body.get("stop"), f, ch.get("stop_reason"), scen, ep, body, ch)
        if fmt and f == "stop":
            check_json_content(m.get("content"), fmt_schema, body, scen, ep, ch)
        if k is not None:
            lp = ch.get("logprobs")
            if not isinstance(lp, dict) or not isinstance(lp.get("content"), list):
                anomaly("logprobs_missing", scen, ep, body, 200, ch, "no logprobs.content")
            else:
                lp_total += len(lp["content"])
                for e in lp["content"]:
                    if len(e.get("top_logprobs") or []) != k or e.get("logprob", 0) > 1e-4:
                        anomaly("top_logprobs_size", scen, ep, body, 200, e, f"top_logprobs != {k} or logprob > 0")
                        break
                if f == "length" and len(lp["content"]) != max_tokens:
                    anomaly("length_not_max_tokens", scen, ep, body, 200, ch,
                            f"length with {len(lp['content'])} logprob tokens != {max_tokens}")
    check_usage(j.get("usage"), n * max_tokens, scen, ep, body, j)
    u = j.get("usage") or {}
    if k is not None and u.get("completion_tokens") != lp_total:
        anomaly("usage_vs_logprobs", scen, ep, body, 200, u, f"usage != {lp_total} logprob tokens")
    if not thinking and (u.get("completion_tokens_details") or {}).get("reasoning_tokens"):
        anomaly("reasoning_tokens_when_off", scen, ep, body, 200, u, "reasoning tokens with thinking off")
    if n == 1 and j["choices"][0].get("finish_reason") == "length" and u.get("completion_tokens") != max_tokens:
        anomaly("length_not_max_tokens", scen, ep, body, 200, j, "finish length, completion_tokens != max_tokens")


def check_calls(calls, finish, body, scen, ep, resp, tools, strict, forced) -> None:
    if forced is not None:
        soft["cov_forced_tool_choice"] += 1
    if calls:
        soft[f"cov_calls_finish_{finish}"] += 1
    if not calls:
        if forced is not None and finish == "stop":
            anomaly("forced_tool_no_call", scen, ep, body, 200, resp, f"tool_choice {forced!r} but no call, finish stop")
        return
    names = {t["function"]["name"]: t["function"] for t in tools or []}
    for c in calls:
        fn = c.get("function") or {}
        if not c.get("id") or c.get("type") != "function" or not isinstance(fn.get("name"), str):
            anomaly("tool_call_shape", scen, ep, body, 200, resp, f"call {c}")
            continue
        if isinstance(forced, str) and forced not in ("required",) and fn["name"] != forced:
            anomaly("forced_tool_wrong_name", scen, ep, body, 200, resp, f"called {fn['name']!r}, forced {forced!r}")
        if (strict or forced is not None) and fn["name"] not in names:
            anomaly("tool_call_unknown_name", scen, ep, body, 200, resp, f"called {fn['name']!r}")
        if finish == "tool_calls":
            soft["cov_tool_args_checked"] += 1
            try:
                args = json.loads(fn.get("arguments") or "")
            except ValueError:
                anomaly("tool_args_not_json", scen, ep, body, 200, resp, f"arguments {fn.get('arguments')!r}")
                continue
            if not isinstance(args, dict):
                anomaly("tool_args_not_object", scen, ep, body, 200, resp, f"arguments {args!r}")
                continue
            spec = names.get(fn["name"])
            if strict and spec is not None and spec.get("strict"):
                soft["cov_strict_args_schema_checked"] += 1
                try:
                    jsonschema.validate(args, spec.get("parameters") or {})
                except jsonschema.ValidationError as e:
                    anomaly("strict_args_schema", scen, ep, body, 200, resp, f"strict arguments fail schema: "
                            f"{e.message}")


def check_json_content(content, schema, body, scen, ep, resp) -> None:
    soft["cov_json_checked" if schema is None else "cov_json_schema_checked"] += 1
    try:
        v = json.loads(content or "")
    except ValueError:
        anomaly("json_format_unparsable", scen, ep, body, 200, resp, f"content {short(content or '', 300)!r}")
        return
    if schema is None:
        if not isinstance(v, dict):
            anomaly("json_object_not_object", scen, ep, body, 200, resp, f"{v!r}")
        return
    try:
        jsonschema.validate(v, schema)
    except jsonschema.ValidationError as e:
        anomaly("json_schema_violation", scen, ep, body, 200, resp, e.message)


def assemble_chat_stream(chunks, n) -> tuple[dict, dict | None, list[str]]:
    """The choices the stream's deltas add up to: index -> {content, reasoning, calls, finish, stop_reason}."""
    out, usage, problems = {}, None, []
    for c in chunks:
        if not c.get("choices"):
            usage = c.get("usage") or usage
            continue
        for ch in c["choices"]:
            i = ch["index"]
            st = out.setdefault(i, {"content": "", "reasoning": "", "calls": {}, "finish": None, "stop_reason": None,
                                    "lp": 0, "role": False})
            if st["finish"] is not None:
                problems.append(f"choice {i}: chunk after finish")
            d = ch.get("delta") or {}
            if d.get("role") == "assistant":
                st["role"] = True
            st["content"] += d.get("content") or ""
            st["reasoning"] += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls") or []:
                cs = st["calls"].setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
                if tc.get("id"):
                    if cs["id"] is not None:
                        problems.append(f"call {tc['index']} id twice")
                    cs["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    cs["name"] = fn["name"]
                cs["arguments"] += fn.get("arguments") or ""
            if ch.get("logprobs") and ch["logprobs"].get("content"):
                st["lp"] += len(ch["logprobs"]["content"])
            if ch.get("finish_reason") is not None:
                st["finish"], st["stop_reason"] = ch["finish_reason"], ch.get("stop_reason")
    if set(out) != set(range(n)):
        problems.append(f"choices {sorted(out)} for n={n}")
    for i, st in out.items():
        if st["finish"] is None:
            problems.append(f"choice {i} has no finish_reason")
        if not st["role"]:
            problems.append(f"choice {i} has no role delta")
    return out, usage, problems


async def sc_chat(sess, scen="chat"):
    stream = random.random() < 0.5
    n = random.choice([1, 1, 1, 2, 3])
    max_tokens = random.randint(1, 64)
    temp = random.choice([0.0, 0.0, 0.6, 1.0])
    thinking = random.random() < 0.5
    body = {"model": MODEL, "messages": chat_messages(), "n": n, "temperature": temp}
    body["max_tokens" if random.random() < 0.6 else "max_completion_tokens"] = max_tokens
    if not thinking:
        body["reasoning_effort"] = random.choice(["none", "minimal"])
    elif random.random() < 0.3:
        body["reasoning_effort"] = random.choice(["low", "high"])
    if temp > 0 and random.random() < 0.8:
        body["seed"] = random.randint(0, 10**6)
    if (stop := random.choice(STOPS)) is not None:
        body["stop"] = stop
    k = None
    if random.random() < 0.35:
        body["logprobs"] = True
        k = random.randint(0, 5)
        body["top_logprobs"] = k
    if stream:
        body["stream"] = True
        if random.random() < 0.7:
            body["stream_options"] = {"include_usage": True}
    ep = "/v1/chat/completions"
    res = await call(sess, ep, scen, body, stream=stream)
    if not expect_ok(res, scen, ep, body):
        return
    if not stream:
        validate_chat_whole(res.json, body, scen, ep, max_tokens, n, thinking=thinking, k=k)
        if temp == 0 and n == 1 and random.random() < 0.2:
            m = res.json["choices"][0]["message"]
            await pair_check(sess, ep, scen, body, (m.get("reasoning_content") or "") + "|" + (m.get("content") or ""))
        return
    chunks = sse_json(res, scen, ep, body)
    if chunks is None:
        return
    st, usage, problems = assemble_chat_stream(chunks, n)
    for p in problems:
        anomaly("stream_structure", scen, ep, body, 200, chunks[-3:], p)
    inc = body.get("stream_options", {}).get("include_usage")
    if inc and usage is None:
        anomaly("stream_no_usage", scen, ep, body, 200, chunks[-3:], "include_usage but no usage chunk")
    if not inc and usage is not None:
        anomaly("stream_unasked_usage", scen, ep, body, 200, chunks[-3:], "usage without include_usage")
    for i, s in st.items():
        if not thinking and s["reasoning"]:
            anomaly("reasoning_when_off", scen, ep, body, 200, s, "reasoning deltas with thinking off")
        if s["calls"]:
            anomaly("unasked_tool_calls", scen, ep, body, 200, s, "tool call deltas without tools")
        check_stop_text(s["content"], body.get("stop"), s["finish"], s["stop_reason"], scen, ep, body, s)
    if usage:
        soft["cov_chat_stream_usage_checked"] += 1
        check_usage(usage, n * max_tokens, scen, ep, body, usage)
        if k is not None and usage.get("completion_tokens") != sum(s["lp"] for s in st.values()):
            anomaly("usage_vs_logprobs", scen, ep, body, 200, usage, "stream usage != logprob entries")
        if n == 1 and st.get(0, {}).get("finish") == "length" and usage.get("completion_tokens") != max_tokens:
            anomaly("length_not_max_tokens", scen, ep, body, 200, usage, "stream: length but != max_tokens")
    if temp == 0 and n == 1 and 0 in st and random.random() < 0.2:
        await pair_check(sess, ep, scen, body, st[0]["reasoning"] + "|" + st[0]["content"])


async def sc_chat_tools(sess, scen="chat_tools"):
    stream = random.random() < 0.4
    strict = random.random() < 0.6
    tools = tools_pick(strict)
    choice_kind = random.choice(["auto", "auto", "required", "named", "none", None])
    thinking = random.random() < 0.35
    max_tokens = random.randint(8, 64)
    body = {"model": MODEL, "messages": chat_messages(), "tools": tools, "max_tokens": max_tokens,
            "temperature": random.choice([0.0, 0.7])}
    forced = None
    if choice_kind == "named":
        name = random.choice(tools)["function"]["name"]
        body["tool_choice"] = {"type": "function", "function": {"name": name}}
        forced = name
    elif choice_kind is not None:
        body["tool_choice"] = choice_kind
        forced = "required" if choice_kind == "required" else None
    if not thinking:
        body["reasoning_effort"] = "none"
    if random.random() < 0.2:
        body["parallel_tool_calls"] = False
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    ep = "/v1/chat/completions"
    res = await call(sess, ep, scen, body, stream=stream)
    if not expect_ok(res, scen, ep, body):
        return
    if not stream:
        validate_chat_whole(res.json, body, scen, ep, max_tokens, 1, tools=tools, strict=strict,
                            forced=forced, thinking=thinking)
        ch = res.json["choices"][0] if isinstance(res.json, dict) and res.json.get("choices") else None
        if ch and body.get("parallel_tool_calls") is False and len(ch["message"].get("tool_calls") or []) > 1 \
                and strict:
            anomaly("parallel_false_many_calls", scen, ep, body, 200, ch, "parallel_tool_calls false, >1 call")
        return
    chunks = sse_json(res, scen, ep, body)
    if chunks is None:
        return
    st, usage, problems = assemble_chat_stream(chunks, 1)
    for p in problems:
        anomaly("stream_structure", scen, ep, body, 200, chunks[-3:], p)
    if usage is None:
        anomaly("stream_no_usage", scen, ep, body, 200, chunks[-3:], "include_usage but no usage chunk")
    else:
        check_usage(usage, max_tokens, scen, ep, body, usage)
    s = st.get(0)
    if s:
        calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                 for _, c in sorted(s["calls"].items())]
        if choice_kind == "none" and calls:
            anomaly("unasked_tool_calls", scen, ep, body, 200, s, "tool_choice none but call deltas")
        check_calls(calls, s["finish"], body, scen, ep, s, tools, strict, forced)
        if s["finish"] == "tool_calls" and not calls:
            anomaly("tool_calls_finish_no_calls", scen, ep, body, 200, s, "finish tool_calls without call deltas")
        if not thinking and s["reasoning"]:
            anomaly("reasoning_when_off", scen, ep, body, 200, s, "reasoning deltas with thinking off")


async def sc_chat_json(sess, scen="chat_json"):
    stream = random.random() < 0.4
    thinking = random.random() < 0.3
    schema = None
    if random.random() < 0.4:
        fmt = {"type": "json_object"}
    else:
        schema = random.choice(JSON_SCHEMAS)
        fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
    max_tokens = random.randint(16, 64)
    body = {"model": MODEL, "messages": chat_messages(), "response_format": fmt, "max_tokens": max_tokens,
            "temperature": random.choice([0.0, 0.8])}
    if not thinking:
        body["reasoning_effort"] = "none"
    if random.random() < 0.3:
        body["stop"] = random.choice(["}", ",", "\n"])      # a grammar holds: stop must not cut it
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    ep = "/v1/chat/completions"
    res = await call(sess, ep, scen, body, stream=stream)
    if not expect_ok(res, scen, ep, body):
        return
    if not stream:
        validate_chat_whole(res.json, body, scen, ep, max_tokens, 1, fmt=True, fmt_schema=schema, thinking=thinking)
        return
    chunks = sse_json(res, scen, ep, body)
    if chunks is None:
        return
    st, usage, problems = assemble_chat_stream(chunks, 1)
    for p in problems:
        anomaly("stream_structure", scen, ep, body, 200, chunks[-3:], p)
    if usage:
        check_usage(usage, max_tokens, scen, ep, body, usage)
    s = st.get(0)
    if s and s["finish"] == "stop":
        check_json_content(s["content"], schema, body, scen, ep, s)


# ---- conversations (prefix caching) ----------------------------------------------------------------------------
async def sc_conversation(sess, scen="conversation"):
    msgs = chat_messages()
    turns = random.randint(3, 6)
    thinking = random.random() < 0.4
    tools = tools_pick(False) if random.random() < 0.3 else None
    prev_prompt = 0
    ep = "/v1/chat/completions"
    for t in range(turns):
        if stop_flag and t > 0:
            return
        body = {"model": MODEL, "messages": msgs, "max_tokens": random.randint(8, 48), "temperature": 0.7,
                "seed": random.randint(0, 9999)}
        if not thinking:
            body["reasoning_effort"] = "none"
        if tools:
            body["tools"] = tools
        res = await call(sess, ep, scen, body)
        if not expect_ok(res, scen, ep, body):
            return
        validate_chat_whole(res.json, body, scen, ep, body["max_tokens"], 1, tools=tools, thinking=thinking)
        u = res.json.get("usage") or {}
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        if t > 0:
            soft_note("conv_followup_turns")
            if cached == 0:
                soft_note("conv_followup_no_cache", {"turn": t, "prompt_tokens": u.get("prompt_tokens"),
                                                     "prev_prompt_tokens": prev_prompt})
            elif cached + 64 < prev_prompt:
                soft_note("conv_followup_partial_cache", {"turn": t, "cached": cached, "prev_prompt": prev_prompt})
            soft["conv_cached_tokens"] += cached
            soft["conv_prompt_tokens"] += u.get("prompt_tokens", 0)
        prev_prompt = u.get("prompt_tokens", 0)
        m = res.json["choices"][0]["message"]
        turn = {"role": "assistant", "content": m.get("content") or ""}
        if m.get("reasoning_content"):
            turn["reasoning_content"] = m["reasoning_content"]
        msgs = msgs + [turn]
        if m.get("tool_calls") and res.json["choices"][0]["finish_reason"] == "tool_calls":
            turn["tool_calls"] = m["tool_calls"]
            for c in m["tool_calls"]:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"result": 42})})
        else:
            msgs.append({"role": "user", "content": random.choice(USER_MSGS)})


# ---- Responses API -----------------------------------------------------------------------------------------------
def flat_tools(strict: bool) -> list[dict]:
    out = []
    for t in tools_pick(strict):
        fn = t["function"]
        out.append({"type": "function", **fn})
    return out


def validate_response_obj(r: dict, body, scen, ep, max_out) -> None:
    if not isinstance(r, dict) or r.get("object") != "response":
        anomaly("bad_shape", scen, ep, body, 200, r, "not a response object")
        return
    st = r.get("status")
    if st not in ("completed", "incomplete"):
        anomaly("response_status", scen, ep, body, 200, r, f"status {st}")
    if (st == "incomplete") != bool(r.get("incomplete_details")):
        anomaly("response_incomplete_details", scen, ep, body, 200, r, "incomplete_details mismatch")
    u = r.get("usage") or {}
    if not u or u.get("total_tokens") != u.get("input_tokens", 0) + u.get("output_tokens", 0):
        anomaly("usage_inconsistent", scen, ep, body, 200, u, "responses usage")
    if max_out is not None and u.get("output_tokens", 0) > max_out:
        anomaly("usage_over_max_tokens", scen, ep, body, 200, u, f"output_tokens > {max_out}")
    if st == "incomplete" and max_out is not None and u.get("output_tokens") != max_out:
        anomaly("length_not_max_tokens", scen, ep, body, 200, u, "incomplete but output_tokens != max_output_tokens")
    sealed = "reasoning.encrypted_content" in (body.get("include") or [])
    for item in r.get("output") or []:
        ty = item.get("type")
        if ty == "function_call":
            if st == "completed":
                try:
                    a = json.loads(item.get("arguments") or "")
                    if not isinstance(a, dict):
                        raise ValueError
                except ValueError:
                    anomaly("tool_args_not_json", scen, ep, body, 200, item, "function_call arguments")
        elif ty == "reasoning":
            text = "".join(p.get("text", "") for p in item.get("content") or [])
            enc = item.get("encrypted_content")
            if sealed:
                if not enc:
                    anomaly("encrypted_missing", scen, ep, body, 200, item, "include encrypted but none")
                else:
                    soft["cov_encrypted_roundtrip"] += 1
                    try:
                        dec = base64.b64decode(enc.split(":", 1)[1]).decode()
                        if dec != text:
                            anomaly("encrypted_mismatch", scen, ep, body, 200, item, "encrypted != text")
                    except Exception as e:  # noqa: BLE001
                        anomaly("encrypted_undecodable", scen, ep, body, 200, item, repr(e))
            elif enc:
                anomaly("encrypted_unasked", scen, ep, body, 200, item, "encrypted_content without include")
        elif ty == "message":
            if not item.get("content") or item["content"][0].get("type") != "output_text":
                anomaly("message_item_shape", scen, ep, body, 200, item, "message item content")
        else:
            anomaly("unknown_item", scen, ep, body, 200, item, f"item type {ty}")


def assemble_response_stream(events, body, scen, ep) -> dict | None:
    parsed = []
    for name, d in events:
        try:
            e = json.loads(d)
        except ValueError:
            anomaly("stream_bad_json", scen, ep, body, 200, d, "event not JSON")
            return None
        if name != e.get("type"):
            anomaly("event_name_mismatch", scen, ep, body, 200, e, f"event {name} vs type {e.get('type')}")
        parsed.append(e)
    if not parsed:
        anomaly("stream_empty", scen, ep, body, 200, None, "no events")
        return None
    seqs = [e.get("sequence_number") for e in parsed]
    if seqs != list(range(len(parsed))):
        anomaly("sequence_numbers", scen, ep, body, 200, seqs[:50], "sequence_number not 0..N-1")
    if parsed[0]["type"] != "response.created":
        anomaly("stream_first_event", scen, ep, body, 200, parsed[0], "first event not response.created")
    last = parsed[-1]
    if last["type"] not in ("response.completed", "response.incomplete"):
        anomaly("stream_last_event", scen, ep, body, 200, last, "last event not completed / incomplete")
        return None
    deltas = defaultdict(str)
    done = {}
    for e in parsed:
        if e["type"] in ("response.output_text.delta", "response.reasoning_text.delta"):
            deltas[e["item_id"]] += e["delta"]
        elif e["type"] == "response.function_call_arguments.delta":
            deltas[e["item_id"]] += e["delta"]
        elif e["type"] in ("response.output_text.done", "response.reasoning_text.done"):
            done[e["item_id"]] = e["text"]
        elif e["type"] == "response.function_call_arguments.done":
            done[e["item_id"]] = e["arguments"]
    for iid, text in done.items():
        soft["cov_responses_deltas_vs_done"] += 1
        if deltas.get(iid, "") != text:
            anomaly("stream_deltas_vs_done", scen, ep, body, 200, {"deltas": deltas.get(iid), "done": text},
                    "concatenated deltas != done text")
    final = last["response"]
    for item in final.get("output") or []:
        txt = item.get("arguments") if item["type"] == "function_call" else "".join(
            p.get("text", "") for p in item.get("content") or [])
        if item["id"] in done and done[item["id"]] != txt:
            anomaly("stream_done_vs_final", scen, ep, body, 200, item, "done text != final response item")
        if item["id"] not in done and txt:
            anomaly("stream_item_without_done", scen, ep, body, 200, item, "final item with text but no done event")
    return final


async def sc_responses(sess, scen="responses"):
    stream = random.random() < 0.5
    sealed = random.random() < 0.6
    tools = flat_tools(random.random() < 0.5) if random.random() < 0.5 else None
    thinking = random.random() < 0.6
    max_out = random.randint(8, 64)
    body = {"model": MODEL, "input": random.choice(USER_MSGS), "max_output_tokens": max_out,
            "temperature": random.choice([0.0, 0.8])}
    if random.random() < 0.4:
        body["instructions"] = "Answer briefly."
    if sealed:
        body["include"] = ["reasoning.encrypted_content"]
    if tools:
        body["tools"] = tools
        body["tool_choice"] = random.choice(["auto", "required", "auto"])
    if not thinking:
        body["reasoning"] = {"effort": "none"}
    if random.random() < 0.15 and not tools:
        body["text"] = {"format": {"type": "json_schema", "name": "o", "schema": JSON_SCHEMAS[0]}}
    ep = "/v1/responses"
    history = [{"type": "message", "role": "user", "content": body["input"]}]
    for turn in range(random.randint(1, 3)):
        if turn > 0:
            body = dict(body, input=history)
        if stream:
            body["stream"] = True
        res = await call(sess, ep, scen, body, stream=stream)
        if not expect_ok(res, scen, ep, body):
            return
        if stream:
            r = assemble_response_stream(res.events, body, scen, ep)
            if r is None:
                return
        else:
            r = res.json
        validate_response_obj(r, body, scen, ep, max_out)
        if "text" in body and r.get("status") == "completed":
            msg = [i for i in r.get("output", []) if i["type"] == "message"]
            if msg:
                check_json_content(msg[0]["content"][0]["text"], JSON_SCHEMAS[0], body, scen, ep, r)
        if turn > 0:
            soft_note("responses_followups")
            if not (r.get("usage") or {}).get("input_tokens_details", {}).get("cached_tokens"):
                soft_note("responses_followup_no_cache")
        # the next turn: the output items back, the calls answered, a new user message
        out = r.get("output") or []
        history = history + out
        calls = [i for i in out if i["type"] == "function_call"]
        if calls and r.get("status") == "completed":
            history += [{"type": "function_call_output", "call_id": c["call_id"], "output": '{"ok": true}'}
                        for c in calls]
        elif calls:
            return                   # an incomplete call's arguments may not parse: the next turn would be a 400
        else:
            history.append({"type": "message", "role": "user", "content": random.choice(USER_MSGS)})
        if stop_flag:
            return


# ---- Anthropic Messages ----------------------------------------------------------------------------------------
def anth_tools() -> list[dict]:
    return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "input_schema": t["function"]["parameters"]} for t in tools_pick(False)]


def validate_message(m: dict, body, scen, ep) -> None:
    if not isinstance(m, dict) or m.get("type") != "message" or m.get("role") != "assistant":
        anomaly("bad_shape", scen, ep, body, 200, m, "not a message")
        return
    sr = m.get("stop_reason")
    if sr not in ("end_turn", "max_tokens", "tool_use", "stop_sequence", "model_context_window_exceeded"):
        anomaly("bad_stop_reason", scen, ep, body, 200, m, f"stop_reason {sr}")
    u = m.get("usage") or {}
    if u.get("output_tokens", 0) > body["max_tokens"]:
        anomaly("usage_over_max_tokens", scen, ep, body, 200, u, f"output_tokens > {body['max_tokens']}")
    if sr == "max_tokens" and u.get("output_tokens") != body["max_tokens"]:
        anomaly("length_not_max_tokens", scen, ep, body, 200, u, "max_tokens stop but output_tokens != max_tokens")
    if sr == "stop_sequence" and m.get("stop_sequence") not in (body.get("stop_sequences") or []):
        anomaly("stop_reason_unknown", scen, ep, body, 200, m, "stop_sequence not one of stop_sequences")
    kinds = [b.get("type") for b in m.get("content") or []]
    if sr == "tool_use" and "tool_use" not in kinds:
        anomaly("tool_use_stop_no_block", scen, ep, body, 200, m, "stop_reason tool_use without tool_use block")
    thinking = (body.get("thinking") or {}).get("type") == "enabled"
    if not thinking and "thinking" in kinds:
        anomaly("reasoning_when_off", scen, ep, body, 200, m, "thinking block without thinking enabled")
    for b in m.get("content") or []:
        if b.get("type") == "tool_use":
            if not isinstance(b.get("input"), dict) or not b.get("id"):
                anomaly("tool_call_shape", scen, ep, body, 200, b, "tool_use input / id")
            if (body.get("tool_choice") or {}).get("type") == "tool" and b.get("name") != body["tool_choice"]["name"]:
                anomaly("forced_tool_wrong_name", scen, ep, body, 200, m, "tool_choice tool, other name")
        elif b.get("type") == "text":
            for s in body.get("stop_sequences") or []:
                if s in b.get("text", ""):
                    anomaly("stop_string_in_output", scen, ep, body, 200, m, f"text holds {s!r}")
    if (body.get("tool_choice") or {}).get("type") in ("any", "tool") and sr == "end_turn" and \
            "tool_use" not in kinds:
        anomaly("forced_tool_no_call", scen, ep, body, 200, m, "tool_choice any/tool, end_turn without tool_use")


def assemble_message_stream(events, body, scen, ep) -> dict | None:
    parsed = []
    for name, d in events:
        try:
            e = json.loads(d)
        except ValueError:
            anomaly("stream_bad_json", scen, ep, body, 200, d, "event not JSON")
            return None
        if name != e.get("type"):
            anomaly("event_name_mismatch", scen, ep, body, 200, e, f"{name} vs {e.get('type')}")
        parsed.append(e)
    if not parsed or parsed[0]["type"] != "message_start" or parsed[-1]["type"] != "message_stop":
        anomaly("stream_order", scen, ep, body, 200, parsed[-3:] if parsed else None,
                "not message_start ... message_stop")
        return None
    if any(e["type"] == "error" for e in parsed):
        anomaly("stream_error_event", scen, ep, body, 200, parsed[-3:], "error event")
        return None
    msg = dict(parsed[0]["message"], content=[])
    open_idx, json_buf = None, ""
    for e in parsed[1:-1]:
        t = e["type"]
        if t == "content_block_start":
            if open_idx is not None or e["index"] != len(msg["content"]):
                anomaly("stream_block_index", scen, ep, body, 200, e, "block start index / nesting")
            open_idx, json_buf = e["index"], ""
            msg["content"].append(dict(e["content_block"]))
        elif t == "content_block_delta":
            if e["index"] != open_idx:
                anomaly("stream_block_index", scen, ep, body, 200, e, "delta for a block not open")
                continue
            b, d = msg["content"][open_idx], e["delta"]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif d["type"] == "input_json_delta":
                json_buf += d["partial_json"]
        elif t == "content_block_stop":
            if e["index"] != open_idx:
                anomaly("stream_block_index", scen, ep, body, 200, e, "stop for a block not open")
            b = msg["content"][open_idx]
            if b["type"] == "tool_use":
                try:
                    b["input"] = json.loads(json_buf or "{}")
                except ValueError:
                    if msg.get("stop_reason") != "max_tokens":
                        b["_bad_json"] = json_buf
            open_idx = None
        elif t == "message_delta":
            msg["stop_reason"] = e["delta"].get("stop_reason")
            msg["stop_sequence"] = e["delta"].get("stop_sequence")
            msg["usage"] = e.get("usage")
        elif t == "ping":
            pass
        else:
            anomaly("stream_unknown_event", scen, ep, body, 200, e, f"event {t}")
    soft["cov_anthropic_streams_assembled"] += 1
    soft["cov_anthropic_tool_use_blocks"] += sum(b.get("type") == "tool_use" for b in msg["content"])
    if open_idx is not None:
        anomaly("stream_block_unclosed", scen, ep, body, 200, parsed[-3:], "block left open")
    for b in msg["content"]:
        if "_bad_json" in b and msg.get("stop_reason") != "max_tokens":
            anomaly("tool_args_not_json", scen, ep, body, 200, b, "streamed tool_use JSON does not parse")
    return msg


async def sc_messages(sess, scen="messages"):
    stream = random.random() < 0.5
    tools = anth_tools() if random.random() < 0.5 else None
    thinking = random.random() < 0.5
    body = {"model": MODEL, "max_tokens": random.randint(8, 64), "temperature": random.choice([0.0, 0.7, 1.0]),
            "messages": [{"role": "user", "content": random.choice(USER_MSGS)}]}
    if random.random() < 0.3:
        body["system"] = "You are terse."
    if tools:
        body["tools"] = tools
        kind = random.choice(["auto", "any", "tool", None])
        if kind == "tool":
            body["tool_choice"] = {"type": "tool", "name": random.choice(tools)["name"]}
        elif kind:
            body["tool_choice"] = {"type": kind}
        if kind in ("any", "tool"):
            thinking = False
    if thinking:
        body["thinking"] = {"type": "enabled", "budget_tokens": random.choice([1024, 2048])}
    if random.random() < 0.25:
        body["stop_sequences"] = random.choice([["\n"], [" the", "."], ["and"]])
    ep = "/v1/messages"
    for turn in range(random.randint(1, 3)):
        if stream:
            body["stream"] = True
        res = await call(sess, ep, scen, body, stream=stream)
        if res.status == 429:
            if not isinstance(res.json, dict) or res.json.get("type") != "error":
                anomaly("429_bad_body", scen, ep, body, 429, res.text, "anthropic 429 body")
            if not res.headers.get("Retry-After"):
                anomaly("429_no_retry_after", scen, ep, body, 429, res.text, "no Retry-After")
            return
        if not expect_ok(res, scen, ep, body):
            return
        m = assemble_message_stream(res.events, body, scen, ep) if stream else res.json
        if m is None:
            return
        validate_message(m, body, scen, ep)
        if turn > 0:
            soft_note("messages_followups")
            if not (m.get("usage") or {}).get("cache_read_input_tokens"):
                soft_note("messages_followup_no_cache")
        content = [{k: v for k, v in b.items() if not k.startswith("_")} for b in m.get("content") or []]
        if not content:
            content = [{"type": "text", "text": ""}]
        msgs = body["messages"] + [{"role": "assistant", "content": content}]
        uses = [b for b in content if b.get("type") == "tool_use"]
        if uses:
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b["id"],
                                                      "content": "42"} for b in uses]})
        else:
            msgs.append({"role": "user", "content": random.choice(USER_MSGS)})
        body = dict(body, messages=msgs)
        if stop_flag:
            return


# ---- disconnects, aborts, bad requests, misc -----------------------------------------------------------------------
async def sc_disconnect(sess, scen="disconnect"):
    kind = random.choice(["chat", "completion", "responses", "messages"])
    mt = 64
    if kind == "chat":
        ep, body = "/v1/chat/completions", {"model": MODEL, "messages": chat_messages(), "max_tokens": mt,
                                            "stream": True, "n": random.choice([1, 2])}
    elif kind == "completion":
        ep, body = "/v1/completions", {"model": MODEL, "prompt": random.choice(TEXTS), "max_tokens": mt,
                                       "stream": True, "n": random.choice([1, 3])}
    elif kind == "responses":
        ep, body = "/v1/responses", {"model": MODEL, "input": random.choice(USER_MSGS), "max_output_tokens": mt,
                                     "stream": True}
    else:
        ep, body = "/v1/messages", {"model": MODEL, "max_tokens": mt, "stream": True,
                                    "messages": [{"role": "user", "content": random.choice(USER_MSGS)}]}
    if random.random() < 0.5:
        body["ignore_eos"] = True if kind in ("chat", "completion") else None
        body = {k: v for k, v in body.items() if v is not None}
    res = await call(sess, ep, scen, body, stream=True, disconnect_after=random.randint(1, 5))
    if res.status not in ("disconnected", 200, 429):
        if isinstance(res.status, int) and res.status < 500:
            anomaly("unexpected_status", scen, ep, body, res.status, res.text, "disconnect scenario")


async def sc_timeout_abort(sess, scen="timeout_abort"):
    ep = random.choice(["/v1/chat/completions", "/v1/completions"])
    body = {"model": MODEL, "max_tokens": 64, "ignore_eos": True}
    if ep == "/v1/completions":
        body["prompt"] = LONG_TEXT * random.randint(1, 30)
    else:
        body["messages"] = chat_messages()
    await call(sess, ep, scen, body, timeout=random.uniform(0.05, 1.0), expect_abort=True)


LONG_PROMPT = LONG_TEXT * 90                  # ~2800 tokens > 2048
HUGE_PROMPT = "x" * 400_000                   # past the character bound


def bad_requests() -> list[tuple[str, str, object, int, str]]:
    """(name, endpoint, body or raw bytes, expected status, error shape: openai / anthropic)."""
    M = MODEL
    msg = [{"role": "user", "content": "hi"}]
    return [
        ("unknown_model_chat", "/v1/chat/completions", {"model": "gpt-4", "messages": msg}, 404, "openai"),
        ("unknown_model_completion", "/v1/completions", {"model": "nope", "prompt": "hi"}, 404, "openai"),
        ("negative_max_tokens", "/v1/completions", {"model": M, "prompt": "hi", "max_tokens": -5}, 400, "openai"),
        ("zero_max_tokens_chat", "/v1/chat/completions", {"model": M, "messages": msg, "max_tokens": 0}, 400,
         "openai"),
        ("malformed_json", "/v1/chat/completions", b'{"model": "tiny", "messages": [', 400, "openai"),
        ("malformed_json_completion", "/v1/completions", b'{"model": tiny}', 400, "openai"),
        ("body_is_array", "/v1/completions", b'[1, 2, 3]', 400, "openai"),
        ("non_utf8", "/v1/completions", b'{"model": "tiny", "prompt": "\xff\xfe"}', 400, "openai"),
        ("lone_surrogate", "/v1/completions", b'{"model": "tiny", "prompt": "a\\ud800b"}', 400, "openai"),
        ("prompt_too_long_tokens", "/v1/completions", {"model": M, "prompt": LONG_PROMPT, "max_tokens": 4}, 400,
         "openai"),
        ("prompt_too_long_chars", "/v1/completions", {"model": M, "prompt": HUGE_PROMPT}, 400, "openai"),
        ("chat_too_long", "/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content":
                                                                              LONG_PROMPT}]}, 400, "openai"),
        ("prompt_plus_max_tokens", "/v1/completions", {"model": M, "prompt": LONG_TEXT * 55, "max_tokens": 1000},
         400, "openai"),
        ("messages_wrong_type", "/v1/chat/completions", {"model": M, "messages": "hello"}, 400, "openai"),
        ("temperature_string", "/v1/chat/completions", {"model": M, "messages": msg, "temperature": "hot"}, 400,
         "openai"),
        ("max_tokens_string", "/v1/completions", {"model": M, "prompt": "hi", "max_tokens": "10"}, 400, "openai"),
        ("max_tokens_float", "/v1/completions", {"model": M, "prompt": "hi", "max_tokens": 10.5}, 400, "openai"),
        ("n_zero", "/v1/completions", {"model": M, "prompt": "hi", "n": 0}, 400, "openai"),
        ("n_too_big", "/v1/chat/completions", {"model": M, "messages": msg, "n": 9}, 400, "openai"),
        ("top_logprobs_without_logprobs", "/v1/chat/completions", {"model": M, "messages": msg, "top_logprobs": 3},
         400, "openai"),
        ("logprobs_too_many", "/v1/completions", {"model": M, "prompt": "hi", "logprobs": 6}, 400, "openai"),
        ("empty_messages", "/v1/chat/completions", {"model": M, "messages": []}, 400, "openai"),
        ("bad_role", "/v1/chat/completions", {"model": M, "messages": [{"role": "wizard", "content": "x"}]}, 400,
         "openai"),
        ("too_many_stops", "/v1/completions", {"model": M, "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400,
         "openai"),
        ("required_without_tools", "/v1/chat/completions", {"model": M, "messages": msg, "tool_choice": "required"},
         400, "openai"),
        ("named_unknown_tool", "/v1/chat/completions", {"model": M, "messages": msg, "tools": [WEATHER],
                                                        "tool_choice": {"type": "function",
                                                                        "function": {"name": "nope"}}}, 400, "openai"),
        ("bad_response_format", "/v1/chat/completions", {"model": M, "messages": msg,
                                                         "response_format": {"type": "yaml"}}, 400, "openai"),
        ("missing_model", "/v1/completions", {"prompt": "hi"}, 400, "openai"),
        ("missing_prompt", "/v1/completions", {"model": M}, 400, "openai"),
        ("image_part", "/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400, "openai"),
        ("priority_under_fcfs", "/v1/completions", {"model": M, "prompt": "hi", "priority": 3}, 400, "openai"),
        ("token_id_out_of_vocab", "/v1/completions", {"model": M, "prompt": [1, 2, 10**9], "max_tokens": 2}, 400,
         "openai"),
        ("stream_options_type", "/v1/chat/completions", {"model": M, "messages": msg, "stream": True,
                                                         "stream_options": {"include_usage": "yes"}}, 400, "openai"),
        ("resp_previous_id", "/v1/responses", {"model": M, "input": "hi", "previous_response_id": "resp_x"}, 400,
         "openai"),
        ("resp_bad_input", "/v1/responses", {"model": M, "input": 42}, 400, "openai"),
        ("resp_unknown_model", "/v1/responses", {"model": "x", "input": "hi"}, 404, "openai"),
        ("resp_bad_include", "/v1/responses", {"model": M, "input": "hi", "include": ["foo"]}, 400, "openai"),
        ("resp_orphan_output", "/v1/responses", {"model": M, "input": [
            {"type": "function_call_output", "call_id": "nope", "output": "1"}]}, 400, "openai"),
        ("resp_too_long", "/v1/responses", {"model": M, "input": LONG_PROMPT}, 400, "openai"),
        ("msg_missing_max_tokens", "/v1/messages", {"model": M, "messages": msg}, 400, "anthropic"),
        ("msg_unknown_model", "/v1/messages", {"model": "claude-x", "max_tokens": 5, "messages": msg}, 404,
         "anthropic"),
        ("msg_image", "/v1/messages", {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}, 400,
         "anthropic"),
        ("msg_bad_role", "/v1/messages", {"model": M, "max_tokens": 5, "messages": [{"role": "system",
                                                                                     "content": "x"}]}, 400,
         "anthropic"),
        ("msg_malformed", "/v1/messages", b'{"model": "tiny", "max_tokens": 5, "messages": [{', 400, "anthropic"),
        ("msg_too_long", "/v1/messages", {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content":
                                                                                     LONG_PROMPT}]}, 400, "anthropic"),
        ("msg_negative_max_tokens", "/v1/messages", {"model": M, "max_tokens": -1, "messages": msg}, 400,
         "anthropic"),
        ("msg_thinking_with_forced_tool", "/v1/messages", {
            "model": M, "max_tokens": 20, "messages": msg, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tools": [{"name": "t", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"}}, 400,
         "anthropic"),
        ("msg_orphan_tool_result", "/v1/messages", {"model": M, "max_tokens": 5, "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "1"}]}]}, 400,
         "anthropic"),
        ("tokenize_neither", "/tokenize", {"model": M}, 400, "openai"),
        ("detokenize_negative", "/detokenize", {"model": M, "tokens": [-1]}, 400, "openai"),
        ("unknown_route", "/v1/nothing", {"model": M}, 404, "openai"),
        ("wrong_method", "/v1/chat/completions", None, 405, "openai"),
        ("count_tokens_bad", "/v1/messages/count_tokens", {"model": M, "messages": "x"}, 400, "anthropic"),
    ]


BAD = None


async def sc_bad(sess, scen="bad", item=None):
    global BAD
    BAD = BAD or bad_requests()
    name, ep, payload, expect, shape = item or random.choice(BAD)
    raw = payload if isinstance(payload, bytes) else None
    body = None if raw is not None else payload
    method = "GET" if name == "wrong_method" else "POST"
    res = await call(sess, ep, f"bad:{name}", body, raw=raw, method=method)
    if res.status == 429:
        check_429(res, f"bad:{name}", ep, body or raw)
        return res
    if res.status != expect:
        anomaly("bad_request_status", f"bad:{name}", ep, body if body is not None else raw, res.status, res.text,
                f"expected {expect}, got {res.status}")
        return res
    j = res.json
    if shape == "openai":
        ok = isinstance(j, dict) and isinstance(j.get("error"), dict) and isinstance(j["error"].get("message"), str)
    else:
        ok = isinstance(j, dict) and j.get("type") == "error" and isinstance((j.get("error") or {}).get("message"),
                                                                            str)
    if not ok:
        anomaly("bad_request_body", f"bad:{name}", ep, body if body is not None else raw, res.status, res.text,
                f"error body not {shape}-shaped")
    return res


async def sc_misc(sess, scen="misc"):
    kind = random.choice(["tokenize", "tokenize_chat", "detokenize", "count_tokens", "models", "model"])
    if kind == "models":
        res = await call(sess, "/v1/models", "misc", method="GET")
        if res.status == 200 and (res.json or {}).get("data", [{}])[0].get("id") != MODEL:
            anomaly("models_shape", "misc", "/v1/models", None, 200, res.text, "model id")
        return
    if kind == "model":
        res = await call(sess, f"/v1/models/{MODEL}", "misc", method="GET")
        if res.status != 200:
            anomaly("unexpected_status", "misc", "/v1/models/{id}", None, res.status, res.text, "expected 200")
        return
    if kind == "tokenize":
        text = random.choice(TEXTS)
        res = await call(sess, "/tokenize", "misc", {"model": MODEL, "prompt": text})
        if res.status == 200:
            j = res.json
            if j["count"] != len(j["tokens"]):
                anomaly("tokenize_count", "misc", "/tokenize", text, 200, j, "count != len(tokens)")
            r2 = await call(sess, "/detokenize", "misc", {"model": MODEL, "tokens": j["tokens"]})
            if r2.status == 200 and r2.json["prompt"] != text:
                anomaly("detok_roundtrip", "misc", "/detokenize", text, 200, r2.json, "detokenize(tokenize(t)) != t")
        else:
            anomaly("unexpected_status", "misc", "/tokenize", text, res.status, res.text, "expected 200")
        return
    if kind == "tokenize_chat":
        body = {"model": MODEL, "messages": chat_messages(), "tools": [WEATHER]}
        res = await call(sess, "/tokenize", "misc", body)
        if res.status != 200:
            anomaly("unexpected_status", "misc", "/tokenize", body, res.status, res.text, "expected 200")
        return
    if kind == "detokenize":
        body = {"model": MODEL, "tokens": [random.randint(0, 1000) for _ in range(10)]}
        res = await call(sess, "/detokenize", "misc", body)
        if res.status != 200:
            anomaly("unexpected_status", "misc", "/detokenize", body, res.status, res.text, "expected 200")
        return
    body = {"model": MODEL, "messages": [{"role": "user", "content": random.choice(USER_MSGS)}]}
    res = await call(sess, "/v1/messages/count_tokens", "misc", body)
    if res.status != 200 or not isinstance((res.json or {}).get("input_tokens"), int):
        anomaly("unexpected_status", "misc", "/v1/messages/count_tokens", body, res.status, res.text, "expected 200")


SCENARIOS = [
    (sc_completion, 16), (sc_chat, 16), (sc_chat_tools, 12), (sc_chat_json, 8), (sc_conversation, 6),
    (sc_responses, 9), (sc_messages, 9), (sc_disconnect, 6), (sc_timeout_abort, 4), (sc_bad, 8), (sc_misc, 4),
]


async def client(sess, cid: int, deadline: float):
    fns, weights = zip(*SCENARIOS)
    while time.monotonic() < deadline and not stop_flag:
        fn = random.choices(fns, weights)[0]
        try:
            await fn(sess)
        except Exception as e:  # noqa: BLE001 — a bug in the load generator, or a malformed answer it choked on
            import traceback
            anomaly("client_exception", fn.__name__, "?", None, None, traceback.format_exc()[-1500:],
                    f"{type(e).__name__}: {e}")
        await asyncio.sleep(random.uniform(0, 0.2))


async def burst(sess, size: int, tag: str) -> Counter:
    """``size`` requests at once: 200 or 429 (with Retry-After), never a hang or a 5xx."""
    async def one(i):
        if i % 3 == 0:
            body = {"model": MODEL, "messages": chat_messages(), "max_tokens": 48, "ignore_eos": True,
                    "stream": True}
            r = await call(sess, "/v1/chat/completions", "burst", body, stream=True)
            if r.status == 200:
                ch = sse_json(r, "burst", "/v1/chat/completions", body)
                if ch is not None:
                    st, _, problems = assemble_chat_stream(ch, 1)
                    for p in problems:
                        anomaly("stream_structure", "burst", "/v1/chat/completions", body, 200, ch[-2:], p)
        else:
            body = {"model": MODEL, "prompt": random.choice(TEXTS), "max_tokens": 48, "ignore_eos": True}
            r = await call(sess, "/v1/completions", "burst", body)
            if r.status == 200:
                u = (r.json or {}).get("usage", {})
                if u.get("completion_tokens") != 48:
                    anomaly("ignore_eos_short", "burst", "/v1/completions", body, 200, r.text,
                            "ignore_eos but completion_tokens != 48")
        if r.status == 429:
            check_429(r, "burst", "/v1/completions", None)
        elif r.status != 200 and not (r.status in ("timeout", "conn_error") or
                                      (isinstance(r.status, int) and r.status >= 500)):
            anomaly("unexpected_status", "burst", "?", None, r.status, r.text, "burst: expected 200 or 429")
        return r.status

    statuses = await asyncio.gather(*[one(i) for i in range(size)])
    c = Counter(statuses)
    print(f"[{now():6.0f} s] burst {tag} x{size}: {dict(c)}", flush=True)
    return c


async def burster(sess, deadline: float, every: float, size: int, results: list):
    await asyncio.sleep(every / 2)
    while time.monotonic() + 30 < deadline and not stop_flag:
        results.append(dict(await burst(sess, size, f"#{len(results) + 1}")))
        await asyncio.sleep(every)


# ---- health -------------------------------------------------------------------------------------------------------
METRIC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict:
    out = defaultdict(float)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = METRIC_RE.match(line.strip())
        if not m:
            continue
        name, labels, val = m.groups()
        try:
            v = float(val)
        except ValueError:
            continue
        if name.endswith("_created") or "_bucket" in name:
            continue
        key = name
        if labels and "finish_reason" in labels:
            key = name + ":" + re.search(r'finish_reason="([^"]*)"', labels).group(1)
        elif labels and "reason" in labels:
            key = name + ":" + re.search(r'reason="([^"]*)"', labels).group(1)
        out[key] += v
    return dict(out)


def proc_label(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return "?"
    for key, lab in (("glmserve serve", "main"), ("gcs_server", "gcs"), ("raylet/raylet", "raylet"),
                     ("Coordinator", "coordinator"), ("OpenAIIngress", "ingress"), ("_WorkerActor", "worker"),
                     ("ProxyActor", "proxy"), ("ServeController", "controller"), ("_Board", "board"),
                     ("MetricsHub", "metricshub"), ("dashboard.py", "dashboard"), ("DashboardAgent", "dash_agent"),
                     ("RuntimeEnvAgent", "renv_agent"), ("log_monitor", "log_monitor"), ("monitor.py", "monitor")):
        if key in cmd:
            return lab
    return "other:" + (p.name() if p.is_running() else "?")


KEY_PROCS = ["main", "gcs", "raylet", "coordinator", "ingress", "worker", "proxy", "controller", "board",
             "metricshub"]
HEALTH_FIELDS = (["t", "phase", "health_status", "health_ms", "metrics_ms", "running", "waiting", "queued_prompt_tokens",
                  "kv_usage", "kv_free_blocks", "prefix_cache_blocks", "requests_total", "refused_total",
                  "generated_tokens", "preemptions", "client_inflight", "client_requests", "nprocs", "rss_total_mb"]
                 + [f"rss_{k}_mb" for k in KEY_PROCS] + ["fds_total"] + [f"fds_{k}" for k in KEY_PROCS]
                 + ["threads_total", "loadavg1"])


async def health_sample(sess, server_pid: int, phase: str) -> dict:
    row = {"t": round(now(), 1), "phase": phase}
    t0 = time.monotonic()
    try:
        async with sess.get(BASE + "/health", timeout=aiohttp.ClientTimeout(total=30)) as r:
            row["health_status"] = r.status
            await r.read()
    except Exception as e:  # noqa: BLE001
        row["health_status"] = type(e).__name__
    row["health_ms"] = round((time.monotonic() - t0) * 1000, 1)
    t0 = time.monotonic()
    mt = {}
    try:
        async with sess.get(BASE + "/metrics", timeout=aiohttp.ClientTimeout(total=30)) as r:
            mt = parse_metrics(await r.text())
    except Exception as e:  # noqa: BLE001
        row["metrics_err"] = type(e).__name__
    row["metrics_ms"] = round((time.monotonic() - t0) * 1000, 1)
    row["running"] = mt.get("glmserve_running_requests")
    row["waiting"] = mt.get("glmserve_queue_depth")
    row["queued_prompt_tokens"] = mt.get("glmserve_queued_prompt_tokens")
    row["kv_usage"] = mt.get("glmserve_kv_usage")
    row["kv_free_blocks"] = mt.get("glmserve_kv_free_blocks")
    row["prefix_cache_blocks"] = mt.get("glmserve_prefix_cache_blocks")
    row["requests_total"] = sum(v for k, v in mt.items() if k.startswith("glmserve_requests_total"))
    row["refused_total"] = sum(v for k, v in mt.items() if k.startswith("glmserve_refused_requests_total"))
    row["generated_tokens"] = mt.get("glmserve_generated_tokens_total")
    row["preemptions"] = mt.get("glmserve_preemptions")
    row["_metrics"] = mt
    row["client_inflight"] = inflight
    row["client_requests"] = req_counter
    try:
        main = psutil.Process(server_pid)
        procs = [main] + main.children(recursive=True)
    except psutil.Error:
        procs = []
    rss, fds, thr = defaultdict(float), defaultdict(int), 0
    for p in procs:
        try:
            lab = proc_label(p)
            rss[lab] += p.memory_info().rss / 2**20
            fds[lab] += p.num_fds()
            thr += p.num_threads()
        except psutil.Error:
            pass
    row["nprocs"] = len(procs)
    row["rss_total_mb"] = round(sum(rss.values()), 1)
    for k in KEY_PROCS:
        row[f"rss_{k}_mb"] = round(rss.get(k, 0.0), 1)
        row[f"fds_{k}"] = fds.get(k, 0)
    row["fds_total"] = sum(fds.values())
    row["threads_total"] = thr
    row["loadavg1"] = os.getloadavg()[0]
    return row


async def health_loop(sess, server_pid, deadline, rows, writer, fh, every=60.0):
    while time.monotonic() < deadline and not stop_flag:
        row = await health_sample(sess, server_pid, "load")
        rows.append(row)
        writer.writerow({k: row.get(k) for k in HEALTH_FIELDS})
        fh.flush()
        print(f"[{row['t']:6.0f} s] health {row['health_status']} run={row['running']} wait={row['waiting']} "
              f"kv={row['kv_usage']} rss={row['rss_total_mb']:.0f}MB fds={row['fds_total']} "
              f"reqs={len(records)} anomalies={len(anomalies)} load={row['loadavg1']:.1f}", flush=True)
        try:
            await asyncio.sleep(min(every, max(0.0, deadline - time.monotonic())))
        except asyncio.CancelledError:
            return


# ---- reference outputs (before / after: the server must answer the same to the same greedy request) -----------------
REFERENCE = [
    ("/v1/completions", {"model": MODEL, "prompt": "The old man said", "max_tokens": 32, "temperature": 0}),
    ("/v1/completions", {"model": MODEL, "prompt": LONG_TEXT * 20, "max_tokens": 24, "temperature": 0}),
    ("/v1/completions", {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 32, "temperature": 0.9,
                         "seed": 1234}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}],
                              "max_tokens": 32, "temperature": 0}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
                              "tools": [WEATHER], "tool_choice": "required", "reasoning_effort": "none",
                              "max_tokens": 40, "temperature": 0}),
]


async def reference_outputs(sess) -> list:
    out = []
    for ep, body in REFERENCE:
        r = await call(sess, ep, "reference", body)
        ch = (r.json or {}).get("choices", [{}])[0] if r.status == 200 else {}
        text = ch.get("text") if "text" in ch else json.loads(json.dumps(ch.get("message")))
        for c in (text.get("tool_calls") or []) if isinstance(text, dict) else []:
            c.pop("id", None)            # a fresh call id each time
        out.append({"status": r.status, "text": text, "finish": ch.get("finish_reason")})
    return out


# ---- summary -------------------------------------------------------------------------------------------------------
def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarize(rows, bursts, ref_before, ref_after, duration, args) -> dict:
    by = defaultdict(Counter)
    lat = defaultdict(list)
    for r in records:
        key = r["endpoint"] + (" (stream)" if r["stream"] else "")
        by[key][str(r["status"])] += 1
        if r["status"] == 200 and not r["scenario"].startswith("bad:") and r["scenario"] != "timeout_abort":
            lat[key].append(r["latency"])
    lat_sum = {k: {"n": len(v), "p50": round(pct(v, .5), 3), "p99": round(pct(v, .99), 3),
                   "max": round(max(v), 3)} for k, v in lat.items() if v}
    scen = defaultdict(Counter)
    for r in records:
        scen[r["scenario"].split(":")[0]][str(r["status"])] += 1
    kinds = Counter(a["kind"] for a in anomalies)
    return {"duration_s": round(duration, 1), "clients": args.clients, "requests": len(records),
            "status_by_endpoint": {k: dict(v) for k, v in sorted(by.items())},
            "status_by_scenario": {k: dict(v) for k, v in sorted(scen.items())},
            "latency_200": lat_sum, "max_latency_any": max((r["latency"] for r in records), default=None),
            "anomaly_kinds": dict(kinds), "soft": dict(soft), "soft_examples": dict(soft_examples),
            "bursts": bursts, "reference_before": ref_before, "reference_after": ref_after,
            "reference_equal": ref_before == ref_after}


async def main_async(args):
    global stop_flag
    out = args.out
    os.makedirs(out, exist_ok=True)
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as sess:
        if args.calibrate:
            for item in bad_requests():
                res = await sc_bad(sess, item=item)
                print(f"{item[0]:34s} expect {item[3]} got {res.status}  {short(res.text, 160)}")
            print("anomalies:", json.dumps(anomalies, indent=1)[:6000])
            return
        fh = open(os.path.join(out, "health.csv"), "w", newline="")
        writer = csv.DictWriter(fh, HEALTH_FIELDS)
        writer.writeheader()
        rows = []
        base = await health_sample(sess, args.server_pid, "before")
        rows.append(base)
        writer.writerow({k: base.get(k) for k in HEALTH_FIELDS})
        ref_before = await reference_outputs(sess)
        print("reference before:", json.dumps(ref_before)[:800], flush=True)
        start = time.monotonic()
        deadline = start + args.seconds
        bursts: list = []
        tasks = [asyncio.create_task(client(sess, i, deadline)) for i in range(args.clients)]
        tasks.append(asyncio.create_task(burster(sess, deadline, args.burst_every, args.burst_size, bursts)))
        hl = asyncio.create_task(health_loop(sess, args.server_pid, deadline, rows, writer, fh, args.health_every))
        await asyncio.gather(*tasks, return_exceptions=True)
        stop_flag = True
        hl.cancel()
        duration = time.monotonic() - start
        print(f"[{now():6.0f} s] load stopped after {duration:.0f} s; {len(records)} requests; idle {args.idle} s",
              flush=True)
        await asyncio.sleep(args.idle)
        for i in range(3):
            row = await health_sample(sess, args.server_pid, f"idle{i}")
            rows.append(row)
            writer.writerow({k: row.get(k) for k in HEALTH_FIELDS})
            fh.flush()
            print(f"idle sample {i}: run={row['running']} wait={row['waiting']} kv={row['kv_usage']} "
                  f"free={row['kv_free_blocks']} prefix_blocks={row['prefix_cache_blocks']} "
                  f"rss={row['rss_total_mb']} fds={row['fds_total']}", flush=True)
            await asyncio.sleep(10)
        ref_after = await reference_outputs(sess)
        print("reference after:", json.dumps(ref_after)[:800], flush=True)
        fh.close()
        summary = summarize(rows, bursts, ref_before, ref_after, duration, args)
        summary["health_first"] = {k: v for k, v in rows[0].items() if k != "_metrics"}
        summary["health_last"] = {k: v for k, v in rows[-1].items() if k != "_metrics"}
        summary["metrics_last"] = rows[-1].get("_metrics")
        m0, m1 = rows[0].get("_metrics") or {}, rows[-1].get("_metrics") or {}
        summary["metric_counter_deltas"] = {k: m1[k] - m0.get(k, 0.0) for k in m1
                                            if k.startswith(("glmserve_requests_total", "glmserve_refused",
                                                             "glmserve_generated", "glmserve_preempt"))}
        gen_eps = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages")
        rec = [r for r in records if r["endpoint"] in gen_eps]
        summary["client_choice_counts"] = {
            "choices_200": sum(r["choices"] for r in rec if r["status"] == 200),
            "choices_disconnected": sum(r["choices"] for r in rec if r["status"] == "disconnected"),
            "choices_timeout": sum(r["choices"] for r in rec if r["status"] == "timeout"),
            "choices_429": sum(r["choices"] for r in rec if r["status"] == 429),
            "requests_other_status": Counter(str(r["status"]) for r in rec
                                             if r["status"] not in (200, "disconnected", "timeout", 429))}
        with open(os.path.join(out, "requests.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        with open(os.path.join(out, "anomalies.jsonl"), "w") as f:
            for a in anomalies:
                f.write(json.dumps(a, ensure_ascii=False) + "\n")
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, ensure_ascii=False)
        print(json.dumps({k: summary[k] for k in ("requests", "status_by_endpoint", "latency_200", "anomaly_kinds",
                                                  "soft", "bursts", "reference_equal")}, indent=1), flush=True)


def main():
    global BASE
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=900)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--server-pid", type=int, default=0)
    ap.add_argument("--base", default=BASE)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--burst-every", type=float, default=150)
    ap.add_argument("--burst-size", type=int, default=72)
    ap.add_argument("--health-every", type=float, default=60)
    ap.add_argument("--idle", type=float, default=30)
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--calibrate", action="store_true")
    args = ap.parse_args()
    BASE = args.base
    random.seed(args.seed)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
