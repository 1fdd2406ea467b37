"""How close the one-row FP8 GEMV is to a bare Triton load stream of the same weight, on the GPU.

For each decode weight shape: the launcher's one-row kernel (``fp8_linear``, its own tile) beside
``_stream_kernel`` — the same [rows × K-step] tiles loaded as int32 words and xor-folded, nothing else
(no activation, no scales, no conversion, no reduction across threads) — at the best of a small tile grid,
and ``_stream_tma_kernel``, the same stream through TMA tensor descriptors (Hopper's bulk copies into shared
memory, pipelined over ``stages`` buffers). All as CUDA-graph replays over enough weight copies that every
launch streams from HBM.

    PYTHONPATH=. python bench/gemv_ceiling.py [--out bench/results]
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from bench.decode_slice import graph_ms
from bench.kernels_micro import rand_fp8
from glmkernels.triton_linear import fp8_linear, gemv_tile
from glmkernels.triton_utils import num_sms

SHAPES = [(12288, 6144), (6144, 16384), (16384, 2048), (2048, 6144), (576, 6144), (4096, 2048)]
COLD_BYTES = 300e6


@triton.jit
def _stream_kernel(w_ptr, out_ptr, N, K4, k4_per_split, BLOCK_N: tl.constexpr, BLOCK_K4: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K4)
    rows = w_ptr + rn[:, None] * K4
    k0 = pid_k * k4_per_split
    k_end = tl.minimum(k0 + k4_per_split, K4)
    acc = tl.zeros((BLOCK_N, BLOCK_K4), dtype=tl.int32)
    for k in range(k0, k_end, BLOCK_K4):
        kk = k + rk
        acc ^= tl.load(rows + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < k_end), other=0,
                       eviction_policy="evict_first")
    tl.store(out_ptr + pid_k * N + rn, tl.xor_sum(acc, axis=1), mask=rn < N)


@triton.jit
def _stream_tma_kernel(w_desc, out_ptr, N, K, k_per_split, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    k0 = pid_k * k_per_split
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.uint8)
    for k in tl.range(k0, tl.minimum(k0 + k_per_split, K), BLOCK_K, num_stages=STAGES):
        acc ^= w_desc.load([pid_n * BLOCK_N, k])
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + pid_k * N + rn, tl.xor_sum(acc.to(tl.int32), axis=1), mask=rn < N)


def stream_tma(desc: TensorDescriptor, out: torch.Tensor, N: int, K: int, block_n: int, block_k: int, split: int,
               stages: int) -> None:
    per = triton.cdiv(triton.cdiv(K, block_k), split) * block_k
    _stream_tma_kernel[(triton.cdiv(N, block_n), triton.cdiv(K, per))](desc, out, N, K, per, BLOCK_N=block_n,
                                                                      BLOCK_K=block_k, STAGES=stages, num_warps=4)


def stream(w8: torch.Tensor, out: torch.Tensor, block_n: int, block_k: int, split: int, warps: int) -> None:
    N, K = w8.shape
    per = triton.cdiv(triton.cdiv(K, block_k), split) * block_k
    _stream_kernel[(triton.cdiv(N, block_n), triton.cdiv(K, per))](
        w8.view(torch.int32), out, N, K // 4, per // 4, BLOCK_N=block_n, BLOCK_K4=block_k // 4, num_warps=warps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    out_dir = Path(ap.parse_args().out)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# One-row FP8 GEMV vs a bare load stream ({torch.cuda.get_device_name()})", "",
             "µs per launch (CUDA-graph replay, weights cold in L2); GB/s = weight bytes / time.", "",
             ("| weight | fp8_linear (pick) | tile | stream only (best) | tile | kernel at … of the stream "
              "| TMA stream (best) | tile |"),
             "|---|---:|---|---:|---|---:|---:|---|"]
    for N, K in SHAPES:
        nbytes = N * K
        ws = [rand_fp8(N, K) for _ in range(max(2, int(COLD_BYTES // nbytes)))]
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        ours = graph_ms(lambda x=x, ws=ws: [fp8_linear(x, w, s) for w, s in ws], 10, chained=True) * 1e3 / len(ws)
        pick = gemv_tile(N, K)
        best = (float("inf"), "")
        for bn, bk, warps, per_sm in itertools.product((8, 16, 32), (512, 1024, 2048), (4, 8), (2, 4)):
            split = max(1, min(triton.cdiv(per_sm * num_sms(), triton.cdiv(N, bn)), triton.cdiv(K, bk)))
            o = torch.empty(split + 1, N, device="cuda", dtype=torch.int32)
            us = graph_ms(lambda o=o, t=(bn, bk, split, warps), ws=ws: [stream(w, o, *t) for w, _ in ws], 10,
                          chained=True) * 1e3 / len(ws)
            best = min(best, (us, f"{bn}x{bk} s{split} w{warps}"))
        tma = (float("inf"), "")
        for bn, bk, stages, per_sm in itertools.product((64, 128), (128, 256), (3, 5), (1, 2)):
            split = max(1, min(triton.cdiv(per_sm * num_sms(), triton.cdiv(N, bn)), triton.cdiv(K, bk)))
            o = torch.empty(split + 1, N, device="cuda", dtype=torch.int32)
            descs = [TensorDescriptor.from_tensor(w.view(torch.uint8), [bn, bk]) for w, _ in ws]
            us = graph_ms(lambda o=o, t=(N, K, bn, bk, split, stages), d=descs: [stream_tma(x, o, *t) for x in d],
                          10, chained=True) * 1e3 / len(ws)
            tma = min(tma, (us, f"{bn}x{bk} s{split} st{stages}"))
        lines.append(f"| {N}x{K} | {ours:.1f} ({nbytes / ours / 1e3:.0f}) | {pick.block_n}x{pick.block_k} "
                     f"s{pick.split} w{pick.num_warps} | {best[0]:.1f} ({nbytes / best[0] / 1e3:.0f}) | {best[1]} | "
                     f"{best[0] / ours:.2f} | {tma[0]:.1f} ({nbytes / tma[0] / 1e3:.0f}) | {tma[1]} |")
        print(lines[-1], flush=True)
    (out_dir / "gemv_ceiling.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
