"""The FP8 KV cache (``kv_cache_dtype: fp8``) against bf16 rows, side by side in one process, the two caches' kernels
alternated: the MLA attention (the Triton split kernel over each row's 2048 selected slots at GLM-5's widths: 64 heads,
latent 512 + rope 64; rows 1 … 2048; 1152 vs 656 bytes a key) and the indexer's scoring of a decode row's whole
context (32 heads of 128, the paged kernel with the select's first pass; 256 vs 144 bytes a key), contexts 8k … 128k.

    PYTHONPATH=. python bench/kv_fp8.py [--out bench/results/kv_fp8.md]
"""

from __future__ import annotations

import argparse
import json

import torch

from bench.decode_slice import time_ms
from glmkernels import ops
from glmkernels.reference import kv_fp8_pack, kv_fp8_unpack

DEV, BF16 = "cuda", torch.bfloat16
RKV, DR, NH, K = 512, 64, 64, 2048


def time_us(fn, iters: int = 50) -> float:
    return time_ms(fn, iters) * 1e3


def alternate(plain, packed) -> tuple[float, float]:
    """Best-of-3 medians of the bf16 launch and the packed one, alternated."""
    t: dict[str, list[float]] = {"bf16": [], "fp8": []}
    for _ in range(3):
        t["bf16"].append(time_us(plain))
        t["fp8"].append(time_us(packed))
    return min(t["bf16"]), min(t["fp8"])


def score_rows(args, g: torch.Generator) -> list[str]:
    """The indexer's paged scoring (+ the select's first pass) of decode rows over their whole contexts: bf16 keys vs
    packed FP8 keys, each row its own keys (no row reads another's from L2)."""
    from glmkernels import triton_attention as att
    ih, idd, bs = 32, 128, 64
    lines = ["", "Indexer scoring of decode rows (32 heads of 128; each row its own context's keys; paged kernel + the "
             "select's first pass; FP8: the dot of a key's e4m3 values, times its scale; median µs, best of 3 "
             "alternated rounds; GB/s = keys' bytes / time; 'equal': the scores on packed keys == on the unpacked "
             "keys, bit for bit).", "",
             "| rows | context | bf16 (µs) | FP8 (µs) | FP8 / bf16 | bf16 GB/s | FP8 GB/s | equal |",
             "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for rows, ctx in args.score_cases:
        packed = torch.empty(rows * ctx, 144, dtype=torch.uint8, device=DEV)
        for i in range(0, rows * ctx, 1 << 16):
            packed[i:i + (1 << 16)] = kv_fp8_pack(torch.randn(min(1 << 16, rows * ctx - i), idd, device=DEV,
                                                              generator=g).to(BF16), idd)
        plain = kv_fp8_unpack(packed, idd, 0, BF16)
        q = torch.randn(rows, ih, idd, device=DEV, generator=g).to(BF16)
        w = torch.randn(rows, ih, device=DEV, generator=g)
        table = torch.arange(rows * ctx // bs, device=DEV, dtype=torch.int32).view(rows, ctx // bs)
        pos = torch.full((rows,), ctx - 1, device=DEV)

        def run(c):
            return att._score(q, w, c, table, None, None, pos, ctx, bs, idd ** -0.5, select_k=2048)
        same = torch.equal(run(packed), run(plain))
        bf, f8 = alternate(lambda: run(plain), lambda: run(packed))
        lines.append(f"| {rows} | {ctx} | {bf:.1f} | {f8:.1f} | {f8 / bf:.2f}× | "
                     f"{rows * ctx * 256 / bf / 1e3:.0f} | {rows * ctx * 144 / f8 / 1e3:.0f} | {same} |")
        print(lines[-1], flush=True)
        del packed, plain
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128, 2048])
    ap.add_argument("--slots", type=int, default=1 << 20)
    ap.add_argument("--score-cases", type=lambda s: tuple(map(int, s.split("x"))), nargs="+",
                    default=[(1, 8192), (1, 32768), (1, 131072), (8, 32768), (8, 131072)], help="ROWSxCONTEXT")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ops.configure("auto", DEV)
    att = ops.impl("mla_sparse_attention", "triton")
    g = torch.Generator(device=DEV).manual_seed(0)
    packed = torch.empty(args.slots, 656, dtype=torch.uint8, device=DEV)
    for i in range(0, args.slots, 1 << 16):
        n = min(1 << 16, args.slots - i)
        packed[i:i + n] = kv_fp8_pack(torch.randn(n, RKV + DR, device=DEV, generator=g).to(BF16), RKV)
    plain = torch.empty(args.slots, RKV + DR, dtype=BF16, device=DEV)
    for i in range(0, args.slots, 1 << 16):
        plain[i:i + (1 << 16)] = kv_fp8_unpack(packed[i:i + (1 << 16)], RKV, DR, BF16)
    rows = []
    for N in args.rows:
        q_lat = torch.randn(N, NH, RKV, device=DEV, generator=g).to(BF16)
        q_rope = torch.randn(N, NH, DR, device=DEV, generator=g).to(BF16)
        sel = torch.randint(0, args.slots, (N, K), device=DEV, generator=g)
        diff = (att(q_lat, q_rope, packed, sel, 0.1).float() - att(q_lat, q_rope, plain, sel, 0.1).float()).abs()
        same = f"{diff.max().item():.2g}"
        bf, f8 = alternate(lambda: att(q_lat, q_rope, plain, sel, 0.1), lambda: att(q_lat, q_rope, packed, sel, 0.1))
        rows.append({"rows": N, "bf16_us": bf, "fp8_us": f8, "equal": same,
                     "bf16_GBps": N * K * 1152 / bf / 1e3, "fp8_GBps": N * K * 656 / f8 / 1e3})
        print(rows[-1], flush=True)
    lines = [f"MLA sparse attention, {torch.cuda.get_device_name()}: {NH} heads, {K} selected of {args.slots:,} slots a "
             "row, bf16 queries; the cache's rows bf16 (1152 bytes) or packed FP8 (656). Median µs of 50 launches, the "
             "best of 3 alternated rounds; GB/s = the gathered rows' bytes / time; max |Δ|: between the FP8 kernel's "
             "output and the bf16 kernel's on the unpacked rows (two compiled kernels: an MMA order apart).", "",
             "| rows | bf16 (µs) | FP8 (µs) | FP8 / bf16 | bf16 GB/s | FP8 GB/s | max |Δ| |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['rows']} | {r['bf16_us']:.1f} | {r['fp8_us']:.1f} | {r['fp8_us'] / r['bf16_us']:.2f}× | "
                     f"{r['bf16_GBps']:.0f} | {r['fp8_GBps']:.0f} | {r['equal']} |")
    lines += score_rows(args, g)
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(args.out.removesuffix(".md") + ".json", "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
