"""A long prompt's prefill on the GPU: its time to first token and the memory it takes beyond the weights and the KV
cache. The GLM-5.2-width slice (``bench/step_host.py``'s: 1 dense + 3 MoE layers, 3 with their own indexer, FP8
random weights) built as ``serve run`` builds one worker, prefilling in the 8×H200 deployment's chunks
(``max_num_batched_tokens`` 8192): the indexer scores each chunk's rows against every key before it, so a chunk at the
end of a long prompt is the step whose transient memory grows with the context.

    PYTHONPATH=. python bench/long_prefill.py --ctx 65536 131072 [--chunk 8192] [--out FILE.jsonl]

``--trace DIR``: for each prompt, every engine step's wall time, the Triton kernels compiled during it (name and
compile seconds, through ``triton.knobs.runtime``'s jit hooks) and torch.profiler's table of host and
device ops by total time — to find what a first long prompt pays that the same prompt again does not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.cluster_slice import slice_config, watch_compiles
from bench.step_host import decode
from cluster.config import EngineConfig
from cluster.local import build_local_engine
from scheduler.request import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", type=int, nargs="+", default=[65536, 131072])
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=16, help="decode steps after each prompt")
    ap.add_argument("--out", default=None, help="a JSON-lines file to append the results to")
    ap.add_argument("--trace", default=None, help="a folder for each prompt's steps, compiles and profiler table")
    ap.add_argument("--warmup-tokens", type=int, default=0, help="the engine's start-up warm-up (0: none)")
    args = ap.parse_args()
    compiles = watch_compiles() if args.trace else []
    with tempfile.TemporaryDirectory() as tmp:
        model_cfg = slice_config(4, False)
        (Path(tmp) / "config.json").write_text(json.dumps(model_cfg))
        cfg = EngineConfig(model=tmp, load_format="dummy", device="cuda", kv_cache_tokens=max(args.ctx) + 1024,
                           max_num_batched_tokens=args.chunk, max_num_seqs=8, warmup_tokens=args.warmup_tokens)
        print("building the engine ...", flush=True)
        engine, _ = build_local_engine(cfg, progress=False)
    vocab = model_cfg["vocab_size"]
    params = SamplingParams(max_tokens=args.tokens + 1, ignore_eos=True)
    rows = []
    for i, ctx in enumerate([2 * args.chunk + 100] + args.ctx):         # the first compiles the kernels
        engine.add_request([(7 * t + i) % vocab for t in range(ctx)], params, f"r{i}")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start, steps, step_compiles = time.perf_counter(), [], []
        with _profiled(args.trace, f"prompt{i}_{ctx}"):
            while True:
                seen, t0 = len(compiles), time.perf_counter()
                events = engine.step()
                steps.append((time.perf_counter() - t0) * 1e3)
                step_compiles.append(compiles[seen:])
                if any(ev.error for ev in events):
                    raise RuntimeError(f"ctx {ctx}: {[ev.error for ev in events if ev.error]}")
                if any(ev.token_ids for ev in events):
                    break
        ttft_ms = (time.perf_counter() - start) * 1e3
        peak_gb = (torch.cuda.max_memory_allocated() - base) / 2**30
        seen = len(compiles)
        step_ms = statistics.median(decode(engine, f"r{i}"))
        row = {"ctx": ctx, "chunk": args.chunk, "ttft_ms": ttft_ms, "last_chunk_ms": steps[-1],
               "prefill_tok_s": ctx / ttft_ms * 1e3, "peak_extra_gb": peak_gb, "decode_step_ms": step_ms}
        if i:
            rows.append(row)
        print(json.dumps(row), flush=True)
        if args.trace:
            trace = {**row, "decode_compiled": compiles[seen:],
                     "steps": [{"ms": round(ms, 2), "compiled": c} for ms, c in zip(steps, step_compiles, strict=True)]}
            Path(args.trace, f"prompt{i}_{ctx}.json").write_text(json.dumps(trace, indent=1))
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


@contextlib.contextmanager
def _profiled(folder: str | None, name: str):
    """Profile the block's host and device ops into ``folder/name.txt`` (nothing without a folder)."""
    if folder is None:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile

    Path(folder).mkdir(parents=True, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        yield prof
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=60, max_name_column_width=90)
    Path(folder, f"{name}.txt").write_text(table)


if __name__ == "__main__":
    main()
