"""Prometheus exposition of two real coordinators (one with MTP speculation, one without), merged as the app's
/metrics merges them: it parses, no duplicate series, counters end in _total, time series in _seconds. Then the
latency buckets against GLM-5 serving's range: a TTFT of 45 s, 3 min and 20 min (a long queue, a 200k-token prompt) and
an ITL of 4 s (a decode stalled behind a long prefill chunk) observed into the real histograms; what a
``histogram_quantile`` over them can say. Exit 1 if the exposition is invalid or those latencies are indistinguishable."""
import asyncio

from _m import check, consume, coordinator, done, families, greedy, prompt

from cluster.coordinator import Metrics
from cluster.engine import TokenEvent
from cluster.metrics_hub import merge


def quantile(q, buckets):
    """Prometheus histogram_quantile over cumulative (le, count) pairs (le sorted, +Inf last)."""
    total = buckets[-1][1]
    rank, prev_le, prev_c = q * total, 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le      # Prometheus returns the highest finite bucket's bound
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


async def main():
    a = coordinator(kv_cache_tokens=16 * 64, speculative_tokens=2)
    b = coordinator(kv_cache_tokens=16 * 64)
    a.replica_id, b.replica_id = "rA", "rB"
    await consume(a, prompt(30, 1), greedy(10), "x")
    await consume(b, prompt(30, 1), greedy(10), "x")
    merged = merge({"rA": a.metrics.text(), "rB": b.metrics.text()})
    try:
        fams = families(merged)
        ok = True
    except Exception as e:  # noqa: BLE001
        ok, fams = False, {}
        print("parse error:", e)
    check(ok, "merged /metrics parses")
    seen, dups = set(), []
    for f in fams.values():
        for s in f.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            (dups.append(key) if key in seen else seen.add(key))
    check(not dups, f"no duplicate series ({dups[:3]})")
    bad_counter = [s.name for f in fams.values() if f.type == "counter" for s in f.samples
                   if not (s.name.endswith("_total") or s.name.endswith("_created"))]
    check(not bad_counter, f"counters' samples end in _total ({bad_counter[:3]})")
    print("families by type:", {t: sorted(n for n, f in fams.items() if f.type == t)
                                for t in ("counter", "gauge", "histogram")})
    # buckets
    m = Metrics(b.engine)
    for ttft in (45.0, 180.0, 1200.0):
        m.observe(TokenEvent("t", [1], "", False), ttft, 0.0, True, 0.0)
    m.observe(TokenEvent("t", [1], "", False), 4.0, 0.0, False, 0.0)
    f = families(m.text())

    def cum(name):
        return sorted(((float(s.labels["le"]), s.value) for s in f[name].samples if s.name == name + "_bucket"))
    ttft_b = cum("glmserve_time_to_first_token_seconds")
    itl_b = cum("glmserve_inter_token_latency_seconds")
    print("TTFT buckets (le, count):", ttft_b)
    print("ITL buckets (le, count):", itl_b)
    qs = [quantile(q, ttft_b) for q in (0.3, 0.6, 0.99)]
    print("histogram_quantile(0.3/0.6/0.99) over TTFTs of 45 s, 3 min, 20 min:", qs)
    check(len(set(qs)) == 3, f"TTFTs of 45 s, 3 min and 20 min are told apart (quantiles {qs}); top finite bucket "
                             f"{ttft_b[-2][0]} s (vLLM's: 2560 s)")
    check(itl_b[-2][0] >= 5.0, f"an ITL of 4 s has a finite bucket (top finite ITL bucket {itl_b[-2][0]} s; vLLM's 80 s)")
    for c in (a, b):
        c.aengine.shutdown()


asyncio.run(main())
done()
