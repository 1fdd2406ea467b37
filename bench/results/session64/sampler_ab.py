"""Session 64: a drawn row's sampling before (session 63's ``_choose`` / ``_filtered_weights``, restated below) and
after this session's cuts (no greedy argmax, pick of rows or scatter back when every row draws; no division at T 1;
top-p and min-p as a scalar when every row has the same) on the reference ops, and with the Triton ops (``auto``: top-p
without a sort, ``glmkernels/triton_sample.py``) — CUDA events (host launches included, the GPU idle between calls) and
the kernels' sum (torch.profiler) side by side in one run, with the tokens compared (seeded rows: the reference's
tokens equal session 63's; the sort-free top-p's may differ where a token's mass above is within rounding of the cut).

    PYTHONPATH=. python bench/results/session64/sampler_ab.py
"""

from __future__ import annotations

import torch

import workers.sampler as ws
from bench.decode_slice import time_ms
from bench.profile_slice import kernel_times
from glmkernels.reference import cumsum_rows
from scheduler.request import SamplingParams


def _column(values, device):
    return ws.to_device(values, torch.float32, device)[:, None]


def _filtered_weights_63(logits, params):
    device, vocab_size = logits.device, logits.shape[1]
    scaled = logits / _column([p.temperature for p in params], device)
    order = None
    if not any(p.top_k != 0 or p.top_p < 1.0 for p in params):
        weights = torch.exp(scaled - scaled.amax(dim=-1, keepdim=True))
    else:
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        if max(top_k) <= ws.TOPK_SELECT:
            order = ws.ops.value_id_keys(scaled).topk(max(top_k), dim=-1).indices
            top = scaled.gather(1, order)
        else:
            top, order = scaled.sort(dim=-1, descending=True, stable=True)
        weights = torch.exp(top - top[:, :1])
        if min(top_k) < top.shape[1]:
            rank = torch.arange(top.shape[1], device=device)
            weights = weights.masked_fill(rank >= ws.to_device(top_k, torch.long, device)[:, None], 0.0)
        if any(p.top_p < 1.0 for p in params):
            top_p = _column([p.top_p if p.top_p < 1.0 else float("inf") for p in params], device)
            above = cumsum_rows(weights) - weights
            weights = weights.masked_fill(above >= top_p * weights.sum(dim=-1, keepdim=True), 0.0)
    if any(p.min_p > 0.0 for p in params):
        weights = weights.masked_fill(weights < _column([p.min_p for p in params], device), 0.0)
    return weights, order


def choose_63(processed, params, num_generated):
    token_ids = processed.argmax(dim=-1)
    sampled_rows = [i for i, p in enumerate(params) if not p.is_greedy]
    if sampled_rows:
        rows = ws.to_device(sampled_rows, torch.long, processed.device)
        weights, order = _filtered_weights_63(processed[rows], [params[i] for i in sampled_rows])
        noise = ws._exponential_noise(processed.shape[1], processed.device, params, num_generated, sampled_rows)
        if order is None:
            token_ids[rows] = (weights / noise).argmax(dim=-1)
        else:
            pick = (weights / noise.gather(1, order)).argmax(dim=-1, keepdim=True)
            token_ids[rows] = order.gather(1, pick).squeeze(1)
    return token_ids


SETTINGS = {"T 1.0, top-p 0.95 (GLM's advice)": SamplingParams(temperature=1.0, top_p=0.95, seed=1),
            "T 0.7, top-p 0.95": SamplingParams(temperature=0.7, top_p=0.95, seed=1),
            "T 0.7, top-k 50": SamplingParams(temperature=0.7, top_k=50, seed=1),
            "T 1.0, min-p 0.05": SamplingParams(temperature=1.0, min_p=0.05, seed=1),
            "T 1.0": SamplingParams(temperature=1.0, seed=1)}


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    for rows in (1, 8):
        logits = (torch.randn(rows, 154880, device="cuda", generator=gen) * 4).bfloat16().float()
        for name, p in SETTINGS.items():
            params, ng = [p] * rows, list(range(rows))
            out = {}
            for label, fn, kernels in (("session 63", choose_63, "reference"), ("session 64", ws._choose, "reference"),
                                       ("session 64 auto", ws._choose, "auto")):
                ws.ops.configure(kernels, "cuda")

                def call(fn=fn, params=params, ng=ng):
                    return fn(logits, params, ng)
                wall = time_ms(call, 100) * 1e3
                kernels = kernel_times(call, 10)
                out[label] = call()
                print(f"{rows} rows, {name}, {label}: wall {wall:.0f} µs, kernels "
                      f"{sum(us for us, _ in kernels.values()):.0f} µs in {sum(n for _, n in kernels.values()):.0f}")
            print(f"    the same tokens: {torch.equal(out['session 63'], out['session 64'])}, with the Triton ops: "
                  f"{torch.equal(out['session 63'], out['session 64 auto'])}")


if __name__ == "__main__":
    main()
