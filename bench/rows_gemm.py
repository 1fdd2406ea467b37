"""Few-row FP8 linear on the GPU: the Gluon rows kernel (glmkernels/gluon_rows.py) against the Triton tile kernel,
with the one-row GEMV beside them, on the GLM-5.2 decode shapes.

Each case is timed as the device sees it in a decode step: a CUDA graph of back-to-back launches over
enough copies of the weight that they do not fit in L2 (≥ 256 MB a round), replayed; time per launch is
the replay time / launches. Every Gluon launch is checked against the reference (fp32 dequantized
weight) before it is timed.

    PYTHONPATH=. python bench/rows_gemm.py --out bench/results
    PYTHONPATH=. python bench/rows_gemm.py --moe [--moe-rows 2 4 8 16 32 64] --out DIR   # fused MoE, 256 × 6144 × I
    PYTHONPATH=. python bench/rows_gemm.py --rows 16 32 64 --out DIR   # past Gluon's 8 rows: a sweep of tile launches
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
from pathlib import Path

import torch
import triton

from bench.decode_slice import graph_ms
from glmkernels import reference
from glmkernels.gluon_rows import MAX_ROWS, MoeTile, RowsTile, fp8_linear_rows, moe_tile, rows_tile
from glmkernels.triton_linear import LinearTile, decode_tile, fp8_linear, tile_counters
from glmkernels.triton_moe import expert_tiles, fused_moe
from glmkernels.triton_utils import num_sms

DEV = "cuda"
SHAPES = [(576, 6144, "kv_a"), (2048, 6144, "q_a"), (16384, 2048, "q_b"), (6144, 16384, "o_proj"),
          (12288, 6144, "dense gate_up"), (6144, 12288, "dense down"), (4096, 2048, "indexer wq_b")]


def weights(N: int, K: int, copies: int):
    out = []
    for _ in range(copies):
        w8 = (torch.randn(N, K, device=DEV) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        out.append((w8, torch.rand(triton.cdiv(N, 128), triton.cdiv(K, 128), device=DEV) * 1e-3 + 1e-4))
    return out


def graph_us(calls, reps: int = 20) -> float:
    """Device time of one call: a graph of ``calls`` (zero-argument launches) replayed ``reps`` times."""
    return graph_ms(lambda: [call() for call in calls], reps, chained=True) * 1e3 / len(calls)


def over(fn, ws, x):
    """One launch of ``fn`` per weight copy."""
    return [lambda w=w: fn(x, *w) for w in ws]


def gluon(tile: RowsTile):
    def run(x, w8, s):
        out = torch.empty(x.shape[0], w8.shape[0], dtype=x.dtype, device=x.device)
        fp8_linear_rows(x, w8, s, out, tile, tile_counters(x.device))
        return out
    return run


def variants(M: int, N: int, K: int) -> dict[str, RowsTile]:
    base = rows_tile(M, N, K, num_sms())
    out = {"gluon default": base, "gluon cvt": RowsTile(base.block_n, base.sub, base.split, base.num_warps, bits=False)}
    for bn, sub, warps, sx in itertools.product((16, 32, 64, 128), (1, 2, 4), (1, 2, 4, 8), (1, 2, 4)):
        if bn % (16 * warps) or (bn >= 64 and (warps < 4 or sx == 4)):
            continue
        split = max(1, min(triton.cdiv(2 * sx * num_sms(), triton.cdiv(N, bn)), triton.cdiv(K, 128) // sub))
        out[f"gluon {bn}/{sub}/{warps}w/s{split}"] = RowsTile(bn, sub, split, warps)
    return out


def tile_variants(M: int, N: int, K: int) -> dict[str, LinearTile]:
    """Past Gluon's rows: the tile kernel's launches around ``decode_tile`` (block_n, warps, stages, programs an
    SM)."""
    out = {"tile default": decode_tile(M, N, K)}
    k_steps = triton.cdiv(K, 128)
    for bn, warps, stages, per_sm in itertools.product((32, 64, 128) if N < 1024 else (64, 128), (4, 8), (3, 4),
                                                       (1, 2)):
        split = max(1, min(max(triton.cdiv(per_sm * num_sms(), triton.cdiv(N, bn)), triton.cdiv(k_steps, 32)),
                           k_steps // 2))
        out[f"tile {bn}/{warps}w/{stages}st/s{split}"] = LinearTile(bn, 128, split, warps, stages)
    return out


def moe_case(I: int, M: int, experts: tuple, k: int = 8) -> dict:
    """One (I, rows) case of ``moe_main``: the Triton tile kernels, the Gluon default and (8 rows) a sweep."""
    gate, up, down, gs, us, ds = experts
    E, _, H = gate.shape
    x = torch.randn(M, H, device=DEV, dtype=torch.bfloat16)
    idx = torch.stack([torch.randperm(E, device=DEV)[:k] for _ in range(M)])
    wr = torch.rand(M, k, device=DEV)

    def call(tiles):
        return fused_moe(x, idx, wr, gate, up, down, gs, us, ds, tiles=tiles)

    tri = call(expert_tiles(M, H, I)).float()
    t_tile = graph_us([lambda: call(expert_tiles(M, H, I))])
    cands = {"default": moe_tile(H, I, min(M * k, E), num_sms(), M)}
    d = cands["default"].split
    if M == 8:                 # a sweep (session 9)
        for bi, sp, bo, sub in itertools.product((64, 128), sorted({1, d, 2 * d}), (64, 128), (2, 4)):
            cands[f"{bi}/{sp}/{bo}/{sub}"] = MoeTile(bi, sp, bo, sub, 4 if bi == 64 else 8, 4 if bo == 64 else 8)
    elif M > 8:                # past 8 rows (session 18: 4 down tiles a program ±2 %, dropped), over every pair's
        for bi, sp, bo in itertools.product((64, 128), (1, 3), (64, 128)):  # position or (c) the runs' chunks
            for pairs, compact in ((8, False), (8, True), (16, True)):
                cands[f"{bi}/{sp}/{bo}/2/{pairs}{'c' if compact else ''}"] = MoeTile(
                    bi, sp, bo, 2, 4 if bi == 64 else 8, 4 if bo == 64 else 8, pairs, compact)
    times = {}
    for name, t in cands.items():
        err = ((call(t).float() - tri).norm() / tri.norm()).item()
        assert err < 1e-2, (I, M, name, err)
        times[name] = graph_us([lambda t=t: call(t)])
    hit = idx.unique().numel()
    return {"I": I, "rows": M, "experts_hit": hit, "bytes": hit * 3 * I * H, "tile_us": t_tile, "gluon": times}


def moe_main(out: Path, rows: list[int]) -> None:
    """fused_moe (routing and combine included) over 256 experts of 6144 × I, the Triton tile kernels vs the
    Gluon kernels (default launch and a sweep), one graph replay a call (the experts hit are ≫ L2)."""
    H, E = 6144, 256
    lines = [f"# Fused MoE experts, few rows ({torch.cuda.get_device_name()}): Gluon vs Triton tile kernels", "",
             ("µs a call (route + gate/up + down + combine), device time of a CUDA graph replay; TB/s = expert "
             "bytes read / time. Gluon launch: block_i/split/block_ho/sub[/pairs a program, c: grid over the "
             "runs' chunks]."), "",
             "| I | rows | experts hit | MB | Triton tile | Gluon default | best Gluon | best | TB/s tile → best |",
             "|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    res = []
    for I in (2048, 256):
        ws = []
        for a, b in ((I, H), (I, H), (H, I)):
            w = torch.empty(E, a, b, device=DEV).uniform_(-200, 200).to(torch.float8_e4m3fn)
            ws.append((w, torch.rand(E, a // 128, b // 128, device=DEV) * 1e-3 + 1e-4))
        experts = tuple(w for w, _ in ws) + tuple(sc for _, sc in ws)
        for M in rows:
            r = moe_case(I, M, experts)
            g = r["gluon"]
            best = min(g, key=g.get)
            nb = r["bytes"]
            print(f"I={I} M={M} hit {r['experts_hit']}: tile {r['tile_us']:.1f}  default {g['default']:.1f}  best "
                  f"{best} {g[best]:.1f} µs  ({nb / r['tile_us'] / 1e6:.2f} → {nb / g[best] / 1e6:.2f} TB/s)",
                  flush=True)
            res.append(r)
            lines.append(f"| {I} | {M} | {r['experts_hit']} | {nb / 1e6:.0f} | {r['tile_us']:.1f} | {g['default']:.1f} "
                         f"| {best} | {g[best]:.1f} | {nb / r['tile_us'] / 1e6:.2f} → {nb / g[best] / 1e6:.2f} |")
        ws = experts = None
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows_moe.json").write_text(json.dumps(res, indent=1))
    (out / "rows_moe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--moe", action="store_true")
    ap.add_argument("--moe-rows", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    args = ap.parse_args()
    if args.moe:
        return moe_main(Path(args.out), args.moe_rows)
    torch.manual_seed(0)
    rows = []
    for N, K, what in SHAPES:
        ws = weights(N, K, max(2, triton.cdiv(256 << 20, N * K)))
        nbytes = N * K
        x1 = torch.randn(1, K, device=DEV, dtype=torch.bfloat16)
        one = graph_us(over(fp8_linear, ws, x1))
        for M in args.rows:
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            ref = reference.linear(x.float(), reference.fp8_dequant(*ws[0]), None)
            # the Triton tile kernel by its launch (fp8_linear's own pick at 2..8 rows, ≥ 1024 outputs is Gluon's)
            tile = graph_us(over(functools.partial(fp8_linear, tile=decode_tile(M, N, K)), ws, x))
            res = {"shape": what, "N": N, "K": K, "rows": M, "gemv_1row_us": one, "tile_us": tile, "gluon": {}}
            if M > MAX_ROWS:                 # Gluon's rows kernel stops at 8: the tile kernel's launches instead
                for name, t in tile_variants(M, N, K).items():
                    y = fp8_linear(x, *ws[0], tile=t).float()
                    assert ((y - ref).abs().max() / ref.abs().max()).item() < 1e-2, (what, M, name)
                    res["gluon"][name] = graph_us(over(functools.partial(fp8_linear, tile=t), ws, x))
                best = min(res["gluon"], key=res["gluon"].get)
                print(f"{what:14s} M={M:2d} tile default {tile:6.1f}  best {best} {res['gluon'][best]:6.1f} µs  "
                      f"({nbytes / tile / 1e6:.2f} → {nbytes / res['gluon'][best] / 1e6:.2f} TB/s)", flush=True)
                rows.append(res)
                continue
            for name, t in variants(M, N, K).items():
                y = gluon(t)(x, *ws[0]).float()
                err = ((y - ref).abs().max() / ref.abs().max()).item()
                assert err < 1e-2, (what, M, name, err)
                res["gluon"][name] = graph_us(over(gluon(t), ws, x))
            best = min(res["gluon"], key=res["gluon"].get)
            print(f"{what:14s} M={M:2d} gemv(1) {one:6.1f}  tile {tile:6.1f}  default {res['gluon']['gluon default']:6.1f}"
                  f"  cvt {res['gluon']['gluon cvt']:6.1f}  best {best} {res['gluon'][best]:6.1f} µs"
                  f"  ({nbytes / res['gluon'][best] / 1e6:.2f} TB/s; tile {nbytes / tile / 1e6:.2f})", flush=True)
            rows.append(res)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows_gemm.json").write_text(json.dumps(rows, indent=1))
    lines = [f"# Few-row FP8 linear ({torch.cuda.get_device_name()}): Gluon rows kernel vs Triton tile kernel", "",
             "µs a launch, device time (CUDA graph of launches over weight copies > L2); TB/s = weight bytes / time.",
             "", "| shape | N×K | rows | GEMV 1 row | tile | Gluon default | Gluon cvt | best Gluon | best | TB/s tile → best |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in rows:
        g = r["gluon"]
        best = min(g, key=g.get)
        nb = r["N"] * r["K"]
        lines.append(f"| {r['shape']} | {r['N']}×{r['K']} | {r['rows']} | {r['gemv_1row_us']:.1f} | {r['tile_us']:.1f} | "
                     f"{g.get('gluon default', float('nan')):.1f} | {g.get('gluon cvt', float('nan')):.1f} | "
                     f"{best.split(' ', 1)[1]} | {g[best]:.1f} | "
                     f"{nb / r['tile_us'] / 1e6:.2f} → {nb / g[best] / 1e6:.2f} |")
    (out / "rows_gemm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
