"""Session 60's fixes. A bundle staged for a decode replica that goes away is dropped from the prefill replica's depot
at once (it waited out the depot's 120 s: at GLM-5.2's ~55 KB of KV a token, seconds of abandoned long prompts held
gigabytes of the prefill node's object store)."""

from __future__ import annotations

import asyncio
import threading
import time
import types

import pytest
import torch

from cluster.disagg import KVDepot, drop_bundle, fetch_bundle, stage_bundle
from scheduler.request import SamplingParams
from tests.unit.test_disagg import _bundle_of


class _Actor:
    """A ``KVDepot`` behind Ray-like ``.remote`` calls: each call is recorded in order, ``put`` takes ``put_s`` to
    submit (the copy into the object store) and ``take`` answers after ``take_s``."""

    def __init__(self, put_s: float = 0.0, take_s: float = 0.0) -> None:
        self.depot, self.calls, self.lock = KVDepot(ttl_s=60), [], threading.Lock()
        self.put = self._method("put", put_s, 0.0)
        self.take = self._method("take", 0.0, take_s)
        self.drop = self._method("drop", 0.0, 0.0)

    def _method(self, name: str, submit_s: float, answer_s: float):
        def remote(*args):
            time.sleep(submit_s)
            with self.lock:
                self.calls.append(name)
            if answer_s == 0:
                return _Ready(getattr(self.depot, name)(*args))

            async def answer():
                await asyncio.sleep(answer_s)
                return getattr(self.depot, name)(*args)
            return answer()
        return types.SimpleNamespace(remote=remote)


class _Ready:
    """An answered call's result (awaited or not, as Ray's object refs)."""

    def __init__(self, value) -> None:
        self.value = value

    def __await__(self):
        return self.value
        yield


def test_a_take_cancelled_or_timed_out_drops_the_bundle():
    actor = _Actor(take_s=5.0)

    async def run(timeout_s):
        staged = await stage_bundle(actor, _bundle_of(list(range(9))))
        task = asyncio.ensure_future(fetch_bundle(staged, timeout_s))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises((asyncio.CancelledError, asyncio.TimeoutError)):
            await task
    asyncio.run(run(60))            # the client went away while its KV was being fetched
    assert actor.calls == ["put", "take", "drop"] and actor.depot.items == {}
    asyncio.run(run(0.01))          # the take timed out
    assert actor.depot.items == {}


def test_staging_cancelled_drops_the_bundle_once_its_put_is_submitted():
    actor = _Actor(put_s=0.3)

    async def run():
        task = asyncio.ensure_future(stage_bundle(actor, _bundle_of(list(range(9)))))
        await asyncio.sleep(0.05)       # inside the put's submission
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.5)
    asyncio.run(run())
    assert actor.calls == ["put", "drop"] and actor.depot.items == {}


def test_a_prefill_result_closed_unread_drops_its_bundle():
    """``Coordinator.prefill``'s last item, the staged bundle: a decode replica that cancels the call (its client
    gone, its wait over) closes the generator there — the bundle goes, no one will take it. Read through, it stays
    for its taker."""
    from cluster.coordinator import Coordinator

    async def generate(*args, **kwargs):
        yield types.SimpleNamespace(error=None, kv=_bundle_of(list(range(9))))

    async def run(read_all: bool):
        actor = _Actor()
        rep = types.SimpleNamespace(_depot=actor, aengine=types.SimpleNamespace(generate=generate))
        gen = Coordinator.prefill(rep, list(range(9)), SamplingParams(), "a")
        where = await gen.__anext__()
        staged = (await gen.__anext__()).bundle
        assert where == staged          # (told before the prompt is computed: session 61)
        if read_all:
            with pytest.raises(StopAsyncIteration):
                await gen.__anext__()
        else:
            await gen.aclose()
        return actor, staged
    actor, staged = asyncio.run(run(False))
    assert actor.calls == ["put", "drop"] and actor.depot.items == {}
    actor, staged = asyncio.run(run(True))
    assert actor.calls == ["put"] and list(actor.depot.items) == [staged[1]]


def test_dropping_a_local_bundle_is_nothing():
    drop_bundle(_bundle_of(list(range(9))))      # (no depot: a local engine passes bundles as they are)
    depot = KVDepot(ttl_s=60)
    depot.drop("absent")


# ---- an engine that does not draft holds no MTP layer (session 59's KV-cache review, r1) ----------------------------
def test_an_engine_without_drafts_holds_no_mtp_layer(tiny_ckpt, tiny_config):
    """Its weights were loaded and its KV kept in every pool, memory-sized pools sized by it and the host tier
    copying it: 17 % of the tiny model's cache bytes, 1.3 % of GLM-5's, for nothing. Tokens are the same."""
    from cluster.config import EngineConfig
    from cluster.local import build_local_engine
    from models.cache import KVCache
    from tests.conftest import run_engine

    cfg = dict(model=str(tiny_ckpt), device="cpu", dtype="float32", kv_cache_tokens=512, host_kv_cache_tokens=64,
               warmup_tokens=0)
    plain, _ = build_local_engine(EngineConfig(**cfg), progress=False)
    drafting, _ = build_local_engine(EngineConfig(**cfg, speculative_tokens=2), progress=False)
    L = tiny_config.num_hidden_layers
    runner = plain.executor.runner
    assert runner.model.mtp_layer is None and len(runner.cache.kv) == L and len(runner.host.tensors) == len(
        runner.cache.tensors())
    assert drafting.executor.runner.model.mtp_layer is not None and len(drafting.executor.runner.cache.kv) == L + 1
    assert plain.kv_layout == KVCache.layout(tiny_config.without_mtp(), torch.float32) != drafting.kv_layout
    assert KVCache.bytes_per_slot(tiny_config.without_mtp(), torch.float32) < KVCache.bytes_per_slot(
        tiny_config, torch.float32)
    prompts = {f"r{i}": ([3 + i, 9, 27, 81 % 50 + i, 5] * 3, SamplingParams(max_tokens=6, temperature=0))
               for i in range(3)}
    assert run_engine(plain, prompts) == run_engine(drafting, prompts)


def test_a_checkpoint_without_its_mtp_tensors_loads_for_an_engine_that_does_not_draft(tmp_path, tiny_config):
    """The MTP layer's tensors are not read without drafts: a checkpoint missing them (config.json still naming the
    layer) serves plain decoding; asked to draft, the loader names what is missing."""
    from models.checkpoint import write_checkpoint
    from models.loader import CheckpointError, load_model

    path = write_checkpoint(tmp_path / "ck", tiny_config, seed=0, dtype="float32")
    from safetensors.torch import load_file, save_file

    (f,) = path.glob("*.safetensors")
    tensors = load_file(f)
    mtp = f"model.layers.{tiny_config.num_hidden_layers}."
    save_file({k: v for k, v in tensors.items() if not k.startswith(mtp)}, f)
    model = load_model(path, dtype=torch.float32, progress=False, mtp=False)
    assert model.mtp_layer is None and model.config.num_nextn_predict_layers == 0
    with pytest.raises(CheckpointError, match=f"missing tensor.*{mtp}"):
        load_model(path, dtype=torch.float32, progress=False)


def test_prefill_and_decode_replicas_agree_on_drafting():
    """A drafting prefill tier's bundles carry the MTP layer's KV, which a decode replica that does not draft has no
    room for: the deploy is refused naming the field, and such a bundle is refused naming what differs."""
    import numpy as np

    from cluster.config import EngineConfig
    from cluster.disagg import KVBundle, KVTransferError, check_bundle, prefill_plan

    decode = EngineConfig(model="m", device="cpu").to_dict()
    with pytest.raises(ValueError, match="prefill.speculative_tokens is 2 while the decode replicas do not draft"):
        prefill_plan(decode, {"speculative_tokens": 2})
    bundle = KVBundle((1, 2, 3, 4, 5), ((4, "uint8"),), True, (np.zeros((4, 4), np.uint8),))
    with pytest.raises(KVTransferError, match="keeps no room for"):
        check_bundle(bundle, [1, 2, 3, 4, 5, 6], ((4, "uint8"),), False, True, 4)


# ---- a failed stream's status (session 60's code review) ------------------------------------------------------------
@pytest.mark.parametrize("status, message", [(503, "the server shut down before the request finished"),
                                             (500, "the engine shut down")])
def test_messages_and_responses_fail_with_the_chats_status(status, message):
    """The Messages and Responses streams chose 503 or 500 by looking for "shut down" in the error's text: an engine
    that died while the server was not closing (the chat's 500) was their 503. Now they take the chat's status."""
    pytest.importorskip("ray")
    from cluster.anthropic import MessageEvents
    from cluster.formatter import ErrorChunk
    from cluster.protocol import ApiError
    from cluster.responses import ResponseEvents
    from tests.unit.test_anthropic import _req as messages_req
    from tests.unit.test_responses import _chunk, _feed
    from tests.unit.test_responses import _req as responses_req

    error = ErrorChunk(ApiError(status, message, None, "server_error"))
    assert error == ApiError(status, message, None, "server_error").body()      # what the chat's stream sends
    for events in (MessageEvents(messages_req(), "m", 3), ResponseEvents(responses_req(), "m")):
        with pytest.raises(ApiError) as e:
            asyncio.run(events.whole(_feed([_chunk({"content": "a"}), error])))
        assert e.value.status == status, (type(events).__name__, e.value.status)


# ---- drafts no one can verify (session 60's speculative-decoding review, r1) -----------------------------------------
def test_no_drafts_are_proposed_for_a_request_that_cannot_take_them(tiny_ckpt):
    """A solo request's step proposed drafts even where the request could take no token after it (its ``max_tokens``
    reached): every prompt of a disaggregated prefill replica (``max_tokens`` 1) paid k MTP passes for nothing (8 % of
    its time at k = 3 on the CPU, 16 % at k = 7). Tokens are those of plain decoding."""
    from cluster.config import EngineConfig
    from cluster.local import build_local_engine
    from tests.conftest import run_engine

    cfg = dict(model=str(tiny_ckpt), device="cpu", dtype="float32", kv_cache_tokens=512, warmup_tokens=0)
    engine, _ = build_local_engine(EngineConfig(**cfg, speculative_tokens=3), progress=False)
    plain, _ = build_local_engine(EngineConfig(**cfg), progress=False)
    steps, execute = [], engine.executor.execute

    def recording(worker_steps):
        results = execute(worker_steps)
        steps.append((worker_steps[0].num_drafts, {r: len(d) for res in results for r, d in res.drafts.items()}))
        return results
    engine.executor.execute = recording
    prompt = [5, 9, 27, 81 % 50, 3, 14] * 4
    for max_tokens in (1, 2, 3, 6):
        steps.clear()
        reqs = {"r": (prompt, SamplingParams(max_tokens=max_tokens, temperature=0))}
        assert run_engine(engine, reqs) == run_engine(plain, reqs)
        proposed = [n for n, drafts in steps if n and drafts]
        if max_tokens <= 2:             # one token after the prompt's at most: nothing to verify drafts against
            assert proposed == [], (max_tokens, steps)
        else:
            assert proposed, (max_tokens, steps)
