"""Shared helpers for the session 56 load review: a tiny CPU engine, a step loop that fails on hangs, leak checks,
an ingress without Ray (the real OpenAIIngress methods over an AsyncEngine), as session 55 review 3's _h3.py."""
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
from cluster.local import build_local_engine  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402
from scheduler.scheduler import AdmissionError  # noqa: E402

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


def engine(**kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("warmup_tokens", 0)
    return build_local_engine(EngineConfig(**kw), progress=False)


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def run(eng, reqs: dict, max_steps: int = 3000, aborts: dict | None = None, on_step=None):
    """Add ``reqs`` {id: (ids, params)}; step until all end. Returns ({id: tokens}, {id: (reason, error)}, steps)."""
    out = {r: [] for r in reqs}
    ends = {}
    for rid, (ids, p) in reqs.items():
        eng.add_request(ids, p, rid)
    for step in range(max_steps):
        if aborts and step in aborts:
            for rid in aborts[step]:
                ev = eng.abort(rid)
                if ev is not None:
                    ends[rid] = (ev.finish_reason, ev.error)
        for ev in eng.step():
            if ev.req_id in out:
                out[ev.req_id] += ev.token_ids
                if ev.finished:
                    ends[ev.req_id] = (ev.finish_reason, ev.error)
        if on_step:
            on_step(step)
        if not eng.has_work():
            return out, ends, step + 1
    raise TimeoutError(f"not finished after {max_steps} steps: {set(reqs) - set(ends)} live")


def prompt(n: int, seed: int = 0, vocab: int = 6144) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(20, vocab, (n,), generator=g).tolist()


def leftovers(eng) -> list[str]:
    """What an idle engine still holds (empty: nothing leaked)."""
    bad = []
    runner = eng.executor.runner
    if eng.has_work():
        bad.append("has_work")
    for name in ("_streams", "_rank_of", "_guides", "_unsent", "_exports"):
        if getattr(eng, name):
            bad.append(f"{name}={list(getattr(eng, name))[:5]}")
    if any(eng._forget):
        bad.append(f"_forget={eng._forget}")
    if runner.requests:
        bad.append(f"runner.requests={list(runner.requests)[:5]}")
    for sch in eng.schedulers:
        if sch.live_ids():
            bad.append(f"live={sch.live_ids()[:5]}")
        if sch.pool.num_free != sch.pool.num_blocks:
            bad.append(f"pool {sch.pool.num_free}/{sch.pool.num_blocks} free")
        if sch.pool.num_kept:
            bad.append(f"kept {sch.pool.num_kept}")
    return bad


class FakeRequest:
    def __init__(self, body: dict):
        import json
        self._data = json.dumps(body).encode()

    async def body(self) -> bytes:
        return self._data


def ingress(eng, cfg_kw: dict, aeng=None):
    """The real OpenAIIngress code (its methods), without Ray: ``_open`` streams from an AsyncEngine over ``eng``."""
    from cluster.async_engine import AsyncEngine
    from cluster.serve import OpenAIIngress

    class Ing:
        pass

    for name in ("__init__", "_thinking", "_set_limits", "_limits", "completions", "chat_completions", "_truncated",
                 "_max_chars", "_check_ids", "_chat_ids", "_parse", "_tokenizer", "_respond", "_start"):
        setattr(Ing, name, OpenAIIngress.__mro__[1].__dict__[name])
    aeng = aeng or AsyncEngine(eng)

    async def _open(self, ids, params, req_id):
        async for ev in aeng.generate(ids, params, req_id):
            yield ev

    Ing._open = _open
    ing = Ing(None, {"device": "cpu", "warmup_tokens": 0, **cfg_kw})
    ing.aeng = aeng
    ing.max_model_len = eng.config.max_model_len
    ing.max_prompt_chars = ing.max_model_len * ing.longest_token
    return ing


async def acall(ing, endpoint: str, body: dict):
    """(status, body or error dict) of one request through the ingress's endpoint (inside a running loop)."""
    import json

    from cluster.protocol import ApiError

    fn = ing.completions if endpoint == "completions" else ing.chat_completions
    try:
        resp = await fn(FakeRequest({"model": ing.model_name, **body}))
    except ApiError as e:
        return e.status, {"param": e.param, "message": str(e), "headers": getattr(e, "headers", None)}
    if hasattr(resp, "body_iterator"):
        chunks = [c async for c in resp.body_iterator]
        return 200, b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks).decode()
    return resp.status_code, json.loads(resp.body)
