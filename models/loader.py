"""Build a model from a safetensors checkpoint (one file or sharded) or from random weights.

``load_format: dummy`` reads only config.json and fills this rank's shard with random weights on the device
(FP8 where the config's ``quantization_config`` says so): benchmarks of full-width models without their
weights on disk, as vLLM's ``--load-format dummy``. Its outputs are meaningless, and the ranks' shards are
not slices of one model.

A weight is FP8 iff ``<name>.weight_scale_inv`` sits beside it in the checkpoint (the
``modules_to_not_convert`` list is not consulted); FP8 weights stay FP8 in memory. Routed experts are
stored per expert in the checkpoint and stacked per layer here; under a ``MoeShard`` each rank keeps
only its slice. Any missing, unexpected, misshapen or mistyped tensor is an error naming it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

from glmkernels.reference import FP8_DTYPE, fp8_quantize
from models.config import ModelConfig
from models.glm5 import GlmForCausalLM, Linear, MoeShard

_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|weight_scale_inv)$")
_TP_MLP = re.compile(r"\.mlp\.(?:shared_experts\.)?(gate_proj|up_proj|down_proj)\.(?:weight|weight_scale_inv)$")
_FP32_PARAMS = re.compile(r"\.mlp\.gate\.(weight|e_score_correction_bias)$")
# DeepSeek's checkpoints give the MTP layer copies of the embedding and the lm_head; it shares the target's (as GLM's
# checkpoints, which hold no copies): checked by shape, not read
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_MTP_COPIES = re.compile(r"^model\.layers\.(\d+)\.(embed_tokens\.weight|shared_head\.head\.weight)$")


class CheckpointError(ValueError):
    """A checkpoint tensor we cannot load; the message names the tensor, what was expected and found."""


_ST_DTYPES = {"F8_E4M3": FP8_DTYPE, "F8_E5M2": torch.float8_e5m2, "BF16": torch.bfloat16, "F16": torch.float16,
              "F32": torch.float32, "F64": torch.float64, "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16,
              "I32": torch.int32, "I64": torch.int64, "BOOL": torch.bool}


def _headers(f: Path) -> list[str]:
    """The tensor names in one safetensors file, from its header alone; a file we cannot read is an error naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(f, "pt") as fh:
            return list(fh.keys())
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{f.name}: not a readable safetensors file ({e})") from None


def checkpoint_files(path: Path) -> dict[str, Path]:
    """tensor name → file, from ``model.safetensors.index.json`` or the lone ``*.safetensors`` files. Every file's
    header is read first (seconds for a real checkpoint's ~140 shards): a truncated shard or an index that names a
    tensor its shard lacks is an error naming the file before any weight is read."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index.name} is not a safetensors index (JSON with a 'weight_map'): {e!r}") from None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index.name}: 'weight_map' must map tensor names to files")
        files = {name: path / f for name, f in weight_map.items()}
        by_file: dict[Path, list[str]] = {}
        for name, f in files.items():
            by_file.setdefault(f, []).append(name)
        for f, names in sorted(by_file.items()):
            if not f.exists():
                raise CheckpointError(f"{index.name} names {f.name}, which does not exist")
            held = set(_headers(f))
            lacking = [n for n in names if n not in held]
            if lacking:
                raise CheckpointError(f"{index.name} puts {lacking[0]} in {f.name}, which does not hold it"
                                      + (f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else ""))
        return files
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"no *.safetensors files in {path}")
    return {k: f for f in shards for k in _headers(f)}


def checkpoint_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint weight name → full (unsharded) shape; routed experts listed per expert."""
    with torch.device("meta"):
        full = GlmForCausalLM(cfg)
    out = {}
    for name, p in full.named_parameters():
        m = re.match(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_proj|up_proj|down_proj)\.weight$", name)
        if m:
            for e in range(cfg.n_routed_experts):
                out[f"{m[1]}.{e}.{m[2]}.weight"] = tuple(p.shape[1:])
        else:
            out[name] = tuple(p.shape)
    return out


def fp8_linears(model: nn.Module, quantized: set[str]) -> None:
    """Turn every Linear whose checkpoint weight carries a scale into an FP8 Linear."""
    modules = set()
    for q in quantized:
        m = _EXPERT.match(q)
        modules.add(f"{m[1]}.{m[3]}" if m else q[: -len(".weight")])
    for mname, mod in model.named_modules():
        if isinstance(mod, Linear) and mname in modules:
            mod.to_fp8()


def _shard(name: str, shape: tuple[int, ...], shard: MoeShard) -> tuple[int, int, int] | None:
    """This rank's part of a full checkpoint tensor as (dim, start, length), None for all of it: tp splits the MLP
    intermediate dim (rows of gate/up, columns of down; FP8 scales by whole 128-blocks); ep keeps whole experts."""
    if shard.world_size == 1:
        return None
    m = _EXPERT.match(name)
    if m:
        if shard.mode == "ep":
            return None
        proj = m[3]
    else:
        m = _TP_MLP.search(name)
        if not m:
            return None
        proj = m[1]
    dim = len(shape) - 1 if proj == "down_proj" else len(shape) - 2
    n = shape[dim] // shard.world_size
    return dim, shard.rank * n, n


def _check_tp_divisible(cfg: ModelConfig, shard: MoeShard, fp8: bool) -> None:
    dims = {"moe_intermediate_size": cfg.moe_intermediate_size * cfg.n_shared_experts,
            "intermediate_size": cfg.intermediate_size}
    if shard.mode == "tp":
        dims["moe_intermediate_size (per expert)"] = cfg.moe_intermediate_size
    for field, d in dims.items():
        unit = shard.world_size * (128 if fp8 and shard.world_size > 1 else 1)   # one rank: a partial last block is fine
        if d % unit:
            raise ValueError(f"{field}={d} cannot be split over {shard.world_size} ranks"
                             + (" in whole 128-column FP8 blocks" if fp8 else ""))
    if shard.mode == "ep" and cfg.n_routed_experts % shard.world_size:
        raise ValueError(f"n_routed_experts={cfg.n_routed_experts} not divisible by {shard.world_size} ranks (moe: ep)")


LOAD_FORMATS = ("auto", "dummy")


def load_model(path: str | Path, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
               shard: MoeShard | None = None, progress: bool = True, load_format: str = "auto",
               mtp: bool = True) -> GlmForCausalLM:
    """Read config.json and the safetensors weights at ``path`` into a model (this rank's shard);
    ``load_format="dummy"``: config.json only, random weights (see module docstring); ``mtp=False``: without the MTP
    layer (``ModelConfig.without_mtp``: an engine that does not draft), whose tensors are then not read."""
    from safetensors import safe_open
    from tqdm import tqdm

    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    path = Path(path)
    cfg = ModelConfig.from_json(path)
    unread = range(cfg.num_hidden_layers, cfg.num_cache_layers) if not mtp else range(0)
    cfg = cfg if mtp else cfg.without_mtp()
    shard = shard or MoeShard()
    if load_format == "dummy":
        return dummy_model(cfg, dtype, device, shard)
    files = {n: f for n, f in checkpoint_files(path).items()
             if not ((m := _LAYER.match(n)) and int(m[1]) in unread)}
    scales = {n[: -len("_scale_inv")] for n in files if n.endswith(".weight_scale_inv")}
    for w in scales:
        if w not in files:
            raise CheckpointError(f"tensor {w}_scale_inv has no weight {w} beside it")
    expected = checkpoint_shapes(cfg)
    copies = {n for n in files if (m := _MTP_COPIES.match(n)) and int(m[1]) >= cfg.num_hidden_layers}
    _check_tp_divisible(cfg, shard, fp8=bool(scales))
    unexpected = sorted(n for n in files
                        if n not in expected and n not in copies and n[: -len("_scale_inv")] not in scales)
    if unexpected:
        raise CheckpointError(f"unexpected tensor(s) in checkpoint: {unexpected[:5]}"
                              + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else ""))
    missing = sorted(n for n in expected if n not in files)
    if missing:
        raise CheckpointError(f"missing tensor(s) in checkpoint: {missing[:5]}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))

    model = _empty_model(cfg, shard, scales, dtype, device)
    params = dict(model.named_parameters())
    for w in scales:            # (only Linears become FP8: the embedding's, the router's scale has nowhere to go)
        if not _EXPERT.match(w) and f"{w}_scale_inv" not in params:
            raise CheckpointError(f"tensor {w}_scale_inv: {w} is not a linear layer's weight and cannot be FP8")
    experts = model.shard.expert_range(cfg.n_routed_experts)

    by_file: dict[Path, list[str]] = {}
    for name, f in files.items():
        by_file.setdefault(f, []).append(name)
    bar = tqdm(total=len(files), desc=f"loading {path.name}", unit="tensor", disable=not progress)
    for f, names in by_file.items():
        with safe_open(f, "pt", device="cpu") as fh:
            for name in names:
                if name in copies:
                    shape = tuple(fh.get_slice(name).get_shape())
                    if shape != (cfg.vocab_size, cfg.hidden_size):
                        raise CheckpointError(f"tensor {name}: expected shape {[cfg.vocab_size, cfg.hidden_size]}, "
                                              f"found {list(shape)}")
                else:
                    _load_one(name, fh.get_slice(name), params, expected, scales, model.shard, experts)
                bar.update(1)
    bar.close()
    return model.eval()


def _empty_model(cfg: ModelConfig, shard: MoeShard, fp8: set[str], dtype: torch.dtype,
                 device: str | torch.device) -> GlmForCausalLM:
    """The model's parameters allocated (uninitialized) on ``device``: the Linears named in ``fp8`` in FP8,
    the router in fp32, everything else in ``dtype``."""
    with torch.device("meta"):
        model = GlmForCausalLM(cfg, shard)
    fp8_linears(model, fp8)
    for name, p in model.named_parameters():      # on meta: the device then holds only the final dtypes, not fp32 first
        if p.dtype == torch.float32 and not name.endswith("_scale_inv") and not _FP32_PARAMS.search(name):
            p.data = p.data.to(dtype)
    return model.to_empty(device=device)


def dummy_model(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                shard: MoeShard | None = None, seed: int = 0) -> GlmForCausalLM:
    """This rank's shard with random weights made on ``device`` (no checkpoint): FP8 Linears when the config
    is FP8-quantized, with weights ~ N(0, 0.02) after dequantization; norms 1; the router fp32."""
    shard = shard or MoeShard()
    _check_tp_divisible(cfg, shard, fp8=cfg.quantization is not None)
    fp8 = {n for n in checkpoint_shapes(cfg) if quantizable(n)} if cfg.quantization is not None else set()
    model = _empty_model(cfg, shard, fp8, dtype, device)
    g = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dtype == FP8_DTYPE:
            for part in (p.data if p.dim() == 3 else [p.data]):       # per expert: bounded fp32 temporaries
                part.copy_(torch.randn(part.shape, device=part.device, generator=g).mul_(100).clamp_(-448, 448))
        elif name.endswith("_scale_inv"):
            p.data.uniform_(1.8e-4, 2.2e-4, generator=g)                # × ~N(0, 100) ≈ N(0, 0.02)
        elif "norm" in name and name.endswith("weight"):
            p.data.fill_(1.0)
        elif name.endswith("bias"):
            p.data.normal_(0, 0.01, generator=g)
        else:
            p.data.normal_(0, 0.02, generator=g)
    return model.eval()


def _load_one(name: str, sl, params: dict, expected: dict, scales: set[str], shard: MoeShard,
              experts: range) -> None:
    """Check one checkpoint tensor by its header (``sl``: safetensors' lazy slice) and read what this rank keeps of
    it: nothing of another rank's experts, the rank's rows or columns of a tp-split MLP weight."""
    is_scale = name.endswith(".weight_scale_inv")
    weight_name = name[: -len("_scale_inv")] if is_scale else name
    shape, found = expected[weight_name], tuple(sl.get_shape())
    dtype = _ST_DTYPES.get(sl.get_dtype())
    named = dtype if dtype is not None else sl.get_dtype()
    quantized = weight_name in scales
    if is_scale:
        want = tuple(-(-d // 128) for d in shape)
        if found != want or dtype != torch.float32:
            raise CheckpointError(f"tensor {name}: expected float32 {list(want)}, found {named} {list(found)}")
    else:
        if found != shape:
            raise CheckpointError(f"tensor {name}: expected shape {list(shape)}, found {list(found)}")
        if quantized and dtype != FP8_DTYPE:
            raise CheckpointError(f"tensor {name}: has a weight_scale_inv so expected float8_e4m3fn, found {named}")
        if not quantized and (dtype is None or not dtype.is_floating_point or dtype.itemsize == 1):
            raise CheckpointError(f"tensor {name}: expected a bf16/fp16/fp32 tensor, found {named}")
    m = _EXPERT.match(name)
    if m:
        e = int(m[2])
        if e not in experts:
            return
        target = params[f"{m[1]}.{m[3]}.{m[4]}"][e - experts.start]
    else:
        target = params[name]
    part = _shard(name, found, shard)
    if part is None:
        t = sl[:]
    else:
        dim, start, n = part
        t = sl[start:start + n] if dim == 0 else sl[:, start:start + n]
    target.data.copy_(t)


# ---- random weights ----------------------------------------------------------------------------
def random_state_dict(cfg: ModelConfig, seed: int = 0, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Full fp32 weights in checkpoint layout (per-expert keys), deterministic in ``seed``.

    Linear/embedding weights ~ N(0, std); norms 1 + 0.1·N(0,1) and biases 0.05·N(0,1) so that every
    weight visibly matters in parity tests.
    """
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in checkpoint_shapes(cfg).items():
        if "norm" in name and name.endswith(".bias") or name.endswith("e_score_correction_bias"):
            t = 0.05 * torch.randn(shape, generator=g)
        elif "norm" in name:
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            t = std * torch.randn(shape, generator=g)
        out[name] = t
    return out


def quantizable(name: str) -> bool:
    """Which checkpoint weights an FP8 build quantizes (reference §4): the big projections, not norms,
    router, embeddings, lm_head, indexer weights_proj or the MTP glue (enorm/hnorm/eh_proj/shared_head)."""
    if not name.endswith(".weight") or "norm" in name:
        return False
    skip = ("embed_tokens", "lm_head", ".mlp.gate.weight", "weights_proj", "eh_proj")
    return not any(s in name for s in skip)


def quantize_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in sd.items():
        if quantizable(name):
            out[name], out[name + "_scale_inv"] = fp8_quantize(t)
        else:
            out[name] = t
    return out


def random_model(cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", shard: MoeShard | None = None, std: float = 0.02,
                 fp8: bool = False) -> GlmForCausalLM:
    """A model with the random weights of ``random_state_dict`` (FP8-quantized when asked), no files."""
    import tempfile

    from models.checkpoint import write_checkpoint

    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(d, cfg, seed=seed, std=std, fp8=fp8)
        return load_model(d, dtype=dtype, device=device, shard=shard, progress=False)
