"""The KV pool sized to memory (``gpu_memory_utilization``, ``workers/memory.py``): the arithmetic, the ranks'
agreement, the config's checks and the ingress learning the context length from its coordinator. The engines and
worker groups that size their pools: ``tests/integration/test_kv_memory_engine.py``."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest
import torch

from cluster.config import EngineConfig
from models.cache import KVCache
from workers.comm import DictRendezvous
from workers.memory import GiB, Share, _cgroup_limit, device_memory, fit_kv_blocks, pool_blocks

CPU = torch.device("cpu")


def test_pool_blocks_split_a_device_and_take_the_smallest_rank():
    """Ranks on one device split its budget, less what each draws from it besides its pool (a CPU rank's host tier);
    every rank takes the smallest rank's pool; the fixed extra slots come off each rank's share first."""
    slot, bs = 1000, 16
    block = slot * bs

    def pool(*shares, extra=0):
        return pool_blocks([Share(*s) for s in shares], slot, bs, extra, 0.9)

    assert pool((100 * block, "a")) == 100
    assert pool((100 * block + 5 * slot, "a"), extra=5) == 100
    assert pool((100 * block + 5 * slot - 1, "a"), extra=5) == 99
    assert pool((100 * block, "a"), (100 * block, "a")) == 50                 # one device, two ranks
    assert pool((100 * block, "a"), (100 * block, "b")) == 100                # a device each
    # the third rank's device holds the least: 90 blocks on "c"; "a" is shared by two: 120 / 2 = 60 each
    assert pool((120 * block, "a"), (120 * block, "a"), (90 * block, "c")) == 60
    # two ranks on a host, each with a host tier of 10 blocks' bytes: (100 - 2 * 10) / 2 each
    assert pool((100 * block, "h", 10 * block), (100 * block, "h", 10 * block)) == 40


def test_no_room_for_a_block_names_the_field():
    with pytest.raises(ValueError, match=r"'gpu_memory_utilization' \(0.8\) leaves no room for the KV cache.*rank 1's"
                                         r" device has -0.50 GiB"):
        pool_blocks([Share(GiB, "a"), Share(-GiB // 2, "b")], 1000, 16, 0, 0.8)
    # a small budget that holds a block but not the fixed slots as well: the message gives both, in MiB
    with pytest.raises(ValueError, match=r"has 0.29 MiB for it \(shared by 1 rank\(s\)\), and a rank's cache needs "
                                         r"0.38 MiB of fixed slots and 0.06 MiB a block of 16 tokens"):
        pool_blocks([Share(300_000, "a")], 4000, 16, 100, 0.5)


def test_cgroup_limit_bounds_the_host(tmp_path):
    assert _cgroup_limit(str(tmp_path)) is None                             # no cgroup files: no limit
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("123\n")
    assert _cgroup_limit(str(tmp_path)) is None
    (tmp_path / "memory.max").write_text(f"{8 * GiB}\n")
    assert _cgroup_limit(str(tmp_path)) == (8 * GiB, 123)


def test_device_memory_reads_the_host_or_the_override(monkeypatch):
    monkeypatch.delenv("GLMSERVE_DEVICE_MEMORY", raising=False)
    free, total = device_memory(CPU)
    assert 0 < free <= total                                      # /proc/meminfo: MemAvailable, MemTotal
    monkeypatch.setenv("GLMSERVE_DEVICE_MEMORY", "1.5,4")
    assert device_memory(CPU) == (3 * GiB // 2, 4 * GiB)
    for bad in ("lots", "4.01,0.02", "-1,4", "0,0"):
        monkeypatch.setenv("GLMSERVE_DEVICE_MEMORY", bad)
        with pytest.raises(ValueError, match=f"GLMSERVE_DEVICE_MEMORY must be 'FREE,TOTAL' in GiB.*got '{bad}'"):
            device_memory(CPU)


def test_ranks_agree_through_the_rendezvous(monkeypatch, tiny_config):
    """Three ranks on one host, each measuring 3 - (1 - 0.5) * 4 = 1 GiB free for the KV, less a host tier each (which
    a CPU device draws from the same memory): each allocates a third of what is left, all alike."""
    monkeypatch.setenv("GLMSERVE_DEVICE_MEMORY", "3,4")
    slot = KVCache.bytes_per_slot(tiny_config, torch.float32)
    host = 64                                   # host-tier slots a rank
    board, out = {}, {}

    def rank(r):
        rdv = DictRendezvous(board, 3, "g/")
        out[r] = fit_kv_blocks(tiny_config, 16, torch.float32, False, CPU, 0.5, 9, host, rdv, r, timeout_s=30)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = ((GiB - 3 * host * slot) // 3 - 9 * slot) // (16 * slot)
    assert out == {0: want, 1: want, 2: want} and want > 0
    # FP8 rows hold more tokens in the same memory
    assert fit_kv_blocks(tiny_config, 16, torch.float32, True, CPU, 0.5, 9) > 3 * want


def test_config_sizes_the_pool_at_start():
    """With ``gpu_memory_utilization`` the config holds no block count (the workers size it) and checks max_model_len
    against the pool once it is known; the fraction is in [0, 1)."""
    cfg = EngineConfig(gpu_memory_utilization=0.9, max_model_len=10**6, kv_cache_tokens=64)   # not refused yet
    assert cfg.num_blocks == 0 and EngineConfig(kv_cache_tokens=64).num_blocks == 4
    cfg.check_pool(10**6 // 16)
    with pytest.raises(ValueError, match=r"'max_model_len' \(1000000\) is more than a worker's KV cache holds "
                                         r"\(gpu_memory_utilization 0.9 leaves room for 16000 tokens\): raise "
                                         "gpu_memory_utilization or lower max_model_len"):
        cfg.check_pool(1000)
    with pytest.raises(ValueError, match=r"kv_cache_tokens in whole blocks: 64 tokens\): raise kv_cache_tokens"):
        EngineConfig(kv_cache_tokens=64, max_model_len=65)
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=rf"field 'gpu_memory_utilization' has an invalid value {bad}: it takes a "
                                             r"fraction in \[0, 1\)"):
            EngineConfig(gpu_memory_utilization=bad)
    graphs = EngineConfig(gpu_memory_utilization=0.9, device="cuda")
    assert graphs.resolved_warmup_tokens(5000) == 5000            # the sized pool's context, given at start
    assert EngineConfig(gpu_memory_utilization=0.9, device="cuda", warmup_tokens=64).resolved_warmup_tokens(
        5000) == 64


def test_cli_flag_reaches_the_config():
    from cluster.cli import _engine_config, parser

    a = parser().parse_args(["generate", "hi", "--gpu-memory-utilization", "0.85"])
    assert _engine_config(a).gpu_memory_utilization == 0.85


def test_ingress_asks_the_coordinator_for_a_sized_context():
    """Where the pool is sized to memory the ingress cannot know the context length: it asks the coordinator once
    (its scheduler's max_model_len), then checks prompts against it."""
    pytest.importorskip("ray")
    from cluster import serve as serve_mod

    calls = []

    async def info():
        calls.append(1)
        return {"max_model_len": 5000}

    ing = types.SimpleNamespace(max_model_len=None, max_prompt_chars=None, longest_token=7,
                                coord=types.SimpleNamespace(info=types.SimpleNamespace(remote=info)))
    ing._set_limits = lambda context: serve_mod.OpenAIIngress._set_limits(ing, context)
    for _ in range(2):
        asyncio.run(serve_mod.OpenAIIngress._limits(ing))
    assert (ing.max_model_len, ing.max_prompt_chars, len(calls)) == (5000, 35000, 1)
