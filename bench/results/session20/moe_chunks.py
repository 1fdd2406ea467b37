"""Session 20: the Gluon expert kernels over every sorted pair's position (a program each, most exit at once: at 256
rows of top-8 the down launch is 2048 × 96 programs for ~300 chunks) against a grid over the runs' chunks
(``gluon_rows.run_chunks``), with 8 or 16 pairs a program — in the slice's decode step (CUDA-graph replay + lm_head,
4k context): 'rank of dp 8' at 8 / 16 / 32 rows a rank (the MoE over 64 / 128 / 256 rows at I 256) and the full
slice at 8 rows. The settings alternate three times, a fresh graph table each.

    PYTHONPATH=. python bench/results/session20/moe_chunks.py [--dp-rows 8 16 32] [--full-rows 8 32]
        [--policies session19 current grid compact compact16 sub1_8 sub1_16]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch

from bench.decode_slice import BF16, BLOCK, DEV, SLICE, OtherRanks, build_model, decode_graphs, time_ms
from glmkernels import gluon_rows, ops
from models.cache import KVCache
from models.config import ModelConfig
from models.glm5 import MoeShard
from scheduler.scheduler import ScheduledSeq
from scheduler.shapes import graph_width

BASE = gluon_rows.moe_tile


def session19(H, I, hit, sms, rows=8):
    """Session 19's moe_tile: past 8 rows a program for every sorted pair, 8 pairs a program."""
    if rows > 8:
        wide = I >= 1024 and rows >= 32
        return gluon_rows.MoeTile(128, 1, 128 if wide else 64, sub=2, gu_warps=8, dn_warps=8 if wide else 4)
    return BASE(H, I, hit, sms, rows)


def policy(name: str):
    """moe_tile with the grid / pairs of ``name``: grid (over every position, 8 pairs), compact (over the chunks,
    8 pairs), compact16 (over the chunks, 16 pairs past 8 rows) on session 19's tiles; current (the module's
    moe_tile as it is), session19."""
    if name in ("current", "session19"):
        return BASE if name == "current" else session19
    if name.startswith("sub1_"):              # runs of ≥ 8 pairs: 64 / 64 on 4 warps, one K block a step
        def sub1(H, I, hit, sms, rows=8, pairs=int(name[5:])):
            t = BASE(H, I, hit, sms, rows)
            return gluon_rows.MoeTile(64, 1, 64, 1, 4, 4, pairs, True) if rows * 8 >= 8 * hit else t
        return sub1
    compact = name.startswith("compact")
    pairs = 16 if name.endswith("16") else 8

    def tile(H, I, hit, sms, rows=8):
        t = session19(H, I, hit, sms, rows)
        return dataclasses.replace(t, compact=compact, pairs=pairs if rows > 8 else 8)
    return tile


def run(label: str, shard: MoeShard, world: int, rows_list, names, ctx: int = 4096) -> None:
    if not rows_list:
        return
    cfg = ModelConfig.from_dict(dict(SLICE))
    most = max(rows_list)
    cache = KVCache(cfg, most * (ctx + BLOCK) + BLOCK, BF16, DEV)
    for t in cache.kv + [k for k in cache.index_k if k is not None]:
        t.normal_()
    model = build_model(cfg, shard)
    if world > 1:
        model.set_comm(OtherRanks(world, cfg.hidden_size, most))
    ops.configure("auto", DEV)
    per_req = cache.num_slots // most // BLOCK
    blocks = -(-(ctx + 1) // BLOCK)
    for rows in rows_list:
        seqs = [ScheduledSeq(f"r{i}", (1000 + i,), ctx, tuple(range(i * per_req, i * per_req + blocks)), True, 0)
                for i in range(rows)]
        width = graph_width(blocks)
        times: dict[str, list[float]] = {n: [] for n in names}
        for name in list(names) * 3:
            gluon_rows.moe_tile = policy(name)
            graphs = decode_graphs(model, cache)

            def step(rows=rows, width=width, graphs=graphs, model=model):
                with torch.no_grad():
                    model.logits(graphs.run(rows, width))
            graphs.stage(seqs, rows, width)
            step()
            times[name].append(time_ms(step, 30))
            del graphs, step
            torch.cuda.synchronize()
        gluon_rows.moe_tile = BASE
        print(f"{label}, {rows} rows: " + "; ".join(
            f"{k} {', '.join(f'{t:.3f}' for t in v)} (median {statistics.median(v):.3f}) ms" for k, v in times.items()),
            flush=True)
    del model, cache
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", nargs="+", default=["session19", "current"])
    ap.add_argument("--dp-rows", type=int, nargs="*", default=[8, 16, 32])
    ap.add_argument("--full-rows", type=int, nargs="*", default=[8, 32])
    args = ap.parse_args()
    run("rank of dp 8", MoeShard(0, 8, "tp"), 8, args.dp_rows, args.policies)
    run("full", MoeShard(), 1, args.full_rows, args.policies)


if __name__ == "__main__":
    main()
