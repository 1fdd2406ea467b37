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
from typing import NamedTuple

import torch

from models.cache import KVCache
from models.config import ModelConfig
from workers.comm import Rendezvous

GiB = 1 << 30
FAKE_ENV = "GLMSERVE_DEVICE_MEMORY"   # "FREE,TOTAL" in GiB: pretend the device has this (tests; planning a pool)


def device_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of ``device``: the GPU's (``cudaMemGetInfo``: every process's use counts), or for a CPU
    the host's (``MemAvailable``, ``MemTotal``), within the process's cgroup limit where one is set (a container).
    ``GLMSERVE_DEVICE_MEMORY=FREE,TOTAL`` (GiB) overrides both."""
    fake = os.environ.get(FAKE_ENV)
    if fake:
        try:
            free, total = (float(x) for x in fake.split(","))
        except ValueError:
            raise ValueError(f"{FAKE_ENV} must be 'FREE,TOTAL' in GiB, got {fake!r}") from None
        if not 0 <= free <= total or total <= 0:
            raise ValueError(f"{FAKE_ENV} must be 'FREE,TOTAL' in GiB with 0 <= FREE <= TOTAL, got {fake!r}")
        return int(free * GiB), int(total * GiB)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            info[name] = int(value.split()[0]) * 1024
    free, total = info["MemAvailable"], info["MemTotal"]
    limit = _cgroup_limit()
    if limit is not None:
        total, free = min(total, limit[0]), min(free, max(0, limit[0] - limit[1]))
    return free, total


def _cgroup_limit(root: str = "/sys/fs/cgroup") -> tuple[int, int] | None:
    """(limit, in use) bytes of this process's cgroup (v2), or None where it sets no limit."""
    try:
        with open(f"{root}/memory.max") as f:
            limit = f.read().strip()
        with open(f"{root}/memory.current") as f:
            current = int(f.read())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else (int(limit), current)


def device_key(device: torch.device) -> str:
    """Names the memory ``device`` draws on, alike for every rank that shares it."""
    if device.type == "cuda":
        return f"{socket.gethostname()}/cuda/{torch.cuda.get_device_properties(device).uuid}"
    return f"{socket.gethostname()}/host"


def kv_budget(device: torch.device, fraction: float) -> int:
    """Bytes the fraction leaves for the KV pool on ``device`` now (may be ≤ 0)."""
    free, total = device_memory(device)
    return int(free - (1.0 - fraction) * total)


class Share(NamedTuple):
    """A rank's reading: the bytes the fraction leaves on its device, the device's name, and what the rank draws from
    that memory besides its pool (a CPU rank's host tier)."""

    budget: int
    key: str
    other: int = 0


def fit_kv_blocks(config: ModelConfig, block_size: int, dtype: torch.dtype, fp8: bool, device: torch.device,
                  fraction: float, extra_slots: int, host_slots: int = 0, rendezvous: Rendezvous | None = None,
                  rank: int = 0, timeout_s: float = 60.0) -> int:
    """The KV blocks this worker (and, through ``rendezvous``, every rank of its group) allocates. ``extra_slots``:
    the cache's slots past the pool (drafts' scratch, the pad slot); ``host_slots``: the host tier's, which a CPU
    device draws from the same memory. Every rank measures before any allocates (each waits for all shares)."""
    slot = KVCache.bytes_per_slot(config, dtype, fp8)
    share = Share(kv_budget(device, fraction), device_key(device), slot * host_slots if device.type == "cpu" else 0)
    shares = [share]
    if rendezvous is not None and rendezvous.world_size > 1:
        rendezvous.publish(f"kv-memory/{rank}", tuple(share))
        shares = [Share(*rendezvous.wait(f"kv-memory/{r}", timeout_s)) for r in range(rendezvous.world_size)]
    return pool_blocks(shares, slot, block_size, extra_slots, fraction)


def pool_blocks(shares: list[Share], slot_bytes: int, block_size: int, extra_slots: int, fraction: float) -> int:
    """The blocks every rank holds, from each rank's ``Share``: a device's budget, less what its ranks draw besides
    their pools, split among those ranks; each rank's pool also holds ``extra_slots`` slots; the smallest rank's pool
    for all. Raises ``ValueError`` naming ``gpu_memory_utilization`` when a rank has no room for one block."""
    ranks = {s.key: [o for o in shares if o.key == s.key] for s in shares}
    room = [(s.budget - sum(o.other for o in ranks[s.key])) // len(ranks[s.key]) for s in shares]
    fits = [max(0, (r - slot_bytes * extra_slots) // (slot_bytes * block_size)) for r in room]
    worst = min(range(len(fits)), key=fits.__getitem__)
    if fits[worst] < 1:
        s = shares[worst]
        raise ValueError(
            f"engine config field 'gpu_memory_utilization' ({fraction}) leaves no room for the KV cache: with the "
            f"weights loaded, rank {worst}'s device has {_size(s.budget)} for it (shared by {len(ranks[s.key])} "
            f"rank(s){f', less {_size(s.other)} of host tier each' if s.other else ''}), and a rank's cache needs "
            f"{_size(slot_bytes * extra_slots)} of fixed slots and {_size(slot_bytes * block_size)} a block of "
            f"{block_size} tokens; raise gpu_memory_utilization, or set it to 0 and size kv_cache_tokens")
    return fits[worst]


def _size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB // 10 else f"{n / 2**20:.2f} MiB"
