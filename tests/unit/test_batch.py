"""The step's attention metadata (``models.cache.build_batch``): the per-request construction's slots, built in
whole arrays, with the indexer's ragged form and the fewest keys a row sees; the sparse attention told to trim
exactly when some row's selection ends in -1s."""

from __future__ import annotations

import random

import pytest
import torch

from glmkernels import ops
from glmkernels.reference import ragged_slots
from models.cache import KVCache, build_batch, slots_for
from models.loader import load_model


def per_request(seqs, block_size: int):
    """The batch as one request at a time builds it: (positions, slot_mapping, seq_rows, seq_slots)."""
    positions, slot_mapping, seq_rows, seq_slots, row = [], [], [], [], 0
    for start, n, blocks in seqs:
        slots = slots_for(blocks, start + n, block_size)
        positions.append(torch.arange(start, start + n))
        slot_mapping.append(slots[start:start + n])
        seq_rows.append((row, n))
        seq_slots.append(slots)
        row += n
    return torch.cat(positions), torch.cat(slot_mapping), seq_rows, seq_slots


def test_build_batch_equals_the_per_request_build():
    """Random steps (block sizes 1–64, block tables longer than needed, starts at 0 and inside a block): the same
    positions, slots and rows as building each request alone; its ``RaggedSlots`` are ``ragged_slots``' of them, and
    ``fewest_keys`` the least position + 1; every per-row array starts 16-byte aligned, odd rows or even."""
    rng = random.Random(0)
    for _ in range(60):
        bs = rng.choice([1, 4, 16, 64])
        seqs = []
        for _ in range(rng.randint(1, 6)):
            start, n = rng.choice([0, rng.randint(0, 300)]), rng.randint(1, 50)
            seqs.append((start, n, tuple(rng.sample(range(2000), -(-(start + n) // bs) + rng.randint(0, 3)))))
        batch = build_batch(seqs, bs)
        positions, slot_mapping, seq_rows, seq_slots = per_request(seqs, bs)
        assert torch.equal(batch.positions, positions) and torch.equal(batch.slot_mapping, slot_mapping)
        assert batch.seq_rows == seq_rows and len(batch.seq_slots) == len(seq_slots)
        assert all(torch.equal(a, b) for a, b in zip(batch.seq_slots, seq_slots))
        want = ragged_slots(seq_rows, seq_slots, torch.device("cpu"))
        got = batch.ragged
        assert torch.equal(got.slots, want.slots) and torch.equal(got.base, want.base)
        assert torch.equal(got.length, want.length) and (got.bases, got.lengths) == (want.bases, want.lengths)
        assert batch.fewest_keys == min(s for s, _, _ in seqs) + 1
        aligned = [batch.positions, batch.slot_mapping, got.slots, got.base, got.length, want.base, want.length]
        assert all(t.data_ptr() % 16 == 0 for t in aligned)      # whatever the rows (a kernel compiles per alignment)
    with pytest.raises(AssertionError, match="block table too short"):
        build_batch([(0, 40, (0, 1))], 16)


def test_attention_trims_where_a_row_sees_fewer_keys_than_the_selection(tiny_ckpt, monkeypatch):
    """A prompt's rows beside a long decode (they see fewer keys than the decode's selection width: their selections
    end in -1s) run the attention with ``trim``; the decode row alone does not, nor does a static batch."""
    model = load_model(tiny_ckpt, dtype=torch.float32, progress=False)
    cache = KVCache(model.config, 64 * 16, torch.float32)
    calls = []
    attention = ops._active["mla_sparse_attention"]

    def spy(q_lat, q_rope, kv, topk, scale, row_chunk=256, trim=False):
        calls.append((trim, bool((topk[:, -1] < 0).any())))
        return attention(q_lat, q_rope, kv, topk, scale, row_chunk, trim)

    monkeypatch.setitem(ops._active, "mla_sparse_attention", spy)
    topk = model.config.index_topk
    decode = (topk + 40, 1, tuple(range(40)))                   # sees topk + 41 keys: a full selection
    with torch.inference_mode():
        for seqs, short in (([(0, 20, (50, 51)), decode], True), ([decode], False)):
            calls.clear()
            batch = build_batch(seqs, 16)
            model(torch.randint(5, 100, (batch.num_rows,)), batch, cache)
            assert calls and all(trim == short == ends_short for trim, ends_short in calls), calls
