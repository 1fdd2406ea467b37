# Session 53 review: a KV-label simulation of the engine's steps (CPU, no model). Run: PYTHONPATH=. .venv/bin/python
# bench/results/session53/review_sim.py [seeds] — prints "bad 0" when every read position held its KV and every pool ended free.
"""A fake worker group that models each rank's KV slots as labels (the hash of the tokens up to the position), runs a
step's saves, loads, forward and (after the step) imports in the runner's order, and checks every read position."""
from __future__ import annotations

import random
import sys

import numpy as np

from cluster.disagg import KVBundle
from cluster.engine import Engine, GroupFailure
from scheduler import SamplingParams, SchedulerConfig
from workers.runner import StepResult

BS = 4
GARBAGE = -1


def label(tokens) -> int:
    return hash(tuple(tokens)) & ((1 << 63) - 1)


def rows_of(prompt, start, n):
    return (np.array([label(prompt[:p + 1]) for p in range(start, n)], dtype=np.int64).view(np.uint8).reshape(-1, 8),)


class SimExecutor:
    def __init__(self, ranks, slots, host_slots, rng, fail=0.0, group_fail=0.0):
        self.ranks, self.rng, self.fail, self.group_fail = ranks, rng, fail, group_fail
        self.slots, self.host_slots = slots, host_slots
        self.recover()
        self.errors = []
        self.steps = 0

    def recover(self):
        self.kv = [[GARBAGE] * self.slots for _ in range(self.ranks)]
        self.host = [[GARBAGE] * self.host_slots for _ in range(self.ranks)]
        self.hist = [{} for _ in range(self.ranks)]

    def execute(self, steps):
        self.steps += 1
        if self.rng.random() < self.group_fail:
            raise GroupFailure("injected")
        failing = self.rng.random() < self.fail
        out = []
        for r, st in enumerate(steps):
            kv, host, hist = self.kv[r], self.host[r], self.hist[r]
            for rid in st.finished:
                hist.pop(rid, None)
            for nr in st.new_requests:
                hist[nr.req_id] = [*nr.prompt_ids, *nr.output_ids]
            for b, s in st.kv_saves:
                host[s * BS:(s + 1) * BS] = kv[b * BS:(b + 1) * BS]
            for s, b in st.kv_loads:
                kv[b * BS:(b + 1) * BS] = host[s * BS:(s + 1) * BS]
            res = StepResult(st.step_id)
            for seq in st.seqs:
                h = hist[seq.req_id]
                slot = lambda p: seq.block_ids[p // BS] * BS + p % BS
                for p in range(seq.start_pos):
                    want = label(h[:p + 1])
                    if kv[slot(p)] != want:
                        self.errors.append(f"step {st.step_id} rank {r}: {seq.req_id} read position {p} (block "
                                           f"{seq.block_ids[p // BS]}) not its KV ({kv[slot(p)]})")
                        break
                h[seq.start_pos:seq.start_pos + len(seq.token_ids)] = list(seq.token_ids)
                for p in range(seq.start_pos, seq.start_pos + len(seq.token_ids)):
                    kv[slot(p)] = GARBAGE if failing else label(h[:p + 1])
                if seq.sample:
                    tok = 1 + label(h) % 50
                    del h[seq.start_pos + len(seq.token_ids):]
                    h.append(tok)
                    res.sampled[seq.req_id] = [tok]
            if failing:
                continue
            for blocks, rows in st.kv_imports:          # after the step's work
                vals = rows[0].view(np.int64).reshape(-1)
                for i, b in enumerate(blocks):
                    kv[b * BS:(b + 1) * BS] = list(vals[i * BS:(i + 1) * BS])
            out.append(res)
        if failing:
            raise RuntimeError("injected step failure")
        return out


def run(seed, ranks=1, blocks=16, host=0, budget_blocks=1, fail=0.0, group_fail=0.0, n_req=40, abort=0.1,
        verbose=False):
    rng = random.Random(seed)
    cfg = SchedulerConfig(num_blocks=blocks, block_size=BS, max_model_len=blocks * BS, vocab_size=1000,
                          eos_token_ids=(), max_num_seqs=4, max_num_batched_tokens=32, prefix_caching=True,
                          host_blocks=host)
    ex = SimExecutor(ranks, (blocks + 1) * BS, max(host, 1) * BS, rng, fail, group_fail)
    e = Engine(ex, cfg, num_ranks=ranks, kv_layout=((8, "uint8"),))
    for imp in e._imports:
        imp.budget = budget_blocks * BS * 8
    system = [rng.randrange(100, 999) for _ in range(9)]
    bases = [(system if i % 2 else []) + [rng.randrange(100, 999) for _ in range(rng.randrange(3, 20))]
             for i in range(5)]
    ids = [f"r{i}" for i in range(8)]          # few ids: reused
    helds = []
    arrived = 0
    for it in range(3000):
        if arrived < n_req:
            for _ in range(rng.randrange(0, 3)):
                rid = rng.choice(ids)
                if rid in e._rank_of:
                    continue
                prompt = rng.choice(bases) + [rng.randrange(100, 999) for _ in range(rng.randrange(0, 10))]
                params = SamplingParams(max_tokens=rng.randrange(1, 6), ignore_eos=True)
                kv = None
                n = (len(prompt) - 1) // BS * BS
                held = None
                if n and rng.random() < 0.7:
                    start = 0
                    if rng.random() < 0.5:
                        held = e.hold_prefix(prompt, None)
                        start = held.start
                    kv = KVBundle(tuple(prompt[:n + 1]), ((8, "uint8"),), False, rows_of(prompt, start, n), start)
                try:
                    e.add_request(prompt, params, rid, kv=kv)
                except Exception as x:  # noqa: BLE001
                    if verbose:
                        print("refused", x)
                    if held:
                        held.release()
                    continue
                finally:
                    if held:
                        held.admitted()
                        helds.append(held)
                arrived += 1
        if helds and rng.random() < 0.3:
            helds.pop(0).release()
        if rng.random() < abort and e._rank_of:
            e.abort(rng.choice(sorted(e._rank_of)))
        if arrived >= n_req and not e.has_work():
            for h in helds:
                h.release()
            break
        e.step()
    else:
        raise AssertionError(f"seed {seed}: still working after 3000 steps: "
                             f"{[(r.req_id, r.importing, r.status) for s in e.schedulers for r in s._live.values()]}")
    problems = list(ex.errors)
    for s in e.schedulers:
        if s.pool.num_free != blocks or s.pool._keeps or s.pool.num_kept or s.pool._pins:
            problems.append(f"rank pool: free {s.pool.num_free}/{blocks}, keeps {len(s.pool._keeps)}")
    if any(e._imports):
        problems.append("imports left")
    return problems, ex.steps


if __name__ == "__main__":
    bad = 0
    for seed in range(int(sys.argv[1]) if len(sys.argv) > 1 else 200):
        for kw in (dict(), dict(host=8), dict(ranks=2, host=6), dict(budget_blocks=2, host=4, fail=0.05),
                   dict(ranks=2, fail=0.03, group_fail=0.01, host=8), dict(blocks=10, host=12, budget_blocks=3)):
            probs, steps = run(seed, **kw)
            if probs:
                bad += 1
                print(seed, kw, probs[:3])
    print("bad", bad)
