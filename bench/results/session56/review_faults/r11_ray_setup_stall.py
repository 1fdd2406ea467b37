"""Scenario 2 with Ray: a 2-rank RayWorkerGroup whose rank 1 stalls in its setup (its worker's constructor sleeps
past the group's setup_timeout_s of 20 s: a hung filesystem, a stuck GPU init). Expected: GroupFailure within the bound,
naming the rank that did not answer; no actor left. ``RayWorkerGroup._wait`` says only "N rank(s) did not answer".
Exit 1 if unbounded, an actor of the group is left alive, or the error does not name rank 1."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
from _common import *  # noqa: F401,F403
from workers.worker import Worker  # noqa: E402


class StallingWorker(Worker):
    def __init__(self, spec, rendezvous):
        if spec.rank == 1:
            time.sleep(3600)
        super().__init__(spec, rendezvous)


def main() -> int:
    import ray

    from cluster.engine import GroupFailure
    from cluster.workers import RayWorkerGroup

    ray.init(address="local", num_cpus=16, include_dashboard=False, log_to_driver=False)
    problems, made = [], []
    orig_kill = RayWorkerGroup._kill

    def kill(self):
        made.extend(self.actors)
        orig_kill(self)
    t = time.monotonic()
    try:
        RayWorkerGroup._kill = kill
        RayWorkerGroup(cfg(), NUM_BLOCKS, setup_timeout_s=20, worker_cls=StallingWorker)
        err = "no error"
    except GroupFailure as e:
        err = str(e)
    took = time.monotonic() - t
    log(f"setup ended after {took:.1f}s: {err}")
    time.sleep(5)
    from ray._private import state as ray_state

    table = ray_state.actors()          # the GCS actor table (no dashboard needed)
    mine = {a._actor_id.hex() for a in made}
    alive = [(k[:8], v.get("State"), v.get("Pid")) for k, v in table.items() if k in mine and v.get("State") != "DEAD"]
    log("the group's worker actors:", [(k[:8], v.get("State")) for k, v in table.items() if k in mine],
        "| not dead 5 s later:", alive)
    if err == "no error" or took > 30:
        problems.append(f"setup not bounded ({took:.1f}s, {err})")
    if alive:
        problems.append(f"{len(alive)} worker actor(s) left alive")
    if "rank 1" not in err and "[1]" not in err:
        problems.append(f"the error does not name the stalled rank: {err!r}")
    ray.shutdown()
    for p in problems:
        log("PROBLEM:", p)
    log("result:", "problem present" if problems else "ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
