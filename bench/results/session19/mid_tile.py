"""Session 19: the tile kernel at 65–256 rows (a dp graph step's MLPs over every rank's rows) — the unsplit
64 × 128 launch it had (``OLD``) against ``triton_linear.mid_tile`` (split over K): each linear alone (a graph of
launches over weight copies > L2, per launch), then the slice's 'rank of dp 8' decode step at 16 and 32 rows a
rank (MoE and MLPs over 128 / 256 rows), a graph replay, the two settings alternating (a fresh graph table each).

    PYTHONPATH=. python bench/results/session19/mid_tile.py [--steps]
"""

from __future__ import annotations

import functools

import torch
import triton

from bench.decode_slice import BF16, BLOCK, DEV, SLICE, OtherRanks, build_model, decode_graphs, time_ms
from bench.rows_gemm import graph_us, over, weights
from glmkernels import ops
from glmkernels import triton_linear as tl_mod
from models.cache import KVCache
from models.config import ModelConfig
from models.glm5 import MoeShard
from scheduler.scheduler import ScheduledSeq
from scheduler.shapes import graph_width

OLD = tl_mod.LinearTile(128, 128, 1, num_warps=4, num_stages=2)
NEW = tl_mod.mid_tile
SHAPES = [(256, 6144, "shared gate/up, 1/8"), (6144, 256, "shared down, 1/8"), (1536, 6144, "dense gate/up, 1/8"),
          (6144, 1536, "dense down, 1/8"), (2048, 6144, "shared gate/up"), (12288, 6144, "dense gate/up")]


def linears() -> None:
    for N, K, what in SHAPES:
        ws = weights(N, K, max(2, triton.cdiv(256 << 20, N * K)))
        for M in (128, 256):
            x = torch.randn(M, K, device=DEV, dtype=BF16)
            old = graph_us(over(functools.partial(tl_mod.fp8_linear, tile=OLD), ws, x))
            new = graph_us(over(functools.partial(tl_mod.fp8_linear, tile=NEW(M, N, K)), ws, x))
            a, b = (tl_mod.fp8_linear(x, *ws[0], tile=t).float() for t in (OLD, NEW(M, N, K)))
            rel = ((a - b).norm() / a.norm()).item()
            print(f"{what:20s} M={M:3d}: unsplit {old:7.1f} µs, mid_tile {NEW(M, N, K)} {new:7.1f} µs "
                  f"(rel {rel:.1e})", flush=True)


def steps(ctx: int = 4096, rules: dict | None = None) -> None:
    """The step with each of ``rules`` (name → ``mid_tile`` stand-in; default: OLD unsplit against NEW), three
    alternations (session 25 passes its own)."""
    rules = rules or {"unsplit": lambda M, N, K: OLD, "mid_tile": NEW}
    cfg = ModelConfig.from_dict(dict(SLICE))
    most = 32
    cache = KVCache(cfg, most * (ctx + BLOCK) + BLOCK, BF16, DEV)
    for t in cache.kv + [k for k in cache.index_k if k is not None]:
        t.normal_()
    model = build_model(cfg, MoeShard(0, 8, "tp"))
    model.set_comm(OtherRanks(8, cfg.hidden_size, most))
    ops.configure("auto", DEV)
    per_req = cache.num_slots // most // BLOCK
    for rows in (16, 32):
        blocks = -(-(ctx + 1) // BLOCK)
        seqs = [ScheduledSeq(f"r{i}", (1000 + i,), ctx, tuple(range(i * per_req, i * per_req + blocks)), True, 0)
                for i in range(rows)]
        width = graph_width(blocks)
        times: dict[str, list[float]] = {name: [] for name in rules}
        for name in list(rules) * 3:
            tl_mod.mid_tile = rules[name]
            graphs = decode_graphs(model, cache)      # captures again with this launch (a pool of its own)
            graphs.stage(seqs, rows, width)

            def step(rows=rows, width=width, graphs=graphs):
                with torch.no_grad():
                    model.logits(graphs.run(rows, width))
            step()
            times[name].append(time_ms(step, 30))
            del graphs, step
            torch.cuda.synchronize()
        tl_mod.mid_tile = NEW
        print(f"rank of dp 8, {rows} rows a rank: " + "; ".join(
            f"{k} {', '.join(f'{t:.3f}' for t in v)} ms" for k, v in times.items()), flush=True)


if __name__ == "__main__":
    import sys
    if "--steps" not in sys.argv:
        linears()
    steps()
