"""Tile sweep of the decode kernels: fp8_linear's decode tiles per weight shape (1 and 8 rows) and the fused
MoE's expert tiles (256 experts, H 6144, I 2048 and the 1/8-width shard I 256), on the GPU.

Every config is timed as CUDA-graph replays of one launch per weight copy (linear) or per routing (MoE),
with enough copies / routings that each launch streams its weights from HBM, not L2 — as in a decode
step. GB/s counts the weight bytes read (+ scales, activations, output). Each config's output is
checked against the reference first. The candidate kernels are compiled beforehand by a pool of
processes (Triton's disk cache), so the sweep is not bound by serial compilation.

    PYTHONPATH=. python bench/tune_decode_kernels.py [--baseline DIR] [--picks-only] [--out bench/results]

``--baseline DIR`` also times DIR/triton_linear.py and DIR/triton_moe.py with their own launch choices
(e.g. a previous commit's files from ``git show REV:glmkernels/triton_linear.py``): the "before" column.
``--picks-only`` times just the launchers' own choices (before/after numbers without the sweep).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import multiprocessing as mp
import os
import time
from pathlib import Path

import torch
import triton

from bench.decode_slice import graph_ms
from bench.kernels_micro import rand_fp8
from glmkernels import reference
from glmkernels.triton_linear import GemvTile, LinearTile, decode_tile, fp8_linear, gemv_tile
from glmkernels.triton_moe import ExpertTile, expert_tiles, fused_moe
from glmkernels.triton_utils import next_pow2, num_sms

DEV, BF16 = "cuda", torch.bfloat16
LINEAR_SHAPES = [(12288, 6144), (6144, 16384), (16384, 2048), (2048, 6144), (576, 6144), (4096, 2048)]
ROWS = (1, 8)
MOE_CASES = [(1, 2048), (8, 2048), (1, 256), (8, 256)]       # (rows, I)
E, H, TOPK = 256, 6144, 8
COLD_BYTES = 300e6                                            # 6× the 50 MB L2
SMEM = 200 * 1024
NARROW = False                 # --narrow: the one-row sweeps over 2–8 outputs × 1024–2048 K per step instead


def gemv_candidates(N: int, K: int) -> list[GemvTile]:
    """One-row (FMA) kernel shapes: fp32 accumulator tiles of 2k–16k lanes, ~2/4/8 programs per SM (NARROW:
    few rows, long runs of each row per step, beside the launcher's pick)."""
    out = {gemv_tile(N, K)} if NARROW else set()
    rows, ks, stages = ((2, 4, 8), (1024, 2048), (1,)) if NARROW else ((16, 32, 64), (128, 256, 512), (1, 3))
    for bn, bk, warps, st, pps in itertools.product(rows, ks, (4, 8), stages, (2, 4, 8)):
        if 2048 <= bn * bk <= 16384:
            split = max(1, min(triton.cdiv(pps * num_sms(), triton.cdiv(N, bn)), triton.cdiv(K, bk)))
            out.add(GemvTile(bn, bk, split, warps, st))
    return sorted(out, key=lambda t: (t.block_n, t.block_k, t.split, t.num_warps, t.num_stages))


def linear_candidates(M: int, N: int, K: int, one_row: bool = False) -> list[LinearTile]:
    if one_row:                                # the one-row kernel's sweep beside the tile kernel's pick
        return [decode_tile(M, N, K)] + gemv_candidates(N, K)
    block_m = max(16, next_pow2(M))
    out = {decode_tile(M, N, K)}
    for bn, bk, warps, stages, waves in itertools.product((32, 64, 128), (128, 256, 512), (4, 8), (3, 5),
                                                          (1, 2, 4)):
        if stages * bk * (bn + 2 * block_m) <= SMEM:
            split = max(1, min(triton.cdiv(waves * num_sms(), triton.cdiv(N, bn)), triton.cdiv(K, bk)))
            out.add(LinearTile(bn, bk, split, warps, stages))
    return sorted(out, key=lambda t: (t.block_n, t.block_k, t.split, t.num_warps, t.num_stages))


def expert_candidates(loads: int) -> list[ExpertTile]:
    """Tiles of an expert GEMM with ``loads`` weight tiles per K step (gate/up 2, down 1)."""
    return [ExpertTile(bn, bk, 4, st) for bn, bk, st in itertools.product((16, 32, 64, 128), (128, 256), (3, 4, 5))
            if st * bk * (loads * bn + 32) <= SMEM]


def fma_candidates() -> list[ExpertTile]:
    rows, ks = ((2, 4, 8), (1024, 2048)) if NARROW else ((8, 16, 32, 64), (128, 256, 512))
    return [ExpertTile(bn, bk, warps, 1, fma=True) for bn, bk, warps in           # num_stages 3: always slower
            itertools.product(rows, ks, (4, 8)) if 2048 <= bn * bk <= 16384]


def moe_jobs(N: int, I: int, one_row: bool = False) -> list[tuple[ExpertTile, ExpertTile]]:
    gu0, dn0 = expert_tiles(N, H, I)
    if one_row:                                # FMA gate/up and down sweeps beside the tile kernels' pick
        return ([expert_tiles(2, H, I)] + [(gu0, dn0)] * NARROW + [(gu, dn0) for gu in fma_candidates()]
                + [(gu0, dn) for dn in fma_candidates()])
    return [(gu, dn0) for gu in expert_candidates(2)] + [(gu0, dn) for dn in expert_candidates(1)]


def linear_inputs(M: int, N: int, K: int, copies: int = 1):
    ws = [rand_fp8(N, K) for _ in range(copies)]
    return torch.randn(M, K, device=DEV, dtype=BF16), ws


def moe_inputs(N: int, I: int, num_experts: int, routings: int):
    g, gs = rand_fp8(num_experts, I, H)
    u, us = rand_fp8(num_experts, I, H)
    d, ds = rand_fp8(num_experts, H, I)
    x = torch.randn(N, H, device=DEV, dtype=BF16)
    idx = [torch.stack([torch.randperm(num_experts, device=DEV)[:TOPK] for _ in range(N)]) for _ in range(routings)]
    w = torch.rand(N, TOPK, device=DEV)
    return x, idx, w, (g, u, d, gs, us, ds)


def _compile(jobs: list[tuple]) -> None:
    """Pool worker: run each job once at the real shapes (small expert count), filling Triton's disk cache."""
    inputs = {}
    for kind, *shape, config in jobs:
        if (kind, *shape) not in inputs:
            inputs[(kind, *shape)] = linear_inputs(*shape) if kind == "linear" else moe_inputs(*shape, 16, 1)
        try:
            if kind == "linear":
                x, ws = inputs[(kind, *shape)]
                fp8_linear(x, *ws[0], config)
            else:
                x, idx, w, weights = inputs[(kind, *shape)]
                fused_moe(x, idx[0], w, *weights, tiles=config)
        except Exception:  # noqa: BLE001, S110  (out of resources, say: the sweep reports it)
            pass
    torch.cuda.synchronize()


def precompile(jobs: list[tuple]) -> None:
    procs = min(16, os.cpu_count() or 1)
    chunks = [jobs[i::procs] for i in range(procs)]
    with mp.get_context("spawn").Pool(procs) as pool:
        pool.map(_compile, chunks)


def timed(name: str, configs, run, reference_out, label=None, bytes_moved: float | None = None) -> list[tuple]:
    """(µs per launch, config) for every config whose ``run(0, config)`` matches ``reference_out`` (1e-2),
    timed by ``per_launch_us``; a wrong or failing config is printed and skipped."""
    label = label or short
    results = []
    for config in configs:
        try:
            if rel(run(0, config), reference_out) > 1e-2:
                print(f"{name} {label(config)}: WRONG", flush=True)
                continue
            us = per_launch_us(run, config)
        except Exception as e:  # noqa: BLE001  (out of resources, say)
            print(f"{name} {label(config)}: {type(e).__name__}", flush=True)
            continue
        results.append((us, config))
        rate = f" {bytes_moved / us / 1e3:.0f} GB/s" if bytes_moved else ""
        print(f"{name} {label(config)}: {us:.1f} us{rate}", flush=True)
    return results


def sweep(name: str, bytes_moved: float, configs, run, reference_out, baseline_run) -> dict:
    """``timed`` over the configs, and ``baseline_run`` (or None) with its own choice."""
    results = timed(name, configs, run, reference_out, bytes_moved=bytes_moved)
    before = per_launch_us(baseline_run, None) if baseline_run else float("nan")
    return {"op": name, "bytes": bytes_moved, "results": results, "baseline_us": before}


def per_launch_us(run, config) -> float:
    """Median µs per call of ``run(i, config)`` for every input set i in turn, replayed as a CUDA graph."""
    return graph_ms(lambda: [run(i, config) for i in range(run.num_inputs)], 10) * 1e3 / run.num_inputs


def pick_tile(M: int, N: int, K: int) -> LinearTile:
    """What fp8_linear launches for M rows by default."""
    return gemv_tile(N, K) if M == 1 else decode_tile(M, N, K)


def linear_rows(baseline, picks_only: bool, one_row: bool = False):
    for (N, K), M in itertools.product(LINEAR_SHAPES, (1,) if one_row else ROWS):
        nbytes = N * K + triton.cdiv(N, 128) * triton.cdiv(K, 128) * 4 + M * (K + N) * 2
        x, ws = linear_inputs(M, N, K, max(2, int(COLD_BYTES // nbytes)))

        def run(i, tile, x=x, ws=ws):
            return fp8_linear(x, *ws[i], tile)

        def run_before(i, _, x=x, ws=ws):
            return baseline[0].fp8_linear(x, *ws[i])
        run.num_inputs = run_before.num_inputs = len(ws)
        configs = [pick_tile(M, N, K)] if picks_only else linear_candidates(M, N, K, one_row)
        row = sweep(f"linear M={M} [{N}x{K}]", nbytes, configs, run,
                    reference.linear(x.float(), *ws[0]), baseline and run_before)
        yield {**row, "pick": pick_tile(M, N, K)}


def shared_inputs(I: int, copies: int) -> list[tuple]:
    """``copies`` shared experts (gate, up, down, scales), one per routing: each launch reads its own."""
    out = []
    for _ in range(copies):
        (g, gs), (u, us), (d, ds) = rand_fp8(I, H), rand_fp8(I, H), rand_fp8(H, I)
        out.append((g, u, d, gs, us, ds))
    return out


def moe_rows(baseline, picks_only: bool, one_row: bool = False):
    """Each case; with --one-row also with the shared expert (one row fuses it as a ninth pair)."""
    cases = [(N, I, False) for N, I in MOE_CASES if N == 1 or not one_row]
    for N, I, with_shared in cases + ([(1, I, True) for N, I in MOE_CASES if N == 1] if one_row else []):
        x, idx, w, weights = moe_inputs(N, I, E, 8)
        shared = shared_inputs(I, len(idx)) if with_shared else [None] * len(idx)
        nbytes = (sum(i.unique().numel() for i in idx) / len(idx) + with_shared) * 3 * I * H

        def run(i, tiles, x=x, idx=idx, w=w, weights=weights, shared=shared):
            return fused_moe(x, idx[i], w, *weights, tiles=tiles, shared=shared[i])

        def run_before(i, _, x=x, idx=idx, w=w, weights=weights):
            return baseline[1].fused_moe(x, idx[i], w, *weights)
        run.num_inputs = run_before.num_inputs = len(idx)
        configs = [expert_tiles(N, H, I)] if picks_only else moe_jobs(N, I, one_row)
        name = f"moe N={N} I={I}" + (" +shared" if with_shared else "")
        row = sweep(name, nbytes, configs, run,
                    reference.moe_experts(x.float(), idx[0], w, *weights, shared=shared[0]),
                    baseline and not with_shared and run_before)
        yield {**row, "pick": expert_tiles(N, H, I)}


def write_table(rows: list[dict], out: Path, name: str = "tune_decode_kernels.md") -> str:
    lines = [f"# Decode kernel tile sweep ({torch.cuda.get_device_name()})", "",
             ("CUDA-graph replay, weights cold in L2; GB/s = bytes moved / time. `pick` is the launcher's choice; "
              "`before` the --baseline kernels with their own choice."), "",
             "| op | before µs (GB/s) | pick µs (GB/s) | best µs (GB/s) | best config (gate/up \\| down) |", "|---|---:|---:|---:|---|"]
    for r in rows:
        if not r["results"]:
            continue
        best_us, best = min(r["results"], key=lambda t: t[0])
        pick_us = next((us for us, t in r["results"] if t == r["pick"]), float("nan"))
        gbps = [r["bytes"] / us / 1e3 for us in (r["baseline_us"], pick_us, best_us)]
        lines.append(f"| {r['op']} | {r['baseline_us']:.1f} ({gbps[0]:.0f}) | {pick_us:.1f} ({gbps[1]:.0f}) | "
                     f"{best_us:.1f} ({gbps[2]:.0f}) | {short(best)} |")
    top = [f"{r['op']}: " + "; ".join(f"{us:.1f} {short(t)}" for us, t in sorted(r["results"], key=lambda t: t[0])[:6])
           for r in rows]
    text = "\n".join(lines) + "\n\nFastest configs per op (µs):\n\n" + "\n".join(f"- {t}" for t in top) + "\n"
    (out / name).write_text(text)
    return text


def short(config) -> str:
    """LinearTile / ExpertTile as ``block_n×block_k[ s<split>] w<warps> st<stages>``; pairs joined by ' | '."""
    if isinstance(config, tuple):
        return " | ".join(short(c) for c in config)
    split = f" s{config.split}" if isinstance(config, LinearTile) else ""
    fma = " fma" if isinstance(config, GemvTile) or getattr(config, "fma", False) else ""
    return f"{config.block_n}x{config.block_k}{split} w{config.num_warps} st{config.num_stages}{fma}"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def load_baseline(folder: str):
    mods = []
    for name in ("triton_linear", "triton_moe"):
        spec = importlib.util.spec_from_file_location(f"baseline_{name}", Path(folder) / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mods.append(mod)
    return mods


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--picks-only", action="store_true")
    ap.add_argument("--one-row", action="store_true", help="sweep the one-row (FMA) kernels only")
    ap.add_argument("--moe-only", action="store_true", help="skip the linear shapes")
    ap.add_argument("--narrow", action="store_true", help="with --one-row: 2–8 outputs × 1024–2048 K per step")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    global NARROW
    NARROW = args.narrow
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.picks_only:
        rows = (1,) if args.one_row else ROWS
        jobs = [("linear", M, N, K, t) for (N, K), M in itertools.product(LINEAR_SHAPES, rows)
                for t in linear_candidates(M, N, K, args.one_row) if not args.moe_only]
        jobs += [("moe", N, I, tiles) for N, I in MOE_CASES if N in rows for tiles in moe_jobs(N, I, args.one_row)]
        t0 = time.time()
        precompile(jobs)
        print(f"precompiled {len(jobs)} configs in {time.time() - t0:.0f} s", flush=True)
    baseline = load_baseline(args.baseline) if args.baseline else None
    rows = []
    linear = [] if args.moe_only else linear_rows(baseline, args.picks_only, args.one_row)
    for row in itertools.chain(linear, moe_rows(baseline, args.picks_only, args.one_row)):
        rows.append(row)
        name = "tune_decode_kernels" + ("_one_row" if args.one_row else "") + ("_narrow" if args.narrow else "")
        text = write_table(rows, out, name + ".md")
    print(text)


if __name__ == "__main__":
    main()
