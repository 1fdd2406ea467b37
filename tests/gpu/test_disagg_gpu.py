"""Disaggregated prefill on a CUDA GPU (``cluster/disagg.py``), the embedded trained model with ``kernels: auto``: the
prefill engine's rows leave the GPU and the decode engine's come back onto it, both engines on CUDA graphs (prompt
chunks riding graph steps, look-ahead, MTP drafting graphs) — in fp32 the tokens equal one engine's that computed the
prompt (and with speculation the drafts' acceptance), with bf16 and with FP8 KV rows (Triton's packed store) the rows
the decode engine holds are byte for byte the prefill engine's.

Run on a lent GPU: ``PYTHONPATH=. python -m pytest -q tests/gpu/test_disagg_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from glmkernels import ops  # noqa: E402
from models.loader import load_model  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402
from tests.integration.test_disagg import (  # noqa: E402
    BS, GREEDY, alike, alone, decode, ids, imports_beside_streams, make_engine, prefill)

_MODELS: dict = {}


def model(dtype: torch.dtype):
    from cluster.config import DEFAULT_MODEL

    ops.configure("auto", "cuda")
    if dtype not in _MODELS:
        _MODELS[dtype] = load_model(DEFAULT_MODEL, dtype=dtype, device="cuda", progress=False)
    return _MODELS[dtype]


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("budget", [512, 32])
def test_fp32_tokens_equal_one_engines_on_graphs(k, budget):
    m = model(torch.float32)
    vocab = m.config.vocab_size
    pre, dec = make_engine(m, k=k, budget=budget, graphs=True), make_engine(m, k=k, graphs=True)
    params = SamplingParams(max_tokens=20, temperature=0.0, logprobs=0)
    for n in (20, 33, 90, 300):
        prompt = ids(n, n, vocab)
        one = make_engine(m, k=k, caching=False, graphs=True)
        want = alone(one, prompt, params)
        before = dict(dec.stats)
        assert alike(decode(dec, prompt, params, prefill(pre, prompt, params), f"d{n}"), want), n
        if k:
            assert dec.stats["drafts_accepted"] - before["drafts_accepted"] == one.stats["drafts_accepted"], n
    assert dec.stats["graph_steps"] > 0 and dec.stats["kv_imported_tokens"] > 0


@pytest.mark.parametrize("fp8", [False, True])
def test_bf16_rows_arrive_byte_for_byte(fp8):
    m = model(torch.bfloat16)
    prompt = ids(200, 5, m.config.vocab_size)
    pre, dec = make_engine(m, fp8=fp8, graphs=True), make_engine(m, fp8=fp8, graphs=True)
    bundle = prefill(pre, prompt, GREEDY)
    assert bundle.num_tokens == (200 - 1) // BS * BS
    dec.add_request(prompt, SamplingParams(max_tokens=8, temperature=0.0), "d", kv=bundle)
    dec.step()                      # sends the rows, after its work; the next step lands them, and the request
    dec.step()                      # starts with the step after
    dec.step()
    table = dec.scheduler.get("d").block_ids
    got = dec.executor.runner.cache.read_blocks(table[:bundle.num_tokens // BS], BS)
    assert all(np.array_equal(a, b) for a, b in zip(got, bundle.rows, strict=True))
    while dec.has_work():
        dec.step()


@pytest.mark.parametrize("fp8", [False, True])
def test_a_next_turns_rows_arrive_after_the_cached_prefix_byte_for_byte(fp8):
    """Turn 2 of a conversation: the decode engine (blocks of 8) holds turn 1 cached and asks for the KV past it; the
    prefill engine (blocks of 16) trims its first block's rows to that position, and the decode engine's blocks after
    its cached prefix hold the bundle's rows byte for byte."""
    m = model(torch.bfloat16)
    vocab = m.config.vocab_size
    pre, dec = make_engine(m, fp8=fp8, graphs=True), make_engine(m, fp8=fp8, graphs=True, bs=8, blocks=256)
    turn = ids(129, 8, vocab)
    params = SamplingParams(max_tokens=11, temperature=0.0)
    nxt = turn + decode(dec, turn, params, prefill(pre, turn, params)) + ids(60, 9, vocab)
    held = dec.hold_prefix(nxt, None)
    start = held.start
    bundle = prefill(pre, nxt, params, "p2", start)
    assert start == 136 and bundle.start == start and bundle.rows[0].shape[0] == bundle.num_tokens - start
    dec.add_request(nxt, params, "d2", kv=bundle)
    for _ in range(3):              # sends, lands, starts
        dec.step()
    held.release()
    table = dec.scheduler.get("d2").block_ids
    got = dec.executor.runner.cache.read_blocks(table[start // 8:bundle.num_tokens // 8], 8)
    assert all(np.array_equal(a, b) for a, b in zip(got, bundle.rows, strict=True))
    while dec.has_work():
        dec.step()



def test_imports_over_many_steps_beside_decoding_streams_keep_every_token():
    """``tests/integration/test_disagg.py``'s case on CUDA graphs, the rows through pinned memory."""
    imports_beside_streams(model(torch.float32), graphs=True)


def test_rows_sent_by_one_write_land_with_the_next_byte_for_byte():
    """``ImportWriter`` on CUDA: a write sends its step's rows (pinned, then to the device on a side stream) and the
    next one lands them (``land``) — byte for byte, over rounds that take both pinned and both device buffers in turn;
    rows the next write does not land are never written, and their device buffer stays in the turn."""
    from models.cache import ImportWriter, KVCache

    config = model(torch.bfloat16).config
    src, dst = (KVCache(config, 64 * BS, torch.bfloat16, "cuda") for _ in range(2))
    for t in src.tensors():
        t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, dtype=torch.uint8, device="cuda"))
    writer = ImportWriter(dst, BS)
    writer.reserve()
    reserved = {b.data_ptr() for b, _ in writer._device}
    rounds = [([3, 9], [0, 1]), ([20], [5]), ([30, 31, 32], [6, 7, 8]), ([40], [9]), ([41, 2], [10, 11])]
    for i, (to, frm) in enumerate(rounds):
        writer.write(writer.stage([(to, src.read_blocks(frm, BS))]), land=i != 3)     # (round 2's: dropped)
    writer.write(None, land=True)
    torch.cuda.synchronize()
    for i, (to, frm) in enumerate(rounds):
        got, want = dst.read_blocks(to, BS), src.read_blocks(frm, BS)
        assert all(np.array_equal(a, b) != (i == 2) for a, b in zip(got, want, strict=True)), i
    assert not any(r.any() for r in dst.read_blocks([30, 31, 32], BS))
    assert {b.data_ptr() for b, _ in writer._device} == reserved      # (a dropped send's buffer came back)


def test_a_decode_replicas_rank_holds_its_import_buffers_from_setup(tiny_ckpt):
    """``WorkerSpec.imports`` (a decode replica of a disaggregated app, a rebuilt group's ranks too): the rank's
    ``ImportWriter`` has both pinned and both device buffers before its first import."""
    from cluster.config import EngineConfig
    from cluster.workers import worker_specs
    from models.cache import ImportWriter
    from workers.comm import DictRendezvous
    from workers.worker import Worker

    spec = worker_specs(EngineConfig(model=str(tiny_ckpt), device="cuda", kv_cache_tokens=256), 16, imports=True)[0]
    worker = Worker(spec, DictRendezvous({}, 1))
    try:
        writer = worker.runner.imports
        assert [(b.is_pinned(), b.numel()) for b, _ in writer._buffers] == [(True, ImportWriter.BUFFER)] * 2
        assert [(d.is_cuda, d.numel()) for d, _ in writer._device] == [(True, ImportWriter.BUFFER)] * 2
    finally:
        worker.close()
