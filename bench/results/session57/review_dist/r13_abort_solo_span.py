"""r13: a solo request riding span steps (its prefill chunks, and k = 3 verify rows) aborted while the step is on the
ranks; then a step with nothing but the forget; then the same prompt again and a second one: == the single process;
every rank's blocks back. 4 ranks ipc."""
import sys
from _common import Group, Timer, blocks_back, compare, config, greedy, prompts, run, single


def main():
    bad = []
    p = prompts(2, 70, 80, seed=41)
    after = {"again": (p[0], greedy(12)), "other": (p[1], greedy(9))}
    with Timer("single"):
        want = run(single(config(1)), after)
    cfg = config(4, comm="ipc", speculative_tokens=3, max_num_batched_tokens=32)
    with Timer("4 ranks"), Group(cfg) as eng:
        group = eng.executor
        inner = group.execute
        for abort_at in (2, 6):         # 2: during its prompt's second chunk (span); 6: during a verify span
            state = {"n": 0}

            def execute(steps, abort_at=abort_at):
                state["n"] += 1
                if state["n"] == abort_at:
                    group._send_all(steps, "step", group.cfg.step_timeout_s)
                    print(f"  abort at step {abort_at}: shape {steps[0].shape}, drafts {steps[0].num_drafts}")
                    eng.abort("solo")
                    return group._collect(group.cfg.step_timeout_s, "step")
                return inner(steps)
            group.execute = execute
            eng.add_request(p[0], greedy(30), "solo")
            while eng.has_work():
                for ev in eng.step():
                    assert ev.error is None, ev.error
            group.execute = inner
            ok, why = blocks_back(eng)
            print(f"  after abort: {why}; forget pending {eng._forget}")
            if not ok:
                bad.append(f"blocks not back after abort at {abort_at}: {why}")
        print(f"  span steps {eng.stats['span_steps']} rounds {eng.stats['draft_rounds']}")
        got = run(eng, after)
        bad += compare(want, got, label="[after aborts] ")
        ok, why = blocks_back(eng)
        if not ok:
            bad.append(f"blocks not back: {why}")
    for b in bad:
        print("DIFF", b)
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
