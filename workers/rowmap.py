"""Row maps: which rank each row of a MoE bucket comes from (AG) and goes back to (RS).

A step's MoE bucket holds ``total_rows(m)`` rows. Compute (routing, expert GEMMs) is
mapping-agnostic; only the comm phases ask a row map where rows live:

- ``Dp``   — row ``r`` belongs to rank ``r // rows_per_rank`` (rank-major; each rank
  contributes ``rows_per_rank`` slots of its own requests).
- ``Span`` — all ``num_rows`` rows belong to one rank, the *owner* (1 committed token +
  drafts on verify, or a prefill chunk). The owner is a runtime value staged per step, not a
  field, so one captured span graph serves whichever rank holds the request.

Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dp:
    """Rank-major bucket: ``num_ranks * rows_per_rank`` rows, rank r owns a contiguous stripe."""

    num_ranks: int
    rows_per_rank: int

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise ValueError(f"Dp.num_ranks must be >= 1, got {self.num_ranks}")
        if self.rows_per_rank < 1:
            raise ValueError(f"Dp.rows_per_rank must be >= 1, got {self.rows_per_rank}")


@dataclass(frozen=True)
class Span:
    """All ``num_rows`` rows belong to one owner rank, passed to the comm calls at runtime."""

    num_ranks: int
    num_rows: int

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise ValueError(f"Span.num_ranks must be >= 1, got {self.num_ranks}")
        if self.num_rows < 1:
            raise ValueError(f"Span.num_rows must be >= 1, got {self.num_rows}")


RowMap = Dp | Span


def total_rows(m: RowMap) -> int:
    """Rows in the gathered bucket (the AG output / RS input length)."""
    if isinstance(m, Dp):
        return m.num_ranks * m.rows_per_rank
    if isinstance(m, Span):
        return m.num_rows
    raise TypeError(f"not a row map: {m!r}")


def _check_rank(m: RowMap, rank: int, what: str) -> None:
    if not 0 <= rank < m.num_ranks:
        raise ValueError(f"{what} {rank} out of range for {m!r}")


def rows_of(m: RowMap, rank: int, owner: int = 0) -> range:
    """Rows of the bucket that ``rank`` contributes in AG and receives in RS.

    ``owner`` only matters for ``Span`` (and must be a valid rank there); ``Dp`` ignores it.
    """
    _check_rank(m, rank, "rank")
    if isinstance(m, Dp):
        return range(rank * m.rows_per_rank, (rank + 1) * m.rows_per_rank)
    _check_rank(m, owner, "span owner")
    return range(m.num_rows) if rank == owner else range(0)


def row_owner(m: RowMap, row: int, owner: int = 0) -> int:
    """The rank that row ``row`` belongs to (inverse of ``rows_of``)."""
    if not 0 <= row < total_rows(m):
        raise ValueError(f"row {row} out of range for {m!r}")
    if isinstance(m, Dp):
        return row // m.rows_per_rank
    _check_rank(m, owner, "span owner")
    return owner


def contributors(m: RowMap, owner: int = 0) -> list[int]:
    """Ranks that own at least one row (Dp: all ranks; Span: the owner)."""
    if isinstance(m, Dp):
        return list(range(m.num_ranks))
    _check_rank(m, owner, "span owner")
    return [owner]
