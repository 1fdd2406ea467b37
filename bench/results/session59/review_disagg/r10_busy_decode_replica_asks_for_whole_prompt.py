"""A decode replica whose seats are all taken (``max_num_seqs`` running or promised to waiting requests — any loaded
replica) asks the prefill tier for a conversation's next turn from position 0 — the whole prompt's KV computed (or
looked up) there and moved — although it holds the earlier turns cached. ``Engine.hold_prefix`` looks only at ranks
with a free seat (``s.free_seats > 0``); with none it returns ``HeldPrefix()`` (start 0), whereas the request is then
placed on a rank anyway (``add_request``: ``loads = ... or seats or loads``) — on a one-rank replica the only rank,
the one holding the prefix. The README: "it asks a prefill replica for the KV of the rest only".

Driver: the real Coordinators in-process (``harness.py``), decode ``max_num_seqs`` 2. Turn 1 (~250 tokens) runs; turn
2 (turn 1 + its answer + ~60 tokens) is sent twice: once with the seats free, once while two other requests hold
both seats. Both answers equal a plain replica's; what is asked for differs.

Exit 1 while the busy replica asks for the prompt from 0 (more KV exported and moved than the part it lacks); 0
once it asks for the rest only."""

from __future__ import annotations

import asyncio
import sys

sys.path.insert(0, "/work/main/bench/results/session59/review_disagg")
from harness import DEFAULT_MODEL, collect, counters, make_pair, plain, shutdown, tokens  # noqa: E402

from cluster.local import load_tokenizer  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402

TK = load_tokenizer(DEFAULT_MODEL)
STORY = "Once upon a time, in a quiet village by the sea, there lived a fisherman and his wife. "
P = SamplingParams(max_tokens=8, temperature=0.0)
BUSY = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)


async def scenario(coord, busy: bool, tag: str, pre=None, tier=None):
    turn1 = TK.encode(f"[{tag}] " + STORY * 9)
    a1 = tokens(await collect(coord, turn1, P, f"{tag}-t1"))
    turn2 = turn1 + a1 + TK.encode(" And then the fisherman said to his wife: " + STORY * 2)
    held = []
    if busy:
        held = [asyncio.ensure_future(collect(coord, TK.encode(f"The old man {i}"), BUSY, f"{tag}-busy{i}"))
                for i in range(2)]
        while counters(coord)["running"] < 2:
            await asyncio.sleep(0.01)
    before = pre.engine.stats["kv_exported_tokens"] if pre else 0
    a2 = tokens(await collect(coord, turn2, P, f"{tag}-t2"))
    exported = (pre.engine.stats["kv_exported_tokens"] - before) if pre else 0
    asked = [c for c in tier.calls if c[0] == f"{tag}-t2"] if tier else []
    for t in held:
        t.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    return len(turn1), len(turn2), a1, a2, asked, exported


def main() -> int:
    d = {"max_num_seqs": 2}
    ref = plain(d)
    want = {b: asyncio.run(scenario(ref, b, "busy" if b else "idle"))[2:4] for b in (False, True)}
    shutdown(ref)
    dec, pre, tier = make_pair(decode=d, prefill={"max_num_seqs": 8})
    bad = False
    for busy in (False, True):
        tag = "busy" if busy else "idle"
        n1, n2, a1, a2, asked, exported = asyncio.run(scenario(dec, busy, tag, pre, tier))
        start = asked[0][1] if asked else None
        lacks = (n2 - 1) // 16 * 16 - (n1 - 1) // 16 * 16
        print(f"{'both seats taken' if busy else 'seats free':17s}: turn 2 ({n2} tokens; turn 1's {n1} cached on the "
              f"decode replica) asked from position {start}; the prefill replica exported {exported} tokens of KV "
              f"(the decode replica lacked {lacks}); answers equal a plain replica's: {(a1, a2) == want[busy]}")
        if (a1, a2) != want[busy]:
            bad = True
        if asked and (start == 0 or exported > lacks):
            bad = True
    print("decode", counters(dec), "prefill", counters(pre))
    shutdown(dec, pre)
    print("RESULT:", "DEFECT: a busy decode replica asks for (and moves) the whole prompt's KV, not the rest it lacks"
          if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
