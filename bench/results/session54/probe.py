"""Session 54: where the host's time goes in a stall round's steps (``bench/disagg.py stall``, the slice): wall time
of each part of the engine's step — the plan (take, schedule, the worker steps), the runner (stage, the step's own
work, write) and the rest — summed a step, medians over the last round's steps that send imports and over its steps
before the import arrived. ``--threads N``: the writer's fill helpers."""

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import bench.disagg as bd  # noqa: E402
import cluster.disagg as disagg  # noqa: E402
import cluster.engine as engine_mod  # noqa: E402
import models.cache as cache  # noqa: E402
import scheduler.scheduler as sched_mod  # noqa: E402
import workers.runner as runner_mod  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=None)
ap.add_argument("--unpaced", action="store_true")
ap.add_argument("--device", default="cuda")
ap.add_argument("--tokens", type=int, nargs="+", default=[32768, 131072])
a = ap.parse_args()

steps: list[dict] = []
marks: list[int] = []


def timed(owner, name, key):
    fn = getattr(owner, name)

    def wrapper(*args, **kw):
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            if steps:
                steps[-1][key] += time.perf_counter() - t
    setattr(owner, name, wrapper)


step = engine_mod.Engine._step


def whole(self):
    steps.append(defaultdict(float))
    t = time.perf_counter()
    out = step(self)
    steps[-1]["step"] = time.perf_counter() - t
    steps[-1]["bytes"] = sum(r.nbytes for st in self.executor._last for _, rows in st.kv_imports for r in rows) \
        if getattr(self.executor, "_last", None) else 0
    return out


engine_mod.Engine._step = whole
execute = engine_mod.LocalExecutor.execute


def ex(self, sts):
    self._last = sts
    t = time.perf_counter()
    try:
        return execute(self, sts)
    finally:
        if steps:
            steps[-1]["execute"] += time.perf_counter() - t


engine_mod.LocalExecutor.execute = ex
timed(disagg.Imports, "take", "take")
timed(disagg.Imports, "written", "written")
timed(sched_mod.Scheduler, "schedule", "schedule")
timed(engine_mod.Engine, "_worker_steps", "worker_steps")
timed(cache.ImportWriter, "stage", "stage")
timed(cache.ImportWriter, "write", "write")
timed(runner_mod.ModelRunner, "_execute", "_execute")
add = engine_mod.Engine.add_request


def add_request(self, *args, **kw):
    if kw.get("kv") is not None:
        marks.append(len(steps))
    return add(self, *args, **kw)


engine_mod.Engine.add_request = add_request
if a.threads:
    init = cache.ImportWriter.__init__
    cache.ImportWriter.__init__ = lambda self, c, bs, staged=None, threads=None: init(self, c, bs, staged, a.threads)
bd.stall(a.device, a.device == "cuda", a.tokens, 4, False, Path("/tmp/probe"), unpaced=a.unpaced)
last = steps[marks[-1]:]
before = steps[marks[-1] - 30:marks[-1]]
keys = ["step", "take", "schedule", "worker_steps", "execute", "stage", "_execute", "write", "written"]
for name, group in (("plain (before the import)", before), ("sending imports", [s for s in last if s["bytes"]])):
    med = {k: statistics.median(s[k] for s in group) * 1e3 for k in keys}
    rest = med["step"] - med["take"] - med["schedule"] - med["worker_steps"] - med["execute"] - med["written"]
    print(f"{name} ({len(group)} steps, threads {a.threads or 'default'}): " +
          " ".join(f"{k} {v:.2f}" for k, v in med.items()) + f" | engine rest {rest:.2f} | runner rest "
          f"{med['execute'] - med['stage'] - med['_execute'] - med['write']:.2f} ms")
