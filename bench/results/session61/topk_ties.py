"""Session 61: the top-k selection's cost with ties broken by id (``workers/sampler.py``'s ``_by_value_then_id``: an
int64 key, one topk) beside session 60's (a float topk, then a re-sort by id and a stable sort by value, whose picks
among tied values at the selection's end depended on the batch) — ``_filtered_weights`` on GLM's vocabulary, 1 and 8
rows, CUDA events (host launches included) and the kernels' sum (torch.profiler), side by side in one run.

    PYTHONPATH=. python bench/results/session61/topk_ties.py
"""

from __future__ import annotations

import torch

import workers.sampler as ws
from bench.decode_slice import time_ms
from bench.profile_slice import kernel_times
from glmkernels import ops
from scheduler.request import SamplingParams


def session60_select(scaled: torch.Tensor, k: int, cut: bool):
    top, order = scaled.topk(k, dim=-1)
    if cut:
        order, by_id = order.sort(dim=-1)
        top, by_value = top.gather(1, by_id).sort(dim=-1, descending=True, stable=True)
        order = order.gather(1, by_value)
    return top, order


def session61_select(scaled: torch.Tensor, k: int, cut: bool):
    order = ops.impl("value_id_keys", "reference")(scaled).topk(k, dim=-1).indices   # (session 64: an op)
    return scaled.gather(1, order), order


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    for rows in (1, 8):
        logits = (torch.randn(rows, 154880, device="cuda", generator=gen) * 4).bfloat16().float()   # ties, as bf16
        for name, params, k in (("top-k 50", SamplingParams(temperature=0.7, top_k=50), 50),
                                ("top-p 0.95", SamplingParams(temperature=1.0, top_p=0.95), 154880)):
            if k > ws.TOPK_SELECT:
                print(f"{rows} rows, {name}: the full stable sort in both (no selection)")
                continue
            scaled = logits / params.temperature
            for label, fn in (("session 60", session60_select), ("session 61", session61_select)):
                def call(fn=fn, scaled=scaled, k=k):
                    return fn(scaled, k, True)
                wall = time_ms(call, 100) * 1e3
                kernels = kernel_times(call, 10)
                print(f"{rows} rows, {name}, {label}: wall {wall:.0f} µs, kernels "
                      f"{sum(us for us, _ in kernels.values()):.0f} µs in {sum(n for _, n in kernels.values()):.0f}")
            a, b = session60_select(scaled, k, True), session61_select(scaled, k, True)
            print(f"    same values: {torch.equal(a[0], b[0])}, same ids: {torch.equal(a[1], b[1])}")


if __name__ == "__main__":
    main()
