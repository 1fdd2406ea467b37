"""Session 53's review (``bench/results/session53/review.md``): imports settled once their step has returned.

``test_a_finished_import_starts_on_its_rank_before_any_move`` failed at f99eb18 / ab22776 / 1560e24 (finding 1): the
plan after the import's last step rebalanced before it scheduled, and moved the request — its KV written on its rank, a
running slot open for it there — to another rank, where it computed its whole prompt. It passed at 6f4a232 (the plan
that settled the import scheduled it before any rebalance), and passes since ``Request.imported``.

``test_a_failed_step_carrying_an_imports_last_blocks_leaves_its_request_to_run`` passes now: it guards the settle in
``Engine._step``'s failure path, which no other test reaches (without it the request waits for its import forever and
the engine steps without end; at 6f4a232, which settled imports as it planned, y ran in the failing step and failed
with it).
"""

from __future__ import annotations

from scheduler import SamplingParams
from tests.unit.test_disagg import _bundle_of, _engine


def test_a_finished_import_starts_on_its_rank_before_any_move():
    """Two ranks of 2 seats: a0 runs on rank 0, b1 (a long prompt) on rank 1. y brings 10 blocks of KV to rank 0 (the
    less loaded with a seat), c waits there behind it: rank 0 has one seat too few, rank 1 one free — but only the
    first waiter moves, and y (importing) does not. Once y's rows are written it must start on rank 0 (a slot is open
    there) from position 40, not be moved to rank 1 and compute its prompt from 0."""
    e = _engine(num_ranks=2)
    p = SamplingParams(max_tokens=40, ignore_eos=True)
    e.add_request(list(range(1, 6)), p, "a0")
    e.add_request(list(range(10, 160)), SamplingParams(max_tokens=50, ignore_eos=True), "b1")
    for _ in range(3):                              # b1's prompt computed: 38 blocks on rank 1
        e.step()
    assert (e._rank_of["a0"], e._rank_of["b1"]) == (0, 1)
    for imports in e._imports:
        imports.budget = 4 * 4                      # a block a step
    y = list(range(300, 341))
    e.add_request(y, SamplingParams(max_tokens=2), "y", kv=_bundle_of(y))
    e.add_request(list(range(600, 605)), p, "c")
    assert (e._rank_of["y"], e._rank_of["c"]) == (0, 0)
    assert [s.free_seats for s in e.schedulers] == [-1, 1]
    starts = []
    for _ in range(20):
        e.step()
        starts = [(r, s.start_pos) for r, st in enumerate(e.executor.steps[-1]) for s in st.seqs if s.req_id == "y"]
        if starts:
            break
    assert starts == [(0, 40)], starts              # at f99eb18: [(1, 0)] — moved, its 40 imported tokens unused


def test_a_failed_step_carrying_an_imports_last_blocks_leaves_its_request_to_run():
    """The only step that carries y's import raises: its blocks are released (the prefix cache is cleared), y stops
    importing and computes its prompt; the engine then runs dry."""
    e = _engine()
    y = list(range(300, 341))
    e.add_request(y, SamplingParams(max_tokens=2), "y", kv=_bundle_of(y))
    execute = e.executor.execute

    def failing(steps):
        e.executor.execute = execute
        raise RuntimeError("injected")

    e.executor.execute = failing
    events = e.step()
    for _ in range(10):
        if not e.has_work():
            break
        events += e.step()
    assert not e.has_work() and not any(e._imports)
    assert [(ev.req_id, ev.finished) for ev in events if ev.token_ids] == [("y", False), ("y", True)]
    assert e.num_free_blocks() == 64


def test_a_failed_step_drops_the_imports_still_on_their_way():
    """y's import goes a block a step; a step fails after its first: the prefix cache is cleared, so the rest is not
    written — nor the first block landed — y stops waiting for it at once and computes its prompt from the start;
    every block comes back."""
    e = _engine()
    e._imports[0].budget = 4 * 4
    y = list(range(300, 341))
    e.add_request(y, SamplingParams(max_tokens=2), "y", kv=_bundle_of(y))
    e.step()
    execute = e.executor.execute

    def failing(steps):
        e.executor.execute = execute
        raise RuntimeError("injected")

    e.executor.execute = failing
    e.step()
    assert not any(e._imports) and not e.scheduler.get("y").importing
    e.step()
    step = e.executor.steps[-1][0]
    # nor does a worker land what the step before the failed one sent (its blocks were released: session 54)
    assert not step.kv_imports and not step.kv_land and [s.start_pos for s in step.seqs if s.req_id == "y"] == [0]
    while e.has_work():
        e.step()
    assert e.num_free_blocks() == 64
