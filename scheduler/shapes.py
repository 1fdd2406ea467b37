"""Step shapes for the MoE bucket (DESIGN §2): `dp` buckets, or one request's `span` over all ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from scheduler.scheduler import StepPlan

DP = "dp"
SPAN = "span"
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)   # rows per rank of the decode / verify steps captured as CUDA graphs
# The most rows a graph step's MoE may take — a dp step's MoE takes every rank's rows (ranks × bucket); more go to
# prefill launches that a graph cannot capture (glmkernels/triton_moe.py: FUSED_MAX_ROWS ≥ this)
GRAPH_MOE_ROWS = 256              # 8 ranks × 32: an 8-rank replica at max_num_seqs 256 stays on graphs
# Block-table widths captured per octave of context. Only the indexer's work grows with the width (keys past a row's
# position score -inf and cost little: bench/graph_width.py), while every width is a graph per bucket to capture.
WIDTHS_PER_OCTAVE = 2


@dataclass(frozen=True)
class StepShape:
    """Rows of one step's MoE bucket and where they come from.

    dp:   row slot i*rows_per_rank + j belongs to rank i's own requests; rows_per_rank is a power of two.
    span: all `total_rows` rows belong to the single request on `owner`: the smallest power of two
          >= max(num_ranks, rows wanted) — 1 committed token + up to N-1 drafts fill N rows, and a solo
          prefill chunk rides in one span instead of N dp stripes of which N-1 would be padding.
    """

    kind: str
    rows_per_rank: int
    total_rows: int
    owner: int | None

    def __post_init__(self) -> None:
        assert self.kind in (DP, SPAN), self.kind
        assert (self.owner is None) == (self.kind == DP), (self.kind, self.owner)
        assert self.rows_per_rank >= 1 and self.total_rows >= self.rows_per_rank

    @property
    def is_span(self) -> bool:
        return self.kind == SPAN


def next_pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1)."""
    return 1 << max(n - 1, 0).bit_length()


def plan_step_shapes(
    num_ranks: int, rows_wanted: dict[int, int], num_active: int, span_enabled: bool = True
) -> StepShape:
    """Choose this step's bucket shape.

    rows_wanted: rank -> rows its requests want this step; num_active: requests active fleet-wide.
    Span iff enabled, more than one rank, exactly one active request, and it wants more than one
    row; the span bucket holds all of that request's rows. Otherwise dp with the
    smallest power-of-two bucket that holds the busiest rank's rows.
    """
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    if num_active < 0:
        raise ValueError(f"num_active must be >= 0, got {num_active}")
    for rank, rows in rows_wanted.items():
        if not 0 <= rank < num_ranks:
            raise ValueError(f"rows_wanted has rank {rank} outside [0, num_ranks={num_ranks})")
        if rows < 0:
            raise ValueError(f"rows_wanted[{rank}] must be >= 0, got {rows}")
    if span_enabled and num_ranks > 1 and num_active == 1:
        owners = [rank for rank, rows in rows_wanted.items() if rows > 0]
        if len(owners) == 1 and rows_wanted[owners[0]] > 1:
            rows = next_pow2(max(num_ranks, rows_wanted[owners[0]]))
            return StepShape(SPAN, rows_per_rank=rows, total_rows=rows, owner=owners[0])
    bucket = next_pow2(max(rows_wanted.values(), default=0))
    return StepShape(DP, rows_per_rank=bucket, total_rows=num_ranks * bucket, owner=None)


def graph_width(blocks: int) -> int:
    """Block-table columns of a graph step whose longest table has ``blocks``: rounded up within its octave to one
    of ``WIDTHS_PER_OCTAVE`` widths (captured graphs), at most 100 / WIDTHS_PER_OCTAVE % padding."""
    granule = max(1, next_pow2(blocks) // (2 * WIDTHS_PER_OCTAVE))
    return -(-blocks // granule) * granule


def graph_widths(max_blocks: int) -> list[int]:
    """Every ``graph_width`` of a block table of 1 … ``max_blocks`` blocks (the widths a start-up warm-up captures)."""
    widths, blocks = [], 1
    while blocks <= max_blocks:
        widths.append(graph_width(blocks))
        blocks = widths[-1] + 1
    return widths


def graph_rows(num_ranks: int) -> int:
    """The most rows a rank's graph step holds: the largest bucket whose dp step's MoE (ranks × bucket) stays within
    ``GRAPH_MOE_ROWS`` — a span of as many rows too (the device comm's regions are this deep)."""
    return max(b for b in GRAPH_BUCKETS if b * num_ranks <= GRAPH_MOE_ROWS)


def graph_shape(bucket: int, span: bool, num_ranks: int) -> StepShape:
    """The MoE bucket of a graph step of ``bucket`` rows per rank (a span's owner is a device value, so 0 here)."""
    return StepShape(SPAN, bucket, bucket, 0) if span else StepShape(DP, bucket, num_ranks * bucket, None)


def place_request(kv_load: dict[int, int]) -> int:
    """Rank with the least KV load (ties -> lowest rank). (A request that then waits there for a slot or for KV blocks
    while another rank has them moves before the step: ``Engine._rebalance``.)"""
    if not kv_load:
        raise ValueError("kv_load must name at least one rank")
    return min(kv_load, key=lambda rank: (kv_load[rank], rank))


def rank_seqs(max_num_seqs: int, num_ranks: int) -> list[int]:
    """Each rank's share of a replica's ``max_num_seqs`` running requests — even, the first ranks one more when it
    does not divide, at least one a rank (so ``num_ranks`` when ``max_num_seqs`` is smaller)."""
    return [max(1, max_num_seqs // num_ranks + (r < max_num_seqs % num_ranks)) for r in range(num_ranks)]


def graph_key(shape: StepShape, plans: Sequence[StepPlan], chunk_rows: int = 0) -> tuple[int, int, bool] | None:
    """(rows bucket, block-table width, span) when the step is graph-shaped on every rank — only decode /
    verify rows (each request feeds 1 + num_drafts and samples), or prompt chunks too in a dp step of at most
    ``chunk_rows`` a rank that drafts nothing (a chunk's rows are a verify's: consecutive positions of one request,
    its block table on each), at most ``graph_rows`` a rank (the largest bucket
    whose dp step's MoE, which takes every rank's rows, stays within ``GRAPH_MOE_ROWS``) — else None. Width:
    ``graph_width`` of the step's longest block table. Span: a span step's comm phases differ from a dp step's of
    the same bucket (AG selects the owner's stripe, RS gathers every partial), so it is a graph of its own. The
    same key goes to every rank, so all ranks replay (or capture) the same graph and its comm phases line up."""
    seqs = [s for p in plans for s in p.seqs]
    if not seqs or shape.rows_per_rank > graph_rows(len(plans)):
        return None
    chunks = shape.rows_per_rank <= chunk_rows and not shape.is_span and not any(s.num_drafts for s in seqs)
    if not all(s.sample and len(s.token_ids) == 1 + s.num_drafts or chunks for s in seqs):
        return None
    return shape.rows_per_rank, graph_width(max(len(s.block_ids) for s in seqs)), shape.is_span


def decode_rows(num_ranks: int, seqs_per_rank: int) -> int:
    """The largest dp bucket a rank's decode steps can fill: its running requests rounded up to a bucket, at most
    ``graph_rows`` (the warm-up captures these; prompt chunks ride them too)."""
    return min(graph_rows(num_ranks), next_pow2(seqs_per_rank))


def warm_keys(num_ranks: int, span: bool, drafts: int, widths: Sequence[int],
              seqs_per_rank: int | None = None) -> list[tuple[tuple, tuple[int, ...]]]:
    """The graph keys an engine's steps can take at these widths, each with the draft counts whose MTP graphs can
    follow it (``WorkerStep.warm``): every dp bucket of at most ``graph_rows`` that a rank's ``seqs_per_rank``
    running requests can fill (drafts ride only for a solo request) — 0 drafts (several requests: the extend
    alone), and ``drafts`` where a solo request's 1 + drafts verify rows land (one row in a group whose solo verify
    rides a span) — and in a group with span steps, the span buckets of a solo request's 1 + d rows, d = 1 …
    drafts."""
    solo = next_pow2(1 + drafts) if num_ranks == 1 or not span else 1
    most = graph_rows(num_ranks) if not seqs_per_rank else \
        max(min(solo, graph_rows(num_ranks)), decode_rows(num_ranks, seqs_per_rank))
    keys = []
    for w in widths:
        for b in GRAPH_BUCKETS:
            if b <= most:
                keys.append(((b, w, False), () if not drafts else (0, drafts) if b <= solo else (0,)))
        if span and num_ranks > 1:
            keys += [((b, w, True), (drafts,)) for b in sorted({next_pow2(max(num_ranks, 1 + d))
                                                               for d in range(1, drafts + 1)})
                     if b <= graph_rows(num_ranks)]
    return keys
