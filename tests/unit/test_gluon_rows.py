"""The Gluon rows kernels' host side on the CPU: when they apply, the launch choices and the switch. The
kernels themselves (no interpreter for Gluon) run in tests/gpu/test_kernels_gpu.py."""

from __future__ import annotations

import pytest
import torch

gluon_rows = pytest.importorskip("glmkernels.gluon_rows", reason="triton is not installed (the 'gpu' extra)")


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


@pytest.mark.parametrize("N,K", [(2048, 6144), (16384, 2048), (6144, 16384), (12288, 6144), (6144, 12288),
                                 (4096, 2048), (1536, 6144), (6144, 1536), (1088, 700), (24576, 6144),
                                 (20480, 2048), (2752, 6144), (3072, 6144)])
def test_rows_tile_shapes(N, K):
    """Every default launch is one the kernel accepts: warps × 16 rows tile BLOCK_N, BLOCK_N divides 128 (one
    scale row a program), and the split leaves every program at least one step of K; a split launch's programs
    fit one wave (32 warps an SM: a second wave barely begun cost the dense gate / up group 54.6 against 44.2 µs)."""
    for sms in (4, 132):
        t = gluon_rows.rows_tile(8, N, K, sms)
        assert t.block_n % (16 * t.num_warps) == 0 and 128 % t.block_n == 0
        kbs = cdiv(K, 128)
        assert 1 <= t.split and t.split * t.sub <= max(t.sub, kbs)
        per_split = cdiv(cdiv(kbs, t.split), t.sub) * t.sub          # as fp8_linear_rows rounds it
        programs = cdiv(N, t.block_n) * cdiv(kbs, per_split)
        assert programs == cdiv(N, t.block_n) or programs <= 32 // t.num_warps * sms


def test_moe_tile_splits_narrow_experts_and_two_rows():
    """H is split for narrow experts, and for wide ones at 2 rows only (their ~17 runs' programs lie just past one
    wave unsplit: bench/moe_few_rows.py)."""
    wide = gluon_rows.moe_tile(6144, 2048, 64, 132)
    narrow = gluon_rows.moe_tile(6144, 256, 64, 132)
    two = gluon_rows.moe_tile(6144, 2048, 18, 132, rows=2)
    assert wide.split == 1 and 1 < narrow.split <= 6144 // 128 // 4 and two.split == 4
    assert [gluon_rows.moe_tile(6144, 2048, 9 * r, 132, rows=r).split for r in (3, 4, 8)] == [1, 1, 1]
    for t in (wide, narrow, two):
        assert t.block_i % (16 * t.gu_warps) == 0 and t.block_ho % (16 * t.dn_warps) == 0


def test_moe_tile_for_an_ep_rank():
    """An ep rank of 8 (32 wide experts held, 1/8 of the pairs routed here): its few runs at ≤ 8 rows split H in 4;
    past 8 rows the chunk grid with 8-pair programs until runs average 8 pairs; every expert held keeps its picks."""
    assert [gluon_rows.moe_tile(6144, 2048, r, 132, rows=r, share=1 / 8).split for r in (4, 8)] == [4, 4]
    ep = [gluon_rows.moe_tile(6144, 2048, min(32, 8 * r // 8), 132, rows=r, share=1 / 8) for r in (16, 64, 128)]
    assert all(t == gluon_rows.MoeTile(128, 1, 64, 2, 8, 4, compact=True) for t in ep)
    assert gluon_rows.moe_tile(6144, 2048, 32, 132, rows=256, share=1 / 8).pairs == 16
    tp = gluon_rows.moe_tile(6144, 2048, 257, 132, rows=64)
    assert not tp.compact and tp.block_ho == 128


def test_moe_tile_down_blocks_in_turn():
    """Past 8 rows a narrow expert's down program takes 4 blocks of outputs in turn (its K is two blocks: one block a
    program is mostly its prologue); wide experts and ≤ 8 rows one; within a scale block (≤ 128 outputs)."""
    narrow = [gluon_rows.moe_tile(6144, 256, min(257, 9 * r), 132, rows=r) for r in (16, 64, 128, 256)]
    assert [t.ho_steps for t in narrow] == [4, 4, 4, 4] and all(t.block_ho <= 128 for t in narrow)
    assert gluon_rows.moe_tile(6144, 256, 32, 132, rows=64, share=1 / 8).ho_steps == 4
    wide = [gluon_rows.moe_tile(6144, 2048, min(257, 9 * r), 132, rows=r) for r in (16, 64, 256)]
    assert [t.ho_steps for t in wide] == [1, 1, 1]
    assert [gluon_rows.moe_tile(6144, 256, 9 * r, 132, rows=r).ho_steps for r in (2, 8)] == [1, 1]


def test_moe_tile_k_blocks_a_step():
    """One K block a step for narrow experts to 8 rows (fewer registers: more programs an SM); two for wide
    experts, an ep rank's too."""
    assert [gluon_rows.moe_tile(6144, 256, 9 * r, 132, rows=r).sub for r in (2, 4, 8)] == [1, 1, 1]
    assert [gluon_rows.moe_tile(6144, 2048, 9 * r, 132, rows=r).sub for r in (2, 3, 8)] == [2, 2, 2]
    assert gluon_rows.moe_tile(6144, 2048, 2, 132, rows=2, share=1 / 8).sub == 2


@pytest.mark.parametrize("N,E_local,offset,pairs", [(256, 256, 0, 16), (256, 32, 64, 8), (3, 16, 0, 8),
                                                    (40, 256, 0, 16)])
def test_run_chunks_lists_every_chunk_start(N, E_local, offset, pairs):
    """The compact grid's list (Triton, run here under the interpreter): the sorted positions that own a chunk of
    ≤ ``pairs`` pairs of a held expert's run, in order, then -1 up to the static bound."""
    from glmkernels.triton_moe import route_pairs
    g = torch.Generator().manual_seed(N + E_local)
    idx = torch.stack([torch.randperm(256, generator=g)[:8] for _ in range(N)])
    sorted_e, _pair, _order, _valid, run_start = route_pairs(idx, offset, E_local)
    got = gluon_rows.run_chunks(sorted_e, run_start, E_local, pairs)
    p = torch.arange(sorted_e.numel())
    starts = p[(sorted_e < E_local) & ((p - run_start) % pairs == 0)]
    assert got.numel() == min(N * 8, N * 8 // pairs + min(E_local, N * 8)) >= starts.numel()
    assert torch.equal(got[:starts.numel()], starts.int()) and bool((got[starts.numel():] == -1).all())


def test_not_usable_on_cpu_and_switch(monkeypatch):
    x = torch.zeros(4, 6144, dtype=torch.bfloat16)
    assert not gluon_rows.usable(x, 2048)
    assert not gluon_rows.moe_usable(x, torch.zeros(8, 256, 6144), True)
    monkeypatch.setenv("GLMSERVE_GLUON", "yes")
    gluon_rows.enabled.cache_clear()
    try:
        with pytest.raises(ValueError, match="GLMSERVE_GLUON"):
            gluon_rows.enabled()
        monkeypatch.setenv("GLMSERVE_GLUON", "0")
        gluon_rows.enabled.cache_clear()
        assert not gluon_rows.enabled()
    finally:
        gluon_rows.enabled.cache_clear()


_COMPILE_FOR_SM90 = """
import json
from bench import gluon_regs as regs
from glmkernels import gluon_rows
if not gluon_rows.HAVE_GLUON:
    print(json.dumps(None))
    raise SystemExit
cases = [(gluon_rows._rows_kernel, regs.ROWS_SIG, {"BLOCK_N": 128, "BLOCK_M": 8, "SUB": 4, "WARPS": 8, "SPLIT": True,
                                                     "BITS": True, "EVEN_K": False, "GROUP": True}, 8),
         (gluon_rows._moe_gate_up_kernel, regs.GATE_UP_SIG, {"TOPK": 8, "BLOCK_I": 64, "BLOCK_R": 8, "SUB": 2,
                                                              "WARPS": 4, "SPLIT": True, "BITS": True,
                                                              "COMPACT": False}, 4),
         (gluon_rows._moe_down_kernel, regs.DOWN_SIG, {"BLOCK_HO": 128, "BLOCK_R": 16, "SUB": 2, "WARPS": 8,
                                                        "BITS": True, "COMPACT": True, "HO_STEPS": 2}, 8)]
print(json.dumps({fn.__name__: regs.inspect(fn, sig, constexprs, warps) for fn, sig, constexprs, warps in cases}))
"""


def test_kernels_compile_for_sm90():
    """Every Gluon kernel of the default launches compiles for sm_90 with the installed triton (no GPU needed):
    an API change in triton.experimental (3.9 renamed ``thread_barrier`` to ``barrier``) fails here, not on a
    GPU at the first 2..8-row step. Tensor-core MMAs present, nothing spilled. In a process of its own, without
    this tier's ``TRITON_INTERPRET`` (``gluon_regs.report_in_subprocess``)."""
    regs = pytest.importorskip("bench.gluon_regs", reason="needs triton's CUDA backend")
    kernels = regs.report_in_subprocess(_COMPILE_FOR_SM90)
    if kernels is None:
        pytest.skip("this triton has no usable Gluon: the Triton tile kernels run")
    for name, r in kernels.items():
        assert r["HMMA"] > 0 and r["local"] == 0 and r["regs"] <= 255, (name, r)
