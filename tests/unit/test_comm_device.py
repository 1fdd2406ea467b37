"""The ipc comm's device-side phases (``workers/comm_device.py``) under the Triton interpreter: N ranks
share one region in this process and run the two halves of each phase in turn (put on every rank, then
get on every rank), so every wait finds its flags published — the protocol, layout, parity alternation,
in-order RS sums and the bounded wait, without a GPU. Cross-process runs on the GPU: tests/gpu."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from scheduler.shapes import graph_rows
from workers.comm import CommTimeout, ordered_sum
from workers.comm_device import DevicePhases

H = 8


def group(n: int, max_spins: int | None = None) -> list[DevicePhases]:
    region = torch.zeros(DevicePhases.nbytes(n, H), dtype=torch.uint8)
    ranks = [DevicePhases(r, n, H, region, 1.0, max_spins) for r in range(n)]
    ranks[0].poison()                   # NaN everywhere: a row read before it was written shows
    return ranks


def data(seed: int, rows: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, H, generator=g) * 10.0 ** torch.randint(-2, 3, (rows, H), generator=g)).to(dtype)


@pytest.mark.parametrize("n", [1, 3])
def test_phases_gather_and_sum_in_order_across_parities(n):
    ranks = group(n)
    for i in range(4):                                   # AG, RS, AG, RS ...: both parities, both phases
        dtype, R = (torch.float32, torch.float16)[i % 2], (1, graph_rows(n), 2, 3)[i]
        rows = [data(10 * i + r, R, dtype) for r in range(n)]
        for r, p in enumerate(ranks):
            p.put("AG", rows[r])
        gathered = [p.get("AG", R, dtype) for p in ranks]
        for g in gathered:
            assert torch.equal(g, torch.stack(rows))
        partials = [data(100 * i + r, n * R, dtype) for r in range(n)]
        for r, p in enumerate(ranks):
            p.put("RS", partials[r])
        for r, p in enumerate(ranks):
            want = ordered_sum([q[r * R:(r + 1) * R] for q in partials])
            assert torch.equal(p.get("RS", R, dtype), want), (i, r)
    assert all(int(p._state[0]) == 8 for p in ranks)    # one epoch per phase, on every rank
    assert all(int(p._state[1]) == 0 for p in ranks)    # arrival counters reset for the next launch
    for p in ranks:
        p.check()


def test_expired_wait_is_reported_and_later_waits_fall_through():
    ranks = group(2, max_spins=3)
    ranks[0].put("AG", data(0, 2, torch.float32))          # rank 1 never arrives
    ranks[0].get("AG", 2, torch.float32)
    with pytest.raises(CommTimeout, match=r"epoch 1 on rank 0.*'AG': \[1\]"):
        ranks[0].check()
    ranks[0].put("RS", data(1, 4, torch.float32))
    ranks[0].get("RS", 2, torch.float32)                   # returns at once (the error is sticky)
    with pytest.raises(CommTimeout):
        ranks[0].check()


def test_shapes_are_checked():
    p = group(2)[0]
    with pytest.raises(ValueError, match="1..64 rows"):
        p.put("AG", torch.zeros(65, H))
    p8 = group(8)[0]                    # 8 ranks' graph steps hold ≤ 32 rows a rank (256 in the MoE), the region too
    assert p8.rows == 32
    with pytest.raises(ValueError, match="1..32 rows"):
        p8.put("AG", torch.zeros(33, H))
    with pytest.raises(ValueError, match="hidden 8"):
        p.put("AG", torch.zeros(2, H + 1))
