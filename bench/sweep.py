"""Throughput against latency at fixed concurrency, as InferenceX and the recipes measure serving engines: ``c``
clients, each sending its next request as soon as its last one ends, ``--requests-per-client`` requests each, prompts
of ``--isl`` tokens and answers of ``--osl`` (greedy, EOS ignored, random token ids, prefix caching off). One engine
serves every concurrency in turn (warmed up once, then ``max(c)`` prompts run untimed: the prefill steps' shapes compile
and capture), in this process as a coordinator drives it (no HTTP, no Ray).

    PYTHONPATH=. python bench/sweep.py [--concurrency 1 4 16] [--out DIR]                # CPU, the tiny model
    PYTHONPATH=. python bench/sweep.py --slice --isl 1024 --osl 256 --concurrency 1 4 8 16 32 64 \
        --warmup-tokens 2048 --out DIR                                                               # a GPU

Per concurrency: output tokens/s of the whole engine and per user (1 / TPOT), time to first token, TPOT (a request's
time between its first and last token over the tokens between), in milliseconds. ``--slice`` is the GLM-5.2-width
slice of ``bench/cluster_slice.py`` (4 layers: 1 dense + 3 MoE, FP8 random weights, one GPU): its steps are a 78-layer
model's embedding, head and sampling with about 1/20 of its layers, so its tokens/s are an upper bound on one GPU's,
not a prediction of a node's. With ``--out DIR`` it writes ``sweep.md``, ``sweep.json`` and, where matplotlib is
installed, ``sweep.png`` (output tokens/s against tokens/s per user).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.prefix_cache import model_path
from cluster.config import DEFAULT_MODEL, EngineConfig
from cluster.local import build_local_engine
from scheduler.request import SamplingParams


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_level(engine, c: int, n: int, isl: int, osl: int, vocab: int, seed: int) -> dict:
    """``n`` requests from ``c`` closed-loop clients; per request its add, first and last token times."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(40, vocab) for _ in range(isl)] for _ in range(n)]
    params = SamplingParams(max_tokens=osl, temperature=0.0, ignore_eos=True)
    added, first, last, count = {}, {}, {}, {}
    issued = 0

    def issue() -> None:
        nonlocal issued
        rid = f"c{c}-{issued}"
        engine.add_request(prompts[issued], params, rid)
        added[rid], count[rid] = time.perf_counter(), 0
        issued += 1

    for _ in range(min(c, n)):
        issue()
    rounds, accepted = engine.stats["draft_rounds"], engine.stats["drafts_accepted"]
    start = time.perf_counter()
    while engine.has_work():
        for ev in engine.step():
            if ev.error:
                raise RuntimeError(f"{ev.req_id}: {ev.error}")
            now = time.perf_counter()
            if ev.token_ids:
                first.setdefault(ev.req_id, now)
                last[ev.req_id] = now
                count[ev.req_id] += len(ev.token_ids)
            if ev.finished and issued < n:
                issue()
    wall = time.perf_counter() - start
    ttft = [1e3 * (first[r] - added[r]) for r in added]
    tpot = [1e3 * (last[r] - first[r]) / (count[r] - 1) for r in added if count[r] > 1]
    out_tokens = sum(count.values())
    rounds, accepted = engine.stats["draft_rounds"] - rounds, engine.stats["drafts_accepted"] - accepted
    return {"concurrency": c, "requests": n, "wall_s": wall, "output_tok_s": out_tokens / wall,
            "total_tok_s": (out_tokens + n * isl) / wall, "ttft_mean": statistics.mean(ttft),
            "ttft_p50": statistics.median(ttft), "ttft_p99": pct(ttft, 0.99), "tpot_mean": statistics.mean(tpot),
            "tpot_p99": pct(tpot, 0.99), "user_tok_s": 1e3 / statistics.mean(tpot),
            "accepted_length": (accepted + rounds) / rounds if rounds else None}


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.plot([r["user_tok_s"] for r in rows], [r["output_tok_s"] for r in rows], "o-")
    for r in rows:
        ax.annotate(f"c={r['concurrency']}", (r["user_tok_s"], r["output_tok_s"]), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    ax.set_xlabel("tokens/s per user (1 / TPOT)")
    ax.set_ylabel("output tokens/s (engine)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a model directory (without --slice)")
    ap.add_argument("--slice", action="store_true", help="the GLM-5.2-width slice, random FP8 weights (a GPU)")
    ap.add_argument("--device", default=None, help="cpu, or cuda (the default with --slice)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests-per-client", type=int, default=3)
    ap.add_argument("--isl", type=int, default=128, help="prompt tokens")
    ap.add_argument("--osl", type=int, default=32, help="output tokens")
    ap.add_argument("--chunk", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--kv", type=int, default=None, help="KV slots (default: every client's whole context, twice)")
    ap.add_argument("--spec", type=int, default=0, help="MTP drafts a round (random weights accept almost none)")
    ap.add_argument("--warmup-tokens", type=int, default=None,
                    help="a GPU's graphs of contexts up to this many (default: the engine's, every context)")
    ap.add_argument("--out", default=None, help="a directory for sweep.md / .json / .png")
    args = ap.parse_args()
    args.device = args.device or ("cuda" if args.slice else "cpu")
    top = max(args.concurrency)
    kv = args.kv or 2 * top * (args.isl + args.osl + 16)
    with tempfile.TemporaryDirectory() as tmp:
        model, fmt = model_path(args.slice, tmp) if args.slice else (args.model, "auto")
        cfg = EngineConfig(model=model, load_format=fmt, device=args.device, max_num_seqs=top,
                           max_num_batched_tokens=args.chunk, max_waiting=4 * top, kv_cache_tokens=kv,
                           prefix_caching=False, speculative_tokens=args.spec, warmup_tokens=args.warmup_tokens,
                           max_model_len=args.isl + args.osl + 16)
        print("building the engine ...", flush=True)
        engine, _ = build_local_engine(cfg, progress=False)
        vocab = engine.schedulers[0].config.vocab_size
        run_level(engine, top, top, args.isl, 2, vocab, seed=99)      # untimed: the prefill chunks' shapes compile
        rows = []
        for c in args.concurrency:
            rows.append(run_level(engine, c, c * args.requests_per_client, args.isl, args.osl, vocab, seed=c))
            r = rows[-1]
            print(f"c={c}: {r['output_tok_s']:.0f} output tok/s, {r['user_tok_s']:.1f} per user, "
                  f"TTFT {r['ttft_mean']:.0f} ms", flush=True)
    what = ("the GLM-5.2-width slice (4 layers, FP8 random weights)" if args.slice else
            "the tiny model" if args.model == DEFAULT_MODEL else args.model)
    lines = [f"Fixed concurrency on {args.device}, {what}: prompts {args.isl} tokens, answers {args.osl}, "
             f"{args.requests_per_client} requests a client; max_num_seqs {top}, max_num_batched_tokens {args.chunk}"
             f"{f', {args.spec} MTP drafts' if args.spec else ''}. Milliseconds.", "",
             "| c | requests | output tok/s | total tok/s | tok/s per user | TTFT mean / p50 / p99 | TPOT mean / p99 "
             "| drafting: tokens a round |", "|---:|---:|---:|---:|---:|---|---|---:|"]
    for r in rows:
        al = "" if r["accepted_length"] is None else f"{r['accepted_length']:.2f}"
        lines.append(f"| {r['concurrency']} | {r['requests']} | {r['output_tok_s']:.0f} | {r['total_tok_s']:.0f} | "
                     f"{r['user_tok_s']:.1f} | {r['ttft_mean']:.0f} / {r['ttft_p50']:.0f} / {r['ttft_p99']:.0f} | "
                     f"{r['tpot_mean']:.1f} / {r['tpot_p99']:.1f} | {al} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.md").write_text(text)
        (out / "sweep.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
        plot(rows, out / "sweep.png")


if __name__ == "__main__":
    main()
