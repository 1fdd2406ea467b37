"""MoE phase communication: all-gather (AG) and reduce-scatter (RS) of a step's bucket.

One interface, two backends (chosen once by ``make_comm``):

- ``torch`` (``workers/comm_torch.py``): torch.distributed — gloo on CPU, NCCL on GPU.
- ``ipc``   (``workers/comm_ipc.py``): peer-mapped buffers with an epoch/parity flag protocol —
  POSIX shared memory on CPU (so CI runs the GPU protocol), cupy IPC buffers on GPU.

Both return bit-identical results: AG is a copy, and RS moves every source's partials to the
row's owner and adds them in fixed source order (``ordered_sum``), never through a library
reduce whose order is unspecified.

The rendezvous (``Rendezvous``) is a tiny key/value board used only during setup: rank 0
publishes what peers need (a shm name, a store port, IPC handles), everyone publishes
``ready``; a rank whose setup fails publishes an error marker so its peers fail fast, naming it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from workers.rowmap import Dp, RowMap, Span, rows_of, total_rows


class CommError(RuntimeError):
    """A comm phase or setup failed (a peer died, a peer's setup failed, ...)."""


class CommTimeout(CommError):
    """A peer did not arrive within the deadline; the message names phase, epoch, missing ranks."""


class CommSetupError(CommError):
    """A peer published a setup failure; the message names the failed rank(s)."""


class Comm(Protocol):
    """The MoE phase collectives of one worker group (one instance per rank)."""

    rank: int
    world_size: int

    def all_gather(self, local_rows: torch.Tensor, rowmap: RowMap, owner: int) -> torch.Tensor:
        """AG: [R_local, H] this rank's rows -> [total_rows, H] bucket, identical on every rank.

        Dp: R_local = rows_per_rank, bucket = rank-major concatenation. Span: the owner passes
        [num_rows, H]; other ranks pass any tensor of the same dtype (e.g. [0, H]), whose
        dtype picks the bucket dtype. ``owner`` is a host int, ignored by Dp.
        """
        ...

    def reduce_scatter(self, partial: torch.Tensor, rowmap: RowMap, owner: int) -> torch.Tensor:
        """RS: [total_rows, H] partials (same dtype on every rank) -> [R_local, H]: the sum over
        sources of this rank's rows, ((p_0 + p_1) + p_2) + ... in the partials' dtype.

        Dp: R_local = rows_per_rank; Span: the owner gets [num_rows, H], the others [0, H].
        """
        ...

    def all_gather_static(self, local_rows: torch.Tensor) -> torch.Tensor:
        """The graph-shaped AG: every rank passes exactly [R, H] (pads included) -> [N, R, H] on every rank.
        Shapes and the phase sequence are fixed, so a captured graph can replay it (``StaticPhases``)."""
        ...

    def reduce_scatter_static(self, partial: torch.Tensor) -> torch.Tensor:
        """The graph-shaped RS: [N·R, H] partials (rank-major stripes) -> [R, H], this rank's stripe summed
        over sources in order."""
        ...

    def barrier(self) -> None:
        """Every rank has reached this point (bounded by the comm timeout)."""
        ...

    def close(self) -> None:
        """Release the process group / shared buffers. Idempotent."""
        ...


# ----------------------------------------------------------------------------- rendezvous


class Rendezvous:
    """Setup-time key/value board shared by one worker group.

    Subclasses implement ``publish`` and ``get`` (non-blocking, ``None`` if absent); ``wait``
    and the error markers are built on them. Keys are namespaced by ``prefix`` so one board can
    serve several groups. Values must be picklable.
    """

    poll_s = 0.002

    def __init__(self, world_size: int, prefix: str = "") -> None:
        self.world_size = world_size
        self.prefix = prefix

    def publish(self, key: str, value: Any) -> None:
        raise NotImplementedError

    def get(self, key: str) -> Any | None:
        raise NotImplementedError

    def fail(self, rank: int, message: str) -> None:
        """Mark ``rank``'s setup as failed; every peer's ``wait`` raises ``CommSetupError``."""
        self.publish(f"error/{rank}", message)

    def check_failures(self) -> None:
        failed = {r: m for r in range(self.world_size) if (m := self.get(f"error/{r}")) is not None}
        if failed:
            detail = "; ".join(f"rank {r}: {m}" for r, m in failed.items())
            raise CommSetupError(f"comm setup failed on rank(s) {sorted(failed)}: {detail}")

    def wait(self, key: str, timeout: float) -> Any:
        """Block until ``key`` is published (-> value); raise if a peer failed or on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.get(key)
            if value is not None:
                return value
            self.check_failures()
            if time.monotonic() > deadline:
                raise CommTimeout(f"rendezvous: key {key!r} not published within {timeout:.1f}s")
            time.sleep(self.poll_s)

    def wait_all_ready(self, rank: int, timeout: float, tag: str = "ready") -> None:
        """Publish ``rank`` ready and wait for every rank (a setup barrier that fails fast)."""
        self.publish(f"{tag}/{rank}", True)
        deadline = time.monotonic() + timeout
        while True:
            missing = [r for r in range(self.world_size) if self.get(f"{tag}/{r}") is None]
            if not missing:
                return
            self.check_failures()
            if time.monotonic() > deadline:
                raise CommTimeout(f"rendezvous: ranks {missing} not {tag} within {timeout:.1f}s")
            time.sleep(self.poll_s)


class DictRendezvous(Rendezvous):
    """Rendezvous over a dict shared between processes (``multiprocessing.Manager().dict()``)."""

    def __init__(self, board: Any, world_size: int, prefix: str = "") -> None:
        super().__init__(world_size, prefix)
        self.board = board

    def publish(self, key: str, value: Any) -> None:
        self.board[self.prefix + key] = value

    def get(self, key: str) -> Any | None:
        return self.board.get(self.prefix + key)


# ----------------------------------------------------------------------------- shared helpers


class StaticPhases:
    """``all_gather_static`` / ``reduce_scatter_static`` as the backend's own Dp phases of R rows per rank
    (host-driven: run eagerly); a backend whose phases a CUDA graph can record overrides them and sets
    ``capturable``.
    ``check`` raises what a device-side wait recorded (nothing here: these phases raise at once)."""

    capturable = False

    def check(self) -> None:
        pass

    def all_gather_static(self, local_rows: torch.Tensor) -> torch.Tensor:
        R, H = local_rows.shape
        return self.all_gather(local_rows, Dp(self.world_size, R), 0).view(self.world_size, R, H)

    def reduce_scatter_static(self, partial: torch.Tensor) -> torch.Tensor:
        return self.reduce_scatter(partial, Dp(self.world_size, partial.shape[0] // self.world_size), 0)


def ordered_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """((p_0 + p_1) + p_2) + ... in the parts' dtype; the fixed order makes RS bit-reproducible.

    parts: N tensors of one shape (e.g. [R, H]); returns a new tensor of that shape.
    """
    out = parts[0].clone()
    for p in parts[1:]:
        out.add_(p)
    return out


def check_local_rows(local_rows: torch.Tensor, rowmap: RowMap, rank: int, owner: int, hidden: int) -> int:
    """Validate AG input; returns the number of rows this rank contributes."""
    num_local = len(rows_of(rowmap, rank, owner))
    if num_local and tuple(local_rows.shape) != (num_local, hidden):
        raise ValueError(
            f"all_gather: rank {rank} must pass [{num_local}, {hidden}] rows for {rowmap!r} "
            f"(owner {owner}), got {tuple(local_rows.shape)}"
        )
    return num_local


def check_partial(partial: torch.Tensor, rowmap: RowMap, hidden: int) -> None:
    """Validate RS input: [total_rows, H]."""
    if tuple(partial.shape) != (total_rows(rowmap), hidden):
        raise ValueError(
            f"reduce_scatter: partial must be [{total_rows(rowmap)}, {hidden}] for {rowmap!r}, "
            f"got {tuple(partial.shape)}"
        )


def check_rowmap(rowmap: RowMap, world_size: int, max_rows: int) -> None:
    if rowmap.num_ranks != world_size:
        raise ValueError(f"{rowmap!r} is for {rowmap.num_ranks} ranks, comm has {world_size}")
    if total_rows(rowmap) > max_rows:
        raise ValueError(f"{rowmap!r} has {total_rows(rowmap)} rows > comm max_rows={max_rows}")


def span_owner(rowmap: RowMap, owner: int) -> int:
    """The owner to use for a phase (Dp ignores it; Span needs a valid rank)."""
    if isinstance(rowmap, Span) and not 0 <= owner < rowmap.num_ranks:
        raise ValueError(f"span owner {owner} out of range for {rowmap!r}")
    return owner if isinstance(rowmap, Span) else 0


def make_comm(
    backend: str,
    rank: int,
    world_size: int,
    *,
    rendezvous: Rendezvous,
    device: torch.device | str,
    max_rows: int,
    hidden: int,
    dtype: torch.dtype,
    timeout_s: float = 30.0,
) -> Comm:
    """Build this rank's ``Comm``; every rank of the group calls it with the same arguments.

    ``max_rows`` bounds ``total_rows`` of any row map; ``dtype`` is the activation dtype (the
    ipc buffers also fit fp32 partials). ``timeout_s`` bounds setup and every phase. On a setup
    error this rank publishes an error marker (peers raise ``CommSetupError`` naming it) and
    re-raises.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} out of range for world_size {world_size}")
    try:
        if max_rows < 1 or hidden < 1:
            raise ValueError(f"make_comm needs max_rows >= 1 and hidden >= 1, got {max_rows}, {hidden}")
        if backend == "torch":
            from workers.comm_torch import TorchComm

            return TorchComm.create(rank, world_size, rendezvous, torch.device(device), max_rows, hidden,
                                    dtype, timeout_s)
        if backend == "ipc":
            from workers.comm_ipc import IpcComm

            return IpcComm.create(rank, world_size, rendezvous, torch.device(device), max_rows, hidden,
                                  dtype, timeout_s)
        raise ValueError(f"unknown comm backend {backend!r} (expected 'torch' or 'ipc')")
    except CommSetupError:
        raise
    except BaseException as exc:
        # A peer that failed first may be why we failed (e.g. its store went away): name it.
        try:
            rendezvous.check_failures()
        except CommSetupError as peer_failed:
            raise peer_failed from exc
        rendezvous.fail(rank, f"{type(exc).__name__}: {exc}")
        raise
