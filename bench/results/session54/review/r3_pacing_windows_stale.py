"""Finding 3: ``Imports.written`` learns a step's work window only from a plain step that follows a plain step
(``_quiet``), beside running requests. Under a steady stream of imports (a busy decode replica of a disaggregated app:
a bundle arrives every few steps) every step sends or lands, so ``windows`` stops changing; the budget keeps the
shortest window of whatever quiet period came last — here a light one (1 stream, 2 ms steps) — while the steps now
work 16 ms (32 streams): imports go at the floor-ish budget for good. (The reverse — windows learned under heavy load,
then light steps — gives fills that outlast the step: the stall the pacing was for.)

Fake executor: a step works 1.5 ms + 0.5 ms a row; the worker fills 1 GB/s (``import_fill``). Floor: a block (as the
session's test). Budgets in blocks of 16 bytes.
Run: cd /work/main && TRITON_INTERPRET=1 .venv/bin/python bench/results/session54/review/r3_pacing_windows_stale.py
Exit status 1 while the windows stay stale."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

import cluster.disagg as disagg  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402
from tests.conftest import RecordingExecutor  # noqa: E402
from tests.unit.test_disagg import _bundle_of  # noqa: E402


def _engine(blocks: int, seqs: int):
    from cluster.engine import Engine
    from scheduler import SchedulerConfig

    cfg = SchedulerConfig(num_blocks=blocks, block_size=4, max_model_len=1000, vocab_size=10000, eos_token_ids=(),
                          max_num_seqs=seqs, max_num_batched_tokens=256, prefix_caching=True)
    return Engine(RecordingExecutor(), cfg, kv_layout=((4, "uint8"),))

disagg.IMPORT_PACE = (0.8, 16)
RATE = 1e3                  # bytes a second: with 16-byte blocks, 2 ms of work -> 1.6 bytes -> the floor; scaled below
RATE = 16 * 1e3 / 1.0       # 16 kB/s: 1 ms of work fills one block


class Filling(RecordingExecutor):
    def execute(self, steps):
        rows = sum(len(s.token_ids) for st in steps for s in st.seqs)
        return [replace(r, busy_ms=1.5 + 0.5 * rows,
                        import_fill=(1 << 20, (1 << 20) / RATE) if st.kv_imports else None)
                for r, st in zip(super().execute(steps), steps)]


e = _engine(blocks=1024, seqs=40)
e.executor = Filling()
imports = e._imports[0]
e.add_request(list(range(900, 905)), SamplingParams(max_tokens=900, ignore_eos=True), "s0")
for _ in range(3):
    e.step()
y = list(range(1, 42))
e.add_request(y, SamplingParams(max_tokens=1), "y0", kv=_bundle_of(y))      # a first import: learns the fill rate
while imports:
    e.step()
for _ in range(3):
    e.step()                                                                   # light quiet steps: 2 ms windows
print("light load: windows", list(imports.windows), "budget", imports.step_budget(True) // 16, "blocks")
for i in range(1, 32):                                                         # load grows to 32 streams
    e.add_request(list(range(1000 + 10 * i, 1005 + 10 * i)), SamplingParams(max_tokens=900, ignore_eos=True),
                  f"s{i}")
n, budgets = 0, []
for step in range(120):                                                        # a bundle every 6 steps
    if step % 6 == 0:
        n += 1
        p = [5000 + 100 * n + j for j in range(41)]
        e.add_request(p, SamplingParams(max_tokens=1), f"y{n}", kv=_bundle_of(p))
    e.step()
    budgets.append(imports.step_budget(True) // 16)
work = e.executor.steps[-1]
rows = sum(len(s.token_ids) for st in work for s in st.seqs)
print(f"32 streams, a bundle every 6 steps: a step works {1.5 + 0.5 * rows:.1f} ms; windows {list(imports.windows)};"
      f" budget {budgets[-1]} blocks a step (the last 120 steps: {min(budgets)}-{max(budgets)})")
want = int(RATE * (1.5 + 0.5 * rows) / 1e3 * 0.8) // 16
print(f"what the fill rate allows beside such a step: {want} blocks")
backlog = sum(len(blocks) - at for _, blocks, _, at in imports.queue)
print(f"imports still queued after 120 steps: {backlog} blocks of {20 * 10} arrived (requests waiting on them: "
      f"{sum(r.importing for r in e.scheduler.waiting())})")
sys.exit(1 if budgets[-1] < want / 2 else 0)
