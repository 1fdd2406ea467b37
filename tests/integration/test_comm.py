"""Multi-process tests of the MoE phase comm (workers/comm*): both backends, no Ray.

Worker processes come from a forkserver pool reused across tests (process start-up dominates on
2 cores). Each group of ranks runs every check for both backends once; the individual tests
then assert on the collected results.
"""

from __future__ import annotations

import io
import os
import time
import traceback

import pytest
import torch
import torch.multiprocessing as mp

from workers.comm import CommSetupError, CommTimeout, DictRendezvous, make_comm
from workers.comm_ipc import SHM_PREFIX
from workers.rowmap import Dp, Span, rows_of

BACKENDS = ("torch", "ipc")
HIDDEN = 16
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
NUM_ROUNDS = 50


def _shm_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(SHM_PREFIX)}


def _data(seed: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """Deterministic [rows, HIDDEN] values spanning many magnitudes, so summation order shows."""
    g = torch.Generator().manual_seed(seed)
    scale = 10.0 ** torch.randint(-3, 4, (rows, HIDDEN), generator=g)
    return (torch.randn(rows, HIDDEN, generator=g) * scale).to(dtype)


def _in_order_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def _to_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _serve(rank, tasks, results):
    """Pool worker: run (fn, world_size, board, args) tasks as ``rank`` until told to stop."""
    torch.set_num_threads(1)
    while (task := tasks.get()) is not None:
        run_id, fn, world_size, board, args = task
        try:
            results.put((run_id, rank, True, fn(rank, world_size, board, *args)))
        except Exception as exc:  # noqa: BLE001 -- report it, never hang the parent
            results.put((run_id, rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    results.close()
    results.join_thread()
    os._exit(0)  # skip interpreter teardown: it costs seconds per process on 2 busy cores


class _Pool:
    """Spawned worker processes reused across tests (start-up dominates on 2 cores): worker r
    plays rank r of every group. Grows on demand; a dead worker is replaced."""

    def __init__(self) -> None:
        # forkserver = spawn semantics (fresh processes, nothing inherited from pytest) but the
        # server imports torch once and forks each worker: 8 spawned workers each importing torch
        # take 10-25 s on 2 shared cores, forked ones well under a second.
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(["torch", "workers.comm", "workers.comm_ipc", "workers.comm_torch"])
        self.manager = self.ctx.Manager()
        self.results = self.ctx.Queue()
        self.workers: list = []  # (process, task queue)
        self.run_id = 0

    def _ensure(self, world_size: int) -> None:
        for r in range(world_size):
            if r < len(self.workers) and self.workers[r][0].is_alive():
                continue
            tasks = self.ctx.Queue()
            proc = self.ctx.Process(target=_serve, args=(r, tasks, self.results), daemon=True)
            proc.start()
            if r < len(self.workers):
                self.workers[r] = (proc, tasks)
            else:
                self.workers.append((proc, tasks))

    def run(self, fn, world_size: int, *args, reporting: int | None = None, deadline_s: float = 60.0) -> list:
        """fn(rank, world_size, board, *args) on ranks 0..world_size-1 -> results of the first
        ``reporting`` ranks (default all); raises if a rank raised or did not report."""
        self._ensure(world_size)
        board = self.manager.dict()
        self.run_id += 1
        for r in range(world_size):
            self.workers[r][1].put((self.run_id, fn, world_size, board, args))
        wanted = world_size if reporting is None else reporting
        out: dict[int, object] = {}
        end = time.monotonic() + deadline_s
        try:
            while len(out) < wanted:
                run_id, rank, ok, value = self.results.get(timeout=max(0.1, end - time.monotonic()))
                if run_id != self.run_id or rank >= wanted:  # late report of an earlier group
                    continue
                if not ok:
                    raise AssertionError(f"rank {rank} failed:\n{value}")
                out[rank] = value
        except BaseException:
            self.close()  # a broken group may leave workers stuck: start afresh next time
            raise
        return [out[r] for r in range(wanted)]

    def wait_exit(self, rank: int, timeout: float = 10.0) -> None:
        self.workers[rank][0].join(timeout)

    def close(self) -> None:
        for proc, tasks in self.workers:
            if proc.is_alive():
                tasks.put(None)
        for proc, _ in self.workers:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        self.workers = []
        while not self.results.empty():
            self.results.get()


_POOL: list[_Pool] = []


@pytest.fixture(scope="module", autouse=True)
def _pool_lifetime():
    yield
    for pool in _POOL:
        pool.close()
        pool.manager.shutdown()
    _POOL.clear()


def _spawn(fn, world_size: int, *args, reporting: int | None = None, deadline_s: float = 60.0) -> list:
    """fn on ranks 0..world_size-1, each a process of the pool (made on first use; a module that imports
    ``_pool_lifetime`` beside this closes it after its tests)."""
    if not _POOL:
        _POOL.append(_Pool())
    return _POOL[0].run(fn, world_size, *args, reporting=reporting, deadline_s=deadline_s)


# ----------------------------------------------------------------------------- the per-rank suite


def _suite(rank: int, n: int, board, rows_per_rank: int, num_rounds: int) -> dict:
    """Every suite check for each backend -> {backend: {"failures": [...], "dp": bytes, "span": bytes}}."""
    return {backend: _suite_one(rank, n, board, backend, rows_per_rank, num_rounds) for backend in BACKENDS}


def _suite_one(rank: int, n: int, board, backend: str, rows_per_rank: int, num_rounds: int) -> dict:
    """AG/RS under Dp and every Span owner in both dtypes, then num_rounds mixed rounds."""
    dp, total = Dp(n, rows_per_rank), n * rows_per_rank
    comm = make_comm(backend, rank, n, rendezvous=DictRendezvous(board, n, prefix=f"{backend}/"),
                     device="cpu", max_rows=total, hidden=HIDDEN, dtype=torch.bfloat16, timeout_s=20.0)
    failures: list[str] = []
    dp_out: dict = {}  # dtype -> {"ag": bucket, "rs": my rows}
    span_out: dict = {}  # dtype -> {owner: {"ag": bucket, "rs": owner's rows}}

    def expect(ok: bool, what: str) -> None:
        if not ok:
            failures.append(f"rank {rank}: {what}")

    for name, dtype in DTYPES.items():
        bucket = _data(1, total, dtype)  # [total, H]
        partials = [_data(100 + src, total, dtype) for src in range(n)]  # N x [total, H]
        expected = _in_order_sum(partials)
        mine = rows_of(dp, rank)
        ag = comm.all_gather(bucket[mine.start : mine.stop], dp, 0)
        expect(torch.equal(ag, bucket), f"ag dp {name}")
        rs = comm.reduce_scatter(partials[rank], dp, 0)
        expect(rs.dtype == dtype and torch.equal(rs, expected[mine.start : mine.stop]), f"rs dp {name}")
        dp_out[name] = {"ag": ag, "rs": rs}
        span, span_out[name] = Span(n, total), {}
        for owner in range(n):
            local = bucket if rank == owner else torch.empty(0, HIDDEN, dtype=dtype)
            ag = comm.all_gather(local, span, owner)
            expect(torch.equal(ag, bucket), f"ag span owner {owner} {name}")
            rs = comm.reduce_scatter(partials[rank], span, owner)
            want = expected if rank == owner else expected[:0]
            expect(rs.dtype == dtype and torch.equal(rs, want), f"rs span owner {owner} {name}")
            if rank == owner:
                span_out[name][owner] = {"ag": ag, "rs": rs}

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
    return {"failures": failures, "dp": _to_bytes(dp_out), "span": _to_bytes(span_out)}


_SUITES: dict[int, list] = {}


def _suite_results(n: int) -> list:
    if n not in _SUITES:
        before = _shm_segments()
        rows_per_rank = 1 if n == 8 else 2
        _SUITES[n] = _spawn(_suite, n, rows_per_rank, 10 if n == 8 else NUM_ROUNDS)
        assert _shm_segments() <= before, "ipc comm left /dev/shm segments behind"
    return _SUITES[n]


def _failures(n: int, backend: str, prefix: str) -> list[str]:
    return [f for rank in _suite_results(n) for f in rank[backend]["failures"] if prefix in f]


def _load(blob: bytes) -> dict:
    return torch.load(io.BytesIO(blob))


WORLDS = (1, 2, 4)


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_all_gather_dp_and_span(backend, n):
    assert _failures(n, backend, " ag ") == []


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_reduce_scatter_is_in_order_sum(backend, n):
    assert _failures(n, backend, " rs ") == []


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_many_rounds_keep_parity(backend, n):
    assert _failures(n, backend, "round") == []


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", WORLDS)
def test_span_matches_dp(n, dtype):
    """Gate: the same rows and partials via Span(owner) are bit-identical to via Dp, whatever the
    owner and backend (and the two backends agree bit for bit)."""
    reports = _suite_results(n)
    rows_per_rank = 2
    reference = None
    for backend in BACKENDS:
        dp = [_load(r[backend]["dp"])[dtype] for r in reports]  # per rank
        span = {o: _load(reports[o][backend]["span"])[dtype][o] for o in range(n)}  # per owner
        dp_rows = torch.cat([d["rs"] for d in dp])  # [total, H] rank-major
        for owner, got in span.items():
            assert torch.equal(got["ag"], dp[0]["ag"]), (backend, owner)
            for r in range(n):
                rows = slice(r * rows_per_rank, (r + 1) * rows_per_rank)
                assert torch.equal(got["rs"][rows], dp[r]["rs"]), (backend, owner, r)
        reference = dp_rows if reference is None else reference
        assert torch.equal(dp_rows, reference), "backends disagree"
    if n == 4:  # the data is order-sensitive, so this gate would catch a reordered sum
        partials = [_data(100 + src, n * rows_per_rank, DTYPES[dtype]) for src in range(n)]
        assert not torch.equal(_in_order_sum(partials[::-1]), reference)


@pytest.mark.parametrize("backend", BACKENDS)
def test_world_8_quick(backend):
    assert _failures(8, backend, "") == []


# ----------------------------------------------------------------------------- failure modes


def _absent_peer(rank: int, n: int, board, backend: str) -> float | None:
    """Rank 1 sets up and never enters the phase; rank 0 must time out. Rank 1 then dies
    without close() — the test checks nothing is left in /dev/shm."""
    rdv = DictRendezvous(board, n, prefix=f"{backend}/")
    rdv.wait_all_ready(rank, 30.0, tag="started")  # spawn skew must not eat the 1 s budget
    comm = make_comm(backend, rank, n, rendezvous=rdv, device="cpu", max_rows=2, hidden=HIDDEN,
                     dtype=torch.float32, timeout_s=1.0)
    comm.all_gather(torch.ones(1, HIDDEN), Dp(n, 1), 0)  # warm: both present
    if rank == 1:
        rdv.wait("done", 30.0)
        if backend == "ipc":
            os._exit(0)  # a crash: no close()
        comm.close()
        return None
    start = time.monotonic()
    try:
        comm.all_gather(torch.ones(1, HIDDEN), Dp(n, 1), 0)
    except CommTimeout as exc:
        elapsed = time.monotonic() - start
        assert "AG" in str(exc) and "epoch 2" in str(exc), str(exc)
        if backend == "ipc":
            assert "ranks [1]" in str(exc) and "rank 1 last published AG epoch 1" in str(exc), str(exc)
        return elapsed
    finally:
        rdv.publish("done", True)
        comm.close()
    raise AssertionError("no CommTimeout")


@pytest.mark.parametrize("backend", BACKENDS)
def test_absent_peer_times_out(backend):
    before = _shm_segments()
    (elapsed,) = _spawn(_absent_peer, 2, backend, reporting=1)  # ipc rank 1 dies without reporting
    if backend == "ipc":
        _POOL[0].wait_exit(1)
    assert 0.9 < elapsed < 2.0
    assert _shm_segments() <= before


def _failing_setup(rank: int, n: int, board, bad_rank: int) -> dict:
    """bad_rank's make_comm raises (max_rows=0); every other rank must raise CommSetupError
    naming it, promptly, although its own timeout is 30 s."""
    took = {}
    for backend in BACKENDS:
        rdv = DictRendezvous(board, n, prefix=f"{backend}/")
        # the start barrier on a board of its own: a fast bad rank's error marker must not fail a slow peer's wait
        # for the others to start (seen in CI under load) — only its make_comm
        DictRendezvous(board, n, prefix=f"{backend}/start/").wait_all_ready(rank, 30.0, tag="started")
        start = time.monotonic()
        try:
            make_comm(backend, rank, n, rendezvous=rdv, device="cpu", max_rows=0 if rank == bad_rank else 4,
                      hidden=HIDDEN, dtype=torch.float32, timeout_s=30.0)
        except CommSetupError as exc:
            assert rank != bad_rank and f"rank(s) [{bad_rank}]" in str(exc), str(exc)
        except ValueError:
            assert rank == bad_rank
        else:
            raise AssertionError(f"{backend}: rank {rank} set up although rank {bad_rank} failed")
        took[backend] = time.monotonic() - start
    return took


@pytest.mark.parametrize("bad_rank", [0, 2])
def test_failed_setup_fails_peers_fast(bad_rank):
    before = _shm_segments()
    for took in _spawn(_failing_setup, 3, bad_rank):
        assert max(took.values()) < 5.0, took
    assert _shm_segments() <= before


# ----------------------------------------------------------------------------- bounded region, chunked phases


def _chunked(rank: int, n: int, board) -> tuple[list[str], int]:
    """An ipc region of 4 rows under buckets of up to 33 rows: Dp and Span phases move in row chunks and
    still return the whole bucket and the in-order sums; Span == Dp bit for bit."""
    from workers.comm_ipc import IpcComm

    comm = IpcComm.create(rank, n, DictRendezvous(board, n, prefix="chunked/"), torch.device("cpu"), max_rows=64,
                          hidden=HIDDEN, dtype=torch.bfloat16, timeout_s=20.0, region_rows=4)
    failures = []
    for R, dtype in ((5, torch.bfloat16), (11, torch.float32)):
        dp = Dp(n, R)
        bucket = _data(R, n * R, dtype)
        partials = [_data(50 + R + src, n * R, dtype) for src in range(n)]
        mine = rows_of(dp, rank)
        if not torch.equal(comm.all_gather(bucket[mine.start:mine.stop], dp, 0), bucket):
            failures.append(f"rank {rank}: chunked ag dp R={R}")
        want = _in_order_sum(partials)
        dp_rs = comm.reduce_scatter(partials[rank], dp, 0)
        if not torch.equal(dp_rs, want[mine.start:mine.stop]):
            failures.append(f"rank {rank}: chunked rs dp R={R}")
        owner = R % n
        span = Span(n, n * R)
        local = bucket if rank == owner else bucket[:0]
        if not torch.equal(comm.all_gather(local, span, owner), bucket):
            failures.append(f"rank {rank}: chunked ag span R={R}")
        span_rs = comm.reduce_scatter(partials[rank], span, owner)
        if not torch.equal(span_rs, want if rank == owner else want[:0]):
            failures.append(f"rank {rank}: chunked rs span R={R}")
    comm.barrier()
    comm.close()
    return failures, comm.layout.max_rows


def test_ipc_phases_beyond_the_region_move_in_chunks():
    reports = _spawn(_chunked, 3)
    assert [f for failures, _ in reports for f in failures] == []
    assert {rows for _, rows in reports} == {4}          # the region holds 4 rows, not max_rows = 64


# ----------------------------------------------------------------------------- the lm_head split by vocabulary


def _lm_head(vocab: int, fp8: bool):
    """A seeded [vocab, HIDDEN] lm_head whose rows 3 and vocab - 2 are equal (logits tied across the first and last
    slices) and row 5 equal to row 4 (tied inside the first slice), those three scaled up so that rows built on them
    take their max there."""
    from models.glm5 import Linear

    g = torch.Generator().manual_seed(vocab)
    head = Linear(HIDDEN, vocab)
    w = torch.randn(vocab, HIDDEN, generator=g)
    w[3] *= 4
    w[vocab - 2] = w[3]
    w[4] *= 4
    w[5] = w[4]
    if not fp8:
        head.weight.data = w
        return head
    head.to_fp8()
    head.weight.data = w.clamp(-440, 440).to(head.weight.dtype)
    head.weight_scale_inv.data = torch.full_like(head.weight_scale_inv, 0.5)
    return head


def _vocab_argmax(rank: int, n: int, board, backend: str, vocab: int, fp8: bool, rows: int) -> list[str]:
    """Every rank's rows through ``StepComm.argmax_logits`` against the argmax of the whole lm_head's logits."""
    from workers.worker import StepComm

    comm = make_comm(backend, rank, n, rendezvous=DictRendezvous(board, n, prefix=f"{backend}/"), device="cpu",
                     max_rows=n * rows, hidden=HIDDEN, dtype=torch.float32, timeout_s=20.0)
    head = _lm_head(vocab, fp8)
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(n * rows, HIDDEN, generator=g)
    hidden[0] = head.weight[3].float() * 0.5           # a tie across slices: index 3 wins over vocab - 2
    hidden[1] = head.weight[4].float() * 0.5           # a tie inside a slice: index 4 wins over 5
    want = head(hidden).argmax(dim=-1)
    assert {int(want[0]), int(want[1])} == {3, 4}, "the tied rows must take their max at the tied indices"
    mine = slice(rank * rows, (rank + 1) * rows)
    failures = []
    for _ in range(3):                                  # consecutive calls keep the phases' parity
        got = StepComm(comm, rank, n, "cpu").argmax_logits(hidden[mine], head)
        if not torch.equal(got, want[mine]):
            failures.append(f"rank {rank} {backend} vocab {vocab} fp8 {fp8}: {got.tolist()} != {want[mine].tolist()}")
    comm.barrier()
    comm.close()
    return failures


@pytest.mark.parametrize("n,vocab,fp8", [(2, 50, False), (3, 50, False), (3, 300, True), (4, 200, True)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_vocab_split_argmax_equals_the_whole_lm_head(backend, n, vocab, fp8):
    """A greedy MTP draft in a worker group reads 1/N of the lm_head on each rank: the ids equal the whole lm_head's
    argmax, ties to the lowest index across and inside slices; uneven slices (50 over 3), FP8 slices of whole
    128-row scale blocks (300 over 3: 128 / 128 / 44), and a rank whose slice is empty (200 over 4: 128 / 72 / 0 / 0)."""
    assert [f for failures in _spawn(_vocab_argmax, n, backend, vocab, fp8, 2) for f in failures] == []


def test_ipc_halves_of_two_dtypes_never_overlap():
    """A bf16 phase then an fp32 one (the split argmax's two AGs) write different parities: the halves must be
    disjoint bytes whatever the dtypes, or the second phase overwrites rows a slower peer still reads."""
    comm = make_comm("ipc", 0, 1, rendezvous=DictRendezvous({}, 1), device="cpu", max_rows=4, hidden=HIDDEN,
                     dtype=torch.bfloat16, timeout_s=5.0)
    try:
        for which in ("AG", "RS"):
            spans = {}
            for dtype in (torch.bfloat16, torch.float32):
                for parity in (0, 1):
                    t = comm._region(which, dtype, parity)
                    spans[dtype, parity] = (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
            for a in (torch.bfloat16, torch.float32):
                for b in (torch.bfloat16, torch.float32):
                    (s0, e0), (s1, e1) = spans[a, 0], spans[b, 1]
                    assert e0 <= s1 or e1 <= s0, (which, a, b, spans)
    finally:
        comm.close()


def _bucket_logits(rank: int, n: int, board, backend: str, vocab: int, fp8: bool) -> list[str]:
    """``StepComm.bucket_logits`` on a graph step's static bucket — dp (R = 2, one pad row a rank) and a span under
    every owner — against the whole lm_head's logits of the real rows."""
    from scheduler.shapes import StepShape
    from workers.worker import StepComm

    R = 2
    comm = make_comm(backend, rank, n, rendezvous=DictRendezvous(board, n, prefix=f"{backend}/"), device="cpu",
                     max_rows=4096, hidden=HIDDEN, dtype=torch.float32, timeout_s=20.0)
    head, sc, failures = _lm_head(vocab, fp8), StepComm(comm, rank, n, "cpu"), []
    fits = sc.split_fits(R, torch.float32, head)                    # a span's R rows
    rows = [torch.randn(R, HIDDEN, generator=torch.Generator().manual_seed(40 + r)) for r in range(n)]
    sc.stage(StepShape("dp", R, n * R, None), 1, static=True)
    got = sc.bucket_logits(rows[rank], head)

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:     # fp32: a narrower or shorter product may round apart
        return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-5)

    if not close(got[:1], head(rows[rank][:1]).float()):
        failures.append(f"rank {rank} {backend} dp vocab {vocab}: {(got[:1] - head(rows[rank][:1])).abs().max()}")
    for owner in range(n):
        sc.stage(StepShape("span", R, R, owner), R if rank == owner else 0, static=True)
        got = sc.bucket_logits(rows[rank] if rank == owner else torch.zeros(R, HIDDEN), head)
        if (fits or rank == owner) and not close(got, head(rows[owner]).float()):     # whole: pads' on the others
            failures.append(f"rank {rank} {backend} span owner {owner} vocab {vocab}")
    comm.barrier()
    comm.close()
    return failures, sc.split_fits(n * R, torch.float32, head), fits


@pytest.mark.parametrize("n,vocab,fp8,dp_split", [(2, 50, False, True), (3, 50, False, True), (3, 300, True, True),
                                                  (4, 200, True, True), (2, 1000, False, True), (2, 3000, False, False)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_bucket_logits_equal_the_whole_lm_head(backend, n, vocab, fp8, dp_split):
    """A graph step's logits in a worker group: each rank reads 1/N of the lm_head and AG phases bring the slices of
    its rows (a span: the owner's rows, on every rank); equal to the whole lm_head's to fp32 rounding (1e-5: CPU BLAS
    rounds a narrower product apart; the H200's cuBLAS matched bit for bit, ``bench/vocab_head.py``). Phases of hidden
    16 hold 64 rows of 16 words a rank: 1000 over 2 moves a dp step's slices in 2 phases; 3000 over 2 a span's in 3,
    a dp step's would take 6 (more than 4): the whole lm_head there, the same logits."""
    reports = _spawn(_bucket_logits, n, backend, vocab, fp8)
    assert [f for failures, _, _ in reports for f in failures] == []
    assert {(dp, span) for _, dp, span in reports} == {(dp_split, True)}
