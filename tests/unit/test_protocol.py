"""The HTTP edge without a server: error mapping, request validation, reasoning split."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("ray")

from cluster.engine import TokenEvent  # noqa: E402
from cluster.formatter import Formatter  # noqa: E402
from cluster.parsers import TOOL_MARKERS
from cluster.protocol import ApiError, ChatCompletionRequest, CompletionRequest, validation_error  # noqa: E402
from cluster.serve import _admission_error  # noqa: E402
from scheduler.scheduler import AdmissionError  # noqa: E402
from tests.conftest import streamed_calls


def test_queue_full_is_429_with_retry_after():
    e = _admission_error(AdmissionError("queue_full", "queue", "waiting queue is full"))
    assert e.status == 429 and e.headers == {"Retry-After": "1"} and e.body()["error"]["type"] == "rate_limit_error"
    e = _admission_error(AdmissionError("too_long", "max_tokens", "too long"))
    assert e.status == 400 and e.param == "max_tokens"


@pytest.mark.parametrize("body,param", [({"max_tokens": "x"}, "max_tokens"), ({"temperature": -1}, "temperature"),
                                        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"n": 0}, "n"),
                                        ({"max_tokens": "5"}, "max_tokens"), ({"max_tokens": 5.0}, "max_tokens"),
                                        ({"n": True}, "n"), ({"temperature": "0.5"}, "temperature"),
                                        ({"prompt": [True, False]}, "prompt"), ({"prompt": [1.0, 2.0]}, "prompt"),
                                        ({"prompt": [1, "a"]}, "prompt"), ({"prompt": 5}, "prompt"),
                                        ({"seed": 2**64}, "seed"), ({"seed": -2**63 - 1}, "seed"),   # int64's
                                        ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage")])
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
    fmt = Formatter(_FakeIngress(), "chatcmpl-1", True, [[0] * 5], None, thinking=True)
    body = asyncio.run(fmt.whole(_events(evs), 1))
    msg = body["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": "Answer.", "reasoning_content": "Let me think."}

    async def collect():
        fmt = Formatter(_FakeIngress(), "c", True, [[0] * 5], None, thinking=True)
        return [c async for c in fmt.sse(_events(evs), False)]

    chunks = asyncio.run(collect())
    # the </think> token says nothing: no chunk of its own (an empty delta only where logprobs ride on it)
    assert '"reasoning_content": "Let me think."' in chunks[0] and '"content": "Answer."' in chunks[1]
    assert chunks[-1] == "data: [DONE]\n\n" and len(chunks) == 3


def _tool_events(args=(("city", "Paris"), ("days", "3")), close: bool = True, after: str = ""):
    """'Let me check.' then a get_weather call (closed or cut off) and ``after``, one token per event; the last one
    finishes."""
    from cluster.config import DEFAULT_MODEL
    from models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEFAULT_MODEL)
    sp = tok.special_ids_by_token()
    ids = tok.encode("Let me check.") + [sp["<tool_call>"]] + tok.encode("get_weather")
    for k, v in args:
        ids += [sp["<arg_key>"]] + tok.encode(k) + [sp["</arg_key>"], sp["<arg_value>"]] + tok.encode(v) + \
            [sp["</arg_value>"]]
    ids += ([sp["</tool_call>"]] if close else []) + tok.encode(after)
    evs = [TokenEvent("r", [t], tok.decode([t])) for t in ids]
    evs[-1].finished, evs[-1].finish_reason = True, "stop" if close else "length"
    ingress = type("I", (), {"model_name": "m", "tokenizer": tok, "think_end": sp["</think>"]})()
    return evs, ingress, {n: sp[n] for n in TOOL_MARKERS}


def _whole_calls(choice: dict) -> list[dict]:
    return [{k: c["function"][k] for k in ("name", "arguments")} for c in choice["message"].get("tool_calls", [])]


def test_glm_tool_calls_whole_and_stream():
    """Whole: the call in ``tool_calls``, the text beside it ``content``. Streamed: the call's name at its first
    argument, its arguments in pieces — a string value as its text comes (here city, typed a string) — that join to
    the whole response's."""
    evs, ingress, tool_ids = _tool_events(after=" Done.")
    choice, chunks = _whole_and_stream(evs, ingress, tool_ids, {"get_weather": {"city"}})
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me check. Done."
    assert _whole_calls(choice) == [{"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}]
    assert "".join(c["delta"].get("content") or "" for c in chunks) == "Let me check. Done."
    assert streamed_calls(chunks) == _whole_calls(choice) and chunks[-1]["finish_reason"] == "tool_calls"
    pieces = [d["function"]["arguments"] for c in chunks for d in c["delta"].get("tool_calls", [])]
    assert len(pieces) > 4 and '{"city": "' in pieces, pieces      # the header, then the value's text as it came
    assert not any("content" in c["delta"] for c in chunks if "tool_calls" in c["delta"])   # a call's delta: no text


def test_whitespace_after_the_calls_is_no_content():
    """The newline a model writes after its calls is not content (null, not "\n"), whole or streamed; text after it
    is, the newline with it."""
    for after, content in (("\n", None), ("\n\n", None), ("\nDone.", "Let me check.\nDone.")):
        evs, ingress, tool_ids = _tool_events(after=after)
        choice, chunks = _whole_and_stream(evs, ingress, tool_ids, {"get_weather": {"city"}})
        want = content if content is not None else "Let me check."
        assert choice["message"]["content"] == want and choice["finish_reason"] == "tool_calls", (after, choice)
        assert "".join(c["delta"].get("content") or "" for c in chunks) == want


def test_untyped_string_enums_and_consts_are_read_as_text():
    """An argument whose schema is an enum or const of strings (no "type") is written raw by GLM's template, as a
    string-typed one is: its value stays text ("2", not 2)."""
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"enum": ["1", "2"]}, "days": {"const": "3"}, "n": {"enum": [1, 2]},
            "m": {"type": ["string", "null"]}}}}}]})
    assert req.string_arguments == {"get_weather": {"city", "days", "m"}}
    evs, ingress, tool_ids = _tool_events(args=(("city", "2"), ("days", "3"), ("n", "2")))
    choice, _ = _whole_and_stream(evs, ingress, tool_ids, req.string_arguments)
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "2", "days": "3", "n": 2}


@pytest.mark.parametrize("tool,param", [
    ({"type": "function"}, "tools[0]"),
    ({"type": "function", "function": "f"}, "tools[0]"),
    ({"type": "web_search", "function": {"name": "f"}}, "tools[0]"),
    ({"type": "function", "function": {"name": ""}}, "tools[0]"),
    ({"type": "function", "function": {"name": "f", "strict": "true"}}, "tools[0].function.strict"),
    ({"type": "function", "function": {"name": "f", "parameters": "x"}}, "tools[0].function.parameters"),
])
def test_a_malformed_tool_is_a_400_naming_it(tool, param):
    from cluster.protocol import ApiError

    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                "tools": [tool], "tool_choice": "required"})
    with pytest.raises(ApiError) as e:
        req.check_supported()
    assert (e.value.status, e.value.param) == (400, param), e.value.message


def test_the_openai_clients_stream_helper_rebuilds_the_call():
    """The openai package's own accumulator (what ``client.chat.completions.stream`` runs) turns our chunks into the
    message the whole response holds."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    evs, ingress, tool_ids = _tool_events(after=" Done.")
    fmt = lambda: Formatter(ingress, "c", True, [[0] * 5], None, tool_ids=tool_ids,
                            string_args={"get_weather": {"city"}})
    whole = asyncio.run(fmt().whole(_events(evs), 1))["choices"][0]["message"]

    async def collect():
        return [c async for c in fmt().sse(_events(evs), False)]

    state = ChatCompletionStreamState()
    for c in asyncio.run(collect())[:-1]:
        state.handle_chunk(ChatCompletionChunk.model_validate_json(c[6:]))
    final = state.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and final.message.content == whole["content"]
    (call,) = final.message.tool_calls
    assert (call.function.name, call.function.arguments) == \
        ("get_weather", whole["tool_calls"][0]["function"]["arguments"])


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


def test_reasoning_effort_reaches_the_chat_template():
    """none / minimal turn thinking off; the others are the template's reasoning_effort; the client's own template
    arguments win; another value is a 400 naming the field; the tiny template renders each (it ignores the effort)."""
    from pydantic import ValidationError

    from cluster.config import DEFAULT_MODEL
    from models.tokenizer import Tokenizer

    def chat(**body):
        return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                     **body})
    assert chat().template_kwargs() == {}
    assert chat(reasoning_effort="minimal").template_kwargs() == {"enable_thinking": False}
    assert chat(reasoning_effort="max").template_kwargs() == {"reasoning_effort": "max"}
    assert chat(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True}).template_kwargs() == \
        {"enable_thinking": True}
    with pytest.raises(ValidationError) as e:
        chat(reasoning_effort="extreme")
    assert validation_error(e.value).param == "reasoning_effort"
    tok = Tokenizer.from_dir(DEFAULT_MODEL)
    off, high, plain = (tok.apply_chat_template(chat(**b).template_messages(), **chat(**b).template_kwargs())
                        for b in ({"reasoning_effort": "none"}, {"reasoning_effort": "high"}, {}))
    assert off.endswith("</think>") and high == plain and not plain.endswith("</think>")


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
    body = asyncio.run(Formatter(ingress, "c", True, [[0] * 3], 1).whole(_events(evs), 1))
    content = body["choices"][0]["logprobs"]["content"]
    assert bytes(b for c in content for b in c["bytes"]).decode() == "日本語"
    assert bytes(b for c in content for b in c["top_logprobs"][0]["bytes"]).decode() == "日本語"


def _tok():
    from cluster.config import DEFAULT_MODEL
    from models.tokenizer import Tokenizer

    return Tokenizer.from_dir(DEFAULT_MODEL)


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing():
    from cluster.protocol import ApiError
    from cluster.serve import _encode

    class Untouchable:
        def encode(self, text):
            raise AssertionError("tokenized a prompt that cannot fit")

    with pytest.raises(ApiError) as e:
        asyncio.run(_encode(Untouchable(), "x" * 101, 100, "prompt"))
    assert (e.value.status, e.value.param) == (400, "prompt") and "101 characters" in e.value.message


@pytest.mark.parametrize("text", ["a\ud800b", "\udc00"])
def test_a_lone_surrogate_is_a_400_naming_the_field(text):
    """JSON's "\\ud800" escape parses to a lone surrogate, which the tokenizer refused with a TypeError (a 500)."""
    from cluster.protocol import ApiError
    from cluster.serve import _encode

    with pytest.raises(ApiError) as e:
        asyncio.run(_encode(_tok(), text, 1000, "messages"))
    assert (e.value.status, e.value.param) == (400, "messages") and "surrogate" in e.value.message
    assert asyncio.run(_encode(_tok(), "a\u00e9b", 1000, "prompt"))       # other text still tokenizes


def test_json_nested_too_deeply_is_a_400():
    """Python's JSON parser raises RecursionError (not a JSONDecodeError) past ~1000 levels: it was a 500."""
    import types

    from cluster.protocol import ApiError
    from cluster.serve import OpenAIIngress

    async def body():
        return b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

    with pytest.raises(ApiError) as e:
        asyncio.run(OpenAIIngress._parse(types.SimpleNamespace(draining=False), types.SimpleNamespace(body=body),
                                         CompletionRequest))
    assert e.value.status == 400 and "nested too deeply" in e.value.message


def test_a_context_overflow_names_max_completion_tokens_when_the_client_sent_it():
    from cluster.protocol import ApiError
    from cluster.serve import _check_context

    for field in ("max_tokens", "max_completion_tokens"):
        body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                     field: 100})
        body.max_tokens = body.max_completion_tokens or body.max_tokens     # as chat_completions does
        with pytest.raises(ApiError) as e:
            _check_context(body, [1] * 8, 100, chat=True, context=64)
        assert (e.value.status, e.value.param) == (400, field) and f"{field} (100)" in e.value.message


def test_tokenizing_leaves_the_event_loop_running():
    """/health and every open stream share the ingress's event loop: a long prompt is tokenized beside it."""
    from cluster.serve import _encode

    tok, text = _tok(), "a " * 200_000
    ticks = 0

    async def main():
        nonlocal ticks
        task = asyncio.create_task(_encode(tok, text, len(text), "prompt"))
        while not task.done():
            await asyncio.sleep(0.001)
            ticks += 1
        return await task

    assert len(asyncio.run(main())) > 100_000
    assert ticks >= 10, f"the event loop ran {ticks} times while the prompt was tokenized"


def test_a_burst_of_huge_prompts_does_not_hold_up_a_short_one():
    """Huge prompts tokenize in a pool of their own: 40 of them (each 0.1 s here) arriving first leave a short
    prompt's tokenizing free to start at once (from the shared pool it would wait for the 40)."""
    import time

    from cluster.serve import LARGE_TEXT, _encode

    done = []

    class Slow:
        def encode(self, text):
            if len(text) > LARGE_TEXT:
                time.sleep(0.1)
            done.append(len(text))
            return [1]

    async def main():
        huge = [asyncio.create_task(_encode(Slow(), "x" * (LARGE_TEXT + 1), 1 << 30, "prompt")) for _ in range(40)]
        await asyncio.sleep(0.01)                       # they are in their pool first
        await _encode(Slow(), "short", 1 << 30, "prompt")
        await asyncio.gather(*huge)

    asyncio.run(main())
    assert done.index(5) < 5, f"the short prompt was tokenized after {done.index(5)} huge ones"


@pytest.mark.parametrize("model,body,param", [
    (CompletionRequest, {"suffix": "end"}, "suffix"),
    (CompletionRequest, {"best_of": 3}, "best_of"),
    (CompletionRequest, {"best_of": 2, "n": 3}, "best_of"),
])
def test_unsupported_values_are_refused_naming_the_field(model, body, param):
    from cluster.protocol import ApiError

    prompt = {"prompt": "p"} if model is CompletionRequest else {"messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ApiError) as e:
        model.model_validate({"model": "m", **prompt, **body}).check_supported()
    assert (e.value.status, e.value.param) == (400, param) and "not supported" in e.value.message


@pytest.mark.parametrize("bias,words", [({"x5": 10}, "token ids"), ({"-5": 10}, "token ids"), ({" 5": 1}, "token ids"),
                                        ({"5": 101}, "[-100, 100]"), ({"5": -100.5}, "[-100, 100]"),
                                        ({str(i): 1 for i in range(301)}, "at most 300")])
def test_a_bad_logit_bias_is_refused_naming_the_field(bias, words):
    from cluster.protocol import ApiError

    for model, prompt in ((CompletionRequest, {"prompt": "p"}),
                          (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}]})):
        with pytest.raises(ApiError) as e:
            model.model_validate({"model": "m", **prompt, "logit_bias": bias}).check_supported()
        assert (e.value.status, e.value.param) == (400, "logit_bias") and words in e.value.message
    ok = CompletionRequest.model_validate({"model": "m", "prompt": "p", "logit_bias": {"5": -100, "7": 2.5}})
    ok.check_supported()
    assert ok.sampling_params(4, None).logit_bias == ((5, -100.0), (7, 2.5))


@pytest.mark.parametrize("response_format,message", [
    ({"type": "json"}, "response_format.type must be 'text', 'json_object' or 'json_schema', not 'json'"),
    ({"type": "json_schema"}, "response_format.json_schema.schema must be a JSON schema object"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}, "must be a JSON schema object"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "objectx"}}}, 'Unsupported type "objectx"'),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": 5}}},
     "properties must be an object"),
])
def test_a_response_format_that_cannot_be_followed_is_refused(response_format, message):
    """Structured output: a 400 naming response_format, with the schema converter's reason."""
    from cluster.protocol import ApiError

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": response_format}
    with pytest.raises(ApiError) as e:
        ChatCompletionRequest.model_validate(body).check_supported()
    assert (e.value.status, e.value.param) == (400, "response_format") and message in e.value.message, e.value.message
    with pytest.raises(ApiError) as e:                  # and with ignore_eos, which a completed schema cannot honour
        ChatCompletionRequest.model_validate({**body, "response_format": {"type": "json_object"},
                                              "ignore_eos": True}).check_supported()
    assert e.value.param == "ignore_eos"


def test_response_format_becomes_the_json_schema_of_the_sampling_params():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for fmt, want in ((None, None), ({"type": "text"}, None), ({"type": "json_object"}, {"type": "object"}),
                      ({"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}, schema)):
        req = CompletionRequest.model_validate({"model": "m", "prompt": "p", "response_format": fmt})
        req.check_supported()
        got = req.sampling_params(8, None).json_schema
        assert (got if got is None else json.loads(got)) == want


@pytest.mark.parametrize("model,body", [
    (CompletionRequest, {"logit_bias": {}, "suffix": None, "best_of": 1, "echo": True, "response_format": None}),
    (CompletionRequest, {"logit_bias": None, "suffix": "", "best_of": 2, "n": 2, "response_format": {"type": "text"}}),
    (ChatCompletionRequest, {"logit_bias": {}, "tool_choice": "auto", "response_format": {"type": "text"}}),
    (ChatCompletionRequest, {"tool_choice": "none"}),
    (ChatCompletionRequest, {"tool_choice": None, "logit_bias": None}),
])
def test_default_values_of_unsupported_fields_pass(model, body):
    prompt = {"prompt": "p"} if model is CompletionRequest else {"messages": [{"role": "user", "content": "hi"}]}
    model.model_validate({"model": "m", **prompt, **body}).check_supported()


@pytest.mark.parametrize("body,message", [
    ({"tool_choice": "required"}, "needs tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "needs tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "g"}}, "tools": [
        {"type": "function", "function": {"name": "f"}}]}, "one of ['f']"),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f"}}],
      "response_format": {"type": "json_object"}}, "cannot be combined with response_format"),
])
def test_a_tool_choice_that_cannot_be_honoured_is_refused(body, message):
    from cluster.protocol import ApiError

    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})
    with pytest.raises(ApiError) as e:
        req.check_supported()
    assert (e.value.status, e.value.param) == (400, "tool_choice") and message in e.value.message, e.value.message


def test_tool_choice_required_or_named_passes_with_its_tools():
    tools = [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g"}}]
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    for choice, name in (("required", None), ({"type": "function", "function": {"name": "g"}}, "g")):
        req = ChatCompletionRequest.model_validate({**base, "tool_choice": choice})
        req.check_supported()
        assert req.forced_function == name and req.parses_tool_calls


def test_tool_choice_none_parses_no_tool_calls():
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert ChatCompletionRequest.model_validate(chat).parses_tool_calls
    assert ChatCompletionRequest.model_validate({**chat, "tool_choice": "auto"}).parses_tool_calls
    assert not ChatCompletionRequest.model_validate({**chat, "tool_choice": "none"}).parses_tool_calls


def _whole_and_stream(evs, ingress, tool_ids, string_args=None) -> tuple[dict, list[dict]]:
    fmt = lambda: Formatter(ingress, "c", True, [[0] * 5], None, tool_ids=tool_ids, string_args=string_args)
    body = asyncio.run(fmt().whole(_events(evs), 1))

    async def collect():
        return [c async for c in fmt().sse(_events(evs), False)]

    return body["choices"][0], [json.loads(c[6:])["choices"][0] for c in asyncio.run(collect())[:-1]]


def test_tool_call_arguments_are_valid_json_for_nan_and_infinity():
    evs, ingress, tool_ids = _tool_events([("x", "NaN"), ("y", "-Infinity"), ("z", "1e999"), ("days", "3")])
    choice, _ = _whole_and_stream(evs, ingress, tool_ids)
    args = choice["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(args, parse_constant=lambda c: pytest.fail(f"{c} in {args}")) == \
        {"x": "NaN", "y": "-Infinity", "z": "1e999", "days": 3}


def test_string_typed_arguments_stay_text():
    """GLM's template writes a string argument raw ("12345", "true") and others as JSON: the tool's schema says which
    values to parse back. Without a schema for the argument (or the tool) a value is JSON where it parses."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "zip": {"type": "string"}, "days": {"type": "integer"}, "flag": {"type": ["string", "null"]},
        "either": {"type": ["string", "integer"]}}}}},
             {"type": "function", "function": {"name": "no_schema"}}]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    strings = ChatCompletionRequest.model_validate(body).string_arguments
    assert strings == {"get_weather": {"zip", "flag"}}
    values = [("zip", "12345"), ("days", "3"), ("flag", "true"), ("either", "7"), ("other", "[1, 2]")]
    evs, ingress, tool_ids = _tool_events(values)
    whole, chunks = _whole_and_stream(evs, ingress, tool_ids, strings)
    assert streamed_calls(chunks) == _whole_calls(whole)
    assert json.loads(_whole_calls(whole)[0]["arguments"]) == \
        {"zip": "12345", "days": 3, "flag": "true", "either": 7, "other": [1, 2]}
    (call,) = _whole_and_stream(evs, ingress, tool_ids)[0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"])["zip"] == 12345          # no schema: JSON where it parses


@pytest.mark.parametrize("cut", ["after-value", "in-string", "in-number", "in-name"])
def test_a_call_cut_by_max_tokens(cut):
    """The output's end (finish_reason length) cuts a call: it ends there, its last value as far as it got — whole
    and streamed alike, valid JSON; cut before its name was complete, it is content as the model wrote it."""
    evs, ingress, tool_ids = _tool_events([("city", "Paris"), ("days", "314159")], close=False)
    sp = tool_ids
    value_end = [i for i, e in enumerate(evs) if e.token_ids == [sp["</arg_value>"]]]
    name_end = next(i for i, e in enumerate(evs) if e.token_ids == [sp["<arg_key>"]])
    last = {"after-value": len(evs) - 1, "in-string": value_end[0] - 2, "in-number": value_end[1] - 2,
            "in-name": name_end - 2}[cut]
    evs = evs[:last + 1]
    evs[-1].finished, evs[-1].finish_reason = True, "length"
    choice, chunks = _whole_and_stream(evs, ingress, tool_ids, {"get_weather": {"city"}})
    assert choice["finish_reason"] == chunks[-1]["finish_reason"] == "length"
    assert "".join(c["delta"].get("content") or "" for c in chunks) == (choice["message"]["content"] or "")
    assert streamed_calls(chunks) == _whole_calls(choice)
    if cut == "in-name":
        assert choice["message"]["content"].startswith("Let me check.<tool_call>get_")
        assert "tool_calls" not in choice["message"]
        return
    (call,) = _whole_calls(choice)
    args = json.loads(call["arguments"])
    assert call["name"] == "get_weather" and choice["message"]["content"] == "Let me check."
    cut_short = lambda v, whole: str(v) and whole.startswith(str(v)) and str(v) != whole
    assert {"after-value": args == {"city": "Paris", "days": 314159},
            "in-number": args["city"] == "Paris" and type(args["days"]) is int and cut_short(args["days"], "314159"),
            "in-string": list(args) == ["city"] and cut_short(args["city"], "Paris")}[cut], args


def _completion_events(tok, text: str) -> list:
    from workers.runner import TokenLogprobs

    evs = [TokenEvent("r", [t], "", logprobs=[TokenLogprobs(-0.5, ((t, -0.5),))]) for t in tok.encode(text)]
    shown = 0                       # the detokenizer's text: a partial UTF-8 character shows once it completes
    for j, ev in enumerate(evs):
        now = tok.decode(tok.encode(text)[: j + 1])
        now = now[: len(now) - 1] if now.endswith("\ufffd") else now
        ev.text, shown = now[shown:], len(now)
    evs[-1].finished, evs[-1].finish_reason = True, "length"
    return evs


def test_completion_text_offset_is_each_tokens_place_in_the_text():
    tok = _tok()
    ingress = type("I", (), {"model_name": "m", "tokenizer": tok, "think_end": None})()
    text = "Hello 日本 world"
    evs = _completion_events(tok, text)
    lp = asyncio.run(Formatter(ingress, "c", False, [[0] * 3], 1).whole(_events(evs), 1))["choices"][0]["logprobs"]
    ids = tok.encode(text)          # each token at the characters its bytes before it complete (日 in 3: all at 日)
    assert lp["text_offset"] == [len(b"".join(map(tok.token_bytes, ids[:j])).decode(errors="ignore")) for j in
                                 range(len(ids))] and lp["text_offset"][-1] == text.index(" world")
    for token, t, at in zip(lp["tokens"], ids, lp["text_offset"]):    # a piece of a character by its bytes (OpenAI)
        assert text[at:].startswith(token) or token == "bytes:" + "".join(f"\\x{b:02x}" for b in tok.token_bytes(t))


def test_echo_puts_the_prompt_before_the_completion():
    evs = [TokenEvent("r", [7], " there"), TokenEvent("r", [8], "!", finished=True, finish_reason="length")]
    fmt = Formatter(_FakeIngress(), "c", False, [[0] * 1], None, n=1, echoes=["Hello"])
    assert asyncio.run(fmt.whole(_events(evs), 1))["choices"][0]["text"] == "Hello there!"

    async def collect():
        fmt = Formatter(_FakeIngress(), "c", False, [[0] * 1], None, echoes=["Hello"])
        return [c async for c in fmt.sse(_events(evs), False)]

    chunks = [json.loads(c[6:])["choices"][0]["text"] for c in asyncio.run(collect())[:-1]]
    assert chunks == ["Hello there", "!"]


@pytest.mark.parametrize("reasoning,tools,breaks", [(False, False, ()), (True, False, ("</think>",)),
                                                    (True, True, ("</think>", *TOOL_MARKERS)),
                                                    (False, True, TOOL_MARKERS)])
def test_the_parsers_markers_reach_the_engine_as_text_breaks(reasoning, tools, breaks):
    """The engine keeps the text held back for a stop string on its side of a marker only where the front end's parsers
    split the text into fields (``SamplingParams.text_breaks``): ``</think>`` with the reasoning split, every tool-call
    marker when the request's calls are parsed."""
    import types

    from cluster.config import DEFAULT_MODEL, EngineConfig
    from cluster.serve import OpenAIIngress
    from models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEFAULT_MODEL)
    sp = tok.special_ids_by_token()
    sent = []

    async def opened(ids, params, req_id):
        sent.append(params)
        yield TokenEvent(req_id, [5], "a", finished=True, finish_reason="stop")

    ingress = types.SimpleNamespace(
        max_model_len=64, sampling_defaults={}, think_start=sp["<think>"], think_end=sp["</think>"], tokenizer=tok,
        model_name="m",
        tool_ids={n: sp[n] for n in TOOL_MARKERS}, _open=opened, turn_ids=set(),
        cfg=EngineConfig(reasoning_parser="glm" if reasoning else "none", tool_parser="glm" if tools else "none"))
    ingress._thinking = lambda ids: OpenAIIngress._thinking(ingress, ids)
    body = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 2, "stop": "x",
        "tools": [{"type": "function", "function": {"name": "f"}}]})
    async def answer():
        fmt, merged = await OpenAIIngress._start(ingress, body, [[1, sp["<think>"]]], None, chat=True)
        await fmt.whole(merged, body.n)

    asyncio.run(answer())
    assert [p.text_breaks for p in sent] == [tuple(sorted(sp[n] for n in breaks))] * 2
    assert [p.tool_call_span for p in sent] == [(sp["<tool_call>"], sp["</tool_call>"]) if tools else ()] * 2


@pytest.mark.parametrize("body", [
    {"continue_final_message": True, "add_generation_prompt": False},                 # the last message is a user's
    {"continue_final_message": True, "messages": [{"role": "user", "content": "hi"},
                                                  {"role": "assistant", "content": "Once"}]},   # with a new turn
])
def test_continue_final_message_needs_a_final_assistant_message_and_no_generation_prompt(body):
    from cluster.protocol import ApiError

    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})
    with pytest.raises(ApiError) as e:
        req.check_supported()
    assert (e.value.status, e.value.param) == (400, "continue_final_message")
    ChatCompletionRequest.model_validate({**req.model_dump(exclude_none=True), "add_generation_prompt": False,
                                          "messages": [{"role": "user", "content": "hi"},
                                                       {"role": "assistant", "content": "Once"}]}).check_supported()


def test_a_call_with_no_name_is_content_and_a_repeated_key_streams_as_whole():
    """A ``<tool_call>`` that ends before any name (here at the next ``<tool_call>``) was no call: its text is content,
    whole and streamed, and no call named "" goes out. A key the model repeats: the streamed pieces are the whole
    response's arguments, to the letter (the last value wins when parsed)."""
    evs, ingress, tool_ids = _tool_events(args=(("city", "Paris"), ("city", "Rome")))
    start = next(i for i, e in enumerate(evs) if e.token_ids == [tool_ids["<tool_call>"]])
    evs.insert(start, TokenEvent("r", [tool_ids["<tool_call>"]], ""))
    choice, chunks = _whole_and_stream(evs, ingress, tool_ids, {"get_weather": {"city"}})
    assert choice["message"]["content"] == "Let me check.<tool_call>" and choice["finish_reason"] == "tool_calls"
    assert "".join(c["delta"].get("content") or "" for c in chunks) == "Let me check.<tool_call>"
    assert streamed_calls(chunks) == _whole_calls(choice) == [
        {"name": "get_weather", "arguments": '{"city": "Paris", "city": "Rome"}'}]
    assert json.loads(_whole_calls(choice)[0]["arguments"]) == {"city": "Rome"}


@pytest.mark.parametrize("name", ["<tool_call>", "get<arg_key>x", " padded", "tab\t"])
def test_a_tool_name_no_call_could_name_is_refused(name):
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                "tools": [{"type": "function", "function": {"name": name}}]})
    with pytest.raises(ApiError) as e:
        req.check_supported()
    assert e.value.status == 400 and e.value.param == "tools[0].function.name" and "tool-call marker" in e.value.message


@pytest.mark.parametrize("body,param", [({"tool_choice": "always"}, "tool_choice"), ({"stop": 5}, "stop"),
                                        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content")])
def test_a_union_fields_error_names_the_field_not_its_branch(body, param):
    """Pydantic puts the union member it tried last in the location ("tool_choice.literal['none',…]", "stop.str")."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})
    assert validation_error(e.value).param == param


@pytest.mark.parametrize("turns,kwargs,thinking", [
    ([{"role": "user", "content": "hi"}], {}, True),                                            # thinking on
    ([{"role": "user", "content": "hi"}], {"enable_thinking": False}, False),                   # off: "</think>"
    ([{"role": "user", "content": "<think>"}], {"enable_thinking": False}, False),              # a user's marker
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>So far"}],    # continued mid-thought
     {"add_generation_prompt": False}, True),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}],        # continued answer
     {"add_generation_prompt": False}, False),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon",          # after a thought
                                          "reasoning_content": "A story."}], {"add_generation_prompt": False}, False),
])
def test_the_reasoning_split_starts_in_a_thought_the_prompt_leaves_open(turns, kwargs, thinking):
    """The chat's reasoning split starts inside a thought when the prompt's last turn opened ``<think>`` and did not
    close it: a generation prompt with thinking on, or a ``continue_final_message`` that stops mid-thought."""
    import types

    from cluster.config import DEFAULT_MODEL
    from cluster.serve import _TURNS, OpenAIIngress
    from models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEFAULT_MODEL)
    sp = tok.special_ids_by_token()
    ingress = types.SimpleNamespace(think_start=sp["<think>"], think_end=sp["</think>"],
                                    turn_ids={sp[t] for t in _TURNS})
    ids = tok.encode_chat(turns, **{"add_generation_prompt": True, **kwargs})
    assert OpenAIIngress._thinking(ingress, ids) is thinking


def test_priority_reaches_the_engine_and_the_responses_api_passes_it():
    from cluster.responses import ResponsesRequest

    chat = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 "priority": -3})
    assert chat.sampling_params(4, None).priority == -3
    assert CompletionRequest.model_validate({"model": "m", "prompt": "p"}).sampling_params(4, None).priority == 0
    assert ResponsesRequest.model_validate({"model": "m", "input": "hi", "priority": 7}).to_chat().priority == 7
    for bad in (1.5, "1", 2**40):
        with pytest.raises(Exception) as e:
            CompletionRequest.model_validate({"model": "m", "prompt": "p", "priority": bad})
        assert validation_error(e.value).param == "priority"


def test_an_error_ends_the_stream_with_no_usage_after_it():
    evs = [TokenEvent("r", [100], "Hi"), TokenEvent("r", [], "", finished=True, finish_reason="abort", error="gone")]

    async def collect():
        return [c async for c in Formatter(_FakeIngress(), "c", False, [[0] * 5], None).sse(_events(evs), True)]

    chunks = asyncio.run(collect())
    assert '"error"' in chunks[-2] and chunks[-1] == "data: [DONE]\n\n" and not any('"usage"' in c for c in chunks)


def test_tokenize_takes_null_as_the_default():
    from cluster.protocol import DetokenizeRequest, TokenizeRequest

    req = TokenizeRequest.model_validate({"model": "m", "prompt": "hi", "add_generation_prompt": None, "tools": None})
    assert req.add_generation_prompt is True
    assert DetokenizeRequest.model_validate({"model": "m", "tokens": [1]}).tokens == [1]


def test_n_choices_whose_prompts_cannot_queue_together_are_a_400():
    """Without prefix caching the n choices queue their prompts at once: past max_waiting_tokens that is a 400 naming
    n, not a 429 that every retry meets again (session 44's review)."""
    import types

    from cluster.config import EngineConfig
    from cluster.protocol import ApiError
    from cluster.serve import OpenAIIngress

    cfg = EngineConfig(max_waiting_tokens=1024, max_model_len=1024, prefix_caching=False)
    ingress = types.SimpleNamespace(max_model_len=1024, sampling_defaults={}, cfg=cfg, think_start=None, tool_ids=None,
                                    tokenizer=None)
    body = CompletionRequest.model_validate({"model": "m", "prompt": [5] * 600, "max_tokens": 4, "n": 2})
    with pytest.raises(ApiError) as e:
        asyncio.run(OpenAIIngress._start(ingress, body, [[5] * 600], None, chat=False))
    assert (e.value.status, e.value.param) == (400, "n"), e.value.message
