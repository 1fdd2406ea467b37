"""Shared helpers for the review4 reproductions: a tiny-model engine on CPU and a request runner."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch  # noqa: E402

torch.set_num_threads(1)

from cluster.config import EngineConfig  # noqa: E402
from cluster.local import build_local_engine  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402

FAILS: list[str] = []


def engine(kv_tokens: int = 2048, host: int = 0, caching: bool = True, bs: int = 16, budget: int = 512,
           max_len: int = 512, **kw):
    cfg = EngineConfig(device="cpu", block_size=bs, kv_cache_tokens=kv_tokens, host_kv_cache_tokens=host,
                       prefix_caching=caching, max_num_batched_tokens=budget, warmup_tokens=0, max_model_len=max_len,
                       **kw)
    eng, _ = build_local_engine(cfg, progress=False)
    return eng


def ids(n: int, seed: int, vocab: int = 1000) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(40, vocab, (n,), generator=g).tolist()


def run(eng, reqs: dict) -> dict:
    """{rid: (prompt, params)} -> {rid: dict(tokens, cached, prompt_lps, logprobs)}; all added at once."""
    out = {rid: {"tokens": [], "cached": None, "prompt_lps": None, "lps": []} for rid in reqs}
    for rid, (p, params) in reqs.items():
        eng.add_request(p, params, rid)
    while eng.has_work():
        for ev in eng.step():
            assert ev.error is None, ev.error
            o = out[ev.req_id]
            o["tokens"] += ev.token_ids
            o["lps"] += [lp.logprob for lp in (ev.logprobs or [])]
            if getattr(ev, "prompt_logprobs", None) is not None:
                o["prompt_lps"] = ev.prompt_logprobs
            o["cached"] = ev.num_cached_tokens
    return out


def check(cond: bool, what: str) -> None:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def done() -> None:
    print(f"\n{len(FAILS)} failure(s)" + (": " + "; ".join(FAILS) if FAILS else ""))
    sys.exit(1 if FAILS else 0)
