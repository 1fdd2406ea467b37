"""CPU tier: Triton kernels (imported by ``glmkernels`` whenever triton is installed) must be decorated in
interpreter mode, so the switch is set before any test module here imports ``glmkernels``."""

from __future__ import annotations

import importlib
import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def tk():
    """The Triton kernel modules, reloaded so their kernels are interpreted in this process (test_triton_kernels.py,
    test_triton_moe.py: the modules that check the interpreter is on). Skips without triton, or where triton was
    imported before the switch (its kernels would compile for a GPU)."""
    triton = pytest.importorskip("triton", reason="triton is not installed (it is in the 'gpu' extra)")
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(triton.language.standard.sum, InterpretedFunction):
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (tests/unit/conftest.py sets it; "
                    "collect tests/unit first)")
    import glmkernels.triton_absorb as absorb
    import glmkernels.triton_attention as att
    import glmkernels.triton_linear as lin
    import glmkernels.triton_moe as moe
    import glmkernels.triton_norm as norm
    import glmkernels.triton_router as router
    import glmkernels.triton_sample as sample
    import glmkernels.triton_w8a8 as w8a8
    mods = [importlib.reload(m) for m in (norm, lin, moe, att, absorb, router, sample, w8a8)]   # w8a8: lin's, moe's
    return dict(zip(("norm", "lin", "moe", "att", "absorb", "router", "sample", "w8a8"), mods))
