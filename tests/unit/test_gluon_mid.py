"""The mid-size Gluon linear's host side on the CPU (glmkernels/gluon_mid.py): which shapes take it, the launch it
picks, and that it compiles for sm_90 with the installed triton. The kernel itself (TMA, wgmma: no interpreter)
runs in tests/gpu/test_kernels_gpu.py."""

from __future__ import annotations

import pytest
import torch

gluon_mid = pytest.importorskip("glmkernels.gluon_mid", reason="triton is not installed (the 'gpu' extra)")

SHAPES = [(2048, 6144), (16384, 2048), (6144, 16384), (4096, 2048), (12288, 6144), (6144, 12288), (1536, 6144),
          (6144, 1536), (1088, 720)]
SMEM = 227 << 10       # an H200 SM's shared memory for one block


def test_applies():
    """16..256 rows, ≥ 1024 outputs, K a multiple of 16; to 64 rows only on the large weights (N·K ≥ 2^24); a group
    of weights from 512 outputs."""
    assert gluon_mid.applies(16, 6144, 16384) and gluon_mid.applies(64, 16384, 2048)
    assert not gluon_mid.applies(64, 4096, 2048)          # small weight, decode rows: the Triton tile
    assert gluon_mid.applies(65, 4096, 2048) and gluon_mid.applies(256, 1536, 6144)
    assert not gluon_mid.applies(15, 6144, 16384) and not gluon_mid.applies(257, 6144, 16384)
    assert not gluon_mid.applies(128, 576, 6144)          # kv_a: too few outputs
    assert not gluon_mid.applies(128, 2048, 6150)         # K not a multiple of 16: no TMA descriptor
    # a group of weights (linear_group): from 512 outputs in all, at 16..256 rows whatever their size
    assert gluon_mid.applies(16, 512, 6144, group=True) and gluon_mid.applies(64, 2696, 6144, group=True)
    assert not gluon_mid.applies(16, 512, 6144) and not gluon_mid.applies(64, 2696, 6144)   # alone: too small
    assert not gluon_mid.applies(16, 384, 6144, group=True) and not gluon_mid.applies(8, 2752, 6144, group=True)
    assert not gluon_mid.applies(257, 2752, 6144, group=True) and not gluon_mid.applies(32, 2752, 6150, group=True)
    x = torch.zeros(128, 6144, dtype=torch.bfloat16)
    assert not gluon_mid.usable(x, 16384, 6144)           # a CPU tensor


@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("M", [16, 17, 32, 64, 65, 100, 128, 200, 256])
def test_mid_tile(M, N, K):
    """One warpgroup on 64 outputs; all rows in one tile to 64; past that on large weights with long rows 64 rows
    (3-deep ring) to 128 rows and 128 (4-deep) beyond, at about two programs an SM; 128 rows on the other large
    weights, 64 on the rest, about one program an SM; the ring fits shared memory; every split ≥ 2 K steps (or none)."""
    t = gluon_mid.mid_tile(M, N, K, 132)
    assert t.block_n == 64 and t.num_warps == 4
    per_sm = 1
    if M <= 64:
        assert t.block_m == max(16, 1 << (M - 1).bit_length()) and t.stages == 4
    elif N * K >= gluon_mid.LARGE and K >= 4096:
        assert (t.block_m, t.stages) == ((64, 3) if M <= 128 else (128, 4))
        per_sm = 2
    else:
        assert t.block_m == (128 if N * K >= gluon_mid.LARGE else 64)
    assert t.stages * (t.block_m * 128 * 2 + t.block_n * 128) <= SMEM
    tiles = -(-N // 64) * -(-M // t.block_m)
    assert t.split == 1 or (-(-K // 128) // t.split >= 2 and tiles * t.split < per_sm * 132 + tiles)


_COMPILE_FOR_SM90 = """
import json
from bench import gluon_regs as regs
from glmkernels import gluon_mid
if not gluon_mid.HAVE_HOPPER:
    print(json.dumps(None))
    raise SystemExit
print(json.dumps({name: dict(regs.inspect(fn, sig, cons, warps), rows=cons["BLOCK_M"])
                  for name, fn, sig, cons, warps in regs.mid_cases()}))
"""


def test_mid_kernel_compiles_for_sm90():
    """mid_tile's launch classes compile for sm_90 with the installed triton (no GPU needed): an API change in
    triton.experimental (3.9 renamed the TMA copy) fails here, not on a GPU. Warpgroup MMAs present; nothing spilled
    to 64 rows (the 128-row tile holds 128 fp32 accumulators a thread: triton 3.6's ptxas spilled 40 bytes there, and
    it was the fastest launch all the same); the grouped form (``GROUP``: a weight's TMA descriptor picked a tile) too.
    In a process of its own (``gluon_regs.report_in_subprocess``)."""
    regs = pytest.importorskip("bench.gluon_regs", reason="needs triton's CUDA backend")
    kernels = regs.report_in_subprocess(_COMPILE_FOR_SM90)
    if kernels is None:
        pytest.skip("this triton has no Hopper Gluon: the Triton tile kernels run")
    assert len(kernels) == 6                       # with the grouped launch (linear_group's q_a, kv_a, wk)
    for name, r in kernels.items():
        assert r["HMMA"] > 0 and r["local"] == 0 and r["regs"] <= 255, (name, r)
        if r["rows"] <= 64:
            assert r["stack"] == 0, (name, r)
