"""The FP8 linear's tile kernel past Gluon's 8 rows (16..256 rows: graph steps of many requests, a dp step's MLPs
over every rank's rows, short prompt chunks): its launches swept around the default pick — the weight as the dot's
second operand (through shared memory) or ``swap``ped to the first (wgmma's register operand), rows a program,
weight tile width, warps, stages, programs an SM — beside two floors measured in the same run: the weight's bytes at
the read stream, and the product's FLOPs at cuBLAS's bf16 rate (a large square GEMM). cuBLAS on the weight already
dequantized to bf16 (twice the bytes) is shown for scale; it is not a path the engine can take for free.

Each launch is timed as the device sees it in a step: a CUDA graph of back-to-back launches over enough weight copies
that they do not fit in L2, replayed (``rows_gemm.graph_us``). Every launch is checked against the reference first,
and each swapped launch against its unswapped twin bit for bit (reported, not asserted).

    PYTHONPATH=. python bench/mid_gemm.py --out DIR [--rows 16 32 64 128 256] [--sweep base|wide|prescale|hopper]
        [--shapes q_b o_proj ...] [--budget-s 420]

``--sweep hopper``: the Gluon kernel of glmkernels/gluon_mid.py (its pick, ``gluon default``, and launches around it)
beside the Triton tile kernel's pick (``default``; since session 26 ``fp8_linear`` takes the Gluon kernel where
it applies).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from functools import partial
from pathlib import Path

import torch
import triton
from triton.runtime.errors import OutOfResources

from bench.decode_slice import time_ms
from bench.rows_gemm import graph_us, over, weights
from glmkernels import gluon_mid, reference
from glmkernels.triton_linear import (
    DECODE_ROWS,
    LinearTile,
    decode_tile,
    fp8_linear,
    mid_tile,
    unswapped_mid_tile,
)
from glmkernels.triton_utils import next_pow2, num_sms

DEV = "cuda"
SHAPES = [(2048, 6144, "q_a"), (16384, 2048, "q_b"), (6144, 16384, "o_proj"), (4096, 2048, "indexer wq_b"),
          (12288, 6144, "dense gate_up"), (6144, 12288, "dense down"), (1536, 6144, "dense gate_up 1/8"),
          (6144, 1536, "dense down 1/8")]


def default_tile(M: int, N: int, K: int) -> LinearTile:
    return decode_tile(M, N, K) if M <= DECODE_ROWS else mid_tile(M, N, K)


def hopper_variants(M: int, N: int, K: int) -> dict[str, gluon_mid.MidTile]:
    """The Gluon TMA / wgmma kernel (glmkernels/gluon_mid.py): the default pick, then rows × 64 outputs a program
    (one warpgroup) × ring stages (to 64 rows all rows in one tile, 4 stages) × split counts (each ≥ 2 K steps)."""
    out = {"gluon default": gluon_mid.mid_tile(M, N, K, num_sms())}
    shapes = [(max(16, next_pow2(M)), 4)] if M <= 64 else itertools.product((64, 128), (2, 3, 4))
    for (bm, stages), split in itertools.product(shapes, (1, 2, 3, 4, 5, 6, 8)):
        if split <= max(1, triton.cdiv(K, 128) // 2):
            out[f"gluon {bm}x64/{stages}st/s{split}"] = gluon_mid.MidTile(64, bm, split, stages)
    return out


def variants(M: int, N: int, K: int, sweep: str = "base") -> dict[str, LinearTile]:
    """The default pick, then the sweep: swap × rows a program × tile width × K step × warps × stages × programs an
    SM; ``wide``: tiles to 256 rows and 256 outputs (over two scale rows), 128-wide K steps; ``prescale``: the
    weight tile dequantized before its dot (``pre``), beside the unscaled launch of session 24 (``old``)."""
    out = {"default": default_tile(M, N, K)}
    if sweep == "hopper":
        return {**out, **hopper_variants(M, N, K)}
    block_ms = (max(16, next_pow2(M)),) if M <= DECODE_ROWS else (64, 128)
    if sweep == "wide":
        grid = itertools.product((True, False), (64, 128, 256), (64, 128, 256), (128,), (4, 8), (2, 3), (1, 2), (0,))
    elif sweep == "prescale":
        out["old"] = (decode_tile if M <= DECODE_ROWS else unswapped_mid_tile)(M, N, K)
        grid = itertools.product((False, True), block_ms, (64, 128), (128,), (4, 8), (3, 4), (1, 2), (1,))
    else:
        grid = itertools.product((False, True), block_ms, (64, 128), (128, 256), (4, 8), (3, 4), (1, 2), (0,))
    for swap, bm, bn, bk, warps, stages, per_sm, pre in grid:
        if sweep == "wide" and (bm > max(64, next_pow2(M)) or (bn * bm >= 128 * 128 and warps == 4)
                                or (bn * bm <= 64 * 128 and warps == 8) or (not swap and bn < 256)):
            continue
        if sweep == "base" and bk == 256 and (not swap or warps == 4):
            continue
        if sweep == "prescale" and (warps == 8) != (bn * bm >= 128 * 128):
            continue
        tiles = triton.cdiv(N, bn) * triton.cdiv(M, bm)
        split = max(1, min(triton.cdiv(per_sm * num_sms(), tiles), triton.cdiv(K, bk) // 2))
        out[f"{'swap' if swap else 'tile'}{' pre' if pre else ''} {bm}x{bn}x{bk}/{warps}w/{stages}st/s{split}"] = \
            LinearTile(bn, bk, split, warps, stages, swap=swap, block_m=bm, prescale=bool(pre))
    return out



def ceilings() -> tuple[float, float]:
    """The read stream (bytes/s: a 2 GiB bf16 sum) and cuBLAS's bf16 rate (FLOP/s: an 8192³ GEMM), measured now."""
    a = torch.randn(2 ** 30, device=DEV, dtype=torch.bfloat16)
    read_bw = a.numel() * 2 / time_ms(lambda: a.sum(dtype=torch.float32), 20) * 1e3
    sq = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    return read_bw, 2 * 8192 ** 3 / time_ms(lambda: sq @ sq, 20) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--shapes", nargs="+", help="names from SHAPES (default: all)")
    ap.add_argument("--sweep", default="base", choices=["base", "wide", "prescale", "hopper"],
                    help="which launches (variants; hopper: the Gluon TMA / wgmma kernel's)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop sweeping past this (the report still writes)")
    args = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(0)
    read_bw, flops = ceilings()
    print(f"read stream {read_bw / 1e12:.2f} TB/s, cuBLAS bf16 {flops / 1e12:.0f} TFLOP/s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: list[dict] = []
    shapes = [s for s in SHAPES if not args.shapes or s[2] in args.shapes]
    for N, K, what in shapes:
        ws = weights(N, K, max(2, triton.cdiv(256 << 20, N * K)))
        wbf = [reference.fp8_dequant(w, s, torch.bfloat16) for w, s in ws[:max(2, triton.cdiv(512 << 20, 2 * N * K))]]
        for M in args.rows:
            if time.time() - t0 > args.budget_s:
                print(f"budget spent: {what} M={M} and later not run", flush=True)
                break
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            ref = reference.linear(x.float(), reference.fp8_dequant(*ws[0]), None)
            times, same = {}, {}
            for name, t in variants(M, N, K, args.sweep).items():
                try:
                    y = fp8_linear(x, *ws[0], tile=t)
                except OutOfResources:                 # shared memory: too many stages of too wide a tile
                    continue
                err = ((y.float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (what, M, name, err)
                if getattr(t, "swap", False):
                    twin = LinearTile(t.block_n, t.block_k, t.split, t.num_warps, t.num_stages, block_m=t.block_m,
                                      prescale=t.prescale)
                    try:
                        same[name] = torch.equal(y, fp8_linear(x, *ws[0], tile=twin))
                    except OutOfResources:
                        pass
                times[name] = graph_us(over(partial(fp8_linear, tile=t), ws, x))
            cublas = graph_us([lambda w=w, x=x: x @ w.t() for w in wbf])
            best = min(times, key=times.get)
            floor_bytes = N * K / read_bw * 1e6
            floor_flops = 2 * M * N * K / flops * 1e6
            r = {"shape": what, "N": N, "K": K, "rows": M, "times_us": times, "swap_bits_equal": same,
                 "cublas_bf16_us": cublas, "floor_bytes_us": floor_bytes, "floor_flops_us": floor_flops,
                 "best": best, "best_tile": repr(variants(M, N, K, args.sweep)[best])}
            res.append(r)
            floor = max(floor_bytes, floor_flops)
            print(f"{what:18s} M={M:3d}: default {times['default']:7.1f}  best {best} {times[best]:7.1f} µs "
                  f"({times['default'] / times[best]:.2f}x; floor {floor:.1f}, best/floor {times[best] / floor:.2f}; "
                  f"cuBLAS bf16 {cublas:.1f}; swap bits equal {sum(same.values())}/{len(same)})  "
                  f"[{time.time() - t0:.0f} s]", flush=True)
            (out / "mid_gemm.json").write_text(json.dumps({"read_Bps": read_bw, "flops": flops, "results": res},
                                                          indent=1))
        ws = wbf = None
    head = (f"µs a launch (CUDA graph of launches over weight copies > L2). Floors: weight bytes at "
            f"{read_bw / 1e12:.2f} TB/s (read stream), FLOPs at {flops / 1e12:.0f} TFLOP/s (cuBLAS bf16, 8192³); "
            "cuBLAS bf16 = the weight dequantized to bf16 beforehand. Launch: swap|tile rows×width/warps/stages/split.")
    cols = ("| shape | N×K | rows | default | best | best µs | default / best | floor µs | best / floor | cuBLAS bf16 "
            "| best unswapped | µs |")
    lines = [f"# FP8 linear, 16..256 rows ({torch.cuda.get_device_name()}): the tile kernel's launches", "", head, "",
             cols, "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in res:
        t = r["times_us"]
        unswapped = min((k for k in t if not k.startswith(("swap", "gluon"))), key=t.get)
        floor = max(r["floor_bytes_us"], r["floor_flops_us"])
        lines.append(f"| {r['shape']} | {r['N']}×{r['K']} | {r['rows']} | {t['default']:.1f} | {r['best']} | "
                     f"{t[r['best']]:.1f} | {t['default'] / t[r['best']]:.2f} | {floor:.1f} | "
                     f"{t[r['best']] / floor:.2f} | {r['cublas_bf16_us']:.1f} | {unswapped} | {t[unswapped]:.1f} |")
    (out / "mid_gemm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
