"""Finding 2: while a request waits for its imported KV, look-ahead is allowed (``Engine._may_look_ahead``), but the
scheduler grants the running requests no slack block (``Scheduler.schedule``: ``if self.slack and not self._waiting``
— an importing request is in ``_waiting``), so at each block edge ``_may_look_ahead`` refuses (``end_pos + 1 > blocks
* bs``) and the next step cannot use a launched one. The session's test (tests/unit/test_lookahead.py) places x at
position 3 of a 16-token block: "no block edge before 16".

Same scenario as the test, but x decodes across a block edge while y's 10-block import goes 1 block a step.
Run: cd /work/main && TRITON_INTERPRET=1 .venv/bin/python bench/results/session54/review/r2_slack_while_importing.py
Exit status 1 while the gap is there."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from cluster.engine import Engine  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402
from scheduler.scheduler import SchedulerConfig  # noqa: E402
from tests.conftest import RecordingExecutor  # noqa: E402
from tests.unit.test_disagg import _bundle_of  # noqa: E402

BS = 16


def run(with_import: bool, PROMPT: int, EDGE: int) -> list:
    cfg = SchedulerConfig(num_blocks=64, block_size=BS, max_model_len=400, vocab_size=1000, max_num_seqs=4,
                          max_num_batched_tokens=64, prefix_caching=True)
    e = Engine(RecordingExecutor(), cfg, graphs=True, kv_layout=((4, "uint8"),))
    rec = e.executor
    e._imports[0].budget = 1 * BS * 4                          # a block a step: the import spans x's block edge
    e.add_request(list(range(500, 500 + PROMPT)), SamplingParams(max_tokens=60, temperature=0.0), "x")
    e.step()
    while rec.steps[-1][0].seqs[0].end_pos < EDGE - 4:          # x decodes up to 4 positions before a block edge
        e.step()
    if with_import:
        y = list(range(1, 162))
        e.add_request(y, SamplingParams(max_tokens=2, temperature=0.0), "y", kv=_bundle_of(y, BS))
    first = len(rec.steps)
    for _ in range(8):
        e.step()
    return [(st[0].seqs[0].end_pos, len(st[0].seqs[0].block_ids), st[0].lookahead, st[0].use_ahead,
             sum(len(b) for b, _ in st[0].kv_imports)) for st in rec.steps[first:]]


bad = 0
for with_import, prompt, edge in ((False, 10, 16), (True, 10, 16), (False, 100, 112), (True, 100, 112)):
    rows = run(with_import, prompt, edge)
    print("import in flight" if with_import else "no import", f"(x: a {prompt}-token prompt, edge at {edge}; "
          "end_pos, blocks, lookahead, use_ahead, sent):")
    for r in rows:
        print("   ", r)
    if with_import and not all(la for _, _, la, _, _ in rows):
        bad += 1
        print("FAIL: look-ahead refused at x's block edge while y imports (no slack block granted)")
    print("    steps that used a launched step:", sum(ua for *_, ua, _ in rows), "of", len(rows))


def many(streams: int, with_import: bool) -> float:
    """``streams`` decoding requests at staggered positions (BS 16); the share of 32 steps that used a launched one."""
    cfg = SchedulerConfig(num_blocks=256, block_size=BS, max_model_len=400, vocab_size=1000, max_num_seqs=streams + 1,
                          max_num_batched_tokens=256, prefix_caching=True)
    e = Engine(RecordingExecutor(), cfg, graphs=True, kv_layout=((4, "uint8"),))
    rec = e.executor
    e._imports[0].budget = 1 * BS * 4
    for i in range(streams):
        e.add_request(list(range(600 + 20 * i, 600 + 20 * i + 3 + i)), SamplingParams(max_tokens=200,
                      temperature=0.0), f"x{i}")
    for _ in range(4):
        e.step()
    if with_import:
        y = list(range(1, 322))                                 # 20 blocks: a block a step, 20+ steps in flight
        e.add_request(y, SamplingParams(max_tokens=2, temperature=0.0), "y", kv=_bundle_of(y, BS))
    first = len(rec.steps)
    for _ in range(20):
        e.step()
    return sum(st[0].use_ahead for st in rec.steps[first:]) / 20


print("\nshare of steps that used a launched step, 20 steps, x streams at staggered positions (BS 16):")
for n in (1, 4, 8, 15):
    print(f"    {n:2d} streams: no import {many(n, False):.2f}   import in flight {many(n, True):.2f}")

sys.exit(1 if bad else 0)
