"""Edge values of the sampling fields (plain and MTP k = 3; fp32 tiny model): each run ends without an error or NaN
logprob and gives what the field means — top_k = 1 at T 1.5, top_p tiny, min_p = 1 and T just above SAMPLING_EPS all
give the greedy tokens; a single allowed id, or a +100 bias, forces that id; a -100 bias bans the greedy path's ids;
a huge repetition penalty (1e39, accepted by the API: gt 0, no upper bound) stays finite; plus the sampler on rows
with -inf (masked) logits. Exit 1 on a crash, a NaN or a wrong meaning."""
import math
import sys
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch  # noqa: E402
from common import SamplingParams, collect, engine, prompts  # noqa: E402
from scheduler.request import SAMPLING_EPS  # noqa: E402
from workers.sampler import sample  # noqa: E402

bad = []
P = prompts(3, seed=21)
base = dict(max_tokens=16, ignore_eos=True, logprobs=5)
engines = {"plain": engine()[0], "spec3": engine(speculative_tokens=3)[0]}
greedy = {i: collect(engines["plain"], {"g": (p, SamplingParams(temperature=0.0, **base))})["g"]["tokens"]
          for i, p in enumerate(P)}
banned = sorted(set(greedy[0]))
cases = {
    "top_k=1,T=1.5": (dict(temperature=1.5, top_k=1, seed=1), "greedy"),
    "top_p=1e-9": (dict(temperature=1.0, top_p=1e-9, seed=2), "greedy"),
    "min_p=1": (dict(temperature=1.0, min_p=1.0, seed=3), "greedy"),
    "T=2*eps": (dict(temperature=2 * SAMPLING_EPS, seed=4), "greedy"),
    "T=eps": (dict(temperature=SAMPLING_EPS, seed=5), "greedy"),
    "unseeded top_p=1e-9": (dict(temperature=1.0, top_p=1e-9), "greedy"),
    "allowed=(777,)": (dict(temperature=1.0, allowed_token_ids=(777,), seed=6), "all777"),
    "bias+100": (dict(temperature=1.0, logit_bias={555: 100.0}, seed=7), "all555"),
    "bias-100 greedy path": (dict(temperature=0.0, logit_bias={t: -100.0 for t in banned}), "banned"),
    "rep=1e39": (dict(temperature=0.0, repetition_penalty=1e39), "finite"),
    "rep=1e39 sampled": (dict(temperature=1.0, repetition_penalty=1e39, seed=8), "finite"),
    "all penalties max": (dict(temperature=2.0, presence_penalty=2.0, frequency_penalty=2.0, repetition_penalty=2.0,
                               top_k=5, top_p=0.5, min_p=0.5, seed=9), "finite"),
    "allowed + min_tokens": (dict(temperature=0.0, allowed_token_ids=(0, 7, 9), min_tokens=4), "finite"),
}
for ename, eng in engines.items():
    for name, (kw, expect) in cases.items():
        i = 0
        try:
            r = collect(eng, {"r": (P[i], SamplingParams(**base, **kw))})["r"]
        except Exception as e:  # noqa: BLE001
            bad.append(f"{ename} {name}: raised {type(e).__name__}: {e}")
            continue
        toks, lps = r["tokens"], r["lps"]
        nan = [lp for lp in lps if math.isnan(lp)] + [v for t in r["tops"] for _, v in t if math.isnan(v)]
        problems = []
        if r["error"]:
            problems.append(f"error {r['error']}")
        if nan:
            problems.append(f"NaN logprobs {nan[:3]}")
        if len(lps) != len(toks):
            problems.append(f"{len(lps)} logprobs for {len(toks)} tokens")
        if expect == "greedy" and toks != greedy[i]:
            problems.append(f"{toks} != greedy {greedy[i]}")
        if expect.startswith("all") and set(toks) != {int(expect[3:])}:
            problems.append(f"{toks} not all {expect[3:]}")
        if expect == "banned" and set(toks) & set(banned):
            problems.append(f"{toks} holds banned ids")
        print(f"{ename:6} {name:24} {'OK' if not problems else 'BAD'} {toks[:10]}")
        bad += [f"{ename} {name}: {p}" for p in problems]

# the sampler itself: rows with masked (-inf) logits at small T / top-p / min-p, rows that are all -inf but one
logits = torch.randn(6, 64) * 5
logits[:, 10:] = float("-inf")
params = [SamplingParams(temperature=SAMPLING_EPS, seed=1), SamplingParams(temperature=0.5, top_p=1e-9, seed=2),
          SamplingParams(temperature=2.0, min_p=0.9, seed=3), SamplingParams(temperature=1.0, top_k=3, seed=4, logprobs=5),
          SamplingParams(temperature=1.0, logprobs=20), SamplingParams(temperature=0.0, logprobs=3)]
out = sample(logits, params, None, [0] * 6)
print("sampler on masked rows:", out.token_ids, [round(lp, 3) for lp in out.logprobs if lp is not None])
if any(t >= 10 for t in out.token_ids):
    bad.append(f"sampler picked a masked id: {out.token_ids}")
if any(lp is not None and math.isnan(lp) for lp in out.logprobs):
    bad.append("sampler NaN logprob on a masked row")
print("\n".join(bad) or "all fine")
sys.exit(1 if bad else 0)
