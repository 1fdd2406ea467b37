"""Anthropic's Messages API without a server (cluster/anthropic.py): a request as the chat completion it asks for, and
a chat stream's chunks as Anthropic's events and message (over HTTP: tests/integration/test_serve.py)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")

from cluster.anthropic import MessageEvents, MessagesRequest  # noqa: E402
from cluster.protocol import ApiError  # noqa: E402
from tests.unit.test_responses import _USAGE, _chunk, _feed, sse_events  # noqa: E402

WEATHER = {"name": "weather", "description": "the weather",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _req(**body) -> MessagesRequest:
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 64,
                                          "messages": [{"role": "user", "content": "hi"}], **body})
    req.check_supported()
    return req


def test_a_request_becomes_the_chat_it_asks_for():
    """Claude Code's shapes: system blocks, a user's text, an assistant turn's thinking + text + tool_use blocks (one
    turn), the user's tool_result blocks (tool messages) then text; tools' input_schema; tool_choice; thinking off."""
    req = _req(system=[{"type": "text", "text": "Be terse."}, {"type": "text", "text": " Use tools."}],
               tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True},
               thinking={"type": "disabled"}, stop_sequences=["END"], temperature=0.5, top_k=5, messages=[
                   {"role": "user", "content": [{"type": "text", "text": "Paris?"}]},
                   {"role": "assistant", "content": [
                       {"type": "thinking", "thinking": "Look it up.", "signature": "sig"},
                       {"type": "text", "text": "Checking."},
                       {"type": "tool_use", "id": "tu_1", "name": "weather", "input": {"city": "Paris"}}]},
                   {"role": "user", "content": [
                       {"type": "tool_result", "tool_use_id": "tu_1", "content": [{"type": "text", "text": "sunny"}]},
                       {"type": "text", "text": "And Nice?"}]}])
    chat = req.to_chat()
    assert chat.template_messages() == [
        {"role": "system", "content": "Be terse. Use tools."}, {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Look it up.", "tool_calls": [
            {"id": "tu_1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "tu_1"}, {"role": "user", "content": "And Nice?"}]
    assert chat.tools == [{"type": "function", "function": {"name": "weather", "parameters": WEATHER["input_schema"],
                                                            "description": "the weather"}}]
    assert chat.tool_choice == "required" and not chat.parallel_tool_calls and chat.stop == ["END"]
    assert chat.max_tokens == 64 and chat.temperature == 0.5 and chat.top_k == 5
    assert chat.template_kwargs()["enable_thinking"] is False
    named = _req(tools=[WEATHER], tool_choice={"type": "tool", "name": "weather"}).to_chat()
    assert named.forced_function == "weather"
    prefill = _req(messages=[{"role": "user", "content": "Say"}, {"role": "assistant", "content": "Hello"}]).to_chat()
    assert prefill.continue_final_message and not prefill.add_generation_prompt


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "r"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}]},
     "messages[0].content[0]"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"tools": [{**WEATHER, "input_schema": "x"}]}, "tools[0].input_schema"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"tool_choice": {"type": "all"}}, "tool_choice.type"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),                   # no tools: the chat's own check
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    ({"system": [{"type": "image"}]}, "system"),
])
def test_what_cannot_be_served_is_a_400_naming_the_messages_field(body, param):
    with pytest.raises(ApiError) as e:
        _req(**body).to_chat()
    assert e.value.status == 400 and (e.value.param or "").startswith(param), (e.value.param, e.value.message)
    assert "function" not in (e.value.param or "") and "max_completion_tokens" not in e.value.message
    assert "required" not in e.value.message and "'function'" not in e.value.message       # the chat's words


def _events(chunks: list[dict]) -> list[dict]:
    return sse_events(MessageEvents(_req(), "m", 3), chunks)


def test_a_chat_stream_becomes_anthropics_events_and_the_whole_message():
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"ci'}}
    chunks = [_chunk({"role": "assistant", "reasoning_content": "Hm"}), _chunk({"reasoning_content": "m."}),
              _chunk({"content": "Let me check."}), _chunk({"tool_calls": [call]}),
              _chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]}, "tool_calls"),
              _chunk(usage=_USAGE)]
    events = _events(chunks)
    assert [(e["type"], e.get("index"), (e.get("delta") or e.get("content_block") or {}).get("type")) for e in events] \
        == [("message_start", None, None),
            ("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
            ("content_block_delta", 0, "thinking_delta"), ("content_block_stop", 0, None),
            ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"),
            ("content_block_stop", 1, None),
            ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
            ("content_block_delta", 2, "input_json_delta"), ("content_block_stop", 2, None),
            ("message_delta", None, None), ("message_stop", None, None)]
    assert events[0]["message"]["usage"]["input_tokens"] == 3 and events[0]["message"]["content"] == []
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == 9
    whole = asyncio.run(MessageEvents(_req(), "m", 3).whole(_feed(chunks)))
    assert whole["content"] == [{"type": "thinking", "thinking": "Hmm.", "signature": ""},
                                {"type": "text", "text": "Let me check."},
                                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}]
    assert whole["stop_reason"] == "tool_use" and whole["usage"]["cache_read_input_tokens"] == 0
    # a client builds each block from its start event and its deltas (session 45's QA: the first piece came twice)
    for i, block in enumerate(whole["content"][:2]):
        kind = block["type"]
        start = next(e["content_block"] for e in events if e["type"] == "content_block_start" and e["index"] == i)
        assert start[kind] + "".join(e["delta"][kind] for e in events if e["type"] == "content_block_delta"
                                     and e["index"] == i) == block[kind]


@pytest.mark.parametrize("finish,stop,clamped,reason", [
    ("stop", None, False, "end_turn"), ("stop", "END", False, "stop_sequence"), ("length", None, False, "max_tokens"),
    ("length", None, True, "model_context_window_exceeded"), ("stop", None, True, "end_turn")])
def test_how_a_message_ends(finish, stop, clamped, reason):
    """The chat's finish as Anthropic's stop_reason: an answer cut where a max_tokens cut to the context left it filled
    the window; usage counts the prompt's cached tokens apart from its input_tokens, as Anthropic does."""
    last = _chunk({"content": "b"}, finish)
    last["choices"][0]["stop_reason"] = stop
    usage = {**_USAGE, "prompt_tokens_details": {"cached_tokens": 2}}
    whole = asyncio.run(MessageEvents(_req(), "m", 3, clamped).whole(_feed([_chunk({"content": "a"}), last,
                                                                            _chunk(usage=usage)])))
    assert (whole["stop_reason"], whole["stop_sequence"], whole["content"]) == (
        reason, stop, [{"type": "text", "text": "ab"}])
    assert (whole["usage"]["input_tokens"], whole["usage"]["cache_read_input_tokens"]) == (1, 2)


def test_thinking_only_where_asked():
    """Anthropic's default is no thinking: GLM's template is told so unless ``thinking`` is enabled (or adaptive); a
    forced tool with thinking on is Anthropic's 400."""
    assert _req().to_chat().template_kwargs()["enable_thinking"] is False
    for kind in ("enabled", "adaptive"):
        chat = _req(thinking={"type": kind, "budget_tokens": 1024}, max_tokens=2048).to_chat()
        assert "enable_thinking" not in chat.template_kwargs()
        assert chat.thinking_token_budget == (1024 if kind == "enabled" else None)     # enabled: the budget is held
    with pytest.raises(ApiError, match="thinking may not be enabled when tool_choice forces tool use"):
        _req(thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=2048, tools=[WEATHER],
             tool_choice={"type": "any"})


@pytest.mark.parametrize("budget,max_tokens,param", [(None, 2048, "thinking.budget_tokens"),
                                                     (1023, 2048, "thinking.budget_tokens"),
                                                     ("2000", 4096, "thinking.budget_tokens"),
                                                     (1024, 1024, "max_tokens"), (4096, 2048, "max_tokens")])
def test_an_enabled_thinking_budget_is_checked_as_anthropic_checks_it(budget, max_tokens, param):
    """``thinking: enabled`` takes a budget of at least 1024 tokens, below ``max_tokens`` (Anthropic's 400s)."""
    with pytest.raises(ApiError) as e:
        _req(thinking={"type": "enabled", **({} if budget is None else {"budget_tokens": budget})},
             max_tokens=max_tokens)
    assert e.value.param == param, e.value


def test_an_error_mid_stream_is_an_error_event_and_fails_the_whole_message():
    chunks = [_chunk({"content": "a"}), {"error": {"message": "worker group failed", "type": "server_error"}}]
    assert [e["type"] for e in _events(chunks)][-2:] == ["content_block_stop", "error"]
    with pytest.raises(ApiError, match="worker group failed"):
        asyncio.run(MessageEvents(_req(), "m", 3).whole(_feed(chunks)))


def test_a_thought_the_model_skipped_is_the_answer_alone_in_the_whole_message_and_response():
    """The chat's ``reasoning_skipped`` (``ReasoningSplit.skipped``: the output stopped inside the thought the prompt
    opened — the answer): its text went out as thinking and came once more as content; the whole Message is one text
    block, the whole Response one message item — as the chat's whole answer (streamed, both went out)."""
    from cluster.responses import ResponseEvents
    from tests.unit.test_responses import _req as responses_req

    last = _chunk({"reasoning_content": "s.", "content": "Paris is."}, "stop")
    last["choices"][0]["reasoning_skipped"] = True
    chunks = [_chunk({"role": "assistant", "reasoning_content": "Paris i"}), last, _chunk(usage=_USAGE)]
    whole = asyncio.run(MessageEvents(_req(), "m", 3).whole(_feed(chunks)))
    assert whole["content"] == [{"type": "text", "text": "Paris is."}] and whole["stop_reason"] == "end_turn"
    response = asyncio.run(ResponseEvents(responses_req(), "m").whole(_feed(chunks)))
    assert [(o["type"], o["content"][0]["text"]) for o in response["output"]] == [("message", "Paris is.")]
    assert [e["type"] for e in _events(chunks)].count("content_block_start") == 2      # streamed: thinking, then text


def test_count_tokens_takes_thinking_without_max_tokens():
    """``/v1/messages/count_tokens`` has no max_tokens: an enabled thinking budget is not held above one (it was a 400
    naming max_tokens, a field the client never sent); the budget's own floor still holds."""
    from cluster.anthropic import CountTokensRequest

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    req = CountTokensRequest.model_validate({**body, "thinking": {"type": "enabled", "budget_tokens": 2048}})
    req.check_supported()
    assert req.to_chat().thinking_token_budget == 2048
    with pytest.raises(ApiError) as e:
        CountTokensRequest.model_validate({**body, "thinking": {"type": "enabled", "budget_tokens": 10}}
                                          ).check_supported()
    assert e.value.param == "thinking.budget_tokens"


def test_a_failed_tool_runs_result_says_so():
    """``tool_result.is_error`` (Claude Code's failed or refused tool run): the chat's tool message has no field for
    it, so its text says it — the model can tell a failure from the tool's output."""
    turn = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {}}]}
    result = lambda **kw: _req(tools=[WEATHER], messages=[{"role": "user", "content": "hi"}, turn, {
        "role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", **kw}]}]
                               ).to_chat().template_messages()[-1]
    assert result(content="exit status 2", is_error=True)["content"] == "Error: exit status 2"
    assert result(content=[{"type": "text", "text": "denied"}], is_error=True)["content"] == "Error: denied"
    assert result(is_error=True)["content"] == "Error"
    assert result(content="exit status 2", is_error=False)["content"] == "exit status 2"
