"""Finding: a solo request's step proposes MTP drafts (k − 1 chained MTP passes and k lm_head projections) even when
the request cannot take another token after this step — it reaches max_tokens here — so the drafts are thrown away
unverified. On a disaggregated prefill replica (``prompts_only``, every request max_tokens 1, usually one prompt at
a time: solo) that is every prompt's step.

Observed through the executor: each step's ``StepResult.drafts`` for a request whose output the same step ended by
max_tokens, and the step's ``draft_ms`` (extend + proposals); and, for 40 prefill-replica prompts (200 tokens, max_tokens 1) at
k = 3 and 7, the share of their wall time spent in ``MtpDrafter.propose`` (the chained passes and the drafts' lm_head;
the extend — the MTP KV the replica sends — is needed and not counted).

Exit 1 while drafts are proposed for a request that reaches max_tokens in that step.

    PYTHONPATH=. .venv/bin/python bench/results/session60/review_spec/r1_drafts_for_ending_requests.py
"""
from __future__ import annotations

import time

import _s
from _s import SamplingParams, check, collect, ids, make_engine, tok
from workers.speculative import MtpDrafter

PROPOSE = [0.0]          # seconds inside MtpDrafter.propose (the chained passes and the drafts' lm_head)
_propose = MtpDrafter.propose


def _timed(self, *a, **kw):
    t = time.perf_counter()
    try:
        return _propose(self, *a, **kw)
    finally:
        PROPOSE[0] += time.perf_counter() - t


MtpDrafter.propose = _timed


class Watch:
    """Wraps an engine's executor: drafts returned for requests that end (max_tokens) in the same step."""

    def __init__(self, eng):
        self.eng, self.inner = eng, eng.executor
        self.wasted = self.proposed = self.excess = self.drafts = 0
        self.wasted_ms = self.draft_ms = 0.0
        eng.executor = self

    def execute(self, steps):
        results = self.inner.execute(steps)
        for step, res in zip(steps, results):
            self.draft_ms += res.draft_ms
            for s in step.seqs:
                if s.req_id not in res.drafts:
                    continue
                self.proposed += 1
                self.drafts += len(res.drafts[s.req_id])
                req = self.eng.schedulers[0].get(s.req_id)
                if req is None:
                    continue
                out = s.num_generated + len(res.sampled[s.req_id])
                room = max(0, req.params.max_tokens - out - 1)     # drafts max_tokens lets the next step verify
                self.excess += max(0, len(res.drafts[s.req_id]) - room)
                if out >= req.params.max_tokens:
                    self.wasted += 1
                    self.wasted_ms += res.draft_ms
        return results

    def recover(self):
        self.inner.recover()

    @property
    def runner(self):
        return self.inner.runner


def prefill_replica(k: int, drafts: bool = True):
    eng = make_engine(k=k, budget=512)
    eng.prompts_only = True             # as Coordinator(exports=True) builds a prefill replica's engine
    if not drafts:
        eng.speculative_tokens = 0      # the same speculative runner (the MTP extend runs), no drafts asked
    w = Watch(eng)
    PROPOSE[0] = 0.0
    t = time.perf_counter()
    for i in range(40):
        collect(eng, {f"p{i}": (ids(200, i), SamplingParams(max_tokens=1, temperature=0.0))})
    return time.perf_counter() - t, w, PROPOSE[0]


def main():
    _s.model()
    # a plain engine: solo requests that end by max_tokens
    eng = make_engine(k=3)
    w = Watch(eng)
    for n in (1, 2, 5, 17):
        collect(eng, {f"m{n}": (tok().encode("And it came to pass, when"),
                                SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))})
    print(f"solo requests (max_tokens 1, 2, 5, 17; k = 3): {w.proposed} draft proposals, {w.wasted} of them for a "
          f"request that reached max_tokens in that step ({w.wasted_ms:.1f} of {w.draft_ms:.1f} ms drafting); "
          f"{w.excess} of {w.drafts} drafts past what max_tokens lets the next step verify")
    check(w.wasted == 0, f"no drafts proposed for a request ending at max_tokens in that step (got {w.wasted})")

    for k in (3, 7):
        wall, w, propose = prefill_replica(k)
        print(f"prefill replica, k = {k}: 40 prompts of 200 tokens in {wall:.2f} s, of which {propose:.2f} s "
              f"({100 * propose / wall:.0f} %) in MtpDrafter.propose; {w.wasted} of {w.proposed} steps proposed drafts "
              "no request can use")
        check(w.wasted == 0, f"prefill replica k={k}: no drafts for max_tokens-1 prompts (got {w.wasted})")
    _s.done()


if __name__ == "__main__":
    main()
