"""Each bad checkpoint gives an error naming the tensor, what was expected and what was found."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from models.checkpoint import write_checkpoint
from models.config import ConfigError
from models.loader import CheckpointError, load_model

KEY = "model.layers.0.self_attn.q_a_proj.weight"


@pytest.fixture()
def ckpt(tmp_path, tiny_config):
    return write_checkpoint(tmp_path / "c", tiny_config, seed=0, dtype="bfloat16")


def rewrite(path, fn):
    sd = load_file(path / "model.safetensors")
    fn(sd)
    save_file(sd, path / "model.safetensors")


@pytest.mark.parametrize("edit,match", [
    (lambda sd: sd.pop(KEY), f"missing tensor.*{KEY}"),
    (lambda sd: sd.__setitem__("model.layers.0.self_attn.bogus.weight", torch.zeros(2)), "unexpected tensor.*bogus"),
    (lambda sd: sd.__setitem__(KEY, torch.zeros(3, 3)), rf"{KEY}: expected shape \[128, 256\], found \[3, 3\]"),
    (lambda sd: sd.__setitem__(KEY, torch.zeros(128, 256, dtype=torch.int32)), rf"{KEY}: expected a bf16.*int32"),
    (lambda sd: sd.__setitem__(KEY + "_scale_inv", torch.ones(1, 2)), rf"{KEY}: has a weight_scale_inv.*float8"),
    (lambda sd: sd.__setitem__("model.layers.0.self_attn.nothing.weight_scale_inv", torch.ones(1, 1)),
     "has no weight"),
])
def test_bad_tensor_named(ckpt, edit, match):
    rewrite(ckpt, edit)
    with pytest.raises(CheckpointError, match=match):
        load_model(ckpt, progress=False)


def test_bad_scale_shape(tmp_path, tiny_config):
    path = write_checkpoint(tmp_path, tiny_config, fp8=True)
    rewrite(path, lambda sd: sd.__setitem__(KEY + "_scale_inv", torch.ones(3, 3)))
    with pytest.raises(CheckpointError, match=rf"{KEY}_scale_inv: expected float32 \[1, 2\]"):
        load_model(path, progress=False)


def test_missing_files(tmp_path, tiny_config):
    with pytest.raises(ConfigError, match="config.json not found"):
        load_model(tmp_path, progress=False)
    path = write_checkpoint(tmp_path / "s", tiny_config, num_shards=2)
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors, which does not exist"):
        load_model(path, progress=False)
    cfg = json.loads((path / "config.json").read_text())
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_model(tmp_path / "empty", progress=False)


def test_bad_config_in_checkpoint(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["n_group"] = 3
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="n_group"):
        load_model(ckpt, progress=False)


def test_fp8_checkpoint_is_quantized_by_scale_presence(tmp_path, tiny_config):
    """modules_to_not_convert is not consulted: a weight with a scale is FP8, one without stays bf16."""
    path = write_checkpoint(tmp_path, tiny_config, fp8=True)
    cfg = json.loads((path / "config.json").read_text())
    assert "model.layers.0.self_attn.indexers_proj" in cfg["quantization_config"]["modules_to_not_convert"]
    cfg["quantization_config"]["modules_to_not_convert"] = []
    (path / "config.json").write_text(json.dumps(cfg))
    model = load_model(path, dtype=torch.bfloat16, progress=False)
    attn = model.model.layers[0].self_attn
    assert attn.q_a_proj.weight.dtype == torch.float8_e4m3fn
    assert attn.indexer.weights_proj.weight.dtype == torch.bfloat16
    assert model.model.layers[2].mlp.gate.weight.dtype == torch.float32


@pytest.mark.parametrize("damage,match", [
    ("truncate", r"model-00001-of-00003.safetensors: not a readable safetensors file"),
    ("misplaced", r"index.json puts \S+ in model-00003-of-00003.safetensors, which does not hold it"),
    ("no_weight_map", r"is not a safetensors index \(JSON with a 'weight_map'\)"),
    ("not_json", r"is not a safetensors index"),
])
def test_a_damaged_checkpoint_is_named_before_any_weight_is_read(tmp_path, tiny_config, monkeypatch, damage, match):
    """A truncated shard, or an index that disagrees with its shards, was a bare SafetensorError / KeyError without the
    file's name, raised only once every earlier shard had been read (session 58's loader review): every header is read
    first and the error names the file."""
    path = write_checkpoint(tmp_path, tiny_config, num_shards=3)
    index = path / "model.safetensors.index.json"
    if damage == "truncate":
        f = path / "model-00001-of-00003.safetensors"
        f.write_bytes(f.read_bytes()[:-100])
    elif damage == "misplaced":
        data = json.loads(index.read_text())
        name = next(n for n, f in data["weight_map"].items() if f.startswith("model-00001"))
        data["weight_map"][name] = "model-00003-of-00003.safetensors"
        index.write_text(json.dumps(data))
    else:
        index.write_text("{" if damage == "not_json" else json.dumps({"metadata": {}}))
    import models.loader as loader

    monkeypatch.setattr(loader, "_load_one", lambda *a: pytest.fail("a weight was read"))
    with pytest.raises(CheckpointError, match=match):
        load_model(path, progress=False)


def test_deepseeks_mtp_copies_of_the_embedding_and_head_are_checked_not_read(tmp_path, tiny_config):
    """DeepSeek's checkpoints give the MTP layer copies of ``embed_tokens`` and the lm_head (``shared_head.head``); the
    layer shares the target's: the copies are accepted by their shape (they were 'unexpected tensors')."""
    path = write_checkpoint(tmp_path, tiny_config, seed=0, dtype="bfloat16")
    mtp, shape = f"model.layers.{tiny_config.num_hidden_layers}", (tiny_config.vocab_size, tiny_config.hidden_size)
    rewrite(path, lambda sd: sd.update({f"{mtp}.embed_tokens.weight": torch.zeros(shape),
                                        f"{mtp}.shared_head.head.weight": torch.zeros(shape)}))
    model = load_model(path, progress=False)
    assert model.model.embed_tokens.weight.abs().sum() > 0
    rewrite(path, lambda sd: sd.__setitem__(f"{mtp}.shared_head.head.weight", torch.zeros(3, 3)))
    with pytest.raises(CheckpointError, match=r"shared_head.head.weight: expected shape"):
        load_model(path, progress=False)
