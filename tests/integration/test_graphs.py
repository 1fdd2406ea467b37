"""The static-shape decode path (``workers/graphs.py``) that CUDA graphs capture, run eagerly on CPU:
same tokens as the ragged eager path, with batching, speculation and contexts beyond ``index_topk``.
Graph capture itself and replay == eager bit for bit are checked on the GPU (tests/gpu/test_graphs_gpu.py)."""

from __future__ import annotations

import pytest
import torch

import workers.runner as runner_module
from cluster.engine import Engine, LocalExecutor, graph_key, warm_keys
from glmkernels.reference import indexer_topk, indexer_topk_paged
from models.cache import build_batch
from models.loader import load_model
from scheduler.request import SamplingParams
from scheduler.scheduler import ScheduledSeq, SchedulerConfig, StepPlan
from scheduler.shapes import DP, GRAPH_BUCKETS, GRAPH_MOE_ROWS, SPAN, StepShape, graph_width, graph_widths
from tests.conftest import run_engine
from workers.runner import ModelRunner
from workers.sampler import has_penalties, history_counts

BLOCK, NUM_BLOCKS = 16, 128


@pytest.fixture(scope="module")
def model(text_ckpt):
    return load_model(text_ckpt, dtype=torch.float32, progress=False)


def make_engine(model, graphs: bool, k: int = 0, blocks: int = NUM_BLOCKS, budget: int = 256,
                pieces: bool = False, caching: bool = False, host: int = 0, kv_fp8: bool = False) -> Engine:
    device = next(model.parameters()).device
    runner = ModelRunner(model, blocks, BLOCK, torch.float32, device, speculative=k > 0,
                         graphs="capture" if graphs else "off",
                         pieces=(budget, device.type == "cuda") if pieces else None, host_blocks=host, kv_fp8=kv_fp8)
    cfg = SchedulerConfig(num_blocks=blocks, block_size=BLOCK, max_model_len=1024,
                          vocab_size=model.config.vocab_size, eos_token_ids=(), max_num_batched_tokens=budget,
                          max_num_seqs=min(64, budget), prefix_caching=caching, host_blocks=host)
    return Engine(LocalExecutor(runner), cfg, speculative_tokens=k, graphs=graphs)


def run(engine: Engine, reqs: dict) -> dict[str, list[int]]:
    out = run_engine(engine, reqs)
    assert engine.num_free_blocks() == engine.scheduler.pool.num_blocks
    return out


def requests(n: int, vocab: int, max_tokens: int = 12, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"r{i}": (torch.randint(40, vocab, (int(torch.randint(20, 90, (1,), generator=g)),),
                                    generator=g).tolist(), SamplingParams(max_tokens=max_tokens, temperature=0.0))
            for i in range(n)}


def graph_runs(engine: Engine) -> dict:
    return engine.executor.runner.graphs.runs


@pytest.mark.parametrize("n", [1, 3, 6, 12, 40])
def test_static_decode_equals_eager(model, n):
    """Prompts of 20..90 tokens (index_topk = 32: the indexer selects) decoded 1, 3, 6, 12, 40 (the 64-row bucket)
    at a time."""
    reqs = requests(n, model.config.vocab_size, seed=n)
    blocks = max(NUM_BLOCKS, 8 * n)                     # every request's KV at once
    static = make_engine(model, graphs=True, blocks=blocks)
    assert run(static, reqs) == run(make_engine(model, graphs=False, blocks=blocks), reqs)
    buckets = {b for b, *_ in graph_runs(static)}
    assert buckets and buckets <= set(GRAPH_BUCKETS) and max(buckets) >= n


def test_static_verify_with_speculation_equals_plain(model):
    greedy = {"r": (requests(1, model.config.vocab_size, seed=7)["r0"][0], SamplingParams(max_tokens=24,
                                                                                         temperature=0.0))}
    spec = make_engine(model, graphs=True, k=3)
    assert run(spec, greedy) == run(make_engine(model, graphs=False), greedy)
    assert any(b == 4 for b, *_ in graph_runs(spec)), graph_runs(spec)      # 1 token + 3 drafts
    assert spec.spec_metrics()["accepted"] > 0
    drafts = spec.executor.runner.draft_graphs.runs                        # the MTP work took the static path
    assert any(k == 3 for *_, k in drafts), drafts
    eager_drafts = make_engine(model, graphs=True, k=3)
    eager_drafts.executor.runner.draft_graphs = None                        # the eager MtpDrafter after the replay
    assert run(eager_drafts, greedy) == run(make_engine(model, graphs=False), greedy)
    assert eager_drafts.spec_metrics() == spec.spec_metrics()                # the same drafts, so the same acceptance


def test_static_drafting_batched_and_sampled(model):
    """With speculation on: several requests (no drafts; the extend alone runs as a graph, k = 0), then drawn
    requests — seeded, unseeded (the same global seed before each engine), with top-p, with a penalty (the drafts
    so far counted on the device), and one whose context starts under ``index_topk`` keys — whose drafts are picked
    between the drafting graphs with their distributions kept: the tokens and the acceptance of the engine without
    graphs (the eager drafter)."""
    batch = requests(3, model.config.vocab_size, seed=11)
    spec, plain = make_engine(model, graphs=True, k=3), make_engine(model, graphs=False, k=3)
    assert run(spec, batch) == run(plain, batch)
    assert any(k == 0 for *_, k in spec.executor.runner.draft_graphs.runs)
    long = batch["r0"][0]
    short = long[:9]                  # fewer keys than index_topk: the selection widens as it decodes
    for prompt, params in ((long, SamplingParams(max_tokens=20, temperature=0.8, seed=5)),
                           (long, SamplingParams(max_tokens=20, temperature=0.6, top_p=0.9)),
                           (long, SamplingParams(max_tokens=20, temperature=0.7, top_k=30, repetition_penalty=1.2,
                                                 seed=6)),
                           (short, SamplingParams(max_tokens=20, temperature=0.8, seed=8))):
        spec, plain = make_engine(model, graphs=True, k=3), make_engine(model, graphs=False, k=3)
        torch.manual_seed(3)
        got = run(spec, {"s": (prompt, params)})
        torch.manual_seed(3)
        assert got == run(plain, {"s": (prompt, params)}), params
        assert spec.spec_metrics() == plain.spec_metrics()
        runs = spec.executor.runner.draft_graphs.runs
        assert any(key[0] == "drawn" and key[-1] == 3 for key in runs), runs
    assert spec.spec_metrics()["accepted"] > 0


def warmed(keys) -> tuple[set, set]:
    """The decode and drafting graph keys (as the runner counts them) that the warm steps of ``keys`` run."""
    drafting = {key + (k,) for key, counts in keys for k in counts}
    return {key for key, _ in keys}, drafting | {("drawn",) + key for key in drafting if key[-1]}


def captured(engine: Engine) -> tuple[list, list]:
    runner = engine.executor.runner
    return runner.graphs.captured, runner.draft_graphs.captured if runner.draft_graphs is not None else []


def serve_warm_shapes(model, k: int, warmup: int | None) -> tuple[Engine, list, tuple]:
    """An engine (warmed up to ``warmup`` tokens, or not) serving contexts under 48 tokens: a greedy and a drawn
    request alone (drafting), then four at once. Returns the engine, every request's tokens, and the graphs captured
    before serving (on CUDA)."""
    engine = make_engine(model, graphs=True, k=k)
    if warmup is not None:
        done = engine.warm_up(warmup)
        runner = engine.executor.runner
        assert done["graph_steps"] == len(warm_keys(1, True, k, graph_widths(-(-warmup // BLOCK))))
        assert engine.stats["steps"] == 0 and engine.num_free_blocks() == NUM_BLOCKS and not runner.requests
    g = torch.Generator().manual_seed(30)
    prompts = [torch.randint(40, model.config.vocab_size, (n,), generator=g).tolist() for n in (20, 9, 30, 14)]
    solo = [SamplingParams(max_tokens=12, temperature=0.0), SamplingParams(max_tokens=12, temperature=0.8, seed=2)]
    batch = {f"b{i}": (p, SamplingParams(max_tokens=10, temperature=0.0)) for i, p in enumerate(prompts)}
    before = captured(engine)
    return engine, [run(engine, {f"s{i}": (prompts[0], p)}) for i, p in enumerate(solo)] + [run(engine, batch)], before


@pytest.mark.parametrize("k", [0, 3])
def test_warm_up_runs_every_served_graph_key_and_changes_nothing(model, k):
    """``Engine.warm_up`` runs the graph keys of short contexts (``warm_keys``) on pad rows — with speculation, the
    drafting graphs after them, greedy and drawn — then a short request, and leaves no request, block or stat behind.
    Requests served after it give the tokens of an engine that never warmed up, and every decode and drafting graph
    key they ran was a warmed one (on a GPU: none was captured while serving)."""
    engine, got, _ = serve_warm_shapes(model, k, 48)
    assert got == serve_warm_shapes(model, k, None)[1]
    decode, drafting = warmed(warm_keys(1, True, k, graph_widths(3)))
    runner = engine.executor.runner
    assert runner.graphs.runs and set(runner.graphs.runs) <= decode, (sorted(runner.graphs.runs), sorted(decode))
    if k:
        assert any(key[0] == "drawn" for key in runner.draft_graphs.runs)
        assert set(runner.draft_graphs.runs) <= drafting, (sorted(runner.draft_graphs.runs, key=str), drafting)


def test_a_prompts_only_engine_runs_no_graph_step(model):
    """A prefill replica's engine (``prompts_only``: ``Coordinator(exports=True)``) warms up without a graph step, and
    its prompts of one token run none either — short ones, cached prompts' short tails, a prompt one token past the
    step's budget and a cached prompt's last token alone (rows that look like decode rows) — and sample an engine's
    without graphs. (A control engine runs such steps on graphs.)"""
    g = torch.Generator().manual_seed(31)
    head = torch.randint(40, model.config.vocab_size, (65,), generator=g).tolist()
    one = SamplingParams(max_tokens=1, temperature=0.0)
    rounds = [{"a": (head[:40], one), "b": (head[:7], one)},
              {f"t{n}": (head[:BLOCK * 2 + 1] + [50 + n] * n, one) for n in (1, 2, 3)},
              {"c": (head[:BLOCK * 2 + 1], one)}, {"d": (head, one)}]
    plain = make_engine(model, graphs=False, caching=True, budget=64)
    want = [run(plain, reqs) for reqs in rounds]
    for prompts_only in (True, False):
        engine = make_engine(model, graphs=True, caching=True, budget=64)
        engine.prompts_only = prompts_only
        done = engine.warm_up(48)
        assert (done["graph_steps"] == 0) == prompts_only and bool(graph_runs(engine)) != prompts_only
        graph_runs(engine).clear()
        assert [run(engine, reqs) for reqs in rounds] == want
        assert bool(graph_runs(engine)) != prompts_only, graph_runs(engine)


def test_warm_keys_follow_the_step_shapes():
    """One process: every dp bucket, drafts after the buckets a solo verify of 1 + 3 rows lands in; a group with
    span steps: drafts after a one-row dp step and on the span buckets; without speculation no drafting graphs."""
    assert warm_keys(1, True, 0, [1]) == [((b, 1, False), ()) for b in (1, 2, 4, 8, 16, 32, 64)]
    assert warm_keys(1, True, 3, [2], seqs_per_rank=16) == [
        ((1, 2, False), (0, 3)), ((2, 2, False), (0, 3)), ((4, 2, False), (0, 3)), ((8, 2, False), (0,)),
        ((16, 2, False), (0,))]
    assert warm_keys(2, True, 3, [5], seqs_per_rank=9) == [
        ((1, 5, False), (0, 3)), ((2, 5, False), (0,)), ((4, 5, False), (0,)), ((8, 5, False), (0,)),
        ((16, 5, False), (0,)), ((2, 5, True), (3,)), ((4, 5, True), (3,))]
    assert warm_keys(8, False, 1, [1])[:2] == [((1, 1, False), (0, 1)), ((2, 1, False), (0, 1))]


def test_graph_steps_keep_the_moe_within_its_capturable_rows():
    """A dp step's MoE takes every rank's rows: a graph step (and the warm-up's keys) keeps them within
    GRAPH_MOE_ROWS — one to four ranks capture every bucket, 8 ranks up to 32 rows a rank, 16 up to 16, 32 up to 8
    — and the Triton MoE runs that many rows on its fused launches, which a graph can hold (the grouped ones sync
    with the host); a span step is held to as many rows (the device comm's regions are that deep)."""
    from glmkernels.gluon_rows import MOE_MAX_ROWS
    from glmkernels.triton_absorb import ABSORB_MAX_ROWS
    from glmkernels.triton_moe import FUSED_MAX_ROWS

    assert FUSED_MAX_ROWS >= GRAPH_MOE_ROWS == 256 and MOE_MAX_ROWS >= GRAPH_MOE_ROWS
    assert ABSORB_MAX_ROWS >= GRAPH_BUCKETS[-1]
    assert [key[0] for key, _ in warm_keys(4, True, 3, [1]) if not key[2]] == [1, 2, 4, 8, 16, 32, 64]
    assert [key[0] for key, _ in warm_keys(8, True, 3, [1]) if not key[2]] == [1, 2, 4, 8, 16, 32]
    assert [key[0] for key, _ in warm_keys(16, True, 3, [1]) if not key[2]] == [1, 2, 4, 8, 16]
    assert [key[0] for key, _ in warm_keys(32, True, 3, [1]) if not key[2]] == [1, 2, 4, 8]
    seq = ScheduledSeq("a", (5,), 9, (0,), True, 0)
    one, eight = [StepPlan(0, (seq,), ())], [StepPlan(0, (seq,), ())] + [StepPlan(0, (), ())] * 7
    assert graph_key(StepShape(DP, 64, 64, None), one) == (64, 1, False)
    assert graph_key(StepShape(DP, 32, 256, None), eight) == (32, 1, False)
    assert graph_key(StepShape(DP, 64, 512, None), eight) is None
    assert graph_key(StepShape(SPAN, 64, 64, 0), eight) is None
    assert graph_key(StepShape(SPAN, 8, 8, 0), eight) == (8, 1, True)


@pytest.mark.parametrize("lengths", [[5, 9], [40, 70, 33], [200]])
def test_paged_indexer_selects_the_ragged_sets(lengths):
    """indexer_topk_paged (static width, pad rows) selects the same sets as indexer_topk, per row."""
    g = torch.Generator().manual_seed(len(lengths))
    ih, idd, topk, bs = 4, 8, 32, BLOCK
    k_cache = torch.randn(64 * bs, idd, generator=g)
    seqs, row_tables = [], []
    for i, T in enumerate(lengths):
        blocks = torch.randperm(64, generator=g)[: -(-T // bs)].tolist()
        seqs.append((T - 2, 2, blocks))                      # two rows each: a verify-shaped step
        row_tables += [blocks, blocks]
    batch = build_batch(seqs, bs)
    N = batch.num_rows
    q, w = torch.randn(N, ih, idd, generator=g), torch.rand(N, ih, generator=g)
    ragged = indexer_topk(q, w, k_cache, batch.seq_rows, batch.seq_slots, batch.positions, topk, 0.3)
    width = max(len(t) for t in row_tables) + 1                  # one spare column, as a graph's width
    table = torch.zeros(N, width, dtype=torch.int32)
    for r, t in enumerate(row_tables):
        table[r, :len(t)] = torch.tensor(t)
    paged = indexer_topk_paged(q, w, k_cache, table, bs, batch.positions, topk, 0.3)
    for r in range(N):
        assert set(ragged[r].tolist()) - {-1} == set(paged[r].tolist()) - {-1}, r



def test_graph_key_only_for_decode_and_verify_rows_within_the_buckets():
    def plan(*seqs):
        return StepPlan(0, tuple(seqs), ())
    decode = ScheduledSeq("a", (7,), 40, tuple(range(3)), True, 0)
    verify = ScheduledSeq("b", (7, 8, 9, 10), 100, tuple(range(10, 17)), True, 0, num_drafts=3)
    prefill = ScheduledSeq("c", (1, 2, 3), 0, (20,), True, 0)                      # a whole prompt: not a graph
    chunk = ScheduledSeq("d", (5,), 16, (21, 22), False, 0)                        # a chunk that does not sample
    dp = StepShape("dp", 4, 8, None)
    assert graph_key(dp, [plan(decode, verify), plan()]) == (4, graph_width(7), False)   # widest table: 7 blocks
    assert graph_key(StepShape("span", 4, 4, 1), [plan(), plan(verify)]) == (4, graph_width(7), True)   # not dp's
    assert graph_key(dp, [plan(decode), plan(prefill)]) is None                    # every rank must qualify
    assert graph_key(dp, [plan(decode), plan(chunk)]) is None
    assert graph_key(StepShape("dp", 128, 128, None), [plan(decode)]) is None      # beyond the largest bucket
    assert graph_key(dp, [plan(), plan()]) is None


def test_graph_key_takes_prompt_chunks_into_dp_steps_that_draft_nothing():
    def plan(*seqs):
        return StepPlan(0, tuple(seqs), ())
    decode = ScheduledSeq("a", (7,), 40, tuple(range(3)), True, 0)
    prefill = ScheduledSeq("c", (1, 2, 3), 0, (20,), True, 0)
    chunk = ScheduledSeq("d", (5, 6), 16, (21, 22), False, 0)
    verify = ScheduledSeq("b", (7, 8, 9, 10), 100, tuple(range(10, 17)), True, 0, num_drafts=3)
    dp = StepShape("dp", 4, 8, None)
    assert graph_key(dp, [plan(decode, chunk), plan(prefill)], chunk_rows=4) == (4, graph_width(3), False)
    assert graph_key(dp, [plan(decode, chunk), plan(prefill)]) is None
    assert graph_key(dp, [plan(decode, chunk), plan(prefill)], chunk_rows=2) is None  # beyond the decode buckets
    assert graph_key(dp, [plan(verify), plan(chunk)], chunk_rows=4) is None          # a verify beside: drafts ride
    assert graph_key(StepShape("span", 4, 4, 1), [plan(), plan(prefill)], chunk_rows=4) is None
    assert graph_key(StepShape("dp", 128, 128, None), [plan(prefill)], chunk_rows=128) is None


def run_arrivals(engine: Engine, arrivals: dict[int, dict]) -> dict[str, list[int]]:
    """``arrivals``: {step index: requests added before that step}; steps until every request is done."""
    out, step = {}, 0
    while step <= max(arrivals) or engine.has_unfinished():
        for rid, (ids, params) in arrivals.get(step, {}).items():
            engine.add_request(ids, params, rid)
            out[rid] = []
        for ev in engine.step():
            assert ev.error is None, ev.error
            out[ev.req_id] += ev.token_ids
        step += 1
    assert engine.num_free_blocks() == engine.scheduler.pool.num_blocks
    return out


@pytest.mark.parametrize("k", [0, 3])
def test_prompt_chunks_ride_graph_steps(model, k):
    """Prompts arriving while others decode — short ones whole, a long one in chunks of a 40-token budget, some
    chunks not sampling — ride the decoders' graph steps where the step fits a bucket: the tokens of the engine
    without graphs; with speculation (drafts ride only a solo request; the MTP extend of every row runs on its
    graph) the same tokens and acceptance as the eager drafter."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(21)

    def ask(n: int, tokens: int) -> tuple:
        return torch.randint(40, vocab, (n,), generator=g).tolist(), SamplingParams(max_tokens=tokens, temperature=0)

    arrivals = {0: {"a": ask(30, 14)}, 3: {"b": ask(9, 10), "c": ask(20, 8)}, 6: {"d": ask(100, 6)},
                9: {"e": ask(5, 4)}}
    engine = make_engine(model, graphs=True, k=k, budget=40)
    staged = []
    stage = engine.executor.runner.graphs.stage
    engine.executor.runner.graphs.stage = lambda seqs, *a: staged.append(seqs) or stage(seqs, *a)
    got = run_arrivals(engine, arrivals)
    assert got == run_arrivals(make_engine(model, graphs=False, k=k, budget=40), arrivals)
    chunks = [s for seqs in staged for s in seqs if len(s.token_ids) > 1 + s.num_drafts]
    assert any(not s.sample for s in chunks) and {s.req_id for s in chunks} >= {"b", "c", "d", "e"}, chunks
    assert any(len(seqs) > 1 and len(s.token_ids) == 1 for seqs in staged for s in seqs)       # beside decoders
    off = make_engine(model, graphs=True, k=k, budget=40)
    off.graph_prefill = False
    assert run_arrivals(off, arrivals) == got and off.stats["graph_steps"] < engine.stats["graph_steps"]
    if k:         # the same blocks on both engines (no slack with speculation): the MTP layer's KV in them too
        spec = make_engine(model, graphs=False, k=k, budget=40)
        run_arrivals(spec, arrivals)
        assert engine.spec_metrics() == spec.spec_metrics() and spec.spec_metrics()["accepted"] > 0
        mtp = model.config.num_hidden_layers
        for cache in ("kv", "index_k"):
            a, b = (getattr(e.executor.runner.cache, cache)[mtp][:NUM_BLOCKS * BLOCK] for e in (engine, spec))
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("k", [0, 3])
def test_logit_bias_on_graph_steps_and_verify_rows_equals_eager(model, k):
    """A biased request's graph steps (looking ahead) and verify rows give the eager plain engine's tokens: the bias
    applies where the step samples, and verification applies it to every position."""
    vocab = model.config.vocab_size
    reqs = requests(3, vocab, max_tokens=16, seed=9)
    plain = run(make_engine(model, graphs=False), reqs)
    for i, rid in enumerate(reqs):      # ban the plain answer's 2nd token, favour a token it never chose
        ids, params = reqs[rid]
        bias = {plain[rid][1]: -100.0, next(t for t in range(40, vocab) if t not in plain[rid]): 3.0 + i}
        reqs[rid] = (ids, SamplingParams(max_tokens=16, temperature=0.0, logit_bias=bias))
    want = run(make_engine(model, graphs=False), reqs)
    assert want != plain
    assert run(make_engine(model, graphs=True), reqs) == want
    solo = {"r0": reqs["r0"]}
    spec = make_engine(model, graphs=True, k=k)
    assert run(spec, solo) == {"r0": want["r0"]} and (k == 0 or spec.spec_metrics()["rounds"] > 0)


@pytest.mark.parametrize("k", [0, 3])
def test_cached_prompts_tails_ride_graph_steps(model, k):
    """Prefix caching: prompts whose cached blocks leave a tail of 1..3 tokens (a new request's first rows start
    mid-context) ride the decoders' graph steps: the tokens of an eager engine without the cache."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(5)
    base = torch.randint(40, vocab, (80,), generator=g).tolist()
    greedy = SamplingParams(max_tokens=10, temperature=0.0)
    arrivals = {0: {"a": (base, SamplingParams(max_tokens=30, temperature=0.0))},
                4: {"b": (base[:64] + base[64:65], greedy)},          # 4 blocks cached (a's), one token to compute
                7: {"c": (base[:48] + base[48:51], greedy), "d": (base[:33] + [50, 51], greedy)}}
    engine = make_engine(model, graphs=True, k=k, caching=True)
    staged = []
    stage = engine.executor.runner.graphs.stage
    engine.executor.runner.graphs.stage = lambda seqs, *a: staged.append(seqs) or stage(seqs, *a)
    assert run_arrivals(engine, arrivals) == run_arrivals(make_engine(model, graphs=False, k=k), arrivals)
    firsts = {s.req_id: s for seqs in staged for s in seqs if s.req_id in "bcd" and s.num_generated == 0}
    assert {r: s.start_pos for r, s in firsts.items()} == {"b": 64, "c": 48, "d": 32}, firsts
    assert engine.scheduler.prefix_hits == 64 + 48 + 32


def host_tier_arrivals(vocab: int) -> dict[int, dict]:
    """Two conversations and a long prompt that, on 24 blocks, evict each other's prefixes from the device while others
    decode (graph steps, launched ahead): their next turns take them back from the host tier."""
    g = torch.Generator().manual_seed(11)
    a, b, filler = (torch.randint(40, vocab, (n,), generator=g).tolist() for n in (120, 100, 200))
    greedy = SamplingParams(max_tokens=16, temperature=0.0)
    return {0: {"a1": (a, greedy)}, 3: {"b1": (b, greedy)}, 30: {"f": (filler, greedy)},
            50: {"a2": (a + [77, 78, 79], greedy)}, 52: {"b2": (b[:97] + [81], greedy)},
            80: {"f2": (filler[:150], greedy)}, 100: {"a3": (a + [77, 78], greedy), "b3": (b + [5], greedy)}}


@pytest.mark.parametrize("k,fp8", [(0, False), (3, False), (0, True), (3, True)])
def test_prefixes_from_the_host_tier_ride_graph_steps(model, k, fp8):
    """The host tier under graph steps and look-ahead: the tokens of an eager engine without the cache. ``fp8``: both
    with the FP8 KV cache, prompt chunks on the per-layer pieces."""
    arrivals = host_tier_arrivals(model.config.vocab_size)
    engine = make_engine(model, graphs=True, k=k, blocks=24, caching=True, host=96, kv_fp8=fp8, pieces=fp8)
    assert run_arrivals(engine, arrivals) == run_arrivals(make_engine(model, graphs=False, k=k, blocks=24,
                                                                      kv_fp8=fp8), arrivals)
    assert engine.scheduler.host_loads > 0 and engine.stats["graph_steps"] > 0
    assert k or engine.stats["ahead_steps"] > 0


@pytest.mark.parametrize("k", [0, 3])
def test_steps_on_pieces_give_the_eager_tokens(model, k):
    """Prompts of 100–200 tokens in chunks of a 96-token budget beside decoders (steps no decode bucket holds) run on
    the per-layer pieces (``workers/pieces.py``, uncaptured on CPU): padded to their rows buckets, the indexer's
    selection and the attention eager between them — the tokens of the ragged eager path, with speculation the same
    acceptance; every step that was not a graph step took them."""
    from workers.pieces import PIECE_BUCKETS, PieceGraphs

    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(33)

    def ask(n: int, tokens: int) -> tuple:
        return torch.randint(40, vocab, (n,), generator=g).tolist(), SamplingParams(max_tokens=tokens, temperature=0)

    arrivals = {0: {"a": ask(150, 10)}, 2: {"b": ask(12, 12), "c": ask(200, 6)}, 5: {"d": ask(100, 5)}}
    engine = make_engine(model, graphs=True, k=k, budget=96, pieces=True)
    plain = make_engine(model, graphs=False, k=k, budget=96)
    assert run_arrivals(engine, arrivals) == run_arrivals(plain, arrivals)
    runs = engine.executor.runner.pieces.runs
    assert set(runs) <= set(PIECE_BUCKETS) and runs.get(96, 0) >= 4, runs
    assert sum(runs.values()) == engine.stats["steps"] - engine.stats["graph_steps"]
    if k:    # the drafts were the eager drafter's (the same acceptance), its passes on the pieces
        assert engine.spec_metrics() == plain.spec_metrics() and plain.spec_metrics()["accepted"] > 0
        assert engine.executor.runner.pieces.mtp_runs.get(96, 0) >= 4, engine.executor.runner.pieces.mtp_runs
    # pieces of at most 64 rows (PieceGraphs caps ``max_rows`` at its largest bucket, 2048, the same way), chunks not
    # on decode graphs: the 96-row steps run eagerly beside smaller ones on the pieces, the same tokens
    small = make_engine(model, graphs=True, k=k, budget=96)
    small.graph_prefill = False
    runner = small.executor.runner
    runner.pieces = PieceGraphs(model, runner.cache, runner.graphs.pad_slot, 64, 1, False, runner.device, None)
    assert run_arrivals(small, arrivals) == run_arrivals(plain, arrivals)
    assert 0 < sum(runner.pieces.runs.values()) < small.stats["steps"] - small.stats["graph_steps"]
    assert PieceGraphs(model, runner.cache, 0, 8192, 1, False, runner.device, None).max_rows == PIECE_BUCKETS[-1]


def test_pieces_equal_the_model_forward_within_fp32_rounding(model):
    """One ragged step (a 70-token chunk, a 40-token prompt, a decode row) on the pieces against ``model.forward``
    on a copy of the cache: the hidden rows and every cache slot written agree to fp32 rounding (the rows are padded to
    the 128-row bucket, so a GEMM may block them differently; bit-identity is the GPU replay's, against the same
    pieces uncaptured: tests/gpu/test_graphs_gpu.py)."""
    import copy

    runner = ModelRunner(model, NUM_BLOCKS, BLOCK, torch.float32, graphs="eager", pieces=(256, False))
    cache = copy.deepcopy(runner.cache)
    seqs = [(0, 70, list(range(5))), (0, 40, list(range(10, 13))), (30, 1, list(range(20, 22)))]
    ids = torch.randint(5, model.config.vocab_size, (111,), generator=torch.Generator().manual_seed(3))
    batch = build_batch(seqs, BLOCK)
    with torch.inference_mode():
        want = model(ids, batch, cache)
        got = runner.pieces.forward(ids, batch)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert runner.pieces.runs == {128: 1}
    for a, b in zip(runner.cache.kv + runner.cache.index_k, cache.kv + cache.index_k):
        if a is not None:
            torch.testing.assert_close(a[:-1], b[:-1], atol=1e-5, rtol=1e-5)    # the pad slot (last) aside


def test_graph_steps_without_index_sharing_draft_on_the_pieces(model):
    """A checkpoint whose MTP passes select anew (no ``index_share_for_mtp_iteration``: no drafting graphs) drafts
    after each graph step with the eager drafter: on the pieces (the extend, the chained passes selecting) its
    acceptance and tokens are those of the drafter without pieces, and the tokens plain decoding's."""
    import copy

    m = copy.copy(model)
    m.config = copy.copy(model.config)
    object.__setattr__(m.config, "index_share_for_mtp_iteration", False)
    reqs = requests(1, m.config.vocab_size, max_tokens=24)
    want = run(make_engine(m, graphs=False), reqs)
    results = []
    for pieces in (False, True):
        engine = make_engine(m, graphs=True, k=3, pieces=pieces)
        assert engine.executor.runner.draft_graphs is None
        results.append((run(engine, reqs), engine.spec_metrics()))
    assert results[0] == results[1] and results[0][0] == want and results[0][1]["accepted"] > 0
    assert sum(engine.executor.runner.pieces.mtp_runs.values()) > engine.stats["graph_steps"] > 0


def test_mtp_passes_on_pieces_equal_the_model_within_fp32_rounding(model):
    """The MTP layer on the pieces: an extend over a ragged step's rows, then a chained draft pass of two rows that
    reuses its selection (scratch slots), against ``model.mtp_forward`` on a copy of the cache — the hidden rows, the
    selections and the MTP layer's cache agree to fp32 rounding."""
    import copy

    from models.cache import Batch

    runner = ModelRunner(model, NUM_BLOCKS, BLOCK, torch.float32, graphs="eager", speculative=True,
                         pieces=(256, False))
    cache, mtp = copy.deepcopy(runner.cache), model.config.num_hidden_layers
    g = torch.Generator().manual_seed(5)
    for a, b in zip(runner.cache.kv + runner.cache.index_k, cache.kv + cache.index_k):   # contexts to attend over
        if a is not None:
            a.copy_(torch.randn(a.shape, generator=g))
            b.copy_(a)
    seqs = [(0, 70, list(range(5))), (40, 30, list(range(10, 15))), (30, 1, list(range(20, 22)))]
    batch = build_batch(seqs, BLOCK)
    hidden = torch.randn(101, model.config.hidden_size, generator=g)
    ids = torch.randint(5, model.config.vocab_size, (101,), generator=g)
    with torch.inference_mode():
        want, want_topk = model.mtp_forward(hidden, ids, batch, cache)
        got, got_topk = runner.pieces.mtp_forward(hidden, ids, batch)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert torch.equal(got_topk.sort(-1).values, want_topk.sort(-1).values)
        rows = [69, 100]                             # two requests' last rows draft on: positions 70 and 31
        scratch = NUM_BLOCKS * BLOCK
        chain = Batch(torch.tensor([70, 31]), torch.tensor([scratch, scratch + 8]), [(0, 1), (1, 1)],
                      [torch.cat([build_batch([seqs[i][:2] + (seqs[i][2],)], BLOCK).seq_slots[0], torch.tensor([s])])
                       for i, s in ((0, scratch), (2, scratch + 8))])
        draft_ids = torch.tensor([7, 9])
        want2, _ = model.mtp_forward(want[rows], draft_ids, chain, cache, want_topk[rows])
        got2, topk2 = runner.pieces.mtp_forward(got[rows], draft_ids, chain, got_topk[rows])
    torch.testing.assert_close(got2, want2, atol=1e-5, rtol=1e-5)
    assert topk2 is not None and torch.equal(topk2, got_topk[rows])             # carried, not selected again
    assert runner.pieces.mtp_runs == {128: 1, 8: 1} and runner.pieces.runs == {}
    for a, b in ((runner.cache.kv[mtp], cache.kv[mtp]), (runner.cache.index_k[mtp], cache.index_k[mtp])):
        torch.testing.assert_close(a[:-1], b[:-1], atol=1e-5, rtol=1e-5)


def test_pieces_can_be_captured_at_first_use_mid_step(model):
    """A CUDA graph's capture runs its piece once more than a replay does (the warm-up run; the capture itself runs
    nothing): a recorder that runs each piece twice at its capture and once per replay gives the same hidden rows and
    KV as running it once — no piece reads what it writes. Then ``warm`` records every piece of every bucket."""
    import copy

    from workers.pieces import PIECE_BUCKETS

    class Replayed:
        def __init__(self, fn):
            self.replay = fn

    def record(fn, what):
        fn()
        fn()
        return Replayed(fn), None

    once = ModelRunner(model, NUM_BLOCKS, BLOCK, torch.float32, graphs="eager", pieces=(200, False),
                       speculative=True)
    twice = copy.deepcopy(once)
    twice.pieces.record = record
    seqs = [(0, 70, list(range(5))), (30, 1, list(range(20, 22)))]
    ids = torch.randint(5, model.config.vocab_size, (71,), generator=torch.Generator().manual_seed(4))
    for r in (once, twice):                      # the target's step, then the MTP's extend over its rows
        batch = build_batch(seqs, BLOCK)
        r.out = r.pieces.forward(ids, batch)
        r.mtp = r.pieces.mtp_forward(r.out, ids.roll(-1), batch)[0]
    layers = model.config.num_hidden_layers
    assert torch.equal(once.out, twice.out) and torch.equal(once.mtp, twice.mtp)
    assert len(twice.pieces.captured) == 1 + 2 * layers + 3
    assert all(torch.equal(a, b) for a, b in zip(once.cache.kv, twice.cache.kv))
    # each bucket: the embedding, two per layer, the MTP's input, A (with and without selecting: the 8-row bucket
    # of the chained draft passes, as GLM-5 shares the selection) and B
    share = model.config.index_share_for_mtp_iteration
    assert twice.pieces.warm() == sum(1 + 2 * layers + 3 + (share and b == 8) for b in PIECE_BUCKETS if b <= 256) \
        - (1 + 2 * layers + 3)


def test_span_and_dp_steps_of_one_bucket_keep_separate_graphs(model):
    """A group's span step and dp step with the same (bucket, width) run different comm phases: their keys
    differ (``graph_key``), and the runner keeps a graph per key (a shared graph would replay the wrong phases)."""
    from workers.runner import NewRequest, WorkerStep

    runner = ModelRunner(model, NUM_BLOCKS, BLOCK, torch.float32, graphs="eager")
    prompt = list(range(40, 60))
    params = SamplingParams(max_tokens=8, temperature=0.0)
    blocks = (0, 1)
    first = runner.execute(WorkerStep(0, (ScheduledSeq("a", tuple(prompt), 0, blocks, True, 0),),
                                      (NewRequest("a", tuple(prompt), params),)))
    token = first.sampled["a"][0]
    for step_id, shape in enumerate([StepShape("span", 2, 2, 0), StepShape("dp", 2, 2, None)], start=1):
        seq = ScheduledSeq("a", (token,), len(prompt) + step_id - 1, blocks, True, step_id)
        key = graph_key(shape, [StepPlan(step_id, (seq,), ())])
        token = runner.execute(WorkerStep(step_id, (seq,), shape=shape, graph=key)).sampled["a"][0]
    assert sorted(runner.graphs.runs) == [(2, 2, False), (2, 2, True)]


def test_lookahead_decode_equals_eager_and_is_used(model):
    """Greedy graph steps sample on the device and launch the next decode step before the tokens are read back: the
    tokens are the eager path's, and most steps of a lone request were launched ahead and used. With traffic —
    requests arriving mid-decode (their prefill steps do not match the step launched ahead), ending on a stop
    token, aborted — the dropped look-aheads change nothing: same tokens, every block back."""
    vocab = model.config.vocab_size
    solo = requests(1, vocab, max_tokens=40, seed=11)
    engine = make_engine(model, graphs=True)
    assert run(engine, solo) == run(make_engine(model, graphs=False), solo)
    stats = engine.executor.runner.ahead_stats
    assert stats["used"] >= 30 and stats["launched"] <= stats["used"] + 3, stats   # the last step and block edges
    assert engine.stats["ahead_steps"] == stats["used"]

    reqs = requests(5, vocab, max_tokens=20, seed=12)
    eager = make_engine(model, graphs=False)
    want = run(eager, reqs)
    stop_tok = want["r1"][5]                       # r1 ends on its sixth token when that is a stop token
    reqs["r1"] = (reqs["r1"][0], SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=[stop_tok]))
    want = run(make_engine(model, graphs=False), reqs)
    assert len(want["r1"]) <= 6
    static = make_engine(model, graphs=True)
    got, pending, step = {}, dict(reqs), 0
    while pending or static.has_unfinished():
        if pending and step % 7 == 0:             # one request joins every 7 steps
            rid, (prompt, params) = pending.popitem()
            static.add_request(prompt, params, rid)
            got[rid] = []
        for ev in static.step():
            got[ev.req_id] += ev.token_ids
        step += 1
    assert got == want
    assert static.num_free_blocks() == NUM_BLOCKS
    runner = static.executor.runner
    assert runner.ahead_stats["used"] > 0 and runner.ahead_stats["launched"] > runner.ahead_stats["used"]

    aborted = make_engine(model, graphs=True)
    aborted.add_request(solo["r0"][0], solo["r0"][1], "a")
    for _ in range(6):
        aborted.step()
    assert aborted.abort("a").finished and aborted.executor.runner._ahead is not None
    assert run(aborted, solo) == run(make_engine(model, graphs=False), solo)   # the next request is unaffected


def test_no_lookahead_past_a_one_token_prompt_chunk(model):
    """A prompt chunk cut to one token by the budget (it samples nothing) beside a decoder is one row like a decode
    row: the step must not launch its successor ahead (its row would sample and get a token) — the tokens are the
    eager path's, no step fails."""
    vocab = model.config.vocab_size
    a, b = requests(2, vocab, max_tokens=8, seed=15).values()
    arrivals = {0: {"a": a}, 3: {"b": (b[0][:5], b[1])}}
    want = run_arrivals(make_engine(model, graphs=False, budget=2), arrivals)
    assert run_arrivals(make_engine(model, graphs=True, budget=2), arrivals) == want


def test_lookahead_draws_seeded_rows_as_eager(model):
    """Drawn rows (temperature, top-k / top-p / min-p, a seed each) sample on the device beside a greedy one: the
    steps launched ahead are used, and every request's tokens are the eager path's."""
    reqs = requests(4, model.config.vocab_size, seed=14)
    drawn = [SamplingParams(max_tokens=24, temperature=0.9, seed=5), SamplingParams(max_tokens=24, temperature=0.7,
             top_k=20, top_p=0.9, seed=6), SamplingParams(max_tokens=24, temperature=1.3, min_p=0.05, seed=7),
             SamplingParams(max_tokens=24, temperature=0.0)]
    reqs = {rid: (prompt, params) for (rid, (prompt, _)), params in zip(reqs.items(), drawn)}
    engine = make_engine(model, graphs=True)
    assert run(engine, reqs) == run(make_engine(model, graphs=False), reqs)
    assert engine.executor.runner.ahead_stats["used"] >= 10, engine.executor.runner.ahead_stats


def test_lookahead_rows_with_penalties_equal_eager(model, monkeypatch):
    """Penalties read each request's token counts on the device, the token fed to a step launched ahead counted before
    the host has it: rows with repetition / presence / frequency penalties (beside a row without) look ahead, and
    their tokens are the eager path's (which counts host histories), and every draw read the counts of exactly the
    tokens before it."""
    vocab = model.config.vocab_size
    reqs = requests(3, vocab, seed=13)
    asks = [SamplingParams(max_tokens=24, temperature=0.8, seed=3, presence_penalty=1.5, frequency_penalty=0.8),
            SamplingParams(max_tokens=24, temperature=0.0, repetition_penalty=1.6),
            SamplingParams(max_tokens=24, temperature=0.0)]
    reqs = {rid: (prompt, p) for (rid, (prompt, _)), p in zip(reqs.items(), asks)}
    engine = make_engine(model, graphs=True)
    seen = []                                   # (request, index of the token drawn, the counts its penalties read)
    draw = runner_module.sample_on_device

    def spy(logits, params, num_generated, counts=None):
        if counts is not None:
            rids = [next(rid for rid, (_, p) in reqs.items() if p is q) for q in params]   # distinct params each
            seen.extend((rid, j, c.clone()) for rid, j, c in zip(rids, num_generated, counts))
        return draw(logits, params, num_generated, counts)

    monkeypatch.setattr(runner_module, "sample_on_device", spy)
    got = run(engine, reqs)
    assert got == run(make_engine(model, graphs=False), reqs)
    assert engine.executor.runner.ahead_stats["used"] >= 10, engine.executor.runner.ahead_stats
    # every draw on the device read the counts of its prompt and the tokens before it, the fed one included
    assert len(seen) >= 30
    for rid, j, counts in seen:
        prompt, params = reqs[rid]
        if has_penalties(params):
            want = history_counts([prompt + got[rid][:j]], [len(prompt)], vocab, counts.device)[0]
            assert torch.equal(counts, want), (rid, j)


def test_lookahead_gives_the_eager_logprobs(model):
    """Rows asking for logprobs (greedy with top 2, seeded drawn with none, beside a row without) look ahead; every
    token's logprob and top-n are those of the same steps sampled on the host."""
    reqs = requests(3, model.config.vocab_size, seed=15)
    asks = [SamplingParams(max_tokens=12, temperature=0.0, logprobs=2),
            SamplingParams(max_tokens=12, temperature=0.9, seed=4, logprobs=0), SamplingParams(max_tokens=12, seed=5)]
    reqs = {rid: (prompt, p) for (rid, (prompt, _)), p in zip(reqs.items(), asks)}
    engine, host = make_engine(model, graphs=True), make_engine(model, graphs=True)
    host.lookahead = False                  # the same graph steps, sampled on the host (the ragged path's logits
    got = run_engine(engine, reqs, logprobs=True)          # differ from the padded bucket's in the last bits)
    assert got == run_engine(host, reqs, logprobs=True)
    assert engine.executor.runner.ahead_stats["used"] >= 5 and host.executor.runner.ahead_stats["used"] == 0
    assert len(got["r0"][3][2]) == 2 and got["r1"][3][2] == ()


def test_lookahead_goes_on_as_requests_end(model):
    """A batch whose requests end at different steps (by length, one on a stop token), some asking for logprobs: the
    step launched ahead is used less the ended rows' — the tokens and top-n ids of the same graph steps sampled on the
    host, the logprobs to 1e-5 (the launched step's lm_head had the ended rows too: other rows, other last bits) —
    and every graph step but where the bucket shrank was launched ahead and used."""
    vocab = model.config.vocab_size
    base = requests(6, vocab, seed=16)
    plain = run_engine(make_engine(model, graphs=True), base)
    asks = [SamplingParams(max_tokens=6 + 3 * i, temperature=0.0, logprobs=2 if i % 2 else None)
            for i in range(6)]
    asks[4] = SamplingParams(max_tokens=30, temperature=0.0, logprobs=1, stop_token_ids=[plain["r4"][7]])
    reqs = {rid: (prompt, p) for (rid, (prompt, _)), p in zip(base.items(), asks)}
    engine, host = make_engine(model, graphs=True), make_engine(model, graphs=True)
    host.lookahead = False
    got, want = run_engine(engine, reqs, logprobs=True), run_engine(host, reqs, logprobs=True)
    for rid in reqs:                    # (token, logprob, top) where asked, else the token
        assert len(got[rid]) == len(want[rid])
        for a, b in zip(got[rid], want[rid]):
            if isinstance(a, int):
                assert a == b
                continue
            assert a[0] == b[0] and a[1] == pytest.approx(b[1], abs=1e-5)
            assert [i for i, _ in a[2]] == [i for i, _ in b[2]]
    assert len(got["r4"]) <= 8 and len(got["r5"]) == 21 and len(got["r1"][0][2]) == 2
    stats, steps = engine.executor.runner.ahead_stats, engine.stats
    assert stats["used"] >= steps["graph_steps"] - 4, (stats, steps)     # the first, and buckets 8 → 4 → 2 → 1
    assert engine.num_free_blocks() == NUM_BLOCKS
