"""The offline tools that build ``models/tiny``, part 2: the trainer (``tools/train_tiny.py``: schedule, data windows,
initialisation, the indexer's KL loss, aux-free expert balancing, checkpoints, resume, export) and the evaluator
(``tools/eval_tiny.py``). Training runs on a shrunken config for a few steps, its clock a fake one so that the step
count (the schedule runs on a time budget) is exact and the run is deterministic."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models.cache import KVCache, contiguous_batch
from models.config import ModelConfig
from models.glm5 import GlmForCausalLM
from models.loader import checkpoint_shapes, load_model
from tools import train_tiny as tr

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "models" / "tiny"

# Every structural feature of TINY_CONFIG (dense and MoE layers, grouped routing, full and shared indexers, an MTP
# layer, index_topk below the window) at a size that trains a step in a few hundredths of a second.
SMALL = dict(tr.TINY_CONFIG, vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=16,
             num_hidden_layers=4, num_attention_heads=2, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
             qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
             first_k_dense_replace=1, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
             index_n_heads=4, index_head_dim=32, index_topk=4, indexer_types=["full", "shared", "shared", "full"])
SEQ = 12                                                 # > index_topk: the sparse phase selects
TOKENS = torch.tensor([3 + (7 * i + i // 5) % 29 for i in range(600)])      # a learnable, not trivial, sequence


@pytest.fixture(autouse=True)
def keep_torch_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def small_model(seed: int = 0, **fields) -> GlmForCausalLM:
    model = GlmForCausalLM(dataclasses.replace(ModelConfig.from_dict(SMALL), **fields))
    tr.init_weights(model, seed)
    return model


# ---- schedule, data, helpers -----------------------------------------------------------------------------------------
def test_lr_warms_up_linearly_then_decays_by_cosine_to_ten_percent():
    args = argparse.Namespace(lr=1e-2, warmup_steps=10)
    warm = [1e-3 * (s + 1) for s in range(10)] + [1e-2] * 2
    assert [tr.lr_at(s, 0.0, args) for s in range(12)] == pytest.approx(warm)
    for p in (0.0, 0.25, 0.5, 0.75, 1.0):
        assert tr.lr_at(50, p, args) == pytest.approx(1e-2 * (0.1 + 0.45 * (1 + math.cos(math.pi * p))))
    assert tr.lr_at(50, 0.5, args) == pytest.approx(5.5e-3) and tr.lr_at(50, 1.0, args) == pytest.approx(1e-3)
    assert tr.lr_at(50, 1.5, args) == pytest.approx(1e-3)                       # past the budget: stays at 10 %
    assert tr.lr_at(4, 0.5, args) == pytest.approx(0.5 * 5.5e-3)                 # warm-up and decay multiply


def test_sample_windows():
    tokens = torch.arange(100, dtype=torch.int32)
    w = tr.sample_windows(tokens, 500, 10, torch.Generator().manual_seed(1))
    assert w.shape == (500, 10) and w.dtype == torch.int64
    assert torch.equal(w - w[:, :1], torch.arange(10).expand(500, 10))           # consecutive tokens
    assert w[:, 0].min() == 0 and w[:, -1].max() == 99            # anywhere in the text, its last token included
    assert torch.equal(w, tr.sample_windows(tokens, 500, 10, torch.Generator().manual_seed(1)))
    assert not torch.equal(w, tr.sample_windows(tokens, 500, 10, torch.Generator().manual_seed(2)))


def test_causal_mask_and_step_batch():
    assert torch.equal(tr.causal_mask(4), torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]).bool())
    batch = tr.step_batch(3, 5)
    assert batch.positions.tolist() == list(range(5)) * 3
    assert batch.slot_mapping.tolist() == list(range(15))                        # slots = rows (IndexerDistill's)
    assert batch.seq_rows == [(0, 5), (5, 5), (10, 5)]


def test_init_weights():
    a, b, c = small_model(0), small_model(0), small_model(1)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if name.endswith("bias"):
            assert not pa.any(), name                                             # LayerNorm / correction biases
        elif pa.dim() == 1:
            assert (pa == 1).all(), name                                          # norm weights
        else:
            assert not torch.equal(pa, pc), name
    params = dict(a.named_parameters())
    resid = torch.cat([p.flatten() for n, p in params.items() if n.endswith(("o_proj.weight", "down_proj.weight"))])
    other = torch.cat([p.flatten() for n, p in params.items() if p.dim() >= 2 and not n.endswith(("o_proj.weight",
                                                                                                  "down_proj.weight"))])
    layers = a.config.num_hidden_layers + a.config.num_nextn_predict_layers   # the MTP layer's outputs count too
    assert resid.std().item() == pytest.approx(0.02 / math.sqrt(2 * layers), rel=0.03)
    assert other.std().item() == pytest.approx(0.02, rel=0.03) and abs(other.mean().item()) < 1e-3


def test_set_index_topk_leaves_the_exported_config_alone():
    model = small_model()
    tr.set_index_topk(model, 99)
    indexers = [layer.self_attn.indexer for layer in model.model.layers if layer.self_attn.indexer is not None]
    assert len(indexers) == 3 and all(ix.cfg.index_topk == 99 for ix in indexers)
    assert model.config.index_topk == SMALL["index_topk"]


def test_checkpoint_state_dict_is_the_checkpoint_layout():
    model = small_model()
    sd = tr.checkpoint_state_dict(model)
    assert {k: tuple(v.shape) for k, v in sd.items()} == checkpoint_shapes(model.config)
    stacked = model.state_dict()["model.layers.1.mlp.experts.up_proj.weight"]
    assert all(torch.equal(sd[f"model.layers.1.mlp.experts.{e}.up_proj.weight"], stacked[e]) for e in range(8))


# ---- the indexer's KL loss -------------------------------------------------------------------------------------------
class Captured:
    """What each attention layer was called with (a forward hook of our own): h, rope, batch, cache."""

    def __init__(self, model: GlmForCausalLM):
        self.calls: dict[int, tuple] = {}
        self.handles = [layer.self_attn.register_forward_hook(self.hook) for layer in model.model.layers]

    def hook(self, attn, args, _out):
        self.calls[args[4]] = (attn, *args[:4])


@pytest.fixture(scope="module")
def distilled():
    """One training step's losses on a sparse small model, the hooks' records and our own capture of the layers."""
    # The indexer's rope half-split, MLA's interleaved (DeepSeek-V3.2's conventions; glm_moe_dsa interleaves both, so
    # that a rope applied with the other one's convention would go unseen)
    model = small_model(seed=3, indexer_rope_interleave=False)
    windows = tr.sample_windows(TOKENS, 2, SEQ + 2, torch.Generator().manual_seed(0))
    distill, seen = tr.IndexerDistill(model), Captured(model)
    parts = tr.losses(model, windows, distill)
    return model, windows, distill, seen, parts


def index_scores(attn, h, rope, cache, layer, B, S) -> torch.Tensor:
    """The model's own indexer score Σ_h w_h · relu(q_h · k_t / sqrt(d)) from ``Indexer.query`` and the key rows the
    forward cached: [B, S, T]."""
    ix = attn.indexer
    with torch.no_grad():
        q, w = ix.query(h, ix.wq_b(attn.q_a_layernorm(attn.q_a_proj(h))), rope)     # [N, ih, d], [N, ih]
        k = cache.index_k[layer][: B * S].view(B, S, -1)                              # [B, T, d]
        s = torch.einsum("bshd,btd->bsht", q.view(B, S, *q.shape[1:]), k) * ix.cfg.index_head_dim ** -0.5
        return torch.einsum("bsh,bsht->bst", w.view(B, S, -1), F.relu(s))


def test_distill_targets_are_each_owners_layers_dense_attention(distilled):
    model, windows, distill, seen, _ = distilled
    B, S = windows.shape[0], SEQ
    cfg = model.config
    # An indexer's target: its own layer and the shared layers after it (the MTP layer owns one of its own).
    assert distill.owner == {0: 0, 1: 0, 2: 0, 3: 3, 4: 4}
    assert {k: len(v) for k, v in distill.targets.items()} == {0: 3, 3: 1, 4: 1}
    assert sorted(distill.inputs) == [0, 3, 4]
    causal = tr.causal_mask(S)
    for layer in range(cfg.num_cache_layers):
        probs = distill.targets[distill.owner[layer]][layer - distill.owner[layer]]             # [B, S, T]
        assert torch.allclose(probs.sum(-1), torch.ones(B, S)) and not probs[:, ~causal].any()
        # Averaged over heads, dense attention's latent output is these probabilities times the cached latents.
        attn, h, rope, batch, cache = seen.calls[layer]
        with torch.no_grad():
            q_lat, q_rope, _ = attn.prepare(h, rope, batch, cache, layer, False)
            everything = torch.where(causal, torch.arange(S), -1).repeat(B, 1)                  # [B*S, S] slots
            everything = everything + torch.arange(B).repeat_interleave(S)[:, None] * S * (everything >= 0)
            o_lat = attn.attend(q_lat, q_rope, cache.kv[layer], everything, batch)              # [B*S, nh, rkv]
        latent = cache.kv[layer][: B * S, : cfg.kv_lora_rank].view(B, S, -1)
        assert torch.allclose(torch.einsum("bst,btc->bsc", probs, latent), o_lat.mean(1).view(B, S, -1), atol=1e-5)


def test_distill_loss_is_kl_from_the_targets_to_the_indexers_scores(distilled):
    model, windows, distill, seen, parts = distilled
    B, S = windows.shape[0], SEQ
    causal = tr.causal_mask(S)
    total = 0.0
    for layer in (0, 3, 4):
        attn, h, rope, _, cache = seen.calls[layer]
        ours = index_scores(attn, h, rope, cache, layer, B, S)
        assert torch.allclose(distill._index_scores(*distill.inputs[layer])[:, causal], ours[:, causal], atol=1e-6)
        p = torch.stack(distill.targets[layer]).mean(0).double()                                # [B, S, T]
        logq = ours.double().masked_fill(~causal, -math.inf).log_softmax(-1)
        terms = torch.where(p > 0, p * (p.log() - logq), torch.zeros(()).double())
        total += terms[:, causal].sum().item() / (B * S)
    assert parts["kl"].item() == pytest.approx(total, rel=1e-4) and total > 0


def test_distill_loss_trains_only_the_indexers():
    model = small_model(seed=3)
    windows = tr.sample_windows(TOKENS, 2, SEQ + 2, torch.Generator().manual_seed(0))
    tr.losses(model, windows, tr.IndexerDistill(model))["kl"].backward()
    touched = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    indexers = {n for n, _ in model.named_parameters() if ".indexer." in n}
    assert touched == indexers and len(indexers) == 3 * 5
    with torch.no_grad():                                                 # nothing is recorded without grad
        distill = tr.IndexerDistill(model)
        tr.losses(model, windows, distill)
    assert not distill.targets and not distill.inputs


# ---- aux-loss-free expert balancing ----------------------------------------------------------------------------------
def test_balancer_counts_loads_and_nudges_the_bias_by_its_sign():
    model = small_model(seed=5)
    balancer = tr.ExpertBalancer(model)
    routers = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    assert balancer.routers == routers and len(routers) == 4                         # 3 MoE layers + the MTP layer
    x = torch.randn(40, SMALL["hidden_size"], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        routers[0](x)                                                                # not a training step: not counted
    assert all(not load.any() for load in balancer.loads.values())
    idx, _ = routers[0](x)
    idx2, _ = routers[0](x[:7])
    load = torch.bincount(torch.cat([idx.flatten(), idx2.flatten()]), minlength=8).float()
    assert torch.equal(balancer.loads[id(routers[0])], load)
    before = routers[0].e_score_correction_bias.clone()
    worst = balancer.update(0.25)
    assert worst == pytest.approx((load.max() / load.mean()).item())
    step = routers[0].e_score_correction_bias - before
    assert torch.equal(step, 0.25 * torch.sign(load.mean() - load))               # over-loaded down, under-loaded up
    assert all(not load.any() for load in balancer.loads.values())                 # counts start again
    assert all(not r.e_score_correction_bias.any() for r in routers[1:])           # unused routers: no load, no move


def test_balancer_moves_routing_toward_balance():
    model = small_model(seed=5)
    router = model.model.layers[1].mlp.gate
    with torch.no_grad():
        router.weight[:2] += 0.02                                # rows of positive mean: experts 0 and 1 take all
    balancer = tr.ExpertBalancer(model)
    x = torch.randn(256, SMALL["hidden_size"], generator=torch.Generator().manual_seed(0)) + 1
    ratios = []
    for _ in range(30):
        router(x)
        ratios.append(balancer.update(0.02))
    # max/mean load: 4 while two of the 8 experts take every row, under 2 once the biases have moved
    assert ratios[0] == 4 and max(ratios[-10:]) < 2, ratios


# ---- losses and the optimizer -------------------------------------------------------------------------------------
def test_losses_are_next_and_next_next_token_cross_entropy():
    """Each window alone, its own cache: CE of the main head on t_{p+1} and of the MTP head (fed t_{p+1}) on t_{p+2}."""
    model = small_model(seed=2)
    tr.set_index_topk(model, SEQ)
    windows = tr.sample_windows(TOKENS, 3, SEQ + 2, torch.Generator().manual_seed(4))
    parts = tr.losses(model, windows, tr.IndexerDistill(model))
    lm = mtp = 0.0
    with torch.no_grad():
        for w in windows:
            batch, cache = contiguous_batch([(0, SEQ)], SEQ), KVCache(model.config, SEQ, torch.float32)
            hidden = model(w[:SEQ], batch, cache)
            lm += -model.logits(hidden).log_softmax(-1)[torch.arange(SEQ), w[1:SEQ + 1]].sum().item()
            mtp_hidden, _ = model.mtp_forward(hidden, w[1:SEQ + 1], batch, cache)
            mtp += -model.logits(mtp_hidden).log_softmax(-1)[torch.arange(SEQ), w[2:]].sum().item()
    n = windows.shape[0] * SEQ
    assert parts["lm"].item() == pytest.approx(lm / n, rel=1e-5)
    assert parts["mtp"].item() == pytest.approx(mtp / n, rel=1e-5)


def test_optimizer_decays_matrices_only():
    model = small_model()
    decay, plain = tr.make_optimizer(model, argparse.Namespace(lr=1e-3, weight_decay=0.1)).param_groups
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert (decay["weight_decay"], plain["weight_decay"]) == (0.1, 0.0)
    assert [id(p) for p in decay["params"]] == [id(p) for p in trainable if p.dim() >= 2]
    assert [id(p) for p in plain["params"]] == [id(p) for p in trainable if p.dim() == 1]    # norms, LayerNorm bias


# ---- train / resume / export, through the command line ---------------------------------------------------------------
class Clock:
    """train()'s clock: every reading one second later, so every step takes 1 s; ``kill_at``: the reading that
    raises, as a Ctrl-C would."""

    def __init__(self, kill_at: int | None = None):
        self.now, self.reads, self.kill_at = 1000.0, 0, kill_at

    def time(self) -> float:
        self.reads += 1
        if self.reads == self.kill_at:
            raise Killed
        self.now += 1.0
        return self.now


class Killed(Exception):
    pass


STEPS, MINUTES = 8, 0.125                                # a 7.5 s budget at 1 s a step: 8 steps
ARGS = ["--batch-size", "4", "--seq-len", str(SEQ), "--lr", "1e-2", "--warmup-steps", "3", "--threads", "1",
        "--log-every", "1", "--ckpt-every", "3", "--seed", "7", "--minutes", str(MINUTES), "--dense-frac", "0.4"]


def run_main(monkeypatch, run_dir: Path, *extra: str, clock: Clock | None = None) -> None:
    loads = []
    monkeypatch.setattr(tr, "TINY_CONFIG", SMALL)
    monkeypatch.setattr(tr, "load_tokens", lambda split: loads.append(split) or TOKENS.numpy().astype(np.uint16))
    monkeypatch.setattr(tr, "time", clock or Clock())
    monkeypatch.setattr(sys, "argv", ["train_tiny", *ARGS, "--run-dir", str(run_dir), *extra])
    tr.main()
    assert loads in ([], ["train"])


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted run of STEPS steps."""
    run_dir = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as mp:
        run_main(mp, run_dir)
    return run_dir


def log_rows(run_dir: Path) -> list[list[str]]:
    return [line.split("\t") for line in (run_dir / "log.tsv").read_text().splitlines()]


def test_training_run_follows_its_schedule_and_lowers_the_loss(straight):
    state = torch.load(straight / "ckpt.pt", weights_only=False)
    assert (state["step"], state["elapsed"], state["tokens"]) == (STEPS, STEPS, STEPS * 4 * (SEQ + 2))
    assert ModelConfig.from_dict(state["config"]) == ModelConfig.from_dict(SMALL)
    rows = log_rows(straight)
    assert [int(r[0]) for r in rows] == list(range(1, STEPS + 1))
    args = argparse.Namespace(lr=1e-2, warmup_steps=3)
    budget = MINUTES * 60
    for k, row in enumerate(rows):                   # step k + 1 starts after k seconds
        assert float(row[3]) == pytest.approx(tr.lr_at(k, k / budget, args), rel=1e-3)
        assert int(row[4]) == (k / budget < 0.4)                          # dense for --dense-frac 0.4: steps 1-3
    # The first step's loss is that of the seed's initial weights on the seed's first windows, attention dense.
    model = small_model(seed=7)
    tr.set_index_topk(model, SEQ)
    windows = tr.sample_windows(TOKENS, 4, SEQ + 2, torch.Generator().manual_seed(7))
    first = tr.losses(model, windows, tr.IndexerDistill(model))
    assert [float(x) for x in rows[0][5:8]] == pytest.approx([first[k].item() for k in ("lm", "mtp", "kl")], abs=2e-4)
    # The trained weights predict the text better than the initial ones, on windows of its own.
    trained = GlmForCausalLM(model.config)
    trained.load_state_dict(state["model"])
    held = tr.sample_windows(TOKENS, 16, SEQ + 2, torch.Generator().manual_seed(99))
    with torch.no_grad():
        before, after = (tr.losses(m, held, tr.IndexerDistill(m)) for m in (small_model(seed=7), trained))
    assert after["lm"] < before["lm"] - 0.5 and after["mtp"] < before["mtp"] - 0.5
    # Every weight moved: the MTP layer by its loss, the indexers by the KL (their only signal), the correction
    # biases by the balancer; the optimizer's groups all ran at the last step's learning rate.
    for name, p in small_model(seed=7).named_parameters():
        assert not torch.equal(state["model"][name], p), name
    last = tr.lr_at(STEPS - 1, (STEPS - 1) / budget, args)
    assert [g["lr"] for g in state["optimizer"]["param_groups"]] == pytest.approx([last, last])


def test_a_killed_run_resumes_where_its_checkpoint_left_off(straight, tmp_path, monkeypatch):
    with pytest.raises(Killed):        # clock readings 1-6: steps 1-3 (checkpoint at 3); the 8th ends step 4: killed
        run_main(monkeypatch, tmp_path, clock=Clock(kill_at=8))
    assert torch.load(tmp_path / "ckpt.pt", weights_only=False)["step"] == 3
    run_main(monkeypatch, tmp_path, "--resume")
    resumed, whole = (torch.load(d / "ckpt.pt", weights_only=False) for d in (tmp_path, straight))
    for key in ("step", "elapsed", "tokens", "sampler_rng"):
        assert torch.equal(*(torch.as_tensor(s[key]) for s in (resumed, whole))), key
    for name, t in whole["model"].items():
        assert torch.equal(resumed["model"][name], t), name
    for i, s in whole["optimizer"]["state"].items():
        assert all(torch.equal(resumed["optimizer"]["state"][i][k], v) for k, v in s.items())
    # Step 4 died before its log line: the resumed run's lines follow the first four as the whole run's do.
    assert log_rows(tmp_path) == log_rows(straight)


def test_export_loads_in_glmserve_with_the_trained_logits(straight, tmp_path, monkeypatch):
    from safetensors import safe_open

    out = tmp_path / "model"
    run_main(monkeypatch, straight, "--export", "--out", str(out))
    state = torch.load(straight / "ckpt.pt", weights_only=False)
    trained = GlmForCausalLM(ModelConfig.from_dict(state["config"]))
    trained.load_state_dict(state["model"])
    with safe_open(out / "model.safetensors", "pt") as f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}
    assert set(dtypes) == set(checkpoint_shapes(trained.config))
    fp32 = {n for n in dtypes if n.endswith((".mlp.gate.weight", "e_score_correction_bias"))}
    assert len(fp32) == 8 and all(dtypes[n] == "F32" for n in fp32)
    assert all(dtypes[n] == "BF16" for n in set(dtypes) - fp32)
    with torch.no_grad():                            # the trained weights as exported: bf16 but the router's
        for name, p in trained.named_parameters():
            if not name.endswith((".mlp.gate.weight", "e_score_correction_bias")):
                p.copy_(p.bfloat16().float())
    loaded = load_model(out, dtype=torch.float32, progress=False)
    assert loaded.config == trained.config
    ids = TOKENS[:SEQ]
    logits = []
    for model in (trained, loaded):
        batch, cache = contiguous_batch([(0, SEQ)], SEQ), KVCache(model.config, SEQ, torch.float32)
        with torch.no_grad():
            logits.append(model.logits(model(ids, batch, cache)))
    assert torch.allclose(logits[0], logits[1], atol=1e-5, rtol=0)


# ---- eval_tiny, on the committed model -------------------------------------------------------------------------------
GENESIS = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
           "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God "
           "said, Let there be light: and there was light. And God saw the light, that it was good: and God divided "
           "the light from the darkness.")


@pytest.fixture(scope="module")
def tiny():
    from models.tokenizer import Tokenizer

    return load_model(TINY, dtype=torch.float32, progress=False), Tokenizer.from_dir(TINY)


def one_window(model, w: torch.Tensor) -> dict[str, float]:
    """score_windows' numbers for one window [S+2], position by position, the window alone in its cache."""
    S = w.numel() - 2
    batch, cache = contiguous_batch([(0, S)], S), KVCache(model.config, S, torch.float32)
    with torch.no_grad():
        hidden = model(w[:S], batch, cache)
        logp = model.logits(hidden).log_softmax(-1)
        main = logp.argmax(-1).tolist()                                      # main[p]: t_{p+1}
        mtp = model.logits(model.mtp_forward(hidden, w[1:S + 1], batch, cache)[0]).argmax(-1).tolist()  # t_{p+2}
    t = w.tolist()
    return {"ce": -sum(logp[p, t[p + 1]].item() for p in range(S)), "n": S,
            "main_hit": sum(main[p] == t[p + 1] for p in range(S)),
            "agree": sum(mtp[p] == main[p + 1] for p in range(S - 1)),
            "mtp_hit": sum(mtp[p] == t[p + 2] for p in range(S - 1)), "n_mtp": S - 1}


def test_score_windows_and_evaluate_count_what_they_say(tiny):
    from tools import eval_tiny as ev

    model, tok = tiny
    tokens = np.array(tok.encode(GENESIS), dtype=np.int64)
    S = 40                                                           # > index_topk 32: DSA selects
    starts = [0, (len(tokens) - S - 2) // 2, len(tokens) - S - 2]   # evaluate's windows: evenly spaced, to the end
    per = [one_window(model, torch.from_numpy(tokens[s:s + S + 2])) for s in starts]
    scored = ev.score_windows(model, torch.from_numpy(np.stack([tokens[s:s + S + 2] for s in starts[:2]])))
    for key, value in scored.items():
        assert value == pytest.approx(per[0][key] + per[1][key], rel=1e-5), key
    assert 0 < scored["agree"] < scored["n_mtp"] and 0 < scored["mtp_hit"] and 0 < scored["main_hit"] < scored["n"]
    total = {k: sum(p[k] for p in per) for k in per[0]}
    result = ev.evaluate(model, tokens, 3, S, batch_size=2)
    assert result == pytest.approx({"perplexity": math.exp(total["ce"] / total["n"]),
                                    "main_top1": total["main_hit"] / total["n"],
                                    "mtp_agreement": total["agree"] / total["n_mtp"],
                                    "mtp_top1": total["mtp_hit"] / total["n_mtp"], "tokens": 3 * S}, rel=1e-5)
    fp8 = ev.evaluate(model, tokens, 3, S, batch_size=2, kv_fp8=True)
    assert fp8["perplexity"] != result["perplexity"]                                   # the FP8 cache is used ...
    assert fp8["perplexity"] == pytest.approx(result["perplexity"], rel=0.05)          # ... and costs little


def test_text_tokens_are_the_training_tokenization(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer

    from tools import eval_tiny as ev

    blocks = ["The first block,\nover two lines.", "  The second block  ", "Café 日本語 <|user|> text"]
    text = "\n\n".join(blocks[:2]) + "\n\n\n\n" + blocks[2] + "\n\n \n\n"
    (tmp_path / "heldout.txt").write_text(text, encoding="utf-8")
    hf = HFTokenizer.from_file(str(TINY / "tokenizer.json"))
    expected = [t for b in blocks for t in hf.encode(b, add_special_tokens=False).ids + [tr.EOS_ID]]
    ours = tr.load_tokens("heldout", corpus_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert ours.tolist() == expected and ours.dtype == np.uint16
    assert ev.text_tokens(tmp_path / "heldout.txt", TINY).tolist() == expected
    (tmp_path / "heldout.txt").unlink()                                            # the cache answers from now on
    assert tr.load_tokens("heldout", corpus_dir=tmp_path, cache_dir=tmp_path / "cache").tolist() == expected
    with pytest.raises(FileNotFoundError, match="tools/corpus.py"):
        tr.load_tokens("train", corpus_dir=tmp_path, cache_dir=tmp_path / "cache")


def test_greedy_generate_is_the_engines_greedy_output(tiny):
    from cluster.engine import Engine, LocalExecutor
    from scheduler.request import SamplingParams
    from scheduler.scheduler import SchedulerConfig
    from tests.conftest import run_engine
    from tools import eval_tiny as ev
    from workers.runner import ModelRunner

    model, tok = tiny
    prompt = tok.encode(GENESIS)
    assert len(prompt) > model.config.index_topk
    out = ev.greedy_generate(model, prompt, 12)
    engine = Engine(LocalExecutor(ModelRunner(model, 16, 16, torch.float32)),
                    SchedulerConfig(num_blocks=16, block_size=16, max_model_len=256, vocab_size=model.config.vocab_size,
                                    eos_token_ids=(), max_num_seqs=4, max_num_batched_tokens=256))
    assert run_engine(engine, {"r": (prompt, SamplingParams(max_tokens=12, temperature=0.0))})["r"] == out
    # A stop id ends the output, itself included.
    k = next(i for i in range(1, 12) if out[i] not in out[:i])
    assert ev.greedy_generate(model, prompt, 12, stop_ids=(out[k], -5)) == out[:k + 1]


def test_eval_main_reports_sparse_and_dense_perplexity_and_a_sample(tiny, tmp_path, monkeypatch, capsys):
    import re

    from tools import eval_tiny as ev

    model, tok = tiny
    (tmp_path / "text.txt").write_text(GENESIS + "\n\n" + GENESIS.upper() + "\n", encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["eval_tiny", "--text", str(tmp_path / "text.txt"), "--windows", "2",
                                      "--seq-len", "64", "--max-new", "6", "--threads", "1", "--prompt", GENESIS])
    ev.main()
    printed = capsys.readouterr().out
    tokens = ev.text_tokens(tmp_path / "text.txt", TINY)
    sparse = ev.evaluate(model, tokens, 2, 64)
    tr.set_index_topk(model, 64)
    dense = ev.evaluate(model, tokens, 2, 64)
    tr.set_index_topk(model, model.config.index_topk)
    m = re.search(rf"main head perplexity\s+([\d.]+)\s+\(index_topk {model.config.index_topk}; "
                  r"dense attention: ([\d.]+)\)", printed)
    assert m and [float(m[1]), float(m[2])] == pytest.approx([sparse["perplexity"], dense["perplexity"]], abs=0.006)
    assert sparse["perplexity"] != pytest.approx(dense["perplexity"], abs=0.02)
    sample = ev.greedy_generate(model, tok.encode(GENESIS), 6, tuple(model.config.eos_token_ids))   # sparse again
    assert printed.endswith(GENESIS + tok.decode(sample, skip_special_tokens=False) + "\n")

