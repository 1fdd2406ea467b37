"""The FP8 KV cache (``kv_cache_dtype: fp8``) in the engine, on the trained tiny model: its tokens equal an engine
whose cache holds the model's dtype but whose MLA rows and indexer keys are rounded as the packed rows hold them (the
store rounds them through ``kv_fp8_pack`` / ``kv_fp8_unpack``) — bit for bit, through chunked prefill, batching,
prefix caching with a host tier, speculation (the MTP layer's rows are packed too) and seeded sampling. So the only
difference FP8 makes is that rounding, whose cost `python -m tools.eval_tiny --kv-cache-dtype fp8` measures."""

from __future__ import annotations

import pytest
import torch

from cluster.engine import Engine, LocalExecutor
from glmkernels import ops, reference
from glmkernels.reference import kv_fp8_pack, kv_fp8_unpack
from models.loader import load_model
from scheduler.request import SamplingParams
from scheduler.scheduler import SchedulerConfig
from tests.conftest import run_engine
from workers.runner import ModelRunner

BS = 16


@pytest.fixture(scope="module")
def model(text_ckpt):
    return load_model(text_ckpt, dtype=torch.float32, progress=False)


def make_engine(model, fp8: bool, k: int, budget: int, blocks: int = 24, host: int = 64) -> Engine:
    runner = ModelRunner(model, blocks, BS, torch.float32, speculative=k > 0, host_blocks=host, kv_fp8=fp8)
    cfg = SchedulerConfig(num_blocks=blocks, block_size=BS, max_model_len=blocks * BS,
                          vocab_size=model.config.vocab_size, eos_token_ids=(), max_num_seqs=4,
                          max_num_batched_tokens=budget, prefix_caching=True, host_blocks=host)
    return Engine(LocalExecutor(runner), cfg, speculative_tokens=k)


def rounded_store(rkv: int, idd: int):
    """``norm_rope_store`` whose MLA rows (the first set, into a cache of rkv + dr columns) and indexer keys (a set
    into a cache of idd columns) are then rounded as packed FP8 rows hold them."""
    def store(x, weight, bias, eps, n_norm, cos, sin, rope_at, interleaved, cache, slots, also=()):
        reference.norm_rope_store(x, weight, bias, eps, n_norm, cos, sin, rope_at, interleaved, cache, slots, also)
        assert n_norm == rope_at == rkv and cache.dtype == torch.float32
        keys = [r.cache for r in also if r.at_slots]
        assert all(k.shape[1] == idd for k in keys)
        for c, n in [(cache, rkv)] + [(k, idd) for k in keys]:
            rows = c[slots]
            c[slots] = kv_fp8_unpack(kv_fp8_pack(rows, n), n, rows.shape[1] - n, rows.dtype)
    return store


def prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    system = torch.randint(40, vocab, (70,), generator=g).tolist()
    tails = [torch.randint(40, vocab, (n,), generator=g).tolist() for n in (9, 23, 40, 150, 300)]
    return [system + tails[0], system + tails[1], tails[3], system + tails[0] + tails[2], tails[4]]


@pytest.mark.parametrize("k,budget", [(0, 512), (0, 32), (3, 64)])
def test_fp8_cache_tokens_equal_the_rounded_cache(model, monkeypatch, k, budget):
    """Tokens and their logprobs (the top 3 too) — which the latent's rounding changes: the model's dtype unrounded
    gives other logprobs."""
    greedy = SamplingParams(max_tokens=14, temperature=0.0, logprobs=3)
    drawn = SamplingParams(max_tokens=14, temperature=0.8, top_p=0.9, seed=11, logprobs=3)
    ps = prompts(model.config.vocab_size)
    outs = []
    for store in ("fp8", "rounded", "plain"):
        with monkeypatch.context() as m:
            if store == "rounded":
                m.setitem(ops._active, "norm_rope_store", rounded_store(model.config.kv_lora_rank,
                                                                         model.config.index_head_dim))
            engine = make_engine(model, store == "fp8", k, budget)
            run = lambda reqs: run_engine(engine, reqs, logprobs=True)       # noqa: E731
            got = [run({"a": (ps[0], greedy)}),                              # one, then a batch that reuses it
                   run({f"b{i}": (p, drawn if i % 2 else greedy) for i, p in enumerate(ps[:4])}),
                   run({"c": (ps[4], greedy)}),                              # 20 of the 24 blocks: evicts the rest
                   run({"d": (ps[3], greedy)})]                              # its prefix back from the host
            outs.append((got, engine.prefix_cache_tokens(), engine.scheduler.host_loads, engine.accepted_at))
            assert engine.num_free_blocks() == 24
    assert outs[0] == outs[1] and outs[0][0] != outs[2][0]
    (_, (_, hits), loads, _) = outs[0]
    print("prefix cache hits", hits, "host loads", loads)
    assert hits > 0 and loads > 0


def test_fp8_cache_is_a_quarter_of_fp32s(model):
    plain, fp8 = (make_engine(model, f, 0, 64).executor.runner.cache for f in (False, True))
    assert plain.kv[0].dtype == torch.float32 and fp8.kv[0].dtype == torch.uint8
    assert fp8.kv[0].shape[1] == 208 and plain.kv[0].shape[1] * 4 == 384     # 64 e4m3 + 4 + 32 fp32, padded: 208
    assert fp8.index_k[0].shape[1] == 80 and plain.index_k[0].shape[1] * 4 == 256     # 64 e4m3 + 4, padded: 80
