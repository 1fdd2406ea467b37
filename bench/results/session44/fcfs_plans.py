"""Session 44's check that the priority scheduler left FCFS alone: 300 random workloads (prefix caching, host tiers,
slack, small pools that preempt) driven through ``tests/unit/test_scheduler``'s fake paged model; every plan pickled.

    git checkout 59e921a && python bench/results/session44/fcfs_plans.py /tmp/old.pkl     # before the change
    git checkout main && python bench/results/session44/fcfs_plans.py /tmp/new.pkl [priority]
    python -c "import pickle; print(pickle.load(open('/tmp/old.pkl','rb')) == pickle.load(open('/tmp/new.pkl','rb')))"

(the optional ``priority`` runs the new policy with every priority 0). Session 44: equal both ways (300 workloads,
10,182 plans, 204 preemptions).
"""

import pickle
import random
import sys

sys.path.insert(0, ".")
import tests.unit.test_scheduler as ts  # noqa: E402
from scheduler import SamplingParams  # noqa: E402

ts.check_plan = lambda sched, plan: None        # its "no shared block" check does not hold with prefix caching


def main(out_path: str, policy: str | None = None) -> None:
    out, rng = [], random.Random(123)
    for trial in range(300):
        nb, bs = rng.randrange(4, 24), rng.choice([1, 2, 4])
        kw = dict(num_blocks=nb, block_size=bs, max_num_batched_tokens=rng.randrange(8, 16),
                  max_num_seqs=rng.choice([1, 2, 4, 8]), prefix_caching=rng.random() < 0.5,
                  host_blocks=rng.choice([0, 0, 4]))
        slack = rng.choice([0, 1])
        arrivals: dict[int, list] = {}
        shared = ts.prompt(rng.randrange(1, 12), trial)
        for i in range(rng.randrange(2, 14)):
            max_tokens = rng.randrange(1, max(2, min(8, nb * bs // 2)))
            n = rng.randrange(1, max(2, nb * bs - max_tokens))
            own = ts.prompt(n, 1000 * trial + i)
            ids = (shared + own)[:n] if rng.random() < 0.5 else own
            arrivals.setdefault(rng.randrange(25), []).append((f"r{i}", ids, SamplingParams(max_tokens=max_tokens)))
        sched = ts.make(slack=slack, **kw, **({"policy": policy} if policy else {}))
        outputs, reasons, plans = ts.drive(sched, ts.FakeModel(nb, bs, ahead=bool(slack)), arrivals=arrivals)
        out.append((outputs, reasons, [(p.seqs, p.preempted, p.kv_saves, p.kv_loads) for p in plans]))
    pickle.dump(out, open(out_path, "wb"))
    print(len(out), "workloads,", sum(len(x[2]) for x in out), "plans,",
          sum(len(p[1]) for x in out for p in x[2]), "preemptions")


if __name__ == "__main__":
    main(*sys.argv[1:])
