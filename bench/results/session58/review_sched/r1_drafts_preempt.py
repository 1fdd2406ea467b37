"""Finding 1: optional speculative drafts make Scheduler.schedule preempt — another request, or the drafting request
itself, which then recomputes its whole context — where the step's real tokens fit the blocks already held.

Two requests of 3 tokens, a pool of 2 blocks of 4 (each holds one block). After the first token each has 4 tokens and
feeds position 3 — inside its own block, no new block needed. B (the younger) also has 2 proposed drafts, which would
write positions 4 and 5: a block the pool does not have. Expected: B's drafts are dropped (or cut to what its blocks
hold) and nothing is preempted. Observed: B preempts itself (`_reserve_or_preempt` asks blocks for num_new + drafts and
its victim is the worst-ranked request, B) and restarts at position 0 in the same plan; with the drafting request the
older one, the younger is preempted for the older one's drafts.
Exit 1 while the problem is present, 0 when fixed, 2 if it could not run."""
import sys

sys.path.insert(0, ".")
try:
    from scheduler import SamplingParams, Scheduler, SchedulerConfig
except Exception as e:  # noqa: BLE001
    print("could not import:", e)
    sys.exit(2)


def case(drafter: str):
    sched = Scheduler(SchedulerConfig(num_blocks=2, block_size=4, max_model_len=16, vocab_size=97, max_num_seqs=2,
                                      max_num_batched_tokens=16))
    sched.add_request("A", [1, 2, 3], SamplingParams(max_tokens=6, ignore_eos=True))
    sched.add_request("B", [4, 5, 6], SamplingParams(max_tokens=6, ignore_eos=True))
    plan = sched.schedule()                                   # both prompts, one block each
    sched.update(plan, {"A": [7], "B": [8]}, {drafter: [9, 10]})
    plan = sched.schedule(max_drafts=2)
    rows = [(s.req_id, s.start_pos, len(s.token_ids), s.num_drafts) for s in plan.seqs]
    print(f"drafts proposed for {drafter}: plan rows (req, start_pos, tokens, drafts) {rows}, "
          f"preempted {list(plan.preempted)}")
    return plan.preempted


bad = False
for who in ("B", "A"):
    if case(who):
        bad = True
print("FAIL: drafts caused a preemption" if bad else "OK: no preemption for drafts")
sys.exit(1 if bad else 0)
