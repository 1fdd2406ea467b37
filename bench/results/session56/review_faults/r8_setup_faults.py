"""Scenario 2: faults during a 2-rank ProcessWorkerGroup's setup (ipc comm, setup_timeout_s 40): rank 1 raises while
loading (FAULT fail:1), exits while loading (die:1), stalls (SIGSTOPs itself before loading, stop:1). Each must fail
start-up within the bound with a GroupFailure that names rank 1 and the cause, and leave no process behind.
Exit 1 if one is unbounded, leaves a process, or its error does not single out rank 1 (the stalled case blames
"rank(s) [0, 1]": the healthy rank 0, which waits for rank 1 at the rendezvous, is named too)."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import *  # noqa: F401,F403

SETUP_TIMEOUT = 40.0


def one(fault: str) -> str:
    """Run one case in a fresh interpreter (a clean ProcessWorkerGroup); prints 'RESULT <seconds>|<error>|<left>'."""
    code = f"""
import os, sys, time
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
os.environ["FAULT"], os.environ["FAULT_GENS"] = {fault!r}, "all"
from _common import *
if __name__ == "__main__":
    from cluster.workers import ProcessWorkerGroup
    install_faulty_main()
    t = time.monotonic()
    try:
        g = ProcessWorkerGroup(cfg(), NUM_BLOCKS, setup_timeout_s={SETUP_TIMEOUT})
        err = "no error"
    except Exception as e:
        err = type(e).__name__ + ": " + str(e)
    took = time.monotonic() - t
    time.sleep(0.5)
    left = [p for p in children() if proc_state(p) not in ("gone", "Z")
            and "resource_tracker" not in open(f"/proc/{{p}}/cmdline").read()
            and "forkserver" not in open(f"/proc/{{p}}/cmdline").read()]
    left = [p for p in left if "SyncManager" not in open(f"/proc/{{p}}/cmdline").read()]
    print("RESULT", f"{{took:.1f}}|{{err}}|{{[(p, proc_state(p)) for p in left]}}", flush=True)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
    return line[-1][7:] if line else f"?|no result: {out.stderr[-500:]}|?"


def main() -> int:
    problems = []
    for fault in ("fail:1", "die:1", "stop:1"):
        took, err, left = one(fault).split("|", 2)
        log(f"{fault}: {took}s: {err} | processes left: {left}")
        if err == "no error" or float(took) > SETUP_TIMEOUT + 5:
            problems.append(f"{fault}: unbounded or no error ({took}s, {err})")
        if left not in ("[]",):
            problems.append(f"{fault}: processes left: {left}")
        if "rank 1" not in err or "[0, 1]" in err:
            problems.append(f"{fault}: the error does not single out rank 1: {err}")
    for p in problems:
        log("PROBLEM:", p)
    log("result:", "problem present" if problems else "ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
