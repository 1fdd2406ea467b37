"""Merging the Coordinator replicas' Prometheus texts into one /metrics (``cluster/metrics_hub.py``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cluster.metrics_hub import merge


def _text(requests: int, queue: float) -> str:
    r = CollectorRegistry()
    Counter("glmserve_requests", "finished requests", ["finish_reason"], registry=r).labels("stop").inc(requests)
    Gauge("glmserve_queue_depth", "requests waiting", registry=r).set(queue)
    Histogram("glmserve_ttft_seconds", "ttft", buckets=(0.1, 1.0), registry=r).observe(0.5)
    return generate_latest(r).decode()


def test_every_replicas_samples_under_one_family_labelled_by_replica():
    merged = merge({"r2": _text(3, 1), "r1": _text(5, 0)})
    families = {f.name: f for f in text_string_to_metric_families(merged)}     # a valid exposition: it parses
    assert set(families) == {f.name for f in text_string_to_metric_families(_text(1, 1))}       # the same families
    assert merged.count("# TYPE glmserve_requests_total counter") == 1
    stops = {s.labels["replica"]: s.value for s in families["glmserve_requests"].samples
             if s.name == "glmserve_requests_total"}
    assert stops == {"r1": 5.0, "r2": 3.0}
    assert all(s.labels["finish_reason"] == "stop" for s in families["glmserve_requests"].samples)
    buckets = [s for s in families["glmserve_ttft_seconds"].samples if s.name.endswith("_bucket")]
    assert {(s.labels["replica"], s.labels["le"]) for s in buckets} == {(r, le) for r in ("r1", "r2")
                                                                        for le in ("0.1", "1.0", "+Inf")}
    assert merge({}) == ""


def test_latency_buckets_reach_minutes_and_aborts_are_not_finished_requests():
    """Session 57's metrics review: TTFTs of minutes (a long prompt queued) and ITLs of seconds landed in +Inf (p99
    read 30 s / 2.5 s), as vLLM's ranges do not; a request the server aborted was observed as a finished one (a client
    that left was not)."""
    from cluster.coordinator import Metrics
    from cluster.engine import Engine, TokenEvent
    from scheduler import SchedulerConfig
    from tests.conftest import RecordingExecutor

    m = Metrics(Engine(RecordingExecutor(), SchedulerConfig(num_blocks=8, max_model_len=64, vocab_size=64)))
    m.observe(TokenEvent("a", [5], "x"), now=200.0, last=20.0, first=True, arrival=20.0)          # TTFT 3 minutes
    m.observe(TokenEvent("a", [6], "y"), now=204.0, last=200.0, first=False, arrival=20.0)        # ITL 4 s
    m.observe(TokenEvent("a", [], "", True, "abort"), now=205.0, last=204.0, first=False, arrival=20.0)

    def samples(hist) -> dict:
        return {(s.name, s.labels.get("le")): s.value for f in hist.collect() for s in f.samples}

    ttft, itl = samples(m.ttft), samples(m.itl)
    assert ttft[("glmserve_time_to_first_token_seconds_bucket", "160.0")] == 0
    assert ttft[("glmserve_time_to_first_token_seconds_bucket", "640.0")] == 1
    assert itl[("glmserve_inter_token_latency_seconds_bucket", "2.5")] == 0
    assert itl[("glmserve_inter_token_latency_seconds_bucket", "5.0")] == 1
    assert samples(m.e2e)[("glmserve_e2e_request_latency_seconds_count", None)] == 0
    assert samples(m.output_len)[("glmserve_request_generation_tokens_count", None)] == 0


def test_a_replica_says_its_part_in_a_disaggregated_app():
    """Prefill and decode replicas both count a disaggregated prompt (its prompt tokens, its prefix-cache lookup):
    ``glmserve_replica_role`` tells their series apart (join on ``replica``)."""
    from cluster.coordinator import Metrics
    from cluster.engine import Engine
    from scheduler import SchedulerConfig
    from tests.conftest import RecordingExecutor

    engine = Engine(RecordingExecutor(), SchedulerConfig(num_blocks=8, max_model_len=64, vocab_size=64))
    for role in ("serve", "prefill", "decode"):
        families = {f.name: f for f in text_string_to_metric_families(Metrics(engine, role).text())}
        assert [(s.labels, s.value) for s in families["glmserve_replica_role"].samples] == [({"role": role}, 1.0)]
