"""Disaggregated prefill on the trained tiny model (``cluster/disagg.py``): one engine computes a prompt and exports its
KV, another takes it into its prefix cache and decodes — the tokens (greedy and seeded draws, with speculation: the
drafts' acceptance too) equal one engine's that computed the prompt itself, whatever the block sizes, chunking, KV
dtype or pool pressure; a bundle the decode engine cannot take is refused with an error that names the difference."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from cluster.disagg import KVBundle, KVTransferError, prefill_params
from cluster.engine import Engine, LocalExecutor
from models.cache import ImportWriter, KVCache
from models.loader import load_model
from scheduler.request import SamplingParams
from scheduler.scheduler import SchedulerConfig
from tests.conftest import run_engine
from workers.runner import ModelRunner

BS = 16


@pytest.fixture(scope="module")
def model(text_ckpt):
    return load_model(text_ckpt, dtype=torch.float32, progress=False)


def make_engine(model, k: int = 0, blocks: int = 128, bs: int = BS, budget: int = 512, fp8: bool = False,
                host: int = 0, caching: bool = True, graphs: bool = False) -> Engine:
    """A one-rank engine on ``model``'s device and dtype (``graphs``: CUDA graphs captured, on a GPU)."""
    weight = next(model.parameters())
    runner = ModelRunner(model, blocks, bs, weight.dtype, weight.device, speculative=k > 0, host_blocks=host,
                         kv_fp8=fp8, graphs="capture" if graphs else "off")
    cfg = SchedulerConfig(num_blocks=blocks, block_size=bs, max_model_len=min(1024, blocks * bs),
                          vocab_size=model.config.vocab_size, eos_token_ids=(), max_num_seqs=8,
                          max_num_batched_tokens=budget, prefix_caching=caching, host_blocks=host if caching else 0)
    return Engine(LocalExecutor(runner), cfg, speculative_tokens=k, graphs=graphs,
                  kv_layout=KVCache.layout(model.config, weight.dtype, fp8))


def ids(n: int, seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(40, vocab, (n,), generator=g).tolist()


def prefill(engine: Engine, prompt: list[int], params: SamplingParams, rid: str = "p",
            start: int = 0) -> KVBundle | None:
    """Run the prompt as a prefill replica does; its final event's bundle (the KV from position ``start`` on)."""
    engine.add_request(prompt, prefill_params(params), rid, export_kv=True, export_from=start)
    bundle = None
    while engine.has_work():
        for ev in engine.step():
            assert ev.error is None, ev.error
            if ev.finished:
                assert len(ev.token_ids) == 1, ev
                bundle = ev.kv
    return bundle


def decode(engine: Engine, prompt: list[int], params: SamplingParams, bundle: KVBundle | None,
           rid: str = "d") -> list[int]:
    engine.add_request(prompt, params, rid, kv=bundle)
    out = []
    while engine.has_work():
        for ev in engine.step():
            assert ev.error is None, ev.error
            out += [(t, lp.logprob) for t, lp in zip(ev.token_ids, ev.logprobs)] if params.logprobs is not None \
                else ev.token_ids
    return out


def alike(got: list, want: list) -> bool:
    """The same tokens, and logprobs within float noise (the engines batch the prompt's rows apart)."""
    return [t for t, _ in got] == [t for t, _ in want] and \
        all(abs(a - b) < 1e-4 for (_, a), (_, b) in zip(got, want))


def alone(engine: Engine, prompt: list[int], params: SamplingParams) -> list:
    out = run_engine(engine, {"r": (prompt, params)}, logprobs=params.logprobs is not None)["r"]
    return [(t, lp) for t, lp, _ in out] if params.logprobs is not None else out


GREEDY = SamplingParams(max_tokens=12, temperature=0.0, logprobs=0)
DRAWN = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=5, logprobs=0)


@pytest.mark.parametrize("budget", [512, 32])           # 32: the prefill replica computes the prompt in chunks
def test_decoding_a_transferred_prompt_gives_one_engines_tokens(model, budget):
    vocab = model.config.vocab_size
    pre, dec, one = make_engine(model, budget=budget), make_engine(model), make_engine(model, caching=False)
    for n in (5, 16, 17, 32, 33, 70, 200):
        prompt = ids(n, n, vocab)
        for params in (GREEDY, DRAWN):
            bundle = prefill(pre, prompt, params)
            whole = (n - 1) // BS * BS
            assert (bundle is None) == (whole == 0) and (bundle is None or bundle.num_tokens == whole), n
            before = dec.prefix_cache_tokens()[1] + dec.stats["kv_imported_tokens"]
            got = decode(dec, prompt, params, bundle)
            assert alike(got, alone(one, prompt, params)), (n, params.temperature)
            # the decode engine computed only the tail: the rest imported, or (after its first run) found cached
            assert dec.prefix_cache_tokens()[1] + dec.stats["kv_imported_tokens"] - before == whole, n
    assert dec.stats["kv_imported_tokens"] == sum((n - 1) // BS * BS for n in (5, 16, 17, 32, 33, 70, 200))
    assert pre.num_free_blocks() == dec.num_free_blocks() == 128 and not pre._exports


def test_the_imported_rows_are_the_prefill_engines_kv(model):
    prompt = ids(90, 7, model.config.vocab_size)
    pre, dec = make_engine(model), make_engine(model, blocks=64)
    bundle = prefill(pre, prompt, GREEDY)
    dec.add_request(prompt, SamplingParams(max_tokens=30, temperature=0.0), "d", kv=bundle)
    dec.step()                      # sends the rows (after its work)
    dec.step()                      # lands them (on a CPU: written at once)
    assert not dec.scheduler.get("d").block_ids
    dec.step()                      # the request starts: its table holds them
    table = dec.scheduler.get("d").block_ids
    got = dec.executor.runner.cache.read_blocks(table[:bundle.num_tokens // BS], BS)
    assert all(np.array_equal(a, b) for a, b in zip(got, bundle.rows, strict=True))
    assert dec.scheduler.get("d").num_cached_tokens == bundle.num_tokens == 80


def test_speculative_decoding_reads_the_transferred_mtp_kv(model):
    """The MTP layer's KV comes along: drafts (and their acceptance) equal a speculative engine's alone."""
    vocab = model.config.vocab_size
    pre, dec = make_engine(model, k=3), make_engine(model, k=3)
    params = SamplingParams(max_tokens=24, temperature=0.0)
    for i, n in enumerate((40, 75)):
        prompt = ids(n, 20 + i, vocab)
        alone = make_engine(model, k=3, caching=False)
        want = run_engine(alone, {"r": (prompt, params)})["r"]
        before = dict(dec.stats)
        assert decode(dec, prompt, params, prefill(pre, prompt, params)) == want
        assert dec.stats["drafts_accepted"] - before["drafts_accepted"] == alone.stats["drafts_accepted"]
        assert dec.stats["draft_rounds"] - before["draft_rounds"] == alone.stats["draft_rounds"]


@pytest.mark.parametrize("to_bs", [8, 32])
def test_block_sizes_may_differ_between_the_replicas(model, to_bs):
    vocab = model.config.vocab_size
    pre, dec, one = make_engine(model), make_engine(model, bs=to_bs, blocks=2048 // to_bs), make_engine(model)
    for n in (33, 81):
        prompt = ids(n, 40 + n, vocab)
        bundle = prefill(pre, prompt, GREEDY)
        assert alike(decode(dec, prompt, GREEDY, bundle, f"d{n}"), alone(one, prompt, GREEDY))
    assert dec.stats["kv_imported_tokens"] == sum((n - 1) // BS * BS // to_bs * to_bs for n in (33, 81))


@pytest.mark.parametrize("to_bs", [16, 8])
def test_a_conversations_next_turn_moves_only_the_kv_the_decode_replica_lacks(model, to_bs):
    """Turn 2 repeats turn 1 (its prompt and answer) and adds to it: the decode engine holds turn 1's blocks cached,
    asks for the KV past them (``hold_prefix``: held meanwhile), and decodes turn 2 to one engine's tokens — whatever
    the two block sizes (the prefill engine's 16 trims its first block's rows to the decode engine's 8)."""
    vocab = model.config.vocab_size
    pre, dec = make_engine(model), make_engine(model, bs=to_bs, blocks=2048 // to_bs)
    one = make_engine(model, caching=False)
    params = SamplingParams(max_tokens=10, temperature=0.0)
    turn = last = ids(45, 70, vocab)
    for i in range(3):
        held = dec.hold_prefix(turn, None)
        start = held.start
        assert start == (0 if i == 0 else (len(last) - 1) // to_bs * to_bs), i     # its prompt and answer, cached
        bundle = prefill(pre, turn, params, f"p{i}", start)
        assert bundle.start == start and bundle.rows[0].shape[0] == bundle.num_tokens - start == \
            (len(turn) - 1) // BS * BS - start
        imported = dec.stats["kv_imported_tokens"]
        out = decode(dec, turn, params, bundle, f"d{i}")
        held.release()
        assert out == run_engine(one, {"r": (turn, params)})["r"], i
        assert dec.stats["kv_imported_tokens"] - imported == bundle.num_tokens // to_bs * to_bs - start
        last, turn = turn + out, turn + out + ids(20 + 7 * i, 71 + i, vocab)
    assert dec.num_free_blocks() == 2048 // to_bs and pre.num_free_blocks() == 128 and not pre._exports


def test_a_next_turn_held_only_in_host_memory_is_loaded_there_not_asked_for(model):
    """Turn 1 came as a bundle (its blocks copied to host memory the step after their write) and was evicted from the
    decode engine's device by another prompt: turn 2 holds its prefix in the host tier (pinned: a third prompt's host
    copies pass over it), asks only for the KV past it, loads it back and decodes one engine's tokens."""
    vocab = model.config.vocab_size
    pre, dec, one = make_engine(model), make_engine(model, blocks=16, host=24), make_engine(model, caching=False)
    params = SamplingParams(max_tokens=10, temperature=0.0)
    turn = ids(45, 80, vocab)
    out = decode(dec, turn, params, prefill(pre, turn, params, "p1"), "d1")
    decode(dec, ids(250, 81, vocab), SamplingParams(max_tokens=1), None, "x")      # fills the device
    nxt, pool = turn + out + ids(30, 82, vocab), dec.scheduler.pool
    assert [pool.block(n) for n in pool.match(nxt)] == [None] * 3
    held = dec.hold_prefix(nxt, None)
    start = held.start
    assert start == 3 * BS
    decode(dec, ids(200, 83, vocab), SamplingParams(max_tokens=1), None, "y")      # 12 host copies: 6 evict others
    assert len(pool.match(nxt)) == 3
    bundle = prefill(pre, nxt, params, "p2", start)
    imported, loads = dec.stats["kv_imported_tokens"], dec.scheduler.host_loads
    got = decode(dec, nxt, params, bundle, "d2")
    held.release()
    assert got == run_engine(one, {"r": (nxt, params)})["r"]
    assert dec.stats["kv_imported_tokens"] - imported == 80 - start and dec.scheduler.host_loads - loads == 3
    assert dec.num_free_blocks() == 16 and not pool._pins


def test_fp8_kv_moves_as_packed_rows(model):
    prompt = ids(60, 3, model.config.vocab_size)
    pre, dec, one = make_engine(model, fp8=True), make_engine(model, fp8=True), make_engine(model, fp8=True)
    bundle = prefill(pre, prompt, GREEDY)
    assert sum(r.nbytes for r in bundle.rows) == 48 * KVCache.bytes_per_slot(model.config, torch.float32, True)
    assert alike(decode(dec, prompt, GREEDY, bundle), alone(one, prompt, GREEDY))


def test_a_bundle_the_engine_cannot_take_is_refused_by_name(model):
    vocab = model.config.vocab_size
    prompt = ids(50, 9, vocab)
    plain, spec, fp8 = make_engine(model), make_engine(model, k=2), make_engine(model, fp8=True)
    bundle = prefill(plain, prompt, GREEDY)
    cases = [(spec, prompt, "speculative_tokens"), (fp8, prompt, "kv_cache_dtype"),
             (plain, ids(50, 10, vocab), "another prompt"), (plain, prompt[:40], "another prompt"),
             (make_engine(model, caching=False), prompt, "prefix_caching")]
    for engine, p, words in cases:
        with pytest.raises(KVTransferError, match=words):
            engine.add_request(p, GREEDY, "x", kv=bundle)
        assert not engine.has_work() and engine.num_free_blocks() == 128
    # and the engine goes on serving
    assert alike(decode(plain, prompt, GREEDY, bundle), alone(make_engine(model), prompt, GREEDY))


def test_a_salted_prompts_transferred_kv_is_its_salts_only(model):
    prompt = ids(70, 11, model.config.vocab_size)
    salted = SamplingParams(max_tokens=4, temperature=0.0, cache_salt="tenant-a")
    pre, dec = make_engine(model), make_engine(model)
    decode(dec, prompt, salted, prefill(pre, prompt, salted))
    before = dec.prefix_cache_tokens()[1]
    decode(dec, prompt, GREEDY, None, "unsalted")
    assert dec.prefix_cache_tokens()[1] == before           # nothing found without the salt
    decode(dec, prompt, salted, None, "salted-again")
    assert dec.prefix_cache_tokens()[1] == before + 64


@pytest.mark.parametrize("host,seed,step_blocks", [(0, 1, 0), (16, 5, 0), (8, 9, 0), (0, 3, 1), (16, 7, 2)])
# (the seeds that met an import evicted before its step, its block a load's destination: a step that loaded before it
# imported failed them at session 49's code, whose imports went whole with the next step and settled as it was planned
# — since session 53 an import settles after its step, so no load shares a step with it; ``step_blocks``: imports go
# a block or two a step, later requests arriving meanwhile)
def test_transfers_into_a_crowded_pool_keep_the_tokens(model, host, seed, step_blocks):
    """A decode pool of 12 blocks for requests of up to 7, some with their prompt's KV and some without, prompts that
    repeat and share prefixes: imports evict cached blocks (and, with a host tier, blocks whose save to host memory is
    pending), are evicted before their request runs, or only partly fit, and cached prefixes come back from host memory
    into blocks an import took — every request's tokens equal an engine's alone."""
    vocab, rng = model.config.vocab_size, random.Random(seed)
    pre, dec = make_engine(model), make_engine(model, blocks=12, host=host)
    if step_blocks:
        dec._imports[0].budget = step_blocks * BS * KVCache.bytes_per_slot(model.config, torch.float32, False)
    system = ids(40, 99, vocab)
    bases = [(system if i % 2 else []) + ids(rng.randrange(10, 70), 100 + i, vocab) for i in range(6)]
    reqs, bundles = {}, {}
    for i in range(30):
        prompt = rng.choice(bases) + ids(rng.randrange(0, 20), 200 + i, vocab)
        reqs[f"r{i}"] = (prompt, SamplingParams(max_tokens=rng.randrange(1, 8), temperature=0.0, logprobs=0))
        if rng.random() < 0.6:
            bundles[f"r{i}"] = prefill(pre, prompt, reqs[f"r{i}"][1], f"p{i}")
    want = run_engine(make_engine(model, caching=False), reqs, logprobs=True)
    got = {rid: [] for rid in reqs}
    pending = list(reqs)
    while pending or dec.has_work():
        for _ in range(rng.randrange(0, 3)):               # arrivals between steps
            if pending:
                rid = pending.pop(0)
                dec.add_request(*reqs[rid], rid, kv=bundles.get(rid))
        for ev in dec.step():
            assert ev.error is None, ev.error
            got[ev.req_id] += [(t, lp.logprob) for t, lp in zip(ev.token_ids, ev.logprobs)]
    for rid in reqs:
        assert alike(got[rid], [(t, lp) for t, lp, _ in want[rid]]), rid
    assert dec.stats["kv_imported_tokens"] > 0 and dec.num_free_blocks() == 12
    print("imported", dec.stats["kv_imported_tokens"], "host loads", dec.scheduler.host_loads)


def test_an_import_may_take_blocks_whose_save_to_host_memory_is_pending(model):
    """A prompt's blocks, cached as it finishes, wait for the next step to be saved to host memory; an import that
    arrives meanwhile into a full pool takes them: the step saves them before it writes the import, so the prompt comes
    back from host memory intact."""
    vocab = model.config.vocab_size
    pre, dec = make_engine(model), make_engine(model, blocks=8, host=16)
    first, other = ids(49, 60, vocab), ids(113, 61, vocab)
    one = SamplingParams(max_tokens=1, temperature=0.0, logprobs=0)
    decode(dec, first, one, None, "a")                     # 3 blocks cached, their saves due with the next step
    bundle = prefill(pre, other, one)
    dec.add_request(other, one, "b", kv=bundle)            # 7 blocks: 5 free ones, then 2 of those
    assert dec.scheduler.pool.num_cached == 8
    while dec.has_work():
        dec.step()
    again = decode(dec, first, GREEDY, None, "c")          # found on the host (loaded), not computed
    assert dec.scheduler.host_loads >= 2
    assert alike(again, alone(make_engine(model), first, GREEDY))


def imports_beside_streams(model, graphs: bool = False, staged: bool | None = None) -> None:
    """Two prompts' rows arrive while three streams decode; each goes a block a step (written after the step's work:
    ``ImportWriter``, ``staged`` as on a GPU), a host tier saving and loading beside them — every request's tokens and
    logprobs equal one engine's that computed its prompt."""
    vocab = model.config.vocab_size
    pre, dec = make_engine(model), make_engine(model, graphs=graphs, blocks=96, host=32)
    if staged is not None:
        dec.executor.runner.imports = ImportWriter(dec.executor.runner.cache, BS, staged=staged)
    dec._imports[0].budget = BS * KVCache.bytes_per_slot(model.config, next(model.parameters()).dtype)
    params = SamplingParams(max_tokens=40, temperature=0.0, logprobs=0)
    streams = {f"s{i}": ids(30 + 7 * i, 300 + i, vocab) for i in range(3)}
    imported = {f"k{i}": ids(170 + 40 * i, 400 + i, vocab) for i in range(2)}
    bundles = {rid: prefill(pre, p, params, f"p{rid}") for rid, p in imported.items()}
    for rid, p in streams.items():
        dec.add_request(p, params, rid)
    got = {rid: [] for rid in [*streams, *imported]}
    for n in range(400):
        if n in (3, 5):                                   # the second arrives while the first is on its way
            rid = f"k{n // 4}"
            dec.add_request(imported[rid], params, rid, kv=bundles[rid])
        for ev in dec.step():
            assert ev.error is None, ev.error
            got[ev.req_id] += [(t, lp.logprob) for t, lp in zip(ev.token_ids, ev.logprobs)]
        if n > 5 and not dec.has_work():
            break
    assert dec.stats["kv_imported_tokens"] == sum(b.num_tokens for b in bundles.values())
    for rid, p in {**streams, **imported}.items():
        assert alike(got[rid], alone(make_engine(model, caching=False), p, params)), rid


@pytest.mark.parametrize("staged", [False, True])
def test_imports_over_many_steps_beside_decoding_streams_keep_every_token(model, staged):
    imports_beside_streams(model, staged=staged)


def test_kv_moves_between_worker_groups(tiny_ckpt, tiny_config):
    """Two 2-rank groups of processes (ep, ipc): the rank that ran a prompt sends its rows back through the step
    channel, the decode group's rank that takes the request gets them with its step — the single process's tokens."""
    from cluster.config import EngineConfig
    from cluster.local import scheduler_config
    from cluster.workers import ProcessWorkerGroup

    cfg = EngineConfig(model=str(tiny_ckpt), device="cpu", dtype="float32", num_workers=2, moe="ep", comm="ipc",
                       kv_cache_tokens=64 * BS, max_num_batched_tokens=64)
    single = load_model(tiny_ckpt, dtype=torch.float32, progress=False)
    prompts = {f"r{i}": ids(n, 300 + i, tiny_config.vocab_size) for i, n in enumerate((20, 47, 90))}
    want = {rid: alone(make_engine(single), p, GREEDY) for rid, p in prompts.items()}
    groups = [ProcessWorkerGroup(cfg, 64) for _ in range(2)]
    try:
        pre, dec = (Engine(g, scheduler_config(cfg, tiny_config, None, 64), num_ranks=2,
                           kv_layout=cfg.kv_layout(tiny_config)) for g in groups)
        bundles = {rid: prefill(pre, p, GREEDY, f"p{rid}") for rid, p in prompts.items()}
        for rid, p in prompts.items():
            assert alike(decode(dec, p, GREEDY, bundles[rid], rid), want[rid]), rid
        assert dec.stats["kv_imported_tokens"] == sum((len(p) - 1) // BS * BS for p in prompts.values())
    finally:
        for g in groups:
            g.shutdown()


def test_a_prefill_aborted_while_its_export_runs_leaves_the_engine_serving(model):
    """A client gone while the step that exports its prompt runs (the engine's lock is not held then): the step's rows
    are dropped, the engine goes on."""
    pre = make_engine(model)
    execute = pre.executor.execute

    def aborting(steps):
        if any(s.kv_exports for s in steps):
            pre.abort("p")
        return execute(steps)

    pre.executor.execute = aborting
    prompt = ids(50, 70, model.config.vocab_size)
    pre.add_request(prompt, prefill_params(GREEDY), "p", export_kv=True)
    while pre.has_work():
        pre.step()
    pre.executor.execute = execute
    assert prefill(pre, prompt, GREEDY, "again").num_tokens == 48 and pre.num_free_blocks() == 128


def test_an_import_whose_request_never_runs_waits_for_the_pending_host_saves(model):
    """The import takes blocks whose saves to host memory wait, and its request is aborted before the next step: the
    step that writes the import (its rank plans no rows) still runs those saves first, so the prompt they hold comes
    back from host memory intact."""
    vocab = model.config.vocab_size
    pre, dec = make_engine(model), make_engine(model, blocks=8, host=16)
    first, other = ids(49, 60, vocab), ids(113, 61, vocab)
    decode(dec, first, SamplingParams(max_tokens=1, temperature=0.0), None, "a")
    dec.add_request(other, GREEDY, "b", kv=prefill(pre, other, GREEDY))
    dec.abort("b")
    while dec.has_work():
        dec.step()
    decode(dec, ids(5, 7, vocab), SamplingParams(max_tokens=1), None, "z")
    again = decode(dec, first, GREEDY, None, "c")
    assert dec.scheduler.host_loads >= 2 and alike(again, alone(make_engine(model), first, GREEDY))
