"""Property fuzzer of the pure-Python scheduler (and the Engine over a fake paged executor).

Written by session 58's scheduler review (``bench/results/session58/review_sched/``);
``tests/unit/test_scheduler_fuzz.py`` runs a few seeds of each mode. Usage (from the repo root):
    .venv/bin/python -m tests.fuzz.scheduler --mode sched --seed 0 --workloads 200
    .venv/bin/python -m tests.fuzz.scheduler --mode engine --seed 0 --workloads 100

Each workload draws a random config (block size, pool, budgets, prefix caching, host tier, policy, slack, drafts)
and a random stream of arrivals (lengths near the limits, shared prefixes, duplicates = n > 1 choices), aborts (any
state, also between schedule() and update()), stop-string finishes, and checks invariants after every step. A fake
paged model keeps, for each KV slot, the token written there and the token after it (as test_prefix_cache's), so a
wrong block table, a stale / shared / wrongly cached block or a bad recompute changes the output or trips a check.
Exit 1 on the first failure (printing the seed, workload and a replay line), 0 otherwise.
"""

from __future__ import annotations

import argparse
import random
import sys
import traceback
from collections import Counter
from dataclasses import dataclass, field

from scheduler import AdmissionError, RequestStatus, SamplingParams, Scheduler, SchedulerConfig, StepPlan
from scheduler.request import FinishReason
from scheduler.shapes import plan_step_shapes

VOCAB = 97


def next_token(context) -> int:
    assert None not in context, "read an unwritten slot"
    h = len(context)
    for t in context:
        h = (h * 31 + t) % 1_000_003
    return h % VOCAB


def expected_output(prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(next_token(ids))
    return ids[len(prompt):]


class PagedModel:
    """Fake paged KV model of one rank: kv[slot] = token fed there, after[slot] = the token after it (MTP's key)."""

    def __init__(self, bs: int, ahead: bool = False):
        self.bs, self.ahead = bs, ahead
        self.kv: dict[int, int] = {}
        self.after: dict[int, int] = {}
        self.host: dict[int, list] = {}

    def slot(self, table, pos):
        return table[pos // self.bs] * self.bs + pos % self.bs

    def copies(self, saves, loads):
        for block, slot in saves:
            self.host[slot] = [(self.kv.get(block * self.bs + i), self.after.get(block * self.bs + i))
                               for i in range(self.bs)]
        for slot, block in loads:
            assert slot in self.host, f"load from host slot {slot} never saved"
            for i, (kv, after) in enumerate(self.host[slot]):
                self.kv[block * self.bs + i], self.after[block * self.bs + i] = kv, after

    def run_seq(self, seq, is_cached, full_ids=None):
        """Write the seq's tokens, check what it reads, sample (verify drafts); returns the sampled tokens or None."""
        bs = self.bs
        assert len(seq.block_ids) * bs >= seq.end_pos, f"{seq.req_id}: table too short"
        for i, tok in enumerate(seq.token_ids):
            s = self.slot(seq.block_ids, seq.start_pos + i)
            assert not is_cached(s // bs), f"{seq.req_id} writes cached block {s // bs} at {seq.start_pos + i}"
            self.kv[s] = tok
        ctx = [self.kv.get(self.slot(seq.block_ids, p)) for p in range(seq.end_pos)]
        assert None not in ctx, f"{seq.req_id}: reads an unwritten slot"
        for p in range(seq.start_pos):
            a = self.after.get(self.slot(seq.block_ids, p))
            assert a == ctx[p + 1], f"{seq.req_id}: position {p}'s kept next token {a} != context's {ctx[p + 1]}"
        n, d = len(seq.token_ids), seq.num_drafts
        for i in range(n - 1):
            self.after[self.slot(seq.block_ids, seq.start_pos + i)] = seq.token_ids[i + 1]
        last = self.slot(seq.block_ids, seq.end_pos - 1)
        if not seq.sample:
            assert full_ids is not None
            self.after[last] = full_ids[seq.end_pos]
            return None
        base = seq.end_pos - d          # positions [0, base) are committed; rows base-1 .. end_pos-1 sample
        pred = [next_token(ctx[:base + j]) for j in range(d + 1)]
        a = 0
        while a < d and seq.token_ids[n - d + a] == pred[a]:
            a += 1
        self.after[self.slot(seq.block_ids, base - 1 + a)] = pred[a]     # the extend pass: the bonus token
        if self.ahead and d == 0 and len(seq.block_ids) * bs > seq.end_pos:
            self.kv[self.slot(seq.block_ids, seq.end_pos)] = VOCAB + 1   # junk, as a step launched ahead may write
        return pred[:a + 1]


def make_drafts(rng, ids_after, k, p_good):
    """Drafts after a request whose tokens so far are ids_after: the true continuation, each wrong with 1 - p_good."""
    ctx, out = list(ids_after), []
    for _ in range(k):
        t = next_token(ctx)
        if rng.random() > p_good:
            t = (t + 1 + rng.randrange(VOCAB - 1)) % VOCAB
        out.append(t)
        ctx.append(t)
    return out


class Fail(AssertionError):
    pass


def check_pool(sched: Scheduler, where="", extra=()):
    """free + held == total; refcounts == holds of live requests; free lists disjoint; cached maps consistent."""
    pool = sched.pool
    holds = Counter()
    for r in sched._running:
        assert len(r.block_ids) == len(set(r.block_ids)), f"{where}: {r.req_id} holds a block twice {r.block_ids}"
        holds.update(r.block_ids)
    for r in sched._waiting:
        holds.update(r.block_ids)
    holds.update(extra)
    for b in range(pool.num_blocks):
        assert pool._refs[b] == holds[b], f"{where}: block {b} refs {pool._refs[b]} != holds {holds[b]}"
    free_ids, idle, kept = list(pool._free_ids), set(pool._idle), set(pool._kept)
    assert len(free_ids) == len(set(free_ids)), f"{where}: free list has duplicates"
    fs = set(free_ids)
    assert not (fs & idle) and not (fs & kept) and not (idle & kept), f"{where}: free/idle/kept overlap"
    zero = {b for b in range(pool.num_blocks) if pool._refs[b] == 0}
    assert fs | idle | kept == zero, f"{where}: unheld blocks {sorted(zero - (fs | idle | kept))} lost / held ones " \
                                     f"{sorted((fs | idle | kept) - zero)} listed free"
    assert pool.num_free + sum(1 for b in range(pool.num_blocks) if pool._refs[b]) == pool.num_blocks
    for b in idle | kept:
        assert b in pool._node_of_block, f"{where}: idle block {b} not cached"
    for b in fs:
        assert b not in pool._node_of_block, f"{where}: free-list block {b} still cached"
    for b, n in pool._node_of_block.items():
        assert pool._nodes[n].block == b, f"{where}: node/block maps disagree for {b}"
    for n, node in pool._nodes.items():
        assert node.block is not None or node.slot is not None, f"{where}: node {n} has no copy"
        assert pool._node_of_key[node.key] == n
    for s, n in pool._node_of_slot.items():
        assert pool._nodes[n].slot == s
    assert len(pool._node_of_slot) <= pool.host_blocks


def check_sched(sched: Scheduler, where="", extra=()):
    check_pool(sched, where, extra)
    cfg = sched.config
    assert len(sched._running) <= cfg.max_num_seqs, f"{where}: {len(sched._running)} running > {cfg.max_num_seqs}"
    assert [r.rank for r in sched._running] == sorted(r.rank for r in sched._running), f"{where}: running unsorted"
    assert [r.rank for r in sched._waiting] == sorted(r.rank for r in sched._waiting), f"{where}: waiting unsorted"
    ids = [r.req_id for r in sched._running] + [r.req_id for r in sched._waiting]
    assert sorted(ids) == sorted(sched._live), f"{where}: live map != running + waiting"
    for r in sched._waiting:
        assert r.status is RequestStatus.WAITING and not r.block_ids and r.num_computed_tokens == 0, \
            f"{where}: waiting {r.req_id} holds {r.block_ids} / computed {r.num_computed_tokens}"
    for r in sched._running:
        assert r.status in (RequestStatus.PREFILLING, RequestStatus.DECODING)
        need = sched.pool.blocks_needed(r.num_computed_tokens)
        assert len(r.block_ids) >= need, f"{where}: {r.req_id} table {len(r.block_ids)} < {need}"
        assert len(r.block_ids) <= sched.pool.blocks_needed(r.num_tokens + sched.slack + 8), \
            f"{where}: {r.req_id} holds {len(r.block_ids)} blocks for {r.num_tokens} tokens"
        assert r.num_computed_tokens <= r.num_tokens
        for i, n in enumerate(r.cached_nodes):
            assert sched.pool._nodes.get(n) is None or sched.pool._nodes[n].block in (r.block_ids[i], None) \
                or True
    if cfg.policy == "fcfs" and sched._running and sched._waiting:
        assert sched._running[-1].rank < sched._waiting[0].rank, f"{where}: FCFS: a waiting request ranks first"
    assert sched.prefix_hits <= sched.prefix_queried


@dataclass
class Track:
    prompt: list
    params: SamplingParams
    out: list = field(default_factory=list)
    ended: str | None = None
    started: bool = False


def rand_len(rng, cfg, mt):
    bs, cap = cfg.block_size, cfg.max_model_len - mt
    choices = [1, 2, bs - 1, bs, bs + 1, 2 * bs, 2 * bs + 1, 3 * bs - 1, cap, cap - 1, cap + 1,
               rng.randrange(1, max(2, cap + 1)), rng.randrange(1, max(2, cap + 1)),
               cfg.max_num_batched_tokens, cfg.max_num_batched_tokens + 1, cfg.max_num_batched_tokens - 1,
               rng.randrange(1, max(2, cap + 2)), rng.randrange(1, max(2, cap // 3 + 2))]
    return max(1, rng.choice(choices))


def random_config(rng):
    bs = rng.choice([1, 2, 3, 4, 8, 16])
    max_model_len = rng.choice([8, 16, 24, 33, 64, 100])
    num_blocks = rng.randrange(max(1, max_model_len // bs // 2), max(2, 3 * max_model_len // bs + 4))
    seqs = rng.choice([1, 2, 3, 4, 8])
    mbt = rng.choice([seqs, seqs + 1, 4, 7, 16, 33, 64, max_model_len, max_model_len + 1])
    mbt = max(mbt, seqs)
    pc = rng.random() < 0.6
    cfg = SchedulerConfig(num_blocks=num_blocks, block_size=bs, max_model_len=max_model_len, vocab_size=VOCAB,
                          eos_token_ids=tuple(rng.sample(range(VOCAB), rng.choice([0, 0, 1, 3]))),
                          max_num_seqs=seqs, max_num_batched_tokens=mbt,
                          max_waiting=rng.choice([0, 1, 3, 8, 256, 256, 256]),
                          prefix_caching=pc, host_blocks=rng.choice([0, 0, 2, 6, 40]) if pc else 0,
                          policy=rng.choice(["fcfs", "priority"]))
    return cfg


def run_sched_workload(seed: int, wl: int, steps: int, verbose=False) -> dict:
    rng = random.Random(seed * 100_003 + wl)
    cfg = random_config(rng)
    slack = rng.choice([0, 0, 1])
    k = rng.choice([0, 0, 1, 2, 3])
    p_good = rng.random()
    sched = Scheduler(cfg, slack)
    model = PagedModel(cfg.block_size, ahead=bool(slack))
    reqs: dict[str, Track] = {}
    bases = [[rng.randrange(VOCAB) for _ in range(cfg.max_model_len + 2)] for _ in range(3)]
    p_arrive, p_abort, p_mid_abort, p_finish = rng.random() * 0.8, rng.random() * 0.15, rng.random() * 0.1, 0.02
    arrive_until = steps
    nid = 0
    counts = Counter()
    host_loads = 0
    started_prompt = 0
    ctx = dict(seed=seed, wl=wl, cfg=cfg, slack=slack, k=k)
    step = 0
    limit = steps + 4000
    while step < limit:
        if step >= arrive_until and not sched.has_unfinished():
            break
        # arrivals
        while step < arrive_until and rng.random() < p_arrive:
            mt = rng.choice([1, 1, 2, 3, 5, 8, 8, 16, cfg.max_model_len // 2, cfg.max_model_len - 1, cfg.max_model_len])
            n = rand_len(rng, cfg, mt)
            if rng.random() < 0.4:
                sh = rng.randrange(0, n + 1)
                ids = rng.choice(bases)[:sh] + [rng.randrange(VOCAB) for _ in range(n - sh)]
            else:
                ids = [rng.randrange(VOCAB) for _ in range(n)]
            copies = rng.choice([1, 1, 1, 2, 3])       # n > 1 choices of one prompt
            prio = rng.choice([-1, 0, 0, 2]) if cfg.policy == "priority" else 0
            params = SamplingParams(max_tokens=mt, priority=prio, ignore_eos=rng.random() < 0.3)
            for _ in range(copies):
                rid = f"r{nid}"
                nid += 1
                waiting_before = sched.num_waiting
                try:
                    sched.add_request(rid, ids, params)
                    reqs[rid] = Track(list(ids), params)
                    counts["admitted"] += 1
                    if n + mt > cfg.max_model_len:
                        raise Fail(f"admitted {rid}: prompt {n} + max_tokens {mt} > max_model_len")
                    if -(-(n + mt - 1) // cfg.block_size) > cfg.num_blocks:
                        raise Fail(f"admitted {rid} needing more blocks than the pool")
                    if waiting_before >= cfg.max_waiting:
                        raise Fail(f"admitted {rid} past max_waiting {cfg.max_waiting}")
                except AdmissionError as e:
                    counts["refused_" + e.reason] += 1
                    exp = ("too_long" if n + mt > cfg.max_model_len else
                           "kv_capacity" if -(-(n + mt - 1) // cfg.block_size) > cfg.num_blocks else
                           "queue_full" if waiting_before >= cfg.max_waiting else None)
                    if e.reason != exp or not str(e) or not e.field:
                        raise Fail(f"{rid}: refused {e.reason!r} ({e.field}), expected {exp!r}: {e}")
        # aborts (waiting, prefilling, decoding, a preempted one)
        if sched.has_unfinished() and rng.random() < p_abort:
            live = sched.live_ids()
            rid = rng.choice(live)
            state = sched.get(rid).status.name + ("/preempted" if sched.get(rid).num_preemptions else "")
            ev = sched.abort(rid)
            assert ev is not None and ev.finished and ev.finish_reason == FinishReason.ABORT
            reqs[rid].ended = "abort"
            counts["abort_" + state] += 1
            check_sched(sched, f"after abort of {rid}")
        if sched.has_unfinished() and rng.random() < p_finish:
            rid = rng.choice(sched.live_ids())
            sched.finish(rid)
            reqs[rid].ended = "stop_string"
            counts["finish_ext"] += 1
        waiting_before = {r.req_id for r in sched._waiting}
        md = k if rng.random() < 0.8 else rng.randrange(0, k + 1)
        plan = sched.schedule(max_drafts=md)
        where = f"step {step}"
        try:
            check_plan(sched, plan, md, where)
            check_sched(sched, where + " after schedule")
            started = [sched.get(r) for r in waiting_before if sched.get(r) is not None
                       and sched.get(r).status is not RequestStatus.WAITING]
            for s in started:
                for w in sched._waiting:
                    assert s.rank < w.rank, f"{where}: {s.req_id} {s.rank} started while {w.req_id} {w.rank} waits"
            for s in plan.seqs:
                if not reqs[s.req_id].started:
                    reqs[s.req_id].started = True
                    started_prompt += len(reqs[s.req_id].prompt) if sched.get(s.req_id).num_preemptions == 0 else 0
            counts["preempted"] += len(plan.preempted)
            again = set(plan.preempted) & {s.req_id for s in plan.seqs}
            counts["preempted_and_rescheduled_same_plan"] += len(again)
            host_loads += len(plan.kv_loads)
            # run
            model.copies(plan.kv_saves, plan.kv_loads)
            sampled = {}
            for s in plan.seqs:
                req = sched.get(s.req_id)
                out = model.run_seq(s, sched.pool.is_cached, req.all_ids)
                if out is not None:
                    sampled[s.req_id] = out
                    if s.num_drafts:
                        counts["verify"] += 1
            # an abort while the step runs
            if plan.seqs and rng.random() < p_mid_abort:
                rid = rng.choice([s.req_id for s in plan.seqs])
                if sched.get(rid) is not None:
                    sched.abort(rid)
                    reqs[rid].ended = "abort"
                    counts["abort_midstep"] += 1
            new_drafts = {}
            if k:
                for rid, toks in sampled.items():
                    req = sched.get(rid)
                    if req is not None:
                        new_drafts[rid] = make_drafts(rng, req.all_ids + toks, k, p_good)
            events = sched.update(plan, sampled, new_drafts)
            for ev in events:
                t = reqs[ev.req_id]
                t.out += ev.new_token_ids
                if ev.finished:
                    t.ended = ev.finish_reason
            check_sched(sched, where + " after update")
        except AssertionError as e:
            raise Fail(f"{ctx} {where}: {e}") from e
        step += 1
    else:
        raise Fail(f"{ctx}: did not drain in {limit} steps; live {sched.live_ids()} "
                   f"waiting {[(r.req_id, r.num_tokens) for r in sched._waiting]} free {sched.pool.num_free}")
    # end: everything ended, outputs right, nothing held
    try:
        assert sched.pool.num_free == sched.pool.num_blocks, "blocks leaked"
        assert not sched.pool._keeps and not sched.pool._kept, "keeps left"
        for rid, t in reqs.items():
            assert t.ended is not None, f"{rid} never ended"
            exp = expected_output(t.prompt, len(t.out))
            assert t.out == exp, f"{rid}: output {t.out} != {exp}"
            stops = set(t.params.stop_token_ids) | (set() if t.params.ignore_eos else set(cfg.eos_token_ids))
            if t.ended == FinishReason.LENGTH:
                assert len(t.out) == t.params.max_tokens and not (stops & set(t.out))
            elif t.ended == FinishReason.STOP:
                assert t.out and t.out[-1] in stops and not (stops & set(t.out[:-1]))
            assert len(t.out) <= t.params.max_tokens
        assert sched.host_loads == host_loads, (sched.host_loads, host_loads)
        assert sched.prompt_started == started_prompt, (sched.prompt_started, started_prompt)
    except AssertionError as e:
        raise Fail(f"{ctx} at the end: {e}") from e
    counts["steps"] = step
    counts["prefix_hits"] = sched.prefix_hits
    return counts


def check_plan(sched: Scheduler, plan: StepPlan, max_drafts: int, where: str):
    cfg, bs = sched.config, sched.config.block_size
    assert plan.num_tokens <= cfg.max_num_batched_tokens, f"{where}: {plan.num_tokens} tokens > budget"
    assert len(plan.seqs) <= cfg.max_num_seqs
    assert len({s.req_id for s in plan.seqs}) == len(plan.seqs), f"{where}: a request twice in a plan"
    written = []
    for s in plan.seqs:
        req = sched.get(s.req_id)
        assert req is not None and req.status in (RequestStatus.PREFILLING, RequestStatus.DECODING), where
        assert s.req_id not in plan.preempted or True
        assert s.start_pos == req.num_computed_tokens
        assert tuple(req.block_ids) == s.block_ids, f"{where}: {s.req_id} plan table != request's"
        assert s.num_drafts <= max_drafts
        assert s.end_pos - s.num_drafts <= req.num_tokens
        assert s.end_pos <= cfg.max_model_len, f"{where}: {s.req_id} writes position {s.end_pos - 1} past max_model_len"
        assert len(s.block_ids) >= sched.pool.blocks_needed(s.end_pos)
        assert len(s.block_ids) <= sched.pool.blocks_needed(s.end_pos + sched.slack), \
            f"{where}: {s.req_id} {len(s.block_ids)} blocks for end {s.end_pos}"
        assert s.sample == (s.end_pos - s.num_drafts == req.num_tokens)
        if s.num_drafts:
            assert s.sample and len(req.output_ids) + s.num_drafts + 1 <= req.params.max_tokens
        written += s.block_ids[s.start_pos // bs: -(-s.end_pos // bs)]
        for b in s.block_ids[s.start_pos // bs:]:
            assert sched.pool._refs[b] == 1, f"{where}: {s.req_id} writes shared block {b}"
    assert len(written) == len(set(written)), f"{where}: two seqs write one block"
    for rid in plan.preempted:
        r = sched.get(rid)
        assert r is None or r.status is RequestStatus.WAITING or rid in {s.req_id for s in plan.seqs}
    shape = plan_step_shapes(1, {0: plan.num_tokens}, sched.num_running)
    assert shape.total_rows >= plan.num_tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["sched", "engine"], default="sched")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workloads", type=int, default=100)
    ap.add_argument("--steps", type=int, default=150, help="steps with arrivals per workload (then drain)")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--keep-going", action="store_true")
    args = ap.parse_args()
    total = Counter()
    fails = 0
    run = run_sched_workload
    if args.mode == "engine":
        from tests.fuzz.engine import run_engine_workload
        run = run_engine_workload
    for wl in range(args.start, args.start + args.workloads):
        try:
            total += run(args.seed, wl, args.steps)
        except Fail as e:
            fails += 1
            print(f"FAIL seed={args.seed} workload={wl}: {e}")
            print(f"  replay: --mode {args.mode} --seed {args.seed} --start {wl} --workloads 1 --steps {args.steps}")
            if not args.keep_going:
                sys.exit(1)
        except Exception as e:      # noqa: BLE001 — an exception inside the scheduler
            fails += 1
            print(f"EXCEPTION seed={args.seed} workload={wl}: {type(e).__name__}: {e}")
            traceback.print_exc()
            print(f"  replay: --mode {args.mode} --seed {args.seed} --start {wl} --workloads 1 --steps {args.steps}")
            if not args.keep_going:
                sys.exit(1)
    print(f"{args.mode} seed={args.seed} workloads={args.workloads} fails={fails}")
    print(dict(sorted(total.items())))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
