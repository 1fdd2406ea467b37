"""Paged KV block accounting: which block ids are free, held, or kept for their cached prefix. Ints only; the tensors
live in the workers.

Prefix caching: a full block whose KV a request computed is registered under its *key* — the key of the block before it
(its chain of blocks from position 0) and its tokens — so a later request whose tokens start alike takes the same
blocks instead of computing them again. A key is exact: a parent's ``node`` number (numbered on registration, never
reused) and the block's token ids themselves, never a digest of them, so no two prefixes can collide. The key holds the
token *after* the block too: the MTP layer's KV at a position is computed from the next token (its input is the hidden
state and the next token's embedding), so a block is valid for a prefix only where the token after it matches as well.

A block no request holds but whose prefix is cached waits in an LRU of its own (counted free): ``allocate`` takes the
never-cached free blocks first, then evicts the least recently released cached ones.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

ROOT = 0   # the parent node of a prompt's first block


class BlockPool:
    """A fixed pool of `num_blocks` KV blocks of `block_size` tokens each, counted by holders.

    Callers check `can_allocate` before `allocate`; running out or releasing a block nobody holds is a scheduler bug
    and trips an assert.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # A stack popped from the end hands out 0, 1, 2, ... first and reuses recently freed blocks.
        self._free_ids: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks                          # holders of each block
        self._idle: OrderedDict[int, None] = OrderedDict()    # cached blocks nobody holds, least recently released first
        self._block_of: dict[tuple, int] = {}                 # key -> the block that holds its KV
        self._key_of: dict[int, tuple] = {}                   # registered block -> its key
        self._node_of: dict[int, int] = {}                    # registered block -> its node (its children's parent)
        self._next_node = ROOT + 1

    @property
    def num_free(self) -> int:
        """Blocks ``allocate`` can hand out: never cached, or cached and held by no request."""
        return len(self._free_ids) + len(self._idle)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks registered under a prefix (held or idle)."""
        return len(self._key_of)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        assert num_tokens >= 0, num_tokens
        return -(-num_tokens // self.block_size)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int) -> list[int]:
        assert 0 <= n <= self.num_free, f"allocate({n}) with {self.num_free} free blocks"
        ids = []
        for _ in range(n):
            if self._free_ids:
                b = self._free_ids.pop()
            else:                                   # evict the least recently released cached block
                b, _ = self._idle.popitem(last=False)
                self._forget(b)
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
                if b in self._key_of:
                    self._idle[b] = None
                else:
                    self._free_ids.append(b)

    # ---- prefix caching ----------------------------------------------------------------------

    def match(self, ids: Sequence[int]) -> list[int]:
        """The cached blocks that hold the KV of ``ids``'s leading full blocks, as far as they go (each with the token
        after it in ``ids``, so the last token is never covered: a request always computes one row to sample from)."""
        bs, blocks, node = self.block_size, [], ROOT
        for end in range(bs, len(ids), bs):
            b = self._block_of.get((node, tuple(ids[end - bs:end + 1])))
            if b is None:
                break
            blocks.append(b)
            node = self._node_of[b]
        return blocks

    def idle_among(self, block_ids: Sequence[int]) -> int:
        """How many of these cached blocks nobody holds (taking them uses up that many free blocks)."""
        return sum(self._refs[b] == 0 for b in block_ids)

    def take(self, block_ids: Sequence[int]) -> None:
        """Hold blocks ``match`` found (their KV is reused)."""
        for b in block_ids:
            if self._refs[b] == 0:
                del self._idle[b]
            self._refs[b] += 1

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._key_of

    def node(self, block_id: int) -> int:
        return self._node_of[block_id]

    def register(self, block_id: int, parent: int, tokens: tuple[int, ...]) -> int:
        """Cache a held block whose KV is complete: ``tokens`` are its ``block_size`` tokens and the next one, after the
        prefix ``parent`` names. Returns the node the next block's key names: this block's, or that of the block
        already cached under the same key (this one then stays uncached, freed as usual)."""
        assert len(tokens) == self.block_size + 1 and self._refs[block_id] > 0, (block_id, len(tokens))
        key = (parent, tokens)
        held = self._block_of.get(key)
        if held is not None:
            return self._node_of[held]
        assert block_id not in self._key_of, f"block {block_id} is cached already"
        self._block_of[key], self._key_of[block_id] = block_id, key
        self._node_of[block_id] = node = self._next_node
        self._next_node += 1
        return node

    def clear_cache(self) -> None:
        """Forget every cached prefix (the workers' KV is gone, after a failure): idle blocks become free, held ones are
        freed as usual when released."""
        self._free_ids.extend(self._idle)
        self._idle.clear()
        self._block_of.clear()
        self._key_of.clear()
        self._node_of.clear()

    def _forget(self, b: int) -> None:
        del self._block_of[self._key_of.pop(b)]
        del self._node_of[b]
