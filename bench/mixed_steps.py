"""What a prompt's arrival costs the requests already decoding: one process on the GLM-5.2-width slice
(``bench/step_host.py``'s: 1 dense + 3 MoE layers, FP8 random weights, CUDA graphs on), ``--decoders`` requests
decoding at ``--ctx`` tokens, then a prompt of P tokens arrives (``--prompts``). Per P: the wall time of the steps
that carry its prefill (mixed steps: its chunk beside the decoders' rows) and of the same prompt's prefill with no
one decoding; beside them the decoders' own step, graph-replayed and eager; on CUDA the GPU kernel time of one mixed
step (torch.profiler; run with ``GLMSERVE_PDL=0`` for kernel-alone sums), so wall − kernels is the host time the GPU
did not hide.

``--modes``: the engine's ways of running a step that carries prefill rows (``eager``: the ragged forward;
``graph``: graph steps hold prefill rows too, up to the buckets decode steps fill — ``Engine.graph_prefill``;
``max_num_seqs`` 64 here, so up to 64 rows; ``pieces``: that, and the other steps on per-layer graphs —
``workers/pieces.py``; ``pieces-mtp-eager``: that, with a speculative engine's MTP passes eager, as before session 24),
alternating per P. ``--spec K``: a speculative engine (K drafts while one request runs alone; every step's MTP
extend). ``--mlp-shard D``: the MLPs at 1/D of their width, as a rank of a D-rank
``tp`` group holds them (its GPU work per layer shrinks, its host work does not).

    NCCL_NVLS_ENABLE=0 PYTHONPATH=. python bench/mixed_steps.py [--decoders 16] [--ctx 2048] [--prompts 16 48 200 1000]
        [--modes eager graph pieces] [--mlp-shard 8] [--depth 4] [--spec 3 --modes pieces-mtp-eager pieces]
    PYTHONPATH=. python bench/mixed_steps.py --device cpu --decoders 3 --ctx 64 --prompts 5 20   # plumbing on CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.cluster_slice import slice_config
from cluster.config import EngineConfig
from cluster.local import build_local_engine
from scheduler.request import SamplingParams


def timed_steps(engine, until) -> list[float]:
    """The engine's steps (wall ms each) until ``until(events)`` is true for a step's events."""
    walls = []
    while True:
        t0 = time.perf_counter()
        events = engine.step()
        walls.append((time.perf_counter() - t0) * 1e3)
        for ev in events:
            if ev.error:
                raise RuntimeError(f"{ev.req_id}: {ev.error}")
        if until(events):
            return walls


def prompt(n: int, salt: int, vocab: int) -> list[int]:
    return [(7 * t + 13 * salt) % vocab for t in range(n)]


def sync_report(fn, top: int = 25) -> str:
    """Where ``fn()`` synchronizes with the GPU (each synchronizing call's Python line, counted) and its host
    functions by own time."""
    import cProfile
    import io
    import pstats
    import warnings
    from collections import Counter

    import torch

    with warnings.catch_warnings(record=True) as caught, cProfile.Profile() as profiler:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = Counter(f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    lines = [f"{n:5d}x  {where}" for where, n in syncs.most_common()]
    return "synchronizing calls:\n" + "\n".join(lines) + "\nhost by own time:\n" + \
        "\n".join(text.getvalue().splitlines()[4:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decoders", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--prompts", type=int, nargs="+", default=[16, 48, 200, 1000])
    ap.add_argument("--repeats", type=int, default=3, help="arrivals per P and mode (the first one compiles)")
    ap.add_argument("--modes", nargs="+", default=["eager"], choices=["eager", "graph", "pieces", "pieces-mtp-eager"])
    ap.add_argument("--spec", type=int, default=0, metavar="K", help="speculative tokens (MTP drafts)")
    ap.add_argument("--prefill-activations", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--mlp-shard", type=int, default=1, metavar="D", help="MLP widths / D (a tp rank's share)")
    ap.add_argument("--depth", type=int, default=4, help="layers of the slice (1 dense, the rest MoE)")
    ap.add_argument("--device", default="cuda", help="cpu: the tiny model's widths (plumbing)")
    ap.add_argument("--sync-debug", type=int, default=0, metavar="P",
                    help="after the table: where one arrival of P tokens among the decoders waits for the GPU "
                         "(torch.cuda sync debug mode), and its host functions by own time (cProfile)")
    ap.add_argument("--trace", type=int, default=0, metavar="P",
                    help="with --out: a chrome trace (torch.profiler, host and GPU) of one arrival of P tokens")
    ap.add_argument("--stream", type=int, default=0, metavar="K",
                    help="then per mode: a prompt arrives every K steps among the decoders (lengths --prompts in "
                         "turn, 8 tokens each) for --stream-steps steps: the decoders' inter-token times and tokens/s")
    ap.add_argument("--stream-steps", type=int, default=96)
    ap.add_argument("--out", default=None, help="folder for mixed_steps.json")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_cfg = slice_config(args.depth, not cuda)
        for key in ("intermediate_size", "moe_intermediate_size"):
            model_cfg[key] //= args.mlp_shard
        (Path(tmp) / "config.json").write_text(json.dumps(model_cfg))
        # the decoders' steps: 36 timed alone, then each arrival's steps (a profiled one more per P and mode)
        steps_each = 64 + sum((args.repeats + 1) * len(args.modes) * (2 + n // 2048) for n in args.prompts) \
            + 2 * args.stream_steps * len(args.modes)
        cfg = EngineConfig(model=tmp, load_format="dummy", device=args.device, warmup_tokens=0,
                           max_num_seqs=max(64, args.decoders + 1), max_num_batched_tokens=2048,
                           kv_cache_tokens=(args.decoders + 2) * (args.ctx + steps_each) + 2 * max(args.prompts),
                           max_model_len=args.ctx + steps_each + max(args.prompts),
                           cuda_graphs="auto" if cuda else "eager", speculative_tokens=args.spec,
                           prefill_activations=args.prefill_activations)
        print("building the engine ...", flush=True)
        engine, _ = build_local_engine(cfg, progress=False)
    vocab = model_cfg["vocab_size"]
    runner = engine.executor.runner
    pieces = runner.pieces

    def set_mode(mode: str) -> None:
        engine.graph_prefill = mode != "eager"
        runner.pieces = pieces if mode.startswith("pieces") else None
        if runner.drafter is not None:
            runner.drafter.pieces = pieces if mode == "pieces" else None

    decoders = [f"d{i}" for i in range(args.decoders)]
    long = SamplingParams(max_tokens=steps_each, ignore_eos=True)
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    rows, arrivals = [], 0

    def arrive(n: int, mode: str) -> tuple[list[float], int]:
        nonlocal arrivals
        arrivals += 1
        set_mode(mode)
        before = engine.stats["graph_steps"]
        rid = f"p{arrivals}"
        engine.add_request(prompt(n, arrivals, vocab), one, rid)
        walls = timed_steps(engine, lambda evs: any(ev.req_id == rid and ev.finished for ev in evs))
        return walls, engine.stats["graph_steps"] - before

    # the prompts alone first (nobody decoding), then the decoders come and the same prompts arrive among them
    for n in args.prompts:
        for mode in args.modes:
            runs = [arrive(n, mode) for _ in range(args.repeats)]
            rows.append({"case": "alone", "prompt": n, "mode": mode, "steps": len(runs[-1][0]),
                         "graph_steps": runs[-1][1], "ms": round(statistics.median(sum(w) for w, _ in runs[1:]), 3)})
            print(json.dumps(rows[-1]), flush=True)
    for i, rid in enumerate(decoders):
        engine.add_request(prompt(args.ctx - 3 * i, i, vocab), long, rid)
    started: set[str] = set()

    def all_started(events) -> bool:
        started.update(ev.req_id for ev in events if ev.token_ids)
        return started >= set(decoders)

    timed_steps(engine, all_started)
    graph_walls = [timed_steps(engine, lambda evs: True)[0] for _ in range(24)]
    engine.graphs = False
    eager_walls = [timed_steps(engine, lambda evs: True)[0] for _ in range(12)]
    engine.graphs = True
    rows.append({"case": "decoders", "decoders": args.decoders,
                 "graph_ms": round(statistics.median(graph_walls[8:]), 3),
                 "eager_ms": round(statistics.median(eager_walls[4:]), 3)})
    print(json.dumps(rows[-1]), flush=True)
    for n in args.prompts:
        for mode in args.modes:
            runs = [arrive(n, mode) for _ in range(args.repeats)]
            row = {"case": "mixed", "prompt": n, "mode": mode, "decoders": args.decoders, "steps": len(runs[-1][0]),
                   "graph_steps": runs[-1][1], "ms": round(statistics.median(sum(w) for w, _ in runs[1:]), 3)}
            if cuda:
                from bench.profile_slice import kernel_times

                walls: list[float] = []
                kernels = kernel_times(lambda w=walls, n=n, m=mode: w.extend(arrive(n, m)[0]), 1)
                row["kernel_ms"] = round(sum(t for t, _ in kernels.values()) / 1e3, 3)
                row["profiled_ms"] = round(sum(walls), 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    chat = SamplingParams(max_tokens=8, ignore_eos=True)
    for mode in args.modes * 2 if args.stream else ():      # each mode twice, alternating (the first compiles)
        set_mode(mode)
        walls, generated, carried = [], 0, 0
        for step in range(args.stream_steps):
            if step % args.stream == 0:
                arrivals += 1
                engine.add_request(prompt(args.prompts[arrivals % len(args.prompts)], arrivals, vocab), chat,
                                   f"s{arrivals}")
            waiting = sum(sch.num_waiting for sch in engine.schedulers)
            t0 = time.perf_counter()
            events = engine.step()
            walls.append((time.perf_counter() - t0) * 1e3)
            generated += sum(len(ev.token_ids) for ev in events)
            carried += waiting > 0
        while any(rid.startswith("s") for rid in engine.executor.runner.requests):   # the last chats finish
            engine.step()
        walls.sort()
        rows.append({"case": "stream", "mode": mode, "every": args.stream, "prompts": args.prompts,
                     "steps": len(walls), "steps_with_arrivals": carried,
                     "itl_p50_ms": round(walls[len(walls) // 2], 3),
                     "itl_p90_ms": round(walls[len(walls) * 9 // 10], 3), "itl_max_ms": round(walls[-1], 3), "tok_s": round(generated / sum(walls) * 1e3)})
        print(json.dumps(rows[-1]), flush=True)
    if args.sync_debug and cuda:
        print(sync_report(lambda: arrive(args.sync_debug, args.modes[0])), flush=True)
    if args.trace and cuda and args.out:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            arrive(args.trace, args.modes[0])
        prof.export_chrome_trace(str(Path(args.out) / f"trace_{args.trace}.json"))
    for rid in decoders:
        engine.abort(rid)
    if args.out:
        (Path(args.out) / "mixed_steps.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
