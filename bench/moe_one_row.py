"""The fused MoE at one row (I 2048, H 6144, 256 experts, FP8): what the shared expert costs when it runs as the
FMA row kernels' ninth pair, and which gate/up launch pays least for it.

    PYTHONPATH=. python bench/moe_one_row.py                          # 8 / 9 routed, shared fused / after
    GLMSERVE_PDL=0 PYTHONPATH=. python bench/moe_one_row.py --launches  # gate/up launches alone, 8 vs 9 pairs
    PYTHONPATH=. python bench/moe_one_row.py --step                     # the launch choice in the whole step
    PYTHONPATH=. python bench/moe_one_row.py --each [--width 256] [--no-shared] [--picks]  # per-step launches

µs a call (route + gate/up + down + combine) are device times of chained graph replays over 8 routings (and 8
shared experts), so the experts stream from HBM; per-kernel times come from the profiler (under PDL a kernel's
time includes its wait for the one before: run --launches with GLMSERVE_PDL=0). ``--step`` times the runner's
1-row decode step (CUDA-graph path + lm_head, the slice of bench/decode_slice.py at 4k) with session 10's gate/up
launch and the current one, alternating runs.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import torch

from bench.kernels_micro import rand_fp8
from bench.profile_slice import kernel_times
from bench.rows_gemm import DEV, graph_us
from glmkernels import reference, triton_moe
from glmkernels.triton_linear import linear
from glmkernels.triton_moe import ExpertTile, expert_tiles, fused_moe

H, E, I = 6144, 256, 2048
COPIES = 8
LAUNCHES = [(16, 256, 4), (8, 256, 2), (8, 512, 4), (32, 128, 4), (16, 128, 2), (4, 512, 2), (8, 128, 1),
            (16, 128, 4), (32, 64, 2)]         # gate/up: outputs × K per step, warps


def experts(width: int = I):
    """256 FP8 experts of 6144 × ``width`` with block scales: (gate, up, down, their scales), as fused_moe takes
    them."""
    (gate, gs), (up, us), (down, ds) = rand_fp8(E, width, H), rand_fp8(E, width, H), rand_fp8(E, H, width)
    return gate, up, down, gs, us, ds


def routings(k: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    return [torch.randperm(E, device=DEV)[:k][None] for _ in range(COPIES)], torch.rand(1, k, device=DEV)


def ninth_pair() -> None:
    w = experts()
    shared = [tuple(t[e + 1].clone() for t in w) for e in range(COPIES)]   # one per call: ≫ L2 in the graph
    x = torch.randn(1, H, device=DEV, dtype=torch.bfloat16)
    (idx8, w8), (idx9, w9) = routings(8), routings(9)
    t1 = expert_tiles(1, H, I)

    def moe(i, idx, wr, sh=None, tiles=t1):
        return fused_moe(x, idx[i], wr, *w, tiles=tiles, shared=sh)
    cases = {
        "8 routed": [lambda i=i: moe(i, idx8, w8) for i in range(COPIES)],
        "9 routed": [lambda i=i: moe(i, idx9, w9) for i in range(COPIES)],
        "8 routed + shared fused (9th pair)": [lambda i=i: moe(i, idx8, w8, shared[i]) for i in range(COPIES)],
        "8 routed, then shared (3 GEMVs)": [lambda i=i: moe(i, idx8, w8) + reference.swiglu(x, *shared[i], linear=linear)
                                            for i in range(COPIES)],
    }
    for name, calls in cases.items():
        t = graph_us(calls)                        # (its warm-up compiles before the profile)
        ks = kernel_times(lambda calls=calls: [c() for c in calls], 20)
        print(f"{name}: {t:.1f} µs  [" + ", ".join(f"{n[:40]} {v / COPIES:.1f}" for n, (v, _) in
                                                  sorted(ks.items(), key=lambda kv: -kv[1][0])) + "]", flush=True)


def launches() -> None:
    w = experts()
    x = torch.randn(1, H, device=DEV, dtype=torch.bfloat16)
    dn = expert_tiles(1, H, I)[1]
    cases = {k: routings(k) for k in (8, 9)}
    print("| gate/up launch | gate/up µs, 8 pairs | 9 pairs | 9 / 8 |\n|---|---:|---:|---:|")
    for bi, bh, wp in LAUNCHES:
        gu = ExpertTile(bi, bh, wp, 1, fma=True)
        t = []
        for idx, wr in cases.values():
            def run(idx=idx, wr=wr, gu=gu):
                return [fused_moe(x, idx[i], wr, *w, tiles=(gu, dn)) for i in range(COPIES)]
            run()                                  # compile outside the profile
            ks = kernel_times(run, 20)
            t.append(sum(v for n, (v, _) in ks.items() if n.startswith("_gate_up_row")) / COPIES)
        print(f"| {bi}x{bh} w{wp} | {t[0]:.1f} | {t[1]:.1f} | {t[1] / t[0]:.2f} |", flush=True)


def each(width: int, fused: bool, picks: bool = False) -> None:
    """The shipped one-row MoE (8 routed, with the shared expert fused as the 9th pair or not; experts ``width``
    wide) beside launches that reduce their products every K step (``ExpertTile.each``): gate/up variants with the
    shipped down, then down variants with the shipped gate/up (``picks``: the shipped launches alone)."""
    w = experts(width)
    shared = [tuple(t[e + 1].clone() for t in w) for e in range(COPIES)] if fused else [None] * COPIES
    x = torch.randn(1, H, device=DEV, dtype=torch.bfloat16)
    idx8, w8 = routings(8)
    gu0, dn0 = expert_tiles(1, H, width)
    cases = {f"shipped: gate/up {gu0.block_n}x{gu0.block_k} w{gu0.num_warps}{' each' * gu0.each}, down "
             f"{dn0.block_n}x{dn0.block_k} w{dn0.num_warps}{' each' * dn0.each}": (gu0, dn0)}
    gate_up = ((4, 512, 2), (4, 1024, 2), (8, 512, 4), (8, 1024, 4), (16, 512, 4), (4, 2048, 4), (2, 2048, 2))
    down = ((32, 256, 4), (16, 512, 4), (32, 512, 4), (8, 1024, 4), (16, 1024, 4), (64, 256, 8))
    if width <= 512:                           # a tp shard's experts: down's K is the width
        gate_up += ((8, 2048, 4), (16, 1024, 4))
        down = ((16, 256, 4), (32, 256, 4), (64, 256, 4), (64, 256, 8), (128, 256, 8), (8, 256, 2))
    if picks:
        gate_up, down = (), ()
    for bi, bh, wp in gate_up:
        cases[f"gate/up {bi}x{bh} w{wp} each"] = (ExpertTile(bi, bh, wp, 1, fma=True, each=True), dn0)
    for bo, bi, wp in down:
        cases[f"down {bo}x{bi} w{wp} each"] = (gu0, ExpertTile(bo, bi, wp, 1, fma=True, each=True))
    want = fused_moe(x, idx8[0], w8, *w, shared=shared[0])
    print(f"experts {H} x {width}, 8 routed{' + the shared expert fused' * fused}:", flush=True)
    for name, tiles in cases.items():
        got = fused_moe(x, idx8[0], w8, *w, tiles=tiles, shared=shared[0])
        assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2, name
        t = graph_us([lambda i=i, t=tiles: fused_moe(x, idx8[i], w8, *w, tiles=t, shared=shared[i])
                      for i in range(COPIES)])
        print(f"{name}: {t:.1f} µs", flush=True)


def step(reps: int) -> None:
    from bench.decode_slice import BF16, BLOCK, SLICE, bench_model, build_model
    from models.cache import KVCache
    from models.config import ModelConfig
    from models.glm5 import MoeShard

    current = triton_moe.expert_tiles

    def session10(rows: int, H: int, I: int):
        tiles = current(rows, H, I)
        return (ExpertTile(16, 256, 4, 1, fma=True), tiles[1]) if rows == 1 and I > 512 else tiles
    cfg = ModelConfig.from_dict(dict(SLICE))
    cache = KVCache(cfg, 8 * (4096 + BLOCK) + BLOCK, BF16, DEV)
    for t in cache.kv + [k for k in cache.index_k if k is not None]:
        t.normal_()
    model = build_model(cfg, MoeShard())
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(reps):
        for name, choice in (("session 10 (16x256 w4)", session10), ("current", current)):
            triton_moe.expert_tiles = choice
            res: list[dict] = []
            bench_model(model, cfg, cache, "full", [4096], [1], ["auto_graph"], 1.0, res)
            times[name].append(res[0]["auto_graph"])
    triton_moe.expert_tiles = current
    print("| gate/up launch at one row | runs (ms) | median |\n|---|---|---:|")
    for name, ts in times.items():
        print(f"| {name} | {', '.join(f'{t:.3f}' for t in ts)} | {statistics.median(ts):.3f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", action="store_true")
    ap.add_argument("--step", action="store_true")
    ap.add_argument("--each", action="store_true")
    ap.add_argument("--width", type=int, default=I, help="--each: the experts' width (256: a tp shard's of 8)")
    ap.add_argument("--no-shared", action="store_true", help="--each: 8 routed pairs, no shared expert fused")
    ap.add_argument("--picks", action="store_true", help="--each: the shipped launches only")
    ap.add_argument("--reps", type=int, default=4)
    args = ap.parse_args()
    if args.step:
        step(args.reps)
    elif args.each:
        each(args.width, not args.no_shared, args.picks)
    elif args.launches:
        launches()
    else:
        ninth_pair()
