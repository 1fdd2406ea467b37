"""GLM-5 family configuration, read from a checkpoint's ``config.json``.

One frozen dataclass for ``glm_moe_dsa`` (GLM-5, 5.1, 5.2, 5.3) and ``deepseek_v32`` (same blocks,
half-split indexer RoPE, no IndexShare). Field meanings follow reference/glm5_architecture.md §1.
Unknown keys, missing required keys and inconsistent values raise ``ConfigError`` naming the field.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("glm_moe_dsa", "deepseek_v32")
FP8_BLOCK = 128

# Keys a real config.json carries that change nothing in our math (HF bookkeeping, training-only
# knobs, or fields that HF itself ignores). Anything outside these and the dataclass fields is an error.
_IGNORED_KEYS = frozenset({
    "architectures", "transformers_version", "initializer_range", "use_cache", "attention_dropout",
    "num_key_value_heads", "head_dim", "qk_head_dim", "ep_size", "pretraining_tp", "mlp_bias",
    "moe_layer_freq", "moe_router_dtype", "layer_types", "output_router_logits", "torch_dtype",
    "index_topk_freq", "index_skip_topk_offset", "index_topk_pattern", "auto_map", "num_experts",
    "aux_loss_alpha", "seq_aux", "router_aux_loss_coef", "tie_word_embeddings", "_name_or_path",
    "rope_scaling", "rope_theta", "model_type", "quantization_config", "eos_token_id", "bos_token_id",
    "pad_token_id", "dtype", "rope_parameters", "indexer_types", "mlp_layer_types",
})

_REQUIRED = (
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
    "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "n_routed_experts", "num_experts_per_tok", "index_n_heads", "index_head_dim", "index_topk",
)


# What transformers' config classes fill in for a field config.json leaves out (or sets null): a config that omits one
# must build the model transformers builds from it.
_HF_DEFAULTS = {
    "glm_moe_dsa": {"routed_scaling_factor": 2.5, "rms_norm_eps": 1e-5, "max_position_embeddings": 202752,
                    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 3, "n_shared_experts": 1},
    "deepseek_v32": {"routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6, "max_position_embeddings": 163840,
                     "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3, "n_shared_experts": 1},
}
_log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config.json value we cannot serve; the message names the field."""


@dataclass(frozen=True)
class Fp8Config:
    """``quantization_config`` of an FP8 block-scaled checkpoint (weights e4m3 + per-block fp32 scales)."""

    block_size: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)
    activation_scheme: str = "dynamic"
    modules_to_not_convert: tuple[str, ...] = ()


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's ``0.1 · mscale · ln(scale) + 1`` (its paper's Eq. 21), 1 for no scaling (transformers'
    ``yarn_get_mscale``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class Yarn:
    """YaRN RoPE scaling (``rope_type: yarn``; DeepSeek-V3.2's config has it, no GLM-5.x's), computed as transformers
    does: inverse frequencies blended between interpolated and extrapolated by a ramp over the rotary dims, and the
    attention's softmax scale times ``yarn_mscale(factor, mscale_all_dim)²`` (MLA's). The cos/sin factor transformers
    would apply besides (``attention_factor``) must be 1 — mscale = mscale_all_dim, as DeepSeek's configs set them."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale_all_dim: float = 0.0
    truncate: bool = True

    def ramp(self, dim: int, theta: float) -> tuple[float, float]:
        """The rotary dims' range over which the frequencies pass from extrapolated (below ``low``) to interpolated
        (above ``high``), as transformers' ``find_correction_range``."""
        def at(rotations: float) -> float:
            turns = self.original_max_position_embeddings / (rotations * 2 * math.pi)
            return dim * math.log(turns) / (2 * math.log(theta))
        low, high = at(self.beta_fast), at(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, dim - 1)

    @property
    def softmax_mscale(self) -> float:
        """The factor MLA's softmax scale takes twice (``scale · m · m``), 1 without ``mscale_all_dim``."""
        return yarn_mscale(self.factor, self.mscale_all_dim) if self.mscale_all_dim else 1.0


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    num_experts_per_tok: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    indexer_types: tuple[str, ...]          # per layer: "full" (own indexer) | "shared" (reuse previous top-k)
    mlp_layer_types: tuple[str, ...]        # per layer: "dense" | "sparse"
    n_shared_experts: int = 1
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_yarn: Yarn | None = None
    rope_interleave: bool = True
    indexer_rope_interleave: bool = True
    max_position_embeddings: int = 4096
    first_k_dense_replace: int = 0
    attention_bias: bool = False
    num_nextn_predict_layers: int = 0
    index_share_for_mtp_iteration: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    dtype: str = "bfloat16"
    quantization: Fp8Config | None = None

    # ---- derived -------------------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_cache_dim(self) -> int:
        """Values cached per token per layer for MLA: latent + shared rope key (512 + 64 for GLM-5)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def num_cache_layers(self) -> int:
        """Target layers plus MTP layers; the MTP layer's cache sits at index num_hidden_layers."""
        return self.num_hidden_layers + self.num_nextn_predict_layers

    def without_mtp(self) -> ModelConfig:
        """The model as an engine that does not draft serves it: no MTP layer (its weights not read, no KV kept)."""
        return replace(self, num_nextn_predict_layers=0)

    def has_indexer(self, layer: int) -> bool:
        """MTP layers always own an indexer; target layers only when ``indexer_types`` says full."""
        return layer >= self.num_hidden_layers or self.indexer_types[layer] == "full"

    def is_moe(self, layer: int) -> bool:
        return layer >= self.num_hidden_layers or self.mlp_layer_types[layer] == "sparse"

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        return _parse(dict(d))

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ConfigError(f"config.json not found at {path}")
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
        return cls.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        """An HF-style config.json dict (what make-checkpoint writes)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("quantization", "eos_token_ids",
                                                                                   "rope_theta")}
        d["indexer_types"] = list(self.indexer_types)
        d["mlp_layer_types"] = list(self.mlp_layer_types)
        d["eos_token_id"] = list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0]
        d.pop("rope_yarn")
        d["rope_parameters"] = {"rope_theta": self.rope_theta, "rope_type": "default"}
        if self.rope_yarn is not None:
            y = self.rope_yarn
            d["rope_parameters"].update(rope_type="yarn", factor=y.factor, beta_fast=y.beta_fast, beta_slow=y.beta_slow,
                                        original_max_position_embeddings=y.original_max_position_embeddings,
                                        attention_factor=1.0, mscale_all_dim=y.mscale_all_dim, truncate=y.truncate)
        d["architectures"] = ["GlmMoeDsaForCausalLM" if self.model_type == "glm_moe_dsa" else "DeepseekV32ForCausalLM"]
        d["qk_head_dim"] = self.qk_head_dim
        d["head_dim"] = self.qk_rope_head_dim
        d["num_key_value_heads"] = self.num_attention_heads
        if self.model_type == "deepseek_v32":
            for k in ("indexer_types", "index_share_for_mtp_iteration"):
                d.pop(k)
        if self.quantization is not None:
            q = self.quantization
            d["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                        "activation_scheme": q.activation_scheme,
                                        "weight_block_size": list(q.block_size),
                                        "modules_to_not_convert": list(q.modules_to_not_convert)}
        return d

    def replace(self, **changes: Any) -> ModelConfig:
        """A new validated config with some fields changed (configs are never mutated)."""
        d = self.to_dict()
        d.update(changes)
        return ModelConfig.from_dict(d)


def derive_indexer_types(num_layers: int, freq: int | None, offset: int | None, pattern: Any) -> list[str]:
    """HF's IndexShare schedule: a pattern string ("FSSF…") wins, else full(i) ⇔ max(i-offset+1,0) % freq == 0."""
    if pattern is not None:
        if isinstance(pattern, str):
            bad = set(pattern) - {"F", "S"}
            if bad:
                raise ConfigError(f"index_topk_pattern may only contain 'F' and 'S', found {sorted(bad)}")
            return [{"F": "full", "S": "shared"}[c] for c in pattern]
        return list(pattern)
    freq = max(1 if freq is None else int(freq), 1)
    offset = 2 if offset is None else int(offset)
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(num_layers)]


def _get_int(d: dict, key: str, minimum: int = 1) -> int:
    v = d.pop(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"config field '{key}' must be an integer, got {v!r}")
    if v < minimum:
        raise ConfigError(f"config field '{key}' must be >= {minimum}, got {v}")
    return v


def _parse(d: dict[str, Any]) -> ModelConfig:
    model_type = d.pop("model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"config field 'model_type' is {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    for key in _REQUIRED:
        if key not in d and not (key == "n_routed_experts" and "num_experts" in d):
            raise ConfigError(f"config field '{key}' is required but missing")
    known = {f.name for f in fields(ModelConfig)} | _IGNORED_KEYS
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"unknown config field(s) {unknown} for model_type {model_type!r}")

    if d.get("num_experts") is not None:
        if d.get("n_routed_experts") is not None and d["n_routed_experts"] != d["num_experts"]:
            raise ConfigError(f"config fields 'num_experts' ({d['num_experts']}) and 'n_routed_experts' "
                              f"({d['n_routed_experts']}) disagree")
        d["n_routed_experts"] = d["num_experts"]
    ints = {k: _get_int(d, k) for k in _REQUIRED}
    L = ints["num_hidden_layers"]
    for key, default in _HF_DEFAULTS[model_type].items():     # absent or null: transformers' value
        if d.get(key) is None:
            d[key] = default
    for key in ("n_group", "topk_group", "first_k_dense_replace", "n_shared_experts", "max_position_embeddings"):
        ints[key] = _get_int(d, key, minimum=0 if key in ("first_k_dense_replace", "n_shared_experts") else 1)
    for key in ("routed_scaling_factor", "rms_norm_eps"):       # (finite: an inf or NaN eps gives NaN logits)
        d[key] = _positive(d, key, "", None)

    rope = {}
    for key in ("rope_scaling", "rope_parameters"):       # the legacy name (DeepSeek's configs), then transformers 5's
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise ConfigError(f"config field '{key}' must be an object, got {d[key]!r}")
        rope.update(d.get(key) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))      # "type": the legacy name transformers maps
    if rope_type not in ("default", "yarn"):
        raise ConfigError(f"config field 'rope_parameters.rope_type' is {rope_type!r}; 'default' and 'yarn' are "
                          "supported")
    rope_theta = _positive(rope, "rope_theta", "rope_parameters.", None)      # (null: absent, as transformers)
    rope_theta = rope_theta or _positive(d, "rope_theta", "", 10000.0)
    yarn = _parse_yarn(rope, ints["max_position_embeddings"]) if rope_type == "yarn" else None
    if d.get("rope_interleave") is False:     # transformers >= 5.11 and vLLM interleave whatever it says
        _log.warning("config field 'rope_interleave' is false: ignored, GLM-5 / DeepSeek-V3.2 MLA RoPE is interleaved "
                     "(as transformers and vLLM take it)")

    first_k = ints.pop("first_k_dense_replace")
    mlp_types = d.get("mlp_layer_types")
    if mlp_types is None:
        n_dense = min(first_k, L)
        mlp_types = ["dense"] * n_dense + ["sparse"] * (L - n_dense)
    mlp_types = _check_list(mlp_types, "mlp_layer_types", L, {"dense", "sparse"})

    if model_type == "deepseek_v32":
        if "indexer_types" in d and any(t != "full" for t in d["indexer_types"]):
            raise ConfigError("config field 'indexer_types': deepseek_v32 has no IndexShare (all layers 'full')")
        indexer_types = ["full"] * L
    elif d.get("indexer_types") is not None:
        indexer_types = _check_list(d["indexer_types"], "indexer_types", L, {"full", "shared"})
    else:
        indexer_types = derive_indexer_types(L, d.get("index_topk_freq"), d.get("index_skip_topk_offset"),
                                             d.get("index_topk_pattern"))
        indexer_types = _check_list(indexer_types, "index_topk_pattern", L, {"full", "shared"})
    if indexer_types[0] != "full":
        raise ConfigError("config field 'indexer_types': layer 0 must be 'full' (a shared layer reuses the "
                          "previous layer's top-k and layer 0 has none)")

    E, k = ints["n_routed_experts"], ints["num_experts_per_tok"]
    n_group, topk_group = ints.pop("n_group"), ints.pop("topk_group")
    if k > E:
        raise ConfigError(f"config field 'num_experts_per_tok' ({k}) exceeds n_routed_experts ({E})")
    if n_group < 1 or E % n_group:
        raise ConfigError(f"config field 'n_group' ({n_group}) must divide n_routed_experts ({E})")
    if not 1 <= topk_group <= n_group:
        raise ConfigError(f"config field 'topk_group' ({topk_group}) must be in [1, n_group={n_group}]")
    if n_group > 1 and E // n_group < 2:
        raise ConfigError("config field 'n_group': each group needs >= 2 experts (group score = sum of top-2)")
    if topk_group * (E // n_group) < k:
        raise ConfigError(f"config field 'topk_group' ({topk_group}) keeps fewer experts than num_experts_per_tok ({k})")
    if ints["qk_rope_head_dim"] % 2 or ints["qk_rope_head_dim"] > ints["index_head_dim"]:
        raise ConfigError("config field 'qk_rope_head_dim' must be even and <= index_head_dim")
    for key, expect in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc"), ("hidden_act", "silu")):
        if d.get(key, expect) != expect:
            raise ConfigError(f"config field '{key}' is {d[key]!r}; only {expect!r} is supported")
    if d.get("attention_bias", False):
        raise ConfigError("config field 'attention_bias' must be false (GLM-5 has no attention biases)")
    if d.get("tie_word_embeddings", False):
        raise ConfigError("config field 'tie_word_embeddings' must be false (GLM-5 has an untied lm_head)")
    n_mtp = d.get("num_nextn_predict_layers") or 0
    if n_mtp not in (0, 1) or isinstance(n_mtp, bool):
        raise ConfigError(f"config field 'num_nextn_predict_layers' is {n_mtp}; 0 or 1 supported")
    if "qk_head_dim" in d and d["qk_head_dim"] != ints["qk_nope_head_dim"] + ints["qk_rope_head_dim"]:
        raise ConfigError("config field 'qk_head_dim' != qk_nope_head_dim + qk_rope_head_dim")

    eos = d.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    return ModelConfig(
        model_type=model_type, **ints,
        indexer_types=tuple(indexer_types), mlp_layer_types=tuple(mlp_types),
        n_group=n_group, topk_group=topk_group, routed_scaling_factor=float(d["routed_scaling_factor"]),
        norm_topk_prob=bool(d.get("norm_topk_prob", True)), rms_norm_eps=float(d["rms_norm_eps"]),
        rope_theta=rope_theta, rope_yarn=yarn, rope_interleave=True,
        indexer_rope_interleave=(model_type == "glm_moe_dsa"), first_k_dense_replace=first_k,
        num_nextn_predict_layers=int(n_mtp),
        index_share_for_mtp_iteration=bool(d.get("index_share_for_mtp_iteration", False)),
        bos_token_id=d.get("bos_token_id"), eos_token_ids=eos_ids, pad_token_id=d.get("pad_token_id"),
        dtype=str(d.get("dtype") or d.get("torch_dtype") or "bfloat16"),
        quantization=_parse_quant(d.get("quantization_config")),
    )


def _positive(d: dict, key: str, prefix: str, default: float | None) -> float | None:
    """``d[key]`` as a positive number (``default`` where absent or null), else a ConfigError naming the field."""
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < float("inf"):
        raise ConfigError(f"config field '{prefix}{key}' must be a positive number, got {v!r}")
    return float(v)


def _parse_yarn(rope: dict, max_positions: int) -> Yarn:
    def number(key: str, default: float | None) -> float:
        v = rope.get(key, default)
        if v is None or isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(f"config field 'rope_parameters.{key}' (YaRN) must be a number, got {v!r}")
        return float(v)

    factor = number("factor", None)
    if factor <= 0:
        raise ConfigError(f"config field 'rope_parameters.factor' (YaRN) must be positive, got {factor!r}")
    yarn = Yarn(factor=factor, original_max_position_embeddings=int(number("original_max_position_embeddings",
                                                                            max_positions)),
                beta_fast=number("beta_fast", 32.0) or 32.0, beta_slow=number("beta_slow", 1.0) or 1.0,
                mscale_all_dim=number("mscale_all_dim", 0.0), truncate=bool(rope.get("truncate", True)))
    mscale, all_dim = rope.get("mscale"), yarn.mscale_all_dim
    attention = rope.get("attention_factor")
    if attention is None:        # transformers' inference of the cos/sin factor
        attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim) if mscale and all_dim else \
            yarn_mscale(factor)
    if abs(attention - 1.0) > 1e-12:
        raise ConfigError(f"config field 'rope_parameters' (YaRN): an attention_factor of {attention:.6g} (cos/sin "
                          "scaled) is not supported; DeepSeek's configs set mscale = mscale_all_dim, which makes it 1")
    return yarn


def _check_list(values: Any, name: str, length: int, allowed: set[str]) -> list[str]:
    if not isinstance(values, (list, tuple)) or len(values) != length:
        raise ConfigError(f"config field '{name}' must be a list of num_hidden_layers={length} entries, "
                          f"got {values!r}")
    bad = sorted({v for v in values if v not in allowed})
    if bad:
        raise ConfigError(f"config field '{name}' has invalid entries {bad}; allowed {sorted(allowed)}")
    return list(values)


def _parse_quant(q: Any) -> Fp8Config | None:
    if not q:
        return None
    if q.get("quant_method") != "fp8":
        raise ConfigError(f"config field 'quantization_config.quant_method' is {q.get('quant_method')!r}; "
                          "only 'fp8' block quantization is supported")
    if q.get("fmt", "e4m3") != "e4m3":
        raise ConfigError(f"config field 'quantization_config.fmt' is {q.get('fmt')!r}; only 'e4m3' is supported")
    block = tuple(q.get("weight_block_size") or (FP8_BLOCK, FP8_BLOCK))
    if block != (FP8_BLOCK, FP8_BLOCK):
        raise ConfigError(f"config field 'quantization_config.weight_block_size' is {list(block)}; only [128, 128]")
    return Fp8Config(block_size=block, activation_scheme=q.get("activation_scheme", "dynamic"),
                     modules_to_not_convert=tuple(q.get("modules_to_not_convert") or ()))


def num_blocks(n: int, block: int = FP8_BLOCK) -> int:
    return math.ceil(n / block)
