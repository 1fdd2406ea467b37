"""Finding 1: ``ImportWriter.write(staged, land=False)`` drops the rows the last step sent but never gives their device
buffer back to ``_device`` (``drop()`` does). The GPU path is driven here on a CPU by a shim for the few torch.cuda
calls it makes (streams, events); the "device" buffers are ordinary tensors, so only the bookkeeping is under test.

Run: cd /work/main && .venv/bin/python bench/results/session54/review/r1_device_buffer_lost.py
Exit status 1 (and FAIL lines) while the bug is there."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

import torch  # noqa: E402

import models.cache as cache  # noqa: E402
from models.cache import ImportWriter, KVCache  # noqa: E402
from models.config import ModelConfig  # noqa: E402


class _Event:
    def record(self, *a):
        pass

    def synchronize(self):
        pass


class _Stream:
    def wait_event(self, e):
        pass

    def wait_stream(self, s):
        pass


torch.cuda.Event = _Event                                  # (the shim: CPU only)
torch.cuda.stream = lambda s: contextlib.nullcontext()
torch.cuda.current_stream = lambda *a: _Stream()

config = ModelConfig.from_json(Path(cache.__file__).resolve().parents[1] / "models/configs/glm5-tiny-random.json")
src, dst = KVCache(config, 64, torch.bfloat16), KVCache(config, 64, torch.bfloat16)
w = ImportWriter(dst, 8, staged=True)
w._stream = _Stream()                                      # as on a GPU: a side stream, two device buffers
w.BUFFER = 1 << 20
w.reserve()
reserved = {b.data_ptr() for b, _ in w._device}
rows = src.read_blocks([0, 1], 8)
bad = 0

w.write(w.stage([([4, 5], rows)]), land=True)              # step 1 sends (device buffer A)
w.write(w.stage([([6, 7], rows)]), land=False)             # step 2: the engine dropped step 1's imports -> no land
print("after a write(land=False): buffers in rotation", len(w._device), "+ one on its way", w._sent is not None)
for _ in range(4):                                         # the steps after: sends and lands as usual
    w.write(w.stage([([4, 5], rows)]), land=True)
ptrs = {b.data_ptr() for b, _ in w._device} | ({w._sent.buffer.data_ptr()} if w._sent else set())
if not ptrs <= reserved:
    bad += 1
    print("FAIL: a device buffer was made after reserve() (the dropped one left the rotation without a wait for "
          "its side-stream copy):", len(ptrs - reserved), "new")

w2 = ImportWriter(dst, 8, staged=True)                     # the same through drop(): stays in rotation
w2._stream = _Stream()
w2.BUFFER = 1 << 20
w2.reserve()
r2 = {b.data_ptr() for b, _ in w2._device}
w2.write(w2.stage([([4, 5], rows)]), land=True)
w2.drop()
for _ in range(4):
    w2.write(w2.stage([([4, 5], rows)]), land=True)
p2 = {b.data_ptr() for b, _ in w2._device} | ({w2._sent.buffer.data_ptr()} if w2._sent else set())
print("through drop(): every buffer a reserved one:", p2 <= r2)
sys.exit(1 if bad else 0)
