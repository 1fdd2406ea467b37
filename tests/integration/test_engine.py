"""The single-node engine: batching, chunked prefill, preemption, sampling, streaming text."""

from __future__ import annotations

import asyncio

import pytest
import torch

from cluster.engine import AsyncEngine, Engine, LocalExecutor
from models.loader import load_model
from scheduler.request import SamplingParams
from scheduler.scheduler import AdmissionError, SchedulerConfig
from tests.conftest import hf_model
from workers.runner import ModelRunner, StepResult

BLOCK = 16


@pytest.fixture(scope="module")
def model(tiny_ckpt):
    return load_model(tiny_ckpt, dtype=torch.float32, progress=False)


def make_engine(model, num_blocks=256, budget=512, max_num_seqs=64, decode=None) -> Engine:
    runner = ModelRunner(model, num_blocks, BLOCK, torch.float32)
    cfg = SchedulerConfig(num_blocks=num_blocks, block_size=BLOCK, max_model_len=1024, vocab_size=1024,
                          eos_token_ids=(1,), max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    return Engine(LocalExecutor(runner), cfg, decode)


def run(engine: Engine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[int]]:
    out = {rid: [] for rid in requests}
    for rid, (ids, params) in requests.items():
        engine.add_request(ids, params, rid)
    done = set()
    for _ in range(10_000):
        for ev in engine.step():
            out[ev.req_id] += ev.token_ids
            if ev.finished:
                done.add(ev.req_id)
        if done == set(requests):
            return out
    raise AssertionError("requests did not finish")


def mixed_requests(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    reqs = {}
    for i in range(n):
        plen = int(torch.randint(3, 70, (1,), generator=g))
        ids = torch.randint(2, 1024, (plen,), generator=g).tolist()
        reqs[f"r{i}"] = (ids, SamplingParams(max_tokens=int(torch.randint(1, 12, (1,), generator=g)),
                                             temperature=0.0))
    return reqs


@pytest.fixture(scope="module")
def alone(model):
    """Each request run by itself: the reference for every batching test."""
    return {rid: run(make_engine(model), {rid: r})[rid] for rid, r in mixed_requests().items()}


def test_concurrent_equals_alone(model, alone):
    engine = make_engine(model)
    assert run(engine, mixed_requests()) == alone
    assert engine.scheduler.pool.num_free == engine.scheduler.pool.num_blocks


def test_matches_hf_generate(model, alone, tiny_ckpt):
    hf = hf_model(tiny_ckpt)
    for rid, (ids, params) in list(mixed_requests().items())[:6]:
        with torch.no_grad():
            gen = hf.generate(torch.tensor([ids]), max_new_tokens=params.max_tokens, do_sample=False,
                              eos_token_id=1, pad_token_id=0)
        assert gen[0, len(ids):].tolist() == alone[rid], rid


@pytest.mark.parametrize("budget", [7, 16, 17, 33])
def test_chunked_prefill_equals_unchunked(model, alone, budget):
    """Budgets below, at and straddling index_topk (16) cut prompts into chunks that select differently."""
    engine = make_engine(model, budget=budget, max_num_seqs=4)
    assert run(engine, mixed_requests()) == alone


def test_preemption_recomputes_same_tokens(model, alone):
    engine = make_engine(model, num_blocks=8)
    assert run(engine, mixed_requests()) == alone
    assert engine.stats["preemptions"] > 0, "the pool was meant to be too small"
    assert engine.scheduler.pool.num_free == 8


def test_abort_frees_everything(model):
    engine = make_engine(model, num_blocks=64)
    for rid, (ids, _) in mixed_requests(6).items():
        engine.add_request(ids, SamplingParams(max_tokens=50, temperature=0.0), rid)
    for _ in range(3):
        engine.step()
    for rid in list(mixed_requests(6)):
        engine.abort(rid)
    assert engine.scheduler.pool.num_free == 64 and not engine.scheduler.has_unfinished()
    engine.step()   # tells the runner to forget them
    assert not engine.executor.runner.requests


def test_seeded_sampling_repeats(model):
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=1234)
    prompt = list(range(5, 40))
    alone_tokens = run(make_engine(model), {"s": (prompt, params)})["s"]
    batch = mixed_requests(5)
    batch["s"] = (prompt, params)
    assert run(make_engine(model), batch)["s"] == alone_tokens
    other = run(make_engine(model), {"s": (prompt, SamplingParams(max_tokens=10, temperature=1.0, seed=99))})
    assert other["s"] != alone_tokens


@pytest.mark.parametrize("bad,reason", [([], "empty_prompt"), ([5, 2000], "bad_token"),
                                        (list(range(2, 1000)), "too_long")])
def test_refused_prompt_has_reason_and_others_continue(model, alone, bad, reason):
    engine = make_engine(model)
    reqs = dict(list(mixed_requests().items())[:4])
    for rid, (ids, p) in reqs.items():
        engine.add_request(ids, p, rid)
    with pytest.raises(AdmissionError) as e:
        engine.add_request(bad, SamplingParams(max_tokens=30), "bad")
    assert e.value.reason == reason
    out = {rid: [] for rid in reqs}
    while engine.scheduler.has_unfinished():
        for ev in engine.step():
            out[ev.req_id] += ev.token_ids
    assert out == {rid: alone[rid] for rid in reqs}


class ScriptedExecutor:
    """Returns a fixed token script, one token per sampled step (fakes by injection, no model)."""

    def __init__(self, script: list[int]):
        self.script, self.i = script, 0

    def execute(self, steps) -> list[StepResult]:
        res = StepResult(steps[0].step_id)
        for s in steps[0].seqs:
            if s.sample:
                res.sampled[s.req_id] = [self.script[self.i]]
                self.i += 1
        return [res]


def text_engine(script, tok):
    cfg = SchedulerConfig(num_blocks=64, block_size=BLOCK, vocab_size=tok.vocab_size, eos_token_ids=(0,))
    return Engine(ScriptedExecutor(script), cfg, lambda ids: tok.decode(ids, skip_special_tokens=True))


@pytest.fixture(scope="module")
def tok():
    from cluster.local import load_tokenizer
    from cluster.config import DEFAULT_MODEL

    t = load_tokenizer(DEFAULT_MODEL)
    if t is None:
        pytest.skip("the embedded tokenizer (models/tiny/tokenizer.json) is missing")
    return t


TEXT = "Naïve café: 你好 🙂 — done. STOP here and more"


def stream(engine, params):
    rid = engine.add_request([5, 6, 7], params)
    deltas = []
    while engine.scheduler.has_unfinished():
        deltas += [ev.text for ev in engine.step() if ev.req_id == rid]
    return deltas


def test_utf8_never_emits_replacement_char(tok):
    script = tok.encode(TEXT)
    assert any("\ufffd" in tok.decode([t]) for t in script), "the text must split a multibyte char"
    deltas = stream(text_engine(script, tok), SamplingParams(max_tokens=len(script)))
    assert "".join(deltas) == TEXT
    assert not any("\ufffd" in d for d in deltas)


def test_stop_string_across_tokens_is_trimmed(tok):
    script = tok.encode(TEXT)
    deltas = stream(text_engine(script, tok), SamplingParams(max_tokens=len(script), stop=("P he",)))
    assert "".join(deltas) == "Naïve café: 你好 🙂 — done. STO"


def test_stop_string_on_the_last_allowed_token_finishes_with_stop(tok):
    """A stop string completed by the max_tokens-th token reports "stop" (OpenAI), as it does one token earlier."""
    script = tok.encode(TEXT)
    last = next(k for k in range(1, len(script) + 1) if "P he" in tok.decode(script[:k]))
    for max_tokens in (last, last + 1):
        engine = text_engine(script, tok)
        rid = engine.add_request([5, 6, 7], SamplingParams(max_tokens=max_tokens, stop=("P he",)))
        evs = []
        while engine.scheduler.has_unfinished():
            evs += [ev for ev in engine.step() if ev.req_id == rid]
        assert "".join(ev.text for ev in evs) == "Naïve café: 你好 🙂 — done. STO"
        assert evs[-1].finished and evs[-1].finish_reason == "stop", max_tokens


def test_async_stream_and_disconnect_frees_kv(model):
    engine = make_engine(model, num_blocks=64)
    aeng = AsyncEngine(engine)

    async def main():
        toks = []
        async for ev in aeng.generate(list(range(2, 30)), SamplingParams(max_tokens=5, temperature=0.0)):
            toks += ev.token_ids
        agen = aeng.generate(list(range(2, 30)), SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True))
        async for ev in agen:
            break                           # the client goes away after the first event
        await agen.aclose()
        return toks

    try:
        toks = asyncio.run(main())
    finally:
        aeng.shutdown()
    assert len(toks) == 5
    assert engine.scheduler.pool.num_free == 64 and not engine.scheduler.has_unfinished()
