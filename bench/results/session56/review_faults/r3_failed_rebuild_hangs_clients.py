"""A rebuild that fails. 2-rank ProcessWorkerGroup (ipc, step_timeout_s 6); rank 1 is SIGKILLed mid-decode with 4
requests in flight, and in every rebuilt generation rank 1 fails its setup (FAULT=fail:1 — a bad disk, a GPU gone).
Expected: the 4 requests end with an error; the engine keeps running (a later request is failed with an error naming
the setup failure, or refused) and the replica's health check reports the broken group; nothing waits forever.
Exit 1 if a request gets no final event within 40 s (its client would wait forever), or the step loop died."""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["FAULT"] = "fail:1"
from _common import *  # noqa: F401,F403


def main() -> int:
    from cluster.async_engine import AsyncEngine
    from cluster.engine import Engine
    from cluster.workers import ProcessWorkerGroup

    install_faulty_main()
    c = cfg(step_timeout_s=6.0)
    group = ProcessWorkerGroup(c, NUM_BLOCKS, setup_timeout_s=30)
    calls = []
    orig = group.recover

    def traced_recover():
        calls.append(time.monotonic())
        try:
            orig()
        except BaseException as e:
            log(f"recover() #{len(calls)} raised {type(e).__name__}: {e}")
            raise
    group.recover = traced_recover
    engine = Engine(group, sched(c), num_ranks=2)
    aeng = AsyncEngine(engine)
    problems = []
    fault = {}

    def hook(ev, n):
        if n == 3 and not fault:
            fault["t"] = time.monotonic()
            os.kill(group.procs[1].pid, signal.SIGKILL)
            log("SIGKILL rank 1")

    async def one(i, p, params, rid, hook=None, limit=40):
        try:
            return await asyncio.wait_for(collect(aeng, p, params, rid, hook), limit)
        except asyncio.TimeoutError:
            return None

    async def run():
        return await asyncio.gather(*[one(i, p, greedy(400), f"r{i}", hook) for i, p in enumerate(prompts(4))])

    res = asyncio.run(run())
    for i, r in enumerate(res):
        if r is None:
            log(f"req {i}: NO final event within 40 s")
            problems.append(f"request r{i} got no final event within 40 s after the kill")
        else:
            log(f"req {i}: finish={r[1].finish_reason} error={r[1].error!r}")
    alive = aeng.is_alive()
    log(f"engine loop alive: {alive}; recover() called {len(calls)} time(s); engine streams still open: "
        f"{len(engine._streams)}; AsyncEngine queues still waiting: {sorted(aeng._queues)}")
    if not alive:
        problems.append("the engine's step loop thread died (check_health now fails: the replica is torn down)")
    later = asyncio.run(one(9, prompts(1)[0], greedy(4), "later", limit=20))
    log("a later request:", "no final event within 20 s" if later is None else
        f"finish={later[1].finish_reason} error={later[1].error!r}")
    if later is None:
        problems.append("a request arriving after the failed rebuild got no answer within 20 s (admitted, never run)")
    aeng._stop = True
    try:
        group.shutdown()
    except Exception as e:
        log("shutdown raised", type(e).__name__, e)
    for p in problems:
        log("PROBLEM:", p)
    log("result:", "problem present" if problems else "ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
