"""Session 54: the GPU timeline of a stall round (``bench/disagg.py stall --profile``'s trace): copies to the device
over 1 MB (stream, start, duration, GB/s), the import landings' ``index_copy`` kernels, and the gaps in the step
stream's kernels over 0.3 ms — relative to the first copy, in ms."""

import json
import sys

trace = json.load(open(sys.argv[1]))
ev = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
ev.sort(key=lambda e: e["ts"])
if not ev:
    sys.exit("no GPU events in the trace")
copies = [e for e in ev if e["cat"] == "gpu_memcpy" and "HtoD" in e["name"] and e["args"].get("bytes", 0) > 1 << 20]
t0 = copies[0]["ts"] if copies else ev[0]["ts"]
streams = {}
for e in ev:
    streams.setdefault(e["args"].get("stream"), []).append(e)
main = max(streams, key=lambda s: len(streams[s]))
print(f"streams: {', '.join(f'{s}: {len(v)}' for s, v in streams.items())}; the step stream: {main}")
rows = []
for e in copies:
    rows.append((e["ts"], f"copy  stream {e['args'].get('stream')} {e['args']['bytes'] / 1e6:6.1f} MB "
                          f"{e['dur'] / 1e3:6.2f} ms {e['args']['bytes'] / e['dur'] / 1e3:5.1f} GB/s"))
for e in ev:
    if e["cat"] == "kernel" and "index" in e["name"].lower() and e["dur"] > 20:
        rows.append((e["ts"], f"index stream {e['args'].get('stream')} {e['dur'] / 1e3:6.2f} ms {e['name'][:60]}"))
run = streams[main]
for a, b in zip(run, run[1:]):
    gap = b["ts"] - (a["ts"] + a["dur"])
    if gap > 300:
        rows.append((a["ts"] + a["dur"], f"gap   stream {main} {gap / 1e3:6.2f} ms before {b['name'][:60]}"))
for ts, text in sorted(rows):
    print(f"{(ts - t0) / 1e3:9.2f}  {text}")
