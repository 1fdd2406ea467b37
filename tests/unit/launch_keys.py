"""Triton kernels' launches recorded — not run — with the key Triton compiles a kernel per: its constexpr arguments,
an integer's divisibility by 16 and whether it is 1 (unless not specialized), a pointer's 16-byte alignment, a float
or a tensor. A variant a warm-up did not launch is compiled while serving (a step stalls about a second), so tests
compare the keys of random traffic with the warm-up's (test_sampler_warm_up.py, test_indexer_launch_keys.py,
test_step_launch_keys.py: the whole engine)."""

from __future__ import annotations

import inspect

import torch


def spec(value, specialize: bool):
    """What of an argument Triton compiles by (not a constexpr: those by value)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return ("int", value == 1, value % 16 == 0) if specialize else "int"
    if isinstance(value, float):
        return "float"
    raise AssertionError(f"an argument Triton would see as {type(value)}")


class Recorder:
    """Stands for a kernel: ``kernel[grid](...)`` adds the launch's compile key to ``seen`` and runs nothing."""

    def __init__(self, name: str, kernel, seen: set):
        self.name, self.seen = name, seen
        self.names = kernel.arg_names
        dns = kernel.kwargs.get("do_not_specialize") if hasattr(kernel, "kwargs") else kernel.do_not_specialize
        self.unspecialized = {self.names[d] if isinstance(d, int) else d for d in dns or ()}    # (names or places)
        self.constexprs = {n for n, p in inspect.signature(kernel.fn).parameters.items()
                           if "constexpr" in str(p.annotation)}

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            named = dict(zip(self.names, args)) | kwargs
            self.seen.add((self.name, tuple((n, v if n in self.constexprs else spec(v, n not in self.unspecialized))
                                            for n, v in sorted(named.items()))))
        return launch


def record_kernels(monkeypatch, seen: set) -> int:
    """Every Triton kernel of ``glmkernels``' Triton modules replaced by a ``Recorder`` into ``seen`` (where a module
    imported another's kernel too); returns how many were."""
    import importlib
    import pkgutil

    import glmkernels

    def is_kernel(obj) -> bool:
        return hasattr(obj, "arg_names") and hasattr(obj, "fn") and callable(getattr(obj, "__getitem__", None))

    count = 0
    for info in pkgutil.iter_modules(glmkernels.__path__):
        if not info.name.startswith("triton_"):
            continue
        module = importlib.import_module(f"glmkernels.{info.name}")
        for name, obj in list(vars(module).items()):
            if is_kernel(obj):
                monkeypatch.setattr(module, name, Recorder(name, obj, seen))
                count += 1
    return count
