"""Session 61's fixes. A decode replica that gives up on a prefill replica's answer while it is on its way (its client
gone, its wait over) drops its bundle: the prefill replica says where the bundle will wait before computing it, and
the depot keeps out a bundle whose key was dropped before it came (it waited out the depot's 120 s)."""

from __future__ import annotations

import asyncio
import types

import pytest

from cluster.disagg import KVDepot
from tests.unit.test_disagg import _bundle_of, _decode_replica, _engine
from tests.unit.test_review60 import _Actor


def test_a_key_dropped_before_its_bundle_came_keeps_it_out():
    depot = KVDepot(ttl_s=0.2)
    depot.drop("k")
    depot.put("k", _bundle_of(list(range(9))))
    assert depot.items == {} and depot.dropped == {}        # (kept out once: the key is not reused)
    depot.put("k", _bundle_of(list(range(9))))
    assert list(depot.items) == ["k"]
    depot.drop("late")
    asyncio.run(asyncio.sleep(0.25))
    depot.put("other", _bundle_of(list(range(9))))      # (a put expires old entries: the tombstone too)
    assert "late" not in depot.dropped


@pytest.mark.parametrize("how", ["cancelled", "timed out"])
def test_a_decode_replica_that_gives_up_on_the_answer_drops_its_bundle(monkeypatch, how):
    """The prefill replica's first item names where its bundle will wait; the answer (the bundle staged) is on its
    way when the decode replica gives up. Its drop reaches the depot first or after the bundle: either way it goes."""
    from cluster import coordinator as coord_mod

    monkeypatch.setattr(coord_mod, "PREFILL_WAIT_S", 0.1 if how == "timed out" else 60)
    actor, sent = _Actor(), []
    where = (actor, "key-1")

    def remote(ids, params, req_id, start):
        class Stream:
            items = [where]

            async def __anext__(self):
                if self.items:
                    return self.items.pop(0)
                await asyncio.sleep(60)         # (the answer on its way)

            def cancel(self):
                sent.append("cancel")
        return Stream()

    dec = _decode_replica(_engine(blocks=16), remote)

    async def run():
        task = asyncio.ensure_future(dec._prefilled(list(range(1, 42)), coord_mod.SamplingParams(), "r"))
        await asyncio.sleep(0.3 if how == "timed out" else 0.05)
        if how == "cancelled":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return None
        return await task
    out = asyncio.run(run())
    if how == "timed out":                  # (this replica computes the prompt)
        bundle, held = out
        assert bundle is None
        held.release()
    assert sent == ["cancel"] and actor.calls == ["drop"]
    actor.depot.put("key-1", _bundle_of(list(range(9))))      # the prefill replica's put, after the drop
    assert actor.depot.items == {}


def test_a_prefill_replica_stages_under_the_key_it_told():
    from cluster.coordinator import Coordinator
    from scheduler.request import SamplingParams

    async def generate(*args, **kwargs):
        yield types.SimpleNamespace(error=None, kv=_bundle_of(list(range(9))))

    async def run():
        actor = _Actor()
        rep = types.SimpleNamespace(_depot=actor, aengine=types.SimpleNamespace(generate=generate))
        out = [r async for r in Coordinator.prefill(rep, list(range(9)), SamplingParams(), "a")]
        return actor, out
    actor, (where, res) = asyncio.run(run())
    assert where == res.bundle and list(actor.depot.items) == [where[1]]


# ---- the configuration review (review_mut_config/: bugs 1 and 2) ----------------------------------------------------
@pytest.mark.parametrize("rope, top, field", [
    ({"rope_type": "default", "rope_theta": 0}, None, "rope_parameters.rope_theta"),
    ({"rope_type": "default", "rope_theta": "1e6"}, None, "rope_parameters.rope_theta"),
    ({"rope_type": "default", "rope_theta": True}, None, "rope_parameters.rope_theta"),
    (None, 0, "'rope_theta'"),
    (None, -5.0, "'rope_theta'"),
    ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 0, "attention_factor": 1.0}, None, "rope_parameters.factor"),
])
def test_a_rotary_base_or_yarn_factor_that_is_not_positive_is_named(rope, top, field):
    """A theta of 0 (or a YaRN factor of 0) gave infinite inverse frequencies — every logit NaN; a string was taken, a
    top-level 0 became 10000 unsaid."""
    from models.config import ConfigError, ModelConfig
    from tests.unit.test_mut61_config import base

    d = base(rope_parameters=rope)
    if top is not None:
        d["rope_theta"] = top
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_dict(d)


def test_a_null_rotary_base_is_the_default_or_the_top_levels():
    from models.config import ModelConfig
    from tests.unit.test_mut61_config import base

    assert ModelConfig.from_dict(base(rope_parameters={"rope_type": "default", "rope_theta": None})).rope_theta == 1e4
    d = base(rope_parameters={"rope_type": "default", "rope_theta": None}, rope_theta=5e5)
    assert ModelConfig.from_dict(d).rope_theta == 5e5


@pytest.mark.parametrize("name", ["model.embed_tokens.weight", "model.layers.2.mlp.gate.weight"])
def test_a_scale_beside_a_weight_that_cannot_be_fp8_is_named(tmp_path, tiny_config, name):
    """The embedding and the router are no Linears: a scale beside them was a bare KeyError mid-load."""
    from safetensors.torch import load_file, save_file

    from glmkernels.reference import fp8_quantize
    from models.checkpoint import write_checkpoint
    from models.loader import CheckpointError, load_model

    path = write_checkpoint(tmp_path, tiny_config, fp8=True)
    sd = load_file(path / "model.safetensors")
    sd[name], sd[name + "_scale_inv"] = fp8_quantize(sd[name].float())
    save_file(sd, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=f"{name}_scale_inv: .* cannot be FP8"):
        load_model(path, progress=False)


def test_prefill_replicas_are_a_count_or_servess_auto():
    from cluster.config import EngineConfig
    from cluster.disagg import prefill_plan

    decode = EngineConfig(device="cpu").to_dict()
    for bad in (True, 0, "2", 1.5):
        with pytest.raises(ValueError, match="prefill.num_replicas"):
            prefill_plan(decode, {"num_replicas": bad})
    assert prefill_plan(decode, {"num_replicas": "auto"}).deployment == {"num_replicas": "auto"}


# ---- the HTTP side's review (review_mut_http/: its bug) -------------------------------------------------------------
def test_min_tokens_is_held_to_max_completion_tokens_where_both_limits_are_given():
    """The chat's limit is ``max_completion_tokens`` where both are sent (as the endpoint and vLLM take it): min_tokens
    was checked against ``max_tokens`` — a 400 for an answer that may hold 100 tokens, or a min_tokens cut unsaid."""
    from cluster.protocol import ApiError, ChatCompletionRequest

    def chat(**kw):
        return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                     **kw})
    chat(max_tokens=5, max_completion_tokens=100, min_tokens=50).check_supported()
    with pytest.raises(ApiError, match=r"must not exceed max_completion_tokens \(5\)") as e:
        chat(max_tokens=100, max_completion_tokens=5, min_tokens=50).check_supported()
    assert (e.value.status, e.value.param) == (400, "min_tokens")
