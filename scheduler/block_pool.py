"""Paged KV block accounting: which block ids are free, held, or kept for their cached prefix. Ints only; the tensors
live in the workers.

Prefix caching: a full block whose KV a request computed is registered under its *key* — the key of the block before it
(its chain of blocks from position 0) and its tokens — so a later request whose tokens start alike takes the same
blocks instead of computing them again. A key is exact: a parent's ``node`` number (numbered on registration, never
reused) and the block's token ids themselves, never a digest of them, so no two prefixes can collide. The key holds the
token *after* the block too: the MTP layer's KV at a position is computed from the next token (its input is the hidden
state and the next token's embedding), so a block is valid for a prefix only where the token after it matches as well.

A block no request holds but whose prefix is cached waits in an LRU of its own (counted free): ``allocate`` takes the
never-cached free blocks first, then evicts the least recently released cached ones. A waiting request's cached prefix
is *kept* (``keep``, until it starts): its idle blocks wait apart and are evicted only once no other cached block is
left — in the scheduler's order from the back: the last waiter's deepest block first, so a later waiter's tail goes
before an earlier one's head (a block several waiters keep ranks as the first of them has it). Kept blocks are still
counted free, so a keep never makes the scheduler wait or preempt: it changes only which cached blocks go first.

Host memory (``host_blocks`` > 0): a second tier of cached blocks. A block is copied there when it is registered
(write-through: ``drain``'s saves), so evicting it from the device forgets nothing while the host holds its copy; a
prefix found on the host is taken into a fresh device block (a load). The host slots are an LRU of their own
(taking a prefix refreshes it). A node — a cached prefix block — lives while either tier holds it. The workers run a
step's saves, then its loads, then its forward: a block saved after its last use and evicted in the same plan is
read before it is written, and a host slot is never both loaded and overwritten in one plan (slots are reused only
on registration, between plans; a slot reused within one plan's saves keeps the last).
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Sequence

ROOT = 0   # the parent node of a prompt's first block (a salted request's: ``root(salt)``)


def root(salt: str | None) -> int | tuple:
    """The parent key of a prompt's first block: ``ROOT``, or a salt's own root (no node number: a tuple), so that
    prefixes cached under one salt are found under that salt only."""
    return ROOT if salt is None else ("salt", salt)


@dataclass(slots=True)
class _Node:
    """A cached prefix block: its key, and its copies (a device block, a host slot; one at least). ``pending``: adopted,
    its KV not yet on its way to the device (``adopt``): no prefix match reaches it until ``settle``."""

    key: tuple
    block: int | None
    slot: int | None = None
    pending: bool = False


class BlockPool:
    """A fixed pool of `num_blocks` KV blocks of `block_size` tokens each, counted by holders; and `host_blocks` slots
    of host memory that keep cached prefixes past their eviction from the device.

    Callers check `can_allocate` before `allocate`; running out or releasing a block nobody holds is a scheduler bug
    and trips an assert.
    """

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int = 0) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if host_blocks < 0:
            raise ValueError(f"host_blocks must be >= 0, got {host_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.host_blocks = host_blocks
        # A stack popped from the end hands out 0, 1, 2, ... first and reuses recently freed blocks.
        self._free_ids: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks                          # holders of each block
        self._idle: OrderedDict[int, None] = OrderedDict()    # cached blocks nobody holds, least recently released first
        self._kept: dict[int, tuple] = {}         # idle block a waiting request will take -> its order (``keep``)
        self._kept_heap: list[tuple] = []         # (the order negated, block): the last first; stale entries skipped
        self._keeps: dict[int, Counter[tuple]] = {}   # node -> the orders its keepers give it
        self._nodes: dict[int, _Node] = {}                    # node -> its key and copies
        self._node_of_key: dict[tuple, int] = {}
        self._node_of_block: dict[int, int] = {}              # registered device block -> its node
        self._next_node = ROOT + 1
        self._host_free: list[int] = list(range(host_blocks - 1, -1, -1))
        self._host_lru: OrderedDict[int, None] = OrderedDict()   # slots in use, least recently used first
        self._node_of_slot: dict[int, int] = {}
        self._pins: Counter[int] = Counter()      # node -> holds on its host copy (``pin``: not in the LRU)
        self._saves: dict[int, int] = {}          # slot -> block: device → host, before the next step's loads (a
                                                  # slot taken again in one plan: the last save only)
        self._loads: list[tuple[int, int]] = []    # (slot, block): host → device, before the next step's forward
        self._written: list[tuple[int, int]] = []  # (block, node): adopted, written by the step being planned

    @property
    def num_free(self) -> int:
        """Blocks ``allocate`` can hand out: never cached, or cached and held by no request."""
        return len(self._free_ids) + len(self._idle) + len(self._kept)

    @property
    def num_kept(self) -> int:
        """Idle blocks kept for waiting requests (``keep``): counted in ``num_free``, evicted last."""
        return len(self._kept)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Device blocks registered under a prefix (held or idle)."""
        return len(self._node_of_block)

    @property
    def num_host_cached(self) -> int:
        """Host slots holding a cached prefix block."""
        return len(self._node_of_slot)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        assert num_tokens >= 0, num_tokens
        return -(-num_tokens // self.block_size)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def freed_by(self, tables: Sequence[Sequence[int]]) -> int:
        """The blocks that releasing ``tables`` (block tables) would make free: those no one else holds."""
        holds = Counter(b for table in tables for b in table)
        return sum(n == self._refs[b] for b, n in holds.items())

    def allocate(self, n: int) -> list[int]:
        assert 0 <= n <= self.num_free, f"allocate({n}) with {self.num_free} free blocks"
        ids = []
        for _ in range(n):
            if self._free_ids:
                b = self._free_ids.pop()
            else:       # evict the least recently released cached block, else the most recently kept one
                b = self._idle.popitem(last=False)[0] if self._idle else self._pop_kept()
                self._drop_block(b)
            self._refs[b] = 1
            ids.append(b)
        return ids

    def free(self, block_ids: Sequence[int]) -> None:
        """Release one hold on each block; a block nobody holds any more goes back to the free list, or idles with its
        cached prefix. A request's table is released from its end, so its last blocks are evicted first (a prefix's
        head is the part other requests share)."""
        for b in reversed(block_ids):
            assert 0 <= b < self.num_blocks, f"block id {b} outside the pool of {self.num_blocks}"
            assert self._refs[b] > 0, f"double free of block {b}"
            self._refs[b] -= 1
            if self._refs[b] == 0:
                if (n := self._node_of_block.get(b)) is None:
                    self._free_ids.append(b)
                elif n in self._keeps:
                    self._set_kept(b, min(self._keeps[n]))
                else:
                    self._idle[b] = None

    # ---- prefix caching ----------------------------------------------------------------------

    def match(self, ids: Sequence[int], first: int | tuple = ROOT) -> list[int]:
        """The nodes of ``ids``'s leading full blocks cached on the device or the host, as far as they go (each with the
        token after it in ``ids``, so the last token is never covered: a request always computes one row to sample
        from); ``first``: the parent of the first block (``root``)."""
        bs, nodes, node = self.block_size, [], first
        for end in range(bs, len(ids), bs):
            node = self._node_of_key.get((node, tuple(ids[end - bs:end + 1])))
            if node is None or self._nodes[node].pending:
                break
            nodes.append(node)
        return nodes

    def cost(self, nodes: Sequence[int]) -> int:
        """The free blocks taking these nodes uses up: their idle device blocks, and a fresh one for each that only the
        host holds."""
        return sum(n.block is None or self._refs[n.block] == 0 for n in map(self._nodes.__getitem__, nodes))

    def take(self, nodes: Sequence[int]) -> list[int]:
        """Hold the blocks of nodes ``match`` found (their KV is reused): a node only the host holds gets a fresh device
        block, loaded before the next step (a load). Returns the blocks, in order; the caller checked ``cost``."""
        held = [self._nodes[n] for n in nodes]
        for node in held:                    # first: the fresh blocks below must not evict these
            if node.block is not None:
                self.hold([node.block])
            if node.slot is not None and node.slot in self._host_lru:        # (not pinned)
                self._host_lru.move_to_end(node.slot)
        for n, node in zip(nodes, held):
            if node.block is None:
                node.block = self.allocate(1)[0]
                self._node_of_block[node.block] = n
                self._loads.append((node.slot, node.block))
        return [node.block for node in held]

    def hold(self, blocks: Sequence[int]) -> None:
        """One more hold on each block (an idle cached one leaves the LRU: nothing evicts it until ``free``)."""
        for b in blocks:
            if self._refs[b] == 0:
                if self._idle.pop(b, 0) is not None:        # (an idle block's value is None)
                    del self._kept[b]
            self._refs[b] += 1

    def keep(self, nodes: Sequence[int], rank: tuple, first: int = 0) -> None:
        """Evict the device blocks of ``nodes`` (a waiting request's cached prefix, ``match``'s, from its block
        ``first`` on) after every other cached block, until ``unkeep``; they stay counted free. ``rank``: the request's
        place in the scheduler's order — among kept blocks the last request's go first, its deepest first."""
        neg = tuple(-x for x in rank)          # (a step's imports keep hundreds of nodes: the loop stays lean)
        for depth, n in enumerate(nodes, first):
            order = (*rank, depth)
            if (orders := self._keeps.get(n)) is None:
                orders = self._keeps[n] = Counter()
            orders[order] += 1
            if (b := self._nodes[n].block) is not None and self._refs[b] == 0:
                if self._idle.pop(b, 0) is None or order < self._kept[b]:      # (an idle block's value is None)
                    self._set_kept(b, order, (*neg, -depth))

    def unkeep(self, nodes: Sequence[int], rank: tuple, first: int = 0) -> None:
        """Release ``keep``'s holds (the same arguments); a block no longer kept idles as the most recently released.
        Nodes gone meanwhile (evicted from both tiers, or a cleared cache) are skipped (node ids are never reused)."""
        for depth, n in enumerate(nodes, first):
            order = (*rank, depth)
            if (orders := self._keeps.get(n)) is None or not orders[order]:
                continue
            orders[order] -= 1
            if orders[order]:
                continue
            del orders[order]
            b = self._nodes[n].block
            if not orders:
                del self._keeps[n]
                if self._kept.pop(b, None) is not None:
                    self._idle[b] = None
            elif self._kept.get(b) == order:        # its first keeper left: the next one's order
                self._set_kept(b, min(orders))

    def _set_kept(self, b: int, order: tuple, neg: tuple | None = None) -> None:
        self._kept[b] = order
        heapq.heappush(self._kept_heap, (neg or tuple(-x for x in order), b))
        if len(self._kept_heap) > 2 * len(self._kept) + 64:       # drop the stale entries now and then
            self._kept_heap = [(tuple(-x for x in o), k) for k, o in self._kept.items()]
            heapq.heapify(self._kept_heap)

    def _pop_kept(self) -> int:
        """The kept block that goes first (the last in the scheduler's order), out of the kept ones."""
        while True:
            neg, b = heapq.heappop(self._kept_heap)
            if self._kept.get(b) == tuple(-x for x in neg):
                del self._kept[b]
                return b

    def pin(self, nodes: Sequence[int]) -> list[int]:
        """Keep the host copies of ``nodes`` from eviction until ``unpin`` (a prefix whose rest another replica
        computes, ``cluster/disagg.py``): their slots leave the host's LRU meanwhile. Returns the nodes pinned: those
        with a host copy. Where every slot is pinned, a block cached meanwhile gets no host copy."""
        pinned = [n for n in nodes if self._nodes[n].slot is not None]
        for n in pinned:
            if not self._pins[n]:
                del self._host_lru[self._nodes[n].slot]
            self._pins[n] += 1
        return pinned

    def unpin(self, nodes: Sequence[int]) -> None:
        """Release ``pin``'s holds (``nodes``: what it returned); a slot no longer pinned is the host's most recently
        used. Holds a cleared cache dropped are gone already (node ids are never reused)."""
        for n in nodes:
            if self._pins[n] > 1:
                self._pins[n] -= 1
            elif self._pins.pop(n, None) is not None:
                self._host_lru[self._nodes[n].slot] = None

    def has_host_copy(self, node: int) -> bool:
        return self._nodes[node].slot is not None

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._node_of_block

    def is_idle(self, block_id: int) -> bool:
        """Whether a block is held by no one (free, or idle with its cached prefix: counted in ``num_free``)."""
        return self._refs[block_id] == 0

    def node(self, block_id: int) -> int:
        return self._node_of_block[block_id]

    def block(self, node: int) -> int | None:
        """The device block of a cached node (None: only the host holds it)."""
        return self._nodes[node].block

    def register(self, block_id: int, parent: int | tuple, tokens: tuple[int, ...]) -> int:
        """Cache a held block whose KV is complete: ``tokens`` are its ``block_size`` tokens and the next one, after the
        prefix ``parent`` names; with a host tier it is copied there (a save). Returns the node the next block's key
        names: this block's, or that of the block already cached under the same key (this one then stays uncached,
        freed as usual — unless only the host held that key: then this block is its device copy)."""
        assert len(tokens) == self.block_size + 1 and self._refs[block_id] > 0, (block_id, len(tokens))
        key = (parent, tokens)
        n = self._node_of_key.get(key)
        if n is not None:
            node = self._nodes[n]
            if node.block is None:
                assert block_id not in self._node_of_block, f"block {block_id} is cached already"
                node.block, self._node_of_block[block_id] = block_id, n
            return n
        assert block_id not in self._node_of_block, f"block {block_id} is cached already"
        n, self._next_node = self._next_node, self._next_node + 1
        node = self._nodes[n] = _Node(key, block_id)
        self._node_of_key[key], self._node_of_block[block_id] = n, n
        self._copy_to_host(n, block_id)
        return n

    def adopt(self, parent: int | tuple, tokens: tuple[int, ...], pending: bool = False) -> tuple[int, int | None]:
        """Cache a block whose KV comes from elsewhere (another replica's prefill, ``cluster/disagg.py``): ``parent``
        and ``tokens`` as ``register``'s. Returns (the node, a fresh device block the caller writes the KV into before
        the next step's forward — None where the key is cached already). The block is held by no one (idle, evicted as
        any cached block) and gets no host copy (its save would run before the write). ``pending``: its write goes
        with a later step — the block is held, no match reaches it until ``settle``, and its host copy is made two
        steps after its write."""
        key = (parent, tokens)
        assert len(tokens) == self.block_size + 1, len(tokens)
        if (n := self._node_of_key.get(key)) is not None:
            return n, None
        block = self.allocate(1)[0]
        n, self._next_node = self._next_node, self._next_node + 1
        self._nodes[n] = _Node(key, block, pending=pending)
        self._node_of_key[key], self._node_of_block[block] = n, n
        if not pending:
            self.free([block])
        return n, block

    def settle(self, blocks: Sequence[int]) -> None:
        """Pending adopted blocks, written by the step just run: matches reach them, and they idle as any cached block
        (blocks no longer cached — the cache was cleared meanwhile — are just released). With a host tier each is
        copied there by a later step (``drain``: the one after the next plan's — two steps after the write, where one
        would do; saving with the next step's own drain let a load and a new copy share a host slot, session 53)."""
        for b in blocks:
            if (n := self._node_of_block.get(b)) is not None:
                self._nodes[n].pending = False
                if self.host_blocks:
                    self._written.append((b, n))
        self.free(blocks)

    def drain(self) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
        """The copies the next step runs first: (saves, loads), handed over once. The blocks settled for this step get
        their saves with the next one (those evicted meanwhile, none)."""
        out = tuple((b, slot) for slot, b in self._saves.items()), tuple(self._loads)
        self._saves, self._loads = {}, []
        written, self._written = self._written, []
        for b, n in written:
            if self._node_of_block.get(b) == n and self._nodes[n].slot is None:
                self._copy_to_host(n, b)
        return out

    def clear_cache(self) -> None:
        """Forget every cached prefix, on both tiers (the workers' KV is gone, after a failure): idle blocks become free,
        held ones are freed as usual when released."""
        self._free_ids.extend(self._idle)
        self._free_ids.extend(self._kept)
        self._idle.clear()
        self._kept.clear()
        self._kept_heap.clear()
        self._keeps.clear()
        self._nodes.clear()
        self._node_of_key.clear()
        self._node_of_block.clear()
        self._host_free = list(range(self.host_blocks - 1, -1, -1))
        self._host_lru.clear()
        self._node_of_slot.clear()
        self._pins.clear()
        self._saves, self._loads, self._written = {}, [], []

    def _copy_to_host(self, n: int, block_id: int) -> None:
        """With a host tier, node ``n`` gets a slot and its block a save (none where every slot is pinned)."""
        if self.host_blocks and (slot := self._host_slot()) is not None:
            self._nodes[n].slot = slot
            self._node_of_slot[slot] = n
            self._saves[slot] = block_id

    def _host_slot(self) -> int | None:
        """A host slot for a new copy: a free one, else the least recently used one's (that node loses its copy); None
        where every slot is pinned."""
        if self._host_free:
            slot = self._host_free.pop()
        elif not self._host_lru:
            return None
        else:
            slot, _ = self._host_lru.popitem(last=False)
            n = self._node_of_slot.pop(slot)
            self._nodes[n].slot = None
            self._forget_if_gone(n)
        self._host_lru[slot] = None
        return slot

    def _drop_block(self, b: int) -> None:
        """An idle cached block is evicted from the device: its node keeps the host's copy, if any."""
        n = self._node_of_block.pop(b)
        self._nodes[n].block = None
        self._forget_if_gone(n)

    def _forget_if_gone(self, n: int) -> None:
        node = self._nodes[n]
        if node.block is None and node.slot is None:
            del self._node_of_key[node.key]
            del self._nodes[n]
            self._keeps.pop(n, None)
