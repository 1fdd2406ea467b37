"""Prompt logprobs (``SamplingParams.prompt_logprobs``; completions' ``echo`` with ``logprobs``): each prompt token's
logprob under the logits of the position before it, and the top n there — against one forward over the whole prompt,
whatever the chunks, the batch, a preemption, a cached prefix or the static (graph) path; the tokens sampled after
them are those of a request that asks for none."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from models.cache import KVCache, build_batch
from models.loader import load_model
from scheduler.request import SamplingParams
from tests.integration.test_graphs import make_engine, requests

BLOCK, TOP = 16, 3


@pytest.fixture(scope="module")
def model(text_ckpt):
    return load_model(text_ckpt, dtype=torch.float32, progress=False)


def reference(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
    """One forward over the whole prompt: each token after the first, its logprob, the top ``TOP`` (values, ids) and
    the bounds of its rank (the tokens within 1e-4 of it may rank either side of it in a chunked computation)."""
    blocks = -(-len(ids) // BLOCK)
    cache = KVCache(model.config, blocks * BLOCK, torch.float32)
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), build_batch([(0, len(ids), list(range(blocks)))], BLOCK, "cpu"), cache)
        logp = torch.log_softmax(model.logits(hidden), dim=-1)[:-1]
    top = logp.topk(TOP, dim=-1)
    chosen = logp.gather(1, torch.tensor(ids[1:])[:, None])
    rank = lambda margin: ((logp > chosen + margin).sum(-1) + 1).tolist()
    return chosen.squeeze(1), top.values, top.indices, list(zip(rank(1e-4), rank(-1e-4)))


def collect(engine, reqs: dict) -> dict[str, tuple[list[int], list | None, int]]:
    """Each request's (tokens, prompt logprobs, how many of its events carried them)."""
    out = {rid: ([], None, 0) for rid in reqs}
    for rid, (ids, params) in reqs.items():
        engine.add_request(ids, params, rid)
    while engine.has_unfinished():
        for ev in engine.step():
            assert ev.error is None, ev.error
            tokens, lps, carried = out[ev.req_id]
            if ev.prompt_logprobs is not None:
                lps, carried = ev.prompt_logprobs, carried + 1
            out[ev.req_id] = (tokens + ev.token_ids, lps, carried)
    assert engine.num_free_blocks() == sum(s.pool.num_blocks for s in engine.schedulers)
    return out


def asking(reqs: dict, n: int = TOP) -> dict:
    return {rid: (ids, replace(p, prompt_logprobs=n)) for rid, (ids, p) in reqs.items()}


def assert_match(model, reqs: dict, got: dict) -> None:
    for rid, (ids, _) in reqs.items():
        lps = got[rid][1]
        assert got[rid][2] == 1 and len(lps) == len(ids) - 1, (rid, got[rid][2], len(lps))
        want, top_values, top_ids, ranks = reference(model, ids)
        assert all(lo <= lp.rank <= hi for lp, (lo, hi) in zip(lps, ranks)), rid
        torch.testing.assert_close(torch.tensor([lp.logprob for lp in lps]), want, atol=1e-4, rtol=0)
        assert [[t for t, _ in lp.top] for lp in lps] == top_ids.tolist(), rid
        torch.testing.assert_close(torch.tensor([[v for _, v in lp.top] for lp in lps]), top_values, atol=1e-4, rtol=0)


@pytest.mark.parametrize("budget,graphs", [(256, False), (7, False), (16, True), (64, True)])
def test_prompt_logprobs_equal_one_forward_over_the_prompt(model, budget, graphs):
    """Eight prompts of 20..90 tokens at once, cut into chunks by the step budget (7: below index_topk, 16: at a
    block), on the eager path and the static one (graphs: chunks riding graph steps beside decode rows)."""
    reqs = requests(8, model.config.vocab_size, max_tokens=6)
    plain = collect(make_engine(model, graphs=False, budget=budget), reqs)
    engine = make_engine(model, graphs=graphs, budget=budget)
    got = collect(engine, asking(reqs))
    assert_match(model, reqs, got)
    assert {rid: g[0] for rid, g in got.items()} == {rid: p[0] for rid, p in plain.items()}
    assert all(p[1] is None for p in plain.values())                  # none asked: none computed
    assert not graphs or engine.stats["graph_steps"] > 0


def test_a_preempted_request_sends_its_prompt_logprobs_once(model):
    """A pool too small for the batch preempts requests that recompute their prompts: each request's first event
    still carries its prompt's logprobs once, as computed the first time."""
    reqs = requests(6, model.config.vocab_size, max_tokens=20, seed=1)
    engine = make_engine(model, graphs=False, blocks=12)
    got = collect(engine, asking(reqs, n=0))
    assert engine.stats["preemptions"] > 0, "the pool was meant to be too small"
    for rid, (ids, _) in reqs.items():
        want, _, _, _ = reference(model, ids)
        torch.testing.assert_close(torch.tensor([lp.logprob for lp in got[rid][1]]), want, atol=1e-4, rtol=0)
        assert got[rid][2] == 1 and all(lp.top == () for lp in got[rid][1])


def test_prompt_logprobs_with_a_cached_prefix(model):
    """Prefix caching on: a request asking for its prompt's logprobs takes no cached block (their rows' logits are
    needed) and gets every one; a request after it that asks for none finds the prompt cached."""
    (ids, params), = requests(1, model.config.vocab_size, max_tokens=4, seed=2).values()
    engine = make_engine(model, graphs=False, caching=True)
    first = collect(engine, {"a": (ids, params)})
    again = collect(engine, asking({"b": (ids, params)}))
    assert_match(model, {"b": (ids, params)}, again)
    assert again["b"][0] == first["a"][0]
    engine.add_request(ids, params, "c")
    cached = [ev.num_cached_tokens for ev in engine.step()]
    assert cached and cached[0] >= BLOCK * (len(ids) // BLOCK - 1), cached
    while engine.has_unfinished():
        engine.step()
