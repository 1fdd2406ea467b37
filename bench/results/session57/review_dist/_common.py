"""Shared helpers for the multi-rank correctness review (session 57): build a single-process engine and an N-rank
ProcessWorkerGroup engine from the same EngineConfig (CPU, fp32, reference kernels, models/tiny), run requests, and
compare tokens + logprobs."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# the code under review: GLM_ROOT (a clean export of 0869402: `git archive 0869402 | tar -x -C /tmp/glm_0869402`, since
# others edit the working tree meanwhile), else this checkout
ROOT = Path(os.environ.get("GLM_ROOT") or Path(__file__).resolve().parents[4])
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

torch.set_num_threads(1)

from cluster.config import EngineConfig  # noqa: E402
from cluster.engine import Engine  # noqa: E402
from cluster.local import build_local_engine, guides, load_tokenizer, scheduler_config  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402

TINY = str(ROOT / "models" / "tiny")


def config(n: int = 1, **kw) -> EngineConfig:
    base = dict(model=TINY, device="cpu", dtype="float32", kernels="reference", num_workers=n,
                kv_cache_tokens=64 * 16, max_num_batched_tokens=64, max_num_seqs=16, moe="tp", comm="ipc")
    base.update(kw)
    return EngineConfig(**base)


def single(cfg: EngineConfig, **engine_kw) -> Engine:
    cfg = replace(cfg, num_workers=1)
    eng, _ = build_local_engine(cfg, progress=False)
    for k, v in engine_kw.items():
        setattr(eng, k, v)
    return eng


class Group:
    """An N-rank engine over spawned processes (ProcessWorkerGroup); a context manager that shuts the ranks down."""

    def __init__(self, cfg: EngineConfig, span: bool = True):
        from cluster.workers import ProcessWorkerGroup

        self.cfg = cfg
        mc = ModelConfig.from_json(cfg.model)
        tok = load_tokenizer(cfg.model)
        self.group = ProcessWorkerGroup(cfg, cfg.num_blocks)
        sched = scheduler_config(cfg, mc, tok, cfg.num_blocks)
        decode = (lambda ids: tok.decode(ids, skip_special_tokens=True)) if tok else None
        self.engine = Engine(self.group, sched, decode, num_ranks=cfg.num_workers, span=span,
                             speculative_tokens=cfg.speculative_tokens, graphs=cfg.graphs_mode() != "off",
                             special_ids=tok.special_ids if tok else (),
                             guides=guides(tok, mc, sched), kv_layout=cfg.kv_layout(mc))

    def __enter__(self):
        return self.engine

    def __exit__(self, *exc):
        pids = [p.pid for p in self.group.procs]
        try:
            self.group.shutdown()
        finally:
            for pid in pids:           # only our own rank processes
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass


def run(engine: Engine, reqs: dict, on_step=None) -> dict:
    """{rid: (prompt ids, params)} -> {rid: {"tokens": [...], "lps": [(logprob, top)...], "reason": str}}.
    ``on_step(engine, step_no, events)`` may add or abort requests between steps."""
    out = {}
    for rid, (ids, p) in reqs.items():
        engine.add_request(ids, p, rid)
        out[rid] = {"tokens": [], "lps": [], "reason": None, "error": None}
    n = 0
    while engine.has_work():
        evs = engine.step()
        for ev in evs:
            o = out.setdefault(ev.req_id, {"tokens": [], "lps": [], "reason": None, "error": None})
            o["tokens"] += ev.token_ids
            o["lps"] += [(lp.logprob, tuple(lp.top)) for lp in (ev.logprobs or [])]
            if ev.finished:
                o["reason"], o["error"] = ev.finish_reason, ev.error
        n += 1
        if on_step:
            on_step(engine, n, evs, out)
        if n > 5000:
            raise RuntimeError("no progress")
    return out


def compare(want: dict, got: dict, tol: float = 1e-4, label: str = "") -> list[str]:
    """Differences between two runs (tokens exactly, logprobs within tol, top ids exactly)."""
    bad = []
    worst = 0.0
    for rid, w in want.items():
        g = got.get(rid)
        if g is None:
            bad.append(f"{label}{rid}: missing")
            continue
        if w["tokens"] != g["tokens"]:
            i = next((i for i, (a, b) in enumerate(zip(w["tokens"], g["tokens"])) if a != b),
                     min(len(w["tokens"]), len(g["tokens"])))
            bad.append(f"{label}{rid}: tokens differ at {i}: single {w['tokens'][i:i + 4]} vs group "
                       f"{g['tokens'][i:i + 4]} (len {len(w['tokens'])} vs {len(g['tokens'])})")
            continue
        if w["reason"] != g["reason"] or w["error"] != g["error"]:
            bad.append(f"{label}{rid}: finish {w['reason']}/{w['error']} vs {g['reason']}/{g['error']}")
        for i, ((a, at), (b, bt)) in enumerate(zip(w["lps"], g["lps"])):
            worst = max(worst, abs(a - b))
            if abs(a - b) > tol or [t for t, _ in at] != [t for t, _ in bt]:
                bad.append(f"{label}{rid}: logprob {i}: {a:.6f} vs {b:.6f}, top {at[:2]} vs {bt[:2]}")
                break
        if len(w["lps"]) != len(g["lps"]):
            bad.append(f"{label}{rid}: {len(w['lps'])} vs {len(g['lps'])} logprobs")
    print(f"  {label}compared {len(want)} requests, max |dlogprob| {worst:.2e}, {len(bad)} differences")
    return bad


def prompts(n: int, lo: int = 3, hi: int = 40, seed: int = 0, vocab: int = 6144) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(40, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=2, ignore_eos=True, **kw)


def free_per_rank(engine: Engine) -> list[int]:
    return [s.pool.num_free for s in engine.schedulers]


def blocks_back(engine: Engine) -> tuple[bool, str]:
    """Whether every rank's pool has all its blocks free (cached-but-idle count as free) and nothing is live."""
    free = free_per_rank(engine)
    total = [s.pool.num_blocks for s in engine.schedulers]
    live = [len(s.live_ids()) for s in engine.schedulers]
    ok = free == total and not any(live) and not engine._rank_of
    return ok, f"free {free} of {total}, live {live}, rank_of {len(engine._rank_of)}"


class Timer:
    def __init__(self, what):
        self.what = what

    def __enter__(self):
        self.t = time.monotonic()

    def __exit__(self, *exc):
        print(f"  [{self.what}: {time.monotonic() - self.t:.1f} s]", flush=True)
