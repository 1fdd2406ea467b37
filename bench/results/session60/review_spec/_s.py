"""Shared helpers of the speculative-decoding review (not a check itself): the embedded tiny model (fp32, CPU) in this
process, engines built as ``cluster/local.py`` builds them (ModelRunner + SchedulerConfig + Engine, with the tokenizer's
text, special ids and guides), optionally several ranks in one process (each rank a whole-model runner: dp attention
without collectives), a step loop that records every event, and the idle-state checks."""
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
_TOK = None


def model():
    global _MODEL
    if _MODEL is None:
        from models.loader import load_model
        _MODEL = load_model(DEFAULT_MODEL, dtype=torch.float32, progress=False)
    return _MODEL


def tok():
    global _TOK
    if _TOK is None:
        from cluster.local import load_tokenizer
        _TOK = load_tokenizer(DEFAULT_MODEL)
    return _TOK


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


class ReplicaRanks:
    """A multi-rank engine's executor in one process: each rank a whole-model runner of its own."""

    def __init__(self, runners):
        self.runners = runners
        self.runner = runners[0]

    def execute(self, steps):
        return [r.execute(s) for r, s in zip(self.runners, steps)]

    def recover(self):
        for r in self.runners:
            r.reset()


def make_engine(k: int = 0, blocks: int = 64, bs: int = 16, caching: bool = True, budget: int = 512, seqs: int = 8,
                mml: int | None = None, graphs: bool = False, lookahead: bool = True, policy: str = "fcfs",
                ranks: int = 1, text: bool = True, eos=None) -> Engine:
    from cluster.detok import TextOf
    from cluster.local import guides
    from workers.runner import ModelRunner
    m = model()
    t = tok() if text else None
    runners = [ModelRunner(m, blocks, bs, torch.float32, speculative=k > 0, graphs="eager" if graphs else "off")
               for _ in range(ranks)]
    if eos is None:
        eos = sorted(set(m.config.eos_token_ids) | set(t.eos_token_ids if t else ()))
    cfg = SchedulerConfig(num_blocks=blocks, block_size=bs, max_model_len=mml or blocks * bs,
                          vocab_size=m.config.vocab_size, eos_token_ids=tuple(eos), max_num_seqs=seqs,
                          max_num_batched_tokens=max(budget, seqs), prefix_caching=caching, policy=policy)
    ex = LocalExecutor(runners[0]) if ranks == 1 else ReplicaRanks(runners)
    return Engine(ex, cfg, TextOf(t) if t else None, num_ranks=ranks, span=ranks == 1, speculative_tokens=k,
                  graphs=graphs, lookahead=lookahead, special_ids=t.special_ids if t else (),
                  guides=guides(t, m.config, cfg) if t else None)


def ids(n: int, seed: int, lo: int = 40) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, model().config.vocab_size, (n,), generator=g).tolist()


def new_out():
    return dict(tokens=[], lps=[], tops=[], text="", reason=None, n_out=None, n_prompt=None, events=0, stop_str=None,
                error=None, cached=None)


def collect(eng: Engine, reqs: dict | None = None, schedule: dict | None = None, max_steps: int = 20000,
            on_step=None) -> dict:
    """reqs: {rid: (ids, params)} added first; schedule: {step: [(rid, ids, params) | ('abort', rid)]}; on_step(eng, i)
    called before each step. Returns {rid: dict(tokens, lps, tops, text, reason, n_out, stop_str, error ...)}."""
    out: dict = {}

    def add(rid, p, params):
        out[rid] = new_out()
        eng.add_request(p, params, rid)

    for rid, (p, params) in (reqs or {}).items():
        add(rid, p, params)
    step = 0
    last = max(schedule) if schedule else -1
    while eng.has_work() or step <= last:
        for item in (schedule or {}).get(step, []):
            if item[0] == "abort":
                ev = eng.abort(item[1])
                if ev is not None:
                    o = out[item[1]]
                    o["reason"], o["aborted_at"] = ev.finish_reason, len(o["tokens"])
            else:
                add(*item)
        if on_step:
            on_step(eng, step)
        for ev in eng.step():
            o = out[ev.req_id]
            o["events"] += 1
            o["tokens"] += ev.token_ids
            o["lps"] += [lp.logprob for lp in ev.logprobs]
            o["tops"] += [tuple(lp.top) for lp in ev.logprobs]
            o["text"] += ev.text
            if ev.error:
                o["error"] = ev.error
            if ev.finished:
                o["reason"], o["n_out"], o["stop_str"] = ev.finish_reason, ev.num_output_tokens, ev.stop_str
                o["n_prompt"], o["cached"] = ev.num_prompt_tokens, ev.num_cached_tokens
        step += 1
        if step > max_steps:
            raise RuntimeError("too many steps")
    return out


def idle(eng: Engine) -> list[str]:
    """What differs from an idle engine: blocks held, live requests, engine maps, runners' requests."""
    bad = []
    for r, s in enumerate(eng.schedulers):
        p = s.pool
        if p.num_free != p.num_blocks:
            bad.append(f"rank {r}: {p.num_blocks - p.num_free} blocks not free")
        if any(p._refs):
            bad.append(f"rank {r}: refs left")
        if p._pins:
            bad.append(f"rank {r}: pins {dict(p._pins)}")
        if s.has_unfinished():
            bad.append(f"rank {r}: live requests {s.live_ids()}")
    for name in ("_streams", "_rank_of", "_unsent", "_guides", "_exports"):
        if getattr(eng, name):
            bad.append(f"engine {name} not empty: {list(getattr(eng, name))[:4]}")
    runners = getattr(eng.executor, "runners", [eng.executor.runner])
    # the runners forget ended requests with the next step that carries ``finished``: run one empty step
    eng.step()
    for r, run in enumerate(runners):
        if run.requests:
            bad.append(f"runner {r} still holds {list(run.requests)[:4]}")
    return bad
