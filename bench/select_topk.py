"""The paged indexer's top-k select on the GPU: the wide select (``wide_select``: three radix passes, a count and
a scatter over many programs a row) per (keys a program, warps), beside ``torch.topk`` + the slot gather, at the
graph widths of 4k-, 16k-, 32k- and 200k-token steps (5120, 16384, 40960, 204800 keys), top 2048, 1 and 8 rows;
then the whole paged indexer (scoring + select, 32 heads × 128, bf16 keys; the select's first pass runs inside
the scoring launch). Every config is checked against torch.topk's set first; times are CUDA-graph replays
(median).

    PYTHONPATH=. python bench/select_topk.py [--out bench/results]
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch

from bench.decode_slice import graph_ms
from glmkernels.triton_attention import SELECT_BLOCK, _score, indexer_topk_paged, wide_select

DEV, BS, TOPK = "cuda", 64, 2048
WIDTHS = (5120, 16384, 40960, 204800)
CONFIGS = [(block, warps) for block in (1024, 2048, 4096) for warps in (4, 8)]


def torch_topk(score: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    val, idx = score.topk(TOPK, dim=-1, sorted=False)
    slot = table.gather(1, idx // BS).long() * BS + idx % BS
    return torch.where(torch.isfinite(val), slot, -1)


def same_sets(got: torch.Tensor, want: torch.Tensor) -> bool:
    return all(set(got[n].tolist()) == set(want[n].tolist()) for n in range(len(want)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device=DEV).manual_seed(0)
    lines = [f"# Indexer top-{TOPK} select ({torch.cuda.get_device_name()})", "",
             f"µs per call (CUDA-graph replay, median); `pick`: the launcher's {SELECT_BLOCK} keys a program, 4 warps.",
             "", "| keys | rows | torch.topk + gather | wide select (pick) | wide best (keys, warps) |",
             "|---:|---:|---:|---:|---|"]
    for W, N in itertools.product(WIDTHS, (1, 8)):
        score = torch.randn(N, W, device=DEV, generator=g)
        score[:, W - 1000:] = float("-inf")                     # the unfilled tail of the last blocks
        table = torch.stack([torch.randperm(W // BS * 2, device=DEV, generator=g)[: W // BS] for _ in range(N)]).int()
        want = torch_topk(score, table)
        times = {}
        for block, warps in CONFIGS:                            # all its launches (the first pass too)
            assert same_sets(wide_select(score, table, BS, TOPK, block, warps), want), (W, N, block, warps)
            times[block, warps] = graph_ms(lambda s=score, t=table, b=block, w=warps: wide_select(s, t, BS, TOPK, b, w),
                                           50) * 1e3
        ref = graph_ms(lambda s=score, t=table: torch_topk(s, t), 50) * 1e3
        best = min(times, key=times.get)
        lines.append(f"| {W} | {N} | {ref:.1f} | {times[SELECT_BLOCK, 4]:.1f} | {times[best]:.1f} {best} |")
        print(lines[-1], flush=True)

    lines += ["", "The whole paged indexer (scoring + select), µs per call (CUDA-graph replay, median):", "",
              "| keys | rows | scoring + wide select |", "|---:|---:|---:|"]
    ih, idd = 32, 128
    for W, N in itertools.product(WIDTHS, (1, 8)):
        k_cache = torch.randn(W * 2, idd, device=DEV, generator=g).to(torch.bfloat16)
        table = torch.stack([torch.randperm(W // BS * 2, device=DEV, generator=g)[: W // BS] for _ in range(N)]).int()
        q = torch.randn(N, ih, idd, device=DEV, generator=g).to(torch.bfloat16)
        w = torch.randn(N, ih, device=DEV, generator=g)
        positions = torch.full((N,), W - 1000, device=DEV)
        args = (q, w, k_cache, table, BS, positions, TOPK, idd ** -0.5)
        score = _score(q, w, k_cache, table, None, None, positions, W, BS, idd ** -0.5)
        assert same_sets(indexer_topk_paged(*args), torch_topk(score, table)), (W, N)
        lines.append(f"| {W} | {N} | {graph_ms(lambda a=args: indexer_topk_paged(*a), 50) * 1e3:.1f} |")
        print(lines[-1], flush=True)
    (out / "select_topk.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
