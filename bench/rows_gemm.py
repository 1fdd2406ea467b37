"""Few-row FP8 linear on the GPU: the Gluon rows kernel (kernels/gluon_rows.py) against the Triton tile kernel,
with the one-row GEMV beside them, on the GLM-5.2 decode shapes.

Each case is timed as the device sees it in a decode step: a CUDA graph of back-to-back launches over
enough copies of the weight that they do not fit in L2 (≥ 256 MB a round), replayed; time per launch is
the replay time / launches. Every Gluon launch is checked against the reference (fp32 dequantized
weight) before it is timed.

    PYTHONPATH=. python bench/rows_gemm.py --out bench/results
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton

from kernels import reference
from kernels.gluon_rows import RowsTile, fp8_linear_rows, rows_tile
from kernels.triton_linear import _counters, fp8_linear
from kernels.triton_utils import num_sms

DEV = "cuda"
SHAPES = [(576, 6144, "kv_a"), (2048, 6144, "q_a"), (16384, 2048, "q_b"), (6144, 16384, "o_proj"),
          (12288, 6144, "dense gate_up"), (6144, 12288, "dense down"), (4096, 2048, "indexer wq_b")]


def weights(N: int, K: int, copies: int):
    out = []
    for _ in range(copies):
        w8 = (torch.randn(N, K, device=DEV) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        out.append((w8, torch.rand(triton.cdiv(N, 128), triton.cdiv(K, 128), device=DEV) * 1e-3 + 1e-4))
    return out


def graph_us(fn, ws, x, reps: int = 20) -> float:
    """Device time of one launch: a graph of len(ws) launches (one per weight copy), replayed ``reps`` times."""
    for w8, s in ws:
        fn(x, w8, s)                             # compile, allocate
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for w8, s in ws:
            fn(x, w8, s)
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps / len(ws))
    return sorted(times)[len(times) // 2]


def gluon(tile: RowsTile):
    def run(x, w8, s):
        out = torch.empty(x.shape[0], w8.shape[0], dtype=x.dtype, device=x.device)
        fp8_linear_rows(x, w8, s, out, tile, _counters(x.device))
        return out
    return run


def variants(M: int, N: int, K: int) -> dict[str, RowsTile]:
    base = rows_tile(M, N, K, num_sms())
    out = {"gluon default": base, "gluon cvt": RowsTile(base.block_n, base.sub, base.split, base.num_warps, bits=False)}
    for bn, sub, warps, sx in itertools.product((64, 128), (1, 2, 4), (4, 8), (1, 2)):
        if bn % (16 * warps):
            continue
        split = max(1, min(triton.cdiv(2 * sx * num_sms(), triton.cdiv(N, bn)), triton.cdiv(K, 128) // sub))
        out[f"gluon {bn}/{sub}/{warps}w/s{split}"] = RowsTile(bn, sub, split, warps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 4, 8, 16])
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for N, K, what in SHAPES:
        ws = weights(N, K, max(2, triton.cdiv(256 << 20, N * K)))
        nbytes = N * K
        x1 = torch.randn(1, K, device=DEV, dtype=torch.bfloat16)
        one = graph_us(fp8_linear, ws, x1)
        for M in args.rows:
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            ref = reference.linear(x.float(), reference.fp8_dequant(*ws[0]), None)
            tile = graph_us(fp8_linear, ws, x)
            res = {"shape": what, "N": N, "K": K, "rows": M, "gemv_1row_us": one, "tile_us": tile, "gluon": {}}
            for name, t in variants(M, N, K).items():
                y = gluon(t)(x, *ws[0]).float()
                err = ((y - ref).abs().max() / ref.abs().max()).item()
                assert err < 1e-2, (what, M, name, err)
                res["gluon"][name] = graph_us(gluon(t), ws, x)
            best = min(res["gluon"], key=res["gluon"].get)
            print(f"{what:14s} M={M:2d} gemv(1) {one:6.1f}  tile {tile:6.1f}  default {res['gluon']['gluon default']:6.1f}"
                  f"  cvt {res['gluon']['gluon cvt']:6.1f}  best {best} {res['gluon'][best]:6.1f} µs"
                  f"  ({nbytes / res['gluon'][best] / 1e6:.2f} TB/s; tile {nbytes / tile / 1e6:.2f})", flush=True)
            rows.append(res)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows_gemm.json").write_text(json.dumps(rows, indent=1))
    lines = [f"# Few-row FP8 linear ({torch.cuda.get_device_name()}): Gluon rows kernel vs Triton tile kernel", "",
             "µs a launch, device time (CUDA graph of launches over weight copies > L2); TB/s = weight bytes / time.",
             "", "| shape | N×K | rows | GEMV 1 row | tile | Gluon default | Gluon cvt | best Gluon | best | TB/s tile → best |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in rows:
        g = r["gluon"]
        best = min(g, key=g.get)
        nb = r["N"] * r["K"]
        lines.append(f"| {r['shape']} | {r['N']}×{r['K']} | {r['rows']} | {r['gemv_1row_us']:.1f} | {r['tile_us']:.1f} | "
                     f"{g['gluon default']:.1f} | {g['gluon cvt']:.1f} | {best[6:]} | {g[best]:.1f} | "
                     f"{nb / r['tile_us'] / 1e6:.2f} → {nb / g[best] / 1e6:.2f} |")
    (out / "rows_gemm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
