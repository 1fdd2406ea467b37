"""The model runner: turns a step plan into tensors, runs the model over the paged cache, samples.

The coordinator↔worker contract is ``WorkerStep`` in, ``StepResult`` out: plain ints, strings and
frozen dataclasses (no tensors), so it crosses process boundaries through Ray unchanged. The runner
keeps each request's token history (for penalties) and sampling parameters from the step that first
mentions it until a step lists it as finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from models.cache import KVCache, build_batch
from models.glm5 import GlmForCausalLM
from scheduler.request import SamplingParams
from scheduler.scheduler import ScheduledSeq
from scheduler.shapes import StepShape
from workers.sampler import sample


@dataclass(frozen=True)
class NewRequest:
    req_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True)
class WorkerStep:
    """One step for one worker: the scheduled rows, requests it sees for the first time, requests to forget."""

    step_id: int
    seqs: tuple[ScheduledSeq, ...]
    new_requests: tuple[NewRequest, ...] = ()
    finished: tuple[str, ...] = ()
    shape: StepShape | None = None     # the MoE bucket of this step (all ranks get the same one)


@dataclass(frozen=True)
class TokenLogprobs:
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class StepResult:
    step_id: int
    sampled: dict[str, list[int]] = field(default_factory=dict)            # req_id -> new tokens
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)  # only where requested


@dataclass
class _RequestState:
    params: SamplingParams
    num_prompt: int
    history: list[int]


class ModelRunner:
    """Runs steps of a (possibly sharded) model on one device over a cache of ``num_blocks`` blocks."""

    def __init__(self, model: GlmForCausalLM, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: str | torch.device = "cpu", in_group: bool = False):
        # in_group: one of several ranks, which must all run every step (the MLP phases are collective)
        self.model, self.block_size, self.device, self.in_group = model, block_size, torch.device(device), in_group
        self.cache = KVCache(model.config, num_blocks * block_size, dtype, device)
        self.requests: dict[str, _RequestState] = {}

    def reset(self) -> None:
        """Forget every request (after a group failure the scheduler starts over; KV is overwritten)."""
        self.requests.clear()

    def execute(self, step: WorkerStep) -> StepResult:
        for rid in step.finished:          # first: a finished id may come back as a new request
            self.requests.pop(rid, None)
        for nr in step.new_requests:
            self.requests[nr.req_id] = _RequestState(nr.params, len(nr.prompt_ids), list(nr.prompt_ids))
        if not step.seqs and not self.in_group:
            return StepResult(step.step_id)
        hidden = self.forward(step.seqs)
        return self._sample(step, hidden)

    @torch.inference_mode()
    def forward(self, seqs: tuple[ScheduledSeq, ...]) -> torch.Tensor:
        """Run the scheduled rows; returns the final hidden state of each seq's last row [num_seqs, H]."""
        ids = torch.tensor([t for s in seqs for t in s.token_ids], dtype=torch.long, device=self.device)
        batch = build_batch([(s.start_pos, len(s.token_ids), s.block_ids) for s in seqs], self.block_size,
                            self.device)
        hidden = self.model(ids, batch, self.cache)
        return hidden[batch.last_rows()]

    @torch.inference_mode()
    def _sample(self, step: WorkerStep, last_hidden: torch.Tensor) -> StepResult:
        rows = [i for i, s in enumerate(step.seqs) if s.sample]
        if not rows:
            return StepResult(step.step_id)
        seqs = [step.seqs[i] for i in rows]
        states = [self.requests[s.req_id] for s in seqs]
        for s, st in zip(seqs, states):
            assert len(st.history) == s.end_pos, f"{s.req_id}: runner history out of sync with the plan"
        logits = self.model.logits(last_hidden[rows])
        out = sample(logits, [st.params for st in states], [st.history for st in states],
                     [st.num_prompt for st in states], [s.num_generated for s in seqs])
        result = StepResult(step.step_id)
        for i, (s, st) in enumerate(zip(seqs, states)):
            tok = out.token_ids[i]
            st.history.append(tok)
            result.sampled[s.req_id] = [tok]
            if st.params.logprobs is not None:
                result.logprobs[s.req_id] = [TokenLogprobs(out.logprobs[i], tuple(out.top_logprobs[i] or ()))]
        return result
