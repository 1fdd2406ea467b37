"""Disaggregated prefill over HTTP (``cluster/disagg.py``): an app whose ``PrefillCoordinator`` replica computes the
prompts (in chunks of 64 tokens) and hands their KV to the ``Coordinator`` replica, which decodes. Answers equal one
engine's that computed the prompt itself; the decode replica reports the transferred tokens as cached, and asks only for
the part of a prompt it does not hold cached; short prompts and prompt-logprob requests stay on the decode replica; a
dead prefill replica costs the prompt's computation there, not the request."""

from __future__ import annotations

import time

import pytest

from tests.integration.test_serve import MODEL, metric, post

pytestmark = pytest.mark.ray
openai = pytest.importorskip("openai")

STORY = "Once upon a time, in a quiet village by the sea, there lived a fisherman and his wife, who " * 3
ENGINE = {"served_model_name": MODEL, "device": "cpu", "kv_cache_tokens": 4096, "max_model_len": 512}


@pytest.fixture(scope="module")
def url(serve_session, text_ckpt):
    from ray import serve

    from cluster.serve import build_app

    serve.run(build_app({"model": str(text_ckpt), **ENGINE,
                         "prefill": {"num_replicas": 1, "max_num_batched_tokens": 64}}),
              name="disagg", route_prefix="/disagg",
              logging_config={"enable_access_log": False, "log_level": "WARNING"})
    yield serve_session + "/disagg"
    serve.delete("disagg")


@pytest.fixture(scope="module")
def reference(text_ckpt):
    """One engine, in this process, that computes every prompt itself."""
    from cluster.config import EngineConfig
    from cluster.local import build_local_engine

    engine, tokenizer = build_local_engine(EngineConfig.from_dict({"model": str(text_ckpt), **ENGINE,
                                                                   "prefix_caching": False}), progress=False)
    return engine, tokenizer


def answer(reference, text: str, max_tokens: int) -> str:
    from scheduler.request import SamplingParams
    from tests.conftest import run_engine

    engine, tokenizer = reference
    ids = run_engine(engine, {"r": (tokenizer.encode(text), SamplingParams(max_tokens=max_tokens, temperature=0.0))})
    return tokenizer.decode(ids["r"], skip_special_tokens=True)


def test_a_prompt_prefilled_on_another_replica_decodes_to_one_engines_answer(url, reference):
    for i, prompt in enumerate((STORY + "[one]", STORY * 2 + "[two]")):
        status, out = post(url, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 12,
                                                    "temperature": 0})
        assert status == 200, out
        n = out["usage"]["prompt_tokens"]
        # the decode replica never saw the prompt: what it found cached came from the prefill replica
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16 > 0, (i, out["usage"])
        assert out["choices"][0]["text"] == answer(reference, prompt, 12)
    assert metric(url, "glmserve_kv_imported_tokens_total") > 0


def test_streamed_chat_through_both_replicas(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": STORY + "[chat]"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and chunks[-1].usage.completion_tokens == 10


def test_a_next_turn_moves_only_the_kv_past_what_the_decode_replica_holds(url, reference):
    """A conversation's turn 2 repeats turn 1 and adds to it: the decode replica holds turn 1's blocks and asks the
    prefill replica for the rest only; the same prompt again is computed where it is cached (nothing to ask for)."""
    first = STORY + "[turn one]"
    status, out = post(url, "/v1/completions", {"model": MODEL, "prompt": first, "max_tokens": 8, "temperature": 0})
    assert status == 200, out
    imported = metric(url, "glmserve_kv_imported_tokens_total")
    local = metric(url, "glmserve_prefill_local_prompts_total")
    second = first + out["choices"][0]["text"] + " And then, in turn two, the fisherman said:"
    status, out2 = post(url, "/v1/completions", {"model": MODEL, "prompt": second, "max_tokens": 8, "temperature": 0})
    assert status == 200 and out2["choices"][0]["text"] == answer(reference, second, 8), out2
    n1, n2 = out["usage"]["prompt_tokens"], out2["usage"]["prompt_tokens"]
    moved = metric(url, "glmserve_kv_imported_tokens_total") - imported
    assert 0 < moved <= (n2 - 1) // 16 * 16 - (n1 - 1) // 16 * 16, (moved, n1, n2)      # turn 1's blocks stayed
    assert out2["usage"]["prompt_tokens_details"]["cached_tokens"] == (n2 - 1) // 16 * 16
    status, out3 = post(url, "/v1/completions", {"model": MODEL, "prompt": second, "max_tokens": 8, "temperature": 0})
    assert status == 200 and out3["choices"][0]["text"] == out2["choices"][0]["text"]
    assert metric(url, "glmserve_kv_imported_tokens_total") - imported == moved
    assert metric(url, 'glmserve_prefill_local_prompts_total{reason="cached"}') == local + 1


def test_prompts_arriving_together_with_one_head_move_its_kv_once(url, reference):
    """Three requests at once whose prompts share a long head (agents with one system prompt): one asks for the head's
    KV, the others wait for it, then find the head cached and compute their short rest there."""
    from concurrent.futures import ThreadPoolExecutor

    head = "[a shared system prompt] " + STORY * 2
    local = metric(url, 'glmserve_prefill_local_prompts_total{reason="cached"}')
    prompts = [head + f"[agent {i}]" for i in range(3)]
    with ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(lambda p: post(url, "/v1/completions", {"model": MODEL, "prompt": p, "max_tokens": 6,
                                                                   "temperature": 0}), prompts))
    for p, (status, out) in zip(prompts, outs):
        assert status == 200 and out["choices"][0]["text"] == answer(reference, p, 6), out
    assert metric(url, 'glmserve_prefill_local_prompts_total{reason="cached"}') == local + 2


def test_short_prompts_and_prompt_logprobs_stay_on_the_decode_replica(url, reference):
    before = metric(url, "glmserve_kv_imported_tokens_total")
    status, out = post(url, "/v1/completions", {"model": MODEL, "prompt": "The old man", "max_tokens": 5,
                                                "temperature": 0})
    assert status == 200 and out["choices"][0]["text"] == answer(reference, "The old man", 5)
    prompt = STORY + "[logprobs]"
    status, out = post(url, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0,
                                                "echo": True, "logprobs": 0})
    assert status == 200 and out["choices"][0]["text"] == prompt + answer(reference, prompt, 5)
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert metric(url, "glmserve_kv_imported_tokens_total") == before


def test_bad_requests_are_answered_as_without_disaggregation(url):
    status, err = post(url, "/v1/completions", {"model": MODEL, "prompt": STORY * 9, "max_tokens": 5})
    assert status == 400 and err["error"]["code"] == "context_length_exceeded", err
    status, err = post(url, "/v1/completions", {"model": MODEL, "prompt": STORY, "max_tokens": 5, "top_p": 7})
    assert status == 400 and err["error"]["param"] == "top_p", err


def test_a_dead_prefill_replica_costs_the_prompts_computation_not_the_request(url, reference):
    """The last test: its prefill replica is killed (Serve starts another). The next request waits at most
    PREFILL_REACH_S for a prefill replica, then its decode replica computes the prompt."""
    import ray

    from cluster.coordinator import PREFILL_REACH_S

    replica = next(a for a in ray.util.list_named_actors(all_namespaces=True)
                   if "PrefillCoordinator" in a["name"])
    ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]), no_restart=True)
    prompt = "[after the prefill replica died] " + STORY      # (no prefix the decode replica has cached)
    start = time.monotonic()
    status, out = post(url, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0})
    assert status == 200, out
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0        # computed on the decode replica
    assert out["choices"][0]["text"] == answer(reference, prompt, 6)
    assert time.monotonic() - start < PREFILL_REACH_S + 20
