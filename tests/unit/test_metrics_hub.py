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
