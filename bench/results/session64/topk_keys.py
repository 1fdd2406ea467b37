"""Session 64: the sampler's top-k keys in one Triton launch (``glmkernels/triton_sample.py``) beside the reference's
elementwise ops (session 61's), alone and inside ``_filtered_weights`` (temperature 0.7, top-k 50) on GLM's vocabulary
at 1 and 8 rows: CUDA events (host launches included) and the kernels' sum (torch.profiler), side by side in one run.

    PYTHONPATH=. python bench/results/session64/topk_keys.py
"""

from __future__ import annotations

import torch

import workers.sampler as ws
from bench.decode_slice import time_ms
from bench.profile_slice import kernel_times
from glmkernels import ops
from scheduler.request import SamplingParams


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    params = SamplingParams(temperature=0.7, top_k=50)
    for rows in (1, 8):
        logits = (torch.randn(rows, 154880, device="cuda", generator=gen) * 4).bfloat16().float()   # ties, as bf16
        picks = {}
        for backend in ("reference", "triton"):
            ops.configure("auto", "cuda", {"value_id_keys": backend})
            for label, call in (("keys", lambda: ops.value_id_keys(logits)),
                                ("filtered weights", lambda: ws._filtered_weights(logits, [params] * rows))):
                wall = time_ms(call, 200) * 1e3
                kernels = kernel_times(call, 10)
                print(f"{rows} rows, {label}, {backend}: wall {wall:.0f} µs, kernels "
                      f"{sum(us for us, _ in kernels.values()):.0f} µs in {sum(n for _, n in kernels.values()):.0f}")
            picks[backend] = ws._filtered_weights(logits, [params] * rows)
        same = all(torch.equal(a, b) for a, b in zip(picks["reference"], picks["triton"]))
        print(f"    {rows} rows: the same weights and order: {same}")


if __name__ == "__main__":
    main()
