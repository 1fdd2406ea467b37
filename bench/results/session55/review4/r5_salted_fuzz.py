"""r5: random shared-prefix workloads with random salts (None, A, B) on small pools — preemption, eviction, a host tier
smaller / larger than the device — over the scheduler tests' fake paged model, extended so that each KV position also
records the salt of the request that computed it (and host copies carry it): a request that reads a position computed
under another salt fails. Plus the engine's rank choice by cached blocks (two ranks): it follows the request's salt."""
import random

import common  # noqa: F401  (sys.path)
from common import check, done

from cluster.engine import Engine
from scheduler import SamplingParams, SchedulerConfig
from tests.conftest import RecordingExecutor
from tests.unit.test_prefix_cache import NextTokenModel, _check_idle_lists, _make
from tests.unit.test_scheduler import expected_output, prompt


class SaltModel(NextTokenModel):
    def __init__(self, sched):
        super().__init__(sched)
        self.owner, self.host_owner, self.cross, self.lp_starts, self.seen = {}, {}, [], [], set()

    def copy(self, plan):
        for block, slot in plan.kv_saves:
            self.host_owner[slot] = [self.owner.get(block * self.bs + i) for i in range(self.bs)]
        for slot, block in plan.kv_loads:
            for i, o in enumerate(self.host_owner[slot]):
                self.owner[block * self.bs + i] = o
        super().copy(plan)

    def execute(self, plan):
        self.copy(plan)
        for seq in plan.seqs:
            salt = self.sched.get(seq.req_id).params.cache_salt
            if self.sched.get(seq.req_id).params.prompt_logprobs is not None and seq.num_generated == 0 \
                    and self.sched.get(seq.req_id).num_preemptions == 0 and seq.start_pos > 0 \
                    and seq.req_id not in self.seen:
                self.lp_starts.append((seq.req_id, seq.start_pos))
            self.seen.add(seq.req_id)
            for p in range(seq.start_pos):
                o = self.owner.get(self._slot(seq.block_ids, p), "?")
                if o != salt:
                    self.cross.append((seq.req_id, salt, p, o))
            for p in range(seq.start_pos, seq.end_pos):
                self.owner[self._slot(seq.block_ids, p)] = salt
        plan_no_copies = plan.__class__(plan.step_id, plan.seqs, plan.preempted)
        return NextTokenModel.execute(self, plan_no_copies)


def drive(sched, arrivals, max_steps=10_000):
    model, outputs = SaltModel(sched), {}
    for step in range(max_steps):
        for rid, ids, params in arrivals.pop(step, []):
            sched.add_request(rid, ids, params)
        if not sched.has_unfinished() and not arrivals:
            break
        plan = sched.schedule()
        for ev in sched.update(plan, model.execute(plan)):
            outputs.setdefault(ev.req_id, []).extend(ev.new_token_ids)
    assert sched.pool.num_free == sched.pool.num_blocks, "blocks leaked"
    return outputs, model


rng = random.Random(11)
cross = wrong = hits = loads = lp_bad = 0
for trial in range(60):
    host = rng.choice([0, 6, 40])
    nb, bs = rng.randrange(8, 24), rng.choice([1, 2, 4])
    sched = _make(num_blocks=nb, block_size=bs, max_num_batched_tokens=rng.randrange(4, 12), max_num_seqs=4,
                  host_blocks=host)
    bases = [prompt(nb * bs, 1000 * trial + j) for j in range(2)]
    arrivals, specs = {}, {}
    for i in range(14):
        max_tokens = rng.randrange(1, 8)
        n = rng.randrange(1, max(2, nb * bs - max_tokens))
        shared = rng.randrange(0, n + 1)
        ids = rng.choice(bases)[:shared] + prompt(n - shared, 100 * trial + i)
        salt = rng.choice([None, "A", "B"])
        lp = 1 if rng.random() < 0.15 else None
        specs[f"r{i}"] = (ids, max_tokens)
        arrivals.setdefault(rng.randrange(30), []).append(
            (f"r{i}", ids, SamplingParams(max_tokens=max_tokens, cache_salt=salt, prompt_logprobs=lp)))
    outputs, model = drive(sched, arrivals)
    _check_idle_lists(sched.pool)
    cross += len(model.cross)
    lp_bad += len(model.lp_starts)
    if model.cross:
        print("cross-salt reads:", model.cross[:3])
    wrong += sum(outputs[r] != expected_output(ids, mt) for r, (ids, mt) in specs.items())
    hits += sched.prefix_hits
    loads += sched.host_loads
check(cross == 0, f"no request read KV computed under another salt ({cross} reads)")
check(lp_bad == 0, f"prompt-logprobs requests start their prefill at position 0 ({lp_bad} did not)")
check(wrong == 0, f"every output == the uncached model's ({wrong} wrong)")
check(hits > 0 and loads > 0, f"the workloads reused prefixes ({hits} tokens) and loaded from the host ({loads})")

# the engine's rank choice: a prefix cached under A on rank 0 draws only A's requests there
cfg = SchedulerConfig(num_blocks=64, block_size=4, max_model_len=128, vocab_size=64, max_num_seqs=8,
                      max_num_batched_tokens=64, prefix_caching=True)
eng = Engine(RecordingExecutor(), cfg, num_ranks=2)
system = list(range(2, 30))


def finish():
    evs = []
    while eng.has_unfinished():
        evs += eng.step()
    return evs


ranks = {}


def add(ids, params, rid):
    eng.add_request(ids, params, rid)
    ranks[rid] = eng._rank_of[rid]


add(system + [40, 41], SamplingParams(max_tokens=2, cache_salt="A"), "first")
add([50, 51, 52], SamplingParams(max_tokens=2), "other")
finish()
add([60] * 6, SamplingParams(max_tokens=30, ignore_eos=True), "busy")      # load on the first's rank
for rid, salt in (("b", "B"), ("n", None), ("a", "A")):     # each probed alone (then withdrawn): the same loads
    add(system + [42, 43], SamplingParams(max_tokens=2, cache_salt=salt), rid + "?")
    eng.abort(rid + "?")
    ranks[rid] = ranks.pop(rid + "?")
for rid, salt in (("b", "B"), ("n", None), ("a", "A")):     # then all three, for their cached_tokens
    eng.add_request(system + [42, 43], SamplingParams(max_tokens=2, cache_salt=salt), rid)
print("ranks:", ranks)
evs = {e.req_id: e for e in finish() if e.finished}
check(ranks["a"] == ranks["first"] and ranks["b"] != ranks["first"] and ranks["n"] != ranks["first"],
      "only salt A's request is drawn to the rank holding A's prefix")
check(evs["a"].num_cached_tokens == 24 and evs["b"].num_cached_tokens == 0 and evs["n"].num_cached_tokens == 0,
      f"cached_tokens a/b/n = {evs['a'].num_cached_tokens}/{evs['b'].num_cached_tokens}/{evs['n'].num_cached_tokens}")
done()
