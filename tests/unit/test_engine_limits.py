"""A replica's admission limits over its ranks: ``max_num_seqs`` running and ``max_waiting`` waiting requests bound the
whole engine (every rank's scheduler together), not each rank — over a fake executor."""

from __future__ import annotations

import pytest

from cluster.engine import Engine, warm_keys
from scheduler.request import SamplingParams
from scheduler.scheduler import AdmissionError, SchedulerConfig
from scheduler.shapes import rank_seqs
from tests.conftest import RecordingExecutor
from workers.runner import NewRequest


def _engine(ranks: int, max_num_seqs: int, max_waiting: int) -> Engine:
    cfg = SchedulerConfig(num_blocks=64, block_size=16, max_model_len=256, vocab_size=64, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=64, max_waiting=max_waiting)
    return Engine(RecordingExecutor(), cfg, num_ranks=ranks)


def _counts(engine: Engine) -> tuple[list[int], list[int]]:
    return [s.num_running for s in engine.schedulers], [s.num_waiting for s in engine.schedulers]


def test_rank_shares_of_max_num_seqs():
    assert rank_seqs(64, 1) == [64]
    assert rank_seqs(128, 8) == [16] * 8
    assert rank_seqs(10, 4) == [3, 3, 2, 2]
    assert rank_seqs(2, 4) == [1, 1, 1, 1]          # at least one a rank


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_max_num_seqs_and_max_waiting_bound_the_replica(ranks):
    engine = _engine(ranks, max_num_seqs=4, max_waiting=3)
    for i in range(7):                                   # 4 run, 3 wait
        engine.add_request([1 + i, 2, 3], SamplingParams(max_tokens=40, ignore_eos=True), f"r{i}")
    with pytest.raises(AdmissionError) as err:
        engine.add_request([9, 9], SamplingParams(max_tokens=4), "over")
    assert err.value.reason == "queue_full" and "4 running + 3 waiting" in str(err.value)
    engine.step()
    running, waiting = _counts(engine)
    assert sum(running) == 4 and sum(waiting) == 3, (running, waiting)
    assert running == [4 // ranks] * ranks               # every rank runs its share (moved where a slot was free)
    with pytest.raises(AdmissionError):
        engine.add_request([9, 9], SamplingParams(max_tokens=4), "still-over")
    engine.abort("r4")                                   # r0–r3 took the free slots, r4 waited: one more may wait
    engine.add_request([9, 9], SamplingParams(max_tokens=4), "late")
    engine.abort("r0")                                   # a slot frees: a request waiting on that rank runs
    engine.step()
    running, waiting = _counts(engine)
    for n, w, share in zip(running, waiting, rank_seqs(4, ranks)):
        assert n <= share and (n == share or not w), (running, waiting)   # no rank idles a slot with requests queued
    assert sum(running) + sum(waiting) == 6


def test_warm_up_captures_only_buckets_a_rank_can_fill():
    assert [k[0] for k, _ in warm_keys(1, True, 0, [1], seqs_per_rank=4)] == [1, 2, 4]
    assert [k[0] for k, _ in warm_keys(1, True, 3, [1], seqs_per_rank=1)] == [1, 2, 4]   # a solo verify's 1 + 3 rows
    assert [k[0] for k, _ in warm_keys(8, True, 0, [1], seqs_per_rank=5)] == [1, 2, 4, 8]
    assert warm_keys(2, True, 0, [1], seqs_per_rank=1000) == warm_keys(2, True, 0, [1])


def test_a_request_waiting_for_a_slot_moves_to_a_rank_that_frees_one():
    """Two ranks of one slot each: r0 and r1 run, r2 waits on rank 0 (placed while both were full). When rank 1's
    request ends first, rank 1 takes r2 before the next step (no worker has seen it) and starts it at once; a rank
    whose own queue fills its free slot takes nothing."""
    engine = _engine(2, max_num_seqs=2, max_waiting=4)
    for i in range(2):
        engine.add_request([1 + i, 2, 3], SamplingParams(max_tokens=40, ignore_eos=True), f"r{i}")
    engine.step()
    engine.add_request([7, 8], SamplingParams(max_tokens=40, ignore_eos=True), "r2")
    assert [engine._rank_of[r] for r in ("r0", "r1", "r2")] == [0, 1, 0]
    engine.abort("r1")
    engine.step()
    assert engine._rank_of["r2"] == 1 and engine.schedulers[1].get("r2").num_computed_tokens == 2
    assert _counts(engine) == ([1, 1], [0, 0])
    engine.add_request([9, 10], SamplingParams(max_tokens=40, ignore_eos=True), "r3")     # waits on a full rank
    placed = engine._rank_of["r3"]
    engine.abort("r0" if placed == 1 else "r2")            # the other rank frees its slot
    engine.add_request([11], SamplingParams(max_tokens=40, ignore_eos=True), "r4")        # ... and queues r4
    engine.step()
    assert engine._rank_of["r3"] == placed and engine._rank_of["r4"] == 1 - placed
    while engine.has_unfinished():                         # every request still finishes whole
        for ev in engine.step():
            assert ev.error is None


def test_a_request_its_worker_has_seen_stays_and_the_next_queue_gives():
    """Three ranks of one slot: rank 0 queues two requests, rank 1 one; rank 0's are marked as seen by its worker
    (as a preempted request is). When rank 2 frees its slot it takes rank 1's waiting request instead."""
    engine = _engine(3, max_num_seqs=3, max_waiting=8)
    for i in range(3):
        engine.add_request([1 + i, 2, 3], SamplingParams(max_tokens=40, ignore_eos=True), f"run{i}")
    engine.step()
    for rid, rank in (("a", 0), ("b", 0), ("c", 1)):      # queued where placed (all ranks full)
        engine.schedulers[rank].add_request(rid, [5, 6], SamplingParams(max_tokens=4))
        engine._rank_of[rid] = rank
        engine._unsent[rid] = NewRequest(rid, (5, 6), SamplingParams(max_tokens=4))
    for rid in ("a", "b"):
        del engine._unsent[rid]
    engine.abort("run2")
    engine._rebalance()
    assert [engine._rank_of[r] for r in "abc"] == [0, 0, 2]


def test_release_and_adopt_move_only_what_movable_allows():
    from scheduler.scheduler import Scheduler

    cfg = SchedulerConfig(num_blocks=8, block_size=16, max_model_len=64, vocab_size=64, max_num_seqs=1)
    a, b = Scheduler(cfg), Scheduler(cfg)
    a.add_request("x", [1, 2], SamplingParams(max_tokens=4))
    a.add_request("y", [3, 4], SamplingParams(max_tokens=4))
    assert a.release_waiting(lambda rid: False) is None and a.num_waiting == 2
    req = a.release_waiting(lambda rid: rid == "y")
    b.add_request("z", [5], SamplingParams(max_tokens=4))
    b.adopt(req)
    assert (req.req_id, a.num_waiting, b.num_waiting, a.get("y"), b.get("y") is req) == ("y", 1, 2, None, True)
    assert req.arrival > b.get("z").arrival                               # the youngest where it lands
