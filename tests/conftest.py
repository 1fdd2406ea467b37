"""Shared fixtures: checkpoints the project makes itself (nothing is downloaded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
torch.set_num_threads(1)  # 2 shared cores: one thread avoids OpenMP spin contention

from models.checkpoint import write_checkpoint  # noqa: E402
from models.config import ModelConfig  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "models" / "configs"


@pytest.fixture(scope="session")
def tiny_config() -> ModelConfig:
    return ModelConfig.from_json(CONFIGS / "glm5-tiny-random.json")


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory, tiny_config) -> Path:
    """The reference §6.1 tiny config with random fp32 weights (index_topk 16 < test lengths)."""
    return write_checkpoint(tmp_path_factory.mktemp("tiny-fp32"), tiny_config, seed=0, dtype="float32")


def hf_model(path, dtype=torch.float32):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager",
                                                experts_implementation="eager").eval()


def run_engine(engine, reqs: dict, logprobs: bool = False) -> dict[str, list]:
    """Add every request (``{id: (prompt ids, SamplingParams)}``), step until all finish with no error
    event; returns each request's tokens (``logprobs``: (token, logprob, top) where its events carry them)."""
    out = {rid: [] for rid in reqs}
    for rid, (ids, params) in reqs.items():
        engine.add_request(ids, params, rid)
    while engine.has_unfinished():
        for ev in engine.step():
            assert ev.error is None, ev.error
            if logprobs and ev.logprobs:
                out[ev.req_id] += [(t, lp.logprob, lp.top) for t, lp in zip(ev.token_ids, ev.logprobs)]
            else:
                out[ev.req_id] += ev.token_ids
    return out


class RecordingExecutor:
    """A fake executor: every rank samples token 7 for each row that samples; the steps it was given are kept."""

    def __init__(self):
        self.steps = []

    def execute(self, steps):
        from workers.runner import StepResult  # not at import: the unit tier sets TRITON_INTERPRET first

        self.steps.append(steps)
        return [StepResult(st.step_id, {s.req_id: [7] for s in st.seqs if s.sample}) for st in steps]

    def recover(self):
        pass
