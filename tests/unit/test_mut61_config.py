"""Session 61's mutation review of the configuration and loading side: each test kills a mutant that the suite let live
(``bench/results/session61/review_mut_config/``): a field check, a bound's edge, a default that transformers fills
in, YaRN's frequencies and softmax scale as transformers computes them, the dtypes a load keeps, a CLI flag that
must reach the engine config."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from cluster.config import EngineConfig
from models.checkpoint import write_checkpoint
from models.config import _REQUIRED, ConfigError, Fp8Config, ModelConfig, derive_indexer_types
from models.glm5 import MoeShard
from models.loader import CheckpointError, dummy_model, load_model, quantizable
from tests.conftest import CONFIGS

TINY_TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "tiny"


def base(**changes) -> dict:
    d = json.loads((CONFIGS / "glm5-tiny-random.json").read_text())
    d.update(changes)
    return d


# ---- models/config.py: field checks --------------------------------------------------------------------------------
@pytest.mark.parametrize("key", _REQUIRED)
def test_every_required_field_left_out_is_named(key):
    d = base()
    d.pop(key)
    with pytest.raises(ConfigError, match=f"config field '{key}' is required but missing"):
        ModelConfig.from_dict(d)


@pytest.mark.parametrize("change,field", [
    ({"index_topk": True}, "field 'index_topk' must be an integer"),         # a boolean is no integer
    ({"routed_scaling_factor": 0}, "routed_scaling_factor"),      # must be positive, not merely >= 0
    ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
    ({"attention_bias": True}, "attention_bias"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"num_nextn_predict_layers": 2}, "num_nextn_predict_layers"),
    ({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}}, "quantization_config.fmt"),
    ({"qk_rope_head_dim": 63, "qk_head_dim": 127}, "qk_rope_head_dim"),
    # sixteen groups of one expert: a group's score is the sum of its top two
    ({"n_group": 16, "topk_group": 4}, "n_group"),
])
def test_a_bad_value_names_its_field(change, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        ModelConfig.from_dict(base(**change))


@pytest.mark.parametrize("change", [
    # the bounds' edges are valid values
    {"num_hidden_layers": 1, "mlp_layer_types": ["dense"], "indexer_types": ["full"]},
    {"n_routed_experts": 4, "num_experts_per_tok": 4, "n_group": 1, "topk_group": 1},      # k == E
    {"n_group": 4, "topk_group": 1, "num_experts_per_tok": 4},                             # one group keeps exactly k
    {"qk_rope_head_dim": 128, "qk_head_dim": 192},                                         # == index_head_dim
    {"first_k_dense_replace": 0, "mlp_layer_types": None},                                 # no dense layer
])
def test_a_value_at_its_bound_is_accepted(change):
    cfg = ModelConfig.from_dict(base(**change))
    assert all(getattr(cfg, k) == v for k, v in change.items() if isinstance(v, int) and k != "qk_head_dim")


@pytest.mark.parametrize("first_k", [0, 1, 3, 6, 9])
def test_mlp_layer_types_from_first_k_dense_replace_are_transformers(first_k):
    transformers = pytest.importorskip("transformers")
    d = base(first_k_dense_replace=first_k)
    d.pop("mlp_layer_types")
    hf = transformers.GlmMoeDsaConfig(num_hidden_layers=6, first_k_dense_replace=first_k)
    assert list(ModelConfig.from_dict(d).mlp_layer_types) == list(hf.mlp_layer_types)


def test_the_num_experts_alias_alone_gives_n_routed_experts():
    d = base(num_experts=16)
    d.pop("n_routed_experts")
    assert ModelConfig.from_dict(d).n_routed_experts == 16


def test_glm5s_attention_dims_give_its_head_and_cache_widths():
    """GLM-5's dims (reference section 1): dn 192, dr 64, dv 256, rkv 512 — the tiny config has dn == dr == dv, so a
    sum of the wrong two dims went unseen."""
    cfg = ModelConfig.from_dict(base(qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256, kv_lora_rank=512,
                                     qk_head_dim=256))
    assert (cfg.qk_head_dim, cfg.kv_cache_dim) == (256, 576)


def test_a_config_without_index_share_keys_has_every_layer_full():
    """GLM-5 / 5.1's config.json carries no indexer_types, index_topk_freq, offset or pattern: every layer is full, as
    transformers builds it."""
    transformers = pytest.importorskip("transformers")
    d = base()
    for k in ("indexer_types", "index_topk_freq", "index_skip_topk_offset", "index_topk_pattern"):
        d.pop(k)
    assert ModelConfig.from_dict(d).indexer_types == ("full",) * 6
    assert derive_indexer_types(78, None, None, None) == list(transformers.GlmMoeDsaConfig(
        num_hidden_layers=78).indexer_types) == ["full"] * 78


def test_rope_theta_left_out_is_10000():
    """Reference section 1: a config without rope_theta rotates with theta 10000 (transformers' default)."""
    d = base()
    d.pop("rope_parameters")
    assert ModelConfig.from_dict(d).rope_theta == 10000.0


# ---- models/config.py: YaRN as transformers computes it -------------------------------------------------------------
YARNS = {
    # DeepSeek-V3.2's (factor 40 over 4096), mscale = mscale_all_dim = 1
    "deepseek": ({"rope_theta": 10000, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32,
                  "beta_slow": 1, "original_max_position_embeddings": 4096}, 163840),
    # defaults: betas, truncate and original_max_position_embeddings (= max_position_embeddings) left out; an
    # mscale_all_dim other than 1
    "defaults": ({"rope_theta": 10000, "factor": 4, "mscale": 0.707, "mscale_all_dim": 0.707}, 16384),
    # a low theta: the ramp's upper end is clamped to dim - 1
    "clamped": ({"rope_theta": 10, "factor": 8, "attention_factor": 1.0, "original_max_position_embeddings": 1024},
                8192),
    "untruncated": ({"rope_theta": 50000, "factor": 16, "mscale": 0.5, "mscale_all_dim": 0.5, "truncate": False,
                     "original_max_position_embeddings": 2048}, 32768),
}


@pytest.mark.parametrize("name", YARNS)
def test_yarn_frequencies_and_softmax_scale_are_transformers(name):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import _compute_yarn_parameters, yarn_apply_mscale

    from models.glm5 import inv_freq

    rope, positions = YARNS[name]
    rope = {"rope_type": "yarn", **rope}
    cfg = ModelConfig.from_dict(base(rope_parameters=dict(rope), max_position_embeddings=positions))
    hf = transformers.GlmMoeDsaConfig(num_hidden_layers=6, qk_rope_head_dim=cfg.qk_rope_head_dim,
                                      max_position_embeddings=positions, rope_parameters=dict(rope))
    want, attention_factor = _compute_yarn_parameters(hf)
    assert attention_factor == pytest.approx(1.0)                 # what we serve: no cos/sin factor
    ours = inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta, torch.device("cpu"), cfg.rope_yarn)
    torch.testing.assert_close(ours, want, rtol=1e-6, atol=0)
    scale = cfg.qk_head_dim ** -0.5
    assert scale * cfg.rope_yarn.softmax_mscale ** 2 == pytest.approx(yarn_apply_mscale(hf.rope_parameters, scale))


# ---- models/loader.py -----------------------------------------------------------------------------------------------
def fp8(cfg: ModelConfig, **changes) -> ModelConfig:
    return dataclasses.replace(cfg, quantization=Fp8Config(), **changes)


def test_tp_and_ep_divisibility_is_the_widths_each_rank_splits(tiny_config):
    """One rank takes a partial last FP8 block; an ep group splits the shared experts' whole width (per-expert width x
    n_shared_experts) by tp, and refuses experts that do not divide over its ranks."""
    dummy_model(fp8(tiny_config, moe_intermediate_size=192), torch.float32)              # 192 = 1.5 blocks
    two = dummy_model(fp8(tiny_config, n_shared_experts=2), torch.float32, shard=MoeShard(0, 2, "ep"))
    assert two.model.layers[2].mlp.shared_experts.gate_proj.weight.shape == (128, 256)   # 2 x 128 over 2 ranks
    with pytest.raises(ValueError, match="moe_intermediate_size=128 cannot be split over 2 ranks in whole 128"):
        dummy_model(fp8(tiny_config), torch.float32, shard=MoeShard(0, 2, "ep"))
    odd = dataclasses.replace(tiny_config, n_routed_experts=15, n_group=1, topk_group=1)
    with pytest.raises(ValueError, match="n_routed_experts=15 not divisible by 2 ranks"):
        dummy_model(odd, torch.float32, shard=MoeShard(1, 2, "ep"))


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory, tiny_config):
    return write_checkpoint(tmp_path_factory.mktemp("fp8"), tiny_config, seed=1, dtype="bfloat16", fp8=True)


def test_an_fp8_load_keeps_scales_and_correction_biases_fp32_and_exact(fp8_ckpt):
    """Reference section 2.10: weight_scale_inv and e_score_correction_bias are fp32 in the checkpoint; a bf16 load
    keeps them fp32, bit for bit (a bf16 scale moves every weight of its block)."""
    model = load_model(fp8_ckpt, dtype=torch.bfloat16, progress=False)
    params = dict(model.named_parameters())
    with safe_open(fp8_ckpt / "model.safetensors", "pt") as fh:
        names = [n for n in sorted(fh.keys()) if n.endswith(("_scale_inv", "e_score_correction_bias"))]
        assert any(".experts." in n for n in names) and any("correction" in n for n in names)
        for n in names:
            assert fh.get_slice(n).get_dtype() == "F32", n
            layer, _, rest = n.partition(".experts.")
            if rest:                                    # stacked per layer: expert e is row e
                e, proj, kind = rest.split(".")
                p = params[f"{layer}.experts.{proj}.{kind}"][int(e)]
            else:
                p = params[n]
            assert p.dtype == torch.float32 and torch.equal(p, fh.get_tensor(n)), n


def test_an_fp8_weight_without_its_scale_is_named(tmp_path, fp8_ckpt):
    key = "model.layers.0.self_attn.q_b_proj.weight"
    for f in ("config.json", "model.safetensors"):
        (tmp_path / f).write_bytes((fp8_ckpt / f).read_bytes())
    sd = load_file(tmp_path / "model.safetensors")
    sd.pop(key + "_scale_inv")
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=rf"{key}: expected a bf16/fp16/fp32 tensor, found torch.float8_e4m3fn"):
        load_model(tmp_path, progress=False)


@pytest.mark.parametrize("name,quantized", [
    ("model.layers.6.eh_proj.weight", False), ("model.layers.6.enorm.weight", False),
    ("model.layers.6.shared_head.norm.weight", False), ("model.layers.0.self_attn.indexer.weights_proj.weight", False),
    ("model.layers.0.self_attn.indexer.k_norm.bias", False), ("model.layers.2.mlp.gate.weight", False),
    ("model.embed_tokens.weight", False), ("lm_head.weight", False), ("model.norm.weight", False),
    ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", True), ("model.layers.0.self_attn.indexer.wk.weight", True),
    ("model.layers.0.mlp.down_proj.weight", True), ("model.layers.2.mlp.shared_experts.up_proj.weight", True),
    ("model.layers.6.mlp.experts.3.gate_proj.weight", True), ("model.layers.6.self_attn.o_proj.weight", True),
])
def test_what_an_fp8_build_quantizes_is_the_references(name, quantized):
    """Reference section 4: the MTP glue (enorm, hnorm, eh_proj, shared_head.norm), norms, router, embeddings, lm_head
    and the indexer's weights_proj stay bf16; every big projection, the MTP layer's too, is FP8."""
    assert quantizable(name) is quantized


# ---- models/tokenizer.py --------------------------------------------------------------------------------------------
def tokenizer_folder(tmp_path: Path, **config_changes) -> Path:
    (tmp_path / "tokenizer.json").write_bytes((TINY_TOKENIZER / "tokenizer.json").read_bytes())
    config = json.loads((TINY_TOKENIZER / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, **config_changes}))
    return tmp_path


def test_special_tokens_written_as_added_token_dicts_are_read(tmp_path):
    from models.tokenizer import Tokenizer

    eos = {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
           "special": True, "__type": "AddedToken"}
    tok = Tokenizer.from_dir(tokenizer_folder(tmp_path, eos_token=eos))
    assert tok.special_tokens["eos_token"] == "<|endoftext|>" and tok.eos_token_ids == (0, 7, 9)


def test_a_missing_tokenizer_json_is_named(tmp_path):
    from models.tokenizer import Tokenizer

    (tokenizer_folder(tmp_path) / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json not found"):
        Tokenizer.from_dir(tmp_path)


def test_a_given_chat_template_wins_over_the_folders(tmp_path):
    from models.tokenizer import Tokenizer

    folder = tokenizer_folder(tmp_path)
    (folder / "chat_template.jinja").write_text("jinja:{{ messages[0].content }}")
    tok = Tokenizer.from_dir(folder, chat_template="given:{{ messages[0].content }}")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "given:hi"


# ---- cluster/config.py ----------------------------------------------------------------------------------------------
def test_engine_config_bounds_at_their_edges():
    assert EngineConfig(kv_cache_tokens=16, block_size=16).num_blocks == 1
    assert EngineConfig(max_num_seqs=8, max_num_batched_tokens=8).max_num_batched_tokens == 8
    assert EngineConfig(speculative_tokens=7).speculative_tokens == 7
    # YAML gives a whole number for a float field
    assert EngineConfig.from_dict({"step_timeout_s": 60, "log_stats_interval_s": 0}).step_timeout_s == 60
    with pytest.raises(ValueError, match="field 'step_timeout_s' has an invalid value 0: it must be more than 0"):
        EngineConfig(step_timeout_s=0)


def test_the_pool_is_whole_blocks_and_a_context_may_fill_it_or_the_positions(tiny_config):
    assert EngineConfig(kv_cache_tokens=100).num_blocks == 6                 # 96 tokens: the partial block is none
    EngineConfig(kv_cache_tokens=100, max_model_len=96)
    with pytest.raises(ValueError, match=r"'max_model_len' \(100\) is more than a worker's KV cache holds"):
        EngineConfig(kv_cache_tokens=100, max_model_len=100)
    positions = tiny_config.max_position_embeddings
    EngineConfig(kv_cache_tokens=positions, max_model_len=positions).check_model(tiny_config)
    with pytest.raises(ValueError, match="is more than the model's positions"):
        EngineConfig(kv_cache_tokens=2 * positions, max_model_len=positions + 1).check_model(tiny_config)


def test_dtype_auto_is_fp32_on_cpu_and_bf16_on_gpu():
    assert EngineConfig(device="cpu").resolved_dtype() == torch.float32
    assert EngineConfig(device="cuda").resolved_dtype() == torch.bfloat16
    assert EngineConfig(device="cpu", dtype="bfloat16").resolved_dtype() == torch.bfloat16


# ---- workers/memory.py ----------------------------------------------------------------------------------------------
def test_the_fraction_is_what_stays_of_the_whole_device(monkeypatch):
    """``free - (1 - fraction) * total``: with 3 of 4 GiB free, 0.9 leaves 3 - 0.4 GiB for the KV pool."""
    from workers.memory import GiB, kv_budget

    monkeypatch.setenv("GLMSERVE_DEVICE_MEMORY", "3,4")
    assert kv_budget(torch.device("cpu"), 0.9) == int(3 * GiB - 0.1 * 4 * GiB)
    assert kv_budget(torch.device("cpu"), 0.25) == 0


def test_a_cgroup_limit_bounds_the_host_by_what_it_has_left(monkeypatch):
    from workers import memory

    monkeypatch.delenv(memory.FAKE_ENV, raising=False)
    monkeypatch.setattr(memory, "_cgroup_limit", lambda: (2 * memory.GiB, 2 * memory.GiB))     # all of it in use
    assert memory.device_memory(torch.device("cpu")) == (0, 2 * memory.GiB)
    monkeypatch.setattr(memory, "_cgroup_limit", lambda: (2 * memory.GiB, memory.GiB // 2))
    free, total = memory.device_memory(torch.device("cpu"))
    assert total == 2 * memory.GiB and 0 < free <= 3 * memory.GiB // 2


# ---- cluster/cli.py -------------------------------------------------------------------------------------------------
def test_every_engine_flag_reaches_the_config(tmp_path, monkeypatch):
    """Every engine field set through its flag to a value other than its default arrives in the config (a flag the
    mapping leaves out kept its default: the existing test's ``== EngineConfig()`` cannot see it); a relative
    --chat-template is made absolute (the replicas' cwd may differ)."""
    from cluster.cli import _add_engine_args, _engine_config

    monkeypatch.chdir(tmp_path)
    p = argparse.ArgumentParser()
    _add_engine_args(p)
    flags = {"model": "/m", "served_model_name": "x", "chat_template": "t.jinja", "load_format": "dummy",
             "device": "cuda", "dtype": "bfloat16", "kernels": "auto", "prefill_activations": "fp8", "block_size": 32,
             "kv_cache_tokens": 4096, "gpu_memory_utilization": 0.5, "kv_cache_dtype": "fp8", "max_model_len": 2048,
             "max_num_seqs": 8, "max_num_batched_tokens": 256, "max_waiting": 9, "max_waiting_tokens": 4096,
             "host_kv_cache_tokens": 1024, "scheduling_policy": "priority", "num_workers": 2, "moe": "ep",
             "comm": "ipc", "step_timeout": 30.0, "step_channel": "ray", "speculative_tokens": 2,
             "cuda_graphs": "eager", "warmup_tokens": 128, "reasoning_parser": "glm", "tool_parser": "glm",
             "generation_config": "none"}
    argv = [a for k, v in flags.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    cfg = _engine_config(p.parse_args([*argv, "--no-piece-graphs", "--no-lm-head-split"]))
    want = {("step_timeout_s" if k == "step_timeout" else k): v for k, v in flags.items()}
    want.update(chat_template=str(tmp_path / "t.jinja"), piece_graphs=False, lm_head_split=False)
    assert cfg == EngineConfig(**want)
    untouched = {f for f, v in EngineConfig().to_dict().items() if cfg.to_dict()[f] == v}
    assert untouched == {"prefix_caching", "kernels", "log_stats_interval_s"}     # the last has no flag (serve's own)
    cfg = _engine_config(p.parse_args(["--no-prefix-caching", "--kernels", "reference"]))
    assert (cfg.prefix_caching, cfg.kernels) == (False, "reference")


def test_serve_refuses_negative_prefill_replicas(capsys, monkeypatch):
    from cluster.cli import main

    monkeypatch.setattr("cluster.server.run_server", lambda *a, **k: 0)       # never a Ray start, whatever happens
    assert main(["serve", "--prefill-replicas", "-1"]) == 2
    assert "--prefill-replicas must be >= 0" in capsys.readouterr().err


def test_make_checkpoint_writes_the_shards_and_fp8_asked_for(tmp_path, capsys):
    from cluster.cli import main

    out = tmp_path / "ckpt"
    assert main(["make-checkpoint", str(out), "--config", str(CONFIGS / "glm5-tiny-random.json"), "--shards", "2",
                 "--fp8", "--seed", "3"]) == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == ["model-00001-of-00002.safetensors",
                                                         "model-00002-of-00002.safetensors"]
    assert "model.layers.0.self_attn.q_a_proj.weight_scale_inv" in index["weight_map"]
    assert "(fp8, 2 shard(s))" in capsys.readouterr().out


# ---- cluster/disagg.py prefill_plan ---------------------------------------------------------------------------------
def test_prefill_plan_bounds_and_which_side_needs_prefix_caching():
    from cluster.disagg import prefill_plan

    decode = EngineConfig(model="m", device="cpu").to_dict()
    with pytest.raises(ValueError, match="prefill.min_prompt_tokens must be an int >= 0, got True"):
        prefill_plan(decode, {"min_prompt_tokens": True})
    # the decode replicas take the KV into their prefix cache; the prefill replicas need not keep one
    assert prefill_plan(decode, {"prefix_caching": False}).engine["prefix_caching"] is False
    with pytest.raises(ValueError, match="prefix_caching must be on"):
        prefill_plan({**decode, "prefix_caching": False}, {"prefix_caching": True})
