"""Other ways to write the one-row FP8 GEMV, beside the shipped one and a bare load stream (one H200).

The shipped ``_gemv_kernel`` kept its products per K lane in a [BLOCK_N, BLOCK_K] fp32 tile and reduced once at
the end (still so below 8192 K); on the big shapes it ran at 0.79–0.88 of a bare Triton load stream of the weight
(bench/results/gemv_ceiling.md: o_proj 34.0 µs against 26.8). ``_gemv_step_kernel`` here reduces every K step
instead (the accumulator is BLOCK_N values, so the registers go to a wider weight tile: more bytes in flight per
thread) and may software-pipeline its loop (``tl.range(num_stages=...)``). Its split-K partials are added with
fp32 atomics (a timing stand-in for the shipped kernel's deterministic last-arrival reduce; ``--explain`` runs that
too); each launch's output is checked against ``fp8_linear`` (split 1 only: the atomics add onto the last call's).
Session 28 found the variant faster here (o_proj 30.6 → 27.2 µs) but, as an option of ``_gemv_kernel`` with 16 × 512
tiles, slower than the shipped launch; session 29's ``--explain`` found why (the first step loaded before the PDL
wait costs a 16 × 512 tile ~2 µs, a 32 × 512 tile nothing) and shipped 32 × 512 from 8192 K
(bench/results/session29/README.md).

µs a launch: device time of a CUDA graph of one launch per weight copy (300 MB of copies: cold in L2), replayed
back to back.

    PYTHONPATH=. python bench/gemv_variants.py [--out DIR] [--shapes 6144x16384 12288x6144] [--explain]

``--explain``: the per-step kernel with the shipped kernel's traits added one at a time (PDL launch and wait, the
first step peeled before the wait, the weight select, the last-arrival split reduce), beside the shipped launch
with PDL on and off.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path

import torch
import triton
import triton.language as tl

from bench.decode_slice import graph_ms
from bench.gemv_ceiling import COLD_BYTES, stream
from bench.kernels_micro import rand_fp8
from glmkernels.triton_linear import _reduce_splits, fp8_linear, gemv_tile, tile_counters
from glmkernels.triton_utils import num_sms, pdl_mode, pdl_wait

SHAPES = ["6144x16384", "12288x6144", "16384x2048", "2048x6144"]    # o_proj, dense gate / up, q_b, q_a


@triton.jit
def _gemv_step_kernel(x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, count_ptr, N, K, num_sb_k, k_per_split, w_b_off,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, SPLIT: tl.constexpr,
                      PDL: tl.constexpr, PEEL: tl.constexpr, SELECT: tl.constexpr, LAST: tl.constexpr):
    """The per-step GEMV; each flag adds one of the shipped kernel's traits (``--explain``): PDL its launch
    attribute and wait, PEEL the first step's weight tile and scales loaded before that wait, SELECT its pointer
    select between weights (here never taken: every tile is in the first), LAST the split-K reduce by the last
    arrival (else fp32 atomics)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    if SELECT:
        w_rows = w_ptr + tl.where(pid_n * BLOCK_N >= N, w_b_off, 0) + rn[:, None] * K
    else:
        w_rows = w_ptr + rn[:, None] * K
    s_row = s_ptr + (pid_n * BLOCK_N) // 128 * num_sb_k
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    k0 = pid_k * k_per_split
    k_end = tl.minimum(k0 + k_per_split, K)
    if PEEL:
        kk = k0 + rk
        w = tl.load(w_rows + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0,
                    eviction_policy="evict_first")
        s = tl.load(s_row + kk // 128, mask=kk < K, other=0.0)
        pdl_wait(PDL)
        acc += tl.sum(w.to(tl.float32) * (tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32) * s)[None, :],
                      axis=1)
        k0 += BLOCK_K
    else:
        pdl_wait(PDL)
    for k in tl.range(k0, k_end, BLOCK_K, num_stages=STAGES):
        kk = k + rk
        w = tl.load(w_rows + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0,
                    eviction_policy="evict_first")
        xs = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32) * tl.load(s_row + kk // 128,
                                                                                   mask=kk < K, other=0.0)
        acc += tl.sum(w.to(tl.float32) * xs[None, :], axis=1)
    if SPLIT:
        if LAST:
            _reduce_splits(acc, out_ptr + rn, rn < N, part_ptr + rn, N, count_ptr, pid_n, pid_k, tl.num_programs(1))
        else:
            tl.atomic_add(out_ptr + rn, acc, mask=rn < N, sem="relaxed")
    else:
        tl.store(out_ptr + rn, acc, mask=rn < N)


def gemv_step(x, w8, s, out, block_n, block_k, split, warps, stages, pdl=False, peel=False, select=False,
              last=False):
    N, K = w8.shape
    per = triton.cdiv(triton.cdiv(K, block_k), split) * block_k
    grid = (triton.cdiv(N, block_n), triton.cdiv(K, per))
    part = _parts(grid[1], N) if last else out
    _gemv_step_kernel[grid](x, w8, s, out, part, tile_counters(x.device), N, K, s.shape[1], per, 0,
                            BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages, SPLIT=split > 1, PDL=pdl, PEEL=peel,
                            SELECT=select, LAST=last, num_warps=warps, launch_pdl=pdl)


_part_buffers: dict[tuple[int, int], torch.Tensor] = {}


def _parts(splits: int, N: int) -> torch.Tensor:
    """A split-K partials buffer per shape, allocated outside graph capture (the first, eager call)."""
    if (splits, N) not in _part_buffers:
        _part_buffers[splits, N] = torch.empty(splits, N, device="cuda", dtype=torch.float32)
    return _part_buffers[splits, N]


def us_per(calls, n: int) -> float:
    return graph_ms(lambda: [c() for c in calls], 10, chained=True) * 1e3 / n


def explain(shapes: list[str]) -> dict:
    """The per-step kernel from a plain launch to the shipped kernel's structure, one trait at a time, each
    launch checked against ``fp8_linear``; beside it the shipped launch with PDL on and off."""
    results = {}
    for shape in shapes:
        N, K = map(int, shape.split("x"))
        ws = [rand_fp8(N, K) for _ in range(max(2, int(COLD_BYTES // (N * K))))]
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        want = fp8_linear(x, *ws[0]).float()
        row = {}
        for mode in ("1", "0"):
            os.environ["GLMSERVE_PDL"] = mode
            pdl_mode.cache_clear()
            row[f"shipped, GLMSERVE_PDL={mode}"] = us_per([lambda w=w, x=x: fp8_linear(x, *w) for w in ws],
                                                           len(ws))
        os.environ.pop("GLMSERVE_PDL")
        pdl_mode.cache_clear()
        for bn, bk, per_sm in ((16, 512, 3), (32, 512, 3)):
            split = max(1, min(triton.cdiv(per_sm * num_sms(), triton.cdiv(N, bn)), triton.cdiv(K, bk)))
            steps = [{}, {"pdl": True}, {"pdl": True, "peel": True}, {"pdl": True, "peel": True, "select": True}]
            if split > 1:
                steps += [{"last": True}, {"pdl": True, "peel": True, "select": True, "last": True}]
            for flags in steps:
                name = f"{bn}x{bk} s{split} w4: " + ("+".join(flags) or "plain")
                out = torch.zeros(1, N, device="cuda", dtype=torch.float32)
                if split == 1 or flags.get("last"):
                    gemv_step(x, *ws[0], out, bn, bk, split, 4, 1, **flags)
                    err = ((out - want).norm() / want.norm()).item()
                    assert err < 1e-2, (name, err)
                row[name] = us_per([lambda w=w, x=x, out=out, t=(bn, bk, split), f=flags:
                                    gemv_step(x, *w, out, *t, 4, 1, **f) for w in ws], len(ws))
        results[shape] = row
        print(f"{shape}: " + "; ".join(f"{n} {us:.1f}" for n, us in row.items()), flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--explain", action="store_true", help="the per-step kernel's gap to the shipped structure")
    args = ap.parse_args()
    if args.explain:
        results = explain(args.shapes)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gemv_explain.json").write_text(json.dumps(results, indent=1))
        return
    results = {}
    for shape in args.shapes:
        N, K = map(int, shape.split("x"))
        ws = [rand_fp8(N, K) for _ in range(max(2, int(COLD_BYTES // (N * K))))]
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        row = {"shipped": us_per([lambda w=w, x=x: fp8_linear(x, *w) for w in ws], len(ws))}
        pick = gemv_tile(N, K)
        row["shipped tile"] = f"{pick.block_n}x{pick.block_k} s{pick.split} w{pick.num_warps}"
        o = torch.empty(8, N, device="cuda", dtype=torch.int32)
        row["stream 32x1024 s2 w4"] = us_per([lambda w=w, o=o: stream(w[0], o, 32, 1024, 2, 4) for w in ws], len(ws))
        want = fp8_linear(x, *ws[0]).float()
        variants = {}
        for bn, bk, warps, stages, per_sm in itertools.product((16, 32), (512, 1024, 2048), (4, 8), (1, 3), (1, 3)):
            split = max(1, min(triton.cdiv(per_sm * num_sms(), triton.cdiv(N, bn)), triton.cdiv(K, bk)))
            name = f"{bn}x{bk} s{split} w{warps} st{stages}"
            if name in variants:
                continue
            out = torch.zeros(1, N, device="cuda", dtype=torch.float32)
            if split == 1:
                gemv_step(x, *ws[0], out, bn, bk, split, warps, stages)
                err = ((out - want).norm() / want.norm()).item()
                assert err < 1e-2, (name, err)
            variants[name] = us_per([lambda w=w, x=x, out=out, t=(bn, bk, split, warps, stages):
                                     gemv_step(x, *w, out, *t) for w in ws], len(ws))
        best = sorted(variants.items(), key=lambda kv: kv[1])[:5]
        row["step-reduce best 5"] = best
        results[shape] = row
        print(f"{shape} ({N * K / 1e6:.0f} MB): shipped {row['shipped']:.1f} µs ({row['shipped tile']}), stream "
              f"{row['stream 32x1024 s2 w4']:.1f}; step-reduce best: "
              + ", ".join(f"{us:.1f} ({n})" for n, us in best), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gemv_variants.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
