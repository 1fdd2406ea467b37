"""Session 64: where a drawn row's sampling spends the host's time on the GPU (``sample_on_device``, GLM's advice
T 1.0 / top-p 0.95, and top-k 50, on GLM's vocabulary at 1 and 8 rows): the wall per call with the GPU idle between
calls (CUDA events: host launches included), then torch.profiler's CPU-side ops by self time.

    PYTHONPATH=. python bench/results/session64/sampler_host.py
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

import workers.sampler as ws
from bench.decode_slice import time_ms
from scheduler.request import SamplingParams


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    for rows in (1, 8):
        logits = (torch.randn(rows, 154880, device="cuda", generator=gen) * 4).bfloat16().float()
        for name, p in (("T 1.0, top-p 0.95", SamplingParams(temperature=1.0, top_p=0.95)),
                        ("T 0.7, top-k 50", SamplingParams(temperature=0.7, top_k=50))):
            def call(p=p, logits=logits, rows=rows):
                return ws.sample_on_device(logits, [p] * rows, [3] * rows)
            print(f"{rows} rows, {name}: wall {time_ms(call, 100) * 1e3:.0f} µs")
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(20):
                    call()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=40))


if __name__ == "__main__":
    main()
