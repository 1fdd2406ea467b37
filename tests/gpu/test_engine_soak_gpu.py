"""``tests/integration/test_engine_soak.py``'s random request mixes on a CUDA GPU, the embedded model with
``kernels: auto``: decode steps on captured graphs looking ahead, the MTP drafting graphs, FP8 KV rows in a pool small
enough to preempt and to evict prefixes to the host tier — with aborts at random points. Once all have ended every
per-request map is empty and every block free.

Run on a lent GPU: ``PYTHONPATH=. python -m pytest -q tests/gpu/test_engine_soak_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from tests.integration.test_engine_soak import engine_for, soak  # noqa: E402


@pytest.mark.parametrize("setup,kw", [("ahead", {"cuda_graphs": "auto"}), ("mtp", {}),
                                      ("crowded", {"kv_cache_dtype": "fp8"})])
def test_random_request_mixes_on_graphs_leave_nothing_behind(setup, kw):
    engine, tok = engine_for(setup, device="cuda", **kw)
    assert engine.graphs
    soak(engine, tok, setup)
