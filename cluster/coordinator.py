"""The coordinator: one per model replica. Owns the engine (per-rank schedulers, the step loop, request
streams) and the worker group; the HTTP ingress talks to it through a Serve deployment handle.

Ray carries control and integers here (token ids, sampling params, token events); activations move
between the workers only (AG/RS inside the forward).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from typing import AsyncIterator

from cluster.config import EngineConfig
from cluster.engine import AsyncEngine, Engine, TokenEvent
from cluster.local import guides, load_tokenizer, report, report_pool, scheduler_config
from cluster.metrics_hub import app_metrics_hub
from scheduler.request import FinishReason, SamplingParams
from scheduler.scheduler import AdmissionError

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """Prometheus metrics of one coordinator (its own registry, rendered by ``text()``)."""

    def __init__(self, engine: Engine):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.engine = engine
        self.registry = r = CollectorRegistry()
        self.ttft = Histogram("glmserve_time_to_first_token_seconds", "arrival to first token", buckets=TTFT_BUCKETS,
                              registry=r)
        self.itl = Histogram("glmserve_inter_token_latency_seconds", "time between streamed tokens",
                             buckets=ITL_BUCKETS, registry=r)
        self.requests = Counter("glmserve_requests", "finished requests", ["finish_reason"], registry=r)
        self.refused = Counter("glmserve_refused_requests", "requests refused at admission (queue_full: the 429s; a "
                               "priority's displaced ones too)", ["reason"], registry=r)
        self.tokens = Counter("glmserve_generated_tokens", "tokens generated", registry=r)
        Gauge("glmserve_queue_depth", "requests waiting", registry=r).set_function(
            lambda: sum(s.num_waiting for s in engine.schedulers))
        Gauge("glmserve_queued_prompt_tokens", "prompt tokens still to compute before first tokens", registry=r
              ).set_function(engine.queued_tokens)
        Gauge("glmserve_running_requests", "requests holding KV", registry=r).set_function(
            lambda: sum(s.num_running for s in engine.schedulers))
        Gauge("glmserve_kv_usage", "fraction of KV blocks in use", registry=r).set_function(engine.kv_usage)
        Gauge("glmserve_kv_free_blocks", "free KV blocks (all ranks)", registry=r).set_function(
            engine.num_free_blocks)
        Gauge("glmserve_kv_cache_tokens", "KV slots a worker holds (kv_cache_tokens, or as memory sized them)",
              registry=r).set(engine.schedulers[0].config.num_blocks * engine.schedulers[0].config.block_size)
        Gauge("glmserve_prefix_cache_queried_tokens", "prompt tokens looked up in the prefix cache", registry=r
              ).set_function(lambda: engine.prefix_cache_tokens()[0])
        Gauge("glmserve_prefix_cache_hit_tokens", "of which their KV was found cached (not computed)", registry=r
              ).set_function(lambda: engine.prefix_cache_tokens()[1])
        Gauge("glmserve_prefix_cache_blocks", "KV blocks registered under a cached prefix (all ranks)", registry=r
              ).set_function(lambda: sum(s.pool.num_cached for s in engine.schedulers))
        Gauge("glmserve_prefix_cache_host_blocks", "host-memory blocks holding a cached prefix (all ranks)", registry=r
              ).set_function(lambda: sum(s.pool.num_host_cached for s in engine.schedulers))
        Gauge("glmserve_prefix_cache_host_loads", "cached blocks copied back from host memory", registry=r
              ).set_function(lambda: sum(s.host_loads for s in engine.schedulers))
        Gauge("glmserve_tokens_per_second", "generated tokens/s over the last 10 s", registry=r).set_function(
            self.tokens_per_second)
        Gauge("glmserve_preemptions", "requests preempted so far", registry=r).set_function(
            lambda: engine.stats["preemptions"])
        Gauge("glmserve_rank_moves", "waiting requests moved to a rank with a free slot or KV blocks", registry=r
              ).set_function(lambda: engine.stats["moves"])
        Gauge("glmserve_step_seconds", "time in worker-group steps so far (send, every rank's work, collect)",
              registry=r).set_function(lambda: engine.stats["step_seconds"])
        Gauge("glmserve_worker_busy_seconds", "of which the busiest rank worked (forward, sampling, drafting)",
              registry=r).set_function(lambda: engine.stats["worker_busy_seconds"])
        Gauge("glmserve_steps", "engine steps so far", registry=r).set_function(lambda: engine.stats["steps"])
        Gauge("glmserve_graph_steps", "of which CUDA-graph decode steps", registry=r).set_function(
            lambda: engine.stats["graph_steps"])
        Gauge("glmserve_ahead_steps", "of which the workers had launched ahead (look-ahead)", registry=r).set_function(
            lambda: engine.stats["ahead_steps"])
        Gauge("glmserve_spec_drafts_proposed", "speculative drafts proposed", registry=r).set_function(
            lambda: engine.stats["drafts_proposed"])
        Gauge("glmserve_spec_drafts_accepted", "speculative drafts accepted", registry=r).set_function(
            lambda: engine.stats["drafts_accepted"])
        Gauge("glmserve_spec_mean_accepted_length", "tokens per verify round", registry=r).set_function(
            lambda: engine.spec_metrics()["mean_accepted_length"])
        per_pos = Gauge("glmserve_spec_acceptance_rate", "acceptance rate of draft position i", ["position"],
                        registry=r)
        for i in range(engine.speculative_tokens):
            per_pos.labels(str(i)).set_function(lambda i=i: engine.spec_metrics()["acceptance_by_position"][i])
        self._recent: deque[tuple[float, int]] = deque()

    def observe(self, ev: TokenEvent, now: float, last: float, first: bool) -> None:
        if ev.token_ids:
            (self.ttft if first else self.itl).observe(now - last)
            self.tokens.inc(len(ev.token_ids))
            self._recent.append((now, len(ev.token_ids)))
        if ev.finished:
            self.requests.labels(ev.finish_reason or "unknown").inc()

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - 10:
            self._recent.popleft()
        return sum(n for _, n in self._recent) / 10.0

    def text(self) -> str:
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


def stats_line(before: tuple[float, dict] | None, now: float, info: dict) -> str | None:
    """The periodic stats line (as vLLM's) from two readings of ``Coordinator.info()`` — ``before`` (time, its
    ``stats``), the other taken at ``now``: prompt and generated tokens a second between them, requests running and
    waiting, KV in use, preemptions. None for the first reading, and while nothing happens (no requests, no change)."""
    s = info["stats"]
    if before is None or not (info["running"] or info["waiting"] or s != before[1]):
        return None
    dt, b = max(now - before[0], 1e-9), before[1]
    return (f"prompt {(s['prompt_tokens'] - b['prompt_tokens']) / dt:.1f} tokens/s, generation "
            f"{(s['generated_tokens'] - b['generated_tokens']) / dt:.1f} tokens/s, {info['running']} running, "
            f"{info['waiting']} waiting, KV {100 * info['kv_usage']:.1f} % used, "
            f"{s['preemptions'] - b['preemptions']} preempted"
            + _hit_rate(s.get("prefix_queried", 0) - b.get("prefix_queried", 0),
                        s.get("prefix_hits", 0) - b.get("prefix_hits", 0)))


def _hit_rate(queried: int, hits: int) -> str:
    return f", prefix cache hit {100 * hits / queried:.1f} %" if queried > 0 else ""


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return "local"


class Coordinator:
    """Serve deployment body: build the worker group and engine, stream token events per request."""

    def __init__(self, engine_config: dict):
        from models.config import ModelConfig

        self.cfg = cfg = self._resolve(EngineConfig.from_dict(engine_config))
        model_config = ModelConfig.from_json(cfg.model)
        tokenizer = load_tokenizer(cfg.model)
        self.group = self._build_group(cfg, cfg.num_blocks)
        try:
            cfg.check_pool(self.group.num_blocks)     # a pool sized to memory is known only now
        except ValueError:
            self.group.shutdown()
            raise
        report_pool(cfg, model_config, self.group.num_blocks)
        decode = (lambda ids: tokenizer.decode(ids, skip_special_tokens=True)) if tokenizer else None
        self.sched_config = scheduler_config(cfg, model_config, tokenizer, self.group.num_blocks)
        self.engine = Engine(self.group, self.sched_config, decode, num_ranks=cfg.num_workers,
                             speculative_tokens=cfg.speculative_tokens, graphs=cfg.graphs_mode() != "off",
                             special_ids=tokenizer.special_ids if tokenizer else (),
                             guides=guides(tokenizer, model_config, self.sched_config))
        self._warm_up(cfg)
        self.aengine = AsyncEngine(self.engine)
        self.metrics = Metrics(self.engine)
        self.replica_id = _replica_id()
        self._stats_log: asyncio.Task | None = None
        self._hub = None                # the app's MetricsHub (``check_health``)

    def _warm_up(self, cfg: EngineConfig) -> None:
        """The engine's start-up warm-up (before the replica takes requests); a failure fails the replica's start."""
        tokens = cfg.resolved_warmup_tokens(self.sched_config.max_model_len)
        if not tokens:
            return
        try:
            self.engine.warm_up(tokens, report)
        except BaseException:
            self.group.shutdown()
            raise

    @staticmethod
    def _resolve(cfg: EngineConfig) -> EngineConfig:
        from cluster.workers import resolve_device

        return resolve_device(cfg)

    @staticmethod
    def _build_group(cfg: EngineConfig, num_blocks: int):
        from cluster.workers import RayWorkerGroup

        return RayWorkerGroup(cfg, num_blocks)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, req_id: str) -> AsyncIterator[TokenEvent]:
        """Stream the request's events; a refused request's one event carries its AdmissionError (``refused``)."""
        arrival = last = time.monotonic()
        first, finished = True, False
        if self._stats_log is None and self.cfg.log_stats_interval_s > 0:      # a context of its own: not this request's
            self._stats_log = contextvars.Context().run(asyncio.get_running_loop().create_task,
                                                        self._log_stats(self.cfg.log_stats_interval_s))
        try:
            async for ev in self.aengine.generate(prompt_ids, params, req_id):
                now = time.monotonic()
                self.metrics.observe(ev, now, last if not first else arrival, first)
                if ev.token_ids:
                    first, last = False, now
                ev.served_by = self.replica_id
                finished = ev.finished
                yield ev
        except (GeneratorExit, asyncio.CancelledError):
            if not finished:                # the client went away: its request ends here, as an abort
                self.metrics.requests.labels(FinishReason.ABORT).inc()
            raise
        except AdmissionError as e:     # an answer (400 / 429), not a failure: an event, where a raise would have Serve
            self.metrics.refused.labels(e.reason).inc()      # log each refusal as an ERROR with its traceback
            yield TokenEvent(req_id, [], "", True, FinishReason.ABORT, error=str(e), refused=e)

    async def abort(self, req_id: str) -> None:
        self.aengine.abort(req_id)

    async def metrics_text(self) -> tuple[str, str]:
        """(this replica's id, its metrics as Prometheus text)."""
        return self.replica_id, self.metrics.text()

    async def info(self) -> dict:
        stats = dict(self.engine.stats)
        stats["prefix_queried"], stats["prefix_hits"] = self.engine.prefix_cache_tokens()
        return {"max_model_len": self.sched_config.max_model_len, "vocab_size": self.sched_config.vocab_size,
                "num_workers": self.cfg.num_workers, "stats": stats, "warmup": self.engine.warmed,
                "free_blocks": self.engine.num_free_blocks(), "kv_usage": self.engine.kv_usage(),
                "running": sum(s.num_running for s in self.engine.schedulers),
                "waiting": sum(s.num_waiting for s in self.engine.schedulers)}

    async def _log_stats(self, interval_s: float) -> None:
        """Every ``interval_s`` while requests come, a stats line in the replica's log (``serve deploy`` has no
        terminal of its own; ``glmserve serve`` prints the same line from the ingress)."""
        log, before = logging.getLogger("ray.serve"), None
        while True:
            try:
                info, now = await self.info(), time.monotonic()
                line = stats_line(before, now, info)
                if line:
                    log.info("glmserve: %s", line)
                before = (now, info["stats"])
            except Exception as e:  # noqa: BLE001 — a line is not worth the replica; the next reading will tell
                log.warning("glmserve: no stats (%s: %s)", type(e).__name__, e)
            await asyncio.sleep(interval_s)

    async def check_health(self) -> None:
        if not self.aengine.is_alive():
            raise RuntimeError("the engine loop has stopped")
        try:                # Serve asks every replica: its metrics reach the app's /metrics whichever one answers it
            if self._hub is None:
                self._hub = app_metrics_hub()
            if self._hub is not None:
                self._hub.put.remote(self.replica_id, self.metrics.text())
        except Exception:   # noqa: BLE001 — metrics are not the replica's health
            self._hub = None

    def __del__(self):
        try:
            if self._stats_log is not None:
                self._stats_log.cancel()
            self.aengine.shutdown()
            self.group.shutdown()
        except Exception:
            pass
