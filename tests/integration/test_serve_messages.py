"""Anthropic's Messages API (``/v1/messages``, Claude Code's endpoint) over HTTP on real Ray Serve, with the GLM
reasoning and tool parsers: the chat's answer as content blocks, streamed as Anthropic's events; ``count_tokens``;
errors in Anthropic's shape. An app of its own beside test_serve.py's."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.integration.test_serve import MODEL, post

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def url(serve_session, text_ckpt):
    from ray import serve

    from cluster.serve import build_app

    serve.run(build_app({"model": str(text_ckpt), "served_model_name": MODEL, "device": "cpu", "kv_cache_tokens": 4096,
                         "max_num_batched_tokens": 256, "reasoning_parser": "glm", "tool_parser": "glm"}),
              name="messages", route_prefix="/anthropic",
              logging_config={"enable_access_log": False, "log_level": "WARNING"})
    yield serve_session + "/anthropic"
    serve.delete("messages")


def _stream(url: str, body: dict) -> list[dict]:
    req = urllib.request.Request(url + "/v1/messages", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"content-type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for block in r.read().decode().split("\n\n"):
            if block.strip():
                head, data = block.split("\n")
                events.append(json.loads(data.removeprefix("data: ")))
                assert head == f"event: {events[-1]['type']}"
    return events


def test_a_message_is_the_chats_answer_whole_and_streamed(url):
    """The chat's reasoning and text as thinking and text blocks (the tiny model never closes its reasoning: thinking
    off for the text), its usage, its stop; streamed, the same blocks from Anthropic's events; count_tokens the
    prompt's tokens."""
    ask = {"model": MODEL, "max_tokens": 16, "temperature": 0, "system": "You are terse.",
           "messages": [{"role": "user", "content": "Hello there"}]}
    chat = {"model": MODEL, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there"}]}
    for thinking, field, kind in (({"thinking": {"type": "adaptive"}}, "reasoning_content",
                                   "thinking"), ({}, "content", "text")):      # Anthropic's default: no thinking
        status, msg = post(url, "/v1/messages", {**ask, **thinking})
        status_chat, ref = post(url, "/v1/chat/completions", {**chat, **(
            {} if thinking else {"reasoning_effort": "none"})})
        assert status == status_chat == 200, msg
        stop = {"length": "max_tokens", "stop": "end_turn"}[ref["choices"][0]["finish_reason"]]
        assert msg["type"] == "message" and msg["role"] == "assistant" and msg["stop_reason"] == stop
        m = ref["choices"][0]["message"]       # (stopped inside its thought, the tiny model's thought is its answer)
        kind, field = ("text", "content") if field not in m else (kind, field)
        assert [(b["type"], b[kind]) for b in msg["content"]] == [(kind, m[field])]
        assert (msg["usage"]["input_tokens"], msg["usage"]["output_tokens"]) == (
            ref["usage"]["prompt_tokens"], ref["usage"]["completion_tokens"])
        events = _stream(url, {**ask, **thinking})
        assert [e["type"] for e in events[:2]] == ["message_start", "content_block_start"]
        assert [e["type"] for e in events[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
        streamed = "".join(e["delta"].get(kind, "") for e in events if e["type"] == "content_block_delta")
        assert streamed == msg["content"][0][kind]       # (a skipped thought: its thinking block went out before)
        assert events[-2]["delta"]["stop_reason"] == stop and events[-2]["usage"] == msg["usage"]
        status, count = post(url, "/v1/messages/count_tokens", {**ask, **thinking})
        assert status == 200 and count == {"input_tokens": msg["usage"]["input_tokens"]}


def test_a_named_tool_is_a_tool_use_block_and_its_result_goes_back(url):
    """``tool_choice`` of a named tool: the answer starts with a tool_use block of it (its input an object); the next
    request sends it back with a tool_result, as Claude Code does."""
    tools = [{"name": "get_weather", "description": "the weather",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    ask = {"model": MODEL, "max_tokens": 24, "temperature": 0, "tools": tools, "thinking": {"type": "disabled"},
           "tool_choice": {"type": "tool", "name": "get_weather"},
           "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    status, msg = post(url, "/v1/messages", ask)
    assert status == 200, msg
    use = msg["content"][0]
    assert use["type"] == "tool_use" and use["name"] == "get_weather" and isinstance(use["input"], dict), msg
    events = _stream(url, ask)
    assert events[1]["content_block"] == {**use, "id": events[1]["content_block"]["id"], "input": {}}
    follow = {**ask, "tool_choice": {"type": "auto"}, "messages": [
        *ask["messages"], {"role": "assistant", "content": msg["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "sunny"}]}]}
    status, out = post(url, "/v1/messages", follow)
    prompt = lambda m: m["usage"]["input_tokens"] + m["usage"]["cache_read_input_tokens"]
    assert status == 200 and prompt(out) > prompt(msg) and out["usage"]["cache_read_input_tokens"] > 0, out


@pytest.mark.parametrize("body,status,kind", [
    ({"model": "claude-sonnet-4-5"}, 404, "not_found_error"),
    ({"max_tokens": None}, 400, "invalid_request_error"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400, "invalid_request_error"),
    ({"messages": [{"role": "user", "content": "word " * 5000}]}, 400, "invalid_request_error"),
])
def test_errors_are_anthropics(url, body, status, kind):
    ask = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], **body}
    got, err = post(url, "/v1/messages", {k: v for k, v in ask.items() if v is not None})
    assert got == status and err["type"] == "error" and err["error"]["type"] == kind, err
    assert err["error"]["message"] and "max_completion_tokens" not in err["error"]["message"]
    if "word" in json.dumps(body):
        assert err["error"]["message"].startswith("prompt is too long: "), err      # the text Claude Code reads


def test_max_tokens_past_the_context_is_cut_to_it(url):
    """Claude Code asks for max_tokens 32000 whatever the context: cut to what the prompt leaves (not a 400), an answer
    that fills the window ends model_context_window_exceeded."""
    ask = {"model": MODEL, "max_tokens": 32000, "temperature": 0,
           "messages": [{"role": "user", "content": "word " * 1500}]}
    status, msg = post(url, "/v1/messages", ask)
    assert status == 200, msg
    used = msg["usage"]["input_tokens"] + msg["usage"]["cache_read_input_tokens"] + msg["usage"]["output_tokens"]
    context = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=30).read())["data"][0]["max_model_len"]
    assert msg["stop_reason"] == "end_turn" or (msg["stop_reason"] == "model_context_window_exceeded" and
                                                used == context), (msg, context)


def test_the_anthropic_sdks_stream_helper_rebuilds_the_whole_message(url):
    """The anthropic SDK (what Claude Code is built on) reads our events with its own accumulator, no warning: a forced
    tool call, and text — its final message is the whole answer's blocks, stop and usage (session 59's agents review
    checked it by hand)."""
    import warnings

    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)
    tools = [{"name": "read_file", "description": "Read a file",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
    greedy = {"temperature": 0}         # (the SDK's own field is gone: newer Claude models take none)
    asks = [dict(model=MODEL, max_tokens=24, tools=tools, tool_choice={"type": "tool", "name": "read_file"},
                 messages=[{"role": "user", "content": "Read main.py"}], extra_body=greedy),
            dict(model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Hello there"}],
                 extra_body=greedy)]       # (thinking on, the tiny model's thought never closes: the answer)
    for ask in asks:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with client.messages.stream(**ask) as stream:
                for _ in stream:
                    pass
                got = stream.get_final_message()
        whole = client.messages.create(**ask)
        blocks = lambda m: [{k: v for k, v in b.model_dump().items() if k not in ("id", "signature")}
                            for b in m.content]
        assert blocks(got) == blocks(whole) and got.stop_reason == whole.stop_reason, (got, whole)
        assert (got.usage.input_tokens + (got.usage.cache_read_input_tokens or 0), got.usage.output_tokens) == (
            whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0), whole.usage.output_tokens)
