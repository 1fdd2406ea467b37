"""A greedy MTP draft's lm_head on one rank of a worker group: the whole lm_head (every rank reads all of it for its
own row, as before session 37) against the vocabulary split over the group (``StepComm.argmax_logits``: each rank
scores every rank's rows against its 1/N of the vocabulary, two small AG phases carry the rows and the (max, index)
pairs), at GLM-5.2 widths (hidden 6144, vocabulary 154880, bf16) on one GPU.

One GPU cannot run the group, so the split is timed as rank 0 of N sees it without the wire: ``SimulatedGroup``'s AG
copies this rank's rows beside fixed rows standing for the other ranks' into the gathered buffer (the bytes a gather
writes), and the wire's latency is reported apart (a graph-captured ipc phase on two H200s: ~8 µs, session 3's
``bench/results/x2/README.md``). Each case is a CUDA graph, replayed and synchronized alone (median), beside its byte
floor (the weight rows it reads / the read stream measured in the same run).

Before timing, the split is checked on the device against the whole lm_head: every rank's slice computed in turn on
the same gathered rows, combined as ``argmax_logits`` does, and compared id for id (and the slices' logits bit for
bit against the whole product's columns) — reported, since cuBLAS may reduce a narrower product in another order.

    PYTHONPATH=. python bench/vocab_head.py --out DIR [--world 8] [--rows 1 2 4 8] [--profile]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.decode_slice import graph_ms, time_ms
from models.glm5 import Linear
from workers.worker import StepComm, first_max, slice_best, vocab_slice

DEV, BF16 = "cuda", torch.bfloat16
HIDDEN, VOCAB = 6144, 154880


class SimulatedGroup:
    """Rank 0's static phases in a group of ``world`` ranks, without the wire. AG: this rank's rows, then zero rows for
    the other ranks' (the pad rows a span's chain pass gathers), copied into a fresh [N, R, H] buffer; RS: this rank's stripe
    of the partials (the sum over sources is the wire's side). Graph-capturable."""

    def __init__(self, world: int):
        self.world = world
        self._others: dict[tuple, torch.Tensor] = {}

    def all_gather_static(self, local: torch.Tensor) -> torch.Tensor:
        key = (tuple(local.shape), local.dtype)
        if key not in self._others:
            self._others[key] = torch.zeros(self.world - 1, *local.shape, device=local.device, dtype=local.dtype)
        out = torch.empty(self.world, *local.shape, dtype=local.dtype, device=local.device)
        out[0].copy_(local)
        out[1:].copy_(self._others[key])
        return out

    def reduce_scatter_static(self, partial: torch.Tensor) -> torch.Tensor:
        return partial[: partial.shape[0] // self.world].clone()


def draft_pass(world: int, iters: int, profile: bool = False) -> dict:
    """One chained greedy MTP draft pass on rank 0 of ``world`` (tp MoE shard, 1 row, index sharing: the extend's
    2048 selected slots), as ``DraftGraphs`` replays it: the MTP layer then the lm_head's argmax — whole, or split by
    vocabulary (``greedy_ids`` over ``StepComm``). GLM-5.2 widths, random FP8 weights (``load_format: dummy``)."""
    from bench.decode_slice import SLICE
    from glmkernels import ops
    from models.cache import Batch, KVCache
    from models.config import ModelConfig
    from models.glm5 import MoeShard
    from models.loader import dummy_model
    from scheduler.shapes import StepShape

    cfg = ModelConfig.from_dict({**SLICE, "num_hidden_layers": 1, "mlp_layer_types": ["dense"],
                                 "indexer_types": ["full"], "num_nextn_predict_layers": 1})
    ops.configure("auto", DEV)
    model = dummy_model(cfg, BF16, DEV, MoeShard(0, world, "tp"))
    comm = StepComm(SimulatedGroup(world), 0, world, torch.device(DEV))
    model.set_comm(comm)
    comm.select(StepShape("dp", 1, world, None), torch.ones(1, dtype=torch.bool, device=DEV))
    ctx = 4096
    cache = KVCache(cfg, ctx + 64, BF16, DEV)
    for t in (*cache.kv, *(k for k in cache.index_k if k is not None)):
        t.normal_()
    hn = torch.randn(1, HIDDEN, device=DEV, dtype=BF16)
    fed = torch.randint(0, VOCAB, (1,), device=DEV)
    topk = torch.randperm(ctx, device=DEV)[: cfg.index_topk].sort().values.view(1, -1).long()
    chain = Batch(torch.tensor([ctx], device=DEV), torch.tensor([ctx + 1], device=DEV), [], [])

    def layer() -> torch.Tensor:
        return model.mtp_forward(hn, fed, chain, cache, topk)[0]

    with torch.no_grad():
        if profile:
            from bench.profile_slice import kernel_times

            times = kernel_times(layer, 20)
            print(f"-- the MTP layer's kernels (eager launches; µs a pass, launches): "
                  f"{sum(t for t, _ in times.values()):.1f} µs in all", flush=True)
            for name, (t, c) in sorted(times.items(), key=lambda kv: -kv[1][0])[:25]:
                print(f"{t:9.1f} {c:5.1f}  {name[:110]}", flush=True)
        out = {"mtp_layer_ms": graph_ms(layer, iters),
               "whole_ms": graph_ms(lambda: model.logits(layer()).argmax(dim=-1), iters),
               "split_ms": graph_ms(lambda: model.greedy_ids(layer()), iters),
               "whole_logits_ms": graph_ms(lambda: model.logits(layer()), iters),          # a drawn draft's head
               "split_logits_ms": graph_ms(lambda: model.bucket_logits(layer()), iters)}
    del model, cache
    torch.cuda.empty_cache()
    return out


def check_split(head: Linear, world: int, rows: int) -> dict:
    """Every rank's slice in turn on the same [world·rows, H] rows, combined as ``argmax_logits`` does, against the
    whole lm_head's argmax; and each slice's logits against the whole product's columns."""
    x = torch.randn(world * rows, HIDDEN, device=DEV, dtype=BF16)
    whole = F.linear(x, head.weight)
    same_logits = same_swapped = True
    for r in range(world):
        lo, hi = vocab_slice(head, r, world)
        same_logits &= torch.equal(F.linear(x, head.weight[lo:hi]), whole[:, lo:hi])
        same_swapped &= torch.equal(torch.mm(head.weight[lo:hi], x.t()).t(), whole[:, lo:hi])
    ids = first_max(torch.stack([slice_best(x, head, *vocab_slice(head, r, world)) for r in range(world)]))
    return {"rows": world * rows, "ids_equal": int((ids == whole.argmax(dim=-1)).sum()),
            "slice_logits_bit_equal": bool(same_logits), "swapped_logits_bit_equal": bool(same_swapped)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8], help="rows a rank (a draft: 1)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--profile", action="store_true", help="print the draft pass's MTP layer kernels (torch.profiler)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    a = torch.randn(2 ** 31, device=DEV, dtype=BF16)
    read_bw = a.numel() * 2 / time_ms(lambda: a.sum(dtype=torch.float32), 20) * 1e3       # bytes / s
    del a
    torch.manual_seed(0)
    head = Linear(HIDDEN, VOCAB).to(DEV, BF16)
    torch.nn.init.normal_(head.weight, std=0.02)
    checks = [check_split(head, args.world, r) for r in args.rows]
    for c in checks:
        print(f"check: {c['rows']} rows: split ids equal the whole lm_head's in {c['ids_equal']} / {c['rows']}; "
              f"slice logits bit-equal to the whole product's columns: {c['slice_logits_bit_equal']} (swapped: "
              f"{c['swapped_logits_bit_equal']})", flush=True)
    group = StepComm(SimulatedGroup(args.world), 0, args.world, torch.device(DEV))
    whole_bytes = VOCAB * HIDDEN * 2
    lo, hi = vocab_slice(head, 0, args.world)
    results = []
    for rows in args.rows:
        x = torch.randn(rows, HIDDEN, device=DEV, dtype=BF16)
        whole = graph_ms(lambda: head(x).argmax(dim=-1), args.iters)
        split = graph_ms(lambda: group.argmax_logits(x, head), args.iters)
        xs = torch.randn(args.world * rows, HIDDEN, device=DEV, dtype=BF16)          # the gathered rows
        w = head.weight[lo:hi]
        product = {"linear": graph_ms(lambda: F.linear(xs, w).argmax(dim=-1), args.iters),
                   "swapped": graph_ms(lambda: torch.mm(w, xs.t()).argmax(dim=0), args.iters)}
        results.append({"rows": rows, "world": args.world, "whole_ms": whole, "split_ms": split,
                        "slice_product_ms": product, "whole_floor_ms": whole_bytes / read_bw * 1e3,
                        "split_floor_ms": (hi - lo) * HIDDEN * 2 / read_bw * 1e3})
        r = results[-1]
        print(f"{rows} rows a rank: whole {whole * 1e3:.1f} µs (floor {r['whole_floor_ms'] * 1e3:.1f}), split over "
              f"{args.world} {split * 1e3:.1f} µs (floor {r['split_floor_ms'] * 1e3:.1f}) + 2 AG phases on the wire; "
              f"the slice's product + argmax alone: " + ", ".join(f"{k} {v * 1e3:.1f} µs" for k, v in product.items()),
              flush=True)
    lines = [f"# A greedy draft's lm_head on a rank of {args.world}: whole vs split by vocabulary",
             "", f"Read stream {read_bw / 1e12:.2f} TB/s; `PYTHONPATH=. python bench/vocab_head.py --out DIR`. The split is "
             "timed without the wire (two AG phases, ~8 µs each captured on two H200s).", "",
             "| rows a rank | whole lm_head + argmax µs | its floor | split (compute + local AG copies) µs | its floor "
             "| whole / split | the slice's product + argmax alone: F.linear / swapped (W·xᵀ) µs |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['rows']} | {r['whole_ms'] * 1e3:.1f} | {r['whole_floor_ms'] * 1e3:.1f} | "
                     f"{r['split_ms'] * 1e3:.1f} | {r['split_floor_ms'] * 1e3:.1f} | {r['whole_ms'] / r['split_ms']:.1f}× | "
                     f"{r['slice_product_ms']['linear'] * 1e3:.1f} / {r['slice_product_ms']['swapped'] * 1e3:.1f} |")
    lines += ["", "Checks (every rank's slice in turn, combined as `argmax_logits`):", ""]
    lines += [f"- {c['rows']} rows: ids equal the whole lm_head's in {c['ids_equal']} / {c['rows']}; slice logits "
              f"bit-equal to the whole product's columns: {c['slice_logits_bit_equal']} (swapped: {c['swapped_logits_bit_equal']})"
              for c in checks]
    lines += ["", "A graph step's logits on rank 0 (every row's full logits, as `sample` / `verify` read them): the whole "
              "lm_head on the rank's rows against `StepComm.bucket_logits` (the slices of every row gathered; the wire "
              "apart: the rows' AG and up to 4 AGs of the slices, ≤ 786 KB a rank each).", "",
              "| step | whole lm_head µs | split µs | whole / split |", "|---|---:|---:|---:|"]
    from scheduler.shapes import StepShape
    for kind, rows in (("span", 4), ("span", 8), ("dp", 1), ("dp", 2)):
        shape = StepShape("span", rows, rows, 0) if kind == "span" else StepShape("dp", rows, args.world * rows, None)
        group.stage(shape, rows, static=True)
        x = torch.randn(rows, HIDDEN, device=DEV, dtype=BF16)
        m = rows if kind == "span" else args.world * rows
        if not group.split_fits(m, BF16, head):
            lines.append(f"| {kind} of {rows} rows | | does not fit a phase | |")
            continue
        whole = graph_ms(lambda: head(x).float(), args.iters)
        split = graph_ms(lambda: group.bucket_logits(x, head), args.iters)
        results.append({"logits": kind, "rows": rows, "whole_ms": whole, "split_ms": split})
        lines.append(f"| {kind} of {rows} rows{' (verify, k = 3)' if kind == 'span' and rows == 4 else ''} | "
                     f"{whole * 1e3:.1f} | {split * 1e3:.1f} | {whole / split:.1f}× |")
    d = draft_pass(args.world, args.iters, args.profile)
    lines += ["", f"A chained greedy MTP draft pass on rank 0 of {args.world} (tp MoE shard, 1 row, ctx 4096, index "
              "sharing; the wire apart): the MTP layer alone "
              f"{d['mtp_layer_ms'] * 1e3:.1f} µs; with the whole lm_head's argmax {d['whole_ms'] * 1e3:.1f} µs; with "
              f"the split {d['split_ms'] * 1e3:.1f} µs ({d['whole_ms'] / d['split_ms']:.2f}× faster before the wire). A drawn "
              f"draft's pass (the row's full logits, for `pick_draft`): whole {d['whole_logits_ms'] * 1e3:.1f} µs, split "
              f"(`bucket_logits`) {d['split_logits_ms'] * 1e3:.1f} µs."]
    (out / "vocab_head.md").write_text("\n".join(lines) + "\n")
    (out / "vocab_head.json").write_text(json.dumps({"read_bw": read_bw, "results": results, "checks": checks,
                                                     "draft_pass": d},
                                                    indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
