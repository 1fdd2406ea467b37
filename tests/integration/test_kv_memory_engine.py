"""Engines and worker groups whose KV pool is sized to memory (``gpu_memory_utilization``) on CPU, where the device is
the host: ``GLMSERVE_DEVICE_MEMORY`` pretends a host of fixed free / total memory (spawned ranks inherit it), so the
pools are known in advance. The single process, a 2-rank process group whose ranks share the host (each takes half)
and keep their pool when the group is rebuilt, a replica's coordinator, and the errors that name the fields."""

from __future__ import annotations

import asyncio

import pytest
import torch

from cluster.config import EngineConfig
from cluster.engine import Engine
from cluster.local import build_local_engine, scheduler_config
from models.cache import KVCache
from scheduler.request import SamplingParams
from tests.conftest import run_engine
from workers.memory import GiB
from workers.runner import ModelRunner

FREE, TOTAL = 2.015, 4.0          # GiB: a fraction of 0.5 leaves 0.015 GiB for the KV (below the positions)
BS = 16


def expected_blocks(config, ranks_on_host: int = 1, host_tokens: int = 0) -> int:
    """The pool of an engine that does not draft (no KV of the MTP layer)."""
    slot = KVCache.bytes_per_slot(config.without_mtp(), torch.float32)
    budget = int(FREE * GiB - 0.5 * TOTAL * GiB) - host_tokens * slot
    return (budget // ranks_on_host - ModelRunner.extra_slots() * slot) // (BS * slot)


def config(ckpt, n: int = 1, **kw) -> EngineConfig:
    return EngineConfig(model=str(ckpt), device="cpu", dtype="float32", gpu_memory_utilization=0.5, num_workers=n,
                        max_num_batched_tokens=128, warmup_tokens=0, **kw)


def requests(vocab: int) -> dict:
    g = torch.Generator().manual_seed(11)
    return {f"r{i}": (torch.randint(2, vocab, (n,), generator=g).tolist(), SamplingParams(max_tokens=5, temperature=0))
            for i, n in enumerate((7, 30, 61))}


@pytest.fixture
def fake_host(monkeypatch):
    monkeypatch.setenv("GLMSERVE_DEVICE_MEMORY", f"{FREE},{TOTAL}")


def test_single_process_pool_fills_the_fraction(fake_host, tiny_ckpt, tiny_config):
    """The pool holds what the fraction leaves (less the host tier, on the same host); the context is what it holds
    (within the positions); tokens equal an engine given that many slots."""
    engine, _ = build_local_engine(config(tiny_ckpt, host_kv_cache_tokens=64 * BS), progress=False)
    blocks = expected_blocks(tiny_config, host_tokens=64 * BS)
    sched = engine.schedulers[0].config
    assert (sched.num_blocks, engine.num_free_blocks()) == (blocks, blocks) and blocks > 100
    assert sched.max_model_len == min(tiny_config.max_position_embeddings, blocks * BS)
    plain, _ = build_local_engine(EngineConfig(model=str(tiny_ckpt), device="cpu", dtype="float32",
                                               kv_cache_tokens=blocks * BS, host_kv_cache_tokens=64 * BS,
                                               max_num_batched_tokens=128, warmup_tokens=0), progress=False)
    reqs = requests(tiny_config.vocab_size)
    assert run_engine(engine, reqs) == run_engine(plain, reqs)


def test_errors_name_the_fields(monkeypatch, tiny_ckpt, tiny_config):
    monkeypatch.setenv("GLMSERVE_DEVICE_MEMORY", f"1.9,{TOTAL}")            # less free than the fraction leaves
    with pytest.raises(ValueError, match=r"'gpu_memory_utilization' \(0.5\) leaves no room for the KV cache"):
        build_local_engine(config(tiny_ckpt), progress=False)
    monkeypatch.setenv("GLMSERVE_DEVICE_MEMORY", f"{FREE},{TOTAL}")
    too_long = expected_blocks(tiny_config) * BS + 1
    with pytest.raises(ValueError, match=rf"'max_model_len' \({too_long}\) is more than a worker's KV cache holds "
                                         r"\(gpu_memory_utilization 0.5 leaves room for"):
        build_local_engine(config(tiny_ckpt, max_model_len=too_long), progress=False)


def test_group_ranks_split_the_host_and_keep_their_pool(fake_host, monkeypatch, tiny_ckpt, tiny_config):
    """Two spawned ranks on one host each take half its budget, agreed; rebuilt after a failure (``recover``) they
    hold the same pool whatever memory says then; their tokens equal the single process's."""
    from cluster.workers import ProcessWorkerGroup

    cfg = config(tiny_ckpt, 2, moe="ep", comm="ipc")
    blocks = expected_blocks(tiny_config, ranks_on_host=2)
    group = ProcessWorkerGroup(cfg, cfg.num_blocks)
    try:
        assert group.num_blocks == blocks
        engine = Engine(group, scheduler_config(cfg, tiny_config, None, group.num_blocks), num_ranks=2)
        reqs = requests(tiny_config.vocab_size)
        single, _ = build_local_engine(config(tiny_ckpt), progress=False)
        want = run_engine(single, reqs)
        assert run_engine(engine, reqs) == want
        monkeypatch.setenv("GLMSERVE_DEVICE_MEMORY", f"1.0,{TOTAL}")     # sizing now would fail
        group.recover()
        engine = Engine(group, scheduler_config(cfg, tiny_config, None, group.num_blocks), num_ranks=2)
        assert group.num_blocks == blocks and run_engine(engine, reqs) == want
    finally:
        group.shutdown()


def process_coordinator():
    """A replica's ``Coordinator`` over spawned ranks instead of Ray actors (``procs``: the last group's processes)."""
    from cluster.coordinator import Coordinator
    from cluster.workers import ProcessWorkerGroup

    class Coord(Coordinator):
        procs = []

        @staticmethod
        def _build_group(cfg, num_blocks, imports=False):
            group = ProcessWorkerGroup(cfg, num_blocks, imports=imports)
            Coord.procs = list(group.procs)
            return group

    return Coord


def test_coordinator_takes_its_group_pool(fake_host, tiny_ckpt, tiny_config):
    """A replica sized to memory reports the group's pool and the context it allows (the ingress asks for it); one
    whose max_model_len the pool cannot hold fails its start, naming the field, and leaves no rank behind."""
    cfg = config(tiny_ckpt, 2, comm="ipc")
    blocks = expected_blocks(tiny_config, ranks_on_host=2)
    coord_cls = process_coordinator()
    coord = coord_cls(cfg.to_dict())
    try:
        info = asyncio.run(coord.info())
        assert info["free_blocks"] == 2 * blocks
        assert info["max_model_len"] == min(tiny_config.max_position_embeddings, blocks * BS)
    finally:
        coord.aengine.shutdown()
        coord.group.shutdown()
    with pytest.raises(ValueError, match=r"'max_model_len' \(\d+\) is more than a worker's KV cache holds"):
        coord_cls(config(tiny_ckpt, 2, comm="ipc", max_model_len=blocks * BS + 1).to_dict())
    assert len(coord_cls.procs) == 2 and not any(p.is_alive() for p in coord_cls.procs)


@pytest.mark.ray
def test_a_sized_replica_serves_its_pool_context(serve_session, text_ckpt):
    """Served with ``gpu_memory_utilization`` (the session's Ray workers see a host of ``RAY_DEVICE_MEMORY``): the
    ingress gives and checks the context the coordinator's pool holds, which it learns from the coordinator."""
    import json
    import urllib.request

    from ray import serve

    from cluster.serve import build_app
    from models.config import ModelConfig
    from tests.integration.conftest import RAY_DEVICE_MEMORY
    from tests.integration.test_serve import MODEL, metric, post

    mc = ModelConfig.from_json(text_ckpt)
    slot = KVCache.bytes_per_slot(mc.without_mtp(), torch.float32)     # (an engine that does not draft)
    free, total = RAY_DEVICE_MEMORY
    blocks = (int(free * GiB - 0.5 * total * GiB) - ModelRunner.extra_slots() * slot) // (BS * slot)
    context = min(mc.max_position_embeddings, blocks * BS)
    assert 0 < context < mc.max_position_embeddings          # the pool, not the positions, bounds it
    serve.run(build_app({"model": str(text_ckpt), "served_model_name": MODEL, "device": "cpu",
                         "gpu_memory_utilization": 0.5}),
              name="sized", route_prefix="/sized", logging_config={"enable_access_log": False, "log_level": "WARNING"})
    try:
        url = serve_session + "/sized"
        status, err = post(url, "/v1/completions", {"model": MODEL, "prompt": [5] * context, "max_tokens": 1})
        assert status == 400 and f"context length {context}" in err["error"]["message"], err
        models = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=30).read())
        assert models["data"][0]["max_model_len"] == context and metric(url, "glmserve_kv_cache_tokens") == blocks * BS
        status, out = post(url, "/v1/completions", {"model": MODEL, "prompt": "The old man", "max_tokens": 4})
        assert status == 200 and out["usage"]["completion_tokens"] == 4, out
    finally:
        serve.delete("sized")
