"""Pure-Python scheduling: request state, KV block accounting, step planning and step shapes."""

from scheduler.block_pool import BlockPool
from scheduler.request import FinishReason, Request, RequestStatus, SamplingParams
from scheduler.scheduler import (
    AdmissionError,
    RequestEvent,
    ScheduledSeq,
    Scheduler,
    SchedulerConfig,
    StepPlan,
)
from scheduler.shapes import StepShape, place_request, plan_step_shapes, rank_seqs

__all__ = [
    "AdmissionError",
    "BlockPool",
    "FinishReason",
    "Request",
    "RequestEvent",
    "RequestStatus",
    "SamplingParams",
    "ScheduledSeq",
    "Scheduler",
    "SchedulerConfig",
    "StepPlan",
    "StepShape",
    "place_request",
    "plan_step_shapes",
    "rank_seqs",
]
