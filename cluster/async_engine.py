"""``AsyncEngine``: ``Engine.step`` in a background thread, each request an async stream of ``TokenEvent`` — the API
the HTTP front end drives."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Sequence

from cluster.disagg import KVBundle
from cluster.engine import Engine, _guided
from cluster.stream import TokenEvent
from scheduler.request import FinishReason, SamplingParams
from scheduler.scheduler import AdmissionError

PROBE_S = 2.0       # an idle engine looks for a dead rank this often (``Engine.probe``)


class AsyncEngine:
    """Runs ``Engine.step`` in a background thread; each request gets an async stream of events. Should the loop ever
    stop (shut down, or an error in its own error handling), every stream still open ends with an error."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._stop = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        why, busy = "the engine shut down", time.monotonic()
        try:
            while not self._stop:
                if not self.engine.has_work():
                    if time.monotonic() - busy > PROBE_S:
                        busy = time.monotonic()
                        for ev in self.engine.probe():
                            self._deliver(ev)
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                busy = time.monotonic()
                try:
                    events = self.engine.step()
                except Exception as e:  # noqa: BLE001 — an engine bug: the requests in flight fail, the loop goes on
                    traceback.print_exc()
                    events = self.engine._fail_all(f"engine error: {type(e).__name__}: {e}")
                for ev in events:
                    self._deliver(ev)
        except BaseException as e:
            traceback.print_exc()
            why = f"the engine loop stopped: {type(e).__name__}: {e}"
        finally:
            for req_id in list(self._queues):
                try:
                    self._deliver(TokenEvent(req_id, [], "", True, FinishReason.ERROR, why))
                except RuntimeError:    # (its event loop is closed)
                    pass

    def _deliver(self, ev: TokenEvent) -> None:
        target = self._queues.get(ev.req_id)
        if target is None:
            return
        loop, q = target
        if ev.finished:
            self._queues.pop(ev.req_id, None)
        loop.call_soon_threadsafe(q.put_nowait, ev)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, req_id: str | None = None,
                       export_kv: bool = False, kv: KVBundle | None = None, export_from: int = 0,
                       added: Callable[[], None] | None = None) -> AsyncIterator[TokenEvent]:
        """Stream the request's events; raises AdmissionError before the first event if refused.
        Leaving the iteration early (a client disconnect) aborts the request and frees its KV. ``added``: called once
        the engine has the request (or refused it)."""
        q: asyncio.Queue = asyncio.Queue()
        req_id = req_id if req_id is not None else f"areq-{next(self._ids)}"
        refused = None
        if req_id in self._queues:      # (the live request keeps its stream)
            refused = AdmissionError("duplicate", "req_id", f"req_id {req_id!r} is already in flight")
        elif not self.is_alive():
            refused = AdmissionError("unavailable", "model", "the engine loop has stopped")
        if refused is not None:
            if added is not None:
                added()
            raise refused
        self._queues[req_id] = (asyncio.get_running_loop(), q)   # before the loop can emit for it
        try:
            if not _guided(params) and kv is None:
                self.engine.add_request(prompt_ids, params, req_id, export_kv, export_from=export_from)
            else:       # its grammar compiles (~0.1-0.3 s a new schema at GLM-5's vocabulary), its KV is adopted: off
                adding = asyncio.ensure_future(asyncio.to_thread(      # the loop, and shielded: a cancel meanwhile
                    self.engine.add_request, prompt_ids, params, req_id, export_kv, kv, export_from))  # aborts it, added
                try:
                    await asyncio.shield(adding)
                except asyncio.CancelledError:
                    adding.add_done_callback(lambda f: f.cancelled() or f.exception() or self.engine.abort(req_id))
                    raise
        except BaseException:
            self._queues.pop(req_id, None)
            raise
        finally:
            if added is not None:
                added()
        kv = None           # (the engine holds what it writes: the rows are not kept for the stream's life)
        self._wake.set()
        finished = False
        try:
            while not finished:
                ev = await q.get()
                finished = ev.finished
                if ev.refused is not None:          # refused to make way for a higher priority: as if at admission
                    raise ev.refused
                yield ev
        finally:
            if not finished:
                self._queues.pop(req_id, None)
                self.engine.abort(req_id)

    def is_alive(self) -> bool:
        """False once the step loop has died (an engine bug): the replica's health check fails then."""
        return self._thread.is_alive()

    def abort(self, req_id: str) -> None:
        ev = self.engine.abort(req_id)
        if ev:
            self._deliver(ev)

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)
