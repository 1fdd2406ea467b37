"""The step scheduler: admission, FCFS (or priority) chunked prefill, decode, preemption by recompute.

Pure Python over plain data. One step is `plan = schedule()`, the workers run the plan, then
`update(plan, sampled)` appends tokens, finishes requests and frees their blocks.

Requests are ordered by rank, ``(priority, arrival)`` (`Request.rank`; under FCFS every priority is 0, so arrival):
the waiting queue and the running list are kept sorted by it, prompt chunks go in its order without overtaking, and
preemption victims are the worst-ranked running requests. Under FCFS every running request ranks before every waiting
one (a new arrival ranks last, a victim before the queue); under the priority policy a request can arrive that outranks
running ones, and takes the place of the worst of them where it could not start beside them (`_start_or_preempt`), its
prompt chunk before their rows.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, replace
from typing import Sequence

from scheduler.block_pool import BlockPool, root
from scheduler.request import FinishReason, Request, RequestStatus, SamplingParams

GROWTH_TOKENS = 256     # placement's guess of the tokens a live request still adds (its max_tokens left, at most)


@dataclass(frozen=True)
class SchedulerConfig:
    """Static scheduler limits. The block count is a runtime fact measured by the workers."""

    num_blocks: int
    block_size: int = 16
    max_model_len: int = 4096  # prompt + max_tokens must fit
    vocab_size: int = 1024
    eos_token_ids: tuple[int, ...] = ()
    max_num_seqs: int = 64  # requests running (holding KV) at once
    max_num_batched_tokens: int = 256  # per-step token budget (chunked prefill)
    max_waiting: int = 256  # queue limit: beyond it add_request refuses (back-pressure)
    max_waiting_tokens: int = 0  # the engine's bound on queued prompt tokens still to compute (0: none)
    prefix_caching: bool = False  # a prompt's leading full blocks reuse the KV of any earlier request with those tokens
    host_blocks: int = 0  # with prefix caching: host-memory blocks that keep cached prefixes evicted from the device
    policy: str = "fcfs"  # fcfs: by arrival | priority: by SamplingParams.priority (lower first), then arrival

    def __post_init__(self) -> None:
        object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))
        for name in ("num_blocks", "block_size", "max_model_len", "vocab_size", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}) so every running request can decode each step"
            )
        for name in ("max_waiting", "max_waiting_tokens", "host_blocks"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if 0 < self.max_waiting_tokens < self.max_model_len:
            raise ValueError(f"max_waiting_tokens ({self.max_waiting_tokens}) must be 0 or at least max_model_len "
                             f"({self.max_model_len}): a longer prompt could never be admitted")
        for tok in self.eos_token_ids:
            if not 0 <= tok < self.vocab_size:
                raise ValueError(f"eos_token_ids must be in [0, vocab_size={self.vocab_size}), got {tok}")
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {self.policy!r}")


class AdmissionError(ValueError):
    """A request refused at admission. `reason` is a short code, `field` the offending input."""

    def __init__(self, reason: str, field: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.field = field

    def __reduce__(self):  # crosses process boundaries (Ray) with its reason and field intact
        return (type(self), (self.reason, self.field, str(self)))


@dataclass(frozen=True)
class ScheduledSeq:
    """One request's slice of a step: a prefill chunk, or the last sampled token for decode."""

    req_id: str
    token_ids: tuple[int, ...]  # tokens fed this step
    start_pos: int  # absolute position of token_ids[0] (== num_computed_tokens before the step)
    block_ids: tuple[int, ...]  # block table covering positions [0, start_pos + len(token_ids))
    sample: bool  # True iff the chunk reaches the end of all_ids: a new token is sampled
    num_generated: int  # len(output_ids) before this step (the sampler seeds per (seed, num_generated))
    num_drafts: int = 0  # the last num_drafts token_ids are speculative (verified this step)

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True)
class StepPlan:
    """What the workers run this step: its rows in rank order (FCFS: the decodes, then prefill chunks by arrival)."""

    step_id: int
    seqs: tuple[ScheduledSeq, ...]
    preempted: tuple[str, ...]  # req_ids preempted while planning (blocks freed; will recompute)
    kv_saves: tuple[tuple[int, int], ...] = ()  # (block, host slot): cached blocks copied to host memory first
    kv_loads: tuple[tuple[int, int], ...] = ()  # (host slot, block): cached prefixes copied back, before the forward

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


@dataclass(frozen=True)
class RequestEvent:
    """What one request produced in a step (or how it ended); the engine streams these out."""

    req_id: str
    new_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    error: str | None = None


class Scheduler:
    """FCFS (or priority) scheduler with chunked prefill and preemption by recompute over one `BlockPool`.

    ``slack``: KV positions a decoding request holds beyond its step where free blocks allow (never by preemption,
    and not while a prompt waits): the engine's look-ahead launches the next decode step before this one's plan,
    and that step writes one position further (1 with look-ahead, else 0)."""

    def __init__(self, config: SchedulerConfig, slack: int = 0) -> None:
        self.config = config
        self.slack = slack
        self.pool = BlockPool(config.num_blocks, config.block_size, config.host_blocks if config.prefix_caching else 0)
        self._waiting: deque[Request] = deque()  # sorted by rank
        self._running: list[Request] = []  # sorted by rank; PREFILLING or DECODING, hold blocks
        self._live: dict[str, Request] = {}  # waiting + running
        self._next_arrival = 0
        self._next_step = 0
        self.prompt_started = 0  # prompt tokens of requests at their first prefill (the stats line's prompt rate)
        self.prefix_queried = 0  # prompt tokens looked up in the prefix cache at a request's first prefill
        self.prefix_hits = 0     # of which found cached
        self.host_loads = 0      # cached blocks copied back from host memory (the prefix cache's second tier)

    # ---- queries -------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def free_seats(self) -> int:
        """Running slots not taken by running requests nor promised to waiting ones (negative: requests wait for a
        slot)."""
        return self.config.max_num_seqs - len(self._running) - len(self._waiting)

    @property
    def kv_usage(self) -> float:
        return self.pool.num_used / self.pool.num_blocks

    def has_unfinished(self) -> bool:
        return bool(self._live)

    def waiting(self) -> list[Request]:
        """The waiting requests, first to start first."""
        return list(self._waiting)

    def live_ids(self) -> list[str]:
        """Every waiting or running request."""
        return list(self._live)

    @property
    def kv_load(self) -> int:
        """Blocks held plus the blocks the waiting prompts will add (less those they will find cached): the placement
        signal."""
        return self.pool.num_used + sum(max(0, self.pool.blocks_needed(r.num_tokens) - r.hit_blocks)
                                        for r in self._waiting)

    @property
    def placement_load(self) -> int:
        """``kv_load`` and the blocks the live requests are expected to grow by — each its tokens still allowed, at most
        ``GROWTH_TOKENS`` — where a new request goes (a rank of long answers fills as its outputs grow: one long prompt
        must not hide it)."""
        grow = sum(min(r.params.max_tokens - len(r.output_ids), GROWTH_TOKENS) for r in self._live.values())
        return self.kv_load + max(0, grow) // self.pool.block_size

    @property
    def queued_tokens(self) -> int:
        """Prompt tokens the requests without a first token yet still have to compute here: the waiting ones' beyond
        the blocks they found cached, the prefilling ones' rest (a preempted request's outputs count: recomputed)."""
        bs = self.pool.block_size
        return sum(max(0, r.num_tokens - r.hit_blocks * bs) for r in self._waiting) + sum(
            r.num_tokens - r.num_computed_tokens for r in self._running if r.status is RequestStatus.PREFILLING)

    def cached_blocks(self, ids: list[int], salt: str | None = None) -> int:
        """How many of ``ids``'s leading blocks this rank holds cached under ``salt`` (0 without prefix caching)."""
        return self.cached_and_held(ids, salt)[0]

    def cached_and_held(self, ids: list[int], salt: str | None = None) -> tuple[int, int]:
        """(``cached_blocks``, how many of them a live request holds now)."""
        if not self.config.prefix_caching:
            return 0, 0
        nodes = self.pool.match(ids, root(salt))
        return len(nodes), len(nodes) - self.pool.cost(nodes)

    def _hits(self, req: Request) -> list:
        """The cached blocks of ``req``'s prefix that it may take: none without prefix caching, or for a request that
        asks for its prompt's logprobs (they come from the logits of its prompt's rows, which a cached block skips)."""
        if not self.config.prefix_caching or req.params.prompt_logprobs is not None:
            return []
        return self.pool.match(req.all_ids, root(req.params.cache_salt))

    def _keep_prefix(self, req: Request) -> None:
        """A request that begins to wait here (arrived, moved here, preempted): its cached prefix, counted for its KV
        load, is kept (``BlockPool.keep``: evicted after other cached blocks, in its order) until it starts."""
        assert not req.kept, req.req_id
        req.kept = self._hits(req)
        self.pool.keep(req.kept, req.rank)
        req.hit_blocks = len(req.kept)

    def imported(self, req: Request, blocks: Sequence[int]) -> None:
        """Blocks of waiting ``req``'s prompt written from another replica's KV (``cluster/disagg.py``'s ``Imports``,
        settled): counted as cached, and kept past its prefix."""
        if req.status is not RequestStatus.WAITING:
            return
        nodes = [self.pool.node(b) for b in blocks if self.pool.is_cached(b)]
        self.pool.keep(nodes, req.rank, len(req.kept))
        req.kept += nodes
        req.hit_blocks += len(nodes)

    def restart(self, req_ids: Sequence[str]) -> None:
        """Waiting requests that have had no output start over on a rebuilt worker group, which holds nothing of them:
        the blocks they held freed, nothing computed (their streams never knew of the failure)."""
        for req in map(self._live.__getitem__, req_ids):
            assert req.status is RequestStatus.WAITING and not req.output_ids, req.req_id
            self._unkeep(req)
            self.pool.free(req.block_ids)
            req.block_ids, req.cached_nodes, req.num_computed_tokens = [], [], 0

    def _unkeep(self, req: Request) -> None:
        self.pool.unkeep(req.kept, req.rank)
        req.kept = []

    def get(self, req_id: str) -> Request | None:
        """The live (waiting or running) request, or None once it has ended."""
        return self._live.get(req_id)

    # ---- admission -----------------------------------------------------------------------

    def add_request(self, req_id: str, prompt_ids: list[int], params: SamplingParams) -> Request:
        """Queue a request, or raise AdmissionError: refusals happen here, never mid-batch."""
        self.check_admission(req_id, prompt_ids, params)
        return self._enqueue(Request(req_id, list(prompt_ids), params, arrival=-1))

    def _enqueue(self, req: Request) -> Request:
        """``req`` waits here, the youngest of its priority (its arrival numbered in this scheduler's order)."""
        req.arrival = self._next_arrival
        self._next_arrival += 1
        self._keep_prefix(req)
        _insort(self._waiting, req)
        self._live[req.req_id] = req
        return req

    def check_admission(self, req_id: str, prompt_ids: list[int], params: SamplingParams, leaving: int = 0,
                        checked: bool = False) -> None:
        """Raise the AdmissionError ``add_request`` would raise for this request once ``leaving`` waiting requests have
        left, if any: one it can never run with first (``check_request``'s, unless ``checked``), then a full queue."""
        if req_id in self._live:
            raise AdmissionError("duplicate", "req_id", f"req_id {req_id!r} is already in flight")
        if not checked:
            self.check_request(prompt_ids, params)
        if len(self._waiting) - leaving >= self.config.max_waiting:
            raise AdmissionError(
                "queue_full", "queue", f"waiting queue is full ({self.config.max_waiting} requests); retry later"
            )

    def check_request(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise the AdmissionError of a request that can never run, however empty the queue (a 400, never a 429 that a
        client would retry)."""
        cfg = self.config
        if params.priority and cfg.policy != "priority":
            raise AdmissionError("priority", "priority", f"priority {params.priority} needs the priority scheduling "
                                 "policy (scheduling_policy: priority); under fcfs every request's priority is 0")
        if not prompt_ids:
            raise AdmissionError("empty_prompt", "prompt", "prompt must hold at least one token")
        bad = next((t for t in prompt_ids if not 0 <= t < cfg.vocab_size), None)
        if bad is not None:
            raise AdmissionError(
                "bad_token", "prompt", f"prompt token id {bad} is outside [0, vocab_size={cfg.vocab_size})"
            )
        for name, ids in (("logit_bias", [t for t, _ in params.logit_bias]), ("stop_token_ids", params.stop_token_ids),
                          ("allowed_token_ids", params.allowed_token_ids)):
            bad = next((t for t in ids if t >= cfg.vocab_size), None)
            if bad is not None:
                raise AdmissionError("bad_token", name, f"{name} id {bad} is outside [0, vocab_size={cfg.vocab_size})")
        total_len = len(prompt_ids) + params.max_tokens
        if total_len > cfg.max_model_len:
            raise AdmissionError(
                "too_long",
                "max_tokens",
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {total_len} "
                f"exceeds max_model_len={cfg.max_model_len}; shorten the prompt or lower max_tokens",
            )
        # The last sampled token is never fed back, so its KV is never stored.
        num_blocks = self.pool.blocks_needed(total_len - 1)
        if num_blocks > self.pool.num_blocks:
            raise AdmissionError(
                "kv_capacity",
                "max_tokens",
                f"prompt + max_tokens needs {num_blocks} KV blocks but the pool has only "
                f"{self.pool.num_blocks}; lower max_tokens or shorten the prompt",
            )

    @property
    def spare_blocks(self) -> int:
        """Blocks neither held nor needed by the waiting prompts, less one of growth for each running request."""
        return self.pool.num_blocks - self.kv_load - len(self._running)

    def stalled(self) -> Request | None:
        """The oldest waiting request when the free blocks cannot hold its tokens and the next one (a preempted request,
        or a prompt behind running requests that grew), counting the blocks it would take cached: here it waits for
        others to end; None otherwise."""
        head = self._waiting[0] if self._waiting else None
        if head is None:
            return None
        hits = self._hits(head)
        need = self.pool.blocks_needed(head.num_tokens + 1) - len(hits) + self.pool.cost(hits)
        return head if need > self.pool.num_free else None

    def release_waiting(self) -> Request | None:
        """Hand over the first waiting request (it holds no KV: never started, or preempted) for another rank to
        ``adopt``; None if none waits."""
        head = self._waiting[0] if self._waiting else None
        req = self._waiting.popleft() if head is not None and not (head.importing or head.imported) else None
        if req is not None:         # (one whose KV is on its way to this rank's blocks, or just written there, stays)
            del self._live[req.req_id]
            self._unkeep(req)
        return req

    def adopt(self, req: Request) -> None:
        """Take a request another rank released: it waits here, the youngest of its priority (arrival renumbered)."""
        assert req.req_id not in self._live and req.status is RequestStatus.WAITING and not req.block_ids
        self._enqueue(req)

    # ---- planning ------------------------------------------------------------------------

    def schedule(self, max_drafts: int = 0) -> StepPlan:
        """Plan one step: the running and the waiting requests in rank order (FCFS: the decodes, then the one partial
        prefill, then the waiting requests), under the token budget.

        A decoding request with proposed drafts feeds up to ``max_drafts`` of them after its last token
        (the caller passes 0 while drafts cannot ride for free, e.g. more than one request is active)."""
        preempted: list[str] = []
        seqs = self._schedule_in_rank_order(self.config.max_num_batched_tokens, preempted, max_drafts)
        if self.slack and all(r.importing for r in self._waiting):    # (an import holds its blocks: it takes none)
            seqs = [self._with_slack(s) for s in seqs]
        copies = self.pool.drain() if seqs else ((), ())      # an empty plan may not run: they wait for one that does
        self.host_loads += len(copies[1])
        plan = StepPlan(self._next_step, tuple(seqs), tuple(preempted), *copies)
        self._next_step += 1
        return plan

    def _schedule_in_rank_order(self, budget: int, preempted: list[str], max_drafts: int) -> list[ScheduledSeq]:
        """The running and the waiting requests merged in rank order. A decoding one feeds its next token (and drafts)
        until one finds no budget; a prefilling one its next prompt chunk — one that cannot go stops everything behind
        it; a waiting one starts while slots, blocks and budget allow (``_start_or_preempt``) — one that cannot stops
        the waiting ones behind it. Under FCFS every running request ranks before every waiting one (a victim of
        preemption was the worst running) and the one partial prefill is the youngest (a prompt starts only once the
        one before it is whole): the decodes, the partial prefill, then the waiting requests."""
        seqs: list[ScheduledSeq] = []
        decoding = starting = True      # decodes may still go; waiting requests may still start
        i = 0
        while i < len(self._running) or (starting and self._waiting):
            head = self._waiting[0] if starting and self._waiting else None
            if head is not None and (i == len(self._running) or head.rank < self._running[i].rank):
                seq = self._start_or_preempt(head, budget, preempted)
                if seq is None:
                    starting = False
                    continue
                i += 1                  # it joined the running list at i: it ranks after those before
            elif self._running[i].status is RequestStatus.PREFILLING:
                seq = self._prefill_or_preempt(self._running[i], budget, preempted)
                if seq is None:
                    return seqs
                i += 1
            elif not decoding:
                i += 1
                continue
            else:
                req = self._running[i]
                # Normally 1 token; more if the caller accepted several tokens without feeding them.
                num_new = req.num_tokens - req.num_computed_tokens
                drafts = self._usable_drafts(req, num_new, budget, max_drafts)
                if num_new + len(drafts) > budget:
                    decoding = False
                    continue
                if not self._reserve_or_preempt(req, num_new, preempted):
                    continue    # req itself was the worst-ranked and got preempted: the running list ends at i
                if req.status is not RequestStatus.DECODING:
                    continue    # preempted while reserving for a younger one
                seq = self._make_seq(req, num_new, self._fit_drafts(req, num_new, drafts))
                i += 1
            seqs.append(seq)
            budget -= len(seq.token_ids)
        return seqs

    def _start_or_preempt(self, req: Request, budget: int, preempted: list[str]) -> ScheduledSeq | None:
        """Start waiting ``req``'s prefill if it has a running slot and blocks for its first chunk; else — where the
        running requests ranked after it (priority: it arrived later and outranks them) hold enough to give it both
        — they give theirs up, worst first. None: it waits."""
        if budget <= 0 or req.importing or self._waits_for_a_prefill(req):
            return None     # (a prefill's blocks, an import's: those behind would have waited for its chunk anyway)
        room = self._room_below(req, budget)
        if len(self._running) >= self.config.max_num_seqs:
            if not room:
                return None
            self._preempt_worst(preempted)
        seq = self._try_prefill(req, budget)
        while seq is None and room and req.rank < self._running[-1].rank:
            self._preempt_worst(preempted)
            seq = self._try_prefill(req, budget)
        if seq is not None:
            self._waiting.remove(req)
            req.status = RequestStatus.PREFILLING
            _insort(self._running, req)
        return seq

    def _prefill_or_preempt(self, req: Request, budget: int, preempted: list[str]) -> ScheduledSeq | None:
        """A prefilling request's next chunk; short of blocks, the running requests ranked after it give theirs up,
        worst first, where they hold enough (never itself: it waits with what it has computed)."""
        seq = self._try_prefill(req, budget)
        if seq is None and budget > 0 and self._room_below(req, budget):
            while seq is None and self._running[-1] is not req:
                self._preempt_worst(preempted)
                seq = self._try_prefill(req, budget)
        return seq

    def _room_below(self, req: Request, budget: int) -> bool:
        """Whether the running requests ranked after ``req`` hold, with the free blocks, what its next chunk needs
        (only the blocks their preemption frees: not those shared with others, a cached prefix)."""
        lower = [r for r in self._running if req.rank < r.rank]
        return bool(lower) and self.pool.can_allocate(
            self._chunk_blocks(req, budget) - self.pool.freed_by([r.block_ids for r in lower]))

    def _preempt_worst(self, preempted: list[str]) -> None:
        victim = self._running[-1]
        self._preempt(victim)
        preempted.append(victim.req_id)

    def _usable_drafts(self, req: Request, num_new: int, budget: int, max_drafts: int) -> list[int]:
        """Drafts that may ride this step: within the budget, max_tokens and the context length."""
        room = min(max_drafts, budget - num_new, req.params.max_tokens - len(req.output_ids) - 1,
                   self.config.max_model_len - req.num_tokens - 1)
        return req.draft_ids[: max(room, 0)]

    def _fit_drafts(self, req: Request, num_new: int, drafts: list[int]) -> list[int]:
        """The drafts that ``req``'s blocks and the free ones hold: drafts are optional, so none is bought by a
        preemption (one preempted the drafting request itself, which then started over from its first token)."""
        while drafts and not self.pool.can_allocate(self._blocks_to_add(req, num_new + len(drafts))):
            drafts = drafts[:-1]
        if drafts:
            req.block_ids += self.pool.allocate(self._blocks_to_add(req, num_new + len(drafts)))
        return drafts

    def _reserve_or_preempt(self, req: Request, num_new: int, preempted: list[str]) -> bool:
        """Grow req's block table for num_new tokens, preempting the worst-ranked running requests (FCFS: the
        youngest)."""
        need = self._blocks_to_add(req, num_new)
        while not self.pool.can_allocate(need):
            victim = self._running[-1]  # the worst-ranked; never one already scheduled (those rank before it)
            self._preempt_worst(preempted)
            if victim is req:
                return False
        req.block_ids += self.pool.allocate(need)
        return True

    def _preempt(self, req: Request) -> None:
        assert self._running[-1] is req
        self._running.pop()
        self.pool.free(req.block_ids)
        req.block_ids = []
        req.cached_nodes = []
        self._keep_prefix(req)      # its own blocks, now idle, mostly: kept
        req.num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        _insort(self._waiting, req)     # FCFS: the front (a running request arrived before every waiting one)

    def _waits_for_a_prefill(self, req: Request) -> bool:
        """Whether a request in prefill here is computing blocks of ``req``'s prefix that are not cached yet, a quarter
        or more of what ``req`` would compute: they enter the cache as that request's chunks end, and ``req`` starts
        then and takes them instead of computing them a second time (prompts that arrive together and share a long
        system prompt). A short shared head (a chat template's) is not worth the wait."""
        prefilling = [r for r in self._running if r.status is RequestStatus.PREFILLING
                      and r.params.cache_salt == req.params.cache_salt]      # (whose blocks it may take)
        if not self.config.prefix_caching or req.block_ids or not prefilling or req.params.prompt_logprobs is not None:
            return False
        bs, ids = self.pool.block_size, req.all_ids
        hits = len(self._hits(req))
        pending = max((common_prefix(ids, r.all_ids) - 1) // bs for r in prefilling) - hits
        return pending > 0 and 4 * pending * bs >= len(ids) - hits * bs

    def _chunk(self, req: Request, budget: int) -> tuple[list[int], int, int, int]:
        """The next prompt chunk of ``req`` at this budget: (the cached blocks a request starting (over) takes, where
        the chunk starts, its tokens, the new blocks it needs)."""
        # a request starting (or starting over) takes the cached blocks of its prefix: its prefill begins after them
        hits = self._hits(req) if not req.block_ids else []
        start = max(req.num_computed_tokens, len(hits) * self.pool.block_size)
        num_new = min(req.num_tokens - start, budget)
        return hits, start, num_new, self.pool.blocks_needed(start + num_new) - len(req.block_ids) - len(hits)

    def _chunk_blocks(self, req: Request, budget: int) -> int:
        """The free blocks the next chunk of ``req`` takes (the cached ones it reuses included)."""
        hits, _, _, need = self._chunk(req, budget)
        return need + self.pool.cost(hits)

    def _try_prefill(self, req: Request, budget: int) -> ScheduledSeq | None:
        if budget <= 0:
            return None
        hits, start, num_new, need = self._chunk(req, budget)
        if num_new <= 0 or not self.pool.can_allocate(need + self.pool.cost(hits)):
            return None
        if not req.block_ids and req.num_preemptions == 0:
            self.prompt_started += len(req.prompt_ids)
        if not req.block_ids and self.config.prefix_caching:
            req.block_ids, req.num_computed_tokens = self.pool.take(hits), start
            self._unkeep(req)
            req.cached_nodes = list(hits)
            if req.num_preemptions == 0:         # the prompt's first prefill: what the usage report counts
                req.num_cached_tokens = start
                imported = min(start, req.imported_tokens)     # (another replica's KV: no hits of this cache's)
                self.prefix_queried += len(req.prompt_ids) - imported
                self.prefix_hits += start - imported
        req.block_ids += self.pool.allocate(need)
        return self._make_seq(req, num_new)

    def _with_slack(self, seq: ScheduledSeq) -> ScheduledSeq:
        """A decode row whose next position opens a block: that block too, if one is free."""
        req = self._live[seq.req_id]
        need = self.pool.blocks_needed(seq.end_pos + self.slack) - len(req.block_ids)
        if req.status is not RequestStatus.DECODING or need <= 0 or not self.pool.can_allocate(need):
            return seq
        req.block_ids += self.pool.allocate(need)
        return replace(seq, block_ids=tuple(req.block_ids))

    def _blocks_to_add(self, req: Request, num_new: int) -> int:
        return self.pool.blocks_needed(req.num_computed_tokens + num_new) - len(req.block_ids)

    def _make_seq(self, req: Request, num_new: int, drafts: list[int] = ()) -> ScheduledSeq:
        start = req.num_computed_tokens
        end = start + num_new
        assert num_new > 0 and end <= req.num_tokens
        assert len(req.block_ids) == self.pool.blocks_needed(end + len(drafts))
        token_ids = tuple(req.ids(start, end)) + tuple(drafts)
        return ScheduledSeq(
            req_id=req.req_id,
            token_ids=token_ids,
            start_pos=start,
            block_ids=tuple(req.block_ids),
            sample=end == req.num_tokens,
            num_generated=len(req.output_ids),
            num_drafts=len(drafts),
        )

    # ---- results -------------------------------------------------------------------------

    def update(self, plan: StepPlan, sampled: dict[str, list[int]],
               drafts: dict[str, list[int]] | None = None) -> list[RequestEvent]:
        """Apply a step's results: advance KV, append sampled tokens, finish and free.

        A seq that verified drafts gets back its accepted drafts plus one more token; the KV of its
        rejected drafts is dropped (num_computed rolls back, surplus blocks are freed). ``drafts`` are the
        new proposals to verify next step. Seqs whose request ended meanwhile (aborted, failed) are skipped.
        """
        events: list[RequestEvent] = []
        for seq in plan.seqs:
            req = self._live.get(seq.req_id)
            if req is None or req.status not in (RequestStatus.PREFILLING, RequestStatus.DECODING):
                continue
            assert req.num_computed_tokens == seq.start_pos, (
                f"{seq.req_id}: plan starts at {seq.start_pos}, cache holds {req.num_computed_tokens}"
            )
            req.num_computed_tokens = seq.end_pos
            req.draft_ids = []
            if not seq.sample:
                self._cache_blocks(req)
                continue
            tokens = sampled.get(seq.req_id)
            assert tokens, f"{seq.req_id} was scheduled to sample but no token came back"
            req.status = RequestStatus.DECODING
            # fed: last token + drafts; cached KV stays valid for the accepted drafts (tokens[:-1])
            accepted = min(len(tokens) - 1, seq.num_drafts)
            req.num_computed_tokens = seq.end_pos - seq.num_drafts + accepted
            new_ids, reason = self._append_tokens(req, tokens)
            self._cache_blocks(req)
            if reason is not None:
                self._end(req, RequestStatus.FINISHED, reason)
            else:
                self._release_surplus(req)
                req.draft_ids = list((drafts or {}).get(seq.req_id, ()))
            events.append(RequestEvent(req.req_id, tuple(new_ids), reason is not None, reason))
        return events

    def _cache_blocks(self, req: Request) -> None:
        """Register the request's full blocks whose KV is complete and whose next token is known (every full block
        before ``num_computed_tokens``: the token at it is in ``all_ids``)."""
        if not self.config.prefix_caching:
            return
        bs, first = self.pool.block_size, len(req.cached_nodes)
        full = min(req.num_computed_tokens, req.num_tokens - 1) // bs
        if full <= first:
            return
        ids = req.ids(first * bs, full * bs + 1)
        node = req.cached_nodes[-1] if req.cached_nodes else root(req.params.cache_salt)
        for i in range(full - first):
            node = self.pool.register(req.block_ids[first + i], node, tuple(ids[i * bs:(i + 1) * bs + 1]))
            req.cached_nodes.append(node)

    def clear_prefix_cache(self) -> None:
        """Forget the cached prefixes (the workers' KV cannot be trusted any more: a failed step or group)."""
        self.pool.clear_cache()
        for req in self._running:
            req.cached_nodes = []
        for req in self._waiting:     # their whole prompts to compute now (KV load, queued tokens)
            req.hit_blocks, req.kept = 0, []

    def _release_surplus(self, req: Request) -> None:
        """Free blocks that only held rejected drafts (the accounting side of the rollback); the slack stays."""
        keep = self.pool.blocks_needed(req.num_computed_tokens + self.slack)
        if len(req.block_ids) > keep:
            self.pool.free(req.block_ids[keep:])
            req.block_ids = req.block_ids[:keep]

    def _append_tokens(self, req: Request, tokens: list[int]) -> tuple[list[int], str | None]:
        """Append tokens up to the first stop token or max_tokens; return them and the finish reason."""
        params = req.params
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(self.config.eos_token_ids)
        if params.single_tool_call:                 # (its close ends the output as a stop id does)
            stop_ids.add(params.tool_call_span[1])
        new_ids: list[int] = []
        for tok in tokens:
            req.output_ids.append(tok)
            new_ids.append(tok)
            if tok in stop_ids:
                return new_ids, FinishReason.STOP
            if len(req.output_ids) >= params.max_tokens:
                return new_ids, FinishReason.LENGTH
        return new_ids, None

    # ---- endings -------------------------------------------------------------------------

    def finish(self, req_id: str, reason: str = FinishReason.STOP) -> RequestEvent | None:
        """End a request from outside (a stop string matched by the detokenizer)."""
        req = self._live.get(req_id)
        if req is None:
            return None
        self._end(req, RequestStatus.FINISHED, reason)
        return RequestEvent(req_id, (), True, reason)

    def abort(self, req_id: str) -> RequestEvent | None:
        """Drop a request and free its blocks at once; None if it is unknown or already ended."""
        req = self._live.get(req_id)
        if req is None:
            return None
        self._end(req, RequestStatus.ABORTED, FinishReason.ABORT)
        return RequestEvent(req_id, (), True, FinishReason.ABORT)

    def fail(self, req_ids: list[str], error: str) -> list[RequestEvent]:
        """Mark requests FAILED (e.g. their worker died) and free their blocks."""
        events = []
        for req_id in req_ids:
            req = self._live.get(req_id)
            if req is None:
                continue
            self._end(req, RequestStatus.FAILED, FinishReason.ERROR, error)
            events.append(RequestEvent(req_id, (), True, FinishReason.ERROR, error))
        return events

    def _end(self, req: Request, status: RequestStatus, reason: str, error: str | None = None) -> None:
        assert status.is_finished
        if req.status is RequestStatus.WAITING:
            self._waiting.remove(req)
        else:
            self._running.remove(req)
        self._unkeep(req)
        self.pool.free(req.block_ids)
        req.block_ids = []
        req.status = status
        req.finish_reason = reason
        req.error = error
        del self._live[req.req_id]


def _rank(req: Request) -> tuple[int, int]:
    return req.rank


def _insort(queue, req: Request) -> None:
    """Put ``req`` into ``queue`` (sorted by rank) after the requests that rank before it or alike."""
    queue.insert(bisect_right(queue, req.rank, key=_rank), req)


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (compared in growing slices: C speed, and a prompt
    that parts early costs a short compare)."""
    n, lo, step = min(len(a), len(b)), 0, 64
    while lo < n:
        hi = min(lo + step, n)
        if a[lo:hi] != b[lo:hi]:
            return next(i for i in range(lo, hi) if a[i] != b[i])
        lo, step = hi, 2 * step
    return n
