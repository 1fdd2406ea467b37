"""Latency of the MoE phase comm: median µs per AG and RS, both backends, N processes.

    python bench/comm_latency.py 4                 # 4 ranks on CPU (gloo / POSIX shm)
    python bench/comm_latency.py 8 --device cuda   # on a GPU host (NCCL / cupy IPC), rank r on GPU r % count
    python bench/comm_latency.py 8 --device cuda --backends ipc   # 8 processes on one GPU (NCCL refuses that)

Bucket: 8 rows x 6144 bf16 (GLM-5 hidden). Dp uses 8 // N rows per rank; Span has 8 rows owned
by rank 0. Every timed call starts after a barrier (so ranks enter together) and ends when its
result is complete on the device (synchronized); each rank takes the median of its calls and the
table shows the slowest rank's median. ``--json`` also writes the numbers.

The graph steps' phases (``all_gather_static`` / ``reduce_scatter_static``: every rank passes the whole
bucket of 8 // N rows; ipc runs them on device-side flags, torch as fixed-shape NCCL calls) are timed the
same way ("AG static", "RS static"), and on CUDA also as a decode step runs them: ``GRAPH_PAIRS`` AG+RS
pairs captured in one CUDA graph, whose replay time / pairs is "AG+RS in graph" (per pair: one MoE layer's
comm; no host work between the phases).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time

import torch

from workers.comm import DictRendezvous, make_comm
from workers.graphs import capture_graph
from workers.rowmap import Dp, Span, rows_of

GRAPH_PAIRS = 64
PHASES = ("AG dp", "RS dp", "AG span", "RS span", "AG static", "RS static", "AG+RS in graph")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cases(comm, rank: int, n: int, rows: int, hidden: int, device: torch.device) -> dict:
    """name -> a callable running one phase on this rank."""
    dp, span = Dp(n, rows // n), Span(n, rows)
    bucket = torch.randn(rows, hidden, device=device).to(torch.bfloat16)  # [rows, H]
    partial = torch.randn(rows, hidden, device=device).to(torch.bfloat16)  # [rows, H]
    mine = rows_of(dp, rank)
    cases = {
        "AG dp": lambda: comm.all_gather(bucket[mine.start : mine.stop], dp, 0),
        "RS dp": lambda: comm.reduce_scatter(partial, dp, 0),
        "AG span": lambda: comm.all_gather(bucket, span, 0),
        "RS span": lambda: comm.reduce_scatter(partial, span, 0),
        "AG static": lambda: comm.all_gather_static(bucket[mine.start : mine.stop]),
        "RS static": lambda: comm.reduce_scatter_static(partial),
    }
    if device.type == "cuda" and comm.capturable:
        def pairs():
            for _ in range(GRAPH_PAIRS):
                comm.reduce_scatter_static(comm.all_gather_static(bucket[mine.start : mine.stop]).view(rows, hidden))
        graph, _ = capture_graph(pairs)
        cases["AG+RS in graph"] = graph.replay
    return cases


def _rank_main(rank: int, args: argparse.Namespace, board, results) -> None:
    torch.set_num_threads(1)
    n = args.world_size
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if args.device == "cuda" else "cpu")
    out = {}
    for backend in args.backends:
        comm = make_comm(backend, rank, n, rendezvous=DictRendezvous(board, n, prefix=f"{backend}/"),
                         device=device, max_rows=args.rows, hidden=args.hidden, dtype=torch.bfloat16)
        cases = _cases(comm, rank, n, args.rows, args.hidden, device)
        for name, fn in cases.items():
            samples = []
            for i in range(args.warmup + args.iters):
                comm.barrier()
                _sync(device)
                start = time.perf_counter()
                fn()
                _sync(device)
                if i >= args.warmup:
                    samples.append((time.perf_counter() - start) * 1e6)
            out[(backend, name)] = statistics.median(samples) / (GRAPH_PAIRS if "graph" in name else 1)
        comm.check()
        comm.close()
    results.put(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("world_size", type=int)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=6144)
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--backends", default="torch,ipc", help="comma-separated: torch, ipc")
    parser.add_argument("--json", help="also append the table as one JSON line to this file")
    args = parser.parse_args()
    args.backends = args.backends.split(",")
    if args.rows % args.world_size:
        raise ValueError(f"--rows {args.rows} must be a multiple of the world size {args.world_size}")
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        board, results = manager.dict(), ctx.Queue()
        procs = [ctx.Process(target=_rank_main, args=(r, args, board, results)) for r in range(args.world_size)]
        for p in procs:
            p.start()
        per_rank = [results.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
    table = {name: {b: max(r.get((b, name), float("nan")) for r in per_rank) for b in args.backends}
             for name in PHASES}
    print(f"{args.world_size} ranks, {args.rows} x {args.hidden} bf16 on {args.device}, "
          f"median µs of the slowest rank over {args.iters} iters")
    print(f"{'phase':<10}" + "".join(f"{b:>12}" for b in args.backends))
    for name, row in table.items():
        print(f"{name:<10}" + "".join(f"{row[b]:>12.1f}" for b in args.backends))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"world_size": args.world_size, "device": args.device, "rows": args.rows,
                                "hidden": args.hidden, "iters": args.iters, "table": table}) + "\n")

if __name__ == "__main__":
    main()
