"""NOTES (Issue 3, Issue 7): a seeded sampled request's tokens depend only on (seed, position) and its logits — alone,
in any batch, after preemption, with drafts riding (MTP k = 1..3), on the static (graph) path with look-ahead.
Checked over temperature / top-k / top-p / min-p / penalties / logit_bias / allowed_token_ids / min_tokens / logprobs.
Exit 1 when any differs from the request run alone on the plain engine."""
import sys
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import SamplingParams, collect, engine, prompts, state  # noqa: E402

bad = []
P = prompts(6, seed=4)
CASES = {
    "t1": dict(temperature=1.0, seed=1),
    "t07_topk": dict(temperature=0.7, top_k=20, seed=2),
    "topp_minp": dict(temperature=0.9, top_p=0.8, min_p=0.05, seed=3),
    "pen": dict(temperature=1.1, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.7, seed=4),
    "bias": dict(temperature=1.0, logit_bias={46: 5.0, 48: -100.0, 300: 3.0}, seed=5),
    "allowed": dict(temperature=1.0, allowed_token_ids=tuple(range(40, 120)), seed=6),
    "min_tokens": dict(temperature=0.8, min_tokens=10, seed=7),
    "all": dict(temperature=0.6, top_k=40, top_p=0.95, min_p=0.01, repetition_penalty=1.1, frequency_penalty=0.3,
                logit_bias={46: 2.0}, seed=2**62 + 9, logprobs=2),
}
CONFIGS = {"spec1": dict(speculative_tokens=1), "spec3": dict(speculative_tokens=3),
           "graphs": dict(cuda_graphs="eager"), "graphs_spec2": dict(cuda_graphs="eager", speculative_tokens=2)}
other = lambda i: SamplingParams(max_tokens=12 + i, temperature=1.0, top_p=0.9)     # unseeded neighbours

plain, _ = engine()
want = {}
for name, kw in CASES.items():
    params = SamplingParams(max_tokens=24, **kw)
    want[name] = collect(plain, {name: (P[0], params)})[name]
    # in a batch with other requests (joining at several steps) on the plain engine
    batch = collect(plain, {name: (P[0], params), "o1": (P[1], other(1))},
                    {2: [("o2", P[2], other(2))], 5: [("o3", P[3], SamplingParams(max_tokens=6, temperature=0.0))]})
    if batch[name]["tokens"] != want[name]["tokens"]:
        bad.append(f"{name}: plain batched {batch[name]['tokens']} != alone {want[name]['tokens']}")
for cname, cfg in CONFIGS.items():
    eng, _ = engine(**cfg)
    for name, kw in CASES.items():
        params = SamplingParams(max_tokens=24, **kw)
        got = collect(eng, {name: (P[0], params)})[name]
        if got["tokens"] != want[name]["tokens"]:
            bad.append(f"{cname} {name}: alone {got['tokens']} != plain {want[name]['tokens']}")
        if got["lps"] and max(abs(a - b) for a, b in zip(got["lps"], want[name]["lps"])) > 1e-4:
            bad.append(f"{cname} {name}: logprobs differ")
        got = collect(eng, {name: (P[0], params), "o1": (P[1], other(1))}, {3: [("o2", P[2], other(2))]})[name]
        if got["tokens"] != want[name]["tokens"]:
            bad.append(f"{cname} {name}: batched {got['tokens']} != plain {want[name]['tokens']}")
    print(cname, "draft rounds", eng.stats["draft_rounds"], "accepted", eng.stats["drafts_accepted"],
          "ahead steps", eng.stats["ahead_steps"])
# after preemption on a tiny pool, with and without drafts
for cname, cfg in {"tiny": {}, "tiny_spec3": dict(speculative_tokens=3)}.items():
    eng, _ = engine(kv_cache_tokens=112, **cfg)
    for name in ("t1", "pen", "all"):
        params = SamplingParams(max_tokens=24, **CASES[name])
        got = collect(eng, {"x": (P[5], SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)),
                            name: (P[0], params)})
        if got[name]["tokens"] != want[name]["tokens"]:
            bad.append(f"{cname} {name}: preempted run {got[name]['tokens']} != plain {want[name]['tokens']}")
    print(cname, "preemptions", eng.stats["preemptions"])
    if eng.stats["preemptions"] == 0:
        bad.append(f"{cname}: no preemption happened (the check did not run)")
print("\n".join(bad) or "all equal")
sys.exit(1 if bad else 0)
