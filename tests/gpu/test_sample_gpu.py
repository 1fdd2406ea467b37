"""The sampler's Triton kernels on GLM's vocabulary (154880) on a CUDA GPU, against the PyTorch references: the top-k
keys, the penalties, and the draws from the nucleus and the top-k without a sort (``glmkernels/triton_sample.py``).

Run on a lent GPU: ``PYTHONPATH=. python -m pytest -q tests/gpu/test_sample_gpu.py``. Skips without CUDA or triton.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from glmkernels import ops, reference

DEV = "cuda"
VOCAB = 154880


def tri(name):
    return ops.impl(name, "triton")


def gen(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


@pytest.mark.parametrize("S", [1, 8, 33])
def test_value_id_keys_at_glm_vocab(S):
    """The sampler's top-k keys on GLM's vocabulary: the reference's bits, and a graph replay's."""
    x = (torch.randn(S, VOCAB, device=DEV, generator=gen(S)) * 4).bfloat16().float()
    x[0, :4] = torch.tensor([0.0, -0.0, float("inf"), -float("inf")])
    want = reference.value_id_keys(x)
    assert torch.equal(tri("value_id_keys")(x), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tri("value_id_keys")(x)
    out.zero_()
    graph.replay()
    assert torch.equal(out, want)


@pytest.mark.parametrize("B", [1, 8, 33])
def test_penalize_at_glm_vocab(B):
    """The penalties in one launch on GLM's vocabulary: the reference's bits (an IEEE division, no fused multiply-add)
    for rows with every kind of penalty and none; a graph's replay the same."""
    g = gen(300 + B)
    x = (torch.randn(B, VOCAB, device=DEV, generator=g) * 4).bfloat16().float()
    counts = torch.randint(0, 3, (B, 2, VOCAB), device=DEV, generator=g, dtype=torch.int32)
    counts[:, 1] *= torch.randint(0, 2, (B, VOCAB), device=DEV, generator=g, dtype=torch.int32) * 5
    values = torch.tensor([[1.1, 0.5, 0.3], [1.0, 0.0, 0.0], [0.9, -0.4, 0.07]] * 11, device=DEV)[:B]
    want = reference.penalize(x, counts, values)
    assert torch.equal(tri("penalize")(x, counts, values), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tri("penalize")(x, counts, values)
    out.zero_()
    graph.replay()
    assert torch.equal(out, want)


@pytest.mark.parametrize("S", [1, 8, 64])
def test_top_p_race_at_glm_vocab(S):
    """The nucleus without a sort on GLM's vocabulary: the reference's draws (bf16-valued logits, so ties; fixed
    inputs — the draws differ only where a token's mass above is within rounding of the cut), per-row and shared
    top-p, min-p; repeat calls and a graph's replay bit-identical."""
    g = gen(100 + S)
    x = (torch.randn(S, VOCAB, device=DEV, generator=g) * 4).bfloat16().float()
    noise = torch.empty_like(x).exponential_(generator=g).clamp_(min=torch.finfo(torch.float32).tiny)
    per_row = torch.tensor([0.5, 0.9, 0.95, 0.99, float("inf")] * 13, device=DEV)[:S, None]
    for top_p, min_p in ((0.95, None), (per_row, None), (0.9, 0.02), (per_row, per_row.clamp(max=0.1) * 0.5)):
        want = reference.top_p_race(x / 0.8, noise, top_p, min_p)
        got = tri("top_p_race")(x / 0.8, noise, top_p, min_p)
        assert torch.equal(got, want), (top_p, min_p, (got != want).nonzero())
        assert torch.equal(tri("top_p_race")(x / 0.8, noise, top_p, min_p), got)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tri("top_p_race")(x, noise, 0.95, None)
    out.zero_()
    graph.replay()
    assert torch.equal(out, reference.top_p_race(x, noise, 0.95, None))


@pytest.mark.parametrize("S", [1, 8, 64])
def test_top_k_race_at_glm_vocab(S):
    """The top-k without a topk on GLM's vocabulary: the reference's draws (bf16-valued logits, so ties) for a top-k
    shared or one per row (0: none; 5000: past the selection, the reference sorts), with top-p — shared or per row —
    or none, and min-p; under noise that lets the k-th token win, that token; repeat calls and a graph's replay
    bit-identical."""
    g = gen(200 + S)
    x = (torch.randn(S, VOCAB, device=DEV, generator=g) * 4).bfloat16().float()
    noise = torch.empty_like(x).exponential_(generator=g).clamp_(min=torch.finfo(torch.float32).tiny)
    per_row_k = ([1, 20, 50, 0, 5000, 2] * 11)[:S]
    per_row_p = torch.tensor([0.5, 0.9, 0.95, 0.99, float("inf")] * 13, device=DEV)[:S, None]
    for top_k, top_p, min_p in (([50] * S, None, None), ([20] * S, 0.95, None), (per_row_k, None, 0.02),
                                (per_row_k, per_row_p, None), ([40] * S, per_row_p, per_row_p.clamp(max=0.1) * 0.5)):
        want = reference.top_k_race(x / 0.6, noise, top_k, top_p, min_p)
        got = tri("top_k_race")(x / 0.6, noise, top_k, top_p, min_p)
        assert torch.equal(got, want), (top_k, top_p, min_p, (got != want).nonzero())
        assert torch.equal(tri("top_k_race")(x / 0.6, noise, top_k, top_p, min_p), got)
    order = x.sort(dim=-1, descending=True, stable=True).indices
    ranks = torch.arange(VOCAB - 1, -1, -1, device=DEV).expand(S, -1)
    rank_from_end = torch.empty_like(order).scatter_(1, order, ranks)
    probe = torch.exp(x - x.amax(dim=-1, keepdim=True)) * (1 + 1e-6 * rank_from_end)
    for k in (1, 20, 1000, 4096):
        assert torch.equal(tri("top_k_race")(x, probe, [k] * S, None, None), order[:, k - 1]), k
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tri("top_k_race")(x, noise, [20] * S, 0.95, None)
    out.zero_()
    graph.replay()
    assert torch.equal(out, reference.top_k_race(x, noise, [20] * S, 0.95, None))


@pytest.mark.parametrize("S", [1, 4])
def test_kept_weights_at_glm_vocab(S):
    """The kept weights without a sort (speculative decoding's distributions) on GLM's vocabulary: the reference's
    tokens kept (top-p, top-k and both, min-p), the weights within Triton's exp of torch's (ex2.approx), in vocabulary
    order."""
    g = gen(400 + S)
    x = (torch.randn(S, VOCAB, device=DEV, generator=g) * 4).bfloat16().float() / 0.6
    for top_k, top_p, min_p in (([0] * S, 0.95, None), ([20] * S, 0.95, None), ([50] * S, None, 0.02)):
        got, want = tri("kept_weights")(x, top_k, top_p, min_p), reference.kept_weights(x, top_k, top_p, min_p)
        assert torch.equal(got > 0, want > 0), (top_k, top_p, min_p)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=0)


def test_no_sampler_kernel_compiles_after_the_warm_up(monkeypatch):
    """After ``sampler.warm_up`` on GLM's vocabulary, random batches of mixed requests (greedy, drawn, a top-k, a
    top-p, a min-p, each or none, penalties; drawn and weighed, from logits at row offsets) compile no Triton kernel:
    none stalls a serving step (Triton's own cache-miss hook counts them)."""
    import random

    from triton import knobs

    from scheduler.request import SamplingParams
    from workers import sampler
    from workers.sampler import TokenCounts, probs_for_rows, sample, sample_on_device

    for name in ("top_p_race", "top_k_race", "kept_weights", "penalize", "value_id_keys"):
        monkeypatch.setitem(ops._active, name, tri(name))
    sampler.warm_up(VOCAB, DEV)
    compiled = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook",
                        lambda *args, **kwargs: compiled.append(str(kwargs.get("repr", "?"))[:60]) or False)
    rng = random.Random(0)
    logits = torch.randn(8, VOCAB, device=DEV, generator=gen(9)) * 3
    for trial in range(200):
        n, at = rng.randint(1, 5), rng.randint(0, 3)
        params = [SamplingParams(temperature=0.0, repetition_penalty=rng.choice([1.0, 1.2]))
                  if rng.random() < 0.2 else
                  SamplingParams(temperature=rng.choice([1.0, 0.7]), top_k=rng.choice([0, 0, 1, 20, 50]),
                                 top_p=rng.choice([1.0, 1.0, 0.9, 0.95]), min_p=rng.choice([0.0, 0.0, 0.05]),
                                 seed=rng.choice([None, 7]), presence_penalty=rng.choice([0.0, 0.0, 0.5]))
                  for _ in range(n)]
        rows = logits[at:at + n]
        counts = torch.stack([TokenCounts(2, VOCAB, torch.device(DEV)).of([3, 5, 9]) for _ in range(n)])
        rng.choice([lambda: sample_on_device(rows, params, [1] * n, counts),
                    lambda: probs_for_rows(rows, params, counts, [1] * n),
                    lambda: sample(rows, params, counts, [1] * n)])()
    torch.cuda.synchronize()
    assert compiled == [], compiled[:5]
