"""r6: prefix-cache hits landing on different ranks, n > 1 (the front end's n choices: one request each, seed + i),
and seeded sampling: a 2- and a 4-rank group == the single process (tokens + logprobs), and a seeded request's output
does not depend on load (alone vs among others; NOTES: "load-independent seeded output")."""
import sys
from scheduler.request import SamplingParams
from _common import Group, Timer, blocks_back, compare, config, greedy, prompts, run, single


def sampled(max_tokens, seed, **kw):
    return SamplingParams(max_tokens=max_tokens, temperature=kw.pop("t", 0.9), seed=seed, logprobs=2, ignore_eos=True,
                          **kw)


def waves():
    base = prompts(3, 35, 50, seed=12)
    w1 = {f"w1-{i}": (p, greedy(5)) for i, p in enumerate(base)}
    # n = 3 choices of one prompt (seed 7 + i), greedy n = 2, and repeats of w1's prompts (cached on some rank)
    w2 = {f"n{i}": (base[0] + [99, 100], sampled(8, 7 + i, top_p=0.9)) for i in range(3)}
    w2.update({f"g{i}": (base[1] + [5], greedy(6)) for i in range(2)})
    w2.update({f"rep{i}": (p + [42 + i], sampled(6, 100 + i, top_k=20)) for i, p in enumerate(base)})
    return [w1, w2]


def main():
    bad = []
    work = waves()
    with Timer("single"):
        s = single(config(1))
        want = [run(s, w) for w in work]
        alone = {}
        for rid, req in work[1].items():       # each seeded request alone on a fresh-ish engine: load independence
            if req[1].seed is not None:
                alone.update(run(s, {rid: req}))
        print(f"  single prefix {s.prefix_cache_tokens()}")
    bad += compare({k: v for k, v in want[1].items() if k in alone}, alone, label="[single: batch vs alone] ")
    for n, comm, moe in ((2, "ipc", "ep"), (4, "ipc", "tp")):
        with Timer(f"{n} ranks"), Group(config(n, comm=comm, moe=moe)) as eng:
            ranks = {}
            got = [run(eng, w, lambda e, k, ev, o: ranks.update(e._rank_of)) for w in work]
            print(f"  ranks {ranks}")
            print(f"  prefix per rank {[(x.prefix_queried, x.prefix_hits) for x in eng.schedulers]}")
            for w, g in zip(want, got):
                bad += compare(w, g, label=f"[{n} {comm} {moe}] ")
            ok, why = blocks_back(eng)
            if not ok:
                bad.append(f"[{n}] blocks not back: {why}")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
