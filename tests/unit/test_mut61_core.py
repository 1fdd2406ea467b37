"""Session 61's mutation review of the engine core (``bench/results/session61/review_mut_core/``): each test here kills
a mutant the rest of the unit tier let live — a one-line change to the scheduler, the shapes, the sampler or the
verifier that no other unit test noticed. The mutant each one kills is named in its docstring."""

from __future__ import annotations

import torch

from scheduler import SamplingParams, Scheduler, SchedulerConfig
from scheduler.scheduler import ScheduledSeq, StepPlan
from scheduler.shapes import graph_key, graph_rows, plan_step_shapes
from tests.unit.test_prefix_cache import NextTokenModel, _make
from tests.unit.test_scheduler import FakeModel, expected_output, make, prompt
from workers.sampler import probs_for_rows, sample
from workers.speculative import pick_draft, verify

# ---- scheduler ----------------------------------------------------------------------------------------------------


def test_stalled_counts_the_block_the_next_token_opens():
    """S09: the head of the queue is stalled when the free blocks hold its prompt but not the token sampled after it
    (a prompt that ends a block opens the next one at its first decode)."""
    for num_blocks, stalled in ((4, True), (5, False)):
        sched = make(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=16)
        sched.add_request("a", prompt(8, 1), SamplingParams(max_tokens=2))
        sched.update(plan := sched.schedule(), FakeModel(num_blocks, 4).execute(plan))
        sched.add_request("b", prompt(8, 2), SamplingParams(max_tokens=2))     # 2 blocks, 3 with its first token
        assert sched.pool.num_free == num_blocks - 2
        assert (sched.stalled() is sched.get("b")) is stalled, num_blocks


def test_a_prefill_short_of_blocks_preempts_nobody_where_the_lower_requests_hold_too_few():
    """S15: a running prefill's own blocks are not room below it. Priority policy: T (0) decodes, H (1) prefills in
    chunks, L (5) holds one block; H's next chunk needs 2 blocks and none is free — L's one would not do, so nobody
    gives way (the mutant counted H's own blocks and preempted L for nothing)."""
    sched = make(num_blocks=11, block_size=4, max_num_batched_tokens=8, max_num_seqs=4, policy="priority")
    model = FakeModel(11, 4)
    sched.add_request("T", prompt(20, 1), SamplingParams(max_tokens=8, priority=0))
    sched.add_request("L", prompt(3, 2), SamplingParams(max_tokens=20, priority=5))
    for step in range(5):
        if step == 3:
            sched.add_request("H", prompt(24, 3), SamplingParams(max_tokens=2, priority=1))
        sched.update(plan := sched.schedule(), model.execute(plan))
    held = {r.req_id: len(r.block_ids) for r in sched._running}
    assert held == {"T": 6, "H": 4, "L": 1} and sched.pool.num_free == 0
    plan = sched.schedule()
    assert plan.preempted == () and [s.req_id for s in plan.seqs] == ["T"]
    assert sched.get("L").status.value == "decoding"
    sched.update(plan, model.execute(plan))
    outputs = {}
    while sched.has_unfinished():
        for ev in sched.update(plan := sched.schedule(), model.execute(plan)):
            outputs.setdefault(ev.req_id, []).extend(ev.new_token_ids)
    assert outputs["H"] == expected_output(prompt(24, 3), 2)
    assert sched.pool.num_free == 11


def test_drafts_that_do_not_all_fit_ride_as_far_as_the_free_blocks_go():
    """S19: drafts are trimmed from the back to what the free blocks hold, not all dropped. B ranks first and takes a
    block for its token; A's last token fits its own blocks, its 3 drafts need 2 more blocks, 1 is left: 2 ride."""
    sched = Scheduler(SchedulerConfig(num_blocks=5, block_size=2, max_model_len=16, vocab_size=97, max_num_seqs=2,
                                      max_num_batched_tokens=16))
    sched.add_request("B", [4, 5], SamplingParams(max_tokens=4, ignore_eos=True))
    sched.add_request("A", [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
    sched.update(sched.schedule(), {"A": [7], "B": [8]}, {"A": [9, 10, 11]})
    assert sched.pool.num_free == 2
    plan = sched.schedule(max_drafts=3)
    assert not plan.preempted and sched.pool.num_free == 0
    assert [(s.req_id, s.start_pos, s.token_ids, s.num_drafts) for s in plan.seqs] == [
        ("B", 2, (8,), 0), ("A", 3, (7, 9, 10), 2)]
    (b, a) = sched.update(plan, {"B": [6], "A": [9, 10, 12]})      # both drafts accepted, then a token of its own
    assert a.new_token_ids == (9, 10, 12) and sched.get("A").num_computed_tokens == 6


def test_a_running_request_caches_its_blocks_again_after_the_cache_is_cleared():
    """S34: ``clear_prefix_cache`` (a failed step) forgets every cached prefix; a request still running registers its
    blocks again from the first (its chain of cached nodes restarts), so the same prompt later finds them. The mutant
    kept its stale chain: its later blocks hung under nodes that no longer exist, and nothing matched."""
    sched = _make(num_blocks=32, block_size=4)
    model = NextTokenModel(sched)
    ids = prompt(13, 7)
    sched.add_request("a", ids, SamplingParams(max_tokens=8))
    for _ in range(2):
        sched.update(plan := sched.schedule(), model.execute(plan))
    assert len(sched.get("a").cached_nodes) == 3
    sched.clear_prefix_cache()
    assert sched.pool.num_cached == 0
    while sched.has_unfinished():
        sched.update(plan := sched.schedule(), model.execute(plan))
    assert len(sched.pool.match(ids)) == 3
    sched.add_request("b", ids, SamplingParams(max_tokens=2))
    plan = sched.schedule()
    assert [(s.req_id, s.start_pos) for s in plan.seqs] == [("b", 12)] and sched.get("b").num_cached_tokens == 12


# ---- shapes -------------------------------------------------------------------------------------------------------


def test_graph_rows_is_the_largest_bucket_whose_moe_fills_graph_moe_rows_exactly():
    """H03: ranks × bucket may equal GRAPH_MOE_ROWS (256): 8 ranks take 32 rows each, 4 take 64."""
    assert [graph_rows(n) for n in (1, 2, 4, 8, 16)] == [64, 64, 64, 32, 16]


def test_a_prompt_chunk_of_exactly_chunk_rows_is_graph_shaped():
    """H06: prompt chunks ride a graph in a dp step of at most ``chunk_rows`` rows a rank — the bound included."""
    seq = ScheduledSeq("r", tuple(range(8)), 0, (0, 1), sample=False, num_generated=0)
    plan = StepPlan(0, (seq,), ())
    shape = plan_step_shapes(1, {0: 8}, 1)
    assert shape.rows_per_rank == 8
    assert graph_key(shape, [plan], chunk_rows=8) == (8, 2, False)
    assert graph_key(shape, [plan], chunk_rows=4) is None


# ---- sampler ------------------------------------------------------------------------------------------------------


def test_top_p_keeps_the_smallest_set_that_reaches_it():
    """P01: eight tied tokens (exact weights), top_p 0.5: the first four (by id) reach it, the fifth's mass above
    (0.5) is not below top_p and goes."""
    probs = probs_for_rows(torch.zeros(1, 8), [SamplingParams(top_p=0.5)])
    assert probs[0].tolist() == [0.25] * 4 + [0.0] * 4
    probs = probs_for_rows(torch.zeros(1, 16), [SamplingParams(top_p=0.25, top_k=16)])
    assert probs[0].tolist() == [0.25] * 4 + [0.0] * 12


def test_min_p_keeps_the_tokens_exactly_at_its_bound():
    """P04: min-p drops tokens *below* min_p × the top probability: ties with the top one stay, also at min_p 1."""
    probs = probs_for_rows(torch.tensor([[0.0, 0.0, 0.0, -1.0]]), [SamplingParams(min_p=1.0)])
    assert (probs[0] > 0).tolist() == [True, True, True, False]
    assert torch.allclose(probs[0, :3], torch.full((3,), 1 / 3))
    drawn = {sample(torch.zeros(1, 4), [SamplingParams(min_p=1.0, seed=3)], None, [i]).token_ids[0]
             for i in range(30)}
    assert drawn == {0, 1, 2, 3}


def test_a_seed_and_its_neighbour_draw_unrelated_streams():
    """P07: a seeded row's generator seed mixes (seed, index) so that seed s at token i+1 is not seed s+1 at token i
    (a plain sum made every seed its neighbour's stream shifted by one token)."""
    torch.manual_seed(5)
    logits = torch.randn(1, 50)
    one = [sample(logits, [SamplingParams(seed=1)], None, [i + 1]).token_ids[0] for i in range(24)]
    two = [sample(logits, [SamplingParams(seed=2)], None, [i]).token_ids[0] for i in range(24)]
    assert one != two
    assert sum(a == b for a, b in zip(one, two)) < 12


def test_a_seeded_row_after_a_greedy_row_draws_with_its_own_position():
    """P08: the noise of a seeded row is seeded by its own ``num_generated``, not that of the batch row at its place
    among the drawn rows (a greedy row before it shifts the drawn rows by one)."""
    torch.manual_seed(6)
    logits = torch.randn(2, 50)
    seeded = SamplingParams(seed=11)
    for step in range(12):
        alone = sample(logits[1:], [seeded], None, [step]).token_ids[0]
        batch = sample(logits, [SamplingParams(temperature=0.0), seeded], None, [40 + step, step]).token_ids
        assert batch == [int(logits[0].argmax()), alone], step


def test_a_top_k_cut_inside_a_tie_keeps_the_lowest_ids_alone_and_in_any_batch():
    """A top-k cut inside a tie keeps the same ids whatever else the batch holds (the lowest, as the sorted path
    does): a seeded row then draws the same tokens alone and beside a row without top-k. (The review's bug, fixed in
    session 61: torch.topk's own picks among tied values at its end depend on the batch's largest top-k.)"""
    row, p = torch.zeros(1, 8), SamplingParams(top_k=3, seed=1)
    other = SamplingParams(top_p=0.9)                   # its top-k is the vocabulary: the batch selects all 8
    batch = probs_for_rows(torch.cat([row, row]), [p, other])[0]
    assert (batch > 0).tolist() == [True] * 3 + [False] * 5
    assert torch.equal(probs_for_rows(row, [p])[0] > 0, batch > 0)
    alone = [sample(row, [p], None, [i]).token_ids[0] for i in range(8)]
    assert alone == [sample(torch.cat([row, row]), [p, other], None, [i, 0]).token_ids[0] for i in range(8)]


# ---- speculative verification -------------------------------------------------------------------------------------


def test_seeded_drafts_are_drawn_and_verified_at_their_own_positions():
    """V01, V05: a seeded request's draft j is drawn with the noise plain decoding draws token num_generated + j
    with (``pick_draft``), and ``verify`` checks row i against that same draw: drafts from the target's own logits
    are all kept, and the output is plain decoding's, token for token."""
    V, k = 40, 4
    for seed in range(4):
        torch.manual_seed(100 + seed)
        logits = torch.randn(k + 1, V)
        params = SamplingParams(temperature=1.0, seed=seed)
        plain = [sample(logits[i:i + 1], [params], None, [9 + i]).token_ids[0] for i in range(k + 1)]
        drafts = [int(pick_draft(logits[j], params, None, 9, [torch.tensor([0])] * j)[0]) for j in range(k)]
        assert drafts == plain[:k], seed
        assert verify(logits, drafts, None, params, None, 9) == plain, seed


def test_rejection_sampling_accepts_a_draft_the_target_is_sure_of():
    """V02: a draft is accepted with probability min(1, p/q): p(d) ≈ 1 > q(d) = 0.5 accepts it every time (the
    inverted ratio accepted it half the time)."""
    V = 8
    logits = torch.zeros(2, V)
    logits[0, 1] = 50.0                                                  # the target: token 1 at position 0
    q = torch.zeros(1, V)
    q[0, :2] = 0.5
    params = SamplingParams(temperature=1.0)
    torch.manual_seed(0)
    outs = [verify(logits, [1], q, params, None, 0) for _ in range(40)]
    assert all(len(out) == 2 and out[0] == 1 for out in outs)


def test_a_rejected_draft_is_replaced_from_the_residual_distribution():
    """V03, V04: after a rejection the token comes from norm(max(p - q, 0)). p = (½, ½, 0, ...), q = (½, 0, ½, ...),
    draft 2 (p = 0: always rejected): the residual is all on token 1 — never the draft (q - p) nor token 0 (p)."""
    V = 8
    logits = torch.full((2, V), float("-inf"))
    logits[:, :2] = 0.0
    q = torch.zeros(1, V)
    q[0, 0] = q[0, 2] = 0.5
    params = SamplingParams(temperature=1.0)
    torch.manual_seed(0)
    assert [verify(logits, [2], q, params, None, 0) for _ in range(30)] == [[1]] * 30
