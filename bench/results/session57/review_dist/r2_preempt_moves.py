"""r2: preemption on one rank's tiny pool, requests moving rank (Engine._rebalance / _move), prefix caching on:
N-rank group tokens + logprobs == single process; every rank's blocks back after."""
import sys
from _common import Group, Timer, blocks_back, compare, config, greedy, prompts, run, single


def main():
    bad = []
    ps = prompts(8, 14, 30, seed=2)
    # rank 0 gets one big request first (KV-load placement then piles the rest elsewhere), the others grow and preempt
    reqs = {"big": (prompts(1, 60, 61, seed=3)[0], greedy(40))}
    reqs.update({f"g{i}": (p, greedy(30 + 5 * (i % 3))) for i, p in enumerate(ps)})
    for blocks in (10, 14):
        cfg = config(2, kv_cache_tokens=blocks * 16, comm="ipc", moe="tp", max_num_seqs=8)
        with Timer(f"single {blocks} blocks"):
            s = single(cfg)
            want = run(s, reqs)
            print(f"  single: preemptions {s.stats['preemptions']}")
        with Timer(f"2 ranks, {blocks} blocks a rank"), Group(cfg) as eng:
            seen = {}
            pre = []

            def hook(engine, k, evs, out):
                for rid, r in engine._rank_of.items():
                    seen.setdefault(rid, [])
                    if not seen[rid] or seen[rid][-1] != r:
                        seen[rid].append(r)
                pre.append([s.num_running for s in engine.schedulers] + [s.num_waiting for s in engine.schedulers])
            got = run(eng, reqs, hook)
            print(f"  rank history: {seen}")
            print(f"  stats: preemptions {eng.stats['preemptions']} moves {eng.stats['moves']} steps {eng.stats['steps']}")
            print(f"  running/waiting per rank over steps (first 30): {pre[:30]}")
            bad += compare(want, got, label=f"[{blocks} blocks] ")
            ok, why = blocks_back(eng)
            print(f"  blocks: {why}")
            if not ok:
                bad.append(f"blocks not back: {why}")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
