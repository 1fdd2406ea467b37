"""A stop (stop_token_ids, a stop string) that hits inside an accepted draft run (MTP k = 3): the tokens, logprob
entries, finish reason and usage equal plain decoding's (checked), and the engine's counters agree with what was
emitted: stats["generated_tokens"] (the stats line's generation tokens/s) == the tokens the requests output, and
stats["drafts_accepted"] (glmserve_spec_drafts_accepted) counts no draft the output never held.
Exit 1 when a counter counts tokens past the stop."""
import sys
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import SamplingParams, collect, engine, prompts  # noqa: E402

bad = []
ids = prompts(1)[0]          # greedy output: 47 1241 53 46 48 46 48 46 48 ... (drafts accepted 3 at a time)
plain, tok = engine()
spec, _ = engine(speculative_tokens=3)
free = collect(plain, {"a": (ids, SamplingParams(max_tokens=40, temperature=0.0))})["a"]
print("free", free["tokens"], repr(free["text"]))
cases = {}
for m in (4, 5, 6, 7, 8):
    cases[f"stop_id_46_min{m}"] = SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=(46,), min_tokens=m,
                                                 logprobs=1)
    cases[f"stop_id_48_min{m}"] = SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=(48,), min_tokens=m,
                                                 logprobs=1)
for st in (".0", ".0.0", "0.0.0.0", "5.0"):
    cases[f"stop_str_{st}"] = SamplingParams(max_tokens=40, temperature=0.0, stop=(st,), logprobs=1)
    cases[f"stop_str_incl_{st}"] = SamplingParams(max_tokens=40, temperature=0.0, stop=(st,), logprobs=1,
                                                  include_stop_str_in_output=True)
for name, params in cases.items():
    s0 = dict(spec.stats)
    want = collect(plain, {name: (ids, params)})[name]
    got = collect(spec, {name: (ids, params)})[name]
    gen = spec.stats["generated_tokens"] - s0["generated_tokens"]
    acc = spec.stats["drafts_accepted"] - s0["drafts_accepted"]
    rounds = spec.stats["draft_rounds"] - s0["draft_rounds"]
    print(f"{name}: plain {want['tokens']} {want['reason']} n_out={want['n_out']} text={want['text']!r}")
    print(f"{name}: spec  {got['tokens']} {got['reason']} n_out={got['n_out']} text={got['text']!r} "
          f"logprob entries={len(got['lps'])}")
    print(f"{name}: spec stats generated_tokens +{gen}, draft rounds +{rounds}, drafts accepted +{acc}")
    for k in ("tokens", "reason", "n_out", "text", "stop_str"):
        if got[k] != want[k]:
            bad.append(f"{name}: {k} spec={got[k]!r} plain={want[k]!r}")
    if len(got["lps"]) != len(got["tokens"]):
        bad.append(f"{name}: {len(got['lps'])} logprob entries for {len(got['tokens'])} tokens")
    if gen != got["n_out"]:
        bad.append(f"{name}: stats['generated_tokens'] grew by {gen}, the request output {got['n_out']} tokens")
    # tokens that came out of verify rounds: every output token but the prefill's first; accepted drafts are at most
    # those less one bonus/replacement a round
    if acc > len(got["tokens"]) - 1 - rounds:
        bad.append(f"{name}: drafts_accepted grew by {acc} over {rounds} rounds, but only "
                   f"{len(got['tokens']) - 1 - rounds} output tokens can be accepted drafts")
print("\n".join(bad) or "counters agree")
sys.exit(1 if bad else 0)
