"""What drawing a token costs on the GPU at GLM-5's vocabulary (154880): ``sample_on_device`` on fp32 logits of 1 and
8 rows for greedy rows and the common drawn settings (and with penalties, their token counts of a 4096-token history
stacked from the device), each as the wall time of one call (CUDA events around it: the
host's launches included) and the sum of its kernels (torch.profiler) — with look-ahead the host part hides behind
the next step, the kernels do not. The largest kernels of each setting are listed. ``--kernels auto`` (the default,
as the engine on a GPU): the sampler's ops' Triton forms (top-k and top-p without a topk or sort); ``reference``:
PyTorch.

``--probs``: ``probs_for_rows`` instead — the distributions a drawn request's speculative decoding weighs drafts by.

    PYTHONPATH=. python bench/sampler.py [--out DIR] [--kernels reference] [--probs]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.decode_slice import time_ms
from bench.profile_slice import kernel_times
from glmkernels import ops
from scheduler.request import SamplingParams
from workers.sampler import TokenCounts, has_penalties, probs_for_rows, sample_on_device

VOCAB = 154880
SETTINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "T 1.0": SamplingParams(temperature=1.0),
    "T 1.0, top-p 0.95 (GLM's advice)": SamplingParams(temperature=1.0, top_p=0.95),
    "T 0.7, top-p 0.95, seed": SamplingParams(temperature=0.7, top_p=0.95, seed=1),
    "T 0.7, top-k 50": SamplingParams(temperature=0.7, top_k=50),
    "T 0.6, top-k 20, top-p 0.95": SamplingParams(temperature=0.6, top_k=20, top_p=0.95),
    "T 1.0, min-p 0.05": SamplingParams(temperature=1.0, min_p=0.05),
    "T 1.0, top-p 0.95, presence 0.5, frequency 0.3": SamplingParams(temperature=1.0, top_p=0.95,
                                                                     presence_penalty=0.5, frequency_penalty=0.3),
    "greedy, repetition 1.1": SamplingParams(temperature=0.0, repetition_penalty=1.1),
}
HISTORY = 4096       # a penalized row's history: its token counts (``TokenCounts``, on the device) are stacked per call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--out", default=None)
    ap.add_argument("--kernels", default="auto", choices=["auto", "reference"])
    ap.add_argument("--probs", action="store_true",
                    help="time probs_for_rows (speculative decoding's distributions of drawn rows) instead")
    args = ap.parse_args()
    ops.configure(args.kernels, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for rows in args.rows:
        logits = torch.randn(rows, VOCAB, device="cuda", generator=gen) * 4      # a peaked-enough distribution
        history = torch.randint(0, VOCAB, (HISTORY,), generator=torch.Generator().manual_seed(1)).tolist()
        counts = [TokenCounts(HISTORY // 2, VOCAB, logits.device) for _ in range(rows)]
        for c in counts:
            c.of(history)
        for name, params in SETTINGS.items():
            def call(params=params, logits=logits, rows=rows, counts=counts, history=history):
                penalized = torch.stack([c.of(history) for c in counts]) if has_penalties(params) else None
                if args.probs:
                    return probs_for_rows(logits, [params] * rows, penalized, list(range(rows)))
                return sample_on_device(logits, [params] * rows, list(range(rows)), penalized)
            wall = time_ms(call, args.iters)
            kernels = kernel_times(call, 10)
            total = sum(us for us, _ in kernels.values())
            launches = sum(n for _, n in kernels.values())
            results.append({"rows": rows, "setting": name, "wall_ms": wall, "kernel_us": total, "launches": launches})
            print(f"{rows} rows, {name}: wall {wall * 1e3:.0f} µs, kernels {total:.0f} µs in {launches:.0f} launches")
            for kname, (us, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:args.top]:
                print(f"    {us:7.1f} µs {int(n):3d}×  {kname[:100]}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "sampler.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
