"""Scheduler policy tests: pure Python, no torch, driven by a fake paged-KV "model"."""

from __future__ import annotations

import random

import pytest

from scheduler import (
    AdmissionError,
    BlockPool,
    RequestStatus,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    StepPlan,
)

VOCAB = 97


class FakeModel:
    """A deterministic "model" over a paged KV store: token = f(tokens read back through the block table).

    Writes every fed token into the slot its block table names and samples from what it reads back,
    so a wrong block table, a stale block or a bad recompute changes the output.
    """

    def __init__(self, num_blocks: int, block_size: int, ahead: bool = False) -> None:
        self.block_size = block_size
        self.kv: list[int | None] = [None] * (num_blocks * block_size)
        self.ahead = ahead      # also write a junk token one position on, as a step launched ahead may

    def _slot(self, block_ids: tuple[int, ...], pos: int) -> int:
        return block_ids[pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, plan: StepPlan) -> dict[str, list[int]]:
        sampled = {}
        for seq in plan.seqs:
            assert len(seq.block_ids) * self.block_size >= seq.end_pos
            for i, tok in enumerate(seq.token_ids):
                self.kv[self._slot(seq.block_ids, seq.start_pos + i)] = tok
            if self.ahead and len(seq.block_ids) * self.block_size > seq.end_pos:
                self.kv[self._slot(seq.block_ids, seq.end_pos)] = VOCAB       # never a sampled token
            if seq.sample:
                context = [self.kv[self._slot(seq.block_ids, p)] for p in range(seq.end_pos)]
                sampled[seq.req_id] = [next_token(context)]
        return sampled


def next_token(context: list[int | None]) -> int:
    assert None not in context
    h = len(context)
    for t in context:
        h = (h * 31 + t) % 1_000_003
    return h % VOCAB


def expected_output(prompt: list[int], max_tokens: int) -> list[int]:
    ids = list(prompt)
    for _ in range(max_tokens):
        ids.append(next_token(ids))
    return ids[len(prompt) :]


def check_plan(sched: Scheduler, plan: StepPlan) -> None:
    used = [b for s in plan.seqs for b in s.block_ids]
    assert len(used) == len(set(used)), "two seqs share a block"
    assert plan.num_tokens <= sched.config.max_num_batched_tokens
    assert len(plan.seqs) <= sched.config.max_num_seqs


def drive(sched: Scheduler, model: FakeModel, max_steps: int = 10_000, arrivals=None):
    """Run to completion; arrivals: step -> [(req_id, prompt, params)]. Returns outputs and plans."""
    outputs: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    plans = []
    arrivals = dict(arrivals or {})
    for step in range(max_steps):
        for req_id, prompt, params in arrivals.pop(step, []):
            sched.add_request(req_id, prompt, params)
        if not sched.has_unfinished() and not arrivals:
            break
        plan = sched.schedule()
        check_plan(sched, plan)
        plans.append(plan)
        for ev in sched.update(plan, model.execute(plan)):
            outputs.setdefault(ev.req_id, []).extend(ev.new_token_ids)
            if ev.finished:
                reasons[ev.req_id] = ev.finish_reason
    else:
        raise AssertionError("did not finish")
    assert sched.pool.num_free == sched.pool.num_blocks, "blocks leaked"
    return outputs, reasons, plans


def make(num_blocks=64, block_size=4, slack=0, **kw) -> Scheduler:
    kw.setdefault("vocab_size", VOCAB)
    kw.setdefault("max_num_batched_tokens", 32)
    kw.setdefault("max_num_seqs", 8)
    return Scheduler(SchedulerConfig(num_blocks=num_blocks, block_size=block_size, **kw), slack)


def prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


# ---- block pool -----------------------------------------------------------------------------


def test_block_pool_alloc_free():
    pool = BlockPool(num_blocks=4, block_size=16)
    assert pool.blocks_needed(0) == 0 and pool.blocks_needed(16) == 1 and pool.blocks_needed(17) == 2
    a = pool.allocate(3)
    assert len(set(a)) == 3 and pool.num_free == 1
    assert pool.can_allocate(1) and not pool.can_allocate(2)
    with pytest.raises(AssertionError):
        pool.allocate(2)
    pool.free(a[:2])
    assert pool.num_free == 3
    with pytest.raises(AssertionError, match="double free"):
        pool.free([a[0]])
    pool.free([a[2]])
    assert sorted(pool.allocate(4)) == [0, 1, 2, 3]


# ---- sampling params ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"temperature": float("inf")}, "temperature must be a finite number"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids"),
    ],
)
def test_sampling_params_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_sampling_params_greedy_and_tuples():
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(top_k=1).is_greedy
    assert not SamplingParams().is_greedy
    p = SamplingParams(stop_token_ids=[3, 4], stop=["\n"])
    assert p.stop_token_ids == (3, 4) and p.stop == ("\n",)
    hash(p)


# ---- admission ------------------------------------------------------------------------------


def test_admission_refusals_leave_others_running():
    sched = make(num_blocks=8, block_size=4, max_model_len=40, max_waiting=2)
    sched.add_request("ok", prompt(5), SamplingParams(max_tokens=3))
    sched.schedule()  # "ok" is now running, not waiting
    cases = [
        ("ok", [1], SamplingParams(), "duplicate", "req_id"),
        ("e", [], SamplingParams(), "empty_prompt", "prompt"),
        ("v", [1, VOCAB], SamplingParams(), "bad_token", "prompt"),
        ("n", [-1], SamplingParams(), "bad_token", "prompt"),
        ("s", [1], SamplingParams(stop_token_ids=(VOCAB,), min_tokens=2), "bad_token", "stop_token_ids"),
        ("b", [1], SamplingParams(logit_bias=((VOCAB, 1.0),)), "bad_token", "logit_bias"),
        ("l", prompt(30), SamplingParams(max_tokens=11), "too_long", "max_tokens"),
        ("k", prompt(30), SamplingParams(max_tokens=8), "kv_capacity", "max_tokens"),
    ]
    for req_id, ids, params, reason, field in cases:
        with pytest.raises(AdmissionError) as info:
            sched.add_request(req_id, ids, params)
        assert (info.value.reason, info.value.field) == (reason, field), req_id
        assert isinstance(info.value, ValueError) and str(info.value)
    # Exactly fits: 30 + 3 tokens, the last never stored -> 32 tokens = 8 blocks.
    sched.add_request("fits", prompt(29), SamplingParams(max_tokens=4))
    sched.add_request("w2", prompt(3), SamplingParams(max_tokens=2))
    with pytest.raises(AdmissionError) as info:
        sched.add_request("w3", prompt(3), SamplingParams())
    assert (info.value.reason, info.value.field) == ("queue_full", "queue")
    assert sched.num_waiting == 2 and sched.num_running == 1
    outputs, reasons, _ = drive(sched, FakeModel(8, 4))
    assert reasons == {"ok": "length", "fits": "length", "w2": "length"}
    assert outputs["fits"] == expected_output(prompt(29), 4)


def test_config_validation():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(num_blocks=4, max_num_seqs=8, max_num_batched_tokens=4)
    with pytest.raises(ValueError, match="num_blocks"):
        SchedulerConfig(num_blocks=0)
    with pytest.raises(ValueError, match="eos_token_ids"):
        SchedulerConfig(num_blocks=4, vocab_size=10, eos_token_ids=(10,))


# ---- chunked prefill ------------------------------------------------------------------------


def test_chunked_prefill_positions_and_block_tables():
    sched = make(block_size=4, max_num_batched_tokens=8)
    ids = prompt(20)
    sched.add_request("a", ids, SamplingParams(max_tokens=3))
    model = FakeModel(64, 4)
    chunks = []
    for _ in range(3):
        plan = sched.schedule()
        (seq,) = plan.seqs
        chunks.append((seq.start_pos, len(seq.token_ids), len(seq.block_ids), seq.sample))
        assert seq.token_ids == tuple(ids[seq.start_pos : seq.end_pos])
        assert sched.get("a").status is RequestStatus.PREFILLING
        events = sched.update(plan, model.execute(plan))
    assert chunks == [(0, 8, 2, False), (8, 8, 4, False), (16, 4, 5, True)]
    assert sched.get("a").status is RequestStatus.DECODING
    assert [e.new_token_ids for e in events] == [tuple(expected_output(ids, 1))]
    plan = sched.schedule()
    (seq,) = plan.seqs
    assert (seq.start_pos, seq.token_ids, seq.sample, seq.num_generated) == (
        20,
        tuple(expected_output(ids, 1)),
        True,
        1,
    )
    assert len(seq.block_ids) == 6  # position 20 opens a sixth block


def test_decodes_first_then_prefill_in_remaining_budget():
    sched = make(block_size=4, max_num_batched_tokens=8)
    sched.add_request("d1", prompt(3, 1), SamplingParams(max_tokens=10))
    sched.add_request("d2", prompt(3, 2), SamplingParams(max_tokens=10))
    model = FakeModel(64, 4)
    sched.update(p := sched.schedule(), model.execute(p))
    assert sched.get("d1").status is RequestStatus.DECODING
    sched.add_request("p", prompt(20, 3), SamplingParams(max_tokens=2))
    plan = sched.schedule()
    assert [(s.req_id, len(s.token_ids)) for s in plan.seqs] == [("d1", 1), ("d2", 1), ("p", 6)]


def test_max_num_seqs_caps_running():
    sched = make(max_num_seqs=2, max_num_batched_tokens=32)
    for i in range(4):
        sched.add_request(f"r{i}", prompt(3, i), SamplingParams(max_tokens=4))
    plan = sched.schedule()
    assert [s.req_id for s in plan.seqs] == ["r0", "r1"]
    assert sched.num_running == 2 and sched.num_waiting == 2
    outputs, _, plans = drive(sched, FakeModel(64, 4))
    assert all(len({s.req_id for s in p.seqs}) <= 2 for p in plans)
    assert outputs["r3"] == expected_output(prompt(3, 3), 4)


# ---- fairness -------------------------------------------------------------------------------


def test_fcfs_long_prompt_not_starved_by_short_stream():
    # The long prompt is one 40-token chunk (10 of the 12 blocks): it fits only once the pool has
    # drained, while a short request (<= 3 blocks) arriving every step would always fit.
    sched = make(num_blocks=12, block_size=4, max_num_batched_tokens=48, max_num_seqs=8)
    arrivals = {s: [(f"s{s}", prompt(4, s), SamplingParams(max_tokens=8))] for s in range(40)}
    arrivals[3].append(("long", prompt(40, 99), SamplingParams(max_tokens=2)))
    outputs, _, plans = drive(sched, FakeModel(12, 4), arrivals=arrivals)
    first_scheduled = []
    for plan in plans:
        first_scheduled += [
            s.req_id for s in plan.seqs if s.start_pos == 0 and s.req_id not in first_scheduled
        ]
    assert first_scheduled == [f"s{s}" for s in range(4)] + ["long"] + [f"s{s}" for s in range(4, 40)]
    assert outputs["long"] == expected_output(prompt(40, 99), 2)
    long_done = next(i for i, p in enumerate(plans) for s in p.seqs if s.req_id == "long" and s.sample)
    assert long_done < 20


# ---- preemption -----------------------------------------------------------------------------


def _workload(n: int = 10):
    rng = random.Random(7)
    return {
        step: [
            (f"r{step}", prompt(rng.randrange(1, 14), step), SamplingParams(max_tokens=rng.randrange(1, 12)))
        ]
        for step in range(n)
    }


def test_preemption_recompute_matches_unconstrained_run():
    big = make(num_blocks=256, block_size=4, max_num_batched_tokens=16)
    ref, ref_reasons, ref_plans = drive(big, FakeModel(256, 4), arrivals=_workload())
    assert not any(p.preempted for p in ref_plans)

    tiny = make(num_blocks=7, block_size=4, max_num_batched_tokens=16)
    out, reasons, plans = drive(tiny, FakeModel(7, 4), arrivals=_workload())
    assert sum(len(p.preempted) for p in plans) > 0, "the tiny pool should force preemption"
    assert out == ref and reasons == ref_reasons
    for reqs in _workload().values():
        for rid, ids, params in reqs:
            assert out[rid] == expected_output(ids, params.max_tokens)


def test_preempted_request_requeues_at_front_and_recomputes():
    sched = make(num_blocks=4, block_size=2, max_num_batched_tokens=8, max_num_seqs=4)
    model = FakeModel(4, 2)
    sched.add_request("old", prompt(3, 1), SamplingParams(max_tokens=4))
    sched.add_request("young", prompt(3, 2), SamplingParams(max_tokens=4))
    sched.update(p := sched.schedule(), model.execute(p))  # both prefilled: 2 blocks each
    sched.add_request("later", prompt(2, 3), SamplingParams(max_tokens=1))
    assert sched.pool.num_free == 0
    plan = sched.schedule()  # both decoders are at position 3 (still in block 2)
    assert plan.preempted == () and {s.req_id for s in plan.seqs} == {"old", "young"}
    sched.update(plan, model.execute(plan))
    plan = sched.schedule()  # position 4 needs a new block: the youngest running is preempted
    assert plan.preempted == ("young",)
    young = sched.get("young")
    assert young.status is RequestStatus.WAITING and young.block_ids == [] and young.num_computed_tokens == 0
    assert young.num_preemptions == 1 and len(young.output_ids) == 2
    assert [r.req_id for r in sched._waiting] == ["young", "later"]
    assert [s.req_id for s in plan.seqs] == ["old"]
    outputs, _, _ = drive(sched, model)
    assert outputs["young"][-2:] == expected_output(prompt(3, 2), 4)[2:]


def test_decoder_preempts_partial_prefill():
    sched = make(num_blocks=6, block_size=2, max_num_batched_tokens=4, max_num_seqs=4)
    model = FakeModel(6, 2)
    sched.add_request("d", prompt(2, 1), SamplingParams(max_tokens=6))
    sched.add_request("p", prompt(12, 2), SamplingParams(max_tokens=1))
    outputs, _, plans = drive(sched, model)
    assert any("p" in plan.preempted for plan in plans)
    assert outputs["d"] == expected_output(prompt(2, 1), 6)
    assert outputs["p"] == expected_output(prompt(12, 2), 1)


# ---- endings --------------------------------------------------------------------------------


def _start(sched: Scheduler, req_id: str, params: SamplingParams, n: int = 3):
    sched.add_request(req_id, prompt(n), params)
    return sched.schedule()


def test_finish_on_max_tokens_truncates():
    sched = make()
    plan = _start(sched, "a", SamplingParams(max_tokens=2))
    (ev,) = sched.update(plan, {"a": [5, 6, 7]})  # e.g. speculative tokens beyond the limit
    assert (ev.new_token_ids, ev.finished, ev.finish_reason) == ((5, 6), True, "length")
    assert sched.get("a") is None and sched.kv_usage == 0.0


def test_finish_on_eos_and_stop_token_ids():
    sched = make(eos_token_ids=(9,))
    plan = _start(sched, "eos", SamplingParams(max_tokens=10))
    (ev,) = sched.update(plan, {"eos": [4, 9, 5]})
    assert (ev.new_token_ids, ev.finish_reason) == ((4, 9), "stop")

    plan = _start(sched, "stop", SamplingParams(max_tokens=10, stop_token_ids=(7,)))
    (ev,) = sched.update(plan, {"stop": [7]})
    assert (ev.new_token_ids, ev.finished, ev.finish_reason) == ((7,), True, "stop")

    plan = _start(sched, "ign", SamplingParams(max_tokens=3, ignore_eos=True))
    (ev,) = sched.update(plan, {"ign": [9]})
    assert not ev.finished and sched.get("ign").output_ids == [9]
    (ev,) = sched.update(sched.schedule(), {"ign": [9, 9]})
    assert (ev.new_token_ids, ev.finish_reason) == ((9, 9), "length")
    assert sched.pool.num_free == sched.pool.num_blocks


def test_external_finish_abort_and_fail_free_blocks():
    sched = make(num_blocks=16, max_num_seqs=2)
    for rid in ("a", "b", "c", "d"):
        sched.add_request(rid, prompt(6), SamplingParams(max_tokens=8))
    plan = sched.schedule()
    sched.update(plan, FakeModel(16, 4).execute(plan))
    assert sched.kv_usage > 0 and sched.num_running == 2 and sched.num_waiting == 2

    ev = sched.abort("a")
    assert (ev.finished, ev.finish_reason) == (True, "abort")
    assert sched.abort("a") is None and sched.abort("nope") is None
    ev = sched.abort("c")  # still waiting
    assert ev.finish_reason == "abort" and sched.num_waiting == 1

    ev = sched.finish("b")
    assert (ev.finished, ev.finish_reason) == (True, "stop") and sched.finish("b") is None
    (ev,) = sched.fail(["d", "ghost"], "worker 3 died")
    assert (ev.req_id, ev.finish_reason, ev.error) == ("d", "error", "worker 3 died")
    assert not sched.has_unfinished() and sched.kv_usage == 0.0


def test_abort_between_schedule_and_update_is_skipped():
    sched = make()
    sched.add_request("a", prompt(4, 1), SamplingParams(max_tokens=4))
    sched.add_request("b", prompt(4, 2), SamplingParams(max_tokens=4))
    plan = sched.schedule()
    sampled = FakeModel(64, 4).execute(plan)
    sched.abort("a")
    events = sched.update(plan, sampled)
    assert [e.req_id for e in events] == ["b"]
    assert sched.pool.num_used == 1  # only b's block


def test_request_readmitted_after_finish_with_same_id():
    sched = make()
    plan = _start(sched, "a", SamplingParams(max_tokens=1))
    sched.update(plan, {"a": [1]})
    sched.add_request("a", prompt(3), SamplingParams(max_tokens=1))  # id is free again
    assert sched.num_waiting == 1


def test_empty_plan_when_nothing_can_run():
    sched = make()
    plan = sched.schedule()
    assert plan.seqs == () and plan.num_tokens == 0 and plan.preempted == ()
    assert sched.update(plan, {}) == []
    assert sched.schedule().step_id == plan.step_id + 1


@pytest.mark.parametrize("slack", [0, 1])
def test_random_workloads_never_corrupt_or_leak(slack):
    """Random arrivals on small pools (preemption); with slack, every step also writes junk one position past its
    rows where their blocks reach (a step launched ahead): a slack block shared or handed on too early shows."""
    rng = random.Random(3)
    for trial in range(6):
        nb = rng.randrange(6, 20)
        bs = rng.choice([1, 2, 4])
        sched = make(
            num_blocks=nb, block_size=bs, slack=slack, max_num_batched_tokens=rng.randrange(4, 12), max_num_seqs=4
        )
        arrivals: dict[int, list] = {}
        specs = {}
        for i in range(12):
            max_tokens = rng.randrange(1, 8)
            n = rng.randrange(1, max(2, nb * bs - max_tokens))
            ids = prompt(n, 100 * trial + i)
            specs[f"r{i}"] = (ids, max_tokens)
            arrivals.setdefault(rng.randrange(20), []).append(
                (f"r{i}", ids, SamplingParams(max_tokens=max_tokens))
            )
        outputs, _, _ = drive(sched, FakeModel(nb, bs, ahead=bool(slack)), arrivals=arrivals)
        for rid, (ids, max_tokens) in specs.items():
            assert outputs[rid] == expected_output(ids, max_tokens), (trial, rid)


def test_slack_holds_the_next_position_from_free_blocks_only():
    """slack = 1: a decode row's blocks reach its next position when a block is free; taking one never preempts,
    and none is taken while a prompt waits (the engine does not look ahead then)."""
    sched = make(num_blocks=3, block_size=4, slack=1, max_num_seqs=2)
    model = FakeModel(3, 4, ahead=True)
    sched.add_request("a", prompt(4, 1), SamplingParams(max_tokens=6))
    sched.update(p := sched.schedule(), model.execute(p))                 # prefill: one block
    assert len(p.seqs[0].block_ids) == 1
    for _ in range(4):                                                    # positions 4..7, then 8 ahead
        plan = sched.schedule()
        s = plan.seqs[0]
        assert len(s.block_ids) * 4 >= s.end_pos + 1 and not plan.preempted
        sched.update(plan, model.execute(plan))
    assert len(sched.get("a").block_ids) == 3 and sched.pool.num_free == 0
    sched.add_request("b", prompt(2, 2), SamplingParams(max_tokens=2))   # waits: the pool is full
    plan = sched.schedule()
    assert [s.req_id for s in plan.seqs] == ["a"] and not plan.preempted
    outputs, _, _ = drive(sched, model)
    assert outputs["b"] == expected_output(prompt(2, 2), 2)
    tight = make(num_blocks=2, block_size=4, slack=1, max_num_seqs=2)     # a block each, the next one full: no slack
    for rid in ("x", "y"):
        tight.add_request(rid, prompt(3, 3), SamplingParams(max_tokens=2))
    tight.update(p := tight.schedule(), FakeModel(2, 4).execute(p))
    plan = tight.schedule()
    assert not plan.preempted and [len(s.block_ids) for s in plan.seqs] == [1, 1]


def test_request_ids_slice_all_ids():
    """``Request.ids(start, end)`` is ``all_ids[start:end]`` for every range (the scheduler's rows per step)."""
    from scheduler.request import Request

    req = Request("r", [5, 6, 7], SamplingParams(), arrival=0)
    req.output_ids = [8, 9]
    for start in range(6):
        for end in range(start, 6):
            assert req.ids(start, end) == req.all_ids[start:end], (start, end)


@pytest.mark.parametrize("drafter", ["A", "B"])
def test_drafts_never_preempt(drafter):
    """Drafts are optional: they ride in what the request's blocks and the free ones hold. They were reserved with the
    real token, so a block short for them preempted the worst-ranked request — the drafting one itself, which started
    over from its first token, or another for its drafts (session 58's scheduler review: 497 of 937 preemptions in
    random plans with drafts). Here each request's real token fits its own block and no block is free."""
    sched = Scheduler(SchedulerConfig(num_blocks=2, block_size=4, max_model_len=16, vocab_size=97, max_num_seqs=2,
                                      max_num_batched_tokens=16))
    for rid, prompt in (("A", [1, 2, 3]), ("B", [4, 5, 6])):
        sched.add_request(rid, prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    sched.update(sched.schedule(), {"A": [7], "B": [8]}, {drafter: [9, 10]})
    plan = sched.schedule(max_drafts=2)
    assert not plan.preempted
    assert [(s.req_id, s.start_pos, len(s.token_ids), s.num_drafts) for s in plan.seqs] == [("A", 3, 1, 0),
                                                                                           ("B", 3, 1, 0)]
    sched.abort("A")                       # a block free: the drafts that fit it ride
    plan = sched.schedule(max_drafts=2)
    assert [(s.req_id, s.num_drafts) for s in plan.seqs] == [("B", 2 if drafter == "B" else 0)]
