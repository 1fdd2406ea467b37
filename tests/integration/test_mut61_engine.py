"""Session 61's mutation review of the engine loop (``cluster/engine.py``, ``cluster/async_engine.py``,
``cluster/local.py``, ``workers/runner.py``): the gaps its surviving mutants showed, over fake executors."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
import torch

from cluster.async_engine import AsyncEngine
from cluster.engine import Engine, GroupFailure
from cluster.local import max_model_len, scheduler_config
from models.loader import load_model
from scheduler.request import SamplingParams
from scheduler.scheduler import AdmissionError, SchedulerConfig
from tests.conftest import RecordingExecutor
from workers.runner import ModelRunner, StepResult, TokenLogprobs

BS = 16


def _cfg(**kw) -> SchedulerConfig:
    base = dict(num_blocks=64, block_size=BS, max_model_len=256, vocab_size=64, max_num_seqs=4,
                max_num_batched_tokens=64, eos_token_ids=(1,))
    return SchedulerConfig(**{**base, **kw})


def _drain(engine: Engine) -> list:
    events = []
    while engine.has_unfinished():
        events += engine.step()
    return events


class Drafting(RecordingExecutor):
    """Every drafting row's drafts are accepted, plus one more token: tokens 10, 11, 12 ... in order per request;
    each sampled token's logprob is -(its value); proposes ``k`` drafts where the step asks (the next ids)."""

    def __init__(self, k: int):
        super().__init__()
        self.k, self.next = k, {}

    def execute(self, steps):
        self.steps.append(steps)
        out = []
        for st in steps:
            res = StepResult(st.step_id)
            for s in st.seqs:
                if not s.sample:
                    continue
                n = self.next.setdefault(s.req_id, 10)
                toks = list(range(n, n + s.num_drafts + 1))
                self.next[s.req_id] = n + len(toks)
                res.sampled[s.req_id] = toks
                res.logprobs[s.req_id] = [TokenLogprobs(-float(t), ()) for t in toks]
                if st.num_drafts:
                    res.drafts[s.req_id] = list(range(n + len(toks), n + len(toks) + st.num_drafts))
            out.append(res)
        return out


def test_no_look_ahead_at_a_block_edge_without_a_free_block_and_preemptions_are_counted():
    """Two requests fill a two-block pool: at the step whose fed token takes a block's last slot, no free block holds
    the next position (the slack is from free blocks only), so that step may not be launched ahead; the step after
    preempts one of them — counted once."""
    rec = RecordingExecutor()
    engine = Engine(rec, _cfg(num_blocks=2, max_model_len=64, max_num_seqs=2), graphs=True)
    for rid in "ab":
        engine.add_request(list(range(1, 15)), SamplingParams(max_tokens=10, ignore_eos=True), rid)
    _drain(engine)
    edges = [st for (st,) in rec.steps if any(s.end_pos == len(s.block_ids) * BS for s in st.seqs)]
    assert edges and all(st.graph is not None and not st.lookahead for st in edges)
    for (st,) in rec.steps:
        assert not st.lookahead or all(len(s.block_ids) * BS > s.end_pos for s in st.seqs)
    assert any(st.lookahead for (st,) in rec.steps)
    assert engine.stats["preemptions"] == 1


def test_no_drafts_asked_for_a_request_with_two_tokens_left():
    """Drafts need a token past this step's and one more to verify: a request two tokens short of max_tokens gets
    none proposed (they would be thrown away unverified)."""
    rec = RecordingExecutor()                              # (proposes no drafts: every step a plain decode)
    engine = Engine(rec, _cfg(), speculative_tokens=2)
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True), "r")
    _drain(engine)
    assert [st.num_drafts for (st,) in rec.steps] == [2, 2, 0, 0]


def test_a_prompts_only_engine_asks_for_no_drafts():
    """A prefill replica's requests end with their prompt's first token (elsewhere they go on): no drafts."""
    rec = RecordingExecutor()
    engine = Engine(rec, _cfg(), speculative_tokens=2, prompts_only=True)
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True), "r")
    _drain(engine)
    assert len(rec.steps) == 8 and not any(st.num_drafts for (st,) in rec.steps)


def test_a_speculative_steps_tokens_are_counted_once_with_their_own_logprobs():
    rec = Drafting(3)
    engine = Engine(rec, _cfg(), speculative_tokens=3)
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=9, ignore_eos=True, logprobs=0), "r")
    events = _drain(engine)
    toks = [t for ev in events for t in ev.token_ids]
    assert toks == list(range(10, 19))
    assert [lp.logprob for ev in events for lp in ev.logprobs] == [-float(t) for t in toks]
    assert [ev.num_output_tokens for ev in events] == [1, 5, 9]
    assert events[-1].finished and events[-1].finish_reason == "length"
    assert engine.stats["generated_tokens"] == 9


def test_stop_str_names_a_stop_token_id_not_the_eos_and_length_keeps_the_last_tokens_text():
    """``stop_str``: the stop token id that ended the output (the OpenAI ``stop_reason``); the EOS is none. A
    request ended by max_tokens keeps its last token's text (only a stop token's is dropped)."""
    text = lambda ids: "".join(chr(ord("a") + i % 26) for i in ids)   # noqa: E731
    for eos, params, reason, stop_str, out in (
            ((7,), SamplingParams(max_tokens=5), "stop", None, ""),
            ((1,), SamplingParams(max_tokens=5, stop_token_ids=(7,)), "stop", 7, ""),
            ((1,), SamplingParams(max_tokens=3), "length", None, "hhh")):
        engine = Engine(RecordingExecutor(), _cfg(eos_token_ids=eos), decode=text)
        engine.add_request([2, 3], params, "r")
        events = _drain(engine)
        last = events[-1]
        assert (last.finish_reason, last.stop_str) == (reason, stop_str)
        assert "".join(ev.text for ev in events) == out


class Failing(RecordingExecutor):
    """Loses the group at its first step; every rebuild fails until ``ok`` is set."""

    def __init__(self):
        super().__init__()
        self.ok, self.recovers = False, 0

    def execute(self, steps):
        if not self.steps:
            self.steps.append(steps)
            raise GroupFailure("rank 1 died")
        return super().execute(steps)

    def recover(self):
        self.recovers += 1
        if not self.ok:
            raise GroupFailure("setup failed")


def test_a_failed_rebuild_is_tried_again_after_one_then_two_seconds():
    group = Failing()
    engine = Engine(group, _cfg(max_waiting=8))
    engine.add_request([2, 3], SamplingParams(max_tokens=3), "r")
    assert [ev.finish_reason for ev in engine.step()] == ["error"]
    assert engine.rebuild_at is not None and engine.rebuild_at <= time.monotonic()
    engine.step()                                          # the first rebuild fails: again a second later
    assert group.recovers == 1 and 0.5 < engine.rebuild_at - time.monotonic() <= 1.0
    engine.rebuild_at = time.monotonic()
    engine.step()
    assert group.recovers == 2 and 1.5 < engine.rebuild_at - time.monotonic() <= 2.0


def test_the_local_engines_limits_and_eos_ids():
    model = SimpleNamespace(max_position_embeddings=4096, eos_token_ids=(3, 5), vocab_size=100)
    cfg = SimpleNamespace(max_model_len=None, block_size=16, max_num_seqs=4, max_num_batched_tokens=64,
                          max_waiting=8, max_waiting_tokens=0, prefix_caching=True, host_blocks=0,
                          scheduling_policy="fcfs")
    assert max_model_len(cfg, model, 100) == 1600             # the blocks bind
    assert max_model_len(cfg, model, 1000) == 4096            # the positions bind
    sched = scheduler_config(cfg, model, SimpleNamespace(eos_token_ids=(5, 9)), 100)
    assert sched.eos_token_ids == (3, 5, 9) and sched.max_model_len == 1600


def test_a_finished_stream_leaves_no_queue_behind():
    aeng = AsyncEngine(Engine(RecordingExecutor(), _cfg()))

    async def main():
        return [ev async for ev in aeng.generate([2, 3], SamplingParams(max_tokens=3, ignore_eos=True), "r")]

    try:
        events = asyncio.run(asyncio.wait_for(main(), 10))
    finally:
        aeng.shutdown()
    assert sum(len(ev.token_ids) for ev in events) == 3 and events[-1].finished
    assert not aeng._queues


def test_an_engine_error_in_the_step_loop_fails_the_requests_in_flight():
    """An exception out of ``Engine.step`` itself (an engine bug): the loop goes on, and the requests in flight end
    with an error event — their clients are not left waiting."""
    engine = Engine(RecordingExecutor(), _cfg())
    real, calls = engine._step, []

    def step():
        calls.append(1)
        if len(calls) == 2:
            raise KeyError("boom")
        return real()

    engine._step = step
    aeng = AsyncEngine(engine)

    async def main():
        return [ev async for ev in aeng.generate([2, 3], SamplingParams(max_tokens=20, ignore_eos=True), "r")]

    try:
        events = asyncio.run(asyncio.wait_for(main(), 5))
    finally:
        aeng.shutdown()
    assert events[-1].finish_reason == "error" and "engine error: KeyError" in events[-1].error


def test_a_stream_refused_for_a_higher_priority_raises_the_admission_error():
    class Slow(RecordingExecutor):
        def execute(self, steps):
            time.sleep(0.005)
            return super().execute(steps)

    aeng = AsyncEngine(Engine(Slow(), _cfg(policy="priority", max_num_seqs=1, max_waiting=1)))

    async def consume(rid, priority):
        return [ev async for ev in aeng.generate([2, 3], SamplingParams(max_tokens=40, ignore_eos=True,
                                                                        priority=priority), rid)]

    async def main():
        first = asyncio.ensure_future(consume("a", 0))
        await asyncio.sleep(0.05)
        low = asyncio.ensure_future(consume("b", 5))
        await asyncio.sleep(0.05)
        high = asyncio.ensure_future(consume("c", 0))
        return await asyncio.gather(first, low, high, return_exceptions=True)

    try:
        a, b, c = asyncio.run(asyncio.wait_for(main(), 10))
    finally:
        aeng.shutdown()
    assert isinstance(b, AdmissionError) and b.reason == "queue_full", b
    assert a[-1].finish_reason == c[-1].finish_reason == "length"


def test_an_abort_ends_the_stream_with_an_abort_event():
    class Slow(RecordingExecutor):
        def execute(self, steps):
            time.sleep(0.005)
            return super().execute(steps)

    aeng = AsyncEngine(Engine(Slow(), _cfg()))

    async def main():
        events = []
        async for ev in aeng.generate([2, 3], SamplingParams(max_tokens=200, ignore_eos=True), "r"):
            events.append(ev)
            if len(events) == 2:
                aeng.abort("r")
        return events

    try:
        events = asyncio.run(asyncio.wait_for(main(), 5))
    finally:
        aeng.shutdown()
    assert events[-1].finished and events[-1].finish_reason == "abort" and len(events) < 50
    assert not aeng._queues and not aeng.engine.has_unfinished()


def test_an_idle_async_engine_probes_its_group_and_rebuilds_a_dead_one(monkeypatch):
    import cluster.async_engine as async_engine

    class Dying(RecordingExecutor):
        gone, recovers = "rank 1 died", 0

        def dead(self):
            return self.gone

        def recover(self):
            self.recovers += 1
            self.gone = None

    monkeypatch.setattr(async_engine, "PROBE_S", 0.05)
    group = Dying()
    aeng = AsyncEngine(Engine(group, _cfg()))
    try:
        for _ in range(100):
            if group.recovers:
                break
            time.sleep(0.02)
    finally:
        aeng.shutdown()
    assert group.recovers == 1 and aeng.engine.rebuild_at is None


class FailsAt(RecordingExecutor):
    """Raises ``error`` at step ``at`` (counting from 0), once."""

    def __init__(self, at: int, error: Exception):
        super().__init__()
        self.at, self.error, self.recovers, self.gone = at, error, 0, None

    def execute(self, steps):
        if len(self.steps) == self.at:
            self.steps.append(steps)
            raise self.error
        return super().execute(steps)

    def recover(self):
        self.recovers += 1

    def dead(self):
        return self.gone


def test_a_failed_step_fails_its_requests_on_every_rank():
    engine = Engine(FailsAt(1, RuntimeError("kernel fault")), _cfg(max_num_seqs=2), num_ranks=2)
    for rid in "ab":
        engine.add_request([2, 3, 4], SamplingParams(max_tokens=5, ignore_eos=True), rid)
    assert sorted(engine._rank_of.values()) == [0, 1]
    events = _drain(engine)
    failed = {ev.req_id for ev in events if ev.finish_reason == "error" and "kernel fault" in ev.error}
    assert failed == {"a", "b"} and not engine.has_unfinished() and not engine._rank_of
    assert all(s.pool.num_free == 64 for s in engine.schedulers) and engine.stats["failed_steps"] == 1


def test_a_failed_step_leaves_no_cached_prefix():
    """What the failed step wrote is unknown: a prompt cached before it is computed again after it."""
    prompt = list(range(2, 42))                             # two full blocks
    engine = Engine(FailsAt(1, RuntimeError("kernel fault")), _cfg(prefix_caching=True))
    engine.add_request(prompt, SamplingParams(max_tokens=1), "x")
    _drain(engine)
    assert engine.scheduler.cached_and_held(prompt, None)[0] == 2
    engine.add_request([9] * 20, SamplingParams(max_tokens=1), "y")
    assert [ev.finish_reason for ev in _drain(engine)] == ["error"]
    assert engine.scheduler.cached_and_held(prompt, None)[0] == 0


def test_a_preempted_request_with_output_fails_with_the_group_not_starts_over():
    """Its client has had tokens: starting it over on the rebuilt group would send them again."""
    rec = FailsAt(5, GroupFailure("rank 1 died"))
    engine = Engine(rec, _cfg(num_blocks=2, max_model_len=64, max_num_seqs=2))
    for rid in "ab":
        engine.add_request(list(range(1, 15)), SamplingParams(max_tokens=10, ignore_eos=True), rid)
    got = {rid: [] for rid in "ab"}
    ended = {}
    for _ in range(4):
        for ev in engine.step():
            got[ev.req_id] += ev.token_ids
    assert engine.stats["preemptions"] == 1 and len(got["b"]) == 3, got     # b waits, preempted, with 3 tokens
    for _ in range(40):
        for ev in engine.step():
            got[ev.req_id] += ev.token_ids
            if ev.finished:
                ended[ev.req_id] = ev.finish_reason
        if not engine.has_work():
            break
    assert ended == {"a": "error", "b": "error"} and len(got["b"]) == 3, (ended, got)


def test_a_request_refused_while_the_group_is_rebuilt_hears_of_it():
    engine = Engine(FailsAt(0, GroupFailure("rank 1 died")), _cfg(policy="priority", max_num_seqs=1, max_waiting=1))
    engine.add_request([2, 3], SamplingParams(max_tokens=3), "x")
    assert [ev.finish_reason for ev in engine.step()] == ["error"] and engine.rebuild_at is not None
    for rid in ("lo", "lo2"):
        engine.add_request([2, 3], SamplingParams(max_tokens=3, priority=5), rid)
    engine.add_request([2, 3], SamplingParams(max_tokens=3, priority=0), "hi")     # takes lo2's place
    events = engine.step()                                  # the rebuild's step
    assert [(ev.req_id, ev.refused.reason) for ev in events if ev.refused] == [("lo2", "queue_full")]


def test_a_refused_request_is_work_even_when_nothing_else_is_left():
    engine = Engine(RecordingExecutor(), _cfg(policy="priority", max_num_seqs=1, max_waiting=0))
    engine.add_request([2, 3], SamplingParams(max_tokens=3, priority=5), "lo")
    engine.add_request([2, 3], SamplingParams(max_tokens=3, priority=0), "hi")
    engine.abort("hi")
    assert not engine.has_unfinished() and engine.has_work()
    assert [ev.req_id for ev in engine.step() if ev.refused] == ["lo"] and not engine.has_work()


def test_a_probe_during_a_pending_rebuild_keeps_its_back_off():
    group = FailsAt(0, GroupFailure("rank 1 died"))
    engine = Engine(group, _cfg())
    engine.add_request([2, 3], SamplingParams(max_tokens=3), "x")
    engine.step()
    engine.rebuild_at = at = time.monotonic() + 30          # (as after failed rebuilds)
    group.gone = "rank 0 died"
    assert engine.probe() == [] and engine.rebuild_at == at and group.recovers == 0


def test_a_request_after_the_step_loop_died_is_refused_at_once():
    aeng = AsyncEngine(Engine(RecordingExecutor(), _cfg()))
    aeng.shutdown()
    assert not aeng.is_alive()

    async def main():           # (a request queued to the dead loop would wait for ever: TimeoutError)
        return await asyncio.wait_for(aeng.generate([2], SamplingParams(max_tokens=1)).__anext__(), 3)

    with pytest.raises(AdmissionError) as err:
        asyncio.run(main())
    assert err.value.reason == "unavailable"


def test_a_rank_without_the_drafting_request_chains_its_drafts_into_the_pad_slot(tiny_ckpt):
    """``DraftGraphs.stage_inputs`` with no drafting row (a group's other ranks, which replay the same chained passes;
    the warm-up): the chain's KV goes to the pad slot, never to a slot a request owns."""
    model = load_model(tiny_ckpt, dtype=torch.float32, progress=False, mtp=True)
    runner = ModelRunner(model, 8, BS, torch.float32, speculative=True, graphs="eager")
    dg = runner.draft_graphs
    assert dg is not None
    dg.stage_inputs(torch.zeros(1, model.config.hidden_size), [], 0, None)
    assert (dg.chain_slot == runner.graphs.pad_slot).all() and not dg.chain_real.item()
    dg.stage_inputs(torch.zeros(1, model.config.hidden_size), [5], 0, 40)
    assert dg.chain_pos.tolist() == [41 + j for j in range(dg.scratch_len)] and dg.chain_real.item()
    assert dg.chain_slot.tolist() == [dg.scratch_base + j for j in range(dg.scratch_len)]
