"""Greedy speculative (MTP k = 1..3) == plain decode, token for token, logprobs (1e-4), finish reason and usage counts,
across mixed-batch scenarios: joins/leaves mid-run, different max_tokens, stop ids / strings inside accepted runs,
ignore_eos, min_tokens, a request ending at max_model_len, preemption on a tiny pool, prefix-cache hits, n>1
(several requests, same prompt), a chunked long prompt beside decoders. Exit 1 on any difference."""
import sys
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import SamplingParams, collect, engine, prompts, state  # noqa: E402

TOL = 1e-4
bad = []
exercised = {}
maxdiff = [0.0]


def compare(tag, got, want, keys=("tokens", "reason", "n_out", "text", "stop_str", "error")):
    for rid in want:
        g, w = got[rid], want[rid]
        for k in keys:
            if g[k] != w[k]:
                bad.append(f"{tag} {rid}: {k} spec={g[k]!r} plain={w[k]!r}")
        if len(g["lps"]) != len(g["tokens"]):
            bad.append(f"{tag} {rid}: {len(g['lps'])} logprobs for {len(g['tokens'])} tokens")
        if g["tokens"] == w["tokens"] and g["lps"] and w["lps"]:
            d = max(abs(a - b) for a, b in zip(g["lps"], w["lps"]))
            maxdiff[0] = max(maxdiff[0], d)
            if d > TOL:
                bad.append(f"{tag} {rid}: logprob diff {d:.2e}")
            if [[i for i, _ in t] for t in g["tops"]] != [[i for i, _ in t] for t in w["tops"]]:
                bad.append(f"{tag} {rid}: top ids differ")


def clean(tag, eng):
    eng.step()  # let the engine send its forget lists
    s = state(eng)
    if s["free"] != s["num_blocks"] or any(s[k] for k in ("running", "waiting", "live", "streams", "rank_of",
                                                            "unsent", "guides", "runner_requests")):
        bad.append(f"{tag}: leftover state {s}")


def run(tag, reqs, schedule=None, k_values=(1, 2, 3), **cfg):
    plain, _ = engine(**cfg)
    want = collect(plain, reqs, schedule)
    clean(tag + " plain", plain)
    rounds = 0
    for k in k_values:
        spec, _ = engine(speculative_tokens=k, **cfg)
        got = collect(spec, reqs, schedule)
        compare(f"{tag} k={k}", got, want)
        clean(f"{tag} k={k}", spec)
        rounds += spec.stats["draft_rounds"]
        exercised.setdefault(tag, []).append((spec.stats["preemptions"], spec.prefix_cache_tokens()[1]))
    for gcfg in ({"cuda_graphs": "eager"}, {"cuda_graphs": "eager", "speculative_tokens": 3}):
        if k_values:
            eng, _ = engine(**gcfg, **cfg)
            got = collect(eng, reqs, schedule)
            compare(f"{tag} {gcfg}", got, want)
            clean(f"{tag} {gcfg}", eng)
    print(f"{tag}: draft rounds {rounds}; plain {[(r, len(w['tokens']), w['reason']) for r, w in want.items()]}")
    return want


G = lambda **kw: SamplingParams(temperature=0.0, logprobs=3, **kw)
P = prompts(8, seed=1)

# solo, varied max_tokens / ignore_eos
for i, ids in enumerate(P[:4]):
    run(f"solo{i}", {"a": (ids, G(max_tokens=5 + 9 * i, ignore_eos=True))})
# stop token ids inside an accepted run: pick a token from the middle of the free output
free = run("free", {"a": (P[0], G(max_tokens=40, ignore_eos=True))}, k_values=())["a"]["tokens"]
print("free output", free)
for pos in (3, 5, 8):
    run(f"stopid@{pos}", {"a": (P[0], G(max_tokens=40, ignore_eos=True, stop_token_ids=(free[pos],)))})
# stop strings inside an accepted run (tokenizer text)
_, tok = engine()
text = tok.decode(free, skip_special_tokens=True)
print("free text", repr(text))
for cut in (text[4:6], text[9:11]):
    if cut.strip():
        run(f"stopstr{cut!r}", {"a": (P[0], G(max_tokens=40, ignore_eos=True, stop=(cut,)))})
        run(f"stopstr_incl{cut!r}", {"a": (P[0], G(max_tokens=40, ignore_eos=True, stop=(cut,),
                                                    include_stop_str_in_output=True))})
# min_tokens
for i, ids in enumerate(P[:3]):
    run(f"min_tokens{i}", {"a": (ids, G(max_tokens=30, min_tokens=12))})
# max_model_len: prompt + max_tokens == max_model_len
ids = P[1][:40]
run("max_model_len", {"a": (ids, G(max_tokens=24, ignore_eos=True))}, max_model_len=64)
# joins / leaves mid-run; different max_tokens
sched = {3: [("b", P[2], G(max_tokens=7, ignore_eos=True))], 9: [("c", P[3], G(max_tokens=20, ignore_eos=True))]}
run("joins", {"a": (P[1], G(max_tokens=48, ignore_eos=True))}, sched)
# preemption on a tiny pool (8 blocks of 16)
run("preempt", {"a": (P[4][:30], G(max_tokens=40, ignore_eos=True)), "b": (P[5][:30], G(max_tokens=40, ignore_eos=True)),
                "c": (P[6][:20], G(max_tokens=30, ignore_eos=True))}, kv_cache_tokens=128)
# prefix-cache hit: the same 48-token prompt again after the first finished
sched = {30: [("b", P[7][:8] * 6, G(max_tokens=24, ignore_eos=True))]}
run("prefix", {"a": (P[7][:8] * 6, G(max_tokens=24, ignore_eos=True))}, sched)
# n > 1 (the front end's n: the same prompt as several requests)
run("n3", {f"n{i}": (P[2], G(max_tokens=20, ignore_eos=True)) for i in range(3)})
# a long prompt chunked (budget 64) while another decodes
long = prompts(1, seed=9, lo=300, hi=301)[0]
sched = {4: [("long", long, G(max_tokens=16, ignore_eos=True))]}
run("chunked", {"a": (P[3], G(max_tokens=40, ignore_eos=True))}, sched, max_num_batched_tokens=64)

# a solo long prompt chunked (budget 64) with drafts; a budget of 2 tokens a step (drafts cut to 1)
run("solo_chunked", {"long": (long, G(max_tokens=24, ignore_eos=True))}, max_num_batched_tokens=64)
run("budget2", {"a": (P[0], G(max_tokens=24, ignore_eos=True))}, max_num_batched_tokens=2, max_num_seqs=1)

for tag in ("preempt", "prefix"):
    print(tag, "(preemptions, prefix-hit tokens) per k:", exercised[tag])
if not all(p for p, _ in exercised["preempt"]) or not all(h for _, h in exercised["prefix"]):
    bad.append(f"scenario not exercised: {exercised['preempt']} {exercised['prefix']}")
print(f"max logprob diff on equal tokens: {maxdiff[0]:.2e}")
print("\n".join(bad) or "all equal")
sys.exit(1 if bad else 0)
