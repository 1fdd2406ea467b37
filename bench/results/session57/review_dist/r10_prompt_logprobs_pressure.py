"""r10: prompt logprobs (SamplingParams.prompt_logprobs) in a 2-rank group under KV pressure — long prompts chunked on
one rank while the other decodes, requests preempted mid-prefill and moved between ranks — == the single process with
a roomy pool (no preemption): tokens, each prompt position's logprob and top ids."""
import sys
from dataclasses import replace
from _common import Group, Timer, blocks_back, config, greedy, prompts, single


def collect(engine, reqs):
    out = {rid: ([], None) for rid in reqs}
    for rid, (ids, p) in reqs.items():
        engine.add_request(ids, p, rid)
    while engine.has_work():
        for ev in engine.step():
            assert ev.error is None, ev.error
            toks, lps = out[ev.req_id]
            out[ev.req_id] = (toks + ev.token_ids, ev.prompt_logprobs if ev.prompt_logprobs is not None else lps)
    return out


def main():
    bad = []
    ps = prompts(6, 40, 90, seed=21)
    reqs = {f"p{i}": (p, replace(greedy(25 + 5 * i), prompt_logprobs=2)) for i, p in enumerate(ps)}
    with Timer("single roomy"):
        want = collect(single(config(1, kv_cache_tokens=128 * 16)), reqs)
    cfg = config(2, kv_cache_tokens=12 * 16, max_num_batched_tokens=32, max_num_seqs=8, comm="torch")
    with Timer("2 ranks tiny pool"), Group(cfg) as eng:
        got = collect(eng, reqs)
        print(f"  preemptions {eng.stats['preemptions']} moves {eng.stats['moves']}")
        ok, why = blocks_back(eng)
        if not ok:
            bad.append(f"blocks not back: {why}")
    worst = 0.0
    for rid, (ids, p) in reqs.items():
        (wt, wl), (gt, gl) = want[rid], got[rid]
        if wt != gt:
            bad.append(f"{rid}: tokens differ")
        if gl is None or len(gl) != len(ids) - 1:
            bad.append(f"{rid}: {None if gl is None else len(gl)} prompt logprobs, want {len(ids) - 1}")
            continue
        for i, (a, b) in enumerate(zip(wl, gl)):
            worst = max(worst, abs(a.logprob - b.logprob))
            if abs(a.logprob - b.logprob) > 1e-4 or [t for t, _ in a.top] != [t for t, _ in b.top]:
                bad.append(f"{rid}: prompt logprob {i}: {a.logprob} vs {b.logprob}")
                break
    print(f"  max |d prompt logprob| {worst:.2e}")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
