"""A lost worker group, over a fake executor (session 56's fault review): the requests of the step that lost it fail at
once — not after the rebuild, which can take minutes; a rebuild that fails fails what was admitted meanwhile, refuses
new requests and is tried again; an idle engine finds a dead rank itself; streams never outlive the step loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from cluster.async_engine import AsyncEngine
from cluster.engine import Engine, GroupFailure
from scheduler.request import SamplingParams
from scheduler.scheduler import AdmissionError, SchedulerConfig
from tests.conftest import RecordingExecutor


class FlakyGroup(RecordingExecutor):
    """Fails the step after ``fail_at`` steps; each rebuild waits for ``rebuilt`` (set by the test), then raises
    while ``setups_fail`` > 0 (counting down); ``gone`` is what ``dead()`` says between steps."""

    def __init__(self, fail_at: int | None = None, setups_fail: int = 0):
        super().__init__()
        self.fail_at, self.setups_fail, self.recovers, self.gone, self.delay = fail_at, setups_fail, 0, None, 0.0
        self.rebuilt = threading.Event()
        self.rebuilt.set()

    def execute(self, steps):
        if self.fail_at is not None and len(self.steps) >= self.fail_at:
            self.fail_at = None
            raise GroupFailure("step: rank 1 died (exit code -9)")
        time.sleep(self.delay)
        return super().execute(steps)

    def recover(self):
        self.recovers += 1
        assert self.rebuilt.wait(30)
        self.gone = None
        if self.setups_fail:
            self.setups_fail -= 1
            raise GroupFailure("setup: rank 1 failed: OSError: weights unreadable")

    def dead(self):
        return self.gone


def _engine(group, max_num_seqs: int = 4) -> Engine:
    cfg = SchedulerConfig(num_blocks=64, block_size=16, max_model_len=256, vocab_size=64, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=64, max_waiting=8)
    return Engine(group, cfg, num_ranks=2)


async def _run(aeng: AsyncEngine, prompt: int, tokens: int = 50) -> tuple[list[int], str | None, str | None, float]:
    out, ev, t = [], None, time.monotonic()
    async for ev in aeng.generate([prompt] * 5, SamplingParams(max_tokens=tokens, ignore_eos=True)):
        out += ev.token_ids
    return out, ev.finish_reason, ev.error, time.monotonic() - t


def test_a_lost_groups_requests_fail_before_its_rebuild_and_later_ones_run_after_it():
    group = FlakyGroup(fail_at=3)
    group.rebuilt.clear()                   # the rebuild takes until the test says (a model's load: minutes)
    aeng = AsyncEngine(_engine(group))

    async def main():
        failed = await asyncio.wait_for(asyncio.gather(*[_run(aeng, p) for p in (1, 2, 3)]), 10)
        later = asyncio.ensure_future(_run(aeng, 4, 3))     # admitted while the group is rebuilt: waits for it
        await asyncio.sleep(0.3)
        assert not later.done() and group.recovers == 1
        group.rebuilt.set()
        return failed, await asyncio.wait_for(later, 10)

    try:
        failed, later = asyncio.run(main())
    finally:
        aeng.shutdown()
    assert all(r[1] == "error" and "rank 1 died" in r[2] for r in failed), failed
    assert later[:3] == ([7, 7, 7], "length", None)
    assert aeng.engine.rebuild_at is None and not aeng.engine.has_unfinished()


def test_requests_that_never_ran_start_over_on_the_rebuilt_group():
    """Two run (a seat a rank), two wait; the group is lost: the two running fail, the two waiting — no output,
    nothing the client saw — run on the rebuilt group, their blocks and the engine's maps as if they had just
    arrived."""
    group = FlakyGroup(fail_at=3)
    engine = _engine(group, max_num_seqs=2)
    aeng = AsyncEngine(engine)

    async def main():
        return await asyncio.wait_for(asyncio.gather(*[_run(aeng, p, 20) for p in (1, 2, 3, 4)]), 20)

    try:
        runs = asyncio.run(main())
    finally:
        aeng.shutdown()
    assert [r[1] for r in runs] == ["error", "error", "length", "length"], runs
    assert runs[2][0] == runs[3][0] == [7] * 20 and group.recovers == 1
    assert not engine.has_unfinished() and all(s.pool.num_free == 64 for s in engine.schedulers)
    assert not engine._streams and not engine._rank_of and not engine._unsent


def test_a_failed_rebuild_fails_whats_waiting_refuses_new_requests_then_tries_again():
    group = FlakyGroup(fail_at=2, setups_fail=1)
    group.rebuilt.clear()
    engine = _engine(group)
    aeng = AsyncEngine(engine)

    async def main():
        first = await asyncio.wait_for(_run(aeng, 1), 10)
        waiting = asyncio.ensure_future(_run(aeng, 2, 3))  # admitted before the rebuild fails: fails with it
        await asyncio.sleep(0.2)
        group.rebuilt.set()
        waited = await asyncio.wait_for(waiting, 10)
        with pytest.raises(AdmissionError) as refused:      # down: refused at once (HTTP 503), not queued
            await _run(aeng, 3, 3)
        assert refused.value.reason == "unavailable" and "weights unreadable" in str(refused.value)
        for _ in range(100):                                # the second rebuild, a second later, works
            if engine.down is None:
                break
            await asyncio.sleep(0.05)
        return first, waited, await asyncio.wait_for(_run(aeng, 4, 3), 10)

    try:
        first, waited, after = asyncio.run(main())
    finally:
        aeng.shutdown()
    assert first[1] == "error" and "rank 1 died" in first[2]
    assert waited[1] == "error" and "rebuild failed" in waited[2] and "weights unreadable" in waited[2]
    assert after[:3] == ([7, 7, 7], "length", None) and group.recovers == 2


def test_an_idle_engine_rebuilds_a_group_whose_rank_died():
    group = FlakyGroup()
    engine = _engine(group)
    assert engine.probe() == [] and engine.rebuild_at is None
    group.gone = "rank 1 died (exit code -9)"
    assert engine.probe() == [] and engine.has_work()      # nothing was running: no request fails
    assert engine.step() == [] and group.recovers == 1 and engine.rebuild_at is None and not engine.has_work()


def test_streams_end_with_an_error_when_the_step_loop_stops():
    group = FlakyGroup()
    group.delay = 0.01
    aeng = AsyncEngine(_engine(group))

    async def main():
        stream = aeng.generate([1] * 5, SamplingParams(max_tokens=250, ignore_eos=True))
        await stream.__anext__()
        aeng._stop = True                   # (as shutdown: the loop ends with the request still running)
        return [ev async for ev in stream][-1]

    try:
        last = asyncio.run(asyncio.wait_for(main(), 10))
    finally:
        aeng.shutdown()
    assert last.finish_reason == "error" and "shut down" in last.error
    with pytest.raises(AdmissionError, match="the engine loop has stopped"):
        asyncio.run(aeng.generate([1], SamplingParams(max_tokens=1)).__anext__())
