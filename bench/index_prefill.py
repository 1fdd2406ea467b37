"""The prefill indexer's scoring on the GPU: one request's chunk of rows against its keys (32 heads × 128, bf16),
the one-row kernel (``_score``: a program per row and 64 keys) beside the rows kernel (``_score_rows``: a program per
block of rows and keys, each key tile loaded once for the block) at several tiles; ms (median of synchronized
calls) and TFLOP/s of the dots (2 · rows · keys · heads · 128). Scores are checked against the one-row kernel's.

    PYTHONPATH=. python bench/index_prefill.py [--rows 2048] [--keys 32768 131072]
"""

from __future__ import annotations

import argparse

import torch

from bench.decode_slice import time_ms
from glmkernels.reference import ragged_slots
from glmkernels.triton_attention import SCORE_ROWS, _score, _score_rows

TILES = [(8, 64, 1024, 8), (8, 64, 256, 8), (8, 64, 1024, 4), (4, 64, 1024, 4), (16, 64, 1024, 8), (8, 128, 1024, 8),
         (16, 32, 1024, 8), (8, 64, 64, 8)]


def case(T: int, N: int, g: torch.Generator) -> list[str]:
    """One request's N rows (the last N positions) against its T keys: a cell per kernel."""
    ih, idd = 32, 128
    k_cache = torch.randn(T + 4096, idd, device="cuda", generator=g).to(torch.bfloat16)
    seq_slots = [torch.randperm(T + 4096, device="cuda", generator=g)[:T]]
    seq_rows = [(0, N)]
    positions = torch.arange(T - N, T, device="cuda")
    q = torch.randn(N, ih, idd, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(N, ih, device="cuda", generator=g)
    r = ragged_slots(seq_rows, seq_slots, q.device)
    scale = idd ** -0.5
    want = _score(q, w, k_cache, r.slots, r.base, r.length, positions, T, 1, scale)
    finite = torch.isfinite(want)
    flop = 2 * N * T * ih * idd
    one = time_ms(lambda: _score(q, w, k_cache, r.slots, r.base, r.length, positions, T, 1, scale), 10)
    cells = [f"{one:.2f} ms {flop / one / 1e9:.0f} TF/s"]
    for tile in TILES:
        got = _score_rows(q, w, k_cache, r, seq_rows, 0, positions, T, scale, tile)
        assert torch.equal(finite, torch.isfinite(got)), tile
        assert torch.allclose(got[finite], want[finite], rtol=1e-3, atol=1e-3), tile
        ms = time_ms(lambda t=tile: _score_rows(q, w, k_cache, r, seq_rows, 0, positions, T, scale, t), 10)
        cells.append(f"{ms:.2f} ms {flop / ms / 1e9:.0f} TF/s" + (" (pick)" if tile == SCORE_ROWS else ""))
    return cells


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--keys", type=int, nargs="+", default=[32768, 131072])
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    print("| keys | rows | one-row kernel | " + " | ".join(f"rows {t}" for t in TILES) + " |")
    for T in args.keys:
        print(f"| {T} | {args.rows} | " + " | ".join(case(T, args.rows, g)) + " |", flush=True)


if __name__ == "__main__":
    main()
