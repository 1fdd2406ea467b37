"""r11: odd group configs == the single process (tokens + logprobs): block_size 8 and 32, a token budget that is no
power of two (48), max_num_seqs not divisible by the ranks (3 over 2) and smaller than the ranks (2 over 4: a seat a
rank), prefix caching off; a mixed workload with a chunked long prompt and staggered ends."""
import sys
from _common import Group, Timer, blocks_back, compare, config, greedy, prompts, run, single


def main():
    bad = []
    reqs = {"long": (prompts(1, 130, 131, seed=31)[0], greedy(5))}
    reqs.update({f"s{i}": (p, greedy(3 + 4 * i)) for i, p in enumerate(prompts(5, 3, 40, seed=32))})
    for n, kw in ((2, dict(block_size=8, max_num_batched_tokens=48, max_num_seqs=3, comm="ipc")),
                  (4, dict(block_size=32, max_num_batched_tokens=48, max_num_seqs=2, comm="torch",
                           prefix_caching=False)),
                  (4, dict(block_size=16, max_num_batched_tokens=100, max_num_seqs=16, comm="ipc", moe="ep",
                           speculative_tokens=2))):
        cfg = config(n, **kw)
        with Timer(f"single {kw}"):
            want = run(single(config(1, **{k: v for k, v in kw.items() if k != 'speculative_tokens'})), reqs)
        with Timer(f"{n} ranks {kw}"), Group(cfg) as eng:
            got = run(eng, reqs)
            print(f"  steps {eng.stats['steps']} span {eng.stats['span_steps']} moves {eng.stats['moves']} "
                  f"preempt {eng.stats['preemptions']}")
            bad += compare(want, got, label=f"[{n} {kw}] ")
            ok, why = blocks_back(eng)
            if not ok:
                bad.append(f"[{n} {kw}] blocks not back: {why}")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
