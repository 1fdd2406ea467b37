"""Where a single-process engine's decode step spends its wall time on the GPU: the GLM-5.2-width slice (1 dense
+ 3 MoE layers, FP8 random weights, one MTP layer) built as ``serve run`` builds it with ``num_workers: 1``
(``cluster.local.build_local_engine``, ``load_format: dummy``, CUDA graphs on), one request decoding after a prompt
of ``--ctx`` tokens.

The prefill's time to the first token; per decode step: the engine step's wall time (median); the GPU's kernel time in it (torch.profiler: the sum of
kernel durations over the decode steps / steps); the host time the GPU did not hide = wall − kernel time (staging
the step, launching the replay and the eager lm_head, sampling's device sync and what follows it, the scheduler).
Under PDL (``GLMSERVE_PDL``, on by default) a kernel's duration includes its wait for the one before, so the sum
over-counts and the difference means nothing: run with ``GLMSERVE_PDL=0`` for it (the report says which).
Then a cProfile of the same decode steps: host functions by own time (a device sync shows as the time of the call
that waits).

``--prefill-activations fp8``: the engine's W8A8 prefill (glmkernels/triton_w8a8.py); on CUDA the prefill's kernels are
listed by time as well. ``--list-index``: sampling picks its rows with a Python list index, as before session 13
(a synchronous copy: lm_head waits for the whole replay) — for an A/B in one process. ``--no-lookahead``: the engine
does not let the runner launch the next decode step before reading this one's tokens (as before session 13).
``--temperature T [--top-p P] [--top-k K]``: the request draws its tokens (greedy by default); ``--pageable-copies``:
sampling copies its per-row values (temperatures, rows, top-k) from pageable memory, each copy waiting for the
forward, as before session 14. ``--eager-drafts`` (with ``--spec``): the eager MTP drafter after each graph step — as
drawn requests had it before session 14. ``--reference-sampler``: the sampler's ops (the top-k / top-p draws, the kept
weights speculative decoding weighs drafts by, the penalties, the top-k keys) as PyTorch — as before session 64/65.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=. python bench/step_host.py [--ctx 4096] [--tokens 64] [--spec 0]
    PYTHONPATH=. python bench/step_host.py --tiny --device cpu --ctx 64 --tokens 8     # plumbing on CPU
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.cluster_slice import slice_config, watch_compiles
from cluster.config import EngineConfig
from cluster.local import build_local_engine
from glmkernels.triton_utils import pdl_mode
from scheduler.request import SamplingParams

SAMPLER_OPS = ("value_id_keys", "penalize", "top_p_race", "top_k_race", "kept_weights")


def prefill(engine, name: str, ctx: int, vocab: int, tokens: int, temperature: float = 0.0,
            top_p: float = 1.0, top_k: int = 0) -> float:
    """Add a request of a ``ctx``-token prompt and ``tokens`` decode steps; run its prefill. Returns the time to its
    first token (ms)."""
    prompt = [(7 * i + len(name)) % vocab for i in range(ctx)]
    params = SamplingParams(max_tokens=tokens + 1, temperature=temperature, top_p=top_p, top_k=top_k,
                            ignore_eos=True)
    engine.add_request(prompt, params, name)
    t0 = time.perf_counter()
    while not any(ev.token_ids for ev in engine.step()):
        pass
    return (time.perf_counter() - t0) * 1e3


def decode(engine, name: str) -> list[float]:
    """The engine's steps until no request is left: each step's wall ms."""
    walls = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        for ev in engine.step():
            if ev.error:
                raise RuntimeError(f"{name}: {ev.error}")
        walls.append((time.perf_counter() - t0) * 1e3)
    return walls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--spec", type=int, default=0, help="MTP drafts per round (0: plain decode)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the embedded tiny model's widths (a CPU plumbing check)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--prefill-activations", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--list-index", action="store_true", help="sampling's row pick as before session 13 (A/B)")
    ap.add_argument("--no-lookahead", action="store_true", help="no step launched ahead (A/B)")
    ap.add_argument("--temperature", type=float, default=0.0, help="the request's (0: greedy)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--reference-sampler", action="store_true",
                    help="the sampler's ops as PyTorch, the rest of the engine as it is (A/B)")
    ap.add_argument("--eager-drafts", action="store_true",
                    help="with --spec: the MTP drafts by the eager drafter after each graph step (A/B)")
    ap.add_argument("--pageable-copies", action="store_true",
                    help="sampling copies its per-row values from pageable memory, as before session 14 (A/B)")
    ap.add_argument("--out", default=None, help="folder for step_host.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_cfg = slice_config(4, args.tiny)
        (Path(tmp) / "config.json").write_text(json.dumps(model_cfg))
        cfg = EngineConfig(model=tmp, load_format="dummy", device=args.device, speculative_tokens=args.spec,
                           kv_cache_tokens=args.ctx + 4 * args.tokens + 256, max_num_batched_tokens=2048,
                           max_num_seqs=8, cuda_graphs="eager" if args.device == "cpu" else "auto",
                           prefill_activations=args.prefill_activations,
                           warmup_tokens=0)                         # it warms up below, with its own request
        if args.list_index:
            import workers.runner

            workers.runner._take_rows = lambda hidden, rows: hidden[rows]
        if args.pageable_copies:
            import workers.sampler

            workers.sampler.to_device = lambda values, dtype, device: torch.tensor(values, dtype=dtype, device=device)
        print("building the engine ...", flush=True)
        engine, _ = build_local_engine(cfg, progress=False)
        engine.lookahead = not args.no_lookahead
        if args.eager_drafts:
            engine.executor.runner.draft_graphs = None
        if args.reference_sampler:
            from glmkernels import ops

            for name in SAMPLER_OPS:
                ops._active[name] = ops.impl(name, "reference")
    vocab = model_cfg["vocab_size"]
    # prompt tokens, vocabulary, decode steps, the draw
    req = (args.ctx, vocab, args.tokens, args.temperature, args.top_p, args.top_k)
    prefill(engine, "warmup", *req)                              # compiles kernels, captures graphs
    decode(engine, "warmup")
    compiled = watch_compiles()
    prefill_ms = prefill(engine, "timed", *req)
    walls = decode(engine, "timed")
    slowest = sorted(range(len(walls)), key=lambda i: -walls[i])[:3]
    print(f"timed decode: the slowest steps {', '.join(f'#{i} {walls[i]:.2f} ms' for i in slowest)}; Triton kernels "
          f"compiled (or loaded) after the warm-up: {len(compiled)} {[name.split('[')[0] for name, _ in compiled[:6]]}")
    gpu = None
    if args.device == "cuda":
        from bench.profile_slice import kernel_times

        by_kernel = kernel_times(lambda: prefill(engine, "prefill-profiled", *req), 1)
        decode(engine, "prefill-profiled")
        total = sum(t for t, _ in by_kernel.values())
        print(f"prefill kernels: {total / 1e3:.1f} ms in all; the largest:")
        for name, (us, n) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:args.top // 2]:
            print(f"  {us / 1e3:8.2f} ms {us / total:6.1%} {int(n):5d}×  {name[:110]}")
        prefill(engine, "profiled", *req)
        prof_walls: list[float] = []
        kernels = kernel_times(lambda: prof_walls.extend(decode(engine, "profiled")), 1)
        gpu = sum(t for t, _ in kernels.values()) / 1e3 / len(prof_walls)
    prefill(engine, "cprofiled", *req)
    with cProfile.Profile() as profiler:
        host_walls = decode(engine, "cprofiled")
    wall = statistics.median(walls)
    pdl = pdl_mode() if args.device == "cuda" else "0"
    row = {"ctx": args.ctx, "spec": args.spec, "pdl": pdl, "prefill_activations": args.prefill_activations,
           "list_index": args.list_index, "lookahead": not args.no_lookahead, "temperature": args.temperature,
           "top_p": args.top_p, "top_k": args.top_k, "reference_sampler": args.reference_sampler,
           "pageable_copies": args.pageable_copies,
           "eager_drafts": args.eager_drafts,
           "prefill_ms": prefill_ms, "steps": len(walls), "step_ms": wall,
           "step_ms_mean": statistics.fmean(walls), "kernel_ms": gpu,
           "host_unhidden_ms": None if gpu is None or pdl != "0" else statistics.fmean(walls) - gpu,
           "graph_steps": engine.stats["graph_steps"], "walls_ms": [round(w, 3) for w in walls],
           "compiled_after_warmup": compiled, "ahead": dict(engine.executor.runner.ahead_stats)}
    print(json.dumps(row))
    print(f"prefill of {args.ctx} tokens (to the first token): {prefill_ms:.1f} ms")
    print(f"decode step: median {wall:.3f} ms, mean {row['step_ms_mean']:.3f} ms over {len(walls)} steps"
          + ("" if gpu is None else f"; GPU kernels {gpu:.3f} ms a step (PDL {pdl})")
          + ("" if row["host_unhidden_ms"] is None else f"; host not hidden {row['host_unhidden_ms']:.3f} ms"))
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(args.top)
    print(f"cProfile of {len(host_walls)} decode steps (mean {statistics.fmean(host_walls):.3f} ms under the "
          f"profiler), by own time:")
    print("\n".join(text.getvalue().splitlines()[4:]))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "step_host.json").write_text(json.dumps(row, indent=1))
        (Path(args.out) / "step_host_cprofile.txt").write_text(text.getvalue())


if __name__ == "__main__":
    main()
