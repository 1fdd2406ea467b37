"""Harness for the session-55 review 2 scripts (Anthropic Messages / OpenAI Responses over the chat stream).

Real engine events (review/_harness.py: Engine._emit over a scripted executor, or hand-built events) → the real
``Formatter.chunks`` → the real ``MessageEvents`` / ``ResponseEvents`` (``sse`` and ``whole``), checked against the
official SDKs: the ``anthropic`` package (2.17.0, installed --no-deps into ./_vendor: not in the project's venv) and the
``openai`` package of the venv, each driven through its own client over an httpx2 MockTransport that replays our SSE.

Run from the repo root:
    RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 .venv/bin/python bench/results/session55/review2/rN_x.py
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_vendor"))
sys.path.insert(0, os.path.join(HERE, "..", "review"))

import _harness as H  # noqa: E402  (the earlier review's: TOK, SP, call, enc, engine_events, events_of, hand_events)
from _harness import EOS, SP, TOK, call, enc, engine_events, events_of, hand_events  # noqa: E402,F401

import httpx2  # noqa: E402

from cluster.anthropic import MessageEvents, MessagesRequest  # noqa: E402
from cluster.formatter import Formatter  # noqa: E402
from cluster.protocol import ApiError  # noqa: E402,F401
from cluster.responses import ResponseEvents, ResponsesRequest  # noqa: E402

FAILS: list[str] = []


def check(ok: bool, what: str) -> bool:
    print(("  ok   " if ok else "  FAIL ") + what)
    if not ok:
        FAILS.append(what)
    return ok


def done() -> None:
    print(f"\n{len(FAILS)} failure(s)")
    for f in FAILS:
        print("  -", f)
    sys.exit(1 if FAILS else 0)


# ---- chat chunks from engine events --------------------------------------------------------------------------------
def chunks_of(events, thinking: bool = True, tools: bool = True, string_args=None, cached: int = 0) -> list[dict]:
    """The real Formatter's chunk stream (dicts) for ``events`` (one choice)."""
    fmt = Formatter(H._Ingress(), "c", True, [[0] * 3], None, thinking=thinking, n=1,
                    tool_ids=H.TOOL_IDS if tools else None, string_args=string_args)

    async def source(evs):
        for ev in evs:
            if cached:
                ev.num_cached_tokens = cached
            yield 0, ev

    async def run():
        return [c async for c in fmt.chunks(H._Aclose(source(copy.deepcopy(events))))]

    return asyncio.run(run())


def chat_whole(events, thinking: bool = True, tools: bool = True, string_args=None) -> dict:
    fmt = Formatter(H._Ingress(), "c", True, [[0] * 3], None, thinking=thinking, n=1,
                    tool_ids=H.TOOL_IDS if tools else None, string_args=string_args)

    async def source(evs):
        for ev in evs:
            yield 0, ev

    return asyncio.run(fmt.whole(source(copy.deepcopy(events)), 1))


async def _feed(chunks):
    for c in chunks:
        yield copy.deepcopy(c)


# ---- Anthropic -----------------------------------------------------------------------------------------------------
def anth_req(**body) -> MessagesRequest:
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 256,
                                          "messages": [{"role": "user", "content": "hi"}], **body})
    req.check_supported()
    return req


def anth_sse(chunks, req=None, clamped=False) -> str:
    conv = MessageEvents(req or anth_req(), "m", 3, clamped)

    async def run():
        return "".join([s async for s in conv.sse(_feed(chunks))])

    return asyncio.run(run())


def anth_events(chunks, req=None, clamped=False) -> list[dict]:
    out = []
    for block in anth_sse(chunks, req, clamped).split("\n\n"):
        if block.strip():
            head, data = block.split("\n", 1)
            ev = json.loads(data.removeprefix("data: "))
            assert head == f"event: {ev['type']}"
            out.append(ev)
    return out


def anth_whole(chunks, req=None, clamped=False) -> dict:
    return asyncio.run(MessageEvents(req or anth_req(), "m", 3, clamped).whole(_feed(chunks)))


def anth_grammar(events: list[dict]) -> list[str]:
    """Problems with an Anthropic event stream's grammar (empty: none)."""
    bad = []
    if not events or events[0]["type"] != "message_start":
        bad.append("first event is not message_start")
    open_idx, next_idx, state = None, 0, "start"
    for k, ev in enumerate(events[1:], 1):
        t = ev["type"]
        if t == "content_block_start":
            if open_idx is not None:
                bad.append(f"event {k}: block {ev['index']} starts while {open_idx} is open")
            if ev["index"] != next_idx:
                bad.append(f"event {k}: block index {ev['index']}, expected {next_idx}")
            open_idx, next_idx = ev["index"], ev["index"] + 1
            kind = ev["content_block"]["type"]
        elif t == "content_block_delta":
            if ev["index"] != open_idx:
                bad.append(f"event {k}: delta for {ev['index']}, open is {open_idx}")
            want = {"text": ("text_delta",), "thinking": ("thinking_delta", "signature_delta"),
                    "tool_use": ("input_json_delta",)}[kind]
            if ev["delta"]["type"] not in want:
                bad.append(f"event {k}: {ev['delta']['type']} in a {kind} block")
        elif t == "content_block_stop":
            if ev["index"] != open_idx:
                bad.append(f"event {k}: stop for {ev['index']}, open is {open_idx}")
            open_idx = None
        elif t == "message_delta":
            if open_idx is not None:
                bad.append(f"event {k}: message_delta with block {open_idx} open")
            state = "delta"
        elif t == "message_stop":
            if state != "delta":
                bad.append(f"event {k}: message_stop without message_delta")
            state = "stopped"
            if k != len(events) - 1:
                bad.append("events after message_stop")
        elif t == "error":
            state = "error"
            if k != len(events) - 1:
                bad.append("events after error")
        elif t != "ping":
            bad.append(f"event {k}: unknown type {t}")
    if state not in ("stopped", "error"):
        bad.append(f"stream ends in state {state}")
    if open_idx is not None:
        bad.append(f"block {open_idx} left open")
    return bad


def anth_sdk_final(sse_text: str, body: dict | None = None):
    """The anthropic SDK's own client reading ``sse_text`` from a mock server: ``messages.stream(...)``'s final
    message (the SDK's accumulator: ``accumulate_event``), or the exception it raised."""
    import anthropic

    def handler(request):
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=sse_text.encode())

    client = anthropic.Anthropic(api_key="x", base_url="http://test",
                                 http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))
    body = body or {"model": "m", "max_tokens": 256, "messages": [{"role": "user", "content": "hi"}]}
    try:
        with client.messages.stream(**body) as stream:
            for _ in stream:
                pass
            return stream.get_final_message()
    except Exception as e:      # noqa: BLE001
        return e


def anth_sdk_whole(body_json: dict):
    """The anthropic SDK's ``messages.create`` reading a non-streamed body."""
    import anthropic

    def handler(request):
        return httpx2.Response(200, json=body_json)

    client = anthropic.Anthropic(api_key="x", base_url="http://test",
                                 http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))
    return client.messages.create(model="m", max_tokens=256, messages=[{"role": "user", "content": "hi"}])


# ---- Responses -----------------------------------------------------------------------------------------------------
def resp_req(**body) -> ResponsesRequest:
    req = ResponsesRequest.model_validate({"model": "m", "input": "hi", **body})
    req.check_supported()
    return req


def resp_sse(chunks, req=None) -> str:
    conv = ResponseEvents(req or resp_req(), "m")

    async def run():
        return "".join([s async for s in conv.sse(_feed(chunks))])

    return asyncio.run(run())


def resp_events(chunks, req=None) -> list[dict]:
    out = []
    for block in resp_sse(chunks, req).split("\n\n"):
        if block.strip():
            head, data = block.split("\n", 1)
            ev = json.loads(data.removeprefix("data: "))
            assert head == f"event: {ev['type']}"
            out.append(ev)
    return out


def resp_whole(chunks, req=None) -> dict:
    return asyncio.run(ResponseEvents(req or resp_req(), "m").whole(_feed(chunks)))


def openai_client(handler):
    import openai

    return openai.OpenAI(api_key="x", base_url="http://test/v1",
                         http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def resp_sdk_final(sse_text: str, **body):
    """The openai SDK's ``responses.stream(...)``: (typed events, final response or the exception it raised)."""
    def handler(request):
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=sse_text.encode())

    client = openai_client(handler)
    typed = []
    try:
        with client.responses.stream(model="m", input="hi", **body) as stream:
            for ev in stream:
                typed.append(ev)
            return typed, stream.get_final_response()
    except Exception as e:      # noqa: BLE001
        return typed, e
