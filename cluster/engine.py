"""The engine: per-rank schedulers + an executor (the local runner, or the worker group) + detokenizer.

``Engine`` is synchronous: ``add_request``, ``abort``, ``step() -> [TokenEvent]``. ``AsyncEngine``
(``cluster/async_engine.py``) runs that step loop in a background thread and hands each request an async stream of
``TokenEvent`` — the API the HTTP front end drives. One step is plan → execute → update:

    plans = [s.schedule(max_drafts) for s in schedulers]          # pure: rows, block ids, drafts
    results = executor.execute(worker_steps(plans, shape))        # every rank, one bucket shape
    events = [s.update(p, r.sampled, r.drafts) for s, p, r in ...]
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import traceback
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from cluster.disagg import Imports, KVBundle, Take, adopt_bundle, check_bundle, exported_blocks, hold_prefix
from cluster.stream import OutputStream, TokenEvent
from scheduler.request import FinishReason, Request, SamplingParams
from scheduler.scheduler import (
    AdmissionError,
    RequestEvent,
    ScheduledSeq,
    Scheduler,
    SchedulerConfig,
    StepPlan,
)
from scheduler.shapes import (
    decode_rows,
    graph_key,
    graph_shape,
    graph_widths,
    place_request,
    plan_step_shapes,
    rank_seqs,
    warm_keys,
)
from workers.runner import NewRequest, StepResult, WorkerStep
from workers.sampler import StepMasks

if TYPE_CHECKING:
    from cluster.disagg import HeldPrefix
    from cluster.guided import Budget, Guide, Guides, Prefix

__all__ = ["AdmissionError", "Engine", "GroupFailure", "LocalExecutor", "TokenEvent"]


def _advanced(launched: tuple, graph, plans: Sequence[StepPlan]) -> bool:
    """Whether ``plans`` are the launched step's: the same graph key (so its tokens are bit for bit this step's)
    and, on every rank, the launched requests in order — less those that ended since — each one position on, in the
    same blocks and maybe one more after them (their fed tokens are the ones just sampled, by construction). Rows
    launched for requests that ended are thrown away."""
    key, before = launched
    return graph == key and all(_follows(p.seqs, q.seqs) for p, q in zip(plans, before))


def _follows(seqs: Sequence[ScheduledSeq], before: Sequence[ScheduledSeq]) -> bool:
    rows = iter(before)
    for s in seqs:
        r = next((r for r in rows if r.req_id == s.req_id), None)
        if r is None or s.start_pos != r.start_pos + 1 or s.block_ids[:len(r.block_ids)] != r.block_ids \
                or len(s.token_ids) != 1 or s.num_drafts:
            return False
    return True


class Executor(Protocol):
    """Runs one step on every rank: ``steps[r]`` is rank r's part; returns one result per rank.
    Raises ``GroupFailure`` when the worker group is lost (then ``recover()`` rebuilds it). A group may also have
    ``dead() -> str | None``: between steps, why a rank is gone (``Engine.probe``)."""

    def execute(self, steps: list[WorkerStep]) -> list[StepResult]: ...

    def recover(self) -> None: ...


def out_of_memory_hint(e: BaseException, steps: list[WorkerStep]) -> str:
    """What to change, after an error that says the device ran out of memory (a rank's, passed on as text too)."""
    if "out of memory" not in str(e).lower():
        return ""
    seqs = [s for step in steps for s in step.seqs]
    what = (f"a step of {max(sum(len(s.token_ids) for s in step.seqs) for step in steps)} tokens a rank (contexts up "
            f"to {max(s.end_pos for s in seqs)})" if seqs else f"capturing the graph step {steps[0].graph}"
            if steps[0].graph else "a step")
    return (f" [{what} found too little device memory beside the KV pool: lower kv_cache_tokens or "
            f"gpu_memory_utilization (whichever sizes the pool), max_num_batched_tokens or max_num_seqs]")


class GroupFailure(RuntimeError):
    """The worker group died or hung: every in-flight request fails, the group is rebuilt."""


class LocalExecutor:
    """One rank, in this process."""

    def __init__(self, runner):
        self.runner = runner

    def execute(self, steps: list[WorkerStep]) -> list[StepResult]:
        return [self.runner.execute(steps[0])]

    def recover(self) -> None:
        self.runner.reset()

    def shutdown(self) -> None:
        pass


def _guided(params: SamplingParams) -> bool:
    """Whether a grammar holds the request's output (a JSON schema, an EBNF grammar, its tool calls')."""
    return params.json_schema is not None or params.grammar is not None or params.tool_grammar is not None


class Engine:
    """The engine core: one scheduler (and KV block pool) per rank, one executor for all ranks.

    A request lives on one rank (the least KV-loaded at arrival; one that waits there for a slot or for KV blocks while
    another rank has them moves before the step, ``_rebalance``): its KV, attention and sampling stay there.
    ``config``'s ``max_num_seqs`` and ``max_waiting`` bound the replica, not a rank: each rank runs its
    ``rank_seqs`` share of ``max_num_seqs``, and the engine holds at most ``max_num_seqs`` + ``max_waiting``
    requests in all (more are refused, ``queue_full``). Each step every rank's scheduler plans its rows,
    ``plan_step_shapes`` picks the MoE bucket (dp stripes, or a span when a solo request wants several rows), and
    the executor runs all ranks.
    ``decode`` turns ids into text (None: token ids only); each of ``special_ids`` (the tokenizer's special tokens)
    starts an event of its own, also when a speculative step accepts several tokens at once: the front end's
    reasoning and tool-call parsers cut the text at them (``</think>``, ``<tool_call>``). ``graphs``: the workers run
    graph-shaped steps (``graph_key``) on their static path — set iff their ``graphs`` mode is not ``off``.
    ``guides``: a request with ``SamplingParams.json_schema`` (``grammar``, ``tool_grammar``) samples only what its
    grammar allows next, one with ``forced_paths`` starts with one of them (each of its sampled rows — a verify
    round's too, each along the drafts before it — gets the allowed tokens' bitmask in ``WorkerStep.masks``; a step
    launched ahead samples once the next step brings them); while it waits (for the reasoning's end, tool_choice
    auto's ``<tool_call>``) its drafts stop before the token that ends the wait, and a step launched ahead over that
    token is dropped. ``lookahead``: let the workers launch the same requests' next decode step before returning a
    graph step's tokens sampled on the device, and tell them when the next step is that one (``WorkerStep.lookahead``
    / ``use_ahead``, decided here for all ranks alike; ``workers/runner.py``; off: for A/B measurements).
    ``graph_prefill``: prompt chunks ride graph steps too when the step fits a bucket that a rank's decode steps can
    fill (``graph_key``; off: for A/B measurements). ``prompts_only``: an engine that only computes prompts (a prefill
    replica's) runs no graph step — a last chunk of one token looks like a decode row — and captures none.
    ``kv_layout`` (``KVCache.layout`` of the workers' caches): a request may bring its prompt's KV computed by another
    replica (``add_request``'s ``kv``) or send its own back (``export_kv``): disaggregated prefill
    (``cluster/disagg.py``).
    """

    def __init__(self, executor: Executor, config: SchedulerConfig,
                 decode: Callable[[Sequence[int]], str] | None = None, num_ranks: int = 1, span: bool = True,
                 speculative_tokens: int = 0, graphs: bool = False, lookahead: bool = True, graph_prefill: bool = True,
                 prompts_only: bool = False, special_ids: Collection[int] = (), guides: Guides | None = None,
                 kv_layout: tuple | None = None):
        self.executor, self.config, self.decode, self.span = executor, config, decode, span
        self.kv_layout = kv_layout
        # request -> (the prompt tokens its KV bundle covers, the position its rows start at)
        self._exports: dict[str, tuple[tuple[int, ...], int]] = {}
        self._imports = [Imports() for _ in range(num_ranks)]   # a rank's blocks to write with its next steps
        self._imported: list[Request] = []     # requests whose import the last step ended (``Request.imported``)
        self.guides = guides                          # structured output (cluster/guided.py); None: refused
        # the requests with a json_schema, tool_grammar, forced_paths or thinking_budget
        self._guides: dict[str, Guide | Prefix | Budget] = {}
        self.special_ids = frozenset(special_ids)
        self.graphs, self.lookahead, self.graph_prefill = graphs, lookahead, graph_prefill
        self.prompts_only = prompts_only
        self._launched: tuple[tuple[int, int, bool], list[StepPlan]] | None = None   # (graph, plans) launched ahead
        self.speculative_tokens = speculative_tokens
        # the replica's bound (add_request) is the one that binds: a rank's own queue bound is the whole of it
        seats = rank_seqs(config.max_num_seqs, num_ranks)
        self._admits = sum(seats) + config.max_waiting
        # prompt chunks ride the buckets decode steps can fill (the warm-up captures those: no capture while serving)
        self._chunk_rows = decode_rows(num_ranks, max(seats))
        slack = int(graphs and lookahead and speculative_tokens == 0)     # a look-ahead step writes one position on
        self.schedulers = [Scheduler(replace(config, max_num_seqs=n, max_waiting=self._admits), slack) for n in seats]
        self._rank_of: dict[str, int] = {}
        self._streams: dict[str, OutputStream] = {}
        self._unsent: dict[str, NewRequest] = {}      # known to a scheduler, not yet to its worker
        self._forget: list[list[str]] = [[] for _ in range(num_ranks)]  # ended, still held by workers
        self._refused: list[TokenEvent] = []          # requests ``_refuse`` refused, for the next step to report
        self._lock = threading.Lock()                 # add/abort (caller's thread) vs step (loop thread)
        self._ids = itertools.count()
        self._admitted = itertools.count()
        self.warmed: dict | None = None               # what ``warm_up`` did, if it ran
        self.rebuild_at: float | None = None          # the group failed: ``step`` rebuilds it from this monotonic time
        self.down: str | None = None                  # why the last rebuild failed: requests are refused meanwhile
        self._failed_rebuilds = 0
        self._reset_stats()

    def _reset_stats(self) -> None:
        self.stats = {"generated_tokens": 0, "steps": 0, "preemptions": 0, "moves": 0,
                      "span_steps": 0, "graph_steps": 0, "ahead_steps": 0, "failed_steps": 0, "draft_rounds": 0,
                      "drafts_proposed": 0, "drafts_accepted": 0, "step_seconds": 0.0, "worker_busy_seconds": 0.0,
                      "kv_exported_tokens": 0, "kv_imported_tokens": 0}
        self.accepted_at = [0] * (self.speculative_tokens + 1)   # rounds whose draft i was accepted
        for sch in self.schedulers:
            sch.prompt_started = sch.prefix_queried = sch.prefix_hits = sch.host_loads = 0

    def prefix_cache_tokens(self) -> tuple[int, int]:
        """(prompt tokens looked up in the prefix cache, of which found cached) since the stats started."""
        return sum(s.prefix_queried for s in self.schedulers), sum(s.prefix_hits for s in self.schedulers)

    @property
    def scheduler(self) -> Scheduler:
        assert len(self.schedulers) == 1, "a multi-rank engine has one scheduler per rank"
        return self.schedulers[0]

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams, req_id: str | None = None,
                    export_kv: bool = False, kv: KVBundle | None = None, export_from: int = 0) -> str:
        """Queue a request; raises AdmissionError (with .field and .reason) if it can never run. ``export_kv``: its
        final event carries its prompt's KV (``TokenEvent.kv``) from position ``export_from`` on (what the decode
        replica lacks); ``kv``: its prompt's KV from another replica, taken into the prefix cache of the rank it runs on
        (``KVTransferError`` if this engine cannot take it)."""
        req_id = req_id if req_id is not None else f"req-{next(self._ids)}"
        if kv is not None:
            self.check_kv(prompt_ids, kv)
        if params.min_tokens:            # the ids that would stop it, which its first min_tokens tokens may not be
            stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.config.eos_token_ids))
            params = replace(params, min_tokens_ban=tuple(sorted(stops)))
        self.schedulers[0].check_request(prompt_ids, params)     # (first: a request that can never run is no 429)
        guide = self._guide(prompt_ids, params)
        with self._lock:
            if self.down is not None:
                raise self._down_error()
            if req_id in self._rank_of:
                raise AdmissionError("duplicate", "req_id", f"req_id {req_id!r} is already in flight")
            full = sum(s.num_running + s.num_waiting for s in self.schedulers) >= self._admits
            ids = list(prompt_ids)
            # the rank its blocks add the least KV load to: the least loaded (the live requests' expected growth
            # counted), less the blocks it holds cached — those a running request holds count twice: they are in its
            # load already, and each rank computes them again (the n > 1 choices of a prompt, a shared system prompt)
            look = len(self.schedulers) > 1 and params.prompt_logprobs is None
            found = [s.cached_and_held(ids, params.cache_salt) if look else (0, 0) for s in self.schedulers]
            hits = [h for h, _ in found]
            loads = {r: s.placement_load - sum(found[r]) for r, s in enumerate(self.schedulers)}
            if kv is not None:   # its prompt's KV comes along, to a rank with a seat (one that waits may be moved)
                seats = {r: s.kv_load for r, s in enumerate(self.schedulers) if s.free_seats > 0}
                holders = [r for r, h in enumerate(hits) if h >= kv.start // self.config.block_size]
                # (a rank without its prefix takes none; where no rank has a seat, it waits on one that holds it)
                takers = [r for r in holders if r in seats] or ([] if seats else holders)
                loads = {r: seats[r] if seats else loads[r] for r in takers} or seats or loads
                hits = [max(h, kv.num_tokens // self.config.block_size) if r in takers else h
                        for r, h in enumerate(hits)]
            rank = place_request(loads)
            queued, over = self._queued_tokens_over()
            displaced = self._displaceable(params.priority, full, over) if full or over else []
            if displaced is None:
                raise self._full_error(full, queued)
            self.schedulers[rank].check_admission(req_id, ids, params, leaving=len(displaced), checked=True)
            for victim in displaced:            # admitted: the requests it displaces are refused now
                self._refuse(*victim)
            writes = kv and adopt_bundle(self.schedulers[rank].pool, ids, params.cache_salt, kv, pending=True)
            if export_kv and (n := exported_blocks(len(ids), self.config.block_size)) * self.config.block_size > \
                    export_from:
                self._exports[req_id] = tuple(ids[:n * self.config.block_size + 1]), export_from
            req = self.schedulers[rank].add_request(req_id, ids, params)
            if writes:      # the rows go to the rank's worker with its next steps; the request waits for them
                self._imports[rank].add(req, *writes)
                req.imported_tokens = len(writes[0]) * self.config.block_size
                self.stats["kv_imported_tokens"] += req.imported_tokens
                req.importing = True
            self._rank_of[req_id] = rank
            self._streams[req_id] = OutputStream.open(ids, params, self.decode, self.config.eos_token_ids, request=req,
                                                      admitted=next(self._admitted))
            self._unsent[req_id] = NewRequest(req_id, tuple(prompt_ids), params)
            if guide is not None:
                self._guides[req_id] = guide
        return req_id

    def check_kv(self, prompt_ids: Sequence[int], kv: KVBundle) -> None:
        """Raise ``KVTransferError`` where this engine cannot take ``kv`` for this prompt (``add_request`` does too)."""
        check_bundle(kv, prompt_ids, self.kv_layout, self.speculative_tokens > 0, self.config.prefix_caching,
                     self.config.block_size)

    def hold_prefix(self, prompt_ids: Sequence[int], salt: str | None) -> HeldPrefix:
        """``cluster/disagg.py``'s ``hold_prefix`` on this engine's ranks: the prompt's tokens cached, held — on a rank
        with a free seat (a request bringing KV goes to one, ``add_request``), or where every seat is taken, on any
        (it waits on the rank that holds its prefix: a busy replica asks for the rest only, as an idle one does)."""
        with self._lock:
            caching = [s for s in self.schedulers if s.config.prefix_caching]
            return hold_prefix([s.pool for s in [s for s in caching if s.free_seats > 0] or caching], prompt_ids,
                               salt, self._lock)

    def check_room(self, params: SamplingParams, promised: int = 0) -> None:
        """Raise the AdmissionError ``add_request`` would raise now for want of room (the worker group down, every
        seat and queue place taken, the queue's prompt tokens at ``max_waiting_tokens``), with ``promised`` requests
        more counted as admitted: a disaggregated decode replica refuses a request before a prefill replica computes
        its prompt (``promised``: the requests whose prompts are being computed there)."""
        with self._lock:
            if self.down is not None:
                raise self._down_error()
            full = sum(s.num_running + s.num_waiting for s in self.schedulers) + promised >= self._admits
            queued, over = self._queued_tokens_over()
            if (full or over) and self._displaceable(params.priority, full, over) is None:
                raise self._full_error(full, queued)

    def _down_error(self) -> AdmissionError:
        return AdmissionError("unavailable", "model", f"the replica's worker group is down ({self.down}); it is "
                              f"rebuilt again in {max(0.0, self.rebuild_at - time.monotonic()):.0f} s")

    def _full_error(self, full: bool, queued: int) -> AdmissionError:
        if full:
            return AdmissionError("queue_full", "queue", f"the engine is full ({self.config.max_num_seqs} running + "
                                  f"{self.config.max_waiting} waiting requests); retry later")
        return AdmissionError("queue_full", "queue", f"the engine's queue holds {queued} prompt tokens still to "
                              f"compute, max_waiting_tokens ({self.config.max_waiting_tokens}) or more; retry later")

    def _displaceable(self, priority: int, seat: bool, tokens: int) -> list[tuple[int, Request]] | None:
        """Priority: an engine that has no seat for a request (``seat``), or whose queue must lose ``tokens`` of its
        prompt tokens to be below ``max_waiting_tokens``, admits it by refusing, after the fact, waiting requests
        of a lower priority that have had no output yet and never ran — the lowest priority first, the latest of it
        first — until a seat and the tokens are free. Their clients have had no answer yet, and get the 429 this one
        would have had (``AsyncEngine.generate`` raises it before any event). Those requests and their ranks, or None
        where they cannot free enough."""
        if self.config.policy != "priority":
            return None
        bs, out, freed = self.config.block_size, [], 0
        for _, rank, r in sorted(((r.params.priority, self._streams[r.req_id].admitted), rank, r)
                                 for rank, s in enumerate(self.schedulers) for r in s.waiting()
                                 if r.params.priority > priority and not r.output_ids and not r.num_preemptions)[::-1]:
            if (not seat or out) and freed >= tokens:
                break
            gain = max(0, r.num_tokens - r.hit_blocks * bs)        # its share of the queue's tokens
            if (seat and not out) or gain:
                out.append((rank, r))
                freed += gain
        return out if (out or not seat) and freed >= tokens else None

    def _refuse(self, rank: int, victim: Request) -> None:
        """Refuse ``victim``, waiting on ``rank``, for a request of a higher priority (``_displaceable``)."""
        ev = self._end(self.schedulers[rank].abort(victim.req_id))
        tokens = f", max_waiting_tokens {self.config.max_waiting_tokens}" if self.config.max_waiting_tokens else ""
        ev.refused = AdmissionError("queue_full", "queue", f"the engine is full ({self.config.max_num_seqs} running + "
                                    f"{self.config.max_waiting} waiting requests{tokens}) and a request of a higher "
                                    "priority took this one's place in the queue; retry later")
        ev.error, ev.finish_reason = str(ev.refused), FinishReason.ABORT
        self._refused.append(ev)

    def _queued_tokens_over(self) -> tuple[int, int]:
        """``max_waiting_tokens``: (the prompt tokens queued in the replica still to compute, how many must go before
        it admits a prompt). Below the bound it takes a prompt of any length (had the prompt to fit, short ones would
        take every opening under load, a long one never: session 56's review), so it holds < bound + max_model_len."""
        bound = self.config.max_waiting_tokens
        queued = sum(s.queued_tokens for s in self.schedulers) if bound else 0   # the caller holds the lock
        return queued, max(0, queued - bound + 1) if bound else 0

    def _guide(self, prompt_ids: Sequence[int], params: SamplingParams) -> Guide | Prefix | Budget | None:
        budget = params.thinking_budget
        if not _guided(params) and not params.forced_paths and budget is None:
            return None
        field = "response_format" if params.json_schema is not None else "structured_outputs" if params.grammar \
            else "tools" if params.tool_grammar else "tool_choice" if params.forced_paths else "thinking_token_budget"
        if self.guides is None:
            what = "a thinking budget" if field == "thinking_token_budget" else "structured output"
            raise AdmissionError("unsupported", field, f"{what} needs the model's tokenizer, which this model "
                                 "directory lacks")
        if max((t for p in (*params.forced_paths, params.guide_after) for t in p), default=0) >= self.guides.vocab_size:
            raise AdmissionError("invalid", field, "forced_paths / guide_after hold an id past the vocabulary")
        if params.forced_paths:
            return self.guides.prefix(params.forced_paths, prompt_ids, budget)
        try:
            if params.tool_grammar is not None:
                return self.guides.tool_guide(params.tool_grammar, prompt_ids, params.guide_after, budget)
            if params.json_schema is not None or params.grammar is not None:
                return self.guides.guide(params.json_schema, prompt_ids, params.guide_after, budget, params.grammar)
        except (ValueError, RuntimeError) as e:
            raise AdmissionError("invalid", field, str(e)) from None
        return self.guides.budget(prompt_ids, budget)

    def abort(self, req_id: str) -> TokenEvent | None:
        with self._lock:
            rank = self._rank_of.get(req_id)
            ev = self.schedulers[rank].abort(req_id) if rank is not None else None
            return self._end(ev) if ev else None

    def has_unfinished(self) -> bool:
        return any(s.has_unfinished() for s in self.schedulers)

    def has_work(self) -> bool:
        return self.has_unfinished() or any(self._forget) or bool(self._refused) or any(map(bool, self._imports)) \
            or (self.rebuild_at is not None and time.monotonic() >= self.rebuild_at)

    def probe(self) -> list[TokenEvent]:
        """An idle engine's look at its group: a rank found dead (the executor's ``dead()``, where it has one) has the
        group rebuilt now, not when the next request arrives (session 56's review)."""
        why = getattr(self.executor, "dead", lambda: None)()
        return self._fail_all(f"worker group failed: {why}") if why is not None and self.rebuild_at is None else []

    def kv_usage(self) -> float:
        return sum(s.kv_usage for s in self.schedulers) / len(self.schedulers)

    def num_free_blocks(self) -> int:
        return sum(s.pool.num_free for s in self.schedulers)

    def queued_tokens(self) -> int:
        """Prompt tokens the requests without a first token still have to compute (``max_waiting_tokens``'s count)."""
        with self._lock:
            return sum(s.queued_tokens for s in self.schedulers)

    # ---- start-up ----------------------------------------------------------------------------
    def warm_up(self, tokens: int, report: Callable[[str], None] | None = None) -> dict:
        """Before serving: capture every graph step of contexts up to ``tokens`` tokens (``warm_keys``: each bucket,
        dp and span, with the MTP drafting graphs after it) on pad rows, one warm step per key on every rank; then
        run the sampler's kernel variants and the per-layer pieces (a warm step without a graph); then serve requests,
        one per rank, at prompt lengths that meet the kernels' row classes, one of several chunks where the contexts
        allow, then each again (prefix-cache hits: prefills past 0) — prefill and sampling (a plain draw, top-p, top-k
        in turn) compile their kernels; ``prompts_only``: no graph steps, requests of one token. A failure raises — a
        replica that cannot warm up cannot serve. The stats start afresh after. Returns what was done."""
        start = time.perf_counter()
        keys = []
        if self.graphs and tokens > 0:
            cfg = self.config
            blocks = min(-(-tokens // cfg.block_size), -(-cfg.max_model_len // cfg.block_size), cfg.num_blocks)
            keys = warm_keys(len(self.schedulers), self.span, self.speculative_tokens, graph_widths(blocks),
                             max(s.config.max_num_seqs for s in self.schedulers)) if not self.prompts_only else []
            if report and keys:
                report(f"warm-up: capturing {len(keys)} graph steps (contexts up to {tokens} tokens) ...")
            for i, (key, drafts) in enumerate(keys):
                shape = graph_shape(key[0], key[2], len(self.schedulers))
                self._warm_step([WorkerStep(-1, (), shape=shape, graph=key, warm=drafts)] * len(self.schedulers))
                if report and (i + 1) % max(1, len(keys) // 4) == 0 and i + 1 < len(keys):
                    report(f"warm-up: {i + 1} of {len(keys)} graph steps in {time.perf_counter() - start:.1f} s")
        if report:
            report(f"warm-up: the sampler's kernels, the other steps' per-layer pieces where on "
                   f"({time.perf_counter() - start:.1f} s) ...")
        shape = graph_shape(1, False, len(self.schedulers))      # a warm step without a graph (``ModelRunner._warm``)
        self._warm_step([WorkerStep(-1, (), shape=shape, warm=())] * len(self.schedulers))
        captured = time.perf_counter()
        # prompts of a prefill chunk at most, decoding within the captured widths; sizes in each of the kernels' row
        # classes (prefill, mid-size past and within 128 rows, the decode tiles' 16 / 32 / 64-row blocks), a multiple of
        # 16 and not, one token (Triton compiles a kernel per divisibility of its integer arguments, and for 1), and a
        # tail of one row (2 blocks + 1), run eagerly (a short prompt among requests rides a graph step, but alone in a
        # span step, with drafts, or beside a longer chunk it runs eagerly); where the contexts allow, first a prompt
        # whose chunks start past 0 and reach past the indexer's top-k (GLM's 2048); then each again: a prefix hit
        # computes its tail
        cfg = self.config
        top = max(1, min(cfg.max_num_batched_tokens, cfg.max_model_len - 16, tokens - 16))
        long = min(max(2 * top, 4096), (min(cfg.max_model_len, tokens) - 64) // 16 * 16) + 37    # (a last chunk of 37)
        sizes = (top, top - 7, 200, 192, 128, 100, 48, 41, 24, 17, 16, 9, 1, 2 * cfg.block_size + 1)
        lengths = [long] * (long > top) + sorted({min(n, top) for n in sizes if n >= 1}, reverse=True)
        rng = random.Random(0)
        prompts = [[[rng.randrange(cfg.vocab_size) for _ in range(n)] for _ in self.schedulers] for n in lengths]
        params = SamplingParams(max_tokens=1 if self.prompts_only else 2 + self.speculative_tokens, ignore_eos=True,
                                seed=0)
        # the sampler's paths (and their kernels): plain, top-p, top-k, both
        draws = ({}, {"top_p": 0.95}, {"top_k": 50}, {"top_k": 20, "top_p": 0.95})
        graph_prefill, self.graph_prefill = self.graph_prefill, False   # the prompts compile the eager path's kernels
        try:
            for i, ids in enumerate(prompts + (prompts if cfg.prefix_caching else [])):
                for r in range(len(self.schedulers)):     # one request a rank (placed on the least loaded, or its hit)
                    self.add_request(ids[r], replace(params, **draws[i % len(draws)]), f"warm-up-{r}")
                while self.has_work():
                    for ev in self.step():
                        if ev.error:
                            raise RuntimeError(f"warm-up request failed: {ev.error}")
        finally:
            self.graph_prefill = graph_prefill
        self._launched = None
        self._reset_stats()
        done = {"graph_steps": len(keys), "capture_s": captured - start, "request_s": time.perf_counter() - captured,
                "prompt_lengths": lengths, "gpu_free": self._gpu_free()}
        self.warmed = done
        if report:
            report(f"warm-up: done in {time.perf_counter() - start:.1f} s ({len(keys)} graph steps "
                   f"{done['capture_s']:.1f} s, prompts of {lengths[-1]}–{lengths[0]} tokens "
                   f"{done['request_s']:.1f} s)")
            if done["gpu_free"]:
                free, total = done["gpu_free"]
                report(f"warm-up: {free / 2**30:.1f} of {total / 2**30:.1f} GiB still free on the fullest GPU after "
                       f"its largest steps (PyTorch keeps what a step reserved: the headroom left at the peak)")
        return done

    def _gpu_free(self) -> tuple[int, int] | None:
        """(free, total) bytes of the GPU with the least free of the ranks', or None on CPU workers."""
        results = self.executor.execute([WorkerStep(-1, (), memory=True)] * len(self.schedulers))
        return min((r.memory for r in results if r.memory), default=None)

    def _warm_step(self, steps: list[WorkerStep]) -> None:
        try:
            self.executor.execute(steps)
        except Exception as e:
            if hint := out_of_memory_hint(e, steps):
                raise RuntimeError(f"warm-up failed: {type(e).__name__}: {e}{hint}") from e
            raise

    # ---- the step loop -----------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        """One step of every rank: its requests' events (first those ``_refuse`` refused since the last step); after
        a step that lost the group (its requests failed at once), the group's rebuild (``_recover``)."""
        refused = []
        if self._refused:               # (one added meanwhile goes out with the next step)
            with self._lock:
                refused, self._refused = self._refused, []
        if self.rebuild_at is not None:
            return refused + (self._recover() if time.monotonic() >= self.rebuild_at else [])
        return refused + self._step()

    def _step(self) -> list[TokenEvent]:
        with self._lock:
            self._rebalance()
            # drafts ride only while one request is active (under the span policy they are free then)
            solo = sum(len(s.live_ids()) for s in self.schedulers) == 1
            k = self.speculative_tokens if solo else 0
            beside = any(s.num_running for s in self.schedulers)        # (imports paced beside running requests)
            imports = [i.take(self.config.block_size, beside) for i in self._imports]   # sent after the step's work
            plans = [s.schedule(max_drafts=k) for s in self.schedulers]
            for req in self._imported:          # (planned once where its KV is: it may move from now on)
                req.imported = False
            self._imported.clear()
            steps = self._worker_steps(plans, imports, k)
        self._launched = None          # set again below if this step launches its successor ahead
        if steps is None:
            return []
        start = time.perf_counter()
        try:
            results = self.executor.execute(steps)
        except GroupFailure as e:      # the group is gone: every live request fails, then rebuild
            return self._fail_all(f"worker group failed: {e}{out_of_memory_hint(e, steps)}")
        except Exception as e:         # a failed step fails its requests, never the engine
            traceback.print_exc()
            self.stats["failed_steps"] += 1
            with self._lock:
                for sch in self.schedulers:      # what the failed step wrote is unknown: no prefix is trusted
                    sch.clear_prefix_cache()
                for imports, sch in zip(self._imports, self.schedulers):    # nor imported KV: their requests compute
                    imports.drop(sch)
                ids = [s.req_id for p in plans for s in p.seqs]
                return [self._end(ev) for r, sch in enumerate(self.schedulers)
                        for ev in sch.fail([i for i in ids if self._rank_of.get(i) == r],
                                           f"step failed: {type(e).__name__}: {e}{out_of_memory_hint(e, steps)}")]
        if steps[0].lookahead:         # the workers launched the next step ahead
            self._launched = (steps[0].graph, plans)
        with self._lock:
            busy = max(r.busy_ms for r in results)
            for imports, sch, res in zip(self._imports, self.schedulers, results):    # the blocks landed now
                self._imported += imports.written(sch, res.import_fill, busy)
            self.stats["steps"] += 1
            # the executor's wall time vs the busiest rank's own: the difference is the group's per-step cost
            self.stats["step_seconds"] += time.perf_counter() - start
            self.stats["worker_busy_seconds"] += busy / 1e3
            events = []
            for sch, plan, res in zip(self.schedulers, plans, results):
                self._count_drafts(plan, res)
                for rid, drafts in res.drafts.items():       # a waiting guide's drafts stop before its wait ends
                    if drafts and (guide := self._guides.get(rid)) is not None:
                        res.drafts[rid] = drafts[:guide.free_drafts(res.sampled.get(rid, ()), drafts)]
                for rid, (first, lps) in res.prompt_logprobs.items():
                    if (st := self._streams.get(rid)) is not None:
                        st.add_prompt_logprobs(first, lps)
                # (before ``_close`` forgets them; a request aborted while its step ran is gone already)
                exports = {rid: self._exports[rid] for rid in res.kv if rid in self._exports}
                events += [out for ev in sch.update(plan, res.sampled, res.drafts) if ev.req_id in self._streams
                           for out in self._emit(ev, res)]
                for out in events if exports else ():
                    if out.finished and out.req_id in exports and not out.error:
                        tokens, start = exports[out.req_id]
                        skip = start % self.config.block_size     # (the rows came from ``start``'s block on)
                        out.kv = KVBundle(tokens, self.kv_layout, self.speculative_tokens > 0,
                                          tuple(r[skip:] for r in res.kv[out.req_id]), start)
                        self.stats["kv_exported_tokens"] += out.kv.num_tokens - start
            return events

    def _rebalance(self) -> None:
        """Before planning, waiting requests move to a rank that can run them now: a rank with running slots beyond its
        own queue takes the oldest requests that wait for a slot elsewhere (placed there by KV load, or while every
        rank was full and a slot freed elsewhere first), the longest queue's first; and a request stalled at the head
        of its rank's queue for KV blocks (preempted there, say) moves to the rank with the most spare blocks, if it
        has a free slot and room for the request's tokens. A moved request its worker has seen goes with its tokens
        so far: that worker forgets it, the new one gets prompt and output (as preemption, it is recomputed)."""
        if len(self.schedulers) == 1:
            return
        for rank, taker in enumerate(self.schedulers):
            while taker.free_seats > 0 and any(g.free_seats < 0 for g in self.schedulers):
                if not self._move(min(range(len(self.schedulers)), key=lambda r: self.schedulers[r].free_seats), rank):
                    break
        for rank, sch in enumerate(self.schedulers):
            while (req := sch.stalled()) is not None:
                taker = max((r for r in range(len(self.schedulers)) if r != rank and self.schedulers[r].free_seats > 0),
                            key=lambda r: self.schedulers[r].spare_blocks, default=None)
                if taker is None or self.schedulers[taker].spare_blocks < sch.pool.blocks_needed(req.num_tokens + 1) \
                        or not self._move(rank, taker):
                    break

    def _move(self, giver: int, taker: int) -> bool:
        """The oldest request waiting on rank ``giver`` waits on ``taker`` from now on (False: it stays, its KV on its
        way to ``giver``'s blocks)."""
        req = self.schedulers[giver].release_waiting()
        if req is None:
            return False
        self.schedulers[taker].adopt(req)
        self.stats["moves"] += 1
        self._rank_of[req.req_id] = taker
        if req.req_id not in self._unsent:       # its worker has seen it (it was preempted there)
            self._forget[giver].append(req.req_id)
            self._unsent[req.req_id] = NewRequest(req.req_id, tuple(req.prompt_ids), req.params,
                                                  tuple(req.output_ids))
        return True

    def _count_drafts(self, plan: StepPlan, res: StepResult) -> None:
        for s in plan.seqs:
            if s.num_drafts and s.req_id in res.sampled:
                accepted = len(res.sampled[s.req_id]) - 1
                self.stats["draft_rounds"] += 1
                self.stats["drafts_proposed"] += s.num_drafts
                self.stats["drafts_accepted"] += accepted
                for i in range(accepted):
                    self.accepted_at[i] += 1

    def spec_metrics(self) -> dict:
        """Mean accepted length (tokens per verify round) and per-position acceptance rates."""
        rounds = self.stats["draft_rounds"]
        return {"rounds": rounds, "proposed": self.stats["drafts_proposed"], "accepted": self.stats["drafts_accepted"],
                "mean_accepted_length": (self.stats["drafts_accepted"] + rounds) / rounds if rounds else 0.0,
                "acceptance_by_position": [a / rounds if rounds else 0.0 for a in self.accepted_at[:-1]]}

    def _worker_steps(self, plans: list[StepPlan], imports: list[Take],
                      num_drafts: int = 0) -> list[WorkerStep] | None:
        self.stats["preemptions"] += sum(len(p.preempted) for p in plans)
        forget, self._forget = self._forget, [[] for _ in self.schedulers]
        for r, i in enumerate(imports):
            if i.writes and plans[r].is_empty:    # an import may take blocks whose save to host waits: saves go first
                plans[r] = replace(plans[r], kv_saves=self.schedulers[r].pool.drain()[0])
        if all(p.is_empty for p in plans) and not any(forget) and not any(i.writes or i.land for i in imports):
            return None
        rows = {r: p.num_tokens for r, p in enumerate(plans)}
        num_active = sum(s.num_running for s in self.schedulers)
        shape = plan_step_shapes(len(plans), rows, num_active, self.span)
        self.stats["span_steps"] += shape.is_span
        chunk_rows = self._chunk_rows if self.graph_prefill and num_drafts == 0 else 0
        graph = graph_key(shape, plans, chunk_rows) if self.graphs and not self.prompts_only else None
        self.stats["graph_steps"] += graph is not None
        if num_drafts and graph is None and not self._may_draft(plans):
            num_drafts = 0      # no request can take a token after this step's: no drafts to throw away unverified
        # the MTP work of a graph step runs on graphs too: a greedy drafting request's drafts are picked inside one,
        # a drawn one's between them (its draft distributions are kept); the same mode goes to every rank
        greedy = num_drafts == 0 or all(self.schedulers[self._rank_of[s.req_id]].get(s.req_id).params.is_greedy
                                        for p in plans for s in p.seqs)
        draft_graph = None if graph is None else "greedy" if greedy else "drawn"
        use_ahead = self._launched is not None and _advanced(self._launched, graph, plans)
        self.stats["ahead_steps"] += use_ahead        # steps the workers had launched ahead (look-ahead)
        lookahead = self._may_look_ahead(graph, plans)
        return [WorkerStep(p.step_id, p.seqs, tuple(self._unsent.pop(s.req_id) for s in p.seqs
                                                    if s.req_id in self._unsent), tuple(f), shape, num_drafts, graph,
                           draft_graph, lookahead, use_ahead, masks=self._masks(p), kv_saves=p.kv_saves,
                           kv_loads=p.kv_loads, kv_exports=self._exporting(p) if self._exports else (),
                           kv_imports=i.writes, kv_land=i.land)
                for p, f, i in zip(plans, forget, imports)]

    def _may_draft(self, plans: list[StepPlan]) -> bool:
        """Whether a request this step samples for can take drafts at its next step (a token past this step's before
        its ``max_tokens``; never on a prompts-only engine). Graph steps draft regardless: their drafting graphs are
        captured per draft count, and the last round's few passes cost less than a capture."""
        if self.prompts_only:
            return False
        live = (self.schedulers[self._rank_of[s.req_id]].get(s.req_id) for p in plans for s in p.seqs if s.sample)
        return any(r is not None and r.params.max_tokens - len(r.output_ids) > 2 for r in live)

    def _exporting(self, plan: StepPlan) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The requests of ``plan`` whose prompt this step completes and whose KV goes back (``export_kv``)."""
        bs = self.config.block_size
        return tuple((s.req_id, s.block_ids[start // bs:(len(tokens) - 1) // bs])
                     for s in plan.seqs if s.sample and s.num_generated == 0 and s.req_id in self._exports
                     for tokens, start in (self._exports[s.req_id],))

    def _masks(self, plan: StepPlan) -> StepMasks | None:
        """The allowed-token bitmasks of each guided request of ``plan`` that samples — its row's, or its verify rows'
        (``Guide.masks`` along its drafts) — built when the runner samples (after launching the forward) or as the
        step is pickled for another process (``cluster/guided.py``); None: no guided row."""
        guides = [(s.req_id, g, s.token_ids[len(s.token_ids) - s.num_drafts:]) for s in plan.seqs
                  if s.sample and (g := self._guides.get(s.req_id)) and g.masked]
        if not guides:
            return None
        return StepMasks(lambda: ((rid, g.masks(drafts)) for rid, g, drafts in guides))

    def _may_look_ahead(self, graph, plans: list[StepPlan]) -> bool:
        """Whether the workers may launch this graph step's successor ahead: every row samples one token on the
        device (greedy or drawn, with logprobs, penalties or not; no speculation), and the next step will be these
        requests' decode step again as far as the engine can tell — nothing waits to be prefilled, every row's next
        position is in its blocks (the schedulers hold one position of slack), and some request goes on. Requests
        that end meanwhile (by length, a stop token or string, an abort) leave the next step without their rows: it
        is still the launched one (``_advanced``). A request waiting for its imported KV waits on unless its last rows
        land with this step (then it starts with the next: ``Imports.landing``)."""
        if not (self.lookahead and graph is not None and self.speculative_tokens == 0) \
                or any(not r.importing for sch in self.schedulers for r in sch.waiting()) \
                or any(last for i in self._imports for _, _, last in i.landing):
            return False
        bs, goes_on = self.config.block_size, False
        for p in plans:
            for s in p.seqs:
                params = self.schedulers[self._rank_of[s.req_id]].get(s.req_id).params
                if not s.sample or len(s.token_ids) != 1 or s.end_pos + 1 > len(s.block_ids) * bs:
                    return False        # a prompt chunk (one token of it too: it samples nothing), a new block
                goes_on |= s.num_generated + 1 < params.max_tokens and s.end_pos + 1 < self.config.max_model_len
        return goes_on

    def _fail_all(self, msg: str) -> list[TokenEvent]:
        """The group is lost: every live request fails now — its client hears at once, not after the rebuild (a
        model's load: minutes), which the next step does (session 56's review)."""
        events = self._fail_live(msg, restart=True)
        self.rebuild_at = time.monotonic()
        return events

    def _recover(self) -> list[TokenEvent]:
        """Rebuild the worker group. A rebuild that fails fails the requests admitted meanwhile, refuses new ones
        (``down``: the replica's health check fails then) and is tried again 1, 2, 4 ... 60 s later."""
        try:
            self.executor.recover()
        except Exception as e:  # noqa: BLE001 — a GroupFailure, or whatever the setup raised
            self.down = f"{type(e).__name__}: {e}"
            self._failed_rebuilds += 1
            self.rebuild_at = time.monotonic() + min(60.0, 2.0 ** (self._failed_rebuilds - 1))
            print(f"glmserve: rebuilding the worker group failed ({self.down}); trying again in "
                  f"{self.rebuild_at - time.monotonic():.0f} s", flush=True)
            return self._fail_live(f"worker group rebuild failed: {self.down}")
        self.rebuild_at = self.down = None
        self._failed_rebuilds = 0
        return []

    def _fail_live(self, msg: str, restart: bool = False) -> list[TokenEvent]:
        """Fail the live requests; with ``restart``, those waiting without output (or KV on its way) start over on the
        rebuilt group instead — their clients never hear of the failure (session 56's fault review)."""
        with self._lock:
            again = [[r.req_id for r in sch.waiting() if restart and not r.output_ids and not r.importing]
                     for sch in self.schedulers]
            events = [self._end(ev) for sch, kept in zip(self.schedulers, again)
                      for ev in sch.fail([i for i in sch.live_ids() if i not in kept], msg)]
            for sch, kept in zip(self.schedulers, again):
                sch.restart(kept)
                sch.clear_prefix_cache()         # the rebuilt workers' KV holds no prefix
            self._forget = [[] for _ in self.schedulers]     # the rebuilt workers start empty
            for imports, sch in zip(self._imports, self.schedulers):
                imports.drop(sch)
            self._unsent = {i: NewRequest(i, tuple(req.prompt_ids), req.params) for sch, kept in
                            zip(self.schedulers, again) for i in kept if (req := sch.get(i)) is not None}
        return events

    def _emit(self, ev: RequestEvent, result: StepResult) -> list[TokenEvent]:
        """The request's new tokens as events: one, or one more at each special token among them (a speculative step
        commits several). Token by token, as a plain decode: a stop string ends the request at the token that
        completes it, and the tokens after it, which a plain decode would not have sampled, are dropped."""
        st, ids, lps = self._streams[ev.req_id], ev.new_token_ids, result.logprobs.get(ev.req_id, [])
        events: list[TokenEvent] = []
        for i in range(max(len(ids), 1)):
            tok, last = ids[i:i + 1], ev.finished and i >= len(ids) - 1
            if tok and tok[0] in st.breaks and (held := st.stops.flush()):
                # the front end gives the text on either side of this marker to different fields: what a stop string's
                # possible start held back goes out before it (with the next text it went to the wrong side)
                if not events:
                    events.append(st.event(ev.req_id))
                events[-1].text += held
            by_grammar = False                  # a guide chose this token (or held the stops): no stop string cuts it
            if (guide := self._guides.get(ev.req_id)) is not None:
                by_grammar = guide.masked
                guide.accept(tok)
                if guide.done:                  # a forced prefix that is out: the request is free again
                    del self._guides[ev.req_id]
                elif not by_grammar and guide.masked:   # its wait ended or its budget is spent: a step launched
                    self._launched = None               # ahead sampled the next token unmasked
            stop_token = last and ev.finish_reason == FinishReason.STOP and bool(tok)    # (EOS or a stop token id)
            text, stopped = st.text(tok, last, by_grammar, stop_token)
            st.num_output += len(tok)
            self.stats["generated_tokens"] += len(tok)      # (a draft run's tokens past a stop string: dropped)
            if not events or tok[0] in self.special_ids:
                events.append(st.event(ev.req_id))
            out = events[-1]
            out.token_ids += tok
            out.text += text
            out.logprobs += lps[i:i + 1]
            out.num_output_tokens = st.num_output
            if stopped or last:  # a stop string met on the last allowed token still reports "stop" (OpenAI)
                if not ev.finished:
                    self.schedulers[self._rank_of[ev.req_id]].finish(ev.req_id, FinishReason.STOP)
                out.finished, out.finish_reason = True, FinishReason.STOP if stopped else ev.finish_reason
                out.stop_str = st.stops.matched if stopped else tok[0] if stop_token and tok[0] in st.stop_ids else None
                self._close(ev.req_id)
                break
        if st.prompt_lps is not None and events:        # complete: the prompt's last chunk sampled the first token
            events[0].prompt_logprobs, st.prompt_lps = st.prompt_lps, None
        return events

    def _end(self, ev: RequestEvent) -> TokenEvent:
        st = self._streams.get(ev.req_id)
        out = st.event(ev.req_id, True, ev.finish_reason, ev.error) if st else \
            TokenEvent(ev.req_id, [], "", True, ev.finish_reason, ev.error)
        self._close(ev.req_id)
        return out

    def _close(self, req_id: str) -> None:
        self._streams.pop(req_id, None)
        self._guides.pop(req_id, None)
        self._exports.pop(req_id, None)
        rank = self._rank_of.pop(req_id)
        if self._unsent.pop(req_id, None) is None:
            self._forget[rank].append(req_id)
