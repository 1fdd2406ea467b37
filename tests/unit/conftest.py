"""CPU tier: Triton kernels (imported by ``kernels`` whenever triton is installed) must be decorated in
interpreter mode, so the switch is set before any test module here imports ``kernels``."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
