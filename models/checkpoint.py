"""Write checkpoints in Hugging Face layout: config.json + safetensors (bf16/fp32 or FP8 e4m3 with
128×128 block scales), one file or sharded with ``model.safetensors.index.json``.

Used by ``glmserve make-checkpoint`` and by test fixtures; the output loads in transformers
(``GlmMoeDsaForCausalLM``) as well as in our loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from models.config import Fp8Config, ModelConfig

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _fp8_config(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> Fp8Config:
    """A real-style ``modules_to_not_convert`` list: every bf16 module, plus the ``indexers_proj`` names
    that GLM's FP8 builds list although no tensor carries them."""
    keep = sorted({n[: -len(".weight")] for n in sd if n.endswith(".weight") and n + "_scale_inv" not in sd
                   and not n.startswith("model.embed_tokens")})
    keep += [f"model.layers.{i}.self_attn.indexers_proj" for i in range(cfg.num_cache_layers) if cfg.has_indexer(i)]
    keep += ["model.embed_tokens"]
    return Fp8Config(modules_to_not_convert=tuple(keep))


def write_checkpoint(out_dir: str | Path, cfg: ModelConfig, seed: int = 0, dtype: str = "bfloat16",
                     fp8: bool = False, num_shards: int = 1, std: float = 0.02,
                     state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``cfg`` with random (or the given full-precision) weights to ``out_dir``. Returns the path."""
    from safetensors.torch import save_file

    from models.loader import quantize_state_dict, random_state_dict

    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sd = state_dict if state_dict is not None else random_state_dict(cfg, seed=seed, std=std)
    sd = {k: v.float() for k, v in sd.items()}
    if fp8:
        sd = quantize_state_dict(sd)
    tensors = {}
    for name, t in sd.items():
        keep_fp32 = name.endswith("e_score_correction_bias") or name.endswith("_scale_inv") or name.endswith(".mlp.gate.weight")
        if t.dtype == torch.float8_e4m3fn or keep_fp32:
            tensors[name] = t.contiguous()
        else:
            tensors[name] = t.to(_DTYPES[dtype]).contiguous()

    config = cfg.to_dict()
    config["dtype"] = dtype
    if fp8:
        q = _fp8_config(cfg, tensors)
        config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                         "weight_block_size": [128, 128],
                                         "modules_to_not_convert": list(q.modules_to_not_convert)}
    else:
        config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    names = sorted(tensors)
    for old in out.glob("model*.safetensors*"):
        old.unlink()
    if num_shards == 1:
        save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
        return out
    chunks = [names[i::num_shards] for i in range(num_shards)]
    weight_map = {}
    for i, chunk in enumerate(chunks):
        fname = f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
        save_file({n: tensors[n] for n in chunk}, out / fname, metadata={"format": "pt"})
        weight_map.update({n: fname for n in chunk})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return out
