"""Where the GPU waited for the host in a torch.profiler chrome trace (``bench/mixed_steps.py --trace``): the GPU's
busy and idle time between its first and last kernel, and the longest idle gaps, each named by the host op whose
launch ended it (the innermost ``cpu_op`` around the launching runtime call) and the op before.

    python bench/trace_gaps.py TRACE.json [--top 25] [--min-us 20]
"""

from __future__ import annotations

import argparse
import bisect
import json
from collections import Counter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--min-us", type=float, default=20.0, help="gaps shorter than this are not listed")
    args = ap.parse_args()
    events = json.load(open(args.trace))["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    starts = [o["ts"] for o in ops]

    def host_op(ts: float) -> str:
        """The innermost cpu_op running at ``ts``."""
        best = None
        for o in ops[max(0, bisect.bisect_right(starts, ts) - 400): bisect.bisect_right(starts, ts)]:
            if o["ts"] <= ts <= o["ts"] + o["dur"] and (best is None or o["dur"] < best["dur"]):
                best = o
        return best["name"] if best else "?"

    busy, gaps, end = 0.0, [], None
    for k in kernels:
        if end is not None and k["ts"] > end:
            gaps.append((k["ts"] - end, k))
        busy += k["dur"]
        end = max(end or 0.0, k["ts"] + k["dur"])
    span = end - kernels[0]["ts"]
    idle = sum(g for g, _ in gaps)
    print(f"{len(kernels)} GPU ops over {span / 1e3:.2f} ms: busy {busy / 1e3:.2f} ms, idle {idle / 1e3:.2f} ms "
          f"in {len(gaps)} gaps ({sum(g for g, _ in gaps if g >= args.min_us) / 1e3:.2f} ms in gaps ≥ "
          f"{args.min_us:.0f} µs)")
    by_op: Counter = Counter()
    rows = []
    for g, k in gaps:
        launch = launches.get(k.get("args", {}).get("correlation"))
        op = host_op(launch["ts"]) if launch else "?"
        by_op[op] += g
        rows.append((g, op, k["name"]))
    print("idle time by the host op whose launch ended the gap:")
    for op, g in by_op.most_common(args.top):
        print(f"  {g / 1e3:8.3f} ms  {op[:100]}")
    print("longest gaps:")
    for g, op, name in sorted(rows, reverse=True)[:args.top]:
        if g >= args.min_us:
            print(f"  {g:9.1f} µs  {op[:60]:60s}  → {name[:60]}")


if __name__ == "__main__":
    main()
