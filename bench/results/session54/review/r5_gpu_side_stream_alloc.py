"""Finding 1 on a GPU: the side stream writes device buffers that the caching allocator accounts to the step's stream.

Part A (no ``reserve()``: a fresh worker after a group's recovery, ``cluster/local.py``, ``bench --no-reserve``, or a
buffer lost to part B): ``_device_buffer`` makes a buffer with ``torch.empty`` on the step's stream, and the side stream
copies into it at once, without waiting for the step's stream. Memory that the step's stream freed on the host side
while its kernels still read it (a step launched ahead, its sampling temporaries) may be handed out: the copy lands
in it under the pending kernel. Here the pending kernel is a sum over a 128 MiB tensor queued behind ~1 s of sleep.

Part B (``write(..., land=False)``): the rows sent by the last write are dropped and so is their device buffer —
freed, not put back in ``_device`` — with no ``record_stream`` for the side stream. If the side stream's copy into it
is still running (delayed here by a sleep queued on the side stream: a busy copy engine), the step's stream may reuse
the memory meanwhile: a tensor made right after reads the copy's bytes.

Run on a GPU: PYTHONPATH=. python3 bench/results/session54/review/r5_gpu_side_stream_alloc.py

Seen on one H100 (torch 2.11, r5_h100_run1.log / run2.log): part B FAILS (y's bytes overwritten by the dropped
send's copy once the side stream got to it); part A did NOT reproduce (the fresh buffer took the freed tensor's
memory, yet the pending sum read its bytes intact — something serialized the copy behind the step's stream that this
script does not pin down), so part A is reported as hardening only."""

from __future__ import annotations

import sys

import torch

from models.cache import ImportWriter, KVCache
from models.config import ModelConfig

BS = 16
cfg = ModelConfig.from_json("models/configs/glm5-tiny-random.json")
src = KVCache(cfg, 256 * BS, torch.bfloat16, "cuda")
dst = KVCache(cfg, 256 * BS, torch.bfloat16, "cuda")
for t in src.tensors():
    t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, dtype=torch.uint8, device="cuda"))
rows = src.read_blocks(list(range(64)), BS)
print("rows' bytes:", sum(r.nbytes for r in rows))
bad = 0
cycles = int(2e9)                       # ~1 s at H100 clocks

# ---- part A: a fresh device buffer, copied into by the side stream at once -------------------------------------
w = ImportWriter(dst, BS)               # no device buffers yet (the pinned ones made now: pinning syncs the device,
w.reserve()                             # and in a step it runs in ``stage``, before the step's work is queued)
w._device.clear()
torch.cuda.synchronize()
x = torch.full((ImportWriter.BUFFER,), 7, dtype=torch.uint8, device="cuda")
ptr = x.data_ptr()
torch.cuda.synchronize()
torch.cuda._sleep(cycles)               # the step's stream is busy ...
total = x.sum(dtype=torch.int64)        # ... and a kernel queued behind it reads x
del x                                   # freed on the host side: legal for the step's stream to reuse
w.write(w.stage([(list(range(64)), rows)]), land=False)      # a send: fresh buffer, side-stream copy now
same = w._sent.buffer.data_ptr() == ptr
torch.cuda.synchronize()
want = 7 * ImportWriter.BUFFER
print(f"A: the fresh device buffer took the freed tensor's memory: {same}; the pending sum read {total.item()}, "
      f"want {want}")
if total.item() != want:
    bad += 1
    print("A: FAIL - the side stream's copy landed under a kernel still pending on the step's stream")

# ---- part B: a dropped send's buffer freed while its side-stream copy runs -------------------------------------
w2 = ImportWriter(dst, BS)
w2.reserve()
torch.cuda.synchronize()
with torch.cuda.stream(w2._stream):
    torch.cuda._sleep(cycles)           # the side stream's copy engine is busy (a stand-in)
w2.write(w2.stage([(list(range(64)), rows)]), land=True)     # step k sends: the copy waits behind the sleep
freed = w2._sent.buffer.data_ptr()
w2.write(None, land=False)              # step k+1: the engine dropped them (a failed step): buffer dropped
y = torch.full((ImportWriter.BUFFER,), 3, dtype=torch.uint8, device="cuda")    # the step's stream allocates
got = y.sum(dtype=torch.int64)          # queued on the step's stream: runs at once, before the copy
torch.cuda.synchronize()
after = y.sum(dtype=torch.int64).item()
print(f"B: buffers left in rotation {len(w2._device)}; y took the dropped buffer's memory: {y.data_ptr() == freed}; "
      f"y's sum right after {got.item()}, once the copy ran {after}, want {3 * ImportWriter.BUFFER}")
if after != 3 * ImportWriter.BUFFER:
    bad += 1
    print("B: FAIL - the dropped send's copy overwrote a tensor the step's stream allocated after it")
sys.exit(1 if bad else 0)
