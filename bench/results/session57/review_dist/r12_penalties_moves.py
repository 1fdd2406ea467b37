"""r12: requests with penalties (repetition / frequency / presence) and seeded sampling, preempted and moved between
ranks of a 2-rank group with a tiny pool (a moved request's worker rebuilds its token counts from prompt + output):
tokens + logprobs == a single process with a roomy pool (no preemption, no moves)."""
import sys
from scheduler.request import SamplingParams
from _common import Group, Timer, blocks_back, compare, config, prompts, run, single


def main():
    bad = []
    ps = prompts(9, 14, 30, seed=2)
    kinds = [dict(temperature=0.0, repetition_penalty=1.3), dict(temperature=0.0, frequency_penalty=0.8),
             dict(temperature=0.9, seed=3, presence_penalty=0.7), dict(temperature=0.7, seed=9, top_k=30)]
    reqs = {"big": (prompts(1, 60, 61, seed=3)[0], SamplingParams(max_tokens=40, temperature=0.0, logprobs=2,
                                                                  ignore_eos=True))}
    reqs.update({f"q{i}": (p, SamplingParams(max_tokens=30 + 5 * (i % 3), logprobs=2, ignore_eos=True,
                                             **kinds[i % len(kinds)])) for i, p in enumerate(ps)})
    with Timer("single roomy"):
        want = run(single(config(1, kv_cache_tokens=128 * 16, max_num_seqs=16)), reqs)
    for blocks in (10, 14):
        cfg = config(2, kv_cache_tokens=blocks * 16, comm="ipc", max_num_seqs=8)
        with Timer(f"2 ranks {blocks} blocks"), Group(cfg) as eng:
            got = run(eng, reqs)
            print(f"  preemptions {eng.stats['preemptions']} moves {eng.stats['moves']}")
            bad += compare(want, got, label=f"[{blocks} blocks] ")
            ok, why = blocks_back(eng)
            if not ok:
                bad.append(f"blocks not back: {why}")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
