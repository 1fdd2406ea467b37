"""Decode on the GLM-5.2-width slice served by a worker group: N ranks, rank r on GPU r, MoE ``tp`` over them,
FP8 random weights (``load_format: dummy``), driven through the engine as the coordinator drives it —
scheduler → ``ProcessWorkerGroup`` (the GPU host has no Ray) → each worker's CUDA-graph decode step.

For each comm backend and each depth (1 dense + 1 MoE layer, 1 dense + 3 MoE layers; one MTP layer):

- plain: one request decodes after a prompt of ``--ctx`` tokens. Its steps are 1 row (a dp bucket of one
  row per rank); reported: the group's step time (median), the whole engine step's (with look-ahead the group
  returns a step while the next one runs: ``--no-lookahead`` for the A/B) and the request owner's time inside it;
- speculative: one request with ``--spec`` MTP drafts per round. A round is one engine step: the verify
  rows 1 + k in one span bucket (a graph step), then the k chained MTP passes (eager). Reported: round time,
  of which drafting, and the acceptance measured — random weights accept almost nothing, so tokens/s
  with speculation is given as AL / round time at stated acceptance lengths (AL = tokens per round).

Per MoE layer = (deep − shallow) / 2; a 78-layer model = shallow + 76 × per-layer (GLM-5's 3 dense layers
counted as MoE layers: they read less, so this over-estimates by about 1 %). Everything per-token that does
not grow with depth — embedding, lm_head, sampling, host scheduling, the MTP passes — is in the shallow run.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=. python bench/cluster_slice.py --out DIR             # on a host of N GPUs
    PYTHONPATH=. python bench/cluster_slice.py --tiny --device cpu --ctx 200 --tokens 8  # plumbing on CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.decode_slice import SLICE
from cluster.config import DEFAULT_MODEL, EngineConfig
from cluster.engine import Engine
from cluster.local import scheduler_config
from cluster.workers import ProcessWorkerGroup
from models.config import ModelConfig
from scheduler.request import SamplingParams

DEPTHS = (2, 4)               # 1 dense + 1 MoE, 1 dense + 3 MoE
FULL_DEPTH = 78
ACCEPTANCE = (2.0, 3.2, 3.48)  # tokens per round to project at (ours, tiny model k=7: 3.20; SGLang GLM-5: 3.48)


def watch_compiles() -> list[tuple[str, float]]:
    """A list that gains (kernel and its specialization, seconds) for every Triton kernel compiled — or loaded from
    the disk cache — from now on (after a warm-up: a variant it did not meet, a stall while serving). Empty without
    triton."""
    try:
        import triton
    except ImportError:
        return []
    seen, started = [], [0.0]

    def before(**kwargs):
        started[0] = time.perf_counter()
        return False

    def after(**kwargs):
        seen.append((str(kwargs.get("repr", "?"))[:400], round(time.perf_counter() - started[0], 3)))
        return False

    triton.knobs.runtime.jit_cache_hook = before
    triton.knobs.runtime.jit_post_compile_hook = after
    return seen


def slice_config(depth: int, tiny: bool) -> dict:
    """The bench model's config.json: the GLM-5.2-width slice (or the embedded tiny model's widths) at
    ``depth`` layers, the first dense, with one MTP layer."""
    cfg = json.loads((Path(DEFAULT_MODEL) / "config.json").read_text()) if tiny else dict(SLICE)
    cfg.update(num_hidden_layers=depth, first_k_dense_replace=1, num_nextn_predict_layers=1,
               index_share_for_mtp_iteration=True,          # as GLM-5's config: chained drafts reuse the selection
               mlp_layer_types=["dense"] + ["sparse"] * (depth - 1),
               indexer_types=(["full"] * 3 + ["shared"] * (depth - 3))[:depth])
    return cfg


class TimedExecutor:
    """The group, with each step's wall time and the request owner's busy / draft time recorded (the owner
    samples, which waits for the forward; a rank without rows returns before its forward has finished, so
    its split between forward and drafting means nothing)."""

    def __init__(self, group):
        self.group, self.log = group, []

    def execute(self, steps):
        start = time.perf_counter()
        results = self.group.execute(steps)
        ms = (time.perf_counter() - start) * 1e3
        owner = max(results, key=lambda r: (bool(r.sampled), r.busy_ms))
        self.log.append({"ms": ms, "graph": steps[0].graph, "span": steps[0].shape.is_span,
                         "rows": steps[0].shape.total_rows, "busy_ms": owner.busy_ms, "draft_ms": owner.draft_ms,
                         "forward_ms": ms - owner.draft_ms})
        return results

    def recover(self):
        self.group.recover()

    def shutdown(self):
        self.group.shutdown()


def run_case(model_dir: Path, args, comm: str, spec: int) -> dict:
    """One group, one request (a warm-up request first): the decode/verify steps' medians."""
    tokens = args.tokens
    cfg = EngineConfig(model=str(model_dir), load_format="dummy", device=args.device, kernels=args.kernels,
                       num_workers=args.workers, moe="tp", comm=comm, speculative_tokens=spec,
                       kv_cache_tokens=args.ctx + 2 * tokens + 256, max_num_batched_tokens=2048,
                       max_num_seqs=8, step_timeout_s=600.0,
                       cuda_graphs="eager" if args.device == "cpu" else "auto")   # CPU: the static path, uncaptured
    num_blocks = cfg.num_blocks
    t0 = time.perf_counter()
    group = ProcessWorkerGroup(cfg, num_blocks, setup_timeout_s=600.0)
    setup_s = time.perf_counter() - t0
    timed = TimedExecutor(group)
    try:
        model_cfg = ModelConfig.from_json(model_dir)
        engine = Engine(timed, scheduler_config(cfg, model_cfg, None, num_blocks), num_ranks=args.workers,
                        speculative_tokens=spec, graphs=cfg.graphs_mode() != "off", lookahead=not args.no_lookahead)
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        for name in ("warmup", "timed"):          # the warm-up compiles kernels and captures the graphs
            timed.log.clear()
            prompt = [(7 * i + len(name)) % model_cfg.vocab_size for i in range(args.ctx)]
            engine.add_request(prompt, params, name)
            t0 = time.perf_counter()
            while engine.has_unfinished():
                t_step = time.perf_counter()
                for ev in engine.step():
                    if ev.error:
                        raise RuntimeError(f"{name}: {ev.error}")
                if timed.log:
                    timed.log[-1]["wall_ms"] = (time.perf_counter() - t_step) * 1e3
            wall = time.perf_counter() - t0
        decode = [s for s in timed.log if s["graph"] is not None]
        if not decode:
            raise RuntimeError("no graph-shaped decode step ran (are CUDA graphs on?)")
        full = max(s["rows"] for s in decode)                # near max_tokens the drafts shrink: leave those out
        decode = [s for s in decode if s["rows"] == full]
        metrics = engine.spec_metrics()
        row = {"comm": comm, "spec": spec, "setup_s": setup_s, "request_s": wall, "steps": len(decode),
               "rows": decode[-1]["rows"], "span": decode[-1]["span"],
               "step_ms": statistics.median(s["ms"] for s in decode),
               "busy_ms": statistics.median(s["busy_ms"] for s in decode),
               "draft_ms": statistics.median(s["draft_ms"] for s in decode),
               "forward_ms": statistics.median(s["forward_ms"] for s in decode),
               "engine_step_ms": statistics.median(s["wall_ms"] for s in decode),
               "graph_steps": engine.stats["graph_steps"], "ahead_steps": engine.stats["ahead_steps"],
               "mean_accepted_length": metrics["mean_accepted_length"] if spec else 1.0}
        # per token: the engine's whole step (with look-ahead the group's own time hides part of the GPU's)
        row["tok_s"] = tokens / sum(s["wall_ms"] for s in decode) * 1e3 if not spec else None
        return row
    finally:
        timed.shutdown()


def extrapolate(rows: list[dict]) -> list[dict]:
    """Per (comm, spec): per-MoE-layer cost from the two depths, and the 78-layer projection. A step is
    forward (engine step − drafting: host, pipes, the graph replay or verify, lm_head, sampling), which grows
    with depth, + drafting (the MTP passes), which does not: per-layer from the forward medians,
    drafting = the mean of the two depths' medians."""
    out = []
    for comm in sorted({r["comm"] for r in rows}):
        for spec in sorted({r["spec"] for r in rows}):
            by = {r["depth"]: r for r in rows if r["comm"] == comm and r["spec"] == spec}
            if set(by) != set(DEPTHS):
                continue
            lo, hi = by[DEPTHS[0]], by[DEPTHS[1]]
            layers = DEPTHS[1] - DEPTHS[0]
            e = {"comm": comm, "spec": spec, "draft_ms": (lo["draft_ms"] + hi["draft_ms"]) / 2}
            for key in ("forward_ms", "busy_ms"):
                e[f"{key}_per_layer"] = (hi[key] - lo[key]) / layers
            e["forward_ms_78"] = lo["forward_ms"] + (FULL_DEPTH - DEPTHS[0]) * e["forward_ms_per_layer"]
            e["step_ms_78"] = e["forward_ms_78"] + e["draft_ms"]
            out.append(e)
    return out


def write_report(rows: list[dict], ext: list[dict], args, out: Path) -> None:
    lines = ["# Decode on a worker group: the GLM-5.2-width slice over N GPUs", "",
             f"`{args.command}`", "",
             f"{args.workers} workers (rank r on GPU r), MoE tp over them, "
             f"{'the tiny model widths' if args.tiny else 'FP8'} random weights (`load_format: dummy`), "
             f"kernels `{args.kernels}`, CUDA graphs auto; one request, prompt {args.ctx} tokens, {args.tokens} new "
             f"tokens (greedy, ignore_eos), after a warm-up request. Step = one engine step (scheduler → "
             f"ProcessWorkerGroup over pipes → every rank); owner busy = the request owner's time inside it "
             f"(forward, lm_head, sampling, drafting); engine step = the whole `Engine.step` (planning and updating "
             f"too: with look-ahead — {'off' if args.no_lookahead else 'on'} here — the group's step returns while "
             f"the next one runs, so the engine step is the per-token time); ahead = steps launched ahead.", "",
             "| comm | depth | mode | rows (bucket) | step ms | engine step ms | owner busy ms | "
             "of which drafting ms | step − drafting ms | accepted length | steps | ahead | setup s |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        mode = f"MTP k={r['spec']}" if r["spec"] else "plain"
        shape = f"{r['rows']} ({'span' if r['span'] else 'dp'})"
        lines.append(f"| {r['comm']} | {r['depth']} | {mode} | {shape} | {r['step_ms']:.2f} | "
                     f"{r['engine_step_ms']:.2f} | {r['busy_ms']:.2f} | {r['draft_ms']:.2f} | {r['forward_ms']:.2f} | "
                     f"{r['mean_accepted_length']:.2f} | {r['steps']} | {r['ahead_steps']} | {r['setup_s']:.0f} |")
    lines += ["", f"Per MoE layer (difference of the depths) and extrapolated to {FULL_DEPTH} layers:", "",
              "| comm | mode | forward ms / layer | owner busy ms / layer | forward ms, 78 layers | drafting ms | "
              "step ms, 78 layers | plain tok/s | " + " | ".join(f"tok/s at AL {a}" for a in ACCEPTANCE) + " |",
              "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(ACCEPTANCE)]
    for e in ext:
        mode = f"MTP k={e['spec']}" if e["spec"] else "plain"
        t78 = e["step_ms_78"]
        plain = f"{1e3 / t78:.1f}" if not e["spec"] else "–"
        spec = " | ".join(f"{a * 1e3 / t78:.1f}" if e["spec"] else "–" for a in ACCEPTANCE)
        lines.append(f"| {e['comm']} | {mode} | {e['forward_ms_per_layer']:.3f} | {e['busy_ms_per_layer']:.3f} | "
                     f"{e['forward_ms_78']:.2f} | {e['draft_ms']:.2f} | {t78:.2f} | {plain} | {spec} |")
    lines += ["", "Anchors (8×H200, the full model, reference/serving_anchors.md): ~7 ms per token plain; "
              "186–200 tok/s with speculation (vLLM/SGLang single-user: 52–56 tok/s plain, 110–143 tok/s MTP).",
              f"Run {time.strftime('%Y-%m-%d %H:%M')}."]
    text = "\n".join(lines) + "\n"
    print(text)
    (out / f"{args.name}.md").write_text(text)
    (out / f"{args.name}.json").write_text(json.dumps({"rows": rows, "extrapolated": ext}, indent=1))


def main() -> None:
    import sys

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--comms", default="ipc,torch")
    ap.add_argument("--spec", default="3,7", help="MTP drafts per round, a comma list (plain always runs)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kernels", default="auto")
    ap.add_argument("--tiny", action="store_true", help="the embedded tiny model's widths (a CPU plumbing check)")
    ap.add_argument("--no-lookahead", action="store_true", help="no decode step launched ahead (A/B)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="cluster_slice", help="report file name (without .md / .json)")
    args = ap.parse_args()
    args.command = "python bench/cluster_slice.py " + " ".join(sys.argv[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    partial = out / f"{args.name}.jsonl"             # a row per finished case, in case the run is cut short
    partial.write_text("")
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {}
        for depth in DEPTHS:
            dirs[depth] = Path(tmp) / f"depth{depth}"
            dirs[depth].mkdir()
            (dirs[depth] / "config.json").write_text(json.dumps(slice_config(depth, args.tiny)))
        for comm in args.comms.split(","):
            for depth in DEPTHS:
                for spec in sorted({0, *map(int, args.spec.split(","))}):
                    print(f"{comm}, depth {depth}, {'plain' if not spec else f'MTP k={spec}'} ...", flush=True)
                    try:
                        row = run_case(dirs[depth], args, comm, spec)
                    except Exception as e:  # noqa: BLE001 — report it, go on with the next case
                        print(f"  failed: {type(e).__name__}: {str(e)[:500]}", flush=True)
                        continue
                    row["depth"] = depth
                    print("  " + json.dumps(row), flush=True)
                    rows.append(row)
                    with partial.open("a") as f:
                        f.write(json.dumps(row) + "\n")
    write_report(rows, extrapolate(rows), args, out)


if __name__ == "__main__":
    main()
