"""Shared helpers for review 3: a tiny CPU engine, a run loop that fails on hangs, an ingress without Ray."""
from __future__ import annotations

import os
import sys
import types

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


def check(cond: bool, what: str) -> None:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def done() -> None:
    print(f"\n{len(FAILS)} failure(s)")
    for f in FAILS:
        print("  -", f)
    sys.exit(1 if FAILS else 0)


def engine(**kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("warmup_tokens", 0)
    return build_local_engine(EngineConfig(**kw), progress=False)


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def run(eng, reqs: dict, max_steps: int = 3000, aborts: dict | None = None):
    """Add ``reqs`` {id: (ids, params)}; step until all end. Returns ({id: tokens}, {id: (reason, error)}, steps).
    Raises on a hang (max_steps)."""
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
        if not eng.has_work():
            return out, ends, step + 1
    raise TimeoutError(f"not finished after {max_steps} steps: {set(reqs) - set(ends)} live")


def prompt(n: int, seed: int = 0, vocab: int = 6144) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(20, vocab, (n,), generator=g).tolist()


class FakeRequest:
    def __init__(self, body: dict):
        import json
        self._data = json.dumps(body).encode()

    async def body(self) -> bytes:
        return self._data


def ingress(eng, cfg_kw: dict):
    """The real OpenAIIngress code (its methods), without Ray: ``_open`` streams from an AsyncEngine over ``eng``."""
    from cluster.async_engine import AsyncEngine
    from cluster.serve import OpenAIIngress

    class Ing:
        pass

    for name in ("__init__", "_thinking", "_set_limits", "_limits", "completions", "chat_completions", "_truncated",
                 "_max_chars", "_check_ids", "_chat_ids", "_parse", "_tokenizer", "_respond", "_start"):
        setattr(Ing, name, OpenAIIngress.__mro__[1].__dict__[name])
    aeng = AsyncEngine(eng)

    async def _open(self, ids, params, req_id):
        async for ev in aeng.generate(ids, params, req_id):
            yield ev

    Ing._open = _open
    ing = Ing(None, {"device": "cpu", "warmup_tokens": 0, **cfg_kw})
    ing.aeng = aeng
    ing.max_model_len = eng.config.max_model_len       # the scheduler's (as the coordinator reports it)
    ing.max_prompt_chars = ing.max_model_len * ing.longest_token
    return ing


def call(ing, endpoint: str, body: dict):
    """(status, param or body) of one request through the ingress's endpoint."""
    import asyncio
    import json

    from cluster.protocol import ApiError

    async def go():
        fn = ing.completions if endpoint == "completions" else ing.chat_completions
        try:
            resp = await fn(FakeRequest({"model": ing.model_name, **body}))
        except ApiError as e:
            return e.status, {"param": e.param, "message": str(e), "headers": getattr(e, "headers", None)}
        if hasattr(resp, "body_iterator"):
            chunks = [c async for c in resp.body_iterator]
            return 200, b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks).decode()
        return resp.status_code, json.loads(resp.body)

    return asyncio.run(go())
