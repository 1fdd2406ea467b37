"""The MoE phase comm on CUDA GPUs: ``ipc`` (cupy IPC buffers, host-shm flags) with 2, 4 and 8
processes, and ``torch`` (NCCL) at N=1 and at every N the host has GPUs for — NCCL refuses two ranks on
one GPU. Rank r runs on GPU r % (visible GPUs): on one GPU every rank shares it, on a multi-GPU host each
rank of a group that fits has its own (the ipc buffers then cross NVLink).

Same checks as ``tests/integration/test_comm.py`` at GLM-5 width: AG and RS under Dp and every Span
owner equal the gathered rows and the in-order sums bit for bit, Span matches Dp bit for bit, many
consecutive phases keep the parity handshake; the regions start NaN-poisoned, so nothing stale
leaks. Then the GPU-only parts: a bounded wait on an absent peer, and the close order (rank 0 must
not free its allocation while a peer still maps it).

Run on a lent H200: ``PYTHONPATH=. python -m pytest -q tests/gpu/test_comm_gpu.py``.
"""

from __future__ import annotations

import io
import time
import warnings

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from scheduler.shapes import StepShape
from tests.integration.test_comm import _pool_lifetime, _shm_segments  # noqa: F401 (a module fixture)
from tests.integration.test_comm import _spawn as spawn
from workers.comm import CommTimeout, DictRendezvous, make_comm, ordered_sum
from workers.comm_device import DevicePhases
from workers.graphs import capture_graph
from workers.rowmap import Dp, Span, rows_of
from workers.worker import StepComm

HIDDEN = 6144
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
GPUS = torch.cuda.device_count()


def _dev() -> torch.device:
    """This rank's GPU (``_comm`` selects it)."""
    return torch.device("cuda", torch.cuda.current_device())


def _needs_cupy() -> None:
    pytest.importorskip("cupy")


def _data(seed: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """Deterministic [rows, HIDDEN] values over many magnitudes (summation order shows), on the GPU."""
    g = torch.Generator().manual_seed(seed)
    scale = 10.0 ** torch.randint(-3, 4, (rows, HIDDEN), generator=g)
    return (torch.randn(rows, HIDDEN, generator=g) * scale).to(dtype).to(_dev())


def _in_order_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def _to_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _comm(rank: int, n: int, board, backend: str, max_rows: int, timeout_s: float = 30.0):
    torch.cuda.set_device(rank % GPUS)
    return make_comm(backend, rank, n, rendezvous=DictRendezvous(board, n, prefix=f"{backend}/"), device="cuda",
                     max_rows=max_rows, hidden=HIDDEN, dtype=torch.bfloat16, timeout_s=timeout_s)


# ----------------------------------------------------------------------------- the per-rank suite


def _suite(rank: int, n: int, board, backend: str, rows_per_rank: int, num_rounds: int) -> dict:
    """AG/RS under Dp and every Span owner in both dtypes, then num_rounds mixed rounds ->
    {"failures": [...], "dp": bytes, "span": bytes} (outputs on the CPU for the cross-rank gate)."""
    dp, total = Dp(n, rows_per_rank), n * rows_per_rank
    comm = _comm(rank, n, board, backend, total)
    if hasattr(comm, "poison"):
        comm.poison()  # NaN everywhere: a row read before it was written shows
        comm.barrier()  # poison is not collective: nobody writes a phase before every rank poisoned
    failures: list[str] = []
    dp_out: dict = {}
    span_out: dict = {}

    def expect(ok: bool, what: str) -> None:
        if not ok:
            failures.append(f"rank {rank}: {what}")

    for name, dtype in DTYPES.items():
        bucket = _data(1, total, dtype)  # [total, H]
        partials = [_data(100 + src, total, dtype) for src in range(n)]  # N x [total, H]
        expected = _in_order_sum(partials)
        mine = rows_of(dp, rank)
        ag = comm.all_gather(bucket[mine.start : mine.stop], dp, 0)
        expect(ag.device.type == "cuda" and torch.equal(ag, bucket), f"ag dp {name}")
        rs = comm.reduce_scatter(partials[rank], dp, 0)
        expect(rs.dtype == dtype and torch.equal(rs, expected[mine.start : mine.stop]), f"rs dp {name}")
        dp_out[name] = {"ag": ag.cpu(), "rs": rs.cpu()}
        span, span_out[name] = Span(n, total), {}
        for owner in range(n):
            local = bucket if rank == owner else torch.empty(0, HIDDEN, dtype=dtype, device=_dev())
            ag = comm.all_gather(local, span, owner)
            expect(torch.equal(ag, bucket), f"ag span owner {owner} {name}")
            rs = comm.reduce_scatter(partials[rank], span, owner)
            want = expected if rank == owner else expected[:0]
            expect(rs.dtype == dtype and torch.equal(rs, want), f"rs span owner {owner} {name}")
            if rank == owner:
                span_out[name][owner] = {"ag": ag.cpu(), "rs": rs.cpu()}

    for i in range(num_rounds):  # the parity handshake across many consecutive phases
        dtype = (torch.float32, torch.bfloat16)[i % 2]
        rowmap, owner = (dp, 0) if i % 3 == 0 else (Span(n, 1 + i % total), i % n)
        rows = rows_of(rowmap, rank, owner)
        bucket = _data(1000 + i, total if rowmap is dp else rowmap.num_rows, dtype)
        ag = comm.all_gather(bucket[rows.start : rows.stop], rowmap, owner)
        expect(torch.equal(ag, bucket), f"round {i} ag {rowmap} owner {owner}")
        partials = [_data(2000 + 31 * i + src, len(bucket), dtype) for src in range(n)]
        rs = comm.reduce_scatter(partials[rank], rowmap, owner)
        expect(torch.equal(rs, _in_order_sum(partials)[rows.start : rows.stop]), f"round {i} rs {rowmap}")
    comm.barrier()
    comm.close()
    comm.close()  # idempotent
    torch.cuda.synchronize()  # no sticky CUDA error left behind
    return {"failures": failures, "dp": _to_bytes(dp_out), "span": _to_bytes(span_out)}


def _spawn(fn, world_size: int, *args, reporting: int | None = None) -> list:
    """fn on ranks 0..world_size-1, each a process of the shared pool (rank r on GPU r % GPUS)."""
    return spawn(fn, world_size, *args, reporting=reporting, deadline_s=120.0)


_SUITES: dict[tuple[str, int], list] = {}
CASES = [("torch", n) for n in (1, 2, 4, 8) if n == 1 or n <= GPUS] + [("ipc", n) for n in (1, 2, 4, 8)]


def _suite_results(backend: str, n: int) -> list:
    if backend == "ipc":
        _needs_cupy()
    if (backend, n) not in _SUITES:
        before = _shm_segments()
        _SUITES[backend, n] = _spawn(_suite, n, backend, 1 if n == 8 else 2, 20 if n == 8 else 40)
        assert _shm_segments() <= before, "ipc comm left /dev/shm segments behind"
    return _SUITES[backend, n]


def _failures(backend: str, n: int, prefix: str) -> list[str]:
    return [f for rank in _suite_results(backend, n) for f in rank["failures"] if prefix in f]


@pytest.mark.parametrize("backend,n", CASES)
def test_all_gather_dp_and_span(backend, n):
    assert _failures(backend, n, " ag ") == []


@pytest.mark.parametrize("backend,n", CASES)
def test_reduce_scatter_is_in_order_sum(backend, n):
    assert _failures(backend, n, " rs ") == []


@pytest.mark.parametrize("backend,n", CASES)
def test_many_rounds_keep_parity(backend, n):
    assert _failures(backend, n, "round") == []


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend,n", CASES)
def test_span_matches_dp(backend, n, dtype):
    """Gate: the same rows and partials via Span(owner) are bit-identical to via Dp, whatever the owner."""
    reports = _suite_results(backend, n)
    rows_per_rank = 1 if n == 8 else 2
    dp = [torch.load(io.BytesIO(r["dp"]))[dtype] for r in reports]  # per rank
    span = {o: torch.load(io.BytesIO(reports[o]["span"]))[dtype][o] for o in range(n)}  # per owner
    for owner, got in span.items():
        assert torch.equal(got["ag"], dp[0]["ag"]), owner
        for r in range(n):
            rows = slice(r * rows_per_rank, (r + 1) * rows_per_rank)
            assert torch.equal(got["rs"][rows], dp[r]["rs"]), (owner, r)


# ----------------------------------------------------------------------------- bounds and close order


def _absent_peer(rank: int, n: int, board) -> float | None:
    """Rank 1 sets up and never enters the second phase; rank 0 must time out naming it."""
    rdv = DictRendezvous(board, n, prefix="ipc/")
    rdv.wait_all_ready(rank, 60.0, tag="started")
    comm = _comm(rank, n, board, "ipc", 2, timeout_s=1.0)
    comm.all_gather(torch.ones(1, HIDDEN, device=_dev()), Dp(n, 1), 0)  # warm: both present
    if rank == 1:
        rdv.wait("done", 60.0)
        comm.close()
        return None
    start = time.monotonic()
    try:
        comm.all_gather(torch.ones(1, HIDDEN, device=_dev()), Dp(n, 1), 0)
    except CommTimeout as exc:
        elapsed = time.monotonic() - start
        assert "AG epoch 2" in str(exc) and "ranks [1]" in str(exc), str(exc)
        assert "rank 1 last published AG epoch 1" in str(exc), str(exc)
        return elapsed
    finally:
        rdv.publish("done", True)
        comm.close()
    raise AssertionError("no CommTimeout")


def test_absent_peer_times_out():
    _needs_cupy()
    before = _shm_segments()
    elapsed, _ = _spawn(_absent_peer, 2)
    assert 0.9 < elapsed < 3.0
    assert _shm_segments() <= before


def _close_order(rank: int, n: int, board, peer_delay_s: float, timeout_s: float) -> dict:
    """Rank 0 closes right after a phase, then scribbles on a fresh allocation of the same size; peers
    keep their mapping peer_delay_s longer (past rank 0's close deadline: until that close returned),
    read it (it must still hold this phase's rows), then close. Returns what each rank saw."""
    rdv = DictRendezvous(board, n, prefix="ipc/")
    comm = _comm(rank, n, board, "ipc", n, timeout_s=timeout_s)
    bucket = _data(7, n, torch.bfloat16)  # [n, H]
    ag = comm.all_gather(bucket[rank : rank + 1], Dp(n, 1), 0)
    assert torch.equal(ag, bucket)
    out: dict = {}
    if rank == 0:
        start = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            comm.close()
        out["close_s"] = time.monotonic() - start
        out["warnings"] = [str(w.message) for w in caught]
        # a same-size cudaMalloc right away lands on the freed block if there was one: scribble on it
        import cupy

        size = comm.layout.ag_bytes + comm.layout.rs_bytes + DevicePhases.nbytes(n, HIDDEN)
        scribble = cupy.cuda.Memory(size)
        cupy.cuda.runtime.memset(scribble.ptr, 7, size)
        cupy.cuda.runtime.deviceSynchronize()
        rdv.publish("rank0_closed", out["close_s"])
        for r in range(1, n):  # keep the scribble until every peer has looked
            rdv.wait(f"read/{r}", 60.0)
    else:
        time.sleep(peer_delay_s)  # rank 0 is inside close() meanwhile
        if peer_delay_s > timeout_s:  # rank 0 gave up waiting for us: its close has returned
            rdv.wait("rank0_closed", 60.0)
        region = comm._region("AG", torch.bfloat16, comm.epoch % 2)[:n]
        out["still_mapped"] = torch.equal(region, bucket)
        comm.close()
        rdv.publish(f"read/{rank}", True)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_rank0_frees_only_after_peers_unmap(n):
    """Rank 0 closes first; its close must wait until every peer has unmapped (freeing an exported
    allocation under a live importer mapping is undefined)."""
    _needs_cupy()
    results = _spawn(_close_order, n, 0.5, 30.0)
    assert 0.45 < results[0]["close_s"] < 10.0, results[0]
    assert results[0]["warnings"] == []
    assert all(r["still_mapped"] for r in results[1:]), results


def test_rank0_keeps_buffer_when_peer_never_unmaps():
    """A peer that holds its mapping past the deadline: rank 0's close returns (bounded) with a
    warning and keeps the allocation, so the late peer still reads valid memory."""
    _needs_cupy()
    results = _spawn(_close_order, 2, 2.0, 1.0)
    assert 0.9 < results[0]["close_s"] < 2.0, results[0]
    assert any("did not unmap" in w for w in results[0]["warnings"]), results[0]
    assert results[1]["still_mapped"]


# ----------------------------------------------------------------------------- device-side phases + graphs


def _device_phases(rank: int, n: int, board, backend: str) -> list[str]:
    """The graph-shaped phases (ipc: device-side flags; torch: fixed-shape NCCL calls): eager rounds over every
    bucket and both dtypes, then StepComm's span AG → per-rank partial → RS with the owner changing through its
    device scalar, and a dp step with a pad row — as a CUDA graph captured once and replayed, where the comm is
    capturable (ipc), else eagerly (torch). Returns failures."""
    comm = _comm(rank, n, board, backend, 8 * n)
    if hasattr(comm, "poison"):
        comm.poison()
    comm.barrier()
    failures: list[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            failures.append(f"rank {rank}: {what}")

    for i in range(24):
        R, dtype = (1, 2, 4, 8)[i % 4], (torch.float32, torch.bfloat16)[i % 2]
        rows = [_data(10 * i + r, R, dtype) for r in range(n)]
        expect(torch.equal(comm.all_gather_static(rows[rank]), torch.stack(rows)), f"static ag round {i}")
        partials = [_data(1000 * i + r, n * R, dtype) for r in range(n)]
        want = ordered_sum([p[rank * R:(rank + 1) * R] for p in partials])
        expect(torch.equal(comm.reduce_scatter_static(partials[rank]), want), f"static rs round {i}")

    sc, R = StepComm(comm, rank, n, _dev()), 4
    h = torch.zeros(R, HIDDEN, dtype=torch.bfloat16, device=_dev())

    def step():
        bucket = sc.all_gather(h)
        return bucket, sc.reduce_scatter(bucket * (rank + 1))          # a rank-dependent "expert" partial

    for kind in ("span", "dp"):
        def stage(owner: int) -> None:
            if kind == "span":
                sc.stage(StepShape("span", R, R, owner), R if rank == owner else 0, static=True)
            else:
                sc.stage(StepShape("dp", R, n * R, None), R - 1, static=True)   # one pad row per rank
        stage(0)
        h.copy_(_data(5, R, torch.bfloat16))
        graph, out = capture_graph(step) if comm.capturable else (None, None)
        for rep, owner in enumerate([0, n - 1, 1 % n, 0, n - 1]):
            stage(owner)
            h.copy_(_data(50 + 7 * rep + rank, R, torch.bfloat16))
            if graph is not None:
                graph.replay()
                got = (out[0].clone(), out[1].clone())
            else:
                got = step()
            eager = step()
            expect(torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1]),
                   f"{kind} replay != eager (owner {owner})")
            if kind == "span":
                rows = _data(50 + 7 * rep + owner, R, torch.bfloat16)
                expect(torch.equal(got[0], rows), f"span owner {owner}: gathered rows")
                expect(torch.equal(got[1], ordered_sum([rows * (s + 1) for s in range(n)])), f"span {owner}: rs")
            else:
                rows = [_data(50 + 7 * rep + r, R, torch.bfloat16) for r in range(n)]
                want = torch.cat([torch.cat([x[:R - 1], torch.zeros_like(x[:1])]) for x in rows])
                expect(torch.equal(got[0], want), "dp: gathered rows, pads zero")
    comm.check()
    comm.barrier()
    comm.close()
    torch.cuda.synchronize()
    return failures


@pytest.mark.parametrize("backend,n", [("ipc", 1), ("ipc", 2), ("ipc", 4)]
                         + [("torch", n) for n in (1, 2, 4, 8) if n <= GPUS])
def test_device_phases_and_graph_replay_with_any_owner(backend, n):
    if backend == "ipc":
        _needs_cupy()
    reports = _spawn(_device_phases, n, backend)
    assert [f for r in reports for f in r] == []


def _device_absent_peer(rank: int, n: int, board) -> float | None:
    """Rank 1 stops after one graph-shaped AG; rank 0's next wait expires and ``check`` names rank 1."""
    rdv = DictRendezvous(board, n, prefix="ipc/")
    comm = _comm(rank, n, board, "ipc", 8 * n, timeout_s=1.0)
    comm.all_gather_static(torch.ones(1, HIDDEN, device=_dev()))
    if rank == 1:
        rdv.wait("done", 120.0)
        comm.close()
        return None
    start = time.monotonic()
    try:
        comm.all_gather_static(torch.ones(1, HIDDEN, device=_dev()))
        comm.check()             # raises nothing yet: the error word is read as it is, the wait still spins (~1 s)
        torch.cuda.synchronize()                    # the step's work done (the runner's token read): now it raises
        comm.check()
    except CommTimeout as exc:
        assert "epoch 2 on rank 0" in str(exc) and "'AG': [1]" in str(exc), str(exc)
        return time.monotonic() - start
    finally:
        rdv.publish("done", True)
        comm.close()
    raise AssertionError("no CommTimeout")


def test_device_phase_wait_is_bounded():
    _needs_cupy()
    elapsed, _ = _spawn(_device_absent_peer, 2)
    print(f"device-side wait expired after {elapsed:.2f} s (timeout 1 s)")
    assert elapsed < 60.0


def _split_argmax(head, rows: torch.Tensor, n: int) -> torch.Tensor:
    """Every rank's slice of the lm_head in turn on all rows, combined as ``argmax_logits`` does."""
    from workers.worker import first_max, slice_best, vocab_slice

    return first_max(torch.stack([slice_best(rows, head, *vocab_slice(head, r, n)) for r in range(n)]))


def _vocab_argmax(rank: int, n: int, board, backend: str, vocab: int) -> tuple[list[str], int, int]:
    """``StepComm.argmax_logits`` (a greedy MTP draft's lm_head split by vocabulary) as a captured CUDA graph over the
    device phases, replayed with new rows, against the same split computed on this rank alone (exact), and counted
    against the whole bf16 lm_head's argmax (cuBLAS may reduce the narrower product in another order: a near tie may
    go the other way). Returns (failures, ids equal to the whole lm_head's, ids)."""
    from models.glm5 import Linear

    comm = _comm(rank, n, board, backend, 8 * n)
    torch.manual_seed(3)                                   # the same lm_head on every rank
    head = Linear(HIDDEN, vocab).to(_dev(), torch.bfloat16)
    torch.nn.init.normal_(head.weight, std=0.02)
    failures, sc, same, total = [], StepComm(comm, rank, n, _dev()), 0, 0
    for R in (1, 4):
        h = torch.zeros(R, HIDDEN, dtype=torch.bfloat16, device=_dev())
        graph, out = capture_graph(lambda: sc.argmax_logits(h, head)) if comm.capturable else (None, None)
        for rep in range(3):
            rows = torch.cat([_data(70 + 11 * rep + r, R, torch.float32).clamp(-4, 4) for r in range(n)]).bfloat16()
            h.copy_(rows[rank * R:(rank + 1) * R])
            if graph is not None:
                graph.replay()
                got = out.clone()
            else:
                got = sc.argmax_logits(h, head)
            mine = slice(rank * R, (rank + 1) * R)
            want = _split_argmax(head, rows, n)[mine]
            if not torch.equal(got, want):
                failures.append(f"rank {rank} R={R} rep {rep}: {got.tolist()} != {want.tolist()}")
            same += int((got == head(rows).argmax(dim=-1)[mine]).sum())
            total += R
    comm.check()
    comm.barrier()
    comm.close()
    torch.cuda.synchronize()
    return failures, same, total


@pytest.mark.parametrize("backend,n", [("ipc", 2), ("ipc", 4)] + [("torch", n) for n in (1, 2) if n <= GPUS])
def test_vocab_split_argmax_captured_equals_the_whole_lm_head(backend, n):
    _split_reports(_vocab_argmax, backend, n, "split ids equal the whole lm_head's")


def _split_reports(fn, backend: str, n: int, what: str) -> None:
    """Run a split-lm_head check on n ranks (V = 20,000), print how many rows agree with the whole lm_head, assert
    no failures."""
    if backend == "ipc":
        _needs_cupy()
    reports = _spawn(fn, n, backend, 20000)
    print(f"{backend} N={n}: {what} {sum(r[1] for r in reports)} / {sum(r[2] for r in reports)}")
    assert [f for r in reports for f in r[0]] == []


def _bucket_logits(rank: int, n: int, board, backend: str, vocab: int) -> tuple[list[str], int, int]:
    """``StepComm.bucket_logits`` (a graph step's logits, the lm_head split by vocabulary) captured in a CUDA graph over
    the device phases and replayed — dp steps of 2 and 8 rows a rank (one pad; 8: two phases) and a 4-row span under
    changing owners —
    against every rank's slice of the same gathered rows computed here, bit for bit, and against each real row's
    product with the whole lm_head to bf16 rounding (1e-2; cuBLAS may reduce a narrower product in another order:
    counted). Returns (failures, rows bit-equal to the whole lm_head's, rows)."""
    from models.glm5 import Linear
    from workers.worker import slice_logits, vocab_slice

    comm = _comm(rank, n, board, backend, 8 * n)
    torch.manual_seed(3)
    head = Linear(HIDDEN, vocab).to(_dev(), torch.bfloat16)
    torch.nn.init.normal_(head.weight, std=0.02)
    failures, sc, same, total = [], StepComm(comm, rank, n, _dev()), 0, 0
    for kind, R in (("dp", 2), ("dp", 8), ("span", 4)):       # dp 8: the slices move in two phases (16-row comm)
        h = torch.zeros(R, HIDDEN, dtype=torch.bfloat16, device=_dev())
        assert sc.split_fits(R if kind == "span" else n * R, torch.bfloat16, head)

        def stage(owner: int) -> None:
            if kind == "span":
                sc.stage(StepShape("span", R, R, owner), R if rank == owner else 0, static=True)
            else:
                sc.stage(StepShape("dp", R, n * R, None), R - 1, static=True)
        stage(0)
        graph, out = capture_graph(lambda: sc.bucket_logits(h, head)) if comm.capturable else (None, None)
        for rep, owner in enumerate([0, n - 1, 1 % n]):
            stage(owner)
            rows = [_data(90 + 13 * rep + r, R, torch.float32).clamp(-4, 4).bfloat16() for r in range(n)]
            h.copy_(rows[rank])
            if graph is not None:
                graph.replay()
                got = out.clone()
            else:
                got = sc.bucket_logits(h, head)
            if kind == "span":
                gathered, mine = rows[owner], slice(0, R)
            else:
                gathered = torch.cat([torch.cat([x[:R - 1], torch.zeros_like(x[:1])]) for x in rows])
                mine = slice(rank * R, rank * R + R - 1)
                got = got[:R - 1]
            exact = torch.cat([slice_logits(gathered, head, *vocab_slice(head, r, n)) for r in range(n)], dim=1)
            own = head(gathered[mine]).float()
            if not torch.equal(got, exact[mine].float()):
                failures.append(f"rank {rank} {kind} owner {owner}: not the slices' logits")
            if not torch.allclose(got, own, rtol=1e-2, atol=1e-2 * own.abs().max().item()):
                failures.append(f"rank {rank} {kind} owner {owner}: max diff {(got - own).abs().max()}")
            same += int((got == own).all(dim=-1).sum())
            total += got.shape[0]
    comm.check()
    comm.barrier()
    comm.close()
    torch.cuda.synchronize()
    return failures, same, total


@pytest.mark.parametrize("backend,n", [("ipc", 2), ("ipc", 4)] + [("torch", n) for n in (2,) if n <= GPUS])
def test_bucket_logits_captured_equal_the_whole_lm_head(backend, n):
    _split_reports(_bucket_logits, backend, n, "rows bit-equal to the whole lm_head's")
