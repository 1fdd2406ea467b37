"""Fuzz: tests/unit/test_disagg_holds.py's random disaggregated flows (holds, bundles a few steps later, aborts, ids
reused, failed steps, two ranks) on an engine with CUDA graphs and look-ahead on, over a ShadowKV that also models
the worker's look-ahead: a step that says ``lookahead`` runs its requests' next decode step right after its forward,
BEFORE its own landing (``ImportWriter.write`` runs after ``_execute``), reading and writing the KV as it stands then;
a step that says ``use_ahead`` takes that one's reads (their errors count) instead of running its own forward.
Every forward must read its own prefix's KV. Also: after every step no rows sent are pending without the engine
having them in ``landing`` (the engine and the modelled worker agree).

Run: cd /work/main && TRITON_INTERPRET=1 .venv/bin/python bench/results/session54/review/r4_fuzz_lookahead_landing.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

import numpy as np  # noqa: E402

import tests.unit.test_disagg_holds as holds  # noqa: E402
from tests.unit.test_disagg_holds import BS, GARBAGE, ShadowKV, cid  # noqa: E402


class AheadShadow(ShadowKV):
    def __init__(self, num_ranks, blocks, host):
        super().__init__(num_ranks, blocks, host)
        self.ahead = [None] * num_ranks        # {req_id: (start_pos, read errors)} launched by the last step
        self.used = self.launched = self.beside = 0

    def _forward(self, r, seqs, errors):
        dev, ids = self.dev[r], self.ids[r]
        sampled = {}
        for s in seqs:
            seq_ids = ids[s.req_id]
            for p in range(s.start_pos):
                got = dev[s.block_ids[p // BS]][p % BS]
                if got != cid(seq_ids[:p + 1]):
                    errors.append((s.req_id, p, got, cid(seq_ids[:p + 1])))
            for p in range(s.start_pos, s.start_pos + len(s.token_ids)):
                dev[s.block_ids[p // BS]][p % BS] = cid(seq_ids[:p + 1])
        return sampled

    def execute(self, steps):
        from workers.runner import StepResult

        if self.fail_next:
            self.ahead = [None] * len(steps)
            return super().execute(steps)
        self.steps.append(steps)
        results = []
        for r, st in enumerate(steps):
            dev, host, ids = self.dev[r], self.host[r], self.ids[r]
            for rid in st.finished:
                ids.pop(rid, None)
            for nr in st.new_requests:
                ids[nr.req_id] = [*nr.prompt_ids, *nr.output_ids]
            saved = {slot: list(dev[b]) for b, slot in st.kv_saves}
            for slot, v in saved.items():
                host[slot] = v
            for slot, b in st.kv_loads:
                dev[b] = list(host[slot])
            ahead, self.ahead[r] = self.ahead[r], None
            sampled = {}
            if st.use_ahead:
                assert ahead is not None, "use_ahead without a launched step"
                self.used += 1
                for s in st.seqs:
                    pos, errs = ahead[s.req_id]
                    assert pos == s.start_pos, (s, pos)
                    self.errors += errs
            else:
                errs = []
                self._forward(r, st.seqs, errs)
                self.errors += errs
            for s in st.seqs:
                seq_ids = ids[s.req_id]
                assert list(seq_ids[s.start_pos:s.start_pos + len(s.token_ids)]) == list(s.token_ids), s
                if s.sample:
                    tok = 1 + (sum(seq_ids) * 7 + len(seq_ids)) % 997
                    sampled[s.req_id] = [tok]
                    seq_ids.append(tok)
            if st.lookahead:             # the next decode step, launched now: before this step's landing
                self.launched += 1
                self.beside += bool(st.kv_imports or st.kv_land)
                launched = {}
                for s in st.seqs:
                    nxt = type(s)(**{**s.__dict__, "token_ids": (0,), "start_pos": s.start_pos + 1})
                    errs = []
                    seq_ids = ids[s.req_id]
                    for p in range(nxt.start_pos):
                        got = dev[s.block_ids[p // BS]][p % BS]
                        if got != cid(seq_ids[:p + 1]):
                            errs.append(("ahead", s.req_id, p, got, cid(seq_ids[:p + 1])))
                    p = nxt.start_pos
                    assert p < len(s.block_ids) * BS, "look-ahead past the request's blocks"
                    dev[s.block_ids[p // BS]][p % BS] = cid(seq_ids[:p + 1])
                    launched[s.req_id] = (nxt.start_pos, errs)
                self.ahead[r] = launched
            for blocks, rows in self.sent[r] if st.kv_land else ():
                vals = rows[0].view(np.uint32).reshape(-1)
                for i, b in enumerate(blocks):
                    dev[b] = [int(v) for v in vals[i * BS:(i + 1) * BS]]
            self.sent[r] = st.kv_imports
            results.append(StepResult(st.step_id, sampled))
        return results


def engine(num_ranks=1, blocks=24, host=12, seqs=4, budget=64):
    from cluster.engine import Engine
    from scheduler import SchedulerConfig

    cfg = SchedulerConfig(num_blocks=blocks, block_size=BS, max_model_len=200, vocab_size=1000, eos_token_ids=(),
                          max_num_seqs=seqs, max_num_batched_tokens=budget, prefix_caching=True, host_blocks=host)
    ex = AheadShadow(num_ranks, blocks, host)
    e = Engine(ex, cfg, num_ranks=num_ranks, kv_layout=((4, "uint8"),), graphs=True)
    engines.append(e)
    return e, ex


engines = []
holds.engine = engine
if "--mutate" in sys.argv:        # the check's own check: settle a step's blocks one step early (before they land)
    from cluster.disagg import Imports

    def early(self, sched, fill=None, work_ms=None):
        landed, self.landing, self.writing = [*self.landing, *self.writing], [], []
        return self._settle(sched, landed)
    Imports.written = early
failed, used, launched, beside = 0, 0, 0, 0
for ranks, failures in ((1, False), (2, True), (1, True)):
    for seed in range(40):
        engines.clear()
        try:
            holds._random_flow(seed, ranks, failures)
        except AssertionError as e:
            failed += 1
            print(f"FAIL ranks={ranks} failures={failures} seed={seed}: {str(e)[:300]}")
        ex = engines[0].executor
        used += ex.used
        launched += ex.launched
        beside += ex.beside
print(f"look-ahead steps launched {launched} ({beside} of them sending or landing imports), used {used}; "
      f"failures {failed}")
sys.exit(1 if failed else 0)
