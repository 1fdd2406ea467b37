"""Disaggregated prefill with MTP drafts: a decode replica (k = 3) whose prompts' KV — the MTP layer's rows included —
a prefill replica computed (session 59's in-process harness: the real ``Coordinator.generate`` / ``prefill``, no Ray)
against a plain replica with the same k: the same tokens, and the same *drafts* after the same committed tokens (the
imported MTP rows are what the drafter reads first: wrong ones would only lower the acceptance, which output equality
cannot see). Prompts of several lengths (block edges), decode / prefill block sizes 16/16, 16/24, 8/40; greedy.

    PYTHONPATH=. .venv/bin/python bench/results/session60/review_spec/c8_disagg_drafts.py
"""
from __future__ import annotations

import asyncio
import sys

import _s
from _s import ROOT, SamplingParams, check, tok

sys.path.insert(0, f"{ROOT}/bench/results/session59/review_disagg")
from harness import collect, make_pair, plain, shutdown, tokens  # noqa: E402

from c7_drafts_after_reuse import Drafts, compare  # noqa: E402

STORY = "And it came to pass, when the king heard the words of the prophet, that he rent his clothes. "


def main():
    prompts = [tok().encode(STORY * n + "And the LORD said") for n in (1, 2, 3)]
    prompts.append(tok().encode(STORY)[:32])                 # a prompt of exactly two 16-blocks
    p = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    for dbs, pbs in ((16, 16), (16, 24), (8, 40)):
        d = {"block_size": dbs, "speculative_tokens": 3}
        ref = plain(d)
        rd = Drafts(ref.engine)
        want = {}
        for i, ids in enumerate(prompts):
            want[i] = tokens(asyncio.run(collect(ref, ids, p, f"p{i}")))
        shutdown(ref)
        dec, pre, tier = make_pair(decode=d, prefill={"block_size": pbs, "max_num_batched_tokens": 64,
                                                      "speculative_tokens": 3})
        dd = Drafts(dec.engine)
        for i, ids in enumerate(prompts):
            got = tokens(asyncio.run(collect(dec, ids, p, f"d{i}")))
            check(got == want[i], f"decode {dbs} / prefill {pbs}, prompt {len(ids)} tokens: tokens equal")
            compare(f"decode {dbs} / prefill {pbs}, prompt {len(ids)} tokens", rd.by[f"p{i}"], dd.by[f"d{i}"])
        check(dec.engine.stats["kv_imported_tokens"] > 0, f"decode {dbs} / prefill {pbs}: imported "
                                                          f"{dec.engine.stats['kv_imported_tokens']} tokens")
        shutdown(dec, pre)
    _s.done()


if __name__ == "__main__":
    main()
