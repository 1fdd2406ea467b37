"""Shared helpers for the session 57 metrics review (not a finding by itself): the real ``Coordinator`` in-process
(its ``_build_group`` returns a one-rank LocalExecutor, or a ProcessWorkerGroup), Prometheus parsing, checks."""
from __future__ import annotations

import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../.."))
sys.path.insert(0, ROOT)
os.chdir(ROOT)

import torch  # noqa: E402

torch.set_num_threads(1)

from cluster.config import EngineConfig  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402

TINY = os.path.join(ROOT, "models", "tiny")
FAILS: list[str] = []
T0 = time.time()


def check(cond: bool, what: str) -> bool:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


def done() -> None:
    print(f"\n{len(FAILS)} failure(s) in {time.time() - T0:.1f} s")
    for f in FAILS:
        print("  -", f)
    sys.exit(1 if FAILS else 0)


def coordinator(process: bool = False, ckw: dict | None = None, **kw):
    """The real Coordinator.__init__, its worker group a LocalExecutor (one rank) or a ProcessWorkerGroup."""
    from cluster.coordinator import Coordinator

    class LocalCoordinator(Coordinator):
        @staticmethod
        def _resolve(cfg):
            return cfg

        @staticmethod
        def _build_group(cfg, num_blocks, imports=False):
            if process:
                from cluster.workers import ProcessWorkerGroup

                return ProcessWorkerGroup(cfg, num_blocks, setup_timeout_s=60)
            from cluster.engine import LocalExecutor
            from glmkernels import ops
            from models.loader import load_model
            from workers.runner import ModelRunner

            ops.configure(cfg.kernels, "cpu", cfg.kernel_overrides())
            model = load_model(cfg.model, dtype=cfg.resolved_dtype(), device="cpu", progress=False)
            runner = ModelRunner(model, num_blocks, cfg.block_size, cfg.resolved_dtype(), "cpu",
                                 speculative=cfg.speculative_tokens > 0, graphs="off", pieces=None)
            ex = LocalExecutor(runner)
            ex.num_blocks = num_blocks
            return ex

    kw.setdefault("device", "cpu")
    kw.setdefault("dtype", "float32")
    kw.setdefault("warmup_tokens", 0)
    kw.setdefault("log_stats_interval_s", 0)
    kw.setdefault("model", TINY)
    return LocalCoordinator(EngineConfig(**kw).to_dict(), **(ckw or {}))


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def prompt(n: int, seed: int = 0, vocab: int = 6144) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(20, vocab, (n,), generator=g).tolist()


async def consume(coord, ids, params, rid, stop_after: int | None = None):
    """(tokens, last event) of one request through Coordinator.generate; ``stop_after``: leave after that many
    tokens (a client disconnect: the generator is closed)."""
    toks, last = [], None
    gen = coord.generate(ids, params, rid)
    try:
        async for ev in gen:
            toks += ev.token_ids
            last = ev
            if stop_after is not None and len(toks) >= stop_after:
                break
    finally:
        await gen.aclose()
    return toks, last


def families(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(text: str, name: str, **labels) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    tot = 0.0
    for f in families(text).values():
        for s in f.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                tot += s.value
    return tot
