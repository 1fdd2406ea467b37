"""The priority scheduling policy: requests go by (priority, arrival); one that outranks running requests takes the
worst one's place when it could not start beside them. Pure Python, driven by test_scheduler's fake paged model."""

from __future__ import annotations

import random

import pytest

from scheduler import AdmissionError, RequestStatus, SamplingParams
from tests.unit.test_scheduler import FakeModel, check_plan, expected_output, make, prompt


def _drive(sched, model, arrivals, max_steps=5000):
    """Run to completion, checking after every ``schedule()`` that the requests it started (waiting before, running
    after) all rank before every request still waiting: no overtaking, by rank. Returns outputs, plans and the step
    at which each request finished."""
    outputs, plans, done = {}, [], {}
    arrivals = dict(arrivals)
    for step in range(max_steps):
        for rid, ids, params in arrivals.pop(step, []):
            sched.add_request(rid, ids, params)
        if not sched.has_unfinished() and not arrivals:
            break
        before = {r.req_id for r in sched._waiting}
        plan = sched.schedule()
        if not sched.config.prefix_caching:     # (a cached prefix's blocks are shared)
            check_plan(sched, plan)
        started = [sched.get(r) for r in before if sched.get(r).status is not RequestStatus.WAITING]
        assert all(s.rank < w.rank for s in started for w in sched._waiting), (step, started, list(sched._waiting))
        assert [r.rank for r in sched._running] == sorted(r.rank for r in sched._running)
        assert [r.rank for r in sched._waiting] == sorted(r.rank for r in sched._waiting)
        plans.append(plan)
        for ev in sched.update(plan, model.execute(plan)):
            outputs.setdefault(ev.req_id, []).extend(ev.new_token_ids)
            if ev.finished:
                done[ev.req_id] = step
    else:
        raise AssertionError("did not finish")
    assert sched.pool.num_free == sched.pool.num_blocks, "blocks leaked"
    return outputs, plans, done


def _random_arrivals(rng, nb, bs, n=12, priorities=(0,)):
    arrivals, specs = {}, {}
    for i in range(n):
        max_tokens = rng.randrange(1, 8)
        ids = prompt(rng.randrange(1, max(2, nb * bs - max_tokens)), rng.randrange(10**6))
        specs[f"r{i}"] = (ids, max_tokens)
        params = SamplingParams(max_tokens=max_tokens, priority=rng.choice(priorities))
        arrivals.setdefault(rng.randrange(20), []).append((f"r{i}", ids, params))
    return arrivals, specs


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_all_priorities_alike_plan_as_fcfs(prefix_caching):
    """With every priority 0 the policy changes nothing: the same plans, step for step, as FCFS."""
    rng = random.Random(11)
    for trial in range(8):
        nb, bs = rng.randrange(6, 20), rng.choice([1, 2, 4])
        kw = {"num_blocks": nb, "block_size": bs, "max_num_batched_tokens": rng.randrange(4, 12), "max_num_seqs": 4,
              "prefix_caching": prefix_caching}
        arrivals, _ = _random_arrivals(rng, nb, bs)
        runs = [_drive(make(policy=policy, **kw), FakeModel(nb, bs), arrivals) for policy in ("fcfs", "priority")]
        assert runs[0][1] == runs[1][1], trial


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_random_priorities_never_corrupt_or_leak(prefix_caching):
    """Random arrivals of mixed priorities on small pools (preemption for blocks, for a slot, for rank): every output
    is what the model gives alone, no block leaks, and no request starts while one that outranks it waits."""
    rng = random.Random(5)
    preempted = 0
    for trial in range(12):
        nb, bs = rng.randrange(6, 20), rng.choice([1, 2, 4])
        sched = make(num_blocks=nb, block_size=bs, max_num_batched_tokens=rng.randrange(4, 12), max_num_seqs=3,
                     policy="priority", prefix_caching=prefix_caching)
        arrivals, specs = _random_arrivals(rng, nb, bs, priorities=(-1, 0, 0, 3))
        outputs, plans, _ = _drive(sched, FakeModel(nb, bs), arrivals)
        preempted += sum(len(p.preempted) for p in plans)
        for rid, (ids, max_tokens) in specs.items():
            assert outputs[rid] == expected_output(ids, max_tokens), (trial, rid)
    assert preempted > 0


def test_an_arrival_that_outranks_takes_the_worst_running_slot():
    """No slot free: a priority-0 arrival preempts the worst-ranked running request (priority 2 before the two of
    priority 1) and starts in the same step; it finishes first, and the victim resumes after it, recomputed."""
    sched = make(num_blocks=64, block_size=4, max_num_batched_tokens=16, max_num_seqs=3, policy="priority")
    model = FakeModel(64, 4)
    for rid, p in (("a", 1), ("b", 2), ("c", 1)):
        sched.add_request(rid, prompt(5, ord(rid)), SamplingParams(max_tokens=12, priority=p))
    sched.update(plan := sched.schedule(), model.execute(plan))
    assert [r.req_id for r in sched._running] == ["a", "c", "b"]           # by rank, not arrival
    sched.add_request("vip", prompt(5, 9), SamplingParams(max_tokens=3, priority=0))
    plan = sched.schedule()
    assert plan.preempted == ("b",) and "vip" in {s.req_id for s in plan.seqs}
    assert [r.req_id for r in sched._running] == ["vip", "a", "c"] and sched.get("b").status is RequestStatus.WAITING
    sched.update(plan, model.execute(plan))
    outputs, _, done = _drive(sched, model, {})
    assert done["vip"] < min(done["a"], done["b"], done["c"])
    assert outputs["b"][-6:] == expected_output(prompt(5, ord("b")), 12)[-6:]


def test_an_arrival_that_outranks_preempts_for_blocks_only_as_far_as_it_needs():
    """Slots free but no blocks: the worst-ranked running requests give theirs up, one at a time, until the arrival's
    first chunk fits — and no further."""
    sched = make(num_blocks=12, block_size=2, max_num_batched_tokens=8, max_num_seqs=8, policy="priority")
    model = FakeModel(12, 2)
    for i in range(4):
        sched.add_request(f"r{i}", prompt(5, i), SamplingParams(max_tokens=6, priority=1))
    sched.update(plan := sched.schedule(), model.execute(plan))     # 8 tokens: r0's prompt, r1's first 3
    sched.update(plan := sched.schedule(), model.execute(plan))
    sched.update(plan := sched.schedule(), model.execute(plan))
    held = {r.req_id: len(r.block_ids) for r in sched._running}
    sched.add_request("vip", prompt(7, 99), SamplingParams(max_tokens=2, priority=-5))
    plan = sched.schedule()
    assert plan.preempted and "vip" in {s.req_id for s in plan.seqs}, (held, plan)
    kept = [r.req_id for r in sched._running if r.req_id != "vip"]
    assert kept == sorted(held)[:len(kept)]                          # the victims are the worst-ranked (latest)
    assert len(plan.preempted) == len(held) - len(kept)
    sched.update(plan, model.execute(plan))
    outputs, _, _ = _drive(sched, model, {})
    for i in range(4):
        assert outputs[f"r{i}"][-1] == expected_output(prompt(5, i), 6)[-1]


def test_waiting_requests_start_by_priority_then_arrival():
    sched = make(num_blocks=64, block_size=4, max_num_batched_tokens=16, max_num_seqs=1, policy="priority")
    for rid, p in (("low", 3), ("mid1", 1), ("high", -2), ("mid2", 1)):
        sched.add_request(rid, prompt(3, len(rid)), SamplingParams(max_tokens=2, priority=p))
    _, _, done = _drive(sched, FakeModel(64, 4), {})
    assert sorted(done, key=done.get) == ["high", "mid1", "mid2", "low"]


def test_fcfs_refuses_a_priority():
    sched = make()
    with pytest.raises(AdmissionError) as e:
        sched.add_request("r", prompt(3), SamplingParams(max_tokens=2, priority=1))
    assert e.value.field == "priority" and "scheduling_policy" in str(e.value)
    with pytest.raises(ValueError, match="policy"):
        make(policy="lifo")
    with pytest.raises(ValueError, match="priority"):
        SamplingParams(priority=1.5)


def test_an_arrival_that_outranks_a_running_prefill_takes_the_budget_before_it():
    """A priority -1 arrival's prompt goes ahead of a priority-5 request's chunked 200-token prefill: its first token
    comes the step after it arrives, not after that prefill (the requests are walked in rank order, the waiting ones
    merged with the running)."""
    sched = make(num_blocks=64, block_size=4, max_num_batched_tokens=8, max_num_seqs=4, policy="priority")
    sched.add_request("L", prompt(200, 1), SamplingParams(max_tokens=2, priority=5))
    outputs, plans, done = _drive(sched, FakeModel(64, 4), {1: [("H", prompt(4, 2), SamplingParams(max_tokens=2,
                                                                                                     priority=-1))]})
    assert [s.req_id for s in plans[1].seqs] == ["H", "L"] and done["H"] == 2 < done["L"]
    assert not any(p.preempted for p in plans)                   # a slot and blocks were free: nobody gave way


def test_running_requests_give_way_only_where_that_lets_the_arrival_start():
    """No slot free: the worst-ranked running request is preempted only if the arrival then starts — not where the
    blocks it needs are held by requests that outrank it."""
    sched = make(num_blocks=10, block_size=4, max_num_batched_tokens=16, max_num_seqs=2, policy="priority")
    model = FakeModel(10, 4)
    sched.add_request("top", prompt(28, 1), SamplingParams(max_tokens=4, priority=0))      # 7 blocks
    sched.add_request("low", prompt(3, 2), SamplingParams(max_tokens=8, priority=5))
    for _ in range(2):
        sched.update(plan := sched.schedule(), model.execute(plan))
    assert {r.req_id for r in sched._running} == {"top", "low"} and sched.pool.num_free == 2
    sched.add_request("mid", prompt(16, 3), SamplingParams(max_tokens=2, priority=1))      # needs 4: 2 free + low's 1
    plan = sched.schedule()
    assert plan.preempted == () and "mid" not in {s.req_id for s in plan.seqs}
    sched.update(plan, model.execute(plan))
    outputs, _, done = _drive(sched, model, {})
    assert outputs["mid"] == expected_output(prompt(16, 3), 2) and done["top"] < done["mid"]


def test_no_request_gives_way_to_an_arrival_the_budget_or_shared_blocks_keep_out():
    """Two ways a preemption started nothing (session 44's review): the step's budget spent by a higher-ranked prompt
    before the arrival's turn; and blocks a lower request shares with a higher one (a cached prefix) counted as if its
    preemption freed them."""
    sched = make(num_blocks=64, block_size=4, max_num_batched_tokens=8, max_num_seqs=2, policy="priority")
    model = FakeModel(64, 4)
    sched.add_request("L", prompt(4, 1), SamplingParams(max_tokens=30, priority=5))
    for _ in range(2):
        sched.update(plan := sched.schedule(), model.execute(plan))
    sched.add_request("A", prompt(40, 2), SamplingParams(max_tokens=3, priority=0))     # its chunks take the budget
    sched.update(plan := sched.schedule(), model.execute(plan))
    sched.add_request("H", prompt(4, 3), SamplingParams(max_tokens=3, priority=1))
    plan = sched.schedule()
    assert plan.preempted == () and [s.req_id for s in plan.seqs] == ["A"]
    sched.update(plan, model.execute(plan))
    _drive(sched, model, {})

    sched = make(num_blocks=11, block_size=4, max_num_batched_tokens=64, max_num_seqs=4, policy="priority",
                 prefix_caching=True)
    model, head = FakeModel(11, 4), prompt(16, 4)                       # 4 blocks of a shared prefix
    sched.add_request("R", head + [50], SamplingParams(max_tokens=12, priority=0))
    sched.update(plan := sched.schedule(), model.execute(plan))
    sched.add_request("L", head + [60], SamplingParams(max_tokens=12, priority=5))   # R's 4 cached blocks and 1
    sched.update(plan := sched.schedule(), model.execute(plan))
    sched.add_request("H", prompt(28, 5), SamplingParams(max_tokens=4, priority=1))  # 7 > 4 free + L's own 1
    plan = sched.schedule()
    assert plan.preempted == () and [s.req_id for s in plan.seqs] == ["R", "L"]
    sched.update(plan, model.execute(plan))
    outputs, _, _ = _drive(sched, model, {})
    assert outputs["H"] == expected_output(prompt(28, 5), 4)
