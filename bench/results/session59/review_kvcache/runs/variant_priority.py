import sys, random
sys.path.insert(0, "/work/main/bench/results/session59/review_kvcache")
import _h, fuzz_kv
from dataclasses import replace
from scheduler.request import SamplingParams
orig_make = fuzz_kv.make_engine
def make_engine(**kw):
    eng = orig_make(**kw)
    for s in eng.schedulers:
        s.config = replace(s.config, policy="priority")
    eng.config = replace(eng.config, policy="priority")
    return eng
fuzz_kv.make_engine = make_engine
rng = random.Random(9)
def greedy(n, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, priority=rng.choice([-1, 0, 0, 2]), **kw)
fuzz_kv.greedy = greedy
bad = 0
for wl in range(8):
    c, reqs, problems, stats = fuzz_kv.workload(91, wl)
    print(wl, c, stats, problems or "OK", flush=True)
    bad += bool(problems)
print("bad", bad)
