"""Session 31: where the several-row sparse attention's time goes. Variants of ``_mla_split_kernel`` that each leave
one stage out (its source with one line replaced), timed like bench/tune_attention.py (CUDA-graph replays over 8
caches, cold in L2) at the launch shapes ``mla_tile`` picks, and the split kernel without the combine. A variant's
output is wrong by construction: timing only.

    PYTHONPATH=. python bench/results/session31/mla_ablate.py [--rows 1 8 16] [--ncu-once N]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
import tempfile
import textwrap
from pathlib import Path

import torch
import triton
import triton.language as tl

from bench.tune_decode_kernels import per_launch_us
from glmkernels import triton_attention as ta

DEV, BF16 = "cuda", torch.bfloat16
NH, RKV, DR, K = 64, 512, 64, 2048

BASE = inspect.getsource(ta._mla_split_kernel.fn)
EDITS = {
    "base": [],
    "no PV dot": [("acc = acc * alpha[:, None] + tl.dot(p.to(lat.dtype), lat, input_precision=PREC)",
                   "acc = acc * alpha[:, None] + tl.sum(p, axis=1)[:, None]")],
    "no QK dot": [(("s = tl.dot(ql, tl.trans(lat), input_precision=PREC) + tl.dot(qr, tl.trans(kr), "
                    "input_precision=PREC)"),
                   ("s = tl.sum(lat.to(tl.float32), axis=1)[None, :] + tl.sum(kr.to(tl.float32), axis=1)[None, :]"
                    " + tl.sum(ql.to(tl.float32) + tl.sum(qr.to(tl.float32), axis=1)[:, None], axis=1)[:, None]"))],
    "no gather (64 hot slots)": [("base = kv_ptr + tl.maximum(slot, 0).to(tl.int64)[:, None] * stride_kv",
                                  "base = kv_ptr + (kk % 64).to(tl.int64)[:, None] * stride_kv")],
    "no partial store": [(("tl.store(o_ptr + row[:, None] * RKV + c[None, :], acc / tl.maximum(l_i, 1e-30)[:, None], "
                           "mask=hmask[:, None])"),
                          "tl.store(o_ptr + row * RKV, tl.sum(acc, axis=1) / tl.maximum(l_i, 1e-30), mask=hmask)")],
}


def variant(name: str, edits: list, tmp: Path):
    src = BASE
    for old, new in edits:
        assert old in src, (name, old)
        src = src.replace(old, new)
    path = tmp / f"mla_var_{abs(hash(name))}.py"
    path.write_text("import triton\nimport triton.language as tl\nfrom kernels.triton_utils import pdl_wait\n"
                    "TRIM_BLOCK: tl.constexpr = tl.constexpr(256)\nLOG2E = 1.4426950408889634\n\n"
                    + textwrap.dedent(src))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod._mla_split_kernel


@triton.jit
def _no_combine(o_ptr, lse_ptr, out_ptr, NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, RKV: tl.constexpr,
                PDL: tl.constexpr):
    pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--ncu-once", type=int, default=0, help="run the committed kernel once at N rows (for ncu)")
    args = ap.parse_args()
    slots = 40960
    caches = [torch.randn(slots, RKV + DR, device=DEV, dtype=BF16) for _ in range(8)]
    if args.ncu_once:
        N = args.ncu_once
        sel = torch.stack([torch.randperm(slots, device=DEV)[:K] for _ in range(N)]).int()
        ql, qr = torch.randn(N, NH, RKV, device=DEV, dtype=BF16), torch.randn(N, NH, DR, device=DEV, dtype=BF16)
        for i in range(3):
            ta._mla(ql, qr, caches[i], sel, 0.0625, *ta.mla_tile(N))
        torch.cuda.synchronize()
        return
    real_kernel, real_combine = ta._mla_split_kernel, ta._mla_combine_kernel
    with tempfile.TemporaryDirectory() as d:
        kernels = {name: variant(name, edits, Path(d)) for name, edits in EDITS.items()}
        print(f"| rows | shape | {' | '.join(kernels)} | split kernel alone (base, no combine) |")
        print("|---:|---|" + "---:|" * (len(kernels) + 1))
        for N in args.rows:
            sel = torch.stack([torch.randperm(slots, device=DEV)[:K] for _ in range(N)]).int()
            ql, qr = torch.randn(N, NH, RKV, device=DEV, dtype=BF16), torch.randn(N, NH, DR, device=DEV, dtype=BF16)
            shapes = [tuple(ta.mla_tile(N))] + ([(64, 1, 64, 64, 8)] if 1 < N <= 32 else [])
            for shape in shapes:
                def run(i, _, shape=shape, ql=ql, qr=qr, sel=sel):
                    return ta._mla(ql, qr, caches[i], sel, 0.0625, *shape)
                run.num_inputs = len(caches)
                cells = []
                for kern in kernels.values():
                    ta._mla_split_kernel = kern
                    cells.append(f"{per_launch_us(run, None):.1f}")
                ta._mla_split_kernel, ta._mla_combine_kernel = real_kernel, _no_combine
                cells.append(f"{per_launch_us(run, None):.1f}")
                ta._mla_split_kernel, ta._mla_combine_kernel = real_kernel, real_combine
                print(f"| {N} | {shape} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
