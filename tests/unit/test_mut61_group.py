"""Session 61's mutation review of the worker-group plumbing (``cluster/workers.py``, ``workers/worker.py``,
``workers/comm*.py``, ``workers/memory.py``, ``cluster/metrics_hub.py``): each test here kills a plausible bug the
suite let through — a deadline off by a factor, a step's results or messages on the wrong rank, a dead rank found
only at the deadline, a failure marked on the wrong rank, a device-side expiry never checked, a metric on the wrong
label. CPU only, no Ray, no processes."""

from __future__ import annotations

import os
import socket
import threading
import time
import types
from multiprocessing import connection as mp_connection

import pytest
import torch

from cluster.config import EngineConfig
from cluster.engine import GroupFailure
from cluster.workers import _ConnGroup, _driver, _recv, _root_cause, _send, worker_specs
from scheduler.shapes import StepShape, next_pow2
from workers.comm import CommSetupError, DictRendezvous, check_rowmap, make_comm, span_owner
from workers.rowmap import Dp, Span


# ---- worker specs: the deadlines and bounds every rank gets -------------------------------------------------------
def test_worker_specs_carry_the_groups_deadlines_and_row_bound():
    """A rank waits 0.9 of the group's setup deadline for its peers (the one giving up first names whom it waited
    for, before the driver's own deadline); a comm phase is bounded by the step deadline, at most 30 s; a bucket holds
    every rank's batched tokens."""
    cfg = EngineConfig(num_workers=2, step_timeout_s=120.0, max_num_batched_tokens=300, device="cpu")
    specs = worker_specs(cfg, 8, setup_timeout_s=100.0)
    assert [s.rank for s in specs] == [0, 1] and all(s.world_size == 2 for s in specs)
    assert all(s.setup_timeout_s == pytest.approx(90.0) for s in specs)
    assert all(s.timeout_s == 30.0 for s in specs)
    assert all(s.max_rows == 2 * next_pow2(300) for s in specs)
    short = worker_specs(EngineConfig(num_workers=2, step_timeout_s=5.0, device="cpu"), 8)
    assert all(s.timeout_s == 5.0 for s in short)


# ---- the step channel: two ranks over socket pairs ---------------------------------------------------------------
def _pairs(n: int) -> tuple[_ConnGroup, list[mp_connection.Connection]]:
    group, ranks = _ConnGroup(), []
    group.conns = []
    for _ in range(n):
        a, b = socket.socketpair()
        group.conns.append(_driver(mp_connection.Connection(a.detach())))
        ranks.append(mp_connection.Connection(b.detach()))
    return group, ranks


def _close(group: _ConnGroup, ranks: list) -> None:
    for c in [*group.conns, *ranks]:
        c.close()


def test_each_rank_gets_its_own_step_and_the_results_come_back_in_rank_order():
    """Rank 1 answers before rank 0: the results are still [rank 0's, rank 1's] (the engine reads rank r's rows
    from result r), and step r went to rank r."""
    group, ranks = _pairs(2)
    try:
        group._send_all(["step0", "step1"], "step", 5.0)
        assert [_recv(r) for r in ranks] == ["step0", "step1"]
        _send(ranks[1], ("ok", "from1"))
        timer = threading.Timer(0.2, lambda: _send(ranks[0], ("ok", "from0")))
        timer.start()
        assert group._collect(5.0, "step") == ["from0", "from1"]
        timer.join()
    finally:
        _close(group, ranks)


def test_a_silent_rank_fails_the_step_at_its_deadline_naming_it():
    group, ranks = _pairs(2)
    try:
        _send(ranks[0], ("ok", 1))
        started = time.monotonic()
        with pytest.raises(GroupFailure, match=r"^step: rank\(s\) \[1\] did not answer within 0.3 s$"):
            group._collect(0.3, "step")
        assert 0.25 < time.monotonic() - started < 2.0
    finally:
        _close(group, ranks)


def test_a_dead_ranks_process_fails_the_step_at_once_not_at_the_deadline():
    """A rank whose process is gone (``_dead``) while its channel stays open (a Ray actor's socket held by the
    node) fails the step within the 50 ms polls, naming why."""
    class Group(_ConnGroup):
        def _dead(self, rank):
            return "exit code -9" if rank == 1 else None

    group, ranks = _pairs(2)
    dead = Group()
    dead.conns = group.conns
    try:
        started = time.monotonic()
        with pytest.raises(GroupFailure, match=r"step: rank 1 died \(exit code -9\)"):
            dead._collect(5.0, "step")
        assert time.monotonic() - started < 2.0
        assert dead.dead() == "rank 1 died (exit code -9)"
    finally:
        _close(group, ranks)


def test_between_steps_a_closed_channel_names_its_rank():
    group, ranks = _pairs(3)
    try:
        assert group.dead() is None
        ranks[2].close()
        assert group.dead() == "rank 2 died (its channel closed)"
    finally:
        _close(group, ranks[:2])
        for c in group.conns:
            c.close()


def test_an_answer_that_arrives_slowly_but_within_the_deadline_is_read_whole():
    """The driver's non-blocking reads wait (poll, in milliseconds) up to the deadline: an answer whose second half
    comes 0.3 s after its first is read, not failed as late."""
    group, ranks = _pairs(1)
    a, b = socket.socketpair()
    try:
        with a, b:
            _send(a, ("ok", list(range(1000))))                   # the message's bytes (small: the buffer holds them)
            a.shutdown(socket.SHUT_WR)
            message = b"".join(iter(lambda: b.recv(1 << 16), b""))

        def slow():
            _sendall(ranks[0].fileno(), memoryview(message)[:20])
            time.sleep(0.3)
            _sendall(ranks[0].fileno(), memoryview(message)[20:])

        threading.Thread(target=slow, daemon=True).start()
        assert _recv(group.conns[0], time.monotonic() + 5.0) == ("ok", list(range(1000)))
    finally:
        _close(group, ranks)


def _sendall(fd: int, view: memoryview) -> None:
    while view.nbytes:
        view = view[os.write(fd, view):]


def test_setup_sizes_the_pool_once_and_holds_a_rebuild_to_it():
    group = _ConnGroup()
    group.num_blocks = 0
    group._sized([40, 40])
    assert group.num_blocks == 40
    group._sized([40, 40])                                          # a rebuilt group: the same pool
    with pytest.raises(GroupFailure, match=r"different KV pools \(\[36, 36\] blocks; asked for 40\)"):
        group._sized([36, 36])                                      # a rebuild that sized itself smaller
    with pytest.raises(GroupFailure, match="different KV pools"):
        group._sized([40, 36])


def test_a_ray_errors_root_cause_is_its_last_unindented_line():
    e = RuntimeError("ray::_WorkerActor.ready() (pid=7, ip=10.0.0.1)\n  File \"w.py\", line 3, in ready\n"
                     "    raise OSError('x')\nOSError: weights unreadable\n")
    assert _root_cause(e) == "OSError: weights unreadable"
    assert _root_cause(RuntimeError("")) == "RuntimeError"


# ---- the comm's rendezvous and checks -------------------------------------------------------------------------------
def test_a_failed_rank_0_fails_its_peers_setup_naming_it():
    board: dict = {}
    DictRendezvous(board, 3, "g/").fail(0, "OSError: no shm")
    peer = DictRendezvous(board, 3, "g/")
    with pytest.raises(CommSetupError, match=r"rank\(s\) \[0\]: rank 0: OSError: no shm"):
        peer.wait("ipc/shm", 5.0)


def test_the_setup_barrier_fails_fast_when_a_peer_failed():
    board: dict = {}
    DictRendezvous(board, 2).fail(1, "ValueError: bad shard")
    started = time.monotonic()
    with pytest.raises(CommSetupError, match=r"\[1\]"):
        DictRendezvous(board, 2).wait_all_ready(0, 30.0, tag="loaded")
    assert time.monotonic() - started < 2.0


def test_a_comm_setup_error_is_marked_on_the_failing_rank():
    board: dict = {}
    with pytest.raises(ValueError, match="unknown comm backend"):
        make_comm("mpi", 1, 2, rendezvous=DictRendezvous(board, 2), device="cpu", max_rows=8, hidden=4,
                  dtype=torch.float32)
    assert set(board) == {"error/1"} and "unknown comm backend" in board["error/1"]


def test_row_bounds_and_span_owners():
    check_rowmap(Dp(2, 4), 2, 8)                                    # exactly max_rows fits
    with pytest.raises(ValueError, match="> comm max_rows=8"):
        check_rowmap(Dp(2, 5), 2, 8)
    assert span_owner(Span(2, 4), 1) == 1 and span_owner(Dp(2, 4), 7) == 0
    with pytest.raises(ValueError, match="span owner 2 out of range"):
        span_owner(Span(2, 4), 2)


def test_a_device_phase_waits_as_long_as_its_timeout():
    pytest.importorskip("triton")
    from workers.comm_device import SPINS_PER_S, DevicePhases

    region = torch.zeros(DevicePhases.nbytes(1, 8), dtype=torch.uint8)
    assert DevicePhases(0, 1, 8, region, 30.0)._max_spins == 30 * SPINS_PER_S
    assert DevicePhases(0, 1, 8, region, 0.01)._max_spins == SPINS_PER_S         # at least a second


# ---- the worker --------------------------------------------------------------------------------------------------
def _worker(graphs: str = "off", world_size: int = 2, capturable: bool = False):
    from workers.worker import Worker, WorkerSpec

    w = Worker.__new__(Worker)
    w.spec = WorkerSpec(model="m", rank=0, world_size=world_size, graphs=graphs)
    checks = []
    w.comm = types.SimpleNamespace(capturable=capturable, check=lambda: checks.append(1))
    w.runner = types.SimpleNamespace(execute=lambda step: "result")
    return w, checks


def test_a_graph_step_checks_the_device_side_waits_after_it_runs():
    w, checks = _worker()
    assert w.execute(types.SimpleNamespace(graph=None)) == "result" and checks == []
    assert w.execute(types.SimpleNamespace(graph="decode")) == "result" and checks == [1]


def test_graph_capture_needs_a_capturable_comm_in_a_group():
    assert _worker("capture")[0]._graphs_mode() == "eager"
    assert _worker("capture", capturable=True)[0]._graphs_mode() == "capture"
    assert _worker("capture", world_size=1)[0]._graphs_mode() == "capture"
    assert _worker("eager")[0]._graphs_mode() == "eager"


class _Gather:
    """A 2-rank comm's gathers as if every rank passed this rank's rows."""

    def __init__(self):
        self.seen = []

    def all_gather_static(self, local):
        self.seen.append(local.clone())
        return torch.stack([local, local])

    def all_gather(self, local, rowmap, owner):
        self.seen.append((tuple(local.shape), rowmap, owner))
        return local


def test_static_gathers_zero_the_pad_rows():
    from workers.worker import StepComm

    comm = _Gather()
    sc = StepComm(comm, 0, 2, torch.device("cpu"))
    sc.stage(StepShape("dp", 4, 8, None), 2, static=True)
    out = sc.all_gather(torch.full((4, 3), float("nan")))
    assert out.shape == (8, 3)
    assert torch.isnan(comm.seen[0][:2]).all() and torch.equal(comm.seen[0][2:], torch.zeros(2, 3))


def test_only_the_span_owner_contributes_rows():
    from workers.worker import StepComm

    owner, other = _Gather(), _Gather()
    shape = StepShape("span", 4, 4, 1)
    a = StepComm(owner, 1, 2, torch.device("cpu"))
    a.stage(shape, 3)
    a.all_gather(torch.ones(3, 5))
    b = StepComm(other, 0, 2, torch.device("cpu"))
    b.stage(shape, 0)
    b.all_gather(torch.ones(0, 5))
    assert owner.seen == [((4, 5), Span(2, 4), 1)] and other.seen == [((0, 5), Span(2, 4), 1)]


def test_ranks_wait_for_each_others_load_on_the_setup_deadline(tiny_ckpt):
    """The "loaded" barrier waits the setup deadline (ranks load at different speeds: minutes), not a comm phase's."""
    from workers.worker import Worker, WorkerSpec

    waits = []

    class Recording(DictRendezvous):
        def wait_all_ready(self, rank, timeout, tag="ready"):
            waits.append((tag, timeout))
            return super().wait_all_ready(rank, timeout, tag)

    spec = WorkerSpec(model=str(tiny_ckpt), rank=0, world_size=1, num_blocks=16, timeout_s=7.0, setup_timeout_s=123.0)
    worker = Worker(spec, Recording({}, 1))
    try:
        assert ("loaded", 123.0) in waits
    finally:
        worker.close()


# ---- metrics ---------------------------------------------------------------------------------------------------------
def test_the_hub_drops_a_replica_that_stopped_reporting():
    from cluster.metrics_hub import MAX_AGE_S, MetricsHub

    hub = MetricsHub.__ray_actor_class__()
    hub.put("fresh", "a 1\n")
    hub.texts["gone"] = (time.monotonic() - MAX_AGE_S - 1, "a 2\n")
    assert hub.get() == {"fresh": "a 1\n"} and set(hub.texts) == {"fresh"}


def test_http_answers_are_counted_by_route_and_status():
    import asyncio

    from cluster.metrics_hub import HttpCounts, http_text

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 404})
        await send({"type": "http.response.body", "body": b""})

    async def send(message):
        pass

    scope = {"type": "http", "route": types.SimpleNamespace(path="/v1/mut61")}
    asyncio.run(HttpCounts(app)(scope, None, send))
    assert 'glmserve_http_requests_total{route="/v1/mut61",status="404"} 1.0' in http_text()


def test_host_memory_within_a_cgroup_counts_what_the_cgroup_uses(monkeypatch):
    """A container's free memory is its limit less its cgroup's use (not the host's MemAvailable): a cgroup near or
    past its limit leaves (almost) nothing for the KV pool."""
    from workers import memory

    monkeypatch.delenv("GLMSERVE_DEVICE_MEMORY", raising=False)
    monkeypatch.setattr(memory, "_cgroup_limit", lambda: (8 * memory.GiB, 8 * memory.GiB - (1 << 20)))
    free, total = memory.device_memory(torch.device("cpu"))
    assert free <= 1 << 20 and total <= 8 * memory.GiB
    monkeypatch.setattr(memory, "_cgroup_limit", lambda: (memory.GiB, 2 * memory.GiB))
    assert memory.device_memory(torch.device("cpu"))[0] == 0


def test_shutdown_returns_once_every_rank_closed_its_worker():
    """``_close_conns`` waits (briefly) for the ranks' answers: ipc rank 0 unlinks its segment in ``close`` — a
    driver that went on at once killed it first."""
    from cluster.workers import _serve

    class SlowClose:
        closed = False

        def close(self):
            time.sleep(0.3)
            self.closed = True

    group, ranks = _pairs(2)
    workers = [SlowClose(), SlowClose()]
    threads = [threading.Thread(target=_serve, args=(w, r), daemon=True) for w, r in zip(workers, ranks)]
    for t in threads:
        t.start()
    group._close_conns()
    assert [w.closed for w in workers] == [True, True] and group.conns == []
    for t in threads:
        t.join(5)
    for r in ranks:
        r.close()


def test_ray_group_waits_report_the_failing_rank_and_keep_rank_order(monkeypatch):
    """``RayWorkerGroup._wait`` (Ray faked): results in rank order whatever order they finish in; a failure names
    its rank; a deadline names the ranks still out."""
    ray = pytest.importorskip("ray")
    from cluster.workers import RayWorkerGroup

    values = {"r0": 10, "r1": RuntimeError("ray::x\n  trace\nOSError: disk"), "r2": 12}
    stalled = set()

    def wait(pending, num_returns, timeout):
        live = [r for r in pending if r not in stalled]
        return ([live[-1]], [r for r in pending if r != live[-1]]) if live else ([], pending)

    def get(ref):
        if isinstance(values[ref], Exception):
            raise values[ref]
        return values[ref]

    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(ray, "get", get)
    group = RayWorkerGroup.__new__(RayWorkerGroup)
    assert group._wait(["r0", "r2"], 5.0, "step") == [10, 12]          # r2 finishes first
    with pytest.raises(GroupFailure, match=r"^setup: rank 1 failed: OSError: disk$"):
        group._wait(["r0", "r1", "r2"], 5.0, "setup")
    stalled.update({"r0", "r1"})
    with pytest.raises(GroupFailure, match=r"^step: rank\(s\) \[0, 1\] did not answer within 5 s$"):
        group._wait(["r0", "r1", "r2"], 5.0, "step")


def test_the_router_learns_prefill_and_generate_prompts_with_their_salt():
    pytest.importorskip("ray")
    from cluster.routing import PrefixAffinity, PrefixAffinityRouter, _prompt

    def pending(method, ids, salt=None):
        return types.SimpleNamespace(metadata=types.SimpleNamespace(call_method=method),
                                     args=(ids, types.SimpleNamespace(cache_salt=salt)))

    ids = list(range(20))
    assert _prompt(pending("prefill", ids, "t")) == (ids, "t") and _prompt(pending("generate", ids)) == (ids, None)
    assert _prompt(pending("info", ids)) is None and _prompt(None) is None
    router = PrefixAffinityRouter.__new__(PrefixAffinityRouter)
    router.affinity = PrefixAffinity(span=4)
    router.on_request_routed(pending("prefill", ids, "t"), "r1", None)
    assert router.affinity.prefer(ids, {"r1": 0, "r2": 0}, "t") == "r1"
    assert router.affinity.prefer(ids, {"r1": 0, "r2": 0}) is None


def test_a_prefix_routed_again_is_remembered_longest():
    from cluster.routing import PrefixAffinity

    aff = PrefixAffinity(span=2, max_keys=8)
    a, b, c = list(range(10)), list(range(50, 60)), list(range(70, 80))
    aff.record(a, "a")
    aff.record(b, "b")
    aff.record(a, "a")                                           # a routed again: its points are the most recent
    aff.record(c, "c")                                           # b's are forgotten, not a's
    assert aff.prefer(a, {"a": 0, "b": 0, "c": 0}) == "a" and aff.prefer(b, {"a": 0, "b": 0, "c": 0}) is None


def test_ipc_phases_past_the_region_end_on_a_short_chunk():
    """A Dp bucket of 5 rows a rank through a 4-row region moves as 4 + 1 rows (the integration test's 3 ranks take
    one row a chunk, which hid a last chunk taken whole)."""
    from workers.comm_ipc import IpcComm

    comm = IpcComm.create(0, 1, DictRendezvous({}, 1, "mut61/"), torch.device("cpu"), max_rows=16, hidden=4,
                          dtype=torch.float32, timeout_s=5.0, region_rows=4)
    try:
        rows = torch.arange(20, dtype=torch.float32).view(5, 4)
        assert torch.equal(comm.all_gather(rows, Dp(1, 5), 0), rows)
        assert torch.equal(comm.reduce_scatter(rows, Dp(1, 5), 0), rows)
        assert torch.equal(comm.all_gather(rows, Span(1, 5), 0), rows)
    finally:
        comm.close()
