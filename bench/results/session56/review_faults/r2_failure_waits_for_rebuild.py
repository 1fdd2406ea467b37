"""Failed requests are told only after the group has been rebuilt. A 2-rank ProcessWorkerGroup (ipc, step_timeout_s
6); rank 1 is SIGKILLed mid-decode with 4 requests in flight, and the rebuilt generation's rank 1 takes 25 s to set
up (FAULT=slow:1:25 — a real checkpoint's load takes minutes). The standard: the affected requests fail fast. Measured:
the time from the kill to each request's error event, and how long ``recover()`` ran.
Exit 1 if the errors reach the clients only after the rebuild (more than step_timeout_s + 4 s after the kill)."""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["FAULT"] = "slow:1:25"
from _common import *  # noqa: F401,F403

STEP_TIMEOUT = 6.0


def main() -> int:
    from cluster.async_engine import AsyncEngine
    from cluster.engine import Engine
    from cluster.workers import ProcessWorkerGroup

    install_faulty_main()
    c = cfg(step_timeout_s=STEP_TIMEOUT)
    group = ProcessWorkerGroup(c, NUM_BLOCKS, setup_timeout_s=60)
    spans = []
    orig = group.recover

    def timed_recover():
        t = time.monotonic()
        try:
            orig()
        finally:
            spans.append((t, time.monotonic()))
            log(f"recover() ran {time.monotonic() - t:.1f}s")
    group.recover = timed_recover
    engine = Engine(group, sched(c), num_ranks=2)
    aeng = AsyncEngine(engine)
    fault = {}

    def hook(ev, n):
        if n == 3 and not fault:
            fault["t"] = time.monotonic()
            os.kill(group.procs[1].pid, signal.SIGKILL)
            log("SIGKILL rank 1")

    async def run():
        return await asyncio.gather(*[collect(aeng, p, greedy(400), f"r{i}", hook) for i, p in enumerate(prompts(4))])

    res = asyncio.run(run())
    ends = []
    for i, (toks, last, secs) in enumerate(res):
        log(f"req {i}: finish={last.finish_reason} error={last.error!r}")
    took = time.monotonic() - fault["t"]
    log(f"the last error event reached its client {took:.1f}s after the kill; recover() spans "
        f"{[(round(a - fault['t'], 1), round(b - fault['t'], 1)) for a, b in spans]} (s after the kill)")
    aeng.shutdown()
    group.shutdown()
    bad = took > STEP_TIMEOUT + 4
    log("result:", "problem present: the failure waited for the rebuild" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
