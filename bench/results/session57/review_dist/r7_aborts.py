"""r7: aborts on one rank — between steps and while a step is in flight (engine.abort called from inside the group's
execute, as the AsyncEngine's caller thread can) — of a waiting, a prefilling (chunked) and a decoding request, with
and without speculation: the other requests' tokens + logprobs == the single process's run without the aborted ones;
every rank's blocks back; the aborted ids reused afterwards give the single process's output."""
import sys
from _common import Group, Timer, blocks_back, compare, config, greedy, prompts, run, single


def main():
    bad = []
    ps = prompts(8, 5, 30, seed=13)
    keep = {f"k{i}": (p, greedy(10 + 2 * i)) for i, p in enumerate(ps[:5])}
    doomed = {"d_long": (prompts(1, 200, 201, seed=14)[0], greedy(8)),    # aborted while its prompt is chunked
              "d_dec": (ps[5], greedy(30)), "d_wait": (ps[6], greedy(5)), "d_mid": (ps[7], greedy(30))}
    reuse = {"d_dec": (ps[0][:4] + [7, 8, 9], greedy(6)), "d_long": (ps[1], greedy(6))}
    for k in (0, 2):
        cfg = config(2, comm="ipc", speculative_tokens=k, max_num_seqs=8, max_num_batched_tokens=32)
        with Timer(f"single k={k}"):
            s = single(config(1, speculative_tokens=0))
            want = run(s, keep)
            want_reuse = run(s, reuse)
        with Timer(f"2 ranks k={k}"), Group(cfg) as eng:
            group = eng.executor
            inner = group.execute
            state = {"step": 0}

            def execute(steps):
                state["step"] += 1
                if state["step"] == 6:          # while this step's rows are on the ranks
                    sent = group._send_all(steps, "step", group.cfg.step_timeout_s)
                    ev = eng.abort("d_mid")
                    print(f"  abort d_mid in flight: {ev and ev.finish_reason}, "
                          f"rank {[r for r, sch in enumerate(eng.schedulers) if sch.get('d_mid')]}")
                    return group._collect(group.cfg.step_timeout_s, "step")
                return inner(steps)
            group.execute = execute

            def hook(e, n, evs, out):
                if n == 1:
                    e.abort("d_wait")
                if n == 3:
                    e.abort("d_long")
                if n == 8:
                    e.abort("d_dec")
            got = run(eng, {**keep, **doomed}, hook)
            print(f"  doomed: { {r: (got[r]['reason'], len(got[r]['tokens'])) for r in doomed} }")
            print(f"  free per rank {[x.pool.num_free for x in eng.schedulers]}")
            bad += compare(want, {r: got[r] for r in keep}, label=f"[k={k} survivors] ")
            ok, why = blocks_back(eng)
            print(f"  blocks: {why}")
            if not ok:
                bad.append(f"[k={k}] blocks not back: {why}")
            bad += compare(want_reuse, run(eng, reuse), label=f"[k={k} reused ids] ")
            ok, why = blocks_back(eng)
            if not ok:
                bad.append(f"[k={k}] blocks not back after reuse: {why}")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
