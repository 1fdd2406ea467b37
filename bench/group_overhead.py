"""What a worker group adds to each engine step: plain processes, Ray actors reached over the socket step
channel, and Ray actors called per step (``step_channel: ray``) — the same ranks and model.

    PYTHONPATH=. python bench/group_overhead.py [--workers 2] [--device cpu|cuda] [--groups processes ray ray-calls]

(CUDA: the engine replays CUDA graphs as a server would; Ray needs as many GPUs as ranks.)

One greedy request (40-token prompt, 40 new tokens, after a warm-up request) on the embedded tiny model; for
its decode steps, the median engine step time and the median time the request's owner rank was busy inside
it (``StepResult.busy_ms``). Their difference is the group's per-step cost: sending the step to every rank and
collecting the results (pickling, pipes or Ray's object transfer, the scheduler's Python).
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import replace

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from bench.cluster_slice import TimedExecutor  # noqa: E402
from cluster.config import EngineConfig  # noqa: E402
from cluster.engine import Engine  # noqa: E402
from cluster.local import scheduler_config  # noqa: E402
from cluster.workers import ProcessWorkerGroup, RayWorkerGroup  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402


def measure(group_cls, cfg: EngineConfig, num_blocks: int) -> tuple[float, float, list[int]]:
    """(median decode step ms, median owner busy ms, the timed request's tokens)."""
    timed = TimedExecutor(group_cls(cfg, num_blocks))
    try:
        model_cfg = ModelConfig.from_json(cfg.model)
        engine = Engine(timed, scheduler_config(cfg, model_cfg, None, num_blocks), num_ranks=cfg.num_workers,
                        graphs=cfg.graphs_mode() != "off")
        for name in ("warmup", "timed"):
            timed.log.clear()
            engine.add_request(list(range(40, 80)), SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
                               name)
            tokens = []
            while engine.has_unfinished():
                tokens += [t for ev in engine.step() for t in ev.token_ids]
        decode = [s for s in timed.log if s["rows"] == cfg.num_workers]       # 1 row per rank (dp bucket 1)
        return statistics.median(s["ms"] for s in decode), statistics.median(s["busy_ms"] for s in decode), tokens
    finally:
        timed.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--groups", nargs="+", choices=("processes", "ray", "ray-calls"),
                    default=["processes", "ray", "ray-calls"], help="which groups (processes alone need no Ray)")
    args = ap.parse_args()
    with_ray = any(g.startswith("ray") for g in args.groups)
    if with_ray:
        import ray

        ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False)        # GPUs: as detected
    cfg = EngineConfig(device=args.device, num_workers=args.workers, comm="ipc", kv_cache_tokens=2048)
    print(f"{args.workers} ranks on {args.device}, tiny model; median ms per decode step")
    print(f"{'group':<26}{'step':>8}{'owner busy':>12}{'group cost':>12}")
    groups = {"processes": ("processes (pipes)", ProcessWorkerGroup, cfg),
              "ray": ("Ray (socket channel)", RayWorkerGroup, cfg),
              "ray-calls": ("Ray (actor calls)", RayWorkerGroup, replace(cfg, step_channel="ray"))}
    groups = [groups[g] for g in args.groups]
    outputs = set()
    for _ in range(args.repeats):
        for name, cls, group_cfg in groups:
            step, busy, tokens = measure(cls, group_cfg, cfg.num_blocks)
            outputs.add(tuple(tokens))
            print(f"{name:<26}{step:>8.2f}{busy:>12.2f}{step - busy:>12.2f}", flush=True)
    print(f"greedy tokens identical across groups and repeats: {'yes' if len(outputs) == 1 else 'NO'}")
    if with_ray:
        ray.shutdown()


if __name__ == "__main__":
    main()
