"""The paged indexer's top-k select on the GPU: the one-program select (``_select_topk_kernel``, widths up to
SELECT_MAX_WIDTH) per warp count, beside ``torch.topk`` + the slot gather it replaces, at the graph widths
of 4k- and 16k-token steps (5120, 16384 keys) and, torch.topk alone, of a 32k step (40960), top 2048, 1 and
8 rows. Every config is checked against torch.topk's set first; times are CUDA-graph replays (median).

    PYTHONPATH=. python bench/select_topk.py [--baseline FILE] [--out bench/results]

``--baseline FILE``: also time FILE's ``_select_topk_kernel`` (an earlier kernels/triton_attention.py, e.g.
from ``git show REV:kernels/triton_attention.py``; launched without the PDL argument it may lack).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
from pathlib import Path

import torch

from bench.decode_slice import graph_ms
from kernels.triton_attention import SELECT_MAX_WIDTH, _select_topk_kernel
from kernels.triton_utils import next_pow2

DEV, BS, TOPK = "cuda", 64, 2048
WIDTHS = (5120, 16384, 40960)


def select(score: torch.Tensor, table: torch.Tensor, warps: int, kernel=None) -> torch.Tensor:
    N, W = score.shape
    out = torch.empty(N, TOPK, dtype=torch.int64, device=DEV)
    extra = {} if kernel else {"PDL": False}
    (kernel or _select_topk_kernel)[(N,)](score, table, out, W, TOPK, table.stride(0), BS=BS, BLOCK_W=next_pow2(W),
                                          num_warps=warps, **extra)
    return out


def torch_topk(score: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    val, idx = score.topk(TOPK, dim=-1, sorted=False)
    slot = table.gather(1, idx // BS).long() * BS + idx % BS
    return torch.where(torch.isfinite(val), slot, -1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--baseline", default=None)
    args = ap.parse_args()
    out = Path(args.out)
    base = None
    if args.baseline:
        spec = importlib.util.spec_from_file_location("baseline_attention", args.baseline)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        base = mod._select_topk_kernel
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device=DEV).manual_seed(0)
    lines = [f"# Indexer top-{TOPK} select ({torch.cuda.get_device_name()})", "",
             "µs per launch (CUDA-graph replay, median); `pick` is the launcher's warp count.", "",
             "| keys | rows | torch.topk + gather | select (pick) | select best (warps) | baseline (pick) |",
             "|---:|---:|---:|---:|---|---:|"]
    for W, N in itertools.product(WIDTHS, (1, 8)):
        score = torch.randn(N, W, device=DEV, generator=g)
        score[:, W - 1000:] = float("-inf")                     # the unfilled tail of the last blocks
        table = torch.stack([torch.randperm(W // BS * 2, device=DEV, generator=g)[: W // BS] for _ in range(N)]).int()
        want = torch_topk(score, table)
        times = {}
        for warps in (4, 8, 16, 32) if W <= SELECT_MAX_WIDTH else ():
            got = select(score, table, warps)
            assert all(set(got[n].tolist()) == set(want[n].tolist()) for n in range(N)), (W, N, warps)
            times[warps] = graph_ms(lambda s=score, t=table, w=warps: select(s, t, w), 50) * 1e3
        ref = graph_ms(lambda s=score, t=table: torch_topk(s, t), 50) * 1e3
        if times:
            best = min(times, key=times.get)
            warps = max(4, min(16, next_pow2(W) // 1024))
            old = "—"
            if base is not None:
                assert all(set(select(score, table, warps, base)[n].tolist()) == set(want[n].tolist()) for n in range(N))
                old = f"{graph_ms(lambda s=score, t=table, w=warps: select(s, t, w, base), 50) * 1e3:.1f}"
            lines.append(f"| {W} | {N} | {ref:.1f} | {times[warps]:.1f} | {times[best]:.1f} ({best}) | {old} |")
        else:
            lines.append(f"| {W} | {N} | {ref:.1f} | — | — | — |")
        print(lines[-1], flush=True)
    (out / "select_topk.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
