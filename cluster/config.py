"""Engine / cluster configuration: one frozen dataclass, built from CLI flags or a YAML/JSON mapping.

Unknown keys and bad values are errors naming the field. Runtime facts (the KV block count that
fits in memory, the device actually used) are computed at start and live elsewhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

DEFAULT_MODEL = str(Path(__file__).resolve().parents[1] / "models" / "tiny")


@dataclass(frozen=True)
class EngineConfig:
    model: str = DEFAULT_MODEL          # checkpoint folder (config.json + safetensors + tokenizer files)
    served_model_name: str | None = None
    chat_template: str | None = None    # a Jinja file that replaces the model's chat template (vLLM's --chat-template)
    load_format: str = "auto"           # auto: the checkpoint's weights | dummy: config.json only, random weights
    device: str = "auto"                # auto | cpu | cuda
    dtype: str = "auto"                 # auto (fp32 on CPU, bf16 on GPU) | float32 | bfloat16
    kernels: str = "auto"               # auto | reference
    prefill_activations: str = "bf16"   # bf16: W8A16 prefill | fp8: FP8 rows × FP8 weights (GPU, kernels auto)
    block_size: int = 16
    kv_cache_tokens: int = 32768        # KV slots per worker (unless gpu_memory_utilization sizes them)
    gpu_memory_utilization: float = 0.0  # > 0: the KV slots are sized to memory at start instead: weights, comm
                                        # buffers and KV cache take this fraction of each worker's device (as SGLang's
                                        # mem_fraction_static; on CPU, of the host), the rest stays for activations
                                        # and graphs; 0: kv_cache_tokens
    kv_cache_dtype: str = "auto"        # auto: the model's dtype | fp8: MLA rows as FlashMLA packs them (e4m3 latent,
                                        # a scale a 128 values, rope key in dtype: 656 bytes a layer for 1152), the
                                        # indexer's keys as DeepSeek-V3.2 (e4m3 and a scale: 144 bytes for 256)
    max_model_len: int | None = None    # default: min(max_position_embeddings, the KV slots in whole blocks)
    max_num_seqs: int = 64              # requests running at once in the replica (each rank its share)
    max_num_batched_tokens: int = 512   # tokens one rank's step takes at most
    max_waiting: int = 256              # queue bound (the replica's): beyond it requests are refused (HTTP 429)
    max_waiting_tokens: int = 0         # queue bound in prompt tokens still to compute (the replica's; 0: none, else
                                        # at least max_model_len): at it requests are refused (HTTP 429)
    prefix_caching: bool = True         # a prompt's leading full blocks reuse the KV an earlier request left (same
                                        # tokens from position 0, on the same rank); false: every prompt is computed
    host_kv_cache_tokens: int = 0       # host-memory KV slots per worker that keep cached prefixes evicted from the
                                        # device (copied there as they are cached, back when a prompt reuses them)
    scheduling_policy: str = "fcfs"     # fcfs: by arrival | priority: by the request's priority (lower first), then
                                        # arrival; a request that outranks running ones takes the worst one's place
    num_workers: int = 1                # N worker ranks (1, 2, 4, 8)
    moe: str = "tp"                     # tp | ep
    comm: str = "torch"                 # torch | ipc
    step_timeout_s: float = 60.0        # a step that overruns this fails its requests
    step_channel: str = "socket"        # Ray groups: socket (a TCP connection per actor) | ray (actor calls)
    speculative_tokens: int = 0         # MTP drafts per round (0 = off)
    cuda_graphs: str = "auto"           # auto: decode/verify steps replay CUDA graphs where supported | off | eager
    piece_graphs: bool = True           # with graphs on, the other steps (prompt chunks past the decode buckets)
                                        # replay per-layer graphs around their attention and comm
    lm_head_split: bool = True          # a group's graph steps and MTP drafting split the lm_head by vocabulary
                                        # (each rank reads 1/N of it; AG phases carry the slices); false: whole
    warmup_tokens: int | None = None    # start-up: capture the graph steps of contexts up to this many tokens, serve
                                        # short requests (kernels compile); 0: none; default: all (max_model_len)
                                        # with CUDA graphs
    log_stats_interval_s: float = 10.0  # the coordinator logs a stats line this often while requests come (0: never)
    reasoning_parser: str = "none"      # glm: chat text before </think> is returned as reasoning_content
    tool_parser: str = "none"           # glm: <tool_call>… in chat output becomes OpenAI tool_calls
    generation_config: str = "auto"     # auto: a request's unset temperature / top_p / top_k / min_p /
                                        # repetition_penalty / max_tokens take the model's generation_config.json
                                        # values (vLLM's --generation-config auto) | none: the API's neutral defaults

    def __post_init__(self) -> None:
        for f in fields(self):      # YAML / JSON give any type: a quoted number failed far from its field (TypeError)
            value = getattr(self, f.name)
            if not _has_type(value, f.type):
                raise ValueError(f"engine config field '{f.name}' has an invalid value {value!r}: it takes {f.type}")
        one_of = lambda name, *values: (getattr(self, name) in values, f"one of {', '.join(map(repr, values))}")
        checks = {      # field: (whether its value holds, the rule it breaks otherwise)
            "device": one_of("device", "auto", "cpu", "cuda"),
            "dtype": one_of("dtype", "auto", "float32", "bfloat16"),
            "kernels": one_of("kernels", "auto", "reference"),
            "prefill_activations": one_of("prefill_activations", "bf16", "fp8"),
            "load_format": one_of("load_format", "auto", "dummy"),
            "block_size": (self.block_size >= 1, "at least 1"),
            "kv_cache_tokens": (self.kv_cache_tokens >= self.block_size, f"at least block_size ({self.block_size})"),
            "kv_cache_dtype": one_of("kv_cache_dtype", "auto", "fp8"),
            "gpu_memory_utilization": (0.0 <= self.gpu_memory_utilization < 1.0,
                                       "a fraction in [0, 1) (0: kv_cache_tokens sizes the pool)"),
            "max_num_seqs": (self.max_num_seqs >= 1, "at least 1"),
            "max_num_batched_tokens": (self.max_num_batched_tokens >= self.max_num_seqs,
                                       f"at least max_num_seqs ({self.max_num_seqs}): a step takes a row of each"),
            "max_waiting": (self.max_waiting >= 0, "at least 0"),
            "max_waiting_tokens": (self.max_waiting_tokens >= 0, "at least 0"),
            "scheduling_policy": one_of("scheduling_policy", "fcfs", "priority"),
            "host_kv_cache_tokens": (self.host_kv_cache_tokens >= 0 and (self.prefix_caching or
                                                                         not self.host_kv_cache_tokens),
                                     "at least 0, and 0 without prefix_caching (the tier keeps cached prefixes)"),
            "num_workers": one_of("num_workers", 1, 2, 4, 8),
            "moe": one_of("moe", "tp", "ep"),
            "comm": one_of("comm", "torch", "ipc"),
            "step_timeout_s": (self.step_timeout_s > 0, "more than 0"),
            "log_stats_interval_s": (self.log_stats_interval_s >= 0, "at least 0"),
            "step_channel": one_of("step_channel", "socket", "ray"),
            "speculative_tokens": (0 <= self.speculative_tokens <= 7, "0 to 7"),
            "reasoning_parser": one_of("reasoning_parser", "none", "glm"),
            "tool_parser": one_of("tool_parser", "none", "glm"),
            "generation_config": one_of("generation_config", "auto", "none"),
            "max_model_len": (self.max_model_len is None or self.max_model_len >= 1, "at least 1 (or unset)"),
            "cuda_graphs": one_of("cuda_graphs", "auto", "off", "eager"),
            "warmup_tokens": (self.warmup_tokens is None or self.warmup_tokens >= 0, "at least 0 (or unset)"),
        }
        for name, (ok, rule) in checks.items():
            if not ok:
                verb = "takes" if rule.startswith(("one of", "a fraction")) else "must be"
                raise ValueError(f"engine config field '{name}' has an invalid value {getattr(self, name)!r}: it "
                                 f"{verb} {rule}")
        if self.prefill_activations == "fp8" and (self.kernels != "auto" or self.device == "cpu"):
            raise ValueError("engine config field 'prefill_activations' is 'fp8', which needs the Triton kernels on a "
                             f"CUDA device (kernels: auto, device: cuda or auto); got kernels {self.kernels!r}, "
                             f"device {self.device!r}")
        if not self.gpu_memory_utilization:
            self.check_pool(self.num_blocks)

    def check_pool(self, num_blocks: int) -> None:
        """A request lives on one rank: past a worker's KV blocks every long one (a chat's default max_tokens) would
        be refused. Checked at once for ``kv_cache_tokens``, once the workers are up when memory sizes the pool."""
        if self.max_model_len is not None and self.max_model_len > num_blocks * self.block_size:
            source = (f"gpu_memory_utilization {self.gpu_memory_utilization} leaves room for" if
                      self.gpu_memory_utilization else "kv_cache_tokens in whole blocks:")
            fix = "raise gpu_memory_utilization" if self.gpu_memory_utilization else "raise kv_cache_tokens"
            raise ValueError(f"engine config field 'max_model_len' ({self.max_model_len}) is more than a worker's KV "
                             f"cache holds ({source} {num_blocks * self.block_size} tokens): {fix} or lower "
                             "max_model_len")

    def check_model(self, model) -> None:
        """What the checkpoint's config (a ``ModelConfig``) bounds, checked before any worker loads it: a context past
        its positions (its output would degrade silently there), drafts from an MTP layer it does not have."""
        if self.max_model_len is not None and self.max_model_len > model.max_position_embeddings:
            raise ValueError(f"engine config field 'max_model_len' ({self.max_model_len}) is more than the model's "
                             f"positions (max_position_embeddings {model.max_position_embeddings} in its config.json): "
                             "lower max_model_len")
        if self.speculative_tokens and not model.num_nextn_predict_layers:
            raise ValueError(f"engine config field 'speculative_tokens' ({self.speculative_tokens}) needs the "
                             "checkpoint's MTP layer, and its config.json has none (num_nextn_predict_layers 0): set "
                             "speculative_tokens to 0")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown engine config field(s) {unknown}; known: {sorted(known)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def num_blocks(self) -> int:
        """KV blocks per worker: the whole blocks in ``kv_cache_tokens``; 0 when ``gpu_memory_utilization`` sizes them
        (each worker at start: ``workers/memory.py``; the group reports the number)."""
        return 0 if self.gpu_memory_utilization else self.kv_cache_tokens // self.block_size

    @property
    def host_blocks(self) -> int:
        """Host-memory blocks per worker (the prefix cache's second tier): the whole blocks in
        ``host_kv_cache_tokens``."""
        return self.host_kv_cache_tokens // self.block_size

    def graphs_mode(self) -> str:
        """The runner's ``graphs``: ``capture`` (auto, on a GPU with the Triton kernels; in a worker group the
        comm must be capturable — ipc, through its device-side phases — else the worker runs ``eager``),
        ``eager`` (the static-shape path without capture: for debugging), or ``off``."""
        if self.cuda_graphs != "auto":
            return self.cuda_graphs
        return "capture" if self.resolved_device() == "cuda" and self.kernels == "auto" else "off"

    def pieces(self) -> bool:
        """Whether a rank's other steps run on per-layer pieces (``workers/pieces.py``): ``piece_graphs`` with graphs
        on — captured on CUDA, where pieces hold no comm, so a group whose comm cannot be captured (``torch``) takes
        them too; run eagerly with ``cuda_graphs: eager`` (as the decode path's static shapes are)."""
        return self.piece_graphs and self.graphs_mode() != "off"

    def served(self, model_config):
        """The model as the workers hold it: without its MTP layer where this engine does not draft (its weights not
        read, no KV for it: 1.3 % of GLM-5's pool)."""
        return model_config if self.speculative_tokens else model_config.without_mtp()

    def kv_layout(self, model_config) -> tuple[tuple[int, str], ...]:
        """``KVCache.layout`` of the workers' caches (what a KV transfer between replicas must agree on)."""
        from models.cache import KVCache

        return KVCache.layout(self.served(model_config), self.resolved_dtype(), self.kv_cache_dtype == "fp8")

    def resolved_warmup_tokens(self, max_model_len: int | None = None) -> int:
        """``warmup_tokens``, its default resolved: every context a request can reach (the scheduler's
        ``max_model_len`` where given, else the configured one or the KV slots) where decode steps are captured as
        CUDA graphs — a capture or a kernel compile met while serving stalls every request in the step — else 0
        (nothing to capture)."""
        if self.warmup_tokens is not None:
            return self.warmup_tokens
        if self.graphs_mode() != "capture":
            return 0
        return max_model_len or self.max_model_len or self.kv_cache_tokens

    def kernel_overrides(self) -> dict[str, str]:
        """``ops.configure``'s per-op overrides: ``prefill_activations: fp8`` runs the FP8 linears and experts of
        prefill chunks (more than 256 rows) on the W8A8 kernels (glmkernels/triton_w8a8.py); decode stays W8A16."""
        if self.prefill_activations == "bf16":
            return {}
        if self.resolved_device() != "cuda":
            raise ValueError("engine config field 'prefill_activations' is 'fp8', which needs a CUDA device "
                             "(the W8A8 kernels are Triton's); use 'bf16' on CPU")
        return {"linear": "triton_w8a8", "moe_experts": "triton_w8a8"}

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved_dtype(self):
        import torch

        name = self.dtype if self.dtype != "auto" else ("bfloat16" if self.resolved_device() == "cuda" else "float32")
        return getattr(torch, name)


_TYPES = {"str": str, "int": int, "float": (int, float), "bool": bool}


def _has_type(value: Any, annotation: str) -> bool:
    """Whether ``value`` fits a field's annotation (``"int"``, ``"str | None"`` ...); a boolean is no number."""
    kinds = [k.strip() for k in annotation.split("|")]
    if value is None:
        return "None" in kinds
    return any(isinstance(value, _TYPES[k]) and (k == "bool" or not isinstance(value, bool))
               for k in kinds if k != "None")
