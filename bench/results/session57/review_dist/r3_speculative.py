"""r3: MTP speculation (k = 1..3) in 2- and 4-rank groups == single-process plain decode: greedy tokens + logprobs,
solo requests (verify rides a span) and a batch that drains to one request (drafts resume mid-request); seeded
sampled requests too (NOTES: seeded output is load-independent, spec draws with the plain noise)."""
import sys
from scheduler.request import SamplingParams
from _common import Group, Timer, blocks_back, compare, config, greedy, prompts, run, single


def seeded(max_tokens, seed):
    return SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.95, seed=seed, logprobs=2, ignore_eos=True)


def main():
    bad = []
    ps = prompts(5, 4, 30, seed=4)
    solo = [{f"solo{i}": (ps[i], greedy(14))} for i in range(2)]
    solo.append({"solo_seeded": (ps[2], seeded(14, 11))})
    batch = {"b0": (ps[3], greedy(3)), "b1": (ps[4], greedy(16)), "b2": (ps[0], seeded(10, 5))}
    with Timer("single plain"):
        s = single(config(1))
        want = [run(s, r) for r in solo] + [run(s, batch)]
    for n, k in ((2, 1), (2, 3), (4, 2), (4, 3)):
        cfg = config(n, speculative_tokens=k, comm="ipc" if n == 2 else "torch")
        with Timer(f"{n} ranks k={k}"), Group(cfg) as eng:
            got = [run(eng, r) for r in solo] + [run(eng, batch)]
            st = eng.stats
            print(f"  stats: span {st['span_steps']} rounds {st['draft_rounds']} proposed {st['drafts_proposed']} "
                  f"accepted {st['drafts_accepted']}")
            for w, g in zip(want, got):
                bad += compare(w, g, label=f"[{n} k={k}] ")
            ok, why = blocks_back(eng)
            if not ok:
                bad.append(f"[{n} k={k}] blocks not back: {why}")
            if st["drafts_accepted"] == 0:
                bad.append(f"[{n} k={k}] no draft accepted (speculation not exercised)")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
