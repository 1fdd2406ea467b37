"""Scenario 6, Ray: a 2-rank RayWorkerGroup (socket step channel, ipc comm, step_timeout_s 6) under an AsyncEngine.
(a) rank 1's actor process is SIGSTOPped mid-decode with 4 requests in flight: do they fail in about step_timeout_s,
is the stopped process killed (ray.kill on a stopped process), do later requests give the baseline tokens?
(b) rank 0's actor is ray.kill-ed mid-decode: the same. (c) the stopped pid is SIGCONTed late: nothing changes.
Exit 1 if a request ends without an error, an old actor process is still alive 20 s after the recovery, the tokens
after recovery differ, or the engine is not empty."""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
from _common import *  # noqa: F401,F403

STEP_TIMEOUT = 6.0


def main() -> int:
    import ray

    from cluster.async_engine import AsyncEngine
    from cluster.engine import Engine
    from cluster.workers import RayWorkerGroup

    ray.init(address="local", num_cpus=16, include_dashboard=False, log_to_driver=False)
    problems = []
    c = cfg(step_timeout_s=STEP_TIMEOUT)
    group = RayWorkerGroup(c, NUM_BLOCKS, setup_timeout_s=120)
    engine = Engine(group, sched(c), num_ranks=2)
    aeng = AsyncEngine(engine)
    ps = prompts(4)

    def pids():
        return [ray.get(a.__ray_call__.remote(lambda self: os.getpid()), timeout=30) for a in group.actors]

    async def batch(tag, n, hook=None):
        return await asyncio.gather(*[collect(aeng, p, greedy(n), f"{tag}{i}", hook) for i, p in enumerate(ps)])

    base = [r[0] for r in asyncio.run(batch("base", 10))]
    log("baseline", base)
    old = []
    for case in ("sigstop rank 1", "ray.kill rank 0"):
        victims = pids()
        old += victims
        fault = {}

        def hook(ev, n):
            if n == 3 and not fault:
                fault["t"] = time.monotonic()
                if case.startswith("sigstop"):
                    os.kill(victims[1], signal.SIGSTOP)
                else:
                    ray.kill(group.actors[0], no_restart=True)
                log(f"{case} (pids {victims})")

        res = asyncio.run(batch(case[:4], 400, hook))
        took = time.monotonic() - fault["t"]
        for i, (toks, last, secs) in enumerate(res):
            log(f"  req {i}: {len(toks)} tokens finish={last.finish_reason} error={last.error!r}")
            if not last.error:
                problems.append(f"{case}: request {i} ended without an error")
        log(f"  requests ended {took:.1f}s after the fault")
        time.sleep(1)
        log(f"  old pids {victims}: {[proc_state(p) for p in victims]}; new pids {pids()}")
        after = [r[0] for r in asyncio.run(batch(f"after{case[:4]}", 10))]
        if after != base:
            problems.append(f"{case}: tokens after recovery differ: {after}")
        kv = kv_state(engine)
        if kv["free"] != kv["total"] or kv["streams"] or kv["rank_of"]:
            problems.append(f"{case}: engine not empty: {kv}")
        log("  after:", "same tokens" if after == base else after, kv)
    for p in old:
        try:
            os.kill(p, signal.SIGCONT)
        except ProcessLookupError:
            pass
    t = time.monotonic()
    while time.monotonic() - t < 20 and any(proc_state(p) not in ("gone", "Z") for p in old):
        time.sleep(1)
    alive = {p: proc_state(p) for p in old if proc_state(p) not in ("gone", "Z")}
    log("old actor processes 20 s after late SIGCONT:", {p: proc_state(p) for p in old})
    if alive:
        problems.append(f"old actor processes still alive: {alive}")
    after = [r[0] for r in asyncio.run(batch("late", 10))]
    if after != base:
        problems.append(f"tokens after the late SIGCONT differ: {after}")
    aeng.shutdown()
    group.shutdown()
    ray.shutdown()
    for p in problems:
        log("PROBLEM:", p)
    log("result:", "problem present" if problems else "ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
