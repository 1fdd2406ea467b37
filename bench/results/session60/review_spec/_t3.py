import time, _s
from _s import *
from workers.speculative import MtpDrafter
calls = []
orig = MtpDrafter.propose
def counted(self, rows, requests, num_drafts, world):
    t = time.perf_counter(); out = orig(self, rows, requests, num_drafts, world)
    calls.append((len(requests), num_drafts, time.perf_counter() - t)); return out
MtpDrafter.propose = counted
for k in (0, 3, 7):
    e = make_engine(k=k, budget=512)
    e.prompts_only = True
    calls.clear()
    t = time.perf_counter()
    for i in range(40):
        collect(e, {f"p{i}": (ids(200, i), SamplingParams(max_tokens=1, temperature=0.0))})
    dt = time.perf_counter() - t
    print(k, f"{dt:.2f}s", len(calls), f"{sum(c[2] for c in calls):.3f}s in propose", e.stats["drafts_proposed"])
