"""Verify-round cost vs rows: one request's speculative verify (positions p..p+k-1 of the SAME request)
on the GLM-5.2-width slice of ``bench/decode_slice.py`` (1 dense + 3 MoE layers, FP8 weights built on
the GPU, random KV), ``kernels: auto``, eager and the runner's CUDA-graph path.

The premise under test: a verify of k+1 rows costs about what a 1-row decode costs. Attention reads
the same context once per row set, but the MoE reads the union of the experts the rows route to, so
the report gives each MoE layer's expert union beside the time — for random token ids (rows as
unrelated as a random-weight model makes them) and for one id repeated (rows differ only by
position and their causal context: the most overlap such a model gives). Random weights: a trained
model's consecutive tokens may overlap more than these, not less than the repeated-id rows.

Compared against 8 rows of 8 distinct requests (the dp decode shape) at the same context.
A step = model forward over the rows + lm_head logits for every row (verify scores them all).

    PYTHONPATH=. python bench/verify_rows.py --out bench/results
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.decode_slice import BF16, BLOCK, DEV, SLICE, build_model, decode_graphs, time_ms
from glmkernels import ops
from models.cache import KVCache, contiguous_batch
from models.config import ModelConfig
from models.glm5 import MoeShard
from scheduler.scheduler import ScheduledSeq
from scheduler.shapes import graph_width

ROWS = (1, 2, 4, 8)
CTXS = (4096, 32768)


def expert_union(model, ids: torch.Tensor, batch, cache) -> list[int]:
    """Distinct routed experts per MoE layer for one forward over ``ids``."""
    router = ops._active["router_topk"]
    unions: list[int] = []

    def spy(*a, **k):
        idx, w = router(*a, **k)  # idx: [rows, top_k]
        unions.append(int(idx.unique().numel()))
        return idx, w

    ops._active["router_topk"] = spy
    try:
        with torch.no_grad():
            model(ids, batch, cache)
    finally:
        ops._active["router_topk"] = router
    return unions


def bench_case(model, cfg, cache, graphs, ctx: int, label: str, lengths: list[tuple[int, int]],
               capacity: int) -> dict:
    rows = sum(n for _, n in lengths)
    batch = contiguous_batch(lengths, capacity, DEV)
    g = torch.Generator(device=DEV).manual_seed(ctx + rows)
    ids = torch.randint(0, cfg.vocab_size, (rows,), device=DEV, generator=g)
    row = {"case": label, "ctx": ctx, "rows": rows,
           "experts_random_ids": expert_union(model, ids, batch, cache),
           "experts_same_id": expert_union(model, ids[:1].expand(rows).contiguous(), batch, cache)}

    def step():
        with torch.no_grad():
            return model.logits(model(ids, batch, cache))

    row["eager_ms"] = time_ms(step, 20)
    per_req = capacity // BLOCK                  # request i's slots i*capacity.. as blocks, like the batch
    seqs, r0 = [], 0
    for i, (start, n) in enumerate(lengths):
        blocks = tuple(range(i * per_req, i * per_req + -(-(start + n) // BLOCK)))
        seqs.append(ScheduledSeq(f"r{i}", tuple(ids[r0:r0 + n].tolist()), start, blocks, True, 0, n - 1))
        r0 += n
    width = graph_width(max(len(s.block_ids) for s in seqs))

    def graph_step():                          # the runner's path: replay, then the lm_head over the rows
        with torch.no_grad():
            return model.logits(graphs.run(rows, width))
    try:
        graphs.stage(seqs, rows, width)
        row["graph_ms"] = time_ms(graph_step, 50)
    except Exception as e:  # noqa: BLE001 — report, keep benchmarking
        row["graph_ms"], row["graph_error"] = None, repr(e)[:200]
    print(json.dumps(row), flush=True)
    return row


def write_report(results: list[dict], out: Path, command: str) -> None:
    base = {(r["ctx"], r["case"]): r for r in results if r["rows"] == 1}
    lines = [f"# Verify-round cost vs rows ({torch.cuda.get_device_name()}, torch {torch.__version__})", "",
             ("GLM-5.2-width slice of `bench/decode_slice.py` (1 dense + 3 MoE layers of 256 experts, top-8, FP8 "
             "block weights, bf16 activations and KV, index_topk 2048), one GPU, `kernels: auto`. A step = forward "
             "over the rows + lm_head logits for every row. `verify k` = ONE request, rows at positions "
             "ctx..ctx+k-1; `dp 8` = 8 distinct requests, one row each (the decode shape). Experts = distinct "
             "routed experts per MoE layer (random token ids | one id repeated). Times: median ms, CUDA events; "
             "graph = the runner's graph path (replay of workers/graphs.py's captured forward + the lm_head)."), "",
             f"Command: `{command}`", "",
             ("| ctx | case | rows | experts/layer (random ids) | experts/layer (same id) | eager ms | graph ms "
             "| graph vs 1 row |"), "|---:|---|---:|---|---|---:|---:|---:|"]
    for r in results:
        one = base.get((r["ctx"], "verify"))
        ratio = "—" if not (one and one.get("graph_ms") and r.get("graph_ms")) else f"{r['graph_ms'] / one['graph_ms']:.2f}×"
        g = "—" if r.get("graph_ms") is None else f"{r['graph_ms']:.2f}"
        lines.append(f"| {r['ctx']} | {r['case']} | {r['rows']} | {r['experts_random_ids']} | {r['experts_same_id']} "
                     f"| {r['eager_ms']:.2f} | {g} | {ratio} |")
    errors = sorted({r["graph_error"] for r in results if r.get("graph_error")})
    if errors:
        lines += ["", "Graph capture failed: " + "; ".join(errors)]
    (out / "verify_rows.md").write_text("\n".join(lines) + "\n")
    (out / "verify_rows.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = ModelConfig.from_dict(dict(SLICE))
    capacity = max(CTXS) + BLOCK                            # slots per request (a multiple of BLOCK)
    cache = KVCache(cfg, 8 * capacity + BLOCK, BF16, DEV)   # + a block for the graphs' pad slot
    for t in cache.kv + [k for k in cache.index_k if k is not None]:
        t.normal_()
    model = build_model(cfg, MoeShard())
    ops.configure("auto", DEV)
    graphs = decode_graphs(model, cache)
    results = []
    for ctx in CTXS:
        for k in ROWS:
            results.append(bench_case(model, cfg, cache, graphs, ctx, "verify", [(ctx, k)], capacity))
        results.append(bench_case(model, cfg, cache, graphs, ctx, "dp 8", [(ctx, 1)] * 8, capacity))
    write_report(results, out, "PYTHONPATH=. python bench/verify_rows.py --out bench/results")


if __name__ == "__main__":
    main()
