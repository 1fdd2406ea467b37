"""Where does a CUDA graph of the torch comm's NCCL phases stop? 2 ranks, one GPU each, every step printed
(flushed) with a stack dump of every thread if a rank is still running after ``--deadline`` seconds.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=. python bench/nccl_capture_probe.py [--deadline 40]

Steps: eager static AG / RS; then each of (all_reduce, static AG, static RS, two all_reduces, AG then RS,
8 × AG then RS) captured in a graph of its own — with torch's default capture mode and with
``capture_error_mode="thread_local"`` — and replayed 3 times.
"""

from __future__ import annotations

import argparse
import faulthandler
import multiprocessing as mp
import sys

import torch
import torch.distributed as dist

from workers.comm import DictRendezvous, make_comm


def _say(rank: int, msg: str) -> None:
    print(f"[rank {rank}] {msg}", flush=True)


def _rank(rank: int, n: int, board, deadline: float, only_global: bool) -> None:
    faulthandler.dump_traceback_later(deadline, exit=True, file=sys.stdout)
    torch.cuda.set_device(rank)
    comm = make_comm("torch", rank, n, rendezvous=DictRendezvous(board, n, prefix="p/"), device="cuda",
                     max_rows=8 * n, hidden=6144, dtype=torch.bfloat16, timeout_s=30.0)
    x = torch.full((2, 6144), float(rank + 1), device="cuda", dtype=torch.bfloat16)
    p = torch.full((2 * n, 6144), float(rank + 1), device="cuda", dtype=torch.bfloat16)
    _say(rank, f"eager static AG {comm.all_gather_static(x)[:, 0, 0].tolist()}")
    _say(rank, f"eager static RS {comm.reduce_scatter_static(p)[:, 0].tolist()}")
    y = torch.ones(4, device="cuda")
    cases = {"all_reduce": lambda: dist.all_reduce(y), "static AG": lambda: comm.all_gather_static(x),
             "static RS": lambda: comm.reduce_scatter_static(p),
             "2 x all_reduce": lambda: (dist.all_reduce(y), dist.all_reduce(y)),
             "AG then RS": lambda: comm.reduce_scatter_static(comm.all_gather_static(x).view(2 * n, 6144)),
             "8 x (AG then RS)": lambda: [comm.reduce_scatter_static(comm.all_gather_static(x).view(2 * n, 6144))
                                          for _ in range(8)]}
    for mode in ("global", "thread_local")[: 1 if only_global else 2]:
        for name, fn in cases.items():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            _say(rank, f"{mode} {name}: warm-up done, capturing")
            g = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g, capture_error_mode=mode):
                    fn()
            except Exception as e:  # noqa: BLE001 — report and go on
                _say(rank, f"{mode} {name}: capture failed: {type(e).__name__}: {str(e)[:300]}")
                continue
            _say(rank, f"{mode} {name}: captured, replaying")
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
            _say(rank, f"{mode} {name}: 3 replays done")
    faulthandler.cancel_dump_traceback_later()
    comm.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deadline", type=float, default=40.0)
    ap.add_argument("--only-global", action="store_true", help="torch's default capture mode only")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    with ctx.Manager() as m:
        board = m.dict()
        procs = [ctx.Process(target=_rank, args=(r, 2, board, args.deadline, args.only_global)) for r in range(2)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(args.deadline + 20)
            if proc.is_alive():
                proc.kill()
        print("exit codes", [proc.exitcode for proc in procs])


if __name__ == "__main__":
    main()
