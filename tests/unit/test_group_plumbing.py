"""Small pieces of the worker group: ranks placed on GPUs, and each rank's step timing in its result."""

from __future__ import annotations

import pytest
import torch

from cluster.config import EngineConfig
from cluster.engine import Engine, GroupFailure, LocalExecutor
from cluster.local import scheduler_config
from cluster.workers import _place_on_gpus, worker_specs
from models.loader import dummy_model
from scheduler.request import SamplingParams
from tests.conftest import run_engine
from workers.runner import ModelRunner


def test_process_group_puts_rank_r_on_gpu_r_mod_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    specs = worker_specs(EngineConfig(device="cuda", num_workers=4), num_blocks=8)
    assert [s.device for s in _place_on_gpus(specs)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    cpu = worker_specs(EngineConfig(device="cpu", num_workers=2), num_blocks=8)
    assert [s.device for s in _place_on_gpus(cpu)] == ["cpu", "cpu"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(GroupFailure, match="no CUDA GPU"):
        _place_on_gpus(specs)


class _Recording(LocalExecutor):
    def __init__(self, runner):
        super().__init__(runner)
        self.results = []

    def execute(self, steps):
        out = super().execute(steps)
        self.results += out
        return out


@pytest.mark.parametrize("graphs", ["off", "eager"])        # eager: the static decode and drafting path
def test_step_results_carry_the_rank_time_and_its_drafting_share(tiny_config, graphs):
    model = dummy_model(tiny_config, torch.float32)
    for k in (0, 2):
        runner = ModelRunner(model, 16, 16, torch.float32, speculative=k > 0, graphs=graphs)
        executor = _Recording(runner)
        cfg = EngineConfig(device="cpu", kv_cache_tokens=256, speculative_tokens=k)
        engine = Engine(executor, scheduler_config(cfg, tiny_config, None, 16), speculative_tokens=k,
                        graphs=graphs != "off")
        run_engine(engine, {"a": ([1, 2, 3], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))})
        assert all(r.busy_ms > 0 and 0 <= r.draft_ms <= r.busy_ms for r in executor.results)
        assert any(r.draft_ms > 0 for r in executor.results) == (k > 0)
        busy = sum(r.busy_ms for r in executor.results) / 1e3                 # one rank: the busiest is it
        assert engine.stats["worker_busy_seconds"] == pytest.approx(busy)
        assert engine.stats["step_seconds"] >= engine.stats["worker_busy_seconds"] > 0
