"""Engine throughput on CPU: tokens/s vs concurrency, and speculative decoding vs plain, in one run.

    python bench/engine_cpu.py [--model models/tiny] [--out bench/results/engine_cpu.md]

Single process (no Ray): the engine core as the coordinator drives it. Greedy, ignore_eos, prompts cut
from held-out-like text. Prints a markdown table and writes it to --out.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from cluster.config import DEFAULT_MODEL, EngineConfig
from cluster.local import build_local_engine
from scheduler.request import SamplingParams

PROMPTS = [
    "The old man said that", "In the beginning God created", "A computer is a machine that",
    "When the ship came into the harbour", "Python is a programming language", "He went out into the night",
    "The king sent his servants to", "To be or not to be", "It was the best of times",
    "Once upon a time there lived", "The function returns a list of", "She looked at the sky and",
    "All happy families are alike", "Call me Ishmael. Some years ago", "The quick brown fox", "And it came to pass",
]


def run(engine, tok, n: int, max_tokens: int, k_label: str) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    first: dict[str, float] = {}
    done = 0
    for i in range(n):
        engine.add_request(tok.encode(PROMPTS[i % len(PROMPTS)]), params, f"{k_label}-{n}-{i}")
    generated = 0
    while done < n:
        for ev in engine.step():
            if ev.token_ids and ev.req_id not in first:
                first[ev.req_id] = time.perf_counter() - t0
            generated += len(ev.token_ids)
            done += ev.finished
    dt = time.perf_counter() - t0
    return {"concurrency": n, "tokens": generated, "seconds": dt, "tok_s": generated / dt,
            "ttft_ms": 1000 * sum(first.values()) / len(first)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--spec", default="1,2,3", help="MTP drafts per round (comma list) for the speculative rows")
    ap.add_argument("--out", default="bench/results/engine_cpu.md")
    a = ap.parse_args()
    torch.set_num_threads(2)
    # the prompts repeat: without prefix caching each one's prefill is measured (bench/prefix_cache.py measures reuse)
    plain, tok = build_local_engine(EngineConfig(model=a.model, device="cpu", kv_cache_tokens=65536,
                                                 prefix_caching=False), progress=False)
    run(plain, tok, 1, 8, "warmup")
    rows = [run(plain, tok, n, a.max_tokens, "plain") for n in (1, 4, 16)]
    solo_plain = [run(plain, tok, 1, a.max_tokens, f"p{i}") for i in range(4)]
    tp = sum(r["tok_s"] for r in solo_plain) / 4
    spec_rows = []
    for k in [int(x) for x in a.spec.split(",")]:
        spec, _ = build_local_engine(EngineConfig(model=a.model, device="cpu", kv_cache_tokens=65536,
                                                  speculative_tokens=k, prefix_caching=False), progress=False)
        ts = sum(run(spec, tok, 1, a.max_tokens, f"s{k}-{i}")["tok_s"] for i in range(4)) / 4
        spec_rows.append((k, ts, spec.spec_metrics()))
    lines = ["| concurrency | tokens | seconds | tokens/s | mean TTFT (ms) |", "|---|---|---|---|---|"]
    lines += [f"| {r['concurrency']} | {r['tokens']} | {r['seconds']:.2f} | {r['tok_s']:.1f} | {r['ttft_ms']:.0f} |"
              for r in rows]
    lines += ["", "Speculative decoding (solo request, greedy, the same 4 prompts, same run):", "",
              "| mode | tokens/s (mean of 4 prompts) | vs plain | mean accepted length | acceptance by position |",
              "|---|---|---|---|---|",
              f"| plain | {tp:.1f} | 1.00x | 1.00 | – |"]
    lines += [f"| MTP k={k} | {ts:.1f} | {ts / tp:.2f}x | {m['mean_accepted_length']:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in m['acceptance_by_position'])} |" for k, ts, m in spec_rows]
    lines += ["", f"model {a.model}; {a.max_tokens} new tokens per request; torch threads 2; "
              f"{time.strftime('%Y-%m-%d %H:%M')}"]
    text = "\n".join(lines)
    print(text)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("# Engine on CPU (tiny model)\n\n`python bench/engine_cpu.py`\n\n" + text + "\n")


if __name__ == "__main__":
    main()
