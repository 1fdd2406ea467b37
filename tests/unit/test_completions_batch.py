"""The completions endpoint's batches and prompt scores (``cluster/protocol.py``, ``cluster/serve.py::Formatter``):
``prompt`` as a batch of texts or of token ids (choice ``p * n + i``), ``echo`` with ``logprobs`` (the prompt's tokens
first, the first one's logprob null), ``max_tokens`` 0 (the prompt and its logprobs alone: a scoring request), vLLM's
``prompt_logprobs`` (each prompt token's logprob and rank, and the most likely tokens there)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from cluster.engine import TokenEvent
from cluster.formatter import Formatter
from cluster.protocol import ApiError, CompletionRequest, validation_error
from workers.runner import TokenLogprobs


def _tok():
    from cluster.config import DEFAULT_MODEL
    from models.tokenizer import Tokenizer

    return Tokenizer.from_dir(DEFAULT_MODEL)


def _ingress(tok=None):
    return type("I", (), {"model_name": "m", "tokenizer": tok, "think_end": None})()


async def _choices(evs):
    for i, ev in evs:
        yield i, ev


@pytest.mark.parametrize("prompt,batch", [("p", ["p"]), (["p"], ["p"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]),
                                          ([[1, 2], [3]], [[1, 2], [3]])])
def test_a_prompt_is_a_text_ids_or_a_batch_of_either(prompt, batch):
    assert CompletionRequest.model_validate({"model": "m", "prompt": prompt}).prompts == batch


@pytest.mark.parametrize("prompt", [[], [[]], [[1], "a"], [[1.0]], [[1], 2], [["a"]], [[True]]])
def test_a_malformed_batch_is_refused_naming_the_prompt(prompt):
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    assert validation_error(e.value).param == "prompt"


def test_max_tokens_zero_needs_echo():
    with pytest.raises(ApiError) as e:
        CompletionRequest.model_validate({"model": "m", "prompt": "p", "max_tokens": 0}).check_supported()
    assert (e.value.status, e.value.param) == (400, "max_tokens") and "echo" in e.value.message
    body = CompletionRequest.model_validate({"model": "m", "prompt": "p", "max_tokens": 0, "echo": True, "logprobs": 2})
    body.check_supported()
    assert body.prompt_alternatives() == 2
    assert CompletionRequest.model_validate({"model": "m", "prompt": "p", "logprobs": 2}).prompt_alternatives() is None
    both = {"model": "m", "prompt": "p", "echo": True, "logprobs": 1, "prompt_logprobs": 4}
    assert CompletionRequest.model_validate(both).prompt_alternatives() == 4        # the more of the two


def _echo_case(tok, echo_only: bool = False):
    text = "Hello 日本 world"
    ids = tok.encode(text)
    prompt_lps = [TokenLogprobs(-0.25 * j, ((ids[j], -0.25 * j), (7, -3.0)), 1) for j in range(1, len(ids))]
    a, b = tok.encode(" it")[0], tok.encode("!")[0]       # (one token each)
    evs = [(0, TokenEvent("r", [a], tok.decode([a]), logprobs=[TokenLogprobs(-1.5, ((a, -1.5),))],
                          prompt_logprobs=prompt_lps)),
           (0, TokenEvent("r", [b], "!", True, "length", logprobs=[TokenLogprobs(-2.5, ((b, -2.5),))]))]
    return text, ids, evs, Formatter(_ingress(tok), "c", False, [ids], 1, echoes=[text], echo_only=echo_only)


def test_echo_with_logprobs_puts_the_prompts_tokens_first():
    tok = _tok()
    text, ids, evs, fmt = _echo_case(tok)
    choice = asyncio.run(fmt.whole(_choices(evs), 1))["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == text + " it!"
    every = [*ids, *(ev.token_ids[0] for _, ev in evs)]
    names = [tok.decode([t], skip_special_tokens=False) for t in every]        # (a piece of a character: its bytes)
    assert lp["tokens"] == [n if "\ufffd" not in n else "bytes:" + "".join(f"\\x{b:02x}" for b in tok.token_bytes(t))
                            for n, t in zip(names, every)]
    assert lp["token_logprobs"] == [None] + [-0.25 * j for j in range(1, len(ids))] + [-1.5, -2.5]
    assert lp["top_logprobs"][0] is None and len(lp["top_logprobs"][1]) == 1      # logprobs 1 of the 2 computed
    prompt_offsets = lp["text_offset"][:len(ids)]
    assert prompt_offsets[0] == 0 and prompt_offsets == sorted(prompt_offsets)
    for token, at in zip(lp["tokens"][:len(ids)], prompt_offsets):
        assert token.startswith("bytes:\\x") or text[at:].startswith(token), (token, at)
    assert lp["text_offset"][len(ids):] == [len(text), len(text) + 3]

    async def stream():
        _, _, evs, fmt = _echo_case(tok)
        return [json.loads(c[6:]) async for c in fmt.sse(_choices(evs), False) if c.startswith("data: {")]

    chunks = stream_chunks = asyncio.run(stream())
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    joined = {k: sum((c["choices"][0]["logprobs"][k] for c in stream_chunks), []) for k in lp}
    assert joined == lp


def test_max_tokens_zero_answers_the_prompt_alone():
    """max_tokens 0 with echo: the engine samples one token, which the answer does not show."""
    tok = _tok()
    text, ids, evs, fmt = _echo_case(tok, echo_only=True)
    body = asyncio.run(fmt.whole(_choices(evs[:1] + [(0, TokenEvent("r", [], "", True, "length"))]), 1))
    choice = body["choices"][0]
    assert choice["text"] == text and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(ids) and choice["logprobs"]["token_logprobs"][-1] == -0.25 * (
        len(ids) - 1)
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == len(ids)


def test_a_batch_indexes_its_choices_prompt_times_n():
    """Two prompts, n = 2: choice 2p + i answers prompt p, echoed before it; usage counts each prompt once, and the
    cached tokens each prompt's first choice found."""
    prompts, echoes = [[1, 2, 3], [4, 5]], ["abc", "de"]
    fmt = Formatter(_ingress(), "c", False, prompts, None, n=2, echoes=echoes)
    evs = [(c, TokenEvent("r", [9], f"<{c}>", True, "length", num_cached_tokens=c + 1)) for c in (3, 1, 0, 2)]
    body = asyncio.run(fmt.whole(_choices(evs), 4))
    assert [c["text"] for c in body["choices"]] == ["abc<0>", "abc<1>", "de<2>", "de<3>"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"]["prompt_tokens"] == 5 and body["usage"]["completion_tokens"] == 4
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 1 + 3


def test_vllms_prompt_logprobs_beside_echos():
    """``prompt_logprobs`` 1 beside echo's ``logprobs`` 2 (the engine computed the top 2): vLLM's shape — null, then per
    token {id: {logprob, rank, decoded_token}} for the token and the top 1 — and echo's top 2; a chat's sits beside its
    choices."""
    tok = _tok()
    text, ids, evs, _ = _echo_case(tok)
    fmt = Formatter(_ingress(tok), "c", False, [ids], 2, echoes=[text], prompt_top=1)
    choice = asyncio.run(fmt.whole(_choices(evs), 1))["choices"][0]
    got = choice["prompt_logprobs"]
    assert got[0] is None and len(got) == len(ids)
    for j, row in enumerate(got[1:], start=1):
        want = {str(ids[j]): {"logprob": -0.25 * j, "rank": 1, "decoded_token": tok.decode([ids[j]],
                                                                                        skip_special_tokens=False)}}
        assert row == want, (row, want)                 # the token is its row's top 1 here: one entry
    assert all(len(t) == 2 for t in choice["logprobs"]["top_logprobs"][1:len(ids)])
    chat = Formatter(_ingress(tok), "c", True, [ids], None, prompt_top=0)
    body = asyncio.run(chat.whole(_choices(evs), 1))
    assert len(body["prompt_logprobs"]) == len(ids) and "prompt_logprobs" not in body["choices"][0]
    with pytest.raises(ApiError) as e:
        CompletionRequest.model_validate({"model": "m", "prompt": "p", "prompt_logprobs": 1, "stream": True}
                                         ).check_supported()
    assert e.value.param == "prompt_logprobs"


def test_top_logprobs_hold_the_token_itself():
    """OpenAI's completions: each token's top_logprobs hold the token too, where it is not among the top n (up to
    n + 1 entries); logprobs 0: the token alone."""
    tok = _tok()
    evs = [(0, TokenEvent("r", [40], " it", True, "length", logprobs=[TokenLogprobs(-5.0, ((99, -0.1),))]))]
    for n, want in ((1, {tok.decode([99]): -0.1, tok.decode([40]): -5.0}), (0, {tok.decode([40]): -5.0})):
        fmt = Formatter(_ingress(tok), "c", False, [[1]], n)
        assert asyncio.run(fmt.whole(_choices(evs), 1))["choices"][0]["logprobs"]["top_logprobs"] == [want]


def test_a_scored_prompt_that_fills_the_context_says_so():
    from cluster.serve import _check_context

    body = CompletionRequest.model_validate({"model": "m", "prompt": [1] * 8, "max_tokens": 0, "echo": True})
    with pytest.raises(ApiError) as e:
        _check_context(body, [1] * 8, 1, chat=False, context=8)
    assert e.value.param == "prompt" and "max_tokens 0" in e.value.message and "(1)" not in e.value.message


def test_stop_token_ids_reach_the_engine():
    body = CompletionRequest.model_validate({"model": "m", "prompt": "p", "stop_token_ids": [611, 7]})
    assert body.sampling_params(4, None).stop_token_ids == (611, 7)
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"model": "m", "prompt": "p", "stop_token_ids": [-1]})
    assert validation_error(e.value).param == "stop_token_ids"


def test_logprobs_up_to_twenty_as_vllm():
    assert CompletionRequest.model_validate({"model": "m", "prompt": "p", "logprobs": 20}).logprobs == 20
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"model": "m", "prompt": "p", "logprobs": 21})
    assert validation_error(e.value).param == "logprobs"


def test_text_offsets_of_a_speculative_steps_tokens_and_partial_characters_by_their_bytes():
    """Session 57's stream review: a step that commits several tokens (MTP) among which a character split in byte
    tokens or a special token: each token sits where its bytes start in the text (日 in three: all at 日; the special
    token adds nothing), whole and streamed alike; a token that holds part of a character is named by its bytes
    (OpenAI's "bytes:\\xe6"), so that two of them in one position's top_logprobs keep their own entries, and the
    sampled token's entry is its own logprob."""
    tok = _tok()
    pieces = [tok.token_bytes(t) for t in tok.encode("日")]
    assert len(pieces) == 3 and all(len(p) == 1 for p in pieces)       # the tiny tokenizer splits it in bytes
    ids = [*tok.encode("日"), *tok.encode("x"), *tok.encode("y"), tok.special_ids_by_token()["</think>"],
           *tok.encode("z")]
    lps = [TokenLogprobs(-1.0, ((ids[1], -0.5), (ids[2], -2.0), (t, -1.0))) for t in ids]
    evs = [(0, TokenEvent("r", ids[:4], "日x", logprobs=lps[:4])),
           (0, TokenEvent("r", ids[4:], "yz", True, "length", logprobs=lps[4:]))]
    want = [0, 0, 0, 1, 2, 3, 3]
    fmt = Formatter(_ingress(tok), "c", False, [[1]], 2)
    lp = asyncio.run(fmt.whole(_choices(evs), 1))["choices"][0]["logprobs"]
    assert lp["text_offset"] == want and lp["tokens"][:3] == [f"bytes:\\x{p[0]:02x}" for p in pieces]
    assert list(lp["top_logprobs"][0].items()) == [(lp["tokens"][1], -0.5), (lp["tokens"][2], -2.0),
                                                  (lp["tokens"][0], -1.0)]

    async def streamed():
        fmt = Formatter(_ingress(tok), "c", False, [[1]], 2)
        return [json.loads(c[6:]) async for c in fmt.sse(_choices(evs), False) if c.startswith("data: {")]

    assert sum((c["choices"][0]["logprobs"]["text_offset"] for c in asyncio.run(streamed())), []) == want


@pytest.mark.parametrize("field,body", [("stream_options", {"stream_options": {"include_usage": True}}),
                                        ("skip_special_tokens", {"skip_special_tokens": False, "stream": True})])
def test_fields_the_server_would_not_apply_are_refused(field, body):
    """OpenAI's and vLLM's 400 for ``stream_options`` without ``stream``; vLLM's ``skip_special_tokens: false`` is
    not applied here (the text always leaves special tokens out): a 400 naming it, not a silent answer without them."""
    with pytest.raises(ApiError) as e:
        CompletionRequest.model_validate({"model": "m", "prompt": "p", **body}).check_supported()
    assert (e.value.status, e.value.param) == (400, field)
    CompletionRequest.model_validate({"model": "m", "prompt": "p", "stream": True, "skip_special_tokens": True,
                                      "stream_options": {"include_usage": True}}).check_supported()


def test_top_k_minus_one_is_off_as_vllm_clients_send_it():
    """vLLM's clients send ``top_k: -1`` for no top-k (session 57's sampling review: a 400 here); below it a 400."""
    body = CompletionRequest.model_validate({"model": "m", "prompt": "p", "top_k": -1})
    assert body.sampling_params(4, None).top_k == 0
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"model": "m", "prompt": "p", "top_k": -2})
    assert validation_error(e.value).param == "top_k"
