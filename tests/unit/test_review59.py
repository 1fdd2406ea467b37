"""Session 59's reviews (``bench/results/session59/review_disagg/``, ``review_operator/``). Disaggregated prefill, a
decode replica's side: a replica with no room refuses before a prefill replica computes the prompt; an abort reaches
a request whose prompt is computed elsewhere; a busy replica asks for the rest of a cached conversation only; the
depot drops what is not taken, and a dead one is replaced; a ``prefill:`` section left empty is the defaults. An
operator's deploy: a value only the checkpoint can check is refused when the app is built."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest

from cluster.disagg import KVBundle, KVDepot, PrefillResult
from scheduler.request import FinishReason, SamplingParams
from scheduler.scheduler import AdmissionError
from tests.unit.test_disagg import _bundle_of, _decode_replica


def _engine(seqs: int = 4, waiting: int = 64, blocks: int = 64):
    from cluster.engine import Engine
    from scheduler import SchedulerConfig
    from tests.conftest import RecordingExecutor

    cfg = SchedulerConfig(num_blocks=blocks, block_size=4, max_model_len=200, vocab_size=1000, eos_token_ids=(),
                          max_num_seqs=seqs, max_num_batched_tokens=64, prefix_caching=True, max_waiting=waiting)
    return Engine(RecordingExecutor(), cfg, kv_layout=((4, "uint8"),))


def _slow_prefill(calls: list, gate: asyncio.Event | None = None):
    """A prefill tier's ``prefill.remote``: its answer waits for ``gate`` (set by the test), each call recorded."""
    def remote(ids, params, req_id, start):
        calls.append((req_id, start))

        class Stream:
            items = [None]

            async def __anext__(self):
                if self.items:
                    return self.items.pop()
                if gate is not None:
                    await gate.wait()
                n = (len(ids) - 1) // 4 * 4
                return PrefillResult(bundle=KVBundle(tuple(ids[:n + 1]), ((4, "uint8"),), False,
                                                     (np.zeros((n - start, 4), np.uint8),), start))

            def cancel(self):
                calls.append((req_id, "cancelled"))
        return Stream()
    return remote


def _replica(e, remote):
    from cluster.async_engine import AsyncEngine

    dec = _decode_replica(e, remote)
    dec.aengine, dec.cfg, dec._stats_log, dec.replica_id = AsyncEngine(e), types.SimpleNamespace(
        log_stats_interval_s=0), None, "r"
    return dec


def test_a_full_decode_replica_refuses_before_a_prefill_replica_computes_the_prompt():
    """The decode replica's 429 came only after the prefill tier had computed the prompt (a burst spent its prefill
    on requests that could never run); now it comes at once, and requests whose prompts are computed elsewhere count
    as admitted (``Engine.check_room``'s ``promised``)."""
    calls = []
    e = _engine(seqs=1, waiting=1)
    dec = _decode_replica(e, _slow_prefill(calls))
    e.add_request([1, 2, 3], SamplingParams(max_tokens=40, ignore_eos=True), "running")
    e.step()
    dec._promised = 1                       # one more on its way here: the queue's one place is promised
    with pytest.raises(AdmissionError) as err:
        asyncio.run(dec._prefilled(list(range(1, 42)), SamplingParams(), "x"))
    assert err.value.reason == "queue_full" and calls == [] and dec._asking == {}
    dec._promised = 0
    bundle, held = asyncio.run(dec._prefilled(list(range(1, 42)), SamplingParams(), "y"))
    held.release()
    assert bundle is not None and calls == [("y", 0)] and dec._promised == 0


def test_an_abort_reaches_a_request_whose_prompt_is_computed_elsewhere():
    """``Coordinator.abort`` (the drain's ``close_streams``) found no request in the engine while a prefill replica
    computed its prompt, and the request then decoded in full; now its stream ends as aborted, its prefill is
    cancelled, and nothing is left behind."""
    from cluster.coordinator import Coordinator

    calls = []
    e = _engine()

    async def main():
        gate = asyncio.Event()
        dec = _replica(e, _slow_prefill(calls, gate))
        try:
            events = []

            async def consume():
                async for ev in Coordinator.generate(dec, list(range(1, 42)), SamplingParams(max_tokens=30), "a"):
                    events.append(ev)
            task = asyncio.ensure_future(consume())
            while not calls:
                await asyncio.sleep(0.01)
            await Coordinator.abort(dec, "a")
            await asyncio.wait_for(task, 5)
            return events, dec
        finally:
            dec.aengine.shutdown()
    events, dec = asyncio.run(main())
    assert [(ev.finished, ev.finish_reason, ev.token_ids) for ev in events] == [(True, FinishReason.ABORT, [])]
    assert ("a", "cancelled") in calls and dec._early == {} and dec._asking == {} and dec._promised == 0
    assert not e.has_unfinished() and e.num_free_blocks() == 64


def test_a_busy_decode_replica_asks_for_the_rest_of_a_cached_conversation_only():
    """Every seat taken, the replica held no prefix (only ranks with a free seat were looked at) and asked for the
    whole prompt, though the request then waited on its one rank where the conversation's blocks were cached."""
    calls = []
    e = _engine(seqs=1)
    turn1 = list(range(1, 42))
    e.add_request(turn1, SamplingParams(max_tokens=1), "t1")
    while e.has_work():
        e.step()
    e.add_request([900, 901], SamplingParams(max_tokens=50, ignore_eos=True), "busy")
    e.step()
    dec = _decode_replica(e, _slow_prefill(calls))
    bundle, held = asyncio.run(dec._prefilled(turn1 + list(range(200, 230)), SamplingParams(), "t2"))
    assert calls == [("t2", 40)] and held.start == 40 and bundle.start == 40
    e.add_request(turn1 + list(range(200, 230)), SamplingParams(max_tokens=1), "t2", kv=bundle)
    held.admitted()
    held.release()
    events = []
    while e.has_unfinished():
        events += [ev for ev in e.step() if ev.req_id == "t2"]
    assert events[-1].finished and events[-1].num_cached_tokens >= 40, events[-1]
    assert e.num_free_blocks() == 64


def test_the_depot_drops_bundles_past_their_time_with_no_traffic():
    """Expiry ran only in ``put``: with no new bundle, ones never taken stayed past ``ttl_s``."""
    import time

    depot = KVDepot(ttl_s=0.05)
    depot.put("a", _bundle_of(list(range(9))))
    depot.put("b", _bundle_of(list(range(9))))
    assert depot.take("b") is not None and list(depot.items) == ["a"]
    time.sleep(0.2)
    assert depot.items == {}
    with pytest.raises(KeyError):
        depot.take("a")


def test_an_empty_prefill_section_is_the_defaults(monkeypatch):
    """A ``prefill:`` whose fields are all commented out is YAML null: it built an app without prefill replicas."""
    serve = pytest.importorskip("ray.serve")
    import cluster.serve as cs
    from cluster.config import DEFAULT_MODEL

    built = []
    monkeypatch.setattr(cs, "_coordinator", lambda name, *a, **kw: built.append(name) or types.SimpleNamespace(
        bind=lambda *x, **y: name))
    monkeypatch.setattr(serve, "deployment", lambda *a, **kw: types.SimpleNamespace(bind=lambda *x: x))
    for prefill, names in ((None, ["PrefillCoordinator", "Coordinator"]), ({}, ["PrefillCoordinator", "Coordinator"]),
                           (False, ["Coordinator"])):
        built.clear()
        cs.build_app({"model": DEFAULT_MODEL, "device": "cpu", "prefill": prefill})
        assert built == names, (prefill, built)
    built.clear()
    cs.build_app({"model": DEFAULT_MODEL, "device": "cpu"})
    assert built == ["Coordinator"]


def test_a_prefill_replica_whose_depot_died_makes_a_new_one(monkeypatch):
    """The depot (a Ray actor: a crash, a node's memory monitor) was made once: after its death every prompt was
    computed on the prefill replica, failed at staging, and was computed again on the decode replica, for the
    replica's life (it stayed healthy). Now a failed staging makes a new depot and stages there."""
    import cluster.coordinator as cc
    from cluster.coordinator import Coordinator

    depots, staged = iter(["new"]), []

    async def stage(depot, bundle, key):
        if depot == "dead":
            raise RuntimeError("the actor died")
        staged.append(depot)
        return depot, key

    monkeypatch.setattr(cc, "stage_bundle", stage)
    monkeypatch.setattr(cc, "new_depot", lambda: next(depots))

    async def generate(*args, **kwargs):
        yield types.SimpleNamespace(error=None, kv=_bundle_of(list(range(9))))

    rep = types.SimpleNamespace(_depot="dead", aengine=types.SimpleNamespace(generate=generate))

    async def run():
        return [r async for r in Coordinator.prefill(rep, list(range(9)), SamplingParams(), "a")]
    out = asyncio.run(run())
    assert out[0][0] == "dead" and out[1].bundle == ("new", out[0][1]) and rep._depot == "new" and staged == ["new"]


def test_a_deploy_with_a_value_only_the_checkpoint_checks_is_refused_at_build(tmp_path):
    """``build_app`` checked only EngineConfig's own rules: a redeploy with ``max_model_len`` past the model's positions
    (or a missing chat template file) stopped the running replicas, then failed to start new ones — an outage. Where
    the model folder is readable, the build refuses it, naming the field (session 59's operator review)."""
    pytest.importorskip("ray.serve")
    import cluster.serve as cs
    from cluster.config import DEFAULT_MODEL

    with pytest.raises(ValueError, match="max_model_len"):
        cs.build_app({"model": DEFAULT_MODEL, "device": "cpu", "max_model_len": 1 << 20})
    with pytest.raises(ValueError, match="chat_template"):
        cs.build_app({"model": DEFAULT_MODEL, "device": "cpu", "chat_template": str(tmp_path / "none.jinja")})
    cs.build_app({"model": str(tmp_path / "elsewhere"), "device": "cpu"})   # not here (a head without the volume)
