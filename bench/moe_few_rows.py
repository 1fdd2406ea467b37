"""The fused MoE at 2..8 rows as a decode step runs it (256 experts of 6144 × 2048, top-8, the shared expert as one
more pair of every row): the Gluon launch shapes over several routings each. ``--inter 256``: a tp rank's 1/8 of
every expert; past 8 rows (a dp step's MoE over every rank's rows, the shared expert fused to 64): the launches
``moe_tile`` picks there beside gate/up split over H and narrower tiles. ``--held 32``: an ep rank of 8 (its 32
experts; the rest of the pairs are routed away).

Why several routings: a launch of (positions × I / block_i × split) programs fills the GPU in waves of (SMs × the
blocks an SM holds); with random routing the experts hit — and so the programs that do work — change every step,
and a count just past a whole number of waves leaves a few programs to run alone at the end. 2 rows hit ~17 runs
(16 routed experts and the shared one): 17 × 16 gate/up programs of 8 warps against 2 × 132 resident.

µs a call (routing, gate/up, down, combine), device time of a CUDA graph replay (the experts hit are ≫ L2), each
launch checked against the Triton tile kernels first. Shape: block_i/split/block_ho/sub/gate-up warps/down warps.

    PYTHONPATH=. python bench/moe_few_rows.py [--rows 2 3 4 5 6 8] [--draws 4] [--inter 2048] [--held 256] [--down]
        --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from bench.rows_gemm import DEV, graph_us
from glmkernels.gluon_rows import MoeTile, moe_tile
from glmkernels.triton_moe import expert_tiles, fused_moe
from glmkernels.triton_utils import num_sms

H, E, TOP_K = 6144, 256, 8


def shapes(rows: int, I: int, held: int = E, down: bool = False) -> dict[str, MoeTile]:
    """The launches to time: ``moe_tile``'s pick as ``fused_moe`` makes it (pairs counted with the shared expert
    where it is fused: every expert held) and others (``down``: the default's gate/up beside other down launches —
    outputs a program, warps, blocks a program takes in turn — and K blocks a step, pairs a program)."""
    share = 1.0 if held == E else held / E
    hit = min(rows * (TOP_K + 1), E + 1) if held == E else min(held, max(1, math.ceil(rows * TOP_K * share)))
    default = moe_tile(H, I, hit, num_sms(), rows, share)
    out = {"default": default}
    if down:
        for ho, warps, steps in ((64, 4, 2), (64, 4, 4), (64, 4, 8), (128, 4, 1), (128, 8, 1), (128, 4, 2),
                                 (128, 8, 2), (128, 8, 4)):     # (≤ 128 outputs: one scale block a program)
            out[f"down {ho}/{warps}/x{steps}"] = replace(default, block_ho=ho, dn_warps=warps, ho_steps=steps)
        out[f"sub {3 - default.sub}"] = replace(default, sub=3 - default.sub)
        out[f"pairs {default.pairs * 2}"] = replace(default, pairs=default.pairs * 2)
        out[f"pairs {default.pairs * 2} down 128/8/x2"] = replace(default, pairs=default.pairs * 2, block_ho=128,
                                                                   dn_warps=8, ho_steps=2)
        return out
    if rows > 8:                               # the default's pairs and grid, gate/up split over H or narrower
        for bi, warps in ((128, 8), (64, 4)):
            for split in (1, 2, 4):
                out[f"{bi}/{split}/{default.block_ho}/{default.sub}/{warps}/{default.dn_warps}"] = MoeTile(
                    bi, split, default.block_ho, default.sub, warps, default.dn_warps, default.pairs, default.compact)
        if held < E:                           # an ep rank: before session 33 runs were counted as rows·k/held
            for t in (MoeTile(128, 1, 64, 2, 8, 4), MoeTile(128, 1, 128, 2, 8, 8), MoeTile(128, 2, 128, 2, 8, 8),
                      MoeTile(128, 1, 64, 2, 8, 4, compact=True), MoeTile(64, 1, 64, 1, 4, 4, 16, True)):
                out[f"{t.block_i}/{t.split}/{t.block_ho}/{t.sub}/{t.gu_warps}/{t.dn_warps}/p{t.pairs}"
                    + ("c" if t.compact else "")] = t
        return out
    if I < 1024:                               # narrow experts: one K block a step (the pick since session 34)
        for split in (2, 4, 6, 8, 12, 16, 24):
            out[f"64/{split}/64/1/4/4"] = MoeTile(64, split, 64, 1, 4, 4)
        for split in (2, 4, 6):
            out[f"128/{split}/64/1/8/4"] = MoeTile(128, split, 64, 1, 8, 4)
    for split in (1, 2, 3, 4):
        out[f"128/{split}/128/2/8/8"] = MoeTile(128, split, 128, 2, 8, 8)
    for split in (1, 2, 4):
        out[f"64/{split}/128/2/4/8"] = MoeTile(64, split, 128, 2, 4, 8)
    for split in (1, 2):
        out[f"128/{split}/64/2/8/4"] = MoeTile(128, split, 64, 2, 8, 4)
    out["64/2/64/2/4/4"] = MoeTile(64, 2, 64, 2, 4, 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 3, 4, 5, 6, 8])
    ap.add_argument("--draws", type=int, default=4)
    ap.add_argument("--inter", type=int, default=2048, help="each expert's width (256: a tp rank's of 8)")
    ap.add_argument("--held", type=int, default=E, help="experts held here (32: an ep rank of 8; the others' pairs "
                    "are routed away and the shared expert, sliced in ep, is left out)")
    ap.add_argument("--down", action="store_true", help="the default's gate/up beside other down launches")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    I, held = args.inter, args.held
    torch.manual_seed(0)
    ws = []
    for a, b in ((I, H), (I, H), (H, I)):
        w = torch.empty(E + 1, a, b, device=DEV).uniform_(-200, 200).to(torch.float8_e4m3fn)
        ws.append((w, torch.rand(E + 1, a // 128, b // 128, device=DEV) * 1e-3 + 1e-4))
    (gate, gs), (up, us), (down, ds) = ((w[:held], s[:held]) for w, s in ws)      # expert E: the shared one
    shared = tuple(w[E] for w, _ in ws) + tuple(s[E] for _, s in ws) if held == E else None   # gate, up, down, scales
    results, lines = [], []
    for rows in args.rows:
        x = torch.randn(rows, H, device=DEV, dtype=torch.bfloat16)
        times: dict[str, list[float]] = {}
        hits = []
        for _ in range(args.draws):
            idx = torch.stack([torch.randperm(E, device=DEV)[:TOP_K] for _ in range(rows)])
            wr = torch.rand(rows, TOP_K, device=DEV)
            hits.append(idx.unique().numel() + 1 if held == E else idx[idx < held].unique().numel())

            def call(tiles, x=x, idx=idx, wr=wr):
                return fused_moe(x, idx, wr, gate, up, down, gs, us, ds, tiles=tiles, shared=shared, n_experts=E)
            want = call(expert_tiles(rows, H, I)).float()
            for name, t in shapes(rows, I, held, args.down).items():
                err = ((call(t).float() - want).norm() / want.norm()).item()
                assert err < 1e-2, (rows, name, err)
                times.setdefault(name, []).append(graph_us([lambda t=t: call(t)]))
        mean = {n: statistics.mean(v) for n, v in times.items()}
        best = min(mean, key=mean.get)
        line = (f"rows {rows} runs {hits}: default {mean['default']:.1f} µs  best {best} {mean[best]:.1f}  | "
                + "  ".join(f"{n} {m:.1f}" for n, m in mean.items()))
        print(line, flush=True)
        lines.append(line)
        results.append({"rows": rows, "runs": hits, "us": times})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"moe_few_rows_i{I}" + (f"_held{held}" if held < E else "") + ("_down" if args.down else "")
    (out / f"{name}.json").write_text(json.dumps(results, indent=1))
    (out / f"{name}.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
