"""Random workloads through the scheduler, and through the Engine over a fake paged executor, every invariant checked
each step (``tests/fuzz/``, session 58's review: blocks held once, order and limits, admission, outputs equal to the
model run alone). A failure prints its replay line: ``python -m tests.fuzz.scheduler --mode ... --start W``."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.fuzz.scheduler import run_sched_workload


@pytest.mark.parametrize("seed", [0, 1])
def test_random_scheduler_workloads_keep_every_invariant(seed):
    counts = sum((run_sched_workload(seed, wl, 150) for wl in range(60)), start=Counter())
    assert counts["admitted"] > 0 and counts["steps"] > 0 and counts["verify"] > 0


def test_random_engine_workloads_keep_every_invariant():
    from tests.fuzz.engine import run_engine_workload

    counts = sum((run_engine_workload(0, wl, 150) for wl in range(24)), start=Counter())
    assert counts["steps"] > 0 and counts["moves"] > 0
