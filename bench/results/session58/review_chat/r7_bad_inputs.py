"""Q3: bad chat inputs through the real ingress (_parse + _chat_ids): each must be a 400 naming the field (or, for
what a template can render, a prompt) — never an exception other than ApiError (a 500) nor a long stall."""
import json
import time

import _h

ing = _h.ingress()
TOOL = {"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
    "cmd": {"type": "string"}}}}}


def run(body):
    t = time.time()
    try:
        ids, err = _h.chat_ids(ing, body)
        out = ("200", len(ids)) if ids is not None else err
    except Exception as e:  # noqa: BLE001 — anything but ApiError is the server's 500
        out = ("500", f"{type(e).__name__}: {str(e)[:120]}")
    return out, time.time() - t


def expect_400(name, body, param_prefix):
    out, dt = run(body)
    ok = out[0] == 400 and str(out[1] or "").startswith(param_prefix)
    _h.check(ok, f"{name}: {out if out[0] != 200 else out} ({dt:.2f} s)")


def expect_no_500(name, body, limit_s=10.0):
    out, dt = run(body)
    _h.check(out[0] != "500" and dt < limit_s, f"{name}: {str(out)[:200]} ({dt:.2f} s)")


call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
expect_400("tool message with no tool call before it", {"messages": [
    {"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c1", "content": "out"}]}, "messages")
expect_400("tool message answering an id no call has", {"messages": [
    {"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]},
    {"role": "tool", "tool_call_id": "zzz", "content": "out"}], "tools": [TOOL]}, "messages")
expect_400("unknown role", {"messages": [{"role": "critic", "content": "x"}]}, "messages.0.role")
expect_400("message without a role", {"messages": [{"content": "x"}]}, "messages.0.role")
for args in ([1, 2], 5, "null", "[1]", "{bad", True):
    expect_400(f"tool call arguments {args!r}", {"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{**call, "function": {"name": "run", "arguments": args}}]}]},
        "messages.1.tool_calls.0.function")
expect_400("content part of type image_url", {"messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]}, "messages.0.content")
expect_400("tools item not an object", {"messages": [{"role": "user", "content": "hi"}], "tools": ["run"]}, "tools.0")
expect_400("tool parameters not an object", {"messages": [{"role": "user", "content": "hi"}], "tools": [
    {"type": "function", "function": {"name": "run", "parameters": [1]}}]}, "tools[0].function.parameters")
expect_no_500("tool parameters that are no valid JSON schema ({'type': 5, 'properties': 'x'})", {
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [{"type": "function", "function": {"name": "run", "parameters": {"type": 5, "properties": "x"}}}]})


def deep(n, leaf):
    v = leaf
    for _ in range(n):
        v = {"a": v}
    return v


for n in (200, 480, 900):
    expect_no_500(f"tool parameters nested {n} deep", {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "run", "parameters": deep(n, "x")}}]})
    expect_no_500(f"tool parameters nested {n} deep, a special token's text at the bottom", {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "run", "parameters": deep(n, "<|user|>")}}]})
    expect_no_500(f"a text part with an extra key nested {n} deep, its text holding '<|user|>'", {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "see <|user|>", "meta": deep(n, 1)}]}]})

many_tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 8,
                                                 "parameters": {"type": "object", "properties": {
                                                     "x": {"type": "string"}}}}} for i in range(10000)]
expect_no_500("10,000 tools (a 400 for the context is right)", {"messages": [{"role": "user", "content": "hi"}],
                                                               "tools": many_tools}, limit_s=30)
expect_no_500("100,000 messages", {"messages": [{"role": "user", "content": "hi"}] * 100000}, limit_s=60)
expect_no_500("20,000 tool results in a row", {"messages": [
    {"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}]
    + [{"role": "tool", "tool_call_id": "c1", "content": "x"}] * 20000}, limit_s=60)
_h.done()
