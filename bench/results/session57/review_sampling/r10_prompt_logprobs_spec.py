"""prompt_logprobs with MTP k = 3 (solo, and chunked at 64 tokens): tokens and prompt logprobs == plain. Exit 1 on a
difference."""
import sys; sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import *
P = prompts(2, seed=5, lo=40, hi=80)
p = SamplingParams(max_tokens=20, temperature=0.0, prompt_logprobs=2, logprobs=1, ignore_eos=True)
res = {}
for name, kw in (("plain", {}), ("spec", dict(speculative_tokens=3)), ("spec_chunk", dict(speculative_tokens=3, max_num_batched_tokens=64, max_num_seqs=8))):
    eng, _ = engine(**kw)
    plps = {}
    eng.add_request(P[0], p, "a")
    toks = []
    while eng.has_unfinished():
        for ev in eng.step():
            toks += ev.token_ids
            if ev.prompt_logprobs is not None: plps = [(x.logprob, x.rank) for x in ev.prompt_logprobs]
    res[name] = (toks, plps)
    print(name, len(toks), len(plps), eng.stats["draft_rounds"])
same = res["plain"][0] == res["spec"][0] == res["spec_chunk"][0]
d = max(max(abs(a[0] - b[0]) for a, b in zip(res["plain"][1], res[n][1])) for n in ("spec", "spec_chunk"))
ranks = all([r for _, r in res["plain"][1]] == [r for _, r in res[n][1]] for n in ("spec", "spec_chunk"))
print("tokens equal", same, "max prompt logprob diff", d, "ranks equal", ranks)
sys.exit(0 if same and d < 1e-4 and ranks else 1)
