"""Piecewise CUDA graphs of the eager step: prompt chunks and mixed steps that no decode graph holds.

An eager step is host-bound on a GPU: the host launches each layer's ~25 Triton kernels and ~40 torch ops one by
one, 3–4 ms a layer on the H200's host (``bench/results/session21/``), while a rank's share of a 200-token chunk
takes its GPU a fraction of that. Most of a layer is per-row work that does not depend on the requests' contexts; it
is captured per rows bucket (``PIECE_BUCKETS``), layer by layer, in pieces around the parts that do depend on them —
the indexer's selection over each request's keys and the sparse attention over the selection (ragged: eager, on the
real rows) — and, in a worker group, around the MLP phases' AG / RS (the eager step's host-polled comm):

    embed       ids, positions → x, RoPE's cos / sin                                     graph, T rows
    layer l  A  norm(x + m); q / kv projections; KV and indexer keys to their slots;
                absorbed queries; the indexer's queries                                  graph, T rows
             -  the indexer's selection, sparse attention                                eager, real rows
             B  expand, o_proj, norm(x + a) → h; one process: the MLP too → m            graph, T rows
             -  AG(h)                                                                    eager (a group)
             C  the MLP over the step's bucket                                           graph, bucket rows (a group)
             -  RS → m                                                                   eager (a group)
    final       norm(x + m)                                                              eager, real rows

A speculative runner's MTP passes (``mtp_forward``: the extend over the step's rows, the chained draft passes) run the
same way: an input piece (``eh_proj`` of the embedded next tokens and the hidden rows) → x, then the MTP layer's A, B
(and C) pieces, keyed ``"mtp"``.

A piece reads and writes only persistent buffers, and never one it reads (A: x, m → x2; B: x2 → x, m), so a
capture's warm-up run leaves the replay's inputs as they were: a piece is captured at its first use, mid-step. Pad
rows (T > the real rows) write their KV to the runner's pad slot, and their MLP rows are zeroed (one process; a
group's AG zeroes them), so they route as one row and the MoE reads no extra experts for them. Pieces hold no comm:
each rank captures its own. With ``capture`` off (CPU) the same pieces run eagerly — the oracle a replay equals bit
for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from models.cache import Batch, KVCache
from models.glm5 import DecoderLayer, GlmForCausalLM, Rope
from scheduler.shapes import next_pow2

# Rows buckets of a rank's step on pieces: powers of two and the midpoints between them, so a chunk pads by at most
# 1/3. Past 2048 rows a step is bound by its GPU work, not by the host's launches (one H200: a 2000-token chunk among
# 16 decoders took as long eager as on pieces, bench/results/session23/), so larger steps stay eager: the buffers and
# the captured graphs stay bounded whatever ``max_num_batched_tokens`` is.
PIECE_BUCKETS = (8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def piece_rows(n: int) -> int:
    """The bucket of a step of ``n`` rows (ValueError past the largest)."""
    for b in PIECE_BUCKETS:
        if n <= b:
            return b
    raise ValueError(f"{n} rows exceed the largest piece bucket {PIECE_BUCKETS[-1]}")


class PieceGraphs:
    """The eager forward (``GlmForCausalLM.forward``'s) on per-layer pieces, for steps of up to ``max_rows`` rows (at
    most the largest bucket).

    ``pad_slot``: the cache slot pad rows write; ``in_group``: one of ``world_size`` ranks — the MLP phases go through
    the layers' comm (``AG`` / ``RS`` between the pieces) and the MLP piece takes the step's bucket over all ranks, up
    to ``moe_rows`` = ``world_size`` × the next power of two of ``max_rows`` (a dp bucket's, or a span's at most);
    ``record(fn, what)`` → (graph, output): the runner's capture into its one memory pool (the decode graphs');
    None: run every piece eagerly. ``draft_rows`` > 0 (a speculative runner's): the MTP layer's passes run on pieces
    too (``mtp_forward``) — the extend over a step's rows, and chained draft passes of up to that many rows — and
    ``warm`` captures theirs."""

    def __init__(self, model: GlmForCausalLM, cache: KVCache, pad_slot: int, max_rows: int, world_size: int,
                 in_group: bool, device: torch.device, record: Callable | None, draft_rows: int = 0):
        cfg = model.config
        self.model, self.cache, self.in_group, self.record = model, cache, in_group, record
        self.draft_rows = draft_rows
        self.max_rows = piece_rows(min(max_rows, PIECE_BUCKETS[-1]))
        T, H, nh = self.max_rows, cfg.hidden_size, cfg.num_attention_heads
        dtype = cache.dtype

        def buf(*shape, dt=dtype):
            return torch.zeros(*shape, dtype=dt, device=device)

        self._meta = buf(3, T, dt=torch.long)                              # ids, positions, slots
        self.ids, self.positions, self.slots = self._meta.unbind(0)
        self._pad = torch.tensor([[0], [0], [pad_slot]], device=device)
        self.real = buf(T, dt=torch.bool)                                  # rows < the step's real rows
        self.x, self.x2, self.m = buf(T, H), buf(T, H), buf(T, H)          # residual stream; the MLP's output
        self.cos, self.sin = buf(T, cfg.qk_rope_head_dim // 2), buf(T, cfg.qk_rope_head_dim // 2)
        self.q_lat, self.o_lat = buf(T, nh, cfg.kv_lora_rank), buf(T, nh, cfg.kv_lora_rank)
        self.q_rope = buf(T, nh, cfg.qk_rope_head_dim)
        self.index_q = buf(T, cfg.index_n_heads, cfg.index_head_dim)
        self.index_w = buf(T, cfg.index_n_heads, dt=torch.float32)
        self.moe_rows = world_size * next_pow2(T) if in_group else 0
        if in_group:
            self.h, self.moe_in, self.moe_out = buf(T, H), buf(self.moe_rows, H), buf(self.moe_rows, H)
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.runs: dict[int, int] = {}                    # steps served per rows bucket
        self.mtp_runs: dict[int, int] = {}                # MTP passes served per rows bucket

    def fits(self, rows: int) -> bool:
        return rows <= self.max_rows

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, batch: Batch) -> torch.Tensor:
        """input_ids [n] and the step's (ragged) Batch → final-normed hidden [n, H], as ``model.forward``. Writes the
        step's KV into the cache; in a group runs the step's MLP phases (the comm staged as for an eager step)."""
        model, cfg, n = self.model, self.model.config, batch.num_rows
        T = piece_rows(max(n, 1))
        if n:                                  # (a group's rank without rows runs only the MLP pieces)
            self.runs[T] = self.runs.get(T, 0) + 1
            self._stage(ids, batch, T)
            self._run(("embed", T), self._embed, T)
        topk = None
        for i, layer in enumerate(model.target_layers):
            topk = self._layer(layer, i, batch, T, i == 0, None if cfg.has_indexer(i) else topk)
        return model.model.norm.add_forward(self.m[:n], self.x[:n])[0]

    @torch.inference_mode()
    def mtp_forward(self, hidden: torch.Tensor, next_ids: torch.Tensor, batch: Batch,
                    topk: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``model.mtp_forward`` on pieces (the MTP layer's own, keyed ``"mtp"``): the extend over a step's rows, or a
        chained draft pass (``topk`` given: the first pass's selection, the MTP indexer only caches its keys)."""
        mtp, n = self.model.mtp_layer, batch.num_rows
        T = piece_rows(max(n, 1))
        if n:
            self.mtp_runs[T] = self.mtp_runs.get(T, 0) + 1
            self._stage(next_ids, batch, T)
            self.m[:n].copy_(hidden)                     # the input piece reads it there (the first layer's A does not)
            self._run(("mtp", T), self._mtp_input, T)
        topk = self._layer(mtp, "mtp", batch, T, True, topk)
        return mtp.shared_head.norm.add_forward(self.m[:n], self.x[:n])[0], topk

    def _stage(self, ids: torch.Tensor, batch: Batch, T: int) -> None:
        """The step's rows into the pieces' inputs (pad rows: token 0 at position 0, writing the pad slot)."""
        n = batch.num_rows
        self._meta[:, n:T].copy_(self._pad.expand(3, T - n))
        self.ids[:n].copy_(ids)
        self.positions[:n].copy_(batch.positions)
        self.slots[:n].copy_(batch.slot_mapping)
        self.real[:T].fill_(False)
        self.real[:n].fill_(True)

    def _layer(self, layer: DecoderLayer, key: int | str, batch: Batch, T: int, first: bool,
               carried: torch.Tensor | None) -> torch.Tensor | None:
        """One decoder layer over x (+ m unless ``first``) → x, m; returns its selection (``carried`` when given: the
        layer reuses it, its indexer, if any, only caches keys). A group's rank without rows runs only the MLP."""
        n, attn, select = batch.num_rows, layer.self_attn, carried is None
        topk = carried
        if n:
            self._run(("a", key, T, select), self._prepare, layer, T, first, select)
            if select:
                topk = attn.indexer.select(self.index_q[:n], self.index_w[:n], batch, self.cache.index_k[layer.layer])
            self.o_lat[:n].copy_(attn.attend(self.q_lat[:n], self.q_rope[:n], self.cache.kv[layer.layer], topk, batch))
            self._run(("b", key, T), self._finish, layer, T)
        if self.in_group:
            rows = layer.comm.all_gather(self.h[:n])             # [the step's bucket, H], pads zero
            self.moe_in[:rows.shape[0]].copy_(rows)
            self._run(("c", key, rows.shape[0]), self._mlp, layer, rows.shape[0])
            self.m[:n].copy_(layer.comm.reduce_scatter(self.moe_out[:rows.shape[0]]))
        return topk

    @torch.inference_mode()
    def warm(self) -> int:
        """Capture every piece of every bucket up to ``max_rows`` (and a group's MLP piece at every power of two up to
        ``moe_rows``: its dp and span buckets) on pad rows, which write only the pad slot, so that no step captures
        while serving. Returns the graphs captured (0 where pieces run eagerly)."""
        if self.record is None:
            return 0
        before, cfg = len(self._graphs), self.model.config
        layers = list(enumerate(self.model.target_layers))
        if self.draft_rows:
            layers.append(("mtp", self.model.mtp_layer))
        for T in (b for b in PIECE_BUCKETS if b <= self.max_rows):
            self._meta[:, :T].copy_(self._pad.expand(3, T))
            self.real[:T].fill_(False)
            self._run(("embed", T), self._embed, T)
            if self.draft_rows:
                self._run(("mtp", T), self._mtp_input, T)
            for key, layer in layers:
                selects = [cfg.has_indexer(layer.layer)]
                if key == "mtp" and cfg.index_share_for_mtp_iteration and T <= piece_rows(self.draft_rows):
                    selects.append(False)                  # the chained draft passes reuse the extend's selection
                for select in selects:
                    self._run(("a", key, T, select), self._prepare, layer, T, key in (0, "mtp"), select)
                self._run(("b", key, T), self._finish, layer, T)
        rows = 1
        while self.in_group and rows <= self.moe_rows:
            for key, layer in layers:
                self._run(("c", key, rows), self._mlp, layer, rows)
            rows *= 2
        return len(self._graphs) - before

    def _run(self, key: tuple, piece: Callable[..., None], *args) -> None:
        """``piece(*args)``: its graph replayed (captured at first use), or run eagerly."""
        if self.record is None:
            piece(*args)
            return
        if key not in self._graphs:
            self._graphs[key] = self.record(lambda: piece(*args), f"the step's piece {key}")[0]
        self._graphs[key].replay()

    def _batch(self, T: int) -> Batch:
        return Batch(self.positions[:T], self.slots[:T], [], [])

    def _embed(self, T: int) -> None:
        self.x[:T].copy_(self.model.model.embed_tokens(self.ids[:T]))
        self._rope(T)

    def _mtp_input(self, T: int) -> None:
        """The MTP layer's input: ``eh_proj(cat(enorm(embed(next ids)), hnorm(hidden in m)))`` → x."""
        mtp = self.model.mtp_layer
        e = self.model.model.embed_tokens(self.ids[:T])
        self.x[:T].copy_(mtp.eh_proj(torch.cat([mtp.enorm(e), mtp.hnorm(self.m[:T])], dim=-1)))
        self._rope(T)

    def _rope(self, T: int) -> None:
        cfg = self.model.config
        rope = Rope.at(self.positions[:T], cfg, self.x.dtype)
        self.cos[:T].copy_(rope.cos)
        self.sin[:T].copy_(rope.sin)

    def _prepare(self, layer: DecoderLayer, T: int, first: bool, select: bool) -> None:
        """Piece A: the layer's input norm and everything of the attention before the selection (the indexer's
        queries when ``select``)."""
        x = self.x[:T]
        h, x = (layer.input_layernorm(x), x) if first else layer.input_layernorm.add_forward(self.m[:T], x)
        self.x2[:T].copy_(x)
        q_lat, q_rope, index_q = layer.self_attn.prepare(h, Rope(self.cos[:T], self.sin[:T]), self._batch(T),
                                                         self.cache, layer.layer, select)
        self.q_lat[:T].copy_(q_lat)
        self.q_rope[:T].copy_(q_rope)
        if index_q is not None:
            self.index_q[:T].copy_(index_q[0])
            self.index_w[:T].copy_(index_q[1])

    def _finish(self, layer: DecoderLayer, T: int) -> None:
        """Piece B: the attention's output, the post-attention norm; one process: the MLP (pad rows zeroed)."""
        h, x = layer.post_attention_layernorm.add_forward(layer.self_attn.finish(self.o_lat[:T]), self.x2[:T])
        self.x[:T].copy_(x)
        if self.in_group:
            self.h[:T].copy_(h)
        else:
            self.m[:T].copy_(layer.mlp(torch.where(self.real[:T, None], h, h.new_zeros(()))))

    def _mlp(self, layer: DecoderLayer, rows: int) -> None:
        """Piece C (a group's): the MLP over the step's bucket of every rank's rows."""
        self.moe_out[:rows].copy_(layer.mlp(self.moe_in[:rows]))

    @property
    def captured(self) -> list[tuple]:
        return sorted(self._graphs, key=str)
