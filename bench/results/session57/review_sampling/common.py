"""Shared helpers for the review scripts (not a check itself)."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

torch.set_num_threads(1)

from cluster.config import EngineConfig  # noqa: E402
from cluster.local import build_local_engine  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402

_CACHE = {}


def engine(**kw):
    kw.setdefault("kv_cache_tokens", 4096)
    kw.setdefault("warmup_tokens", 0)
    kw.setdefault("device", "cpu")
    eng, tok = build_local_engine(EngineConfig(**kw), progress=False)
    return eng, tok


def collect(eng, reqs: dict, schedule=None, max_steps=10000):
    """reqs: {rid: (ids, params)}; schedule: {step_index: [(rid, ids, params)] to add / ('abort', rid)}.
    Returns {rid: dict(tokens, lps, tops, text, reason, n_out, events)}."""
    out = {}

    def add(rid, ids, params):
        eng.add_request(ids, params, rid)
        out[rid] = dict(tokens=[], lps=[], tops=[], text="", reason=None, n_out=None, events=0, stop_str=None,
                        error=None)

    for rid, (ids, params) in reqs.items():
        add(rid, ids, params)
    step = 0
    while eng.has_unfinished() or (schedule and any(s >= step for s in schedule)):
        for item in (schedule or {}).get(step, []):
            if item[0] == "abort":
                ev = eng.abort(item[1])
                if ev is not None:
                    out[item[1]]["reason"] = ev.finish_reason
            else:
                add(*item)
        for ev in eng.step():
            o = out[ev.req_id]
            o["events"] += 1
            o["tokens"] += ev.token_ids
            o["lps"] += [lp.logprob for lp in ev.logprobs]
            o["tops"] += [lp.top for lp in ev.logprobs]
            o["text"] += ev.text
            if ev.error:
                o["error"] = ev.error
            if ev.finished:
                o["reason"], o["n_out"], o["stop_str"] = ev.finish_reason, ev.num_output_tokens, ev.stop_str
        step += 1
        if step > max_steps:
            raise RuntimeError("too many steps")
    return out


def prompts(n, vocab=6144, seed=0, lo=4, hi=60):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(40, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def state(eng):
    """What should be empty when nothing runs."""
    sch = eng.scheduler
    runner = eng.executor.runner
    return dict(free=eng.num_free_blocks(), num_blocks=sch.pool.num_blocks, running=sch.num_running,
                waiting=sch.num_waiting, live=len(sch.live_ids()), streams=len(eng._streams),
                rank_of=len(eng._rank_of), unsent=len(eng._unsent), guides=len(eng._guides),
                forget=sum(len(f) for f in eng._forget), runner_requests=len(runner.requests))
