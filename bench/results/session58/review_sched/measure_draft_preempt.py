"""How many of the scheduler fuzz's preemptions happen only because of drafts: each plan with drafts is planned again
on a copy of the scheduler with max_drafts=0; counts plans that preempt with drafts and not without."""
import copy
import sys

sys.path.insert(0, ".")
import tests.fuzz.scheduler as fuzz  # noqa: E402  (moved there from this folder in session 58)
from scheduler import Scheduler  # noqa: E402

orig = Scheduler.schedule
stats = {"plans_with_drafts": 0, "preempt_with": 0, "preempt_only_with_drafts": 0, "self_preempt_restarted": 0}


def wrap(self, max_drafts=0):
    if max_drafts and any(r.draft_ids for r in self._running):
        twin = copy.deepcopy(self)
        plain = orig(twin, 0)
        plan = orig(self, max_drafts)
        stats["plans_with_drafts"] += 1
        stats["preempt_with"] += len(plan.preempted)
        if len(plan.preempted) > len(plain.preempted):
            stats["preempt_only_with_drafts"] += len(plan.preempted) - len(plain.preempted)
            stats["self_preempt_restarted"] += len(set(plan.preempted) & {s.req_id for s in plan.seqs})
        return plan
    return orig(self, max_drafts)


Scheduler.schedule = wrap
for wl in range(int(sys.argv[1]) if len(sys.argv) > 1 else 300):
    fuzz.run_sched_workload(20, wl, 150)
print(stats)
