"""N worker actors (local Ray, logical GPUs, gloo and shared memory) against the single-process engine."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from cluster.async_engine import AsyncEngine
from cluster.config import EngineConfig
from cluster.engine import Engine, GroupFailure, LocalExecutor, warm_keys
from cluster.local import scheduler_config
from cluster.workers import RayWorkerGroup
from models.loader import load_model
from scheduler.request import SamplingParams
from scheduler.shapes import StepShape, graph_widths
from tests.conftest import run_engine as run
from workers.runner import ModelRunner
from workers.worker import Worker

pytestmark = pytest.mark.ray
NUM_BLOCKS = 128


def requests(n=6, max_tokens=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(n):
        plen = int(torch.randint(3, 40, (1,), generator=g))
        out[f"r{i}"] = (torch.randint(2, 1024, (plen,), generator=g).tolist(),
                        SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return out


def engine_config(ckpt, n, moe="tp", comm="torch", **kw) -> EngineConfig:
    return EngineConfig(model=str(ckpt), device="cpu", dtype="float32", num_workers=n, moe=moe, comm=comm,
                        kv_cache_tokens=NUM_BLOCKS * 16, max_num_batched_tokens=128, **kw)


@pytest.fixture(scope="module")
def reference(tiny_ckpt, tiny_config):
    """The single-process engine's tokens: the oracle for every distributed layout."""
    model = load_model(tiny_ckpt, dtype=torch.float32, progress=False)
    cfg = engine_config(tiny_ckpt, 1)
    engine = Engine(LocalExecutor(ModelRunner(model, NUM_BLOCKS, 16, torch.float32)),
                    scheduler_config(cfg, tiny_config, None, NUM_BLOCKS))
    return (run(engine, requests()), run(engine, {"solo": requests(1, max_tokens=8, seed=5)["r0"]}),
            run(engine, staggered()))


def staggered() -> dict:
    """Four requests ending 3 tokens apart (4 … 13 tokens)."""
    return {rid: (ids, SamplingParams(max_tokens=4 + 3 * i, temperature=0.0))
            for i, (rid, (ids, _)) in enumerate(requests(4, seed=7).items())}


@pytest.mark.parametrize("n,moe,comm", [(1, "tp", "torch"), (2, "tp", "ipc"), (2, "ep", "torch"),
                                        (8, "tp", "torch"), (8, "tp", "ipc"), (8, "ep", "torch"),
                                        (8, "ep", "ipc")])
def test_greedy_tokens_equal_single_process(ray_session, tiny_ckpt, tiny_config, reference, n, moe, comm):
    cfg = engine_config(tiny_ckpt, n, moe, comm)
    group = RayWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = Engine(group, scheduler_config(cfg, tiny_config, None, NUM_BLOCKS), num_ranks=n)
        assert run(engine, requests()) == reference[0]
        # a solo request: its prefill rides in one span over all ranks, then dp decode
        assert run(engine, {"solo": requests(1, max_tokens=8, seed=5)["r0"]}) == reference[1]
        assert (engine.stats["span_steps"] > 0) == (n > 1)
        assert engine.num_free_blocks() == n * NUM_BLOCKS
        _gate_span_matches_dp(group, n, tiny_config.hidden_size, comm)
    finally:
        group.shutdown()


def test_steps_as_ray_actor_calls_equal_single_process(ray_session, tiny_ckpt, tiny_config, reference):
    """``step_channel: ray`` (the fallback where the socket channel cannot connect) gives the same tokens."""
    cfg = engine_config(tiny_ckpt, 2, "tp", "ipc", step_channel="ray")
    group = RayWorkerGroup(cfg, NUM_BLOCKS)
    try:
        assert group.conns == []
        engine = Engine(group, scheduler_config(cfg, tiny_config, None, NUM_BLOCKS), num_ranks=2)
        assert run(engine, requests()) == reference[0]
    finally:
        group.shutdown()


def _gate_span_matches_dp(group, n: int, hidden: int, comm: str) -> None:
    """span_matches_dp: the same rows through Dp (rank r holds rows r*R..) and Span(owner) (the owner holds
    all) give bit-identical MoE outputs; NaN-poisoned buffers and pad rows never leak."""
    import ray

    if n == 1:
        return
    R = 2
    x = torch.randn(n * R, hidden, generator=torch.Generator().manual_seed(3))
    for a in group.actors:
        ray.get(a.call.remote("poison_comm_buffers"))
    layer = 3                                                    # an MoE layer of the tiny config
    # same bucket both ways: Dp (rank r holds rows r*R..r*R+R-1) vs Span (the owner holds all n*R rows)
    dp = ray.get([a.call.remote("run_mlp", layer, x[r * R:(r + 1) * R], StepShape("dp", R, n * R, None))
                  for r, a in enumerate(group.actors)])
    dp_out = torch.cat([out for _, out in dp])
    assert torch.isfinite(dp_out).all()
    for owner in (0, n - 1):
        span = ray.get([a.call.remote("run_mlp", layer, x if r == owner else x[:0],
                                      StepShape("span", n * R, n * R, owner))
                        for r, a in enumerate(group.actors)])
        assert torch.equal(span[owner][0], dp[0][0]), "the gathered rows differ"
        assert torch.equal(span[owner][1], dp_out), f"span (owner {owner}) and dp MoE outputs differ ({comm})"
        assert all(out.shape[0] == 0 for r, (_, out) in enumerate(span) if r != owner)
    # pad rows: a bucket of 2R per rank holding R rows; pads gather as exact zeros, outputs stay finite
    padded = ray.get([a.call.remote("run_mlp", layer, x[r * R:(r + 1) * R], StepShape("dp", 2 * R, 2 * n * R, None))
                      for r, a in enumerate(group.actors)])
    gathered = padded[0][0]
    for r in range(n):
        assert torch.equal(gathered[r * 2 * R + R:(r + 1) * 2 * R], torch.zeros(R, hidden)), "pads must be zeros"
    assert torch.isfinite(gathered).all() and all(torch.isfinite(out).all() for _, out in padded)


class FailingWorker(Worker):
    """Rank 1 raises during setup (after loading, before the comm meets)."""

    def __init__(self, spec, rendezvous):
        if spec.rank == 1:
            rendezvous.fail(1, "injected setup failure")
            raise RuntimeError("injected setup failure on rank 1")
        super().__init__(spec, rendezvous)


def test_setup_failure_fails_fast(ray_session, tiny_ckpt):
    t0 = time.monotonic()
    with pytest.raises(GroupFailure, match="injected setup failure"):
        RayWorkerGroup(engine_config(tiny_ckpt, 2), NUM_BLOCKS, worker_cls=FailingWorker)
    assert time.monotonic() - t0 < 120


def _finds_cuda() -> bool:
    return True


def test_device_auto_is_decided_where_the_workers_run(ray_session):
    """``device: auto`` in a replica (which may sit on a node without GPUs) asks a one-GPU task: the session's logical
    GPUs are no CUDA devices, so CPU; a task that finds CUDA makes it cuda. An explicit device is kept."""
    from cluster.workers import resolve_device

    assert resolve_device(EngineConfig(device="auto")).device == "cpu"
    assert resolve_device(EngineConfig(device="auto"), probe=_finds_cuda).device == "cuda"
    assert resolve_device(EngineConfig(device="cpu"), probe=_finds_cuda).device == "cpu"


def test_coordinator_warms_up_before_it_serves(ray_session, text_ckpt):
    """A replica's ``Coordinator`` with ``warmup_tokens`` (the static graph path run eagerly on CPU) warms its worker
    group up in its constructor: ``info()`` reports the warm steps and fresh stats, and a request served after it
    streams the tokens of one served by a replica without the warm-up."""
    from cluster.coordinator import Coordinator
    from models.tokenizer import Tokenizer

    async def serve(coord, prompt):
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        return [t for ev in [ev async for ev in coord.generate(prompt, params, "r")] for t in ev.token_ids], \
            await coord.info()

    prompt = requests(1, seed=3)["r0"][0]
    got = {}
    for warm in (48, 0):
        coord = Coordinator(engine_config(text_ckpt, 1, cuda_graphs="eager", warmup_tokens=warm).to_dict())
        try:
            info = asyncio.run(coord.info())
            if warm:
                assert info["warmup"]["graph_steps"] == len(warm_keys(1, True, 0, graph_widths(3)))
                assert info["warmup"]["gpu_free"] is None       # asked of the group's worker: a CPU has no GPU's
            else:
                assert info["warmup"] is None
            assert info["stats"]["steps"] == 0 and info["free_blocks"] == NUM_BLOCKS
            # the parsers' split needs an event at each special token (with speculation too): the engine knows them
            specials = Tokenizer.from_dir(text_ckpt).special_ids_by_token()
            assert coord.engine.special_ids == set(specials.values()) and "</think>" in specials
            got[warm], after = asyncio.run(serve(coord, prompt))
            assert after["stats"]["graph_steps"] > 0
        finally:
            coord.aengine.shutdown()
            coord.group.shutdown()
    assert got[48] == got[0] and len(got[0]) == 8


def test_killed_worker_fails_requests_then_recovers(ray_session, tiny_ckpt, tiny_config):
    import ray

    cfg = engine_config(tiny_ckpt, 2, step_timeout_s=20.0)
    group = RayWorkerGroup(cfg, NUM_BLOCKS)
    engine = Engine(group, scheduler_config(cfg, tiny_config, None, NUM_BLOCKS), num_ranks=2)
    aeng = AsyncEngine(engine)

    async def long_request():
        events = []
        async for ev in aeng.generate(list(range(2, 20)), SamplingParams(max_tokens=400, temperature=0.0,
                                                                          ignore_eos=True)):
            events.append(ev)
            if len(events) == 3:
                ray.kill(group.actors[1], no_restart=True)          # a rank dies mid-generation
        return events

    async def short_request():
        return [ev async for ev in aeng.generate(list(range(2, 12)), SamplingParams(max_tokens=4, temperature=0))]

    try:
        t0 = time.monotonic()
        events = asyncio.run(long_request())
        assert events[-1].finished and events[-1].finish_reason == "error" and "rank" in events[-1].error
        assert time.monotonic() - t0 < 30
        after = asyncio.run(short_request())          # the group was rebuilt: new requests succeed
        assert after[-1].finished and after[-1].error is None and sum(len(e.token_ids) for e in after) == 4
    finally:
        aeng.shutdown()
        group.shutdown()


def test_speculative_span_on_8_ranks_equals_plain(ray_session, tiny_ckpt, tiny_config, reference):
    """k = N-1 = 7 drafts ride with the committed token in one 8-row span; tokens equal plain decode."""
    cfg = engine_config(tiny_ckpt, 8, "tp", "ipc", speculative_tokens=7)
    group = RayWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = Engine(group, scheduler_config(cfg, tiny_config, None, NUM_BLOCKS), num_ranks=8,
                        speculative_tokens=7)
        assert run(engine, {"solo": requests(1, max_tokens=8, seed=5)["r0"]}) == reference[1]
        assert engine.stats["draft_rounds"] > 0 and engine.stats["span_steps"] > engine.stats["draft_rounds"] - 1
        assert run(engine, requests()) == reference[0]          # a batch: drafts suppressed, dp buckets
        assert engine.num_free_blocks() == 8 * NUM_BLOCKS
    finally:
        group.shutdown()


def test_plain_process_group_without_ray(tiny_ckpt, tiny_config, reference):
    """The same ranks as spawned processes (what GPU benchmarks use where Ray is not installed)."""
    from cluster.workers import ProcessWorkerGroup

    cfg = engine_config(tiny_ckpt, 2, "ep", "ipc")
    group = ProcessWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = Engine(group, scheduler_config(cfg, tiny_config, None, NUM_BLOCKS), num_ranks=2)
        assert run(engine, requests()) == reference[0]
    finally:
        group.shutdown()


def test_prompt_logprobs_in_a_group_equal_single_process(tiny_ckpt, tiny_config):
    """Prompt logprobs (``SamplingParams.prompt_logprobs``) from a 2-rank ep group (spawned processes, ipc): a batch
    spread over both ranks, then a solo request whose prompt rides spans — the single process's values and tokens."""
    from dataclasses import replace

    from cluster.workers import ProcessWorkerGroup
    from tests.integration.test_prompt_logprobs import collect

    asking = {rid: (ids, replace(p, prompt_logprobs=2)) for rid, (ids, p) in requests().items()}
    solo = {"solo": (lambda ids, p: (ids, replace(p, prompt_logprobs=2)))(*requests(1, max_tokens=8, seed=5)["r0"])}
    model = load_model(tiny_ckpt, dtype=torch.float32, progress=False)
    single = Engine(LocalExecutor(ModelRunner(model, NUM_BLOCKS, 16, torch.float32)),
                    scheduler_config(engine_config(tiny_ckpt, 1), tiny_config, None, NUM_BLOCKS))
    want = [collect(single, reqs) for reqs in (asking, solo)]
    cfg = engine_config(tiny_ckpt, 2, "ep", "ipc")
    group = ProcessWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = Engine(group, scheduler_config(cfg, tiny_config, None, NUM_BLOCKS), num_ranks=2)
        for reqs, expected in zip((asking, solo), want):
            got = collect(engine, reqs)
            assert got.keys() == expected.keys()
            for rid, (tokens, lps, carried) in got.items():
                assert tokens == expected[rid][0] and carried == 1 and len(lps) == len(reqs[rid][0]) - 1, rid
                for a, b in zip(lps, expected[rid][1]):
                    assert abs(a.logprob - b.logprob) < 1e-4 and [t for t, _ in a.top] == [t for t, _ in b.top], rid
        assert engine.stats["span_steps"] > 0
    finally:
        group.shutdown()


def test_a_group_reuses_prefixes_from_host_memory(tiny_ckpt, tiny_config, reference):
    """Each rank's host tier (the runner's copies between its device cache and host memory, sent in the steps): the
    requests again, after long prompts evicted them from 8 device blocks a rank, find their prefixes on the host and
    give the single process's tokens."""
    from cluster.workers import ProcessWorkerGroup

    cfg = EngineConfig(model=str(tiny_ckpt), device="cpu", dtype="float32", num_workers=2, moe="ep", comm="ipc",
                       kv_cache_tokens=8 * 16, max_num_batched_tokens=128, host_kv_cache_tokens=64 * 16)
    group = ProcessWorkerGroup(cfg, 8)
    try:
        engine = Engine(group, scheduler_config(cfg, tiny_config, None, 8), num_ranks=2)
        assert run(engine, requests()) == reference[0]
        long = SamplingParams(max_tokens=4, temperature=0.0)
        run(engine, {"fill0": (list(range(2, 122)), long), "fill1": (list(range(200, 320)), long)})
        again = run(engine, {f"again-{rid}": req for rid, req in requests().items()})
        assert {rid.removeprefix("again-"): out for rid, out in again.items()} == reference[0]
        assert sum(s.host_loads for s in engine.schedulers) > 0 and engine.num_free_blocks() == 2 * 8
    finally:
        group.shutdown()


def test_speculative_trained_model_8_ranks_equals_plain(ray_session, text_ckpt):
    """The trained tiny model (its MTP head agrees with the target, so drafts are accepted): greedy output
    with k = 7 drafts riding in the 8-rank span equals single-process plain decode for 20 prompts."""
    from models.config import ModelConfig

    mc = ModelConfig.from_json(text_ckpt)
    g = torch.Generator().manual_seed(21)
    prompts = [torch.randint(40, mc.vocab_size, (int(torch.randint(4, 40, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(20)]
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    cfg1 = engine_config(text_ckpt, 1)
    plain = Engine(LocalExecutor(ModelRunner(load_model(text_ckpt, dtype=torch.float32, progress=False),
                                             NUM_BLOCKS, 16, torch.float32)),
                   scheduler_config(cfg1, mc, None, NUM_BLOCKS))
    expected = [run(plain, {f"p{i}": (ids, greedy)})[f"p{i}"] for i, ids in enumerate(prompts)]
    cfg = engine_config(text_ckpt, 8, "tp", "ipc", speculative_tokens=7)
    group = RayWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = Engine(group, scheduler_config(cfg, mc, None, NUM_BLOCKS), num_ranks=8, speculative_tokens=7)
        got = [run(engine, {f"s{i}": (ids, greedy)})[f"s{i}"] for i, ids in enumerate(prompts)]
        assert got == expected
        assert engine.stats["drafts_accepted"] > 0, "the trained MTP head should get drafts accepted"
        print("8-rank speculation:", engine.spec_metrics())
    finally:
        group.shutdown()


@pytest.mark.parametrize("n,moe,comm", [(2, "tp", "torch"), (8, "ep", "ipc")])
def test_static_graph_steps_equal_single_process(ray_session, tiny_ckpt, tiny_config, reference, n, moe, comm):
    """``cuda_graphs: eager``: decode steps take the graph-shaped path (every rank padded to the bucket,
    owner and real-row count in device scalars, static AG/RS) without capture; tokens equal single-process."""
    cfg = engine_config(tiny_ckpt, n, moe, comm, cuda_graphs="eager")
    group = RayWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = Engine(group, scheduler_config(cfg, tiny_config, None, NUM_BLOCKS), num_ranks=n, graphs=True)
        assert run(engine, requests()) == reference[0]
        assert run(engine, {"solo": requests(1, max_tokens=8, seed=5)["r0"]}) == reference[1]
        assert engine.stats["graph_steps"] > 0
        assert engine.stats["ahead_steps"] > 0      # every rank replayed steps launched ahead, in lock-step
        before = dict(engine.stats)                 # requests ending at different steps: a rank's rows thin out
        assert run(engine, staggered()) == reference[2]                             # (on 8 ranks: to none)
        graph, ahead = (engine.stats[k] - before[k] for k in ("graph_steps", "ahead_steps"))
        print(f"{n} ranks, staggered ends: {ahead} of {graph} graph steps launched ahead")
        assert ahead >= graph - 3, (ahead, graph)
    finally:
        group.shutdown()


def test_static_span_verify_steps_equal_plain(ray_session, text_ckpt):
    """Speculation on 4 ranks with graph-shaped steps, after a warm-up: each verify step (1 + 3 drafts) is a static span
    whose owner comes from a device scalar; greedy output equals single-process plain decode, and a seeded drawn
    request (its drafts picked between the drafting graphs on its rank, the other ranks' passes on pad rows) gives
    the tokens of a single process with speculation and no graphs."""
    from models.config import ModelConfig

    mc = ModelConfig.from_json(text_ckpt)
    g = torch.Generator().manual_seed(22)
    prompts = [torch.randint(40, mc.vocab_size, (int(torch.randint(4, 40, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(6)]
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    plain = Engine(LocalExecutor(ModelRunner(load_model(text_ckpt, dtype=torch.float32, progress=False),
                                             NUM_BLOCKS, 16, torch.float32)),
                   scheduler_config(engine_config(text_ckpt, 1), mc, None, NUM_BLOCKS))
    expected = [run(plain, {f"p{i}": (ids, greedy)})[f"p{i}"] for i, ids in enumerate(prompts)]
    drawn = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, seed=4)
    spec = Engine(LocalExecutor(ModelRunner(load_model(text_ckpt, dtype=torch.float32, progress=False),
                                            NUM_BLOCKS, 16, torch.float32, speculative=True)),
                  scheduler_config(engine_config(text_ckpt, 1), mc, None, NUM_BLOCKS), speculative_tokens=3)
    expected_drawn = run(spec, {"d": (prompts[0], drawn)})["d"]
    cfg = engine_config(text_ckpt, 4, "tp", "ipc", speculative_tokens=3, cuda_graphs="eager")
    group = RayWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = Engine(group, scheduler_config(cfg, mc, None, NUM_BLOCKS), num_ranks=4, speculative_tokens=3,
                        graphs=True)
        # the start-up warm-up first: every rank runs each warm step (dp and span keys, drafting graphs after them)
        keys = warm_keys(4, True, 3, graph_widths(4), cfg.max_num_seqs // 4)
        assert engine.warm_up(64)["graph_steps"] == len(keys)
        assert engine.stats["steps"] == 0 and engine.num_free_blocks() == 4 * NUM_BLOCKS
        got = [run(engine, {f"s{i}": (ids, greedy)})[f"s{i}"] for i, ids in enumerate(prompts)]
        assert got == expected
        assert engine.stats["graph_steps"] > 0 and engine.stats["drafts_accepted"] > 0
        assert engine.stats["span_steps"] > 0
        accepted = engine.stats["drafts_accepted"]
        assert run(engine, {"d": (prompts[0], drawn)})["d"] == expected_drawn
        assert engine.stats["drafts_accepted"] - accepted == spec.stats["drafts_accepted"]
    finally:
        group.shutdown()


def test_structured_output_in_a_worker_group_equals_single_process(text_ckpt):
    """Guided rows in a 2-rank group — one alone (span steps: its owner samples it; with MTP drafts too, its verify
    rows masked along them) and three at once (dp: each rank its own), and on graph-shaped steps launched ahead (each
    rank's sampling deferred to its next step's masks) — sample what the single-process engine samples: each rank's
    step carries its own rows' masks."""
    import json

    pytest.importorskip("xgrammar")
    from cluster.local import guides, load_tokenizer
    from cluster.workers import ProcessWorkerGroup
    from models.config import ModelConfig
    from tests.integration.test_engine import PERSON

    mc, tok = ModelConfig.from_json(text_ckpt), load_tokenizer(text_ckpt)
    schema = json.dumps(PERSON)
    prompts = [tok.encode_chat([{"role": "user", "content": c}], enable_thinking=False)
               for c in ("A person as JSON.", "Someone old.", "Name a sailor.")]
    solo = {"solo": (prompts[0], SamplingParams(max_tokens=80, temperature=0.0, json_schema=schema))}
    several = {f"g{i}": (p, SamplingParams(max_tokens=60, temperature=0.7 * i, seed=i, json_schema=schema))
               for i, p in enumerate(prompts)}

    def engine_on(executor, cfg, n, k=0, graphs=False):
        sched = scheduler_config(cfg, mc, tok, NUM_BLOCKS)
        return Engine(executor, sched, num_ranks=n, guides=guides(tok, mc, sched), speculative_tokens=k, graphs=graphs)
    cfg1 = engine_config(text_ckpt, 1)
    plain = engine_on(LocalExecutor(ModelRunner(load_model(text_ckpt, dtype=torch.float32, progress=False),
                                                NUM_BLOCKS, 16, torch.float32)), cfg1, 1)
    want = [run(plain, solo), run(plain, several)]
    cfg = engine_config(text_ckpt, 2, "tp", "ipc")
    group = ProcessWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = engine_on(group, cfg, 2)
        assert [run(engine, solo), run(engine, several)] == want
        assert engine.stats["span_steps"] > 0, engine.stats
    finally:
        group.shutdown()
    cfg = engine_config(text_ckpt, 2, "tp", "ipc", speculative_tokens=3)
    group = ProcessWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = engine_on(group, cfg, 2, k=3)
        assert run(engine, solo) == want[0]
        assert engine.stats["drafts_accepted"] > 0, engine.stats
    finally:
        group.shutdown()
    cfg = engine_config(text_ckpt, 2, "tp", "ipc", cuda_graphs="eager")       # graph-shaped steps, launched ahead
    group = ProcessWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = engine_on(group, cfg, 2, graphs=True)
        assert [run(engine, solo), run(engine, several)] == want
        assert engine.stats["ahead_steps"] > 0, engine.stats
    finally:
        group.shutdown()
