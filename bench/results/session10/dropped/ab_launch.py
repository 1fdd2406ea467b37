"""A/B of the Gluon launch choices inside the whole decode step (CUDA-graph path, 8 rows at 4k, the slice of
``bench/decode_slice.py``): session 9's choices vs the current ``rows_tile`` / ``moe_tile``, in one process,
alternating A and B three times so that drift of the GPU hits both. Kernel micro-benchmarks time one kernel
alone; this says whether a launch choice survives among the step's other kernels.

    PYTHONPATH=. python bench/ab_launch.py --out bench/results
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import triton

from bench.decode_slice import BF16, BLOCK, DEV, SLICE, bench_model, build_model
from glmkernels import gluon_rows
from glmkernels.gluon_rows import MoeTile, RowsTile
from models.cache import KVCache
from models.config import ModelConfig
from models.glm5 import MoeShard


def session9_rows_tile(M: int, N: int, K: int, sms: int) -> RowsTile:
    """Session 9's rows launch: four K blocks a step for the 128-row / 8-warp class too."""
    block_n, warps = (128, 8) if K >= 8192 or N >= 16384 else (64, 4)
    split = max(1, min(triton.cdiv(4 * sms, triton.cdiv(N, block_n)), triton.cdiv(K, 128) // 4))
    return RowsTile(block_n, 4, split, warps)


def session9_moe_tile(H: int, I: int, experts_hit: int, sms: int) -> MoeTile:
    """Session 9's MoE launch: narrow experts 64-wide on 4 warps at ~16 programs per SM."""
    if I >= 1024:
        return MoeTile(128, 1, 128, sub=2, gu_warps=8, dn_warps=8)
    split = max(1, min(triton.cdiv(16 * sms, experts_hit * triton.cdiv(I, 64)), H // 128 // 4))
    return MoeTile(64, split, 64, sub=2, gu_warps=4, dn_warps=4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    read_bw = 1.0                              # byte floors are not reported here
    cfg = ModelConfig.from_dict(dict(SLICE))
    cache = KVCache(cfg, 8 * (4096 + BLOCK) + BLOCK, BF16, DEV)
    for t in cache.kv + [k for k in cache.index_k if k is not None]:
        t.normal_()
    choices = {"session 9": (session9_rows_tile, session9_moe_tile), "current": (gluon_rows.rows_tile, gluon_rows.moe_tile)}
    times: dict[tuple[str, str], list[float]] = {}
    for label, shard in (("full", MoeShard()), ("shard 1/8", MoeShard(0, 8, "tp"))):
        model = build_model(cfg, shard)
        for _ in range(args.reps):
            for name, (rows_tile, moe_tile) in choices.items():
                gluon_rows.rows_tile, gluon_rows.moe_tile = rows_tile, moe_tile
                res: list[dict] = []
                bench_model(model, cfg, cache, label, [4096], [8], ["auto_graph"], read_bw, res)
                times.setdefault((label, name), []).append(res[0]["auto_graph"])
        gluon_rows.rows_tile, gluon_rows.moe_tile = choices["current"]
        del model
        torch.cuda.empty_cache()
    lines = [f"# Launch A/B in the 8-row decode step ({torch.cuda.get_device_name()})", "",
             "ms a step (CUDA-graph path + lm_head, 8 rows at 4k), each run the median of 50; runs alternate A/B.", "",
             "| slice | launch | runs (ms) | median |", "|---|---|---|---:|"]
    for (label, name), ts in times.items():
        lines.append(f"| {label} | {name} | {', '.join(f'{t:.3f}' for t in ts)} | {statistics.median(ts):.3f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ab_launch.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
