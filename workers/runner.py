"""The model runner: turns a step plan into tensors, runs the model over the paged cache, samples.

The coordinator↔worker contract is ``WorkerStep`` in, ``StepResult`` out: plain ints, strings and
frozen dataclasses (no tensors), so it crosses process boundaries through Ray unchanged. The runner
keeps each request's token history (with penalties, its token counts on the device) and sampling parameters
from the step that first mentions it until a step lists it as finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import torch

from models.cache import HostKV, ImportWriter, KVCache, build_batch
from models.glm5 import GlmForCausalLM
from scheduler.request import SamplingParams
from scheduler.scheduler import ScheduledSeq
from scheduler.shapes import GRAPH_BUCKETS, StepShape, next_pow2
from workers.graphs import DecodeGraphs, DraftGraphs
from workers.memory import device_memory
from workers.pieces import PieceGraphs
from workers.sampler import (
    RowLogprobs,
    StepMasks,
    TokenCounts,
    allow_only,
    has_penalties,
    row_logprobs,
    sample,
    sample_on_device,
    to_device,
    token_logprobs,
)
from workers.sampler import warm_up as sampler_warm_up
from workers.speculative import DraftRequest, MtpDrafter, pick_draft, verify

MAX_DRAFTS = 7       # drafts per round at most (N - 1 on an 8-rank span)
GRAPH_ROWS = GRAPH_BUCKETS[-1]
PROMPT_ROWS = 256    # prompt rows whose logits (fp32, [rows, vocab]) one pass of prompt logprobs holds at once


@dataclass(frozen=True)
class NewRequest:
    req_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    output_ids: tuple[int, ...] = ()    # what it generated on another rank (preempted there, moved here)


@dataclass(frozen=True)
class WorkerStep:
    """One step for one worker: the scheduled rows, requests it sees for the first time, requests to forget."""

    step_id: int
    seqs: tuple[ScheduledSeq, ...]
    new_requests: tuple[NewRequest, ...] = ()
    finished: tuple[str, ...] = ()
    shape: StepShape | None = None     # the MoE bucket of this step (all ranks get the same one)
    num_drafts: int = 0                # drafts to propose after this step (0: none; the same on every rank)
    graph: tuple[int, int, bool] | None = None   # (rows bucket, table width, span): a graph step, same everywhere
    draft_graph: str | None = None     # a graph step's MTP work on DraftGraphs: "greedy" (drafts picked inside one
                                       # graph) or "drawn" (picked between graphs); None: the eager drafter
    lookahead: bool = False            # launch the same requests' next decode step ahead (``ModelRunner``)
    use_ahead: bool = False            # this step is the one the last step launched ahead (the same everywhere)
    warm: tuple[int, ...] | None = None  # a warm-up step (no rows): capture ``graph`` ahead of use, then the MTP
                                         # drafting graphs after it for these draft counts (0: the extend alone);
                                         # without ``graph``: the sampler's kernel variants (``sampler.warm_up``)
                                         # and the per-layer pieces (``workers/pieces.py``)
    masks: StepMasks | None = None     # the tokens each guided row may sample (structured output, ``cluster/guided.py``)
    kv_saves: tuple[tuple[int, int], ...] = ()   # (block, host block): cached blocks to host memory, first
    kv_loads: tuple[tuple[int, int], ...] = ()   # (host block, block): cached prefixes back, before the forward
    memory: bool = False               # no rows: report the device's free and total bytes (after the warm-up)
    # disaggregated prefill (``cluster/disagg.py``): (request, blocks) whose KV rows go back after the step
    # (``StepResult.kv``); (blocks, rows) sent to the device after the step's work, into their blocks after the next
    # step's where it says ``kv_land`` (``ImportWriter``; without it they are dropped)
    kv_exports: tuple[tuple[str, tuple[int, ...]], ...] = ()
    kv_imports: tuple[tuple[tuple[int, ...], tuple[np.ndarray, ...]], ...] = ()
    kv_land: bool = False


@dataclass(frozen=True)
class TokenLogprobs:
    logprob: float
    top: tuple[tuple[int, float], ...]
    rank: int | None = None      # the token's place among the row's (1: the most likely); prompt logprobs only


@dataclass(frozen=True)
class StepResult:
    step_id: int
    sampled: dict[str, list[int]] = field(default_factory=dict)            # req_id -> new tokens
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)  # only where requested
    # where requested (``SamplingParams.prompt_logprobs``): req_id -> (the prompt position of the first, the logprobs of
    # the prompt tokens this step's chunk predicts — each under its row's logits, the row before it)
    prompt_logprobs: dict[str, tuple[int, list[TokenLogprobs]]] = field(default_factory=dict)
    drafts: dict[str, list[int]] = field(default_factory=dict)              # proposals to verify next step
    busy_ms: float = 0.0     # this rank's wall time in the step (forward, logits, sampling, drafting)
    draft_ms: float = 0.0    # of which the MTP passes (extend + proposals)
    memory: tuple[int, int] | None = None   # a GPU's (free, total) bytes, where the step asked (``WorkerStep.memory``)
    kv: dict[str, tuple[np.ndarray, ...]] = field(default_factory=dict)   # ``WorkerStep.kv_exports``' rows (bytes)
    import_fill: tuple[int, float] | None = None   # ``kv_imports``' pinned bytes and their fill's seconds (a GPU)


@dataclass
class _Ahead:
    """A decode step launched before the engine asked for it: the requests of ``seqs`` one position on, fed the
    tokens sampled on the device. ``tokens``: its own sampled tokens, on the device; ``logprobs``: theirs, where
    asked — or, where its rows need structured output's masks (which need the tokens it was fed, on the host),
    ``pending``: its logits and token counts, sampled once the engine's step brings the masks."""

    key: tuple[int, int, bool]
    seqs: tuple[ScheduledSeq, ...]
    tokens: torch.Tensor | None
    logprobs: RowLogprobs | None
    pending: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def rows_of(self, step: WorkerStep, requests: dict) -> list[int] | None:
        """Where the engine's step's rows are among this one's, or None when it is not this step: the same graph key,
        these rows in order less those whose requests ended since (their tokens are thrown away), each at the same
        position in the same blocks (the plan may hold one more block after them) and fed its request's last token
        (the one the launched step was fed on the device)."""
        if step.graph != self.key:
            return None
        at = {a.req_id: i for i, a in enumerate(self.seqs)}
        rows = [at.get(s.req_id, -1) for s in step.seqs]
        if -1 in rows or rows != sorted(rows):
            return None
        for s, i in zip(step.seqs, rows):
            a = self.seqs[i]
            if s.start_pos != a.start_pos or s.block_ids[:len(a.block_ids)] != a.block_ids \
                    or s.token_ids != (requests[s.req_id].history[-1],):
                return None
        return rows


@dataclass
class _RequestState:
    params: SamplingParams
    num_prompt: int
    history: list[int]
    counts: TokenCounts | None = None         # with penalties: the history's token counts, on the device
    draft_probs: torch.Tensor | None = None   # [k, V]: what the pending drafts were drawn from


class ModelRunner:
    """Runs steps of a (possibly sharded) model on one device over a cache of ``num_blocks`` blocks.

    ``in_group``: one of several ranks, which all run every step (the MLP phases are collective);
    ``stage(shape, num_rows, static)`` is called before every forward so the rank's comm knows the bucket
    (``static``: the graph-shaped phases, every rank padded to the bucket).
    ``speculative``: keep the MTP layer's cache filled and propose drafts when a step asks for them.
    ``graphs``: steps the engine marks ``graph`` (decode / verify rows, ≤ 8 per rank) run the static-shape
    forward of ``workers/graphs.py`` — ``capture``: as CUDA graphs (eager off CUDA); ``eager``: the same
    static path without capture (the replays' oracle); ``off``: every step runs the ragged eager path.
    ``pieces`` (rows, capture) with ``graphs`` on: the other steps of up to that many rows (2048 at most) run on
    ``workers/pieces.py``'s per-layer pieces — captured (on CUDA; they hold no comm, so also in a group whose
    ``graphs`` is ``eager`` for its comm's sake) or eagerly.
    With speculation and ``graphs`` on, the MTP work after a graph step runs on ``DraftGraphs`` as the step's
    ``draft_graph`` says; ``select(shape, real)`` is the comm's capture-safe switch of bucket shape and row mask
    (``StepComm.select``) that those graphs use in a group.

    Look-ahead (graphs on, no speculation): a graph step the engine marks ``lookahead`` (every row of every rank
    samples one token, greedy or drawn, and the same requests will decode again as far as the engine can tell)
    samples on the device (``sample_on_device``, ``row_logprobs``; penalties from the device-side ``TokenCounts``, which
    count the fed token before the host has it), and the same requests' next
    decode step is staged and launched at once — fed those device-side tokens, through the same comm phases on every
    rank — before this step's tokens are read back. The host returns, and the engine updates and plans while the GPU
    runs that step; if the engine's next step is it (``use_ahead``, decided by the engine for all ranks alike,
    checked here by ``_Ahead.rows_of``), it is not run again. Otherwise every rank drops it: its KV writes went to the
    positions after the requests' last token, which a later step writes again before anything reads them (or to
    blocks a finished request freed, which a new owner writes before reading, later in the same stream).
    """

    def __init__(self, model: GlmForCausalLM, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: str | torch.device = "cpu", in_group: bool = False, world_size: int = 1,
                 stage: Callable[[StepShape | None, int, bool], None] | None = None, speculative: bool = False,
                 max_drafting: int = 8, graphs: str = "off", select: Callable | None = None,
                 pieces: tuple[int, bool] | None = None, host_blocks: int = 0, kv_fp8: bool = False):
        self.model, self.block_size, self.device = model, block_size, torch.device(device)
        self.in_group, self.world_size = in_group, world_size
        self.stage = stage or (lambda shape, n, static=False: None)
        num_slots = num_blocks * block_size
        scratch = MAX_DRAFTS + 1
        pad_slot = num_slots + self.extra_slots(max_drafting) - 1     # written by the graphs' pad rows, read by no one
        self.cache = KVCache(model.config, pad_slot + 1, dtype, device, fp8=kv_fp8)
        self.host = HostKV(self.cache, host_blocks, block_size) if host_blocks else None   # the prefix cache's 2nd tier
        self.imports = ImportWriter(self.cache, block_size)      # other replicas' KV, written after the steps
        if graphs not in ("off", "eager", "capture"):
            raise ValueError(f"graphs must be 'off', 'eager' or 'capture', got {graphs!r}")
        self.graphs = None if graphs == "off" else DecodeGraphs(
            model, self.cache, block_size, pad_slot, next_pow2(num_blocks), self.device, capture=graphs == "capture")
        self.pieces = None if pieces is None or self.graphs is None else PieceGraphs(
            model, self.cache, pad_slot, pieces[0], world_size, in_group, self.device,
            self.graphs.record if pieces[1] else None, max_drafting if speculative else 0)
        self.requests: dict[str, _RequestState] = {}
        self._ahead: _Ahead | None = None
        self.ahead_stats = {"launched": 0, "used": 0}
        self._host_tokens = torch.zeros(GRAPH_ROWS, dtype=torch.long, pin_memory=self.device.type == "cuda")
        self._tokens_read = torch.cuda.Event() if self.device.type == "cuda" else None
        self.drafter = self.draft_graphs = None
        if speculative:
            assert model.mtp_layer is not None, "speculative decoding needs the checkpoint's MTP layer"
            self.drafter = MtpDrafter(model, self.cache, block_size, num_slots, scratch, self.stage, self.pieces)
            self.max_drafting = max_drafting
            if self.graphs is not None and self.drafter.share_index:
                self.draft_graphs = DraftGraphs(model, self.graphs, num_slots, scratch, world_size,
                                                select or (lambda shape, real=None: None), self.device)

    @staticmethod
    def extra_slots(max_drafting: int = 8) -> int:
        """The cache's slots past the pool's: the drafts' scratch rows and the pad rows' slot."""
        return max_drafting * (MAX_DRAFTS + 1) + 1

    def reset(self) -> None:
        """Forget every request (after a group failure the scheduler starts over; KV is overwritten)."""
        self.requests.clear()
        self._ahead = None
        self.imports.drop()

    @torch.inference_mode()
    def execute(self, step: WorkerStep) -> StepResult:
        staged = self.imports.stage(step.kv_imports)    # (on a GPU: into pinned memory while the step runs)
        try:
            result = self._execute(step)
        except BaseException:
            self.imports.drop()            # (the engine drops the imports of a failed step: their blocks go elsewhere)
            raise
        if step.kv_exports:            # after the step's forward and MTP passes: the prompt's KV is complete
            result = replace(result, kv={rid: self.cache.read_blocks(blocks, self.block_size)
                                         for rid, blocks in step.kv_exports})
        if step.step_id < 0:               # a warm-up's or a report's (no rows): imports on their way stay so
            return result
        fill = self.imports.write(staged, step.kv_land)    # last: no plan takes the blocks before the next step
        return replace(result, import_fill=fill) if fill else result

    def _execute(self, step: WorkerStep) -> StepResult:
        start = time.perf_counter()
        for rid in step.finished:          # first: a finished id may come back as a new request
            self.requests.pop(rid, None)
        for nr in step.new_requests:
            counts = TokenCounts(len(nr.prompt_ids), self.model.config.vocab_size, self.device) \
                if has_penalties(nr.params) else None
            self.requests[nr.req_id] = _RequestState(nr.params, len(nr.prompt_ids),
                                                     [*nr.prompt_ids, *nr.output_ids], counts)
        # saves first (a saved block may be a load's destination, or an import's: those are written after the step)
        if step.kv_saves or step.kv_loads:
            assert self.host is not None and not (step.use_ahead and step.kv_loads), "host copies this runner can't run"
            self.host.save(step.kv_saves)
        if step.kv_loads:
            self.host.load(step.kv_loads)
        ahead, self._ahead = self._ahead, None           # used by this step, or dropped
        if step.memory:
            return StepResult(step.step_id, memory=device_memory(self.device) if self.device.type == "cuda" else None)
        if step.warm is not None:
            self._warm(step)
            return StepResult(step.step_id, busy_ms=(time.perf_counter() - start) * 1e3)
        if not step.seqs and not self.in_group:
            return StepResult(step.step_id)
        if self.graphs is not None and step.graph is not None and (step.lookahead or step.use_ahead):
            rows = ahead.rows_of(step, self.requests) if step.use_ahead and ahead is not None else None
            assert rows is not None or not step.use_ahead, "the step launched ahead is not this one"
            result = self._execute_on_device(step, ahead if step.use_ahead else None, rows)
            return replace(result, busy_ms=(time.perf_counter() - start) * 1e3)
        static_draft = self.draft_graphs is not None and step.graph is not None and step.draft_graph is not None
        if self.graphs is not None and step.graph is not None:
            bucket, width, _ = step.graph
            batch = self.graphs.stage(step.seqs, bucket, width)
            self.stage(step.shape, batch.num_rows, True)
            full = self.graphs.run(*step.graph)                                        # [bucket, H]
            hidden = full[:batch.num_rows]                                              # [N, H]
            logits = self.model.bucket_logits(full) if self.in_group else None          # every rank: 1/N of the lm_head
            if self.drafter is not None and not static_draft:
                self.stage(step.shape, batch.num_rows, False)   # the eager MTP passes use the ragged comm
        else:
            logits = None
            ids = to_device([t for s in step.seqs for t in s.token_ids], torch.long, self.device)
            batch = build_batch([(s.start_pos, len(s.token_ids), s.block_ids) for s in step.seqs],
                                self.block_size, self.device)
            self.stage(step.shape, batch.num_rows, False)
            if self._on_pieces(step, batch.num_rows):
                hidden = self.pieces.forward(ids, batch)                              # [N, H]
            else:
                hidden = self.model(ids, batch, self.cache)
        result = self._sample(step, hidden, batch, logits)   # sampling ends in a device sync (token ids)
        sampled = end = time.perf_counter()
        if self.drafter is not None:                            # so does drafting (draft ids)
            if static_draft:
                self._draft_static(step, full, batch, result)
            else:
                self._draft(step, hidden, batch, result)
            end = time.perf_counter()
        return replace(result, busy_ms=(end - start) * 1e3, draft_ms=(end - sampled) * 1e3)

    def _on_pieces(self, step: WorkerStep, rows: int) -> bool:
        """Whether the eager step runs on ``PieceGraphs``: its rows, and in a group its MLP bucket, fit them."""
        return self.pieces is not None and self.pieces.fits(rows) and (
            not self.in_group or step.shape.total_rows <= self.pieces.moe_rows)

    def _warm(self, step: WorkerStep) -> None:
        """Capture the step's graph, and the drafting graphs after it, on pad rows alone (they write only the pad
        slot), so no request's step pays a capture later. Every rank runs the same warm steps, so a group's captured
        comm phases line up. The graphs' step counters are left as they were."""
        if step.graph is None:              # the sampler's kernel variants, and the per-layer pieces of the other steps
            sampler_warm_up(self.model.config.vocab_size, self.device)
            if self.pieces is not None:
                self.pieces.warm()
            return
        if self.graphs is None:
            return
        runs = dict(self.graphs.runs)
        bucket, width, _ = step.graph
        self.graphs.stage((), bucket, width)
        self.stage(step.shape, 0, True)
        full = self.graphs.run(*step.graph)
        self.graphs.runs = runs
        if self.draft_graphs is None:
            return
        runs = dict(self.draft_graphs.runs)
        self.draft_graphs.stage_inputs(full, [], 0, None)
        for k in step.warm:
            self.draft_graphs.run(*step.graph, k)
            if k:
                self.draft_graphs.run_drawn(*step.graph, k, None)
        self.draft_graphs.runs = runs

    def _execute_on_device(self, step: WorkerStep, ahead: _Ahead | None, rows: list[int] | None = None
                           ) -> StepResult:
        """A graph step sampled on the device (the launched look-ahead if it is this step — its ``rows`` —, else staged
        and replayed now), the next one launched ahead if the engine allows, then this step's tokens read back."""
        if ahead is not None and ahead.pending is not None:    # sampled now, with this step's masks
            raw, counts = ahead.pending
            if len(rows) < len(ahead.seqs):            # requests ended since it was launched: their rows go
                index = to_device(rows, torch.long, self.device)
                raw, counts = raw[index], None if counts is None else counts[index]
            tokens, logprobs = self._sample_rows(step, step.seqs, raw, counts)
            self.ahead_stats["used"] += 1
        elif ahead is not None:
            tokens, logprobs = ahead.tokens, ahead.logprobs
            if len(rows) < len(ahead.seqs):            # requests ended since it was launched: their rows go
                tokens = tokens[to_device(rows, torch.long, self.device)]
                logprobs = logprobs.take(rows) if logprobs is not None else None
            self.ahead_stats["used"] += 1
        else:
            tokens, logprobs = self._replay_on_device(step, step.seqs)
        n = len(step.seqs)
        host = self._host_tokens[:n]
        host.copy_(tokens, non_blocking=True)
        logprobs = logprobs.to_host() if logprobs is not None else None
        if self._tokens_read is not None:
            self._tokens_read.record()
        if step.lookahead:
            self._ahead = self._launch_ahead(step, tokens)
        if self._tokens_read is not None:
            self._tokens_read.synchronize()
        states = [self._state(s) for s in step.seqs]
        lps, tops = logprobs.read([st.params for st in states]) if logprobs is not None else ([None] * n, [None] * n)
        result = StepResult(step.step_id)
        for s, st, t, lp, top in zip(step.seqs, states, host.tolist(), lps, tops):
            self._commit(result, s, st, [t], [(lp, tuple(top or ()))])
        return result

    def _replay_on_device(self, step: WorkerStep, seqs: tuple[ScheduledSeq, ...], fed: torch.Tensor | None = None,
                          pending: bool = False) -> tuple:
        """Stage ``seqs`` (their ids replaced by ``fed`` on the device when given), replay the step's graph, and
        return each request's token on the device [len(seqs)] and the logprobs asked for (as ``sample`` gives them) —
        or, ``pending``, the (logits, token counts) to sample them from later (``_Ahead.pending``)."""
        batch = self.graphs.stage(seqs, *step.graph[:2])
        if fed is not None:
            self.graphs.ids[:len(seqs)].copy_(fed)       # after the staged ids, in stream order
        self.stage(step.shape, batch.num_rows, True)
        hidden = self.graphs.run(*step.graph)
        bucket = self.model.bucket_logits(hidden) if self.in_group else None        # every rank, rows or none
        if not seqs:
            return torch.empty(0, dtype=torch.long, device=hidden.device), None
        last = [r0 + n - 1 for r0, n in batch.seq_rows]
        raw = _take_rows(bucket, last) if bucket is not None else self.model.logits(_take_rows(hidden, last))
        counts = self._counts([self.requests[s.req_id] for s in seqs], fed)
        return (raw, counts) if pending else self._sample_rows(step, seqs, raw, counts)

    def _sample_rows(self, step: WorkerStep, seqs, raw: torch.Tensor, counts: torch.Tensor | None
                     ) -> tuple[torch.Tensor, RowLogprobs | None]:
        """The rows' tokens on the device and the logprobs asked for, from their logits ``raw`` — masked where the
        step's guided rows have masks (built now: the forward is launched, the device runs it meanwhile)."""
        if step.masks is not None:
            masks = step.masks.rows()
            raw = allow_only(raw, [masks[s.req_id][0] if s.req_id in masks else None for s in seqs])
        params = [self.requests[s.req_id].params for s in seqs]
        tokens = sample_on_device(raw, params, [s.num_generated for s in seqs], counts)
        return tokens, row_logprobs(raw, params, tokens)

    def _history_counts(self, st: _RequestState) -> torch.Tensor | None:
        """A request's token counts [2, V] over its whole history (penalties), None without penalties."""
        return st.counts.of(st.history) if st.counts is not None else None

    def _counts(self, states: list[_RequestState], fed: torch.Tensor | None = None) -> torch.Tensor | None:
        """The rows' token counts [B, 2, V] for penalties (zeros for rows without), None when no row has them.
        ``fed``: each row's fed token on the device, not yet in its history (a step launched ahead)."""
        if all(st.counts is None for st in states):
            return None
        rows = []
        for i, st in enumerate(states):
            if st.counts is None:
                rows.append(torch.zeros(2, self.model.config.vocab_size, dtype=torch.int32, device=self.device))
                continue
            counts = self._history_counts(st)
            if fed is not None:
                st.counts.add(fed[i:i + 1])            # in place, before the stack below copies the counts
            rows.append(counts)
        return torch.stack(rows)

    def _launch_ahead(self, step: WorkerStep, tokens: torch.Tensor) -> _Ahead:
        """Stage and launch the same requests' next decode step, fed ``tokens`` (on the device); where this step's rows
        have masks, the next one's will too, so its sampling waits for them (``_Ahead.pending``)."""
        seqs = tuple(replace(s, token_ids=(0,), start_pos=s.start_pos + 1, num_generated=s.num_generated + 1)
                     for s in step.seqs)
        self.ahead_stats["launched"] += 1
        if step.masks is not None:
            return _Ahead(step.graph, seqs, None, None, self._replay_on_device(step, seqs, tokens, pending=True))
        return _Ahead(step.graph, seqs, *self._replay_on_device(step, seqs, tokens))

    def _sample(self, step: WorkerStep, hidden: torch.Tensor, batch, bucket: torch.Tensor | None = None) -> StepResult:
        """Sample the plain rows, verify the drafting ones; ``bucket``: the step's logits, one row per row of ``hidden``
        (a group's graph step: ``bucket_logits``), else the lm_head runs here on the rows that sample."""
        result = StepResult(step.step_id)
        # built now: the forward is launched, the device runs it meanwhile; {req_id: a mask per sampled row, or None}
        masks = step.masks.rows() if step.masks is not None else {}
        plain = [i for i, s in enumerate(step.seqs) if s.sample and not s.num_drafts]
        if plain:
            seqs = [step.seqs[i] for i in plain]
            states = [self._state(s) for s in seqs]
            last = [batch.seq_rows[i][0] + batch.seq_rows[i][1] - 1 for i in plain]
            logits = _take_rows(bucket, last) if bucket is not None else self.model.logits(_take_rows(hidden, last))
            if masks:
                logits = allow_only(logits, [masks[s.req_id][0] if s.req_id in masks else None for s in seqs])
            out = sample(logits, [st.params for st in states], self._counts(states), [s.num_generated for s in seqs])
            for i, (s, st) in enumerate(zip(seqs, states)):
                self._commit(result, s, st, [out.token_ids[i]],
                             [(out.logprobs[i], tuple(out.top_logprobs[i] or ()))])
        for i, s in enumerate(step.seqs):
            if s.sample and s.num_drafts:
                st = self._state(s)
                r0, n = batch.seq_rows[i]
                verified = slice(r0 + n - 1 - s.num_drafts, r0 + n)
                logits = bucket[verified] if bucket is not None else self.model.logits(hidden[verified])   # [k+1, V]
                if s.req_id in masks:                    # a guided request: each row what may follow its drafts
                    logits = allow_only(logits, masks[s.req_id])
                drafts = s.token_ids[-s.num_drafts:]
                tokens = verify(logits, drafts, st.draft_probs, st.params, self._history_counts(st), s.num_generated)
                lps = [row[:2] for row in token_logprobs(logits, tokens, st.params.logprobs or 0)] \
                    if st.params.logprobs is not None else []
                self._commit(result, s, st, tokens, lps)
        for i, s in enumerate(step.seqs):       # (not again for a request that has output: recomputed, or moved)
            st = self.requests[s.req_id]
            if st.params.prompt_logprobs is not None and s.num_generated == 0 and s.start_pos + 1 < st.num_prompt:
                result.prompt_logprobs[s.req_id] = self._prompt_logprobs(s, st, batch.seq_rows[i][0], hidden, bucket)
        return result

    def _prompt_logprobs(self, s: ScheduledSeq, st: _RequestState, r0: int, hidden: torch.Tensor,
                         bucket: torch.Tensor | None) -> tuple[int, list[TokenLogprobs]]:
        """The prompt tokens that the chunk ``s`` (its rows from ``r0``) predicts, each one's logprob under the logits
        of the row before it and the top n there: (the position of the first, the logprobs). Logits of ``PROMPT_ROWS``
        rows at a time (a long chunk's whole [rows, vocab] would not fit beside the step)."""
        first = s.start_pos + 1
        count = min(len(s.token_ids), st.num_prompt - first)
        out = []
        for a in range(0, count, PROMPT_ROWS):
            rows = slice(r0 + a, r0 + min(count, a + PROMPT_ROWS))
            logits = bucket[rows] if bucket is not None else self.model.logits(hidden[rows])
            targets = st.history[first + a:first + a + logits.shape[0]]
            out += [TokenLogprobs(*row) for row in token_logprobs(logits, targets, st.params.prompt_logprobs)]
        return first, out

    def _state(self, s: ScheduledSeq) -> _RequestState:
        st = self.requests[s.req_id]
        assert len(st.history) == s.end_pos - s.num_drafts, f"{s.req_id}: runner history out of sync with the plan"
        return st

    def _commit(self, result: StepResult, s: ScheduledSeq, st: _RequestState, tokens: list[int], lps) -> None:
        st.history += tokens
        st.draft_probs = None
        result.sampled[s.req_id] = tokens
        if st.params.logprobs is not None:
            result.logprobs[s.req_id] = [TokenLogprobs(lp, top) for lp, top in lps]

    def _draft_static(self, step: WorkerStep, full: torch.Tensor, batch, result: StepResult) -> None:
        """``_draft`` on the graph path (``DraftGraphs``): the same extend inputs and drafts — greedy ones in one
        replay, drawn ones picked between replays by the eager drafter's ``pick_draft``, with their distributions."""
        flat = [t for s in step.seqs for t in s.token_ids]
        next_ids = flat[1:] + flat[:1]                   # as _draft's roll, then the committed tokens
        drafting = None
        for i, s in enumerate(step.seqs):
            r0, n = batch.seq_rows[i]
            if not s.sample:                             # a prompt chunk: the next prompt token
                next_ids[r0 + n - 1] = self.requests[s.req_id].history[s.end_pos]
                continue
            tokens = result.sampled[s.req_id]
            last = _last_valid_row(s, r0, n, tokens)
            next_ids[last] = tokens[-1]
            if step.num_drafts and drafting is None:
                drafting = (s.req_id, last, s.start_pos + last - r0)
        assert step.num_drafts == 0 or len(step.seqs) <= 1, "graph drafting serves one drafting request"
        req, row, position = drafting or (None, 0, None)
        self.draft_graphs.stage_inputs(full, next_ids, row, position)
        if step.draft_graph == "greedy" or step.num_drafts == 0:
            assert req is None or self.requests[req].params.is_greedy, f"{req}: drawn drafts in the greedy graph"
            out = self.draft_graphs.run(*step.graph, step.num_drafts)
            if req is not None:
                result.drafts[req] = out.tolist()
                self.requests[req].draft_probs = None
            return
        st = self.requests[req] if req is not None else None
        counts = self._history_counts(st) if st is not None else None
        probs, drafts = [], []

        def pick(logits: torch.Tensor) -> torch.Tensor:
            tok, q = pick_draft(logits[0], st.params, counts, len(st.history) - st.num_prompt, drafts)
            drafts.append(tok)
            probs.append(q)
            return tok

        self.draft_graphs.run_drawn(*step.graph, step.num_drafts, pick if st is not None else None)
        if st is not None:
            result.drafts[req] = torch.cat(drafts).tolist()
            st.draft_probs = None if probs[0] is None else torch.stack(probs)

    def _draft(self, step: WorkerStep, hidden: torch.Tensor, batch, result: StepResult) -> None:
        """MTP extend over the step's rows (the token after each row: the next fed token, or for the last
        valid row the token just committed), then drafts for requests that sampled. The extend's ids are put
        together on the host and moved in one copy (a host value written into a device tensor waits for the GPU)."""
        flat = [t for s in step.seqs for t in s.token_ids]
        next_ids = flat[1:] + flat[:1]
        rows, reqs = [], []
        for i, s in enumerate(step.seqs):
            r0, n = batch.seq_rows[i]
            st = self.requests[s.req_id]
            if s.sample:
                tokens = result.sampled[s.req_id]
                last = _last_valid_row(s, r0, n, tokens)
                next_ids[last] = tokens[-1]
                if step.num_drafts and len(reqs) < self.max_drafting:
                    rows.append(last)
                    reqs.append(DraftRequest(s.req_id, s.start_pos + last - r0, s.block_ids, st.params,
                                             self._history_counts(st), len(st.history) - st.num_prompt, len(reqs)))
            else:
                next_ids[r0 + n - 1] = st.history[s.end_pos]          # the next prompt token
        self.drafter.extend(hidden, to_device(next_ids, torch.long, self.device), batch,
                            self._on_pieces(step, batch.num_rows))
        if step.num_drafts:
            for r, (d, q) in zip(reqs, self.drafter.propose(rows, reqs, step.num_drafts, self.world_size)):
                result.drafts[r.req_id] = d
                self.requests[r.req_id].draft_probs = q


def _take_rows(hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """hidden[rows] without waiting for the GPU: a run of consecutive rows (every decode step's) is a view; other
    rows index with an asynchronous copy of the index (a Python list index would copy it synchronously, so the
    launches after it — lm_head, sampling — would wait for the whole forward to finish)."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return hidden[rows[0]: rows[0] + len(rows)]
    index = torch.tensor(rows, dtype=torch.long)
    if hidden.is_cuda:
        index = index.pin_memory().to(hidden.device, non_blocking=True)
    return hidden.index_select(0, index)


def _last_valid_row(s: ScheduledSeq, r0: int, n: int, tokens: list[int]) -> int:
    """The last of request s's rows [r0, r0 + n) whose KV stays valid after verification: the committed token's
    row plus the accepted drafts (``tokens`` = accepted drafts + one more)."""
    return r0 + n - 1 - s.num_drafts + len(tokens) - 1
