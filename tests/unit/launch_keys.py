"""Triton kernels' launches recorded — not run — with the key Triton compiles a kernel per: its constexpr arguments,
an integer's divisibility by 16 and whether it is 1 (unless not specialized), a pointer's 16-byte alignment, a float
or a tensor. A variant a warm-up did not launch is compiled while serving (a step stalls about a second), so tests
compare the keys of random traffic with the warm-up's (test_sampler_warm_up.py, test_indexer_launch_keys.py)."""

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
        self.unspecialized = set(kernel.kwargs.get("do_not_specialize") or ())
        self.constexprs = {n for n, p in inspect.signature(kernel.fn).parameters.items()
                           if "constexpr" in str(p.annotation)}

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            named = dict(zip(self.names, args)) | kwargs
            self.seen.add((self.name, tuple((n, v if n in self.constexprs else spec(v, n not in self.unspecialized))
                                            for n, v in sorted(named.items()))))
        return launch
