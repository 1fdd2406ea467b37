"""Checked and right: the KV memory the pool is sized by equals what the caches allocate.

``KVCache.bytes_per_slot`` (what ``fit_kv_blocks`` and the start-up line count a token) against the bytes the device
cache's tensors and the host tier's (``HostKV``) really hold — bf16 / fp32, FP8 packed rows, the MTP layer's cache and
the indexer keys included — for the tiny model's config and the GLM-5-width slice config; and a runner's cache is the
pool plus exactly ``extra_slots`` slots."""
from __future__ import annotations

import _h
import torch
from _h import check
from models.cache import HostKV, KVCache
from models.config import ModelConfig


def nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


configs = [("tiny", _h.model().config)]
for name in ("glm5-tiny-random.json",):
    configs.append((name, ModelConfig.from_json(f"models/configs/{name}")))

for cname, cfg in configs:
    for dtype in (torch.float32, torch.bfloat16):
        for fp8 in (False, True):
            slots = 64
            cache = KVCache(cfg, slots, dtype, "cpu", fp8=fp8)
            per = KVCache.bytes_per_slot(cfg, dtype, fp8)
            got = nbytes(cache.tensors())
            check(got == per * slots, f"{cname} {dtype} fp8={fp8}: device cache {got} B == bytes_per_slot {per} x "
                                      f"{slots}")
            host = HostKV(cache, 4, 16)
            hb = nbytes(t for _, t in host.tensors)
            check(hb == per * 4 * 16, f"{cname} {dtype} fp8={fp8}: host tier {hb} B == {per} x 64 slots")
            check(len(cache.tensors()) == len(KVCache.layout(cfg, dtype, fp8)),
                  f"{cname} fp8={fp8}: layout names every tensor (MTP layer {cfg.num_cache_layers} layers)")

from workers.runner import ModelRunner  # noqa: E402

m = _h.model()
for k in (0, 2):
    r = ModelRunner(m, 10, 16, torch.float32, speculative=k > 0, host_blocks=3)
    check(r.cache.num_slots == 10 * 16 + ModelRunner.extra_slots(),
          f"runner (k={k}) cache slots {r.cache.num_slots} == pool 160 + extra_slots {ModelRunner.extra_slots()}")
    check(nbytes(t for _, t in r.host.tensors) == KVCache.bytes_per_slot(m.config, torch.float32) * 3 * 16,
          f"runner (k={k}) host tier holds 3 blocks of 16 slots")
_h.done()
