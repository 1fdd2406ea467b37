"""Kernels: one op registry (``ops``), PyTorch references, optional Triton implementations."""

from glmkernels import reference  # noqa: F401  (registers the reference ops)
from glmkernels.registry import ops

__all__ = ["ops"]


def _register_triton() -> None:
    """Triton implementations register beside the references when triton imports; the registry decides
    (per op, per device) whether they run."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return
    from glmkernels import triton_absorb, triton_attention, triton_linear, triton_moe, triton_norm  # noqa: F401
    from glmkernels import triton_router, triton_sample  # noqa: F401
    from glmkernels import triton_w8a8  # noqa: F401  (after the triton backend: `auto` takes the first registered)


_register_triton()
