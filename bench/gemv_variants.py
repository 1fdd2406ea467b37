"""Other ways to write the one-row FP8 GEMV, beside the shipped one and a bare load stream (one H200).

The shipped ``_gemv_kernel`` keeps its products per K lane in a [BLOCK_N, BLOCK_K] fp32 tile and reduces once at
the end; on the big shapes it runs at 0.79–0.88 of a bare Triton load stream of the weight
(bench/results/gemv_ceiling.md: o_proj 34.0 µs against 26.8). ``_gemv_step_kernel`` here reduces every K step
instead (the accumulator is BLOCK_N values, so the registers go to a wider weight tile: more bytes in flight per
thread) and may software-pipeline its loop (``tl.range(num_stages=...)``). Its split-K partials are added with
fp32 atomics (a timing stand-in for the shipped kernel's deterministic last-arrival reduce, which costs a little
more); each launch's output is checked against ``fp8_linear`` (split 1 only: the atomics add onto the last call's).
Session 28 found the variant faster here (o_proj 30.6 → 27.2 µs) but, as an option of ``_gemv_kernel`` with the same
tile, slower than the shipped launch (31.0 vs 30.3; bench/results/session28/README.md): the difference is unexplained.

µs a launch: device time of a CUDA graph of one launch per weight copy (300 MB of copies: cold in L2), replayed
back to back.

    PYTHONPATH=. python bench/gemv_variants.py [--out DIR] [--shapes 6144x16384 12288x6144]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from bench.decode_slice import graph_ms
from bench.gemv_ceiling import COLD_BYTES, stream
from bench.kernels_micro import rand_fp8
from kernels.triton_linear import fp8_linear, gemv_tile
from kernels.triton_utils import num_sms

SHAPES = ["6144x16384", "12288x6144", "16384x2048", "2048x6144"]    # o_proj, dense gate / up, q_b, q_a


@triton.jit
def _gemv_step_kernel(x_ptr, w_ptr, s_ptr, out_ptr, N, K, num_sb_k, k_per_split, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, STAGES: tl.constexpr, SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    s_row = s_ptr + (pid_n * BLOCK_N) // 128 * num_sb_k
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    k0 = pid_k * k_per_split
    for k in tl.range(k0, tl.minimum(k0 + k_per_split, K), BLOCK_K, num_stages=STAGES):
        kk = k + rk
        w = tl.load(w_ptr + rn[:, None] * K + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0,
                    eviction_policy="evict_first")
        xs = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32) * tl.load(s_row + kk // 128,
                                                                                   mask=kk < K, other=0.0)
        acc += tl.sum(w.to(tl.float32) * xs[None, :], axis=1)
    if SPLIT:
        tl.atomic_add(out_ptr + rn, acc, mask=rn < N, sem="relaxed")
    else:
        tl.store(out_ptr + rn, acc, mask=rn < N)


def gemv_step(x, w8, s, out, block_n, block_k, split, warps, stages):
    N, K = w8.shape
    per = triton.cdiv(triton.cdiv(K, block_k), split) * block_k
    _gemv_step_kernel[(triton.cdiv(N, block_n), triton.cdiv(K, per))](
        x, w8, s, out, N, K, s.shape[1], per, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages, SPLIT=split > 1,
        num_warps=warps)


def us_per(calls, n: int) -> float:
    return graph_ms(lambda: [c() for c in calls], 10, chained=True) * 1e3 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    args = ap.parse_args()
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
