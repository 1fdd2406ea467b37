"""Session 61's mutation review of the request/response side: tests that kill mutants the suite let live (see
bench/results/session61/review_mut_http/report.md) — stop strings and a request's text (cluster/detok.py,
cluster/stream.py), the GLM parsers and the chat body / chunks (cluster/parsers.py, cluster/formatter.py), request
validation (cluster/protocol.py), the Messages and Responses APIs, structured output, run-batch and prefix routing."""

from __future__ import annotations

import asyncio
import json
import types

import pytest

pytest.importorskip("ray")

from pydantic import ValidationError

from cluster.detok import StopStringMatcher
from cluster.engine import TokenEvent
from cluster.formatter import Formatter
from cluster.parsers import TOOL_MARKERS
from cluster.protocol import ApiError, ChatCompletionRequest, validation_error
from cluster.stream import OutputStream
from scheduler.request import SamplingParams
from tests.conftest import streamed_calls
from tests.unit.test_protocol import _events, _tok
from tests.unit.test_responses import _USAGE, _chunk

# ---- stop strings and a request's text -----------------------------------------------------------------------------
_VOCAB = {1: "", 2: "", 5: "a", 6: "b", 7: "X", 8: "Y", 9: "!"}      # 1, 2: a tool call's markers (no text)


def _stream(**params) -> OutputStream:
    return OutputStream.open([5, 6], SamplingParams(max_tokens=8, **params),
                             lambda ids: "".join(_VOCAB[t] for t in ids), eos=(0,))


def test_a_kept_stop_strings_held_tail_is_not_sent_twice_at_the_end():
    """include_stop_str_in_output: nothing is held back (the tail is only searched again), so the end releases
    nothing more — the text is the deltas', once."""
    m = StopStringMatcher(["END"], keep=True)
    assert m.feed("abc EN") == ("abc EN", False) and m.flush() == ""


def test_min_tokens_arms_stop_strings_from_the_token_after_them():
    """vLLM's count: with min_tokens 1 the first token's stop string does not end the output, the second's does."""
    st = _stream(stop=("X",), min_tokens=1)
    assert st.text([7], last=False) == ("X", False)
    st.num_output += 1
    assert st.text([7], last=False) == ("", True)


def test_the_stop_tokens_text_is_no_part_of_the_output_unless_kept():
    assert _stream(stop_token_ids=(9,)).text([5, 9], last=True, stop_token=True) == ("a", False)
    kept = _stream(stop_token_ids=(9,), include_stop_str_in_output=True)
    assert kept.text([5, 9], last=True, stop_token=True) == ("a!", False)


def test_stop_strings_apply_again_after_a_tool_calls_close():
    st = _stream(stop=("X",), tool_call_span=(1, 2))           # (the engine's events: a token at a time)
    assert [st.text([t], last=False) for t in (5, 1, 7, 2, 6)] == [("a", False), ("", False), ("X", False),
                                                                  ("", False), ("b", False)]    # in the call: no stop
    assert st.text([7], last=False) == ("", True)               # after its close: the stop string ends the text


def test_text_held_for_a_stop_strings_start_goes_out_before_grammar_chosen_text():
    st = _stream(stop=("XY",))
    assert st.text([5, 7], last=False) == ("a", False)          # "X" held: it may start "XY"
    assert st.text([6], last=False, held=True) == ("Xb", False)


def test_a_stop_string_split_across_tokens_is_held_until_it_completes():
    st = _stream(stop=("XY",))
    assert st.text([7], last=False) == ("", False)
    assert st.text([8], last=False) == ("", True) and st.stops.matched == "XY"
    ended = _stream(stop=("XY",))
    assert ended.text([7], last=False) == ("", False) and ended.text([5], last=True) == ("Xa", False)


def test_an_eos_among_the_stop_token_ids_is_eos():
    """An EOS id the client lists among stop_token_ids is EOS (no stop_reason, as vLLM's) — unless ignore_eos."""
    assert _stream(stop_token_ids=(0, 9)).stop_ids == frozenset({9})
    assert _stream(stop_token_ids=(0, 9), ignore_eos=True).stop_ids == frozenset({0, 9})


def test_prompt_logprobs_computed_again_are_taken_once():
    st = _stream(prompt_logprobs=0)
    st.add_prompt_logprobs(1, ["p1", "p2"])                    # positions 1, 2 (the first token has none)
    st.add_prompt_logprobs(3, ["p3"])
    st.add_prompt_logprobs(1, ["p1", "p2", "p3", "p4"])        # preempted: the prompt computed again
    assert st.prompt_lps == ["p1", "p2", "p3", "p4"]


# ---- the GLM parsers and the chat body / chunks ---------------------------------------------------------------------
def _ingress(tok, **kw):
    sp = tok.special_ids_by_token()
    return types.SimpleNamespace(model_name="m", tokenizer=tok, think_end=sp["</think>"], think_start=sp["<think>"],
                                 **kw)


def _chat_evs(tok, *groups, finish="stop", **last):
    """One event per group: a marker's name is its id, other text its tokens."""
    sp = tok.special_ids_by_token()
    evs = []
    for g in groups:
        ids = [t for p in g for t in ([sp[p]] if p in sp else tok.encode(p))] if isinstance(g, tuple) else \
            [sp[g]] if g in sp else tok.encode(g)
        evs.append(TokenEvent("r", ids, tok.decode(ids)))
    evs[-1].finished, evs[-1].finish_reason = True, finish
    for k, v in last.items():
        setattr(evs[-1], k, v)
    return evs


def _answer(tok, evs, tools=False, thinking=False, include_usage=False, ingress=None, string_args=None, **kw):
    """(the whole chat body, the streamed chunks as dicts — the usage chunk among them where asked)."""
    ing = ingress or _ingress(tok)
    tool_ids = {n: tok.special_ids_by_token()[n] for n in TOOL_MARKERS} if tools else None
    fmt = lambda: Formatter(ing, "c", True, [[5] * 4], None, thinking=thinking, tool_ids=tool_ids,
                            string_args=string_args, **kw)
    body = asyncio.run(fmt().whole(_events(evs), 1))

    async def collect():
        return [c async for c in fmt().sse(_events(evs), include_usage)]

    chunks = [json.loads(c[6:]) for c in asyncio.run(collect()) if c.startswith("data: {")]
    return body, chunks


def test_the_reasoning_ends_at_a_think_end_that_opens_a_speculative_steps_event():
    """A step that commits </think> and the answer's first tokens: one event, the marker first."""
    tok = _tok()
    evs = _chat_evs(tok, "Hm", ("</think>", "Answer."))
    body, chunks = _answer(tok, evs, thinking=True)
    msg = body["choices"][0]["message"]
    assert (msg["content"], msg["reasoning_content"]) == ("Answer.", "Hm")
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == len(tok.encode("Hm"))
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "Answer."


def test_an_answer_cut_by_max_tokens_inside_its_thought_keeps_it_a_thought():
    """Only an output that *stops* inside the thought the prompt opened skipped thinking (its text is the answer); one
    cut by max_tokens (length) was still thinking."""
    tok = _tok()
    for finish, content, thought in (("length", "", "Let me think."), ("stop", "Let me think.", None)):
        body, chunks = _answer(tok, _chat_evs(tok, "Let me", " think.", finish=finish), thinking=True,
                              include_usage=True)
        msg = body["choices"][0]["message"]
        assert (msg["content"], msg.get("reasoning_content")) == (content, thought), finish
        reasoning = body["usage"]["completion_tokens_details"]["reasoning_tokens"]
        assert reasoning == (0 if finish == "stop" else len(tok.encode("Let me think."))), finish
        assert chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == reasoning


def test_a_call_with_no_arguments_is_an_empty_object():
    tok = _tok()
    body, chunks = _answer(tok, _chat_evs(tok, "<tool_call>", "now", "</tool_call>"), tools=True)
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "now", "arguments": "{}"}
    assert streamed_calls([c["choices"][0] for c in chunks]) == [{"name": "now", "arguments": "{}"}]


def test_trailing_whitespace_is_content_where_the_output_made_no_call():
    """Only the newline after a model's calls is dropped; an answer with tools but no call keeps its text whole."""
    tok = _tok()
    body, chunks = _answer(tok, _chat_evs(tok, "Hi", "\n"), tools=True)
    assert body["choices"][0]["message"]["content"] == "Hi\n"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hi\n"


@pytest.mark.parametrize("groups,args", [
    # a key the model left open at its value (no </arg_key>), a newline before the value: the key is its text
    (("<tool_call>", "f", "<arg_key>", "city\n", "<arg_value>", "Paris", "</arg_value>", "</tool_call>"),
     {"city": "Paris"}),
    # a key with nothing after it but a newline (no value written at all): no argument
    (("<tool_call>", "f", "<arg_key>", "a", "</arg_key>", "\n", "<arg_key>", "b", "</arg_key>", "<arg_value>", "1",
      "</arg_value>", "</tool_call>"), {"b": 1}),
])
def test_keys_and_values_a_model_writes_without_their_markers(groups, args):
    tok = _tok()
    body, chunks = _answer(tok, _chat_evs(tok, *groups), tools=True)
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == args
    assert streamed_calls([c["choices"][0] for c in chunks]) == [{"name": "f", "arguments": call["function"][
        "arguments"]}]


def test_usage_totals_prompt_and_completion_and_goes_out_where_asked():
    tok = _tok()
    evs = _chat_evs(tok, "Hello", " world")
    body, chunks = _answer(tok, evs, include_usage=True)
    assert body["usage"]["total_tokens"] == 4 + 4 == chunks[-1]["usage"]["total_tokens"]     # He ll o, world
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert not any("usage" in c for c in _answer(tok, evs)[1])


def test_continuous_usage_counts_each_choices_own_tokens():
    """vLLM's continuous_usage_stats with n = 2: a chunk's usage is its choice's tokens so far, not the request's."""
    fmt = Formatter(types.SimpleNamespace(model_name="m", tokenizer=None, think_end=None), "c", False, [[1, 2, 3]],
                    None, n=2, continuous_usage=True)
    evs = [(0, TokenEvent("r", [7], "a")), (1, TokenEvent("r", [7, 7], "bb")),
           (0, TokenEvent("r", [7], "c", True, "length")), (1, TokenEvent("r", [7], "d", True, "length"))]

    async def collect():
        async def merged():
            for i, ev in evs:
                yield i, ev
        return [c async for c in fmt.chunks(merged())]

    chunks = asyncio.run(collect())
    assert [(c["choices"][0]["index"], c["usage"]["completion_tokens"]) for c in chunks[:-1]] == \
        [(0, 1), (1, 2), (0, 2), (1, 3)]
    assert all(c["usage"]["prompt_tokens"] == 3 == c["usage"]["total_tokens"] - c["usage"]["completion_tokens"]
               for c in chunks[:-1])


def test_a_calls_end_and_the_text_after_it_in_one_event_are_two_chunks():
    """A speculative step commits </tool_call> and the text after it: the call's chunk holds no content (a client
    reads it as a call), the text comes in a chunk of its own."""
    tok = _tok()
    evs = _chat_evs(tok, "<tool_call>", "f", "<arg_key>", "a", "</arg_key>", "<arg_value>", "1", "</arg_value>",
                    ("</tool_call>", " Done."))
    body, chunks = _answer(tok, evs, tools=True)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert not any(d.get("content") and d.get("tool_calls") for d in deltas)
    assert "".join(d.get("content") or "" for d in deltas) == " Done." == body["choices"][0]["message"]["content"]
    assert streamed_calls([c["choices"][0] for c in chunks]) == [{"name": "f", "arguments": '{"a": 1}'}]


def test_the_first_chunk_says_the_role_and_a_last_event_with_no_text_still_ends_the_choice():
    """An EOS (its text left out) is the last event: its chunk carries the finish_reason though it says nothing."""
    tok = _tok()
    evs = _chat_evs(tok, "Hi") + [TokenEvent("r", [0], "", True, "stop")]
    _, chunks = _answer(tok, evs)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Hi"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and "role" not in chunks[-1]["choices"][0]["delta"]


def test_a_request_the_server_ended_on_shutting_down_is_a_503():
    tok = _tok()
    evs = [TokenEvent("r", [], "", True, "abort", error="the server shut down")]
    for closing, status in ((True, 503), (False, 500)):
        with pytest.raises(ApiError) as e:
            _answer(tok, evs, ingress=_ingress(tok, closing=closing))
        assert e.value.status == status

        async def collect(closing=closing):
            fmt = Formatter(_ingress(tok, closing=closing), "c", True, [[5]], None)
            return [c async for c in fmt.chunks(_events(evs))]

        assert asyncio.run(collect())[-1].status == status


def test_text_offsets_past_a_stop_strings_cut_stay_within_the_text():
    """The tokens after where a stop string cut the text (committed in the same step) sit at the text's end."""
    from workers.runner import TokenLogprobs

    tok = _tok()
    ids = tok.encode("Hello world!")                            # He ll o ' world' !
    lps = [TokenLogprobs(-1.0, ((t, -1.0),)) for t in ids]
    evs = [TokenEvent("r", ids, "Hello", True, "stop", logprobs=lps, stop_str=" world")]
    fmt = Formatter(types.SimpleNamespace(model_name="m", tokenizer=tok, think_end=None), "c", False, [[1]], 0)
    choice = asyncio.run(fmt.whole(_events(evs), 1))["choices"][0]
    assert choice["text"] == "Hello" and choice["logprobs"]["text_offset"] == [0, 2, 4, 5, 5]


# ---- request validation and sampling params -------------------------------------------------------------------------
_HI = [{"role": "user", "content": "hi"}]


def _chat(**body) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": _HI, **body})


@pytest.mark.parametrize("body,param", [({"n": 9}, "n"), ({"stop": ["a", ""]}, "stop"), ({"stop": ""}, "stop"),
                                        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
                                        ({"top_logprobs": 21}, "top_logprobs"),
                                        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
                                         "messages.0.content")])
def test_out_of_range_values_are_400s_naming_the_field(body, param):
    with pytest.raises(ValidationError) as e:
        _chat(**body)
    assert validation_error(e.value).param == param
    ok = {"n": 8, "stop": ["a", "b"], "truncate_prompt_tokens": -1, "top_logprobs": 20}
    if param in ok:
        _chat(**{param: ok[param]}).check_supported()           # the bound itself passes


def test_the_logit_bias_bound_and_min_tokens_up_to_max_tokens_pass():
    _chat(logit_bias={str(i): 1 for i in range(300)}).check_supported()
    _chat(min_tokens=4, max_tokens=4).check_supported()
    _chat(min_tokens=1, max_completion_tokens=1).check_supported()
    with pytest.raises(ApiError) as e:
        _chat(min_tokens=5, max_tokens=4).check_supported()
    assert (e.value.status, e.value.param) == (400, "min_tokens")


def test_sampling_params_per_choice():
    """Choice i samples with seed + i (n choices that differ, reproducibly); min_tokens is held to the max_tokens the
    server gave (a max_tokens the client left out: what the context leaves); parallel_tool_calls false is one call
    only where calls are parsed."""
    req = _chat(seed=7, min_tokens=10, parallel_tool_calls=False)
    assert [req.sampling_params(5, None, seed_offset=i).seed for i in range(3)] == [7, 8, 9]
    params = req.sampling_params(5, None)
    assert params.min_tokens == 5 and params.single_tool_call is False
    assert req.sampling_params(5, None, tool_call_span=(23, 24)).single_tool_call is True


def test_a_developer_message_is_the_templates_system_message():
    req = _chat(messages=[{"role": "developer", "content": "Be terse."}, *_HI])
    assert req.template_messages()[0] == {"role": "system", "content": "Be terse."}


def test_structured_outputs_one_at_most_and_json_object_false_is_none():
    with pytest.raises(ApiError) as e:
        _chat(guided_regex="a+", guided_choice=["a", "b"]).check_supported()
    assert (e.value.status, e.value.param) == (400, "guided_choice") and "one structured output" in e.value.message
    req = _chat(structured_outputs={"json_object": False})
    req.check_supported()
    assert req.guidance == (None, None)


# ---- the Messages and Responses APIs ---------------------------------------------------------------------------------
def _messages(**body):
    from cluster.anthropic import MessagesRequest

    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 64, "messages": _HI, **body})
    req.check_supported()
    return req


def test_messages_refuse_what_anthropic_refuses():
    """Anthropic's temperature is in [0, 1]; a forced tool with thinking on (adaptive too) is a 400."""
    with pytest.raises(ValidationError) as e:
        _messages(temperature=1.5)
    assert validation_error(e.value).param == "temperature"
    tool = {"name": "f", "input_schema": {"type": "object"}}
    with pytest.raises(ApiError) as e:
        _messages(thinking={"type": "adaptive"}, tools=[tool], tool_choice={"type": "any"})
    assert e.value.param == "tool_choice"


def test_an_assistant_messages_text_blocks_are_one_content():
    turn = {"role": "assistant", "content": [{"type": "text", "text": "Once"}, {"type": "text", "text": " upon"}]}
    chat = _messages(messages=[*_HI, turn, {"role": "user", "content": "go on"}]).to_chat()
    assert chat.template_messages()[1] == {"role": "assistant", "content": "Once upon"}


def _responses(**body):
    from cluster.responses import ResponsesRequest

    req = ResponsesRequest.model_validate({"model": "m", "input": "hi", **body})
    req.check_supported()
    return req


def test_responses_refuse_what_openai_refuses():
    with pytest.raises(ValidationError, match="metadata holds"):
        _responses(metadata={"k" * 65: "v"})
    _responses(metadata={"k" * 64: "v" * 512})
    with pytest.raises(ApiError) as e:
        _responses(top_logprobs=2)
    assert e.value.param == "top_logprobs"


def test_a_reasoning_item_after_a_call_starts_the_next_turn():
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    reasoning = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Again."}]}
    done = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}
    msgs = _responses(input=[{"role": "user", "content": "go"}, call, reasoning, done]).to_chat().template_messages()
    assert [(m["role"], m.get("content"), m.get("reasoning_content"), len(m.get("tool_calls", []))) for m in msgs] == \
        [("user", "go", None, 0), ("assistant", None, None, 1), ("assistant", "Done.", "Again.", 0)]


def test_a_responses_usage_counts_cached_input_and_its_events_name_their_item():
    """OpenAI's input_tokens count the cached ones too (input_tokens_details.cached_tokens says how many); a call's
    argument deltas carry its item's output_index; an error closes the open item incomplete."""
    from cluster.responses import ResponseEvents
    from tests.unit.test_responses import sse_events

    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    usage = {**_USAGE, "prompt_tokens_details": {"cached_tokens": 2}}
    events = sse_events(ResponseEvents(_responses(), "m"), [_chunk({"role": "assistant", "content": "Hi"}),
                                                            _chunk({"tool_calls": [call]}, "tool_calls"),
                                                            _chunk(usage=usage)])
    final = events[-1]["response"]
    assert final["usage"]["input_tokens"] == 3 and final["usage"]["input_tokens_details"]["cached_tokens"] == 2
    added = next(e for e in events if e["type"] == "response.output_item.added" and e["item"]["type"] ==
                 "function_call")
    assert [e["output_index"] for e in events if e["type"] == "response.function_call_arguments.delta"] == \
        [added["output_index"]] == [1]
    failed = sse_events(ResponseEvents(_responses(), "m"), [_chunk({"role": "assistant", "content": "Hi"}),
                                                            {"error": {"message": "gone", "type": "server_error"}}])
    done = next(e for e in failed if e["type"] == "response.output_item.done")
    assert done["item"]["status"] == "incomplete" and failed[-1]["response"]["output"][0]["status"] == "incomplete"


# ---- structured output, run-batch, prefix routing --------------------------------------------------------------------
def test_a_guide_waits_for_the_reasoning_only_where_the_prompt_ends_opening_it():
    """A prompt whose last token is <think> opens the reasoning; an earlier turn's <think>...</think> does not."""
    from cluster.guided import Guides

    tok = _tok()
    sp = tok.special_ids_by_token()
    guides = Guides(tok, tok.vocab_size, [0])
    assert guides._waits([5, sp["<think>"]]) == [sp["</think>"]]
    assert guides._waits([sp["<think>"], 5, sp["</think>"], 6]) == []


def test_run_batch_retries_counts_and_waits_as_documented(monkeypatch):
    import io

    from cluster import batch

    monkeypatch.setattr(batch, "RETRIES", 2)
    posts, slept = [], []
    full = batch.answer("a", "/v1/completions", {}, lambda p, b: posts.append(p) or (429, {}, {}), slept.append)
    assert full["response"]["status_code"] == 429 and len(posts) == 3          # the first try and RETRIES more
    later = iter([(503, {}, {"retry-after": "-5"}), (200, {}, {})])
    slept.clear()
    assert batch.answer("b", "/v1/completions", {}, lambda p, b: next(later), slept.append)["error"] is None
    assert slept == [0.0]                                                       # a negative Retry-After: no wait
    out = io.StringIO()
    line = json.dumps({"custom_id": "c", "url": "/v1/completions", "body": {}})  # method left out: POST
    assert batch.run_batch([line], out, lambda p, b: (400, {"error": {}}, {})) == (1, 1)    # a 400 counts as failed
    assert json.loads(out.getvalue())["response"]["status_code"] == 400


def test_an_outage_is_timed_from_the_last_refusal_run_since_an_answer(monkeypatch):
    from cluster import batch

    monkeypatch.setattr(batch, "REFUSED_S", 3.0)
    clock = [0.0]
    outage = batch.Outage(lambda: clock[0])
    tries = iter([ConnectionRefusedError(111, "refused"), (200, {}, {})])

    def post(path, body):
        got = next(tries)
        if isinstance(got, Exception):
            raise got
        return got

    assert batch.answer("a", "/v1/completions", {}, post, lambda s: None, outage)["error"] is None
    clock[0] = 100.0                                    # long after: a new outage, tried again for REFUSED_S
    tries = iter([ConnectionRefusedError(111, "refused"), (200, {}, {})])
    assert batch.answer("b", "/v1/completions", {}, post, lambda s: None, outage)["error"] is None


def test_routing_remembers_prefixes_least_recently_routed_first_and_learns_from_prefills():
    from cluster.routing import PrefixAffinity, _prompt

    aff = PrefixAffinity(span=2, max_keys=4)
    a, b, c = list(range(5)), list(range(10, 15)), list(range(20, 25))        # two prefix points each
    aff.record(a, "a")
    aff.record(b, "b")
    aff.record(a, "a")                                  # a's prefix routed again: the most recent
    aff.record(c, "c")                                  # b's points are forgotten, not a's
    idle = {"a": 0, "b": 0, "c": 0}
    assert (aff.prefer(a, idle), aff.prefer(b, idle), aff.prefer(c, idle)) == ("a", None, "c")
    for method in ("generate", "prefill"):
        pending = types.SimpleNamespace(metadata=types.SimpleNamespace(call_method=method),
                                        args=([1, 2], SamplingParams(cache_salt="s")))
        assert _prompt(pending) == ([1, 2], "s")
    assert _prompt(types.SimpleNamespace(metadata=types.SimpleNamespace(call_method="abort"), args=("r",))) is None
