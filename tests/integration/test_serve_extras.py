"""vLLM's request extras over HTTP, as its clients send them: ``cache_salt`` (prefix caching apart per salt),
``truncate_prompt_tokens``, ``include_stop_str_in_output``, ``allowed_token_ids``, ``return_tokens_as_token_ids``,
``return_token_ids``, ``stream_options.continuous_usage_stats``, structured outputs (``structured_outputs``,
``guided_*``); and the ``/ping`` and ``/version`` probes. Its own app (prefix caching on,
the default) beside test_serve.py's."""

from __future__ import annotations

import pytest

from tests.integration.test_serve import MODEL, get, post

pytestmark = pytest.mark.ray
openai = pytest.importorskip("openai")

STORY = "Once upon a time, in a quiet village by the sea, there lived a fisherman and his wife, who " * 2


@pytest.fixture(scope="module")
def url(serve_session, text_ckpt):
    from ray import serve

    from cluster.serve import build_app

    serve.run(build_app({"model": str(text_ckpt), "served_model_name": MODEL, "device": "cpu", "kv_cache_tokens": 4096,
                         "max_num_batched_tokens": 256, "max_model_len": 512}),
              name="extras", route_prefix="/extras",
              logging_config={"enable_access_log": False, "log_level": "WARNING"})
    yield serve_session + "/extras"
    serve.delete("extras")


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def complete(url, **kw) -> dict:
    status, out = post(url, "/v1/completions", {"model": MODEL, "max_tokens": 4, "temperature": 0, **kw})
    assert status == 200, out
    return out


def test_a_salted_prompt_finds_only_its_salts_cached_prefix(url):
    """The same prompt under salt a, again under a (cached), under b and unsalted (computed: another salt's blocks
    are not theirs), then unsalted again (cached); the answers are the same throughout."""
    prompt = STORY + "[salted]"
    runs = [complete(url, prompt=prompt, cache_salt=salt) for salt in ("a", "a", "b", None, None)]
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in runs]
    assert cached[0] == cached[2] == cached[3] == 0 and cached[1] == cached[4] > 0, cached
    assert len({r["choices"][0]["text"] for r in runs}) == 1
    chat = {"model": MODEL, "messages": [{"role": "user", "content": STORY}], "max_tokens": 2, "temperature": 0}
    first, again = (post(url, "/v1/chat/completions", {**chat, "cache_salt": "c"})[1] for _ in range(2))
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    status, err = post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "cache_salt": ""})
    assert status == 400 and err["error"]["param"] == "cache_salt", err


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(url):
    """The prompt's last k tokens, as if they were the prompt (echo shows them); -1: the server's max_model_len."""
    ids = post(url, "/tokenize", {"model": MODEL, "prompt": STORY})[1]["tokens"]
    kw = dict(max_tokens=6, ignore_eos=True)
    cut = complete(url, prompt=STORY, truncate_prompt_tokens=20, **kw)
    assert cut["usage"]["prompt_tokens"] == 20 < len(ids)
    assert cut["choices"][0]["text"] == complete(url, prompt=ids[-20:], **kw)["choices"][0]["text"]
    echoed = complete(url, prompt=STORY, truncate_prompt_tokens=20, echo=True, **kw)["choices"][0]["text"]
    head = post(url, "/detokenize", {"model": MODEL, "tokens": ids[-20:]})[1]["prompt"]
    assert echoed == head + cut["choices"][0]["text"]
    same = complete(url, prompt=STORY, truncate_prompt_tokens=-1, max_tokens=1)
    assert same["usage"]["prompt_tokens"] == len(ids)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": STORY}], "max_tokens": 1}
    assert post(url, "/v1/chat/completions", {**chat, "truncate_prompt_tokens": 8})[1]["usage"]["prompt_tokens"] == 8
    long = STORY * 200                                  # more text than the 512-token context could hold uncut
    assert post(url, "/v1/completions", {"model": MODEL, "prompt": long, "max_tokens": 1})[0] == 400
    assert complete(url, prompt=long, truncate_prompt_tokens=100, max_tokens=1)["usage"]["prompt_tokens"] == 100
    for k in (0, 513):                                  # 513: past max_model_len
        status, err = post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "truncate_prompt_tokens": k})
        assert status == 400 and err["error"]["param"] == "truncate_prompt_tokens", (k, err)


def test_include_stop_str_in_output_ends_the_text_after_the_stop_string(client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    text = client.completions.create(**kw).choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop.strip(), f"need a visible stop string in {text!r}"
    keep = {**kw["extra_body"], "include_stop_str_in_output": True}
    out = client.completions.create(stop=[stop], **{**kw, "extra_body": keep}).choices[0]
    assert out.text == text[: text.index(stop) + len(stop)] and out.finish_reason == "stop"
    streamed = client.completions.create(stop=[stop], stream=True, **{**kw, "extra_body": keep})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == out.text



def test_a_stop_token_ids_text_is_left_out_unless_kept(url):
    """vLLM's: an output ended by one of stop_token_ids leaves that token's text out (include_stop_str_in_output keeps
    it), and its stop_reason is the id."""
    kw = dict(prompt="Once upon a time", max_tokens=12, ignore_eos=True, logprobs=0, return_tokens_as_token_ids=True)
    free = complete(url, **kw)["choices"][0]
    ids = [int(t.removeprefix("token_id:")) for t in free["logprobs"]["tokens"]]
    at = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])       # its first time out: it ends there
    pieces = [post(url, "/detokenize", {"model": MODEL, "tokens": ids[:n]})[1]["prompt"] for n in (at, at + 1)]
    for keep, text in ((False, pieces[0]), (True, pieces[1])):
        out = complete(url, stop_token_ids=[ids[at]], include_stop_str_in_output=keep, **kw)["choices"][0]
        assert (out["text"], out["finish_reason"], out["stop_reason"]) == (text, "stop", ids[at]), (keep, out)
        assert len(out["logprobs"]["tokens"]) == at + 1                     # the token itself is still out


def test_allowed_token_ids_hold_the_output_and_logprobs_can_name_ids(url):
    """Every token sampled (greedy and drawn) is one of allowed_token_ids; with return_tokens_as_token_ids the logprobs
    name tokens "token_id:<id>" (a completion's and a chat's)."""
    allowed = post(url, "/tokenize", {"model": MODEL, "prompt": " the sea and a"})[1]["tokens"]
    for temperature in (0, 1.0):
        out = complete(url, prompt="Once upon a time", max_tokens=12, temperature=temperature, seed=3, logprobs=2,
                       ignore_eos=True, allowed_token_ids=allowed, return_tokens_as_token_ids=True)
        names = out["choices"][0]["logprobs"]["tokens"]
        assert len(names) == 12 and {int(n.removeprefix("token_id:")) for n in names} <= set(allowed), names
        assert all(k.startswith("token_id:") for top in out["choices"][0]["logprobs"]["top_logprobs"] for k in top)
    chat = post(url, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                              "max_tokens": 3, "logprobs": True, "top_logprobs": 1,
                                              "return_tokens_as_token_ids": True})[1]
    assert all(c["token"].startswith("token_id:") for c in chat["choices"][0]["logprobs"]["content"]), chat
    status, err = post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "allowed_token_ids": [10**9]})
    assert status == 400 and err["error"]["param"] == "allowed_token_ids", err
    status, err = post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "allowed_token_ids": []})
    assert status == 400 and err["error"]["param"] == "allowed_token_ids", err


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(client):
    chunks = list(client.completions.create(model=MODEL, prompt=STORY, max_tokens=8, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}, stream_options={
                                                "include_usage": True, "continuous_usage_stats": True}))
    counted = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counted == sorted(counted) and counted[-1] == 8 == chunks[-1].usage.completion_tokens
    assert all(c.usage.prompt_tokens == chunks[-1].usage.prompt_tokens for c in chunks)       # one prompt here
    two = list(client.completions.create(model=MODEL, prompt=["Hello there", STORY], max_tokens=4, n=2, stream=True,
                                         extra_body={"ignore_eos": True}, stream_options={
                                             "include_usage": True, "continuous_usage_stats": True}))
    for i in range(4):                                  # each choice's own count, beside its own prompt's size
        mine = [c.usage for c in two if c.choices and c.choices[0].index == i]
        assert [u.completion_tokens for u in mine][-1] == 4 and len({u.prompt_tokens for u in mine}) == 1, mine
    assert two[-1].usage.completion_tokens == 16
    plain = list(client.completions.create(model=MODEL, prompt=STORY, max_tokens=3, temperature=0, stream=True,
                                           stream_options={"include_usage": True}))
    assert all(c.usage is None for c in plain if c.choices) and plain[-1].usage.completion_tokens == 3


def test_ping_and_version(url):
    assert get(url, "/ping") == (200, {"status": "ok"})
    assert post(url, "/ping", b"") == (200, {"status": "ok"})
    status, out = get(url, "/version")
    assert status == 200 and isinstance(out["version"], str) and out["version"]


def test_structured_outputs_hold_the_answer(url):
    """vLLM's structured outputs — ``structured_outputs`` {choice, regex, json, grammar} and the older guided_* —
    hold a completion's and a chat's answer; more than one, or one the grammar cannot take, is a 400 naming it."""
    import json
    import re

    ask = lambda **kw: complete(url, prompt="The old man said", **{"max_tokens": 30, **kw})["choices"][0]  # noqa: E731
    assert ask(guided_choice=["yes", "no"])["text"] in ("yes", "no")
    assert ask(structured_outputs={"choice": ["the sea", "the sky"]}, temperature=1.0, seed=2)["text"] in (
        "the sea", "the sky")
    assert re.fullmatch(r"[0-9]{3}-[a-z]+", ask(structured_outputs={"regex": "[0-9]{3}-[a-z]+"})["text"])
    out = ask(guided_json={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
              max_tokens=60)
    assert out["finish_reason"] == "stop" and isinstance(json.loads(out["text"])["n"], int), out
    assert ask(guided_grammar='root ::= "A" [0-9] "."')["text"] in {f"A{d}." for d in range(10)}
    assert ask(guided_choice=["über", "😀 yes"])["text"] in ("über", "😀 yes")      # their own text, not escapes
    dead = ask(guided_grammar='root ::= "ab" []', logprobs=1)                         # a dead end: the output ends
    assert dead["text"] == "ab" and all(lp is not None for lp in dead["logprobs"]["token_logprobs"]), dead
    chat = post(url, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Yes or no?"}], "max_tokens": 10, "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False}, "structured_outputs": {"choice": ["Yes", "No"]}})[1]
    assert chat["choices"][0]["message"]["content"] in ("Yes", "No"), chat
    for body, param in (({"guided_choice": ["a"], "guided_regex": "b"}, "guided_choice"),
                        ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
                        ({"structured_outputs": {"structural_tag": {}}}, "structured_outputs.structural_tag"),
                        ({"guided_grammar": "root ::= "}, "guided_grammar"),
                        ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos"),
                        ({"guided_grammar": "root ::= []"}, "structured_outputs"),      # takes no output at all
                        ({"structured_outputs": {"json_object": 0}}, "structured_outputs.json_object")):
        status, err = post(url, "/v1/completions", {"model": MODEL, "prompt": "x", **body})
        assert status == 400 and err["error"]["param"] == param, (body, err)


def test_return_token_ids_gives_the_prompts_and_outputs_ids(url):
    """vLLM's return_token_ids (what RL rollouts read instead of tokenizing the text again): a completion's choices
    carry their prompt's ids and their own; a chat's prompt ids sit beside its choices; streamed, each chunk the ids
    since the last one (the prompt's in the first) — together the whole answer's."""
    ids = post(url, "/tokenize", {"model": MODEL, "prompt": "The old man said"})[1]["tokens"]
    kw = dict(prompt="The old man said", max_tokens=6, ignore_eos=True, logprobs=0, return_tokens_as_token_ids=True,
              return_token_ids=True, n=2, temperature=1.0, seed=5)
    whole = complete(url, **kw)["choices"]
    for c in whole:
        assert c["prompt_token_ids"] == ids and len(c["token_ids"]) == 6
        assert c["token_ids"] == [int(t.removeprefix("token_id:")) for t in c["logprobs"]["tokens"]]
    stream = _sse(url, "/v1/completions", {"model": MODEL, **kw, "stream": True})
    for i in range(2):
        mine = [c["choices"][0] for c in stream if c.get("choices") and c["choices"][0]["index"] == i]
        assert mine[0]["prompt_token_ids"] == ids and all("prompt_token_ids" not in c for c in mine[1:])
        assert [t for c in mine for t in c["token_ids"]] == whole[i]["token_ids"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0,
            "return_token_ids": True}
    body = post(url, "/v1/chat/completions", chat)[1]
    assert body["prompt_token_ids"] == post(url, "/tokenize", {"model": MODEL, "messages": chat["messages"]})[1][
        "tokens"] and len(body["choices"][0]["token_ids"]) == body["usage"]["completion_tokens"]
    chunks = _sse(url, "/v1/chat/completions", {**chat, "stream": True})
    assert chunks[0]["prompt_token_ids"] == body["prompt_token_ids"]
    assert [t for c in chunks if c.get("choices") for t in c["choices"][0]["token_ids"]] == \
        body["choices"][0]["token_ids"]


def _sse(url, path, body) -> list[dict]:
    """A streamed answer's chunks (the data lines before [DONE])."""
    import json
    import urllib.request

    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        lines = [ln.decode().removeprefix("data: ").strip() for ln in r if ln.startswith(b"data: ")]
    return [json.loads(ln) for ln in lines if ln != "[DONE]"]


def test_request_level_metrics(url):
    """vLLM's request-level series (its dashboards read them): end-to-end latency, prompt and generation lengths of
    finished requests, prompt tokens started (a counter since session 57)."""
    from tests.integration.test_serve import metric

    before = {k: metric(url, k) for k in ("glmserve_e2e_request_latency_seconds_count",
                                          "glmserve_request_generation_tokens_sum",
                                          "glmserve_request_prompt_tokens_sum", "glmserve_prompt_tokens_total")}
    out = complete(url, prompt=STORY, max_tokens=7, ignore_eos=True)
    after = {k: metric(url, k) for k in before}
    assert after["glmserve_e2e_request_latency_seconds_count"] == before[
        "glmserve_e2e_request_latency_seconds_count"] + 1
    assert after["glmserve_request_generation_tokens_sum"] - before["glmserve_request_generation_tokens_sum"] == 7
    prompt = out["usage"]["prompt_tokens"]
    assert after["glmserve_request_prompt_tokens_sum"] - before["glmserve_request_prompt_tokens_sum"] == prompt
    assert after["glmserve_prompt_tokens_total"] - before["glmserve_prompt_tokens_total"] == prompt
