"""Shared helpers for the review5 (structured output) reproductions: the tiny-model engine on CPU, a runner, and an
independent replay of a request's tokens through a fresh xgrammar matcher."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch  # noqa: E402

torch.set_num_threads(1)

import xgrammar  # noqa: E402

from cluster.config import EngineConfig  # noqa: E402
from cluster.local import build_local_engine  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402,F401

FAILS: list[str] = []
_T0 = time.time()


def engine(**kw):
    cfg = EngineConfig(device="cpu", kv_cache_tokens=kw.pop("kv_cache_tokens", 4096), warmup_tokens=0, **kw)
    return build_local_engine(cfg, progress=False)


def run(eng, reqs: dict, on_step=None) -> dict:
    """{rid: (prompt, params)} -> {rid: dict(ids, text, reason, error, events)}; all added at once."""
    out = {rid: {"ids": [], "text": "", "reason": None, "error": None, "events": []} for rid in reqs}
    for rid, (p, params) in reqs.items():
        eng.add_request(p, params, rid)
    n = 0
    while eng.has_work():
        evs = eng.step()
        n += 1
        for ev in evs:
            o = out[ev.req_id]
            o["ids"] += ev.token_ids
            o["text"] += ev.text
            o["events"].append(ev)
            if ev.finished:
                o["reason"], o["error"] = ev.finish_reason, ev.error
        if on_step:
            on_step(eng, n)
        assert n < 5000, "engine does not finish"
    return out


def replay(eng, compiled_grammar, ids, skip_until=None) -> tuple[int, int | None]:
    """Feed ``ids`` (after the first ``skip_until`` token, if given) to a fresh matcher of ``compiled_grammar``;
    returns (index of the first token the grammar did not allow or -1, whether it terminated)."""
    m = xgrammar.GrammarMatcher(compiled_grammar)
    start = 0
    if skip_until is not None:
        start = ids.index(skip_until) + 1 if skip_until in ids else len(ids)
    for i in range(start, len(ids)):
        if m.is_terminated():
            return i, True
        if not m.accept_token(ids[i]):
            return i, m.is_terminated()
    return -1, m.is_terminated()


def check(cond: bool, what: str) -> bool:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


def done() -> None:
    print(f"\n{len(FAILS)} failure(s) in {time.time() - _T0:.1f} s" + (": " + "; ".join(FAILS) if FAILS else ""))
    sys.exit(1 if FAILS else 0)
