"""Every rebuilt generation of a ProcessWorkerGroup leaves named POSIX semaphores in /dev/shm. Each rank creates one
(``models/loader.py:158``: ``tqdm(...)`` — even with ``disable=True`` — makes tqdm's multiprocessing RLock, a named
semaphore registered with the driver's resource tracker, which the spawned ranks share). ``recover()`` SIGKILLs the
ranks (``ProcessWorkerGroup._kill``), so nothing unregisters them; they go only when the driver process exits.
A 2-rank group is rebuilt 3 times (as the engine does after each fault). Exit 1 if /dev/shm holds more sem.mp-*
files than the live generation's 2 ranks account for."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import *  # noqa: F401,F403


def sems():
    return {n for n in os.listdir("/dev/shm") if n.startswith("sem.mp-")}


def main() -> int:
    from cluster.workers import ProcessWorkerGroup

    before = sems()
    group = ProcessWorkerGroup(cfg(), NUM_BLOCKS, setup_timeout_s=60)
    log("up:", len(sems() - before), "new semaphores")
    for i in range(3):
        group.recover()
        log(f"after recover #{i + 1}:", len(sems() - before), "new semaphores")
    extra = len(sems() - before)
    group.shutdown()
    log("after shutdown:", len(sems() - before), "new semaphores (the driver still runs)")
    bad = extra > 2
    log("result:", f"problem present: {extra} semaphores for 2 live ranks" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
