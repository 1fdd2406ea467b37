"""vLLM's sampling extras on the engine (the tiny model): ``min_tokens`` — an output's first ``min_tokens`` tokens are
none of the tokens that would stop it (EOS unless ``ignore_eos``, ``stop_token_ids``) and no stop string ends it before
then; a grammar that allows only a stop token still ends the output there; ``allowed_token_ids``; structured outputs
by a regex, a choice or an EBNF grammar — each the same tokens plain, drafting and looking ahead."""

from __future__ import annotations

import json

import pytest

from scheduler.request import SamplingParams
from tests.integration.test_engine import _local, _outputs


@pytest.fixture(scope="module")
def engine_tok():
    engine, tok = _local()
    engine.lookahead = False
    return engine, tok


def _prompt(tok, text: str) -> list[int]:
    return tok.encode_chat([{"role": "user", "content": text}], enable_thinking=False)


def test_no_stop_token_before_min_tokens(engine_tok):
    """The tiny model answers "Say yes." with "." and EOS: with min_tokens 6 EOS is out of reach for six tokens
    (the first token is as before), then allowed; min_tokens past where a stop token id would end it, the same."""
    engine, tok = engine_tok
    eos = set(engine.config.eos_token_ids)
    prompt = _prompt(tok, "Say yes.")
    free = _outputs(engine, {"f": (prompt, SamplingParams(max_tokens=40, temperature=0.0))})["f"]
    assert free[2] == "stop" and len(free[0]) == 2 and free[0][-1] in eos, free
    held = _outputs(engine, {"h": (prompt, SamplingParams(max_tokens=40, temperature=0.0, min_tokens=6))})["h"]
    assert held[0][0] == free[0][0] and not eos & set(held[0][:6]) and len(held[0]) > 6, held
    # a stop token id the output holds early: not before min_tokens, then it ends the output
    longer = _outputs(engine, {"l": (_prompt(tok, "What is 2+2?"), SamplingParams(max_tokens=40, temperature=0.0))})
    ids = longer["l"][0]
    stop = ids[3]
    first = ids.index(stop)
    params = SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=(stop,), min_tokens=first + 4)
    out = _outputs(engine, {"s": (_prompt(tok, "What is 2+2?"), params)})["s"]
    assert out[0][:first] == ids[:first] and stop not in out[0][:first + 4] and len(out[0]) > first + 4, (ids, out)


def test_stop_strings_wait_for_min_tokens(engine_tok):
    """A stop string the output meets early ends it only once min_tokens tokens are out."""
    engine, tok = engine_tok
    prompt = _prompt(tok, "What is 2+2?")
    free = _outputs(engine, {"f": (prompt, SamplingParams(max_tokens=40, temperature=0.0))})["f"]
    assert "first line" in free[1], free
    cut = _outputs(engine, {"c": (prompt, SamplingParams(max_tokens=40, temperature=0.0, stop=("first",)))})["c"]
    held = _outputs(engine, {"h": (prompt, SamplingParams(max_tokens=40, temperature=0.0, stop=("first",),
                                                             min_tokens=len(cut[0]) + 3))})["h"]
    assert free[1].startswith(cut[1]) and len(held[0]) >= len(cut[0]) + 3 and held[1].startswith(cut[1] + "first")
    assert held[2] in ("stop", "length"), held


def test_a_stop_string_may_end_only_past_min_tokens(engine_tok):
    """vLLM's count: no stop string ends in the text of the first min_tokens tokens; one that starts there and ends in
    the next token's text ends the output where it starts."""
    engine, tok = engine_tok
    prompt = tok.encode("Once upon a time")
    free = _outputs(engine, {"f": (prompt, SamplingParams(max_tokens=10, temperature=0.0))})["f"]
    pieces = [tok.decode([t]) for t in free[0]]
    before = "".join(pieces[:2])
    k = lambda stop: _outputs(engine, {"k": (prompt, SamplingParams(max_tokens=10, temperature=0.0, stop=(stop,),
                                                                    min_tokens=3))})["k"]
    assert k(pieces[2])[1] != before and pieces[2] in k(pieces[2])[1]   # ends in token 3: not cut there
    straddle = pieces[2][-2:] + pieces[3][:2]                           # starts in token 3, ends in token 4
    assert straddle not in before + pieces[2] and k(straddle)[1] == before + pieces[2][:-2], (pieces, k(straddle))


def test_min_tokens_plain_drafting_and_looking_ahead_agree(engine_tok):
    """Greedy and seeded drawn requests with min_tokens: an engine drafting (MTP, k = 3: verify rows at positions
    before and after min_tokens) and one looking ahead on the static path give the plain engine's tokens."""
    engine, tok = engine_tok
    prompt = _prompt(tok, "Say yes.")
    reqs = {"greedy": (prompt, SamplingParams(max_tokens=24, temperature=0.0, min_tokens=9)),
            "drawn": (prompt, SamplingParams(max_tokens=24, temperature=0.9, seed=5, min_tokens=9)),
            "penalised": (prompt, SamplingParams(max_tokens=24, temperature=0.0, min_tokens=5,
                                                 repetition_penalty=1.3))}
    want = {rid: _outputs(engine, {rid: r})[rid] for rid, r in reqs.items()}
    eos = set(engine.config.eos_token_ids)
    assert all(not eos & set(w[0][:r[1].min_tokens]) for w, r in zip(want.values(), reqs.values())), want
    spec, _ = _local(speculative_tokens=3)
    assert {rid: _outputs(spec, {rid: r})[rid] for rid, r in reqs.items()} == want
    assert spec.stats["drafts_proposed"] > 0
    ahead, _ = _local(cuda_graphs="eager")
    assert {rid: _outputs(ahead, {rid: r})[rid] for rid, r in reqs.items()} == want
    assert ahead.stats["ahead_steps"] > 0


def test_a_grammar_that_allows_only_a_stop_token_still_ends(engine_tok):
    """A JSON value done before min_tokens: the grammar allows only the stop tokens, so they stay allowed — the
    output ends with its value, not a token the mask and the ban left nothing for."""
    pytest.importorskip("xgrammar")
    engine, tok = engine_tok
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
                         "additionalProperties": False})
    prompt = _prompt(tok, "JSON please.")
    out = _outputs(engine, {"j": (prompt, SamplingParams(max_tokens=60, temperature=0.0, json_schema=schema,
                                                         min_tokens=50))})["j"]
    assert out[2] == "stop" and json.loads(out[1]) in ({"a": True}, {"a": False}), out


def test_the_request_field():
    """``min_tokens`` on both endpoints: past max_tokens (or max_completion_tokens) a 400 naming it; else it reaches
    the engine's params (clamped to a default max_tokens)."""
    from cluster.protocol import ApiError, ChatCompletionRequest, CompletionRequest

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for body in ({"model": "m", "prompt": "p", "max_tokens": 4, "min_tokens": 5},
                 {**chat, "max_completion_tokens": 4, "min_tokens": 5}):
        model = CompletionRequest if "prompt" in body else ChatCompletionRequest
        with pytest.raises(ApiError) as e:
            model.model_validate(body).check_supported()
        assert (e.value.status, e.value.param) == (400, "min_tokens"), e.value.message
    body = ChatCompletionRequest.model_validate({**chat, "min_tokens": 50})
    body.check_supported()
    assert body.sampling_params(30, None).min_tokens == 30 and body.sampling_params(80, None).min_tokens == 50


def test_allowed_token_ids_plain_drafting_and_looking_ahead_agree(engine_tok):
    """vLLM's allowed_token_ids: every token is one of them (greedy and seeded drawn), and an engine drafting (MTP,
    drafts outside the set are rejected) or looking ahead gives the plain engine's tokens."""
    engine, tok = engine_tok
    prompt = _prompt(tok, "Tell me a story.")
    allowed = tuple(tok.encode(" the old man and the sea said yes"))
    reqs = {"greedy": (prompt, SamplingParams(max_tokens=16, temperature=0.0, allowed_token_ids=allowed)),
            "drawn": (prompt, SamplingParams(max_tokens=16, temperature=0.9, seed=5, allowed_token_ids=allowed))}
    want = {rid: _outputs(engine, {rid: r})[rid] for rid, r in reqs.items()}
    assert all(set(w[0]) <= set(allowed) and len(w[0]) == 16 for w in want.values()), want
    spec, _ = _local(speculative_tokens=3)
    assert _outputs(spec, {"greedy": reqs["greedy"]})["greedy"] == want["greedy"]
    # its drafts are argmaxes over the allowed ids (the raw argmax: 5 of 26 accepted here, measured)
    assert spec.stats["drafts_accepted"] * 3 >= spec.stats["drafts_proposed"] > 0, spec.stats
    assert _outputs(spec, {"drawn": reqs["drawn"]})["drawn"] == want["drawn"]
    ahead, _ = _local(cuda_graphs="eager")
    assert {rid: _outputs(ahead, {rid: r})[rid] for rid, r in reqs.items()} == want
    assert spec.stats["drafts_proposed"] > 0 and ahead.stats["ahead_steps"] > 0


def test_regex_choice_and_grammar_outputs_plain_drafting_and_looking_ahead_agree(engine_tok):
    """vLLM's structured outputs other than JSON (EBNF grammars from ``cluster.guided``): each output is one the
    grammar takes, and drafting (MTP) and looking ahead give the plain engine's tokens; greedy and seeded drawn."""
    import re

    from cluster.guided import choice_grammar, ebnf_grammar, regex_grammar

    engine, tok = engine_tok
    prompt = _prompt(tok, "Is the sea old?")
    choices = ["yes", "no", "the old sea"]
    words = r"[a-z]{2,6}( [a-z]{2,6}){1,3}\."
    cases = {"regex": (regex_grammar(words), lambda t: re.fullmatch(words, t)),
             "choice": (choice_grammar(choices), lambda t: t in choices),
             "grammar": (ebnf_grammar('root ::= "The answer is " ("yes" | "no") "."'),
                         lambda t: t in ("The answer is yes.", "The answer is no."))}
    reqs = {f"{kind}-{how}": (prompt, SamplingParams(max_tokens=40, grammar=src, **kw))
            for kind, (src, _) in cases.items()
            for how, kw in (("greedy", {"temperature": 0.0}), ("drawn", {"temperature": 1.0, "seed": 11}))}
    want = {rid: _outputs(engine, {rid: r})[rid] for rid, r in reqs.items()}
    for rid, (ids, text, reason) in want.items():
        assert reason == "stop" and cases[rid.split("-")[0]][1](text), (rid, text, reason)
    spec, _ = _local(speculative_tokens=3)
    assert {rid: _outputs(spec, {rid: r})[rid] for rid, r in reqs.items()} == want
    ahead, _ = _local(cuda_graphs="eager")
    assert {rid: _outputs(ahead, {rid: r})[rid] for rid, r in reqs.items()} == want
    assert spec.stats["drafts_proposed"] > 0 and ahead.stats["ahead_steps"] > 0
