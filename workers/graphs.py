"""Static-shape decode / verify forward, captured as CUDA graphs per (row bucket, context width).

A decode or verify step — every scheduled request feeds its last token plus its drafts, ≤ 8 rows in
all — runs on persistent buffers: token ids, positions, KV slots and one block table per row are
copied in, rows are padded to the bucket (1, 2, 4, 8), and the forward captured for that bucket is
replayed. Pad rows write their KV to a slot no request owns and their outputs are dropped. The width
(block-table columns) is the smallest power of two ≥ the longest request's block count, so the
indexer scores a bounded range; each (bucket, width) is captured on first use into one shared pool.

On CPU (or with ``capture=False``) the same static-shape forward runs eagerly: it is the oracle a
replay must equal bit for bit, and on CPU it runs the padded path in CI.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from models.cache import Batch, KVCache
from models.glm5 import GlmForCausalLM
from scheduler.scheduler import ScheduledSeq
from scheduler.shapes import next_pow2

BUCKETS = (1, 2, 4, 8)


class DecodeGraphs:
    """Graphs of ``model.forward`` (final-normed hidden rows) for decode / verify steps.

    ``pad_slot``: a cache slot reserved for pad rows; ``max_blocks``: block-table columns at most (the
    longest context served, in blocks); ``capture``: record CUDA graphs (needs a CUDA device and
    graph-capturable kernels, i.e. ``kernels: auto``), else run the static forward eagerly.
    """

    def __init__(self, model: GlmForCausalLM, cache: KVCache, block_size: int, pad_slot: int, max_blocks: int,
                 device: torch.device, capture: bool):
        self.model, self.cache, self.block_size = model, cache, block_size
        self.pad_slot, self.max_blocks = pad_slot, max_blocks
        self.capture = capture and device.type == "cuda"
        rows = BUCKETS[-1]
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slots = torch.full((rows,), pad_slot, dtype=torch.long, device=device)
        self.block_table = torch.zeros(rows, max_blocks, dtype=torch.int32, device=device)
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None
        self.runs: dict[tuple[int, int], int] = {}      # steps served per (bucket, width)

    def fits(self, seqs: Sequence[ScheduledSeq]) -> bool:
        """Every request feeds 1 + num_drafts rows and samples; ≤ 8 rows; contexts within ``max_blocks``."""
        rows = sum(len(s.token_ids) for s in seqs)
        return (0 < rows <= BUCKETS[-1]
                and all(s.sample and len(s.token_ids) == 1 + s.num_drafts for s in seqs)
                and max(len(s.block_ids) for s in seqs) <= self.max_blocks)

    def shape(self, seqs: Sequence[ScheduledSeq]) -> tuple[int, int]:
        """(row bucket, block-table width) of a step that ``fits``."""
        rows = sum(len(s.token_ids) for s in seqs)
        bucket = next(b for b in BUCKETS if b >= rows)
        return bucket, min(self.max_blocks, next_pow2(max(len(s.block_ids) for s in seqs)))

    def stage(self, seqs: Sequence[ScheduledSeq]) -> tuple[Batch, int, int]:
        """Copy the step into the static buffers (pad rows reset). Returns (the real rows' Batch, bucket,
        width); the Batch views the static buffers, so it serves the eager MTP pass after the forward."""
        bucket, width = self.shape(seqs)
        bs = self.block_size
        ids, positions, slots = [], [], []
        table = torch.zeros(bucket, width, dtype=torch.int32)
        seq_rows = []
        for s in seqs:
            seq_rows.append((len(ids), len(s.token_ids)))
            for j, t in enumerate(s.token_ids):
                p = s.start_pos + j
                table[len(ids), :len(s.block_ids)] = torch.tensor(s.block_ids, dtype=torch.int32)
                ids.append(t)
                positions.append(p)
                slots.append(s.block_ids[p // bs] * bs + p % bs)
        pad = bucket - len(ids)
        host = torch.tensor([ids + [0] * pad, positions + [0] * pad, slots + [self.pad_slot] * pad])
        n = len(ids)
        dev = self.ids.device
        host = host.pin_memory() if dev.type == "cuda" else host
        staged = host.to(dev, non_blocking=True)
        self.ids[:bucket].copy_(staged[0])
        self.positions[:bucket].copy_(staged[1])
        self.slots[:bucket].copy_(staged[2])
        self.block_table[:bucket, :width].copy_(table.to(dev, non_blocking=True))
        batch = Batch(self.positions[:n], self.slots[:n], seq_rows, [], self.block_table[:n, :width], bs)
        return batch, bucket, width

    def _forward(self, bucket: int, width: int) -> torch.Tensor:
        batch = Batch(self.positions[:bucket], self.slots[:bucket], [], [], self.block_table[:bucket, :width],
                      self.block_size)
        return self.model(self.ids[:bucket], batch, self.cache)

    def run(self, bucket: int, width: int) -> torch.Tensor:
        """The staged step's hidden rows [bucket, H] (pad rows included): a graph replay, or eagerly."""
        key = (bucket, width)
        self.runs[key] = self.runs.get(key, 0) + 1
        if not self.capture:
            return self._forward(bucket, width)
        if key not in self._graphs:
            self._graphs[key] = self._record(bucket, width)
        graph, out = self._graphs[key]
        graph.replay()
        return out

    def eager(self, bucket: int, width: int) -> torch.Tensor:
        """The same static forward without the graph (the replay's oracle)."""
        return self._forward(bucket, width)

    def _record(self, bucket: int, width: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # warm up on a side stream (Triton compiles, cuBLAS workspaces) before recording; the step's inputs
        # are staged, so the warm-up writes exactly the KV the replay writes
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward(bucket, width)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                out = self._forward(bucket, width)
        except Exception as e:
            raise RuntimeError(f"CUDA graph capture of the decode step (rows {bucket}, width {width} blocks) "
                               f"failed: {e}; kernels must be 'auto' on CUDA, or set cuda_graphs: false") from e
        self._pool = graph.pool()
        return graph, out

    @property
    def captured(self) -> list[tuple[int, int]]:
        return sorted(self._graphs)
