"""Tile sweep of the one-row kernel on the step's small unquantized weights (``linear_f32``): the router's
fp32 [256 × 6144] logits and the indexer's bf16 [32 × 6144] head weights (rounded, scaled), on the GPU.
``--rows``: the same weights under a few rows (a verify step's span, a dp step's MoE over every rank's rows) —
the rows kernel (``_gemv_rows_kernel``) at its pick and a sweep of its tiles, beside the tile kernel with IEEE
fp32 dots (``linear_f32``'s launch before session 30) and with 3-pass TF32 dots, and the reference (torch; past
64 rows ``linear_f32``'s launch before session 33). Past 64 rows the tile kernel only (``f32_tile``'s 64-row blocks).

Each tile is timed as CUDA-graph replays over enough weight copies that every launch reads from HBM;
``pick`` is ``gemv_tile``'s (``gemv_rows_tile``'s) choice.

    PYTHONPATH=. python bench/tune_small_gemv.py [--out bench/results] [--rows 2 4 8 16 32 64]
"""

from __future__ import annotations

import argparse
import itertools
from functools import partial
from pathlib import Path

import torch
import triton

from bench.decode_slice import graph_ms
from glmkernels import reference
from glmkernels.triton_linear import GemvTile, _gemv, _gemv_rows, _tiles, f32_tile, gemv_rows_tile, gemv_tile
from glmkernels.triton_utils import next_pow2, num_sms

CASES = [("router fp32 [256x6144]", 256, torch.float32, False, 1.0),
         ("head weights bf16 [32x6144]", 32, torch.bfloat16, True, 32 ** -0.5)]
K = 6144


def label(t: GemvTile) -> str:
    return f"{t.block_n}x{t.block_k} s{t.split} w{t.num_warps}"


def cold_weights(N: int, dtype: torch.dtype) -> list[torch.Tensor]:
    return [torch.randn(N, K, device="cuda").to(dtype) for _ in range(max(2, int(300e6 // (N * K * dtype.itemsize))))]


def launch_us(launch, x: torch.Tensor, ws: list[torch.Tensor], out: torch.Tensor, want: torch.Tensor,
              tol: float) -> float:
    """µs per ``launch(x, w, out)`` over the cold weights, or nan where its first result is not within ``tol``."""
    launch(x, ws[0], out=out)
    if ((out - want).norm() / want.norm()).item() > tol:
        return float("nan")
    return graph_ms(lambda: [launch(x, w, out=out) for w in ws], 10) * 1e3 / len(ws)


def rows_sweep(rows: list[int]) -> list[str]:
    """µs per launch of ``linear_f32``'s candidates at each row count, every one checked against the reference."""
    lines = [("| weight | rows | reference (torch) | tile kernel, IEEE dots | tile kernel, TF32 × 3 | "
              "rows kernel pick | pick | fastest rows tiles (µs tile) |"), "|---|---:|---:|---:|---:|---:|---|---|"]
    for name, N, dtype, rounded, scale in CASES:
        ws = cold_weights(N, dtype)
        fin = {"round_to": torch.bfloat16 if rounded else None, "out_scale": scale}
        for M in rows:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            args = (x, ws, torch.empty(M, N, device="cuda"), reference.linear_f32(x, ws[0], rounded, scale),
                    4e-3 if rounded else 1e-5)
            torch_us = launch_us(lambda x, w, out, r=rounded, s=scale: out.copy_(reference.linear_f32(x, w, r, s)),
                                 *args)
            block_m, tile = f32_tile(M, N, K)
            ieee, tf32 = (launch_us(partial(_tiles, scale_inv=None, block_m=block_m, tile=tile,
                                            upcast=not rounded, f32_prec=p, **fin), *args) for p in ("ieee", "tf32x3"))
            if M > 64:                         # the rows kernel holds every row in one program: to 64 rows
                lines.append(f"| {name} | {M} | {torch_us:.2f} | {ieee:.2f} | {tf32:.2f} | — | — | — |")
                print(lines[-1], flush=True)
                continue
            pick = gemv_rows_tile(M, N, K)
            cands = [pick] + [GemvTile(bn, bk, triton.cdiv(K, span))
                              for bn, bk, span in itertools.product((4, 8), (32, 64, 128, 256), (1024, 2048))
                              if bn <= N and next_pow2(M) * bn * bk <= 16384]
            res = [(launch_us(partial(_gemv_rows, tile=t, **fin), *args), label(t)) for t in cands]
            best = "; ".join(f"{us:.2f} {lab}" for us, lab in sorted(r for r in res if r[0] == r[0])[:4])
            lines.append(f"| {name} | {M} | {torch_us:.2f} | {ieee:.2f} | {tf32:.2f} | {res[0][0]:.2f} | {label(pick)} "
                         f"| {best} |")
            print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rows", type=int, nargs="*", help="the few-row launches at these row counts instead")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.rows:
        lines = [f"# linear_f32 under a few rows ({torch.cuda.get_device_name()})", "",
                 "µs per launch (CUDA-graph replay, cold in L2; nan: not within tolerance).", ""]
        lines += rows_sweep(args.rows)
        (out_dir / "tune_small_gemv_rows.md").write_text("\n".join(lines) + "\n")
        return
    lines = [f"# One-row kernel on small unquantized weights ({torch.cuda.get_device_name()})", "",
             "µs per launch (CUDA-graph replay, cold in L2).", "", "| weight | pick µs | pick | fastest (µs tile) |",
             "|---|---:|---|---|"]
    for name, N, dtype, rounded, scale in CASES:
        ws = cold_weights(N, dtype)
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
