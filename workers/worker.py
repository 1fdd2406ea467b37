"""One worker rank: its model shard, KV cache, runner and MLP-phase communicator.

Plain Python (no Ray): ``cluster/workers.py`` wraps it in a Ray actor, benchmarks can run it in
plain processes. Attention is data-parallel (this rank's requests only); each layer's MLP gathers
the step's rows from every rank (AG), computes this rank's expert slices, and reduce-scatters the
partial sums back to the rows' owners (RS) — through ``StepComm``, staged once per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glmkernels import ops
from scheduler.shapes import GRAPH_BUCKETS, StepShape, graph_rows
from workers.comm import Comm, Rendezvous, make_comm, ordered_sum
from workers.rowmap import Dp, RowMap, Span
from workers.runner import ModelRunner, StepResult, WorkerStep


class StepComm:
    """The model's view of AG/RS for the current step: pads this rank's rows into the bucket
    (pad rows are fresh zeros, so nothing stale or NaN enters the MoE) and trims them after RS.

    A *static* step (a CUDA graph's) has fixed shapes on every rank: each rank passes the whole bucket
    of R rows, pads included, whose first ``num_local`` rows are real; pads are zeroed on the device.
    The span owner and the real-row mask live in device memory written before the replay, so one captured
    graph serves any owner: AG gathers [N, R, H] and selects the owner's stripe with a device index; a
    span's RS gathers every rank's partials and sums them in source order (``ordered_sum``, as the
    ragged span RS does, so the two agree bit for bit).
    """

    def __init__(self, comm: Comm, rank: int, world_size: int, device: torch.device, split_head: bool = True):
        self.comm, self.rank, self.world_size = comm, rank, world_size
        self.split_head = split_head      # the lm_head split by vocabulary (``argmax_logits``, ``bucket_logits``)
        self.rowmap: RowMap | None = None
        self.owner = 0
        self.num_local = 0
        self.static = False
        self._owner_dev = torch.zeros(1, dtype=torch.long, device=device)
        self._real_dev = torch.zeros(GRAPH_BUCKETS[-1], dtype=torch.bool, device=device)   # static rows < num_local
        self._mask = self._real_dev          # the row mask static phases read (``select`` may point elsewhere)

    def stage(self, shape: StepShape, num_local: int, static: bool = False) -> None:
        """Set this step's row map and owner (the span owner is a per-step value, never baked in)."""
        self.rowmap, self.owner = self._rowmap(shape), shape.owner if shape.is_span else 0
        assert not shape.is_span or num_local == 0 or self.rank == shape.owner, "only the span owner has rows"
        self.num_local, self.static = num_local, static
        self._mask = self._real_dev
        if static:
            self._owner_dev.fill_(self.owner)
            self._real_dev.fill_(False)
            self._real_dev[:num_local].fill_(True)

    def select(self, shape: StepShape, real: torch.Tensor | None = None) -> None:
        """Static phases over ``shape`` with the row mask ``real`` (None: the one ``stage`` wrote), touching no
        device memory — safe inside a CUDA graph capture (the MTP drafting graph switches shapes this way; a
        span's owner is still the device scalar ``stage`` wrote)."""
        self.rowmap = self._rowmap(shape)
        self.static, self._mask = True, self._real_dev if real is None else real

    def _rowmap(self, shape: StepShape) -> RowMap:
        return Span(self.world_size, shape.total_rows) if shape.is_span else Dp(self.world_size, shape.rows_per_rank)

    def _bucket_rows(self) -> int:
        if isinstance(self.rowmap, Span):
            return self.rowmap.num_rows if self.rank == self.owner else 0
        return self.rowmap.rows_per_rank

    def all_gather(self, h: torch.Tensor) -> torch.Tensor:
        """h: [num_local, H] (static: [R, H]) → the step's bucket [total_rows, H], identical on every rank."""
        if self.static:
            R, H = h.shape
            local = torch.where(self._mask[:R, None], h, h.new_zeros(()))           # pads → exact zeros
            gathered = self.comm.all_gather_static(local)                          # [N, R, H]
            if isinstance(self.rowmap, Span):
                return gathered.index_select(0, self._owner_dev).view(R, H)
            return gathered.view(self.world_size * R, H)
        assert h.shape[0] == self.num_local
        local = h.new_zeros(self._bucket_rows(), h.shape[1])
        local[: self.num_local] = h
        return self.comm.all_gather(local, self.rowmap, self.owner)

    def reduce_scatter(self, partial: torch.Tensor) -> torch.Tensor:
        """partial: [total_rows, H] this rank's partial sums → the summed rows it owns [num_local, H]
        (static: [R, H], pads included; a span's non-owners get the owner's sums and ignore them)."""
        if self.static:
            if isinstance(self.rowmap, Span):
                return ordered_sum(self.comm.all_gather_static(partial).unbind(0))
            return self.comm.reduce_scatter_static(partial)
        return self.comm.reduce_scatter(partial, self.rowmap, self.owner)[: self.num_local]

    def argmax_logits(self, hidden: torch.Tensor, lm_head) -> torch.Tensor:
        """hidden: [R, H] this rank's rows (every rank passes R, pads included) → the argmax of each row's logits [R],
        as ``lm_head(hidden).argmax(-1)``, with the lm_head split by vocabulary: every rank's rows are gathered (AG),
        each rank scores them against its 1/N of the vocabulary, and every rank's (max, index) per row is gathered
        (a second AG of the fp32 pairs as words: indices below 2^24 are exact) — a rank reads 1/N of the lm_head (a
        greedy MTP draft's weight bytes, ~1.9 GB at GLM-5 widths) for two small phases. Ties go to the lowest index,
        as argmax's. Static phases: a CUDA graph can capture it."""
        N, (R, H) = self.world_size, hidden.shape
        if N == 1 or not self.split_head:
            return lm_head(hidden).argmax(dim=-1)
        rows = self.comm.all_gather_static(hidden).view(N * R, H)
        best = slice_best(rows, lm_head, *vocab_slice(lm_head, self.rank, N))            # [N·R, 2]
        got = self.comm.all_gather_static(_words(best, H)).view(N, -1).view(torch.float32)
        return first_max(got[:, : 2 * N * R].reshape(N, N, R, 2)[:, self.rank])        # this rank's rows

    def bucket_logits(self, hidden: torch.Tensor, lm_head) -> torch.Tensor:
        """hidden: [R, H] this rank's static bucket (pads included) → fp32 logits [R, V], as ``lm_head(hidden).float()``
        on this rank's real rows (a span split: the owner's rows on every rank), with the lm_head split by vocabulary: the
        step's rows are gathered as the MoE gathers them (pads zeroed; a span: the owner's), each rank computes its
        1/N of their logits, and AG phases (1..4) bring every slice of this rank's rows (words of the packed slices) — a
        rank reads 1/N of the lm_head (~1.9 GB whole at GLM-5 widths). Static phases (a CUDA graph can capture it),
        so every rank calls it with the same R; where the slices would take too many phases (``split_fits``), or on
        one rank, the whole lm_head. Bit for bit ``lm_head``'s where its product reduces each logit alike."""
        N, (R, H) = self.world_size, hidden.shape
        M = R if isinstance(self.rowmap, Span) else N * R                        # the rows every rank scores
        if not self.split_fits(M, hidden.dtype, lm_head):
            return lm_head(hidden).float()
        assert self.static, "bucket_logits runs on a graph step's static phases"
        rows = self.all_gather(hidden)                                            # [M, H]
        chunk, V = vocab_chunk(lm_head, N), lm_head.out_features
        lo, hi = vocab_slice(lm_head, self.rank, N)
        part = slice_logits(rows, lm_head, lo, hi) if hi > lo else rows.new_zeros(M, 0)   # [M, ≤ chunk]
        words = _words(torch.nn.functional.pad(part, (0, chunk - part.shape[1])), H)            # [cols, H] int32
        depth = self._phase_rows()
        got = torch.cat([self.comm.all_gather_static(words[i:i + depth]) for i in range(0, words.shape[0], depth)],
                        dim=1)                                                              # [N, cols, H]
        got = got.view(N, -1).view(hidden.dtype)[:, : M * chunk].reshape(N, M, chunk)
        if not isinstance(self.rowmap, Span):
            got = got[:, self.rank * R:(self.rank + 1) * R]                     # [src, R, chunk]: this rank's rows
        return got.permute(1, 0, 2).reshape(R, N * chunk)[:, :V].float()

    def split_fits(self, M: int, dtype: torch.dtype, lm_head) -> bool:
        """Whether M rows' logit slices move in at most ``MAX_SPLIT_PHASES`` static phases of ``_phase_rows`` rows of H
        4-byte words a rank. Past that a rank would receive more than ~4 × 786 KB × N of slices (N = 8: a dp step past
        8 rows a rank), which over NVLink may cost what the split saves. The same answer on every rank (shapes alone)."""
        N, H = self.world_size, lm_head.in_features
        words = -(-M * vocab_chunk(lm_head, N) * dtype.itemsize // 4)
        return N > 1 and self.split_head and -(-words // H) <= MAX_SPLIT_PHASES * self._phase_rows()

    def _phase_rows(self) -> int:
        """Rows of H words one static phase moves a rank: the device phases' depth (``graph_rows``), within the comm's
        row bound."""
        return max(1, min(graph_rows(self.world_size), getattr(self.comm, "max_rows", 1 << 30) // self.world_size))


MAX_SPLIT_PHASES = 4        # AG phases a split lm_head's slices may take (``StepComm.split_fits``)


def _words(x: torch.Tensor, width: int) -> torch.Tensor:
    """x (any dtype of ≤ 4 bytes) as int32 words in rows of ``width`` (zero-padded): a phase copies the bits."""
    flat = x.reshape(-1).view(torch.uint8)
    n = -(-flat.numel() // (4 * width)) * 4 * width
    return torch.nn.functional.pad(flat, (0, n - flat.numel())).view(torch.int32).view(-1, width)


def slice_logits(rows: torch.Tensor, lm_head, lo: int, hi: int) -> torch.Tensor:
    """rows [M, H] against the lm_head's rows [lo, hi) → [M, hi - lo] logits in the rows' dtype."""
    scale = lm_head.weight_scale_inv
    return ops.linear(rows, lm_head.weight[lo:hi], None if scale is None else scale[lo // 128: -(-hi // 128)])


def slice_best(rows: torch.Tensor, lm_head, lo: int, hi: int) -> torch.Tensor:
    """rows [M, H] against the lm_head's rows [lo, hi) → [M, 2] fp32: each row's max logit and its (first) index."""
    if hi == lo:                                                     # a vocabulary of fewer than N slices
        best = rows.new_zeros(rows.shape[0], 2, dtype=torch.float32)
        best[:, 0] = -torch.inf
        return best
    logits = slice_logits(rows, lm_head, lo, hi)
    idx = logits.argmax(dim=-1, keepdim=True)
    return torch.cat([logits.gather(1, idx).float(), (idx + lo).float()], dim=1)


def first_max(cand: torch.Tensor) -> torch.Tensor:
    """cand [src, M, (max, index)] from the slices in vocabulary order → [M] ids: the first source holding the max
    (ties go to the lowest index, as ``argmax``'s)."""
    src = cand[..., 0].argmax(dim=0, keepdim=True)
    return cand[..., 1].gather(0, src).squeeze(0).long()


def vocab_chunk(lm_head, world_size: int) -> int:
    """Rows of the lm_head a rank holds: ⌈V/N⌉, whole 128-row scale blocks when FP8."""
    chunk = -(-lm_head.out_features // world_size)
    return -(-chunk // 128) * 128 if lm_head.weight_scale_inv is not None else chunk


def vocab_slice(lm_head, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s rows [lo, hi) of the lm_head: ``vocab_chunk`` each, the last fewer (or none)."""
    V, chunk = lm_head.out_features, vocab_chunk(lm_head, world_size)
    return min(V, rank * chunk), min(V, (rank + 1) * chunk)


@dataclass(frozen=True)
class WorkerSpec:
    """What a rank needs to build itself (plain data: crosses process boundaries)."""

    model: str
    rank: int
    world_size: int
    moe: str = "tp"
    comm: str = "torch"
    device: str = "cpu"
    dtype: str = "float32"
    kernels: str = "auto"
    kernel_overrides: tuple[tuple[str, str], ...] = ()    # (op, backend): ``EngineConfig.kernel_overrides``
    num_blocks: int = 2048      # 0: as many as memory_fraction leaves room for (``workers/memory.py``)
    memory_fraction: float = 0.0  # ``gpu_memory_utilization``, where it sizes the pool
    block_size: int = 16
    host_blocks: int = 0        # host memory for cached prefixes evicted from the device (the prefix cache's tier 2)
    kv_fp8: bool = False        # MLA's cache rows packed in FP8 (``models/cache.py``)
    max_rows: int = 4096        # bound on any step's bucket (total rows)
    timeout_s: float = 30.0     # bound on every comm phase
    setup_timeout_s: float = 300.0
    speculative: bool = False   # fill the MTP cache and propose drafts
    graphs: str = "off"         # decode/verify steps: capture (CUDA graphs) | eager (static shapes) | off
    pieces: bool = False        # with graphs on, the other steps run on per-layer pieces (``workers/pieces.py``)
    lm_head_split: bool = True  # graph steps and drafting graphs split the lm_head by vocabulary (``StepComm``)
    load_format: str = "auto"   # auto: the checkpoint | dummy: random weights (benchmarks)
    imports: bool = False       # a decode replica of a disaggregated app: its KV imports' buffers made at setup
                                # (``ImportWriter.reserve``; pinning them at a first import took 30-120 ms)


class Worker:
    """Builds this rank's shard from the checkpoint and runs steps; every rank runs every step."""

    def __init__(self, spec: WorkerSpec, rendezvous: Rendezvous):
        from glmkernels import ops
        from models.glm5 import MoeShard
        from models.loader import load_model

        self.spec = spec
        device = torch.device(spec.device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.enter_thread()
        dtype = getattr(torch, spec.dtype)
        ops.configure(spec.kernels, device.type, dict(spec.kernel_overrides))
        try:
            model = load_model(spec.model, dtype=dtype, device=device,
                               shard=MoeShard(spec.rank, spec.world_size, spec.moe), progress=False,
                               load_format=spec.load_format, mtp=spec.speculative)
        except BaseException as e:
            rendezvous.fail(spec.rank, f"{type(e).__name__}: {e}")
            raise
        # ranks load at different speeds; meet before the comm setup, whose waits are short
        rendezvous.wait_all_ready(spec.rank, spec.setup_timeout_s, tag="loaded")
        self.comm = make_comm(spec.comm, spec.rank, spec.world_size, rendezvous=rendezvous, device=device,
                              max_rows=spec.max_rows, hidden=model.config.hidden_size, dtype=dtype,
                              timeout_s=spec.timeout_s)
        self.step_comm = StepComm(self.comm, spec.rank, spec.world_size, device, spec.lm_head_split)
        if spec.world_size > 1:
            model.set_comm(self.step_comm)
        self.num_blocks = spec.num_blocks or self._fit_blocks(model.config, dtype, rendezvous)
        self.runner = ModelRunner(model, self.num_blocks, spec.block_size, dtype, device,
                                  in_group=spec.world_size > 1, world_size=spec.world_size, stage=self._stage,
                                  speculative=spec.speculative, graphs=self._graphs_mode(), select=self._select,
                                  pieces=(spec.max_rows // spec.world_size, spec.graphs == "capture")
                                  if spec.pieces else None, host_blocks=spec.host_blocks, kv_fp8=spec.kv_fp8)
        if spec.imports:
            self.runner.imports.reserve()

    def _fit_blocks(self, config, dtype: torch.dtype, rendezvous: Rendezvous) -> int:
        """The group's KV blocks sized to memory: weights and comm buffers are in place on every rank (the comm
        setup met them all), the runner's cache not yet."""
        from workers.memory import fit_kv_blocks

        spec = self.spec
        try:
            return fit_kv_blocks(config, spec.block_size, dtype, spec.kv_fp8, self.device, spec.memory_fraction,
                                 ModelRunner.extra_slots(), spec.host_blocks * spec.block_size, rendezvous, spec.rank,
                                 spec.setup_timeout_s)
        except BaseException as e:
            rendezvous.fail(spec.rank, f"{type(e).__name__}: {e}")
            raise

    def enter_thread(self) -> None:
        """Set this thread's torch state for the rank — the current CUDA device is per host thread, and so is
        OpenMP's thread count under ``torch.set_num_threads``: a socket-served Ray actor runs its steps on a
        thread other than the one that built the worker."""
        if self.device.type == "cpu":
            torch.set_num_threads(1)
        else:
            torch.cuda.set_device(self.device)       # Triton launches and streams follow the current device

    def _graphs_mode(self) -> str:
        """``capture`` needs a capturable comm in a group (ipc's device phases); else the graph
        steps run the same static path eagerly."""
        if self.spec.graphs == "capture" and self.spec.world_size > 1 and not self.comm.capturable:
            return "eager"
        return self.spec.graphs

    def _stage(self, shape: StepShape | None, num_rows: int, static: bool = False) -> None:
        if self.spec.world_size > 1:
            assert shape is not None, "a multi-rank step needs its bucket shape"
            self.step_comm.stage(shape, num_rows, static)

    def _select(self, shape: StepShape, real: torch.Tensor | None = None) -> None:
        if self.spec.world_size > 1:
            self.step_comm.select(shape, real)

    def execute(self, step: WorkerStep) -> StepResult:
        result = self.runner.execute(step)
        if step.graph is not None:
            self.comm.check()        # a device-side wait that expired inside the step fails it here
        return result

    @torch.inference_mode()
    def run_mlp(self, layer: int, h: torch.Tensor, shape: StepShape) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's MLP phases alone (AG → experts → RS) on this rank's rows h [n, H], for the
        span-vs-dp gate. Returns (the gathered bucket, this rank's summed output rows)."""
        self.step_comm.stage(shape, h.shape[0])
        mlp = self.runner.model.model.layers[layer].mlp
        rows = self.step_comm.all_gather(h.to(self.runner.cache.dtype))
        return rows, self.step_comm.reduce_scatter(mlp(rows))

    def poison_comm_buffers(self) -> None:
        """Diagnostic: NaN-fill the comm's persistent buffers where it has any (ipc)."""
        if hasattr(self.comm, "poison"):
            self.comm.poison()

    def reset(self) -> None:
        self.runner.reset()

    def close(self) -> None:
        self.comm.close()
