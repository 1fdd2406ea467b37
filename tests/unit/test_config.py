from __future__ import annotations

import json

import pytest

from models.config import ConfigError, ModelConfig, derive_indexer_types
from tests.conftest import CONFIGS


def base() -> dict:
    return json.loads((CONFIGS / "glm5-tiny-random.json").read_text())


def test_tiny_config_fields():
    cfg = ModelConfig.from_dict(base())
    assert cfg.indexer_types == ("full", "full", "shared", "shared", "full", "shared")
    assert cfg.mlp_layer_types == ("dense", "dense") + ("sparse",) * 4
    assert cfg.qk_head_dim == 128 and cfg.kv_cache_dim == 128
    assert cfg.num_cache_layers == 7 and cfg.has_indexer(6) and not cfg.has_indexer(2)
    assert cfg.index_share_for_mtp_iteration and cfg.rope_theta == 1e6 and cfg.eos_token_ids == (1,)


@pytest.mark.parametrize("freq,offset,pattern", [(1, 2, None), (4, 3, None), (3, 2, None), (2, 0, None),
                                                 (None, None, "FSSFFS"), (4, None, None)])
def test_indexer_types_derived_as_hf(freq, offset, pattern):
    from transformers import GlmMoeDsaConfig

    kw = {k: v for k, v in (("index_topk_freq", freq), ("index_skip_topk_offset", offset),
                            ("index_topk_pattern", pattern)) if v is not None}
    hf = GlmMoeDsaConfig(num_hidden_layers=6, **kw)
    assert derive_indexer_types(6, freq, offset, pattern) == list(hf.indexer_types)


def test_glm52_schedule_has_21_full_layers():
    types = derive_indexer_types(78, 4, 3, None)
    assert types.count("full") == 21 and [i for i, t in enumerate(types) if t == "full"][:5] == [0, 1, 2, 6, 10]


def test_indexer_types_derived_when_absent():
    d = base()
    del d["indexer_types"]
    assert ModelConfig.from_dict(d).indexer_types == ("full", "full", "shared", "shared", "full", "shared")


@pytest.mark.parametrize("change,field", [
    ({"model_type": "llama"}, "model_type"),
    ({"hidden_size": None}, "hidden_size"),
    ({"topk_group": 5}, "topk_group"),
    ({"n_group": 3}, "n_group"),
    ({"num_experts_per_tok": 32}, "num_experts_per_tok"),
    ({"mlp_layer_types": ["dense"] * 5}, "mlp_layer_types"),
    ({"indexer_types": ["shared"] + ["full"] * 5}, "indexer_types"),
    ({"indexer_types": ["full", "half", "full", "full", "full", "full"]}, "indexer_types"),
    ({"rope_parameters": {"rope_type": "longrope", "factor": 4}}, "rope_parameters.rope_type"),
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"qk_head_dim": 99}, "qk_head_dim"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"quantization_config": {"quant_method": "awq"}}, "quantization_config.quant_method"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}},
     "quantization_config.weight_block_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
])
def test_bad_config_names_the_field(change, field):
    d = base()
    for k, v in change.items():
        if v is None:
            del d[k]
        else:
            d[k] = v
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        ModelConfig.from_dict(d)


def test_deepseek_v32_has_no_index_share():
    d = base()
    d["model_type"] = "deepseek_v32"
    with pytest.raises(ConfigError, match="indexer_types"):
        ModelConfig.from_dict(d)
    del d["indexer_types"]
    cfg = ModelConfig.from_dict(d)
    assert cfg.indexer_types == ("full",) * 6 and not cfg.indexer_rope_interleave


def test_config_is_frozen_and_round_trips():
    cfg = ModelConfig.from_dict(base())
    with pytest.raises(Exception):
        cfg.hidden_size = 3  # type: ignore[misc]
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_our_packages_shadow_no_installed_distribution():
    """Our top-level packages (pyproject's list) are no other installed distribution's import names: a clash makes
    one of the two unimportable (in session 33 our old ``kernels`` met Hugging Face's, a transformers >= 5.25
    dependency)."""
    import importlib.metadata
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib", reason="Python < 3.11 has no tomllib")
    ours = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]
    owners = importlib.metadata.packages_distributions()
    clashes = {name: owners[name] for name in ours if set(owners.get(name, [])) - {"glmserve"}}
    assert not clashes, clashes


@pytest.mark.parametrize("model_type", ["glm_moe_dsa", "deepseek_v32"])
def test_a_field_left_out_or_null_is_what_transformers_fills_in(model_type):
    """A config.json without ``routed_scaling_factor`` was scaled by 1.0 where transformers builds 2.5 (|Δlogit| 0.32),
    ``rms_norm_eps`` 1e-6 for 1e-5, ``max_position_embeddings`` 4096 for 202752 (session 58's loader review): a field
    left out, or null, takes the value transformers' config class gives it, per model type."""
    transformers = pytest.importorskip("transformers")
    hf = {"glm_moe_dsa": transformers.GlmMoeDsaConfig, "deepseek_v32": transformers.DeepseekV32Config}[model_type]
    keys = ("routed_scaling_factor", "rms_norm_eps", "max_position_embeddings", "n_shared_experts",
            "first_k_dense_replace", "n_group", "topk_group")
    d = {**base(), "model_type": model_type, "n_routed_experts": 64, "num_experts_per_tok": 4}
    d.pop("indexer_types") if model_type == "deepseek_v32" else None
    for k in keys:
        d.pop(k)
    d.pop("mlp_layer_types")
    default = hf()
    for cfg in (ModelConfig.from_dict(d), ModelConfig.from_dict({**d, **dict.fromkeys(keys)})):
        assert {k: getattr(cfg, k) for k in keys} == {k: getattr(default, k) for k in keys}


@pytest.mark.parametrize("change,match", [
    ({"num_experts": 8}, "'num_experts' .* and 'n_routed_experts' .* disagree"),
    ({"rope_parameters": {"type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_type' is 'linear'"),
    ({"routed_scaling_factor": "2.5"}, "routed_scaling_factor"),
    ({"max_position_embeddings": 0}, "max_position_embeddings"),
])
def test_more_bad_values_name_the_field(change, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_dict({**base(), **change})


def test_rope_interleave_false_is_ignored_as_transformers_does(caplog):
    """transformers >= 5.11 and vLLM interleave the MLA RoPE whatever ``rope_interleave`` says: so do we, with a
    warning (it switched our model to split halves)."""
    assert ModelConfig.from_dict({**base(), "rope_interleave": False}).rope_interleave
    assert "'rope_interleave' is false: ignored" in caplog.text


def test_deepseek_v32s_yarn_rope_scaling_is_read_in_either_form():
    """DeepSeek-V3.2's config.json writes YaRN under the legacy ``rope_scaling`` (``type``) beside ``rope_theta``;
    transformers 5 under ``rope_parameters``: the same scaling either way, and back through ``to_dict``. A YaRN whose
    cos/sin factor is not 1 (no mscale = mscale_all_dim) is refused, naming the field (our RoPE kernels take no factor)."""
    ds = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
          "original_max_position_embeddings": 4096, "type": "yarn"}
    d = {**base(), "model_type": "deepseek_v32", "rope_theta": 10000, "rope_scaling": ds}
    for k in ("indexer_types", "index_share_for_mtp_iteration", "rope_parameters"):
        d.pop(k, None)
    cfg = ModelConfig.from_dict(d)
    assert cfg.rope_yarn is not None and cfg.rope_yarn.factor == 40 and cfg.rope_theta == 10000
    assert cfg.rope_yarn.original_max_position_embeddings == 4096 and cfg.rope_yarn.softmax_mscale > 1
    new_form = {**d, "rope_parameters": {**ds, "rope_theta": 10000}}
    new_form.pop("rope_scaling")
    assert ModelConfig.from_dict(new_form) == cfg == ModelConfig.from_dict(cfg.to_dict())
    with pytest.raises(ConfigError, match="rope_parameters.*attention_factor"):
        ModelConfig.from_dict({**d, "rope_scaling": {**ds, "mscale": 0.0}})
