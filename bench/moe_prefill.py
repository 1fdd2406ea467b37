"""Prefill MoE on the GLM-5.2 widths: the grouped launches (``glmkernels/triton_moe.py::grouped_moe``) against the
per-expert reference loop the Triton backend ran before (``reference.moe_experts``: a host sync per expert, each
linear's whole FP8 weight dequantized, then a bf16 GEMM), one layer's routed experts, bf16 rows, FP8 experts.

Cases: 256 experts top-8 of width 2048 (a whole layer) and 256 (one tp rank of 8), at 512, 2048 and 8192 rows
(a prefill chunk is up to ``max_num_batched_tokens`` rows). Reported per call: ms, TFLOP/s of the expert GEMMs
(2 · rows · 8 · 3 · H · I) against the measured bf16 GEMM ceiling (768 TFLOP/s on H200; the kernels widen the
FP8 tiles to bf16 for the tensor cores), and the experts' bytes read once / time against the copy stream
(4.2 TB/s), with the relative difference of the two outputs against an fp32 reference. Times: median of single
synchronized calls (``decode_slice.time_ms``; session 12's table took the mean of back-to-back calls).

    PYTHONPATH=. python bench/moe_prefill.py [--rows 512 2048 8192] [--out DIR]
    PYTHONPATH=. python bench/moe_prefill.py --sweep [--rows 2048 8192]    # launch shapes, grouped only
    PYTHONPATH=. python bench/moe_prefill.py --fused --rows 33 64 128      # fused vs grouped at a graph step's rows
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch

from bench.decode_slice import time_ms
from bench.kernels_micro import rand_fp8
from bench.tune_decode_kernels import rel
from glmkernels import reference, triton_moe
from glmkernels.triton_moe import ExpertTile, GroupTile, fused_moe, grouped_moe

DEV, BF16 = "cuda", torch.bfloat16
H, E, K = 6144, 256, 8
BF16_TFLOPS, COPY_TBS = 768.0, 4.2        # measured on the lent H200 (brief)


def experts(I: int) -> tuple:
    """Random FP8 experts: (gate, up, down, their block scales)."""
    out = [rand_fp8(E, a, b) for a, b in ((I, H), (I, H), (H, I))]
    return tuple(w for w, _ in out) + tuple(s for _, s in out)


def cases(widths: list[int], rows_list: list[int]):
    """(I, the experts, rows, x, top-k ids, weights) for each width and row count: random bf16 rows routed top-8."""
    g = torch.Generator(device=DEV).manual_seed(0)
    for I in widths:
        weights = experts(I)
        for rows in rows_list:
            x = torch.randn(rows, H, device=DEV, generator=g).to(BF16)
            idx = torch.rand(rows, E, device=DEV, generator=g).topk(K, dim=1).indices
            yield I, weights, rows, x, idx, torch.rand(rows, K, device=DEV, generator=g)


def sweep(args) -> None:
    """ms of ``grouped_moe`` per (block rows, gate/up tile, down tile), the launch default beside them. (Session
    12 swept two more variants this way and dropped them: the products as W @ x.T, and scaling each dot's fp32
    result instead of the weight tile — 1.15–1.3× slower, bench/results/session12/sweep*.txt.)"""
    shapes = [(m, gu, dn) for m in (64, 128, 32) for gu in ((128, 8, 3), (64, 4, 3), (128, 4, 3), (128, 8, 4))
              for dn in ((128, 8, 3), (64, 4, 3), (128, 4, 4))]
    for I, weights, rows, x, idx, w in cases(args.widths, args.rows):
        times = []
        for m, gu, dn in shapes:
            tiles = (GroupTile(*gu), GroupTile(*dn))
            try:
                ms = time_ms(partial(grouped_moe, x, idx, w, *weights, block_m=m, tiles=tiles), 5)
            except Exception as e:  # noqa: BLE001 — a shape that does not fit (shared memory): report, go on
                print(f"  I {I} rows {rows} {m} {gu} {dn}: {type(e).__name__}", flush=True)
                continue
            times.append((ms, m, gu, dn))
        times.sort()
        default = time_ms(partial(grouped_moe, x, idx, w, *weights), 5)
        print(f"I {I} rows {rows}: default {default:.3f} ms; best:", flush=True)
        for t in times[:5]:
            print(f"  {t[0]:.3f} ms  block_m {t[1]}  gate/up {t[2]}  down {t[3]}", flush=True)


def fused_vs_grouped(args) -> None:
    """The rows a graph step's MoE may take past 32 (up to 128: 8 ranks × 16 a dp step): the fused launches, which a
    graph can hold — an expert's run in chunks of ``RUN_ROWS`` pairs a program (16), or whole (one program, a
    tile of next_pow2(rows): before session 17); 128- or 256-deep K steps — against the grouped ones (one host sync);
    ms, and the relative difference from an fp32 reference. (Rows ≤ 32 are a graph step's in 4 ranks × 8.)"""
    narrow, wide = (ExpertTile(32, 128), ExpertTile(64, 128)), (ExpertTile(32, 256), ExpertTile(64, 128))
    launches = {"fused, runs of 16, K 128": (16, narrow), "fused, runs of 16, K 256": (16, wide),
                "fused, runs whole, K 128": (64, narrow), "fused, runs whole, K 256": (64, wide)}
    for I, weights, rows, x, idx, w in cases(args.widths, args.rows):
        want = reference.moe_experts(x.float(), idx, w, *weights)
        fn = partial(fused_moe, x, idx, w, *weights)         # its own pick: the Gluon kernels for bf16 rows
        cells = [f"fused, default launch {time_ms(fn, 20):.3f} ms (rel {rel(fn(), want):.1e})"]
        for name, (run_rows, tiles) in launches.items():
            triton_moe.RUN_ROWS = run_rows
            fn = partial(fused_moe, x, idx, w, *weights, tiles=tiles)
            cells.append(f"{name} {time_ms(fn, 20):.3f} ms (rel {rel(fn(), want):.1e})")
        triton_moe.RUN_ROWS = 16
        fn = partial(grouped_moe, x, idx, w, *weights)
        cells.append(f"grouped {time_ms(fn, 20):.3f} ms (rel {rel(fn(), want):.1e})")
        print(f"I {I} rows {rows}: " + "; ".join(cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--widths", type=int, nargs="+", default=[2048, 256])
    ap.add_argument("--out", default=None)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--fused", action="store_true", help="fused vs grouped launches at --rows (33–64)")
    args = ap.parse_args()
    if args.sweep:
        return sweep(args)
    if args.fused:
        return fused_vs_grouped(args)
    rows_out = []
    print(f"{'I':>5}{'rows':>6}{'reference ms':>14}{'grouped ms':>12}{'speed-up':>10}{'TFLOP/s':>9}{'of bf16':>9}"
          f"{'GB/s':>8}{'of copy':>9}{'rel ref':>9}{'rel ours':>9}")
    for I, weights, rows, x, idx, w in cases(args.widths, args.rows):
        nbytes = sum(t.numel() * t.element_size() for t in weights)
        want = reference.moe_experts(x.float(), idx, w, *weights)
        ref_out = reference.moe_experts(x, idx, w, *weights)
        ours = grouped_moe(x, idx, w, *weights)
        ref_ms = time_ms(partial(reference.moe_experts, x, idx, w, *weights), 2)
        ours_ms = time_ms(partial(grouped_moe, x, idx, w, *weights), 10)
        tflops = 2 * rows * K * 3 * H * I / ours_ms / 1e9
        gbs = nbytes / ours_ms / 1e6
        row = {"I": I, "rows": rows, "reference_ms": ref_ms, "grouped_ms": ours_ms, "tflops": tflops,
               "gb_s": gbs, "rel_reference": rel(ref_out, want), "rel_grouped": rel(ours, want)}
        rows_out.append(row)
        print(f"{I:>5}{rows:>6}{ref_ms:>14.2f}{ours_ms:>12.3f}{ref_ms / ours_ms:>9.1f}×{tflops:>9.0f}"
              f"{tflops / BF16_TFLOPS:>9.0%}{gbs:>8.0f}{gbs / COPY_TBS / 1e3:>9.0%}"
              f"{row['rel_reference']:>9.1e}{row['rel_grouped']:>9.1e}", flush=True)
        del want, ref_out, ours
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "moe_prefill.json").write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main()
