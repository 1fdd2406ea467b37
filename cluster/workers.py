"""Worker groups: N ranks that run every step together, as Ray actors or as plain processes.

Both implement the engine's ``Executor``: ``execute(steps) -> results`` (one step per rank, all ranks
every step), ``recover()`` (rebuild after a failure), ``shutdown()``. A rank that dies, fails setup or
overruns the step deadline raises ``GroupFailure`` within the deadline — nothing waits forever: every
comm phase inside a step is itself bounded by ``timeout_s``.

Steps travel over one connection per rank (``_serve``'s loop on the rank's side, ``_ConnGroup._collect`` on
the driver's): a pipe to a spawned process, or a TCP socket to a Ray actor (``step_channel: socket``; the
actor's node must accept the driver's connection on an ephemeral port, as Ray's own worker ports do).
``step_channel: ray`` sends steps as Ray actor calls instead (measured ~4× the per-step cost,
``bench/group_overhead.py``).
"""

from __future__ import annotations

import hmac
import itertools
import multiprocessing as mp
import os
import pickle
import select
import socket
import struct
import threading
import time
import uuid
from dataclasses import replace
from multiprocessing import connection as mp_connection
from typing import Any

from cluster.config import EngineConfig
from cluster.engine import GroupFailure
from scheduler.shapes import next_pow2
from workers.comm import DictRendezvous, Rendezvous
from workers.runner import StepResult, WorkerStep
from workers.worker import Worker, WorkerSpec


def worker_specs(cfg: EngineConfig, num_blocks: int, imports: bool = False,
                 setup_timeout_s: float = 300.0) -> list[WorkerSpec]:
    """Every rank's spec; ``num_blocks`` 0: the ranks size their KV pool to memory (``gpu_memory_utilization``);
    ``imports``: a decode replica of a disaggregated app (``WorkerSpec.imports``). A rank waits for its peers 0.9 of
    the group's ``setup_timeout_s``: the one that gives up first names the rank it waited for."""
    device = cfg.resolved_device()
    max_rows = cfg.num_workers * next_pow2(cfg.max_num_batched_tokens)
    return [WorkerSpec(model=cfg.model, rank=r, world_size=cfg.num_workers, moe=cfg.moe, comm=cfg.comm,
                       device=device, dtype=str(cfg.resolved_dtype()).removeprefix("torch."), kernels=cfg.kernels,
                       kernel_overrides=tuple(sorted(cfg.kernel_overrides().items())),
                       num_blocks=num_blocks, memory_fraction=cfg.gpu_memory_utilization, block_size=cfg.block_size,
                       host_blocks=cfg.host_blocks, max_rows=max_rows,
                       kv_fp8=cfg.kv_cache_dtype == "fp8",
                       timeout_s=min(cfg.step_timeout_s, 30.0), speculative=cfg.speculative_tokens > 0,
                       graphs=cfg.graphs_mode(), pieces=cfg.pieces(), lm_head_split=cfg.lm_head_split,
                       load_format=cfg.load_format, imports=imports, setup_timeout_s=0.9 * setup_timeout_s)
            for r in range(cfg.num_workers)]


# ---- Ray ------------------------------------------------------------------------------------------
def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_device(cfg: EngineConfig, timeout_s: float = 120.0, probe=_has_cuda) -> EngineConfig:
    """``device: auto`` decided where a Ray group's workers run, not in the replica that builds the group: that one
    asks Ray for no GPU, so it may sit on a node without any (a KubeRay head) or see none (Ray's old behaviour, back
    with ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1``), and resolving ``auto`` there put a GPU cluster's workers on the
    CPU. On a cluster with GPU resources a one-GPU task looks for CUDA instead (a CPU host's logical GPUs — tests, CPU
    runs — have none)."""
    import ray

    if cfg.device != "auto" or not ray.is_initialized():
        return cfg
    if ray.cluster_resources().get("GPU", 0) < 1:
        return replace(cfg, device="cpu")
    ref = ray.remote(num_gpus=1, num_cpus=0)(probe).remote()
    try:
        found = ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise GroupFailure(f"setup: device auto: no GPU of the cluster was free within {timeout_s:.0f} s to tell "
                           "whether its GPUs are CUDA devices; set device: cuda or cpu") from None
    return replace(cfg, device="cuda" if found else "cpu")


class RayRendezvous(Rendezvous):
    """Rendezvous over a small Ray actor (a key/value board), for one group generation."""

    poll_s = 0.02

    def __init__(self, board: Any, world_size: int, prefix: str):
        super().__init__(world_size, prefix)
        self.board = board

    def publish(self, key: str, value: Any) -> None:
        import ray

        ray.get(self.board.put.remote(self.prefix + key, value))

    def get(self, key: str) -> Any | None:
        import ray

        return ray.get(self.board.get.remote(self.prefix + key))


class _Board:
    def __init__(self):
        self.d: dict[str, Any] = {}

    def put(self, k: str, v: Any) -> None:
        self.d[k] = v

    def get(self, k: str) -> Any | None:
        return self.d.get(k)


class _WorkerActor:
    """The Ray actor around one ``Worker`` (synchronous: every rank issues its collectives in order)."""

    def __init__(self, spec: WorkerSpec, board: Any, prefix: str, worker_cls: type = Worker):
        self.worker = worker_cls(spec, RayRendezvous(board, spec.world_size, prefix))

    def ready(self) -> int:
        """Setup is done: the KV blocks this rank holds."""
        return self.worker.num_blocks

    def open_channel(self, token: bytes) -> tuple[str, int]:
        """Listen for the driver's step connection (the first that presents ``token``) on a thread that
        then runs ``_serve``; returns the address to connect to."""
        import ray

        host = ray.util.get_node_ip_address()
        server = _listen(host)
        threading.Thread(target=self._channel, args=(server, token), daemon=True, name="step-channel").start()
        return host, server.getsockname()[1]

    def _channel(self, server: socket.socket, token: bytes) -> None:
        with server:
            conn = _accept(server, token)
        self.worker.enter_thread()
        _serve(self.worker, conn)

    def execute(self, step: WorkerStep) -> StepResult:
        return self.worker.execute(step)

    def call(self, method: str, *args):
        """Run a diagnostic method of the worker (gates and tests); not on the serving path."""
        return getattr(self.worker, method)(*args)

    def close(self) -> None:
        self.worker.close()


# ---- the step channel: one connection per rank --------------------------------------------------------
def _serve(worker: Worker, conn) -> None:
    """A rank's step loop: a ``WorkerStep`` in, ``("ok", StepResult)`` or ``("error", text)`` out; ``None``
    closes the worker and ends the loop (so does the driver's side of the connection going away)."""
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):
            return
        try:
            _send(conn, ("ok", worker.close() if msg is None else worker.execute(msg)))
        except BaseException as e:
            _send(conn, ("error", f"{type(e).__name__}: {e}"))
        if msg is None:
            return


def _send(conn, obj, deadline: float | None = None) -> None:
    """One message of the channel: pickled by value, its large buffers (a transferred prompt's KV rows) out of band —
    written from where they lie, not copied into the pickle and out again. (``Connection.send``'s pickler would pass a
    tensor as a file descriptor of shared memory, which only processes of one multiprocessing family can open.) Past
    ``deadline`` (monotonic; the driver's side) it raises ``TimeoutError``: a rank that stopped reading holds no one."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    views = [buf.raw() for buf in buffers]
    frame = struct.pack(f"<QI{len(views)}Q", len(head), len(views), *(v.nbytes for v in views))
    for view in (memoryview(frame + head), *views):
        _transfer(conn.fileno(), view, True, deadline)


def _recv(conn, deadline: float | None = None):
    """A message ``_send`` sent: its buffers read straight into their own memory; ``deadline`` as ``_send``'s (an
    answer that stops arriving halfway fails at it too)."""
    fixed = bytearray(12)
    _transfer(conn.fileno(), memoryview(fixed), False, deadline)
    size, count = struct.unpack("<QI", fixed)
    rest = bytearray(8 * count + size)
    _transfer(conn.fileno(), memoryview(rest), False, deadline)
    buffers = [bytearray(n) for n in struct.unpack_from(f"<{count}Q", rest)]
    for buf in buffers:
        _transfer(conn.fileno(), memoryview(buf), False, deadline)
    return pickle.loads(memoryview(rest)[8 * count:], buffers=buffers)


def _transfer(fd: int, view: memoryview, write: bool, deadline: float | None) -> None:
    """All of ``view`` written to (read from) ``fd``. On a descriptor that does not block (the driver's, ``_driver``)
    a wait past ``deadline`` raises ``TimeoutError``; a rank's blocks (it has nothing else to do)."""
    while view.nbytes:
        try:
            n = os.write(fd, view) if write else os.readv(fd, [view])
        except BlockingIOError:
            poll = select.poll()
            poll.register(fd, select.POLLOUT if write else select.POLLIN)
            if not poll.poll(-1 if deadline is None else max(0.0, deadline - time.monotonic()) * 1000):
                raise TimeoutError(f"{view.nbytes} bytes not {'sent' if write else 'received'} in time") from None
            continue
        if n == 0 and not write:
            raise EOFError("the channel closed")
        view = view[n:]


def _driver(conn: mp_connection.Connection) -> mp_connection.Connection:
    """The driver's side of a rank's channel: its descriptor does not block, so a step's deadline holds while a
    rank stops reading or writing mid-message (session 56's fault review)."""
    os.set_blocking(conn.fileno(), False)
    return conn


def _listen(host: str) -> socket.socket:
    """A listening socket on ``host`` (IPv4 or IPv6), port chosen by the OS."""
    return socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)


def _accept(server: socket.socket, token: bytes) -> mp_connection.Connection:
    """The first connection to ``server`` whose first bytes are ``token`` (others are closed unread:
    nothing is unpickled from a peer before it shows the token)."""
    while True:
        sock, _ = server.accept()
        sock.settimeout(10.0)
        try:
            got = b""
            while len(got) < len(token) and (chunk := sock.recv(len(token) - len(got))):
                got += chunk
        except OSError:
            got = b""
        if hmac.compare_digest(got, token):
            return _connection(sock)
        sock.close()


def _connect(address: tuple[str, int], token: bytes, timeout_s: float) -> mp_connection.Connection:
    sock = socket.create_connection(address, timeout=timeout_s)
    sock.sendall(token)
    return _connection(sock)


def _connection(sock: socket.socket) -> mp_connection.Connection:
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)    # a header and a large body go out as two writes
    return mp_connection.Connection(sock.detach())


class _ConnGroup:
    """The driver's side of the channel: ``conns[r]`` reaches rank r; ``_dead(r)`` says why rank r is gone
    (None while it lives)."""

    conns: list[mp_connection.Connection]
    num_blocks: int         # each rank's KV blocks (0 before a first setup sized them to memory)

    def _dead(self, rank: int) -> str | None:
        return None

    def dead(self) -> str | None:
        """Between steps: why a rank is gone (its process ended; its channel closed: nothing else arrives between
        steps), or None (``Engine.probe``)."""
        for rank in range(len(self.conns)):
            if (why := self._dead(rank)) is not None:
                return f"rank {rank} died ({why})"
        ready = mp_connection.wait(self.conns, 0) if self.conns else []
        return f"rank {self.conns.index(ready[0])} died (its channel closed)" if ready else None

    def _collect(self, timeout_s: float, what: str) -> list:
        """One answer per rank; the first failure to arrive (an error, a dead rank) is the one reported."""
        deadline = time.monotonic() + timeout_s
        out: dict[int, Any] = {}
        while len(out) < len(self.conns):
            # block until a connection has an answer (or 50 ms pass: then look for dead ranks and the deadline)
            mp_connection.wait([c for r, c in enumerate(self.conns) if r not in out], timeout=0.05)
            for rank, conn in enumerate(self.conns):
                if rank in out:
                    continue
                if conn.poll():
                    try:
                        kind, value = _recv(conn, deadline)
                    except TimeoutError:
                        raise GroupFailure(f"{what}: rank {rank}'s answer did not arrive whole within "
                                           f"{timeout_s:.0f} s") from None
                    except (EOFError, OSError):
                        raise GroupFailure(f"{what}: rank {rank} died ({self._dead(rank) or 'connection closed'})") \
                            from None
                    if kind == "error":
                        raise GroupFailure(f"{what}: rank {rank} failed: {value}")
                    out[rank] = value
                elif (why := self._dead(rank)) is not None:
                    raise GroupFailure(f"{what}: rank {rank} died ({why})")
            if time.monotonic() > deadline:
                missing = [r for r in range(len(self.conns)) if r not in out]
                raise GroupFailure(f"{what}: rank(s) {missing} did not answer within {timeout_s:g} s")
        return [out[r] for r in range(len(self.conns))]

    def _sized(self, blocks: list[int]) -> None:
        """The ranks' KV blocks after setup: the pool sized to memory the first time (the ranks agree), held at that
        size when the group is rebuilt (``recover``)."""
        if len(set(blocks)) != 1 or (self.num_blocks and blocks[0] != self.num_blocks):
            raise GroupFailure(f"setup: the ranks hold different KV pools ({blocks} blocks; asked for "
                               f"{self.num_blocks or 'a pool sized to memory'})")
        self.num_blocks = blocks[0]

    def _send_all(self, steps: list, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for rank, (conn, step) in enumerate(zip(self.conns, steps)):
            try:
                _send(conn, step, deadline)
            except TimeoutError:
                raise GroupFailure(f"{what}: rank {rank} did not take its message within {timeout_s:.0f} s") \
                    from None
            except OSError:
                raise GroupFailure(f"{what}: rank {rank} died ({self._dead(rank) or 'connection closed'})") from None

    def _close_conns(self) -> None:
        """Ask every rank to close its worker (all at once: ipc rank 0 waits for its peers), briefly wait."""
        try:
            self._send_all([None] * len(self.conns), "shutdown", 10.0)
            self._collect(10.0, "shutdown")
        except GroupFailure:
            pass
        for conn in self.conns:
            conn.close()
        self.conns = []


# ---- Ray ------------------------------------------------------------------------------------------
class RayWorkerGroup(_ConnGroup):
    """N worker actors; on CPU each takes a logical GPU when the cluster has N of them, else none
    (``serve run`` on a fresh cluster sees 0 GPUs; CPU mode must not wait for GPUs it cannot get)."""

    def __init__(self, cfg: EngineConfig, num_blocks: int, setup_timeout_s: float = 300.0,
                 worker_cls: type = Worker, imports: bool = False):
        import ray

        self.cfg, self.num_blocks, self.setup_timeout_s, self.imports = cfg, num_blocks, setup_timeout_s, imports
        self.worker_cls = worker_cls          # injectable (tests use a worker whose setup fails)
        self._pg = None
        self._board = ray.remote(num_cpus=0)(_Board).remote()
        self._generation = itertools.count()
        self.actors: list[Any] = []
        self.conns = []
        self._start()

    def _actor_options(self) -> dict:
        """GPU mode: one GPU per rank, all ranks packed on one node (NCCL / IPC stay intra-node)."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        opts: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0}
        if self.cfg.resolved_device() == "cuda":
            if self._pg is None:
                self._pg = placement_group([{"GPU": 1}] * self.cfg.num_workers, strategy="STRICT_PACK")
                try:
                    ray.get(self._pg.ready(), timeout=self.setup_timeout_s)
                except ray.exceptions.GetTimeoutError:
                    raise GroupFailure(f"setup: no node offers {self.cfg.num_workers} GPUs "
                                       f"within {self.setup_timeout_s:.0f} s") from None
            opts.update(num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg))
        elif ray.cluster_resources().get("GPU", 0) >= self.cfg.num_workers:
            opts["num_gpus"] = 1
        return opts

    def _start(self) -> None:
        import ray

        prefix = f"g{next(self._generation)}-{uuid.uuid4().hex[:6]}/"
        cls = ray.remote(_WorkerActor).options(**self._actor_options())
        self.actors = [cls.remote(spec, self._board, prefix, self.worker_cls)
                       for spec in worker_specs(self.cfg, self.num_blocks, self.imports, self.setup_timeout_s)]
        try:
            self._sized(self._wait([a.ready.remote() for a in self.actors], self.setup_timeout_s, "setup"))
            if self.cfg.step_channel == "socket":
                token = os.urandom(32)
                addresses = self._wait([a.open_channel.remote(token) for a in self.actors], 30.0, "setup")
                try:
                    self.conns = [_driver(_connect(tuple(addr), token, 30.0)) for addr in addresses]
                except OSError as e:
                    raise GroupFailure(f"setup: cannot reach a rank's step channel ({e}); "
                                       "step_channel: ray sends steps as Ray calls instead") from None
        except GroupFailure:
            self._kill()
            raise

    def _wait(self, refs: list, timeout_s: float, what: str) -> list:
        """Results of all refs, failing as soon as any rank fails, or when the deadline passes."""
        import ray

        deadline = time.monotonic() + timeout_s
        done: dict[Any, Any] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise GroupFailure(f"{what}: rank(s) {sorted(refs.index(r) for r in pending)} did not answer within "
                                   f"{timeout_s:g} s")
            try:
                done[ready[0]] = ray.get(ready[0])
            except Exception as e:   # RayActorError (a dead rank), or the rank's own exception
                raise GroupFailure(f"{what}: rank {refs.index(ready[0])} failed: {_root_cause(e)}") from None
        return [done[r] for r in refs]

    def execute(self, steps: list[WorkerStep]) -> list[StepResult]:
        if self.conns:
            self._send_all(steps, "step", self.cfg.step_timeout_s)
            return self._collect(self.cfg.step_timeout_s, "step")
        refs = [a.execute.remote(s) for a, s in zip(self.actors, steps)]
        return self._wait(refs, self.cfg.step_timeout_s, "step")

    def recover(self) -> None:
        self._kill()
        self._start()

    def _kill(self) -> None:
        import ray

        for conn in self.conns:
            conn.close()
        self.conns = []
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []

    def shutdown(self) -> None:
        import ray

        if self.conns:
            self._close_conns()
        else:
            closing = [a.close.remote() for a in self.actors]    # all at once: ipc rank 0 waits for its peers
            try:
                ray.get(closing, timeout=10)
            except Exception:
                pass
        self._kill()
        ray.kill(self._board, no_restart=True)
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)


def _root_cause(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    tail = [line for line in msg if line and not line.startswith(" ")]
    return (tail[-1] if tail else type(e).__name__)[:500]


# ---- plain processes (no Ray: GPU benchmarks, tests) ----------------------------------------------
def _process_main(spec: WorkerSpec, board: Any, prefix: str, conn) -> None:
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())    # not its default multiprocessing lock: a named semaphore a killed rank leaks
    try:
        worker = Worker(spec, DictRendezvous(board, spec.world_size, prefix))
        _send(conn, ("ok", worker.num_blocks))
    except BaseException as e:
        _send(conn, ("error", f"{type(e).__name__}: {e}"))
        return
    _serve(worker, conn)


def _place_on_gpus(specs: list[WorkerSpec]) -> list[WorkerSpec]:
    if not specs or specs[0].device != "cuda":
        return specs
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        raise GroupFailure("setup: device is cuda but no CUDA GPU is visible to this process")
    return [replace(s, device=f"cuda:{s.rank % count}") for s in specs]


class ProcessWorkerGroup(_ConnGroup):
    """N ranks as spawned processes talking over pipes; same contract as ``RayWorkerGroup``. On CUDA rank r
    takes GPU r % (visible GPUs): one GPU each when there are N, else several share (ipc only: NCCL
    refuses two ranks on one GPU)."""

    def __init__(self, cfg: EngineConfig, num_blocks: int, setup_timeout_s: float = 300.0, imports: bool = False):
        self.cfg, self.num_blocks, self.setup_timeout_s, self.imports = cfg, num_blocks, setup_timeout_s, imports
        self._ctx = mp.get_context("spawn")
        self._manager = self._ctx.Manager()
        self._generation = itertools.count()
        self._start()

    def _start(self) -> None:
        self._board = board = self._manager.dict()
        self._prefix = prefix = f"g{next(self._generation)}/"
        self.conns, self.procs = [], []
        for spec in _place_on_gpus(worker_specs(self.cfg, self.num_blocks, self.imports, self.setup_timeout_s)):
            parent, child = self._ctx.Pipe()
            p = self._ctx.Process(target=_process_main, args=(spec, board, prefix, child), daemon=True)
            p.start()
            self.conns.append(_driver(parent))
            self.procs.append(p)
        try:
            self._sized(self._collect(self.setup_timeout_s, "setup"))
        except GroupFailure:
            self._kill()
            raise

    def _dead(self, rank: int) -> str | None:
        proc = self.procs[rank]
        return None if proc.is_alive() else f"exit code {proc.exitcode}"

    def execute(self, steps: list[WorkerStep]) -> list[StepResult]:
        self._send_all(steps, "step", self.cfg.step_timeout_s)
        return self._collect(self.cfg.step_timeout_s, "step")

    def recover(self) -> None:
        self._kill()
        self._start()

    def _kill(self) -> None:
        for p in self.procs:
            p.kill()
            p.join(5)
        self.procs, self.conns = [], []
        try:    # an ipc segment rank 0 made and no peer attached (it unlinks the name once all have): gone with it
            name = self._board.get(f"{self._prefix}ipc/shm")
            if name:
                os.unlink(f"/dev/shm/{name}")
                from multiprocessing import resource_tracker

                resource_tracker.unregister(f"/{name}", "shared_memory")     # (the ranks registered it with ours)
        except (OSError, EOFError):     # (already unlinked; the manager gone)
            pass

    def shutdown(self) -> None:
        self._close_conns()
        for p in self.procs:
            p.join(10)
        self._kill()
        self._manager.shutdown()
