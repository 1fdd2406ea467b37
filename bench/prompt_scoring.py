"""What scoring prompts costs: ``--prompts`` prompts of ``--isl`` tokens, all at once, one token each (max_tokens 1,
prefix caching off), with no prompt logprobs beside the same with every prompt token's logprob (and its top n, for
each ``--top``) — as lm-eval's loglikelihood requests ask for them. One engine, the variants alternating
``--rounds`` times after an untimed warm run; prompt tokens a second (median of the rounds) and the ratio to the
plain prefill.

    PYTHONPATH=. python bench/prompt_scoring.py [--isl 512 --prompts 8] [--out DIR]        # CPU, the tiny model
    PYTHONPATH=. python bench/prompt_scoring.py --slice --isl 4096 --prompts 8 --out DIR    # a GPU, the GLM-5.2 slice

``--slice``: the GLM-5.2-width slice of ``bench/cluster_slice.py`` (4 layers, FP8 random weights, vocab 154,880):
its lm_head and log-softmax over every prompt row are a full model's, its layers ~1/20 of one — the ratio there is
an upper bound on a full model's cost of scoring.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.prefix_cache import model_path, report
from cluster.config import EngineConfig
from cluster.local import build_local_engine
from workers import runner
from scheduler.request import SamplingParams


def run(engine, prompts: list[list[int]], top: int | None, tag: str) -> float:
    """Seconds until every prompt has its one token (and, with ``top``, its prompt logprobs)."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=top)
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        engine.add_request(ids, params, f"{tag}-{i}")
    scored = 0
    while engine.has_work():
        for ev in engine.step():
            if ev.error:
                raise RuntimeError(f"{ev.req_id}: {ev.error}")
            scored += ev.prompt_logprobs is not None
    if top is not None and scored != len(prompts):
        raise AssertionError(f"{scored} of {len(prompts)} prompts came back with their logprobs")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slice", action="store_true", help="the GLM-5.2-width slice, random FP8 weights (a GPU)")
    ap.add_argument("--device", default=None, help="cpu, or cuda (the default with --slice)")
    ap.add_argument("--isl", type=int, default=512, help="prompt tokens")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--top", type=int, nargs="+", default=[0, 5], help="alternatives a token (prompt_logprobs)")
    ap.add_argument("--chunk", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--prompt-rows", type=int, nargs="+", default=[runner.PROMPT_ROWS],
                    help="rows of logits a pass of prompt logprobs holds (workers.runner.PROMPT_ROWS), each tried")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="a directory for prompt_scoring.md / .json")
    args = ap.parse_args()
    args.device = args.device or ("cuda" if args.slice else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        model, fmt = model_path(args.slice, tmp)
        cfg = EngineConfig(model=model, load_format=fmt, device=args.device, max_num_seqs=max(args.prompts, 8),
                           max_num_batched_tokens=args.chunk, kv_cache_tokens=args.prompts * (args.isl + 32),
                           prefix_caching=False, max_model_len=args.isl + 16, warmup_tokens=0)
        print("building the engine ...", flush=True)
        engine, _ = build_local_engine(cfg, progress=False)
        vocab = engine.schedulers[0].config.vocab_size
        rng = random.Random(0)
        prompts = [[rng.randrange(40, vocab) for _ in range(args.isl)] for _ in range(args.prompts)]
        variants = [(None, None)] + [(top, rows) for rows in args.prompt_rows for top in args.top]
        for top, rows in variants:                                 # untimed: every shape compiles
            runner.PROMPT_ROWS = rows or runner.PROMPT_ROWS
            run(engine, prompts, top, f"warm{top}")
        times: dict = {v: [] for v in variants}
        for r in range(args.rounds):
            for top, rows in variants:
                runner.PROMPT_ROWS = rows or runner.PROMPT_ROWS
                times[top, rows].append(run(engine, prompts, top, f"r{r}-{top}"))
                print(f"round {r}, prompt_logprobs {top}, {rows} rows a pass: {times[top, rows][-1]:.3f} s", flush=True)
    tokens = args.prompts * args.isl
    base = statistics.median(times[None, None])
    what = "the GLM-5.2-width slice (4 layers, FP8 random weights)" if args.slice else "the tiny model"
    lines = [f"Scoring {args.prompts} prompts of {args.isl} tokens at once on {args.device}, {what}: "
             f"max_num_batched_tokens {args.chunk}, one token each, prefix caching off; median of {args.rounds} "
             "alternating rounds.", "",
             "| prompt_logprobs | rows a pass | seconds | prompt tokens/s | / plain prefill |", "|---|---:|---:|---:|---:|"]
    for top, rows in variants:
        t = statistics.median(times[top, rows])
        lines.append(f"| {'none' if top is None else top} | {rows or ''} | {t:.3f} | {tokens / t:.0f} | "
                     f"{t / base:.2f}× |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    report(lines, {"args": vars(args), "seconds": {f"{t}@{r}": v for (t, r), v in times.items()}},
           str(Path(args.out) / "prompt_scoring.md") if args.out else None)


if __name__ == "__main__":
    main()
