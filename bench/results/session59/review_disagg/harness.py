"""In-process drivers for the review's scripts: the real ``Coordinator`` (decode side) and a real prefill
``Coordinator`` (``exports=True``) on the embedded tiny model, without Ray — each on a ``LocalExecutor`` — and a
stand-in for Serve's streaming handle to the prefill tier (``prefill_tier.options(stream=True).prefill.remote``)
that runs the prefill replica's ``Coordinator.prefill`` generator in the same event loop, as Serve would run it in the
prefill replica (a ``cancel()`` cancels it there, as Serve's cancellation does).

Nothing here changes the code under review: the only override is ``_build_group`` (a local executor instead of a Ray
worker group) — everything ``Coordinator.generate`` / ``_prefilled`` / ``prefill`` do is theirs.
"""

from __future__ import annotations

import asyncio
import os
import sys

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, "/work/main")

import torch  # noqa: E402

from cluster.config import DEFAULT_MODEL  # noqa: E402
from cluster.coordinator import Coordinator  # noqa: E402
from cluster.engine import LocalExecutor  # noqa: E402

torch.set_num_threads(1)


class _Group(LocalExecutor):
    def __init__(self, runner, num_blocks):
        super().__init__(runner)
        self.num_blocks = num_blocks


class LocalCoordinator(Coordinator):
    """``Coordinator`` with its worker group in this process (one rank)."""

    @staticmethod
    def _build_group(cfg, num_blocks, imports=False):
        from glmkernels import ops
        from models.loader import load_model
        from workers.runner import ModelRunner

        ops.configure(cfg.kernels, cfg.resolved_device(), cfg.kernel_overrides())
        model = load_model(cfg.model, dtype=cfg.resolved_dtype(), device=cfg.resolved_device(), progress=False)
        runner = ModelRunner(model, num_blocks, cfg.block_size, cfg.resolved_dtype(), cfg.resolved_device(),
                             speculative=cfg.speculative_tokens > 0, host_blocks=cfg.host_blocks,
                             kv_fp8=cfg.kv_cache_dtype == "fp8")
        return _Group(runner, num_blocks)


class Stream:
    """What ``handle.options(stream=True).prefill.remote(...)`` returns: an async iterator of the prefill replica's
    ``prefill`` generator, which runs as a task of its own (as in its replica); ``cancel()`` cancels that task."""

    def __init__(self, agen, delay_s: float = 0.0, log: list | None = None):
        self.q: asyncio.Queue = asyncio.Queue()
        self.log = log if log is not None else []
        self.task = asyncio.get_running_loop().create_task(self._run(agen, delay_s))

    async def _run(self, agen, delay_s):
        try:
            if delay_s:
                await asyncio.sleep(delay_s)
            async for item in agen:
                await self.q.put(("item", item))
            await self.q.put(("end", None))
        except asyncio.CancelledError:
            self.log.append("prefill task cancelled")
            await agen.aclose()
            raise
        except BaseException as e:  # noqa: BLE001
            await self.q.put(("error", e))

    async def __anext__(self):
        kind, item = await self.q.get()
        if kind == "end":
            raise StopAsyncIteration
        if kind == "error":
            raise item
        return item

    def cancel(self):
        self.log.append("cancel")
        self.task.cancel()


class Tier:
    """A stand-in for the app's prefill deployment handle over one prefill ``Coordinator`` (``delay_s``: how long a
    replica takes to pick a call up)."""

    def __init__(self, prefill_coord, delay_s: float = 0.0):
        self.coord, self.delay_s, self.calls, self.log = prefill_coord, delay_s, [], []

    def options(self, **kw):
        return self

    @property
    def prefill(self):
        return self

    def remote(self, ids, params, req_id, start=0):
        self.calls.append((req_id, start, len(ids)))
        return Stream(self.coord.prefill(ids, params, req_id, start), self.delay_s, self.log)


ENGINE = {"model": DEFAULT_MODEL, "device": "cpu", "kv_cache_tokens": 4096, "max_model_len": 1024,
          "warmup_tokens": 0}


def make_pair(decode: dict | None = None, prefill: dict | None = None, delay_s: float = 0.0):
    """(decode Coordinator asking the prefill tier, prefill Coordinator, the tier's handle stand-in)."""
    d = {**ENGINE, **(decode or {})}
    p = {**d, **(prefill or {})}
    pre = LocalCoordinator(p, exports=True)
    tier = Tier(pre, delay_s)
    dec = LocalCoordinator(d, prefill=tier, min_prefill_tokens=0, prefill_block=p.get("block_size", 16))
    return dec, pre, tier


def plain(decode: dict | None = None):
    """A single-replica Coordinator (no prefill tier): the oracle."""
    return LocalCoordinator({**ENGINE, **(decode or {})})


async def collect(coord, ids, params, rid):
    """All events of one request through ``Coordinator.generate``."""
    return [ev async for ev in coord.generate(ids, params, rid)]


def tokens(events):
    return [t for ev in events for t in ev.token_ids]


def counters(coord):
    """(free KV blocks, pins, kept blocks, held-by-anyone blocks) of a coordinator's engine, and whether it is idle."""
    e = coord.engine
    pools = [s.pool for s in e.schedulers]
    return {"free": e.num_free_blocks(), "blocks": sum(p.num_blocks for p in pools),
            "pins": sum(len(p._pins) for p in pools), "kept": sum(p.num_kept for p in pools),
            "running": sum(s.num_running for s in e.schedulers), "waiting": sum(s.num_waiting for s in e.schedulers),
            "asking": len(getattr(coord, "_asking", {})), "exports": len(e._exports)}


def shutdown(*coords):
    for c in coords:
        try:
            c.aengine.shutdown()
        except Exception:
            pass
