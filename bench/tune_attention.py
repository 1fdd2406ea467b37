"""Launch-shape sweep of the decode attention kernels on the GPU: MLA sparse attention (keys per program
and splits of a row's 2048 selected keys) and the W_UK absorb / W_UV expand from the FP8 kv_b (tile
and warps; for several rows also the kernels that read the weight once for all rows), at GLM-5 widths
(64 heads, kv_lora 512, rope 64, nope 192, v 256) for 1 and 8 rows.

Each config is checked against the reference, then timed as CUDA-graph replays cycling over enough
caches / kv_b copies that every launch reads from HBM, as one layer of a decode step does.

    PYTHONPATH=. python bench/tune_attention.py [--rows 1 8] [--out bench/results] [--mla-only] [--picks-only]
        [--per-sm 1 2 3 4]    # up to 8 rows: also more than one program an SM (more splits of a row's keys)
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from types import SimpleNamespace

import torch

from bench.kernels_micro import rand_fp8
from bench.tune_decode_kernels import timed
from glmkernels import reference
from glmkernels import triton_absorb as tb, triton_attention as ta

DEV, BF16 = "cuda", torch.bfloat16
NH, RKV, DR, DN, DV, K = 64, 512, 64, 192, 256, 2048
COLD_BYTES = 300e6


def sweep(name: str, configs, run, want, copies: int, label) -> list[tuple[float, str]]:
    """(µs, label) of every config whose output matches ``want``, ``run(i, config)`` over copies i in turn."""
    run.num_inputs = copies
    return [(us, label(config)) for us, config in timed(name, configs, run, want, label)]


# (keys a step, programs per SM, most splits, heads a program, warps, stages) but those that spill registers when
# compiled for sm_90 (triton 3.6 on CPU, as bench/gluon_regs.py does: 64 heads on 4 warps, 32 heads of 64 keys on 4);
# a shape over the shared memory fails at launch and is skipped
def mla_sweep(per_sms=(1,)) -> list[tuple]:
    """≤ 8 rows; ``per_sms``: the programs an SM is given (``--per-sm``: more than one a SM, more splits)."""
    return [(bk, per_sm, splits, bh, w, st) for per_sm, bh, bk, w, st, splits in
            itertools.product(per_sms, (16, 32, 64), (32, 64), (4, 8), (2, 3), (4, 8, 16, 64))
            if (w == 8 or bh == 16 or bh == 32 and bk < 64) and (per_sm == 1 or splits == 64)]


# past 8 rows a row's split count comes from the programs an SM is given (per_sm), not the most splits
MLA_ROWS_SWEEP = [(bk, per_sm, 64, bh, w, st) for bh, w in ((64, 8), (32, 8), (16, 4))
                  for bk, per_sm, st in itertools.product((32, 64), (1, 2, 3, 4), (2, 3))]
# --splits: the split count itself past 8 rows (the programs a step makes, N × splits, against the SMs' one wave);
# per_sm 64 leaves the most splits to set it
MLA_SPLITS_SWEEP = [(64, 64, splits, 64, 8, 2) for splits in range(1, 13)]


def mla_rows(N: int, picks_only: bool, splits: bool = False, per_sms=(1,)) -> tuple[str, list, str]:
    slots = 40960
    caches = [torch.randn(slots, RKV + DR, device=DEV, dtype=BF16) for _ in range(8)]
    sel = torch.stack([torch.randperm(slots, device=DEV)[:K] for _ in range(N)]).int()
    ql = torch.randn(N, NH, RKV, device=DEV, dtype=BF16)
    qr = torch.randn(N, NH, DR, device=DEV, dtype=BF16)
    want = reference.mla_sparse_attention(ql.float(), qr.float(), caches[0].float(), sel, 0.0625)

    def run(i, c):
        return ta._mla(ql, qr, caches[i], sel, 0.0625, *c)
    pick = (*ta.mla_tile(N), 2)                 # the stages: _mla's default
    sweep_ = MLA_SPLITS_SWEEP if splits and N > 8 else MLA_ROWS_SWEEP if N > 8 else mla_sweep(per_sms)
    configs = [pick] + ([] if picks_only else [c for c in sweep_ if c != pick])

    def label(c):
        return f"keys {c[0]} per_sm {c[1]} max {c[2]} heads {c[3]} w{c[4]} st{c[5]}"
    return f"mla N={N}", sweep(f"mla N={N}", configs, run, want, len(caches), label), label(pick)


class KvB(SimpleNamespace):
    """The FP8 kv_b as the kernels and the reference take it (models.glm5.Linear's fields)."""

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        return reference.fp8_dequant(self.weight, self.weight_scale_inv, dtype)


def kv_b_copies(copies: int) -> list[KvB]:
    out = []
    for _ in range(copies):
        w, s = rand_fp8(NH * (DN + DV), RKV)
        out.append(KvB(weight=w, weight_scale_inv=s, in_features=RKV, out_features=NH * (DN + DV)))
    return out


def absorb_expand_rows(N: int, kv_bs: list) -> list[tuple[str, list, str]]:
    q_nope = torch.randn(N, NH, DN, device=DEV, dtype=BF16)
    o_lat = torch.randn(N, NH, RKV, device=DEV, dtype=BF16)
    want_a = reference.mla_absorb(q_nope.float(), kv_bs[0])
    want_e = reference.mla_expand(o_lat.float(), kv_bs[0], DN)
    absorb = list(itertools.product((32, 64, 128, 256), (32, 64, 128), (2, 4, 8)))
    expand = list(itertools.product((16, 32, 64), (128, 256, 512), (2, 4, 8)))

    def label(c):
        return f"{c[0]}x{c[1]} w{c[2]}"

    def rows_label(c):
        return f"BLOCK_C {c[0]} w{c[1]}"

    def run_rows(kernel, *args):
        return lambda i, c: kernel(args[0], kv_bs[i], *args[1:], *c)
    rows_cfg = list(itertools.product((64, 128), (2, 4, 8)))
    several = [] if N == 1 else [         # several rows: the kernels that read each weight tile once for all
        (f"absorb rows N={N}", sweep(f"absorb rows N={N}", rows_cfg, run_rows(tb._absorb_rows, q_nope), want_a,
                                     len(kv_bs), rows_label), rows_label(tb.ABSORB_ROWS_TILE)),
        (f"expand rows N={N}", sweep(f"expand rows N={N}", rows_cfg, run_rows(tb._expand_rows, o_lat, DN), want_e,
                                     len(kv_bs), rows_label), rows_label(tb.EXPAND_ROWS_TILE))]
    return several + [
        (f"absorb per row N={N}", sweep(f"absorb per row N={N}", absorb, run_rows(tb._absorb, q_nope), want_a,
                                        len(kv_bs), label), label(tb.absorb_tile(RKV))),
        (f"expand per row N={N}", sweep(f"expand per row N={N}", expand, run_rows(tb._expand, o_lat, DN), want_e,
                                        len(kv_bs), label), label(tb.expand_tile(N)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--mla-only", action="store_true", help="only the sparse attention (not absorb / expand)")
    ap.add_argument("--picks-only", action="store_true", help="the sparse attention's launch shape of mla_tile only")
    ap.add_argument("--splits", action="store_true", help="past 8 rows: the sparse attention's split count, 1..12")
    ap.add_argument("--per-sm", type=float, nargs="+", default=[1.0],
                    help="up to 8 rows: the sparse attention's programs an SM to sweep (1: one wave of one)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kv_bs = [] if args.mla_only else kv_b_copies(int(COLD_BYTES // (NH * (DN + DV) * RKV)))
    results = []
    for N in args.rows:
        results.append(mla_rows(N, args.picks_only, args.splits, args.per_sm))
        if not args.mla_only:
            results += absorb_expand_rows(N, kv_bs)
    lines = [f"# Decode attention launch shapes ({torch.cuda.get_device_name()})", "",
             ("µs per launch (CUDA-graph replay, cold in L2). MLA: keys per program, programs per SM aimed at, "
              "most splits of a row's 2048 keys. absorb: BLOCK_D×BLOCK_C; expand: BLOCK_V×BLOCK_C."), "",
             "| op | pick µs | pick | best µs | best | next best |", "|---|---:|---|---:|---|---|"]
    for name, rows, pick in results:
        rows.sort()
        pick_us = next((us for us, lab in rows if lab == pick), float("nan"))
        nxt = "; ".join(f"{us:.1f} {lab}" for us, lab in rows[1:12 if args.splits else 5])
        lines.append(f"| {name} | {pick_us:.1f} | {pick} | {rows[0][0]:.1f} | {rows[0][1]} | {nxt} |")
    text = "\n".join(lines) + "\n"
    (out / "tune_attention.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
