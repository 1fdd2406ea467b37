"""Scenario 1: a stuck peer. One rank of a 2-rank ProcessWorkerGroup (ipc comm, step_timeout_s 6) is SIGSTOPped
mid-decode with 4 requests in flight (COMM=torch: gloo instead of ipc); later the same with SIGCONT arriving after the timeout (a zombie that wakes).
Checks: the group failure is raised within step_timeout_s + 3 s and every request fails with an error naming the
problem (the time its clients see it is logged: it also includes the rebuild, see r2); the group is rebuilt and
the same requests afterwards give the tokens they gave before the fault; the stopped process is killed and reaped; no
/dev/shm segment, child process or thread is left; the KV pools are empty.
Exit 1 if any check fails (the problem is present), 0 otherwise."""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import *  # noqa: F401,F403

STEP_TIMEOUT = 6.0
BOUND = STEP_TIMEOUT + 3.0      # "about step_timeout_s": the group failure must be raised by then


def main() -> int:
    from cluster.async_engine import AsyncEngine
    from cluster.engine import Engine
    from cluster.workers import ProcessWorkerGroup

    problems = []
    shm0, threads0 = shm_names(), threads()
    c = cfg(step_timeout_s=STEP_TIMEOUT, comm=os.environ.get("COMM", "ipc"))
    log("comm backend:", c.comm)
    group = ProcessWorkerGroup(c, NUM_BLOCKS, setup_timeout_s=60)
    failures = []
    orig_execute = group.execute

    def execute(steps):
        try:
            return orig_execute(steps)
        except Exception as e:
            failures.append(time.monotonic())
            raise
    group.execute = execute
    engine = Engine(group, sched(c), num_ranks=2)
    aeng = AsyncEngine(engine)
    ps = prompts(4)

    async def batch(tag, max_tokens, hook=None):
        return await asyncio.gather(*[collect(aeng, p, greedy(max_tokens), f"{tag}{i}", hook) for i, p in enumerate(ps)])

    before = [r[0] for r in asyncio.run(batch("base", 12))]
    log("baseline tokens", before)
    for victim, wake_after in ((1, None), (0, STEP_TIMEOUT + 6.0)):
        pid = group.procs[victim].pid
        fault = {}

        def hook(ev, n):
            if n == 3 and not fault:
                fault["t"] = time.monotonic()
                os.kill(pid, signal.SIGSTOP)
                log(f"SIGSTOP rank {victim} pid {pid}")
                if wake_after:
                    def wake():
                        time.sleep(wake_after)
                        try:
                            os.kill(pid, signal.SIGCONT)
                            log(f"late SIGCONT to pid {pid}: state was {proc_state(pid)}")
                        except ProcessLookupError:
                            log(f"late SIGCONT: pid {pid} already gone")
                    threading.Thread(target=wake, daemon=True).start()

        res = asyncio.run(batch(f"f{victim}-", 400, hook))
        for i, (toks, last, secs) in enumerate(res):
            log(f"req {i}: {len(toks)} tokens, finish={last.finish_reason}, error={last.error!r}, {secs:.1f}s")
            if not (last.finished and last.error):
                problems.append(f"rank {victim} stopped: request {i} ended without an error")
        took = time.monotonic() - fault["t"]
        raised = failures[-1] - fault["t"] if failures else float("inf")
        log(f"GroupFailure raised {raised:.1f}s after the SIGSTOP; the clients got their errors {took:.1f}s after it")
        if raised > BOUND:
            problems.append(f"rank {victim} stopped: the group failure came {raised:.1f}s after the fault (> {BOUND:.0f}s)")
        if wake_after:
            time.sleep(max(0.0, fault["t"] + wake_after + 1 - time.monotonic()))
        st = proc_state(pid)
        log(f"stopped pid {pid} now: {st}")
        if st != "gone":
            problems.append(f"the stopped rank's process {pid} is still there ({st})")
        after = [r[0] for r in asyncio.run(batch(f"after{victim}-", 12))]
        log("tokens after rebuild", after)
        if after != before:
            problems.append(f"rank {victim}: tokens after the rebuild differ from before the fault")
        kv = kv_state(engine)
        log("engine state", kv)
        if kv["free"] != kv["total"] or kv["running"] or kv["waiting"] or kv["streams"] or kv["rank_of"]:
            problems.append(f"rank {victim}: engine not empty after recovery: {kv}")
    aeng.shutdown()
    group.shutdown()
    time.sleep(1)
    left = [p for p in children() if proc_state(p) not in ("gone", "Z")]
    cmd = {p: open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:100] for p in left if proc_state(p) != "gone"}
    log("children left after shutdown", cmd)
    if any("resource_tracker" not in v for v in cmd.values()):
        problems.append(f"processes left after shutdown: {cmd}")
    zombies = [p for p in children() if proc_state(p) == "Z"]
    if zombies:
        problems.append(f"zombie children: {zombies}")
    if shm_names() - shm0:
        problems.append(f"/dev/shm segments left: {shm_names() - shm0}")
    extra = sorted(set(threads()) - set(threads0))
    log("threads", threads0, "->", threads())
    if extra:
        problems.append(f"threads left: {extra}")
    for p in problems:
        log("PROBLEM:", p)
    log("result:", "problem present" if problems else "ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
