"""The FP8 KV cache's attention (``kv_cache_dtype: fp8``) against bf16 rows, side by side: the Triton split kernel over
each row's 2048 selected slots at GLM-5's widths (64 heads, latent 512 + rope 64), rows 1 … 2048, the two caches'
kernels alternated in one process. The bytes column is the rows' gathered cache bytes (1152 vs 656 a key).

    PYTHONPATH=. python bench/kv_fp8.py [--out bench/results/kv_fp8.md]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from glmkernels import ops
from glmkernels.reference import kv_fp8_pack, kv_fp8_unpack

DEV, BF16 = "cuda", torch.bfloat16
RKV, DR, NH, K = 512, 64, 64, 2048


def time_us(fn, iters: int = 50) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128, 2048])
    ap.add_argument("--slots", type=int, default=1 << 20)
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
        same = torch.equal(att(q_lat, q_rope, packed, sel, 0.1), att(q_lat, q_rope, plain, sel, 0.1))
        t = {"bf16": [], "fp8": []}
        for _ in range(3):                              # alternated: the clock and the other's cache state alike
            t["bf16"].append(time_us(lambda: att(q_lat, q_rope, plain, sel, 0.1)))
            t["fp8"].append(time_us(lambda: att(q_lat, q_rope, packed, sel, 0.1)))
        bf, f8 = min(t["bf16"]), min(t["fp8"])
        rows.append({"rows": N, "bf16_us": bf, "fp8_us": f8, "equal": same,
                     "bf16_GBps": N * K * 1152 / bf / 1e3, "fp8_GBps": N * K * 656 / f8 / 1e3})
        print(rows[-1], flush=True)
    lines = [f"MLA sparse attention, {torch.cuda.get_device_name()}: {NH} heads, {K} selected of {args.slots:,} slots a "
             "row, bf16 queries; the cache's rows bf16 (1152 bytes) or packed FP8 (656). Median µs of 50 launches, "
             "the best of 3 alternated rounds; GB/s = the gathered rows' bytes / time; 'equal': the FP8 kernel's output "
             "== the bf16 kernel's on the unpacked rows, bit for bit.", "",
             "| rows | bf16 (µs) | FP8 (µs) | FP8 / bf16 | bf16 GB/s | FP8 GB/s | equal |", "|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['rows']} | {r['bf16_us']:.1f} | {r['fp8_us']:.1f} | {r['fp8_us'] / r['bf16_us']:.2f}× | "
                     f"{r['bf16_GBps']:.0f} | {r['fp8_GBps']:.0f} | {r['equal']} |")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(args.out.removesuffix(".md") + ".json", "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
