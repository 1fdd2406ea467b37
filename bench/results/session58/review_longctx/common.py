"""Shared helpers for the long-context review scripts (session 58). Not a test module."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[4]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

torch.set_num_threads(int(os.environ.get("REVIEW_THREADS", "1")))

from cluster.config import EngineConfig  # noqa: E402
from cluster.local import build_local_engine  # noqa: E402
from models.cache import KVCache, contiguous_batch  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402

MODEL = ROOT / "models" / "tiny"
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


_MODEL = None


def ref_model():
    """The tiny model, fp32, reference kernels (``ops`` is configured by build_local_engine too: call after it or
    configure here)."""
    global _MODEL
    if _MODEL is None:
        from glmkernels import ops
        from models.loader import load_model
        ops.configure("reference", "cpu", {})
        _MODEL = load_model(MODEL, dtype=torch.float32, progress=False)
    return _MODEL


def ref_greedy(prompt: list[int], max_new: int, eos=(), model=None, cache_factory=None) -> list[int]:
    """The model's own greedy loop without the engine: prefill the prompt in one piece into a contiguous KVCache, then
    one token a step; stops at an EOS id (included) unless eos is empty."""
    model = model or ref_model()
    capacity = len(prompt) + max_new + 8
    cache = cache_factory(capacity) if cache_factory else KVCache(model.config, capacity, torch.float32)
    step, pos, out = list(prompt), 0, []
    with torch.no_grad():
        while len(out) < max_new:
            hidden = model(torch.tensor(step), contiguous_batch([(pos, len(step))], capacity), cache)
            pos += len(step)
            step = [int(model.logits(hidden[-1:]).argmax(-1))]
            out += step
            if step[0] in eos:
                break
    return out


def full_recompute_check(prompt: list[int], out: list[int], model=None) -> tuple[list[int], float]:
    """One forward over prompt + out[:-1] (no cache reuse: the whole sequence recomputed); returns the argmax at each
    position from len(prompt)-1 on (== out for a consistent greedy run), and the smallest top-1/top-2 logit margin."""
    model = model or ref_model()
    ids = torch.tensor(prompt + out[:-1])
    n = ids.numel()
    cache = KVCache(model.config, n + 8, torch.float32)
    with torch.no_grad():
        h = model(ids, contiguous_batch([(0, n)], n + 8), cache)
        lg = model.logits(h[len(prompt) - 1:])
    top2 = lg.topk(2, dim=-1).values
    return lg.argmax(-1).tolist(), float((top2[:, 0] - top2[:, 1]).min())


def engine(**kw):
    base = dict(kernels="reference", device="cpu", warmup_tokens=0, kv_cache_tokens=4096, max_model_len=2048,
                log_stats_interval_s=0.0)
    base.update(kw)
    return build_local_engine(EngineConfig(**base), progress=False)


def run(eng, requests: dict, max_steps=100_000, abort_at=None):
    """requests: rid -> (ids, SamplingParams). Returns (tokens, finish reasons, errors)."""
    out = {rid: [] for rid in requests}
    reasons, errors = {}, {}
    for rid, (ids, params) in requests.items():
        eng.add_request(ids, params, rid)
    done = set()
    for _ in range(max_steps):
        for ev in eng.step():
            out[ev.req_id] += ev.token_ids
            if ev.error:
                errors[ev.req_id] = ev.error
            if ev.finished:
                done.add(ev.req_id)
                reasons[ev.req_id] = ev.finish_reason
        if done == set(requests) and not eng.has_work():
            return out, reasons, errors
    raise AssertionError(f"requests did not finish: {set(requests) - done}")


def prompt_ids(n: int, seed: int = 0, vocab=(10, 6000)) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(vocab[0], vocab[1], (n,), generator=g).tolist()


def text_prompt(tok, n: int, seed: int = 0) -> list[int]:
    """n ids of English-like text (the tiny model's corpus style), cut to exactly n."""
    import random
    words = ("and the lord said unto moses , behold the people of israel went up into the land which i gave "
             "unto their fathers ; and they dwelt there many days . the old man said to the sea that the night "
             "was long and the fish was near").split()
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < n:
        ids += tok.encode(" ".join(rng.choices(words, k=64)))
    return ids[:n]


def finish(ok: bool, msg: str = ""):
    log(("PASS " if ok else "FAIL ") + msg)
    sys.exit(0 if ok else 1)
