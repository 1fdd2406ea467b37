"""Disaggregated prefill's holds on a decode replica's cached prefix (``cluster/disagg.py``'s ``hold_prefix`` /
``HeldPrefix``, ``BlockPool.pin``) and the host copies of adopted blocks, against a fake executor (``ShadowKV``, written
by session 51's review) that keeps, per rank, what each device block and host slot holds — the prefix each position's
KV belongs to — runs a step's copies in the worker's order (saves, loads, forward, then imports) and checks that every
forward reads the KV of its own prefix. Requests are released as the Coordinator does: the device blocks once the
engine has the request (``admitted``), the host copies at its first token (``release``)."""

from __future__ import annotations

import random
import threading

import numpy as np

from cluster.disagg import KVBundle, hold_prefix
from scheduler import BlockPool, SamplingParams
from scheduler.block_pool import ROOT
from tests.unit.test_prefix_cache import _check_idle_lists

BS = 4
_ids: dict[tuple, int] = {}
_of: list[tuple] = []


def cid(prefix) -> int:
    """A content id for the KV of the last position of ``prefix`` (a position's KV depends on its whole prefix)."""
    key = tuple(prefix)
    if key not in _ids:
        _ids[key] = len(_of) + 1
        _of.append(key)
    return _ids[key]


GARBAGE = -1


class ShadowKV:
    """A RecordingExecutor that tracks KV contents and checks what every forward reads. Imported rows land as a
    worker's ``ImportWriter`` lands them: after the work of the step after the one that sent them, where it says
    ``kv_land`` (else never); a failed step garbles what it wrote, and its ranks keep its imports on their way (as a
    rank that got through would): only the engine's ``kv_land`` keeps them out."""

    def __init__(self, num_ranks: int, blocks: int, host: int):
        self.dev = [[[0] * BS for _ in range(blocks)] for _ in range(num_ranks)]
        self.host = [[[0] * BS for _ in range(max(host, 1))] for _ in range(num_ranks)]
        self.ids = [{} for _ in range(num_ranks)]
        self.sent = [() for _ in range(num_ranks)]
        self.steps, self.fail_next, self.errors = [], False, []

    def execute(self, steps):
        from workers.runner import StepResult

        self.steps.append(steps)
        if self.fail_next:
            self.fail_next = False
            for r, st in enumerate(steps):       # what the failed step wrote is unknown
                for b, slot in st.kv_saves:
                    self.host[r][slot] = [GARBAGE] * BS
                for blocks, _ in (*st.kv_imports, *(self.sent[r] if st.kv_land else ())):
                    for b in blocks:
                        self.dev[r][b] = [GARBAGE] * BS
                for _, b in st.kv_loads:
                    self.dev[r][b] = [GARBAGE] * BS
                self.sent[r] = st.kv_imports
            raise RuntimeError("injected step failure")
        results = []
        for r, st in enumerate(steps):
            dev, host, ids = self.dev[r], self.host[r], self.ids[r]
            for rid in st.finished:
                ids.pop(rid, None)
            for nr in st.new_requests:
                ids[nr.req_id] = [*nr.prompt_ids, *nr.output_ids]
            saved = {slot: list(dev[b]) for b, slot in st.kv_saves}      # gathered before anything else
            for slot, v in saved.items():
                host[slot] = v
            for slot, b in st.kv_loads:
                dev[b] = list(host[slot])
            sampled = {}
            for s in st.seqs:
                seq_ids = ids[s.req_id]
                assert list(seq_ids[s.start_pos:s.start_pos + len(s.token_ids)]) == list(s.token_ids), s
                for p in range(s.start_pos):
                    got = dev[s.block_ids[p // BS]][p % BS]
                    if got != cid(seq_ids[:p + 1]):
                        self.errors.append((s.req_id, p, got, cid(seq_ids[:p + 1])))
                for p in range(s.start_pos, s.start_pos + len(s.token_ids)):
                    dev[s.block_ids[p // BS]][p % BS] = cid(seq_ids[:p + 1])
                if s.sample:
                    tok = 1 + (sum(seq_ids) * 7 + len(seq_ids)) % 997
                    sampled[s.req_id] = [tok]
                    seq_ids.append(tok)
            for blocks, rows in self.sent[r] if st.kv_land else ():      # after the step's work: the last step's
                vals = rows[0].view(np.uint32).reshape(-1)
                for i, b in enumerate(blocks):
                    dev[b] = [int(v) for v in vals[i * BS:(i + 1) * BS]]
            self.sent[r] = st.kv_imports
            results.append(StepResult(st.step_id, sampled))
        return results

    def recover(self):
        pass


def engine(num_ranks=1, blocks=24, host=12, seqs=4, budget=64):
    from cluster.engine import Engine
    from scheduler import SchedulerConfig

    cfg = SchedulerConfig(num_blocks=blocks, block_size=BS, max_model_len=200, vocab_size=1000, eos_token_ids=(),
                          max_num_seqs=seqs, max_num_batched_tokens=budget, prefix_caching=True, host_blocks=host)
    ex = ShadowKV(num_ranks, blocks, host)
    return Engine(ex, cfg, num_ranks=num_ranks, kv_layout=((4, "uint8"),)), ex


def bundle_of(prompt, start=0) -> KVBundle | None:
    """What a prefill replica sends: the prompt's whole blocks before its last token, rows from ``start``."""
    n = (len(prompt) - 1) // BS * BS
    if n <= start:
        return None
    rows = np.array([cid(prompt[:p + 1]) for p in range(start, n)], dtype=np.uint32).view(np.uint8).reshape(-1, 4)
    return KVBundle(tuple(prompt[:n + 1]), ((4, "uint8"),), False, (rows,), start)


def run_all(e, limit=500):
    for _ in range(limit):
        if not e.has_work():
            return
        e.step()
    raise AssertionError("the engine did not drain")


def fill_host_only(e, prompt, filler_seed=0):
    """Run ``prompt`` (1 token), then a filler that takes every device block: ``prompt``'s blocks are then held only
    in host memory (sized to hold both: then full)."""
    e.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True), "first")
    run_all(e)
    pool = e.scheduler.pool
    rng = random.Random(filler_seed)
    f = [rng.randrange(500, 999) for _ in range(pool.num_blocks * BS - 1)]
    e.add_request(f, SamplingParams(max_tokens=1, ignore_eos=True), "fill")
    run_all(e)
    assert [pool.block(n) for n in pool.match(prompt)] == [None] * ((len(prompt) - 1) // BS)
    return pool



def first_token(e, rid: str, held) -> list[int]:
    """Run the engine dry; ``held`` is released at ``rid``'s first token (as ``Coordinator.generate`` does). Returns
    the positions ``rid``'s rows started at, step by step."""
    for _ in range(500):
        if not e.has_work():
            break
        for ev in e.step():
            if ev.req_id == rid and (ev.token_ids or ev.finished):
                held.release()
    ex = e.executor
    return [s.start_pos for st in ex.steps for s in st[0].seqs if s.req_id == rid]


def test_a_host_held_prefix_stays_pinned_until_its_request_has_loaded_it():
    """A prefix held only in host memory, pinned while the rest of its prompt arrives a block a step (a long import):
    the import's own host copies (and the filler's, before) take other slots, the request loads the prefix and
    computes only its last token. (Released at ``add_request``, as first built, the prefix was evicted and the whole
    prompt computed: the review's F2.)"""
    e, ex = engine(blocks=24, host=3 + 23)
    head = list(range(1, 13))                      # 3 blocks
    pool = fill_host_only(e, head + [900])
    nxt = head + [900] + list(range(100, 140))
    held = e.hold_prefix(nxt, None)
    assert held.start == 3 * BS and pool._pins
    e._imports[0].budget = BS * 4                   # one block a step
    e.add_request(nxt, SamplingParams(max_tokens=1, ignore_eos=True), "d", kv=bundle_of(nxt, held.start))
    held.admitted()
    loads = e.scheduler.host_loads
    started = first_token(e, "d", held)
    assert not ex.errors and e.scheduler.host_loads - loads == 3 and started[0] == len(nxt) - 1, started
    assert e.num_free_blocks() == 24 and not pool._pins


def test_a_host_held_prefix_stays_pinned_while_its_request_waits_behind_another_prompt():
    e, ex = engine(blocks=40, host=3 + 39)
    head = list(range(1, 13))
    pool = fill_host_only(e, head + [900])
    nxt = head + [900] + list(range(100, 120))
    held = e.hold_prefix(nxt, None)
    other = [700 + i % 250 for i in range(80)]     # a 64-token chunk fills the step: 16 blocks, 16 host copies
    e.add_request(other, SamplingParams(max_tokens=1, ignore_eos=True), "o")
    e.add_request(nxt, SamplingParams(max_tokens=1, ignore_eos=True), "d", kv=bundle_of(nxt, held.start))
    held.admitted()
    loads = e.scheduler.host_loads
    started = first_token(e, "d", held)
    assert not ex.errors and e.scheduler.host_loads - loads == 3 and started[0] == len(nxt) - 1, started
    assert not pool._pins


def test_a_host_held_prefix_stays_pinned_after_admission_while_other_prompts_fill_the_host_tier():
    """Admitted behind seven prompts whose blocks, cached as they finish, give the host tier more copies than it has
    slots besides the prefix's: pinned until the request's first token, the prefix is not among those they evict (let
    go at admission, even as the host's most recently used, it was, and the request computed its whole prompt). The
    transferred blocks are kept, not held, meanwhile: evicted after every other cached block, tail first — here the
    last two of five go to the others' prompts, and are computed again (five prompts evicted none since imports land
    a step later, session 54)."""
    e, ex = engine(blocks=24, host=3 + 23, budget=64)
    head = list(range(1, 13))
    pool = fill_host_only(e, head + [900])
    nxt = head + [900] + list(range(100, 120))
    held = e.hold_prefix(nxt, None)
    for i in range(7):                              # 7 blocks cached each: 49 host copies
        e.add_request([300 + 20 * i + j for j in range(29)], SamplingParams(max_tokens=1, ignore_eos=True), f"o{i}")
    e.add_request(nxt, SamplingParams(max_tokens=1, ignore_eos=True), "d", kv=bundle_of(nxt, held.start))
    held.admitted()
    loads = e.scheduler.host_loads
    started = first_token(e, "d", held)
    assert not ex.errors and started[0] == 6 * BS and e.scheduler.host_loads - loads == 3, started
    assert not pool._pins and not pool._keeps and e.stats["kv_imported_tokens"] == 5 * BS


def test_a_tight_pool_holds_only_a_prefix_with_host_copies():
    """Where holding its idle device blocks would leave less than a quarter of the pool free, a prefix is held only as
    far as its blocks have host copies (pinned: no device block taken); without a host tier, not at all."""
    for host in (24, 0):
        e, _ = engine(blocks=24, host=host)
        head = list(range(1, 41))                  # 10 blocks cached, idle on the device
        e.add_request(head, SamplingParams(max_tokens=1, ignore_eos=True), "a")
        run_all(e)
        pool = e.scheduler.pool
        e.add_request([500 + i for i in range(40)], SamplingParams(max_tokens=30, ignore_eos=True), "b")
        e.step()                                   # b holds 10 blocks: 14 free, 9 of them a's prefix (its 10th
        held = e.hold_prefix(head + [1], None)     # block's key holds a's sampled token)
        assert held.start == (9 * BS if host else 0) and pool.num_free == 14
        assert len(pool._pins) == (9 if host else 0)
        held.release()
        assert not pool._pins
        e.abort("b")
        run_all(e)


def test_a_stale_release_after_a_cleared_cache_leaves_a_newer_hold_pinned():
    """Pins are counted by node (never reused), not by host slot: after a failure cleared the cache, an old request's
    release does not unpin the slot a newer hold pinned (the review's F3)."""
    pool = BlockPool(4, 2, host_blocks=2)
    lock = threading.Lock()

    def host_only(ids):
        b = pool.allocate(2)
        parent = ROOT
        for i, blk in enumerate(b):
            parent = pool.register(blk, parent, tuple(ids[i * 2:i * 2 + 3]))
        pool.drain()
        pool.free(b)
        pool.free(pool.allocate(4))             # evicted from the device: the host holds them

    a = [1, 2, 3, 4, 5]
    host_only(a)
    with lock:
        old = hold_prefix([pool], a, None, lock)
    pool.clear_cache()                           # a failed step: every prefix forgotten, the pins with them
    b = [7, 8, 9, 10, 11]
    host_only(b)                                 # the same slot numbers, now b's
    with lock:
        new = hold_prefix([pool], b, None, lock)
    assert new.start == 4 and pool._pins
    old.release()
    c = pool.allocate(2)                         # another prompt's host copies must pass over b's pinned slots
    pool.register(c[0], ROOT, (20, 21, 22))
    pool.register(c[1], ROOT, (23, 24, 25))
    assert len(pool.match(b)) == 2 and pool.drain() == ((), ())      # (every slot pinned: no copy made)
    new.release()
    assert not pool._pins


def _random_flow(seed: int, num_ranks: int, failures: bool, steps: int = 400) -> None:
    """Requests arrive, hold their cached prefix, get their rest as a bundle a few steps later (rows from the held
    position), are aborted (their ids taken again by later requests), and steps fail (the cache cleared): every forward
    reads its own prefix's KV, after every step only waiting requests keep blocks (``BlockPool.keep``), and at the end
    no block is held, kept or pinned."""
    rng = random.Random(seed)
    e, ex = engine(num_ranks=num_ranks, blocks=rng.choice([16, 24, 32]), host=rng.choice([4, 8, 16]),
                   seqs=rng.choice([2, 4]), budget=rng.choice([16, 32, 64]))
    for imp in e._imports:
        imp.budget = BS * 4 * rng.choice([1, 2, 8, 100])
    convs = [[rng.randrange(1, 999) for _ in range(rng.randrange(5, 30))] for _ in range(4)]
    asking, holds, live, ended, n = [], {}, set(), [], 0        # asking: [steps left, prompt, held, rid]
    for _ in range(steps):
        r = rng.random()
        if r < 0.25 and len(asking) < 4:            # a request arrives: hold its prefix, ask a "prefill replica"
            c = rng.randrange(len(convs))
            prompt = convs[c] + [rng.randrange(1, 999) for _ in range(rng.randrange(1, 25))]
            if rng.random() < 0.5:
                convs[c] = prompt
            prompt = prompt[:e.config.num_blocks * BS // 2]
            rid = ended.pop(rng.randrange(len(ended))) if ended and rng.random() < 0.3 else f"r{n}"
            asking.append([rng.randrange(0, 4), prompt, e.hold_prefix(prompt, None), rid])
            n += 1
        elif r < 0.3 and live:                      # a client goes away
            rid = rng.choice(sorted(live))
            e.abort(rid)
            live.discard(rid)
            ended.append(rid)
        elif r < 0.33 and failures:
            ex.fail_next = True
        for item in list(asking):
            item[0] -= 1
            if item[0] < 0:
                asking.remove(item)
                _, prompt, held, rid = item
                try:
                    e.add_request(prompt, SamplingParams(max_tokens=rng.randrange(1, 8), ignore_eos=True), rid,
                                  kv=bundle_of(prompt, held.start))
                    live.add(rid)
                    holds[rid] = held
                except Exception:                   # noqa: BLE001 (refused: the queue is full)
                    held.release()
                    ended.append(rid)
                held.admitted()
        try:
            events = e.step()
        except Exception:                            # noqa: BLE001 (an injected failure surfaces as events)
            events = []
        for ev in events:
            if ev.token_ids or ev.finished:
                if (held := holds.pop(ev.req_id, None)) is not None:
                    held.release()
            if ev.finished and ev.req_id in live:
                live.discard(ev.req_id)
                ended.append(ev.req_id)
        for rid in [r for r in holds if r not in live]:
            holds.pop(rid).release()
        for sched in e.schedulers:
            _check_keeps(sched)
    for item in asking:
        item[2].release()
    for rid in list(live):
        e.abort(rid)
    run_all(e, 2000)
    for held in holds.values():
        held.release()
    assert not ex.errors, ex.errors[:5]
    for s in e.schedulers:
        assert s.pool.num_free == s.pool.num_blocks and not s.pool._pins and not s.pool._keeps, \
            (s.pool.num_free, s.pool._pins, s.pool._keeps)


def _check_keeps(sched) -> None:
    """The pool's idle lists are sound, and its keeps are exactly the waiting requests'."""
    _check_idle_lists(sched.pool)
    want: dict[int, int] = {}
    for rid in sched.live_ids():
        req = sched.get(rid)
        assert not req.kept or req in sched.waiting(), rid
        for n in req.kept:
            want[n] = want.get(n, 0) + 1
    got = {n: sum(orders.values()) for n, orders in sched.pool._keeps.items()}
    assert {n: c for n, c in want.items() if n in sched.pool._nodes} == got, (want, got)


def test_random_disaggregated_flows_read_only_their_own_kv():
    for seed in range(40):
        _random_flow(seed, 1, failures=False)


def test_random_flows_on_two_ranks_with_failed_steps_read_only_their_own_kv():
    for seed in range(40):
        _random_flow(seed, 2, failures=True)


def test_the_coordinator_lets_go_of_the_pins_at_the_first_token_not_at_admission():
    """``Coordinator.generate``'s order: the held prefix's device blocks go once the engine has the request
    (``AsyncEngine.generate``'s ``added``), its host copies at the first token (here a stand-in runs the engine's
    steps in the stream)."""
    import asyncio
    import types

    from cluster.coordinator import Coordinator
    from cluster.disagg import PrefillResult
    from tests.unit.test_disagg import _decode_replica

    e, ex = engine(blocks=24, host=3 + 23)
    head = list(range(1, 13))
    pool = fill_host_only(e, head + [900])
    nxt, pinned = head + [900] + list(range(100, 140)), []

    def remote(ids, params, req_id, start):
        class Stream:
            items = [PrefillResult(bundle=bundle_of(ids, start)), None]

            async def __anext__(self):
                return self.items.pop()

            def cancel(self):
                pass
        return Stream()

    async def generate(ids, params, rid, kv=None, added=None):
        e.add_request(ids, params, rid, kv=kv)
        added()
        pinned.append(len(pool._pins))
        while e.has_work():
            for ev in e.step():
                if ev.req_id == rid:
                    pinned.append(len(pool._pins))
                    yield ev

    dec = _decode_replica(e, remote)
    dec.aengine, dec.cfg, dec._stats_log, dec.replica_id = types.SimpleNamespace(generate=generate), \
        types.SimpleNamespace(log_stats_interval_s=0), None, "r"

    async def main():
        return [t async for ev in Coordinator.generate(dec, nxt, SamplingParams(max_tokens=3, ignore_eos=True), "d")
                for t in ev.token_ids]
    assert len(asyncio.run(main())) == 3 and not ex.errors
    assert pinned[:2] == [3, 3] and pinned[-1] == 0, pinned      # (the first token's event is seen before the release)
    started = [s.start_pos for st in ex.steps for s in st[0].seqs if s.req_id == "d"]
    assert started[0] == len(nxt) - 1 and e.num_free_blocks() == 24 and not pool._pins
