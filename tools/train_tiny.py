"""Train the embedded tiny GLM-5 model (``models/tiny``) on the CPU, and export it.

The loss is next-token cross-entropy + ``--mtp-weight`` × the MTP layer's next-next-token cross-entropy
(the MTP input at position p is the final-normed hidden of p and the actual token p+1), plus a KL loss
that teaches every DSA lightning indexer to rank keys like its layers' dense attention does
(DeepSeek-V3.2's indexer warm-up). The model gives its indexers no gradient (their inputs are detached
and top-k is not differentiable), so that KL is their only training signal. Attention is dense
(every key selected) for the first ``--dense-frac`` of the time budget, so that attention and then the
indexers learn something worth selecting; after that it is the checkpoint's sparse top-``index_topk``.
Routed experts are balanced without an auxiliary loss: after each step every router's
``e_score_correction_bias`` moves by ``--bias-rate`` × sign(mean load − expert load).

The learning-rate schedule runs on the time budget (``--minutes``, all resumes together), not on a
step count: linear warm-up, then cosine to 10 %. ``runs/tiny/ckpt.pt`` holds the model, the optimizer,
the step, the elapsed time and the RNG states; ``--resume`` continues from it.

Usage::

    python -m tools.train_tiny --minutes 40            # trains; Ctrl-C or a kill loses at most --ckpt-every steps
    python -m tools.train_tiny --resume                # continues until the budget is spent
    python -m tools.train_tiny --export                # runs/tiny/ckpt.pt -> models/tiny/{config.json,model.safetensors}
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

# The CPUs are shared: OpenMP threads that spin-wait at barriers burn the slice the other thread needs
# (measured 10-30x slower steps under load). Must be set before torch loads libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from models.cache import Batch, KVCache, contiguous_batch
from models.config import ModelConfig
from models.glm5 import Attention, GlmForCausalLM, Rope

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "models" / "tiny"
CORPUS_DIR = ROOT / "data" / "corpus"
RUN_DIR = ROOT / "runs" / "tiny"
EOS_ID = 0          # <|endoftext|>, appended after every corpus block

# Every structural feature of GLM-5.2 at a few million parameters: dense and MoE layers, grouped
# routing, full and shared indexer layers, index_topk below typical prompt lengths, one MTP layer.
TINY_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
    "vocab_size": 6144, "hidden_size": 256, "intermediate_size": 384, "moe_intermediate_size": 64,
    "num_hidden_layers": 6, "num_attention_heads": 4,
    "q_lora_rank": 128, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 64,
    "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "first_k_dense_replace": 2, "mlp_layer_types": ["dense", "dense", "sparse", "sparse", "sparse", "sparse"],
    "index_n_heads": 16, "index_head_dim": 64, "index_topk": 32,
    "indexer_types": ["full", "full", "shared", "shared", "full", "shared"],
    "num_nextn_predict_layers": 1, "index_share_for_mtp_iteration": True,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "rope_interleave": True,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "attention_bias": False, "tie_word_embeddings": False,
    "bos_token_id": 2, "eos_token_id": [0, 7, 9], "pad_token_id": 0, "dtype": "bfloat16",
}


# ---- data --------------------------------------------------------------------------------------
def load_tokens(split: str, corpus_dir: Path = CORPUS_DIR, cache_dir: Path = RUN_DIR) -> np.ndarray:
    """Token ids of ``{split}.txt`` (every block followed by <|endoftext|>), cached as ``{split}_ids.npy``."""
    from tokenizers import Tokenizer

    cache = cache_dir / f"{split}_ids.npy"
    if cache.exists():
        return np.load(cache)
    src = corpus_dir / f"{split}.txt"
    if not src.exists():
        raise FileNotFoundError(f"{src} not found: build the corpus with `python tools/corpus.py --out {corpus_dir}`")
    tok = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    blocks = [b for b in src.read_text(encoding="utf-8").split("\n\n") if b.strip()]
    ids: list[int] = []
    for enc in tok.encode_batch(blocks, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    arr = np.asarray(ids, dtype=np.uint16)
    cache_dir.mkdir(parents=True, exist_ok=True)
    np.save(cache, arr)
    return arr


def sample_windows(tokens: torch.Tensor, batch_size: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """``batch_size`` random windows of ``length`` consecutive tokens: [B, length] int64."""
    starts = torch.randint(0, tokens.numel() - length + 1, (batch_size,), generator=gen)    # the last one too
    return torch.stack([tokens[s:s + length] for s in starts.tolist()]).long()


# ---- model helpers -----------------------------------------------------------------------------
def init_weights(model: GlmForCausalLM, seed: int) -> None:
    """GPT-2 style: N(0, 0.02) matrices, residual-output projections scaled by 1/sqrt(2·layers), norms 1,
    biases (LayerNorm, e_score_correction_bias) 0."""
    g = torch.Generator().manual_seed(seed)
    out_std = 0.02 / math.sqrt(2 * model.config.num_cache_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                std = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)


def set_index_topk(model: GlmForCausalLM, index_topk: int) -> None:
    """Point every indexer at a config with this ``index_topk`` (≥ sequence length = dense attention).
    The model's own config (what gets exported) is untouched."""
    cfg = model.config.replace(index_topk=index_topk)
    for layer in model.model.layers:
        if layer.self_attn.indexer is not None:
            layer.self_attn.indexer.cfg = cfg


def checkpoint_state_dict(model: GlmForCausalLM) -> dict[str, torch.Tensor]:
    """Our state dict in checkpoint layout: stacked experts [E, ...] split into per-expert tensors."""
    out = {}
    for name, t in model.state_dict().items():
        if ".mlp.experts." in name:
            base, proj, leaf = name.rsplit(".", 2)
            for e in range(t.shape[0]):
                out[f"{base}.{e}.{proj}.{leaf}"] = t[e]
        else:
            out[name] = t
    return out


def step_batch(batch_size: int, seq_len: int) -> Batch:
    """One request per row, positions 0..seq_len-1, each in its own contiguous slots."""
    return contiguous_batch([(0, seq_len)] * batch_size, capacity=seq_len)


def causal_mask(seq_len: int) -> torch.Tensor:
    return torch.ones(seq_len, seq_len, dtype=torch.bool).tril()     # [S, T]


# ---- the indexer's KL loss -----------------------------------------------------------------------
class IndexerDistill:
    """KL(dense attention ‖ indexer) per indexer, DeepSeek-V3.2's indexer loss, from forward hooks.

    Each attention layer's dense attention distribution (heads summed and renormalised, detached) is
    recomputed from its own queries and the latents it cached; the target of an indexer is the mean over
    the layers that use its selection (itself and the ``shared`` layers after it). The indexer's own
    distribution is the softmax of its index scores over the causal keys, computed from detached inputs so
    that only the indexer weights receive this gradient. Rows are the step's [B, S] windows.
    """

    def __init__(self, model: GlmForCausalLM):
        cfg = model.config
        self.owner = {}
        for layer in range(cfg.num_cache_layers):
            self.owner[layer] = layer if cfg.has_indexer(layer) else self.owner[layer - 1]
        self.shape = (0, 0)
        self.targets: dict[int, list[torch.Tensor]] = {}
        self.inputs: dict[int, tuple[Attention, torch.Tensor, Rope]] = {}
        self.handles = [layer.self_attn.register_forward_hook(self._hook) for layer in model.model.layers]

    def start(self, batch_size: int, seq_len: int) -> None:
        self.shape = (batch_size, seq_len)
        self.targets.clear()
        self.inputs.clear()

    def _hook(self, attn: Attention, args: tuple, _out) -> None:
        h, rope, _batch, cache, layer = args[:5]
        if not torch.is_grad_enabled():
            return
        with torch.no_grad():
            self.targets.setdefault(self.owner[layer], []).append(self._dense_probs(attn, h, rope, cache.kv[layer]))
        if attn.indexer is not None:
            self.inputs[layer] = (attn, h.detach(), rope)

    def _dense_probs(self, attn: Attention, h: torch.Tensor, rope: Rope, kv_cache: torch.Tensor) -> torch.Tensor:
        """The layer's attention over all causal keys, mean over heads: [B, S, T] (rows sum to 1)."""
        cfg, (B, S) = attn.cfg, self.shape
        nh, dn, rkv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank
        q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(h))).view(B * S, nh, cfg.qk_head_dim)
        q_rope = rope.apply(q[..., dn:], cfg.rope_interleave)
        w_uk = attn.kv_b_proj.weight.view(nh, dn + cfg.v_head_dim, rkv)[:, :dn]
        q_lat = torch.einsum("nhd,hdc->nhc", q[..., :dn], w_uk)                     # [N, nh, rkv]
        kv = kv_cache[: B * S].detach().view(B, S, -1)                               # slots = rows here
        score = (torch.einsum("bshc,btc->bhst", q_lat.view(B, S, nh, rkv), kv[..., :rkv])
                 + torch.einsum("bshr,btr->bhst", q_rope.view(B, S, nh, -1), kv[..., rkv:])) * attn.scale
        probs = score.masked_fill(~causal_mask(S), float("-inf")).softmax(-1)        # [B, nh, S, T]
        return probs.mean(1)

    def loss(self) -> torch.Tensor:
        """Sum over indexers of the mean per-row KL divergence."""
        (B, S), total = self.shape, torch.zeros(())
        mask = causal_mask(S)
        for layer, (attn, h, rope) in self.inputs.items():
            target = torch.stack(self.targets[layer]).mean(0)                            # [B, S, T]
            logq = self._index_scores(attn, h, rope).masked_fill(~mask, float("-inf")).log_softmax(-1)
            kl = target * (target.clamp(min=1e-20).log() - logq.masked_fill(~mask, 0.0))
            total = total + kl.sum() / (B * S)
        return total

    def _index_scores(self, attn: Attention, h: torch.Tensor, rope: Rope) -> torch.Tensor:
        """Σ_h w_h · relu(q_h·k_t · scale), exactly the indexer's score, with grad to its weights: [B, S, T]."""
        ix, cfg, (B, S) = attn.indexer, attn.cfg, self.shape
        with torch.no_grad():
            q_resid = attn.q_a_layernorm(attn.q_a_proj(h))
        q = rope.apply(ix.wq_b(q_resid).view(B * S, cfg.index_n_heads, -1), cfg.indexer_rope_interleave)
        k = rope.apply(ix.k_norm(ix.wk(h)), cfg.indexer_rope_interleave)
        w = ix.weights_proj(h) * cfg.index_n_heads ** -0.5                               # [N, ih]
        s = torch.einsum("bshd,btd->bsht", q.view(B, S, cfg.index_n_heads, -1), k.view(B, S, -1))
        return torch.einsum("bsh,bsht->bst", w.view(B, S, -1), F.relu(s * cfg.index_head_dim ** -0.5))


class ExpertBalancer:
    """Aux-loss-free balancing: counts each router's expert loads per step, then nudges its bias."""

    def __init__(self, model: GlmForCausalLM):
        self.routers = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
        self.loads = {id(r): torch.zeros(r.cfg.n_routed_experts) for r in self.routers}
        self.handles = [r.register_forward_hook(self._hook) for r in self.routers]

    def _hook(self, router, _args, out) -> None:
        if torch.is_grad_enabled():
            self.loads[id(router)] += torch.bincount(out[0].flatten(), minlength=router.cfg.n_routed_experts)

    def update(self, rate: float) -> float:
        """bias += rate · sign(mean load − load); returns the worst max/mean load ratio of the step."""
        worst = 0.0
        with torch.no_grad():
            for r in self.routers:
                load = self.loads[id(r)]
                r.e_score_correction_bias += rate * torch.sign(load.mean() - load)
                worst = max(worst, float(load.max() / load.mean().clamp(min=1)))
                load.zero_()
        return worst


# ---- training ----------------------------------------------------------------------------------
def lr_at(step: int, progress: float, args: argparse.Namespace) -> float:
    warm = min(1.0, (step + 1) / args.warmup_steps)
    return args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def losses(model: GlmForCausalLM, windows: torch.Tensor, distill: IndexerDistill) -> dict[str, torch.Tensor]:
    """windows: [B, S+2] → next-token CE, MTP next-next-token CE and indexer KL of one step."""
    B, S = windows.shape[0], windows.shape[1] - 2
    batch, cache = step_batch(B, S), KVCache(model.config, B * S, torch.float32)
    distill.start(B, S)
    hidden = model(windows[:, :S].reshape(-1), batch, cache)                          # [B*S, H]
    lm = F.cross_entropy(model.logits(hidden), windows[:, 1:S + 1].reshape(-1))
    mtp_hidden, _ = model.mtp_forward(hidden, windows[:, 1:S + 1].reshape(-1), batch, cache)
    mtp = F.cross_entropy(model.logits(mtp_hidden), windows[:, 2:S + 2].reshape(-1))
    return {"lm": lm, "mtp": mtp, "kl": distill.loss()}


def make_optimizer(model: GlmForCausalLM, args: argparse.Namespace) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def save_ckpt(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)                    # a kill mid-save never leaves a broken checkpoint


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    ckpt_path = args.run_dir / "ckpt.pt"
    state = torch.load(ckpt_path, weights_only=False) if args.resume else None
    cfg = ModelConfig.from_dict(state["config"] if state else TINY_CONFIG)
    model = GlmForCausalLM(cfg)
    opt = make_optimizer(model, args)
    gen = torch.Generator().manual_seed(args.seed)
    step, elapsed, seen = 0, 0.0, 0
    if state:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["sampler_rng"])
        torch.set_rng_state(state["torch_rng"])
        step, elapsed, seen = state["step"], state["elapsed"], state["tokens"]
    else:
        init_weights(model, args.seed)
    model.train()
    tokens = torch.from_numpy(load_tokens("train").astype(np.int64))
    distill, balancer = IndexerDistill(model), ExpertBalancer(model)
    budget = args.minutes * 60.0
    dense = None

    bar = tqdm(total=round(budget), initial=min(round(elapsed), round(budget)), unit="s", dynamic_ncols=True,
               desc="train tiny", bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}s {postfix}")
    while elapsed < budget:
        t0 = time.time()
        progress = elapsed / budget
        if dense is not (progress < args.dense_frac):
            dense = progress < args.dense_frac
            set_index_topk(model, args.seq_len if dense else cfg.index_topk)
        lr = lr_at(step, progress, args)
        for g in opt.param_groups:
            g["lr"] = lr
        windows = sample_windows(tokens, args.batch_size, args.seq_len + 2, gen)
        parts = losses(model, windows, distill)
        loss = parts["lm"] + args.mtp_weight * parts["mtp"] + parts["kl"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        imbalance = balancer.update(args.bias_rate)
        step += 1
        seen += windows.numel()
        dt = time.time() - t0
        elapsed += dt
        bar.update(min(round(elapsed), round(budget)) - bar.n)
        bar.set_postfix_str(f"step {step} loss {parts['lm'].item():.3f} mtp {parts['mtp'].item():.3f} "
                            f"kl {parts['kl'].item():.3f} |g| {gnorm:.2f} load {imbalance:.2f} lr {lr:.1e} "
                            f"{'dense' if dense else 'sparse'} {args.batch_size * args.seq_len / dt:.0f} tok/s")
        if step % args.log_every == 0:
            with open(args.run_dir / "log.tsv", "a") as f:
                f.write(f"{step}\t{elapsed:.0f}\t{seen}\t{lr:.3e}\t{int(dense)}\t{parts['lm'].item():.4f}\t"
                        f"{parts['mtp'].item():.4f}\t{parts['kl'].item():.4f}\t{imbalance:.2f}\n")
        if step % args.ckpt_every == 0 or elapsed >= budget:
            save_ckpt(ckpt_path, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                                  "elapsed": elapsed, "tokens": seen, "sampler_rng": gen.get_state(),
                                  "torch_rng": torch.get_rng_state(), "config": cfg.to_dict(), "args": vars(args)})
    bar.close()
    print(f"done: {step} steps, {seen:,} tokens, {elapsed / 60:.1f} min; checkpoint {ckpt_path}")


def export(args: argparse.Namespace) -> None:
    """runs/tiny/ckpt.pt → ``--out``/config.json + model.safetensors (bf16; router fp32, as GLM ships it)."""
    from models.checkpoint import write_checkpoint

    state = torch.load(args.run_dir / "ckpt.pt", weights_only=False)
    cfg = ModelConfig.from_dict(state["config"])
    model = GlmForCausalLM(cfg)
    model.load_state_dict(state["model"])
    write_checkpoint(args.out, cfg, state_dict=checkpoint_state_dict(model), dtype="bfloat16")
    size = (args.out / "model.safetensors").stat().st_size
    n = sum(p.numel() for p in model.parameters())
    print(f"exported step {state['step']} ({n:,} parameters, {size / 1e6:.1f} MB) to {args.out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=40.0, help="total training time budget (all resumes)")
    p.add_argument("--resume", action="store_true", help="continue from <run-dir>/ckpt.pt")
    p.add_argument("--export", action="store_true", help="write <run-dir>/ckpt.pt to --out and exit")
    p.add_argument("--run-dir", type=Path, default=RUN_DIR)
    p.add_argument("--out", type=Path, default=MODEL_DIR)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--mtp-weight", type=float, default=0.3)
    p.add_argument("--dense-frac", type=float, default=0.25, help="fraction of the budget with dense attention")
    p.add_argument("--bias-rate", type=float, default=1e-3, help="e_score_correction_bias step (0 = off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ckpt-every", type=int, default=25)
    p.add_argument("--log-every", type=int, default=5)
    args = p.parse_args()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    if args.export:
        export(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
