"""r2: requests that ask for prompt logprobs take no cached prefix, on every engine path: a prefix cached on the
device, one only the host tier holds, a waiting request behind an in-flight prefill of its prompt, a preempted request
recomputing, and a request that brings a transferred KV bundle (Engine.add_request(kv=...)). The prompt logprobs must
cover every prompt token after the first and equal an uncached engine's; cached_tokens must be 0."""
import math

from cluster.disagg import prefill_params
from common import SamplingParams, check, done, engine, ids, run

PL = lambda **kw: SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, prompt_logprobs=2, **kw)  # noqa
G = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

ref = engine(kv_tokens=1024, caching=False, max_len=256)
P = ids(120, 3)
want = run(ref, {"r": (P, PL())})["r"]


def same(got, tag):
    lps = got["prompt_lps"]
    ok = lps is not None and len(lps) == len(P) - 1 and all(
        a.rank == b.rank and math.isclose(a.logprob, b.logprob, abs_tol=1e-4)
        for a, b in zip(lps, want["prompt_lps"]))
    check(ok, f"{tag}: prompt logprobs cover {len(lps) if lps else None} of {len(P) - 1} tokens, == uncached")
    check(got["tokens"] == want["tokens"], f"{tag}: tokens == uncached")
    check(got["cached"] == 0, f"{tag}: cached_tokens {got['cached']} == 0")


# device-cached prefix
eng = engine(kv_tokens=512, host=2048, max_len=256)
run(eng, {"warm": (P, G)})
same(run(eng, {"pl1": (P, PL())})["pl1"], "device-cached prefix")
same(run(eng, {"pl1s": (P, PL(cache_salt="s"))})["pl1s"], "salted, cached under its salt")
run(eng, {"warms": (P, SamplingParams(max_tokens=2, cache_salt="s"))})
same(run(eng, {"pl1s2": (P, PL(cache_salt="s"))})["pl1s2"], "salted, its salt's prefix cached")
# host-only prefix
for i in range(6):
    run(eng, {f"fill{i}": (ids(200, 200 + i), G)})
same(run(eng, {"pl2": (P, PL())})["pl2"], "host-tier-only prefix")
# together with a plain request of the same prompt (the in-flight wait), in one batch
got = run(eng, {"plain": (P + [5], G), "pl3": (P, PL())})
same(got["pl3"], "beside an in-flight prefill of its prompt")

# preemption: a small pool, the prompt-logprobs request ranks last and is preempted while it decodes
small = engine(kv_tokens=256, max_len=256, budget=64)      # 16 blocks
run(small, {"w": (P, G)})
reqs = {"big": (ids(150, 9), SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)),
        "pl4": (P, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, prompt_logprobs=2))}
got = run(small, reqs)
pre = small.stats["preemptions"]
lps = got["pl4"]["prompt_lps"]
check(lps is not None and len(lps) == len(P) - 1 and all(
    a.rank == b.rank and math.isclose(a.logprob, b.logprob, abs_tol=1e-4) for a, b in zip(lps, want["prompt_lps"])),
    f"after {pre} preemption(s): prompt logprobs whole and == uncached")
check(got["pl4"]["cached"] == 0, "after preemption: cached_tokens 0")

# a transferred bundle for a prompt-logprobs request (the coordinator does not send one; the engine must still not
# start the request mid-prompt)
pre_eng = engine(kv_tokens=1024, max_len=256)
pre_eng.add_request(P, prefill_params(G), "p", export_kv=True)
bundle = None
while pre_eng.has_work():
    for ev in pre_eng.step():
        bundle = ev.kv or bundle
dec = engine(kv_tokens=1024, max_len=256)
dec.add_request(P, PL(), "d", kv=bundle)
out = {"tokens": [], "prompt_lps": None, "cached": None}
while dec.has_work():
    for ev in dec.step():
        out["tokens"] += ev.token_ids
        out["prompt_lps"] = ev.prompt_logprobs if ev.prompt_logprobs is not None else out["prompt_lps"]
        out["cached"] = ev.num_cached_tokens
same(out, "with a transferred KV bundle")
done()
