"""Prefix caching on the trained tiny model: a prompt whose leading blocks an earlier request computed takes their KV
(the main layers', the indexer's and the MTP layer's) and computes only the rest — the tokens equal an engine without
the cache, and under speculation so do the drafts (their acceptance), which read the MTP layer's cached KV."""

from __future__ import annotations

import pytest
import torch

from cluster.engine import Engine, LocalExecutor
from models.loader import load_model
from scheduler.request import SamplingParams
from scheduler.scheduler import SchedulerConfig
from tests.conftest import run_engine
from workers.runner import ModelRunner

BLOCKS, BS = 128, 16


@pytest.fixture(scope="module")
def model(text_ckpt):
    return load_model(text_ckpt, dtype=torch.float32, progress=False)


def make_engine(model, caching: bool, k: int = 0, budget: int = 512, blocks: int = BLOCKS, host: int = 0) -> Engine:
    runner = ModelRunner(model, blocks, BS, torch.float32, speculative=k > 0, host_blocks=host)
    cfg = SchedulerConfig(num_blocks=blocks, block_size=BS, max_model_len=min(1536, blocks * BS),
                          vocab_size=model.config.vocab_size, eos_token_ids=(), max_num_seqs=8,
                          max_num_batched_tokens=budget, prefix_caching=caching, host_blocks=host)
    return Engine(LocalExecutor(runner), cfg, speculative_tokens=k)


def ids(n: int, seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(40, vocab, (n,), generator=g).tolist()


def conversation(vocab: int) -> list[list[int]]:
    """A system prompt shared by every request; a second turn holding the first; prompts sharing a block and a half, and
    four blocks exactly (the token after them differs: the fourth is not reused)."""
    system = ids(70, 1, vocab)
    first = system + ids(9, 2, vocab)
    return [first, system + ids(23, 3, vocab), first + ids(40, 4, vocab), system[:24] + ids(30, 5, vocab),
            system[:64] + ids(20, 6, vocab)]


@pytest.mark.parametrize("budget", [512, 32])     # 32: the prompts' uncached tails in chunks
def test_reused_prefixes_give_the_tokens_of_an_engine_without_the_cache(model, budget):
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    cached, plain = make_engine(model, True, budget=budget), make_engine(model, False, budget=budget)
    prompts = conversation(model.config.vocab_size)
    for i, p in enumerate(prompts):                 # one after another: each finds the ones before it cached
        assert run_engine(cached, {"r": (p, greedy)}) == run_engine(plain, {"r": (p, greedy)}), f"prompt {i}"
    together = {f"t{i}": (p, greedy) for i, p in enumerate(prompts)}     # and all at once, sharing blocks in a step
    assert run_engine(cached, together) == run_engine(plain, together)
    queried, hits = cached.prefix_cache_tokens()
    print("prefix cache: queried", queried, "hits", hits)
    # one after another: 64 (the system prompt's first 4 blocks) + 64 (the second turn: block 4 held the first request's
    # output) + 16 + 48; at once: every prompt finds its own earlier run, all but its last partial block
    assert queried == 2 * sum(map(len, prompts)) and hits >= 192 + sum((len(p) - 1) // BS * BS - BS for p in prompts)
    assert plain.prefix_cache_tokens() == (0, 0)
    assert cached.num_free_blocks() == plain.num_free_blocks() == BLOCKS


def mtp_kv(engine: Engine, rid: str, n: int) -> torch.Tensor:
    """The MTP layer's cached KV (the cache's last layer) of the live request's positions 0..n-1."""
    req = engine.scheduler.get(rid)
    slots = [req.block_ids[p // BS] * BS + p % BS for p in range(n)]
    return engine.executor.runner.cache.kv[-1][slots]


def test_drafts_read_the_cached_mtp_kv(model):
    """The MTP layer's KV of a reused prefix is the one its own next tokens made (a block's key holds the token after
    it): equal to an engine's that computed the prompt whole; and so the drafts after it are that engine's."""
    greedy = SamplingParams(max_tokens=24, temperature=0.0)
    prompts = conversation(model.config.vocab_size)
    cached = make_engine(model, True, k=3)
    run_engine(cached, {"warm": (prompts[0], greedy)})
    for i, p in enumerate(prompts[1:]):
        plain = make_engine(model, False, k=3)
        cached._reset_stats()
        tokens = {}
        for engine in (cached, plain):
            engine.add_request(p, greedy, "r")
            tokens[engine] = [t for ev in engine.step() for t in ev.token_ids]   # the prompt's rows, its first token
        assert cached.prefix_cache_tokens()[1] > 0
        torch.testing.assert_close(mtp_kv(cached, "r", len(p) - 1), mtp_kv(plain, "r", len(p) - 1),
                                   rtol=1e-4, atol=1e-4, msg=f"prompt {i + 1}")
        for engine in (cached, plain):
            while engine.has_unfinished():
                tokens[engine] += [t for ev in engine.step() for t in ev.token_ids]
        assert tokens[cached] == tokens[plain] and len(tokens[plain]) == 24
        assert cached.accepted_at == plain.accepted_at and cached.stats["drafts_accepted"] > 0, \
            (cached.accepted_at, plain.accepted_at)


@pytest.mark.parametrize("k", [0, 3])
def test_prefixes_evicted_to_host_memory_come_back_with_the_same_tokens(model, k):
    """A device pool of 16 blocks and a host tier of 64: each prompt evicts the last one's blocks from the device, and
    the next turns of a conversation take them back from the host (the main layers', the indexer's and the MTP
    layer's KV): the tokens — and under speculation the drafts' acceptance — equal an engine's without the cache, and
    more of the prompts is found cached than on the device alone."""
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    vocab = model.config.vocab_size
    host, device = make_engine(model, True, k=k, blocks=16, host=64), make_engine(model, True, k=k, blocks=16)
    plain = make_engine(model, False, k=k, blocks=16)
    talk = conversation(vocab)
    other = ids(200, 7, vocab)                      # 13 blocks: with the prompts' own, more than the device holds
    for i, p in enumerate([talk[0], other, talk[2], other[:100] + ids(30, 8, vocab), talk[1], talk[4]]):
        want = run_engine(plain, {"r": (p, greedy)})
        assert run_engine(host, {"r": (p, greedy)}) == run_engine(device, {"r": (p, greedy)}) == want, f"prompt {i}"
    loads, hits = host.scheduler.host_loads, host.prefix_cache_tokens()[1]
    print("host loads", loads, "hits with / without the host tier", hits, device.prefix_cache_tokens()[1])
    assert loads > 0 and hits >= device.prefix_cache_tokens()[1] + loads * BS
    assert host.accepted_at == device.accepted_at == plain.accepted_at
    assert host.num_free_blocks() == device.num_free_blocks() == plain.num_free_blocks() == 16
