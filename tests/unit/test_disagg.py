"""Disaggregated prefill's pure parts (``cluster/disagg.py``): a block adopted from another replica's KV (the pool's
keys, idle and evictable, a host copy the step after its write), a bundle taken into a pool of another block size or
too few free blocks, the cache's layout and block rows, and the application's ``prefill`` settings (each error names
its field)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cluster.config import EngineConfig
from cluster.disagg import (
    KVBundle,
    KVTransferError,
    adopt_bundle,
    exported_blocks,
    prefill_params,
    prefill_plan,
)
from models.cache import ImportWriter, KVCache
from models.config import ModelConfig
from scheduler import BlockPool, SamplingParams
from scheduler.block_pool import ROOT, root


def bundle(tokens: int, width: int = 3) -> KVBundle:
    """A bundle of ``tokens`` positions whose rows hold their position (one uint8 tensor)."""
    ids = tuple(range(100, 100 + tokens + 1))
    rows = np.repeat(np.arange(tokens, dtype=np.uint8)[:, None], width, axis=1)
    return KVBundle(ids, ((width, "uint8"),), False, (rows,))


def test_an_adopted_block_is_cached_idle_and_found_by_its_key():
    pool = BlockPool(4, 2, host_blocks=4)
    node, block = pool.adopt(ROOT, (1, 2, 3))
    assert block is not None and pool.is_cached(block) and pool.num_free == 4 and pool.num_used == 0
    assert pool.match([1, 2, 3, 9]) == [node]
    assert pool.adopt(ROOT, (1, 2, 3)) == (node, None)          # cached already: nothing to write
    assert pool.num_host_cached == 0 and pool.drain() == ((), ())  # no host copy, no save
    pool.allocate(4)                                             # evicted as any idle cached block
    assert pool.match([1, 2, 3, 9]) == [] and not pool.is_cached(block)


def test_a_settled_adopted_block_is_copied_to_the_host_by_the_step_after_its_write():
    """A pending adoption settles once the step that wrote it has returned; its save to host memory goes with a later
    step (the drain after the next plan's) — none where that plan evicted it."""
    pool = BlockPool(4, 2, host_blocks=4)
    (a, ba), (_, bb) = pool.adopt(ROOT, (1, 2, 3), pending=True), pool.adopt(ROOT, (4, 5, 6), pending=True)
    pool.settle([ba, bb])                           # the step that wrote them has returned
    fresh = pool.allocate(3)                        # the next plan evicts b's block (the least recently released)
    assert pool.drain() == ((), ()) and pool.match([4, 5, 6]) == []
    assert pool.drain() == (((ba, 0),), ()) and pool.num_host_cached == 1 and pool.drain() == ((), ())
    pool.free(fresh)
    pool.allocate(4)                                # a's device block evicted: its host copy holds it
    assert pool.match([1, 2, 3]) == [a] and pool.block(a) is None


def test_a_bundle_is_adopted_in_the_pools_own_blocks():
    b = bundle(12)                                   # 12 positions: 3 blocks of 4, or 1 of 8 (the 2nd would need 16)
    ids = list(b.token_ids) + [7, 7]
    pool = BlockPool(8, 4)
    blocks, rows = adopt_bundle(pool, ids, None, b)
    assert len(blocks) == 3 and rows[0][:, 0].tolist() == list(range(12))
    assert len(pool.match(ids)) == 3
    assert adopt_bundle(pool, ids, None, b) is None                      # all cached: nothing to write
    wide = BlockPool(8, 8)
    blocks, rows = adopt_bundle(wide, ids, "salt", b)
    assert len(blocks) == 1 and rows[0][:, 0].tolist() == list(range(8))
    assert wide.match(ids) == [] and len(wide.match(ids, root("salt"))) == 1


def test_a_bundle_takes_at_most_the_pools_free_blocks():
    pool = BlockPool(4, 4)
    held = pool.allocate(2)
    blocks, rows = adopt_bundle(pool, list(bundle(16).token_ids), None, bundle(16))
    assert len(blocks) == 2 and rows[0].shape == (8, 3) and not set(blocks) & set(held)


def test_a_bundle_continuing_a_cached_prefix_is_adopted_after_it_or_not_at_all():
    """A bundle from position 8 (the decode replica held 8 tokens cached when it asked): its blocks hang off the cached
    prefix; once that prefix is gone (evicted meanwhile), nothing is adopted — the request computes its prompt."""
    from cluster.disagg import check_bundle

    whole = bundle(16)
    part = KVBundle(whole.token_ids, whole.layout, False, (whole.rows[0][8:],), start=8)
    ids = list(whole.token_ids) + [7]
    pool = BlockPool(8, 4)
    assert adopt_bundle(pool, ids, None, part) is None and pool.num_cached == 0      # no prefix cached: none
    first = pool.allocate(2)
    pool.register(first[1], pool.register(first[0], ROOT, tuple(ids[:5])), tuple(ids[4:9]))
    blocks, rows = adopt_bundle(pool, ids, None, part)
    assert len(blocks) == 2 and rows[0][:, 0].tolist() == list(range(8, 16)) and len(pool.match(ids)) == 4
    for bs, start, words in [(4, 6, "starts at position 6"), (4, 20, "position 20"), (16, 8, "blocks \\(of 16")]:
        with pytest.raises(KVTransferError, match=words):
            check_bundle(KVBundle(whole.token_ids, whole.layout, False, (whole.rows[0][start:],), start=start), ids,
                         whole.layout, False, True, bs)
    with pytest.raises(KVTransferError, match="rows do not match"):
        check_bundle(KVBundle(whole.token_ids, whole.layout, False, whole.rows, start=8), ids, whole.layout, False,
                     True, 4)


def test_exported_blocks_stop_before_the_prompts_last_token():
    assert [exported_blocks(n, 16) for n in (1, 16, 17, 32, 33)] == [0, 0, 1, 1, 2]


def test_prefill_params_keep_only_what_the_kv_depends_on():
    p = prefill_params(SamplingParams(max_tokens=100, temperature=0.7, stop=("x",), logprobs=3, priority=0,
                                      cache_salt="s", json_schema="{}"))
    assert (p.max_tokens, p.is_greedy, p.ignore_eos, p.cache_salt, p.json_schema, p.stop) == (1, True, True, "s",
                                                                                           None, ())


def test_the_cache_layout_is_its_tensors(tiny_config):
    config = ModelConfig.from_dict(tiny_config) if isinstance(tiny_config, dict) else tiny_config
    for fp8 in (False, True):
        cache = KVCache(config, 64, torch.bfloat16, fp8=fp8)
        want = tuple((t.shape[1], str(t.dtype).removeprefix("torch.")) for t in cache.tensors())
        assert KVCache.layout(config, torch.bfloat16, fp8) == want
        for t in cache.tensors():
            t.copy_(torch.randint(0, 100, t.shape).to(t.dtype))
        other = KVCache(config, 64, torch.bfloat16, fp8=fp8)
        other.write_blocks([3, 1], 8, cache.read_blocks([0, 2], 8))
        assert all(torch.equal(a[24:32], b[0:8]) and torch.equal(a[8:16], b[16:24])
                   for a, b in zip(other.tensors(), cache.tensors()))
        assert all(r.dtype == np.uint8 for r in cache.read_blocks([0], 8))


@pytest.mark.parametrize("staged", [False, True])
def test_imported_rows_land_in_their_blocks(tiny_config, staged):
    """``ImportWriter``: a step's writes (two imports, blocks in any order; read-only rows, as Ray hands them over) go
    into exactly their blocks, bf16 and FP8 rows — ``staged`` takes the GPU's way (one buffer of slot ids then rows,
    filled on a thread, landing after the next step: ``write(..., land=True)``) on the CPU; nothing is written until
    ``write``, a dropped handle writes nothing, nor rows sent that the next step does not land."""
    config = ModelConfig.from_dict(tiny_config) if isinstance(tiny_config, dict) else tiny_config
    for fp8 in (False, True):
        src = KVCache(config, 64, torch.bfloat16, fp8=fp8)
        for t in src.tensors():
            t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, dtype=torch.uint8))
        rows = [src.read_blocks(b, 8) for b in ([0, 2], [5])]
        for r in (r for rs in rows for r in rs):
            r.flags.writeable = False
        dst = KVCache(config, 64, torch.bfloat16, fp8=fp8)
        writer = ImportWriter(dst, 8, staged=staged)
        assert (writer._pool is not None) == staged
        writer.stage([([7, 1], rows[0])])                       # dropped: never written
        if staged:                                              # sent, then not landed: never written
            writer.write(writer.stage([([7, 0], rows[0])]), land=False)
        handle = writer.stage([([3, 1], rows[0]), ([6], rows[1])])
        assert all(not t.any() for t in dst.tensors())
        writer.write(handle, land=False)
        if staged:
            assert all(not t.any() for t in dst.tensors())
            writer.write(None, land=True)                       # (the next step's: it sent nothing)
        for d, s in ((d.view(torch.uint8), s.view(torch.uint8)) for d, s in zip(dst.tensors(), src.tensors())):
            assert torch.equal(d[24:32], s[0:8]) and torch.equal(d[8:16], s[16:24]) and torch.equal(d[48:56], s[40:48])
            assert not d[56:64].any() and not d[:8].any()
    assert writer.stage([]) is None


def test_prefill_settings_name_the_field_in_error():
    decode = EngineConfig(model="m", speculative_tokens=3).to_dict()
    plan = prefill_plan(decode, {"num_replicas": 2, "max_num_batched_tokens": 8192, "min_prompt_tokens": 512})
    assert plan.deployment == {"num_replicas": 2} and plan.min_prompt_tokens == 512
    assert plan.engine["max_num_batched_tokens"] == 8192 and plan.engine["speculative_tokens"] == 3
    assert prefill_plan(decode, True).engine == decode
    for spec, words in [({"dtype": "float32"}, "prefill.dtype"), ({"kv_cache_dtype": "fp8"}, "prefill.kv_cache_dtype"),
                        ({"model": "other"}, "prefill.model"),
                        ({"speculative_tokens": 0}, "prefill.speculative_tokens"),
                        ({"bogus": 1}, "bogus"), ({"min_prompt_tokens": -1}, "prefill.min_prompt_tokens"),
                        ("yes", "prefill must be a mapping")]:
        with pytest.raises(ValueError, match=words):
            prefill_plan(decode, spec)
    with pytest.raises(ValueError, match="prefix_caching"):
        prefill_plan(EngineConfig(model="m", prefix_caching=False).to_dict(), {})
    # the dtype as each side resolves it: auto is float32 on a CPU, bfloat16 on a GPU
    gpu = EngineConfig(model="m", device="cuda").to_dict()
    assert prefill_plan(gpu, {"dtype": "bfloat16"}).engine["dtype"] == "bfloat16"
    for spec, words in [({"device": "cpu"}, "prefill.dtype"), ({"load_format": "dummy"}, "prefill.load_format"),
                        ({"num_replicas": 0}, "prefill.num_replicas")]:
        with pytest.raises(ValueError, match=words):
            prefill_plan(gpu, spec)
    with pytest.raises(ValueError, match="prefill.dtype"):      # unknown devices: the same setting, or refused
        prefill_plan(EngineConfig(model="m").to_dict(), {"dtype": "float32"})


def test_a_decode_replica_asks_for_the_rest_of_its_cached_prefix_and_falls_back_to_computing_it(monkeypatch):
    """``Coordinator._prefilled``: which prompts go to a prefill replica, from which position (past what this replica
    holds cached, held meanwhile), and what its answers become — a bundle is taken; a full prefill tier is the client's
    429; any other refusal, a failure, a bundle that does not fit, or no replica taking the request within
    PREFILL_REACH_S leaves the prompt to this replica (and after a missing replica, the next requests for
    PREFILL_PAUSE_S do not try)."""
    import asyncio
    import types

    from cluster import coordinator as coord_mod
    from cluster.disagg import PrefillResult
    from scheduler.scheduler import AdmissionError

    monkeypatch.setattr(coord_mod, "PREFILL_REACH_S", 0.05)
    calls: list = []
    answers: dict[str, object] = {}

    def remote(ids, params, req_id, start):
        calls.append((req_id, start))

        class Stream:                     # a streaming handle call: ``None`` once a replica took it, then the answer
            items = [None, answers[req_id]]

            async def __anext__(self):
                if answers[req_id] == "hang":
                    await asyncio.sleep(60)
                return self.items.pop(0)

            def cancel(self):
                calls.append(f"cancel {req_id}")
        return Stream()

    class Counter:
        def __init__(self):
            self.counts = {}

        def labels(self, reason):
            return types.SimpleNamespace(inc=lambda: self.counts.__setitem__(reason, self.counts.get(reason, 0) + 1))

        def inc(self):
            self.counts[None] = self.counts.get(None, 0) + 1

    e = _engine(blocks=16)
    metrics = types.SimpleNamespace(local_prompts=Counter(), kv_lost=Counter())
    dec = _decode_replica(e, remote, metrics)
    params, long = SamplingParams(), list(range(1, 42))

    def ask(req_id, answer, ids=long, p=params, min_tokens=0):
        answers[req_id], dec.min_prefill_tokens = answer, min_tokens
        bundle, held = asyncio.run(dec._prefilled(ids, p, req_id))
        if held is not None:
            held.release()
        dec._asked_end(req_id)                  # (as its request's first token does)
        return bundle

    ok = _bundle_of(long)
    assert ask("a", PrefillResult(bundle=ok)) is ok
    assert ask("b", PrefillResult()) is None and ask("c", PrefillResult(error="step failed")) is None
    assert ask("d", PrefillResult(refused=AdmissionError("too_long", "prompt", "long"))) is None
    with pytest.raises(AdmissionError):
        ask("e", PrefillResult(refused=AdmissionError("queue_full", "queue", "full")))
    other = KVBundle(ok.token_ids, ((8, "uint8"),), False, (np.zeros((40, 8), np.uint8),))
    assert ask("x", PrefillResult(bundle=other)) is None and metrics.kv_lost.counts == {None: 1}   # another layout
    assert ask("f", ok, ids=long[:4]) is None and ask("g", ok, p=SamplingParams(prompt_logprobs=0)) is None
    assert ask("f2", ok, min_tokens=42) is None     # (a refusal or failure there: counted and logged, session 59)
    assert metrics.local_prompts.counts == {"short": 2, "failed": 1, "refused": 1}
    assert [c[0] for c in calls] == ["a", "b", "c", "d", "e", "x"] and {c[1] for c in calls} == {0}
    # 24 of its tokens cached here (the rest of the blocks evicted): the prefill replica is asked for the rest only,
    # and the cached blocks are held until the request has them
    e.add_request(long[:25] + [500] * 16, SamplingParams(max_tokens=1), "c1")
    while e.has_work():
        e.step()
    free = e.scheduler.pool.num_free
    answers["h"], dec.min_prefill_tokens = PrefillResult(bundle=ok), 0
    bundle, held = asyncio.run(dec._prefilled(long, params, "h"))
    assert calls[-1] == ("h", 24) and bundle is ok and e.scheduler.pool.num_free == free - 6
    held.release()
    held.release()                                              # (once only)
    dec._asked_end("h")
    assert e.scheduler.pool.num_free == free
    assert ask("i", ok, min_tokens=20) is None and metrics.local_prompts.counts["cached"] == 1    # 17 to compute
    dec.prefill_block = 64                  # the prefill replica's blocks: none whole in 41 tokens, nothing to ask
    assert ask("i2", ok) is None and metrics.local_prompts.counts["short"] == 3 and calls[-1][0] == "h"
    dec.prefill_block = 32                  # one of 32: 8 tokens past the 24 cached here
    assert ask("i3", PrefillResult(bundle=ok)) is ok and calls[-1] == ("i3", 24)
    dec.prefill_block = 0
    assert ask("j", "hang") is None and dec.prefill_paused_until > 0
    assert ask("k", ok) is None and calls[-2:] == [("j", 24), "cancel j"]  # cancelled; then paused: not asked
    dec.prefill_paused_until = 0.0
    assert ask("l", PrefillResult(bundle=ok)) is ok and e.scheduler.pool.num_free == free


def _decode_replica(engine, remote, metrics=None):
    """What ``Coordinator._prefilled`` reads of its replica: its prefill tier's handle (``remote``: the call of a
    ``prefill`` stream) and metrics (silent ones where not given)."""
    import types

    from cluster.coordinator import Coordinator

    handle = types.SimpleNamespace(options=lambda **kw: types.SimpleNamespace(prefill=types.SimpleNamespace(
        remote=remote)))
    if metrics is None:
        counter = types.SimpleNamespace(labels=lambda r: types.SimpleNamespace(inc=lambda: None), inc=lambda: None)
        metrics = types.SimpleNamespace(local_prompts=counter, kv_lost=counter, observe=lambda *a: None,
                                        requests=counter, refused=counter)
    dec = types.SimpleNamespace(prefill_tier=handle, min_prefill_tokens=0, prefill_paused_until=0.0, engine=engine,
                                sched_config=engine.config, metrics=metrics, _asking={}, prefill_block=0, _promised=0,
                                _early={})
    for f in (Coordinator._asked, Coordinator._ask, Coordinator._asked_end, Coordinator._worth_asking,
              Coordinator._prefilled):
        setattr(dec, f.__name__, types.MethodType(f, dec))
    return dec


def test_requests_waiting_on_an_ask_that_found_no_prefill_replica_do_not_ask_again(monkeypatch):
    """The prefill tier is down: the request asking for a shared head waits PREFILL_REACH_S and pauses the tier; those
    that waited on it compute their prompts at once, rather than each asking (and waiting) in turn (a QA pass found)."""
    import asyncio

    from cluster import coordinator as coord_mod

    monkeypatch.setattr(coord_mod, "PREFILL_REACH_S", 0.2)
    calls = []

    def remote(ids, params, req_id, start):
        calls.append(req_id)

        class Stream:
            async def __anext__(self):
                await asyncio.sleep(60)

            def cancel(self):
                pass
        return Stream()

    dec = _decode_replica(_engine(), remote)
    head = list(range(1, 41))

    async def one(rid, tail):
        bundle, held = await dec._prefilled(head + tail, SamplingParams(), rid)
        if held is not None:
            held.release()
        dec._asked_end(rid)                     # (its request's end, as ``generate`` does)
        return bundle

    async def main():
        return await asyncio.wait_for(asyncio.gather(*[one(f"r{i}", [100 + i] * 3) for i in range(3)]), 1.0)
    assert asyncio.run(main()) == [None] * 3 and calls == ["r0"] and dec.prefill_paused_until > 0


def test_turns_holding_their_cached_prefixes_leave_the_pool_room_to_run():
    """Two conversations' next turns arrive together at a pool of 12 blocks holding both first turns (5 blocks each).
    A turn holds its cached prefix while its prompt is computed elsewhere only where a quarter of the pool stays free,
    and until the engine has it (not its first token): both answer. (Holding both prefixes until their first tokens,
    neither could get blocks for its rest — a deadlock a review found.)"""
    import asyncio
    import types

    from cluster.async_engine import AsyncEngine
    from cluster.coordinator import Coordinator
    from cluster.disagg import PrefillResult

    e = _engine(blocks=12)
    a, b = list(range(1, 22)), list(range(100, 121))
    for rid, prompt in (("a", a), ("b", b)):
        e.add_request(prompt, SamplingParams(max_tokens=1), rid)
        while e.has_work():
            e.step()
    starts = []

    def remote(ids, params, req_id, start):
        starts.append(start)
        n = (len(ids) - 1) // 4 * 4

        class Stream:
            items = [None]

            async def __anext__(self):
                if self.items:
                    return self.items.pop()
                await asyncio.sleep(0.05)
                return PrefillResult(bundle=KVBundle(tuple(ids[:n + 1]), ((4, "uint8"),), False,
                                                     (np.zeros((n - start, 4), np.uint8),), start))

            def cancel(self):
                pass
        return Stream()

    dec = _decode_replica(e, remote)
    dec.aengine, dec.cfg, dec._stats_log, dec.replica_id = AsyncEngine(e), types.SimpleNamespace(
        log_stats_interval_s=0), None, "r"

    async def turn(ids, rid):
        return [t async for ev in Coordinator.generate(dec, ids, SamplingParams(max_tokens=2), rid)
                for t in ev.token_ids]

    async def main():
        return await asyncio.wait_for(asyncio.gather(turn(a + list(range(300, 312)), "a2"),
                                                     turn(b + list(range(400, 412)), "b2")), 10)
    try:
        assert asyncio.run(main()) == [[7, 7], [7, 7]] and sorted(starts) == [0, 20]
    finally:
        dec.aengine.shutdown()
    assert e.num_free_blocks() == 12


def test_prompts_sharing_a_head_ask_for_its_kv_once():
    """Three prompts arrive together: two share a 36-token head, the third another prompt. The second waits until the
    first's KV is here (its release: the request took it), then asks only for the rest past it; the third does not
    wait. A short shared head (a chat template's) is not waited for."""
    import asyncio

    from cluster.coordinator import Coordinator
    from cluster.disagg import PrefillResult

    calls, gate = [], None
    e = _engine(blocks=32)

    def remote(ids, params, req_id, start):
        calls.append((req_id, start))

        class Stream:
            items = [None]

            async def __anext__(self):
                if self.items:
                    return self.items.pop()
                if req_id == "a":
                    await gate.wait()
                return PrefillResult(bundle=_bundle_of(ids) if start == 0 else None)

            def cancel(self):
                pass
        return Stream()

    dec = _decode_replica(e, remote)
    head = list(range(1, 37))
    a, b, c = head + list(range(100, 110)), head + list(range(200, 213)), list(range(300, 341))
    short = head[:5] + list(range(400, 440))

    async def main():
        nonlocal gate
        gate = asyncio.Event()
        first = asyncio.create_task(Coordinator._prefilled(dec, a, SamplingParams(), "a"))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(Coordinator._prefilled(dec, b, SamplingParams(), "b"))
        third = asyncio.create_task(Coordinator._prefilled(dec, c, SamplingParams(), "c"))
        fourth = asyncio.create_task(Coordinator._prefilled(dec, short, SamplingParams(), "d"))
        await asyncio.sleep(0.05)
        assert [r for r, _ in calls] == ["a", "c", "d"] and not second.done()
        gate.set()
        bundle, held = await first
        e.add_request(a, SamplingParams(max_tokens=1), "a", kv=bundle)      # as ``generate`` does: releases its
        held.admitted()                                                    # prefix once the engine has it, and
        await asyncio.sleep(0.01)
        assert len(calls) == 3                  # (its import not written yet: the others still wait)
        e.step()                                # sends its rows
        e.step()                                # lands them
        dec._asked_end("a")                     # ends the ask at its first token
        await asyncio.sleep(0.01)
        assert calls[-1] == ("b", 32)         # the rest past the head (its last block's key holds token 37)
        held.release()
        for rid, t in (("b", second), ("c", third), ("d", fourth)):
            (await t)[1].release()
            dec._asked_end(rid)
        assert not dec._asking

    asyncio.run(main())
    while e.has_work():
        e.step()
    assert e.num_free_blocks() == 32


def _engine(num_ranks: int = 1, blocks: int = 64, seqs: int = 4):
    from cluster.engine import Engine
    from scheduler import SchedulerConfig
    from tests.conftest import RecordingExecutor

    cfg = SchedulerConfig(num_blocks=blocks, block_size=4, max_model_len=200, vocab_size=1000, eos_token_ids=(),
                          max_num_seqs=seqs, max_num_batched_tokens=64, prefix_caching=True)
    return Engine(RecordingExecutor(), cfg, num_ranks=num_ranks, kv_layout=((4, "uint8"),))


def _bundle_of(prompt: list[int], bs: int = 4) -> KVBundle:
    n = (len(prompt) - 1) // bs * bs
    return KVBundle(tuple(prompt[:n + 1]), ((4, "uint8"),), False, (np.zeros((n, 4), np.uint8),))


def test_an_adoption_keeps_the_prompts_own_cached_prefix():
    """Into a pool of idle cached blocks, the prompt's first blocks among them (the least recently used): adopting the
    rest must not evict them, or the blocks after them would hang off a prefix no longer cached."""
    e = _engine(blocks=12)
    system = list(range(1, 9))
    for rid, prompt in (("a", system + [50]), ("filler", list(range(100, 141)))):
        e.add_request(prompt, SamplingParams(max_tokens=1), rid)
        while e.has_work():
            e.step()
    y = system + list(range(200, 225))
    queried, hits = e.prefix_cache_tokens()
    e.add_request(y, SamplingParams(max_tokens=1), "y", kv=_bundle_of(y))
    assert e.scheduler.cached_blocks(y) == 1            # (the adopted blocks: matched once written)
    e.step()                                            # the step that sends them runs without y
    assert e.executor.steps[-1][0].kv_imports and not e.executor.steps[-1][0].seqs
    assert e.scheduler.cached_blocks(y) == 1
    e.step()                                            # and the one that lands them
    assert e.executor.steps[-1][0].kv_land and not e.executor.steps[-1][0].seqs
    assert e.scheduler.cached_blocks(y) == 8
    e.step()
    assert [s.start_pos for s in e.executor.steps[-1][0].seqs] == [32]       # only the last token computed
    # the prefix cache's own hit: the system block, 4 tokens — the 28 imported are no hits of it (session 57's metrics
    # review: an imported prompt read as a near-100 % hit rate)
    assert e.stats["kv_imported_tokens"] == 28
    assert e.prefix_cache_tokens() == (queried + len(y) - 28, hits + 4)


def test_a_request_bringing_kv_goes_to_a_rank_with_a_seat():
    """Two ranks, the less loaded one with no free seat: the request (and its imported blocks) go to the other, where it
    runs — a waiting request may be moved to another rank, and its imported KV would not go with it."""
    e = _engine(num_ranks=2)
    p = SamplingParams(max_tokens=50, ignore_eos=True)
    for rid, prompt in (("a0", list(range(1, 6))), ("b1", list(range(10, 90))), ("a1", list(range(100, 105)))):
        e.add_request(prompt, p, rid)
    for _ in range(3):
        e.step()
    y = list(range(300, 341))
    e.add_request(y, p, "y", kv=_bundle_of(y))
    rank = e._rank_of["y"]
    assert e.schedulers[rank].free_seats >= 0 and e._imports[rank]
    e.step()                                            # sends its KV, the next step lands it; it starts in the
    e.step()                                            # step after
    e.step()
    assert e._rank_of["y"] == rank
    assert [s.start_pos for s in e.executor.steps[-1][rank].seqs if s.req_id == "y"] == [40]


def test_a_prefix_on_a_rank_without_a_seat_is_not_continued():
    """Two ranks; the one holding a prompt's cached prefix has no free seat. The decode side asks for the whole prompt
    (nothing held there), and the request runs with it on the other rank — not placed where the prefix is and moved
    off it, computing its prompt from the start (a review found that)."""
    e = _engine(num_ranks=2)
    head = list(range(1, 22))
    e.add_request(head, SamplingParams(max_tokens=1), "p")
    while e.has_work():
        e.step()
    for i in range(2):                  # two long requests sharing the head: on its rank, filling its seats
        e.add_request(head + [500 + i] * 3, SamplingParams(max_tokens=8, ignore_eos=True), f"x{i}")
    e.step()
    (full,) = {e._rank_of["x0"], e._rank_of["x1"]}
    assert e.schedulers[full].free_seats == 0 and e.schedulers[1 - full].cached_blocks(head) == 0
    y = head + list(range(600, 620))
    held = e.hold_prefix(y, None)
    assert held.start == 0
    e.add_request(y, SamplingParams(max_tokens=1), "y", kv=_bundle_of(y))
    held.release()
    for _ in range(3):                  # sends its KV, lands it, starts
        e.step()
    assert [(r, s.start_pos) for r, st in enumerate(e.executor.steps[-1]) for s in st.seqs if s.req_id == "y"] == \
        [(1 - full, 40)] and e.stats["moves"] == 0


def test_an_import_goes_a_few_blocks_a_step_and_its_request_waits_for_the_last():
    """A step sends at most ``Imports.budget`` bytes of imported KV (here 3 blocks): a 10-block import goes over 4
    steps beside a decoding request, its blocks matchable only once the step after the one that sends them (which
    lands them) has returned, and its request starts in the step after the one that lands the last of them (computing
    only its last token); a request
    for the same prompt arriving meanwhile waits behind it, then takes every block cached; an aborted import still
    settles its blocks."""
    e = _engine(blocks=64)
    e._imports[0].budget = 3 * 4 * 4                        # 3 blocks of 4 tokens × 4 bytes
    e.add_request(list(range(500, 505)), SamplingParams(max_tokens=30, ignore_eos=True), "x")
    e.step()
    y = list(range(1, 42))
    e.add_request(y, SamplingParams(max_tokens=2), "y", kv=_bundle_of(y))
    sent = []
    for i in range(6):
        assert len(e.scheduler.pool.match(y)) == min(10, 3 * max(i - 1, 0))
        e.step()
        step = e.executor.steps[-1][0]
        sent.append(sum(len(blocks) for blocks, _ in step.kv_imports))
        assert len(e.scheduler.pool.match(y)) == min(10, 3 * i)         # what the step before sent: landed
        assert step.kv_land == (1 <= i <= 4)
        started = [s.start_pos for s in step.seqs if s.req_id == "y"]
        assert started == ([40] if i == 5 else []), i
        if i == 0:
            e.add_request(y, SamplingParams(max_tokens=2), "z")
    assert sent == [3, 3, 3, 1, 0, 0]
    e.add_request(list(range(60, 101)), SamplingParams(max_tokens=2), "w", kv=_bundle_of(list(range(60, 101))))
    e.abort("w")
    while e.has_work():
        e.step()
    z = [s.start_pos for steps in e.executor.steps for s in steps[0].seqs if s.req_id == "z"]
    assert z[0] == 40 and not e._imports[0] and e.num_free_blocks() == 64


def test_an_adoption_does_not_evict_the_blocks_an_earlier_import_keeps_for_its_waiting_request():
    """x's import is written while x waits for the one seat: x keeps its 10 blocks. y's import, arriving next into a
    pool with 8 blocks besides them, adopts 8 and computes the rest (before keeps it took 10, evicting x's tail: both
    computed 13 tokens again); r's growth, once y's blocks landed, then takes y's newest kept block, not x's."""
    e = _engine(blocks=20, seqs=1)
    e.add_request(list(range(500, 504)), SamplingParams(max_tokens=6, ignore_eos=True), "r")    # grows at step 6
    e.step()
    x, y = list(range(1, 42)), list(range(300, 341))
    e.add_request(x, SamplingParams(max_tokens=1), "x", kv=_bundle_of(x))
    e.step()                                            # sends them
    e.step()                                            # lands them
    pool = e.scheduler.pool
    assert (pool.num_kept, e.stats["kv_imported_tokens"]) == (10, 40)
    e.add_request(y, SamplingParams(max_tokens=1), "y", kv=_bundle_of(y))
    assert e.stats["kv_imported_tokens"] == 40 + 32
    while e.has_work():
        e.step()
    starts = {s.req_id: s.start_pos for steps in e.executor.steps for s in steps[0].seqs if s.req_id in "xy"}
    assert starts == {"x": 40, "y": 28} and e.num_free_blocks() == 20 and not pool._keeps


def test_an_aborted_import_settling_on_leaves_no_keep_with_a_request_that_takes_its_id():
    """x's import goes a block a step; x is aborted after one and a new request takes its id: the old import's blocks
    still settle, and must not be credited to (kept by) the new x — which would keep them past its end."""
    e = _engine(blocks=64)
    e._imports[0].budget = 4 * 4
    x = list(range(1, 42))
    e.add_request(x, SamplingParams(max_tokens=1), "x", kv=_bundle_of(x))
    e.step()
    e.abort("x")
    e.add_request(list(range(600, 610)), SamplingParams(max_tokens=20, ignore_eos=True), "x")
    for _ in range(4):
        e.step()
    assert e.scheduler.get("x").kept == [] and e.scheduler.get("x").hit_blocks == 0
    while e.has_work():
        e.step()
    assert not e.scheduler.pool._keeps and e.scheduler.pool.num_kept == 0 and e.num_free_blocks() == 64


def test_an_import_written_over_steps_keeps_its_place_before_a_later_waiter():
    """x (a 10-block import, a block a step) waits ahead of w, which arrives meanwhile and keeps w0's cached blocks;
    r's growth then evicts kept blocks: two of w's (behind x in the queue), its tail first, none of x's later-written
    ones (when kept blocks went by the time they were kept, x lost two: 32, 12)."""
    e = _engine(blocks=20, seqs=1)
    e._imports[0].budget = 4 * 4
    w0 = list(range(700, 713))
    e.add_request(w0, SamplingParams(max_tokens=1), "w0")
    while e.has_work():
        e.step()
    e.add_request(list(range(500, 505)), SamplingParams(max_tokens=30, ignore_eos=True), "r")
    e.step()
    x = list(range(1, 42))
    e.add_request(x, SamplingParams(max_tokens=1), "x", kv=_bundle_of(x))
    e.step()
    e.add_request(w0 + [9, 9, 9], SamplingParams(max_tokens=1), "w")
    while e.has_work():
        e.step()
    starts = {}
    for steps in e.executor.steps:
        for seq in steps[0].seqs:
            starts.setdefault(seq.req_id, seq.start_pos)
    assert (starts["x"], starts["w"]) == (40, 4), starts        # w lost two tail blocks, x none


def test_a_cancel_while_the_kv_is_adopted_aborts_the_request():
    """The client goes away while ``add_request`` adopts its KV in a thread: the request is aborted once added, not
    left decoding for no one."""
    import asyncio
    import time

    from cluster.async_engine import AsyncEngine

    e = _engine()
    add, execute = e.add_request, e.executor.execute
    e.add_request = lambda *a, **k: (time.sleep(0.2), add(*a, **k))[1]
    e.executor.execute = lambda steps: (time.sleep(0.01), execute(steps))[1]     # 100 tokens: a second at least
    ae = AsyncEngine(e)
    y = list(range(300, 341))

    async def main():
        async def consume():
            async for _ in ae.generate(y, SamplingParams(max_tokens=100, ignore_eos=True), "y", kv=_bundle_of(y)):
                pass
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.4)

    try:
        asyncio.run(main())
        assert "y" not in e._rank_of and e.stats["generated_tokens"] < 100
    finally:
        ae.shutdown()


def test_imports_beside_running_requests_go_as_fast_as_the_worker_fills_them(monkeypatch):
    """Paced imports (``IMPORT_PACE``): once the worker reported a fill (``StepResult.import_fill``: 1 MiB or more),
    a step beside running requests takes what its helpers fill in 0.8 of the shortest of the last 8 steps' work — here
    30 kB a second × 2 ms × 0.8 = 3 blocks of 16 bytes, then × 9 ms = 13 — not the whole budget; steps sending imports
    count (a steady flow of imports must not freeze the budget), steps without running requests or rows do not; with
    nothing running (nothing to hold up), and unpaced, an import goes whole; small fills teach nothing."""
    from dataclasses import replace

    import cluster.disagg as disagg
    from tests.conftest import RecordingExecutor

    monkeypatch.setattr(disagg, "IMPORT_PACE", (0.8, 16))        # (the floor: a block)

    class Filling(RecordingExecutor):
        busy = 2.0

        def execute(self, steps):
            return [replace(r, busy_ms=self.busy if st.seqs else 0.0,
                            import_fill=(1 << 20, (1 << 20) / 30e3) if st.kv_imports else None)
                    for r, st in zip(super().execute(steps), steps)]

    e = _engine(blocks=128)
    e.executor = Filling()
    imports = e._imports[0]

    def sent(prompt, rid):
        e.add_request(prompt, SamplingParams(max_tokens=2), rid, kv=_bundle_of(prompt))
        counts = []
        while imports:
            e.step()
            counts.append(sum(len(b) for b, _ in e.executor.steps[-1][0].kv_imports))
        return counts

    e.add_request(list(range(500, 505)), SamplingParams(max_tokens=90, ignore_eos=True), "x")
    e.step()                                    # (x was not running when the step was planned: not counted)
    assert sent(list(range(1, 42)), "y") == [10, 0] and list(imports.windows) == [2.0, 2.0]
    assert imports.rate == pytest.approx(30e3)
    assert imports.step_budget(True) == 48 and imports.step_budget(False) == imports.budget
    assert sent(list(range(100, 141)), "w") == [3, 3, 3, 1, 0]
    e.executor.busy = 9.0                       # heavier steps, imports going on
    assert sent(list(range(150, 191)), "v") == [3, 3, 3, 1, 0]
    assert sent(list(range(400, 441)), "t") == [3, 3, 3, 1, 0]    # (the 2 ms steps leave the last 8 here)
    assert imports.step_budget(True) == 216 and sent(list(range(600, 641)), "r") == [10, 0]
    imports.paced = False
    e.executor.busy = 2.0
    assert sent(list(range(200, 241)), "u") == [10, 0]
    imports.paced = True
    e.abort("x")
    while e.has_work():
        e.step()
    windows = list(imports.windows)
    assert sent(list(range(300, 341)), "s") == [10, 0] and list(imports.windows) == windows  # nothing ran beside it
    imports.written(e.scheduler, (1 << 19, 1.0))
    assert imports.rate == pytest.approx(30e3)                   # (half a MiB: thread start-up, not the rate)


def test_a_reserved_import_writer_fills_its_two_buffers_and_reports_the_fill(tiny_config):
    """``ImportWriter.reserve`` (a decode replica's start) makes both buffers at once; the imports after it fill them in
    turn — no buffer made at an import — and ``write`` reports the bytes and the fill's seconds (``import_fill``)."""
    config = ModelConfig.from_dict(tiny_config) if isinstance(tiny_config, dict) else tiny_config
    src, dst = KVCache(config, 64, torch.bfloat16), KVCache(config, 64, torch.bfloat16)
    writer = ImportWriter(dst, 8, staged=True)
    writer.reserve()
    buffers = {b.data_ptr() for b, _ in writer._buffers}
    assert len(buffers) == 2 and all(b.numel() == ImportWriter.BUFFER for b, _ in writer._buffers)
    rows = src.read_blocks([0, 1], 8)
    for _ in range(3):
        nbytes, seconds = writer.write(writer.stage([([4, 5], rows)]), land=True)
        assert nbytes == 2 * 8 * 8 + sum(r.nbytes for r in rows) and seconds > 0
        assert {b.data_ptr() for b, _ in writer._buffers} == buffers
    plain = ImportWriter(dst, 8, staged=False)
    assert plain.write(plain.stage([([4, 5], rows)]), land=True) is None       # (a CPU: written in place)


def test_a_runner_whose_step_raises_drops_the_rows_it_sent(tiny_config):
    """``ModelRunner.execute``: rows a step sent (staged: they land after the next step's work) are dropped when the
    next step raises — the engine releases their blocks, which may go to other requests — while a report's step (id
    -1) leaves them on their way; a later step told to land writes nothing."""
    from models.loader import dummy_model
    from workers.runner import ModelRunner, WorkerStep

    runner = ModelRunner(dummy_model(tiny_config, torch.float32), 16, 8, torch.float32)
    runner.imports = ImportWriter(runner.cache, 8, staged=True)
    src = KVCache(tiny_config, 16 * 8, torch.float32)
    for t in src.tensors():
        t.view(torch.uint8).copy_(torch.randint(1, 256, t.view(torch.uint8).shape, dtype=torch.uint8))
    runner.execute(WorkerStep(0, (), kv_imports=(((3, 4), src.read_blocks([0, 1], 8)),)))
    runner.execute(WorkerStep(-1, (), memory=True))
    assert runner.imports._sent is not None

    def failing(step):
        raise RuntimeError("injected")

    runner._execute = failing
    with pytest.raises(RuntimeError, match="injected"):
        runner.execute(WorkerStep(1, (), kv_land=True))
    del runner._execute
    assert runner.imports._sent is None
    runner.execute(WorkerStep(2, (), kv_land=True))
    assert not any(t.view(torch.uint8)[3 * 8:5 * 8].any() for t in runner.cache.tensors())
