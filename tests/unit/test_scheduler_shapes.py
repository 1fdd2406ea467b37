"""plan_step_shapes / place_request: pure policy tests."""

from __future__ import annotations

import pytest

from scheduler import shapes
from scheduler.shapes import StepShape, graph_width, graph_widths, next_pow2, place_request, plan_step_shapes


def test_solo_request_wanting_several_rows_is_a_span():
    shape = plan_step_shapes(num_ranks=4, rows_wanted={2: 7}, num_active=1)
    assert shape == StepShape("span", rows_per_rank=8, total_rows=8, owner=2)
    assert shape.is_span


def test_solo_request_wanting_one_row_is_dp_bucket_one():
    shape = plan_step_shapes(4, {1: 1, 0: 0}, num_active=1)
    assert shape == StepShape("dp", rows_per_rank=1, total_rows=4, owner=None)


def test_two_requests_are_dp_even_on_one_rank():
    assert plan_step_shapes(4, {0: 5, 3: 1}, num_active=2).kind == "dp"
    assert plan_step_shapes(4, {0: 5}, num_active=2) == StepShape("dp", 8, 32, None)


def test_span_disabled_or_single_rank_falls_back_to_dp():
    assert plan_step_shapes(4, {0: 3}, num_active=1, span_enabled=False) == StepShape("dp", 4, 16, None)
    assert plan_step_shapes(1, {0: 3}, num_active=1) == StepShape("dp", 4, 4, None)


@pytest.mark.parametrize("rows, bucket", [(0, 1), (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (9, 16), (64, 64)])
def test_dp_buckets_are_powers_of_two(rows, bucket):
    shape = plan_step_shapes(2, {0: rows, 1: 1}, num_active=3)
    assert (shape.rows_per_rank, shape.total_rows) == (max(bucket, 1), 2 * max(bucket, 1))
    assert next_pow2(rows) == bucket


def test_empty_step_is_smallest_dp_bucket():
    assert plan_step_shapes(8, {}, num_active=0) == StepShape("dp", 1, 8, None)


@pytest.mark.parametrize(
    "args, match",
    [
        ((0, {}, 0), "num_ranks"),
        ((2, {2: 1}, 1), "rows_wanted"),
        ((2, {0: -1}, 1), "rows_wanted"),
        ((2, {}, -1), "num_active"),
    ],
)
def test_bad_inputs(args, match):
    with pytest.raises(ValueError, match=match):
        plan_step_shapes(*args)


def test_place_request_least_loaded_lowest_rank():
    assert place_request({0: 10, 1: 3, 2: 3, 3: 9}) == 1
    assert place_request({3: 0, 1: 0}) == 1
    with pytest.raises(ValueError, match="kv_load"):
        place_request({})


def test_span_holds_a_whole_prefill_chunk():
    shape = plan_step_shapes(4, {0: 0, 1: 37, 2: 0, 3: 0}, num_active=1)
    assert shape == StepShape("span", rows_per_rank=64, total_rows=64, owner=1)


@pytest.mark.parametrize("per_octave,widths", [
    (4, [1, 1, 3, 4, 5, 10, 80, 320, 2560, 4096]),
    (2, [1, 1, 3, 4, 6, 12, 96, 384, 3072, 4096]),
    (1, [1, 1, 4, 4, 8, 16, 128, 512, 4096, 4096])])
def test_graph_width_pads_within_its_octave(monkeypatch, per_octave, widths):
    """A step's table width: ``WIDTHS_PER_OCTAVE`` widths an octave, at most 1 / WIDTHS_PER_OCTAVE of padding, and
    ``graph_widths`` (what a warm-up captures) lists every width a table of up to that many blocks can take."""
    monkeypatch.setattr(shapes, "WIDTHS_PER_OCTAVE", per_octave)
    for blocks, width in zip([1, 1, 3, 4, 5, 9, 65, 257, 2049, 4096], widths, strict=True):
        assert graph_width(blocks) == width, blocks
        assert blocks <= width < (1 + 1 / per_octave) * blocks + 1
    assert len([w for w in graph_widths(4096) if 1024 < w <= 2048]) == per_octave
    assert {graph_width(b) for b in range(1, 3001)} == set(graph_widths(3000))
