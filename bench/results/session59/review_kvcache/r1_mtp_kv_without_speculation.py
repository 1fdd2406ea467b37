"""Finding: an engine without speculative decoding (speculative_tokens 0, the default) still allocates, sizes its pool
by, copies to the host tier and ships (disaggregated KV bundles) the MTP layer's KV rows and indexer keys — which no
step ever writes or reads. Exit 1 while a non-speculative runner holds cache tensors no step touches.

Shown on the embedded tiny model (6 layers + 1 MTP layer: 1/7 of the MLA rows); at GLM-5 width (78 layers + 1 MTP)
the MTP layer's row and indexer key are 1152 + 256 B of ~107 KB a token a worker (NOTES): ~1.3 % of the pool that
``gpu_memory_utilization`` sizes, of every host-tier save / load and every disaggregated transfer."""
from __future__ import annotations

import _h
import torch
from _h import check, greedy, make_engine, run
from models.cache import KVCache

m = _h.model()
cfg = m.config
L = cfg.num_hidden_layers
eng = make_engine(caching=True, k=0, host=16, blocks=12, bs=16)
runner = eng.executor.runner
# several prompts, a host tier that saves and loads back
run(eng, {f"r{i}": (_h.ids(40 + 7 * i, 40 + i), greedy(12)) for i in range(3)})
run(eng, {"big": (_h.ids(150, 50), greedy(10))})

names = [f"kv[{i}]" for i in range(len(runner.cache.kv))] + \
    [f"index_k[{i}]" for i, t in enumerate(runner.cache.index_k) if t is not None]
untouched = [n for n, t in zip(names, runner.cache.tensors()) if not t.any()]
total = sum(t.numel() * t.element_size() for t in runner.cache.tensors())
dead = sum(t.numel() * t.element_size() for n, t in zip(names, runner.cache.tensors()) if n in untouched)
print(f"speculative_tokens 0: cache tensors {len(names)}, never written: {untouched} "
      f"({dead} of {total} bytes, {100 * dead / total:.1f} %)")
host_dead = sum(h.numel() * h.element_size() for (d, h), n in zip(runner.host.tensors, names) if n in untouched)
print(f"host tier: {host_dead} of {sum(h.numel() * h.element_size() for _, h in runner.host.tensors)} bytes "
      "are copies of those")
per = KVCache.bytes_per_slot(cfg, torch.float32)
print(f"bytes_per_slot (what fit_kv_blocks sizes the pool by): {per}; without layer {L} (the MTP layer): "
      f"{per - dead // runner.cache.num_slots}")
layout = eng.kv_layout or KVCache.layout(cfg, torch.float32)
print(f"the disaggregated KV layout lists {len(layout)} tensors (the MTP layer's included)")
print("at GLM-5 width: 1152 + 256 B of ~107 KB a token a worker (NOTES) = "
      f"{100 * (1152 + 256) / 107e3:.1f} % of the pool, host copies and transfers")
check(not untouched, "a non-speculative engine allocates no KV that no step writes")
_h.done()
