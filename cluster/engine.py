"""The engine: scheduler + an executor (the local model runner, or the remote worker group) + detokenizer.

``Engine`` is synchronous: ``add_request``, ``abort``, ``step() -> [TokenEvent]``. ``AsyncEngine`` runs
that step loop in a background thread and hands each request an async stream of ``TokenEvent`` —
the API the HTTP front end drives. The loop is plan → execute → update:

    plan = scheduler.schedule()
    result = executor.execute(WorkerStep(plan, new requests, forgotten requests))
    events = scheduler.update(plan, result.sampled)
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import traceback
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Protocol, Sequence

from cluster.detok import IncrementalDetokenizer, StopStringMatcher
from scheduler.request import FinishReason, SamplingParams
from scheduler.scheduler import AdmissionError, RequestEvent, Scheduler, SchedulerConfig
from workers.runner import NewRequest, StepResult, TokenLogprobs, WorkerStep

__all__ = ["AdmissionError", "AsyncEngine", "Engine", "TokenEvent"]


class Executor(Protocol):
    def execute(self, step: WorkerStep) -> StepResult: ...


@dataclass
class TokenEvent:
    """New output of one request: tokens, the text they finalised, and how it ended (if it did)."""

    req_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0


@dataclass
class _Stream:
    prompt_len: int
    detok: IncrementalDetokenizer | None
    stops: StopStringMatcher
    num_output: int = 0


class Engine:
    """Single-threaded engine core. ``decode`` turns ids into text (None: token ids only)."""

    def __init__(self, executor: Executor, config: SchedulerConfig,
                 decode: Callable[[Sequence[int]], str] | None = None):
        self.executor, self.config, self.decode = executor, config, decode
        self.scheduler = Scheduler(config)
        self._streams: dict[str, _Stream] = {}
        self._unsent: dict[str, NewRequest] = {}      # known to the scheduler, not yet to the workers
        self._forget: list[str] = []                  # ended requests the workers still hold state for
        self._lock = threading.Lock()                 # add/abort (caller's thread) vs step (loop thread)
        self._ids = itertools.count()
        self.stats = {"prompt_tokens": 0, "generated_tokens": 0, "steps": 0, "preemptions": 0}

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams, req_id: str | None = None) -> str:
        """Queue a request; raises AdmissionError (with .field and .reason) if it can never run."""
        req_id = req_id if req_id is not None else f"req-{next(self._ids)}"
        with self._lock:
            self.scheduler.add_request(req_id, list(prompt_ids), params)
            detok = IncrementalDetokenizer(self.decode, list(prompt_ids)) if self.decode else None
            self._streams[req_id] = _Stream(len(prompt_ids), detok, StopStringMatcher(params.stop))
            self._unsent[req_id] = NewRequest(req_id, tuple(prompt_ids), params)
            self.stats["prompt_tokens"] += len(prompt_ids)
        return req_id

    def abort(self, req_id: str) -> TokenEvent | None:
        with self._lock:
            ev = self.scheduler.abort(req_id)
            return self._end(ev) if ev else None

    def has_work(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._forget)

    # ---- the step loop -----------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        with self._lock:
            plan = self.scheduler.schedule()
            new = tuple(self._unsent.pop(s.req_id) for s in plan.seqs if s.req_id in self._unsent)
            forget, self._forget = tuple(self._forget), []
        self.stats["preemptions"] += len(plan.preempted)
        if plan.is_empty and not forget:
            return []
        try:
            result = self.executor.execute(WorkerStep(plan.step_id, plan.seqs, new, forget))
        except Exception as e:  # a failed step fails its requests, never the engine
            msg = f"step {plan.step_id} failed: {type(e).__name__}: {e}"
            traceback.print_exc()
            with self._lock:
                return [self._end(ev) for ev in self.scheduler.fail([s.req_id for s in plan.seqs], msg)]
        with self._lock:
            self.stats["steps"] += 1
            events = self.scheduler.update(plan, result.sampled)
            return [self._emit(ev, result) for ev in events if ev.req_id in self._streams]

    def _emit(self, ev: RequestEvent, result: StepResult) -> TokenEvent:
        st = self._streams[ev.req_id]
        st.num_output += len(ev.new_token_ids)
        self.stats["generated_tokens"] += len(ev.new_token_ids)
        text = st.detok.add(list(ev.new_token_ids)) if st.detok else ""
        if ev.finished and st.detok:
            text += st.detok.flush()
        text, stopped = st.stops.feed(text)
        out = TokenEvent(ev.req_id, list(ev.new_token_ids), text, logprobs=result.logprobs.get(ev.req_id, []),
                         num_prompt_tokens=st.prompt_len, num_output_tokens=st.num_output)
        if stopped and not ev.finished:
            self.scheduler.finish(ev.req_id, FinishReason.STOP)
            ev = RequestEvent(ev.req_id, ev.new_token_ids, True, FinishReason.STOP)
        if ev.finished:
            if not stopped:
                out.text += st.stops.flush()
            out.finished, out.finish_reason = True, ev.finish_reason
            self._close(ev.req_id)
        return out

    def _end(self, ev: RequestEvent) -> TokenEvent:
        st = self._streams.get(ev.req_id)
        out = TokenEvent(ev.req_id, [], "", True, ev.finish_reason, ev.error,
                         num_prompt_tokens=st.prompt_len if st else 0, num_output_tokens=st.num_output if st else 0)
        self._close(ev.req_id)
        return out

    def _close(self, req_id: str) -> None:
        self._streams.pop(req_id, None)
        if self._unsent.pop(req_id, None) is None:
            self._forget.append(req_id)


class AsyncEngine:
    """Runs ``Engine.step`` in a background thread; each request gets an async stream of events."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._stop = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop:
            if not self.engine.has_work():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            for ev in self.engine.step():
                self._deliver(ev)

    def _deliver(self, ev: TokenEvent) -> None:
        target = self._queues.get(ev.req_id)
        if target is None:
            return
        loop, q = target
        if ev.finished:
            self._queues.pop(ev.req_id, None)
        loop.call_soon_threadsafe(q.put_nowait, ev)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams,
                       req_id: str | None = None) -> AsyncIterator[TokenEvent]:
        """Stream the request's events; raises AdmissionError before the first event if refused.
        Leaving the iteration early (a client disconnect) aborts the request and frees its KV."""
        q: asyncio.Queue = asyncio.Queue()
        req_id = req_id if req_id is not None else f"areq-{next(self._ids)}"
        self._queues[req_id] = (asyncio.get_running_loop(), q)   # before the loop can emit for it
        try:
            self.engine.add_request(prompt_ids, params, req_id)
        except BaseException:
            self._queues.pop(req_id, None)
            raise
        self._wake.set()
        finished = False
        try:
            while not finished:
                ev = await q.get()
                finished = ev.finished
                yield ev
        finally:
            if not finished:
                self._queues.pop(req_id, None)
                self.engine.abort(req_id)

    def abort(self, req_id: str) -> None:
        ev = self.engine.abort(req_id)
        if ev:
            self._deliver(ev)

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)
