"""Differential random-workload driver of the KV cache's reuse on the real tiny model (fp32, CPU, in-process).

Each workload draws a small engine (block size, a pool small enough to evict and preempt, host tier, budget / chunk
size, seats, FP8 KV, MTP drafts, look-ahead graph steps) and a stream of greedy requests that share heads (two bases,
duplicates, salts), arriving at random steps, some aborted at random steps. Oracle: every request's tokens equal the
same request run alone on an engine without prefix caching (same KV dtype; drafts off) — an aborted one's are a prefix
of them; the pool is idle after the workload (no held block, ref, keep or pin); ``num_cached_tokens`` is a whole
number of blocks below the prompt's length, and 0 for a request whose salt / head was never computed before.

Near-ties: the reference's top-2 margin at each position is kept; a mismatch at a position whose margin is < 1e-4 is
reported as a tie, not a failure (a reused prefix's KV may differ in its last bits: NOTES, session 40).

    PYTHONPATH=. .venv/bin/python bench/results/session59/review_kvcache/fuzz_kv.py --seed 0 --n 20
"""
from __future__ import annotations

import argparse
import random
import sys
import time

import _h
from _h import greedy, make_engine
from scheduler.request import SamplingParams

_REF: dict = {}


def reference(prompt, n, fp8):
    key = (tuple(prompt), fp8)
    have = _REF.get(key)
    if have is not None and len(have[0]) >= n:
        return have
    eng = make_engine(caching=False, blocks=max(8, -(-(len(prompt) + n) // 16) + 1), bs=16, fp8=fp8)
    eng.add_request(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=2), "ref")
    toks, margins = [], []
    while eng.has_unfinished():
        for ev in eng.step():
            toks += ev.token_ids
            for lp in ev.logprobs:
                vals = sorted((v for _, v in lp.top), reverse=True) if lp.top else []
                margins.append(vals[0] - vals[1] if len(vals) > 1 else 1.0)
    _REF[key] = (toks, margins)
    return _REF[key]


def draw(rng: random.Random):
    bs = rng.choice([4, 8, 16])
    k = rng.choice([0, 0, 2, 3])
    fp8 = rng.random() < 0.3
    graphs = rng.random() < 0.3
    seqs = rng.choice([1, 2, 3, 4])
    budget = rng.choice([8, 13, 32, 64, 512])
    mml = 96
    blocks = rng.randrange(-(-mml // bs), 2 * -(-mml // bs))
    host = rng.choice([0, 0, 2, 6, 40])
    ranks = rng.choice([1, 1, 2])
    return dict(ranks=ranks, bs=bs, k=k, fp8=fp8, graphs=graphs, seqs=seqs, budget=budget, mml=mml, blocks=blocks, host=host)


def workload(seed: int, wl: int, verbose: bool = False):
    rng = random.Random(seed * 1_000_003 + wl)
    c = draw(rng)
    eng = make_engine(caching=True, k=c["k"], budget=c["budget"], blocks=c["blocks"], bs=c["bs"], host=c["host"],
                      fp8=c["fp8"], seqs=max(c["seqs"], c["ranks"]), mml=c["mml"], graphs=c["graphs"],
                      ranks=c["ranks"])
    bases = [_h.ids(80, 1000 + seed * 10 + i) for i in range(2)]
    n_req = rng.randrange(3, 12)
    reqs = []
    for i in range(n_req):
        L = rng.randrange(2, 70)
        if rng.random() < 0.7:
            sh = rng.randrange(0, L + 1)
            p = rng.choice(bases)[:sh] + _h.ids(L - sh, seed * 7919 + wl * 101 + i)
        else:
            p = _h.ids(L, seed * 7919 + wl * 101 + i)
        if reqs and rng.random() < 0.2:
            p = list(rng.choice(reqs)["prompt"])
        mt = rng.randrange(1, min(26, c["mml"] - len(p)) + 1)
        salt = rng.choice([None, None, None, "a", "b"])
        arrive = rng.choice([0, 0, rng.randrange(0, 12), rng.randrange(0, 40)])
        abort = rng.randrange(arrive, arrive + 25) if rng.random() < 0.15 else None
        parent = rng.randrange(i) if i and rng.random() < 0.3 else None
        if parent is not None:      # a next turn: the parent's prompt + answer + a tail, once the parent has ended
            arrive, abort, salt = None, None, reqs[parent]["salt"]
        reqs.append(dict(rid=f"r{i}", prompt=p, mt=mt, salt=salt, arrive=arrive, abort=abort, out=[], end=None,
                         cached=None, parent=parent, tail=_h.ids(rng.randrange(1, 12), seed * 31 + wl * 7 + i)))
    by = {r["rid"]: r for r in reqs}
    step = 0
    problems = []
    while True:
        for r in reqs:
            par = reqs[r["parent"]] if r["parent"] is not None else None
            if par is not None and r["arrive"] is None and par["end"] is not None:
                r["arrive"] = step
                if par["end"] != "abort":
                    r["prompt"] = (par["prompt"] + par["out"] + r["tail"])[:c["mml"] - 1]
                    r["mt"] = max(1, min(r["mt"], c["mml"] - len(r["prompt"])))
            if r["arrive"] == step:
                eng.add_request(r["prompt"], greedy(r["mt"], cache_salt=r["salt"]), r["rid"])
            if r["abort"] == step and r["end"] is None and r["arrive"] <= step:
                ev = eng.abort(r["rid"])
                if ev is not None:
                    r["end"] = "abort"
        if all(r["arrive"] is not None and r["arrive"] < step for r in reqs) and not eng.has_work():
            break
        for ev in eng.step():
            r = by[ev.req_id]
            if ev.error:
                problems.append(f"{ev.req_id}: error {ev.error}")
            r["out"] += ev.token_ids
            if ev.finished:
                r["end"] = r["end"] or ev.finish_reason
                r["cached"] = ev.num_cached_tokens
        step += 1
        if step > 3000:
            problems.append("did not drain")
            break
    ties = 0
    for r in reqs:
        ref, margins = reference(r["prompt"], r["mt"], c["fp8"])
        out = r["out"]
        if r["end"] != "abort" and len(out) != r["mt"]:
            problems.append(f"{r['rid']}: {len(out)} tokens, wanted {r['mt']} (end {r['end']})")
        n = min(len(out), len(ref))
        diff = next((i for i in range(n) if out[i] != ref[i]), None)
        if diff is not None:
            if margins[diff] < 1e-4:
                ties += 1
            else:
                problems.append(f"{r['rid']}: token {diff} {out[diff]} != alone {ref[diff]} (margin "
                                f"{margins[diff]:.3g}); prompt len {len(r['prompt'])} salt {r['salt']}")
        if r["cached"] is not None and r["end"] != "abort":
            bs = c["bs"]
            if r["cached"] % bs or r["cached"] > len(r["prompt"]) - 1:
                problems.append(f"{r['rid']}: cached_tokens {r['cached']} (prompt {len(r['prompt'])}, bs {bs})")
    problems += _h.pool_idle(eng)
    for rn in getattr(eng.executor, "runners", [eng.executor.runner]):
        if rn.requests:
            problems.append(f"runner still holds {list(rn.requests)}")
    for s in eng.schedulers:
        if s.pool._loads:
            problems.append(f"loads left pending: {len(s.pool._loads)}")
    stats = dict(steps=step, preempt=eng.stats["preemptions"], hits=eng.prefix_cache_tokens()[1],
                 loads=sum(s.host_loads for s in eng.schedulers), ties=ties,
                 moves=eng.stats["moves"])
    return c, reqs, problems, stats


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--first", type=int, default=0)
    a = ap.parse_args()
    t0 = time.time()
    total = dict(preempt=0, hits=0, loads=0, ties=0)
    bad = 0
    for wl in range(a.first, a.first + a.n):
        c, reqs, problems, stats = workload(a.seed, wl)
        for key in total:
            total[key] += stats[key]
        print(f"seed {a.seed} wl {wl}: {c} -> {stats} {'OK' if not problems else 'FAIL'}", flush=True)
        for pr in problems:
            print("   ", pr)
        bad += bool(problems)
    print(f"{a.n} workloads, {bad} failing, totals {total}, {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
