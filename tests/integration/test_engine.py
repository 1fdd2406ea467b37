"""The single-node engine: batching, chunked prefill, preemption, sampling, streaming text."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from cluster.async_engine import AsyncEngine
from cluster.engine import Engine, LocalExecutor
from models.loader import load_model
from scheduler.request import SamplingParams
from scheduler.scheduler import AdmissionError, SchedulerConfig
from tests.conftest import hf_model, streamed_calls
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


class _TwoReplicas:
    """Two ranks that each run the whole model (data parallel without the MoE's collectives): the engine's placement
    and moves between ranks, over real runners."""

    def __init__(self, model, num_blocks: int):
        self.runners = [ModelRunner(model, num_blocks, BLOCK, torch.float32) for _ in range(2)]

    def execute(self, steps) -> list[StepResult]:
        return [runner.execute(step) for runner, step in zip(self.runners, steps)]

    def recover(self) -> None:
        pass


def test_preempted_request_moves_rank_and_samples_as_alone(model):
    """Rank 0's pool (4 blocks) cannot hold both of its requests as they grow: the younger is preempted, and rank 1
    (its request ended) takes it at once. It goes there with its tokens so far — the new worker's history, its penalty
    counts, its seeded draws — so each request's tokens equal its tokens alone."""
    g = torch.Generator().manual_seed(3)
    prompt = lambda n: torch.randint(2, 1024, (n,), generator=g).tolist()
    reqs = {"old": (prompt(20), SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)),
            "brief": (prompt(56), SamplingParams(max_tokens=1, temperature=0.0)),
            "young": (prompt(10), SamplingParams(max_tokens=30, temperature=0.9, seed=11, repetition_penalty=1.3,
                                                  frequency_penalty=0.5, ignore_eos=True))}
    alone = {rid: run(make_engine(model), {rid: r})[rid] for rid, r in reqs.items()}
    cfg = SchedulerConfig(num_blocks=4, block_size=BLOCK, max_model_len=64, vocab_size=1024, eos_token_ids=(1,),
                          max_num_seqs=4, max_num_batched_tokens=64)
    engine = Engine(_TwoReplicas(model, 4), cfg, num_ranks=2, span=False)
    assert run(engine, reqs) == alone
    assert engine.stats["preemptions"] >= 1 and engine.stats["moves"] >= 1


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_priority_request_takes_a_running_ones_place_and_every_output_equals_alone(model, ranks):
    """The priority policy: a request of priority 0 arrives while requests of priority 1 fill every slot; the latest
    of them gives its place up at once (preempted), the new one finishes first, and the one preempted resumes — its
    tokens recomputed, its seeded draws and penalties as they were — so every request's tokens equal its tokens
    alone."""
    g = torch.Generator().manual_seed(5)
    prompt = lambda n: torch.randint(2, 1024, (n,), generator=g).tolist()
    low = {f"low{i}": (prompt(12 + 9 * i), SamplingParams(max_tokens=24, temperature=0.8, seed=i, priority=1,
                                                          repetition_penalty=1.2, ignore_eos=True))
           for i in range(2 * ranks)}
    vip = {"vip": (prompt(7), SamplingParams(max_tokens=4, temperature=0.0, priority=0, ignore_eos=True))}
    alone = {rid: run(make_engine(model), {rid: (ids, replace(p, priority=0))})[rid]
             for rid, (ids, p) in {**low, **vip}.items()}
    cfg = SchedulerConfig(num_blocks=64, block_size=BLOCK, max_model_len=256, vocab_size=1024, eos_token_ids=(1,),
                          max_num_seqs=2 * ranks, max_num_batched_tokens=64, policy="priority")
    executor = _TwoReplicas(model, 64) if ranks == 2 else LocalExecutor(ModelRunner(model, 64, BLOCK, torch.float32))
    engine = Engine(executor, cfg, num_ranks=ranks, span=False)
    out, finished = {rid: [] for rid in alone}, []
    for rid, (ids, params) in low.items():
        engine.add_request(ids, params, rid)
    for step in range(10_000):
        if step == 3:
            engine.add_request(*vip["vip"], "vip")
        for ev in engine.step():
            out[ev.req_id] += ev.token_ids
            finished += [ev.req_id] if ev.finished else []
        if len(finished) == len(alone):
            break
    assert out == alone and finished[0] == "vip" and engine.stats["preemptions"] >= 1, (finished, engine.stats)
    assert all(s.pool.num_free == s.pool.num_blocks for s in engine.schedulers)


def test_a_full_priority_engine_refuses_a_lower_priority_waiting_request_to_admit_a_higher_one(model):
    """Full (1 running + 2 waiting): an arrival is admitted in place of the latest waiting request of the lowest
    priority below it that never ran, whose stream raises the 429's AdmissionError as at admission; an arrival that
    finds none below it (the same priority, or only a request that ran and was preempted) is refused itself."""
    def prompt(n, seed):
        return torch.randint(2, 1024, (n,), generator=torch.Generator().manual_seed(seed)).tolist()

    def params(p, n=6):
        return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, priority=p)

    cfg = SchedulerConfig(num_blocks=64, block_size=BLOCK, max_model_len=256, vocab_size=1024, eos_token_ids=(1,),
                          max_num_seqs=1, max_num_batched_tokens=64, max_waiting=2, policy="priority")
    engine = Engine(LocalExecutor(ModelRunner(model, 64, BLOCK, torch.float32)), cfg)
    out: dict[str, int] = {}

    def step():
        events = engine.step()
        for ev in events:
            out[ev.req_id] = out.get(ev.req_id, 0) + len(ev.token_ids)
        return events

    engine.add_request(prompt(9, 0), params(2, 30), "r0")
    step()                                               # r0 runs
    engine.add_request(prompt(9, 1), params(3), "r1")
    engine.add_request(prompt(9, 2), params(3), "r2")    # full
    with pytest.raises(AdmissionError, match="engine is full"):
        engine.add_request(prompt(5, 7), params(3), "same")
    with pytest.raises(AdmissionError) as e:             # refused for itself: it displaces nobody
        engine.add_request([5, 2000], params(0), "bad")
    assert e.value.reason == "bad_token" and engine.scheduler.num_waiting == 2
    engine.add_request(prompt(9, 3), params(1), "vip")   # takes r2's place
    events = step()                                      # vip preempts r0 (it ran: no longer one to refuse)
    assert events[0].req_id == "r2" and events[0].finished and events[0].refused.reason == "queue_full"
    engine.add_request(prompt(9, 4), params(0), "vip2")  # takes r1's place: r0 has output
    assert [ev.req_id for ev in step() if ev.refused] == ["r1"]
    with pytest.raises(AdmissionError, match="engine is full"):
        engine.add_request(prompt(5, 8), params(0), "vip3")
    for _ in range(1000):
        if not engine.has_work():
            break
        step()
    assert out == {"r0": 30, "r1": 0, "r2": 0, "vip": 6, "vip2": 6} and engine.scheduler.pool.num_free == 64, out

    # two ranks number their arrivals apart: the latest is the engine's latest admitted
    engine = Engine(_TwoReplicas(model, 64), replace(cfg, max_num_seqs=2), num_ranks=2, span=False)
    for rid, p in (("a", 2), ("b", 2)):
        engine.add_request(prompt(9, len(rid)), params(p, 30), rid)
    engine.step()
    for rid in ("w_first", "w_last"):
        engine.add_request(prompt(9, len(rid)), params(3), rid)
    engine.add_request(prompt(9, 5), params(0), "vip")
    assert [ev.req_id for ev in engine.step() if ev.refused] == ["w_last"]
    while engine.has_work():
        engine.step()

    async def refused_stream():              # AsyncEngine raises it where an admission error is raised
        aeng = AsyncEngine(Engine(LocalExecutor(ModelRunner(model, 64, BLOCK, torch.float32)), cfg))
        got = {}

        async def one(rid, p, n):
            try:
                got[rid] = [t async for ev in aeng.generate(prompt(9, len(rid)), params(p, n), rid)
                            for t in ev.token_ids]
            except AdmissionError as e:
                got[rid] = e

        tasks = [asyncio.create_task(one(rid, p, n)) for rid, p, n in (("a", 2, 200), ("b", 3, 4), ("c", 3, 4))]
        await asyncio.sleep(0)               # each has been added (a runs, b and c wait)
        tasks.append(asyncio.create_task(one("vip", 1, 4)))
        await asyncio.gather(*tasks)
        aeng.shutdown()
        return got

    got = asyncio.run(refused_stream())
    assert isinstance(got["c"], AdmissionError) and "higher priority" in str(got["c"]), got
    assert [len(got[r]) for r in ("a", "b", "vip")] == [200, 4, 4]


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


def test_logit_bias_bans_a_token_in_its_own_row_only(model, alone):
    """-100 on every token the request chose unbiased: none comes back (greedy and seeded draws); the other requests of
    the batch are untouched (the bias is per row); an id past the vocabulary is refused naming logit_bias."""
    reqs = mixed_requests()
    ids, params = reqs["r3"]
    ban = {t: -100.0 for t in alone["r3"]}
    batch = dict(reqs)
    batch["r3"] = (ids, replace(params, logit_bias=ban))
    drawn = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    free = run(make_engine(model), {"s": (ids, drawn)})["s"]
    batch["s"] = (ids, replace(drawn, logit_bias={t: -100.0 for t in free}))
    got = run(make_engine(model), batch)
    assert not set(got["r3"]) & set(ban) and not set(got["s"]) & set(free)
    assert {r: t for r, t in got.items() if r not in ("r3", "s")} == {r: t for r, t in alone.items() if r != "r3"}
    boosted = run(make_engine(model), {"b": (ids, replace(params, logit_bias={77: 100.0}))})["b"]
    assert boosted == [77] * len(boosted)
    with pytest.raises(AdmissionError) as e:
        make_engine(model).add_request(ids, replace(params, logit_bias={1024: 1.0}))
    assert e.value.field == "logit_bias"


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
    """Returns a fixed token script (fakes by injection, no model): a token per sampled step, or, when the step
    verifies drafts, the drafts it proposed — the script's next tokens, all accepted — and one more."""

    def __init__(self, script: list[int]):
        self.script, self.i = script, 0

    def execute(self, steps) -> list[StepResult]:
        res = StepResult(steps[0].step_id)
        for s in steps[0].seqs:
            if s.sample:
                res.sampled[s.req_id] = self.script[self.i:self.i + 1 + s.num_drafts]
                self.i += 1 + s.num_drafts
                if steps[0].num_drafts:
                    res.drafts[s.req_id] = self.script[self.i:self.i + steps[0].num_drafts]
        return [res]


def text_engine(script, tok, k: int = 0):
    cfg = SchedulerConfig(num_blocks=64, block_size=BLOCK, vocab_size=tok.vocab_size, eos_token_ids=(0,))
    return Engine(ScriptedExecutor(script), cfg, lambda ids: tok.decode(ids, skip_special_tokens=True),
                  speculative_tokens=k, special_ids=tok.special_ids)


@pytest.fixture(scope="module")
def tok():
    from cluster.config import DEFAULT_MODEL
    from cluster.local import load_tokenizer

    t = load_tokenizer(DEFAULT_MODEL)
    if t is None:
        pytest.skip("the embedded tokenizer (models/tiny/tokenizer.json) is missing")
    return t


TEXT = "Naïve café: 你好 🙂 — done. STOP here and more"


def stream(engine, params, events: list | None = None):
    rid = engine.add_request([5, 6, 7], params)
    deltas = []
    while engine.scheduler.has_unfinished():
        for ev in engine.step():
            if ev.req_id == rid:
                deltas.append(ev.text)
                if events is not None:
                    events.append(ev)
    return deltas


@pytest.mark.parametrize("k", [0, 3], ids=["plain", "speculative"])
def test_utf8_never_emits_replacement_char(tok, k):
    script = tok.encode(TEXT)
    assert any("\ufffd" in tok.decode([t]) for t in script), "the text must split a multibyte char"
    deltas = stream(text_engine(script, tok, k), SamplingParams(max_tokens=len(script)))
    assert "".join(deltas) == TEXT
    assert not any("\ufffd" in d for d in deltas)


def test_stop_string_across_tokens_is_trimmed(tok):
    """Trimmed at the stop string; a speculative step that committed tokens past it delivers none of them (usage
    counts what a plain decode would have sampled)."""
    script = tok.encode(TEXT)
    ended = {}
    for k in (0, 3):
        events = []
        deltas = stream(text_engine(script, tok, k), SamplingParams(max_tokens=len(script), stop=("P he",)), events)
        assert "".join(deltas) == "Naïve café: 你好 🙂 — done. STO"
        assert events[-1].finish_reason == "stop"
        ended[k] = (sum(len(ev.token_ids) for ev in events), events[-1].num_output_tokens)
    assert ended[3] == ended[0] and ended[0][0] == ended[0][1]


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
        live = aeng.generate(list(range(2, 30)), SamplingParams(max_tokens=8, temperature=0.0), "x")
        first = await live.__anext__()
        with pytest.raises(AdmissionError, match="already in flight"):      # an id in flight is refused, and its
            await aeng.generate([5, 6], SamplingParams(max_tokens=2), "x").__anext__()   # stream goes on (session 56)
        async def drain():
            return [ev async for ev in live]
        events = [first] + await asyncio.wait_for(drain(), 60)     # (it hung before)
        assert events[-1].finished and [t for ev in events for t in ev.token_ids][:5] == toks
        return toks

    try:
        toks = asyncio.run(main())
    finally:
        aeng.shutdown()
    assert len(toks) == 5
    assert engine.scheduler.pool.num_free == 64 and not engine.scheduler.has_unfinished()


def _glm_turn(tok, thought: bool = True) -> list[int]:
    """A GLM assistant turn as token ids: a thought (closed by ``</think>``, or not when ``thought`` is False: the
    model calls a tool before closing it), text, a call with two arguments, text with a multibyte character, a call
    without arguments, EOS."""
    sp = tok.special_ids_by_token()
    arg = lambda k, v: [sp["<arg_key>"], *tok.encode(k), sp["</arg_key>"], sp["<arg_value>"], *tok.encode(v),
                        sp["</arg_value>"]]
    ids = tok.encode("The user wants the weather.") + ([sp["</think>"]] if thought else [])
    ids += tok.encode("Let me check.") + [sp["<tool_call>"], *tok.encode("get_weather"), *arg("city", "Paris"),
                                           *arg("days", "3"), sp["</tool_call>"]]
    return ids + tok.encode(" Also the time — 🙂") + [sp["<tool_call>"], *tok.encode("now"), sp["</tool_call>"],
                                                       tok.eos_token_ids[0]]


def _formatted(tok, events, thinking: bool = True) -> tuple[dict, dict]:
    """The chat body and the streamed deltas (joined) the front end makes of one request's events (the prompt opened
    a thought: ``thinking``; the reasoning parser on)."""
    from cluster.formatter import Formatter
    from cluster.parsers import TOOL_MARKERS

    sp = tok.special_ids_by_token()
    ingress = type("I", (), {"model_name": "m", "tokenizer": tok, "think_end": sp["</think>"],
                             "think_start": sp["<think>"]})()
    tool_ids = {n: sp[n] for n in TOOL_MARKERS}
    fmt = lambda: Formatter(ingress, "c", True, [[0] * 3], None, thinking=thinking, tool_ids=tool_ids,
                            string_args={"get_weather": {"city"}}, reasoning_parser=True)

    async def source():
        for ev in events:
            yield 0, ev

    async def chunks():
        return [json.loads(c[6:])["choices"] async for c in fmt().sse(source(), False) if c != "data: [DONE]\n\n"]

    message = asyncio.run(fmt().whole(source(), 1))["choices"][0]
    for call in message["message"].get("tool_calls", []):
        assert call.pop("id").startswith("call_")          # (random: left out of the comparison)
    deltas = [c[0] for c in asyncio.run(chunks())]
    streamed = {"reasoning": "".join(d["delta"].get("reasoning_content", "") for d in deltas),
                "content": "".join(d["delta"].get("content") or "" for d in deltas), "calls": streamed_calls(deltas),
                "finish_reason": deltas[-1]["finish_reason"]}
    return message, streamed


@pytest.mark.parametrize("thought", [True, False], ids=["closed-thought", "call-in-thought"])
def test_reasoning_and_tool_calls_with_speculation_equal_without(tok, thought):
    """A speculative step commits several tokens at once, so ``</think>`` or a call's marker can fall inside what one
    step returns; the engine starts an event at each special token, so the front end's reasoning / tool-call split is
    the plain decode's — whole and streamed — and that is the turn as written."""
    script = _glm_turn(tok, thought)
    out = {}
    for k in (0, 2, 3):
        engine = text_engine(script, tok, k)
        rid = engine.add_request([5, 6, 7], SamplingParams(max_tokens=len(script)))
        events = []
        while engine.scheduler.has_unfinished():
            events += [ev for ev in engine.step() if ev.req_id == rid]
        assert [t for ev in events for t in ev.token_ids] == script
        if k:
            assert any(len(ev.token_ids) > 1 for ev in events), "no step committed several tokens"
        out[k] = _formatted(tok, events)
    assert out[2] == out[0] and out[3] == out[0]
    message, streamed = out[0]
    calls = message["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("get_weather", {"city": "Paris", "days": 3}), ("now", {})]
    assert message["finish_reason"] == streamed["finish_reason"] == "tool_calls"
    thought_text, content = ("The user wants the weather.", "Let me check. Also the time — 🙂") if thought else \
        ("The user wants the weather.Let me check.", " Also the time — 🙂")
    assert message["message"]["reasoning_content"] == streamed["reasoning"] == thought_text
    assert message["message"]["content"] == streamed["content"] == content
    assert [(c["name"], c["arguments"]) for c in streamed["calls"]] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


def test_text_held_for_a_stop_string_stays_on_its_side_of_a_marker(tok):
    """A stop string's possible start is held back until the text after it rules the stop out; when a marker where the
    parsers split the text (``SamplingParams.text_breaks``: ``</think>``, a call's) comes in between, the held text is
    still the text before it: it went out with the next token's text, so the end of a thought became content, text
    before a call was dropped and a call's text became content. Stop strings that never occur leave the turn — whole
    and streamed, with speculation or not — as it is without them. Without breaks (a completion) the text is one: a
    stop string across a marker still ends it."""
    from cluster.parsers import TOOL_MARKERS

    script = _glm_turn(tok)
    sp = tok.special_ids_by_token()
    breaks = tuple(sp[n] for n in ("</think>", *TOOL_MARKERS))
    stops = (".\n", "Paris!", "🙂!")     # "weather." and "check." end before a marker, "Paris" and "🙂" too
    out = {}
    for k in (0, 3):
        for stop in ((), stops):
            engine = text_engine(script, tok, k)
            rid = engine.add_request([5, 6, 7], SamplingParams(max_tokens=len(script), stop=stop, text_breaks=breaks))
            events = []
            while engine.scheduler.has_unfinished():
                events += [ev for ev in engine.step() if ev.req_id == rid]
            assert [t for ev in events for t in ev.token_ids] == script
            out[k, stop] = _formatted(tok, events)
    assert out[0, stops] == out[0, ()] and out[3, stops] == out[0, ()]
    assert "".join(stream(text_engine(script, tok), SamplingParams(max_tokens=len(script), stop=(".Let",)))) == \
        "The user wants the weather"


PERSON = {"type": "object", "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2}}}


def _is_person(value) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("name"), str) and len(value["name"]) <= 40
            and type(value.get("age")) is int
            and isinstance(value.get("tags", []), list) and len(value.get("tags", [])) <= 2
            and all(isinstance(t, str) and len(t) <= 12 for t in value.get("tags", []))
            and set(value) <= {"name", "age", "tags"})


def _local(**kw):
    pytest.importorskip("xgrammar", reason="structured output needs xgrammar (the 'serve' and 'test' extras)")
    from cluster.config import EngineConfig
    from cluster.local import build_local_engine

    return build_local_engine(EngineConfig(kv_cache_tokens=4096, warmup_tokens=0, **kw), progress=False)


def _outputs(engine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, tuple[list[int], str, str]]:
    """Each request's (token ids, text, finish reason), run together."""
    out = {rid: ([], [], None) for rid in requests}
    for rid, (ids, params) in requests.items():
        engine.add_request(ids, params, rid)
    while engine.has_unfinished():
        for ev in engine.step():
            out[ev.req_id][0].extend(ev.token_ids)
            out[ev.req_id][1].append(ev.text)
            if ev.finished:
                out[ev.req_id] = (out[ev.req_id][0], out[ev.req_id][1], ev.finish_reason)
    return {rid: (ids, "".join(texts), reason) for rid, (ids, texts, reason) in out.items()}


def test_structured_output_follows_its_schema_beside_free_requests():
    """response_format's schema, token by token: greedy and drawn rows (top-k / top-p, penalties) end in values that
    parse and match it, every token was one the grammar allowed, and an unguided request in the same steps samples
    what it samples alone."""
    engine, tok = _local()
    prompt = tok.encode_chat([{"role": "user", "content": "A person as JSON."}], enable_thinking=False)
    schema = json.dumps(PERSON)
    guided = {"greedy": SamplingParams(max_tokens=200, temperature=0.0, json_schema=schema),
              "drawn": SamplingParams(max_tokens=200, temperature=1.0, seed=3, json_schema=schema),
              "filtered": SamplingParams(max_tokens=200, temperature=0.8, top_k=40, top_p=0.9, seed=4,
                                         frequency_penalty=0.5, json_schema=schema),
              "object": SamplingParams(max_tokens=60, temperature=0.0, json_schema='{"type": "object"}')}
    free = SamplingParams(max_tokens=30, temperature=0.0)
    out = _outputs(engine, {**{rid: (prompt, p) for rid, p in guided.items()}, "free": (prompt, free)})
    alone = _outputs(engine, {"alone": (prompt, free)})["alone"]
    assert out["free"][0] == alone[0]
    assert_follows(engine, tok, prompt, guided, out)
    assert out["greedy"][2] == "stop" and _is_person(json.loads(out["greedy"][1]))


def assert_follows(engine, tok, prompt: list[int], guided: dict[str, SamplingParams], out) -> None:
    """Each guided request's tokens were all ones its grammar allowed; a value it finished parses and matches."""
    from cluster.guided import Guides

    guides = Guides(tok, engine.config.vocab_size, engine.config.eos_token_ids)
    for rid, params in guided.items():
        ids, text, reason = out[rid]
        check = guides.guide(params.json_schema, prompt)
        check.accept(ids)
        assert check.rejected == 0, (rid, text)
        if reason == "stop":
            value = json.loads(text)
            assert _is_person(value) if json.loads(params.json_schema) == PERSON else isinstance(value, dict), \
                (rid, text)


def waiting_guide_case(plain, tok) -> tuple[list[int], SamplingParams, tuple]:
    """A json_schema request that waits for a token its free greedy output holds early (``plain``: an engine that
    neither drafts nor looks ahead): (prompt, params, its output there), checked to follow the schema after it."""
    prompt = tok.encode("The old man said unto the king")
    free = _outputs(plain, {"f": (prompt, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))})["f"][0]
    at = next(i for i in range(4, 12) if free[i] not in free[:i])
    params = SamplingParams(max_tokens=200, temperature=0.0, json_schema=json.dumps(PERSON), guide_after=(free[at],))
    want = _outputs(plain, {"r": (prompt, params)})["r"]
    assert want[0][:at + 1] == free[:at + 1] and want[2] == "stop"
    assert _is_person(json.loads(tok.decode(want[0][at + 1:])))
    return prompt, params, want


def test_a_waiting_guide_lets_drafts_and_look_ahead_run_until_its_wait_ends():
    """A guide that waits (here for a token the free output holds early, as tool_choice auto waits for ``<tool_call>``
    and any guide for the reasoning's end) lets drafts ride — stopped before the token that ends the wait — and steps
    launch ahead (one launched over that token is dropped): the tokens are those of the plain engine, which drafts
    nothing and launches nothing ahead, and from the trigger on they follow the schema."""
    plain, tok = _local()
    prompt, params, want = waiting_guide_case(plain, tok)
    for kw, stat in (({"speculative_tokens": 2}, "drafts_proposed"), ({"cuda_graphs": "eager"}, "ahead_steps")):
        engine, _ = _local(**kw)
        assert _outputs(engine, {"r": (prompt, params)})["r"] == want, kw
        assert engine.stats[stat] > 0, (kw, engine.stats)


def test_a_guided_rows_logprobs_leave_out_what_the_grammar_ruled_out_and_stop_strings_wait_for_its_end():
    """Top logprobs of a guided row list only tokens its grammar allowed (never -inf: JSON has no such number); a stop
    string met inside the held value does not cut it — the grammar ends the output, whole and valid."""
    from tests.conftest import run_engine

    engine, tok = _local()
    prompt = tok.encode_chat([{"role": "user", "content": "A person as JSON."}], enable_thinking=False)
    params = SamplingParams(max_tokens=200, temperature=0.0, json_schema=json.dumps(PERSON), logprobs=5)
    for eng in (engine, _local(speculative_tokens=3)[0]):             # plain rows, and verify rows
        out = run_engine(eng, {"r": (prompt, params)}, logprobs=True)["r"]
        tops = [top for _, _, top in out]
        assert all(math.isfinite(lp) for _, lp, _ in out) and all(math.isfinite(v) for top in tops for _, v in top)
        assert any(len(top) < 5 for top in tops)             # where fewer than five tokens were allowed
    want = _outputs(engine, {"r": (prompt, replace(params, logprobs=None))})["r"]
    cut = _outputs(engine, {"r": (prompt, replace(params, logprobs=None, stop=('"', "\n")))})["r"]
    assert cut == want and want[2] == "stop" and _is_person(json.loads(want[1]))


def test_a_guided_steps_masks_are_built_after_its_forward_is_launched():
    """In one process the runner builds a step's masks at sampling, once its forward is launched (on a GPU the host
    builds them while the device runs it); a step pickled for another process carries them built."""
    import pickle

    from workers.sampler import StepMasks

    engine, tok = _local()
    runner = engine.executor.runner
    order = []
    forward = runner.model.forward
    runner.model.forward = lambda *a, **kw: (order.append("forward"), forward(*a, **kw))[1]
    execute = engine._worker_steps

    def tracked(*a, **kw):
        steps = execute(*a, **kw)
        for st in steps or ():
            if st.masks is not None:
                build = st.masks._build
                st.masks._build = lambda build=build: (order.append("masks"), list(build()))[1]
        return steps

    engine._worker_steps = tracked
    prompt = tok.encode_chat([{"role": "user", "content": "A person as JSON."}], enable_thinking=False)
    out = _outputs(engine, {"r": (prompt, SamplingParams(max_tokens=40, temperature=0.0, json_schema=json.dumps(PERSON)))})
    assert order.count("masks") == len(out["r"][0]) > 5          # one build a sampled step (the prefill samples one)
    assert all(order[i - 1] == "forward" for i, o in enumerate(order) if o == "masks"), order

    built = []
    lazy = StepMasks(lambda: (built.append(1), [("a", np.arange(3, dtype=np.int32))])[1])
    assert not built
    back = pickle.loads(pickle.dumps(lazy))
    assert built == [1] and back.rows()["a"].tolist() == [0, 1, 2]
    assert lazy.rows()["a"].tolist() == [0, 1, 2] and built == [1]     # built once


def test_structured_output_drafts_on_masked_verify_rows_and_looks_ahead_with_its_sampling_deferred():
    """A guided request drafts: each verify row is masked with what may follow the drafts before it, so its tokens are
    the plain engine's — greedy, and drawn with a seed (drafts share plain decoding's noise) — with drafts accepted
    along the way. Its steps launch ahead too (CPU static-shape steps), their sampling left until the next step
    brings its masks (they need the token fed on the host): the same tokens. A drawn request without a seed
    (rejection sampling over masked rows) follows its schema."""
    prompt_of = lambda tok: tok.encode_chat([{"role": "user", "content": "A person as JSON."}], enable_thinking=False)
    schema = json.dumps(PERSON)
    plain, tok = _local()
    prompt = prompt_of(tok)
    for params in (SamplingParams(max_tokens=200, temperature=0.0, json_schema=schema),
                   SamplingParams(max_tokens=200, temperature=0.9, top_p=0.95, seed=8, json_schema=schema)):
        want = _outputs(plain, {"r": (prompt, params)})["r"]
        assert want[2] == "stop"
        for kw in ({"speculative_tokens": 3}, {"cuda_graphs": "eager"}):
            engine, _ = _local(**kw)
            assert _outputs(engine, {"r": (prompt, params)})["r"] == want, (kw, params)
            stat = "drafts_accepted" if kw.get("speculative_tokens") else "ahead_steps"
            assert engine.stats[stat] > 0, (kw, engine.stats)
    engine, _ = _local(speculative_tokens=3)
    free = SamplingParams(max_tokens=200, temperature=1.0, json_schema=schema)
    assert_follows(engine, tok, prompt, {"r": free}, _outputs(engine, {"r": (prompt, free)}))
    assert engine.stats["drafts_proposed"] > 0


def test_a_schema_the_engine_cannot_follow_is_refused_naming_response_format(model):
    engine, tok = _local()
    with pytest.raises(AdmissionError) as e:
        engine.add_request(tok.encode("hi"), SamplingParams(json_schema='{"type": "objectx"}'))
    assert e.value.field == "response_format" and "objectx" in str(e.value)
    no_tokenizer = make_engine(model)                     # token ids only: no vocabulary to hold a grammar to
    with pytest.raises(AdmissionError) as e:
        no_tokenizer.add_request([5, 6], SamplingParams(json_schema='{"type": "object"}'))
    assert e.value.field == "response_format" and not no_tokenizer.has_unfinished()


def test_a_schema_compiles_off_the_event_loop(monkeypatch):
    """A new schema's grammar compiles in ``add_request`` (~0.1-0.3 s at GLM-5's vocabulary): ``AsyncEngine`` runs it
    off the event loop, so other streams keep flowing meanwhile."""
    import time

    from cluster.guided import Guides

    engine, tok = _local()
    slow = Guides.guide

    def compiling(self, *args):
        time.sleep(0.5)
        return slow(self, *args)
    monkeypatch.setattr(Guides, "guide", compiling)
    aeng = AsyncEngine(engine)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        before = ticks
        params = SamplingParams(max_tokens=4, temperature=0.0, json_schema='{"type": "object"}')
        stream = aeng.generate(tok.encode("hi"), params)
        first = await stream.__anext__()
        await stream.aclose()
        task.cancel()
        return ticks - before, first

    try:
        ticked, first = asyncio.run(main())
    finally:
        aeng.shutdown()
    assert first.token_ids and ticked >= 20, ticked           # the loop ran on through the 0.5 s compile


def test_a_forced_call_starts_the_output_then_speculation_resumes():
    """``forced_paths`` (tool_choice required / named): the output starts with one of the paths; once it is out the
    request is free again — it drafts (k = 2) where it was held to one token at a time."""
    engine, tok = _local(speculative_tokens=2)
    marks = tok.special_ids_by_token()
    paths = ((marks["<tool_call>"], *tok.encode("get_weather"), marks["</tool_call>"]),
             (marks["<tool_call>"], *tok.encode("add"), marks["<arg_key>"]))
    prompt = tok.encode_chat([{"role": "user", "content": "Weather?"}], enable_thinking=False)
    ids, _, _ = _outputs(engine, {"r": (prompt, SamplingParams(max_tokens=24, temperature=0.0,
                                                                forced_paths=paths))})["r"]
    assert any(tuple(ids[:len(p)]) == p for p in paths), ids
    assert engine.stats["drafts_proposed"] > 0 and not engine._guides, engine.stats


def test_a_thinking_budget_closes_the_reasoning_at_its_count():
    """``thinking_budget``: the reasoning takes that many tokens, then ``</think>`` comes (the tiny model never writes it
    on its own) and the answer follows — held to its schema where one is asked. A spent budget of 0 closes it at once.
    Plain, speculative (k = 3: drafts stop a token short of the budget) and on the static graph path looking ahead
    (a step launched ahead of a spent budget is dropped): the same tokens, greedy and seeded."""
    import json

    engine, tok = _local()
    end = tok.special_ids_by_token()["</think>"]
    prompt = tok.encode_chat([{"role": "user", "content": "Hi there"}])
    assert prompt[-1] == tok.special_ids_by_token()["<think>"]
    free = _outputs(engine, {"f": (prompt, SamplingParams(max_tokens=24, temperature=0.0))})["f"][0]
    assert end not in free
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'
    budget = lambda n, **kw: SamplingParams(max_tokens=40, thinking_budget=n, **{"temperature": 0.0, **kw})
    reqs = {"b5": (prompt, budget(5)), "b0": (prompt, budget(0)), "drawn": (prompt, budget(7, temperature=1.0, seed=3)),
            "schema": (prompt, budget(4, json_schema=schema))}
    want = _outputs(engine, reqs)
    assert want["b5"][0][:6] == [*free[:5], end] and end not in want["b5"][0][6:]
    assert want["b0"][0][0] == end and want["drawn"][0].index(end) == 7 and want["schema"][0].index(end) == 4
    answer = tok.decode(want["schema"][0][5:], skip_special_tokens=True)
    assert answer.lstrip().startswith("{") and (want["schema"][2] != "stop" or "a" in json.loads(answer)), answer
    assert not engine._guides                                  # each guide dropped once its request ended
    spec, _ = _local(speculative_tokens=3)                      # drafts ride where a request runs alone
    assert {rid: _outputs(spec, {rid: r})[rid] for rid, r in reqs.items()} == want
    assert spec.stats["drafts_proposed"] > 0
    ahead, _ = _local(cuda_graphs="eager")
    assert _outputs(ahead, reqs) == want and ahead.stats["ahead_steps"] > 0
    for rid in ("b5", "drawn"):                 # alone, no other row's masks make the steps launched ahead wait
        assert _outputs(ahead, {rid: reqs[rid]})[rid] == want[rid], rid
