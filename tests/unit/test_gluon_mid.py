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


@pytest.mark.parametrize("N,K", SHAPES + [(2752, 6144), (20480, 2048), (512, 6144), (3072, 6144), (24576, 6144)])
@pytest.mark.parametrize("M", [16, 17, 32, 64, 65, 100, 128, 160, 192, 200, 256])
def test_mid_tile(M, N, K):
    """One warpgroup on 64 outputs; all rows in one tile to 64; 65..128 rows: 64 rows (3-deep ring) on large weights
    with long rows, 128 (2-deep) on the other large weights if two an SM are one wave, else 64; past 128 rows
    128-row tiles only on large weights and where 64-row tiles pad as many rows (so 64 at 160 / 192 rows), 2-deep
    where there are two tiles an SM; the ring fits shared memory; every
    split ≥ 2 K steps, ≤ 8 and ≤ 1024 rows summed; at 16 / 32 rows a weight of few tiles splits to ≥ ~2 programs an
    SM where the cap allows, its busiest SM's share the least; past 128 rows short rows split only within a wave."""
    sms, kbs, large = 132, -(-K // 128), N * K >= gluon_mid.LARGE
    t = gluon_mid.mid_tile(M, N, K, sms)
    assert t.block_n == 64 and t.num_warps == 4
    if M <= 64:
        assert t.block_m == max(16, 1 << (M - 1).bit_length()) and t.stages == 4
    elif M <= 128:
        wave = -(-N // 64) <= 2 * sms
        assert (t.block_m, t.stages) == ((64, 3) if large and (K >= 4096 or not wave) else
                                         (128, 2) if large else (64, 4))
    else:
        assert t.block_m == (128 if large and M > 192 else 64)
    assert t.stages * (t.block_m * 128 * 2 + t.block_n * 128) <= SMEM
    tiles = -(-N // 64) * -(-M // t.block_m)
    if M > 128:
        assert t.stages == ((2 if tiles >= 2 * sms else 4) if t.block_m == 128 else 3)
    cap = max(1, min(kbs // 2, 8, 1024 // M))
    assert 1 <= t.split <= cap
    if M <= 32:
        def busiest(s):
            return -(-tiles * s // sms) / s
        enough = [s for s in range(1, cap + 1) if tiles * s * 20 >= 2 * sms * 19]
        if tiles * 20 >= 2 * sms * 19:
            assert t.split == 1
        else:
            assert t.split == (min(enough, key=lambda s: (busiest(s), s)) if enough else cap)
    elif M > 128 and K < 8192:
        assert t.split == 1 or tiles * t.split <= sms


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
