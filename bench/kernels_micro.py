"""Micro-benchmark of every Triton kernel vs its reference, against the measured ceilings of the card.

Ceilings are measured first in the same process: device-to-device copy (bytes read + written), a
read-only stream (``sum`` of a 4 GB bf16 tensor: the read bandwidth the decode byte floor uses), and an
8192³ bf16 GEMM. Each kernel reports its median time (CUDA events, ``triton.testing.do_bench``, which
flushes L2 before every call but, for a kernel of a few µs, also counts the host's launch), its device
time in a CUDA graph (back-to-back launches over copies of the inputs that together exceed L2, so each
launch reads HBM as a decode step does; the GB/s and % columns use it), the bytes it must move (each input
read once, output written once) as GB/s, and FLOP/s where it matters.

    PYTHONPATH=. python bench/kernels_micro.py --out bench/results
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
from triton.testing import do_bench

from bench.decode_slice import graph_ms
from glmkernels import ops, reference

DEV, BF16 = "cuda", torch.bfloat16
FP8 = torch.float8_e4m3fn


def t_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def clone(a):
    """A copy of one op argument at its own address: tensors keep their strides (a strided view stays one),
    modules (kv_b) are deep-copied; other values are shared."""
    if isinstance(a, torch.Tensor):
        return a.new_empty_strided(a.shape, a.stride()).copy_(a)
    if isinstance(a, torch.nn.Module):
        return copy.deepcopy(a)
    return a


def device_ms(fn, args: tuple, nbytes: int, reps: int = 10) -> float | None:
    """Device time of one call of ``fn``: a CUDA graph of calls over clones of ``args`` (as many as make
    ≥ 256 MB of inputs, so none is served from L2), replayed back to back (the host launch of a replay hidden
    behind the one before); None if the op cannot be captured."""
    copies = [args] + [tuple(clone(a) for a in args) for _ in range(min(63, (256 << 20) // max(1, nbytes)))]
    try:
        return graph_ms(lambda: [fn(*a) for a in copies], reps, chained=True) / len(copies)
    except Exception as e:                       # an op that syncs the host or allocates mid-capture
        print(f"  (no graph: {type(e).__name__}: {str(e)[:80]})")
        torch.cuda.synchronize()
        return None


def ceilings() -> dict[str, float]:
    a = torch.randn(2 ** 31, device=DEV, dtype=BF16)                              # 4.3 GB
    b = torch.empty_like(a)
    copy = 2 * a.numel() * 2 / t_ms(lambda: b.copy_(a)) / 1e9                     # TB/s (ms → 1e-3)
    read = a.numel() * 2 / t_ms(lambda: a.sum(dtype=torch.float32)) / 1e9
    del a, b
    m = torch.randn(8192, 8192, device=DEV, dtype=BF16)
    gemm = 2 * 8192 ** 3 / t_ms(lambda: m @ m) / 1e9                              # TFLOP/s
    return {"copy_TBps": copy, "read_TBps": read, "bf16_gemm_TFLOPs": gemm}


def rand_fp8(*shape):
    w8 = (torch.randn(*shape, device=DEV) * 100).clamp(-448, 448).to(FP8)
    return w8, torch.rand(*shape[:-2], -(-shape[-2] // 128), -(-shape[-1] // 128), device=DEV) * 1e-3


def kv_b_proj(nh: int, dn: int, dv: int, rkv: int):
    """An FP8 kv_b_proj as the model holds it (its reference path dequantizes once and keeps the result)."""
    from models.glm5 import Linear
    kv_b = Linear(rkv, nh * (dn + dv)).to(DEV)
    kv_b.to_fp8()
    kv_b.weight.data, kv_b.weight_scale_inv.data = rand_fp8(nh * (dn + dv), rkv)
    return kv_b


def cases():
    """(name, op, args builder, bytes, flops)."""
    out = []
    decode = [(576, 6144, "kv_a"), (16384, 2048, "q_b"), (6144, 16384, "o_proj"), (12288, 6144, "dense gate_up"),
              (2048, 6144, "q_a"), (4096, 2048, "indexer wq_b")]
    for M, N, K, what in [(M, N, K, what) for M in (1, 8) for N, K, what in decode] + [
            (4096, 16384, 2048, "q_b prefill")]:
        w8, s = rand_fp8(N, K)
        x = torch.randn(M, K, device=DEV, dtype=BF16)
        out.append((f"linear fp8 {what} M={M} [{N}x{K}]", "linear", (x, w8, s),
                    N * K + s.numel() * 4 + M * (K + N) * 2, 2 * M * N * K))
    for N, I in [(1, 2048), (8, 2048), (8, 256)]:
        E, H, k = 256, 6144, 8
        g, gs = rand_fp8(E, I, H)
        u, us = rand_fp8(E, I, H)
        d, ds = rand_fp8(E, H, I)
        x = torch.randn(N, H, device=DEV, dtype=BF16)
        idx = torch.stack([torch.randperm(E, device=DEV)[:k] for _ in range(N)])
        w = torch.rand(N, k, device=DEV)
        hit = idx.unique().numel()
        out.append((f"moe_experts fp8 N={N} I={I} ({hit} experts hit)", "moe_experts",
                    (x, idx, w, g, u, d, gs, us, ds, 0), hit * 3 * I * H, 2 * N * k * 3 * I * H))
    for N in (1, 8):
        logits = torch.randn(N, 256, device=DEV)
        out.append((f"router_topk N={N} E=256 k=8", "router_topk",
                    (logits, torch.zeros(256, device=DEV), 8, 1, 1, True, 2.5), N * 256 * 4 + 256 * 4, 0))
    for N in (1, 8):
        nh, rkv, dr, K, slots = 64, 512, 64, 2048, 300000
        kv = torch.randn(slots, rkv + dr, device=DEV, dtype=BF16)
        sel = torch.stack([torch.randperm(slots, device=DEV)[:K] for _ in range(N)])
        ql = torch.randn(N, nh, rkv, device=DEV, dtype=BF16)
        qr = torch.randn(N, nh, dr, device=DEV, dtype=BF16)
        out.append((f"mla_sparse_attention N={N} K={K}", "mla_sparse_attention", (ql, qr, kv, sel, 0.0625),
                    N * K * (rkv + dr) * 2 + N * nh * (2 * rkv + dr) * 2, 2 * N * nh * K * (2 * rkv + dr)))
    for N in (1, 2, 4, 8):                     # W_UK absorb / W_UV expand straight from the FP8 kv_b
        kv_b = kv_b_proj(64, 192, 256, 512)
        q_nope = torch.randn(N, 64, 256, device=DEV, dtype=BF16)[..., :192]          # strided, as the model's
        o_lat = torch.randn(N, 64, 512, device=DEV, dtype=BF16)
        w_uk, w_uv = 64 * 192 * 512, 64 * 256 * 512                                   # fp8 bytes read
        out.append((f"mla_absorb N={N} [64 heads x 192 -> 512]", "mla_absorb", (q_nope, kv_b),
                    w_uk + N * 64 * (192 + 512) * 2, 2 * N * w_uk))
        out.append((f"mla_expand N={N} [64 heads x 512 -> 256]", "mla_expand", (o_lat, kv_b, 192),
                    w_uv + N * 64 * (512 + 256) * 2, 2 * N * w_uv))
    for N, T in ((1, 32768), (8, 32768)):
        ih, idd, slots = 32, 128, N * T
        kc = torch.randn(slots, idd, device=DEV, dtype=BF16)
        seq_slots = [torch.arange(i * T, (i + 1) * T, device=DEV) for i in range(N)]
        q = torch.randn(N, ih, idd, device=DEV, dtype=BF16)
        w = torch.randn(N, ih, device=DEV)
        pos = torch.full((N,), T - 1, device=DEV)
        out.append((f"indexer_topk N={N} T={T}", "indexer_topk",
                    (q, w, kc, [(i, 1) for i in range(N)], seq_slots, pos, 2048, idd ** -0.5),
                    N * T * (idd * 2 + 8 + 4), 2 * N * T * ih * idd))
    for N in (1, 8, 4096):
        x, r = torch.randn(2, N, 6144, device=DEV, dtype=BF16)
        w = torch.ones(6144, device=DEV, dtype=BF16)
        out.append((f"add_rms_norm N={N} H=6144", "add_rms_norm", (x, r, w, 1e-5), N * 6144 * 2 * 4, 0))
    for N in (8, 4096):
        q = torch.randn(N, 64, 256, device=DEV, dtype=BF16)[..., 192:]
        c = torch.randn(N, 1, 32, device=DEV, dtype=BF16)
        out.append((f"rope q N={N} [64x64]", "rope", (q, c, c, True), N * 64 * 64 * 2 * 2, 0))
    w8, s = rand_fp8(28672, 512)
    out.append(("fp8_dequant kv_b [28672x512]->bf16", "fp8_dequant", (w8, s, BF16), 28672 * 512 * 3, 0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    ceil = ceilings()
    rows = []
    for name, op, a, nbytes, flops in cases():
        tri = t_ms(lambda: ops.impl(op, "triton")(*a))
        ref = t_ms(lambda: reference.__dict__[op](*a))
        dev = device_ms(ops.impl(op, "triton"), a, nbytes)
        t = dev or tri
        rows.append({"kernel": name, "triton_us": tri * 1e3, "reference_us": ref * 1e3,
                     "graph_us": None if dev is None else dev * 1e3, "GBps": nbytes / t / 1e6,
                     "pct_read_bw": 100 * nbytes / t / 1e9 / ceil["read_TBps"], "TFLOPs": flops / t / 1e9})
        print(f"{name:48s} {tri * 1e3:9.1f} us  graph {rows[-1]['graph_us'] or float('nan'):9.1f} us  "
              f"ref {ref * 1e3:9.1f} us  {rows[-1]['GBps']:7.0f} GB/s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels_micro.json").write_text(json.dumps({"ceilings": ceil, "rows": rows,
                                                        "device": torch.cuda.get_device_name()}, indent=1))
    lines = [f"# Kernel micro-benchmark ({torch.cuda.get_device_name()}, torch {torch.__version__})", "",
             (f"Measured ceilings: copy {ceil['copy_TBps']:.2f} TB/s (read+write), read-only stream "
             f"{ceil['read_TBps']:.2f} TB/s, bf16 GEMM {ceil['bf16_gemm_TFLOPs']:.0f} TFLOP/s. "
             "GB/s counts the bytes the op must move once, over the graph (device) time where the op captures "
             "(else the per-call time); % is of the read stream. Per-call times (do_bench: L2 flushed, host "
             "launch included) for triton and reference side by side."), "",
             "| kernel | triton µs | reference µs | speed-up | triton µs, graph | GB/s | % read BW | TFLOP/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        g = "—" if r["graph_us"] is None else f"{r['graph_us']:.1f}"
        lines.append(f"| {r['kernel']} | {r['triton_us']:.1f} | {r['reference_us']:.1f} | "
                     f"{r['reference_us'] / r['triton_us']:.1f}× | {g} | {r['GBps']:.0f} | {r['pct_read_bw']:.0f}% | "
                     f"{r['TFLOPs']:.1f} |")
    (out / "kernels_micro.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
