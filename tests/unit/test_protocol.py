"""The HTTP edge without a server: error mapping, request validation, reasoning split."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("ray")

from cluster.engine import TokenEvent  # noqa: E402
from cluster.protocol import ChatCompletionRequest, CompletionRequest, validation_error  # noqa: E402
from cluster.serve import _admission_error, _Formatter  # noqa: E402
from scheduler.scheduler import AdmissionError  # noqa: E402


def test_queue_full_is_429_with_retry_after():
    e = _admission_error(AdmissionError("queue_full", "queue", "waiting queue is full"))
    assert e.status == 429 and e.headers == {"Retry-After": "1"} and e.body()["error"]["type"] == "rate_limit_error"
    e = _admission_error(AdmissionError("too_long", "max_tokens", "too long"))
    assert e.status == 400 and e.param == "max_tokens"


@pytest.mark.parametrize("body,param", [({"max_tokens": "x"}, "max_tokens"), ({"temperature": -1}, "temperature"),
                                        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"n": 0}, "n")])
def test_validation_errors_name_the_field(body, param):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"model": "m", "prompt": "p", **body})
    assert validation_error(e.value).param == param


def test_image_part_rejected_naming_the_part():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({"model": "m", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]}]})
    err = validation_error(e.value)
    assert err.param == "messages.0.content" and "image_url" in err.message


class _FakeIngress:
    model_name, tokenizer, think_end = "m", None, 22


async def _events(evs):
    for i, ev in enumerate(evs):
        yield 0, ev


def test_reasoning_split_whole_and_stream():
    evs = [TokenEvent("r", [100], "Let me think."), TokenEvent("r", [22], ""),
           TokenEvent("r", [101], "Answer.", finished=True, finish_reason="stop")]
    fmt = _Formatter(_FakeIngress(), "chatcmpl-1", True, 5, None, thinking=True)
    body = asyncio.run(fmt.whole(_events(evs), 1))
    msg = body["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": "Answer.", "reasoning_content": "Let me think."}

    async def collect():
        return [c async for c in _Formatter(_FakeIngress(), "c", True, 5, None, thinking=True).sse(_events(evs), False)]

    chunks = asyncio.run(collect())
    assert '"reasoning_content": "Let me think."' in chunks[0] and '"content": "Answer."' in chunks[2]
    assert chunks[-1] == "data: [DONE]\n\n"


def _tool_events():
    from cluster.config import DEFAULT_MODEL
    from models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEFAULT_MODEL)
    sp = tok.special_ids_by_token()
    ids = tok.encode("Let me check.") + [sp["<tool_call>"]] + tok.encode("get_weather")
    for k, v in (("city", "Paris"), ("days", "3")):
        ids += [sp["<arg_key>"]] + tok.encode(k) + [sp["</arg_key>"], sp["<arg_value>"]] + tok.encode(v) + \
            [sp["</arg_value>"]]
    ids += [sp["</tool_call>"]]
    evs = [TokenEvent("r", [t], tok.decode([t])) for t in ids]
    evs[-1].finished, evs[-1].finish_reason = True, "stop"
    names = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
    ingress = type("I", (), {"model_name": "m", "tokenizer": tok, "think_end": sp["</think>"]})()
    return evs, ingress, {n: sp[n] for n in names}


def test_glm_tool_calls_whole_and_stream():
    evs, ingress, tool_ids = _tool_events()
    body = asyncio.run(_Formatter(ingress, "c", True, 5, None, tool_ids=tool_ids).whole(_events(evs), 1))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me check."
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3}

    async def collect():
        return [c async for c in _Formatter(ingress, "c", True, 5, None, tool_ids=tool_ids).sse(_events(evs), False)]

    chunks = [json.loads(c[6:]) for c in asyncio.run(collect())[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert content == "Let me check." and len(calls) == 1 and calls[0]["function"]["name"] == "get_weather"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_admission_error_across_ray_is_the_plain_message():
    """Across Ray an AdmissionError arrives as RayTaskError(AdmissionError), whose str() is the remote traceback."""
    from ray.exceptions import RayTaskError

    from cluster.serve import _cause

    for cause, status in ((AdmissionError("empty_prompt", "prompt", "prompt must hold at least one token"), 400),
                          (AdmissionError("queue_full", "queue", "waiting queue is full"), 429)):
        remote = RayTaskError("generate", "Traceback (most recent call last):\n  File \"x.py\"\n" + str(cause),
                              cause).as_instanceof_cause()
        assert isinstance(remote, AdmissionError) and str(remote) != str(cause) and "pid=" in str(remote)
        e = _admission_error(_cause(remote))
        assert (e.status, e.message, e.param) == (status, str(cause), None if status == 429 else "prompt")


_TOOL_TURNS = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                   "name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


def test_tool_call_arguments_json_string_is_parsed():
    """OpenAI clients send tool call arguments back as a JSON string; the template renders a mapping."""
    from cluster.config import DEFAULT_MODEL
    from models.tokenizer import Tokenizer

    msgs = ChatCompletionRequest.model_validate({"model": "m", "messages": _TOOL_TURNS}).template_messages()
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}
    prompt = Tokenizer.from_dir(DEFAULT_MODEL).apply_chat_template(msgs)
    assert "<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3" in prompt


@pytest.mark.parametrize("function,field", [({"name": "f", "arguments": "{not json"}, "arguments"),
                                            ({"name": "f", "arguments": "[1, 2]"}, "arguments"),
                                            ({"name": "f", "arguments": [1, 2]}, "arguments"),
                                            ({"name": 5, "arguments": {}}, "name")])
def test_bad_tool_call_names_the_field(function, field):
    from pydantic import ValidationError

    turns = [_TOOL_TURNS[0], {"role": "assistant", "tool_calls": [{"type": "function", "function": function}]}]
    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({"model": "m", "messages": turns})
    assert validation_error(e.value).param == f"messages.1.tool_calls.0.function.{field}"


@pytest.mark.parametrize("kwargs", [{"add_generation_prompt": False}, {"messages": 5}])
def test_chat_template_kwargs_cannot_set_the_templates_own_arguments(kwargs):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                              "chat_template_kwargs": kwargs})
    err = validation_error(e.value)
    assert err.param == "chat_template_kwargs" and next(iter(kwargs)) in err.message


def test_null_optional_fields_mean_the_default():
    nulls = dict.fromkeys(("temperature", "top_p", "n", "presence_penalty", "frequency_penalty", "stream", "top_k",
                           "min_p", "repetition_penalty", "ignore_eos", "seed", "stop", "max_tokens"))
    for model, extra in ((CompletionRequest, {"prompt": "p", "echo": None, "logprobs": None}),
                         (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], "logprobs": None,
                                                  "top_logprobs": None, "tools": None})):
        body = model.model_validate({"model": "m", **nulls, **extra})
        assert body == model.model_validate({"model": "m", **{k: v for k, v in extra.items() if v is not None}})
    from pydantic import ValidationError

    with pytest.raises(ValidationError):       # a required field stays required
        CompletionRequest.model_validate({"model": "m", "prompt": None})


def test_nan_temperature_is_not_a_finite_number():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"model": "m", "prompt": "p", "temperature": float("nan")})
    err = validation_error(e.value)
    assert err.param == "temperature" and "finite number" in err.message


def test_chat_logprob_bytes_are_the_tokens_own_bytes():
    """A byte-level token holding part of a UTF-8 character decodes to U+FFFD; its bytes must be its own."""
    from cluster.config import DEFAULT_MODEL
    from models.tokenizer import Tokenizer
    from workers.runner import TokenLogprobs

    tok = Tokenizer.from_dir(DEFAULT_MODEL)
    ids = tok.encode("日本語")
    assert any(tok.decode([t]) == "\ufffd" for t in ids), "the text must split a multibyte char"
    evs = [TokenEvent("r", [t], "", logprobs=[TokenLogprobs(-0.5, ((t, -0.5),))]) for t in ids]
    evs[-1].text, evs[-1].finished, evs[-1].finish_reason = "日本語", True, "length"
    ingress = type("I", (), {"model_name": "m", "tokenizer": tok, "think_end": None})()
    body = asyncio.run(_Formatter(ingress, "c", True, 3, 1).whole(_events(evs), 1))
    content = body["choices"][0]["logprobs"]["content"]
    assert bytes(b for c in content for b in c["bytes"]).decode() == "日本語"
    assert bytes(b for c in content for b in c["top_logprobs"][0]["bytes"]).decode() == "日本語"
