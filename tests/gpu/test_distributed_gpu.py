"""The distributed equality gate on CUDA GPUs without Ray: N ranks as processes, rank r on GPU r % (visible
GPUs) — all on one GPU on a single-GPU host, one GPU each where the host has N — with the ``ipc`` comm
(cupy IPC buffers) and, where every rank has its own GPU, ``torch`` (NCCL), against the single-process
engine on GPU 0.

- greedy tokens of ``cluster.workers.ProcessWorkerGroup`` (N = 2, 4; moe tp/ep; fp32) equal the
  single-process engine's, for a mixed batch (dp steps) and a solo request (its prefill rides in a
  span); one bf16 case is compared at a looser level (token agreement), since the MoE partial sums
  round in a different order there;
- a worker whose steps run on a thread other than the one that built it (how a Ray actor serves its socket
  step channel), bf16 + Triton + CUDA graphs + MTP drafting, gives the tokens of one run on its own thread;
- one MoE layer through ``Worker.run_mlp`` on NaN-poisoned comm buffers: Span(owner) is
  bit-identical to Dp, pads gather as zeros, and the result matches the unsharded layer.

Run on a lent H200: ``PYTHONPATH=. python -m pytest -q tests/gpu/test_distributed_gpu.py``.
"""

from __future__ import annotations

import collections
import dataclasses
import io
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")
GPUS = torch.cuda.device_count()

from cluster.config import EngineConfig
from cluster.engine import Engine, LocalExecutor
from cluster.local import scheduler_config
from cluster.workers import ProcessWorkerGroup, worker_specs
from glmkernels import ops
from models.loader import load_model
from scheduler.request import SamplingParams
from scheduler.shapes import StepShape
from tests.integration.test_comm import _pool_lifetime, _spawn  # noqa: F401 (a module fixture)
from tests.integration.test_distributed import requests, run
from workers.comm import DictRendezvous
from workers.runner import ModelRunner
from workers.worker import Worker, WorkerSpec

NUM_BLOCKS = 128
DEVICE = "cuda"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MOE_LAYER = 3  # an MoE layer of the tiny config (layers 0-1 are dense)


def engine_config(ckpt, n: int, moe: str, dtype: str, kernels: str, comm: str = "ipc") -> EngineConfig:
    return EngineConfig(model=str(ckpt), device=DEVICE, dtype=dtype, kernels=kernels, num_workers=n, moe=moe,
                        comm=comm, kv_cache_tokens=NUM_BLOCKS * 16, max_num_batched_tokens=128)


def _solo() -> dict:
    return {"solo": requests(1, max_tokens=8, seed=5)["r0"]}


_REFERENCE: dict = {}


def _reference_model(ckpt, dtype: str, kernels: str):
    ops.configure(kernels, DEVICE)  # this process's ops; the ranks configure their own from the spec
    if (dtype, kernels) not in _REFERENCE:
        _REFERENCE[dtype, kernels] = {"model": load_model(ckpt, dtype=DTYPES[dtype], device=DEVICE, progress=False)}
    return _REFERENCE[dtype, kernels]


def reference_tokens(ckpt, tiny_config, dtype: str, kernels: str) -> tuple[dict, dict]:
    """The single-process engine's tokens on the GPU (mixed batch, solo request): the oracle."""
    ref = _reference_model(ckpt, dtype, kernels)
    if "tokens" not in ref:
        cfg = engine_config(ckpt, 1, "tp", dtype, kernels)
        runner = ModelRunner(ref["model"], NUM_BLOCKS, 16, DTYPES[dtype], DEVICE)
        engine = Engine(LocalExecutor(runner), scheduler_config(cfg, tiny_config, None, NUM_BLOCKS))
        ref["tokens"] = (run(engine, requests()), run(engine, _solo()))
    return ref["tokens"]


@pytest.fixture(scope="module", autouse=True)
def _restore_ops():
    yield
    ops.configure("reference", "cpu")


def _group_tokens(ckpt, tiny_config, n: int, moe: str, dtype: str, kernels: str,
                  comm: str = "ipc") -> tuple[dict, dict, dict]:
    cfg = engine_config(ckpt, n, moe, dtype, kernels, comm)
    group = ProcessWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = Engine(group, scheduler_config(cfg, tiny_config, None, NUM_BLOCKS), num_ranks=n,
                        graphs=cfg.graphs_mode() != "off")
        mixed, solo = run(engine, requests()), run(engine, _solo())
        assert engine.num_free_blocks() == n * NUM_BLOCKS
        return mixed, solo, dict(engine.stats)
    finally:
        group.shutdown()


def _nccl_fits(n: int):
    return pytest.mark.skipif(n > GPUS, reason=f"NCCL needs one GPU per rank: {n} ranks, {GPUS} GPU(s) here")


@pytest.mark.parametrize("n,moe,kernels,comm", [
    (2, "tp", "reference", "ipc"), (4, "ep", "reference", "ipc"), (4, "tp", "auto", "ipc"), (2, "ep", "auto", "ipc"),
    *[pytest.param(n, moe, kernels, "torch", marks=_nccl_fits(n))
      for n, moe, kernels in [(2, "tp", "reference"), (2, "tp", "auto"), (2, "ep", "auto"), (4, "tp", "auto"),
                              (8, "ep", "auto")]]])
def test_greedy_tokens_equal_single_process(tiny_ckpt, tiny_config, n, moe, kernels, comm):
    """``kernels: auto`` also captures the decode steps as CUDA graphs (``cuda_graphs: auto``), their AG/RS
    through the ipc device-side phases or NCCL; the single-process oracle runs without graphs."""
    want_mixed, want_solo = reference_tokens(tiny_ckpt, tiny_config, "float32", kernels)
    mixed, solo, stats = _group_tokens(tiny_ckpt, tiny_config, n, moe, "float32", kernels, comm)
    assert mixed == want_mixed
    assert solo == want_solo
    assert stats["span_steps"] > 0
    assert (stats["graph_steps"] > 0) == (kernels == "auto")
    assert (stats["ahead_steps"] > 0) == (kernels == "auto")     # graph steps launched ahead on every rank


@pytest.mark.parametrize("per_rank", [8, 16, 32])
def test_eight_ranks_capture_a_full_dp_bucket(tiny_ckpt, tiny_config, monkeypatch, per_rank):
    """8 ipc ranks (processes sharing the GPU here), 8, 16 or 32 requests a rank: their decode steps are dp graph
    steps of that bucket, whose MoE takes every rank's rows, 64–256 (``GRAPH_MOE_ROWS``; the Triton MoE's grouped
    launches, which took more than 32 rows before session 17, cannot be captured; 16 a rank ran eagerly before
    session 18, 32 before session 19). Captured, replayed: the single process's tokens."""
    import cluster.engine as engine_module

    g = torch.Generator().manual_seed(3)        # one prompt length: placement by KV load spreads them evenly
    reqs = {f"r{i}": (torch.randint(2, 1024, (20,), generator=g).tolist(),
                      SamplingParams(max_tokens=12, temperature=0.0))
            for i in range(8 * per_rank)}
    ref = _reference_model(tiny_ckpt, "float32", "auto")
    cfg = dataclasses.replace(engine_config(tiny_ckpt, 8, "tp", "float32", "auto"), max_num_batched_tokens=512,
                              max_num_seqs=8 * per_rank)
    blocks = 8 * NUM_BLOCKS                      # the single process holds every request's KV, as the 8 ranks do
    plain = Engine(LocalExecutor(ModelRunner(ref["model"], blocks, 16, torch.float32, DEVICE)),
                   scheduler_config(engine_config(tiny_ckpt, 1, "tp", "float32", "auto"), tiny_config, None, blocks))
    want = run(plain, reqs)
    keys = []

    def recorded(shape, plans, *rest):
        keys.append(original(shape, plans, *rest))
        return keys[-1]

    original = engine_module.graph_key
    monkeypatch.setattr(engine_module, "graph_key", recorded)
    group = ProcessWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = Engine(group, scheduler_config(cfg, tiny_config, None, NUM_BLOCKS), num_ranks=8, graphs=True)
        assert run(engine, reqs) == want
    finally:
        group.shutdown()
    assert any(k is not None and k[0] == per_rank and not k[2] for k in keys), collections.Counter(keys)


def test_speculative_group_with_captured_drafting_equals_plain():
    """The embedded trained tiny model, 2 ipc ranks, k = 3: verify steps (static spans) and the MTP drafting
    replay CUDA graphs in the group; greedy output equals the single-process plain engine, drafts are accepted."""
    from cluster.config import DEFAULT_MODEL
    from models.config import ModelConfig

    text_ckpt = DEFAULT_MODEL
    mc = ModelConfig.from_json(text_ckpt)
    g = torch.Generator().manual_seed(23)
    prompts = [torch.randint(40, mc.vocab_size, (int(torch.randint(4, 40, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(4)]
    greedy = SamplingParams(max_tokens=16, temperature=0.0)
    ops.configure("auto", DEVICE)
    plain = Engine(LocalExecutor(ModelRunner(load_model(text_ckpt, dtype=torch.float32, device=DEVICE,
                                                        progress=False), NUM_BLOCKS, 16, torch.float32, DEVICE)),
                   scheduler_config(engine_config(text_ckpt, 1, "tp", "float32", "auto"), mc, None, NUM_BLOCKS))
    expected = [run(plain, {f"p{i}": (ids, greedy)})[f"p{i}"] for i, ids in enumerate(prompts)]
    cfg = EngineConfig(model=str(text_ckpt), device=DEVICE, dtype="float32", kernels="auto", num_workers=2,
                       comm="ipc", kv_cache_tokens=NUM_BLOCKS * 16, max_num_batched_tokens=128, speculative_tokens=3)
    group = ProcessWorkerGroup(cfg, NUM_BLOCKS)
    try:
        engine = Engine(group, scheduler_config(cfg, mc, None, NUM_BLOCKS), num_ranks=2, speculative_tokens=3,
                        graphs=True)
        got = [run(engine, {f"s{i}": (ids, greedy)})[f"s{i}"] for i, ids in enumerate(prompts)]
        print(f"2 ranks, captured drafting: {engine.spec_metrics()}")
        assert got == expected
        assert engine.stats["graph_steps"] > 0 and engine.stats["span_steps"] > 0
        assert engine.stats["drafts_accepted"] > 0
    finally:
        group.shutdown()


class _OnThread(LocalExecutor):
    """Steps on a thread of their own, as ``cluster.workers._WorkerActor._channel`` runs them."""

    def __init__(self, worker: Worker):
        self.worker, self.pool = worker, ThreadPoolExecutor(1, initializer=worker.enter_thread)

    def execute(self, steps):
        return [self.pool.submit(self.worker.execute, steps[0]).result()]


class _OnCaller(LocalExecutor):
    def __init__(self, worker: Worker):
        self.worker = worker

    def execute(self, steps):
        return [self.worker.execute(steps[0])]


def test_steps_on_another_thread_equal_steps_on_the_building_thread():
    from cluster.config import DEFAULT_MODEL
    from models.config import ModelConfig

    mc = ModelConfig.from_json(DEFAULT_MODEL)
    cfg = EngineConfig(model=DEFAULT_MODEL, device=DEVICE, dtype="bfloat16", kernels="auto", num_workers=1,
                       kv_cache_tokens=NUM_BLOCKS * 16, max_num_batched_tokens=128, speculative_tokens=3)
    g = torch.Generator().manual_seed(29)
    reqs = {f"p{i}": (torch.randint(40, mc.vocab_size, (int(torch.randint(4, 40, (1,), generator=g)),),
                                    generator=g).tolist(), SamplingParams(max_tokens=16, temperature=0.0))
            for i in range(3)}
    out = []
    for executor_cls in (_OnCaller, _OnThread):
        worker = Worker(worker_specs(cfg, NUM_BLOCKS)[0], DictRendezvous({}, 1, "t/"))
        try:
            engine = Engine(executor_cls(worker), scheduler_config(cfg, mc, None, NUM_BLOCKS), speculative_tokens=3,
                            graphs=True)
            out.append({k: run(engine, {k: r})[k] for k, r in reqs.items()})
            assert engine.stats["graph_steps"] > 0
        finally:
            worker.close()
    assert out[1] == out[0]


def _agreement(got: dict, want: dict) -> float:
    """Fraction of tokens inside each request's common prefix with the oracle (divergence compounds)."""
    same = total = 0
    for k, w in want.items():
        g = got[k]
        prefix = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        same, total = same + prefix, total + len(w)
    return same / total


def test_bf16_tokens_close_to_single_process(tiny_ckpt, tiny_config):
    """bf16: sharded partial sums round differently from the unsharded layer, so tokens may drift after
    a near tie; most must still agree with the single-process bf16 engine."""
    want_mixed, want_solo = reference_tokens(tiny_ckpt, tiny_config, "bfloat16", "auto")
    mixed, solo, _ = _group_tokens(tiny_ckpt, tiny_config, 2, "tp", "bfloat16", "auto")
    agreement = _agreement({**mixed, **solo}, {**want_mixed, **want_solo})
    print(f"bf16 N=2 tp: {agreement:.0%} of greedy tokens agree with the single-process engine")
    assert agreement >= 0.5


# ----------------------------------------------------------------------------- one MoE layer, per rank


def _mlp_gate(rank: int, n: int, board, ckpt: str, moe: str, dtype: str, kernels: str, rows_per_rank: int,
              comm: str) -> bytes:
    """One MoE layer on this rank through Dp, Span(0), Span(n-1) and a half-padded Dp bucket, on
    NaN-poisoned buffers (ipc). Returns the outputs (CPU) as torch.save bytes."""
    spec = WorkerSpec(model=ckpt, rank=rank, world_size=n, moe=moe, comm=comm, device=f"cuda:{rank % GPUS}",
                      dtype=dtype,
                      kernels=kernels, num_blocks=16, max_rows=4 * n * rows_per_rank)
    worker = Worker(spec, DictRendezvous(board, n, prefix="gate/"))
    R, H = rows_per_rank, worker.runner.model.config.hidden_size
    x = _gate_rows(n * R, H).to(DEVICE)  # [n*R, H]
    worker.poison_comm_buffers()
    worker.comm.barrier()  # every rank poisoned before anyone writes
    out: dict = {}
    rows, got = worker.run_mlp(MOE_LAYER, x[rank * R:(rank + 1) * R], StepShape("dp", R, n * R, None))
    out["dp"] = (rows.cpu(), got.cpu())
    for owner in (0, n - 1):
        rows, got = worker.run_mlp(MOE_LAYER, x if rank == owner else x[:0], StepShape("span", n * R, n * R, owner))
        out[f"span{owner}"] = (rows.cpu(), got.cpu())
    rows, got = worker.run_mlp(MOE_LAYER, x[rank * R:(rank + 1) * R], StepShape("dp", 2 * R, 2 * n * R, None))
    out["padded"] = (rows.cpu(), got.cpu())
    worker.close()
    buf = io.BytesIO()
    torch.save(out, buf)
    return buf.getvalue()


def _gate_rows(num_rows: int, hidden: int) -> torch.Tensor:
    return torch.randn(num_rows, hidden, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("n,moe,dtype,comm", [(4, "tp", "float32", "ipc"), (2, "ep", "bfloat16", "ipc"),
                                              pytest.param(2, "tp", "float32", "torch", marks=_nccl_fits(2)),
                                              pytest.param(8, "ep", "bfloat16", "torch", marks=_nccl_fits(8))])
def test_span_matches_dp_on_poisoned_buffers(tiny_ckpt, n, moe, dtype, comm):
    R, kernels = 2, "auto"
    reports = [torch.load(io.BytesIO(b)) for b in
               _spawn(_mlp_gate, n, str(tiny_ckpt), moe, dtype, kernels, R, comm, deadline_s=240.0)]
    dp_rows = reports[0]["dp"][0]                                      # [n*R, H] gathered bucket
    dp_out = torch.cat([r["dp"][1] for r in reports])                  # [n*R, H] rank-major outputs
    assert torch.isfinite(dp_out).all()
    for owner in (0, n - 1):
        rows, got = reports[owner][f"span{owner}"]
        assert torch.equal(rows, dp_rows), "the gathered rows differ"
        assert torch.equal(got, dp_out), f"span (owner {owner}) and dp MoE outputs differ"
        assert all(r[f"span{owner}"][1].shape[0] == 0 for i, r in enumerate(reports) if i != owner)
    gathered = reports[0]["padded"][0]                                 # [2*n*R, H]
    for r in range(n):
        assert torch.equal(gathered[r * 2 * R + R:(r + 1) * 2 * R], torch.zeros(R, gathered.shape[1])), "pads"
    assert torch.isfinite(gathered).all() and all(torch.isfinite(r["padded"][1]).all() for r in reports)
    # the sharded layer against the whole layer in this process, same dtype and kernels
    model = _reference_model(tiny_ckpt, dtype, kernels)["model"]
    with torch.inference_mode():
        want = model.model.layers[MOE_LAYER].mlp(dp_rows.to(DEVICE)).float().cpu()
    rel = ((dp_out.float() - want).norm() / want.norm()).item()
    print(f"N={n} {moe} {dtype}: sharded MoE layer vs whole layer, relative error {rel:.2e}")
    assert rel < (1e-5 if dtype == "float32" else 2e-2), rel
