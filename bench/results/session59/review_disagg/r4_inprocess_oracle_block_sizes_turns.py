"""In-process oracle (the real ``Coordinator.generate`` / ``_prefilled`` / ``prefill`` on the tiny model, no Ray:
``harness.py``): four conversations of three turns each, arriving together, through a decode + prefill pair whose
block sizes differ (16/24, 32/24, 8/40) or whose decode replica drafts with MTP (k = 2, 16/16), give exactly the
tokens of a plain replica with the decode replica's settings; a next turn asks only for the KV past what the decode
replica holds; a decode pool too small for the prompts at once (32 blocks, four 16-block prompts) answers the same;
after the load no block, pin, keep, ask or export is left on either side.

Exit 0 when all hold, 1 otherwise."""

from __future__ import annotations

import asyncio
import random
import sys

sys.path.insert(0, "/work/main/bench/results/session59/review_disagg")
from harness import DEFAULT_MODEL, collect, counters, make_pair, plain, shutdown, tokens  # noqa: E402

from cluster.local import load_tokenizer  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402

TK = load_tokenizer(DEFAULT_MODEL)
STORY = "Once upon a time, in a quiet village by the sea, there lived a fisherman and his wife. "


async def convo(coord, tag, seed):
    rng = random.Random(seed)
    out = []
    ids = TK.encode(f"[{seed}] " + STORY * rng.randint(1, 5))
    for turn in range(3):
        p = SamplingParams(max_tokens=rng.randint(3, 12), temperature=0.0)
        evs = await collect(coord, ids, p, f"{tag}-{seed}-{turn}")
        assert not evs[-1].error, evs[-1].error
        t = tokens(evs)
        out.append(t)
        ids = ids + t + TK.encode(" and then " + STORY[: rng.randint(5, 80)] * rng.randint(1, 3))
    return out


async def conversations(coord, tag):
    return await asyncio.gather(*[convo(coord, tag, s) for s in range(4)])


async def crowded(coord, tag):
    p = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    ps = [TK.encode(f"[{i}] " + STORY * 9) for i in range(4)]
    res = await asyncio.wait_for(asyncio.gather(*[collect(coord, ids, p, f"{tag}{i}") for i, ids in enumerate(ps)]),
                                 120)
    return [tokens(e) for e in res]


def clean(c: dict) -> bool:
    return c["free"] == c["blocks"] and not any(c[k] for k in ("pins", "kept", "running", "waiting", "asking",
                                                                  "exports"))


def main() -> int:
    bad = []
    for dbs, pbs, spec, work in [(16, 24, 0, conversations), (32, 24, 0, conversations), (8, 40, 0, conversations),
                                 (16, 16, 2, conversations), (16, 16, 0, crowded)]:
        d = {"block_size": dbs, "speculative_tokens": spec}
        if work is crowded:
            d.update(kv_cache_tokens=512, max_model_len=512, max_num_seqs=4)
        ref = plain(d)
        want = asyncio.run(work(ref, "p"))
        shutdown(ref)
        dec, pre, tier = make_pair(decode=d, prefill={"block_size": pbs, "max_num_batched_tokens": 64,
                                                      "max_num_seqs": 8, "kv_cache_tokens": 4096,
                                                      "max_model_len": 1024 if work is conversations else 512})
        got = asyncio.run(work(dec, "d"))
        cd, cp = counters(dec), counters(pre)
        ok = got == want and clean(cd) and clean(cp) and dec.engine.stats["kv_imported_tokens"] > 0
        # a next turn asks only for what is past the decode replica's cached prefix
        later = [c for c in tier.calls if c[0].endswith("-1") or c[0].endswith("-2")]
        ok = ok and (work is crowded or all(start > 0 for _, start, _ in later))
        print(f"{work.__name__}: decode bs {dbs}, prefill bs {pbs}, spec {spec}: "
              f"{'equal' if got == want else 'DIFFERENT'}; imported {dec.engine.stats['kv_imported_tokens']} tokens "
              f"in {len(tier.calls)} asks (later turns' starts {[c[1] for c in later]}); decode {cd}; prefill {cp}")
        if not ok:
            bad.append((dbs, pbs, spec, work.__name__))
            for a, b in zip(got, want):
                if a != b:
                    print("  got ", a, "\n  want", b)
        shutdown(dec, pre)
    print("RESULT:", "ok" if not bad else f"problems in {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
