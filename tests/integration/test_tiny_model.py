"""The committed default model (models/tiny): what it contains, HF parity, its chat template, greedy decode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.cache import KVCache, contiguous_batch
from models.config import ModelConfig
from models.loader import load_model
from models.tokenizer import Tokenizer
from tests.conftest import hf_model
from tests.integration.test_parity_hf import TOL, compare_selections, hf_selections, run_ours

MODEL = Path(__file__).resolve().parents[2] / "models" / "tiny"
TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
        "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. "
        "And God said, Let there be light: and there was light. And God saw the light, that it was good.")


@pytest.fixture(scope="module")
def model():
    return load_model(MODEL, dtype=torch.float32, progress=False)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_dir(MODEL)


def test_checkpoint_keeps_every_structural_feature():
    cfg = ModelConfig.from_json(MODEL)
    assert cfg.model_type == "glm_moe_dsa"
    assert set(cfg.mlp_layer_types) == {"dense", "sparse"}
    assert set(cfg.indexer_types) == {"full", "shared"}
    assert cfg.n_group > 1 and cfg.topk_group < cfg.n_group
    assert cfg.num_nextn_predict_layers == 1 and cfg.index_share_for_mtp_iteration
    assert cfg.index_topk < 64, "index_topk must sit below typical prompt lengths so that DSA selects"
    assert (MODEL / "model.safetensors").stat().st_size <= 30_000_000
    assert cfg.vocab_size == Tokenizer.from_dir(MODEL).vocab_size


def test_logits_and_selections_match_hf(model, tokenizer):
    ids = torch.tensor(tokenizer.encode(TEXT))
    assert ids.numel() >= 64 > model.config.index_topk
    topk = []
    ours = run_ours(model, ids, [ids.numel()], topk)
    ref, captured = hf_selections(hf_model(MODEL), ids)
    diff = (ours - ref).abs().max().item()
    print(f"tiny model, {ids.numel()} tokens: max |Δlogit| = {diff:.2e}")
    assert diff <= TOL
    compare_selections(topk[0], captured, model.config)
    decoded = run_ours(model, ids, [48] + [1] * (ids.numel() - 48))
    assert (decoded - ref).abs().max().item() <= TOL


def test_chat_template_renders_multi_turn_with_system(tokenizer):
    messages = [{"role": "system", "content": "You are a terse assistant."},
                {"role": "user", "content": "Who made the heaven?"},
                {"role": "assistant", "content": "God."},
                {"role": "user", "content": "And the earth?"}]
    text = tokenizer.apply_chat_template(messages)
    assert text == ("[gMASK]<sop><|system|>You are a terse assistant.<|user|>Who made the heaven?"
                    "<|assistant|></think>God.<|user|>And the earth?<|assistant|><think>")
    ids = tokenizer.encode_chat(messages)
    specials = [tokenizer.decode([i], skip_special_tokens=False) for i in ids if i in tokenizer.special_ids]
    assert specials == ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "</think>", "<|user|>",
                        "<|assistant|>", "<think>"]
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def greedy(model, prompt: list[int], max_new: int) -> list[int]:
    """Prefill, then one token per step against the KV cache."""
    capacity = len(prompt) + max_new
    cache = KVCache(model.config, capacity, torch.float32)
    step, pos, out = prompt, 0, []
    with torch.no_grad():
        while len(out) < max_new:
            hidden = model(torch.tensor(step), contiguous_batch([(pos, len(step))], capacity), cache)
            pos += len(step)
            step = [int(model.logits(hidden[-1:]).argmax(-1))]
            out += step
    return out


def test_greedy_generation_is_deterministic(model, tokenizer):
    prompt = tokenizer.encode(TEXT)
    first, second = greedy(model, prompt, 20), greedy(model, prompt, 20)
    assert first == second
    # Decoding against the cache agrees with re-reading the whole sequence in one prefill.
    logits = run_ours(model, torch.tensor(prompt + first), [len(prompt) + 20])
    assert logits[len(prompt) - 1:-1].argmax(-1).tolist() == first
