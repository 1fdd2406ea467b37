"""Session 20: the routing kernel (``triton_moe._route_kernel``, every pair ranked against all P) at a dp step's
MoE rows — 64 / 128 / 256 rows of top-8 (P 512 / 1024 / 2048): pairs a program (BLOCK_I) × pairs a step
(BLOCK_J), each checked against the launch ``route_pairs`` takes, timed as a graph replay. At 256 rows the step
profile had it at 32.5 µs a layer.

    PYTHONPATH=. python bench/results/session20/route_blocks.py
"""

from __future__ import annotations

import torch
import triton

from bench.rows_gemm import graph_us
from glmkernels import triton_moe
from glmkernels.triton_utils import pdl_launch

DEV, E, K = "cuda", 256, 8


def launch(idx: torch.Tensor, block_i: int, block_j: int, warps: int):
    N, k = idx.shape
    P = N * k
    outs = [torch.empty(P, dtype=torch.int32, device=DEV) for _ in range(3)]
    order = torch.empty(N, k, dtype=torch.int32, device=DEV)
    valid = torch.empty(P, dtype=torch.int8, device=DEV)

    def run():
        triton_moe._route_kernel[(triton.cdiv(P, block_i),)](idx, outs[0], outs[1], outs[2], order, valid, P, 0, E,
                                                             TOPK=k, BLOCK_I=block_i, BLOCK_J=block_j,
                                                             num_warps=warps, **pdl_launch())
        return outs[0], outs[1], order, valid, outs[2]
    return run


def main() -> None:
    g = torch.Generator(device=DEV).manual_seed(0)
    for rows in (64, 128, 256):
        idx = torch.rand(rows, E, device=DEV, generator=g).topk(K, dim=1).indices.contiguous()
        ref = triton_moe.route_pairs(idx, 0, E)
        res = {}
        for bi in (8, 16, 32, 64):
            for bj in (32, 64, 128):
                for warps in (2, 4, 8):
                    run = launch(idx, bi, bj, warps)
                    assert all(torch.equal(a, b) for a, b in zip(run(), ref)), (rows, bi, bj, warps)
                    res[f"{bi}/{bj}/{warps}w"] = graph_us([run] * 8)
        best = sorted(res.items(), key=lambda kv: kv[1])
        print(f"rows {rows}: route_pairs' launch {res.get(f'{triton_moe.ROUTE_BLOCK}/32/4w', float('nan')):.1f} µs; "
              + ", ".join(f"{k} {v:.1f}" for k, v in best[:8]), flush=True)


if __name__ == "__main__":
    main()
