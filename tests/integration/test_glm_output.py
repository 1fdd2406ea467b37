"""The GLM output parsers (``cluster/parsers.py``) on the engine's real events (``Engine._emit``: an event at each
special token; k = 3 commits several tokens a step) through the front end's formatter, whole and streamed — the cases
that session 55's review (``bench/results/session55/review/``) found wrong, as vLLM's and SGLang's users met them with
GLM: a value the model wrote without ``<arg_value>``, a thought the model skipped, a stop string inside a call's
arguments, whitespace after the calls, and a call's chunk carrying text."""

from __future__ import annotations

import json

import pytest

from scheduler.request import SamplingParams
from tests.integration.test_engine import _formatted, text_engine


@pytest.fixture(scope="module")
def tok():
    from cluster.config import DEFAULT_MODEL
    from cluster.local import load_tokenizer

    return load_tokenizer(DEFAULT_MODEL)


def script_of(tok, *pieces: str) -> list[int]:
    """Token ids of ``pieces``: a special token's name is its id, other text its tokens; EOS last."""
    sp = tok.special_ids_by_token()
    return [t for p in pieces for t in ([sp[p]] if p in sp else tok.encode(p))] + [tok.eos_token_ids[0]]


def answers(tok, script: list[int], ks=(0, 3), thinking: bool = True, **params) -> list[tuple[dict, dict]]:
    """(whole choice, streamed view) for each k — the engine's events of ``script`` as a chat's, thinking (the prompt
    opened a thought) or not, calls parsed (the request's ``text_breaks`` and ``tool_call_span`` as the front end sets
    them)."""
    from cluster.parsers import TOOL_MARKERS

    sp = tok.special_ids_by_token()
    breaks = tuple(sorted(sp[n] for n in ("</think>", *TOOL_MARKERS)))
    out, max_tokens = [], params.pop("max_tokens", len(script))
    for k in ks:
        engine = text_engine(script, tok, k)
        rid = engine.add_request([5, 6, 7], SamplingParams(max_tokens=max_tokens, text_breaks=breaks, **params,
                                                           tool_call_span=(sp["<tool_call>"], sp["</tool_call>"])))
        events = []
        while engine.scheduler.has_unfinished():
            events += [ev for ev in engine.step() if ev.req_id == rid]
        out.append(_formatted(tok, events, thinking))
    return out


def calls(choice: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]]


@pytest.mark.parametrize("missing", ["<arg_value>", "</arg_key>"])
def test_a_value_the_model_wrote_without_its_marker_is_still_the_arguments(tok, missing):
    """vLLM #49248: under load GLM skips a value's opening ``<arg_value>`` (or a key's ``</arg_key>``); the text up to
    ``</arg_value>`` is still the value — not ``{}`` with the text lost."""
    pieces = ["</think>", "<tool_call>", "get_weather", "<arg_key>", "city", "</arg_key>", "<arg_value>", "Paris",
              "</arg_value>", "<arg_key>", "days", "</arg_key>", "<arg_value>", "3", "</arg_value>", "</tool_call>"]
    pieces.remove(missing)                                  # (the first's: city's)
    for whole, streamed in answers(tok, script_of(tok, "Hm.", *pieces)):
        assert calls(whole) == [("get_weather", {"city": "Paris", "days": 3})], whole
        assert streamed["calls"] == [{k: c["function"][k] for k in ("name", "arguments")}
                                     for c in whole["message"]["tool_calls"]]


def test_a_thought_the_model_skipped_is_the_answer(tok):
    """sglang #37645: the prompt opens a thought, the model answers at once and stops (EOS) without ``</think>``: that
    text is the answer (content), not a thought — streamed, the reasoning deltas it went out as are followed by it
    once as content. Cut by max_tokens it stays a thought (the model was still thinking)."""
    script = script_of(tok, "The capital of France is Paris.")
    for whole, streamed in answers(tok, script):
        assert whole["message"]["content"] == "The capital of France is Paris." and whole["finish_reason"] == "stop"
        assert "reasoning_content" not in whole["message"] and streamed["content"] == whole["message"]["content"]
    for whole, streamed in answers(tok, script, max_tokens=4):
        assert whole["message"]["content"] == "" and whole["message"]["reasoning_content"] == streamed["reasoning"]
        assert whole["finish_reason"] == "length" and streamed["content"] == ""


def test_a_thought_the_model_opens_with_thinking_off_is_reasoning(tok):
    """``enable_thinking: false`` (the prompt closes the thought) and the model thinks anyway: an output whose first
    token is ``<think>`` has its thought as reasoning_content up to ``</think>`` (as vLLM's GLM parser), whole and
    streamed; stopped before ``</think>`` it stays a thought (the prompt did not open it: no skipped thought). A
    ``<think>`` later in the output, or none, leaves all of it content."""
    for whole, streamed in answers(tok, script_of(tok, "<think>", "Let me see.", "</think>", "Paris."), thinking=False):
        assert whole["message"]["reasoning_content"] == streamed["reasoning"] == "Let me see."
        assert whole["message"]["content"] == streamed["content"] == "Paris."
    for whole, streamed in answers(tok, script_of(tok, "<think>", "Let me see."), thinking=False):
        assert whole["message"]["reasoning_content"] == streamed["reasoning"] == "Let me see."
        assert whole["message"]["content"] == streamed["content"] == "" and whole["finish_reason"] == "stop"
    for script in (script_of(tok, "Paris.", "<think>", "no.", "</think>", "Yes."), script_of(tok, "Paris.")):
        for whole, streamed in answers(tok, script, thinking=False):
            assert "reasoning_content" not in whole["message"] and streamed["reasoning"] == ""
            assert whole["message"]["content"] == streamed["content"] == tok.decode(script[:-1])


def test_a_stop_string_inside_a_calls_arguments_does_not_cut_the_call(tok):
    """A stop string is the client's content's end; inside a call (``tool_call_span``) it is a file's text: a blank
    line in ``write_file``'s content no longer cuts the call (it was reported complete, finish_reason tool_calls, with
    the file cut). After the call, the stop string ends the output as before."""
    script = script_of(tok, "</think>", "<tool_call>", "write_file", "<arg_key>", "content", "</arg_key>",
                       "<arg_value>", "# T\n\nbody\n", "</arg_value>", "</tool_call>", "Done.\n\nMore")
    for whole, streamed in answers(tok, script, stop=("\n\n",)):
        assert calls(whole) == [("write_file", {"content": "# T\n\nbody\n"})], whole
        assert whole["message"]["content"] == "Done." and whole["stop_reason"] == "\n\n"
        assert streamed["content"] == "Done." and streamed["finish_reason"] == "tool_calls"


def test_whitespace_after_the_calls_and_a_calls_chunk_do_not_depend_on_the_steps(tok):
    """Whitespace after the calls waits for more text however the tokens fall into steps (``Done.\\n`` committed in one
    step kept its newline as content, one token a step did not); a chunk that ends a call carries no text — the text
    that came in the same step goes in the next chunk (a client reads a call's chunk as a call)."""
    script = script_of(tok, "</think>", "<tool_call>", "get_weather", "<arg_key>", "city", "</arg_key>",
                       "<arg_value>", "Paris", "</arg_value>", "</tool_call>", " Done.\n")
    (plain, plain_streamed), (spec, spec_streamed) = answers(tok, script)
    assert plain == spec and plain_streamed == spec_streamed and plain["message"]["content"] == " Done."
    for k in (0, 3):
        engine = text_engine(script, tok, k)
        sp = tok.special_ids_by_token()
        rid = engine.add_request([5, 6, 7], SamplingParams(max_tokens=len(script), text_breaks=tuple(sp.values())))
        events = []
        while engine.scheduler.has_unfinished():
            events += [ev for ev in engine.step() if ev.req_id == rid]
        assert k == 0 or any(len(ev.token_ids) > 1 and ev.token_ids[0] == sp["</tool_call>"] for ev in events)
        chunks = _chunks(tok, events)
        assert not [c for c in chunks if c["delta"].get("tool_calls") and c["delta"].get("content")], chunks


def test_parallel_tool_calls_false_ends_the_output_at_the_first_calls_close(tok):
    """OpenAI's "at most one call" (the Messages API's ``disable_parallel_tool_use``, the Responses API's
    ``parallel_tool_calls`` map to it) held only where a strict function's grammar held the calls: a model that wrote
    two non-strict calls returned both (session 59's review). The output now ends at the first ``</tool_call>``,
    finish_reason tool_calls, whole and streamed, one token a step or several (``single_tool_call``)."""
    script = script_of(tok, "</think>", "<tool_call>", "get_weather", "<arg_key>", "city", "</arg_key>",
                       "<arg_value>", "Paris", "</arg_value>", "</tool_call>", "<tool_call>", "get_weather",
                       "<arg_key>", "city", "</arg_key>", "<arg_value>", "Rome", "</arg_value>", "</tool_call>")
    for whole, streamed in answers(tok, script, single_tool_call=True):
        assert calls(whole) == [("get_weather", {"city": "Paris"})] and whole["finish_reason"] == "tool_calls"
        assert whole["stop_reason"] is None and not whole["message"]["content"], whole
        assert [c["name"] for c in streamed["calls"]] == ["get_weather"], streamed
        assert streamed["finish_reason"] == "tool_calls"
    whole, _ = answers(tok, script, ks=(0,))[0]
    assert [a for _, a in calls(whole)] == [{"city": "Paris"}, {"city": "Rome"}]       # parallel calls: both
    body = __import__("cluster.protocol", fromlist=["x"]).ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "parallel_tool_calls": False})
    assert body.sampling_params(8, None, tool_call_span=(1, 2)).single_tool_call
    assert not body.sampling_params(8, None).single_tool_call        # (no calls parsed: nothing to stop at)


def _chunks(tok, events) -> list[dict]:
    import asyncio

    from cluster.formatter import Formatter
    from cluster.parsers import TOOL_MARKERS

    sp = tok.special_ids_by_token()
    ingress = type("I", (), {"model_name": "m", "tokenizer": tok, "think_end": sp["</think>"]})()
    fmt = Formatter(ingress, "c", True, [[0] * 3], None, thinking=True, tool_ids={n: sp[n] for n in TOOL_MARKERS})

    async def source():
        for ev in events:
            yield 0, ev

    async def collect():
        return [json.loads(c[6:])["choices"][0] async for c in fmt.sse(source(), False) if c != "data: [DONE]\n\n"]

    return [c for c in asyncio.run(collect()) if c]
