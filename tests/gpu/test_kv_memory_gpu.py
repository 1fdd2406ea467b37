"""The KV pool sized to a GPU's memory (``gpu_memory_utilization``): one process takes what the fraction leaves after
its weights; two ranks on one GPU (ipc) split it; both serve the tokens of an engine given the same pool by
``kv_cache_tokens``, with CUDA graphs captured in a warm-up. The fraction is chosen from the memory free before the
engine starts, so that the pool is ~2 GiB whatever else the GPU holds.

Run on a lent H200: ``PYTHONPATH=. python -m pytest -q tests/gpu/test_kv_memory_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from cluster.config import EngineConfig
from cluster.engine import Engine
from cluster.local import build_local_engine, scheduler_config
from models.cache import KVCache
from models.config import ModelConfig
from tests.conftest import run_engine
from tests.integration.test_kv_memory_engine import requests
from workers.memory import GiB

POOL = 2 * GiB


def fraction_for(pool: int) -> float:
    """The fraction that leaves ``pool`` bytes for the KV given what the GPU holds now (the tiny weights are MBs)."""
    free, total = torch.cuda.mem_get_info()
    return (total - free + pool) / total


def config(ckpt, **kw) -> EngineConfig:
    return EngineConfig(model=str(ckpt), device="cuda", dtype="bfloat16", max_num_batched_tokens=128,
                        warmup_tokens=512, **kw)


def test_one_process_pool_fills_the_fraction(tiny_ckpt):
    torch.cuda.synchronize()
    engine, _ = build_local_engine(config(tiny_ckpt, gpu_memory_utilization=fraction_for(POOL)), progress=False)
    mc = ModelConfig.from_json(tiny_ckpt).without_mtp()      # (no drafts: no KV of the MTP layer)
    sched = engine.schedulers[0].config
    pool = sched.num_blocks * 16 * KVCache.bytes_per_slot(mc, torch.bfloat16)
    # less what the process takes between the two readings: the weights and the CUDA libraries the load brings in
    # (~0.16 GiB on the H200 in session 43), and the scratch slots
    assert 0.85 * POOL < pool <= POOL, pool / GiB
    cache = engine.executor.runner.cache
    held = sum(t.numel() * t.element_size() for t in (*cache.kv, *(k for k in cache.index_k if k is not None)))
    assert pool <= held < pool + 64 * 2**20
    plain, _ = build_local_engine(config(tiny_ckpt, kv_cache_tokens=sched.num_blocks * 16), progress=False)
    reqs = requests(mc.vocab_size)
    assert run_engine(engine, reqs) == run_engine(plain, reqs)
    assert engine.stats["graph_steps"] > 0
    free, total = engine.warmed["gpu_free"]           # the warm-up's report: what its largest steps left free
    assert total == torch.cuda.mem_get_info()[1] and 0 < free < total - pool


def test_ranks_on_one_gpu_split_it(tiny_ckpt):
    """Two ipc ranks on the one GPU measure after both loaded and before either allocates: each takes half."""
    pytest.importorskip("cupy")
    from cluster.workers import ProcessWorkerGroup

    mc = ModelConfig.from_json(tiny_ckpt).without_mtp()      # (no drafts: no KV of the MTP layer)
    cfg = config(tiny_ckpt, gpu_memory_utilization=fraction_for(2 * POOL), num_workers=2, moe="ep", comm="ipc")
    group = ProcessWorkerGroup(cfg, cfg.num_blocks)
    try:
        pool = group.num_blocks * 16 * KVCache.bytes_per_slot(mc, torch.bfloat16)
        # each rank's CUDA context and comm buffers (~0.5-1 GiB) come off the two ranks' budget before it is split
        assert 0.5 * POOL < pool < POOL, pool / GiB
        engine = Engine(group, scheduler_config(cfg, mc, None, group.num_blocks), num_ranks=2)
        plain, _ = build_local_engine(config(tiny_ckpt, kv_cache_tokens=group.num_blocks * 16), progress=False)
        reqs = requests(mc.vocab_size)
        got, want = run_engine(engine, reqs), run_engine(plain, reqs)
        agree = sum(a == b for r in reqs for a, b in zip(got[r], want[r])) / sum(len(v) for v in want.values())
        assert agree > 0.8, (got, want)                     # bf16: the MoE's partial sums round in another order
    finally:
        group.shutdown()
