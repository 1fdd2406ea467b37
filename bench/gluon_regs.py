"""Registers, spills and load / MMA counts of the Gluon kernels (glmkernels/gluon_rows.py, gluon_mid.py), compiled for
sm_90 on this machine — no GPU needed: triton's own ptxas (inside ``triton.compile``) and cuobjdump. A refactor that
looks neutral can change the register count and with it how many CTAs an SM holds (session 10: 64 → 86 registers
halved the rows kernel's 8-warp occupancy); check here before sweeping launches on the GPU.

    PYTHONPATH=. python bench/gluon_regs.py

The device image's triton is 3.6 (whose kernels the GPU numbers are of); CI's 3.9 compiles the same source to
other register counts. To see 3.6's here: ``pip install --target /tmp/tr36 --no-deps triton==3.6.0`` and
``PYTHONPATH=/tmp/tr36:. python bench/gluon_regs.py``.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

from glmkernels import gluon_mid
from glmkernels import gluon_rows as G

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
ROWS_SIG = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "out_ptr": "*bf16", "part_ptr": "*fp32",
            "count_ptr": "*i32",
            **dict.fromkeys(["M", "N", "K", "stride_xm", "num_sb_k", "kb_per_split", "N_a", "N_ab"], "i32"),
            **dict.fromkeys(["w_b_off", "s_b_off", "w_c_off", "s_c_off"], "i64")}
GATE_UP_SIG = {"x_ptr": "*bf16", "g_ptr": "*fp8e4nv", "u_ptr": "*fp8e4nv", "gs_ptr": "*fp32", "us_ptr": "*fp32",
               **dict.fromkeys(["sg_off", "su_off", "sgs_off", "sus_off"], "i64"), "E_shared": "i32",
               "sorted_e_ptr": "*i32", "sorted_pair_ptr": "*i32", "run_start_ptr": "*i32", "chunk_ptr": "*i32",
               "act_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32",
               **dict.fromkeys(["P", "E_local", "H", "I", "num_sb_h", "num_sb_i", "kb_per_split"], "i32")}
DOWN_SIG = {"act_ptr": "*bf16", "d_ptr": "*fp8e4nv", "ds_ptr": "*fp32", "sd_off": "i64", "sds_off": "i64",
            "E_shared": "i32", "w_route_ptr": "*fp32", "sorted_e_ptr": "*i32",
            "sorted_pair_ptr": "*i32", "run_start_ptr": "*i32", "chunk_ptr": "*i32", "y_ptr": "*bf16",
            **dict.fromkeys(["P", "E_local", "H", "I", "num_sb_h", "num_sb_i"], "i32")}
# as Triton specializes them at launch (multiples of 16; the shared expert's element offsets: 512-byte aligned tensors)
DIVISIBLE = ("K", "N", "stride_xm", "H", "I", "sg_off", "su_off", "sgs_off", "sus_off", "sd_off", "sds_off", "N_a",
             "N_ab", "w_b_off", "s_b_off", "w_c_off", "s_c_off")


def mid_sig(block_m: int, block_n: int) -> dict:
    """The mid-size kernel's signature: its two TMA descriptors name their blocks and shared layouts."""
    from triton.experimental.gluon import language as gl

    def desc(name: str, dtype, shape: list[int]) -> str:
        layout = gl.NVMMASharedLayout.get_default_for(shape, dtype)
        return f"tensordesc<{name}[{shape[0]}, {shape[1]}],{layout!r}>"
    w_desc = desc("fp8e4nv", gl.float8e4nv, [block_n, 128])
    return {"x_desc": desc("bf16", gl.bfloat16, [block_m, 128]), "w_desc": w_desc, "wb_desc": w_desc,
            "wc_desc": w_desc, "s_ptr": "*fp32", "out_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32",
            **dict.fromkeys(["M", "N", "num_sb_k", "kb_per_split", "N_a", "N_ab", "s_b_off", "s_c_off"], "i32")}


def mid_cases() -> list[tuple]:
    """(name, kernel, signature, constexprs, warps) of ``gluon_mid.mid_tile``'s five launch classes (16 rows; past 64
    rows on a small weight, on q_b, on o_proj to 128 rows and beyond), split over K; the first also as a group of
    weights (``linear_group``: q_a, kv_a and wk at 32 rows)."""
    cases = []
    for M, N, K, group in ((16, 6144, 16384, False), (100, 4096, 2048, False), (128, 16384, 2048, False),
                           (128, 6144, 16384, False), (256, 6144, 16384, False), (32, 2752, 6144, True)):
        t = gluon_mid.mid_tile(M, N, K, 132)
        cases.append((f"mid {t.block_m}x{t.block_n}/{t.stages}st" + (" group" if group else ""), gluon_mid._mid_kernel,
                      mid_sig(t.block_m, t.block_n), {"BLOCK_N": t.block_n, "BLOCK_M": t.block_m, "STAGES": t.stages,
                                                      "WARPS": t.num_warps, "SPLIT": True, "GROUP": group},
                      t.num_warps))
    return cases


def inspect(fn, signature: dict, constexprs: dict, warps: int) -> dict:
    """Compile ``fn`` for sm_90 (to a cubin: triton runs its own ptxas) and read the cubin's resource usage and
    SASS instruction mix with triton's cuobjdump."""
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = dict(signature, **dict.fromkeys(constexprs, "constexpr"))
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
             if t.startswith("*") or n in DIVISIBLE}
    kernel = triton.compile(GluonASTSource(fn, signature=sig, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([BIN / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([BIN / "cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True).stdout
    ops = collections.Counter(op.split(".")[0] for op in
                              re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass,
                                         re.MULTILINE))
    res = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    regs = int(res["REG"])
    return {"regs": regs, "ctas_per_sm": 65536 // (-(-regs // 8) * 8 * 32 * warps), "local": int(res["LOCAL"]),
            "stack": int(res.get("STACK", 0)), "shared": int(res["SHARED"]), "sass": sum(ops.values()),
            "LDG": ops["LDG"], "HMMA": ops["HMMA"] + ops["HGMMA"],
            "BAR": ops["BAR"]}


def report_in_subprocess(code: str):
    """Run ``code`` (Python that prints a JSON value as its last line) in a fresh interpreter at the repository root,
    without ``TRITON_INTERPRET`` — the interpreter patches ``triton.language`` while it runs a kernel, and a compile
    in a process that had interpreted kernels failed once inside a full test run ("'value' object has no attribute
    'dtype'"), never alone — and return that value; an AssertionError with its stderr if it fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    cases = []
    for bn, sub, warps, group in ((128, 4, 8, False), (64, 4, 4, False), (64, 4, 4, True)):  # rows_tile's classes
        cases.append((f"rows {bn}/{sub}/{warps}w{' group' if group else ''}", G._rows_kernel, ROWS_SIG,
                      {"BLOCK_N": bn, "BLOCK_M": 8, "SUB": sub, "WARPS": warps, "SPLIT": True, "BITS": True,
                       "EVEN_K": True, "GROUP": group}, warps))
    for bi, warps, split, pairs in ((128, 8, False, 8), (128, 8, True, 8), (64, 4, True, 8), (64, 4, False, 16)):
        name = f"moe gate/up {bi}/{warps}w/{pairs}p{' split' if split else ''}"
        cases.append((name, G._moe_gate_up_kernel, GATE_UP_SIG,
                      {"TOPK": 8, "BLOCK_I": bi, "BLOCK_R": pairs, "SUB": 2, "WARPS": warps, "SPLIT": split,
                       "BITS": True, "COMPACT": pairs > 8}, warps))
    for bo, warps, pairs, steps in ((128, 8, 8, 1), (64, 4, 8, 1), (64, 4, 16, 1), (64, 4, 16, 4), (128, 8, 16, 2),
                                    (256, 8, 16, 1)):
        cases.append((f"moe down {bo}/{warps}w/{pairs}p" + (f" x{steps}" if steps > 1 else ""), G._moe_down_kernel,
                      DOWN_SIG, {"BLOCK_HO": bo, "BLOCK_R": pairs, "SUB": 2, "WARPS": warps, "BITS": True,
                                 "COMPACT": pairs > 8, "HO_STEPS": steps}, warps))
    cases += mid_cases()
    print(f"triton {triton.__version__}, sm_90\n")
    print("| kernel | registers | CTAs / SM (by registers) | local / stack (spill) bytes | static shared bytes | SASS "
          "| LDG | HMMA (+HGMMA) | BAR |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, fn, sig, cons, warps in cases:
        r = inspect(fn, sig, cons, warps)
        print(f"| {name} | {r['regs']} | {r['ctas_per_sm']} | {r['local']} / {r['stack']} | {r['shared']} "
              f"| {r['sass']} | {r['LDG']} | {r['HMMA']} | {r['BAR']} |", flush=True)


if __name__ == "__main__":
    main()
