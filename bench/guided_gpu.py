"""What structured output costs a decode step on the GPU, and what building its masks during the forward saves: the
GLM-5.2-width slice (``bench/cluster_slice.py``'s config, FP8 random weights, CUDA graphs on) in one process, its
154,880-token vocabulary guided through a BPE of that size trained on the host's Python sources (``--vocab code``,
``bench/guided_cpu.py``'s ``code_vocabulary``) or the embedded tokenizer padded with random tokens (``--vocab
padded``), 1 and 8 requests decoding at once after a short prompt.

Per row count, alternated in one process: free (no schema, look-ahead on as served; and off, as guided steps run), guided with the masks built at
sampling once the forward is launched (``StepMasks``, as served), and guided with the masks built before the step is
handed to the runner (as before session 39). A step's ms: the median over the steps where every row decodes.

    PYTHONPATH=. python bench/guided_gpu.py [--rows 1 8] [--tokens 48] [--out DIR]
    PYTHONPATH=. python bench/guided_gpu.py --tiny --device cpu --tokens 8     # plumbing on CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.cluster_slice import slice_config
from bench.guided_cpu import SCHEMA, _PaddedTokenizer, code_vocabulary
from cluster.config import DEFAULT_MODEL, EngineConfig
from cluster.engine import Engine
from cluster.guided import Guides
from cluster.local import build_local_engine, load_tokenizer
from scheduler.request import SamplingParams

MODES = ("free", "free, no look-ahead", "guided (masks during the forward)", "guided (masks before the step)")


def run(engine, rows: int, tokens: int, schema: str | None, vocab: int) -> tuple[float, int]:
    """(median ms of the steps where every row decodes, such steps) for ``rows`` greedy requests at once."""
    for i in range(rows):
        prompt = [(13 * j + 7 * i) % 6000 + 40 for j in range(200)]
        engine.add_request(prompt, SamplingParams(max_tokens=tokens, temperature=0.0, json_schema=schema,
                                                  ignore_eos=schema is None), f"r{i}")
    walls = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        events = engine.step()
        if len(events) == rows and all(len(ev.token_ids) == 1 and not ev.error for ev in events):
            walls.append((time.perf_counter() - t0) * 1e3)
        for ev in events:
            if ev.error:
                raise RuntimeError(ev.error)
    return (statistics.median(walls) if walls else float("nan")), len(walls)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3, help="alternated runs of each mode")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the embedded model's widths (a CPU plumbing check)")
    ap.add_argument("--vocab", default="code", choices=["code", "padded"], help="the slice's guided vocabulary")
    ap.add_argument("--out", default=None, help="folder for guided_gpu.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_cfg = slice_config(4, args.tiny)
        (Path(tmp) / "config.json").write_text(json.dumps(model_cfg))
        cfg = EngineConfig(model=tmp, load_format="dummy", device=args.device, kv_cache_tokens=16384,
                           max_num_seqs=8, cuda_graphs="eager" if args.device == "cpu" else "auto", warmup_tokens=0)
        print("building the engine ...", flush=True)
        engine, _ = build_local_engine(cfg, progress=False)
    vocab = model_cfg["vocab_size"]
    tok = load_tokenizer(DEFAULT_MODEL)
    if vocab > len(tok.vocab()):
        tok = code_vocabulary(vocab) if args.vocab == "code" else _PaddedTokenizer(tok, vocab)
    engine.guides = Guides(tok, vocab, load_tokenizer(DEFAULT_MODEL).eos_token_ids)
    lazy_masks = Engine._masks

    def eager_masks(self, plan):
        masks = lazy_masks(self, plan)
        if masks is not None:
            masks.rows()
        return masks

    table = {}
    for rows in args.rows:
        for rep in range(-1, args.repeats):                  # -1: warm (kernels, graphs, the schema's compile)
            for mode in MODES:
                Engine._masks = eager_masks if mode == MODES[3] else lazy_masks
                engine.lookahead = mode != MODES[1]              # guided steps look ahead as served
                ms, n = run(engine, rows, 8 if rep < 0 else args.tokens, SCHEMA if "guided" in mode else None, vocab)
                if rep < 0:
                    continue
                table.setdefault((rows, mode), []).append(ms)
                print(f"rows {rows} {mode}: {ms:.3f} ms a step ({n} steps)", flush=True)
    Engine._masks, engine.lookahead = lazy_masks, True
    where = "the embedded model's widths" if args.tiny else "the GLM-5.2-width slice (1 dense + 3 MoE layers, FP8)"
    lines = ["# Structured output on the decode step: masks during the forward vs before the step", "",
             f"`PYTHONPATH=. python bench/guided_gpu.py --rows {' '.join(map(str, args.rows))} --tokens {args.tokens}"
             f"{' --tiny' if args.tiny else ''} --device {args.device} --vocab {args.vocab}` — {where}, vocabulary {vocab:,}, one process, "
             f"greedy, {args.repeats} alternated runs a mode (median of each run's steps where every row decodes; "
             "the runs listed).", "", f"Schema: `{SCHEMA}`", "",
             "| rows | " + " | ".join(f"{m}: ms a step" for m in MODES) + " | saved by building during the forward |",
             "|---:|" + "---:|" * (len(MODES) + 1)]
    for rows in args.rows:
        best = [min(table[(rows, m)]) for m in MODES]
        cells = [f"{b:.3f} ({', '.join(f'{x:.2f}' for x in table[(rows, m)])})" for b, m in zip(best, MODES)]
        lines.append(f"| {rows} | " + " | ".join(cells) + f" | {best[3] - best[2]:.3f} ms |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "guided_gpu.md").write_text(text)


if __name__ == "__main__":
    main()
