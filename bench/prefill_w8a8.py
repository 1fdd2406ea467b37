"""Prefill GEMMs on the GLM-5.2 widths with FP8 activations (W8A8, ``glmkernels/triton_w8a8.py``) beside the W8A16
paths the Triton backend runs by default: the dense FP8 linears (one Triton pass dequantizes the weight to bf16,
then cuBLAS) and the grouped MoE (``triton_moe.grouped_moe``: FP8 tiles widened to bf16 for the tensor cores).

Dense: each linear of a layer (q_a, kv_a, q_b, the indexer's wq_b, o_proj, the dense MLP's gate / up / down, the
shared expert's) at ``--rows`` rows: ms of W8A16 (dequant + cuBLAS), of cuBLAS alone on the pre-dequantized
weight (what W8A16 would cost without its weight pass), of W8A8 (activation quantization included) on cuBLAS's
block-scaled GEMM and on our Triton kernel, and of the quantization alone; which one the op takes (``MIN_LINEAR_WORK``); TFLOP/s against the measured ceilings (bf16 768, fp8 1385 TFLOP/s on H200); relative error
of both against the fp32 product of bf16 rows and the dequantized weight. MoE: one layer's routed experts (256 of
width 2048 top-8; 256 of width 256 = one tp rank's), grouped W8A16 vs W8A8, same columns. Times: median of
single synchronized calls (``decode_slice.time_ms``).

    PYTHONPATH=. python bench/prefill_w8a8.py [--rows 2048 8192] [--moe-rows 512 2048 8192] [--out DIR]
    PYTHONPATH=. python bench/prefill_w8a8.py --sweep        # launch shapes of the W8A8 kernels
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.decode_slice import time_ms
from bench.kernels_micro import rand_fp8
from bench.moe_prefill import BF16_TFLOPS, DEV, E, H, K, experts
from bench.tune_decode_kernels import rel
from glmkernels import reference, triton_linear
from glmkernels.triton_moe import grouped_moe
from glmkernels.triton_w8a8 import MIN_LINEAR_WORK, act_quant, w8a8_linear, w8a8_moe

BF16 = torch.bfloat16
FP8_TFLOPS = 1385.0            # measured fp8 GEMM ceiling on the lent H200 (brief)
LINEARS = {"q_a": (2048, 6144), "kv_a": (576, 6144), "q_b": (16384, 2048), "indexer wq_b": (4096, 2048),
           "o_proj": (6144, 16384), "dense gate/up": (12288, 6144), "dense down": (6144, 12288),
           "shared gate/up": (2048, 6144), "shared down": (6144, 2048)}      # (N, K) of the slice's FP8 linears


def dense(rows: list[int], g: torch.Generator) -> list[dict]:
    out = []
    print(f"{'linear':>15}{'rows':>6}{'W8A16 ms':>10}{'bf16 GEMM':>10}{'W8A8 ms':>9}{'Triton':>8}{'quant ms':>9}"
          f"{'speed-up':>9}{'TFLOP/s':>9}{'of fp8':>8}{'op':>6}{'rel W8A16':>11}{'rel W8A8':>10}")
    for name, (N, Kd) in LINEARS.items():
        w8, s = rand_fp8(N, Kd)
        wd = reference.fp8_dequant(w8, s, BF16)
        for M in rows:
            x = torch.randn(M, Kd, device=DEV, generator=g).to(BF16)
            want = x.float() @ reference.fp8_dequant(w8, s).T
            a16 = time_ms(partial(triton_linear.linear, x, w8, s), 10)
            cublas = time_ms(partial(F.linear, x, wd), 10)
            a8 = time_ms(partial(w8a8_linear, x, w8, s), 10)
            a8t = time_ms(partial(w8a8_linear, x, w8, s, "triton"), 10)
            op = "W8A8" if M * N * Kd >= MIN_LINEAR_WORK else "W8A16"
            quant = time_ms(partial(act_quant, x), 10)
            tflops = 2 * M * N * Kd / a8 / 1e9
            row = {"linear": name, "N": N, "K": Kd, "rows": M, "w8a16_ms": a16, "cublas_bf16_ms": cublas,
                   "w8a8_ms": a8, "w8a8_triton_ms": a8t, "op": op, "act_quant_ms": quant, "w8a8_tflops": tflops,
                   "rel_w8a16": rel(triton_linear.linear(x, w8, s), want), "rel_w8a8": rel(w8a8_linear(x, w8, s), want)}
            out.append(row)
            print(f"{name:>15}{M:>6}{a16:>10.3f}{cublas:>10.3f}{a8:>9.3f}{a8t:>8.3f}{quant:>9.3f}{a16 / a8:>8.2f}×"
                  f"{tflops:>9.0f}{tflops / FP8_TFLOPS:>8.0%}{op:>6}{row['rel_w8a16']:>11.1e}{row['rel_w8a8']:>10.1e}",
                  flush=True)
    return out


def moe(rows: list[int], widths: list[int], g: torch.Generator) -> list[dict]:
    out = []
    print(f"{'I':>5}{'rows':>6}{'W8A16 ms':>10}{'W8A8 ms':>9}{'speed-up':>9}{'TFLOP/s':>9}{'of fp8':>8}"
          f"{'(W8A16 of bf16)':>16}{'rel W8A16':>11}{'rel W8A8':>10}")
    for I in widths:
        weights = experts(I)
        for M in rows:
            x = torch.randn(M, H, device=DEV, generator=g).to(BF16)
            idx = torch.rand(M, E, device=DEV, generator=g).topk(K, dim=1).indices
            w = torch.rand(M, K, device=DEV, generator=g)
            want = reference.moe_experts(x.float(), idx, w, *weights)
            a16 = time_ms(partial(grouped_moe, x, idx, w, *weights), 10)
            a8 = time_ms(partial(w8a8_moe, x, idx, w, *weights), 10)
            flop = 2 * M * K * 3 * H * I
            row = {"I": I, "rows": M, "w8a16_ms": a16, "w8a8_ms": a8, "w8a8_tflops": flop / a8 / 1e9,
                   "w8a16_tflops": flop / a16 / 1e9, "rel_w8a16": rel(grouped_moe(x, idx, w, *weights), want),
                   "rel_w8a8": rel(w8a8_moe(x, idx, w, *weights), want)}
            out.append(row)
            print(f"{I:>5}{M:>6}{a16:>10.3f}{a8:>9.3f}{a16 / a8:>8.2f}×{row['w8a8_tflops']:>9.0f}"
                  f"{row['w8a8_tflops'] / FP8_TFLOPS:>8.0%}{row['w8a16_tflops'] / BF16_TFLOPS:>16.0%}"
                  f"{row['rel_w8a16']:>11.1e}{row['rel_w8a8']:>10.1e}", flush=True)
            del want
    return out


def sweep(g: torch.Generator) -> None:
    """ms per launch shape: the dense GEMM (outputs a program, warps, stages) on o_proj and dense gate/up at 4096
    rows; the MoE (row block, warps, stages, down outputs a program) at 2048 and 8192 rows of width 2048."""
    for name in ("o_proj", "dense gate/up", "q_b"):
        N, Kd = LINEARS[name]
        w8, s = rand_fp8(N, Kd)
        x = torch.randn(4096, Kd, device=DEV, generator=g).to(BF16)
        times = sorted((time_ms(partial(w8a8_linear, x, w8, s, "triton", bn, nw, ns), 10), bn, nw, ns)
                       for bn in (128, 256) for nw in (4, 8) for ns in (2, 3, 4))
        print(f"{name} 4096 rows: " + "; ".join(f"{t:.3f} ms (n {bn}, {nw} warps, {ns} stages)"
                                                for t, bn, nw, ns in times[:4]), flush=True)
    weights = experts(2048)
    for M in (2048, 8192):
        x = torch.randn(M, H, device=DEV, generator=g).to(BF16)
        idx = torch.rand(M, E, device=DEV, generator=g).topk(K, dim=1).indices
        w = torch.rand(M, K, device=DEV, generator=g)
        times = []
        for bm in (64, 128):
            for nw in (4, 8):
                for ns in (2, 3, 4):
                    for dn in (64, 128):
                        try:
                            t = time_ms(partial(w8a8_moe, x, idx, w, *weights, block_m=bm, down_n=dn, num_warps=nw,
                                                num_stages=ns), 5)
                        except Exception as e:  # noqa: BLE001 — a shape that does not fit: report, go on
                            print(f"  block_m {bm} warps {nw} stages {ns} down {dn}: {type(e).__name__}")
                            continue
                        times.append((t, bm, nw, ns, dn))
        times.sort()
        print(f"MoE {M} rows: " + "; ".join(f"{t[0]:.3f} ms (m {t[1]}, {t[2]} warps, {t[3]} stages, down {t[4]})"
                                            for t in times[:5]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--moe-rows", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--widths", type=int, nargs="+", default=[2048, 256])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    g = torch.Generator(device=DEV).manual_seed(0)
    if args.sweep:
        return sweep(g)
    result = {"dense": dense(args.rows, g), "moe": moe(args.moe_rows, args.widths, g)}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "prefill_w8a8.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
