"""Session 28, call 2 (kept as it ran, at commit 10a0aeb: the fused router (``ops.router``, ``RouterTile``), the
one-row combine in the down launch (``row_combine``) and the grouped q_b + wq_b were removed after it, each slower
than what it replaced — results in README.md beside this file; run it from a checkout of that commit).

The one-row step's fused launches against the launches they replace, on the GLM-5.2-width shapes (one H200):

* the router: the logits' GEMV (``linear_f32``) + ``router_topk`` (two launches) vs ``ops.router``'s one launch
  (``RouterTile`` variants: programs of experts × hidden dims, warps, selection by rank or by iterative pick);
* the MoE's one row (8 routed experts + the shared one as a ninth pair): the combine as its own launch vs in the
  down launch (its last arrival at each output block);
* q_b (16384 × 2048) and the indexer's wq_b (4096 × 2048): two GEMV launches vs one (``linear_group``'s tile and
  split-K variants).

µs a call: device time of a CUDA graph of one call per weight copy (copies enough that the weights stream from HBM,
not L2), replayed back to back (``bench.rows_gemm.graph_us``: PDL as the step runs it, launch gaps included).

    PYTHONPATH=. python bench/results/session28/one_row_fusions.py [--out DIR]   # at 10a0aeb
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.kernels_micro import rand_fp8
from bench.moe_one_row import experts
from bench.rows_gemm import DEV, graph_us
from glmkernels.triton_linear import GemvTile, _gemv, gemv_tile, linear, linear_f32
from glmkernels.triton_moe import fused_moe
from glmkernels.triton_router import RouterTile, router, router_topk

H, E, TOP_K = 6144, 256, 8
BF16 = torch.bfloat16


def router_cases(copies: int = 16) -> dict[str, float]:
    gates = [torch.randn(E, H, device=DEV) / 80 for _ in range(copies)]           # 6.3 MB each, fp32
    bias = 0.01 * torch.randn(E, device=DEV)
    x = torch.randn(1, H, device=DEV, dtype=BF16)
    args = (bias, TOP_K, 1, 1, True, 2.5)
    out = {"two launches (linear_f32 + router_topk)": graph_us(
        [lambda w=w: router_topk(linear_f32(x, w), *args) for w in gates])}
    for tile in (RouterTile(), RouterTile(rank=False), RouterTile(8, 1024, 8), RouterTile(4, 1024, 2),
                 RouterTile(16, 512, 4), RouterTile(4, 512, 1), RouterTile(8, 512, 2), RouterTile(2, 1024, 1)):
        out[f"one launch {tile.block_e}×{tile.block_k} {tile.num_warps}w {'rank' if tile.rank else 'pick'}"] = \
            graph_us([lambda w=w, t=tile: router(x, w, *args, tile=t) for w in gates])
    ref = router_topk(linear_f32(x, gates[0]), *args)
    got = router(x, gates[0], *args)
    assert set(ref[0][0].tolist()) == set(got[0][0].tolist())
    return out


def moe_cases(copies: int = 8) -> dict[str, float]:
    gate, up, down, gs, us, ds = experts()
    sh = [rand_fp8(2048, H), rand_fp8(2048, H), rand_fp8(H, 2048)]
    shared = (sh[0][0], sh[1][0], sh[2][0], sh[0][1], sh[1][1], sh[2][1])
    x = torch.randn(1, H, device=DEV, dtype=BF16)
    routes = [(torch.randperm(E, device=DEV)[:TOP_K][None], torch.rand(1, TOP_K, device=DEV)) for _ in range(copies)]
    out = {}
    for combine in (False, True):
        out[f"gate/up + down + combine, combine {'in down' if combine else 'its own launch'}"] = graph_us(
            [lambda r=r, c=combine: fused_moe(x, *r, gate, up, down, gs, us, ds, shared=shared, row_combine=c)
             for r in routes])
    a, b = (fused_moe(x, *routes[0], gate, up, down, gs, us, ds, shared=shared, row_combine=c) for c in (False, True))
    assert torch.equal(a, b)
    return out


def q_cases(copies: int = 4) -> dict[str, float]:
    ws = [(rand_fp8(16384, 2048), rand_fp8(4096, 2048)) for _ in range(copies)]
    x = torch.randn(1, 2048, device=DEV, dtype=BF16)

    def group(tile):
        def run(qb, wq):
            y = torch.empty(1, 16384 + 4096, dtype=BF16, device=DEV)
            _gemv(x, qb[0], qb[1], y, tile, more=(wq,))
            return y
        return run
    out = {"two launches": graph_us([lambda qb=qb, wq=wq: (linear(x, *qb), linear(x, *wq)) for qb, wq in ws])}
    default = gemv_tile(16384 + 4096, 2048)
    tiles = {"default": default}
    for bn, bk, split, warps in ((32, 256, 2, 4), (32, 256, 4, 4), (16, 256, 2, 4), (64, 256, 2, 8), (32, 512, 2, 4),
                                 (16, 512, 1, 4), (64, 128, 1, 4)):
        tiles[f"{bn}×{bk} split {split} {warps}w"] = GemvTile(bn, bk, split, num_warps=warps)
    for name, tile in tiles.items():
        out[f"one launch, {name}"] = graph_us([lambda qb=qb, wq=wq, t=tile: group(t)(qb, wq) for qb, wq in ws])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results = {}
    for name, fn in (("router", router_cases), ("moe one row", moe_cases), ("q_b + wq_b", q_cases)):
        print(f"== {name}", flush=True)
        results[name] = fn()
        for case, us in results[name].items():
            print(f"  {us:8.2f} us  {case}", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "one_row_fusions.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
