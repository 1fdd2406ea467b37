"""Session 62's mutation review of disaggregated prefill (``bench/results/session62/review_mut_disagg/``): behaviour of
``cluster/disagg.py`` (the bundle checks, adoption, imports, held prefixes, the depot, staging) and of the
``Coordinator``'s two sides (``_prefilled`` / ``_asked`` / ``_worth_asking``, ``prefill``, ``generate``) that no test
held — each test fails on one or more of that review's mutants and passes on the code as it is. No Ray: the depot is
a fake actor around a real ``KVDepot`` (``tests/unit/test_review60._Actor``)."""

from __future__ import annotations

import asyncio
import threading
import time
import types

import numpy as np
import pytest

import cluster.disagg as disagg
from cluster.disagg import (
    Imports,
    KVBundle,
    KVDepot,
    KVTransferError,
    PrefillResult,
    check_bundle,
    fetch_bundle,
    hold_prefix,
)
from scheduler import BlockPool, SamplingParams
from scheduler.block_pool import ROOT
from scheduler.scheduler import AdmissionError
from tests.unit.test_disagg import _bundle_of, _decode_replica, _engine
from tests.unit.test_review59 import _slow_prefill
from tests.unit.test_review60 import _Actor

LAYOUT = ((4, "uint8"),)


def _run(coro, timeout_s: float = 10.0):
    """``asyncio.run`` with a bound: a mutant that leaves a wait unanswered fails the test, not hangs it."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def _cached(e, prompt: list[int]) -> None:
    """Run ``prompt`` to its one token: its whole blocks stay cached (idle) in ``e``'s pool."""
    e.add_request(prompt, SamplingParams(max_tokens=1), f"warm{len(prompt)}")
    while e.has_work():
        e.step()


def _answering(bundle_for=None):
    """A prefill tier's ``prefill.remote`` that takes each request at once and answers with ``bundle_for(ids, start)``
    (``_bundle_of`` the prompt where None)."""
    def remote(ids, params, req_id, start):
        class Stream:
            items = [None, PrefillResult(bundle=bundle_for(ids, start) if bundle_for else _bundle_of(ids))]

            async def __anext__(self):
                return self.items.pop(0)

            def cancel(self):
                pass
        return Stream()
    return remote


# ---- check_bundle ----------------------------------------------------------------------------------------------------
def test_a_bundle_starting_where_the_prompts_blocks_end_carries_no_rows_and_is_taken():
    """A bundle may start at its last position (``start == num_tokens``: the decode replica held all of it): no rows,
    and nothing to refuse."""
    ids = list(range(1, 10))
    b = KVBundle(tuple(ids), LAYOUT, False, (np.zeros((0, 4), np.uint8),), start=8)
    check_bundle(b, ids + [5], LAYOUT, False, True, 4)


def test_a_bundle_with_more_row_tensors_than_the_layout_is_refused():
    """Each cache tensor of the layout has its rows: an extra tensor of rows is another layout's bundle."""
    ids = list(range(1, 10))
    rows = np.zeros((8, 4), np.uint8)
    with pytest.raises(KVTransferError, match="rows do not match"):
        check_bundle(KVBundle(tuple(ids), LAYOUT, False, (rows, rows)), ids, LAYOUT, False, True, 4)


# ---- adopt_bundle --------------------------------------------------------------------------------------------------
def test_an_adoption_holds_the_prompts_cached_prefix_only_while_it_runs():
    """The prompt's cached blocks are held while the bundle is adopted, and let go after: they idle as before."""
    whole = KVBundle(tuple(range(100, 117)), LAYOUT, False, (np.zeros((16, 4), np.uint8),))
    part = KVBundle(whole.token_ids, LAYOUT, False, (np.zeros((8, 4), np.uint8),), start=8)
    ids = list(whole.token_ids) + [7]
    pool = BlockPool(8, 4)
    first = pool.allocate(2)
    pool.register(first[1], pool.register(first[0], ROOT, tuple(ids[:5])), tuple(ids[4:9]))
    pool.free(first)
    blocks, _ = disagg.adopt_bundle(pool, ids, None, part)
    assert len(blocks) == 2 and pool.num_free == 8 and all(pool.is_idle(b) for b in first)


# ---- Imports -------------------------------------------------------------------------------------------------------
def _rows(blocks: int) -> tuple[np.ndarray, ...]:
    return (np.zeros((4 * blocks, 4), np.uint8),)          # blocks of 4 tokens × 4 bytes: 16 bytes a block


def test_a_paced_step_budget_never_exceeds_the_budget():
    """However fast the helpers fill, a step beside running requests takes at most ``budget`` bytes."""
    imports = Imports(budget=100)
    imports.rate, imports.windows = 1e12, type(imports.windows)([50.0])
    assert imports.step_budget(True) == 100 and imports.step_budget(False) == 100


def test_a_step_takes_a_block_past_its_budget_only_where_it_takes_nothing_else():
    """A budget of one block: the first import gets its block, the import behind it none this step — and the first
    import's second block waits too (the block at least is for a step that would take none)."""
    imports = Imports(budget=16, paced=False)
    a, b = types.SimpleNamespace(req_id="a"), types.SimpleNamespace(req_id="b")
    imports.add(a, (1, 2), _rows(2))
    imports.add(b, (3, 4), _rows(2))
    take = imports.take(4)
    assert [blocks for blocks, _ in take.writes] == [(1,)] and not take.land
    imports.budget = 8                                       # (less than a block: still one a step)
    take = imports.take(4)
    assert [blocks for blocks, _ in take.writes] == [(2,)]


# ---- HeldPrefix / hold_prefix --------------------------------------------------------------------------------------
def test_a_held_prefix_is_released_once_even_where_another_holds_the_same_host_copies():
    """Two requests pin one prefix's host copies; the first one's release, called twice (its first token, then its
    end), lets go of its own pins only: the second's stay."""
    pool, lock = BlockPool(4, 2, host_blocks=4), threading.Lock()
    b = pool.allocate(2)
    pool.register(b[1], pool.register(b[0], ROOT, (1, 2, 3)), (3, 4, 5))
    pool.drain()
    pool.free(b)
    pool.free(pool.allocate(4))                             # evicted from the device: the host holds them
    with lock:
        first = hold_prefix([pool], [1, 2, 3, 4, 5], None, lock)
        second = hold_prefix([pool], [1, 2, 3, 4, 5], None, lock)
    assert first.start == second.start == 4
    first.release()
    first.release()
    assert sum(pool._pins.values()) == 2
    second.release()
    assert not pool._pins


def test_a_tight_pool_holds_a_prefix_only_as_far_as_its_leading_blocks_have_host_copies():
    """A prefix whose first block lost its host copy (the host tier's one slot went to the second): in a tight pool
    nothing is held — a held prefix is leading blocks, never one after a gap."""
    pool, lock = BlockPool(4, 2, host_blocks=1), threading.Lock()
    b = pool.allocate(2)
    n0 = pool.register(b[0], ROOT, (1, 2, 3))
    n1 = pool.register(b[1], n0, (3, 4, 5))
    assert not pool.has_host_copy(n0) and pool.has_host_copy(n1)
    pool.free(b)
    busy = pool.allocate(2)                                 # the other two blocks run a request: a tight pool
    with lock:
        held = hold_prefix([pool], [1, 2, 3, 4, 5, 6], None, lock)
    assert held.start == 0 and not pool._pins
    held.release()
    pool.free(busy)


# ---- KVDepot, fetch_bundle -------------------------------------------------------------------------------------------
def test_a_bundle_past_its_time_is_not_taken_even_before_a_sweep(monkeypatch):
    """``take`` expires what is past ``ttl_s`` first: an old bundle is a KeyError (the decode replica computes the
    prompt), whether or not the sweeper has run since."""
    now = [1000.0]
    monkeypatch.setattr(disagg, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=time.sleep))
    depot = KVDepot(ttl_s=60)
    depot._sweeper = object()                               # (no sweeper thread: only take may expire it)
    depot.put("k", _bundle_of(list(range(9))))
    now[0] += 61
    with pytest.raises(KeyError):
        depot.take("k")


def test_a_depot_sweeps_with_one_thread():
    """The sweeper starts with the first bundle; later ones reuse it (a thread a put would pile up for ever)."""
    depot = KVDepot(ttl_s=600)
    depot.put("a", _bundle_of(list(range(9))))
    sweeper = depot._sweeper
    depot.put("b", _bundle_of(list(range(9))))
    assert depot._sweeper is sweeper and sweeper.is_alive()


def test_a_take_that_outlasts_its_timeout_fails_and_drops_the_bundle():
    """``fetch_bundle`` waits ``timeout_s`` for the depot's answer, then raises (the decode replica computes the prompt)
    and drops the key — it does not wait for the answer however late."""
    actor = _Actor(take_s=1.5)

    async def run():
        staged = await disagg.stage_bundle(actor, _bundle_of(list(range(9))))
        with pytest.raises(asyncio.TimeoutError):
            await fetch_bundle(staged, 0.05)
    _run(run())
    assert actor.calls == ["put", "take", "drop"]


# ---- Coordinator._prefilled / _asked / _worth_asking: a decode replica's side ---------------------------------------
def _rest(ids, start):
    """The bundle a prefill replica sends for ``ids`` from ``start`` (blocks of 4, one uint8 tensor of width 4)."""
    n = (len(ids) - 1) // 4 * 4
    return KVBundle(tuple(ids[:n + 1]), LAYOUT, False, (np.zeros((n - start, 4), np.uint8),), start)


def test_a_request_refused_for_want_of_room_lets_go_of_its_cached_prefix():
    """A full decode replica refuses (its 429) after holding the prompt's cached prefix: the hold goes with the
    refusal, nothing is asked, and the prefix's blocks idle again."""
    from tests.unit.test_review59 import _engine as full_engine

    e = full_engine(seqs=1, waiting=1)
    head = list(range(1, 41))
    _cached(e, head + [99])
    e.add_request([900, 901, 902], SamplingParams(max_tokens=40, ignore_eos=True), "running")
    e.step()
    free, calls = e.scheduler.pool.num_free, []
    dec = _decode_replica(e, lambda *a: calls.append(a))
    dec._promised = 1                                       # the queue's one place is promised
    with pytest.raises(AdmissionError):
        _run(dec._prefilled(head + list(range(200, 230)), SamplingParams(), "x"))
    assert calls == [] and e.scheduler.pool.num_free == free


def test_a_request_whose_client_leaves_while_its_prompt_is_computed_lets_go_of_its_cached_prefix():
    """Cancelled while it waits for the prefill replica's answer: its held prefix is released at once (the request
    never reaches the engine, which would have let go of it)."""
    e = _engine(blocks=32)
    head = list(range(1, 41))
    _cached(e, head + [99])
    free = e.scheduler.pool.num_free

    def remote(ids, params, req_id, start):
        class Stream:
            items = [None]

            async def __anext__(self):
                if self.items:
                    return self.items.pop()
                await asyncio.sleep(60)

            def cancel(self):
                pass
        return Stream()
    dec = _decode_replica(e, remote)

    async def run():
        task = asyncio.ensure_future(dec._prefilled(head + list(range(200, 230)), SamplingParams(), "x"))
        await asyncio.sleep(0.05)
        assert e.scheduler.pool.num_free == free - 9        # (held meanwhile: 9 blocks, 36 tokens)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    _run(run())
    assert e.scheduler.pool.num_free == free and dec._asking == {} and dec._promised == 0


def test_a_full_prefill_tier_ends_the_ask_so_that_those_waiting_on_it_look_again():
    """The prefill tier's 429 goes to the client; the request's ask ends with it — a request sharing its head, waiting
    for that KV, is not left waiting for an ask that will bring nothing."""
    e = _engine(blocks=32)

    def remote(ids, params, req_id, start):
        class Stream:
            items = [None, PrefillResult(refused=AdmissionError("queue_full", "queue", "full"))]

            async def __anext__(self):
                return self.items.pop(0)

            def cancel(self):
                pass
        return Stream()
    dec = _decode_replica(e, remote)
    with pytest.raises(AdmissionError):
        _run(dec._prefilled(list(range(1, 42)), SamplingParams(), "a"))
    assert dec._asking == {} and dec._promised == 0


def test_a_request_waiting_on_anothers_ask_holds_no_prefix_meanwhile():
    """b shares a's prompt past the prefix cached here: it waits for a's KV rather than ask for it too. Its hold of the
    cached prefix goes while it waits (it holds it again after), so that every hold ends released: at the end no
    block is held."""
    e = _engine(blocks=64)
    head, mid = list(range(1, 41)), list(range(300, 340))
    _cached(e, head + [99])
    total = e.scheduler.pool.num_free
    gate, calls = asyncio.Event(), []
    dec = _decode_replica(e, _slow_prefill(calls, gate))    # (b asks only once a's answer came: the gate is open)

    async def main():
        a = asyncio.create_task(dec._prefilled(head + mid + [1, 2, 3], SamplingParams(), "a"))
        await asyncio.sleep(0.01)
        b = asyncio.create_task(dec._prefilled(head + mid + [7, 8, 9], SamplingParams(), "b"))
        await asyncio.sleep(0.05)
        assert calls == [("a", 36)] and not b.done()
        gate.set()
        _, held_a = await a
        held_a.release()
        dec._asked_end("a")
        _, held_b = await asyncio.wait_for(b, 5)
        held_b.release()
        dec._asked_end("b")
    _run(main())
    assert calls[-1][0] == "b" and e.scheduler.pool.num_free == total


def test_no_prefill_replica_taking_the_request_is_known_within_the_reach_time(monkeypatch):
    """No prefill replica takes the request (its first item never comes): after ``PREFILL_REACH_S`` — not the far
    longer wait for a computed prompt — the replica computes it itself and pauses the tier."""
    from cluster import coordinator as coord_mod

    monkeypatch.setattr(coord_mod, "PREFILL_REACH_S", 0.05)
    monkeypatch.setattr(coord_mod, "PREFILL_WAIT_S", 60.0)

    def remote(ids, params, req_id, start):
        class Stream:
            async def __anext__(self):
                await asyncio.sleep(60)

            def cancel(self):
                pass
        return Stream()
    dec = _decode_replica(_engine(), remote)
    bundle, held = _run(dec._prefilled(list(range(1, 42)), SamplingParams(), "a"), 5.0)
    held.release()
    assert bundle is None and dec.prefill_paused_until > 0

def test_a_prompt_whose_last_token_opens_the_prefill_replicas_block_is_not_worth_asking():
    """32 tokens, the prefill replica's blocks of 32: its one whole block holds the last token, which the decode
    replica computes — no whole block before it is sent, so nothing is asked; 33 tokens: one block."""
    dec = _decode_replica(_engine(), _answering())
    dec.prefill_block = 32
    assert not dec._worth_asking(32, 0) and dec._worth_asking(33, 0)
    dec.prefill_block = 0                                   # (this replica's blocks of 4)
    assert not dec._worth_asking(4, 0) and dec._worth_asking(5, 0)


def test_a_request_waits_only_on_an_ask_of_its_own_salt_and_whole_blocks():
    """Another salt's KV is not this request's (its blocks are keyed apart); and a shared head counts in whole blocks
    of the shorter prompt's KV — the block holding a prompt's last token is never sent, so two prompts that share 4
    tokens and then part share no block."""
    dec = _decode_replica(_engine(), _answering())
    ids = list(range(1, 42))
    dec._ask("a", ids, "s1")
    assert dec._asked(ids, "s2", 0) is None and dec._asked(ids, "s1", 0) is not None
    dec._asked_end("a")
    dec._ask("a", [1, 2, 3, 4, 5, 6, 7, 8], None)
    assert dec._asked([1, 2, 3, 4, 50, 51, 52, 53, 54], None, 0) is None


# ---- Coordinator.prefill: a prefill replica's side -----------------------------------------------------------------
def _prefill_replica(generate, depot=None):
    return types.SimpleNamespace(_depot=depot, aengine=types.SimpleNamespace(generate=generate))


def test_a_prefill_replica_answers_a_full_queue_with_its_refusal():
    """The prefill engine refused the prompt (its queue full): the answer is that refusal — the decode replica's
    429 — not a failure it would compute the prompt after."""
    from cluster.coordinator import Coordinator

    refusal = AdmissionError("queue_full", "queue", "full")

    async def generate(*args, **kwargs):
        raise refusal
        yield

    async def run():
        return [r async for r in Coordinator.prefill(_prefill_replica(generate, _Actor()), list(range(9)),
                                                     SamplingParams(), "a")]
    where, res = _run(run())
    assert res.refused is refusal and res.error is None and res.bundle is None


def test_a_prompt_with_no_whole_block_to_send_stages_nothing():
    """The prefill engine sent no KV (no whole block before the prompt's last token): nothing goes to the depot, and
    the answer says there is no bundle."""
    from cluster.coordinator import Coordinator

    async def generate(*args, **kwargs):
        yield types.SimpleNamespace(error=None, kv=None)

    actor = _Actor()

    async def run():
        return [r async for r in Coordinator.prefill(_prefill_replica(generate, actor), [1, 2, 3], SamplingParams(),
                                                     "a")]
    where, res = _run(run())
    assert res.bundle is None and res.error is None and actor.calls == [] and actor.depot.items == {}


# ---- Coordinator.generate: a decode replica's stream ---------------------------------------------------------------
def _generating(e, stream):
    """A decode replica over ``e`` whose prefill tier answers at once and whose async engine is ``stream`` (an async
    generator function taking ``(ids, params, rid, kv=None, added=None)``)."""
    dec = _decode_replica(e, _answering(_rest))
    dec.aengine = types.SimpleNamespace(generate=stream, abort=lambda rid: dec.aborted.append(rid))
    dec.cfg, dec._stats_log, dec.replica_id, dec.aborted = types.SimpleNamespace(log_stats_interval_s=0), None, "r", []
    return dec


def test_the_first_event_ends_the_ask_before_the_stream_ends():
    """Those waiting on a request's ask look again at its first event (its KV is in the cache), not at its end."""
    from cluster.coordinator import Coordinator
    from cluster.stream import TokenEvent

    e, seen = _engine(), []

    async def stream(ids, params, rid, kv=None, added=None):
        added()
        yield TokenEvent(rid, [5], "x")
        seen.append(dict(dec._asking))
        yield TokenEvent(rid, [6], "y", True, "length")
    dec = _generating(e, stream)

    async def main():
        return [ev async for ev in Coordinator.generate(dec, list(range(1, 42)), SamplingParams(max_tokens=2), "d")]
    assert len(_run(main())) == 2 and seen == [{}]


def test_the_held_prefix_goes_once_the_engine_has_the_request_and_if_it_is_refused():
    """The prefix's device blocks are let go once the engine has the request (``added``), before its first token;
    a request the engine refuses after that lets go of its host copies too (no event came to release them)."""
    from cluster.coordinator import Coordinator
    from tests.unit.test_disagg_holds import engine as shadow_engine
    from tests.unit.test_disagg_holds import fill_host_only

    e = _engine(blocks=32)
    head = list(range(1, 41))
    _cached(e, head + [99])
    total, free_at_added = e.scheduler.pool.num_free, []

    async def stream(ids, params, rid, kv=None, added=None):
        added()
        free_at_added.append(e.scheduler.pool.num_free)
        yield types.SimpleNamespace(token_ids=[5], finished=True, error=None, finish_reason="length")
    dec = _generating(e, stream)

    async def main(d, prompt):
        return [ev async for ev in Coordinator.generate(d, prompt, SamplingParams(max_tokens=1), "d")]
    _run(main(dec, head + list(range(200, 230))))
    assert free_at_added == [total] and e.scheduler.pool.num_free == total

    e2, _ = shadow_engine(blocks=24, host=3 + 23)
    pool = fill_host_only(e2, list(range(1, 13)) + [900])

    async def refused(ids, params, rid, kv=None, added=None):
        added()
        raise AdmissionError("queue_full", "queue", "full")
        yield
    dec2 = _generating(e2, refused)
    events = _run(main(dec2, list(range(1, 13)) + [900] + list(range(100, 140))))
    assert events[-1].refused is not None and not pool._pins and e2.num_free_blocks() == 24


def test_an_abort_while_the_engine_adopts_the_requests_kv_reaches_it_once_added():
    """An abort that comes while the engine takes the request in (its KV adopted, the request not in the engine yet)
    is sent again once the engine has it."""
    from cluster.coordinator import Coordinator

    e = _engine()

    async def stream(ids, params, rid, kv=None, added=None):
        await Coordinator.abort(dec, rid)                   # (the engine has not got it: this abort finds nothing)
        added()
        yield types.SimpleNamespace(token_ids=[], finished=True, error=None, finish_reason="abort")
    dec = _generating(e, stream)

    async def main():
        return [ev async for ev in Coordinator.generate(dec, list(range(1, 42)), SamplingParams(max_tokens=2), "d")]
    _run(main())
    assert dec.aborted == ["d", "d"] and dec._early == {}
