"""Priority policy on a tiny pool (8 blocks): a higher-priority arrival preempts the solo request while it drafts
(MTP k = 3, drafts pending); greedy and seeded-with-penalty outputs == plain alone, pool and maps empty after.
Exit 1 on a difference."""
import sys; sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import *
P = prompts(3, seed=31)
G = lambda **kw: SamplingParams(temperature=0.0, ignore_eos=True, logprobs=1, **kw)
S = lambda **kw: SamplingParams(temperature=0.9, seed=4, ignore_eos=True, frequency_penalty=0.4, **kw)
bad = []
for mk in (G, S):
    want = {}
    plain, _ = engine(scheduling_policy="priority")
    want["lo"] = collect(plain, {"lo": (P[0][:40], mk(max_tokens=60, priority=5))})["lo"]
    want["hi"] = collect(plain, {"hi": (P[1][:40], mk(max_tokens=30, priority=-1))})["hi"]
    for k in (0, 3):
        eng, _ = engine(scheduling_policy="priority", speculative_tokens=k, kv_cache_tokens=128)
        got = collect(eng, {"lo": (P[0][:40], mk(max_tokens=60, priority=5))}, {6: [("hi", P[1][:40], mk(max_tokens=30, priority=-1))]})
        print(mk.__name__ if hasattr(mk,'__name__') else '', k, "preemptions", eng.stats["preemptions"], "rounds", eng.stats["draft_rounds"],
              {r: got[r]["tokens"] == want[r]["tokens"] for r in got}, max(abs(a-b) for a,b in zip(got["lo"]["lps"], want["lo"]["lps"])) if got["lo"]["lps"] else None)
        eng.step(); st = state(eng); print(st)
        if not all(got[r]["tokens"] == want[r]["tokens"] for r in got) or eng.stats["preemptions"] == 0 or \
                st["free"] != st["num_blocks"] or st["live"] or st["runner_requests"]:
            bad.append(k)
print('bad', bad)
sys.exit(1 if bad else 0)
