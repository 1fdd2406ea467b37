"""The KV cache (paged by slots) and the per-step attention metadata.

A cache *slot* holds one token of one request in every layer: the MLA latent + rope key
(``kv_lora_rank + qk_rope_head_dim`` values) and, on layers with an indexer, the indexer key
(``index_head_dim`` values). Slots are ``block_id * block_size + offset``; a request's block table
maps its positions to slots, so the same model code serves a contiguous cache (one request, slots =
positions) and the engine's paged pool.
"""

from __future__ import annotations

import os
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple, Sequence

import numpy as np
import torch

from glmkernels.reference import RaggedSlots, kv_fp8_layout
from models.config import ModelConfig


class KVCache:
    """Per-layer slot tensors; layer ``num_hidden_layers`` is the MTP layer's own cache (a drafting engine's: one that
    does not draft loads the model ``without_mtp``). ``fp8``: each MLA row packed as FlashMLA does
    (``reference.kv_fp8_layout``: the latent in e4m3 with a power-of-two scale a 128 values, the rope key in ``dtype``;
    656 bytes at GLM-5's width instead of 1152) and each indexer key as DeepSeek-V3.2 keeps it (e4m3 and its scale: 144
    bytes instead of 256), uint8 tensors the kernels unpack as they read."""

    def __init__(self, config: ModelConfig, num_slots: int, dtype: torch.dtype, device: str | torch.device = "cpu",
                 fp8: bool = False):
        self.num_slots, self.dtype = num_slots, dtype          # dtype: the activations' (and unpacked rows')
        L = config.num_cache_layers
        width, key = (KVCache.row_bytes(config, dtype), KVCache.key_bytes(config, dtype)) if fp8 else (
            config.kv_cache_dim, config.index_head_dim)
        store = torch.uint8 if fp8 else dtype
        self.kv = [torch.zeros(num_slots, width, dtype=store, device=device) for _ in range(L)]
        self.index_k = [torch.zeros(num_slots, key, dtype=store, device=device) if config.has_indexer(layer) else None
                        for layer in range(L)]

    def tensors(self) -> list[torch.Tensor]:
        """Every slot tensor: each layer's MLA rows, then the indexer keys of the layers that have them."""
        return [*self.kv, *(t for t in self.index_k if t is not None)]

    @staticmethod
    def layout(config: ModelConfig, dtype: torch.dtype, fp8: bool = False) -> tuple[tuple[int, str], ...]:
        """(width, dtype) of each of ``tensors()``' rows: what a slot holds, to check KV moved between caches."""
        L, store = config.num_cache_layers, "uint8" if fp8 else str(dtype).removeprefix("torch.")
        row, key = (KVCache.row_bytes(config, dtype), KVCache.key_bytes(config, dtype)) if fp8 else (
            config.kv_cache_dim, config.index_head_dim)
        return ((row, store),) * L + ((key, store),) * sum(map(config.has_indexer, range(L)))

    def read_blocks(self, blocks: Sequence[int], block_size: int) -> tuple[np.ndarray, ...]:
        """The rows of these blocks' slots, in order, of every tensor (``tensors()``), as bytes in host memory
        ([slots, row bytes] uint8: they pickle, and pass through Ray's object store, as a plain copy)."""
        rows = _block_rows(blocks, block_size, self.kv[0].device)
        return tuple(t.index_select(0, rows).cpu().view(torch.uint8).numpy() for t in self.tensors())

    def write_blocks(self, blocks: Sequence[int], block_size: int, rows: Sequence[np.ndarray]) -> None:
        """Put ``read_blocks``' rows (another cache's, same ``layout``) into these blocks' slots."""
        at = _block_rows(blocks, block_size, self.kv[0].device)
        for t, r in zip(self.tensors(), rows, strict=True):
            with warnings.catch_warnings():        # Ray hands over read-only arrays (shared memory): only read here
                warnings.simplefilter("ignore", UserWarning)
                src = torch.from_numpy(r).view(t.dtype)
            assert src.shape == (at.numel(), t.shape[1]), (src.shape, t.shape)
            t.index_copy_(0, at, src.to(t.device, non_blocking=True))

    @staticmethod
    def row_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
        """A packed FP8 MLA row's bytes."""
        return kv_fp8_layout(config.kv_lora_rank, config.qk_rope_head_dim, dtype)[2]

    @staticmethod
    def key_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
        """A packed FP8 indexer key's bytes."""
        return kv_fp8_layout(config.index_head_dim, 0, dtype, "index_head_dim")[2]

    @staticmethod
    def bytes_per_slot(config: ModelConfig, dtype: torch.dtype, fp8: bool = False) -> int:
        """One token's bytes over every layer (its MLA rows and indexer keys)."""
        size = torch.empty((), dtype=dtype).element_size()
        n_idx = sum(config.has_indexer(layer) for layer in range(config.num_cache_layers))
        if fp8:
            return KVCache.row_bytes(config, dtype) * config.num_cache_layers + KVCache.key_bytes(config, dtype) * n_idx
        return (config.kv_cache_dim * config.num_cache_layers + config.index_head_dim * n_idx) * size


def _block_rows(blocks: Sequence[int], block_size: int, device: torch.device) -> torch.Tensor:
    b = torch.as_tensor(list(blocks), dtype=torch.long)
    return (b[:, None] * block_size + torch.arange(block_size)).flatten().to(device)


class HostKV:
    """Host memory for cached prefix blocks (the block pool's host tier, ``scheduler/block_pool.py``): the device
    cache's tensors, ``num_blocks`` blocks of ``block_size`` slots each. A step's copies (``WorkerStep.kv_saves`` /
    ``kv_loads``) move whole blocks, every layer's, in one gather and one copy a tensor. On a GPU neither waits for
    it: a save gathers on the device into pinned buffers (an asynchronous copy, behind the steps already queued) and
    is written into place on the host at the next copy, once its event has passed (a load that reads a slot still in
    flight waits for it); a load gathers on the host and copies in asynchronously."""

    def __init__(self, cache: KVCache, num_blocks: int, block_size: int):
        self.device, self.block_size = cache.kv[0].device, block_size
        self.pin = self.device.type == "cuda"
        self.tensors = [(dev, torch.empty(num_blocks * block_size, dev.shape[1], dtype=dev.dtype))
                        for dev in cache.tensors()]
        self._saving: tuple | None = None     # (event, host rows, slots, buffers): a save not yet in place

    def _rows(self, blocks: Sequence[int], device: torch.device | str) -> torch.Tensor:
        """The cache rows of these blocks, on ``device`` (to a GPU through a pinned copy: a pageable one would wait
        for the steps queued before it)."""
        b = torch.as_tensor(blocks, dtype=torch.long)
        rows = (b[:, None] * self.block_size + torch.arange(self.block_size)).flatten()
        return rows.pin_memory().to(device, non_blocking=True) if torch.device(device).type == "cuda" else rows

    def save(self, moves: Sequence[tuple[int, int]]) -> None:
        """(device block, host block) pairs: device → host."""
        self.settle()
        if not moves:
            return
        blocks, slots = zip(*moves)
        assert len(set(slots)) == len(slots), "a host block saved twice in one step"
        src = self._rows(blocks, self.device)
        bufs = []
        for dev, _ in self.tensors:
            rows = dev.index_select(0, src)
            bufs.append(torch.empty(rows.shape, dtype=rows.dtype, pin_memory=self.pin))
            bufs[-1].copy_(rows, non_blocking=self.pin)
        event = torch.cuda.Event() if self.pin else None
        if event is not None:
            event.record()
        self._saving = (event, self._rows(slots, "cpu"), set(slots), bufs)

    def settle(self) -> None:
        """Put the last save's blocks in place (waiting for its copies, if still in flight)."""
        if self._saving is not None:
            event, dst, _, bufs = self._saving
            if event is not None:
                event.synchronize()
            for (_, host), buf in zip(self.tensors, bufs):
                host.index_copy_(0, dst, buf)
            self._saving = None

    def load(self, moves: Sequence[tuple[int, int]]) -> None:
        """(host block, device block) pairs: host → device."""
        if not moves:
            return
        slots, blocks = zip(*moves)
        if self._saving is not None and not self._saving[2].isdisjoint(slots):
            self.settle()
        src, dst = self._rows(slots, "cpu"), self._rows(blocks, self.device)
        for dev, host in self.tensors:
            rows = host.index_select(0, src)
            dev.index_copy_(0, dst, rows.pin_memory().to(self.device, non_blocking=True) if self.pin else rows)


class ImportWriter:
    """Rows from another replica's cache (``read_blocks``') written into this cache's blocks over two steps
    (``WorkerStep.kv_imports``, then ``kv_land``; the engine settles those blocks once the second has returned, so no
    step reads them before). On a GPU ``stage`` copies a step's rows into one pinned buffer on ``threads`` helper
    threads while the step runs (host work only: a CUDA graph captured meanwhile on the step's thread forbids other
    threads' CUDA calls); ``write``, once the step's work is queued, sends the buffer to the device on a side stream,
    beside the next step's work, and after that step's work (``land``) moves the rows into their slots on the step's
    stream. A pageable copy held the step at ~6 GB/s, one host core's memcpy (sessions 52–53); a 64 MB copy to the
    device in the step's stream took 1.2 ms of it (session 54's traces). On a CPU ``write`` copies the rows in place
    at once (``staged``: as on a GPU, unpinned and without a copy; tests)."""

    # the buffers' least size: a step's imports (``cluster/disagg.py``'s IMPORT_STEP_BYTES, 64 MiB, a block more at
    # most: ~1.5 MB at GLM-5.2's full depth) and their slot ids fit; pinning memory ran at ~1-3 GB/s on H100 hosts
    # (session 53: 30-100 ms a step that grew a buffer), so each is made once
    BUFFER = 80 << 20

    def __init__(self, cache: KVCache, block_size: int, staged: bool | None = None, threads: int | None = None):
        self.cache, self.block_size, self.device = cache, block_size, cache.kv[0].device
        self.pin = self.device.type == "cuda"
        self.threads = threads or min(4, len(os.sched_getaffinity(0)))     # (the fastest at 56 MB on an H100 host)
        self._pool = ThreadPoolExecutor(self.threads, "kv-import") if (self.pin if staged is None else staged) else None
        self._buffers: list[tuple[torch.Tensor, Staged]] = []     # two, taken in turn: (buffer, its last use)
        self._device: list[tuple[torch.Tensor, torch.cuda.Event]] = []    # two, in turn: (buffer, its rows landed)
        self._stream = torch.cuda.Stream(self.device) if self.pin and self._pool else None
        self._sent: Sent | None = None      # the last step's rows, to land after this step's work

    def _buffer(self, nbytes: int) -> torch.Tensor:
        """A host buffer of at least ``nbytes`` that no earlier fill or copy still uses (two in turn: the older one's
        copy went a step ago). Kept, not freed: pinning fresh memory costs more than the copy."""
        host, done = self._buffers.pop(0) if len(self._buffers) == 2 else (None, None)
        if done is not None:
            done.wait()          # (a use of it without its rows: they go with the engine's last reference)
        if host is None or host.numel() < nbytes:
            host = torch.empty(_size(nbytes, self.BUFFER), dtype=torch.uint8, pin_memory=self.pin)
        return host

    def _device_buffer(self, nbytes: int) -> torch.Tensor:
        """A device buffer of at least ``nbytes`` whose rows landed (two in turn), for the side stream."""
        dev, landed = self._device.pop(0) if len(self._device) == 2 else (None, None)
        if landed is not None:
            self._stream.wait_event(landed)
        if dev is None or dev.numel() < nbytes:
            dev = torch.empty(_size(nbytes, self.BUFFER), dtype=torch.uint8, device=self.device)
            self._stream.wait_stream(torch.cuda.current_stream(self.device))    # (memory the step's kernels freed)
        return dev

    def reserve(self) -> None:
        """Make both buffers of each kind now (a decode replica of a disaggregated app, before it serves: pinning
        ran at ~1-3 GB/s, 30-120 ms a buffer on a first import otherwise)."""
        while self._pool is not None and len(self._buffers) < 2:
            self._buffers.append((self._buffer(0), Staged(())))
        while self._stream is not None and len(self._device) < 2:
            self._device.append((self._device_buffer(0), None))

    def stage(self, writes: Sequence[tuple[Sequence[int], Sequence[np.ndarray]]]) -> Staged | None:
        """Start on ``writes`` ((blocks, rows) each); the handle goes to ``write`` (or is dropped: nothing written)."""
        if not writes:
            return None
        if self._pool is None:
            return Staged(writes)
        slots = np.concatenate([_block_rows(b, self.block_size, "cpu").numpy() for b, _ in writes])
        parts = [slots.view(np.uint8), *(r.reshape(-1).view(np.uint8) for _, rows in writes for r in rows)]
        total = sum(p.nbytes for p in parts)
        buffer = self._buffer(total)
        host = buffer[:total]
        share, dst = -(-total // self.threads), host.numpy()
        pieces, at = [[] for _ in range(self.threads)], 0      # each helper one run of the buffer, across parts
        for p in parts:
            i = 0
            while i < p.nbytes:
                k = (at + i) // share
                n = min(p.nbytes - i, (k + 1) * share - (at + i))
                pieces[k].append((dst[at + i:at + i + n], p[i:i + n]))
                i += n
            at += p.nbytes
        staged = Staged(writes, host, [self._pool.submit(_copy, run) for run in pieces if run], [])
        self._buffers.append((buffer, staged._replace(writes=())))
        return staged

    def write(self, staged: Staged | None, land: bool) -> tuple[int, float] | None:
        """After a step's work: the rows the last step sent go into their slots (``land``: the engine still wants them
        — else they are dropped), then ``staged`` goes to the device. Returns (bytes, the fill's seconds) where helpers
        filled a buffer (``Imports.written`` paces the next steps' imports by it), else None."""
        if land and self._sent is not None:
            sent, self._sent = self._sent, None
            self._land(sent)
        self.drop()
        if staged is None:
            return None
        writes, host = staged.writes, staged.host
        if host is None:
            for blocks, rows in writes:
                self.cache.write_blocks(blocks, self.block_size, rows)
            return None
        spans = [f.result() for f in staged.filling]
        if self._stream is None:            # (staged on a CPU: the buffer itself lands)
            self._sent = Sent(writes, host)
        else:
            dev = self._device_buffer(host.numel())
            with torch.cuda.stream(self._stream):
                flat = dev[:host.numel()].copy_(host, non_blocking=True)
                staged.copied.append(torch.cuda.Event())
                staged.copied[0].record()
            self._sent = Sent(writes, flat, dev, staged.copied[0])
        return host.numel(), max(end for _, end in spans) - min(begin for begin, _ in spans)

    def _land(self, sent: Sent) -> None:
        if sent.copied is not None:
            torch.cuda.current_stream(self.device).wait_event(sent.copied)
        flat, writes = sent.flat, sent.writes
        n = sum(len(b) for b, _ in writes) * self.block_size
        slots, at = flat[:8 * n].view(torch.long), 8 * n
        for blocks, rows in writes:
            dst, slots = slots[:len(blocks) * self.block_size], slots[len(blocks) * self.block_size:]
            for t, r in zip(self.cache.tensors(), rows, strict=True):
                assert r.shape == (dst.numel(), t.shape[1] * t.element_size()), (r.shape, t.shape)
                t.index_copy_(0, dst, flat[at:at + r.nbytes].view(t.dtype).view(-1, t.shape[1]))
                at += r.nbytes
        if sent.buffer is not None:
            landed = torch.cuda.Event()
            landed.record()
            self._device.append((sent.buffer, landed))

    def drop(self) -> None:
        """Forget the rows on their way (a failed step: the engine drops its imports, their blocks may go elsewhere).
        Their device buffer goes back to the turn: the side stream's next copy into it follows the last."""
        if self._sent is not None and self._sent.buffer is not None:
            self._device.append((self._sent.buffer, None))
        self._sent = None


def _size(nbytes: int, least: int) -> int:
    return max(least, 1 << (nbytes - 1).bit_length())


def _copy(run: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
    begin = time.perf_counter()
    for dst, src in run:
        np.copyto(dst, src)
    return begin, time.perf_counter()


class Staged(NamedTuple):
    """``ImportWriter.stage``'s handle: the writes, and on a GPU their pinned buffer (slot ids, then the rows) and the
    helpers' copies into it."""

    writes: Sequence[tuple[Sequence[int], Sequence[np.ndarray]]]
    host: torch.Tensor | None = None
    filling: Sequence[Future] = ()
    copied: list[torch.cuda.Event] | tuple = ()      # its copy to the device, once ``write`` sent it

    def wait(self) -> None:
        """Until the buffer is filled (numpy's copies let go of the GIL: the helpers run beside the step), and its copy
        to the device, if sent, is done."""
        for f in self.filling:
            f.result()
        for e in self.copied:
            e.synchronize()


class Sent(NamedTuple):
    """A step's rows on their way (``ImportWriter.write``): slot ids then rows, on the device (``buffer``'s first bytes,
    there once ``copied``) or, staged on a CPU, the host buffer."""

    writes: Sequence[tuple[Sequence[int], Sequence[np.ndarray]]]
    flat: torch.Tensor
    buffer: torch.Tensor | None = None
    copied: torch.cuda.Event | None = None


@dataclass
class Batch:
    """Where the step's N rows sit: rows of request i are ``seq_rows[i] = (first, count)``.

    positions: [N] absolute positions; slot_mapping: [N] slot receiving each row's KV;
    seq_slots[i]: [T_i] slots of request i's positions 0..T_i-1 (T_i = its last row's position + 1).
    A static-shape batch (CUDA graphs) instead gives each row its request's ``block_table`` [N, MB]
    (pad rows included) and leaves ``seq_slots`` empty; the indexer then scores MB·block_size keys.
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    seq_rows: list[tuple[int, int]]
    seq_slots: list[torch.Tensor]
    block_table: torch.Tensor | None = None
    block_size: int = 0
    ragged: RaggedSlots | None = None    # seq_slots as one list (``build_batch``'s), for the Triton indexer
    fewest_keys: int | None = None       # the fewest keys a row sees (its position + 1; ``build_batch``'s), or unknown

    @property
    def num_rows(self) -> int:
        return int(self.positions.numel())

    def short_rows(self, k: int) -> bool:
        """Whether some row sees fewer than ``k`` keys — its selection of width ``k`` ends in -1s — as far as the
        host knows (a static batch: not known, False)."""
        return self.fewest_keys is not None and self.fewest_keys < k


def slots_for(block_ids: Sequence[int], num_tokens: int, block_size: int, device="cpu") -> torch.Tensor:
    """Slots of positions 0..num_tokens-1 for a request with this block table."""
    t = torch.arange(num_tokens, device=device)
    blocks = torch.as_tensor(list(block_ids), dtype=torch.long, device=device)
    assert blocks.numel() * block_size >= num_tokens, "block table too short for the request"
    return blocks[t // block_size] * block_size + t % block_size


def build_batch(seqs: Sequence[tuple[int, int, Sequence[int]]], block_size: int, device="cpu") -> Batch:
    """seqs: per request (start_pos, num_new_tokens, block_ids) → the step's Batch, rows in request order. Built on
    the host in whole-array steps (a step's requests hold tens of thousands of slots) and moved in one copy (on CUDA
    pinned and asynchronous: a copy per request from pageable memory would wait for the GPU each time)."""
    if not seqs:   # a rank with no rows this step still runs every layer (its MLP phases are collective)
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return Batch(empty, empty, [], [])
    starts = np.array([s for s, _, _ in seqs], dtype=np.int64)
    news = np.array([n for _, n, _ in seqs], dtype=np.int64)
    assert (news > 0).all()
    ends = starts + news                                  # T_i: request i's slots cover positions 0..T_i-1
    used = -(-ends // block_size)                         # the blocks they take
    assert all(len(b) >= k for (_, _, b), k in zip(seqs, used.tolist())), "block table too short for the request"
    blocks = np.fromiter(chain.from_iterable(b[:k] for (_, _, b), k in zip(seqs, used.tolist())), np.int64,
                         int(used.sum()))
    every = (blocks[:, None] * block_size + np.arange(block_size)).ravel()      # every slot of those blocks
    offset = np.arange(every.size) - np.repeat((np.cumsum(used) - used) * block_size, used * block_size)
    seq_slots = every[offset < np.repeat(ends, used * block_size)]              # each request's 0..T_i-1, in turn
    rows = int(news.sum())
    row_starts = np.cumsum(news) - news
    positions = np.arange(rows) - np.repeat(row_starts - starts, news)
    bases, lengths = np.repeat(np.cumsum(ends) - ends, news), np.repeat(ends, news)     # per row, as RaggedSlots
    slot_mapping = seq_slots[bases + positions]
    # each per-row array padded to an even count, so that each starts 16-byte aligned whatever the rows: Triton
    # compiles a kernel per pointer alignment (an odd step beside an even one would compile twice)
    even = rows + rows % 2
    pad = np.zeros(even - rows, dtype=np.int64)
    host = torch.from_numpy(np.concatenate([positions, pad, slot_mapping, pad, bases, pad, lengths, pad, seq_slots]))
    flat = host.pin_memory().to(device, non_blocking=True) if torch.device(device).type == "cuda" else host.to(device)
    parts = flat.split([even] * 4 + ends.tolist())
    positions_d, slot_mapping_d, bases_d, lengths_d = (p[:rows] for p in parts[:4])
    ragged = RaggedSlots(flat[4 * even:], bases_d, lengths_d, bases.tolist(), lengths.tolist())
    return Batch(positions_d, slot_mapping_d, list(zip(row_starts.tolist(), news.tolist())), list(parts[4:]),
                 ragged=ragged, fewest_keys=int(starts.min()) + 1)


def contiguous_batch(lengths: Sequence[tuple[int, int]], capacity: int, device="cpu") -> Batch:
    """Requests i = 0.. with (start_pos, num_new) each owning slots [i*capacity, (i+1)*capacity)."""
    return build_batch([(s, n, [i]) for i, (s, n) in enumerate(lengths)], capacity, device)
