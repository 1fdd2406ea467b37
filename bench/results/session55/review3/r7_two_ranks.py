"""Two ranks (each a whole tiny model, as tests/integration/test_engine.py's _TwoReplicas) with small pools: requests
arrive over time, some are aborted; every request ends (no livelock of moves/preemptions), greedy outputs equal alone,
the admission bound counts the replica, and both pools are whole after. FCFS and priority, prefix cache on / off."""
import random
from dataclasses import replace

import torch

from _h3 import AdmissionError, check, done, engine, greedy, prompt, run
from cluster.engine import Engine
from scheduler.request import SamplingParams
from workers.runner import ModelRunner
from workers.runner import StepResult  # noqa: F401

ref, _ = engine(kv_cache_tokens=4096, max_model_len=128, prefix_caching=False)
model = ref.executor.runner.model


class Two:
    def __init__(self, n, host=0):
        self.runners = [ModelRunner(model, n, 16, torch.float32, host_blocks=host) for _ in range(2)]

    def execute(self, steps):
        return [r.execute(s) for r, s in zip(self.runners, steps)]

    def recover(self):
        pass


rng = random.Random(11)
shared = prompt(32, seed=77)
arrivals = []
for i in range(24):
    p = rng.randrange(40, 110)
    ids = shared + prompt(p - 32, seed=i) if i % 3 == 0 else prompt(p, seed=i)
    arrivals.append((rng.randrange(0, 120), f"r{i}", ids, rng.randrange(4, 128 - p + 1), rng.randrange(0, 3)))
alone = {rid: run(ref, {rid: (ids, greedy(mt))})[0][rid] for _, rid, ids, mt, _ in arrivals}

for policy in ("fcfs", "priority"):
    for pc in (False, True):
        cfg = replace(ref.config, num_blocks=9, max_model_len=128, max_num_seqs=4, max_waiting=6,
                      max_num_batched_tokens=48, prefix_caching=pc, policy=policy,
                      host_blocks=4 if pc else 0)
        eng = Engine(Two(9, 4 if pc else 0), cfg, num_ranks=2, span=False)
        out, ends, refused, aborted = {}, {}, [], set()
        for step in range(6000):
            for t, rid, ids, mt, pr in arrivals:
                if t == step:
                    try:
                        eng.add_request(ids, SamplingParams(max_tokens=mt, temperature=0.0, ignore_eos=True,
                                                            priority=pr if policy == "priority" else 0), rid)
                        out[rid] = []
                    except AdmissionError as e:
                        refused.append((rid, e.reason))
            if step == 60:
                for rid in list(out)[::5]:
                    if eng.abort(rid) is not None:
                        aborted.add(rid)
            for ev in eng.step():
                out.setdefault(ev.req_id, [])
                out[ev.req_id] += ev.token_ids
                if ev.finished:
                    ends[ev.req_id] = (ev.finish_reason, ev.error, ev.refused)
            total = sum(s.num_running + s.num_waiting for s in eng.schedulers)
            if total > 4 + 6:
                check(False, f"{policy} pc={pc}: {total} live > max_num_seqs + max_waiting")
            if step > 120 and not eng.has_work():
                break
        name = f"{policy}, prefix cache {pc}"
        unfinished = [rid for rid in out if rid not in ends and rid not in aborted]
        check(not unfinished, f"{name}: {len(out)} admitted, {len(refused)} refused {set(r for _, r in refused)}, "
                              f"{len(aborted)} aborted, ended in {step} steps, {eng.stats['preemptions']} preemptions, "
                              f"{eng.stats['moves']} moves; unfinished {unfinished}")
        bad = [rid for rid, e in ends.items() if e[0] == "length" and out[rid] != alone[rid]]
        check(not bad, f"{name}: outputs that differ from alone: {bad}")
        check(all(s.pool.num_free == s.pool.num_blocks for s in eng.schedulers), f"{name}: both pools whole")
done()
