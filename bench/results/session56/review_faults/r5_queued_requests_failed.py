"""Requests that never ran are failed with the group. A 2-rank ProcessWorkerGroup (ipc, step_timeout_s 6,
max_num_seqs 2: one running request a rank); 4 requests: 2 run, 2 wait in the queue (no token, no KV). Rank 1 is
SIGSTOPped mid-decode; 2 s later the client of one running request leaves (an abort while the step is failing).
Checked: the waiting requests' fate, the abort, and that the engine is empty afterwards (KV blocks all free, no stream)
and serves again. Exit 1 if a request that had not started (nothing of it on the workers) is failed instead of kept
and run on the rebuilt group; the other checks are logged (and must hold for exit 0 as well)."""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import *  # noqa: F401,F403


def main() -> int:
    from cluster.async_engine import AsyncEngine
    from cluster.engine import Engine
    from cluster.workers import ProcessWorkerGroup

    c = cfg(step_timeout_s=6.0, max_num_seqs=2)
    group = ProcessWorkerGroup(c, NUM_BLOCKS, setup_timeout_s=60)
    engine = Engine(group, sched(c), num_ranks=2)
    aeng = AsyncEngine(engine)
    problems, fault, first_token = [], {}, {}

    def hook_for(rid):
        def hook(ev, n):
            first_token.setdefault(rid, time.monotonic())
            if n == 3 and not fault:
                fault["t"] = time.monotonic()
                fault["waiting"] = [r for s in engine.schedulers for r in s.live_ids() if s.get(r).status.name == "WAITING" and not s.get(r).block_ids]
                os.kill(group.procs[1].pid, signal.SIGSTOP)
                log("SIGSTOP rank 1; engine:", kv_state(engine), "not started:", fault["waiting"])
        return hook

    async def leaving(i, p):
        task = asyncio.ensure_future(collect(aeng, p, greedy(400), f"r{i}", hook_for(f"r{i}")))
        while "t" not in fault:
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.0)
        task.cancel()
        log(f"client of r{i} left 2 s after the fault")
        try:
            await task
        except asyncio.CancelledError:
            return "left"

    async def run():
        ps = prompts(4)
        return await asyncio.gather(leaving(0, ps[0]),
                                    *[collect(aeng, p, greedy(400), f"r{i}", hook_for(f"r{i}"))
                                      for i, p in enumerate(ps) if i])

    res = asyncio.run(run())
    log("r0:", res[0])
    for i, r in enumerate(res[1:], 1):
        log(f"r{i}: {len(r[0])} tokens, finish={r[1].finish_reason}, error={r[1].error!r}")
    failed_unstarted = [rid for rid in fault["waiting"]
                        if res[int(rid[1:])] != "left" and res[int(rid[1:])][1].error and not res[int(rid[1:])][0]]
    log("requests that had not started and were failed:", failed_unstarted)
    if failed_unstarted:
        problems.append(f"{failed_unstarted} had not started (queued, no KV) and were failed with the group")
    time.sleep(1.0)
    kv = kv_state(engine)
    log("engine after recovery:", kv, "forget lists:", engine._forget, "unsent:", len(engine._unsent))
    if kv["free"] != kv["total"] or kv["running"] or kv["waiting"] or kv["streams"] or kv["rank_of"]:
        problems.append(f"the engine is not empty after recovery: {kv}")
    again = asyncio.run(collect(aeng, prompts(1)[0], greedy(6), "again"))
    log("a request after recovery:", again[0], again[1].error)
    if again[1].error:
        problems.append("a request after recovery failed")
    aeng.shutdown()
    group.shutdown()
    for p in problems:
        log("PROBLEM:", p)
    log("result:", "problem present" if problems else "ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
