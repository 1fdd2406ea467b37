"""r1: an N-rank group (2 and 4 ranks, ipc/torch, tp/ep) == the single process, tokens and logprobs, under uneven load:
one long prompt chunked on one rank while the other ranks decode many short requests that end at different steps,
requests arriving mid-run, ranks going idle; all blocks back on every rank after."""
import sys
from _common import Group, Timer, blocks_back, compare, config, greedy, prompts, run, single

def workload():
    ps = prompts(8, 3, 30, seed=1)
    reqs = {"long": (prompts(1, 150, 151, seed=9)[0], greedy(6))}
    for i, p in enumerate(ps[:6]):
        reqs[f"s{i}"] = (p, greedy(2 + 3 * i))
    late = {f"late{i}": (p, greedy(5 + 4 * i)) for i, p in enumerate(ps[6:])}
    return reqs, late

def add_late(late):
    def hook(engine, n, evs, out):
        if n == 4:
            for rid, (ids, p) in late.items():
                engine.add_request(ids, p, rid)
                out[rid] = {"tokens": [], "lps": [], "reason": None, "error": None}
    return hook

def main():
    bad = []
    reqs, late = workload()
    with Timer("single"):
        want = run(single(config(1)), reqs, add_late(late))
    for n, comm, moe in ((2, "ipc", "tp"), (4, "torch", "ep")):
        cfg = config(n, comm=comm, moe=moe)
        with Timer(f"{n} ranks {comm} {moe}"), Group(cfg) as eng:
            ranks = {}
            def hook(engine, k, evs, out, inner=add_late(late)):
                inner(engine, k, evs, out)
                for rid, r in engine._rank_of.items():
                    ranks.setdefault(rid, set()).add(r)
            got = run(eng, reqs, hook)
            print(f"  placement: { {rid: sorted(r) for rid, r in ranks.items()} }")
            print(f"  stats: steps {eng.stats['steps']} span {eng.stats['span_steps']} moves {eng.stats['moves']} "
                  f"preemptions {eng.stats['preemptions']}")
            bad += compare(want, got, label=f"[{n} {comm} {moe}] ")
            ok, why = blocks_back(eng)
            print(f"  blocks: {why}")
            if not ok:
                bad.append(f"[{n}] blocks not back: {why}")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)

if __name__ == '__main__':
    main()
