"""Session 19: the W_UK absorb / W_UV expand past 16 rows (a 32- or 64-row graph step) — the several-row kernels
(ABSORB_MAX_ROWS 64) against the reference they replaced there (kv_b dequantized, then a batched matmul), at GLM-5
widths: a CUDA graph of one call on each of 8 kv_b copies (each reads its weight from HBM), replays chained, per call.

    PYTHONPATH=. python bench/results/session19/absorb_rows.py
"""

from __future__ import annotations

import torch

from bench.decode_slice import graph_ms
from bench.tune_attention import DN, NH, RKV, kv_b_copies
from glmkernels import reference
from glmkernels import triton_attention as ta

BF16 = torch.bfloat16


def main() -> None:
    kv_bs = kv_b_copies(8)
    for N in (8, 16, 32, 64):
        q = torch.randn(N, NH, DN, device="cuda", dtype=BF16)
        o = torch.randn(N, NH, RKV, device="cuda", dtype=BF16)
        cells = []
        for name, fn in (("absorb kernel", lambda kv, q=q: ta.mla_absorb(q, kv)),
                         ("absorb reference", lambda kv, q=q: reference.mla_absorb(q, kv)),
                         ("expand kernel", lambda kv, o=o: ta.mla_expand(o, kv, DN)),
                         ("expand reference", lambda kv, o=o: reference.mla_expand(o, kv, DN))):
            us = graph_ms(lambda f=fn: [f(kv) for kv in kv_bs], 20, chained=True) * 1e3 / len(kv_bs)
            cells.append(f"{name} {us:.1f} µs")
        ref = reference.mla_absorb(q.float(), kv_bs[0])
        rel = ((ta.mla_absorb(q, kv_bs[0]).float() - ref).norm() / ref.norm()).item()
        print(f"N {N}: " + "; ".join(cells) + f"; absorb rel {rel:.1e}", flush=True)


if __name__ == "__main__":
    main()
