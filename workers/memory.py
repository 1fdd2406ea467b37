"""The KV pool sized to memory (``gpu_memory_utilization``): what a worker's device has left once its weights and comm
buffers are in place.

The fraction is of the device's whole memory, for everything that stays (weights, comm buffers, KV cache), as
SGLang's ``mem_fraction_static``: the pool takes ``free - (1 - fraction) * total`` bytes, measured after the load, and
the rest of the device is left for activations, CUDA graphs and the allocator's slack. Ranks that share a device (ipc
tests on one GPU; processes on one CPU host) split their device's share; every rank of a group takes the smallest
pool any rank can hold, so the ranks' schedulers are alike.
"""

from __future__ import annotations

import os
import socket

import torch

from models.cache import KVCache
from models.config import ModelConfig
from workers.comm import Rendezvous

GiB = 1 << 30
FAKE_ENV = "GLMSERVE_DEVICE_MEMORY"   # "FREE,TOTAL" in GiB: pretend the device has this (tests; planning a pool)


def device_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of ``device``: the GPU's (``cudaMemGetInfo``: every process's use counts), or for a CPU
    the host's (``MemAvailable``, ``MemTotal``). ``GLMSERVE_DEVICE_MEMORY=FREE,TOTAL`` (GiB) overrides both."""
    fake = os.environ.get(FAKE_ENV)
    if fake:
        try:
            free, total = (float(x) for x in fake.split(","))
        except ValueError:
            raise ValueError(f"{FAKE_ENV} must be 'FREE,TOTAL' in GiB, got {fake!r}") from None
        return int(free * GiB), int(total * GiB)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            info[name] = int(value.split()[0]) * 1024
    return info["MemAvailable"], info["MemTotal"]


def device_key(device: torch.device) -> str:
    """Names the memory ``device`` draws on, alike for every rank that shares it."""
    if device.type == "cuda":
        return f"{socket.gethostname()}/cuda/{torch.cuda.get_device_properties(device).uuid}"
    return f"{socket.gethostname()}/host"


def kv_budget(device: torch.device, fraction: float) -> int:
    """Bytes the fraction leaves for the KV pool on ``device`` now (may be ≤ 0)."""
    free, total = device_memory(device)
    return int(free - (1.0 - fraction) * total)


def kv_blocks(budget: int, block_bytes: int, reserved: int = 0) -> int:
    """Whole blocks of ``block_bytes`` in ``budget`` bytes once ``reserved`` (fixed extras of the cache) are taken."""
    return max(0, (budget - reserved) // block_bytes)


def fit_kv_blocks(config: ModelConfig, block_size: int, dtype: torch.dtype, fp8: bool, device: torch.device,
                  fraction: float, extra_slots: int, host_bytes: int = 0, rendezvous: Rendezvous | None = None,
                  rank: int = 0, timeout_s: float = 60.0) -> int:
    """The KV blocks this worker (and, through ``rendezvous``, every rank of its group) allocates. ``extra_slots``:
    the cache's slots past the pool (drafts' scratch, the pad slot); ``host_bytes``: the host tier's size, which a CPU
    device draws from the same memory. Every rank measures before any allocates (each waits for all shares)."""
    budget = kv_budget(device, fraction) - (host_bytes if device.type == "cpu" else 0)
    shares = [(budget, device_key(device))]
    if rendezvous is not None and rendezvous.world_size > 1:
        rendezvous.publish(f"kv-memory/{rank}", shares[0])
        shares = [rendezvous.wait(f"kv-memory/{r}", timeout_s) for r in range(rendezvous.world_size)]
    return pool_blocks(shares, KVCache.bytes_per_slot(config, dtype, fp8), block_size, extra_slots, fraction)


def pool_blocks(shares: list[tuple[int, str]], slot_bytes: int, block_size: int, extra_slots: int,
                fraction: float) -> int:
    """The blocks every rank holds, from each rank's (budget bytes, device key): a device's budget split among the
    ranks on it, the smallest rank's pool for all. Raises ``ValueError`` naming ``gpu_memory_utilization`` when a
    rank has no room for one block."""
    sharing = {k: sum(1 for _, other in shares if other == k) for _, k in shares}
    fits = [kv_blocks(b // sharing[k], slot_bytes * block_size, slot_bytes * extra_slots) for b, k in shares]
    worst = min(range(len(fits)), key=fits.__getitem__)
    if fits[worst] < 1:
        budget, key = shares[worst]
        raise ValueError(
            f"engine config field 'gpu_memory_utilization' ({fraction}) leaves no room for the KV cache: with the "
            f"weights loaded, rank {worst}'s device has {budget / GiB:.2f} GiB for it (shared by {sharing[key]} "
            f"rank(s)) and a block of {block_size} tokens needs {slot_bytes * block_size / 2**20:.2f} MiB; raise "
            "gpu_memory_utilization, or set it to 0 and size kv_cache_tokens")
    return fits[worst]
