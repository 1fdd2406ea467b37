"""The indexer's scoring kernels launch with one compile key whatever the step (``launch_keys.py``: constexprs, an
integer's divisibility by 16, a pointer's 16-byte alignment), so the engine's warm-up — its long prompt's chunks and
its prefix hit — meets every variant a ragged step can ask for. Session 66 saw ``_index_score_kernel`` compiled while
serving on a prefix hit with a tail of 4 rows, after a warm-up whose hit's tail had 5: ``build_batch`` packed the rows'
arrays end to end, so the rows' lengths started 16-byte aligned only for an even number of rows (the likely cause:
session 67's rerun of the tree before did not compile it, its warm-up having met the variant elsewhere); a context of
a multiple of 16 keys was another variant. The GPU form: ``bench/warmup.py`` (compiles while serving, by Triton's own
hook)."""

from __future__ import annotations

import random
from itertools import cycle

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is in the 'gpu' extra)")   # (the kernels: `tk`)

from models.cache import build_batch
from tests.unit.launch_keys import Recorder

KERNELS = ("_index_score_kernel", "_index_score_rows_kernel")
TOPK, CHUNK, BLOCK, IH, IDD = 2048, 2048, 16, 32, 128        # GLM-5's indexer; the engine's chunk and block


@pytest.fixture
def keys_of(tk, monkeypatch):
    """A function: the scoring kernels' keys of a step of requests (start, new rows), through ``indexer_topk``."""
    att = tk["att"]
    seen: set = set()
    for name in KERNELS:
        monkeypatch.setattr(att, name, Recorder(name, getattr(att, name), seen))
    g = torch.Generator().manual_seed(0)
    k_cache = torch.randn(8192 + 64, IDD, generator=g).to(torch.bfloat16)

    def run(requests: list[tuple[int, int]], prebuilt: bool = True, topk: int = TOPK) -> set:
        blocks = cycle(range(len(k_cache) // BLOCK))     # (the keys' values do not matter)
        seqs = [(s, n, [next(blocks) for _ in range(-(-(s + n) // BLOCK))]) for s, n in requests]
        batch = build_batch(seqs, BLOCK)
        N = batch.num_rows
        q = torch.randn(N, IH, IDD, generator=g).to(torch.bfloat16)
        w = torch.randn(N, IH, generator=g)
        seen.clear()
        att.indexer_topk(q, w, k_cache, batch.seq_rows, batch.seq_slots, batch.positions, topk, IDD ** -0.5,
                         batch.ragged if prebuilt else None)
        return set(seen)
    return run


def _warm_up_steps() -> list[list[tuple[int, int]]]:
    """The steps of ``Engine.warm_up``'s long prompt (4096 + 37 tokens in chunks of 2048; then again, a prefix hit
    that computes the tail past its cached blocks) that reach past the top-k (where the kernels run)."""
    long = 2 * CHUNK + 37
    cached = long // BLOCK * BLOCK
    return [[(CHUNK, CHUNK)], [(2 * CHUNK, long - 2 * CHUNK)], [(cached, long - cached)]]


def test_a_ragged_step_launches_the_scoring_kernels_with_one_key_each(keys_of):
    """Random steps — prefill chunks of 1–2048 rows and decode rows, 1–4 requests, contexts up to ~6000 keys, the
    step's ``RaggedSlots`` or built in the op (a draft chain's) — launch no key the warm-up's steps did not."""
    warm = set().union(*(keys_of(step) for step in _warm_up_steps()))
    assert {key[0] for key in warm} == set(KERNELS) and len(warm) == len(KERNELS)
    rng = random.Random(0)
    met = set()
    for trial in range(200):
        step = []
        for _ in range(rng.randint(1, 4)):
            n = rng.choice([1, 1, rng.randint(1, 9), rng.randint(1, 40), rng.randint(1, CHUNK)])
            step.append((rng.randint(0, 6000 - n), n))
        if max(s + n for s, n in step) <= TOPK:
            continue                                           # every key visible: no scoring
        keys = keys_of(step, prebuilt=rng.random() < 0.7)
        assert keys <= warm, (trial, step, sorted(keys - warm, key=str)[:2])
        met |= keys
    assert met == warm


@pytest.mark.parametrize("step", [[(4192, 4)], [(4096, 112)], [(4207, 1)], [(4207, 1), (3000, 1), (2500, 1)]],
                         ids=["hit-tail-4", "context-4208", "decode-4208", "decode-three-rows"])
def test_session_66s_variants(keys_of, step):
    """The steps whose variants the warm-up missed before: an even prefix-hit tail (the rows' lengths aligned), a
    context of a multiple of 16 keys, an odd number of rows."""
    warm = set().union(*(keys_of(s) for s in _warm_up_steps()))
    assert keys_of(step) <= warm


def test_the_rows_kernel_takes_one_key_per_program_whatever_the_context(keys_of):
    """Prefill rows past a top-k under 1024 keys (a model's ``index_topk`` of 256): the rows kernel's keys a program
    (``KEYS``) stayed its 1024 only for contexts past 1024 — under it, one variant per 64 keys of context (session
    68's ``test_step_launch_keys.py`` met three while serving)."""
    keys = [keys_of([(t - 16, 16)], topk=256) for t in (320, 576, 768, 1100, 3000)]
    assert {key[0] for key in keys[0]} == {"_index_score_rows_kernel"}
    assert all(k == keys[0] for k in keys)
