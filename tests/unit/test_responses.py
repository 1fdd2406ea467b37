"""The Responses API without a server (cluster/responses.py): a request as the chat completion it asks for, a chat
answer as a Response, and a chat stream's chunks as the typed events (over HTTP: tests/integration/test_serve.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("ray")

from cluster.protocol import ApiError  # noqa: E402
from cluster.responses import ResponseEvents, ResponsesRequest  # noqa: E402

WEATHER = {"type": "function", "name": "weather", "description": "the weather", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _req(**body) -> ResponsesRequest:
    req = ResponsesRequest.model_validate({"model": "m", "input": "hi", **body})
    req.check_supported()
    return req


def test_a_request_becomes_the_chat_it_asks_for():
    req = _req(instructions="Be terse.", max_output_tokens=40, temperature=0.5, tools=[WEATHER],
               tool_choice={"type": "function", "name": "weather"}, parallel_tool_calls=False,
               reasoning={"effort": "none"},
               input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris"},
                                                                      {"type": "input_text", "text": " weather?"}]},
                      {"type": "reasoning", "id": "rs_1", "summary": []},
                      {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Paris"}'},
                      {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": '{"city": "Nice"}'},
                      {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                      {"type": "function_call_output", "call_id": "c2", "output": {"sky": "grey"}},
                      {"role": "user", "content": "and tomorrow?"}])
    chat = req.to_chat()
    assert chat.template_messages() == [
        {"role": "system", "content": "Be terse."}, {"role": "user", "content": "Paris weather?"},
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}},
            {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": {"city": "Nice"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {"role": "tool", "content": '{"sky": "grey"}', "tool_call_id": "c2"}, {"role": "user", "content": "and tomorrow?"}]
    assert chat.max_completion_tokens == chat.max_tokens == 40 and chat.temperature == 0.5 and not chat.parallel_tool_calls
    assert chat.tools == [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
    assert chat.forced_function == "weather" and chat.template_kwargs()["enable_thinking"] is False
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = _req(text={"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": True}}).to_chat()
    assert fmt.response_format == {"type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                                            "strict": True}}
    assert _req(input="hello").to_chat().template_messages() == [{"role": "user", "content": "hello"}]
    call = {"type": "function_call", "call_id": "c", "name": "weather"}          # no arguments: {}
    parts = _req(input=[call, {"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_text", "text": "sun"}, {"type": "input_text", "text": "ny"}]}]).to_chat()
    assert parts.template_messages() == [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "weather", "arguments": {}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c"}]


def test_an_assistant_turns_items_are_one_turn_with_its_reasoning():
    """A run of reasoning, assistant message and function_call items (one turn of the model's, as a response gave
    them) is one assistant message: its reasoning kept — from the item's content, its summary, or the
    ``encrypted_content`` this server wrote — its text and its calls; a reasoning item after the answer starts
    another turn. (Session 45's QA: the reasoning was dropped and a message + call were two turns.)"""
    from cluster.responses import ResponseEvents

    sealed = ResponseEvents(_req(include=["reasoning.encrypted_content"]), "m")
    item = sealed._reasoning_done("rs_9", "I recall.")
    assert item["encrypted_content"] and item["content"][0]["text"] == "I recall."
    assert ResponseEvents(_req(), "m")._reasoning_done("rs_9", "x")["encrypted_content"] is None
    assert sealed._reasoning_done("rs_9", "", "in_progress")["encrypted_content"] is None
    call = {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Paris"}'}
    req = _req(input=[
        {"role": "user", "content": "Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Look it"}]},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": " up."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]}, call,
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "reasoning", "id": "rs_3", "summary": [], "encrypted_content": item["encrypted_content"]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
        {"type": "reasoning", "id": "rs_4", "summary": [], "encrypted_content": "gAAAA-someone-elses"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Bye."}]},
        {"role": "user", "content": "Again?"},
        {"type": "reasoning", "id": "rs_5", "summary": [], "encrypted_content": "gAAAA-opaque"},  # alone: no turn
        {"role": "user", "content": "Well?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {**call, "call_id": "c2"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
        {**call, "call_id": "c3"}])
    weather = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
    assert req.to_chat().template_messages() == [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Look it up.",
         "tool_calls": [{"id": "c1", **weather}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "I recall."},
        {"role": "assistant", "content": "Bye."}, {"role": "user", "content": "Again?"},
        {"role": "user", "content": "Well?"},
        {"role": "assistant", "content": "ab", "tool_calls": [{"id": "c2", **weather}, {"id": "c3", **weather}]}]
    with pytest.raises(ApiError) as e:
        _req(input=[{"type": "reasoning", "encrypted_content": "glmserve-reasoning:%%"}]).to_chat()
    assert e.value.param == "input[0].encrypted_content"


def test_nulls_are_the_defaults_and_a_bad_input_is_named():
    from pydantic import ValidationError

    from cluster.protocol import validation_error

    req = _req(temperature=None, top_p=None, parallel_tool_calls=None, stream=None, tool_choice=None)
    assert (req.temperature, req.top_p, req.parallel_tool_calls, req.stream) == (1.0, 1.0, True, False)
    for bad in (5, [1, 2], None):
        with pytest.raises(ValidationError) as e:
            ResponsesRequest.model_validate({"model": "m", "input": bad})
        assert validation_error(e.value).param == "input"


@pytest.mark.parametrize("body,param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"include": ["reasoning.encrypted_content", "message.output_text.logprobs"]}, "include[1]"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"max_tool_calls": 3}, "max_tool_calls"),
    ({"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "web_search_call"}]}, "input[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"tool_choice": "required"}, "tool_choice"),                    # no tools: the chat's own check
    ({"tools": [{**WEATHER, "parameters": "x"}]}, "tools[0].parameters"),
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "maximal"}}, "reasoning.effort"),
    ({"reasoning": {"summary": "bogus"}}, "reasoning.summary"),
    # named by the item and field (session 44: the input as a whole, or the chat's forms, were named)
    ({"instructions": "x", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{no"}]},
     "input[0].arguments"),
    ({"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]}, "input[0].name"),
    ({"input": [{"type": "function_call_output", "output": "sunny"}]}, "input[0].call_id"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
])
def test_what_cannot_be_served_is_a_400_naming_the_responses_field(body, param):
    with pytest.raises(ApiError) as e:
        _req(**body).to_chat()
    assert e.value.status == 400 and (e.value.param or "").startswith(param), (e.value.param, e.value.message)
    assert "messages" not in e.value.message and "json_schema.schema" not in e.value.message
    assert "'function': {" not in e.value.message, e.value.message     # the flat Responses forms


def _chunk(delta: dict | None = None, finish=None, usage=None) -> dict:
    if usage is not None:
        return {"choices": [], "usage": usage}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


_USAGE = {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12, "prompt_tokens_details": {"cached_tokens": 0},
          "completion_tokens_details": {"reasoning_tokens": 2}}


async def _feed(chunks):
    for c in chunks:
        yield c


def sse_events(converter, chunks: list[dict]) -> list[dict]:
    """The events ``converter`` (``ResponseEvents``, ``anthropic.MessageEvents``) streams for ``chunks``, each SSE
    block's ``event:`` line checked against its type."""
    async def collect():
        return [out async for out in converter.sse(_feed(chunks))]

    events = []
    for raw in asyncio.run(collect()):
        head, data = raw.split("\n")[:2]
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        events.append(event)
    return events


def _events(chunks: list[dict]) -> list[dict]:
    events = sse_events(ResponseEvents(_req(), "m"), chunks)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_a_chat_stream_becomes_the_typed_events_and_the_whole_response():
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"ci'}}
    events = _events(chunks := [_chunk({"role": "assistant", "reasoning_content": "Hm"}), _chunk({"reasoning_content": "m."}),
                      _chunk({"content": "Let me "}), _chunk({"content": "check."}), _chunk({"tool_calls": [call]}),
                      _chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]}),
                      _chunk({"tool_calls": [{**call, "index": 1, "id": "call_2", "function": {
                          "name": "weather", "arguments": '{"city": "Nice"}'}}]}, "tool_calls"),
                      _chunk(usage=_USAGE)])
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress",
                     "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                     "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
                     "response.output_item.done",
                     "response.output_item.added", "response.content_part.added", "response.output_text.delta",
                     "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                     "response.output_item.done",
                     "response.output_item.added", "response.function_call_arguments.delta",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done",
                     "response.output_item.added", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["output_tokens_details"]["reasoning_tokens"] == 2
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert final["output"][1]["content"][0]["text"] == "Let me check."
    assert [(i["call_id"], i["arguments"]) for i in final["output"][2:]] == [
        ("call_1", '{"city": "Paris"}'), ("call_2", '{"city": "Nice"}')]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1, 2, 3]
    assert [e["part"]["type"] for e in events if e["type"] == "response.content_part.done"] == \
        ["reasoning_text", "output_text"] and final["output"][0]["content"][0]["text"] == "Hmm."
    assert [e["item"] for e in events if e["type"] == "response.output_item.done"] == final["output"]
    whole = asyncio.run(ResponseEvents(_req(), "m").whole(_feed(chunks)))      # the answer not streamed: the same
    assert [{k: v for k, v in i.items() if k != "id"} for i in whole["output"]] == \
        [{k: v for k, v in i.items() if k != "id"} for i in final["output"]]
    assert whole["usage"] == final["usage"] and whole["status"] == "completed"
    responses = pytest.importorskip("openai.types.responses")
    for body in (whole, final):                 # the SDK's own types hold them (required fields, value types)
        typed = responses.Response.model_validate(body)
        assert typed.usage.input_tokens_details.cache_write_tokens == 0 and typed.output[3].call_id == "call_2"


def test_a_chunk_with_a_calls_last_piece_and_the_text_after_it_keeps_them_apart():
    """A speculative step commits several tokens: one chunk can end a call and start the text after it (from session
    40's QA pass: the text went first, closing the call with its arguments cut)."""
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "now", "arguments": '{"tz": "UTC"'}}
    events = _events([_chunk({"role": "assistant", "tool_calls": [call]}),
                      _chunk({"content": " It is noon.", "tool_calls": [{"index": 0, "function": {"arguments": "}"}}]},
                             "stop"),
                      _chunk(usage=_USAGE)])
    final = events[-1]["response"]
    assert [(i["type"], i.get("arguments"), i.get("content")) for i in final["output"]] == [
        ("function_call", '{"tz": "UTC"}', None),
        ("message", None, [{"type": "output_text", "text": " It is noon.", "annotations": [], "logprobs": []}])]


def test_the_items_an_answer_ends_in_the_middle_of_are_incomplete():
    events = _events([_chunk({"role": "assistant", "reasoning_content": "Hm"}), _chunk({"content": "Once"}, "length"),
                      _chunk(usage=_USAGE)])
    final = events[-1]["response"]
    assert [(i["type"], i["status"]) for i in final["output"]] == [("reasoning", "completed"), ("message", "incomplete")]


def test_a_stream_cut_by_max_output_tokens_is_incomplete_and_an_error_fails_it():
    events = _events([_chunk({"role": "assistant", "content": "Once"}), _chunk({"content": " upon"}, "length"),
                      _chunk(usage=_USAGE)])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    failed = _events([_chunk({"role": "assistant", "content": "Once"}),
                      {"error": {"message": "the model replica failed", "type": "server_error"}}])
    assert [e["type"] for e in failed][-2:] == ["response.output_item.done", "response.failed"]
    assert failed[-1]["response"]["error"]["message"] == "the model replica failed"


def test_an_answer_without_text_is_an_empty_message_and_the_settings_echo_as_sent():
    """No text at all (an immediate stop): one empty message item, as OpenAI's; ``text`` echoes its ``format`` (the
    default) beside ``verbosity``; ``reasoning.summary`` as sent (session 45's QA)."""
    from cluster.responses import ResponseEvents

    req = _req(text={"verbosity": "low"}, reasoning={"effort": "low", "summary": "auto"})
    whole = asyncio.run(ResponseEvents(req, "m").whole(_feed([_chunk({"role": "assistant"}, "stop"),
                                                              _chunk(usage=_USAGE)])))
    assert [(i["type"], i["content"][0]["text"], i["status"]) for i in whole["output"]] == [
        ("message", "", "completed")]
    assert whole["text"] == {"format": {"type": "text"}, "verbosity": "low"}
    assert whole["reasoning"] == {"effort": "low", "summary": "auto"}
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="metadata holds at most 16 pairs"):      # OpenAI's bounds
        _req(metadata={str(i): "v" for i in range(17)})
    with pytest.raises(ValidationError, match="metadata holds"):
        _req(metadata={"k": "v" * 513})
