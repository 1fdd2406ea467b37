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


def streamed_calls(choices: list[dict]) -> list[dict]:
    """A client's view of streamed tool calls (``choices``: one choice of each chunk): per index the first delta's
    name, the arguments' pieces joined; later deltas of a call carry only pieces."""
    calls: list[dict] = []
    for c in choices:
        for d in c["delta"].get("tool_calls", []):
            if d["index"] == len(calls):
                assert d["id"].startswith("call_") and d["type"] == "function", d
                calls.append({"name": d["function"]["name"], "arguments": d["function"]["arguments"]})
            else:
                assert d["index"] == len(calls) - 1 and set(d) == {"index", "function"}, d
                calls[-1]["arguments"] += d["function"]["arguments"]
    return calls
