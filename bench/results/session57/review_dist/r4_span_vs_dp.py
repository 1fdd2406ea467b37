"""r4: DESIGN §2/§4 — Span and Dp row maps must be bit-identical. The same solo requests (prefill chunks and, with
k = 3, verify rows ride a span when span is on; dp stripes when off) on a group with Engine(span=True) vs
Engine(span=False): tokens and logprobs exactly equal (tolerance 0), 2 ranks ipc tp, 4 ranks torch ep."""
import sys
from _common import Group, Timer, compare, config, greedy, prompts, run


def main():
    bad = []
    ps = prompts(3, 20, 90, seed=6)
    work = [{f"solo{i}": (p, greedy(10))} for i, p in enumerate(ps)]
    for n, comm, moe, k in ((2, "ipc", "tp", 0), (4, "torch", "ep", 3)):
        outs = {}
        for span in (True, False):
            cfg = config(n, comm=comm, moe=moe, speculative_tokens=k, max_num_batched_tokens=32)
            with Timer(f"{n} {comm} {moe} k={k} span={span}"), Group(cfg, span=span) as eng:
                outs[span] = [run(eng, w) for w in work]
                print(f"  span_steps {eng.stats['span_steps']} steps {eng.stats['steps']}")
                if span and not eng.stats["span_steps"]:
                    bad.append("no span step ran")
        for a, b in zip(outs[True], outs[False]):
            bad += compare(a, b, tol=0.0, label=f"[{n} {comm} {moe} k={k} span vs dp] ")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
