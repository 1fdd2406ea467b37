"""The coordinator's health check while its worker group is broken. A ``Coordinator`` (cluster/coordinator.py) whose
group is a 2-rank ProcessWorkerGroup (its ``_build_group`` overridden: no Ray needed), idle; rank 1 is SIGKILLed.
``check_health`` (what Serve polls to replace a broken replica) is asked while the rank is dead, then a request comes.
Exit 1 if check_health passes while a rank of the group is dead (Serve keeps routing requests to the replica)."""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import *  # noqa: F401,F403


def main() -> int:
    from cluster.coordinator import Coordinator
    from cluster.workers import ProcessWorkerGroup

    class ProcCoordinator(Coordinator):
        @staticmethod
        def _build_group(cfg, num_blocks, imports=False):
            return ProcessWorkerGroup(cfg, num_blocks, setup_timeout_s=60)

    coord = ProcCoordinator(cfg(step_timeout_s=6.0, warmup_tokens=0).to_dict())

    async def ask(rid, n=6):
        out = [ev async for ev in coord.generate(prompts(1)[0], greedy(n), rid)]
        return sum((e.token_ids for e in out), []), out[-1]

    async def health():
        try:
            await coord.check_health()
            return "healthy"
        except Exception as e:
            return f"unhealthy: {e}"

    async def scenario():
        toks, last = await ask("before")
        log("before:", toks, last.error)
        await asyncio.sleep(2.0)        # the step that tells the workers to forget the finished request has gone out
        steps = coord.engine.stats["steps"]
        pid = coord.group.procs[1].pid
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(3.0)
        log(f"rank 1 (pid {pid}) killed; is_alive={coord.group.procs[1].is_alive()} state={proc_state(pid)} "
            f"pids now {[p.pid for p in coord.group.procs]} engine steps {steps} -> {coord.engine.stats['steps']}")
        h = await health()
        log("check_health with a dead rank:", h)
        t = time.monotonic()
        toks, last = await ask("next")
        log(f"the next request: tokens={toks} finish={last.finish_reason} error={last.error!r} "
            f"({time.monotonic() - t:.1f}s)")
        toks2, last2 = await ask("after")
        log("after the rebuild:", toks2, last2.error, "| health:", await health())
        return h

    h = asyncio.run(scenario())
    coord.aengine.shutdown()
    coord.group.shutdown()
    bad = h == "healthy"
    log("result:", "problem present: healthy while a rank is dead" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
