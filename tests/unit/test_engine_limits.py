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


def test_a_full_engine_refuses_a_request_that_can_never_run_for_what_it_is():
    """A token id outside the vocabulary, a context past max_model_len, an empty prompt: their 400s whether or not the
    engine is full — a full engine's 429 would have a client retry what can never run (session 55's review 3)."""
    engine = _engine(1, max_num_seqs=2, max_waiting=1)
    for i in range(3):
        engine.add_request([1 + i, 2, 3], SamplingParams(max_tokens=40, ignore_eos=True), f"r{i}")
    for ids, max_tokens, want in (([99], 4, "bad_token"), ([1, 2], 300, "too_long"), ([], 4, "empty_prompt"),
                                  ([9], 4, "queue_full")):            # (vocab_size 64, max_model_len 256)
        with pytest.raises(AdmissionError) as err:
            engine.add_request(ids, SamplingParams(max_tokens=max_tokens), "hopeless")
        assert err.value.reason == want, err.value


@pytest.mark.parametrize("ranks", [1, 2])
def test_max_waiting_tokens_bounds_the_prompt_tokens_queued_in_the_replica(ranks):
    """Prompt tokens still to compute (waiting prompts past their cached blocks, prefilling ones' rest), over every
    rank: a queue at the bound refuses a request (a queue_full naming it); below it, a prompt of any length gets in —
    a long prompt is not left out while short ones take each opening (session 56's review). The bound is at least
    max_model_len."""
    cfg = SchedulerConfig(num_blocks=64, block_size=16, max_model_len=160, vocab_size=64, max_num_seqs=4,
                          max_num_batched_tokens=64, max_waiting=8, max_waiting_tokens=160, prefix_caching=True)
    engine = Engine(RecordingExecutor(), cfg, num_ranks=ranks)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    big = [5] * 150
    engine.add_request(big, params, "big")
    engine.add_request([1] * 11, params, "small")                 # 150 queued: below the bound
    with pytest.raises(AdmissionError) as err:
        engine.add_request([2], params, "over")
    assert err.value.reason == "queue_full" and "holds 161 prompt tokens still to compute, max_waiting_tokens (160) " \
        "or more" in str(err.value)
    engine.step()                                                 # 64 tokens a rank computed
    assert sum(s.queued_tokens for s in engine.schedulers) == (97 if ranks == 1 else 86)
    engine.add_request([4] * 150, params, "long")                 # below the bound: the whole prompt gets in
    with pytest.raises(AdmissionError):
        engine.add_request([2], params, "over")
    while engine.has_unfinished():
        engine.step()
    engine.add_request([3] * 90, params, "a")
    engine.add_request(big[:-1] + [6], params, "again")           # big's 9 cached blocks: 6 tokens to compute
    assert sum(s.queued_tokens for s in engine.schedulers) == 96
    for s in engine.schedulers:                                   # a failed step: nothing is cached any more
        s.clear_prefix_cache()
    assert sum(s.queued_tokens for s in engine.schedulers) == 90 + 150
    while engine.has_unfinished():
        for ev in engine.step():
            assert ev.error is None
    with pytest.raises(ValueError, match=r"max_waiting_tokens \(100\) must be 0 or at least max_model_len \(160\)"):
        SchedulerConfig(num_blocks=64, max_model_len=160, max_waiting_tokens=100)


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


def test_a_request_its_worker_has_seen_moves_with_its_tokens():
    """Three ranks of one slot: rank 0 queues two requests, rank 1 one; rank 0's oldest was preempted there (its worker
    holds it, with 2 tokens generated). When rank 2 frees its slot it takes the longest queue's oldest request: rank
    0's forgets it, rank 2's gets its prompt and tokens."""
    engine = _engine(3, max_num_seqs=3, max_waiting=8)
    for i in range(3):
        engine.add_request([1 + i, 2, 3], SamplingParams(max_tokens=40, ignore_eos=True), f"run{i}")
    engine.step()
    for rid, rank in (("a", 0), ("b", 0), ("c", 1)):      # queued where placed (all ranks full)
        engine.schedulers[rank].add_request(rid, [5, 6], SamplingParams(max_tokens=4))
        engine._rank_of[rid] = rank
        engine._unsent[rid] = NewRequest(rid, (5, 6), SamplingParams(max_tokens=4))
    del engine._unsent["a"]                               # its worker has it
    engine.schedulers[0].get("a").output_ids = [8, 9]
    engine.abort("run2")
    engine._rebalance()
    assert [engine._rank_of[r] for r in "abc"] == [2, 0, 1] and engine.stats["moves"] == 1
    assert engine._forget[0] == ["a"] and engine._unsent["a"].output_ids == (8, 9)
    steps = engine.executor.steps
    engine.step()
    assert steps[-1][0].finished == ("a",) and [nr.req_id for nr in steps[-1][2].new_requests] == ["a"]


def test_a_request_stalled_for_kv_moves_to_a_rank_with_room():
    """Rank 0's pool fills as its two requests grow: the younger is preempted, and rank 1 (its request ended) has a
    slot and the blocks, so it moves there at once — not after rank 0's other request ends."""
    cfg = SchedulerConfig(num_blocks=4, block_size=4, max_model_len=64, vocab_size=64, max_num_seqs=4,
                          max_num_batched_tokens=64)
    engine = Engine(RecordingExecutor(), cfg, num_ranks=2)
    long = SamplingParams(max_tokens=12, ignore_eos=True)
    engine.add_request([1] * 3, long, "old")                                      # rank 0
    engine.add_request([2] * 13, SamplingParams(max_tokens=1), "brief")           # rank 1 (ends at once)
    engine.add_request([3] * 3, long, "young")                                    # rank 0: no more load than 1's
    assert [engine._rank_of[r] for r in ("old", "brief", "young")] == [0, 1, 0]
    where = []
    while engine.has_unfinished():
        engine.step()
        where.append(engine._rank_of.get("young"))
    assert engine.stats["preemptions"] >= 1 and engine.stats["moves"] == 1
    assert 1 in where and where[where.index(1):] == [1] * (len(where) - where.index(1) - 1) + [None]
    moved = next(nr for st in engine.executor.steps for nr in st[1].new_requests if nr.req_id == "young")
    assert moved.output_ids and moved.prompt_ids == (3, 3, 3)


def test_release_and_adopt_move_the_oldest_waiting_request():
    from scheduler.scheduler import Scheduler

    cfg = SchedulerConfig(num_blocks=8, block_size=16, max_model_len=64, vocab_size=64, max_num_seqs=1)
    a, b = Scheduler(cfg), Scheduler(cfg)
    assert a.release_waiting() is None
    a.add_request("x", [1, 2], SamplingParams(max_tokens=4))
    a.add_request("y", [3, 4], SamplingParams(max_tokens=4))
    req = a.release_waiting()
    b.add_request("z", [5], SamplingParams(max_tokens=4))
    b.adopt(req)
    assert (req.req_id, a.num_waiting, b.num_waiting, a.get("x"), b.get("x") is req) == ("x", 1, 2, None, True)
    assert req.arrival > b.get("z").arrival                               # the youngest where it lands


class _OutOfMemory(RecordingExecutor):
    """Runs out of device memory on a step of more than ``limit`` tokens a rank (as a worker's exception, or as a
    group's failure that passes a rank's on as text)."""

    def __init__(self, limit: int, group: bool):
        super().__init__()
        self.limit, self.group = limit, group

    def execute(self, steps):
        import torch

        from cluster.engine import GroupFailure

        if any(sum(len(s.token_ids) for s in st.seqs) > self.limit for st in steps):
            msg = "CUDA out of memory. Tried to allocate 2.00 GiB"
            raise GroupFailure(f"step: rank 0 failed: OutOfMemoryError: {msg}") if self.group else \
                torch.OutOfMemoryError(msg)
        return super().execute(steps)


@pytest.mark.parametrize("group", [False, True])
def test_a_step_out_of_memory_fails_its_requests_naming_the_knobs_and_serving_goes_on(group):
    """A step the device has no memory for fails its requests with an error that says what to lower; a later request
    is served (the failure is the step's, not the engine's)."""
    cfg = SchedulerConfig(num_blocks=64, block_size=16, max_model_len=256, vocab_size=64, max_num_batched_tokens=64)
    engine = Engine(_OutOfMemory(limit=40, group=group), cfg)
    engine.add_request(list(range(1, 61)), SamplingParams(max_tokens=4), "long")
    errors = [ev.error for ev in engine.step() if ev.error]
    assert len(errors) == 1 and "out of memory" in errors[0] and "a step of 60 tokens a rank (contexts up to 60)" \
        in errors[0] and "lower kv_cache_tokens or gpu_memory_utilization (whichever sizes the pool), " \
        "max_num_batched_tokens or max_num_seqs" in errors[0], errors
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True), "short")
    out = []
    while engine.has_unfinished():
        out += [(ev.token_ids, ev.error) for ev in engine.step()]
    assert out and all(err is None for _, err in out) and sum(len(t) for t, _ in out) == 3


def test_a_warm_up_out_of_memory_names_the_knobs():
    """A graph capture the device has no memory for stops the warm-up (a replica that cannot warm up cannot serve)
    with an error that says what to lower; another error passes as it is."""
    cfg = SchedulerConfig(num_blocks=64, block_size=16, max_model_len=256, vocab_size=64, max_num_batched_tokens=64)

    class Capture(RecordingExecutor):
        error = None

        def execute(self, steps):
            if steps[0].warm is not None and steps[0].graph is not None:
                raise self.error
            return super().execute(steps)

    import torch

    for error, match in ((torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB"),
                          r"warm-up failed: OutOfMemoryError: CUDA out of memory.*capturing the graph step \(1, 1, "
                          r"False\) found too little device memory beside the KV pool: lower kv_cache_tokens or "
                          r"gpu_memory_utilization"),
                         (ValueError("a bad kernel"), "^a bad kernel$")):
        Capture.error = error
        with pytest.raises(type(error) if isinstance(error, ValueError) else RuntimeError, match=match):
            Engine(Capture(), cfg, graphs=True).warm_up(64)


def test_a_long_prompt_gets_in_under_a_stream_of_short_ones():
    """Overloaded by short prompts, the queue sits at ``max_waiting_tokens``; a long prompt (400 of 512) retried among
    the arrivals gets in at the first opening it meets — had it to fit below the bound, it never would (session 56's
    review) — and the queue stays below the bound + max_model_len."""
    import random

    cfg = SchedulerConfig(num_blocks=256, block_size=16, max_model_len=512, vocab_size=64, max_num_seqs=4,
                          max_num_batched_tokens=64, max_waiting=16, max_waiting_tokens=512, prefix_caching=False)
    engine = Engine(RecordingExecutor(), cfg)
    rng, params, admitted, peak = random.Random(0), SamplingParams(max_tokens=4, ignore_eos=True), None, 0
    for step in range(200):
        arrivals = [f"s{step}-0", f"s{step}-1"] + (["long"] if admitted is None and step >= 10 else [])
        rng.shuffle(arrivals)
        for rid in arrivals:
            try:
                engine.add_request([2 + (rid == "long")] * (400 if rid == "long" else 48), params, rid)
                admitted = step if rid == "long" else admitted
            except AdmissionError as e:
                assert e.reason == "queue_full", e
        peak = max(peak, engine.queued_tokens())
        engine.step()
    assert admitted is not None and peak < 512 + 512, (admitted, peak)
    assert peak >= 512 - 64                         # (the engine was overloaded throughout)


def test_a_higher_priority_displaces_queued_prompt_tokens_past_max_waiting_tokens():
    """Under the priority policy, a prompt that meets a queue at ``max_waiting_tokens`` is admitted by refusing waiting
    requests of a lower priority that never ran — the lowest priority first — until the queue is below the bound;
    none is refused where they cannot free enough, and the arrival is refused as under FCFS."""
    cfg = SchedulerConfig(num_blocks=64, block_size=16, max_model_len=160, vocab_size=64, max_num_seqs=4,
                          max_num_batched_tokens=64, max_waiting=8, max_waiting_tokens=160, policy="priority")
    engine = Engine(RecordingExecutor(), cfg)
    add = lambda rid, n, p: engine.add_request([1 + len(rid)] * n, SamplingParams(max_tokens=2, priority=p), rid)
    add("low2", 100, 2)
    add("low1", 50, 1)                              # 150 queued: below the bound, so
    add("vip", 60, 0)                               # any prompt gets in: 210
    add("mid", 100, 1)                              # at the bound: low2 (the lowest; 51 must go) makes room
    assert sorted(r.req_id for s in engine.schedulers for r in s.waiting()) == ["low1", "mid", "vip"]
    with pytest.raises(AdmissionError, match=r"holds 210 prompt tokens still to compute, max_waiting_tokens \(160\) "
                                             r"or more"):
        add("x", 10, 1)                             # nothing below priority 1 is left
    add("vip2", 10, 0)                              # mid (priority 1, the latest of it) goes: 120
    add("vip3", 100, 0)                             # 220
    with pytest.raises(AdmissionError, match="max_waiting_tokens"):
        add("vip4", 10, 0)                          # low1's 50 tokens cannot bring 220 below the bound
    refused = [ev for ev in engine.step() if ev.refused]
    assert [ev.req_id for ev in refused] == ["low2", "mid"] and all(
        "max_waiting_tokens 160) and a request of a higher priority took" in ev.error for ev in refused)
    while engine.has_unfinished():
        engine.step()
    assert engine.scheduler.prompt_started == 50 + 60 + 10 + 100           # the refused prompts never started
