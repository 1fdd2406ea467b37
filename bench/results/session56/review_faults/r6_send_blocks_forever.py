"""Sending a step to a stuck rank has no deadline. A 2-rank ProcessWorkerGroup (ipc, step_timeout_s 6); rank 1 is
SIGSTOPped (idle); then ``group.execute`` gets a step whose payload is larger than the channel's socket buffer: 8 MB of
KV rows in ``kv_imports`` (what a disaggregated decode replica sends with its steps; a GLM-5 prompt's KV is hundreds of
MB). ``_send`` writes it with blocking writes on the connection (``os.write`` / ``send_bytes``, no timeout), so the
driver blocks before ``_collect`` and its deadline ever start.
Exit 1 if ``execute`` has neither returned nor raised within step_timeout_s + 10 s."""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import *  # noqa: F401,F403

STEP_TIMEOUT = 6.0


def main() -> int:
    import numpy as np

    from cluster.workers import ProcessWorkerGroup
    from workers.runner import WorkerStep

    group = ProcessWorkerGroup(cfg(step_timeout_s=STEP_TIMEOUT), NUM_BLOCKS, setup_timeout_s=60)
    stopped = group.procs[1].pid
    os.kill(stopped, signal.SIGSTOP)
    log(f"SIGSTOP rank 1 (pid {stopped})")
    rows = np.zeros(8 << 20, dtype=np.uint8)
    steps = [WorkerStep(step_id=1, seqs=(), kv_imports=(((0, 1), (rows,)),)) for _ in range(2)]
    out = {}

    def run():
        t = time.monotonic()
        try:
            group.execute(steps)
            out["r"] = "returned"
        except BaseException as e:
            out["r"] = f"{type(e).__name__}: {e}"
        out["t"] = time.monotonic() - t

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(STEP_TIMEOUT + 10)
    stuck = th.is_alive()
    if stuck:
        import sys as _s
        import traceback

        frame = _s._current_frames()[th.ident]
        where = traceback.format_stack(frame)[-3:]
        log(f"execute still blocked after {STEP_TIMEOUT + 10:.0f}s, in:\n" + "".join(where))
    else:
        log(f"execute ended after {out['t']:.1f}s: {out['r']}")
    os.kill(stopped, signal.SIGKILL)
    th.join(10)
    log("after SIGKILL of the stopped rank:", out.get("r"), f"({out.get('t', 0):.1f}s)")
    try:
        group._kill()
        group._manager.shutdown()
    except Exception as e:
        log("cleanup:", e)
    log("result:", "problem present: the send to a stuck rank is unbounded" if stuck else "ok")
    return 1 if stuck else 0


if __name__ == "__main__":
    sys.exit(main())
