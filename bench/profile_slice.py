"""Where a decode step of the GLM-5.2-width slice spends its time on the runner's graph path (replay of
``workers/graphs.py`` + the lm_head): per-kernel CUDA time (torch.profiler), grouped by kernel name.

    PYTHONPATH=. python bench/profile_slice.py [--ctx 4096] [--rows 1 8] [--shard [--dp]] [--sequence]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from bench.decode_slice import BF16, BLOCK, DEV, SLICE, OtherRanks, build_model, decode_graphs
from glmkernels import ops
from models.cache import KVCache
from models.config import ModelConfig
from models.glm5 import MoeShard
from scheduler.scheduler import ScheduledSeq
from scheduler.shapes import graph_width


def kernel_times(fn, reps: int) -> dict[str, tuple[float, float]]:
    """CUDA kernels of ``fn()`` by name (torch.profiler over ``reps`` calls): µs and launches per call. Under PDL a
    kernel's time includes its wait for the one before (profile with ``GLMSERVE_PDL=0`` for kernel-alone times)."""
    by: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            by[ev.name][0] += ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
            by[ev.name][1] += 1
    return {name: (t / reps, c / reps) for name, (t, c) in by.items()}


def kernel_sequence(fn) -> list[tuple[float, float, str]]:
    """One call of ``fn()``'s CUDA kernels in launch order: (start µs from the first kernel's, µs, name)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    evs = sorted((ev for ev in prof.events() if ev.device_type.name == "CUDA"), key=lambda ev: ev.time_range.start)
    t0 = evs[0].time_range.start if evs else 0.0
    return [(ev.time_range.start - t0, ev.time_range.end - ev.time_range.start, ev.name) for ev in evs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--shard", action="store_true", help="MoE and dense MLP at 1/8 width (one tp rank of 8)")
    ap.add_argument("--dp", action="store_true", help="with --shard: the MLPs over 8 ranks' rows (decode_slice's "
                    "'rank of dp 8')")
    ap.add_argument("--sequence", action="store_true", help="also list one step's kernels in launch order "
                    "(start, gap before, time): what a fusion would remove")
    args = ap.parse_args()
    cfg = ModelConfig.from_dict(dict(SLICE))
    most = max(8, *args.rows)
    cache = KVCache(cfg, most * (args.ctx + BLOCK) + BLOCK, BF16, DEV)     # + a block for the pad slot
    for t in cache.kv + [k for k in cache.index_k if k is not None]:
        t.normal_()
    model = build_model(cfg, MoeShard(0, 8, "tp") if args.shard else MoeShard())
    if args.dp:
        model.set_comm(OtherRanks(8, cfg.hidden_size, most))
    ops.configure("auto", DEV)
    per_req = cache.num_slots // most // BLOCK
    graphs = decode_graphs(model, cache)
    for rows in args.rows:
        blocks = -(-(args.ctx + 1) // BLOCK)
        seqs = [ScheduledSeq(f"r{i}", (1000 + i,), args.ctx, tuple(range(i * per_req, i * per_req + blocks)), True, 0)
                for i in range(rows)]
        width = graph_width(blocks)
        graphs.stage(seqs, rows, width)
        for _ in range(5):                  # the first run captures
            with torch.no_grad():
                model.logits(graphs.run(rows, width))
        torch.cuda.synchronize()

        def step(rows=rows, width=width):
            with torch.no_grad():
                model.logits(graphs.run(rows, width))
        by = kernel_times(step, args.replays)
        total = sum(t for t, _ in by.values())
        print(f"\n== rows {rows} ctx {args.ctx}: kernel time per step {total:.0f} us, "
              f"{sum(c for _, c in by.values()):.0f} kernels per step")
        for name, (t, c) in sorted(by.items(), key=lambda kv: -kv[1][0])[:40]:
            print(f"{t:9.1f} us  {c:6.1f}x  {name[:110]}")
        if args.sequence:
            print(f"\n-- one step in launch order (rows {rows}): start us, gap before us, kernel us, name")
            end = 0.0
            for start, t, name in kernel_sequence(step):
                print(f"{start:9.1f} {start - end:6.1f} {t:8.1f}  {name[:90]}")
                end = start + t


if __name__ == "__main__":
    main()
