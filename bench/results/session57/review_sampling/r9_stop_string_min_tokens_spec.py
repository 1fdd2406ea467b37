"""Stop strings with min_tokens (the ban lifting inside an accepted draft run): MTP k = 3 == plain, tokens, text,
finish reason, usage and stop_str. Exit 1 on a difference."""
import sys; sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import *
ids = prompts(1)[0]
bad=0
for st in (".0", "0.0", ".0.0"):
  for m in (3,4,5,6,7,8,9):
    for keep in (False,):
        p = SamplingParams(max_tokens=30, temperature=0.0, stop=(st,), min_tokens=m, include_stop_str_in_output=keep, logprobs=0)
        r = {}
        for name, kw in (("plain", {}), ("spec", dict(speculative_tokens=3))):
            eng, _ = engine(**kw)
            r[name] = collect(eng, {"a": (ids, p)})["a"]
        same = all(r["plain"][k] == r["spec"][k] for k in ("tokens","text","reason","n_out","stop_str"))
        if not same: bad+=1
        print(st, m, keep, same, len(r["plain"]["tokens"]), len(r["spec"]["tokens"]), repr(r["plain"]["text"]), repr(r["spec"]["text"]))
print("bad", bad)
sys.exit(1 if bad else 0)
