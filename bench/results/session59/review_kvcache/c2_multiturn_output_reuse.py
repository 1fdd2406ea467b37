"""Multi-turn reuse of *generated* tokens' KV: turn 2's prompt is turn 1's prompt + turn 1's answer + a new tail, so
its cached blocks include blocks written by decode steps — verify rounds with rejected drafts (MTP, k = 2 / 3), look-ahead
graph steps (slack positions written ahead), FP8 rows, a small pool with a host tier (the answer's blocks evicted to
host memory and loaded back). Oracle: turn 2's greedy tokens equal turn 2 run alone on an engine without prefix
caching; the hits cover the answer's blocks; the pool is idle after."""
from __future__ import annotations

import itertools

import _h
from _h import check, greedy, make_engine, run

V = _h.model().config.vocab_size


def alone(prompt, n, fp8):
    return run(make_engine(caching=False, blocks=16, fp8=fp8), {"x": (prompt, greedy(n))})["x"]


for k, graphs, fp8, host, bs in [(0, False, False, 0, 16), (2, False, False, 0, 8), (3, False, False, 60, 4),
                                 (0, True, False, 0, 4), (0, True, True, 30, 8), (3, False, True, 0, 16),
                                 (2, False, False, 16, 16)]:
    blocks = 96 // bs + (2 if host else 24)     # with a host tier: a pool the turns' other prompts evict
    eng = make_engine(caching=True, k=k, graphs=graphs, fp8=fp8, host=host, bs=bs, blocks=blocks, budget=64,
                      seqs=2, mml=96)
    p1 = _h.ids(23, 11)
    a1 = run(eng, {"t1": (p1, greedy(30))})["t1"]
    if host:        # another conversation pushes turn 1 out of the device pool
        run(eng, {"o": (_h.ids(60, 12), greedy(20))})
    p2 = p1 + a1 + _h.ids(9, 13)
    out, cached = run(eng, {"t2": (p2, greedy(20))}, usage=True)
    ref = alone(p2, 20, fp8)
    tag = f"k={k} graphs={graphs} fp8={fp8} host={host} bs={bs}"
    check(out["t2"] == ref, f"{tag}: turn 2 == alone without the cache")
    want = (len(p1) + len(a1) - 1) // bs * bs      # every whole block of turn 1's prompt + answer but the last token's
    check(cached["t2"] >= want - bs, f"{tag}: turn 2 found {cached['t2']} tokens cached (turn 1 computed {want})")
    check(not _h.pool_idle(eng), f"{tag}: pool idle after ({_h.pool_idle(eng)})")
_h.done()
