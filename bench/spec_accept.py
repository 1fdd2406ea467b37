"""Acceptance of sampled drafts: a seeded request (drafts drawn with plain decoding's noise, kept while they equal
the target's own draw — its tokens are plain decoding's) against an unseeded one (rejection sampling), in one run.

    python bench/spec_accept.py [--model models/tiny] [--out bench/results/spec_accept.md]

Single process (no Ray), one request at a time (drafts ride only for a solo request), the same prompts and
sampling settings for both; each request draws its own seed (seeded) or none (unseeded). Prints a markdown table
of the mean accepted length (tokens a verify round emits) and per-position acceptance, and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
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
SCHEMA = json.dumps({"type": "object", "required": ["name", "age", "notes"],
                     "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                    "notes": {"type": "array", "items": {"type": "string"}}}})


def accept(engine, tok, settings: dict, seeded: bool, repeats: int, max_tokens: int, guided: bool = False) -> dict:
    """Run every prompt ``repeats`` times alone; the engine's speculation counters over those runs. ``guided``: a chat
    prompt asking for JSON, held to ``SCHEMA`` (each verify row masked along its drafts)."""
    s = engine.stats
    before = (s["draft_rounds"], s["drafts_proposed"], s["drafts_accepted"], list(engine.accepted_at))
    for r in range(repeats):
        for i, text in enumerate(PROMPTS):
            seed = 1000 * r + i if seeded else None
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=not guided, seed=seed,
                                    json_schema=SCHEMA if guided else None, **settings)
            ids = tok.encode_chat([{"role": "user", "content": f"{text} As JSON."}], enable_thinking=False) \
                if guided else tok.encode(text)
            engine.add_request(ids, params, f"{seeded}-{r}-{i}")
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
    lines = ["# Sampled drafts: seeded (shared noise, exact match) vs unseeded (rejection sampling); guided drafts", "",
             f"`python bench/spec_accept.py --drafts {a.drafts} --repeats {a.repeats} --max-tokens {a.max_tokens}` "
             f"(model {os.path.relpath(a.model)}, CPU, {len(PROMPTS)} prompts × {a.repeats} runs alone, {a.drafts} MTP drafts a round)",
             "The last two rows: greedy on chat prompts asking for JSON, free (`ignore_eos`) and held to a schema (verify rows "
             "masked along the drafts; the MTP head drafts unmasked).", "",
             "| sampling | requests | rounds | mean accepted length | acceptance by draft position |",
             "|---|---|---:|---:|---|"]
    t0 = time.perf_counter()
    runs = [(label, settings, seeded, False) for label, settings in SETTINGS for seeded in (True, False)]
    runs += [("T 0, chat prompt", dict(temperature=0.0), False, guided) for guided in (False, True)]
    for label, settings, seeded, guided in runs:
        m = accept(engine, tok, settings, seeded, a.repeats, a.max_tokens, guided)
        pos = " / ".join(f"{p:.2f}" for p in m["by_pos"])
        kind = "greedy, held to a JSON schema" if guided else "greedy" if not settings["temperature"] else \
            "seeded" if seeded else "unseeded"
        lines.append(f"| {label} | {kind} | {m['rounds']} | {m['mean_len']:.2f} | {pos} |")
        print(lines[-1], f"({time.perf_counter() - t0:.0f} s)", flush=True)
    text = "\n".join(lines) + "\n"
    Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
