"""``ipc`` comm backend: peer-mapped buffers with an epoch/parity flag protocol.

One region shared by the whole group, created by rank 0 and mapped by every rank:

    flags  int64 [parity=2][phase=3][src=N][8]   (one 64-byte line per flag word)
    AG     dtype [parity=2][row=region_rows][hidden]          one bucket; rank r writes its rows
    RS     dtype [parity=2][row=region_rows][src=N][hidden]   src writes its partial of row r at [r][src]

``region_rows`` = min(max_rows, REGION_ROWS): a bucket larger than the region (a big prefill step)
moves in consecutive phases of row chunks — every rank splits the same row map the same way, so the
phases stay in step — and the region's size stays bounded whatever ``max_num_batched_tokens`` is.

Protocol, per phase: ``epoch += 1``, ``parity = epoch % 2``; write this rank's data into
``[parity]``; publish ``flags[parity][phase][rank] = epoch``; spin until every rank's flag in
``[parity][phase]`` equals ``epoch`` (bounded: backoff, deadline -> ``CommTimeout`` naming the
phase, epoch and missing ranks); read. AG reads the bucket; RS sums ``[parity][my rows][0..N-1]``
in source order. Every rank waits on every peer in every phase, even when it reads nothing. A half holds
its elements at the widest dtype's stride (4 bytes), so consecutive phases of two dtypes (the lm_head's
split argmax: bf16 rows, then fp32 (max, index) pairs) never write into the half a peer still reads.

Why two parities are enough: a rank writes parity ``p`` at epoch ``e + 2`` only after its wait
at epoch ``e + 1`` saw every peer's flag ``e + 1``; a peer publishes ``e + 1`` only after it
finished epoch ``e`` — including reading parity ``p``. So nobody overwrites data (or a flag) a
peer still needs, and a flag can never skip ahead past the epoch a reader is waiting for.
Flags start at 0 and epochs at 1, so fresh memory never looks published. The phase index in
the flag turns a rank that called RS while its peers called AG into a timeout that says so.

CPU: POSIX shared memory. Rank 0 creates it (tracked by multiprocessing's resource tracker, so
even a killed creator leaves nothing behind once the tracker exits), publishes the name through
the rendezvous, and unlinks it as soon as every rank has attached (the setup barrier): from then
on no name exists in /dev/shm, and the memory goes away with the last mapping. Peers attach
without the resource tracker. Ordering: data is written before the flag word by the same thread
and x86 stores are not reordered with older stores (TSO); a weakly ordered CPU would need a
fence between them.

GPU: the AG/RS regions live in one ``cudaMalloc`` of rank 0 whose IPC handle peers open
(``cudaIpcOpenMemHandle``; also several processes on one GPU); flags stay in host shared memory,
polled by the host. The same allocation also holds the graph-shaped phases' regions and device-side
flags (``workers/comm_device.py``), which a captured decode step uses instead. Ordering: each phase's device work (this rank's copy into the region, and its
reads of the previous phases) is issued on its current stream, and ``publish`` first runs
``torch.cuda.current_stream().synchronize()``: the flag becomes visible only after those kernels
have completed, so a peer that sees the flag and then launches its reads finds the data in device
memory, and the two-parity argument above holds with "finished reading" meaning "its reading
kernels completed". Work a caller issues on other streams is not covered. These ragged phases cost a
host round trip each (prefill, mixed steps); graph steps use the device-side phases. Close is ordered too (see
``_create_cupy``): rank 0 frees the allocation only after every peer has unmapped it.
"""

from __future__ import annotations

import mmap
import os
import secrets
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np
import torch

from workers.comm import (
    CommTimeout,
    Rendezvous,
    StaticPhases,
    check_local_rows,
    check_partial,
    check_rowmap,
    ordered_sum,
    span_owner,
)
from workers.rowmap import Dp, RowMap, Span, rows_of, total_rows

PHASES = ("AG", "RS", "barrier")
REGION_ROWS = 2048  # bucket rows one ragged phase moves at most (8 ranks × H 6144 × 4 B: RS region 0.8 GB)
_FLAG_WORDS = 8  # int64 words per flag: one cache line, no false sharing between sources
_ALIGN = 4096
SHM_PREFIX = "glmserve_comm_"


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class IpcLayout:
    """Byte layout of the shared region (see module docstring). ``itemsize`` is the widest
    element a phase may move: the activation dtype's, or 4 so fp32 partials fit."""

    world_size: int
    max_rows: int
    hidden: int
    itemsize: int

    @property
    def flags_bytes(self) -> int:
        """The phase flags [2][3][N] and the close words [N] (``unmapped``, GPU only), 64 B each."""
        return _align((2 * len(PHASES) + 1) * self.world_size * _FLAG_WORDS * 8)

    @property
    def ag_bytes(self) -> int:
        return _align(2 * self.max_rows * self.hidden * self.itemsize)

    @property
    def rs_bytes(self) -> int:
        return _align(2 * self.max_rows * self.world_size * self.hidden * self.itemsize)


class IpcComm(StaticPhases):
    """Comm over peer-mapped buffers (see module docstring for layout and protocol).

    flags: int64 numpy view [2, 3, N, 8] of host shared memory; ag/rs: uint8 tensors holding
    the AG and RS regions (host shm or device memory); ``sync`` completes this rank's device work
    before a flag is published (a no-op on CPU); ``release`` unmaps (and unlinks if still named,
    and on the GPU frees in order) on close.
    """

    def __init__(self, rank: int, world_size: int, layout: IpcLayout, flags: np.ndarray, ag: torch.Tensor,
                 rs: torch.Tensor, timeout_s: float, sync: Callable[[], None],
                 release: Callable[[], None], device_region: torch.Tensor | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.layout = layout
        self.max_rows = layout.max_rows     # a row map's bound (``create`` sets it); the region may hold fewer
        self.timeout_s = timeout_s
        self.epoch = 0
        self._flags = flags
        self._ag, self._rs = ag, rs
        self._sync, self._release = sync, release
        self._closed = False
        self._device = None          # GPU: the graph-shaped phases with device-side flags (comm_device)
        if device_region is not None:
            from workers.comm_device import DevicePhases

            self._device = DevicePhases(rank, world_size, layout.hidden, device_region, timeout_s)

    @property
    def capturable(self) -> bool:
        """The graph-shaped phases can be captured in a CUDA graph (device-side flags, GPU only)."""
        return self._device is not None

    def all_gather_static(self, local_rows: torch.Tensor) -> torch.Tensor:
        if self._device is None:
            return super().all_gather_static(local_rows)
        return self._device.all_gather(local_rows)

    def reduce_scatter_static(self, partial: torch.Tensor) -> torch.Tensor:
        if self._device is None:
            return super().reduce_scatter_static(partial)
        return self._device.reduce_scatter(partial)

    def check(self) -> None:
        """Raise ``CommTimeout`` if a device-side wait expired (the ragged phases raise at once)."""
        if self._device is not None:
            self._device.check()

    @classmethod
    def create(cls, rank: int, world_size: int, rendezvous: Rendezvous, device: torch.device, max_rows: int,
               hidden: int, dtype: torch.dtype, timeout_s: float, region_rows: int = REGION_ROWS) -> IpcComm:
        """``max_rows`` bounds a row map; ``region_rows`` the rows one phase moves (larger buckets chunk)."""
        layout = IpcLayout(world_size, min(max_rows, max(region_rows, world_size)), hidden, max(dtype.itemsize, 4))
        if device.type == "cpu":
            comm = _create_shm(cls, rank, rendezvous, layout, timeout_s)
        elif device.type == "cuda":
            comm = _create_cupy(cls, rank, rendezvous, layout, device, timeout_s)
        else:
            raise ValueError(f"ipc comm supports cpu and cuda devices, got {device}")
        comm.max_rows = max_rows
        return comm

    # -- protocol ----------------------------------------------------------------------------

    def _region(self, which: str, dtype: torch.dtype, parity: int) -> torch.Tensor:
        """AG: [max_rows, H]; RS: [max_rows, N, H] — the ``parity`` half, viewed as ``dtype``."""
        if dtype.itemsize > self.layout.itemsize:
            raise ValueError(f"ipc comm buffers hold {self.layout.itemsize}-byte elements, got {dtype}")
        lay = self.layout
        shape = (lay.max_rows, lay.hidden) if which == "AG" else (lay.max_rows, lay.world_size, lay.hidden)
        per = int(np.prod(shape))                  # elements a half holds; halves sit at the widest element's stride,
        base = self._ag if which == "AG" else self._rs      # so phases of two dtypes in a row never overlap
        return base[parity * per * lay.itemsize:][: per * dtype.itemsize].view(dtype).view(shape)

    def poison(self) -> None:
        """Fill both regions with NaN bit patterns (0xFF bytes): tests check nothing stale leaks out.

        Not collective, and the regions are shared: every rank must have returned from ``poison``
        before any rank enters the next phase (a barrier, or a driver that waits for each)."""
        self._ag.fill_(255)
        self._rs.fill_(255)
        if self._device is not None:
            self._device.poison()
        self._sync()  # on the GPU: done before any peer can write its next phase

    def _begin(self) -> tuple[int, int]:
        if self._closed:
            raise RuntimeError("comm is closed")
        self.epoch += 1
        return self.epoch, self.epoch % 2

    def _publish_and_wait(self, phase: str, epoch: int) -> None:
        parity, ph = epoch % 2, PHASES.index(phase)
        self._sync()
        self._flags[parity, ph, self.rank, 0] = epoch
        flags = self._flags[parity, ph, :, 0]  # [N] view into shared memory
        deadline = time.monotonic() + self.timeout_s
        polls = 0
        while not (flags == epoch).all():
            polls += 1
            if polls < 64:
                continue
            if polls < 512:
                os.sched_yield()  # more ranks than cores: let the peer we wait on run
            else:
                time.sleep(min(1e-3, 1e-6 * (polls - 511)))
            if time.monotonic() > deadline:
                raise CommTimeout(self._missing_message(phase, epoch, flags))

    def _missing_message(self, phase: str, epoch: int, flags: np.ndarray) -> str:
        missing = [int(r) for r in np.nonzero(flags != epoch)[0]]
        seen = []
        for r in missing:
            per_phase = self._flags[:, :, r, 0]  # [2, 3]
            parity, ph = np.unravel_index(int(per_phase.argmax()), per_phase.shape)
            last = int(per_phase[parity, ph])
            seen.append(f"rank {r} last published {PHASES[ph]} epoch {last}" if last else f"rank {r} never published")
        return (f"{phase} epoch {epoch} on rank {self.rank}: ranks {missing} did not arrive within "
                f"{self.timeout_s:.1f}s ({'; '.join(seen)})")

    def _chunks(self, rowmap: RowMap) -> list[tuple[int, RowMap]]:
        """(first row, chunk row map) of the phases that move ``rowmap``: Dp splits each rank's stripe,
        Span its rows, so that every chunk's bucket fits the region."""
        if total_rows(rowmap) <= self.layout.max_rows:
            return [(0, rowmap)]
        if isinstance(rowmap, Dp):
            step = self.layout.max_rows // self.world_size
            return [(r, Dp(self.world_size, min(step, rowmap.rows_per_rank - r)))
                    for r in range(0, rowmap.rows_per_rank, step)]
        step = self.layout.max_rows
        return [(r, Span(self.world_size, min(step, rowmap.num_rows - r))) for r in range(0, rowmap.num_rows, step)]

    def all_gather(self, local_rows: torch.Tensor, rowmap: RowMap, owner: int) -> torch.Tensor:
        """AG. local_rows: [rows_per_rank, H] (Dp) or [num_rows, H] on the Span owner (ignored
        elsewhere). Returns a copy of the bucket [total_rows, H], identical on every rank."""
        check_rowmap(rowmap, self.world_size, self.max_rows)
        owner = span_owner(rowmap, owner)
        check_local_rows(local_rows, rowmap, self.rank, owner, self.layout.hidden)
        chunks = self._chunks(rowmap)
        if len(chunks) == 1:
            return self._all_gather(local_rows, rowmap, owner)
        parts = [self._all_gather(local_rows[r: r + len(rows_of(c, self.rank, owner))], c, owner) for r, c in chunks]
        if isinstance(rowmap, Span):
            return torch.cat(parts)
        H = self.layout.hidden
        return torch.cat([p.view(self.world_size, -1, H) for p in parts], dim=1).view(-1, H)

    def _all_gather(self, local_rows: torch.Tensor, rowmap: RowMap, owner: int) -> torch.Tensor:
        epoch, parity = self._begin()
        bucket = self._region("AG", local_rows.dtype, parity)  # [max_rows, H]
        mine = rows_of(rowmap, self.rank, owner)
        if len(mine):
            bucket[mine.start : mine.stop].copy_(local_rows)
        self._publish_and_wait("AG", epoch)
        return bucket[: total_rows(rowmap)].clone()

    def reduce_scatter(self, partial: torch.Tensor, rowmap: RowMap, owner: int) -> torch.Tensor:
        """RS. partial: [total_rows, H]. Returns [len(rows_of(rank)), H]: the sum over sources
        of this rank's rows, ((p_0 + p_1) + p_2) + ... in ``partial.dtype``."""
        check_rowmap(rowmap, self.world_size, self.max_rows)
        owner = span_owner(rowmap, owner)
        check_partial(partial, rowmap, self.layout.hidden)
        chunks = self._chunks(rowmap)
        if len(chunks) == 1:
            return self._reduce_scatter(partial, rowmap, owner)
        if isinstance(rowmap, Span):
            return torch.cat([self._reduce_scatter(partial[r: r + c.num_rows], c, owner) for r, c in chunks])
        stripes = partial.reshape(self.world_size, rowmap.rows_per_rank, -1)
        return torch.cat([self._reduce_scatter(stripes[:, r: r + c.rows_per_rank].reshape(-1, partial.shape[1]), c, 0)
                          for r, c in chunks])

    def _reduce_scatter(self, partial: torch.Tensor, rowmap: RowMap, owner: int) -> torch.Tensor:
        epoch, parity = self._begin()
        packets = self._region("RS", partial.dtype, parity)  # [max_rows, N_src, H]
        packets[: total_rows(rowmap), self.rank].copy_(partial)
        self._publish_and_wait("RS", epoch)
        mine = rows_of(rowmap, self.rank, owner)
        return ordered_sum(packets[mine.start : mine.stop].unbind(1))

    def barrier(self) -> None:
        epoch, _ = self._begin()
        self._publish_and_wait("barrier", epoch)

    def close(self) -> None:
        """Drop every view of the shared region, unmap it, unlink it if still named. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._flags = self._ag = self._rs = self._device = None  # type: ignore[assignment]
        self._release()


# ----------------------------------------------------------------------------- host shared memory


def _open_shared(rank: int, rendezvous: Rendezvous, size: int,
                 timeout_s: float) -> tuple[memoryview | mmap.mmap, Callable[[], None]]:
    """One POSIX shm segment of ``size`` bytes mapped by every rank -> (buffer, release).

    Rank 0 creates it (resource-tracked) and publishes the name; peers attach untracked; every
    rank meets at the ``ready`` barrier, after which rank 0 unlinks the name. ``release`` unmaps
    (unlinking first if setup never got that far); a view still alive keeps the mapping until exit.
    """
    shm = mapping = None
    if rank == 0:
        shm = shared_memory.SharedMemory(f"{SHM_PREFIX}{os.getpid()}_{secrets.token_hex(6)}", create=True,
                                         size=size)
        buf = shm.buf
    state = {"unlinked": rank != 0}

    def unlink() -> None:
        if not state["unlinked"]:
            state["unlinked"] = True
            try:
                shm.unlink()
            except FileNotFoundError:
                pass

    def release() -> None:
        unlink()
        try:
            shm.close() if shm is not None else mapping.close()
        except BufferError:  # a caller still holds a view; the mapping dies with the process
            pass

    try:
        if rank == 0:
            rendezvous.publish("ipc/shm", shm.name)
        else:
            mapping = _attach_untracked(rendezvous.wait("ipc/shm", timeout_s))
            buf = mapping
        rendezvous.wait_all_ready(rank, timeout_s)
    except BaseException:
        if shm is not None or mapping is not None:
            release()
        raise
    unlink()  # everyone is attached: the name is no longer needed
    return buf, release


def _views(buf, layout: IpcLayout) -> tuple[np.ndarray, np.ndarray, torch.Tensor, torch.Tensor]:
    """Split a mapped buffer into (flags [2, 3, N, 8] int64, unmapped [N, 8] int64, AG bytes, RS bytes);
    the AG/RS parts are empty when the buffer holds only the flags (the GPU keeps them on the device)."""
    base = torch.frombuffer(buf, dtype=torch.uint8)
    fb, ab = layout.flags_bytes, layout.ag_bytes
    words = base[: (2 * len(PHASES) + 1) * layout.world_size * _FLAG_WORDS * 8].view(torch.int64).numpy()
    flags = words[: 2 * len(PHASES) * layout.world_size * _FLAG_WORDS].reshape(
        2, len(PHASES), layout.world_size, _FLAG_WORDS)
    unmapped = words[2 * len(PHASES) * layout.world_size * _FLAG_WORDS :].reshape(layout.world_size, _FLAG_WORDS)
    return flags, unmapped, base[fb : fb + ab], base[fb + ab : fb + ab + layout.rs_bytes]


def _attach_untracked(name: str) -> mmap.mmap:
    """Map an existing segment without registering it with this process's resource tracker
    (Python < 3.13 registers attachers too, which would unlink the creator's segment)."""
    from _posixshmem import shm_open

    fd = shm_open("/" + name, os.O_RDWR, 0o600)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _create_shm(cls, rank: int, rendezvous: Rendezvous, layout: IpcLayout, timeout_s: float) -> IpcComm:
    """CPU: flags and the AG/RS regions all in one host shm segment."""
    buf, release = _open_shared(rank, rendezvous, layout.flags_bytes + layout.ag_bytes + layout.rs_bytes,
                                timeout_s)
    flags, _, ag, rs = _views(buf, layout)
    del buf
    return cls(rank, layout.world_size, layout, flags, ag, rs, timeout_s, lambda: None, release)


# ----------------------------------------------------------------------------- GPU: cupy IPC

# Allocations whose peers did not report unmapping before the close deadline: freeing them under a
# live peer mapping is undefined behaviour (CUDA IPC docs), so they stay until the process exits.
_LEAKED: list = []


def _create_cupy(cls, rank: int, rendezvous: Rendezvous, layout: IpcLayout, device: torch.device,
                 timeout_s: float) -> IpcComm:
    """Flags in host shm (as on CPU); AG/RS regions in one ``cudaMalloc`` of rank 0, which peers map
    through its IPC handle (``cudaIpcOpenMemHandle``; several processes on one GPU work too).

    Close: every rank synchronizes its device first (no kernel of its still touches the region);
    a peer unmaps (``cudaIpcCloseMemHandle``) and then sets ``unmapped[rank]`` in host shm; rank 0
    frees only once every peer has set it — freeing an exported allocation before an importer
    closes it is undefined — and, if a peer does not report within ``timeout_s`` (hung, or it died
    holding the mapping), keeps the allocation until exit (``_LEAKED``) and warns.
    """
    import cupy

    if not cupy.cuda.is_available():
        raise RuntimeError("ipc comm on cuda needs cupy with a visible CUDA device")
    index = device.index if device.index is not None else torch.cuda.current_device()
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    from workers.comm_device import DevicePhases

    data_bytes = layout.ag_bytes + layout.rs_bytes + DevicePhases.nbytes(layout.world_size, layout.hidden)
    owned, ptr = None, 0
    with cupy.cuda.Device(index):
        try:
            if rank == 0:
                owned = cupy.cuda.Memory(data_bytes)  # a raw cudaMalloc: its IPC handle maps exactly this block
                cupy.cuda.runtime.memset(owned.ptr, 0, data_bytes)
                cupy.cuda.runtime.deviceSynchronize()
                ptr = owned.ptr
                rendezvous.publish("ipc/cuda_handle", bytes(cupy.cuda.runtime.ipcGetMemHandle(ptr)))
            else:
                handle = rendezvous.wait("ipc/cuda_handle", timeout_s)
                ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle, cupy.cuda.runtime.cudaIpcMemLazyEnablePeerAccess)
            # owner None: the lifetime is ``release``'s business, not the tensors'
            mem = cupy.cuda.UnownedMemory(ptr, data_bytes, None, index)
            arr = cupy.ndarray((data_bytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
            data = torch.as_tensor(arr, device=device)  # [data_bytes] uint8, zero-copy
            assert data.data_ptr() == ptr
            buf, release_shm = _open_shared(rank, rendezvous, layout.flags_bytes, timeout_s)
        except BaseException:
            if rank != 0 and ptr:
                cupy.cuda.runtime.ipcCloseMemHandle(ptr)
            raise
    flags, unmapped, _, _ = _views(buf, layout)
    del buf, mem, arr
    state = {"owned": owned, "unmapped": unmapped}  # [N, 8] int64 in host shm
    del owned, unmapped

    def release() -> None:
        torch.cuda.synchronize(device)
        unmapped = state.pop("unmapped")
        if rank != 0:
            cupy.cuda.runtime.ipcCloseMemHandle(ptr)
            unmapped[rank, 0] = 1
        else:
            deadline = time.monotonic() + timeout_s
            while not (unmapped[1:, 0] == 1).all() and time.monotonic() < deadline:
                time.sleep(1e-3)
            peers = [r for r in range(1, layout.world_size) if unmapped[r, 0] != 1]
            if peers:
                _LEAKED.append(state["owned"])
                warnings.warn(f"ipc comm: ranks {peers} did not unmap the GPU buffer within {timeout_s:.1f}s; "
                              "rank 0 keeps it allocated until exit", RuntimeWarning, stacklevel=2)
            state["owned"] = None  # the last reference: cudaFree, unless leaked above
        del unmapped  # the last view of the host mapping
        release_shm()

    rs_end = layout.ag_bytes + layout.rs_bytes
    return cls(rank, layout.world_size, layout, flags, data[: layout.ag_bytes], data[layout.ag_bytes: rs_end],
               timeout_s, lambda: torch.cuda.current_stream(device).synchronize(), release, data[rs_end:])
