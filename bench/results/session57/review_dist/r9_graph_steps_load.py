"""r9: graph-shaped steps (cuda_graphs: eager — the static decode path with look-ahead, run eagerly on CPU) in 2- and
4-rank groups under uneven load, staggered ends, a tiny pool (preemption, moves) and an abort in flight: tokens +
logprobs == the plain single process; blocks back."""
import sys
from _common import Group, Timer, blocks_back, compare, config, greedy, prompts, run, single


def main():
    bad = []
    ps = prompts(8, 14, 30, seed=2)
    reqs = {"big": (prompts(1, 60, 61, seed=3)[0], greedy(40))}
    reqs.update({f"g{i}": (p, greedy(30 + 5 * (i % 3))) for i, p in enumerate(ps)})
    uneven = {"long": (prompts(1, 150, 151, seed=9)[0], greedy(6))}
    uneven.update({f"s{i}": (p, greedy(2 + 3 * i)) for i, p in enumerate(prompts(7, 3, 30, seed=1))})
    with Timer("single plain"):
        s = single(config(1))
        want_u = run(s, uneven)
        want_p = run(s, reqs)
    for n, blocks in ((2, 10), (4, 10), (2, 64)):
        cfg = config(n, cuda_graphs="eager", kv_cache_tokens=blocks * 16, max_num_seqs=8, comm="ipc")
        with Timer(f"{n} ranks eager graphs, {blocks} blocks"), Group(cfg) as eng:
            got_u = run(eng, uneven) if blocks == 64 else None
            got_p = run(eng, reqs)
            st = eng.stats
            print(f"  graph {st['graph_steps']} ahead {st['ahead_steps']} preempt {st['preemptions']} moves {st['moves']}")
            if got_u:
                bad += compare(want_u, got_u, label=f"[{n} eager {blocks} uneven] ")
            bad += compare(want_p, got_p, label=f"[{n} eager {blocks} pressure] ")
            ok, why = blocks_back(eng)
            if not ok:
                bad.append(f"[{n} {blocks}] blocks not back: {why}")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
