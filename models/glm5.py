"""The GLM-5 family (``glm_moe_dsa``, ``deepseek_v32``) in one file with one decoder loop.

MLA attention (absorbed: attends in the latent space over the cache) + DSA lightning indexer
(``full`` layers select top-k keys, ``shared`` layers reuse the previous selection) + MoE (sigmoid,
grouped top-k, shared expert) or dense MLP + the MTP layer. Parameter names follow the checkpoint
(``model.layers.{l}.self_attn.q_a_proj.weight`` …) except routed experts, which are stacked per layer
(``mlp.experts.gate_proj.weight [E, I, H]``) and filled from per-expert keys by the loader.

Math: reference/glm5_architecture.md §2–3. Every op goes through ``glmkernels.ops``. The MLP phases of
a layer (dense or MoE) gather the step's rows from all ranks and reduce-scatter partial sums back
(``self.comm``); on one process that comm is the identity.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glmkernels import ops
from glmkernels.reference import FP8_DTYPE, CacheRows
from models.cache import Batch, KVCache
from models.config import ModelConfig, Yarn, num_blocks


@dataclass(frozen=True)
class MoeShard:
    """This rank's slice of every MLP: ``tp`` = 1/N of each expert's (and dense MLP's) intermediate dim;
    ``ep`` = E/N whole experts (dense and shared MLPs still ``tp``)."""

    rank: int = 0
    world_size: int = 1
    mode: str = "tp"

    def expert_range(self, num_experts: int, mode: str | None = None) -> range:
        if (mode or self.mode) != "ep":
            return range(num_experts)
        n = num_experts // self.world_size
        return range(self.rank * n, (self.rank + 1) * n)


class LocalComm:
    """Single-process MLP phases: every row is local, partial sums are already whole."""

    def all_gather(self, rows: torch.Tensor) -> torch.Tensor:
        return rows

    def reduce_scatter(self, partial: torch.Tensor) -> torch.Tensor:
        return partial

    def argmax_logits(self, hidden: torch.Tensor, lm_head: Linear) -> torch.Tensor:
        return lm_head(hidden).argmax(dim=-1)

    def bucket_logits(self, hidden: torch.Tensor, lm_head: Linear) -> torch.Tensor:
        return lm_head(hidden).float()


class Linear(nn.Module):
    """``y = x @ W.T`` with no bias; FP8 block-scaled when ``weight_scale_inv`` is set (see ``to_fp8``)."""

    def __init__(self, in_features: int, out_features: int, num_stacked: int | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        lead = () if num_stacked is None else (num_stacked,)
        self.weight = nn.Parameter(torch.empty(*lead, out_features, in_features))
        self.weight_scale_inv: nn.Parameter | None = None

    def to_fp8(self) -> None:
        """Re-shape the parameters for an FP8 checkpoint: e4m3 weight + [⌈out/128⌉, ⌈in/128⌉] fp32 scales."""
        w = self.weight
        self.weight = nn.Parameter(torch.empty(w.shape, dtype=FP8_DTYPE, device=w.device), requires_grad=False)
        scale_shape = (*w.shape[:-2], num_blocks(self.out_features), num_blocks(self.in_features))
        self.weight_scale_inv = nn.Parameter(torch.empty(scale_shape, device=w.device), requires_grad=False)

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in ``dtype``. FP8 weights are dequantized once and kept (keyed on the weight's
        storage and version, so loading new weights in place invalidates it)."""
        if self.weight_scale_inv is None:
            return self.weight.to(dtype)
        key = (dtype, self.weight.data_ptr(), self.weight._version, self.weight_scale_inv._version)
        if getattr(self, "_dense_key", None) != key:
            self._dense = ops.fp8_dequant(self.weight, self.weight_scale_inv, dtype)
            self._dense_key = key
        return self._dense

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.weight_scale_inv)


class StackedLinear(Linear):
    """The same Linear for E experts: weight [E, out, in] (+ scales [E, ⌈out/128⌉, ⌈in/128⌉] when FP8)."""

    def __init__(self, num: int, in_features: int, out_features: int):
        super().__init__(in_features, out_features, num_stacked=num)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise TypeError("stacked expert weights are applied by ops.moe_experts")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual) in one op."""
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps)


@functools.cache
def inv_freq(dim: int, theta: float, device: torch.device, yarn: Yarn | None = None) -> torch.Tensor:
    """RoPE's inverse frequencies [dim/2] fp32 on ``device``, computed as HF does (YaRN's blend too), once per device
    (first made by an eager step: a decode graph's capture follows its warm-up)."""
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim)
    if yarn is None:
        return 1.0 / pos_freqs
    low, high = yarn.ramp(dim, theta)
    high += 0.001 if low == high else 0.0
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1).to(device)
    extrapolated = 1 - ramp
    return 1.0 / (yarn.factor * pos_freqs) * (1 - extrapolated) + 1.0 / pos_freqs * extrapolated


@dataclass
class Rope:
    """cos/sin of the step's positions: [N, dr/2] each, in the activation dtype (as HF casts them)."""

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def at(cls, positions: torch.Tensor, cfg: ModelConfig, dtype: torch.dtype) -> Rope:
        freq = inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta, positions.device, cfg.rope_yarn)
        ang = positions[:, None] * freq[None, :]                                     # fp32, as .float() * f
        return cls(ang.cos().to(dtype), ang.sin().to(dtype))

    def apply(self, x: torch.Tensor, interleaved: bool) -> torch.Tensor:
        """x: [N, ..., D ≥ dr]: its first dr dims rotated (``ops.rope``); cos/sin broadcast over the middle dims."""
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (self.cos.shape[-1],)
        return ops.rope(x, self.cos.view(shape), self.sin.view(shape), interleaved)


class Indexer(nn.Module):
    """DSA lightning indexer: scores every cached key of the request and keeps the top ``index_topk``. Driven by
    ``Attention.prepare`` (its keys ``key_rows`` cached in MLA's cache-row launch, then ``query``) and ``select``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wq_b = Linear(cfg.q_lora_rank, cfg.index_n_heads * cfg.index_head_dim)
        self.wk = Linear(cfg.hidden_size, cfg.index_head_dim)
        self.k_norm = LayerNorm(cfg.index_head_dim, 1e-6)
        self.weights_proj = Linear(cfg.hidden_size, cfg.index_n_heads)

    def key_rows(self, k: torch.Tensor, k_cache: torch.Tensor) -> CacheRows:
        """This step's indexer keys ``k = wk(h)`` [N, idd] as rows for ``ops.norm_rope_store`` (LayerNorm'd, then
        the first dr dims roped, into their slots of ``k_cache``)."""
        n = self.k_norm
        return CacheRows(k.detach(), n.weight.detach(), n.bias.detach(), n.eps, self.cfg.index_head_dim, 0,
                         self.cfg.indexer_rope_interleave, k_cache)

    def query(self, h: torch.Tensor, q: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
        """(roped queries [N, ih, idd], head weights [N, ih] fp32): the per-row work before scoring, given the
        queries ``q = wq_b(q_resid)`` [N, ih · idd] (projected beside MLA's q_b: ``Attention.prepare``)."""
        cfg, N = self.cfg, h.shape[0]
        q = q.view(N, cfg.index_n_heads, cfg.index_head_dim)
        q = rope.apply(q, cfg.indexer_rope_interleave)                                 # heads [rope | nope]
        wp = self.weights_proj                         # head weights [N, ih] fp32 (bf16 in GLM-5.2; FP8 composed)
        w = (ops.linear_f32(h, wp.weight, rounded=True, scale=cfg.index_n_heads ** -0.5)
             if wp.weight_scale_inv is None else wp(h).float() * cfg.index_n_heads ** -0.5)
        return q.detach(), w.detach()

    def select(self, q: torch.Tensor, w: torch.Tensor, batch: Batch, k_cache: torch.Tensor) -> torch.Tensor:
        """Selected slots [N, K] (-1 = none) of the cached keys each row may see, by index score."""
        cfg = self.cfg
        scale = cfg.index_head_dim ** -0.5
        if batch.block_table is not None:
            return ops.indexer_topk_paged(q, w, k_cache, batch.block_table, batch.block_size, batch.positions,
                                          cfg.index_topk, scale)
        return ops.indexer_topk(q, w, k_cache, batch.seq_rows, batch.seq_slots, batch.positions, cfg.index_topk,
                                scale, batch.ragged)


class Attention(nn.Module):
    """MLA with weight absorption: attends in the ``kv_lora_rank`` latent space over the selected slots."""

    def __init__(self, cfg: ModelConfig, has_indexer: bool):
        super().__init__()
        self.cfg = cfg
        nh = cfg.num_attention_heads
        self.q_a_proj = Linear(cfg.hidden_size, cfg.q_lora_rank)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6)      # 1e-6, not rms_norm_eps (HF default arg)
        self.q_b_proj = Linear(cfg.q_lora_rank, nh * cfg.qk_head_dim)
        self.kv_a_proj_with_mqa = Linear(cfg.hidden_size, cfg.kv_cache_dim)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, 1e-6)
        self.kv_b_proj = Linear(cfg.kv_lora_rank, nh * (cfg.qk_nope_head_dim + cfg.v_head_dim))
        self.o_proj = Linear(nh * cfg.v_head_dim, cfg.hidden_size)
        self.indexer = Indexer(cfg) if has_indexer else None
        m = cfg.rope_yarn.softmax_mscale if cfg.rope_yarn else 1.0
        self.scale = cfg.qk_head_dim ** -0.5 * m * m            # (YaRN's mscale², in transformers' order)

    def forward(self, h: torch.Tensor, rope: Rope, batch: Batch, cache: KVCache, layer: int,
                carried_topk: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """h: [N, H] → (attention output [N, H], selected slots [N, K]).

        ``carried_topk`` None: this layer's indexer selects. Given: reuse it (an IndexShare ``shared`` layer, or
        an MTP draft step sharing the first step's selection — whose indexer still caches its keys)."""
        q_lat, q_rope, index_q = self.prepare(h, rope, batch, cache, layer, carried_topk is None)
        topk = carried_topk if index_q is None else self.indexer.select(*index_q, batch, cache.index_k[layer])
        return self.finish(self.attend(q_lat, q_rope, cache.kv[layer], topk, batch)), topk

    def attend(self, q_lat: torch.Tensor, q_rope: torch.Tensor, kv: torch.Tensor, topk: torch.Tensor,
               batch: Batch) -> torch.Tensor:
        """The sparse attention over the selection → o_lat [N, nh, rkv] (told whether some row selects fewer keys
        than the selection's width: the Triton kernel then stops at each row's last one)."""
        return ops.mla_sparse_attention(q_lat, q_rope, kv, topk, self.scale, trim=batch.short_rows(topk.shape[1]))

    def prepare(self, h: torch.Tensor, rope: Rope, batch: Batch, cache: KVCache, layer: int, select: bool
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """The per-row work before attending: writes the step's KV (and indexer keys) to ``batch.slot_mapping``;
        returns (absorbed queries [N, nh, rkv], roped queries [N, nh, dr], the indexer's (queries, head weights)
        when ``select``, else None). Reads only the rows' own state, so it runs on padded rows too."""
        cfg, N = self.cfg, h.shape[0]
        nh, dn, rkv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank
        # the projections of h in one launch at one row: q_a, kv_a (and the indexer's key)
        projs = [self.q_a_proj, self.kv_a_proj_with_mqa] + ([self.indexer.wk] if self.indexer is not None else [])
        q_a, ckv, *index_k = ops.linear_group(h, *((p.weight, p.weight_scale_inv) for p in projs))
        # in one launch: ckv [N, rkv + dr] (RMSNorm'd latent | roped key) to the slots, q_a's RMSNorm → q_resid
        # [N, rq], the indexer's keys to theirs
        qn = self.q_a_layernorm
        q_resid = torch.empty(q_a.shape, dtype=torch.promote_types(qn.weight.dtype, q_a.dtype), device=q_a.device)
        also = (CacheRows(q_a, qn.weight, None, qn.eps, q_a.shape[-1], None, False, q_resid, at_slots=False),)
        if self.indexer is not None:
            also += (self.indexer.key_rows(index_k[0], cache.index_k[layer]),)
        ops.norm_rope_store(ckv, self.kv_a_layernorm.weight, None, self.kv_a_layernorm.eps, rkv,      # trainable
                            rope.cos, rope.sin, rkv, cfg.rope_interleave, cache.kv[layer], batch.slot_mapping,
                            also=also)
        assert not select or self.indexer is not None, "a shared indexer layer needs the previous layer's selection"
        # q_b (and the indexer's wq_b when this layer selects) of q_resid, in one launch at several rows
        projs = [self.q_b_proj] + ([self.indexer.wq_b] if select else [])
        q, *q_index = ops.linear_group(q_resid, *((p.weight, p.weight_scale_inv) for p in projs))
        q = q.view(N, nh, cfg.qk_head_dim)                                             # MLA layout: [nope | rope]
        index_q = self.indexer.query(h, q_index[0], rope) if select else None
        q_lat, q_rope = ops.mla_absorb_rope(q, self.kv_b_proj, dn, rope.cos, rope.sin, cfg.rope_interleave)
        return q_lat, q_rope, index_q                                                  # absorbed by W_UK, roped

    def finish(self, o_lat: torch.Tensor) -> torch.Tensor:
        """The attention's output rows [N, H] from the latent ones [N, nh, rkv]: expand with W_UV, then o_proj."""
        cfg, N = self.cfg, o_lat.shape[0]
        o = ops.mla_expand(o_lat, self.kv_b_proj, cfg.qk_nope_head_dim)
        return self.o_proj(o.reshape(N, cfg.num_attention_heads * cfg.v_head_dim))


class MLP(nn.Module):
    """SwiGLU MLP (dense layers and the shared expert), holding this rank's slice of the intermediate dim."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = Linear(hidden, inter)
        self.up_proj = Linear(hidden, inter)
        self.down_proj = Linear(inter, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_proj, self.up_proj            # gate and up of x in one launch where a kernel takes both
        gate, up = ops.linear_group(x, (g.weight, g.weight_scale_inv), (u.weight, u.weight_scale_inv))
        return self.down_proj(F.silu(gate) * up)

    def weights(self) -> tuple:
        """(gate, up, down, their scales or None): the MLP as ``ops.moe_experts`` takes a shared expert."""
        g, u, d = self.gate_proj, self.up_proj, self.down_proj
        return g.weight, u.weight, d.weight, g.weight_scale_inv, u.weight_scale_inv, d.weight_scale_inv


class Router(nn.Module):
    """``mlp.gate``: fp32 router weight and the selection-only ``e_score_correction_bias``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden_size, dtype=torch.float32))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.n_routed_experts, dtype=torch.float32),
                                                    requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cfg
        logits = ops.linear_f32(x, self.weight)                                        # [N, E] fp32
        return ops.router_topk(logits, self.e_score_correction_bias, c.num_experts_per_tok, c.n_group,
                               c.topk_group, c.norm_topk_prob, c.routed_scaling_factor)


class Experts(nn.Module):
    """This rank's routed experts, stacked: experts ``expert_offset ..`` with intermediate slice ``I_l``."""

    def __init__(self, cfg: ModelConfig, shard: MoeShard):
        super().__init__()
        experts = shard.expert_range(cfg.n_routed_experts)
        inter = cfg.moe_intermediate_size // (1 if shard.mode == "ep" else shard.world_size)
        self.expert_offset, self.n_experts = experts.start, cfg.n_routed_experts
        self.gate_proj = StackedLinear(len(experts), cfg.hidden_size, inter)
        self.up_proj = StackedLinear(len(experts), cfg.hidden_size, inter)
        self.down_proj = StackedLinear(len(experts), inter, cfg.hidden_size)

    def forward(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor,
                shared: MLP | None = None) -> torch.Tensor:
        """Σ of the routed experts (+ ``shared``'s output, added last: one op, so a kernel may fuse it)."""
        g, u, d = self.gate_proj, self.up_proj, self.down_proj
        return ops.moe_experts(x, topk_idx, topk_w, g.weight, u.weight, d.weight, g.weight_scale_inv,
                               u.weight_scale_inv, d.weight_scale_inv, self.expert_offset,
                               shared=None if shared is None else shared.weights(), n_experts=self.n_experts)


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, shard: MoeShard):
        super().__init__()
        self.gate = Router(cfg)
        self.experts = Experts(cfg, shard)
        self.shared_experts = MLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts
                                  // shard.world_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        topk_idx, topk_w = self.gate(x)                # every rank routes every row identically
        return self.experts(x, topk_idx, topk_w, shared=self.shared_experts)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shard: MoeShard):
        super().__init__()
        self.layer = layer
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, cfg.has_indexer(layer))
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = (MoE(cfg, shard) if cfg.is_moe(layer)
                    else MLP(cfg.hidden_size, cfg.intermediate_size // shard.world_size))
        self.comm = LocalComm()

    def forward(self, x: torch.Tensor, rope: Rope, batch: Batch, cache: KVCache, carried_topk: torch.Tensor | None,
                mlp_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's input is x + mlp_out (the layer before's MLP output, None for the first layer); returns
        (x', mlp_out', selected slots) with output x' + mlp_out'. Each residual add is done by the next norm
        (``add_rms_norm``: the same rounded sum, one launch fewer)."""
        h, x = (self.input_layernorm(x), x) if mlp_out is None else self.input_layernorm.add_forward(mlp_out, x)
        a, topk = self.self_attn(h, rope, batch, cache, self.layer, carried_topk)
        h, x = self.post_attention_layernorm.add_forward(a, x)
        rows = self.comm.all_gather(h)                                # AG: the step's rows to every rank
        return x, self.comm.reduce_scatter(self.mlp(rows)), topk      # RS: partial sums to each row's owner


class SharedHead(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MTPLayer(DecoderLayer):
    """Multi-token prediction: ``eh_proj(cat(enorm(embed(t_{p+1})), hnorm(h_p)))`` → a decoder layer →
    ``shared_head.norm`` → the target's lm_head predicts t_{p+2}."""

    def __init__(self, cfg: ModelConfig, layer: int, shard: MoeShard):
        super().__init__(cfg, layer, shard)
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = Linear(2 * cfg.hidden_size, cfg.hidden_size)
        self.shared_head = SharedHead(cfg)


class GlmModel(nn.Module):
    def __init__(self, cfg: ModelConfig, shard: MoeShard):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        layers: list[nn.Module] = [DecoderLayer(cfg, i, shard) for i in range(cfg.num_hidden_layers)]
        layers += [MTPLayer(cfg, cfg.num_hidden_layers + j, shard) for j in range(cfg.num_nextn_predict_layers)]
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class GlmForCausalLM(nn.Module):
    """The target model plus its MTP layer. ``forward`` returns final-normed hidden states [N, H];
    ``logits`` applies the lm_head; ``mtp_forward`` runs one draft step."""

    def __init__(self, cfg: ModelConfig, shard: MoeShard | None = None):
        super().__init__()
        self.config = cfg
        self.shard = shard or MoeShard()
        self.model = GlmModel(cfg, self.shard)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        self.comm = LocalComm()          # the group's view (``set_comm``): greedy ids over the vocabulary's slices

    @property
    def target_layers(self) -> list[DecoderLayer]:
        return list(self.model.layers[: self.config.num_hidden_layers])

    @property
    def mtp_layer(self) -> MTPLayer | None:
        layers = self.model.layers
        return layers[self.config.num_hidden_layers] if len(layers) > self.config.num_hidden_layers else None

    def set_comm(self, comm) -> None:
        """Install the MLP-phase communicator (AG/RS) on every layer; done once by the worker at start."""
        self.comm = comm
        for layer in self.model.layers:
            layer.comm = comm

    def _embed(self, ids: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, Rope]:
        """The embeddings of ``ids`` and the rope angles of the step's positions (one op: ``embed_rope``)."""
        cfg = self.config
        freq = inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta, ids.device, cfg.rope_yarn)
        x, cos, sin = ops.embed_rope(ids, self.model.embed_tokens.weight, batch.positions, freq)
        return x, Rope(cos, sin)

    def forward(self, input_ids: torch.Tensor, batch: Batch, cache: KVCache,
                topk_out: list | None = None) -> torch.Tensor:
        """input_ids: [N] → final-normed hidden [N, H]. Writes the step's KV into ``cache``.
        ``topk_out``, when given, receives each layer's selected slots (for parity tests)."""
        x, rope = self._embed(input_ids, batch)
        topk = m = None
        for i, layer in enumerate(self.target_layers):
            x, m, topk = layer(x, rope, batch, cache, None if self.config.has_indexer(i) else topk, m)
            if topk_out is not None:
                topk_out.append(topk)
        return self.model.norm.add_forward(m, x)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [M, H] → logits [M, V] in fp32."""
        return self.lm_head(hidden).float()

    def bucket_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``logits`` of a graph step's static bucket [R, H] → [R, V]. In a worker group every rank calls it with the
        same R, each reading 1/N of the lm_head (``StepComm.bucket_logits``: a span's rows are the owner's)."""
        return self.comm.bucket_logits(hidden, self.lm_head)

    def greedy_ids(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [M, H] → each row's logits' argmax [M], as ``logits(hidden).argmax(-1)``. In a worker group every
        rank calls it with the same M (pad rows included) and reads only its 1/N of the lm_head (``StepComm``)."""
        return self.comm.argmax_logits(hidden, self.lm_head)

    def mtp_forward(self, hidden: torch.Tensor, next_ids: torch.Tensor, batch: Batch, cache: KVCache,
                    topk: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One MTP step. hidden: [N, H] final-normed target (or previous draft) hidden at position p;
        next_ids: [N] tokens at p+1; batch positions are p. ``topk`` given → reuse that selection and skip
        the MTP indexer (index sharing across draft steps). Returns (normed hidden [N, H], selected slots)."""
        mtp = self.mtp_layer
        assert mtp is not None, "this checkpoint has no MTP layer (num_nextn_predict_layers = 0)"
        e, rope = self._embed(next_ids, batch)
        z = mtp.eh_proj(torch.cat([mtp.enorm(e), mtp.hnorm(hidden)], dim=-1))
        if z.dtype != e.dtype:                   # the angles in the activations' dtype (as HF casts them)
            rope = Rope.at(batch.positions, self.config, z.dtype)
        x, m, topk = mtp(z, rope, batch, cache, topk)
        return mtp.shared_head.norm.add_forward(m, x)[0], topk
