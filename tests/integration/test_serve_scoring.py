"""Scoring over HTTP, as lm-eval's ``local-completions`` asks for it: ``/v1/completions`` with a batch of prompts
(texts or token ids), ``echo`` and ``logprobs`` — each prompt token's logprob (the first one's null) — and
``max_tokens`` 0 for the prompt alone; and vLLM's ``prompt_logprobs`` on both endpoints. On a replica with prefix caching on (a request for its prompt's logprobs takes
no cached block). Its own app beside test_serve.py's."""

from __future__ import annotations

import pytest

from tests.integration.test_serve import MODEL, post

pytestmark = pytest.mark.ray
openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def url(serve_session, text_ckpt):
    from ray import serve

    from cluster.serve import build_app

    serve.run(build_app({"model": str(text_ckpt), "served_model_name": MODEL, "device": "cpu", "kv_cache_tokens": 4096,
                         "max_num_batched_tokens": 32, "max_num_seqs": 8, "max_waiting": 8, "prefix_caching": True}),
              name="score", route_prefix="/score", logging_config={"enable_access_log": False, "log_level": "WARNING"})
    yield serve_session + "/score"
    serve.delete("score")


@pytest.fixture(scope="module")
def tok(text_ckpt):
    from models.tokenizer import Tokenizer

    return Tokenizer.from_dir(text_ckpt)


def score(url, prompt, **kw) -> dict:
    status, out = post(url, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 0, "echo": True,
                                                "logprobs": 1, "temperature": 0, **kw})
    assert status == 200, out
    return out


def test_a_prompt_token_scores_as_the_same_token_sampled(url, tok):
    """The oracle inside the server: a greedy token's logprob (its prompt's last row) equals that token's logprob as
    the last token of a longer prompt scored in 32-token chunks, and it is its row's top-1 (lm-eval's is_greedy); a
    prompt scored twice (the second time its blocks are cached) scores the same."""
    ids = tok.encode("The old man and the sea, a story told by the fire of a long winter night when the")
    status, gen = post(url, "/v1/completions", {"model": MODEL, "prompt": ids, "max_tokens": 1, "logprobs": 1,
                                                "temperature": 0, "ignore_eos": True})
    assert status == 200, gen
    sampled = gen["choices"][0]["logprobs"]
    t = tok.encode(sampled["tokens"][0])
    body = score(url, ids + t)
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(ids) + len(t) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert abs(lp["token_logprobs"][len(ids)] - sampled["token_logprobs"][0]) < 1e-4, (lp, sampled)
    assert list(lp["top_logprobs"][len(ids)]) == [sampled["tokens"][0]]
    assert all(v <= 0 for v in lp["token_logprobs"][1:])
    assert body["choices"][0]["text"] == tok.decode(ids + t) and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == len(ids) + len(t)
    again = score(url, ids + t)
    assert again["choices"][0]["logprobs"] == lp and again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_a_batch_of_prompts_with_n_choices(url, tok):
    """Two text prompts and two id prompts, n = 2: choice 2p + i answers prompt p (its text echoed first, its own
    prompt tokens' logprobs); usage counts each prompt once; streamed, the same choices."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    texts = ["Once upon a time", "The old man said"]
    kw = {"model": MODEL, "max_tokens": 3, "temperature": 0, "n": 2, "echo": True, "logprobs": 2,
          "extra_body": {"ignore_eos": True}}
    for prompts, shown in ((texts, texts), ([tok.encode(t) for t in texts], texts)):
        out = client.completions.create(prompt=prompts, **kw)
        assert [c.index for c in out.choices] == [0, 1, 2, 3]
        alone = [client.completions.create(prompt=p, **{**kw, "n": 1}).choices[0] for p in prompts]
        for c in out.choices:
            want = alone[c.index // 2]
            assert c.text.startswith(shown[c.index // 2]) and c.text == want.text, (c.text, want.text)
            assert c.logprobs.token_logprobs == pytest.approx(want.logprobs.token_logprobs, abs=1e-4)
            assert c.logprobs.tokens == want.logprobs.tokens
        assert out.usage.prompt_tokens == sum(len(tok.encode(t)) for t in texts)
        assert out.usage.completion_tokens == 4 * 3
        stream = client.completions.create(prompt=prompts, stream=True, **kw)
        streamed = {}
        for chunk in stream:
            for c in chunk.choices:
                streamed[c.index] = streamed.get(c.index, "") + c.text
        assert streamed == {c.index: c.text for c in out.choices}


def test_vllms_prompt_logprobs_on_both_endpoints(url, tok):
    """vLLM's ``prompt_logprobs``: a completion's choices and a chat's answer carry each prompt token's logprob (as
    echo's), rank and the most likely tokens there; streamed, a 400 naming it."""
    ids = tok.encode("Once upon a time there was")
    body = score(url, ids, prompt_logprobs=2)
    choice = body["choices"][0]
    rows = choice["prompt_logprobs"]
    assert rows[0] is None and len(rows) == len(ids)
    for t, row, lp in zip(ids[1:], rows[1:], choice["logprobs"]["token_logprobs"][1:]):
        mine = row[str(t)]
        assert mine["logprob"] == lp and mine["decoded_token"] == tok.decode([t], skip_special_tokens=False)
        assert sorted(v["rank"] for v in row.values())[:2] == [1, 2] and 2 <= len(row) <= 3, row   # the top 2 too
        assert (mine["rank"] == 1) == (max(row.values(), key=lambda v: v["logprob"]) is mine)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "prompt_logprobs": 0}
    status, out = post(url, "/v1/chat/completions", chat)
    assert status == 200 and out["prompt_logprobs"][0] is None and len(out["prompt_logprobs"]) == \
        out["usage"]["prompt_tokens"], out
    assert all(len(row) == 1 for row in out["prompt_logprobs"][1:])
    status, err = post(url, "/v1/chat/completions", {**chat, "stream": True})
    assert status == 400 and err["error"]["param"] == "prompt_logprobs", err


@pytest.mark.parametrize("body,param", [
    ({"prompt": "Hi", "max_tokens": 0}, "max_tokens"),                       # no echo: nothing to answer
    ({"prompt": [[1, 2], []]}, "prompt"), ({"prompt": [[1], "a"]}, "prompt"),
    ({"prompt": [[1], [10**9]], "echo": True}, "prompt"),                   # an echoed id out of the vocabulary
    ({"prompt": ["Hi"] * 5, "n": 8, "max_tokens": 1}, "prompt"),             # more choices than the server admits
    ({"prompt": "Hi", "stop_token_ids": [10**7], "min_tokens": 2}, "stop_token_ids"),   # outside the vocabulary
    ({"prompt": "Hi", "stop_token_ids": list(range(301))}, "stop_token_ids"),
])
def test_a_bad_batch_is_a_400_naming_the_field(url, body, param):
    status, err = post(url, "/v1/completions", {"model": MODEL, **body})
    assert status == 400 and err["error"]["param"] == param, err
