"""What structured output costs: the engine with and without ``json_schema`` rows (the embedded model, one process, CPU),
and the grammar's own host work at the embedded vocabulary and at GLM-5's size (154,880 tokens: a BPE trained here on
Python sources, ``code_vocabulary``, and the embedded one padded with random byte-level tokens — GLM's own cannot be
fetched) — the schema's compile, and a step's mask and accept per row.

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


def code_vocabulary(size: int = 154_880, cache: str | Path | None = None):
    """A byte-level BPE of ``size`` tokens trained on this interpreter's Python sources (the standard library, then the
    installed packages, to 150 MB; ``tools/train_tokenizer.py``'s trainer and special tokens) — a real BPE at GLM-5's
    size, code-heavy as GLM's is: its tokens hold JSON's quotes and brackets about as often as a real vocabulary's,
    where the padded one's random tokens hold them far more often (tokens that hold a quote, say, are checked
    against the grammar one by one inside a string). ``cache``: a folder to keep it in (built once)."""
    import sysconfig

    from cluster.local import load_tokenizer
    from tools.train_tokenizer import tokenizer_config, train

    out = Path(cache or Path(os.environ.get("TMPDIR", "/tmp")) / f"glmserve_code_bpe_{size}")
    if not (out / "tokenizer.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        roots = dict.fromkeys(Path(sysconfig.get_paths()[k]) for k in ("stdlib", "purelib", "platlib"))
        corpus, written = out / "corpus.txt", 0
        with corpus.open("w", encoding="utf-8") as f:
            for root in roots:
                for path in sorted(root.rglob("*.py")):
                    if written > 150e6 or "test" in path.parts or "tests" in path.parts:
                        continue
                    try:
                        text = path.read_text(encoding="utf-8")
                    except (UnicodeDecodeError, OSError):
                        continue
                    written += f.write(text + "\n")
        print(f"training a {size:,}-token BPE on {written / 1e6:.0f} MB of Python sources ...", flush=True)
        tokenizer = train(corpus, size)
        tokenizer.save(str(out / "tokenizer.json"))
        (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config()))
        corpus.unlink()
    tok = load_tokenizer(out)
    assert len(tok.vocab()) == size, f"the sources here gave {len(tok.vocab())} tokens, not {size}"
    return tok


def quoted_share(tok) -> float:
    """The share of the vocabulary's tokens that hold a double quote (context-dependent inside a JSON string)."""
    vocab = tok.vocab()                                 # byte-level: printable ASCII stands for itself
    return sum('"' in t for t in vocab) / len(vocab)


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
    vocabularies = [("embedded (6,144)", tok, engine.config.vocab_size, tok.encode(text)),
                    ("154,880: a BPE trained on Python sources (`code_vocabulary`)", code := code_vocabulary(), 154_880,
                     code.encode(text)),
                    ("154,880: the embedded padded with random tokens", _PaddedTokenizer(tok, 154_880), 154_880,
                     tok.encode(text))]                               # the embedded ids are the padded one's too
    lines += ["", "The grammar's host work per guided row (the engine's thread), feeding a 30-odd-token value:", "",
              "| vocabulary | tokens holding a `\"` | schema compile (first request) ms | mask µs a token | "
              "accept µs a token |", "|---|---:|---:|---:|---:|"]
    for name, vocab, size, ids in vocabularies:
        c = grammar_costs(vocab, size, engine.config.eos_token_ids, ids)
        assert c["rejected"] == 0, c
        lines.append(f"| {name} | {quoted_share(vocab):.1%} | {c['compile_ms']:.1f} | {c['mask_us']:.1f} | "
                     f"{c['accept_us']:.1f} |")
    lines += ["", f"A step's masks of 8 guided rows, µs ({os.cpu_count()} cores here; xgrammar's threads: half):", "",
              "| vocabulary | one at a time (the engine) | together (xgrammar's `BatchGrammarMatcher`) |",
              "|---|---:|---:|"]
    for name, vocab, size, ids in vocabularies:
        prefixes = [ids[:round(len(ids) * f)] for f in (0.03, 0.13, 0.29, 0.45, 0.65, 0.84, 0.97, 0.1)]  # 8 rows
        serial, together = batch_costs(vocab, size, engine.config.eos_token_ids, prefixes)
        lines.append(f"| {name} | {serial:.0f} | {together:.0f} |")
    out = "\n".join(lines) + "\n"
    Path(args.out).write_text(out)
    print(out)


if __name__ == "__main__":
    main()
