"""r5: kv_cache_dtype fp8 and the host tier (host_kv_cache_tokens) in 2- and 4-rank groups == the single process with
the same settings: tokens + logprobs, a workload whose shared prefixes are evicted from a small device pool to host
memory and loaded back on whichever rank the repeat lands; blocks back after."""
import sys
from _common import Group, Timer, blocks_back, compare, config, greedy, prompts, run, single


def main():
    bad = []
    sysp = prompts(2, 40, 41, seed=7)           # two "system prompts" of 40 tokens (2 full blocks + 8)
    tails = prompts(6, 3, 12, seed=8)
    first = {f"a{i}": (sysp[i % 2] + t, greedy(6)) for i, t in enumerate(tails)}
    evict = {f"fill{i}": (p, greedy(3)) for i, p in enumerate(prompts(4, 100, 120, seed=10))}
    again = {f"b{i}": (sysp[i % 2] + t, greedy(6)) for i, t in enumerate(reversed(tails))}
    work = [first, evict, again]
    for fp8, host in ((True, 0), (False, 64 * 16), (True, 64 * 16)):
        kw = dict(kv_cache_tokens=12 * 16, host_kv_cache_tokens=host, kv_cache_dtype="fp8" if fp8 else "auto",
                  max_num_seqs=8)
        with Timer(f"single fp8={fp8} host={host}"):
            s = single(config(1, **kw))
            want = [run(s, w) for w in work]
            print(f"  single: host_loads {sum(x.host_loads for x in s.schedulers)} prefix {s.prefix_cache_tokens()}")
        for n, comm in ((2, "torch"), (4, "ipc")):
            with Timer(f"{n} ranks {comm} fp8={fp8} host={host}"), Group(config(n, comm=comm, **kw)) as eng:
                got = [run(eng, w) for w in work]
                print(f"  host_loads per rank {[x.host_loads for x in eng.schedulers]} prefix "
                      f"{eng.prefix_cache_tokens()} preemptions {eng.stats['preemptions']}")
                for w, g in zip(want, got):
                    bad += compare(w, g, label=f"[{n} fp8={fp8} host={host}] ")
                ok, why = blocks_back(eng)
                if not ok:
                    bad.append(f"[{n} fp8={fp8} host={host}] blocks not back: {why}")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
