"""A/B in the whole 8-row decode step: the MoE gate/up as the register kernel (default) vs the cp.async ring
kernel, one process, alternating. (Session 10 experiment.)"""

from __future__ import annotations

import dataclasses
import statistics
import sys

import torch

from bench.decode_slice import BF16, BLOCK, DEV, SLICE, bench_model, build_model
from glmkernels import gluon_rows
from models.cache import KVCache
from models.config import ModelConfig
from models.glm5 import MoeShard

base = gluon_rows.moe_tile


def ring_tile(ring: int, bi: int):
    def tile(H, I, hit, sms):
        d = base(H, I, hit, sms)
        split = d.split if bi == d.block_i else max(1, d.split * d.block_i // bi)
        return dataclasses.replace(d, block_i=bi, split=split, gu_warps=8 if bi == 128 else 4, ring=ring)
    return tile


def main() -> None:
    cfg = ModelConfig.from_dict(dict(SLICE))
    cache = KVCache(cfg, 8 * (4096 + BLOCK) + BLOCK, BF16, DEV)
    for t in cache.kv + [k for k in cache.index_k if k is not None]:
        t.normal_()
    choices = {"register": base, "ring 128 x3": ring_tile(3, 128), "ring 128 x4": ring_tile(4, 128),
               "ring 64 x4": ring_tile(4, 64)}
    times: dict = {}
    for label, shard, rows in (("full", MoeShard(), [2, 8]), ("shard 1/8", MoeShard(0, 8, "tp"), [8])):
        model = build_model(cfg, shard)
        for _ in range(3):
            for name, fn in choices.items():
                gluon_rows.moe_tile = fn
                res: list[dict] = []
                bench_model(model, cfg, cache, label, [4096], rows, ["auto_graph"], 1.0, res)
                for r in res:
                    times.setdefault((label, r["rows"], name), []).append(r["auto_graph"])
        gluon_rows.moe_tile = base
        del model
        torch.cuda.empty_cache()
    for (label, rows, name), ts in times.items():
        print(f"| {label} | {rows} | {name} | {', '.join(f'{t:.3f}' for t in ts)} | {statistics.median(ts):.3f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
