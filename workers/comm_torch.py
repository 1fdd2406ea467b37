"""``torch`` comm backend: torch.distributed (gloo on CPU, NCCL on GPU).

AG: ``Dp`` -> all_gather of every rank's stripe; ``Span`` -> broadcast from the owner.
RS: all_to_all_single with uneven splits delivers ``[N_src, my_rows, H]`` to each row owner,
which then adds the sources in order (``ordered_sum``) — never a library reduce.

Bounds: the process group is created with ``timeout=timeout_s``. Gloo honours it on every
collective (a missing peer raises after ``timeout_s``; we re-raise it as ``CommTimeout``). NCCL
collectives are asynchronous: what bounds them is the process-group watchdog, which with the
default ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` aborts the communicator and tears the process down
once a collective exceeds the same ``timeout``; the caller sees the worker die, not an
exception (the Ray worker group turns that into a failed step).

The group is the process's default process group, so one ``TorchComm`` per process.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from workers.comm import (
    CommError,
    CommTimeout,
    Rendezvous,
    StaticPhases,
    check_local_rows,
    check_partial,
    check_rowmap,
    ordered_sum,
    span_owner,
)
from workers.rowmap import Dp, RowMap, rows_of, total_rows

# torch >= 2.13 names it all_gather_single (all_gather_into_tensor warns there); older torch has only the latter
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class TorchComm(StaticPhases):
    """Comm over the default torch.distributed process group (see module docstring)."""

    def __init__(self, rank: int, world_size: int, device: torch.device, max_rows: int, hidden: int,
                 timeout_s: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.max_rows = max_rows
        self.hidden = hidden
        self.timeout_s = timeout_s
        self.epoch = 0  # counts phases, for error messages only
        self._closed = False

    @classmethod
    def create(cls, rank: int, world_size: int, rendezvous: Rendezvous, device: torch.device, max_rows: int,
               hidden: int, dtype: torch.dtype, timeout_s: float) -> TorchComm:
        """Rank 0 opens a TCPStore on a free port (port 0: no pick-then-bind race) and publishes
        the port; peers wait for it, so a failed rank 0 fails them fast through the rendezvous.
        Equivalent to ``init_method="tcp://127.0.0.1:PORT"``."""
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            # a bare "cuda" means the current device (set_device needs an index)
            device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
            torch.cuda.set_device(device)
        timeout = timedelta(seconds=timeout_s)
        if rank == 0:
            store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=timeout,
                                  wait_for_workers=False)
            rendezvous.publish("torch/port", store.port)
        # Every rank finishes its local setup before anyone blocks in C++ (the client connect
        # retries for the whole timeout if rank 0's store went away because a peer failed).
        rendezvous.wait_all_ready(rank, timeout_s)
        if rank != 0:
            port = rendezvous.wait("torch/port", timeout_s)
            store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        return cls(rank, world_size, device, max_rows, hidden, timeout_s)

    # Not capturable: a CUDA graph holding these NCCL calls hung at N = 2 on two H200s (torch 2.11; see
    # NOTES.md), so graph-shaped steps of a torch group run the static path eagerly; the ipc comm's
    # device-side phases are what a captured step uses.
    capturable = False

    def all_gather_static(self, local_rows: torch.Tensor) -> torch.Tensor:
        """[R, H] rows of every rank -> [N, R, H] (one all-gather into one tensor: fixed shapes, capturable)."""
        R, H = local_rows.shape
        out = torch.empty(self.world_size, R, H, dtype=local_rows.dtype, device=self.device)
        self._run("AG", lambda: _all_gather_single(out.view(-1, H), local_rows.contiguous()))
        return out

    def reduce_scatter_static(self, partial: torch.Tensor) -> torch.Tensor:
        """[N·R, H] partials of every rank's rows -> this rank's R rows summed over sources in order."""
        n, H = self.world_size, partial.shape[1]
        R = partial.shape[0] // n
        recv = torch.empty(n, R, H, dtype=partial.dtype, device=self.device)            # [N_src, R, H]
        self._run("RS", lambda: dist.all_to_all_single(recv.view(n * R, H), partial.contiguous()))
        return ordered_sum(recv.unbind(0))

    def _run(self, phase: str, fn) -> None:
        self.epoch += 1
        try:
            fn()
        except RuntimeError as exc:
            text = str(exc)
            if "timed out" in text.lower() or "timeout" in text.lower():
                raise CommTimeout(
                    f"{phase} epoch {self.epoch} on rank {self.rank}: a peer did not arrive within "
                    f"{self.timeout_s:.1f}s (missing ranks not reported by torch.distributed; {text})"
                ) from exc
            raise CommError(f"{phase} epoch {self.epoch} on rank {self.rank} failed: {text}") from exc

    def all_gather(self, local_rows: torch.Tensor, rowmap: RowMap, owner: int) -> torch.Tensor:
        """AG. local_rows: [rows_per_rank, H] (Dp) or [num_rows, H] on the Span owner (ignored on
        other ranks). Returns the bucket [total_rows, H], identical on every rank."""
        check_rowmap(rowmap, self.world_size, self.max_rows)
        owner = span_owner(rowmap, owner)
        check_local_rows(local_rows, rowmap, self.rank, owner, self.hidden)
        if isinstance(rowmap, Dp):
            bucket = torch.empty(total_rows(rowmap), self.hidden, dtype=local_rows.dtype, device=self.device)
            stripes = list(bucket.view(self.world_size, rowmap.rows_per_rank, self.hidden).unbind(0))
            self._run("AG", lambda: dist.all_gather(stripes, local_rows.contiguous()))
            return bucket
        if self.rank == owner:
            bucket = local_rows.contiguous().clone()
        else:
            bucket = torch.empty(rowmap.num_rows, self.hidden, dtype=local_rows.dtype, device=self.device)
        self._run("AG", lambda: dist.broadcast(bucket, src=owner))
        return bucket

    def reduce_scatter(self, partial: torch.Tensor, rowmap: RowMap, owner: int) -> torch.Tensor:
        """RS. partial: [total_rows, H] this rank's partial sums for all rows. Returns
        [len(rows_of(rank)), H]: sum over sources of this rank's rows, in source order."""
        check_rowmap(rowmap, self.world_size, self.max_rows)
        owner = span_owner(rowmap, owner)
        check_partial(partial, rowmap, self.hidden)
        n = self.world_size
        send_splits = [len(rows_of(rowmap, dst, owner)) for dst in range(n)]
        num_mine = send_splits[self.rank]
        recv = torch.empty(n, num_mine, self.hidden, dtype=partial.dtype, device=self.device)  # [N_src, R, H]
        self._run("RS", lambda: dist.all_to_all_single(
            recv.view(n * num_mine, self.hidden), partial.contiguous(),
            output_split_sizes=[num_mine] * n, input_split_sizes=send_splits))
        return ordered_sum(recv.unbind(0))

    def barrier(self) -> None:
        if self.device.type == "cuda":  # NCCL: name the device rather than let torch guess it
            self._run("barrier", lambda: dist.barrier(device_ids=[self.device.index]))
        else:
            self._run("barrier", dist.barrier)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if dist.is_initialized():
            dist.destroy_process_group()
