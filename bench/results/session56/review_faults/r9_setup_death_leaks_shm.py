"""A rank that dies in the middle of the ipc comm setup leaves rank 0's shared-memory segment in /dev/shm. 2-rank
ProcessWorkerGroup (ipc): rank 1 exits where it would attach rank 0's created and published segment (FAULT dieshm:1),
before every rank has attached (rank 0 unlinks the name only then). The driver sees rank 1 die and SIGKILLs rank 0
(``ProcessWorkerGroup._kill``), which never runs its unlink. The segment is registered with the driver's resource
tracker (spawned ranks share it), so it is removed only when the driver process exits — a serving process that retries
keeps one more segment (the AG + RS regions: ~0.8 GB at GLM-5 widths, ``comm_ipc.REGION_ROWS``) per failed setup.
Exit 1 if a glmserve_comm_* segment is left in /dev/shm after the GroupFailure while the driver lives."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["FAULT"], os.environ["FAULT_GENS"] = "dieshm:1", "all"
from _common import *  # noqa: F401,F403


def main() -> int:
    from cluster.engine import GroupFailure
    from cluster.workers import ProcessWorkerGroup

    install_faulty_main()
    before = shm_names()
    leaked = set()
    for attempt in range(3):
        try:
            ProcessWorkerGroup(cfg(), NUM_BLOCKS, setup_timeout_s=40).shutdown()
            log(f"attempt {attempt}: no failure?")
        except GroupFailure as e:
            log(f"attempt {attempt}: GroupFailure: {e}")
        time.sleep(1.0)
        now = shm_names() - before
        sizes = {n: os.stat(f"/dev/shm/{n}").st_size for n in now}
        log(f"  /dev/shm glmserve segments now: {sizes}")
        leaked = now
    bad = bool(leaked)
    log("result:", f"problem present: {len(leaked)} segment(s) left while the driver lives" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
