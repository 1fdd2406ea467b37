"""MLA sparse attention over a prefill chunk on the GLM-5 widths (64 heads, latent 512 + rope 64): ``--rows`` query
rows, each attending to 2048 selected keys of a ``--ctx``-token cache (row i, at position ctx - rows + i, selects
2048 random keys among those it sees, in random order, as the indexer's top-k hands them over). Every launch
shape of ``triton_attention._mla`` in the sweep is checked against the reference on the first 64 rows, then timed
(median of single synchronized calls); the default (``mla_tile``) first. TFLOP/s: 2 · rows · 64 · 2048 ·
(576 + 512) / time; GB/s: the gathered key bytes (rows · programs a row · 2048 · 576 · 2) / time.

    PYTHONPATH=. python bench/mla_prefill.py [--rows 2048] [--ctx 4096] [--default-only]
"""

from __future__ import annotations

import argparse
import itertools
from functools import partial

import torch

from bench.decode_slice import time_ms
from bench.tune_decode_kernels import rel
from glmkernels import reference
from glmkernels import triton_attention as ta

DEV, BF16 = "cuda", torch.bfloat16
NH, RKV, DR, TOPK = 64, 512, 64, 2048


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--default-only", action="store_true", help="time mla_tile's launch shape only")
    args = ap.parse_args()
    g = torch.Generator(device=DEV).manual_seed(0)
    N, T = args.rows, args.ctx
    cache = torch.randn(T, RKV + DR, device=DEV, generator=g).to(BF16)
    ql = torch.randn(N, NH, RKV, device=DEV, generator=g).to(BF16)
    qr = torch.randn(N, NH, DR, device=DEV, generator=g).to(BF16)
    pos = torch.arange(T - N, T, device=DEV)
    score = torch.rand(N, T, device=DEV, generator=g).masked_fill(torch.arange(T, device=DEV) > pos[:, None], -1)
    idx = score.topk(TOPK, dim=1).indices                                       # random order among the visible
    idx = torch.where(score.gather(1, idx) >= 0, idx, -1)
    scale = 1 / 24.0
    want = reference.mla_sparse_attention(ql[:64], qr[:64], cache, idx[:64], scale)
    flop = 2 * N * NH * TOPK * (RKV + DR + RKV)
    default = ta.mla_tile(N)
    shapes = [default] + ([] if args.default_only else [(bk, 1, 64, bh, w, st) for bh, bk, w, st in
                                                        itertools.product((32, 64), (32, 64, 128), (4, 8), (1, 2, 3))])
    results = []
    for shape in shapes:
        run = partial(ta._mla, ql, qr, cache, idx, scale, *shape)
        try:
            err = rel(ta._mla(ql[:64], qr[:64], cache, idx[:64], scale, *shape), want)
            ms = time_ms(run, 5)
        except Exception as e:  # noqa: BLE001 — a shape that does not fit: report, go on
            print(f"{shape}: {type(e).__name__}", flush=True)
            continue
        gathered = N * (NH // shape[3]) * TOPK * (RKV + DR) * 2
        results.append((ms, shape))
        print(f"{shape}: {ms:.3f} ms, {flop / ms / 1e9:.0f} TFLOP/s, {gathered / ms / 1e6:.0f} GB/s gathered, "
              f"rel {err:.1e}" + ("  (default)" if shape is default else ""), flush=True)
    results.sort()
    print("best:", "; ".join(f"{ms:.3f} ms {shape}" for ms, shape in results[:5]))


if __name__ == "__main__":
    main()
