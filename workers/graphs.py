"""Static-shape decode / verify forward, captured as CUDA graphs per (row bucket, context width).

A decode or verify step — every scheduled request feeds its last token plus its drafts, ≤ 64 rows per
rank (``GRAPH_BUCKETS``; ``graph_rows`` in a group), maybe beside prompt chunks (rows of consecutive positions, as a
verify's) — runs on persistent buffers: token ids, positions, KV slots
and one block table per row are copied in, rows are padded to the bucket (1, 2, 4, …, 64), and the forward
captured for that bucket is replayed. Pad rows write their KV to a slot no request owns and their outputs are
dropped (in a worker group the comm zeroes them before the MoE). The width (block-table columns, chosen by the
engine) is the step's longest block table rounded up, so the indexer scores a bounded range; each (bucket, width)
is captured on first use into one shared memory pool.

On CPU (or with ``capture=False``) the same static-shape forward runs eagerly: it is the oracle a
replay must equal bit for bit, and on CPU it runs the padded path in CI.

``DraftGraphs`` does the same for the MTP drafter's work after such a step (the extend pass, and a drafting
request's chained draft passes), reading the step's buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from models.cache import Batch, KVCache
from models.glm5 import GlmForCausalLM
from scheduler.scheduler import ScheduledSeq
from scheduler.shapes import GRAPH_BUCKETS, StepShape, graph_shape


class DecodeGraphs:
    """Graphs of ``model.forward`` (final-normed hidden rows) for decode / verify steps.

    ``pad_slot``: a cache slot reserved for pad rows; ``max_blocks``: block-table columns at most (a power
    of two ≥ the blocks one request can hold); ``capture``: record CUDA graphs (needs a CUDA device and
    graph-capturable kernels and comm), else run the static forward eagerly. Which steps qualify and their
    (bucket, width) is the engine's call (``scheduler.shapes.graph_key``): in a worker group every rank must
    run the same captured sequence of comm phases.
    """

    def __init__(self, model: GlmForCausalLM, cache: KVCache, block_size: int, pad_slot: int, max_blocks: int,
                 device: torch.device, capture: bool):
        self.model, self.cache, self.block_size = model, cache, block_size
        self.pad_slot, self.max_blocks = pad_slot, max_blocks
        self.capture = capture and device.type == "cuda"
        rows = GRAPH_BUCKETS[-1]
        self._meta = torch.zeros(3, rows, dtype=torch.long, device=device)          # ids, positions, slots
        self.ids, self.positions, self.slots = self._meta.unbind(0)
        self.block_table = torch.zeros(rows, max_blocks, dtype=torch.int32, device=device)
        # host mirrors, pinned on CUDA (asynchronous copies); reused, so a step waits for the previous copy
        pin = device.type == "cuda"
        self._host_meta = torch.zeros(3, rows, dtype=torch.long, pin_memory=pin)
        self._host_table = torch.zeros(rows * max_blocks, dtype=torch.int32, pin_memory=pin)
        self._copied = torch.cuda.Event() if pin else None
        self._graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None
        self.runs: dict[tuple[int, int, bool], int] = {}      # steps served per (bucket, width, span)

    def stage(self, seqs: Sequence[ScheduledSeq], bucket: int, width: int) -> Batch:
        """Copy the step (its requests' decode / verify rows or prompt chunks, in order) into the static buffers, pad
        rows reset. Returns the real rows' Batch, a view of the buffers (it serves the eager MTP pass too)."""
        bs = self.block_size
        assert width <= self.max_blocks, f"graph width {width} blocks > table capacity {self.max_blocks}"
        if self._copied is not None:
            self._copied.synchronize()                  # the host mirrors are free again
        meta = self._host_meta.numpy()
        table = self._host_table[: bucket * width].numpy().reshape(bucket, width)
        table[:] = 0
        meta[:, :bucket] = ((0,), (0,), (self.pad_slot,))
        n, seq_rows = 0, []
        for s in seqs:
            assert not s.num_drafts or s.sample and len(s.token_ids) == 1 + s.num_drafts, \
                f"{s.req_id}: drafts without their verify rows"
            rows = len(s.token_ids)
            assert n + rows <= bucket, f"the step's rows do not fit the graph bucket {bucket}"
            seq_rows.append((n, rows))
            table[n, :len(s.block_ids)] = s.block_ids
            table[n + 1: n + rows] = table[n]
            for j, t in enumerate(s.token_ids):
                p = s.start_pos + j
                meta[:, n + j] = (t, p, s.block_ids[p // bs] * bs + p % bs)
            n += rows
        self._meta.copy_(self._host_meta, non_blocking=True)
        self.block_table[:bucket, :width].copy_(self._host_table[: bucket * width].view(bucket, width),
                                                non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        return Batch(self.positions[:n], self.slots[:n], seq_rows, [], self.block_table[:n, :width], bs)

    def _forward(self, bucket: int, width: int) -> torch.Tensor:
        batch = Batch(self.positions[:bucket], self.slots[:bucket], [], [], self.block_table[:bucket, :width],
                      self.block_size)
        return self.model(self.ids[:bucket], batch, self.cache)

    def run(self, bucket: int, width: int, span: bool = False) -> torch.Tensor:
        """The staged step's hidden rows [bucket, H] (pad rows included): a graph replay, or eagerly.
        ``span``: a worker group's span step, whose comm phases differ from a dp step's (``graph_key``)."""
        key = (bucket, width, span)
        self.runs[key] = self.runs.get(key, 0) + 1
        if not self.capture:
            return self._forward(bucket, width)
        if key not in self._graphs:
            # the step's inputs are staged, so the warm-up writes exactly the KV the replay writes
            self._graphs[key] = self.record(lambda: self._forward(bucket, width),
                                            f"the decode step (rows {bucket}, width {width} blocks)")
        graph, out = self._graphs[key]
        graph.replay()
        return out

    def eager(self, bucket: int, width: int) -> torch.Tensor:
        """The same static forward without the graph (the replay's oracle)."""
        return self._forward(bucket, width)

    def record(self, fn, what: str) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """(graph, output) of ``fn`` captured into the runner's one memory pool (its decode and drafting graphs)."""
        try:
            graph, out = capture_graph(fn, self._pool)
        except Exception as e:
            raise RuntimeError(f"CUDA graph capture of {what} failed: {e}; kernels must be 'auto' on CUDA, "
                               f"or set cuda_graphs: off") from e
        self._pool = graph.pool()
        return graph, out

    @property
    def captured(self) -> list[tuple[int, int, bool]]:
        return sorted(self._graphs)


def capture_graph(fn, pool=None, warmup: int = 1):
    """(graph, its output) of ``fn`` captured on the current CUDA device, after ``warmup`` eager runs on a
    side stream (Triton compiles, cuBLAS workspaces). ``pool``: share another graph's memory pool."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


class DraftGraphs:
    """The MTP drafter's work after a graph step, static-shaped and captured like the step itself: the extend pass
    over the step's rows (the bucket's buffers of ``DecodeGraphs``; it keeps the MTP cache complete), then for a
    greedy drafting request k − 1 chained single-row passes, each draft picked by argmax inside the graph. One
    graph per (bucket, width, span, k); k = 0 is the extend alone (steps that do not draft).

    A drawn drafting request (``run_drawn``) needs each draft's distribution for verification, so the drafts are
    picked between graphs: one graph for the extend and the first draft's logits (per (bucket, width, span)), one per
    chained pass j (its logits; per selection width too: a context narrower than ``index_topk`` keys selects
    fewer), and ``pick`` — the eager drafter's own sampling — between them, on the device; the
    drafts are read back once, at the end.

    Needs ``index_share_for_mtp_iteration``: a chained pass reuses the extend row's selection, so it runs no
    indexer over its scratch slots and its shapes are fixed. One drafting request at most (drafts ride only while
    one request is active). In a worker group every rank replays the same graphs: a rank without the drafting
    request runs pad rows that write only the pad slot, and the chained passes' comm rows are masked by a device
    flag (``chain_real``).
    ``select(shape, real)``: points the rank's comm at a bucket shape and a device row mask (None: the step's)
    without writing device memory, so the switch between the extend's and the chain's shapes can be captured.
    """

    def __init__(self, model: GlmForCausalLM, graphs: DecodeGraphs, scratch_base: int, scratch_len: int,
                 world_size: int, select: Callable[[StepShape, torch.Tensor | None], None], device: torch.device):
        self.model, self.graphs, self.select, self.world_size = model, graphs, select, world_size
        self.scratch_base, self.scratch_len = scratch_base, scratch_len
        rows, hidden = GRAPH_BUCKETS[-1], model.config.hidden_size
        dtype = graphs.cache.dtype
        self.hidden = torch.zeros(rows, hidden, dtype=dtype, device=device)        # the step's output rows
        self._meta = torch.zeros(1 + rows + 2 * scratch_len, dtype=torch.long, device=device)
        self.row = self._meta[:1]                                  # the drafting row within the bucket
        self.next_ids = self._meta[1:1 + rows]                     # the token after each row
        self.chain_pos, self.chain_slot = self._meta[1 + rows:].view(2, scratch_len).unbind(0)
        self.chain_real = torch.zeros(1, dtype=torch.bool, device=device)   # this rank drafts (comm mask)
        self._chain_h = torch.zeros(2, 1, hidden, dtype=dtype, device=device)   # drawn chain: pass j reads j % 2
        self._chain_topk: dict[int, torch.Tensor] = {}      # the extend row's selection, per selection width
        self._head_sel: dict[tuple, int] = {}               # each head graph's selection width
        self._chain_tok = torch.zeros(1, dtype=torch.long, device=device)       # the draft a pass is fed
        pin = device.type == "cuda"
        self._host = torch.zeros(self._meta.numel(), dtype=torch.long, pin_memory=pin)
        self._copied = torch.cuda.Event() if pin else None
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.runs: dict[tuple, int] = {}

    def stage_inputs(self, hidden: torch.Tensor, next_ids: list[int], row: int, position: int | None) -> None:
        """hidden: the step's [bucket, H] output; next_ids: the token after each real row; row / position: the
        drafting row and its committed position (None: this rank does not draft — its chain writes the pad slot)."""
        if self._copied is not None:
            self._copied.synchronize()
        host = self._host.numpy()
        host[:] = 0
        rows = GRAPH_BUCKETS[-1]
        host[1:1 + len(next_ids)] = next_ids
        chain = host[1 + rows:].reshape(2, self.scratch_len)
        if position is None:
            chain[1] = self.graphs.pad_slot
        else:
            host[0] = row
            chain[0] = [position + 1 + j for j in range(self.scratch_len)]
            chain[1] = [self.scratch_base + j for j in range(self.scratch_len)]     # the solo request's scratch
        self._meta.copy_(self._host, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self.hidden[: hidden.shape[0]].copy_(hidden)
        self.chain_real.fill_(position is not None)

    def _extend(self, bucket: int, width: int, span: bool) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.graphs
        self.select(graph_shape(bucket, span, self.world_size), None)   # the extend rides the step's bucket and rows
        batch = Batch(g.positions[:bucket], g.slots[:bucket], [], [], g.block_table[:bucket, :width], g.block_size)
        return self.model.mtp_forward(self.hidden[:bucket], self.next_ids[:bucket], batch, g.cache)

    def _chain_pass(self, j: int, hn: torch.Tensor, fed: torch.Tensor, topk: torch.Tensor) -> torch.Tensor:
        """Chained pass j: the draft ``fed`` [1] after hidden ``hn`` [1, H], into scratch slot j → [1, H]."""
        chain = Batch(self.chain_pos[j:j + 1], self.chain_slot[j:j + 1], [], [])
        self.select(StepShape("dp", 1, self.world_size, None), self.chain_real)
        return self.model.mtp_forward(hn, fed, chain, self.graphs.cache, topk)[0]

    def _forward(self, bucket: int, width: int, span: bool, k: int) -> torch.Tensor:
        hn, topk = self._extend(bucket, width, span)
        if k == 0:
            return hn
        hn, topk = hn.index_select(0, self.row), topk.index_select(0, self.row)          # [1, H], [1, K]
        drafts = []
        for j in range(k):
            drafts.append(self.model.greedy_ids(hn))         # [1]; a group's ranks read 1/N of the lm_head each
            if j == k - 1:
                break
            hn = self._chain_pass(j, hn, drafts[-1], topk)
        return torch.cat(drafts)

    def _drawn_head(self, bucket: int, width: int, span: bool) -> torch.Tensor:
        """The extend, its drafting row kept for the chain; returns the first draft's logits [1, V]. The selection
        has min(index_topk, width keys) slots, so the chain keeps one buffer (and graphs) per selection width."""
        hn, topk = self._extend(bucket, width, span)
        hn, topk = hn.index_select(0, self.row), topk.index_select(0, self.row)
        sel = self._head_sel[(bucket, width, span)] = topk.shape[1]
        if sel not in self._chain_topk:                    # first met in an eager run (a capture's warm-up)
            self._chain_topk[sel] = torch.empty_like(topk)
        self._chain_h[0].copy_(hn)
        self._chain_topk[sel].copy_(topk)
        self.select(StepShape("dp", 1, self.world_size, None), self.chain_real)     # the drafting row, as the chain's
        return self.model.bucket_logits(hn)

    def _drawn_pass(self, j: int, sel: int) -> torch.Tensor:
        """Chained pass j fed ``_chain_tok`` over the selection of width ``sel``: reads hidden buffer j % 2, writes the
        other (a graph's warm-up run must not overwrite its own input); returns the next draft's logits [1, V]."""
        hn = self._chain_pass(j, self._chain_h[j % 2], self._chain_tok, self._chain_topk[sel])
        self._chain_h[(j + 1) % 2].copy_(hn)
        return self.model.bucket_logits(hn)

    def run(self, bucket: int, width: int, span: bool, k: int) -> torch.Tensor:
        """The staged drafting: k greedy draft ids [k] (k = 0: the extend alone, returns its hidden rows)."""
        self._count((bucket, width, span, k))
        return self._replay((bucket, width, span, k), lambda: self._forward(bucket, width, span, k),
                            f"the MTP drafting (rows {bucket}, width {width}, {k} drafts)")

    def run_drawn(self, bucket: int, width: int, span: bool, k: int,
                  pick: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        """The staged drafting of k ≥ 1 drafts picked between graphs: ``pick(logits [1, V])`` → the next draft [1] on
        the device, fed to the next pass (None: this rank does not draft; its passes run on pad rows, fed 0)."""
        self._count(("drawn", bucket, width, span, k))
        logits = self._replay(("head", bucket, width, span), lambda: self._drawn_head(bucket, width, span),
                              f"the MTP extend for drawn drafts (rows {bucket}, width {width})")
        sel = self._head_sel[(bucket, width, span)]
        for j in range(k):
            draft = pick(logits) if pick is not None else None
            if j == k - 1:
                break
            if draft is not None:
                self._chain_tok.copy_(draft)
            else:
                self._chain_tok.zero_()
            logits = self._replay(("pass", j, sel), lambda j=j: self._drawn_pass(j, sel),
                                  f"MTP draft pass {j} (selection {sel})")

    def _count(self, key: tuple) -> None:
        self.runs[key] = self.runs.get(key, 0) + 1

    def _replay(self, key: tuple, fn: Callable[[], torch.Tensor], what: str) -> torch.Tensor:
        if not self.graphs.capture:
            return fn()
        if key not in self._graphs:
            self._graphs[key] = self.graphs.record(fn, what)
        graph, out = self._graphs[key]
        graph.replay()
        return out

    @property
    def captured(self) -> list[tuple]:
        return sorted(self._graphs, key=str)
