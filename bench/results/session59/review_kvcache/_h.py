"""Shared helpers of the kvcache review: the embedded tiny model (fp32, CPU) in-process, engines built as the tests
build them (ModelRunner + SchedulerConfig + Engine), a step loop that records events, pool idle-state checks."""
from __future__ import annotations

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../.."))
sys.path.insert(0, ROOT)
os.chdir(ROOT)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch  # noqa: E402

torch.set_num_threads(1)

from cluster.config import DEFAULT_MODEL  # noqa: E402
from cluster.engine import Engine, LocalExecutor  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402
from scheduler.scheduler import SchedulerConfig  # noqa: E402

FAILS: list[str] = []
_MODEL = None


def model():
    global _MODEL
    if _MODEL is None:
        from models.loader import load_model
        _MODEL = load_model(DEFAULT_MODEL, dtype=torch.float32, progress=False)
    return _MODEL


def check(cond: bool, what: str) -> bool:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


def done() -> None:
    print(f"\n{len(FAILS)} failure(s)")
    for f in FAILS:
        print("  -", f)
    sys.exit(1 if FAILS else 0)


def make_engine(caching: bool = True, k: int = 0, budget: int = 512, blocks: int = 64, bs: int = 16, host: int = 0,
                fp8: bool = False, seqs: int = 8, mml: int | None = None, graphs: bool = False,
                lookahead: bool = True, eos=(), ranks: int = 1) -> Engine:
    from workers.runner import ModelRunner
    m = model()
    runners = [ModelRunner(m, blocks, bs, torch.float32, speculative=k > 0, host_blocks=host if caching else 0,
                           kv_fp8=fp8, graphs="eager" if graphs else "off") for _ in range(ranks)]
    cfg = SchedulerConfig(num_blocks=blocks, block_size=bs, max_model_len=mml or blocks * bs,
                          vocab_size=m.config.vocab_size, eos_token_ids=tuple(eos), max_num_seqs=seqs,
                          max_num_batched_tokens=max(budget, seqs), prefix_caching=caching,
                          host_blocks=host if caching else 0)
    ex = LocalExecutor(runners[0]) if ranks == 1 else ReplicaRanks(runners)
    return Engine(ex, cfg, speculative_tokens=k, graphs=graphs, lookahead=lookahead, num_ranks=ranks, span=ranks == 1)


class ReplicaRanks:
    """A multi-rank engine's executor in one process: each rank a whole-model runner of its own (its own KV pool and
    host tier; no collectives — the rows of a rank are computed by the full model, as dp attention would)."""

    def __init__(self, runners):
        self.runners = runners
        self.runner = runners[0]

    def execute(self, steps):
        return [r.execute(s) for r, s in zip(self.runners, steps)]

    def recover(self):
        for r in self.runners:
            r.reset()


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def ids(n: int, seed: int, lo: int = 40) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, model().config.vocab_size, (n,), generator=g).tolist()


def run(eng: Engine, reqs: dict, max_steps: int = 5000, usage: bool = False):
    """Add ``reqs`` {id: (ids, params)} and step until all end; returns {id: tokens} (and with ``usage`` also
    {id: num_cached_tokens} as the stream reports it)."""
    out = {r: [] for r in reqs}
    cached = {}
    for rid, (p, params) in reqs.items():
        eng.add_request(p, params, rid)
        if usage:
            cached[rid] = lambda rid=rid: eng._streams[rid]
    streams = {rid: eng._streams[rid] for rid in reqs}
    for _ in range(max_steps):
        if not eng.has_unfinished():
            break
        for ev in eng.step():
            assert ev.error is None, ev.error
            out[ev.req_id] += ev.token_ids
            if ev.finished and usage:
                cached[ev.req_id] = ev.num_cached_tokens if hasattr(ev, "num_cached_tokens") else \
                    streams[ev.req_id].request.num_cached_tokens
    else:
        raise RuntimeError("did not finish")
    return (out, cached) if usage else out


def pool_idle(eng: Engine) -> list[str]:
    """What differs from an idle pool: held blocks, refs, kept blocks, keeps, pins, pending copies."""
    bad = []
    for r, s in enumerate(eng.schedulers):
        p = s.pool
        if p.num_free != p.num_blocks:
            bad.append(f"rank {r}: {p.num_blocks - p.num_free} blocks not free")
        if any(p._refs):
            bad.append(f"rank {r}: refs left {[(b, c) for b, c in enumerate(p._refs) if c]}")
        if p._kept or p._keeps:
            bad.append(f"rank {r}: kept {len(p._kept)} keeps {len(p._keeps)}")
        if p._pins:
            bad.append(f"rank {r}: pins {dict(p._pins)}")
        free = set(p._free_ids) | set(p._idle) | set(p._kept)
        if len(free) != p.num_blocks or len(p._free_ids) + len(p._idle) + len(p._kept) != p.num_blocks:
            bad.append(f"rank {r}: free structures overlap / miss blocks")
        if s.has_unfinished():
            bad.append(f"rank {r}: live requests {s.live_ids()}")
    return bad
