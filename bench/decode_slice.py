"""Decode step time on a GLM-5.2-width slice (reference §6.2 widths, 1 dense + 3 MoE layers, FP8 weights)
for ``kernels: reference`` vs ``auto`` (eager and CUDA-graph replay), beside the byte floor and HF.

Weights are random and made directly on the GPU (``models.loader.dummy_model``, the engine's
``load_format: dummy``): the Linears an FP8 checkpoint quantizes are FP8 — no checkpoint is written.
The KV cache is filled with random values; each step decodes one row per request (distinct requests)
at context 4k or 32k, so the indexer selects 2048 of the keys. A step = model forward + lm_head logits.

Byte floor = bytes the step must read / the measured read-stream bandwidth: every weight of the step
(routed experts only those actually hit, counted on the step's own routing; embedding only the rows
used) + the MLA cache rows selected (576 values) + the indexer keys scored (128 values, full layers).

HF transformers runs the same widths with bf16 random weights and eager attention, at each of the full slice's
(ctx, rows) cases: its cache prefilled in chunks, then one decode step at a time, the cache cropped back after
each. A case whose HF cache cannot fit beside HF's weights is reported as not run, with the estimate.

    PYTHONPATH=. python bench/decode_slice.py --out bench/results
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from glmkernels import ops
from glmkernels.reference import kv_fp8_pack
from glmkernels.triton_utils import pdl_mode
from models.cache import KVCache, build_batch
from models.config import ModelConfig
from models.glm5 import GlmForCausalLM, MoeShard
from models.loader import dummy_model
from scheduler.scheduler import ScheduledSeq
from scheduler.shapes import graph_width, next_pow2
from workers.graphs import DecodeGraphs, capture_graph

DEV, BF16 = "cuda", torch.bfloat16
KV_FP8 = False          # --kv-cache-dtype fp8: cache rows packed (MLA's 656 bytes instead of 1152, keys' 144 for 256)
BLOCK = 64                     # KV block size of the bench's paged cache
SLICE = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "vocab_size": 154880,
         "hidden_size": 6144, "intermediate_size": 12288, "moe_intermediate_size": 2048, "num_hidden_layers": 4,
         "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 2048, "kv_lora_rank": 512,
         "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "qk_head_dim": 256, "v_head_dim": 256, "head_dim": 64,
         "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
         "routed_scaling_factor": 2.5, "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
         "first_k_dense_replace": 1, "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
         "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
         "indexer_types": ["full", "full", "full", "shared"], "indexer_rope_interleave": True, "rope_interleave": True,
         "num_nextn_predict_layers": 0, "rope_parameters": {"rope_theta": 8000000, "rope_type": "default"},
         "max_position_embeddings": 1048576, "rms_norm_eps": 1e-05, "hidden_act": "silu", "attention_bias": False,
         "tie_word_embeddings": False, "dtype": "bfloat16",
         "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                 "weight_block_size": [128, 128]}}


def build_model(cfg: ModelConfig, shard: MoeShard) -> GlmForCausalLM:
    """This shard of the slice with random FP8 weights, made on the GPU (``load_format: dummy``)."""
    return dummy_model(cfg, BF16, DEV, shard)


class OtherRanks:
    """One rank's MLP phases in a step of ``world`` ranks (data-parallel attention, tp MoE), without the
    communication: AG appends the other ranks' rows — fixed random activations, as their own tokens, routed
    apart from ours — and RS keeps this rank's rows (summing the ranks' partials is the comm's, timed in
    bench/comm_latency.py). Graph-capturable."""

    def __init__(self, world: int, hidden: int, max_rows: int = 8):
        self.others = torch.randn((world - 1) * max_rows, hidden, device=DEV, dtype=BF16)
        self.world = world

    def all_gather(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.cat([rows, self.others[:(self.world - 1) * rows.shape[0]]])

    def reduce_scatter(self, partial: torch.Tensor) -> torch.Tensor:
        return partial[:partial.shape[0] // self.world]


def split_head(rows: int):
    """Rank 0 of a dp 8 step of ``rows`` rows a rank, for ``StepComm.bucket_logits`` without the wire (the other ranks'
    rows zero, ``bench/vocab_head.py``'s ``SimulatedGroup``); where the slices overflow a phase, the whole lm_head."""
    from bench.vocab_head import SimulatedGroup
    from scheduler.shapes import StepShape
    from workers.worker import StepComm

    group = StepComm(SimulatedGroup(8), 0, 8, torch.device(DEV))
    group.stage(StepShape("dp", rows, 8 * rows, None), rows, static=True)
    return group


def step_bytes(model: GlmForCausalLM, cfg: ModelConfig, hit: list[int], rows: int, ctx: int) -> int:
    first_moe = next(layer for layer in range(cfg.num_hidden_layers) if cfg.is_moe(layer))
    per_expert = sum(p[0].numel() * p.element_size() for n, p in model.named_parameters()
                     if n.startswith(f"model.layers.{first_moe}.mlp.experts."))
    total = 0
    for name, p in model.named_parameters():
        if ".mlp.experts." in name:
            continue
        if "embed_tokens" in name:
            total += rows * cfg.hidden_size * p.element_size()
            continue
        total += p.numel() * p.element_size()
    total += sum(hit) * per_expert
    K = min(cfg.index_topk, ctx + 1)
    n_full = sum(cfg.has_indexer(layer) for layer in range(cfg.num_hidden_layers))
    row, key = ((KVCache.row_bytes(cfg, BF16), KVCache.key_bytes(cfg, BF16)) if KV_FP8
                else (cfg.kv_cache_dim * 2, cfg.index_head_dim * 2))
    total += rows * cfg.num_hidden_layers * K * row + rows * n_full * (ctx + 1) * key
    return total


def time_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def graph_ms(step, iters: int, chained: bool = False) -> float:
    """Capture ``step`` in a CUDA graph (after warm-up on a side stream) and time its replays: each alone
    (median; a decode step, synchronized after), or ``chained``: the mean of ``iters`` back-to-back replays
    (median of 5 such runs), where the launch of a replay hides behind the one before — for kernel micro-
    benchmarks, whose graphs are many launches of one kernel and whose per-replay host launch is not theirs."""
    graph, _ = capture_graph(step, warmup=3)
    if not chained:
        return time_ms(graph.replay, iters)
    return time_ms(lambda: [graph.replay() for _ in range(iters)], 5) / iters


def decode_graphs(model, cache: KVCache) -> DecodeGraphs:
    """The runner's graph path over the bench cache; its last slot is the pad slot (keep it out of requests)."""
    return DecodeGraphs(model, cache, BLOCK, cache.num_slots - 1, next_pow2(cache.num_slots // BLOCK),
                        torch.device(DEV), capture=True)


def stage_ms(graphs: DecodeGraphs, seqs, bucket: int, width: int) -> float:
    """Median host time to copy a step into the graph buffers (the runner does not overlap it)."""
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        graphs.stage(seqs, bucket, width)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_model(model, cfg, cache, label, ctxs, rows_list, modes, read_bw, results):
    graphs = decode_graphs(model, cache)
    for ctx in ctxs:
        for rows in rows_list:
            per_req = cache.num_slots // max(8, rows) // BLOCK     # blocks each request may hold
            tables = [list(range(i * per_req, i * per_req + -(-(ctx + 1) // BLOCK))) for i in range(rows)]
            batch = build_batch([(ctx, 1, t) for t in tables], BLOCK, DEV)
            ids = torch.randint(0, cfg.vocab_size, (rows,), device=DEV)
            seqs = [ScheduledSeq(f"r{i}", (int(ids[i]),), ctx, tuple(t), True, 0) for i, t in enumerate(tables)]
            hits: list[int] = []
            router = ops._active["router_topk"]

            def spy(*a, **k):
                idx, w = router(*a, **k)
                hits.append(int(idx.unique().numel()))
                return idx, w
            ops._active["router_topk"] = spy
            with torch.no_grad():
                model(ids, batch, cache)
            ops._active["router_topk"] = router
            nbytes = step_bytes(model, cfg, hits, rows, ctx)
            row = {"slice": label, "ctx": ctx, "rows": rows, "experts_hit": hits, "bytes": nbytes,
                   "floor_ms": nbytes / read_bw * 1e3}

            def step():
                with torch.no_grad():
                    return model.logits(model(ids, batch, cache))

            def graph_step():                          # the runner's path: replay, then the eager lm_head
                with torch.no_grad():
                    return model.logits(graphs.run(rows, width))

            def split_step():                          # a group's path: the lm_head split by vocabulary, no wire
                with torch.no_grad():
                    return split.bucket_logits(graphs.run(rows, width), model.lm_head)
            split = split_head(rows)
            width = graph_width(len(tables[0]))
            row["stage_ms"] = stage_ms(graphs, seqs, rows, width)
            for mode in modes:
                ops.configure("reference" if mode == "reference" else "auto", DEV)
                if mode == "auto_graph":
                    try:
                        t0 = time.perf_counter()
                        graph_step()                       # warm-up + capture of this (rows, width)
                        torch.cuda.synchronize()
                        row["capture_ms"] = (time.perf_counter() - t0) * 1e3
                        row[mode] = time_ms(graph_step, 50)
                    except Exception as e:  # noqa: BLE001 — report, keep benchmarking
                        row[mode] = None
                        row["graph_error"] = repr(e)[:200]
                elif mode == "auto_graph_split":
                    if label.startswith("rank of dp"):
                        graph_step()                       # capture, if auto_graph did not
                        row[mode] = time_ms(split_step, 50)
                        row["floor_split_ms"] = row["floor_ms"] - 7 / 8 * model.lm_head.weight.nbytes / read_bw * 1e3
                else:
                    row[mode] = time_ms(step, 10 if mode == "reference" else 30)
            ops.configure("reference", DEV)
            print(json.dumps(row), flush=True)
            results.append(row)


HF_CASES = [(4096, 1), (4096, 8), (32768, 1), (32768, 8)]      # (ctx, rows), the full slice's cases


def _hf_cache_bytes(pkv) -> int:
    """Bytes held by an HF cache's layers (keys, values, indexer keys — whatever this transformers stores)."""
    return sum(v.numel() * v.element_size() for layer in getattr(pkv, "layers", [])
               for v in vars(layer).values() if isinstance(v, torch.Tensor))


def _hf_prefill(hf, rows: int, ctx: int):
    """HF's cache for ``rows`` random prompts of ``ctx`` tokens, prefilled in chunks small enough that eager
    attention's scores (bf16 + fp32 softmax, 64 heads) and the indexer's (fp32, 32 heads) stay within ~16 GB."""
    chunk = 128
    while chunk < ctx and rows * (2 * chunk) * ctx * 900 <= 16e9:
        chunk *= 2
    pkv = None
    for start in range(0, ctx, chunk):
        ids = torch.randint(0, 1000, (rows, min(chunk, ctx - start)), device=DEV)
        pkv = hf(ids, past_key_values=pkv, use_cache=True).past_key_values
    return pkv


def bench_hf(experts: str | None, cases=HF_CASES) -> tuple[str, dict]:
    """HF transformers on the same widths, bf16 random weights (timing only), eager attention; ``experts``
    is HF's experts implementation ("eager" = the oracle's per-expert loop; None = HF's default for the
    device, grouped_mm on CUDA). One decode step (``rows`` rows at context ``ctx``, its cache cropped back
    after each) per case: (median, min, max) ms of 6 after 2 warm-up steps, or why the case did not run
    (a cache that cannot fit beside the weights is not attempted)."""
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    hf_cfg = GlmMoeDsaConfig(**{k: v for k, v in SLICE.items() if k not in ("architectures", "quantization_config")})
    torch.set_default_dtype(BF16)
    kwargs = {} if experts is None else {"experts_implementation": experts}
    with torch.device(DEV):
        hf = GlmMoeDsaForCausalLM._from_config(hf_cfg, attn_implementation="eager", **kwargs).eval()
    impl = hf.config._experts_implementation
    torch.set_default_dtype(torch.float32)
    out: dict = {}
    with torch.no_grad():
        per_token = _hf_cache_bytes(_hf_prefill(hf, 1, 256)) / 256
        torch.cuda.empty_cache()
        for ctx, rows in cases:
            need = per_token * rows * (ctx + 1) * 1.25 + 20e9    # + one layer's cat copy, + prefill scores
            free = torch.cuda.mem_get_info()[0]
            if need > free:
                out[(ctx, rows)] = (f"not run: HF's cache ({per_token / 1024:.0f} KiB a token) needs ~{need / 1e9:.0f} "
                                    f"GB, {free / 1e9:.0f} GB free beside its bf16 weights")
                continue
            pkv = None
            try:
                pkv = _hf_prefill(hf, rows, ctx)
                nxt = torch.randint(0, 1000, (rows, 1), device=DEV)
                times = []
                for i in range(8):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    hf(nxt, past_key_values=pkv, use_cache=True)
                    b.record()
                    b.synchronize()
                    pkv.crop(-1)                   # drop the step's token: every step at context ctx
                    if i >= 2:
                        times.append(a.elapsed_time(b))
                out[(ctx, rows)] = (statistics.median(times), min(times), max(times))
            except torch.OutOfMemoryError:
                out[(ctx, rows)] = "out of GPU memory"
            del pkv
            torch.cuda.empty_cache()
            print(f"HF experts {impl}, ctx {ctx} x {rows}: {out[(ctx, rows)]}", flush=True)
    del hf
    torch.cuda.empty_cache()
    return impl, out


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def write_report(results, hf, read_bw, out: Path) -> None:
    cols = {impl: cases for impl, cases in hf.items() if "error" not in cases}
    lines = [f"# Decode step on a GLM-5.2-width slice ({torch.cuda.get_device_name()}, torch {torch.__version__})",
             "", "1 dense + 3 MoE layers (indexer full,full,full,shared), FP8 block weights, bf16 activations, "
             f"{'FP8 (packed rows: MLA 656 bytes, indexer keys 144)' if KV_FP8 else 'bf16'} KV, index_topk 2048; step = forward + lm_head (vocab 154880). Floor = bytes read / "
             f"{read_bw / 1e12:.2f} TB/s (measured read stream). 'shard' = MoE and dense MLP at 1/8 width "
             "(one rank of 8, tp). 'rank of dp 8' = that shard as one rank of an 8-rank step with 1, 8, 16 or 32 rows "
             "a rank: "
             "attention and lm_head over its own rows, the MoE and dense MLP over all 8 ranks' rows (the other 7 "
             "ranks' random, routed apart), the AG/RS communication itself not included. Times in ms (median, CUDA "
             "events). 'auto (graph)' is the runner's decode path: "
             "a replay of the step's CUDA graph (workers/graphs.py, paged block tables) + the eager lm_head; "
             "'stage' is the host time to copy the step into the graph's buffers (not overlapped); 'capture' the "
             "one-time warm-up + capture of that graph. Programmatic dependent launch of our kernels "
             f"(GLMSERVE_PDL): {pdl_mode()}.", "",
             "| slice | ctx | rows | experts hit/layer | MB read | floor | reference | auto (eager) | auto (graph) "
             "| graph / floor | stage (host) | capture |" + "".join(f" HF ({i}) | HF ({i}) / graph | HF ({i}) / floor |"
                                                         for i in cols),
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|---:|---:|" * len(cols)]
    notes = []
    for r in results:
        g = r.get("auto_graph")
        ratio = "—" if g is None else f"{g / r['floor_ms']:.2f}×"
        line = (f"| {r['slice']} | {r['ctx']} | {r['rows']} | {r['experts_hit']} | {r['bytes'] / 1e6:.0f} | "
                f"{r['floor_ms']:.2f} | {_ms(r.get('reference'))} | {_ms(r.get('auto'))} | {_ms(g)} | {ratio} | "
                f"{_ms(r.get('stage_ms'))} | {_ms(r.get('capture_ms'))} |")
        for impl, cases in cols.items():
            t = cases.get((r["ctx"], r["rows"])) if r["slice"] == "full" else None
            if isinstance(t, tuple):
                line += (f" {t[0]:.1f} ({t[1]:.1f}–{t[2]:.1f}) | {'—' if g is None else f'{t[0] / g:.1f}×'} | "
                         f"{t[0] / r['floor_ms']:.1f}× |")
            else:
                line += " — | — | — |"
                if t is not None:
                    notes.append(f"HF ({impl}) at {r['ctx']} × {r['rows']}: {t}")
        lines.append(line)
    lines += ["", "HF transformers (same widths and layers, bf16 random weights, eager attention, its cache prefilled in "
              "chunks; experts 'eager' is the oracle's per-expert loop, the other HF's default on CUDA): median ms of "
              "6 steps (min–max), the full slice only; 'HF / graph' = how many times faster ours is; 'HF / floor' = how "
              "many times faster a step at the byte floor would be: no kernel can be faster than HF by more."]
    lines += [f"- {n}" for n in notes] + [f"- HF ({impl}): {c['error']}" for impl, c in hf.items() if "error" in c]
    split = [r for r in results if r.get("auto_graph_split") is not None]
    if split:
        lines += ["", "A rank of dp 8 with the lm_head split by vocabulary (`auto_graph_split`: `StepComm.bucket_logits`, "
                  "1/8 of the lm_head a rank, the AG phases' wire not included; past 8 rows a rank the slices would take over 4 "
                  "phases and the whole lm_head runs): " + "; ".join(
                      f"{r['rows']} rows a rank {r['auto_graph_split']:.2f} ms (whole lm_head {_ms(r.get('auto_graph'))}, "
                      f"floor {r['floor_split_ms']:.2f})" for r in split) + "."]
    (out / "decode_slice.md").write_text("\n".join(lines) + "\n")
    hf_json = {impl: {f"{k[0]}x{k[1]}" if isinstance(k, tuple) else k: v for k, v in c.items()} for impl, c in hf.items()}
    (out / "decode_slice.json").write_text(json.dumps({"results": results, "hf": hf_json, "read_Bps": read_bw},
                                                      indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(11, 4.5))
        labels = [f"{r['slice']}\n{r['ctx'] // 1024}k×{r['rows']}" for r in results]
        xs = range(len(results))
        series = [("byte floor", [r["floor_ms"] for r in results]),
                  ("auto (graph)", [r.get("auto_graph") or 0 for r in results]),
                  ("auto (eager)", [r.get("auto") or 0 for r in results]),
                  ("reference", [r.get("reference") or 0 for r in results])]
        for impl, cases in cols.items():           # HF where it ran (the full slice)
            ts = [cases.get((r["ctx"], r["rows"])) if r["slice"] == "full" else None for r in results]
            series.append((f"HF ({impl} experts)", [t[0] if isinstance(t, tuple) else 0 for t in ts]))
        w = 0.8 / len(series)
        for i, (name, ys) in enumerate(series):
            ax.bar([x + w * i - 0.4 + w / 2 for x in xs], ys, w, label=name)
        ax.set_yscale("log")
        ax.set_ylabel("step time (ms)")
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "decode_slice.png", dpi=110)
    except Exception as e:  # noqa: BLE001
        print("plot failed:", e)
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--modes", nargs="+", default=["reference", "auto", "auto_graph"],
                    help="paths to time (the shard slice takes the non-reference ones; auto_graph_split: a rank of dp 8 "
                         "with the lm_head split by vocabulary)")
    ap.add_argument("--no-shard", action="store_true", help="the full slice only (as --slices full)")
    ap.add_argument("--slices", nargs="+", choices=["full", "shard", "dp"], default=["full", "shard", "dp"],
                    help="which slices to time: full width, the tp shard, the shard as a rank of dp 8")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    args = ap.parse_args()
    global KV_FP8
    KV_FP8 = args.kv_cache_dtype == "fp8"
    slices = ["full"] if args.no_shard else args.slices
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    a = torch.randn(2 ** 31, device=DEV, dtype=BF16)
    read_bw = a.numel() * 2 / time_ms(lambda: a.sum(dtype=torch.float32), 20) * 1e3
    del a
    cfg = ModelConfig.from_dict(dict(SLICE))
    results: list[dict] = []
    cache = KVCache(cfg, 8 * (32768 + BLOCK) + BLOCK, BF16, DEV, fp8=KV_FP8)     # + a block for the pad slot
    for t in cache.kv + [k for k in cache.index_k if k is not None]:
        if t.dtype != torch.uint8:
            t.normal_()
            continue
        width, packed = ((cfg.kv_cache_dim, cfg.kv_lora_rank) if any(t is kv for kv in cache.kv)
                         else (cfg.index_head_dim, cfg.index_head_dim))
        for i in range(0, t.shape[0], 65536):                                # packed rows of random values
            n = min(65536, t.shape[0] - i)
            t[i:i + n] = kv_fp8_pack(torch.randn(n, width, device=DEV, dtype=BF16), packed)
    if "full" in slices:
        model = build_model(cfg, MoeShard())
        bench_model(model, cfg, cache, "full", [4096, 32768], [1, 8], args.modes, read_bw, results)
        del model
        torch.cuda.empty_cache()
    if "shard" in slices or "dp" in slices:
        shard = build_model(cfg, MoeShard(0, 8, "tp"))
        modes = [m for m in args.modes if m != "reference"]
        if "shard" in slices:
            bench_model(shard, cfg, cache, "shard 1/8", [4096], [1, 8], modes, read_bw, results)
        if "dp" in slices:
            shard.set_comm(OtherRanks(8, cfg.hidden_size, 32))     # one rank of 8, 1–32 rows each: MoE over 8–256
            bench_model(shard, cfg, cache, "rank of dp 8", [4096], [1, 8, 16, 32], modes, read_bw, results)
        del shard
    del cache
    torch.cuda.empty_cache()
    hf: dict = {}                              # experts implementation -> {(ctx, rows): times or why not}
    if not args.no_hf:
        for experts in ("eager", None):
            try:
                impl, cases = bench_hf(experts)
                hf[impl] = cases
            except Exception as e:  # noqa: BLE001 — report, keep the rest of the table
                hf[f"{experts or 'default'} (failed)"] = {"error": repr(e)[:300]}
    write_report(results, hf, read_bw, out)


if __name__ == "__main__":
    main()
