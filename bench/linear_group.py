"""``linear_group`` at several rows: two or three FP8 projections of one input in one launch — of the Gluon mid-size
kernel past 8 rows (glmkernels/gluon_mid.py, ``more=``; every group there ran apart before session 35), of the Gluon
rows kernel at 2..8 — against the same projections launched apart (each on its own pick), at 2..256 rows: a dp
step's attention input projections (q_a, kv_a, the indexer's wk), q_b with the indexer's wq_b, and the SwiGLU gate
with up (the shared expert and the dense MLP at one rank of 8's width and whole; ``models.glm5.MLP`` groups them
since session 35).

Each variant is timed as the device sees it in a step (``rows_gemm.graph_us``: a CUDA graph of back-to-back launches
over weight copies that do not fit in L2), beside the group's weight bytes at the read stream. Every launch is checked
against the fp32 reference first; the grouped launch's outputs against the launches apart are reported (max |Δ|:
split-K sums in another order round differently).

    PYTHONPATH=. python bench/linear_group.py --out DIR [--rows 2 8 16 32 64 128 256] [--sweep] [--groups NAME ...]

``--sweep``: the grouped launch at split counts 1..24 (each ≥ one K step a split) and, past 64 rows, the mid-size
kernel's 64- and 128-row tiles at 2..4 ring stages and 1..4 splits — beside the pick.
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace
from pathlib import Path

import torch
import triton
from triton.runtime.errors import OutOfResources

from bench.mid_gemm import ceilings
from bench.rows_gemm import graph_us, weights
from glmkernels import gluon_mid, gluon_rows, reference
from glmkernels.triton_linear import fp8_linear, linear_group, tile_counters
from glmkernels.triton_utils import num_sms

DEV, BF16 = "cuda", torch.bfloat16
GROUPS = {"q_a, kv_a, wk": ((2048, 576, 128), 6144), "q_b, wq_b": ((16384, 4096), 2048),
          "gate, up 1/8 (shared)": ((256, 256), 6144), "gate, up 1/8 (dense)": ((1536, 1536), 6144),
          "gate, up (shared)": ((2048, 2048), 6144), "gate, up (dense)": ((12288, 12288), 6144)}
COLD_BYTES = 300e6
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24)


def grouped(tile: gluon_mid.MidTile | gluon_rows.RowsTile):
    """One launch of the group: the mid-size kernel, or at 2..8 rows the Gluon rows kernel."""
    launch = gluon_mid.fp8_linear_mid if isinstance(tile, gluon_mid.MidTile) else gluon_rows.fp8_linear_rows

    def run(x, group):
        out = torch.empty(x.shape[0], sum(w.shape[0] for w, _ in group), dtype=x.dtype, device=x.device)
        launch(x, *group[0], out, tile, tile_counters(x.device), more=tuple(group[1:]))
        return out
    return run


def apart(x, group):
    return torch.cat([fp8_linear(x, w, s) for w, s in group], -1)


def sweep_tiles(base: gluon_mid.MidTile | gluon_rows.RowsTile, M: int, K: int) -> dict:
    """Launches around the pick: split counts 1..24 that leave each split a K step (the rows kernel's is ``sub``
    128-wide blocks, the mid-size kernel's two), and past 64 rows the mid-size tile's 64 / 128 rows × 2..4 ring
    stages at 1..4 splits."""
    kbs = triton.cdiv(K, 128)
    if isinstance(base, gluon_rows.RowsTile):
        return {f"group split {s}": replace(base, split=s) for s in SPLITS if s <= kbs // base.sub}
    if M <= 64:
        return {f"group split {s}": replace(base, split=s) for s in SPLITS if s <= kbs // 2}
    return {f"group {bm}r/{st}st/s{s}": replace(base, block_m=bm, stages=st, split=s)
            for bm, st in itertools.product((64, 128), (2, 3, 4)) for s in SPLITS[:4] if s <= kbs // 2}


def case(name: str, sizes: tuple, K: int, M: int, stream_tbs: float, sweep: bool = False) -> dict:
    N = sum(sizes)
    copies = max(2, int(COLD_BYTES // (N * K)))
    groups = list(zip(*(weights(n, K, copies) for n in sizes)))
    x = torch.randn(M, K, device=DEV).to(BF16)
    want = torch.cat([reference.linear(x.float(), w, s) for w, s in groups[0]], -1)
    few = M <= gluon_rows.MAX_ROWS
    base = gluon_rows.rows_tile(M, N, K, num_sms()) if few else gluon_mid.mid_tile(M, N, K, num_sms())
    variants = {"apart": apart, "group": grouped(base)}
    kbs = triton.cdiv(K, 128)
    for split in sorted({1, max(1, base.split // 2), min(kbs // 2, base.split * 2)} - {base.split}):
        variants[f"group split {split}"] = grouped(replace(base, split=split))
    if sweep:
        variants.update({label: grouped(t) for label, t in sweep_tiles(base, M, K).items()})
    takes = gluon_rows.usable(x, N) if few else gluon_mid.usable(x, N, K, tuple(w for w, _ in groups[0]))
    row = {"group": name, "rows": M, "N": N, "K": K, "floor_us": N * K / stream_tbs / 1e6,
           "pick": "group" if takes else "apart", "us": {}}
    outs = {}
    for label, fn in variants.items():
        try:
            out = outs[label] = fn(x, groups[0])
        except OutOfResources:                     # shared memory: too deep a ring of too wide a tile
            continue
        err = ((out.float() - want).norm() / want.norm()).item()
        if err > 1e-2:
            print(f"  {name} {M} rows {label}: rel err {err:.2e}, skipped")
            continue
        row["us"][label] = graph_us([lambda g=g, fn=fn: fn(x, g) for g in groups])
    row["group_vs_apart_max_abs"] = (outs["group"].float() - outs["apart"].float()).abs().max().item()
    picked = torch.cat(linear_group(x, *groups[0]), -1)
    row["pick_matches"] = torch.equal(picked, outs[row["pick"]])
    print(f"{name:24s} {M:4d} rows  floor {row['floor_us']:6.1f} µs  " +
          "  ".join(f"{k} {v:6.1f}" for k, v in row["us"].items()) + f"  (pick: {row['pick']})", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 8, 16, 32, 64, 128, 256])
    ap.add_argument("--sweep", action="store_true", help="every split count (and past 64 rows tile rows × stages)")
    ap.add_argument("--groups", nargs="+", choices=list(GROUPS), help="which groups (default: all)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stream = ceilings()[0] / 1e12
    rows = [case(name, sizes, K, M, stream, args.sweep) for name, (sizes, K) in GROUPS.items()
            if not args.groups or name in args.groups for M in args.rows]
    (out / "linear_group.json").write_text(json.dumps({"read_stream_tbs": stream, "rows": rows}, indent=1))
    lines = [f"# linear_group at several rows ({torch.cuda.get_device_name()}; read stream {stream:.2f} TB/s)", "",
             ("µs a launch (CUDA graph over weight copies > L2). apart: each weight on its own pick; group: one "
              "launch of the mid-size (rows) kernel (its pick, and splits around it). pick: what linear_group takes."),
             "",
             "| group | rows | floor µs | apart | group | best grouped | group / apart | pick |",
             "|---|---:|---:|---:|---:|---|---:|---|"]
    for r in rows:
        us = r["us"]
        best = min((v, k) for k, v in us.items() if k != "apart")
        lines.append(f"| {r['group']} | {r['rows']} | {r['floor_us']:.1f} | {us.get('apart', float('nan')):.1f} | "
                     f"{us.get('group', float('nan')):.1f} | {best[1]} {best[0]:.1f} | "
                     f"{us.get('group', float('nan')) / us.get('apart', float('nan')):.2f} | {r['pick']} |")
    (out / "linear_group.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
