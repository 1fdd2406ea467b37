"""``load_format: dummy``: a model (or one rank's shard) from config.json alone, with random weights — FP8 where
the config is FP8-quantized — that run; bad values are errors naming the field."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from cluster.config import EngineConfig
from cluster.local import build_local_engine
from models.config import ModelConfig
from models.glm5 import MoeShard
from models.loader import dummy_model, load_model, quantizable
from scheduler.request import SamplingParams
from tests.conftest import CONFIGS, run_engine

FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


@pytest.fixture()
def config_only(tmp_path):
    """A folder holding only the tiny config.json, FP8-quantized."""
    cfg = json.loads((CONFIGS / "glm5-tiny-random.json").read_text())
    cfg["quantization_config"] = FP8_CONFIG
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_dummy_weights_fp8_where_quantized_and_finite(config_only):
    model = load_model(config_only, dtype=torch.float32, load_format="dummy")
    fp8 = {n for n, p in model.named_parameters() if p.dtype == torch.float8_e4m3fn}
    assert fp8 and all(quantizable(n) or ".experts." in n for n in fp8)
    assert model.model.embed_tokens.weight.dtype == torch.float32            # not quantizable: the model dtype
    assert model.model.layers[0].self_attn.q_a_proj.weight.dtype == torch.float8_e4m3fn
    assert all(torch.isfinite(p.float()).all() for p in model.parameters())
    from models.cache import KVCache, build_batch

    cache = KVCache(model.config, 64, torch.float32, "cpu")
    with torch.inference_mode():
        hidden = model(torch.arange(5), build_batch([(0, 5, [0, 1, 2, 3])], 16, "cpu"), cache)
        assert torch.isfinite(model.logits(hidden)).all()


def test_dummy_shard_is_the_rank_slice_and_unquantized_without_config(tiny_config):
    whole = dummy_model(tiny_config, torch.float32)
    half = dummy_model(tiny_config, torch.float32, shard=MoeShard(1, 2, "tp"))
    layer = next(i for i in range(tiny_config.num_hidden_layers) if tiny_config.is_moe(i))
    w, h = (m.model.layers[layer].mlp.experts.gate_proj.weight for m in (whole, half))
    assert w.dtype == torch.float32 and h.shape[1] * 2 == w.shape[1]      # [E, I/2, H] of [E, I, H]
    assert not any(p.dtype == torch.float8_e4m3fn for p in whole.parameters())
    again = dummy_model(tiny_config, torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), again.parameters())), "seeded: repeatable"


def test_engine_serves_a_dummy_model(config_only):
    engine, tok = build_local_engine(EngineConfig(model=str(config_only), load_format="dummy", device="cpu",
                                                  kv_cache_tokens=512), progress=False)
    assert tok is None                                                        # no tokenizer: ids in, ids out
    out = run_engine(engine, {"a": ([1, 2, 3], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))})
    assert len(out["a"]) == 4


def test_bad_load_format_is_named(config_only, tiny_config):
    with pytest.raises(ValueError, match="load_format"):
        EngineConfig(load_format="random")
    with pytest.raises(ValueError, match="load_format must be one of"):
        load_model(config_only, load_format="random")
    with pytest.raises(ValueError, match="moe_intermediate_size"):        # FP8 tp needs whole 128-column blocks
        dummy_model(replace(tiny_config, quantization=ModelConfig.from_json(config_only).quantization),
                    shard=MoeShard(0, 2, "tp"))


def test_cli_generate_with_dummy_weights(capsys):
    """``glmserve generate --load-format dummy``: the embedded model's config and tokenizer, random weights."""
    from cluster.cli import main

    assert main(["generate", "--load-format", "dummy", "--device", "cpu", "--kv-cache-tokens", "512",
                 "--max-tokens", "4", "The old man said"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("The old man said") and "[4 tokens" in out.err


def test_cli_generate_json_schema_and_its_errors(capsys):
    """``--json-schema`` holds the output to the schema (the embedded model, greedy, no thinking: the value parses);
    a bad schema and ``--num-workers`` (serve's, not generate's) are errors naming the problem, exit 2."""
    import json

    from cluster.cli import main

    pytest.importorskip("xgrammar")
    schema = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
    base = ["generate", "--device", "cpu", "--kv-cache-tokens", "512", "--max-tokens", "60"]
    assert main([*base, "--json-schema", schema, "A number"]) == 0
    value = json.loads(capsys.readouterr().out[len("A number"):])
    assert set(value) == {"n"} and type(value["n"]) is int
    assert main([*base, "--json-schema", '{"type": "objectx"}', "x"]) == 2
    assert "objectx" in capsys.readouterr().err
    assert main([*base, "--num-workers", "2", "x"]) == 2
    assert "--num-workers" in capsys.readouterr().err


def test_cli_ctrl_c_exits_130_without_a_traceback(monkeypatch, capsys):
    import cluster.cli as cli

    def interrupted(a):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "cmd_generate", interrupted)
    assert cli.main(["generate", "x"]) == 130
    assert capsys.readouterr().err.strip() == "glmserve: interrupted"
