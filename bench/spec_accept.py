"""Acceptance of sampled drafts: a seeded request (drafts drawn with plain decoding's noise, kept while they equal
the target's own draw — its tokens are plain decoding's) against an unseeded one (rejection sampling), in one run.

    python bench/spec_accept.py [--model models/tiny] [--out bench/results/spec_accept.md]

Single process (no Ray), one request at a time (drafts ride only for a solo request), the same prompts and
sampling settings for both; each request draws its own seed (seeded) or none (unseeded). Prints a markdown table
of the mean accepted length (tokens a verify round emits) and per-position acceptance, and writes it to --out.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from bench.engine_cpu import PROMPTS
from cluster.config import DEFAULT_MODEL, EngineConfig
from cluster.local import build_local_engine
from scheduler.request import SamplingParams

SETTINGS = [("T 0.6", dict(temperature=0.6)), ("T 1.0", dict(temperature=1.0)),
            ("T 1.0, top-p 0.9", dict(temperature=1.0, top_p=0.9))]


def accept(engine, tok, settings: dict, seeded: bool, repeats: int, max_tokens: int) -> dict:
    """Run every prompt ``repeats`` times alone; the engine's speculation counters over those runs."""
    s = engine.stats
    before = (s["draft_rounds"], s["drafts_proposed"], s["drafts_accepted"], list(engine.accepted_at))
    for r in range(repeats):
        for i, text in enumerate(PROMPTS):
            seed = 1000 * r + i if seeded else None
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=seed, **settings)
            engine.add_request(tok.encode(text), params, f"{seeded}-{r}-{i}")
            while engine.has_unfinished():
                engine.step()
    rounds = s["draft_rounds"] - before[0]
    accepted = s["drafts_accepted"] - before[2]
    by_pos = [(a - b) / rounds for a, b in zip(engine.accepted_at[:-1], before[3][:-1])]
    return {"rounds": rounds, "proposed": s["drafts_proposed"] - before[1], "accepted": accepted,
            "mean_len": (accepted + rounds) / rounds, "by_pos": by_pos}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--drafts", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=4, help="runs of each prompt (a fresh seed each)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--out", default="bench/results/spec_accept.md")
    a = ap.parse_args()
    torch.set_num_threads(2)
    engine, tok = build_local_engine(EngineConfig(model=a.model, device="cpu", speculative_tokens=a.drafts),
                                     progress=False)
    lines = [f"# Sampled drafts: seeded (shared noise, exact match) vs unseeded (rejection sampling)", "",
             f"`python bench/spec_accept.py --drafts {a.drafts} --repeats {a.repeats} --max-tokens {a.max_tokens}` "
             f"(model {os.path.relpath(a.model)}, CPU, {len(PROMPTS)} prompts × {a.repeats} runs alone, {a.drafts} MTP drafts a round)",
             "", "| sampling | requests | rounds | mean accepted length | acceptance by draft position |",
             "|---|---|---:|---:|---|"]
    t0 = time.perf_counter()
    for label, settings in SETTINGS:
        for seeded in (True, False):
            m = accept(engine, tok, settings, seeded, a.repeats, a.max_tokens)
            pos = " / ".join(f"{p:.2f}" for p in m["by_pos"])
            lines.append(f"| {label} | {'seeded' if seeded else 'unseeded'} | {m['rounds']} | {m['mean_len']:.2f} | {pos} |")
            print(lines[-1], f"({time.perf_counter() - t0:.0f} s)", flush=True)
    text = "\n".join(lines) + "\n"
    Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
