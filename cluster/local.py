"""Build a single-process engine (model + runner in this process) from an ``EngineConfig``."""

from __future__ import annotations

import sys
from pathlib import Path

from cluster.config import EngineConfig
from cluster.detok import TextOf
from cluster.engine import Engine, LocalExecutor
from cluster.guided import Guides
from scheduler.scheduler import SchedulerConfig


def load_tokenizer(path: str | Path, chat_template: str | None = None):
    """The checkpoint's tokenizer, or None when it ships none (token-id-only serving); ``chat_template``: a Jinja
    file whose template replaces the model's."""
    from models.tokenizer import Tokenizer

    path = Path(path)
    if not (path / "tokenizer.json").exists():
        if chat_template:
            raise ValueError(f"engine config field 'chat_template' is set, but {path} ships no tokenizer to use it")
        return None
    if chat_template and not Path(chat_template).is_file():
        raise ValueError(f"engine config field 'chat_template': no file {chat_template}")
    return Tokenizer.from_dir(path, chat_template=Path(chat_template).read_text(encoding="utf-8")
                              if chat_template else None)


# What transformers' GenerationConfig holds when generation_config.json says nothing; a value equal to it is no default
# of the model's (vLLM's ``--generation-config auto`` takes the file's differences from these, as here)
_HF_GENERATION = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "min_p": None, "repetition_penalty": 1.0,
                  "max_new_tokens": None}


def sampling_defaults(path: str | Path) -> dict:
    """The sampling defaults the model's ``generation_config.json`` sets (GLM's ship their recommended temperature /
    top_p): a request that leaves a field out takes the model's value, as vLLM's and SGLang's servers do. A value out
    of its range is an error naming the file's field."""
    import json

    f = Path(path) / "generation_config.json"
    if not f.is_file():
        return {}
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{f} is not valid JSON: {e}") from None
    rules = {"temperature": lambda v: 0 <= v <= 2, "top_p": lambda v: 0 < v <= 1, "min_p": lambda v: 0 <= v <= 1,
             "top_k": lambda v: isinstance(v, int) and v >= -1, "repetition_penalty": lambda v: v > 0,
             "max_new_tokens": lambda v: isinstance(v, int) and v >= 1}
    out = {}
    for key, ok in rules.items():
        v = data.get(key) if isinstance(data, dict) else None
        if v is None or v == _HF_GENERATION[key]:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not ok(v):
            raise ValueError(f"{f.name} field '{key}' has an invalid value {v!r}")
        out[key] = v
    return out


def max_model_len(cfg: EngineConfig, model_config, num_blocks: int) -> int:
    """The prompt + max_tokens limit: the configured one, else what the positions and the whole KV blocks hold. The
    scheduler enforces it and the HTTP edge advertises and checks it, so both take it from here."""
    return cfg.max_model_len or min(model_config.max_position_embeddings, num_blocks * cfg.block_size)


def scheduler_config(cfg: EngineConfig, model_config, tokenizer, num_blocks: int) -> SchedulerConfig:
    eos = set(model_config.eos_token_ids) | set(tokenizer.eos_token_ids if tokenizer else ())
    return SchedulerConfig(num_blocks=num_blocks, block_size=cfg.block_size,
                           max_model_len=max_model_len(cfg, model_config, num_blocks),
                           vocab_size=model_config.vocab_size, eos_token_ids=tuple(sorted(eos)),
                           max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                           max_waiting=cfg.max_waiting, max_waiting_tokens=cfg.max_waiting_tokens,
                           prefix_caching=cfg.prefix_caching, host_blocks=cfg.host_blocks,
                           policy=cfg.scheduling_policy)


def guides(tokenizer, model_config, sched: SchedulerConfig) -> Guides | None:
    """Structured output over the checkpoint's tokenizer (None without one: json_schema requests are refused)."""
    return Guides(tokenizer, model_config.vocab_size, sched.eos_token_ids) if tokenizer else None


def build_local_engine(cfg: EngineConfig, progress: bool = True) -> tuple[Engine, object]:
    """Load the model and tokenizer; returns (engine, tokenizer)."""
    import torch

    from glmkernels import ops
    from models.config import ModelConfig
    from models.loader import load_model
    from workers.memory import fit_kv_blocks
    from workers.runner import ModelRunner

    device = cfg.resolved_device()
    cfg.check_model(ModelConfig.from_json(cfg.model))
    ops.configure(cfg.kernels, device, cfg.kernel_overrides())
    model = load_model(cfg.model, dtype=cfg.resolved_dtype(), device=device, progress=progress,
                       load_format=cfg.load_format, mtp=cfg.speculative_tokens > 0)
    tokenizer = load_tokenizer(cfg.model)
    num_blocks = cfg.num_blocks or fit_kv_blocks(
        model.config, cfg.block_size, cfg.resolved_dtype(), cfg.kv_cache_dtype == "fp8", torch.device(device),
        cfg.gpu_memory_utilization, ModelRunner.extra_slots(), cfg.host_blocks * cfg.block_size)
    cfg.check_pool(num_blocks)
    if progress:
        report_pool(cfg, model.config, num_blocks)
    sched = scheduler_config(cfg, model.config, tokenizer, num_blocks)
    runner = ModelRunner(model, num_blocks, cfg.block_size, cfg.resolved_dtype(), device,
                         speculative=cfg.speculative_tokens > 0, graphs=cfg.graphs_mode(),
                         pieces=(cfg.max_num_batched_tokens, cfg.graphs_mode() == "capture")
                         if cfg.pieces() else None, host_blocks=cfg.host_blocks, kv_fp8=cfg.kv_cache_dtype == "fp8")
    decode = TextOf(tokenizer) if tokenizer else None
    engine = Engine(LocalExecutor(runner), sched, decode, speculative_tokens=cfg.speculative_tokens,
                    graphs=cfg.graphs_mode() != "off", special_ids=tokenizer.special_ids if tokenizer else (),
                    guides=guides(tokenizer, model.config, sched), kv_layout=cfg.kv_layout(model.config))
    if cfg.resolved_warmup_tokens(sched.max_model_len):
        engine.warm_up(cfg.resolved_warmup_tokens(sched.max_model_len), report if progress else None)
    return engine, tokenizer


def report_pool(cfg: EngineConfig, model_config, num_blocks: int) -> None:
    """Start-up: the KV pool a worker holds, and where its size came from."""
    from models.cache import KVCache

    slot = KVCache.bytes_per_slot(cfg.served(model_config), cfg.resolved_dtype(), cfg.kv_cache_dtype == "fp8")
    source = (f"sized to gpu_memory_utilization {cfg.gpu_memory_utilization}" if cfg.gpu_memory_utilization else
              "kv_cache_tokens")
    report(f"KV cache: {num_blocks * cfg.block_size} tokens a worker ({num_blocks} blocks, "
           f"{num_blocks * cfg.block_size * slot / 2**30:.2f} GiB at {slot / 1024:.1f} KiB a token; {source})")


def report(line: str) -> None:
    """Start-up progress on stderr (the engine's warm-up)."""
    print(f"glmserve: {line}", file=sys.stderr, flush=True)
