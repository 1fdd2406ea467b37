"""Decode steps of a batch on the GPU: several requests decoding together on the GLM-5.2-width slice
(``bench/step_host.py``'s: 1 dense + 3 MoE layers, FP8 random weights, one process, CUDA graphs on), each step's
wall time with the decode graphs capped at ``--caps`` rows (steps of more rows then run eagerly: 16 was the most
before session 19, 8 before session 17) and uncapped (``scheduler.shapes.graph_rows``), in one engine,
alternating.

    PYTHONPATH=. python bench/batch_decode.py [--requests 32 64] [--caps 16] [--ctx 4096] [--tokens 48]
    PYTHONPATH=. python bench/batch_decode.py --lookahead-ab [--ragged] [--requests 32 64]   # all graph rows: look-ahead
        on with the schedulers' slack position, on without it (session 19: no look-ahead where a row opens a block), off
    (``--ragged``: prompt i is 5·i tokens shorter, so the requests open blocks at different steps)
    PYTHONPATH=. python bench/batch_decode.py --device cpu --requests 3 --ctx 64 --tokens 8    # plumbing on CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import scheduler.shapes as shapes_module
from bench.cluster_slice import slice_config
from bench.step_host import decode
from cluster.config import EngineConfig
from cluster.local import build_local_engine
from scheduler.request import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--caps", type=int, nargs="+", default=[16], help="graph rows a step may have, besides all")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--device", default="cuda", help="cpu: the tiny model's widths (plumbing)")
    ap.add_argument("--lookahead-ab", action="store_true", help="look-ahead with / without slack / off, not caps")
    ap.add_argument("--ragged", action="store_true", help="prompts of different lengths")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_cfg = slice_config(4, args.device == "cpu")
        (Path(tmp) / "config.json").write_text(json.dumps(model_cfg))
        cfg = EngineConfig(model=tmp, load_format="dummy", device=args.device, warmup_tokens=0,
                           max_num_seqs=max(64, *args.requests),
                           kv_cache_tokens=(max(args.requests) + 1) * (args.ctx + args.tokens + 64),
                           max_num_batched_tokens=8192, cuda_graphs="eager" if args.device == "cpu" else "auto")
        print("building the engine ...", flush=True)
        engine, _ = build_local_engine(cfg, progress=False)
    vocab = model_cfg["vocab_size"]
    graph_rows = shapes_module.graph_rows
    settings = [(0, ahead, slack) for ahead, slack in ((True, 1), (True, 0), (False, 1))] if args.lookahead_ab \
        else [(cap, True, 1) for cap in (*args.caps, 0)]
    for n in args.requests:
        for cap, ahead, slack in settings * 2:          # each setting twice: the first run also compiles / captures
            shapes_module.graph_rows = (lambda r, c=cap: min(c, graph_rows(r))) if cap else graph_rows
            engine.lookahead = ahead
            for sch in engine.schedulers:
                sch.slack = slack
            for i in range(n):
                prompt = [(7 * t + i) % vocab for t in range(args.ctx - (5 * i if args.ragged else 0))]
                engine.add_request(prompt, SamplingParams(max_tokens=args.tokens, ignore_eos=True), f"r{i}")
            started: set[str] = set()
            while len(started) < n:                                              # every prefill done
                for ev in engine.step():
                    if ev.error:
                        raise RuntimeError(f"{ev.req_id}: {ev.error}")
                    if ev.token_ids:
                        started.add(ev.req_id)
            before = dict(engine.stats)
            steps = decode(engine, "batch")
            ms = statistics.median(steps[4:])
            print(json.dumps({"requests": n, "graph_rows_max": cap or graph_rows(1), "lookahead": ahead, "slack": slack,
                              "step_ms": round(ms, 3), "tok_s": round(n / ms * 1e3), "steps": len(steps),
                              **{k: engine.stats[k] - before[k] for k in ("graph_steps", "ahead_steps")}}),
                  flush=True)
    shapes_module.graph_rows = graph_rows

if __name__ == "__main__":
    main()
