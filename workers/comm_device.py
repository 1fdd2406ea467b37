"""Graph-shaped AG/RS of the ``ipc`` comm with device-side flags: no host round trip, CUDA-graph capturable.

The ragged phases of ``comm_ipc`` poll flags from the host (a stream sync and a host wait per phase);
a captured decode step cannot do that. Here every phase is two Triton launches on the rank's stream:

- ``put``: copy this rank's rows into the shared region's ``[parity]`` half; the last program to finish
  (a per-rank arrival counter) publishes ``flags[parity][phase][rank] = epoch`` with a release store at
  system scope, after the other programs' writes (acquire-release through the counter).
- ``get``: spin (acquire loads) until every rank's flag for this phase reads ``epoch``, then copy the
  gathered rows out (AG) or add the sources' partials in source order (RS, rounding to the dtype after
  every add, as ``ordered_sum``); the last program to finish advances the rank's epoch.

The epoch is a device counter, so a graph replay continues the sequence; every rank runs the same
sequence of graph-shaped phases (the engine marks graph steps for all ranks alike), and these phases
use their own regions and flags, so the ragged phases interleave freely. Two parities suffice by the
argument of ``comm_ipc``. A wait is bounded by a spin count (≈ ``timeout_s``); on expiry the kernel
records the epoch in an error word and lets later waits fall through, and ``check()`` (after the step)
raises ``CommTimeout`` naming the ranks whose flags are behind.

Shared region (inside the ipc allocation), for R ≤ S = ``graph_rows(N)`` rows per rank (a graph step's most),
element size 4 (a phase of a 2-byte dtype fills the front of each half, whose stride stays the 4-byte one: phases
of two dtypes in a row never overlap):

    flags  int64 [parity=2][phase=2][src=N][16]        one 128-byte line per flag
    AG     [parity=2][src=N][S·H]                      src writes its rows in its slot
    RS     [parity=2][dst=N][src=N][S·H]               src writes its partial of dst's stripe
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from scheduler.shapes import graph_rows
from workers.comm import CommTimeout

LINE = 16                      # int64 words per flag
PHASES = ("AG", "RS")
BLOCK = 1024
SPINS_PER_S = 1_000_000        # spin iterations per second of timeout (one round of N flag loads ≳ 1 µs)


@triton.jit
def _put_kernel(src_ptr, region_ptr, flags_ptr, state_ptr, rank, N, n_elems, part_stride, dst_stride,
                slot_stride, parity_stride, PHASE: tl.constexpr, LINE_: tl.constexpr, BLOCK_: tl.constexpr):
    """src part d (grid axis 1) → region[parity][d][rank]; the last program publishes the flag."""
    d = tl.program_id(1)
    e = tl.load(state_ptr) + 1                                        # this phase's epoch
    parity = e % 2
    offs = tl.program_id(0) * BLOCK_ + tl.arange(0, BLOCK_)
    m = offs < n_elems
    x = tl.load(src_ptr + d * part_stride + offs, mask=m)
    tl.store(region_ptr + parity * parity_stride + d * dst_stride + rank * slot_stride + offs, x, mask=m)
    total = tl.num_programs(0) * tl.num_programs(1)
    arrived = tl.atomic_add(state_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if arrived == total - 1:
        tl.atomic_xchg(state_ptr + 1, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(flags_ptr + ((parity * 2 + PHASE) * N + rank) * LINE_, e, sem="release", scope="sys")


@triton.jit
def _get_kernel(region_ptr, out_ptr, flags_ptr, state_ptr, N, n_elems, max_spins, parity_stride, mine_offset,
                src_stride, SUM: tl.constexpr, PHASE: tl.constexpr, LINE_: tl.constexpr, NP2: tl.constexpr,
                BLOCK_: tl.constexpr):
    """Wait for every rank's flag, then AG: out[s] = region[parity][s] (s = grid axis 1), or RS: out =
    ((p_0 + p_1) + p_2) + … over region[parity][rank][s]; the last program advances the epoch."""
    e = tl.load(state_ptr) + 1
    parity = e % 2
    src = tl.arange(0, NP2)
    live = src < N
    flag = flags_ptr + ((parity * 2 + PHASE) * N + src) * LINE_
    ready = (tl.load(state_ptr + 2) != 0).to(tl.int32)                # an earlier wait expired: fall through
    spins = 0
    while (ready == 0) & (spins < max_spins):
        seen = tl.atomic_add(flag, 0, mask=live, sem="acquire", scope="sys")
        ready = tl.min(tl.where(live, (seen == e).to(tl.int32), 1), axis=0)
        spins += 1
    if ready == 0:
        tl.atomic_max(state_ptr + 2, e, sem="relaxed", scope="gpu")
    offs = tl.program_id(0) * BLOCK_ + tl.arange(0, BLOCK_)
    m = offs < n_elems
    base = region_ptr + parity * parity_stride + mine_offset
    if SUM:
        acc = tl.load(base + offs, mask=m, other=0.0)
        for s in range(1, N):
            part = tl.load(base + s * src_stride + offs, mask=m, other=0.0)
            acc = (acc.to(tl.float32) + part.to(tl.float32)).to(acc.dtype)
        tl.store(out_ptr + offs, acc, mask=m)
    else:
        s = tl.program_id(1)
        tl.store(out_ptr + s * n_elems + offs, tl.load(base + s * src_stride + offs, mask=m), mask=m)
    total = tl.num_programs(0) * tl.num_programs(1)
    arrived = tl.atomic_add(state_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if arrived == total - 1:
        tl.atomic_xchg(state_ptr + 1, 0, sem="relaxed", scope="gpu")
        tl.store(state_ptr, e)


class DevicePhases:
    """``all_gather_static`` / ``reduce_scatter_static`` over ``region`` (uint8, mapped by every rank at
    the same layout; see the module docstring) with this rank's epoch, arrival counter and error word
    in local device memory. ``max_spins`` bounds a wait (default: from ``timeout_s``)."""

    def __init__(self, rank: int, world_size: int, hidden: int, region: torch.Tensor, timeout_s: float,
                 max_spins: int | None = None):
        self.rank, self.world_size, self.hidden, self.timeout_s = rank, world_size, hidden, timeout_s
        self.rows = graph_rows(world_size)
        N, slot = world_size, self.rows * hidden
        fb = _flags_bytes(N)
        self._flags = region[:fb].view(torch.int64)
        self._ag = region[fb: fb + 2 * N * slot * 4]
        self._rs = region[fb + 2 * N * slot * 4: fb + 2 * N * slot * 4 + 2 * N * N * slot * 4]
        self._state = torch.zeros(3, dtype=torch.int64, device=region.device)   # epoch, arrivals, expired epoch
        if region.is_cuda:                          # ``check`` reads the expired epoch on a stream of its own
            self._side = torch.cuda.Stream(region.device)
            # ... after the zeros above: a side-stream read may otherwise run before them and see the allocator's
            # leftover bytes (a check right after setup read 0x0101…01 as an expired epoch on a cold GPU)
            self._side.wait_stream(torch.cuda.current_stream(region.device))
            self._expired_host = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self._max_spins = max_spins or int(min(2 ** 31 - 1, max(1.0, timeout_s) * SPINS_PER_S))

    @staticmethod
    def nbytes(world_size: int, hidden: int) -> int:
        slot = graph_rows(world_size) * hidden * 4
        return _flags_bytes(world_size) + 2 * world_size * slot + 2 * world_size * world_size * slot

    def all_gather(self, local_rows: torch.Tensor) -> torch.Tensor:
        """[R, H] this rank's rows (R ≤ ``self.rows``, pads included) → [N, R, H] every rank's."""
        self.put("AG", local_rows)
        return self.get("AG", local_rows.shape[0], local_rows.dtype)

    def reduce_scatter(self, partial: torch.Tensor) -> torch.Tensor:
        """[N·R, H] partials (rank-major stripes) → [R, H]: this rank's stripe summed over sources in order."""
        self.put("RS", partial)
        return self.get("RS", partial.shape[0] // self.world_size, partial.dtype)

    def put(self, phase: str, x: torch.Tensor) -> None:
        """The first half of a phase (no wait): AG x = [R, H]; RS x = [N·R, H]."""
        N, H = self.world_size, self.hidden
        R = x.shape[0] // (N if phase == "RS" else 1)
        self._check_shape(R, x.shape[1], x.dtype)
        slot, n = self.rows * H, R * H
        wide = 4 // x.dtype.itemsize                # halves at 4-byte elements' stride: dtypes may alternate
        if phase == "AG":
            dsts, dst_stride, parity_stride = 1, 0, N * slot * wide
        else:
            dsts, dst_stride, parity_stride = N, N * slot, N * N * slot * wide
        _put_kernel[(triton.cdiv(n, BLOCK), dsts)](
            x.contiguous(), self._region(phase, x.dtype), self._flags, self._state, self.rank, N, n, n, dst_stride,
            slot, parity_stride, PHASE=PHASES.index(phase), LINE_=LINE, BLOCK_=BLOCK)

    def get(self, phase: str, R: int, dtype: torch.dtype) -> torch.Tensor:
        """The second half: wait for every rank's put, then AG → [N, R, H]; RS → [R, H]."""
        N, H = self.world_size, self.hidden
        slot, n = self.rows * H, R * H
        wide = 4 // dtype.itemsize
        if phase == "AG":
            out = torch.empty(N, R, H, dtype=dtype, device=self._state.device)
            sources, parity_stride, mine = N, N * slot * wide, 0
        else:
            out = torch.empty(R, H, dtype=dtype, device=self._state.device)
            sources, parity_stride, mine = 1, N * N * slot * wide, self.rank * N * slot
        _get_kernel[(triton.cdiv(n, BLOCK), sources)](
            self._region(phase, dtype), out, self._flags, self._state, N, n, self._max_spins, parity_stride, mine,
            slot, SUM=phase == "RS", PHASE=PHASES.index(phase), LINE_=LINE, NP2=triton.next_power_of_2(N),
            BLOCK_=BLOCK)
        return out

    def _region(self, phase: str, dtype: torch.dtype) -> torch.Tensor:
        return (self._ag if phase == "AG" else self._rs).view(dtype)

    def check(self) -> None:
        """Raise ``CommTimeout`` if a wait of this rank expired. Call it once the step's work is done (its tokens read):
        on CUDA the error word is read on a side stream, so this does not wait for a step launched ahead behind it on
        the rank's stream (whose expiry a later check reports)."""
        expired = self._expired()
        if expired:
            flags = self._flags.view(2, len(PHASES), self.world_size, LINE)[expired % 2, :, :, 0].tolist()
            behind = {PHASES[p]: [r for r, v in enumerate(row) if v != expired] for p, row in enumerate(flags)}
            raise CommTimeout(f"device phase epoch {expired} on rank {self.rank}: peers did not publish within "
                              f"~{self.timeout_s:.1f}s (ranks behind per phase: {behind})")

    def _expired(self) -> int:
        if not self._state.is_cuda:
            return int(self._state[2])
        with torch.cuda.stream(self._side):
            self._expired_host.copy_(self._state[2:3], non_blocking=True)
        self._side.synchronize()
        return int(self._expired_host[0])

    def poison(self) -> None:
        """NaN bit patterns over both data regions (flags untouched)."""
        self._ag.fill_(255)
        self._rs.fill_(255)

    def _check_shape(self, R: int, H: int, dtype: torch.dtype) -> None:
        if not 1 <= R <= self.rows or H != self.hidden or dtype.itemsize > 4:
            raise ValueError(f"device phases take 1..{self.rows} rows of hidden {self.hidden} in a ≤ 4-byte "
                             f"dtype, got [{R}, {H}] {dtype}")


def _flags_bytes(world_size: int) -> int:
    return 2 * len(PHASES) * world_size * LINE * 8
