from __future__ import annotations

import pytest

from workers.rowmap import Dp, Span, contributors, row_owner, rows_of, total_rows


def test_dp_rows_are_rank_major_stripes():
    m = Dp(num_ranks=4, rows_per_rank=2)
    assert total_rows(m) == 8
    assert [rows_of(m, r) for r in range(4)] == [range(2), range(2, 4), range(4, 6), range(6, 8)]
    assert [row_owner(m, i) for i in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert rows_of(m, 3, owner=1) == range(6, 8)  # Dp ignores the owner
    assert contributors(m) == [0, 1, 2, 3]


def test_span_rows_all_belong_to_the_runtime_owner():
    m = Span(num_ranks=4, num_rows=5)
    assert total_rows(m) == 5
    for owner in range(4):
        assert [len(rows_of(m, r, owner)) for r in range(4)] == [5 if r == owner else 0 for r in range(4)]
        assert rows_of(m, owner, owner) == range(5)
        assert {row_owner(m, i, owner) for i in range(5)} == {owner}
        assert contributors(m, owner) == [owner]


@pytest.mark.parametrize("m", [Dp(1, 1), Dp(2, 3), Dp(8, 1), Span(1, 1), Span(8, 8), Span(4, 3)])
def test_rows_partition_the_bucket(m):
    for owner in range(m.num_ranks):
        rows = sorted(i for r in range(m.num_ranks) for i in rows_of(m, r, owner))
        assert rows == list(range(total_rows(m)))
        assert all(row_owner(m, i, owner) == r for r in range(m.num_ranks) for i in rows_of(m, r, owner))


def test_maps_are_frozen_and_hashable():
    assert Dp(2, 1) == Dp(2, 1) and hash(Span(2, 3)) == hash(Span(2, 3))
    with pytest.raises(AttributeError):
        Dp(2, 1).rows_per_rank = 2  # type: ignore[misc]


@pytest.mark.parametrize("bad", [lambda: Dp(0, 1), lambda: Dp(2, 0), lambda: Span(0, 1), lambda: Span(2, 0)])
def test_invalid_maps_are_rejected(bad):
    with pytest.raises(ValueError):
        bad()


def test_out_of_range_rank_owner_row():
    with pytest.raises(ValueError, match="rank 2"):
        rows_of(Dp(2, 1), 2)
    with pytest.raises(ValueError, match="span owner 5"):
        rows_of(Span(2, 2), 0, owner=5)
    with pytest.raises(ValueError, match="row 4"):
        row_owner(Dp(2, 2), 4)
    with pytest.raises(TypeError):
        total_rows((2, 2))  # type: ignore[arg-type]
