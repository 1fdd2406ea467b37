"""The op registry: every op the model uses has a PyTorch reference and optionally faster versions.

Model code calls ``ops.name(...)``; which implementation runs is decided once at start by
``configure(mode, overrides)`` — never by a platform check in the model or an ``if use_triton`` at the call
site. (Two environment variables switch how some Triton forms run, for A/B benchmarks: ``GLMSERVE_GLUON``,
``GLMSERVE_PDL``; they pick no op's backend.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Impl:
    fn: Callable
    backend: str                            # "reference" | "triton" | ...
    available: Callable[[str], bool]        # device type -> usable there


class OpRegistry:
    """Name → implementations; ``ops.<name>`` resolves to the configured one."""

    def __init__(self) -> None:
        self._impls: dict[str, dict[str, Impl]] = {}
        self._active: dict[str, Callable] = {}

    def register(self, name: str, backend: str = "reference",
                 available: Callable[[str], bool] = lambda device: True) -> Callable[[Callable], Callable]:
        def deco(fn: Callable) -> Callable:
            self._impls.setdefault(name, {})[backend] = Impl(fn, backend, available)
            if backend == "reference":
                self._active.setdefault(name, fn)
            return fn
        return deco

    def configure(self, mode: str = "auto", device: str = "cpu", overrides: dict[str, str] | None = None) -> None:
        """Pick one implementation per op. ``auto``: the fastest usable on ``device``; ``reference``: PyTorch."""
        if mode not in ("auto", "reference"):
            raise ValueError(f"kernels must be 'auto' or 'reference', got {mode!r}")
        overrides = dict(overrides or {})
        unknown = set(overrides) - set(self._impls)
        if unknown:
            raise ValueError(f"kernel overrides name unknown ops {sorted(unknown)}; known: {sorted(self._impls)}")
        for name, impls in self._impls.items():
            want = overrides.get(name)
            if want is not None:
                if want not in impls or not impls[want].available(device):
                    raise ValueError(f"kernel override {name}={want!r} is not available on {device}; "
                                     f"have {sorted(b for b, i in impls.items() if i.available(device))}")
                choice = want
            elif mode == "auto":
                fast = [b for b, i in impls.items() if b != "reference" and i.available(device)]
                choice = fast[0] if fast else "reference"
            else:
                choice = "reference"
            self._active[name] = impls[choice].fn

    def impl(self, name: str, backend: str) -> Callable:
        return self._impls[name][backend].fn

    def __getattr__(self, name: str) -> Callable:
        try:
            return self.__dict__["_active"][name]
        except KeyError:
            raise AttributeError(f"no op named {name!r} is registered") from None


ops = OpRegistry()
