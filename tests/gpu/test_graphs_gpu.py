"""CUDA graphs of the decode / verify step (``workers/graphs.py``) on a CUDA GPU, ``kernels: auto``:

- a replay is bit-identical to the same static forward run eagerly, for every bucket (1, 2, 4, 8, 16 rows:
  decode rows, verify rows of 1 + k drafts, prompt chunks, pad rows) and several context widths, in fp32 and bf16;
- the engine's greedy tokens with graphs equal its tokens without them (fp32), batched and speculative;
- seeded drawn rows launched ahead draw the tokens they draw without look-ahead;
- drawn drafts picked between captured drafting graphs equal the eager drafter's, seeded ones plain decoding;
- a thinking budget closes the reasoning at its count on graph steps, looking ahead and drafting as plain;
- ``allowed_token_ids`` hold the output on graph steps, looking ahead and drafting as plain; so do regex and choice
  grammars (vLLM's structured outputs);
- prompt logprobs on graph steps and pieces equal one forward of the CPU reference over the prompt;
- the other steps' per-layer pieces (``workers/pieces.py``): replayed == run uncaptured bit for bit (hidden rows and
  KV), the engine's tokens with them equal its tokens without, and after the warm-up nothing more is captured.

Run on a lent H200: ``PYTHONPATH=. python -m pytest -q tests/gpu/test_graphs_gpu.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from glmkernels import ops
from models.loader import load_model
from scheduler.request import SamplingParams
from scheduler.scheduler import ScheduledSeq
from scheduler.shapes import GRAPH_BUCKETS, next_pow2
from tests.integration.test_graphs import captured, make_engine, requests, run, serve_warm_shapes
from workers.runner import ModelRunner

DEV = "cuda"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
NUM_BLOCKS = 6144                 # 40 requests of 1500 tokens (the 64-row step) fit

# per bucket: (rows fed, drafts) of each request — decode rows, verify rows, and pad rows
STEPS = {1: [(1, 0)], 2: [(1, 0), (1, 0)], 4: [(1, 0), (1, 0), (1, 0)], 8: [(1, 0)] * 5, 16: [(1, 0)] * 11,
         32: [(1, 0)] * 20, 64: [(1, 0)] * 40,
         "verify4": [(4, 3)], "verify8": [(8, 7)], "mixed8": [(4, 3), (1, 0), (1, 0)], "verify16": [(4, 3)] * 4,
         "chunks32": [(20, 0), (1, 0), (1, 0)], "chunks64": [(30, 0), (17, 0)] + [(1, 0)] * 10}   # prompt chunks

_MODELS: dict = {}


@pytest.fixture(scope="module")
def text_ckpt():
    """The embedded trained tiny model (real MTP head, indexer selecting beyond 32 keys)."""
    from cluster.config import DEFAULT_MODEL

    return DEFAULT_MODEL


def model(ckpt, dtype):
    ops.configure("auto", DEV)
    if dtype not in _MODELS:
        _MODELS[dtype] = load_model(ckpt, dtype=DTYPES[dtype], device=DEV, progress=False)
    return _MODELS[dtype]


def step_seqs(shape, context: int, seed: int) -> list[ScheduledSeq]:
    g = torch.Generator().manual_seed(seed)
    seqs = []
    perm = torch.randperm(NUM_BLOCKS, generator=g).tolist()
    for i, (n, drafts) in enumerate(shape):
        end = context + 7 * i + n
        nb = -(-end // 16)
        blocks, perm = perm[:nb], perm[nb:]
        ids = torch.randint(40, 1000, (n,), generator=g).tolist()
        seqs.append(ScheduledSeq(f"r{i}", tuple(ids), end - n, tuple(blocks), True, 0, drafts))
    return seqs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("step", list(STEPS))
def test_replay_is_bit_identical_to_eager(text_ckpt, dtype, step):
    m = model(text_ckpt, dtype)
    runner = ModelRunner(m, NUM_BLOCKS, 16, DTYPES[dtype], DEV, graphs="capture")
    g = torch.Generator(device=DEV).manual_seed(0)
    for t in runner.cache.kv + [k for k in runner.cache.index_k if k is not None]:
        t.copy_(torch.randn(t.shape, device=DEV, generator=g))
    graphs = runner.graphs
    for context, seed in [(20, 1), (300, 2), (40, 3), (1500, 4)]:         # widths 2, 32, 4, 128 blocks
        seqs = step_seqs(STEPS[step], context, seed)
        bucket = next_pow2(sum(len(s.token_ids) for s in seqs))
        width = next_pow2(max(len(s.block_ids) for s in seqs))
        graphs.stage(seqs, bucket, width)
        replay = graphs.run(bucket, width).clone()
        again = graphs.run(bucket, width).clone()
        eager = graphs.eager(bucket, width)
        assert torch.isfinite(eager).all()
        assert torch.equal(replay, eager), (step, context, (replay - eager).abs().max().item())
        assert torch.equal(again, replay)
    assert graphs.captured and all(b in GRAPH_BUCKETS for b, *_ in graphs.captured)


@pytest.mark.parametrize("n", [1, 3, 6, 12, 40])
def test_engine_with_graphs_equals_without(text_ckpt, n):
    m = model(text_ckpt, "float32")
    reqs = requests(n, m.config.vocab_size, seed=n)
    on, off = _engine(m, True), _engine(m, False)
    assert run(on, reqs) == run(off, reqs)
    assert on.executor.runner.graphs.captured and on.stats["graph_steps"] > 0
    assert on.executor.runner.ahead_stats["used"] > 0       # greedy steps replayed ahead of the engine, same tokens


def test_lookahead_draws_seeded_rows_as_without(text_ckpt):
    """Seeded drawn rows (temperature, top-k / top-p; one with penalties, read from its token counts on the device)
    and a greedy one asking for logprobs sample on the device and launch the next step ahead: the same tokens as the
    same graph steps without look-ahead (sampling on the host's side)."""
    m = model(text_ckpt, "float32")
    params = [SamplingParams(max_tokens=20, temperature=0.9, seed=5), SamplingParams(max_tokens=20, temperature=0.7,
              top_k=20, top_p=0.9, seed=6), SamplingParams(max_tokens=20, temperature=0.0, logprobs=2),
              SamplingParams(max_tokens=20, temperature=0.8, seed=7, presence_penalty=1.5, frequency_penalty=0.8)]
    reqs = {rid: (prompt, p) for (rid, (prompt, _)), p in zip(requests(4, m.config.vocab_size, seed=9).items(), params)}
    on, off = _engine(m, True), _engine(m, True)
    off.lookahead = False
    assert run(on, reqs) == run(off, reqs)
    assert on.executor.runner.ahead_stats["used"] > 0 and off.executor.runner.ahead_stats["used"] == 0


def test_speculative_with_graphs_equals_plain(text_ckpt):
    m = model(text_ckpt, "float32")
    reqs = requests(1, m.config.vocab_size, max_tokens=24, seed=7)
    spec = _engine(m, True, k=3)
    assert run(spec, reqs) == run(_engine(m, False), reqs)
    assert any(b == 4 for b, *_ in spec.executor.runner.graphs.captured)
    drafting = spec.executor.runner.draft_graphs
    assert any(k == 3 for *_, k in drafting.captured), drafting.captured      # the MTP drafting replayed too
    eager = _engine(m, True, k=3)
    eager.executor.runner.draft_graphs = None                                 # the eager drafter after the replay
    assert run(eager, reqs) == run(_engine(m, False), reqs)
    print(f"accepted drafts: graph drafting {spec.spec_metrics()}, eager drafting {eager.spec_metrics()}")
    assert spec.spec_metrics()["accepted"] > 0


def test_drawn_speculation_with_captured_drafting(text_ckpt):
    """Seeded drawn requests (T 0.8, top-p 0.95): their drafts picked between captured drafting graphs (the extend and
    each chained pass) give the tokens and acceptance of the eager drafter after the same replayed verify steps — one
    whose prompt is shorter than ``index_topk`` keys, so its selection widens as it decodes (chain graphs per width)
    — and both are plain decoding's tokens (a seeded request's drafts share its noise and are verified by token)."""
    m = model(text_ckpt, "float32")
    prompt = next(iter(requests(1, m.config.vocab_size, seed=7).values()))[0]
    params = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.95, seed=9)
    reqs = {"d": (prompt, params), "short": (prompt[:9], params)}
    spec = _engine(m, True, k=3)
    eager = _engine(m, True, k=3)
    eager.executor.runner.draft_graphs = None
    plain = _engine(m, True)
    for rid, req in reqs.items():
        want = run(plain, {rid: req})
        assert run(spec, {rid: req}) == want and run(eager, {rid: req}) == want, rid
    assert spec.spec_metrics() == eager.spec_metrics() and spec.spec_metrics()["accepted"] > 0
    captured = spec.executor.runner.draft_graphs.captured
    assert any(key[0] == "head" for key in captured), captured
    assert len({key[2] for key in captured if key[:2] == ("pass", 1)}) >= 2, captured   # two selection widths


@pytest.mark.parametrize("k", [0, 3])
def test_warm_up_captures_every_graph_served_after_it(text_ckpt, k):
    """After ``Engine.warm_up`` (graphs captured on pad rows), requests within its contexts — alone and drafting
    (greedy, drawn), then four at once — capture nothing more, and their tokens are an unwarmed engine's."""
    m = model(text_ckpt, "float32")
    engine, got, warm = serve_warm_shapes(m, k, 48)
    assert warm[0] and (warm[1] or not k)
    assert captured(engine) == warm
    assert got == serve_warm_shapes(m, k, None)[1]


@pytest.mark.parametrize("k", [0, 3])
def test_prompt_chunks_in_graph_steps_equal_without(text_ckpt, k):
    """Prompts arriving among decoding requests, whole and in chunks, ride their replayed graph steps: the tokens
    (and with speculation the acceptance) of the engine without graphs."""
    from tests.integration.test_graphs import run_arrivals

    m = model(text_ckpt, "float32")
    g = torch.Generator().manual_seed(22)

    def ask(n: int, tokens: int) -> tuple:
        return torch.randint(40, m.config.vocab_size, (n,), generator=g).tolist(), \
            SamplingParams(max_tokens=tokens, temperature=0)

    arrivals = {0: {"a": ask(30, 14)}, 3: {"b": ask(9, 10), "c": ask(20, 8)}, 6: {"d": ask(100, 6)},
                9: {"e": ask(5, 4)}}
    on = make_engine(m, True, k, blocks=NUM_BLOCKS, budget=40)
    got = run_arrivals(on, arrivals)
    off = make_engine(m, False, k, blocks=NUM_BLOCKS, budget=40)
    assert got == run_arrivals(off, arrivals)
    assert on.executor.runner.graphs.captured and on.stats["graph_steps"] > 0
    if k:
        assert on.spec_metrics() == off.spec_metrics()


@pytest.mark.parametrize("k", [0, 3])
def test_cached_prompt_tails_in_graph_steps_equal_without(text_ckpt, k):
    """Prefix caching: prompts whose cached blocks leave a tail of 1..3 tokens start mid-context in replayed graph
    steps; the tokens (and with speculation the acceptance) of an engine without graphs or the cache."""
    from tests.integration.test_graphs import run_arrivals

    m = model(text_ckpt, "float32")
    base = torch.randint(40, m.config.vocab_size, (80,), generator=torch.Generator().manual_seed(5)).tolist()
    greedy = SamplingParams(max_tokens=10, temperature=0.0)
    arrivals = {0: {"a": (base, SamplingParams(max_tokens=30, temperature=0.0))}, 4: {"b": (base[:65], greedy)},
                7: {"c": (base[:51], greedy), "d": (base[:33] + [50, 51], greedy)}}
    on = make_engine(m, True, k, blocks=NUM_BLOCKS, caching=True)
    got = run_arrivals(on, arrivals)
    off = make_engine(m, False, k, blocks=NUM_BLOCKS)
    assert got == run_arrivals(off, arrivals)
    assert on.scheduler.prefix_hits == 64 + 48 + 32 and on.stats["graph_steps"] > 0
    if k:
        assert on.spec_metrics() == off.spec_metrics()


@pytest.mark.parametrize("k", [0, 3])
def test_prefixes_from_the_host_tier_in_captured_steps_equal_without(text_ckpt, k):
    """The host tier on the GPU (saves gathered into pinned buffers behind the queued steps, loads copied in
    asynchronously) under captured graph steps and look-ahead: the tokens of an engine without graphs or the cache."""
    from tests.integration.test_graphs import host_tier_arrivals, run_arrivals

    m = model(text_ckpt, "float32")
    arrivals = host_tier_arrivals(m.config.vocab_size)
    on = make_engine(m, True, k, blocks=24, caching=True, host=96)
    assert run_arrivals(on, arrivals) == run_arrivals(make_engine(m, False, k, blocks=24), arrivals)
    assert on.scheduler.host_loads > 0 and on.executor.runner.graphs.captured
    assert k or on.stats["ahead_steps"] > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pieces_replay_is_bit_identical_to_uncaptured(text_ckpt, dtype):
    """Ragged steps (prompt chunks after contexts of 0–1500 tokens beside decode rows; 42–1305 rows: buckets 64 …
    1536) on the captured pieces and on the same pieces uncaptured: equal hidden rows and equal KV, bit for bit;
    against ``model.forward`` within the dtype's rounding. The MTP layer's extend over each step's rows too."""
    from models.cache import build_batch

    m = model(text_ckpt, dtype)
    runner = ModelRunner(m, NUM_BLOCKS, 16, DTYPES[dtype], DEV, graphs="capture", pieces=(2048, True),
                         speculative=True)
    g = torch.Generator(device=DEV).manual_seed(0)
    for t in runner.cache.kv + [k for k in runner.cache.index_k if k is not None]:
        t.copy_(torch.randn(t.shape, device=DEV, generator=g))
    pieces, gen = runner.pieces, torch.Generator().manual_seed(1)
    for step in [[(0, 100)], [(300, 40), (20, 1), (700, 1)], [(0, 1000)], [(1500, 700), (0, 600), (40, 5)]]:
        perm, seqs = torch.randperm(NUM_BLOCKS, generator=gen).tolist(), []
        for start, n in step:
            nb = -(-(start + n) // 16)
            seqs.append((start, n, perm[:nb]))
            perm = perm[nb:]
        batch = build_batch(seqs, 16, DEV)
        ids = torch.randint(40, 1000, (batch.num_rows,), generator=gen).to(DEV)
        replay = pieces.forward(ids, batch).clone()
        replay_mtp = pieces.mtp_forward(replay, ids.roll(-1), batch)[0].clone()
        kv = [t.clone() for t in runner.cache.kv]
        record, pieces.record = pieces.record, None
        eager = pieces.forward(ids, batch)
        eager_mtp = pieces.mtp_forward(eager, ids.roll(-1), batch)[0]
        pieces.record = record
        assert torch.isfinite(eager).all() and torch.isfinite(eager_mtp).all()
        assert torch.equal(replay, eager), (step, (replay - eager).abs().max().item())
        assert torch.equal(replay_mtp, eager_mtp), (step, (replay_mtp - eager_mtp).abs().max().item())
        assert all(torch.equal(a[:-1], b[:-1]) for a, b in zip(kv, runner.cache.kv))   # the pad slot (last) aside
        with torch.inference_mode():
            want = m(ids, batch, runner.cache)
        tol = 1e-4 if dtype == "float32" else 5e-2
        torch.testing.assert_close(replay.float(), want.float(), atol=tol, rtol=tol)
    assert set(pieces.runs) == set(pieces.mtp_runs) == {128, 64, 1024, 1536} and pieces.captured


@pytest.mark.parametrize("k", [0, 3])
def test_engine_with_pieces_equals_without(text_ckpt, k):
    """Prompts of 100–300 tokens in chunks of a 96-token budget among decoders (steps no decode graph holds) on the
    captured pieces: the tokens (with speculation the acceptance) of the engine without graphs; after the warm step
    of the pieces no step captures another."""
    from tests.integration.test_graphs import run_arrivals
    from workers.runner import WorkerStep

    m = model(text_ckpt, "float32")
    g = torch.Generator().manual_seed(23)

    def ask(n: int, tokens: int) -> tuple:
        return torch.randint(40, m.config.vocab_size, (n,), generator=g).tolist(), \
            SamplingParams(max_tokens=tokens, temperature=0)

    arrivals = {0: {"a": ask(150, 14)}, 2: {"b": ask(12, 10), "c": ask(300, 8)}, 5: {"d": ask(100, 6)}}
    on = make_engine(m, True, k, blocks=NUM_BLOCKS, budget=96, pieces=True)
    runner = on.executor.runner
    runner.execute(WorkerStep(-1, (), warm=()))
    warm = set(runner.pieces.captured)
    got = run_arrivals(on, arrivals)
    off = make_engine(m, False, k, blocks=NUM_BLOCKS, budget=96)
    assert got == run_arrivals(off, arrivals)
    assert set(runner.pieces.captured) == warm and runner.pieces.runs.get(96, 0) >= 4, runner.pieces.runs
    if k:
        assert on.spec_metrics() == off.spec_metrics()


def _fp32_engine(**kw):
    """A local engine on the GPU in fp32 over the embedded model (its tokenizer too), no warm-up."""
    from cluster.config import EngineConfig
    from cluster.local import build_local_engine

    return build_local_engine(EngineConfig(device="cuda", dtype="float32", kv_cache_tokens=4096, warmup_tokens=0,
                                           **kw), progress=False)


def _engine(m, graphs: bool, k: int = 0):
    engine = make_engine(m, graphs, k, blocks=NUM_BLOCKS)      # 40 requests' KV at once: the 64-row bucket
    assert engine.executor.runner.device.type == "cuda"
    return engine


@pytest.mark.parametrize("k", [0, 2])
def test_structured_output_on_graph_steps(k):
    """response_format on the GPU path (bf16, CUDA graphs, the Triton kernels): guided rows — greedy and drawn, beside
    a free one — sample only what the schema allows and end in values that parse; steps launch ahead (their sampling
    deferred to the next step's masks) without speculation, and with it (k) MTP drafts ride once one request is left,
    verified on masked rows."""
    pytest.importorskip("xgrammar")
    import json

    from cluster.config import EngineConfig
    from cluster.local import build_local_engine
    from tests.integration.test_engine import PERSON, _outputs, assert_follows

    engine, tok = build_local_engine(EngineConfig(device="cuda", kv_cache_tokens=4096, warmup_tokens=0,
                                                  speculative_tokens=k), progress=False)
    prompt = tok.encode_chat([{"role": "user", "content": "A person as JSON."}], enable_thinking=False)
    schema = json.dumps(PERSON)
    guided = {"greedy": SamplingParams(max_tokens=200, temperature=0.0, json_schema=schema),
              "drawn": SamplingParams(max_tokens=200, temperature=1.0, seed=3, json_schema=schema)}
    out = _outputs(engine, {**{rid: (prompt, p) for rid, p in guided.items()},
                            "free": (prompt, SamplingParams(max_tokens=30, temperature=0.0))})
    assert engine.stats["graph_steps"] > 0, engine.stats
    assert (engine.stats["ahead_steps"] > 0) == (k == 0), engine.stats     # (k = 2: drafts, once one request is left)
    assert_follows(engine, tok, prompt, guided, out)
    assert out["greedy"][2] == "stop", out["greedy"]


def test_regex_and_choice_grammars_on_graph_steps_equal_plain():
    """vLLM's regex / choice structured outputs on the GPU path (fp32, CUDA graphs, the Triton kernels): each output is
    one the grammar takes, and an engine looking ahead and one drafting (graph drafting) give the tokens of one that
    does neither — greedy and seeded."""
    pytest.importorskip("xgrammar")
    import re

    from cluster.guided import choice_grammar, regex_grammar
    from tests.integration.test_engine import _outputs

    plain, tok = _fp32_engine()
    plain.lookahead = False
    prompt = tok.encode_chat([{"role": "user", "content": "Is the sea old?"}], enable_thinking=False)
    words, choices = r"[a-z]{2,6}( [a-z]{2,6}){1,3}\.", ["yes", "no", "the old sea"]
    reqs = {"regex": (prompt, SamplingParams(max_tokens=40, temperature=0.0, grammar=regex_grammar(words))),
            "choice": (prompt, SamplingParams(max_tokens=40, temperature=1.0, seed=4,
                                              grammar=choice_grammar(choices)))}
    want = {rid: _outputs(plain, {rid: r})[rid] for rid, r in reqs.items()}
    assert re.fullmatch(words, want["regex"][1]) and want["choice"][1] in choices, want
    for kw, stat in (({}, "ahead_steps"), ({"speculative_tokens": 3}, "drafts_proposed")):
        eng, _ = _fp32_engine(**kw)
        for rid in reqs:                                    # alone: a solo request drafts on the graph path
            assert _outputs(eng, {rid: reqs[rid]})[rid] == want[rid], (kw, rid)
        assert eng.stats["graph_steps"] > 0, (kw, eng.stats)


def test_a_guided_request_drafting_on_graph_steps_equals_plain():
    """A guide that waits (for a token the free output holds early) on the GPU path (fp32, CUDA graphs): with MTP
    drafts (graph drafting, stopped before the token that ends the wait) and with look-ahead (a step launched over that
    token dropped), the tokens of an engine that does neither, and a value that follows the schema after the
    trigger; guided from the start (greedy, and drawn with a seed), its drafts verified on masked rows, the same."""
    pytest.importorskip("xgrammar")
    from tests.integration.test_engine import _outputs, waiting_guide_case

    plain, tok = _fp32_engine()
    plain.lookahead = False
    prompt, params, want = waiting_guide_case(plain, tok)
    for kw, stat in (({"speculative_tokens": 2}, "drafts_proposed"), ({}, "ahead_steps")):
        eng, _ = _fp32_engine(**kw)
        assert _outputs(eng, {"r": (prompt, params)})["r"] == want, kw
        assert eng.stats[stat] > 0 and eng.stats["graph_steps"] > 0, (kw, eng.stats)
    # guided from the first token, drafting all along: each verify row masked along its drafts
    for held in (replace(params, guide_after=()), replace(params, guide_after=(), temperature=0.8, seed=4)):
        want = _outputs(plain, {"r": (prompt, held)})["r"]
        eng, _ = _fp32_engine(speculative_tokens=2)
        assert _outputs(eng, {"r": (prompt, held)})["r"] == want, held
        assert eng.stats["drafts_accepted"] > 0 and eng.stats["graph_steps"] > 0, eng.stats


def test_a_thinking_budget_on_graph_steps_equals_plain():
    """``thinking_budget`` on the GPU path (fp32, CUDA graphs, the Triton kernels): ``</think>`` comes at the budget's
    count, and an engine looking ahead (a step launched over a spent budget dropped) and one drafting (graph drafting,
    drafts a token short of the budget) give the tokens of one that does neither — greedy and seeded."""
    from tests.integration.test_engine import _outputs

    plain, tok = _fp32_engine()
    plain.lookahead = False
    end = tok.special_ids_by_token()["</think>"]
    prompt = tok.encode_chat([{"role": "user", "content": "Hi there"}])
    reqs = {"b5": (prompt, SamplingParams(max_tokens=40, temperature=0.0, thinking_budget=5)),
            "drawn": (prompt, SamplingParams(max_tokens=40, temperature=1.0, seed=3, thinking_budget=7))}
    want = _outputs(plain, reqs)
    assert want["b5"][0].index(end) == 5 and want["drawn"][0].index(end) == 7, want
    for kw, stat in (({}, "ahead_steps"), ({"speculative_tokens": 3}, "drafts_proposed")):
        eng, _ = _fp32_engine(**kw)
        for rid in reqs:                                    # alone: drafts ride, and no other row's masks wait
            assert _outputs(eng, {rid: reqs[rid]})[rid] == want[rid], (kw, rid)
        assert eng.stats[stat] > 0 and eng.stats["graph_steps"] > 0, (kw, eng.stats)


def test_allowed_token_ids_on_graph_steps_equal_plain():
    """vLLM's ``allowed_token_ids`` on the GPU path (fp32, CUDA graphs, the Triton kernels): every token is one of them,
    and an engine looking ahead (sampling on the device) and one drafting (drafts outside the set rejected) give the
    tokens of one that does neither — greedy and seeded."""
    from tests.integration.test_engine import _outputs

    plain, tok = _fp32_engine()
    plain.lookahead = False
    prompt = tok.encode_chat([{"role": "user", "content": "Tell me a story."}], enable_thinking=False)
    allowed = tuple(tok.encode(" the old man and the sea said yes"))
    reqs = {"greedy": (prompt, SamplingParams(max_tokens=16, temperature=0.0, allowed_token_ids=allowed)),
            "drawn": (prompt, SamplingParams(max_tokens=16, temperature=0.9, seed=5, allowed_token_ids=allowed))}
    want = _outputs(plain, reqs)
    assert all(set(w[0]) <= set(allowed) and len(w[0]) == 16 for w in want.values()), want
    for kw, stat in (({}, "ahead_steps"), ({"speculative_tokens": 3}, "drafts_proposed")):
        eng, _ = _fp32_engine(**kw)
        for rid in reqs:                                    # alone: a solo request drafts on the graph path
            assert _outputs(eng, {rid: reqs[rid]})[rid] == want[rid], (kw, rid)
        assert eng.stats[stat] > 0 and eng.stats["graph_steps"] > 0, (kw, eng.stats)


def test_prompt_logprobs_on_the_gpu_path_equal_one_forward():
    """Prompt logprobs on the GPU path (fp32, graphs and pieces, the Triton kernels): eight prompts in chunks riding
    graph steps and pieces beside decode rows — each token's logprob and top 3 as one forward of the CPU reference
    over the whole prompt; the tokens sampled after them as without."""
    from cluster.config import DEFAULT_MODEL, EngineConfig
    from cluster.local import build_local_engine
    from tests.integration.test_graphs import requests
    from tests.integration.test_prompt_logprobs import TOP, asking, collect, reference

    ops.configure("reference", "cpu")                   # the oracle first: the engine's configure is process-wide
    cpu = load_model(DEFAULT_MODEL, dtype=torch.float32, progress=False)
    reqs = requests(8, cpu.config.vocab_size, max_tokens=6)
    refs = {rid: reference(cpu, ids) for rid, (ids, _) in reqs.items()}
    engine, _ = build_local_engine(EngineConfig(device="cuda", dtype="float32", kv_cache_tokens=4096, warmup_tokens=0,
                                                max_num_batched_tokens=64), progress=False)
    plain = collect(engine, reqs)
    got = collect(engine, asking(reqs))
    assert engine.stats["graph_steps"] > 0, engine.stats
    for rid, (ids, _) in reqs.items():
        want, _, top_ids, _ = refs[rid]
        lps = got[rid][1]
        assert got[rid][0] == plain[rid][0] and len(lps) == len(ids) - 1, rid
        torch.testing.assert_close(torch.tensor([lp.logprob for lp in lps]), want, atol=2e-3, rtol=0)
        same = sum([t for t, _ in lp.top] == row for lp, row in zip(lps, top_ids.tolist()))
        assert same >= len(lps) - 2 and all(len(lp.top) == TOP for lp in lps), (rid, same, len(lps))
