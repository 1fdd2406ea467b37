"""r14: seeded sampled requests (with top-p / top-k / min-p, penalties, logprobs) on graph-shaped steps with look-ahead
(cuda_graphs: eager) in 2- and 4-rank groups, under uneven load and a tiny pool (preemption, moves): == the plain
single process with a roomy pool (NOTES: seeded output is load-independent)."""
import sys
from scheduler.request import SamplingParams
from _common import Group, Timer, blocks_back, compare, config, prompts, run, single


def main():
    bad = []
    ps = prompts(9, 10, 40, seed=51)
    kinds = [dict(temperature=0.9, seed=1, top_p=0.9), dict(temperature=1.1, seed=2, top_k=25, min_p=0.02),
             dict(temperature=0.8, seed=3, frequency_penalty=0.5, repetition_penalty=1.2), dict(temperature=0.0)]
    reqs = {f"q{i}": (p, SamplingParams(max_tokens=12 + 4 * i, logprobs=1, ignore_eos=True, **kinds[i % 4]))
            for i, p in enumerate(ps)}
    reqs["long"] = (prompts(1, 130, 131, seed=52)[0], SamplingParams(max_tokens=10, temperature=0.9, seed=77,
                                                                      logprobs=1, ignore_eos=True))
    with Timer("single roomy"):
        want = run(single(config(1, kv_cache_tokens=128 * 16, max_num_seqs=16)), reqs)
    for n, blocks in ((2, 14), (4, 64)):
        cfg = config(n, cuda_graphs="eager", kv_cache_tokens=blocks * 16, max_num_seqs=8, comm="ipc")
        with Timer(f"{n} ranks eager graphs, {blocks} blocks"), Group(cfg) as eng:
            got = run(eng, reqs)
            st = eng.stats
            print(f"  graph {st['graph_steps']} ahead {st['ahead_steps']} preempt {st['preemptions']} moves {st['moves']}")
            bad += compare(want, got, label=f"[{n} eager {blocks}] ")
            ok, why = blocks_back(eng)
            if not ok:
                bad.append(f"[{n} {blocks}] blocks not back: {why}")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
