"""The decode benchmark's HF side on the CPU (bench/decode_slice.py): the chunked prefill builds HF's cache to
the context, a timed step's token is cropped back, and the report places HF's times, ratios and not-run cases."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="HF transformers is not installed (the 'test' extra)")
ds = pytest.importorskip("bench.decode_slice", reason="the bench needs triton (the 'gpu' extra)")

TINY = dict(ds.SLICE, vocab_size=1000, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
            qk_rope_head_dim=8, qk_head_dim=24, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
            index_n_heads=2, index_head_dim=16, index_topk=8)


@pytest.fixture
def hf(monkeypatch):
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM
    monkeypatch.setattr(ds, "DEV", "cpu")
    cfg = GlmMoeDsaConfig(**{k: v for k, v in TINY.items() if k not in ("architectures", "quantization_config")})
    torch.manual_seed(0)
    return GlmMoeDsaForCausalLM._from_config(cfg, attn_implementation="eager").eval()


def test_chunked_prefill_and_crop(hf):
    """300 tokens prefilled in chunks (the last one partial) for 2 rows; a step adds one token, crop(-1) drops it."""
    with torch.no_grad():
        pkv = ds._hf_prefill(hf, 2, 300)
        assert pkv.get_seq_length() == 300
        per_row = ds._hf_cache_bytes(ds._hf_prefill(hf, 1, 300))
        assert per_row > 0 and ds._hf_cache_bytes(pkv) == 2 * per_row
        hf(torch.randint(0, 1000, (2, 1)), past_key_values=pkv, use_cache=True)
        assert pkv.get_seq_length() == 301
        pkv.crop(-1)
        assert pkv.get_seq_length() == 300 and ds._hf_cache_bytes(pkv) == 2 * per_row


def test_report_hf_columns(monkeypatch, tmp_path):
    """HF columns for the full slice only, 'ours ×' = HF / graph beside HF / floor, a case not run listed with its
    reason, a failed implementation reported and left out of the columns."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "test device")
    row = {"ctx": 4096, "experts_hit": [8], "bytes": 1e9, "floor_ms": 1.0, "auto": 5.0, "stage_ms": 0.1,
           "capture_ms": 9.0}
    results = [dict(row, slice="full", rows=1, reference=20.0, auto_graph=2.0),
               dict(row, slice="full", rows=8, reference=30.0, auto_graph=4.0),
               dict(row, slice="shard 1/8", rows=1, auto_graph=1.0)]
    hf = {"eager": {(4096, 1): (30.0, 29.0, 31.0), (4096, 8): "not run: too big"},
          "default (failed)": {"error": "RuntimeError('boom')"}}
    ds.write_report(results, hf, 4e12, tmp_path)
    md = (tmp_path / "decode_slice.md").read_text()
    lines = md.splitlines()
    header = next(line for line in lines if line.startswith("| slice |"))
    assert header.endswith("| HF (eager) | HF (eager) / graph | HF (eager) / floor |") and "failed" not in header
    full1 = next(line for line in lines if line.startswith("| full | 4096 | 1 |"))
    assert full1.endswith("| 30.0 (29.0–31.0) | 15.0× | 30.0× |")
    assert next(line for line in lines if line.startswith("| shard 1/8 |")).endswith("| — | — | — |")
    assert "- HF (eager) at 4096 × 8: not run: too big" in md and "RuntimeError('boom')" in md
