"""What structured output costs: the engine with and without ``json_schema`` rows (the embedded model, one process, CPU),
and the grammar's own host work at the embedded vocabulary and at GLM-5's (154,880 tokens: the embedded one padded
with synthetic byte-level tokens) — the schema's compile, and a step's mask and accept per row.

    python bench/guided_cpu.py [--rows 1 8] [--max-tokens 64] [--out bench/results/guided_cpu.md]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

from cluster.config import EngineConfig
from cluster.guided import Guides
from cluster.local import build_local_engine
from scheduler.request import SamplingParams

SCHEMA = json.dumps({"type": "object", "required": ["name", "age", "notes"],
                     "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                    "notes": {"type": "array", "items": {"type": "string"}}}})
TOPICS = ["A person as JSON.", "Someone old.", "Name a sailor.", "A king and his age.", "The old man.",
          "A child in the village.", "The captain.", "A farmer."]


def engine_rate(engine, tok, rows: int, max_tokens: int, schema: str | None) -> tuple[float, float, float]:
    """(ms a decode step, generated tokens/s, mean tokens a request) for ``rows`` requests at once, greedy; a step's
    time is the mean over the steps where every row decodes (requests end at different lengths)."""
    for i in range(rows):
        ids = tok.encode_chat([{"role": "user", "content": TOPICS[i % len(TOPICS)]}], enable_thinking=False)
        engine.add_request(ids, SamplingParams(max_tokens=max_tokens, temperature=0.0, json_schema=schema,
                                               ignore_eos=schema is None), f"r{i}")
    n, full, t0 = 0, [], time.perf_counter()
    while engine.has_unfinished():
        s0 = time.perf_counter()
        events = engine.step()
        if len(events) == rows and all(len(ev.token_ids) == 1 for ev in events):
            full.append(time.perf_counter() - s0)
        n += sum(len(ev.token_ids) for ev in events)
    return sum(full) / max(len(full), 1) * 1e3, n / (time.perf_counter() - t0), n / rows


class _PaddedTokenizer:
    """The embedded tokenizer's vocabulary padded with synthetic byte-level tokens to ``size`` (only what ``Guides``
    reads: the vocabulary, its special ids and markers, byte-level)."""

    def __init__(self, tok, size: int):
        self.special_ids, self.byte_level = tok.special_ids, True
        self._marks, vocab = tok.special_ids_by_token(), dict(tok.vocab())
        rng, alphabet = random.Random(0), "abcdefghijklmnopqrstuvwxyzĠ{}[]\":,0123456789"
        while len(vocab) < size:
            vocab.setdefault("".join(rng.choices(alphabet, k=rng.randint(2, 9))), len(vocab))
        self._vocab = vocab

    def vocab(self):
        return self._vocab

    def special_ids_by_token(self):
        return self._marks


def grammar_costs(tok, vocab_size: int, stop_ids, ids: list[int]) -> dict:
    """ms for the schema's compile (a first request), and µs per token of ``ids``: a mask (``Guide.mask``), an accept."""
    t0 = time.perf_counter()
    guide = Guides(tok, vocab_size, stop_ids).guide(SCHEMA, [])
    compile_ms = (time.perf_counter() - t0) * 1e3
    mask_s = accept_s = 0.0
    for t in ids:
        t0 = time.perf_counter()
        guide.mask()
        t1 = time.perf_counter()
        guide.accept([t])
        mask_s, accept_s = mask_s + t1 - t0, accept_s + time.perf_counter() - t1
    return {"compile_ms": compile_ms, "mask_us": mask_s / len(ids) * 1e6, "accept_us": accept_s / len(ids) * 1e6,
            "rejected": guide.rejected}


def batch_costs(tok, vocab_size: int, stop_ids, prefixes: list[list[int]], reps: int = 20) -> tuple[float, float]:
    """µs for a step's masks of len(prefixes) rows (each guide fed its prefix): one at a time (``Guide.mask``, what
    the engine does), and together on xgrammar's ``BatchGrammarMatcher`` (its threads: half the host's cores)."""
    import xgrammar as xgr

    rows = [Guides(tok, vocab_size, stop_ids).guide(SCHEMA, []) for _ in prefixes]
    for g, ids in zip(rows, prefixes):
        g.accept(ids)
    batch, words = xgr.BatchGrammarMatcher(), xgr.allocate_token_bitmask(len(rows), vocab_size)
    batch.batch_fill_next_token_bitmask([g.matcher for g in rows], words)       # its thread pool, started
    t0 = time.perf_counter()
    for _ in range(reps):
        [g.mask() for g in rows]
    t1 = time.perf_counter()
    for _ in range(reps):
        batch.batch_fill_next_token_bitmask([g.matcher for g in rows], words)
    return (t1 - t0) / reps * 1e6, (time.perf_counter() - t1) / reps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default="bench/results/guided_cpu.md")
    ap.add_argument("--grammar-only", action="store_true", help="only the grammar's host work (no engine steps)")
    args = ap.parse_args()
    engine, tok = build_local_engine(EngineConfig(device="cpu", kv_cache_tokens=8192, warmup_tokens=0),
                                     progress=False)
    lines = ["# Structured output's cost (CPU, the embedded model, one process)", "",
             f"`python bench/guided_cpu.py --rows {' '.join(map(str, args.rows))} --max-tokens {args.max_tokens}`; "
             "greedy, requests at once; guided = the schema below, free = none and ignore_eos (same prompts). A "
             "step's ms: the mean over the steps where every row decodes.", "",
             f"Schema: `{SCHEMA}`", "",
             "| rows | free: ms a step | guided: ms a step | guided / free | free tok/s | guided tok/s | tokens a "
             "request (free / guided) |", "|---:|---:|---:|---:|---:|---:|---|"]
    for rows in [] if args.grammar_only else args.rows:
        engine_rate(engine, tok, rows, 8, None)                                  # warm: kernels, the compiler
        engine_rate(engine, tok, rows, 8, SCHEMA)
        free = engine_rate(engine, tok, rows, args.max_tokens, None)
        guided = engine_rate(engine, tok, rows, args.max_tokens, SCHEMA)
        lines.append(f"| {rows} | {free[0]:.2f} | {guided[0]:.2f} | {guided[0] / free[0]:.2f} | {free[1]:.1f} | "
                     f"{guided[1]:.1f} | {free[2]:.1f} / {guided[2]:.1f} |")
    text = '{"name": "The old sailor", "age": 61, "notes": ["came home", "sat by the fire", "and slept"]}'
    lines += ["", "The grammar's host work per guided row (the engine's thread), feeding a 30-odd-token value:", "",
              "| vocabulary | schema compile (first request) ms | mask µs a token | accept µs a token |",
              "|---|---:|---:|---:|"]
    ids = tok.encode(text)                                                       # valid in both vocabularies
    for name, vocab, size in (("embedded (6,144)", tok, engine.config.vocab_size),
                              ("GLM-5 size (154,880; synthetic tokens past the embedded)",
                               _PaddedTokenizer(tok, 154_880), 154_880)):
        c = grammar_costs(vocab, size, engine.config.eos_token_ids, ids)
        assert c["rejected"] == 0, c
        lines.append(f"| {name} | {c['compile_ms']:.1f} | {c['mask_us']:.1f} | {c['accept_us']:.1f} |")
    prefixes = [ids[:n] for n in (1, 4, 9, 14, 20, 26, 31, 3)]               # 8 rows at 8 points of the value
    lines += ["", f"A step's masks of 8 guided rows, µs ({os.cpu_count()} cores here; xgrammar's threads: half):", "",
              "| vocabulary | one at a time (the engine) | together (xgrammar's `BatchGrammarMatcher`) |",
              "|---|---:|---:|"]
    for name, vocab, size in (("embedded (6,144)", tok, engine.config.vocab_size),
                              ("GLM-5 size (154,880, synthetic)", _PaddedTokenizer(tok, 154_880), 154_880)):
        serial, together = batch_costs(vocab, size, engine.config.eos_token_ids, prefixes)
        lines.append(f"| {name} | {serial:.0f} | {together:.0f} |")
    out = "\n".join(lines) + "\n"
    Path(args.out).write_text(out)
    print(out)


if __name__ == "__main__":
    main()
