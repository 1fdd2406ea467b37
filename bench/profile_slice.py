"""Where a graph-replayed decode step of the GLM-5.2-width slice spends its time: per-kernel CUDA time
(torch.profiler over graph replays), grouped by kernel name, for 1 and 8 rows.

    PYTHONPATH=. python bench/profile_slice.py [--ctx 4096] [--rows 1 8]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from bench.decode_slice import DEV, BF16, SLICE, build_model
from kernels import ops
from models.cache import KVCache, contiguous_batch
from models.config import ModelConfig
from models.glm5 import MoeShard


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args()
    cfg = ModelConfig.from_dict(dict(SLICE))
    cache = KVCache(cfg, 8 * (args.ctx + 64), BF16, DEV)
    for t in cache.kv + [k for k in cache.index_k if k is not None]:
        t.normal_()
    model = build_model(cfg, MoeShard())
    ops.configure("auto", DEV)
    for rows in args.rows:
        batch = contiguous_batch([(args.ctx, 1)] * rows, cache.num_slots // 8, DEV)
        ids = torch.randint(0, cfg.vocab_size, (rows,), device=DEV)

        def step():
            with torch.no_grad():
                return model.logits(model(ids, batch, cache))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.replays):
                graph.replay()
            torch.cuda.synchronize()
        by = defaultdict(lambda: [0.0, 0])
        total = 0.0
        for ev in prof.events():
            if ev.device_type.name == "CUDA":
                t = ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
                by[ev.name][0] += t
                by[ev.name][1] += 1
                total += t
        print(f"\n== rows {rows} ctx {args.ctx}: kernel time per step {total / args.replays:.0f} us, "
              f"{sum(c for _, c in by.values()) / args.replays:.0f} kernels per step")
        for name, (t, c) in sorted(by.items(), key=lambda kv: -kv[1][0])[:40]:
            print(f"{t / args.replays:9.1f} us  {c / args.replays:6.1f}x  {name[:110]}")


if __name__ == "__main__":
    main()
