"""A replica's cold start on the GPU: what its first requests pay with and without the start-up warm-up.

Builds the GLM-5.2-width slice (``bench/cluster_slice.py::slice_config``: 1 dense + ``--depth`` − 1 MoE layers, FP8
random weights, one MTP layer) as ``serve run`` builds it for one worker (``build_local_engine``), with
``warmup_tokens: --warmup-tokens`` (0: none — every kernel compiles and every graph shape is captured in the step
that first needs it). Then the same traffic twice — a request alone (prompt ``--ctx``), four at once (prompts of
300 … 1800 tokens, drawn: T 1.0, top-p 0.95), then four at once that draw each its own way (top-p, top-k and top-p,
min-p, greedy with a repetition penalty: the batch's per-row forms of the sampler's kernels), then prompts of three
prefill chunks (``--max-num-batched-tokens``), one at a time: 2 chunks + 100 tokens, + 163 (the second pass's prefix
hits compute tails of 4 and 3 rows past the cached blocks of 16) and + 112 (a multiple of 16); a prompt of one token;
then eight at once of random lengths and sampling (``_fuzz``) — and reports per pass:
each request's time to first token, the engine's longest step and median step, the graphs captured and the Triton
kernels compiled while serving. The second pass is the warm reference. Run each setting in a fresh process with an
empty ``TRITON_CACHE_DIR`` (a new container compiles everything).

    NCCL_NVLS_ENABLE=0 PYTHONPATH=. TRITON_CACHE_DIR=$(mktemp -d) python bench/warmup.py --warmup-tokens 4096 --spec 3
    PYTHONPATH=. python bench/warmup.py --tiny --device cpu --cuda-graphs eager --warmup-tokens 256 --ctx 100
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.cluster_slice import slice_config, watch_compiles
from cluster.config import EngineConfig
from cluster.local import build_local_engine
from scheduler.request import SamplingParams


def captured(engine) -> int:
    runner = engine.executor.runner
    graphs = runner.graphs.captured if runner.graphs is not None else []
    return len(graphs) + (len(runner.draft_graphs.captured) if runner.draft_graphs is not None else 0) + \
        (len(runner.pieces.captured) if runner.pieces is not None else 0)


def serve(engine, reqs: dict, vocab: int, compiles: list) -> dict:
    """Add ``reqs`` ({id: (prompt length, SamplingParams)}) at once and step until they finish: each one's time to first
    token (ms), the longest and the median engine step (ms), the prompts' tokens found cached, graphs captured and
    Triton kernels compiled meanwhile (``compiles``: ``watch_compiles``' list). A prompt's tokens follow from its length
    and its id's length only: ids of one length share a prefix (the second pass's ids, as long as the first's: prefix
    hits)."""
    before, compiled = captured(engine), len(compiles)
    cached = sum(s.prefix_hits for s in engine.schedulers)
    t0 = time.perf_counter()
    for rid, (n, params) in reqs.items():
        engine.add_request([(7 * i + len(rid)) % vocab for i in range(n)], params, rid)
    ttft, walls = {}, []
    while engine.has_unfinished():
        s = time.perf_counter()
        for ev in engine.step():
            if ev.error:
                raise RuntimeError(f"{ev.req_id}: {ev.error}")
            if ev.token_ids and ev.req_id not in ttft:
                ttft[ev.req_id] = (time.perf_counter() - t0) * 1e3
        walls.append((time.perf_counter() - s) * 1e3)
    return {"ttft_ms": ttft, "max_step_ms": max(walls), "median_step_ms": statistics.median(walls),
            "steps": len(walls), "captured": captured(engine) - before,
            "cached_tokens": sum(s.prefix_hits for s in engine.schedulers) - cached,      # (prefix hits)
            "compiled": compiles[compiled:]}          # (the kernel with its specialization: which variant, seconds)


def _fuzz(n: int, params: list[SamplingParams]) -> dict:
    """``n`` requests at once of seeded random prompt lengths (1–3 tokens, up to 64, up to 3000) and sampling: shapes
    the other traffic does not have (the second pass: prefix hits of random tails)."""
    rng = random.Random(0)
    return {f"fuzz{i}" + "x" * (6 + i): (rng.choice([rng.randint(1, 3), rng.randint(4, 64), rng.randint(65, 3000)]),
                                rng.choice(params)) for i in range(n)}            # (ids of other lengths: see serve)


def free_gib(device: str) -> list[float] | None:
    """[free, total] GiB of the GPU (None on CPU)."""
    if device != "cuda":
        return None
    import torch

    return [round(x / 2**30, 2) for x in torch.cuda.mem_get_info()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warmup-tokens", type=int, default=4096)
    ap.add_argument("--depth", type=int, default=4, help="layers of the slice (the first dense)")
    ap.add_argument("--mlp-shard", type=int, default=1, metavar="D", help="MLP widths / D (a tp rank's share)")
    ap.add_argument("--spec", type=int, default=0, help="MTP drafts per round")
    ap.add_argument("--ctx", type=int, default=1000, help="the lone request's prompt")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=8, help="running requests: the warm-up captures the graph "
                    "buckets they can fill")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cuda-graphs", default="auto")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.0, help="size the KV pool to memory (else "
                    "--kv-cache-tokens); the report gives the device's free memory after the warm-up and after the "
                    "traffic")
    ap.add_argument("--kv-cache-tokens", type=int, default=65536, help="the KV pool: one that holds a pass's traffic, "
                    "so that the second pass's prompts are prefix hits (16384 until session 67: the first pass's "
                    "long prompts evicted the earlier prompts' blocks)")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048, help="a prefill chunk's rows at most")
    ap.add_argument("--tiny", action="store_true", help="the embedded tiny model's widths (a CPU plumbing check)")
    ap.add_argument("--out", default=None, help="a JSON-lines file to append the result to")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_cfg = slice_config(args.depth, args.tiny)
        for key in ("intermediate_size", "moe_intermediate_size"):
            model_cfg[key] //= args.mlp_shard
        (Path(tmp) / "config.json").write_text(json.dumps(model_cfg))
        cfg = EngineConfig(model=tmp, load_format="dummy", device=args.device, speculative_tokens=args.spec,
                           kv_cache_tokens=args.kv_cache_tokens, gpu_memory_utilization=args.gpu_memory_utilization,
                           kv_cache_dtype=args.kv_cache_dtype,
                           max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                           cuda_graphs=args.cuda_graphs, warmup_tokens=args.warmup_tokens)
        t0 = time.perf_counter()
        engine, _ = build_local_engine(cfg, progress=True)
        build_s = time.perf_counter() - t0
        warmed = captured(engine)
        memory = {"kv_tokens": engine.schedulers[0].config.num_blocks * cfg.block_size,
                  "max_model_len": engine.schedulers[0].config.max_model_len, "after_warmup": free_gib(args.device)}
    vocab = model_cfg["vocab_size"]
    greedy = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    drawn = SamplingParams(max_tokens=args.tokens, temperature=1.0, top_p=0.95, ignore_eos=True)
    mixed = [drawn, replace(drawn, temperature=0.6, top_k=20), replace(drawn, top_p=0.9, min_p=0.05),
             replace(greedy, repetition_penalty=1.1)]
    traffic = [{"alone": (args.ctx, greedy)}, {f"b{i}": (n, drawn) for i, n in enumerate((300, 700, 1200, 1800))},
               {f"m{i}": (n, params) for i, (n, params) in enumerate(zip((200, 400, 600, 800), mixed))},
               # (prompts of three chunks; ids of other lengths: other tokens, so none is a prefix of another)
               *({rid: (2 * args.max_num_batched_tokens + extra, greedy)}
                 for rid, extra in (("long", 100), ("long-tail3", 163), ("long-x16", 112))),
               {"one": (1, greedy)}, _fuzz(8, [greedy, drawn, *mixed])]
    compiles = watch_compiles()
    passes = []
    for p in range(2):
        passes.append([serve(engine, {f"{rid}-{p}": r for rid, r in reqs.items()}, vocab, compiles)
                       for reqs in traffic])
    memory["after_traffic"] = free_gib(args.device)
    if args.device == "cuda":
        import torch

        memory["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    row = {"warmup_tokens": args.warmup_tokens, "gpu_memory_utilization": args.gpu_memory_utilization,
           "kv_cache_dtype": args.kv_cache_dtype,
           "max_num_batched_tokens": args.max_num_batched_tokens,
           "memory": memory, "depth": args.depth, "mlp_shard": args.mlp_shard, "spec": args.spec,
           "build_s": build_s,
           "max_num_seqs": args.max_num_seqs,
           "warmup": engine.warmed, "graphs_warmed": warmed, "passes": passes, "graphs_after": captured(engine)}
    for p, results in enumerate(passes):
        for r in results:
            print(f"pass {p}: ttft ms {', '.join(f'{v:.0f}' for v in r['ttft_ms'].values())}; longest step "
                  f"{r['max_step_ms']:.0f} ms, median {r['median_step_ms']:.2f} ms; {r['cached_tokens']} tokens "
                  f"cached; {r['captured']} graphs captured, {len(r['compiled'])} Triton kernels compiled "
                  f"({sum(c for _, c in r['compiled']):.1f} s): "
                  f"{[name.split('[')[0] for name, _ in r['compiled']]}")
    print(f"KV pool {memory['kv_tokens']} tokens, max_model_len {memory['max_model_len']}; device memory free "
          f"(GiB, of total) after the warm-up {memory['after_warmup']}, after the traffic {memory['after_traffic']}")
    print(json.dumps(row))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
