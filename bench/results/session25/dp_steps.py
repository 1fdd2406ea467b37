"""Session 25: the slice's 'rank of dp 8' decode step (graph replay; MoE and MLPs over every rank's rows: 128 and 256
at 16 and 32 rows a rank) with ``mid_tile`` as session 24 shipped it (``unswapped``) and as now (``swapped`` from 1024
outputs), alternating three times, a fresh graph table each (session 19's ``mid_tile.py --steps``, other rules).

    PYTHONPATH=. python bench/results/session25/dp_steps.py
"""

from __future__ import annotations

import torch
import triton

from bench.decode_slice import BF16, BLOCK, DEV, SLICE, OtherRanks, build_model, decode_graphs, time_ms
from kernels import ops
from kernels import triton_linear as tl_mod
from kernels.triton_utils import num_sms
from models.cache import KVCache
from models.config import ModelConfig
from models.glm5 import MoeShard
from scheduler.scheduler import ScheduledSeq
from scheduler.shapes import graph_width


def unswapped(M: int, N: int, K: int) -> tl_mod.LinearTile:
    """``mid_tile`` before session 25."""
    block_n = 128 if N >= 1024 else 64
    tiles = triton.cdiv(N, block_n) * triton.cdiv(M, 64)
    return tl_mod.LinearTile(block_n, 128, max(1, min(triton.cdiv(2 * num_sms(), tiles), triton.cdiv(K, 128) // 2)),
                             num_warps=4, num_stages=3)


def main(ctx: int = 4096, most: int = 32) -> None:
    rules = {"unswapped": unswapped, "swapped": tl_mod.mid_tile}
    cfg = ModelConfig.from_dict(dict(SLICE))
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
            graphs = decode_graphs(model, cache)      # captures again with this rule (a pool of its own)
            graphs.stage(seqs, rows, width)

            def step(graphs=graphs, rows=rows, width=width):
                with torch.no_grad():
                    model.logits(graphs.run(rows, width))
            step()
            times[name].append(time_ms(step, 30))
            del graphs, step
            torch.cuda.synchronize()
        tl_mod.mid_tile = rules["swapped"]
        print(f"rank of dp 8, {rows} rows a rank: " + "; ".join(
            f"{k} {', '.join(f'{t:.3f}' for t in v)} ms" for k, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
