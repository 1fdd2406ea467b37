"""Random request mixes through the engine leave nothing behind. Requests that finish by length, EOS, stop strings or
stop token ids; greedy, seeded and unseeded draws; with logprobs and prompt logprobs; held to a JSON schema or a
thinking budget; sharing prefixes; aborted at random points (before their first step, mid-prompt, while decoding) —
over a plain engine, a speculative one, one that launches steps ahead, and one whose pool is small enough to preempt
and to evict cached prefixes to a host tier. Once all have ended: every per-request map of the engine and the runner
is empty and every KV block is free again. The same through ``AsyncEngine`` with clients that leave mid-stream, and
through a replica (``Coordinator``) over two spawned ranks."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import random
import signal

import pytest

from scheduler.request import SamplingParams
from scheduler.scheduler import AdmissionError

# JSON-schema requests need xgrammar (the 'serve' and 'test' extras; the GPU image lacks it): without it, none
KINDS = ["greedy", "seeded", "drawn", "stop", "stop_ids", "logprobs", "prompt_logprobs", "budget", "eos",
         *(["schema"] if importlib.util.find_spec("xgrammar") else [])]

SETUPS = {
    "plain": {},
    "mtp": dict(speculative_tokens=2),
    "ahead": dict(cuda_graphs="eager"),
    "crowded": dict(kv_cache_tokens=320, max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64,
                    host_kv_cache_tokens=512),
}
SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
WORDS = "the old man said to the sea that the night was long and the fish was near".split()


def engine_for(setup: str, **kw):
    """The embedded model's engine in one of ``SETUPS`` (``kw``: more config, e.g. a CUDA device)."""
    from cluster.config import EngineConfig
    from cluster.local import build_local_engine

    kw = {"kv_cache_tokens": 4096, "max_model_len": 512, "warmup_tokens": 0, **SETUPS[setup], **kw}
    return build_local_engine(EngineConfig(**kw), progress=False)


def random_request(rng: random.Random, tok, shared: list[int]) -> tuple[list[int], SamplingParams]:
    """A prompt (a chat, plain text, or a shared prefix and more) and one of the kinds of sampling a client asks for."""
    text = " ".join(rng.choices(WORDS, k=rng.randint(2, 40)))
    form = rng.random()
    ids = (tok.encode_chat([{"role": "user", "content": text}], enable_thinking=rng.random() < 0.5) if form < 0.4
           else shared + tok.encode(text) if form < 0.7 else tok.encode(text))
    kind = rng.choice(KINDS)
    kw: dict = {"max_tokens": rng.choice([1, 4, 24, 64]), "temperature": 0.0}
    if kind in ("seeded", "drawn"):
        kw.update(temperature=1.0, top_p=0.9, seed=rng.randint(0, 99) if kind == "seeded" else None)
    elif kind == "stop":
        kw.update(stop=(rng.choice(WORDS), " a"))
    elif kind == "stop_ids":
        kw.update(stop_token_ids=tuple(rng.sample(range(10, 6000), 40)))
    elif kind == "logprobs":
        kw.update(logprobs=2)
    elif kind == "prompt_logprobs":
        kw.update(prompt_logprobs=1)
    elif kind == "schema":
        kw.update(max_tokens=rng.randint(4, 40), json_schema=SCHEMA)
    elif kind == "budget":
        kw.update(thinking_budget=rng.randint(0, 4))
    else:
        kw.update(ignore_eos=False, temperature=1.0, seed=rng.randint(0, 99))
    return ids, SamplingParams(**kw)


def assert_nothing_left(engine) -> None:
    runner = engine.executor.runner
    assert not engine.has_work()
    assert not (engine._streams or engine._rank_of or engine._guides or engine._unsent or engine._exports)
    assert not any(engine._forget) and not runner.requests
    for sch in engine.schedulers:
        assert not sch.live_ids() and sch.pool.num_free == sch.pool.num_blocks, (sch.pool.num_free, sch.pool.num_blocks)


@pytest.mark.parametrize("setup", list(SETUPS))
def test_random_request_mixes_with_aborts_leave_nothing_behind(setup):
    soak(*engine_for(setup), setup)


def soak(engine, tok, setup: str) -> None:
    """240 steps of random arrivals (quiet stretches between: a request alone) and aborts, then the rest run out."""
    rng = random.Random(f"soak-{setup}")
    shared = tok.encode(" ".join(rng.choices(WORDS, k=40)))         # a prefix several prompts share (cached blocks)
    live, ended, n = set(), set(), 0
    for step in range(240):
        for _ in range(rng.choice([0, 0, 1, 1, 2, 4]) if step % 60 < 40 else 0):      # (then quiet: a request alone)
            ids, params = random_request(rng, tok, shared)
            rid, n = f"q{n}", n + 1
            try:
                engine.add_request(ids, params, rid)
                live.add(rid)
            except AdmissionError:
                ended.add(rid)
        if live and rng.random() < 0.15:
            rid = rng.choice(sorted(live))
            if engine.abort(rid) is not None:
                live.discard(rid)
                ended.add(rid)
        for ev in engine.step():
            assert ev.error is None, ev.error
            if ev.finished:
                assert ev.req_id in live, ev.req_id         # one end a request, never after its abort
                live.discard(ev.req_id)
                ended.add(ev.req_id)
    for _ in range(2000):
        if not engine.has_work():
            break
        for ev in engine.step():
            assert ev.error is None and (not ev.finished or ev.req_id in live), (ev.req_id, ev.error)
            if ev.finished:
                live.discard(ev.req_id)
    assert not live and n > 150, (live, n)
    assert_nothing_left(engine)
    # a last request alone, greedy: it drafts (mtp) and looks ahead (ahead) whatever the mix left to chance
    engine.add_request(shared + tok.encode(" the end"), SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
                       "last")
    while engine.has_work():
        assert all(ev.error is None for ev in engine.step())
    assert_nothing_left(engine)
    queried, hits = engine.prefix_cache_tokens()
    assert hits > 0 and {"mtp": engine.stats["drafts_proposed"], "ahead": engine.stats["ahead_steps"],
                         "crowded": engine.stats["preemptions"]}.get(setup, 1) > 0, engine.stats


async def leaving_clients(generate, tok, seed: str, waves: int = 6, width: int = 12, fault=None) -> list[str]:
    """Waves of clients streaming through ``generate`` (``AsyncEngine.generate``'s or ``Coordinator.generate``'s
    arguments): some read to the end, some leave after a few events, guided ones may leave while their grammar
    compiles; refusals are answers. ``fault``: called at the first event (a rank killed) — then the requests in
    flight may end in an error (returned), and must end."""
    rng = random.Random(seed)
    shared = tok.encode(" ".join(rng.choices(WORDS, k=40)))
    faults, errors = [fault] if fault else [], []

    async def client(i: int) -> None:
        ids, params = random_request(rng, tok, shared)
        leave = rng.choice([None, 0, 1, 3])
        rid = f"{seed}-{i}"
        if leave == 0 and params.json_schema is not None:         # gone while the grammar compiles
            task = asyncio.ensure_future(anext(generate(ids, params, rid)))
            await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return
        stream, got = generate(ids, params, rid), 0
        try:
            async for ev in stream:
                if faults:
                    faults.pop()()                  # (once: at the run's first event)
                if ev.error is not None and ev.refused is None:
                    assert fault is not None, ev.error
                    errors.append(ev.error)
                got += 1
                if leave is not None and got >= leave:
                    break
        except AdmissionError:
            pass
        finally:
            await stream.aclose()

    for wave in range(waves):
        await asyncio.gather(*(client(wave * width + i) for i in range(width)))
    return errors


def settle(engine, queues: dict) -> None:
    """Wait for the engine's loop to take the last aborts (a few steps)."""
    for _ in range(200):
        if not engine.has_work() and not queues:
            return
        asyncio.run(asyncio.sleep(0.05))


def test_async_clients_that_leave_mid_stream_leave_nothing_behind():
    """``AsyncEngine.generate`` streams left after a random number of events (the client went away), refused ones,
    and guided ones cancelled while their grammar compiles: every stream's queue goes, the engine ends empty."""
    from cluster.async_engine import AsyncEngine

    engine, tok = engine_for("mtp")
    aengine = AsyncEngine(engine)
    try:
        asyncio.run(leaving_clients(aengine.generate, tok, "soak-async"))
        settle(engine, aengine._queues)
        assert not aengine._queues
    finally:
        aengine.shutdown()
    assert_nothing_left(engine)


def test_a_two_rank_replica_with_leaving_clients_ends_empty():
    """A replica (``Coordinator``) over two spawned ranks (ep, ipc): requests placed on either rank, clients leaving
    mid-stream, a rank killed under a wave (its requests in flight end in an error; the group is rebuilt and serves the
    next waves, no error) — the engine's maps, the coordinator's asks and every block of both ranks end free."""
    from cluster.config import EngineConfig
    from cluster.local import load_tokenizer
    from tests.integration.test_kv_memory_engine import process_coordinator

    cfg = EngineConfig(device="cpu", num_workers=2, moe="ep", comm="ipc", kv_cache_tokens=640, max_model_len=256,
                       max_num_seqs=8, max_num_batched_tokens=64, warmup_tokens=0, log_stats_interval_s=0)
    coord = process_coordinator()(cfg.to_dict())
    try:
        tok = load_tokenizer(cfg.model)
        asyncio.run(leaving_clients(coord.generate, tok, "soak-ranks", waves=2))
        kill = lambda: os.kill(coord.group.procs[1].pid, signal.SIGKILL)        # rank 1 dies under a wave
        errors = asyncio.run(leaving_clients(coord.generate, tok, "soak-kill", waves=1, width=16, fault=kill))
        assert errors and all("worker group failed" in e for e in errors), errors
        asyncio.run(leaving_clients(coord.generate, tok, "soak-rebuilt", waves=2))      # the rebuilt group serves
        settle(coord.engine, coord.aengine._queues)
        engine = coord.engine
        assert not (coord.aengine._queues or coord._asking or engine.has_work())
        assert not (engine._streams or engine._rank_of or engine._guides or engine._unsent or engine._exports)
        assert all(not sch.live_ids() and sch.pool.num_free == sch.pool.num_blocks for sch in engine.schedulers)
        assert engine.stats["generated_tokens"] > 0 and all(p.is_alive() for p in coord.group.procs)
    finally:
        coord.aengine.shutdown()
        coord.group.shutdown()
