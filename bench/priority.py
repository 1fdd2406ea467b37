"""Priority scheduling under a batch flood: interactive requests' time to first token with the FCFS and the priority
policy, side by side in one run, on the same arrivals.

    PYTHONPATH=. python bench/priority.py [--out bench/results/session44/priority_cpu.md]      # CPU, the tiny model
    PYTHONPATH=. python bench/priority.py --slice --device cuda --batch 96 --batch-prompt 2048 --batch-out 256 \
        --max-num-seqs 32 --chunk 8192 --chat-prompt 512 --chat-out 64 --kv 1048576 --warmup-tokens 4096   # a GPU

``--batch`` batch requests (priority 1: ``--batch-prompt`` prompt tokens, ``--batch-out`` output tokens) arrive at
once and fill the ``--max-num-seqs`` slots and the queue; then one interactive request (priority 0, a short prompt and
answer) arrives every ``--every`` steps. Arrivals are counted in engine steps, so both policies see the same ones;
times are wall-clock. Token ids are synthetic; greedy; EOS ignored. On a GPU each engine warms up first (CUDA graphs
of contexts up to ``--warmup-tokens``, as ``serve run`` does), outside the timing.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import statistics
import tempfile
import time

from bench.prefix_cache import model_path
from cluster.config import DEFAULT_MODEL, EngineConfig
from cluster.local import build_local_engine
from scheduler.request import SamplingParams


def workload(args, vocab: int) -> dict[int, list[tuple[str, list[int], SamplingParams]]]:
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(40, vocab) for _ in range(n)]
    arrivals = {0: [(f"batch{i}", ids(args.batch_prompt), SamplingParams(max_tokens=args.batch_out, temperature=0.0,
                                                                         ignore_eos=True, priority=1))
                    for i in range(args.batch)]}
    for i in range(args.interactive):
        arrivals.setdefault(args.start + i * args.every, []).append(
            (f"chat{i}", ids(args.chat_prompt), SamplingParams(max_tokens=args.chat_out, temperature=0.0,
                                                               ignore_eos=True, priority=0)))
    return arrivals


def run(args, policy: str, model: str, load_format: str) -> dict:
    cfg = EngineConfig(model=model, load_format=load_format, device=args.device, scheduling_policy=policy,
                       max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.chunk, max_waiting=1024,
                       kv_cache_tokens=args.kv, prefix_caching=False, warmup_tokens=args.warmup_tokens)
    print(f"{policy}: building the engine ...", flush=True)
    engine, _ = build_local_engine(cfg, progress=False)
    arrivals = workload(args, engine.schedulers[0].config.vocab_size)
    added, first, done, tokens = {}, {}, {}, 0
    start = time.perf_counter()
    for step in range(100_000):
        for rid, ids, params in arrivals.pop(step, []):
            if policy == "fcfs":
                params = SamplingParams(**{**params.__dict__, "priority": 0})
            engine.add_request(ids, params, rid)
            added[rid] = time.perf_counter()
        if not engine.has_work() and not arrivals:
            break
        for ev in engine.step():
            now = time.perf_counter()
            tokens += len(ev.token_ids)
            if ev.token_ids:
                first.setdefault(ev.req_id, now)
            if ev.finished:
                done[ev.req_id] = now
    wall = time.perf_counter() - start
    preemptions = engine.stats["preemptions"]
    del engine
    gc.collect()                          # the engine's pool and graphs, before the next policy's engine is built
    if args.device == "cuda":
        import torch

        torch.cuda.empty_cache()
    out = {"policy": policy, "wall_s": wall, "tokens_per_s": tokens / wall, "preemptions": preemptions}
    for kind in ("chat", "batch"):
        ttft = sorted(1e3 * (first[r] - added[r]) for r in added if r.startswith(kind))
        e2e = sorted(1e3 * (done[r] - added[r]) for r in added if r.startswith(kind))
        out[kind] = {"ttft_p50": statistics.median(ttft), "ttft_p95": ttft[math.ceil(0.95 * len(ttft)) - 1],
                     "ttft_max": ttft[-1], "e2e_p50": statistics.median(e2e), "e2e_max": e2e[-1]}
    print(f"{policy}: {wall:.1f} s, chat TTFT p50 {out['chat']['ttft_p50']:.0f} ms", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a model directory (without --slice)")
    ap.add_argument("--slice", action="store_true", help="the GLM-5.2-width slice, random FP8 weights (a GPU)")
    ap.add_argument("--device", default=None, help="cpu, or cuda (the default with --slice)")
    ap.add_argument("--warmup-tokens", type=int, default=None,
                    help="a GPU's graphs of contexts up to this many (default: the engine's, every context)")
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--batch-prompt", type=int, default=192)
    ap.add_argument("--batch-out", type=int, default=96)
    ap.add_argument("--interactive", type=int, default=12)
    ap.add_argument("--chat-prompt", type=int, default=48)
    ap.add_argument("--chat-out", type=int, default=16)
    ap.add_argument("--start", type=int, default=10, help="the step the first interactive request arrives at")
    ap.add_argument("--every", type=int, default=15, help="steps between interactive arrivals")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=256, help="max_num_batched_tokens")
    ap.add_argument("--kv", type=int, default=16384, help="KV slots")
    ap.add_argument("--out", default=None, help="a markdown file for the table")
    args = ap.parse_args()
    args.device = args.device or ("cuda" if args.slice else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        model, fmt = model_path(args.slice, tmp) if args.slice else (args.model, "auto")
        rows = [run(args, policy, model, fmt) for policy in ("fcfs", "priority")]
    what = ("the GLM-5.2-width slice (4 layers, FP8)" if args.slice else
            "the tiny model" if args.model == DEFAULT_MODEL else args.model)
    lines = [f"Interactive (priority 0) and batch (priority 1) requests on {args.device}, {what}: {args.batch} batch "
             f"requests ({args.batch_prompt} + {args.batch_out} tokens) at once, then {args.interactive} interactive "
             f"({args.chat_prompt} + {args.chat_out}) one every {args.every} steps; max_num_seqs {args.max_num_seqs}, "
             f"max_num_batched_tokens {args.chunk}. Milliseconds.", "",
             "| policy | chat TTFT p50 / p95 / max | chat end p50 / max | batch TTFT p50 / max | batch end p50 / max "
             "| tokens/s | preemptions | wall s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c, b = r["chat"], r["batch"]
        lines.append(f"| {r['policy']} | {c['ttft_p50']:.0f} / {c['ttft_p95']:.0f} / {c['ttft_max']:.0f} | "
                     f"{c['e2e_p50']:.0f} / {c['e2e_max']:.0f} | {b['ttft_p50']:.0f} / {b['ttft_max']:.0f} | "
                     f"{b['e2e_p50']:.0f} / {b['e2e_max']:.0f} | {r['tokens_per_s']:.0f} | {r['preemptions']} | "
                     f"{r['wall_s']:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
