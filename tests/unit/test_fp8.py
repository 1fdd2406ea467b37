from __future__ import annotations

import pytest
import torch

from glmkernels import ops
from glmkernels.reference import FP8_DTYPE, fp8_quantize


def f64_dequant(w8: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The §4 formula, element by element in float64: W[r, c] = W8[r, c] * S[r // 128, c // 128]."""
    r = torch.arange(w8.shape[0])[:, None] // 128
    c = torch.arange(w8.shape[1])[None, :] // 128
    return w8.double() * s.double()[r, c]


@pytest.mark.parametrize("shape", [(576, 192), (576, 6144 // 8), (192, 576), (100, 130), (128, 256), (1, 1)])
def test_dequant_partial_blocks_exact(shape):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=g) * 3
    w8, s = fp8_quantize(w)
    assert w8.dtype == FP8_DTYPE and s.shape == (-(-shape[0] // 128), -(-shape[1] // 128))
    ours = ops.fp8_dequant(w8, s, torch.float32)
    ref = f64_dequant(w8, s)
    # fp32 multiply of an e4m3 value and an fp32 scale is one correctly rounded operation
    assert torch.equal(ours, ref.float())
    # the last (partial) row block really has its own scale
    assert (ours - w).abs().max() <= w.abs().max() / 8


def test_quantize_uses_per_block_scales():
    w = torch.ones(256, 130)
    w[128:, :] *= 100       # second row block is 100× larger
    w8, s = fp8_quantize(w)
    assert torch.allclose(s[1] / s[0], torch.full((2,), 100.0))
    assert torch.equal(ops.fp8_dequant(w8, s), w)


def test_linear_fp8_matches_dequantized_weight():
    g = torch.Generator().manual_seed(1)
    w8, s = fp8_quantize(torch.randn(576, 192, generator=g))
    x = torch.randn(3, 192, generator=g)
    assert torch.allclose(ops.linear(x, w8, s), x @ ops.fp8_dequant(w8, s).T, atol=1e-5)


def test_stacked_dequant_matches_per_expert():
    g = torch.Generator().manual_seed(2)
    w8, s = fp8_quantize(torch.randn(4, 200, 136, generator=g))
    stacked = ops.fp8_dequant(w8, s)
    for e in range(4):
        assert torch.equal(stacked[e], f64_dequant(w8[e], s[e]).float())
