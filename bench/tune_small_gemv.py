"""Tile sweep of the one-row kernel on the step's small unquantized weights (``linear_f32``): the router's
fp32 [256 × 6144] logits and the indexer's bf16 [32 × 6144] head weights (rounded, scaled), on the GPU.

Each tile is timed as CUDA-graph replays over enough weight copies that every launch reads from HBM;
``pick`` is ``gemv_tile``'s choice.

    PYTHONPATH=. python bench/tune_small_gemv.py [--out bench/results]
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch
import triton

from bench.decode_slice import graph_ms
from kernels.triton_linear import GemvTile, _gemv, gemv_tile
from kernels.triton_utils import num_sms

CASES = [("router fp32 [256x6144]", 256, torch.float32, False, 1.0),
         ("head weights bf16 [32x6144]", 32, torch.bfloat16, True, 32 ** -0.5)]
K = 6144


def label(t: GemvTile) -> str:
    return f"{t.block_n}x{t.block_k} s{t.split} w{t.num_warps}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    out_dir = Path(ap.parse_args().out)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# One-row kernel on small unquantized weights ({torch.cuda.get_device_name()})", "",
             "µs per launch (CUDA-graph replay, cold in L2).", "", "| weight | pick µs | pick | fastest (µs tile) |",
             "|---|---:|---|---|"]
    for name, N, dtype, rounded, scale in CASES:
        ws = [torch.randn(N, K, device="cuda").to(dtype) for _ in range(max(2, int(300e6 // (N * K * dtype.itemsize))))]
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(1, N, device="cuda")
        pick = gemv_tile(N, K)
        tiles = [pick] + [GemvTile(bn, bk, max(1, min(triton.cdiv(per_sm * num_sms(), triton.cdiv(N, bn)),
                                                       triton.cdiv(K, bk))), warps)
                          for bn, bk, warps, per_sm in itertools.product((2, 4, 8, 16, 32), (128, 256, 512, 1024),
                                                                         (4, 8), (1, 2, 4)) if bn <= N]
        res = []
        for t in tiles:
            def run(t=t, ws=ws, x=x, out=out, rounded=rounded, scale=scale):
                return [_gemv(x, w, None, out, t, round_to=torch.bfloat16 if rounded else None, out_scale=scale)
                        for w in ws]
            res.append((graph_ms(run, 10) * 1e3 / len(ws), label(t)))
        best = "; ".join(f"{us:.2f} {lab}" for us, lab in sorted(res)[:5])
        lines.append(f"| {name} | {res[0][0]:.2f} | {label(pick)} | {best} |")
        print(lines[-1], flush=True)
    (out_dir / "tune_small_gemv.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
