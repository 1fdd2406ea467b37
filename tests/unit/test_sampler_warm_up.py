"""``sampler.warm_up`` meets every variant of the sampler's Triton kernels that serving can ask for, so none compiles
while serving (a compile stalls a step for about a second). The kernels' launches are recorded — not run — with the
key Triton compiles a kernel per (``launch_keys.py``): the warm-up's keys must hold every key of random batches of
mixed requests. The GPU form (no compile after the warm-up, counted by Triton's own hook):
tests/gpu/test_sample_gpu.py."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is in the 'gpu' extra)")   # (the kernels: `tk`)

from glmkernels import ops
from scheduler.request import SamplingParams
from tests.unit.launch_keys import Recorder
from workers import sampler
from workers.sampler import TokenCounts, probs_for_rows, sample, sample_on_device

KERNELS = ("_max_kernel", "_hist_kernel", "_scan_kernel", "_tie_count_kernel", "_race_kernel", "_penalize_kernel",
           "_value_id_keys_kernel")
OPS = ("top_p_race", "top_k_race", "kept_weights", "penalize", "value_id_keys")


@pytest.fixture
def record(tk, monkeypatch):
    """The sampler on the Triton ops, their kernels recorded: a function that returns the keys ``fn()`` launched."""
    mod = tk["sample"]
    for name in OPS:
        monkeypatch.setitem(ops._active, name, getattr(mod, name))
    seen: set = set()
    for name in KERNELS:
        monkeypatch.setattr(mod, name, Recorder(name, getattr(mod, name), seen))

    def run(fn) -> set:
        seen.clear()
        fn()
        return set(seen)
    return run


def _request(rng: random.Random, V: int) -> SamplingParams:
    if rng.random() < 0.2:
        return SamplingParams(temperature=0.0, repetition_penalty=rng.choice([1.0, 1.2]))
    return SamplingParams(temperature=rng.choice([1.0, 0.7]), top_k=rng.choice([0, 0, 1, 5, 20, V - 1, V + 3]),
                          top_p=rng.choice([1.0, 1.0, 0.5, 0.9]), min_p=rng.choice([0.0, 0.0, 0.1, 0.2]),
                          seed=rng.choice([None, 7]), presence_penalty=rng.choice([0.0, 0.0, 0.5]))


@pytest.mark.parametrize("V", [2048, 2503])
def test_warm_up_meets_every_variant_a_batch_asks_for(record, V):
    """Random batches of 1–5 mixed requests (greedy, drawn, a top-k, a top-p, a min-p, each or none, penalties), as
    the runner samples them — a draw, the kept weights for a verify, from logits at row offsets (V = 2503: a row's
    bytes are not a multiple of 16, so an offset changes a pointer's alignment)."""
    warm = record(lambda: sampler.warm_up(V, "cpu"))
    assert {key[0] for key in warm} >= set(KERNELS) - {"_value_id_keys_kernel"}     # (the reference path's only)
    rng, g = random.Random(V), torch.Generator().manual_seed(V)
    logits = torch.randn(8, V, generator=g)
    met = set()
    for trial in range(300):
        n, at = rng.randint(1, 5), rng.randint(0, 3)
        params = [_request(rng, V) for _ in range(n)]
        rows = logits[at:at + n]
        counts = torch.stack([TokenCounts(2, V, torch.device("cpu")).of([3, 5, 5 + trial % 7]) for _ in range(n)])
        fn = rng.choice([lambda: sample_on_device(rows, params, [1] * n, counts),
                         lambda: probs_for_rows(rows, params, counts, [1] * n),
                         lambda: sample(rows, params, counts, [1] * n)])
        keys = record(fn)
        assert keys <= warm, (trial, params, sorted(keys - warm, key=str)[:3])
        met |= keys
    assert len(met) > len(warm) // 2        # (the batches met much of what the warm-up compiles)


def test_the_warm_up_is_needed(record):
    """A batch of two top-p values launches a kernel variant that one top-p for both rows does not: the warm-up's
    per-row forms are needed."""
    V = 2048
    plain = [SamplingParams(top_p=0.9)] * 2
    scalar = record(lambda: sample_on_device(torch.randn(2, V), plain, [0, 0]))
    each = record(lambda: sample_on_device(torch.randn(2, V), [SamplingParams(top_p=0.9), SamplingParams(top_p=0.8)],
                                           [0, 0]))
    assert each - scalar and each <= record(lambda: sampler.warm_up(V, "cpu"))
