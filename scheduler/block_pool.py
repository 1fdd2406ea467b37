"""Paged KV block accounting: which block ids are free. Ints only; the tensors live in the workers."""

from __future__ import annotations


class BlockPool:
    """A fixed pool of `num_blocks` KV blocks of `block_size` tokens each.

    Callers check `can_allocate` before `allocate`; running out or freeing a block twice is a
    scheduler bug and trips an assert.
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
        self._is_free = bytearray(b"\x01") * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free_ids)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free_ids)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        assert num_tokens >= 0, num_tokens
        return -(-num_tokens // self.block_size)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free_ids)

    def allocate(self, n: int) -> list[int]:
        assert 0 <= n <= len(self._free_ids), f"allocate({n}) with {len(self._free_ids)} free blocks"
        ids = [self._free_ids.pop() for _ in range(n)]
        for b in ids:
            self._is_free[b] = 0
        return ids

    def free(self, block_ids: list[int]) -> None:
        for b in block_ids:
            assert 0 <= b < self.num_blocks, f"block id {b} outside the pool of {self.num_blocks}"
            assert not self._is_free[b], f"double free of block {b}"
            self._is_free[b] = 1
            self._free_ids.append(b)
