"""Prefix caching: the block pool's cached prefixes (exact keys, the next token, idle blocks and their eviction) and the
scheduler over a fake paged-KV model that records, for every position, the token after it (as the MTP layer's KV
does): a shared block written twice, a stale block, or a cached block whose next token differs shows in the output."""

from __future__ import annotations

import random

import pytest

from cluster.engine import Engine
from scheduler import BlockPool, SamplingParams, Scheduler, SchedulerConfig, StepPlan
from scheduler.block_pool import ROOT
from tests.conftest import RecordingExecutor
from tests.unit.test_scheduler import VOCAB, expected_output, next_token, prompt


def _key(ids: list[int], b: int, bs: int) -> tuple[int, ...]:
    return tuple(ids[b * bs:(b + 1) * bs + 1])


def _register(pool: BlockPool, blocks: list[int], ids: list[int]) -> list[int]:
    node, nodes = ROOT, []
    for i, b in enumerate(blocks):
        node = pool.register(b, node, _key(ids, i, pool.block_size))
        nodes.append(node)
    return nodes


# ---- the block pool -----------------------------------------------------------------------


def _blocks(pool: BlockPool, ids: list[int]) -> list[int | None]:
    """The device blocks of ``ids``'s cached prefix (None where only the host holds one)."""
    return [pool.block(n) for n in pool.match(ids)]


def test_match_walks_exact_chains_and_needs_the_next_token():
    pool = BlockPool(8, 4)
    ids = list(range(10, 23))                       # 13 tokens: 3 full blocks, the token after each known
    blocks = pool.allocate(4)
    nodes = _register(pool, blocks[:3], ids)
    assert pool.match(ids) == nodes and _blocks(pool, ids) == blocks[:3]
    assert _blocks(pool, ids[:12]) == blocks[:2]    # the token after block 2 is not there: it cannot be reused
    assert _blocks(pool, ids[:13] + [99]) == blocks[:3]
    assert _blocks(pool, ids[:8] + [99] + ids[9:]) == blocks[:1]     # block 1's next token differs
    assert _blocks(pool, ids[:5] + [99] + ids[6:]) == blocks[:1]     # inside block 1
    assert pool.match([99] + ids[1:]) == []
    assert pool.match(ids[4:]) == []                # the same tokens at other positions are another prefix
    assert pool.num_cached == 3 and pool.drain() == ((), ())        # no host tier: nothing to copy


def test_released_cached_blocks_idle_counted_free_and_are_evicted_tail_first():
    pool = BlockPool(4, 2)
    ids = [5, 6, 7, 8, 9, 1, 2]
    blocks = pool.allocate(4)
    _register(pool, blocks[:3], ids)
    pool.free(blocks)
    assert pool.num_free == 4 and pool.num_used == 0 and pool.num_cached == 3
    assert _blocks(pool, ids) == blocks[:3]
    got = pool.allocate(1)                          # the never-cached block goes first
    assert got == [blocks[3]] and _blocks(pool, ids) == blocks[:3]
    got = pool.allocate(1)                          # then the least recently released: the chain's tail
    assert got == [blocks[2]] and _blocks(pool, ids) == blocks[:2] and pool.num_cached == 2
    hits = pool.match(ids)
    assert pool.cost(hits) == 2
    assert pool.take(hits) == blocks[:2]            # held again: no longer free, no longer evictable
    assert pool.num_free == 0 and pool.cost(hits) == 0
    pool.take(hits[:1])                             # a second holder
    pool.free(blocks[:1])
    assert pool.num_free == 0
    pool.free(blocks[:2])
    assert pool.num_free == 2 and _blocks(pool, ids) == blocks[:2]
    with pytest.raises(AssertionError, match="double free"):
        pool.free(blocks[:1])


def _check_idle_lists(pool: BlockPool) -> None:
    """The pool's idle blocks: each in one list (kept or not, as its node's keeps say — in the first keeper's order),
    held by no one, cached."""
    assert not set(pool._idle) & set(pool._kept)
    for b in [*pool._idle, *pool._kept]:
        assert pool._refs[b] == 0 and pool.is_cached(b), b
        n = pool.node(b)
        assert (b in pool._kept) == (n in pool._keeps), b
        assert b not in pool._kept or pool._kept[b] == min(pool._keeps[n]), b
    assert all(all(c > 0 for c in orders.values()) and orders for orders in pool._keeps.values())
    assert pool.num_free == len(pool._free_ids) + len(pool._idle) + len(pool._kept)


def test_a_kept_prefix_is_evicted_after_every_other_cached_block_and_stays_counted_free():
    """``keep`` (a waiting request's prefix, with its place in the scheduler's order): kept blocks still count free,
    go only once no other cached block is left — the last waiter's deepest first; ``unkeep`` makes a block no one keeps
    an ordinary idle one (the most recently released); a cleared cache forgets every keep."""
    pool = BlockPool(8, 2)
    a, b = [1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5]              # 3 and 2 full blocks
    blocks = pool.allocate(5)
    na, _ = _register(pool, blocks[:3], a), _register(pool, blocks[3:], b)
    pool.free(blocks)
    pool.keep(na, (0, 1))                               # a later waiter keeps all of a
    pool.keep(na[:1], (0, 0))                           # an earlier one its head
    assert pool.num_free == 8 and pool.num_kept == 3 and pool.can_allocate(8)
    _check_idle_lists(pool)
    pool.allocate(5)                                    # 3 never cached, then b's two — a's are kept
    assert _blocks(pool, a) == blocks[:3] and pool.match(b) == []
    pool.allocate(1)                                    # then a kept one: the later waiter's deepest
    assert _blocks(pool, a) == blocks[:2] and pool.num_kept == 2
    pool.unkeep(na, (0, 1))                             # the head is still kept: block 1 idles
    assert pool.num_kept == 1 and pool.num_free == 2 and pool._kept[blocks[0]] == (0, 0, 0)
    _check_idle_lists(pool)
    pool.allocate(1)
    assert _blocks(pool, a) == blocks[:1]
    pool.unkeep(na[:1], (0, 0))
    assert pool.num_kept == 0 and not pool._keeps
    pool.keep(na[:1], (0, 0))
    pool.clear_cache()
    assert pool.num_free == 1 and not pool._keeps and not pool._kept
    pool.unkeep(na[:1], (0, 0))                         # a stale release after the clear: nothing to do
    assert pool.num_free == 1


def test_kept_blocks_go_in_the_scheduler_order_from_the_back_whenever_they_were_kept():
    """Two waiters keep their prompts' blocks: the one behind in the queue loses its deepest first, though it kept them
    first; a head a running request still held when it was kept (a shared one) goes after its waiter's tail, and a
    node kept by two waiters ranks as the first of them has it."""
    pool = BlockPool(12, 2)
    x, y = [1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4, 3]
    bx, by = pool.allocate(3), pool.allocate(3)
    nx, ny = _register(pool, bx, x), _register(pool, by, y)
    pool.free(bx[1:] + by)                              # x's head is still held
    pool.keep(ny, (0, 9))                               # y: behind x in the queue, kept first
    pool.keep(nx, (0, 4))
    pool.free(bx[:1])                                   # x's head idles now: kept, as x's first block
    assert pool.num_kept == 6
    _check_idle_lists(pool)
    pool.allocate(6 + 3)                                # the never-cached 6, then y's three, tail first
    assert _blocks(pool, y) == [] and _blocks(pool, x) == bx
    pool.allocate(1)
    assert _blocks(pool, x) == bx[:2]                   # x's tail, not its head
    pool.keep(nx[:1], (0, 2))                           # a third waiter, ahead of x, shares the head
    pool.unkeep(nx, (0, 4))
    assert pool._kept[bx[0]] == (0, 2, 0) and pool.num_kept == 1 and pool.num_free == 2
    _check_idle_lists(pool)


def test_a_kept_block_released_by_its_holder_idles_kept_and_a_taken_one_leaves_the_kept_list():
    pool = BlockPool(6, 2)
    ids = [1, 2, 3, 4, 5]
    blocks = pool.allocate(2)
    nodes = _register(pool, blocks, ids)
    pool.keep(nodes, (0, 0))                            # held: nothing moves yet
    assert pool.num_kept == 0
    pool.free(blocks)
    assert pool.num_kept == 2
    _check_idle_lists(pool)
    assert pool.take(pool.match(ids)) == blocks and pool.num_kept == 0 and pool.num_free == 4
    pool.free(blocks)
    pool.unkeep(nodes, (0, 0))
    assert pool.num_kept == 0 and pool.num_free == 6 and not pool._keeps
    _check_idle_lists(pool)


def test_a_key_cached_twice_keeps_the_first_block_and_clear_forgets_everything():
    pool = BlockPool(6, 2)
    ids = [3, 4, 5, 6, 7]
    first, second = pool.allocate(2), pool.allocate(2)
    nodes = _register(pool, first, ids)
    assert _register(pool, second, ids) == nodes    # the same nodes: the duplicate stays uncached
    assert pool.num_cached == 2
    pool.free(second)
    assert pool.num_free == 4 and _blocks(pool, ids) == first
    pool.clear_cache()                              # held blocks stay held, their prefix forgotten
    assert pool.match(ids) == [] and pool.num_cached == 0 and pool.num_free == 4
    pool.free(first)
    assert pool.num_free == 6


def test_the_host_tier_keeps_evicted_prefixes_and_loads_them_back():
    """Registration copies a block to the host (write-through); a device eviction leaves the node on the host; taking
    it allocates a fresh device block loaded from its slot; the host's own LRU forgets nodes no tier holds."""
    pool = BlockPool(3, 2, host_blocks=2)
    ids = [5, 6, 7, 8, 9]
    blocks = pool.allocate(3)
    nodes = _register(pool, blocks[:2], ids)
    saves, loads = pool.drain()
    assert saves == ((blocks[0], 0), (blocks[1], 1)) and loads == () and pool.drain() == ((), ())
    pool.free(blocks)
    pool.allocate(3)                                # evicts both cached blocks from the device
    assert pool.num_cached == 0 and pool.num_host_cached == 2 and _blocks(pool, ids) == [None, None]
    assert pool.cost(nodes) == 2 and not pool.can_allocate(pool.cost(nodes))
    pool.free([0, 1, 2])
    got = pool.take(nodes)
    assert pool.drain() == ((), ((0, got[0]), (1, got[1])))       # host slot → device block, in the prefix's order
    assert _blocks(pool, ids) == got and pool.num_cached == 2 and pool.num_free == 1
    other = [1, 2, 3, 4, 9]                         # a third host copy evicts the least recently used slot
    b = pool.allocate(1)
    pool.register(b[0], ROOT, tuple(other[:3]))
    assert pool.drain()[0] == ((b[0], 0),)          # slot 0 (ids' first block) was the least recently used
    assert _blocks(pool, ids) == got                # its device copy still holds the node
    pool.free(got)
    pool.free(b)
    pool.allocate(3)                                # device evictions: ids' first block is now in no tier
    assert pool.match(ids) == [] and pool.num_host_cached == 2
    pool.clear_cache()
    assert pool.num_host_cached == 0 and pool.match(other) == []


def test_a_host_slot_taken_again_in_one_plan_is_saved_once_with_its_last_block():
    """A host tier smaller than one step's registrations hands its LRU slot out again: only the last save stays (two
    saves to one slot in one copy would leave either block's rows there)."""
    pool = BlockPool(8, 2, host_blocks=1)
    ids = list(range(10, 17))
    blocks = pool.allocate(3)
    nodes = _register(pool, blocks, ids)
    assert pool.drain() == (((blocks[2], 0),), ()) and pool.num_host_cached == 1
    pool.free(blocks)
    pool.allocate(8)                                # the device evicts all three: the first two are gone
    assert pool.match(ids) == [] and pool.num_host_cached == 1 and nodes[2] not in pool.match(ids)


def test_a_block_registered_where_only_the_host_held_its_key_becomes_its_device_copy():
    pool = BlockPool(2, 2, host_blocks=2)
    ids = [5, 6, 7]
    b = pool.allocate(1)
    n = pool.register(b[0], ROOT, tuple(ids))
    pool.free(b)
    pool.allocate(2)                                # evicted from the device
    pool.free([0, 1])
    c = pool.allocate(1)                            # computed again by a request that did not look it up
    assert pool.register(c[0], ROOT, tuple(ids)) == n and pool.block(n) == c[0]
    assert pool.drain() == (((b[0], 0),), ())       # no second host copy


def test_a_pinned_host_copy_is_not_evicted_and_a_tier_all_pinned_copies_nothing():
    """``pin``: the host's LRU passes over pinned slots (the next unpinned one goes); with every slot pinned a new
    block gets no host copy (its device eviction forgets it); ``unpin`` counts holds, and a cleared cache drops them."""
    pool = BlockPool(6, 2, host_blocks=2)
    ids, other, third = [5, 6, 7, 8, 9], [1, 2, 3], [4, 4, 4]
    blocks = pool.allocate(2)
    nodes = _register(pool, blocks, ids)
    pool.drain()
    pool.free(blocks)
    pool.allocate(6)                                # both evicted from the device: only the host holds them
    pool.free(list(range(6)))
    slots = pool.pin(nodes[:1]) + pool.pin(nodes[:1])   # ids' first block (its LRU slot), held twice
    b = pool.allocate(1)
    pool.register(b[0], ROOT, tuple(other))          # takes the unpinned slot (ids' second block's)
    assert pool.drain()[0] == ((b[0], 1),) and _blocks(pool, ids) == [None]
    pin2 = pool.pin(pool.match(other))
    c = pool.allocate(1)
    pool.register(c[0], ROOT, tuple(third))          # every slot pinned: no host copy
    assert pool.drain() == ((), ()) and pool.num_host_cached == 2
    pool.free(b + c)
    pool.allocate(6)                                 # evicted from the device: third is gone, the pinned ones stay
    pool.free(list(range(6)))
    assert pool.match(third) == [] and _blocks(pool, ids) == [None] and _blocks(pool, other) == [None]
    pool.unpin(slots[:1])
    pool.unpin(pin2)
    d = pool.allocate(1)
    pool.register(d[0], ROOT, tuple(third))          # ids' slot is still pinned once: other's goes
    assert pool.drain()[0] == ((d[0], 1),) and _blocks(pool, ids) == [None] and pool.match(other) == []
    pool.clear_cache()
    pool.unpin(slots[1:])                            # (a hold the cleared cache dropped)
    assert not pool._pins


def test_host_kv_moves_whole_blocks_of_every_layer():
    """HostKV: a save then a load round-trips every cache tensor's block (the MTP layer's and the indexer's too); a load
    reading a slot the save still holds back (written into place at the next copy) gets it."""
    import torch

    from cluster.config import DEFAULT_MODEL
    from models.cache import HostKV, KVCache
    from models.config import ModelConfig

    cfg = ModelConfig.from_json(f"{DEFAULT_MODEL}/config.json")
    cache = KVCache(cfg, 8 * 4, torch.float32)
    for t in (*cache.kv, *(t for t in cache.index_k if t is not None)):
        t.copy_(torch.randn_like(t))
    before = [t.clone() for t in cache.kv] + [t.clone() for t in cache.index_k if t is not None]
    host = HostKV(cache, 4, 4)
    assert len(host.tensors) == len(before) == cfg.num_cache_layers + sum(map(cfg.has_indexer,
                                                                             range(cfg.num_cache_layers)))
    host.save([(5, 2), (1, 0)])                     # device blocks 5 and 1 → host blocks 2 and 0
    host.load([(2, 3), (0, 6)])                     # and back into blocks 3 and 6 (the save not yet in place)
    for (dev, _), old in zip(host.tensors, before):
        assert torch.equal(dev[12:16], old[20:24]) and torch.equal(dev[24:28], old[4:8])
        assert torch.equal(dev[:12], old[:12]) and torch.equal(dev[16:24], old[16:24])   # nothing else written


# ---- the scheduler over a fake model ----------------------------------------------------


class NextTokenModel:
    """The scheduler tests' fake model, also keeping with every position the token after it (the last fed row's is the
    sampled token), as the MTP layer's cache does. Writing a cached block, or reading a position whose kept next
    token is not the context's, fails. A plan's host copies run first, as the runner's do: saves, then loads."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.bs = sched.config.block_size
        self.kv: dict[int, int] = {}
        self.after: dict[int, int] = {}
        self.host: dict[int, list[tuple]] = {}      # host slot -> its block's (kv, after) per offset
        self.loaded = 0

    def copy(self, plan: StepPlan) -> None:
        for block, slot in plan.kv_saves:
            self.host[slot] = [(self.kv.get(block * self.bs + i), self.after.get(block * self.bs + i))
                               for i in range(self.bs)]
        for slot, block in plan.kv_loads:
            for i, (kv, after) in enumerate(self.host[slot]):
                self.kv[block * self.bs + i], self.after[block * self.bs + i] = kv, after
            self.loaded += 1

    def _slot(self, block_ids, pos: int) -> int:
        return block_ids[pos // self.bs] * self.bs + pos % self.bs

    def execute(self, plan: StepPlan) -> dict[str, list[int]]:
        self.copy(plan)
        sampled = {}
        for seq in plan.seqs:
            req = self.sched.get(seq.req_id)
            for i, tok in enumerate(seq.token_ids):
                slot = self._slot(seq.block_ids, seq.start_pos + i)
                assert not self.sched.pool.is_cached(slot // self.bs), f"{seq.req_id} writes cached block {slot}"
                self.kv[slot] = tok
            context = [self.kv[self._slot(seq.block_ids, p)] for p in range(seq.end_pos)]
            for p in range(seq.start_pos):       # every position before: the token after it as it was computed
                assert self.after[self._slot(seq.block_ids, p)] == context[p + 1], (seq.req_id, p)
            for i in range(len(seq.token_ids) - 1):
                self.after[self._slot(seq.block_ids, seq.start_pos + i)] = seq.token_ids[i + 1]
            last = self._slot(seq.block_ids, seq.end_pos - 1)
            if seq.sample:
                sampled[seq.req_id] = [next_token(context)]
                self.after[last] = sampled[seq.req_id][0]
            else:
                self.after[last] = req.all_ids[seq.end_pos]
        return sampled


def _make(num_blocks=64, block_size=4, slack=0, **kw) -> Scheduler:
    kw.setdefault("vocab_size", VOCAB)
    kw.setdefault("max_num_batched_tokens", 32)
    kw.setdefault("max_num_seqs", 8)
    return Scheduler(SchedulerConfig(num_blocks=num_blocks, block_size=block_size, prefix_caching=True, **kw), slack)


def _drive(sched: Scheduler, arrivals: dict[int, list], max_steps: int = 10_000):
    model, outputs, plans = NextTokenModel(sched), {}, []
    arrivals = dict(arrivals)
    for step in range(max_steps):
        for req_id, ids, params in arrivals.pop(step, []):
            sched.add_request(req_id, ids, params)
        if not sched.has_unfinished() and not arrivals:
            break
        plan = sched.schedule()
        written = [b for s in plan.seqs for b in s.block_ids[s.start_pos // sched.config.block_size:]]
        assert len(written) == len(set(written)), "two seqs write one block"
        plans.append(plan)
        for ev in sched.update(plan, model.execute(plan)):
            outputs.setdefault(ev.req_id, []).extend(ev.new_token_ids)
    else:
        raise AssertionError("did not finish")
    assert sched.pool.num_free == sched.pool.num_blocks, "blocks leaked"
    return outputs, plans


def test_a_repeated_prompt_computes_only_its_uncached_tail():
    sched = _make()
    ids = prompt(19, 1)
    outputs, plans = _drive(sched, {0: [("a", ids, SamplingParams(max_tokens=5))],
                                    10: [("b", ids, SamplingParams(max_tokens=5)),
                                         ("c", ids[:9] + [0] + ids[10:], SamplingParams(max_tokens=5))]})
    assert outputs["a"] == outputs["b"] == expected_output(ids, 5)
    assert outputs["c"] == expected_output(ids[:9] + [0] + ids[10:], 5)
    b_first = next(s for p in plans for s in p.seqs if s.req_id == "b")
    c_first = next(s for p in plans for s in p.seqs if s.req_id == "c")
    assert b_first.start_pos == 16 and b_first.token_ids == tuple(ids[16:])   # blocks 0..3 cached
    assert c_first.start_pos == 8                    # block 2 holds the changed token
    assert sched.prefix_queried == 3 * 19 and sched.prefix_hits == 16 + 8


def test_a_salted_prompt_shares_cached_blocks_only_with_its_salt():
    """vLLM's cache_salt: a prefix cached under one salt (or none) is found under that salt only — and a salted request
    does not wait for another salt's prefill of its prefix (it could not take those blocks)."""
    sched = _make()
    ids = prompt(19, 1)
    salted = [SamplingParams(max_tokens=3, cache_salt=s) for s in (None, "t1", "t2", "t1", None)]
    outputs, plans = _drive(sched, {10 * i: [(f"r{i}", ids, p)] for i, p in enumerate(salted)})
    assert all(out == expected_output(ids, 3) for out in outputs.values())
    starts = [_first_seq(plans, f"r{i}")[1].start_pos for i in range(5)]
    assert starts == [0, 0, 0, 16, 16]              # t1's second and the unsalted second find their own blocks
    assert sched.cached_blocks(ids) == sched.cached_blocks(ids, "t1") == 4 and sched.cached_blocks(ids, "t3") == 0
    sched.add_request("a", ids, SamplingParams(max_tokens=2, cache_salt="t3"))
    sched.add_request("b", ids + [7], SamplingParams(max_tokens=2, cache_salt="t4"))
    assert {s.req_id for s in sched.schedule().seqs} == {"a", "b"}      # b computes its own prefix beside a's
    with pytest.raises(ValueError, match="cache_salt"):
        SamplingParams(cache_salt="")


def test_a_preempted_request_restarts_after_its_own_cached_blocks():
    sched = _make(num_blocks=6, block_size=4, max_num_seqs=2, max_num_batched_tokens=64)
    young_ids = prompt(8, 3)
    outputs, plans = _drive(sched, {0: [("old", prompt(4, 2), SamplingParams(max_tokens=7))],
                                    1: [("young", young_ids, SamplingParams(max_tokens=6))]})
    assert outputs["young"] == expected_output(young_ids, 6)
    at = next(i for i, p in enumerate(plans) if "young" in p.preempted)
    restart = next(s for p in plans[at + 1:] for s in p.seqs if s.req_id == "young")
    assert restart.start_pos == 12 and restart.num_generated == 5     # its prompt and 4 outputs were cached
    assert sched.prefix_queried == 4 + 8 and sched.prefix_hits == 0   # counted at a prompt's first prefill only


def test_a_waiting_request_keeps_its_cached_prefix_while_a_running_one_grows():
    """w waits for the one seat while r decodes; r's growth evicts cached blocks — the other prompt's, not w's prefix,
    which w kept as it arrived (before keeps the least recently released went first: w's own, and w computed all)."""
    sched = _make(num_blocks=10, block_size=4, max_num_seqs=1, max_num_batched_tokens=64)
    p, q = prompt(13, 1), prompt(9, 2)
    w = p + prompt(4, 3)
    outputs, plans = _drive(sched, {0: [("a", p, SamplingParams(max_tokens=1))],
                                    2: [("b", q, SamplingParams(max_tokens=1))],
                                    4: [("r", prompt(4, 4), SamplingParams(max_tokens=24))],    # 7 blocks
                                    5: [("w", w, SamplingParams(max_tokens=2))]})
    assert outputs["w"] == expected_output(w, 2)
    assert [_first_seq(plans, r)[0] for r in "abrw"] == [0, 2, 4, 28]       # w waited for r's end
    assert _first_seq(plans, "w")[1].start_pos == 12 and sched.cached_blocks(q) == 0
    assert not sched.pool._keeps and sched.pool.num_kept == 0


def test_a_shared_head_that_idles_after_its_waiter_kept_it_goes_after_the_waiters_tail():
    """W waits, keeping S+T: S's block is still held by R (it shares S), T's are idle. When R ends, S's block idles
    kept as W's first block — evicted after W's tail, not before it (which would leave W's tail kept and unmatchable:
    W computed everything)."""
    sched = _make(num_blocks=10, block_size=4, max_num_seqs=2, max_num_batched_tokens=64)
    s, t = prompt(8, 1), prompt(8, 2)
    outputs, plans = _drive(sched, {0: [("t0", s + t + [7], SamplingParams(max_tokens=1))],
                                    2: [("R", s + [3, 3, 3], SamplingParams(max_tokens=8, ignore_eos=True)),
                                        ("G", prompt(4, 9), SamplingParams(max_tokens=12, ignore_eos=True))],
                                    3: [("Z", prompt(12, 8), SamplingParams(max_tokens=12, ignore_eos=True)),
                                        ("W", s + t + [5], SamplingParams(max_tokens=1))]})
    assert outputs["W"] == expected_output(s + t + [5], 1)
    assert _first_seq(plans, "W")[1].start_pos == 8        # S's two blocks: 0 with keeps by time, 4 without keeps


def _first_seq(plans, req_id):
    return next((i, s) for i, p in enumerate(plans) for s in p.seqs if s.req_id == req_id)


def test_prompts_arriving_together_compute_their_shared_prefix_once():
    """A burst sharing a system prompt: the first computes it, the others wait for its blocks and compute their tails."""
    sched = _make(num_blocks=64, block_size=4, max_num_batched_tokens=64)   # room for all four in one step
    system = prompt(40, 1)
    ids = {f"r{i}": system + prompt(3, 10 + i) for i in range(4)}
    outputs, plans = _drive(sched, {0: [(r, p, SamplingParams(max_tokens=3)) for r, p in ids.items()]})
    for r, p in ids.items():
        assert outputs[r] == expected_output(p, 3)
    for r in ("r1", "r2", "r3"):   # the step after r0's; block 9's next token (40) is theirs: computed again
        assert _first_seq(plans, r)[0] == 1 and _first_seq(plans, r)[1].start_pos == 36, r
    prefill = sum(len(s.token_ids) for p in plans for s in p.seqs if s.end_pos <= 43 and s.num_generated == 0)
    assert prefill == 43 + 3 * 7
    assert sched.prefix_hits == 3 * 36


def test_a_short_shared_head_is_not_waited_for_and_an_abort_ends_the_wait():
    sched = _make(num_blocks=64, block_size=4, max_num_batched_tokens=64)
    head = prompt(5, 2)
    sched.add_request("a", head + prompt(30, 3), SamplingParams(max_tokens=2))
    sched.add_request("b", head + prompt(30, 4), SamplingParams(max_tokens=2))   # one shared block of 8: not worth it
    assert {s.req_id for s in sched.schedule().seqs} == {"a", "b"}

    sched = _make(num_blocks=64, block_size=4, max_num_batched_tokens=64)
    long = prompt(40, 5)
    sched.add_request("a", long + [1], SamplingParams(max_tokens=2))
    sched.add_request("b", long + [2], SamplingParams(max_tokens=2))
    sched.add_request("c", prompt(4, 6), SamplingParams(max_tokens=2))             # behind b: no overtaking
    assert [s.req_id for s in sched.schedule().seqs] == ["a"]
    sched.abort("a")
    plan = sched.schedule()   # a's KV never completed: b computes it all
    assert [(s.req_id, s.start_pos) for s in plan.seqs] == [("b", 0), ("c", 0)]


@pytest.mark.parametrize("slack,host", [(0, 0), (1, 0), (0, 6), (1, 40)])
def test_random_shared_prefix_workloads_never_corrupt_or_leak(slack, host):
    """Random arrivals of prompts that share prefixes of random lengths, on small pools (preemption, eviction; with a
    host tier smaller or larger than the device's, its copies and loads)."""
    rng = random.Random(7)
    hits = loads = 0
    for trial in range(8):
        nb, bs = rng.randrange(8, 24), rng.choice([1, 2, 4])
        sched = _make(num_blocks=nb, block_size=bs, slack=slack, max_num_batched_tokens=rng.randrange(4, 12),
                      max_num_seqs=4, host_blocks=host)
        bases = [prompt(nb * bs, 1000 * trial + j) for j in range(3)]
        arrivals: dict[int, list] = {}
        specs = {}
        for i in range(14):
            max_tokens = rng.randrange(1, 8)
            n = rng.randrange(1, max(2, nb * bs - max_tokens))
            shared = rng.randrange(0, n + 1)
            ids = rng.choice(bases)[:shared] + prompt(n - shared, 100 * trial + i)
            specs[f"r{i}"] = (ids, max_tokens)
            arrivals.setdefault(rng.randrange(30), []).append((f"r{i}", ids, SamplingParams(max_tokens=max_tokens)))
        outputs, plans = _drive(sched, arrivals)
        _check_idle_lists(sched.pool)
        assert not sched.pool._keeps
        for rid, (ids, max_tokens) in specs.items():
            assert outputs[rid] == expected_output(ids, max_tokens), (trial, rid)
        hits += sched.prefix_hits
        loads += sum(len(p.kv_loads) for p in plans)
    assert hits > 0 and (loads > 0) == (host > 0)


def test_a_block_saved_and_reused_in_one_plan_is_saved_before_it_is_loaded_into():
    """q's blocks are registered (saves pending) as q ends; the next plan evicts one of them for c's load: the save must
    read it first, or q's host copy holds c's KV and q's next reuse reads it (the fake model's check fails)."""
    sched = _make(num_blocks=4, block_size=2, max_num_batched_tokens=64, host_blocks=8)
    p, q = prompt(5, 1), prompt(7, 2)
    outputs, plans = _drive(sched, {0: [("p", p, SamplingParams(max_tokens=1))],
                                    3: [("q", q, SamplingParams(max_tokens=1))],     # evicts p's blocks; ends at once
                                    4: [("c", p, SamplingParams(max_tokens=1))],     # p's blocks back, into q's
                                    8: [("q2", q, SamplingParams(max_tokens=2))]})
    at, _ = _first_seq(plans, "c")
    assert {b for b, _ in plans[at].kv_saves} & {b for _, b in plans[at].kv_loads}, "the case is not reached"
    assert outputs["q2"] == expected_output(q, 2) and len(_first_seq(plans, "q2")[1].token_ids) == 1


def test_a_prefix_evicted_from_the_device_comes_back_from_the_host():
    sched = _make(num_blocks=8, block_size=4, max_num_batched_tokens=64, host_blocks=16)
    ids, other = prompt(17, 1), prompt(28, 2)
    outputs, plans = _drive(sched, {0: [("a", ids, SamplingParams(max_tokens=2))],
                                    5: [("b", other, SamplingParams(max_tokens=2))],   # takes every device block
                                    10: [("c", ids, SamplingParams(max_tokens=3))]})
    assert outputs["c"] == expected_output(ids, 3)
    at, seq = _first_seq(plans, "c")
    assert seq.start_pos == 16 and len(plans[at].kv_loads) == 4      # a's 4 blocks, loaded back; its tail computed
    assert [b for _, b in plans[at].kv_loads] == list(seq.block_ids[:4])


def test_rejected_drafts_leave_no_cached_block():
    """A verify step writes drafts past the accepted tokens: only blocks before ``num_computed_tokens`` are cached."""
    sched = _make(block_size=2)
    model = NextTokenModel(sched)
    ids = prompt(3, 4)
    sched.add_request("a", ids, SamplingParams(max_tokens=10))
    plan = sched.schedule()
    sched.update(plan, model.execute(plan), {"a": [1, 2, 3]})
    plan = sched.schedule(max_drafts=3)
    seq = plan.seqs[0]
    assert seq.num_drafts == 3 and seq.end_pos == 7
    model.execute(plan)
    sched.update(plan, {"a": [next_token(ids + [model.kv[model._slot(seq.block_ids, 3)]])]})   # all rejected
    req = sched.get("a")
    # blocks 0 and 1 (positions 2, 3: the token after them is the one just sampled); not the drafts' blocks 2 and 3
    assert req.num_computed_tokens == 4 and len(req.cached_nodes) == 2 and len(req.block_ids) == 2
    assert sched.pool.num_cached == 2 and not any(sched.pool.is_cached(b) for b in seq.block_ids[2:])


def test_off_by_default_in_the_scheduler_and_clear_forgets():
    plain = Scheduler(SchedulerConfig(num_blocks=16, block_size=2, vocab_size=VOCAB))
    _drive(plain, {0: [("a", prompt(9, 5), SamplingParams(max_tokens=3))]})
    assert plain.pool.num_cached == 0 and plain.prefix_queried == 0
    sched = _make(num_blocks=16, block_size=2)
    _drive(sched, {0: [("a", prompt(9, 5), SamplingParams(max_tokens=3))]})
    assert sched.pool.num_cached == 5                # 11 tokens computed: 5 blocks, each with the token after it
    sched.clear_prefix_cache()
    assert sched.pool.num_cached == 0 and sched.pool.match(prompt(9, 5)) == []


# ---- the engine: placement and the counts ------------------------------------------------


def _engine(ranks: int, seqs: int = 8) -> Engine:
    cfg = SchedulerConfig(num_blocks=64, block_size=4, max_model_len=128, vocab_size=64, max_num_seqs=seqs,
                          max_num_batched_tokens=64, prefix_caching=True)
    return Engine(RecordingExecutor(), cfg, num_ranks=ranks)


def _finish(engine: Engine) -> list:
    events = []
    for _ in range(100):
        events += engine.step()
        if not engine.has_unfinished():
            return events
    raise AssertionError("did not finish")


def test_a_request_goes_to_the_rank_that_holds_its_prefix_and_reports_its_cached_tokens():
    engine = _engine(2)
    system = list(range(2, 30))                     # 28 tokens: a shared system prompt
    engine.add_request(system + [40, 41], SamplingParams(max_tokens=2), "first")     # rank 0 (least loaded)
    engine.add_request([50, 51, 52], SamplingParams(max_tokens=2), "other")          # rank 1
    assert engine._rank_of == {"first": 0, "other": 1}
    _finish(engine)
    engine.add_request([60] * 6, SamplingParams(max_tokens=8, ignore_eos=True), "busy")
    assert engine._rank_of["busy"] == 0             # both idle: the lowest rank; 4 blocks of load there (2 held, 2 to grow)
    engine.add_request(system + [42, 43, 44], SamplingParams(max_tokens=2), "second")
    assert engine._rank_of["second"] == 0           # the 6 blocks it would not add outweigh the load
    events = _finish(engine)
    second = [e for e in events if e.req_id == "second"]
    # blocks 0..5; block 6 (positions 24..27) was cached with the token after it, 40, where this prompt has 42
    assert second[-1].num_cached_tokens == 24 and second[-1].num_prompt_tokens == 31
    assert engine.prefix_cache_tokens() == (30 + 3 + 6 + 31, 24)


def test_a_failed_group_forgets_every_cached_prefix():
    engine = _engine(1)
    engine.add_request(list(range(2, 20)), SamplingParams(max_tokens=2), "a")
    _finish(engine)
    assert engine.scheduler.pool.num_cached == 4
    engine._fail_all("test")
    assert engine.scheduler.pool.num_cached == 0


def test_a_request_placed_by_its_prefix_is_not_moved_away_as_stalled():
    """The rank's free blocks hold what the request adds beyond its cached blocks: it starts there (not moved, as a
    request stalled for blocks is, to a rank where its whole prompt would be computed). From session 40's QA pass."""
    cfg = SchedulerConfig(num_blocks=16, block_size=4, max_model_len=64, vocab_size=100, max_num_seqs=8,
                          max_num_batched_tokens=64, prefix_caching=True)
    rec = RecordingExecutor()
    engine = Engine(rec, cfg, num_ranks=2)
    system = list(range(10, 46))                    # 9 blocks, cached on rank 0 by the first request
    engine.add_request(system + [50], SamplingParams(max_tokens=20, ignore_eos=True), "a")
    engine.step()
    engine.add_request(list(range(60, 72)), SamplingParams(max_tokens=20, ignore_eos=True), "f")   # rank 1
    engine.step()
    engine.add_request(system + [51, 52], SamplingParams(max_tokens=2, ignore_eos=True), "b")
    assert engine._rank_of["b"] == 0 and engine.schedulers[0].pool.num_free < 10     # it would not fit uncached
    engine.step()
    first = [(r, s) for r, st in enumerate(rec.steps[-1]) for s in st.seqs if s.req_id == "b"]
    assert [(r, s.start_pos) for r, s in first] == [(0, 32)] and engine.stats["moves"] == 0


def test_waiting_requests_weigh_what_they_add_beyond_their_cached_blocks():
    """Two requests sharing a prefix cached on rank 0 arrive together: both go there (the first's prompt counts as
    the one block it adds, not as ten). From session 40's QA pass."""
    engine = _engine(2)
    system = list(range(10, 46))
    engine.add_request(system + [50], SamplingParams(max_tokens=1, ignore_eos=True), "warm")
    _finish(engine)
    engine.add_request(system + [50, 1], SamplingParams(max_tokens=4, ignore_eos=True), "u1")
    engine.add_request(system + [50, 2], SamplingParams(max_tokens=4, ignore_eos=True), "u2")
    assert engine._rank_of == {"u1": 0, "u2": 0}
    _finish(engine)
    assert engine.prefix_cache_tokens()[1] == 2 * 36


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_other_choices_of_a_prompt_join_the_rank_whose_running_lead_holds_it(ranks):
    """The front end's n > 1: the first choice runs until its first token, then the others come — to its rank, where
    a running request holds the prompt's blocks (they add no load there, and each other rank would compute the prompt
    again), not to an empty rank (session 57's distributed review: 0 of the prompt's tokens were found cached on 4
    ranks)."""
    engine = _engine(ranks, seqs=4 * ranks)         # (4 seats a rank: the four choices fit beside each other)
    prompt = list(range(2, 42))                     # 40 tokens: 9 cached blocks once computed
    engine.add_request(prompt, SamplingParams(max_tokens=8, ignore_eos=True), "c0")
    while not any(ev.req_id == "c0" and ev.token_ids for ev in engine.step()):
        pass
    for i in range(1, 4):
        engine.add_request(prompt, SamplingParams(max_tokens=8, ignore_eos=True, seed=i), f"c{i}")
    assert {engine._rank_of[f"c{i}"] for i in range(4)} == {0}
    _finish(engine)
    queried, hit = engine.prefix_cache_tokens()
    assert hit == 3 * 36 and queried == 4 * 40


def test_a_rank_of_long_answers_counts_what_they_will_grow_by():
    """Placement weighs the tokens live requests may still add (``GROWTH_TOKENS`` a request at most): a long prompt
    with a short answer on one rank does not send every long-answer chat to the other (session 57's review: rank 0
    sat empty for 70 steps while rank 1 preempted 18 times)."""
    engine = _engine(2)
    engine.add_request(list(range(2, 62)), SamplingParams(max_tokens=2), "long")           # 15 blocks on rank 0
    for i in range(8):
        engine.add_request([50 + i, 3, 4], SamplingParams(max_tokens=100, ignore_eos=True), f"chat{i}")
    ranks = [engine._rank_of[f"chat{i}"] for i in range(8)]
    assert ranks.count(0) >= 3 and ranks.count(1) >= 3, ranks
