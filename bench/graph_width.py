"""What a graph step's block-table width costs, to choose how many widths a start-up warm-up captures per octave
(``scheduler.shapes.WIDTHS_PER_OCTAVE``): each width is one captured graph per bucket, while a wider table than the
step's longest request only pads the indexer's scoring and select with keys past the rows' positions (-inf).

1. The paged indexer alone (32 heads × 128, bf16 keys, 16-token blocks, top 2048; CUDA-graph replay, median) at
   contexts just past a power of two — the most padding for 1 and 2 widths an octave — at the exact width and at
   the width 4, 2 and 1 widths an octave round it to; 1 and 8 rows.
2. The engine on the GLM-5.2-width slice (``bench/step_host.py``'s: 1 dense + 3 MoE layers, 3 with their own
   indexer, FP8 random weights): one request's decode steps (median wall) after ``--ctx`` prompts, per setting.
3. The warm-up of every width up to the slice engine's ``max_model_len`` at each setting: its graph steps and
   seconds (kernels compiled already; capture only), and the graph steps a GLM-5.2 deployment (8 ranks, MTP 3,
   262144 tokens) would capture.

    PYTHONPATH=. python bench/graph_width.py [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from bench.cluster_slice import slice_config
from bench.decode_slice import graph_ms
from bench.step_host import decode, prefill
from cluster.config import EngineConfig
from cluster.engine import warm_keys
from cluster.local import build_local_engine
from glmkernels.triton_attention import indexer_topk_paged
from scheduler import shapes

BS, TOPK, IH, IDD = 16, 2048, 32, 128
SETTINGS = (4, 2, 1)                      # widths an octave: before this session 4


def width_of(blocks: int, per_octave: int) -> int:
    shapes.WIDTHS_PER_OCTAVE = per_octave
    return shapes.graph_width(blocks)


def indexer_table(contexts: list[int]) -> list[str]:
    g = torch.Generator(device="cuda").manual_seed(0)
    lines = ["| context | rows | exact width | " + " | ".join(f"{p} an octave" for p in SETTINGS) + " |",
             "|---:|---:|---:|" + "---:|" * len(SETTINGS)]
    for ctx in contexts:
        blocks = -(-ctx // BS)
        widths = [blocks] + [width_of(blocks, p) for p in SETTINGS]
        k_cache = torch.randn(max(widths) * BS, IDD, device="cuda", generator=g).to(torch.bfloat16)
        for rows in (1, 8):
            table = torch.stack([torch.randperm(max(widths), device="cuda", generator=g) for _ in range(rows)]).int()
            q = torch.randn(rows, IH, IDD, device="cuda", generator=g).to(torch.bfloat16)
            w = torch.randn(rows, IH, device="cuda", generator=g)
            positions = torch.full((rows,), ctx - 1, device="cuda")
            cells = []
            for width in widths:
                args = (q, w, k_cache, table[:, :width], BS, positions, TOPK, IDD ** -0.5)
                cells.append(f"{graph_ms(lambda a=args: indexer_topk_paged(*a), 50) * 1e3:.1f} µs ({width})")
            lines.append(f"| {ctx} | {rows} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    return lines


def engine_rows(contexts: list[int], tokens: int, device: str) -> tuple[list[str], list[dict]]:
    """Decode steps of one request per (context, setting), in one engine; then a warm-up of every width per setting."""
    with tempfile.TemporaryDirectory() as tmp:
        model_cfg = slice_config(4, device == "cpu")
        (Path(tmp) / "config.json").write_text(json.dumps(model_cfg))
        cfg = EngineConfig(model=tmp, load_format="dummy", device=device, kv_cache_tokens=max(contexts) + 1024,
                           max_num_batched_tokens=2048, max_num_seqs=8, warmup_tokens=0,
                           cuda_graphs="eager" if device == "cpu" else "auto")
        print("building the engine ...", flush=True)
        engine, _ = build_local_engine(cfg, progress=False)
    vocab = model_cfg["vocab_size"]
    lines = ["| context | " + " | ".join(f"{p} an octave" for p in SETTINGS) + " |", "|---:|" + "---:|" * len(SETTINGS)]
    rows = []
    for ctx in contexts:
        cells = []
        for p in SETTINGS:
            shapes.WIDTHS_PER_OCTAVE = p
            prefill(engine, f"warm-{ctx}-{p}", ctx, vocab, tokens)          # captures this setting's widths
            decode(engine, "warm")
            prefill(engine, f"timed-{ctx}-{p}", ctx, vocab, tokens)
            ms = statistics.median(decode(engine, "timed"))
            rows.append({"ctx": ctx, "per_octave": p, "step_ms": ms})
            cells.append(f"{ms:.3f} ms")
        lines.append(f"| {ctx} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    header = ("| widths an octave | graph steps to the slice's max_model_len | capture s "
              "| GLM-5.2, 8 ranks, MTP 3, 262144 tokens: graph steps |")
    lines += ["", header, "|---:|---:|---:|---:|"]
    for p in SETTINGS:
        shapes.WIDTHS_PER_OCTAVE = p
        engine.executor.runner.graphs._graphs.clear()          # every capture again (kernels stay compiled)
        if engine.executor.runner.draft_graphs is not None:
            engine.executor.runner.draft_graphs._graphs.clear()
        done = engine.warm_up(engine.config.max_model_len)
        glm = len(warm_keys(8, True, 3, shapes.graph_widths(262144 // BS), 128 // 8))
        lines.append(f"| {p} | {done['graph_steps']} | {done['capture_s']:.1f} | {glm} |")
        print(lines[-1], flush=True)
    return lines, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--contexts", type=int, nargs="+", default=[4097, 32769, 131073])
    ap.add_argument("--engine-contexts", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--device", default="cuda", help="cpu: the engine part on the tiny model's widths (plumbing)")
    ap.add_argument("--indexer-only", action="store_true", help="part 1 alone (e.g. another revision's kernels)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Graph widths ({torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'})", ""]
    if args.device == "cuda":
        lines += ["The paged indexer, µs a call (table width in blocks of 16 tokens):", ""]
        lines += indexer_table(args.contexts)
    rows = []
    if not args.indexer_only:
        title = f"The slice's engine step (median wall of {args.tokens} decode steps after a prompt of the context):"
        lines += ["", title, ""]
        engine_lines, rows = engine_rows(args.engine_contexts, args.tokens, args.device)
        lines += engine_lines
    (out / "graph_width.md").write_text("\n".join(lines) + "\n")
    (out / "graph_width.json").write_text(json.dumps(rows))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
