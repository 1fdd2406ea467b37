"""Shared helpers for the fault-injection review scripts (not a finding by itself)."""
from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from cluster.config import EngineConfig  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402

TINY = str(ROOT / "models" / "tiny")
NUM_BLOCKS = 64
T0 = time.monotonic()


def log(*a):
    print(f"[{time.monotonic() - T0:6.1f}s]", *a, flush=True)


def cfg(n=2, comm="ipc", moe="tp", step_timeout_s=6.0, **kw) -> EngineConfig:
    return EngineConfig(model=TINY, device="cpu", dtype="float32", num_workers=n, moe=moe, comm=comm,
                        kv_cache_tokens=NUM_BLOCKS * 16, max_num_batched_tokens=128,
                        step_timeout_s=step_timeout_s, **kw)


def sched(c: EngineConfig):
    from cluster.local import scheduler_config
    from models.config import ModelConfig

    return scheduler_config(c, ModelConfig.from_json(TINY), None, NUM_BLOCKS)


def prompts(n=4):
    return [list(range(2 + 7 * i, 12 + 9 * i)) for i in range(n)]


def greedy(max_tokens=8):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def collect(aeng, ids, params, rid, hook=None):
    """(tokens, last event, seconds) of one request."""
    t0, toks, last = time.monotonic(), [], None
    async for ev in aeng.generate(ids, params, rid):
        toks += ev.token_ids
        last = ev
        if hook:
            hook(ev, len(toks))
    return toks, last, time.monotonic() - t0


def children(pid=None) -> list[int]:
    """Direct and indirect child pids of this process (from /proc)."""
    pid = pid or os.getpid()
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parts = f.read().rsplit(")", 1)[1].split()
                kids.setdefault(int(parts[1]), []).append(int(d))
            except OSError:
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def proc_state(pid) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def shm_names() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("glmserve")}


def kv_state(engine) -> dict:
    return {"free": engine.num_free_blocks(), "total": NUM_BLOCKS * len(engine.schedulers),
            "running": sum(s.num_running for s in engine.schedulers),
            "waiting": sum(s.num_waiting for s in engine.schedulers),
            "streams": len(engine._streams), "rank_of": len(engine._rank_of)}


def threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate())


# ---- fault injection inside the spawned ranks of a ProcessWorkerGroup -------------------------------------------
# ``ProcessWorkerGroup._start`` spawns ``cluster.workers._process_main``; a script replaces that module attribute with
# ``faulty_main`` below (importable by reference in the spawned child). FAULT (env, inherited by the children) says what
# a rank does in a rebuilt generation (board prefix other than "g0/"): "slow:<rank>:<seconds>" sleeps before setup,
# "fail:<rank>" raises during setup (after publishing the failure, as Worker does), "stop:<rank>" SIGSTOPs itself,
# "die:<rank>" exits (code 7) before loading, "dieshm:<rank>" exits (code 9) once rank 0 published its ipc segment.
# FAULT_GENS="all" applies it to the first generation too.
def faulty_main(spec, board, prefix, conn):
    import signal

    from cluster import workers as W
    from workers.comm import DictRendezvous

    fault = os.environ.get("FAULT", "")
    rebuilt = prefix != "g0/" or os.environ.get("FAULT_GENS") == "all"
    if fault and rebuilt:
        kind, rank, *arg = fault.split(":")
        if int(rank) == spec.rank:
            if kind == "slow":
                time.sleep(float(arg[0]))
            elif kind == "fail":
                DictRendezvous(board, spec.world_size, prefix).fail(spec.rank, "injected: weights unreadable")
                W._send(conn, ("error", "RuntimeError: injected: weights unreadable"))
                return
            elif kind == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif kind == "die":
                os._exit(7)
            elif kind == "dieshm":       # die where it would attach rank 0's ipc segment (created, named, published)
                import workers.comm_ipc as ci

                ci._attach_untracked = lambda name: os._exit(9)
    W._process_main(spec, board, prefix, conn)      # (the child imported cluster.workers afresh: the original)


def install_faulty_main():
    from cluster import workers as W

    if not hasattr(W, "_ORIG_PROCESS_MAIN"):
        W._ORIG_PROCESS_MAIN = W._process_main
    W._process_main = faulty_main
