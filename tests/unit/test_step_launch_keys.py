"""A whole engine's Triton launches: after ``Engine.warm_up``, serving launches no kernel variant the warm-up did not
(a variant first met while serving is compiled in that step: about a second's stall on the GPU). Every kernel of the
Triton ops is recorded, not run (``launch_keys.py``: its constexprs, an integer's divisibility by 16 and whether it is
1, a pointer's 16-byte alignment); each op returns its reference's result, so the engine serves as it would — the
warm-up's graph-shaped steps (uncaptured, ``cuda_graphs: eager``), its prompts and their prefix hits, then random
traffic: prompts of one token to several chunks, shared prefixes with tails of any rows, drawn and greedy rows, MTP
drafts and their verification. The per-op tests of the same property: test_indexer_launch_keys.py,
test_sampler_warm_up.py; the GPU form (Triton's own compile hook): ``bench/warmup.py``.

The model has GLM-5's per-row widths (MLA latent 512 + rope 64, 192 / 256 head dims, the indexer's 32 heads of 128,
FP8 blocks of 128) at 16 heads, hidden 1024 and 16 experts, with the indexer's top-k and the prefill chunk scaled
down (256, 512) so that a CPU serves contexts past both within a minute or two. Not seen here: the GPU-only forms
(the Gluon rows kernels, PDL launches, the SM count's splits at 132 SMs)."""

from __future__ import annotations

import json
import random

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is in the 'gpu' extra)")

from bench.cluster_slice import slice_config
from cluster.config import EngineConfig
from cluster.local import build_local_engine
from glmkernels import ops, reference
from scheduler.request import SamplingParams
from tests.unit.launch_keys import record_kernels

pytestmark = pytest.mark.slow

CHUNK, TOPK, MAX_LEN, VOCAB = 512, 256, 2048, 4096


def _recorded(fast, ref):
    """An op that launches ``fast``'s kernels (recorded: they write nothing) and returns ``ref``'s result."""
    def op(*args, **kwargs):
        fast(*args, **kwargs)
        return ref(*args, **kwargs)
    return op


def _dequant_once(dequant):
    """The reference's FP8 dequantization, each weight once (the reference linear dequantizes at every call: most of
    this test's time otherwise). Keyed by the weight's storage, held so that no other tensor takes its place."""
    done: dict = {}

    def fp8_dequant(w8, scale_inv, dtype=torch.float32):
        key = (w8.data_ptr(), w8.shape, w8.stride(), scale_inv.data_ptr(), dtype)
        if key not in done:
            done[key] = (w8, scale_inv, dequant(w8, scale_inv, dtype))
        return done[key][2]
    return fp8_dequant


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(engine, the set the kernels' launches go to, the warm-up's keys): the engine built on the CPU, every op
    with a Triton form on it (the one ``kernels: auto`` takes on a GPU: the first registered), then warmed up at
    the model's full length (``warmup_tokens``' default)."""
    model = tmp_path_factory.mktemp("launch-keys")
    cfg = slice_config(2, tiny=False) | dict(
        hidden_size=1024, intermediate_size=512, moe_intermediate_size=256, num_attention_heads=16,
        num_key_value_heads=16, q_lora_rank=512, n_routed_experts=16, vocab_size=VOCAB, index_topk=TOPK,
        max_position_embeddings=MAX_LEN)
    (model / "config.json").write_text(json.dumps(cfg))
    engine, _ = build_local_engine(EngineConfig(
        model=str(model), load_format="dummy", device="cpu", dtype="bfloat16", speculative_tokens=3,
        kv_cache_tokens=4 * MAX_LEN, max_num_batched_tokens=CHUNK, max_num_seqs=16, cuda_graphs="eager",
        warmup_tokens=0), progress=False)
    seen: set = set()
    with pytest.MonkeyPatch.context() as mp:
        assert record_kernels(mp, seen) > 50
        mp.setattr(reference, "fp8_dequant", _dequant_once(reference.fp8_dequant))
        for name, impls in ops._impls.items():
            fast = [b for b in impls if b != "reference"]
            if fast:
                mp.setitem(ops._active, name, _recorded(impls[fast[0]].fn, impls["reference"].fn))
        engine.warm_up(MAX_LEN)
        yield engine, seen, frozenset(seen)


def _round(rng: random.Random, prefixes: list[list[int]]) -> list[tuple[list[int], SamplingParams]]:
    """1–6 requests: prompts of one token, of a few rows, of mid sizes, of several chunks, or an earlier prefix
    (its blocks cached) with a tail of 0–40 tokens; greedy or drawn with top-p / top-k / min-p, some penalized."""
    requests = []
    for _ in range(rng.randint(1, 6)):
        n = rng.choice([1, rng.randint(2, 40), rng.randint(41, 600), rng.randint(CHUNK, 3 * CHUNK)])
        prompt = [rng.randrange(VOCAB) for _ in range(n)]
        if rng.random() < 0.4:
            prompt = rng.choice(prefixes) + prompt[:rng.randint(0, 40)]
        draw = rng.choice([{"temperature": 0.0}, {}, {"top_p": 0.9}, {"top_k": 20}, {"min_p": 0.05},
                           {"top_k": 5, "top_p": 0.8, "temperature": 0.7}])
        if rng.random() < 0.2:
            draw["repetition_penalty"] = 1.1
        requests.append((prompt, SamplingParams(max_tokens=rng.randint(1, 10), ignore_eos=True, **draw)))
    return requests


def _nearest(key, warm) -> tuple:
    """A new key named by how it differs from the warm-up's nearest of the same kernel: (kernel, {argument:
    (warm-up's, new)})."""
    name, args = key
    others = [dict(w[1]) for w in warm if w[0] == name] or [{}]
    near = min(others, key=lambda w: sum(w.get(n) != v for n, v in args))
    return name, {n: (near.get(n), v) for n, v in args if near.get(n) != v}


def test_serving_launches_no_kernel_variant_the_warm_up_did_not(served):
    engine, seen, warm = served
    kernels = {key[0] for key in warm}
    assert {"_index_score_kernel", "_mla_split_kernel", "_norm_rope_store_kernel", "_gate_up_kernel",
            "_race_kernel"} <= kernels, sorted(kernels)            # the step's kernels and the sampler's were met
    rng = random.Random(0)
    prefixes = [[rng.randrange(VOCAB) for _ in range(n)] for n in (16, 37, CHUNK + 100, 2 * CHUNK + 300)]
    for trial in range(8):
        seen.clear()
        for i, (prompt, params) in enumerate(_round(rng, prefixes)):
            engine.add_request(prompt, params, f"t{trial}-{i}")
        while engine.has_unfinished():
            for ev in engine.step():
                assert ev.error is None, ev.error
        new = seen - warm
        assert not new, (trial, [_nearest(key, warm) for key in sorted(new, key=str)[:3]])
    assert sum(s.prefix_hits for s in engine.schedulers) > 0           # some prompts were prefix hits
