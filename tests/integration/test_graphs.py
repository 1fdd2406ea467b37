"""The static-shape decode path (``workers/graphs.py``) that CUDA graphs capture, run eagerly on CPU:
same tokens as the ragged eager path, with batching, speculation and contexts beyond ``index_topk``.
Graph capture itself and replay == eager bit for bit are checked on the GPU (tests/gpu/test_graphs_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from cluster.engine import Engine, LocalExecutor, graph_key
from kernels.reference import indexer_topk, indexer_topk_paged
from models.cache import build_batch
from models.loader import load_model
from scheduler.request import SamplingParams
from scheduler.scheduler import ScheduledSeq, SchedulerConfig, StepPlan
from scheduler.shapes import StepShape
from tests.conftest import run_engine
from workers.runner import ModelRunner

BLOCK, NUM_BLOCKS = 16, 128


@pytest.fixture(scope="module")
def model(text_ckpt):
    return load_model(text_ckpt, dtype=torch.float32, progress=False)


def make_engine(model, graphs: bool, k: int = 0) -> Engine:
    device = next(model.parameters()).device
    runner = ModelRunner(model, NUM_BLOCKS, BLOCK, torch.float32, device, speculative=k > 0,
                         graphs="capture" if graphs else "off")
    cfg = SchedulerConfig(num_blocks=NUM_BLOCKS, block_size=BLOCK, max_model_len=1024,
                          vocab_size=model.config.vocab_size, eos_token_ids=())
    return Engine(LocalExecutor(runner), cfg, speculative_tokens=k, graphs=graphs)


def run(engine: Engine, reqs: dict) -> dict[str, list[int]]:
    out = run_engine(engine, reqs)
    assert engine.num_free_blocks() == NUM_BLOCKS
    return out


def requests(n: int, vocab: int, max_tokens: int = 12, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"r{i}": (torch.randint(40, vocab, (int(torch.randint(20, 90, (1,), generator=g)),),
                                    generator=g).tolist(), SamplingParams(max_tokens=max_tokens, temperature=0.0))
            for i in range(n)}


def graph_runs(engine: Engine) -> dict:
    return engine.executor.runner.graphs.runs


@pytest.mark.parametrize("n", [1, 3, 6])
def test_static_decode_equals_eager(model, n):
    """Prompts of 20..90 tokens (index_topk = 32: the indexer selects) decoded 1, 3, 6 at a time."""
    reqs = requests(n, model.config.vocab_size, seed=n)
    static = make_engine(model, graphs=True)
    assert run(static, reqs) == run(make_engine(model, graphs=False), reqs)
    buckets = {b for b, *_ in graph_runs(static)}
    assert buckets and buckets <= {1, 2, 4, 8} and max(buckets) >= min(n, 8)


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
    requests — seeded, unseeded (the same global seed before each engine), with top-p and with a penalty (its
    drafts' history read back) — whose drafts are picked between the drafting graphs with their distributions kept:
    the tokens and the acceptance of the engine without graphs (the eager drafter)."""
    batch = requests(3, model.config.vocab_size, seed=11)
    spec, plain = make_engine(model, graphs=True, k=3), make_engine(model, graphs=False, k=3)
    assert run(spec, batch) == run(plain, batch)
    assert any(k == 0 for *_, k in spec.executor.runner.draft_graphs.runs)
    prompt = batch["r0"][0]
    for params in (SamplingParams(max_tokens=20, temperature=0.8, seed=5),
                   SamplingParams(max_tokens=20, temperature=0.6, top_p=0.9),
                   SamplingParams(max_tokens=20, temperature=0.7, top_k=30, repetition_penalty=1.2, seed=6)):
        spec, plain = make_engine(model, graphs=True, k=3), make_engine(model, graphs=False, k=3)
        torch.manual_seed(3)
        got = run(spec, {"s": (prompt, params)})
        torch.manual_seed(3)
        assert got == run(plain, {"s": (prompt, params)}), params
        assert spec.spec_metrics() == plain.spec_metrics()
        runs = spec.executor.runner.draft_graphs.runs
        assert any(key[0] == "drawn" and key[-1] == 3 for key in runs), runs
    assert spec.spec_metrics()["accepted"] > 0


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
    assert graph_key(dp, [plan(decode, verify), plan()]) == (4, 7, False)          # widest table: 7 blocks
    assert graph_key(StepShape("span", 4, 4, 1), [plan(), plan(verify)]) == (4, 7, True)   # not the dp graph
    assert graph_key(dp, [plan(decode), plan(prefill)]) is None                    # every rank must qualify
    assert graph_key(dp, [plan(decode), plan(chunk)]) is None
    assert graph_key(StepShape("dp", 16, 16, None), [plan(decode)]) is None        # beyond the largest bucket
    assert graph_key(dp, [plan(), plan()]) is None


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


def test_no_lookahead_for_rows_with_penalties(model):
    """Penalties read the history on the host: no look-ahead, same tokens as eager."""
    vocab = model.config.vocab_size
    prompt = requests(1, vocab, seed=13)["r0"][0]
    for params in (SamplingParams(max_tokens=10, temperature=0.8, seed=3, presence_penalty=0.4),
                   SamplingParams(max_tokens=10, temperature=0.0, repetition_penalty=1.3)):
        engine = make_engine(model, graphs=True)
        assert run(engine, {"r": (prompt, params)}) == run(make_engine(model, graphs=False), {"r": (prompt, params)})
        assert engine.executor.runner.ahead_stats == {"launched": 0, "used": 0}


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
