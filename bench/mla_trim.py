"""The sparse MLA attention with and without its trim (``triton_attention._mla(..., trim=)``: a program whose keys end
in -1 attends only up to its last selected key) on the GLM-5 widths (64 heads, latent 512 + rope 64, top-k 2048), the
default launch (``mla_tile``) of each case, timed alternately in one process (median of synchronized calls), outputs
compared bit for bit. Rows that see fewer keys than the step's K hold -1s after their selection: a prompt's rows beside
long-context decoders (K is the decoders' 2048), a fresh prompt's early rows (row i sees i + 1 keys).

    PYTHONPATH=. python bench/mla_trim.py [--out FILE.md]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

from bench.decode_slice import time_ms
from glmkernels import triton_attention as ta

DEV, BF16 = "cuda", torch.bfloat16
NH, RKV, DR, TOPK = 64, 512, 64, 2048


def selection(seen: list[int], slots: int, g: torch.Generator) -> torch.Tensor:
    """[rows, TOPK]: row r selects min(seen[r], TOPK) distinct slots, then -1s (the indexer's layout)."""
    out = torch.full((len(seen), TOPK), -1, dtype=torch.long, device=DEV)
    for r, n in enumerate(seen):
        k = min(n, TOPK)
        out[r, :k] = torch.randperm(slots, device=DEV, generator=g)[:k]
    return out


CASES = {
    "decode, 1 row of 2048 keys": [4096],
    "verify, 8 rows of 2048 keys": [4096] * 8,
    "100-token prompt beside 16 decoders": [4096] * 16 + [i + 1 for i in range(100)],
    "400-token prompt beside 16 decoders": [4096] * 16 + [i + 1 for i in range(400)],
    "fresh 2048-token prompt": [i + 1 for i in range(2048)],
    "2048-row chunk at 4k context": [4096] * 2048,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    g = torch.Generator(device=DEV).manual_seed(0)
    cache = torch.randn(8192, RKV + DR, device=DEV, generator=g).to(BF16)
    variants = {"untrimmed": {"trim": False}, "trimmed": {"trim": True}}
    lines = ["| case | rows | " + " | ".join(f"{v} ms" for v in variants) + " | untrimmed / best | equal |",
             "|---|---:|" + "---:|" * len(variants) + "---:|---|"]
    for name, seen in CASES.items():
        N = len(seen)
        ql = torch.randn(N, NH, RKV, device=DEV, generator=g).to(BF16)
        qr = torch.randn(N, NH, DR, device=DEV, generator=g).to(BF16)
        idx = selection(seen, cache.shape[0], g)
        tile = ta.mla_tile(N)
        runs = {v: partial(ta._mla, ql, qr, cache, idx, 1 / 24.0, *tile, **kw) for v, kw in variants.items()}
        outs = [run() for run in runs.values()]
        equal = all(torch.equal(outs[0], o) for o in outs[1:])
        times = {v: [] for v in runs}
        for _ in range(3):                                   # alternating, so that drift hits all alike
            for v, run in runs.items():
                times[v].append(time_ms(run, 10))
        ms = {v: sorted(t)[1] for v, t in times.items()}
        lines.append(f"| {name} | {N} | " + " | ".join(f"{ms[v]:.3f}" for v in runs)
                     + f" | {ms['untrimmed'] / min(ms.values()):.2f}× | {equal} |")
        print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
