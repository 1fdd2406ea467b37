"""Disaggregated prefill: one replica computes a prompt's KV, another decodes with it.

The decode replica a request is routed to holds the prompt's blocks it has cached (``hold_prefix``: a conversation's
earlier turns) and asks a prefill replica for the rest (``Coordinator._prefilled``). The prefill replica runs the prompt
as a request of one token (``prefill_params``) whose engine sends back, from the step that completes the prompt, the KV
rows of its whole blocks before the last token, from the position asked for on (``WorkerStep.kv_exports``): a
``KVBundle``. The decode replica takes the bundle into its prefix cache (``BlockPool.adopt``: each block under its key,
after the blocks it held, as if that replica had computed it; the rows go to its worker with the next steps, at most
``IMPORT_STEP_BYTES`` a step, ``Imports`` / ``WorkerStep.kv_imports``) and then runs the request as any other, from the
step that writes its last block: its prefix is found cached, and it computes only the prompt's tail — at most a block
and the last token — before sampling the first token itself. Whatever the bundle held, the output is the one the
decode replica alone would give (its prefix cache's reuse, tested to equal a computed prompt).

The rows are staged in host memory and wait in a ``KVDepot`` actor beside the prefill replica until the decode replica
takes them (through Ray's object store); nothing crosses GPUs directly (no NIXL / RDMA here). A bundle the decode
replica cannot use — another KV layout (model, dtype, ``kv_cache_dtype``), a prompt that is not its own, no MTP rows
where it drafts — is refused with an error that names the difference (``KVTransferError``); the replica then computes
the prompt past what it holds cached, as it does when a bundle is lost (its prefill replica died).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from itertools import takewhile
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from scheduler.block_pool import BlockPool, root
from scheduler.request import Request, SamplingParams
from scheduler.scheduler import Scheduler

FETCH_TIMEOUT_S = 120.0     # a decode replica's wait for a bundle from the object store before computing the prompt
IMPORT_STEP_BYTES = 64 << 20    # a decode rank's step writes at most this much imported KV (and a block at least):
# on a GPU after the step's work, through pinned memory (a GLM-5.2 prompt at full depth: ~1200 FP8 tokens a step; the
# slice's decode steps waited 4-5 ms a step for them on an H100 host, 11-16 ms from pageable memory: session 53)
IMPORT_PACE = 0.8, 8 << 20      # beside running requests, a step's imports are what its worker's helpers fill in this
# share of a recent step's work (the fill runs beside it: session 53's 64 MB outlasted a 2.6 ms step); this at least


@dataclass(frozen=True)
class KVBundle:
    """A prompt's KV: ``rows[i]`` holds cache tensor i's rows of positions ``start .. len(token_ids) - 2`` (up to a
    whole block of the prefill replica's; ``KVCache.tensors`` order), as bytes (``KVCache.read_blocks``). ``token_ids``:
    the prompt's tokens they cover and the one after (a block's prefix-cache key holds it, and so does the MTP layer's
    KV). ``layout``: ``KVCache.layout`` of the cache they came from; ``mtp``: whether the MTP layer's rows were computed
    (a speculative prefill engine); ``start``: the prefix the decode replica holds cached already (at one of its block
    boundaries), whose rows do not move."""

    token_ids: tuple[int, ...]
    layout: tuple[tuple[int, str], ...]
    mtp: bool
    rows: tuple[np.ndarray, ...]
    start: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) - 1


@dataclass(frozen=True)
class PrefillResult:
    """What a prefill replica answers (``Coordinator.prefill``): the bundle (a ``KVBundle``, or where a ``KVDepot``
    holds one), or why there is none — ``refused``, the admission error to answer the client with; ``error``, a failure
    (the decode replica then computes the prompt itself)."""

    bundle: Any = None
    refused: Exception | None = None
    error: str | None = None


class KVTransferError(ValueError):
    """A bundle this engine cannot take: the message names what differs."""


def prefill_params(params: SamplingParams) -> SamplingParams:
    """A request's prefill on the prefill replica: its prompt and one token (thrown away: the decode replica samples
    the first token itself), under the request's cache salt and priority."""
    return SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, priority=params.priority,
                          cache_salt=params.cache_salt)


def exported_blocks(prompt_len: int, block_size: int) -> int:
    """The whole blocks of a prompt a bundle carries: those before its last token (which the decode replica computes
    to sample from)."""
    return max(0, (prompt_len - 1) // block_size)


def check_bundle(bundle: KVBundle, prompt_ids: Sequence[int], layout: tuple | None, drafts: bool,
                 caching: bool, block_size: int) -> None:
    """Raise ``KVTransferError`` where this engine (its cache ``layout``; ``drafts``: it runs the MTP layer;
    ``caching``: its prefix caching is on; its ``block_size``) cannot take ``bundle`` for this prompt."""
    if layout is None or not caching:
        raise KVTransferError("this engine takes no transferred KV: " + (
            "it was built without its KV layout" if layout is None else "it needs prefix_caching on"))
    if drafts and not bundle.mtp:
        raise KVTransferError("the prefill replica computed no MTP-layer KV, which this replica's drafts read: give "
                              "the prefill replicas speculative_tokens too")
    if bundle.mtp and not drafts:
        raise KVTransferError("the prefill replica sent MTP-layer KV, which this replica keeps no room for (it does "
                              "not draft): give the prefill replicas speculative_tokens 0 too")
    if bundle.layout != layout:
        raise KVTransferError(f"the prefill replica's KV layout {_layout(bundle.layout)} differs from this replica's "
                              f"{_layout(layout)}: give both the same model, dtype and kv_cache_dtype")
    if tuple(prompt_ids[:len(bundle.token_ids)]) != bundle.token_ids or len(bundle.token_ids) > len(prompt_ids):
        raise KVTransferError("the transferred KV is of another prompt")
    if bundle.start % block_size or not 0 <= bundle.start <= bundle.num_tokens:
        raise KVTransferError(f"the transferred KV starts at position {bundle.start}, not at one of this replica's "
                              f"blocks (of {block_size} tokens) within the prompt")
    count = bundle.num_tokens - bundle.start
    if len(bundle.rows) != len(layout) or any(r.shape != (count, w * _itemsize(d)) or r.dtype != np.uint8
                                               for r, (w, d) in zip(bundle.rows, layout)):
        raise KVTransferError("the transferred KV's rows do not match its token count")


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def _layout(layout: tuple) -> str:
    widths = sorted({f"{w}×{d}" for w, d in layout})
    return f"({len(layout)} tensors: {', '.join(widths)})"


def adopt_bundle(pool: BlockPool, prompt_ids: Sequence[int], salt: str | None, bundle: KVBundle,
                 pending: bool = False) -> tuple[tuple[int, ...], tuple[np.ndarray, ...]] | None:
    """Cache the bundle's whole blocks (of ``pool``'s block size: the prefill replica's may differ) that ``pool`` has
    not cached, as many as its free blocks hold; returns (the blocks to write, their rows) for the worker's next
    step, or None when there is nothing to write — or when the prefix the bundle continues (``bundle.start``) is no
    longer cached here: the request then computes its prompt past what is. ``pending``: ``BlockPool.adopt``'s (the
    writes go with later steps, ``Imports``)."""
    bs, count, first = pool.block_size, bundle.num_tokens // pool.block_size, bundle.start // pool.block_size
    nodes = pool.match(prompt_ids[:count * bs + 1], root(salt))
    if len(nodes) < first:
        return None
    # the prompt's blocks cached on the device already are held meanwhile: an adoption must not evict its own prefix
    cached = [b for n in nodes if (b := pool.block(n)) is not None]
    pool.hold(cached)
    # past this an adoption would evict the blocks adopted before it, or those waiting requests keep (theirs first)
    room = pool.num_free - pool.num_kept
    parent, blocks, spans = nodes[first - 1] if first else root(salt), [], []
    for j in range(first, count):
        if len(blocks) == room:
            break
        parent, block = pool.adopt(parent, tuple(prompt_ids[j * bs:(j + 1) * bs + 1]), pending)
        if block is not None:
            blocks.append(block)
            spans.append(j - first)
    pool.free(cached)
    if not blocks:
        return None
    if spans == list(range(spans[0], spans[0] + len(spans))):        # one run of blocks: a view, no copy
        return tuple(blocks), tuple(r[spans[0] * bs:(spans[-1] + 1) * bs] for r in bundle.rows)
    at = np.array([j * bs + i for j in spans for i in range(bs)])
    return tuple(blocks), tuple(r[at] for r in bundle.rows)


class Take(NamedTuple):
    """A rank's imports for one step (``Imports.take``): the writes it sends, and whether the rows the last step sent
    land after its work (``WorkerStep.kv_imports`` / ``kv_land``)."""

    writes: tuple
    land: bool


class Imports:
    """A rank's imports on their way to its blocks, in arrival order: each a request's adopted blocks (pending: no
    match reaches them) and their rows. A step takes whole blocks of them up to ``budget`` bytes (a block at least) —
    beside running requests, where the worker's helpers fill a pinned buffer with them (a GPU), as much as they fill
    while a step works (``IMPORT_PACE``; ``written`` learns both rates), so the decode steps do not wait for the fill;
    the worker sends them to the device after that step's work and into their blocks after the next step's
    (``ImportWriter``: the copy runs beside that step), and once that one has returned they settle (``written``), so
    the plan after it may take them."""

    def __init__(self, budget: int = IMPORT_STEP_BYTES, paced: bool = True) -> None:
        self.budget, self.queue, self.writing, self.landing = budget, deque(), [], []
        self.paced, self.rate, self.windows, self._beside = paced, None, deque(maxlen=8), False  # (bytes a s; ms)

    def __bool__(self) -> bool:
        return bool(self.queue or self.writing or self.landing)

    def add(self, req: Request, blocks: tuple[int, ...], rows: tuple[np.ndarray, ...]) -> None:
        self.queue.append([req, blocks, rows, 0])

    def step_budget(self, beside: bool) -> int:
        """The bytes a step takes: ``budget``, or beside running requests (``beside``) once fills were measured, what
        the helpers fill in ``IMPORT_PACE``'s share of the shortest of the last steps' work (``written``)."""
        if not (self.paced and beside and self.rate and self.windows):
            return self.budget
        share, least = IMPORT_PACE
        return min(self.budget, max(least, int(self.rate * min(self.windows) / 1e3 * share)))

    def take(self, block_size: int, beside: bool = False) -> Take:
        """This step's writes ((blocks, rows) each; their blocks stay pending until ``written`` after the next step)."""
        bs, writes, left = block_size, [], self.step_budget(beside)
        self._beside = beside
        while self.queue:
            item = self.queue[0]
            req, blocks, rows, at = item
            k = min(len(blocks) - at, max(left // (bs * sum(r.shape[1] for r in rows)), 0 if writes else 1))
            if k == 0:
                break
            writes.append((blocks[at:at + k], tuple(r[at * bs:(at + k) * bs] for r in rows)))
            left -= k * bs * sum(r.shape[1] for r in rows)
            item[3] = at = at + k
            self.writing.append((req, blocks[at - k:at], at == len(blocks)))
            if at == len(blocks):
                self.queue.popleft()
        return Take(tuple(writes), bool(self.landing))

    def written(self, sched: Scheduler, fill: tuple[int, float] | None = None, work_ms: float = 0.0) -> list[Request]:
        """After a step: the blocks the step before sent landed — they settle, their requests (if still live: an id may
        be another's now) keep them (``Scheduler.imported``) — and this step's are on their way. Returns the requests
        whose imports ended, no longer ``importing`` and ``imported`` (the next plan finds them on this rank before any
        move). ``fill``: the worker's (bytes, seconds) filling a buffer (``StepResult.import_fill``; one of 1 MiB or
        more counts); ``work_ms``: the step's work (the busiest rank's), counted where requests ran — steps sending
        imports too (their copies run beside the next step's work, on a side stream: session 53's, on the step's
        stream, let the budget grow with itself; counting only quiet steps froze it under a steady flow of imports)."""
        if fill and fill[0] >= 1 << 20:
            rate = fill[0] / max(fill[1], 1e-6)
            self.rate = rate if self.rate is None else (self.rate + rate) / 2
        if work_ms > 0 and self._beside:
            self.windows.append(work_ms)
        landed, self.landing, self.writing = self.landing, self.writing, []
        return self._settle(sched, landed)

    @staticmethod
    def _settle(sched: Scheduler, landed: list) -> list[Request]:
        for req, blocks, _ in landed:
            sched.pool.settle(blocks)
            if sched.get(req.req_id) is req:
                sched.imported(req, blocks)
        ended = [req for req, _, last in landed if last]
        for req in ended:
            req.importing, req.imported = False, True
        return ended

    def drop(self, sched: Scheduler) -> list[Request]:
        """Forget the imports on their way (the workers were rebuilt, or a step failed: the prefix cache was cleared;
        the next step lands nothing): their blocks are released, their requests (returned) no longer wait for them."""
        landed, self.landing, self.writing = [*self.landing, *self.writing], [], []
        reqs = {id(r): r for r in [*(r for r, _, _ in landed), *(item[0] for item in self.queue)]}
        self._settle(sched, landed)
        for _, blocks, _, at in self.queue:
            sched.pool.settle(blocks[at:])
        self.queue.clear()
        for req in reqs.values():
            req.importing = req.imported = False
        return list(reqs.values())


class HeldPrefix:
    """The prefix of a prompt that a decode replica holds cached while a prefill replica computes the rest
    (``hold_prefix``): ``start`` tokens on one rank. Its device blocks are held until ``admitted`` (the engine has the
    request: ``AsyncEngine.generate``'s ``added``), its host copies pinned until ``release`` (the request's first token:
    its first step loaded them; or its end) — so that nothing evicts them before the request takes them. Each once,
    under the engine's lock."""

    def __init__(self, start: int = 0, pool: BlockPool | None = None, blocks: Sequence[int] = (),
                 pinned: Sequence[int] = (), lock: threading.Lock | None = None) -> None:
        self.start, self._pool, self._blocks, self._pinned, self._lock = start, pool, blocks, pinned, lock

    def admitted(self) -> None:
        if self._blocks:
            with self._lock:
                blocks, self._blocks = self._blocks, ()
                self._pool.free(blocks)

    def release(self) -> None:
        self.admitted()
        if self._pinned:
            with self._lock:
                pinned, self._pinned = self._pinned, ()
                self._pool.unpin(pinned)


def hold_prefix(pools: Sequence[BlockPool], prompt_ids: Sequence[int], salt: str | None,
                lock: threading.Lock) -> HeldPrefix:
    """The leading blocks of a prompt that one of ``pools`` (the ranks' with a free seat) holds cached — the prefix a
    decode replica does not ask a prefill replica for — held (``HeldPrefix``): the bundle that comes continues them.
    Their device blocks are held where a quarter of the pool stays free besides (holds while prompts are computed
    elsewhere must not starve the requests that run); else only blocks with a host copy count, which pins hold. The
    caller holds ``lock``."""
    best: tuple | None = None
    for pool in pools:
        run = pool.match(prompt_ids, root(salt))
        blocks = [b for b in map(pool.block, run) if b is not None]
        if pool.num_free - sum(map(pool.is_idle, blocks)) < pool.num_blocks // 4:
            run, blocks = list(takewhile(pool.has_host_copy, run)), []
        if run and (best is None or len(run) > len(best[2])):
            best = pool, blocks, run
    if best is None:
        return HeldPrefix()
    pool, blocks, run = best
    pool.hold(blocks)
    return HeldPrefix(len(run) * pool.block_size, pool, blocks, pool.pin(run), lock)


class KVDepot:
    """A prefill replica's bundles until a decode replica takes them: a Ray actor beside the replica, which owns it (it
    ends with the replica). A bundle taken goes out as the call's result — an object the taker owns, freed once it
    has written the rows (a reference passed along with the request instead would pin the bundle in the object store
    until the whole answer had streamed); one not taken within ``ttl_s`` (its request gone) is dropped. A key
    dropped before its bundle came (the taker gave up while it was computed or on its way) keeps the bundle out."""

    def __init__(self, ttl_s: float = FETCH_TIMEOUT_S) -> None:
        self.ttl_s, self.items, self.dropped, self._lock, self._sweeper = ttl_s, {}, {}, threading.Lock(), None

    def put(self, key: str, bundle: KVBundle) -> None:
        with self._lock:
            self._expire()
            if self.dropped.pop(key, None) is None:
                self.items[key] = (time.monotonic(), bundle)
        if self._sweeper is None:       # (bundles left when no request comes any more go too)
            self._sweeper = threading.Thread(target=self._sweep, name="kv-depot-sweep", daemon=True)
            self._sweeper.start()

    def take(self, key: str) -> KVBundle:
        with self._lock:
            self._expire()
            return self.items.pop(key)[1]          # (a KeyError: expired, or taken)

    def drop(self, key: str) -> None:
        """Forget ``key``'s bundle: its request went away (or its take timed out) before taking it — or before it
        came: then it is not kept when it comes."""
        with self._lock:
            if self.items.pop(key, None) is None:
                self.dropped[key] = time.monotonic()

    def _expire(self) -> None:
        now = time.monotonic()
        self.items = {k: v for k, v in self.items.items() if now - v[0] < self.ttl_s}
        self.dropped = {k: t for k, t in self.dropped.items() if now - t < self.ttl_s}

    def _sweep(self) -> None:
        while True:
            time.sleep(self.ttl_s / 4)
            with self._lock:
                self._expire()


def new_depot():
    """A ``KVDepot`` actor on this replica's node, or None without Ray (a local engine: bundles are passed as they
    are)."""
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    return ray.remote(num_cpus=0)(KVDepot).options(scheduling_strategy=here).remote()


def depot_key(depot) -> tuple | None:
    """Where a bundle will wait in ``depot``: (the depot, a new key) — what a decode replica fetches or drops it by,
    told before the prompt is computed (``Coordinator.prefill``'s first item) — or None without a depot."""
    return None if depot is None else (depot, uuid.uuid4().hex)


async def stage_bundle(depot, bundle: KVBundle, key: str | None = None) -> Any:
    """Leave ``bundle`` in ``depot`` under ``key`` (a new one if None; its copy into the object store off the event
    loop); returns what a decode replica fetches it by: (the depot, the key) — or the bundle itself without a depot."""
    if depot is None:
        return bundle
    key = key or uuid.uuid4().hex
    put = asyncio.ensure_future(asyncio.to_thread(depot.put.remote, key, bundle))
    try:
        await (await asyncio.shield(put))
    except asyncio.CancelledError:      # its request went away while staging: drop it once its put is submitted
        put.add_done_callback(lambda _: drop_bundle((depot, key)))
        raise
    return depot, key


def drop_bundle(staged: Any) -> None:
    """Have the depot forget what ``stage_bundle`` left there, for a request that will not take it (not waited on)."""
    if isinstance(staged, tuple):
        depot, key = staged
        depot.drop.remote(key)


async def fetch_bundle(staged: Any, timeout_s: float = FETCH_TIMEOUT_S) -> KVBundle:
    """The bundle ``stage_bundle`` left (raises where it is lost: its replica died, or it expired)."""
    if isinstance(staged, KVBundle):
        return staged
    depot, key = staged
    try:
        return await asyncio.wait_for(depot.take.remote(key), timeout_s)
    except BaseException:       # timed out, or its request cancelled: never left waiting out the depot's ttl
        drop_bundle(staged)
        raise


# ---- the Serve application's prefill replicas (``cluster/serve.py``'s ``build_app`` argument ``prefill``) -----------
DEPLOYMENT_KEYS = ("num_replicas", "autoscaling_config")
SAME_KEYS = ("model", "load_format", "kv_cache_dtype")    # what the KV depends on (and the dtype, ``_dtype``)


@dataclass(frozen=True)
class PrefillPlan:
    """The prefill replicas of an application: their engine config (the decode replicas', with the overrides), their
    Serve deployment options, and the shortest prompt sent to them (shorter ones the decode replicas compute)."""

    engine: dict
    deployment: dict
    min_prompt_tokens: int


def _dtype(dtype: str, device: str) -> str | None:
    """The dtype ``EngineConfig.resolved_dtype`` gives, where the device says (None: ``auto`` on an ``auto`` device)."""
    return dtype if dtype != "auto" else {"cpu": "float32", "cuda": "bfloat16"}.get(device)


def prefill_plan(decode: dict, spec: Any) -> PrefillPlan:
    """``spec``: ``build_app``'s ``prefill`` — engine config fields overriding the decode replicas' for the prefill
    replicas, ``num_replicas`` / ``autoscaling_config``, ``min_prompt_tokens``. Raises ``ValueError`` naming the
    field (``prefill.<name>``) where the two sides could not exchange KV."""
    from cluster.config import EngineConfig

    if spec is True or spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise ValueError(f"prefill must be a mapping of engine config fields and num_replicas / autoscaling_config / "
                         f"min_prompt_tokens, got {type(spec).__name__}")
    spec = dict(spec)
    deployment = {k: spec.pop(k) for k in DEPLOYMENT_KEYS if k in spec}
    least = spec.pop("min_prompt_tokens", 0)
    if not isinstance(least, int) or isinstance(least, bool) or least < 0:
        raise ValueError(f"prefill.min_prompt_tokens must be an int >= 0, got {least!r}")
    try:
        engine = EngineConfig.from_dict({**decode, **spec})
    except (TypeError, ValueError) as e:
        raise ValueError(f"prefill: {e}") from None
    for key in SAME_KEYS:
        if getattr(engine, key) != decode[key]:
            raise ValueError(f"prefill.{key} ({getattr(engine, key)!r}) must equal the decode replicas' "
                             f"({decode[key]!r}): the KV they exchange must have one layout")
    mine, theirs = _dtype(engine.dtype, engine.device), _dtype(decode["dtype"], decode["device"])
    if mine != theirs:
        raise ValueError(f"prefill.dtype ({engine.dtype!r} on device {engine.device!r}) must come to the decode "
                         f"replicas' ({decode['dtype']!r} on {decode['device']!r}): the KV they exchange must have one "
                         "layout")
    n = deployment.get("num_replicas", 1)
    if n != "auto" and (not isinstance(n, int) or isinstance(n, bool) or n < 1):    # ("auto": Serve's autoscaling)
        raise ValueError(f"prefill.num_replicas must be an int >= 1 or 'auto', got {n!r}")
    if decode["speculative_tokens"] and not engine.speculative_tokens:
        raise ValueError("prefill.speculative_tokens is 0 while the decode replicas draft: their drafts read the MTP "
                         "layer's KV, which only a speculative prefill replica computes")
    if engine.speculative_tokens and not decode["speculative_tokens"]:
        raise ValueError(f"prefill.speculative_tokens is {engine.speculative_tokens} while the decode replicas do not "
                         "draft: they keep no MTP-layer KV, which such a prefill replica sends (set it to 0)")
    if not decode["prefix_caching"]:
        raise ValueError("prefix_caching must be on for disaggregated prefill: the decode replicas take the "
                         "transferred KV into their prefix cache")
    return PrefillPlan(engine.to_dict(), deployment, least)
