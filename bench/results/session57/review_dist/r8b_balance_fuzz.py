"""r8b: r8's imbalance in random traffic (fake executor, real Engine + Schedulers; 30 seeded trials of 400 steps, 2 or 4
ranks, small pools, arrivals with shared system prompts). Counts preemptions that happened while another rank had at
least half its pool free, and steps where a rank had waiting requests while another rank held no request at all and
had room for the head. Exits 1 when any preemption happened with another rank half free."""
import sys, random
from _common import config, TINY
from cluster.engine import Engine
from cluster.local import scheduler_config
from models.config import ModelConfig
from scheduler.request import SamplingParams
from workers.runner import StepResult
class Fake:
    def execute(self, steps):
        return [StepResult(st.step_id, {s.req_id: [50] for s in st.seqs if s.sample}) for st in steps]
    def recover(self): pass
mc = ModelConfig.from_json(TINY)
from collections import Counter
total = Counter()
for trial in range(30):
    rng = random.Random(trial)
    n = rng.choice([2, 4])
    cfg = config(n, kv_cache_tokens=rng.choice([16, 32, 64]) * 16, max_num_seqs=rng.choice([4, 8, 16]), max_num_batched_tokens=rng.choice([64, 128]))
    eng = Engine(Fake(), scheduler_config(cfg, mc, None, cfg.num_blocks), num_ranks=n)
    sys_p = [list(range(1000 + 100 * k, 1000 + 100 * k + 48)) for k in range(3)]
    k = 0
    for step in range(400):
        if rng.random() < 0.4:
            for _ in range(rng.randint(1, 3)):
                p = (rng.choice(sys_p) if rng.random() < 0.5 else []) + [rng.randrange(40, 6000) for _ in range(rng.randint(1, 120))]
                try:
                    eng.add_request(p, SamplingParams(max_tokens=rng.randint(1, 150), temperature=0, ignore_eos=True), f"r{k}")
                except Exception as e:
                    pass
                k += 1
        pre = eng.stats["preemptions"]
        eng.step()
        if eng.stats["preemptions"] > pre:
            total["preempt"] += eng.stats["preemptions"] - pre
            frees = [x.pool.num_free for x in eng.schedulers]
            if max(frees) >= 0.5 * eng.schedulers[0].pool.num_blocks:
                total["preempt_while_other_half_free"] += eng.stats["preemptions"] - pre
        # after the step: a rank with waiting requests while another rank sits with no request at all and room for it
        for r, s in enumerate(eng.schedulers):
            w = s.waiting()
            if not w: continue
            head = w[0]
            for r2, s2 in enumerate(eng.schedulers):
                if r2 != r and s2.num_running + s2.num_waiting == 0 and s2.pool.num_free >= s2.pool.blocks_needed(head.num_tokens + 1):
                    why = "seat" if s.free_seats < 0 else "stalled" if s.stalled() is not None else "other"
                    total[(why)] += 1
                    if total[why] <= 3:
                        print(trial, step, "rank", r, "waits", len(w), "running", s.num_running, "free_seats", s.free_seats, "free", s.pool.num_free, "need", s.pool.blocks_needed(head.num_tokens+1), "hits", head.hit_blocks, "| rank", r2, "empty free", s2.pool.num_free, "why", why, "status", head.status, "preempted", head.num_preemptions)
                    break
print(dict(total))
bad = total["preempt_while_other_half_free"] > 0
print("RESULT:", "FAIL" if bad else "OK")
sys.exit(1 if bad else 0)
