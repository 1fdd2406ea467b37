"""The drafter's own state (the MTP layer's KV), which output equality cannot see — a wrong MTP cache only lowers the
acceptance. Oracle: greedy drafts are a function of the committed tokens, so the drafts proposed after the same
committed tokens must be the same however the KV got there:
  A  the request fresh on an engine without prefix caching (twice: the drafts repeat exactly);
  B  the same prompt again on a caching engine after it ran once (its prompt blocks — main and MTP KV — reused);
  C  its prompt + the first m output tokens as a new prompt (m = 9, 17, 24): blocks whose KV verify steps wrote —
     accepted drafts' rows, the last valid row's MTP row with the bonus token — are reused;
  D  preempted by a higher-priority arrival on a small pool and recomputed (prompt + output in one prefill);
  E  its prefix evicted to the host tier and loaded back (``host_blocks``);
  F  a 2-rank engine (each rank a whole-model runner) where it runs on rank 1 after rank 0's request;
per block size 4 and 16 and k = 3, on the eager drafter and on the static graph-shaped path (``cuda_graphs: eager``).
Drafts keyed by the output length they follow; any difference at a common key is reported.

    PYTHONPATH=. .venv/bin/python bench/results/session60/review_spec/c7_drafts_after_reuse.py
"""
from __future__ import annotations

import torch

import _s
from _s import SamplingParams, check, collect, make_engine, tok
from workers.runner import ModelRunner

K = 3
TEXTS = ["And it came to pass, when", "The old man said unto the king", "Thou shalt not", "A hacker is a person who"]


class Drafts:
    """Wraps an engine's executor: {req_id: {output length: drafts}} from every step's results."""

    def __init__(self, eng):
        self.eng, self.inner, self.by = eng, eng.executor, {}
        eng.executor = self

    def execute(self, steps):
        results = self.inner.execute(steps)
        for step, res in zip(steps, results):
            for s in step.seqs:
                if s.req_id in res.drafts and s.req_id in res.sampled:
                    self.by.setdefault(s.req_id, {})[s.num_generated + len(res.sampled[s.req_id])] = \
                        list(res.drafts[s.req_id])
        return results

    def recover(self):
        self.inner.recover()

    @property
    def runner(self):
        return self.inner.runner

    @property
    def runners(self):
        return getattr(self.inner, "runners", [self.inner.runner])


def engine(**kw):
    eng = make_engine(k=K, **kw)
    return eng, Drafts(eng)


def make_engine_host(host, **kw):
    """make_engine with a host tier of ``host`` blocks (the runner's copies and the scheduler's pool both)."""
    from cluster.detok import TextOf
    from cluster.engine import Engine, LocalExecutor
    from cluster.local import guides
    from scheduler.scheduler import SchedulerConfig
    m, t = _s.model(), tok()
    blocks, bs = kw.get("blocks", 64), kw.get("bs", 16)
    runner = ModelRunner(m, blocks, bs, torch.float32, speculative=True, host_blocks=host,
                         graphs="eager" if kw.get("graphs") else "off")
    eos = sorted(set(m.config.eos_token_ids) | set(t.eos_token_ids))
    cfg = SchedulerConfig(num_blocks=blocks, block_size=bs, max_model_len=kw.get("mml") or blocks * bs,
                          vocab_size=m.config.vocab_size, eos_token_ids=tuple(eos), max_num_seqs=8,
                          max_num_batched_tokens=512, prefix_caching=True, host_blocks=host)
    return Engine(LocalExecutor(runner), cfg, TextOf(t), speculative_tokens=K, graphs=bool(kw.get("graphs")),
                  special_ids=t.special_ids, guides=guides(t, m.config, cfg))


def compare(tag, want: dict, got: dict, offset: int = 0):
    common = [n for n in got if n + offset in want]
    diff = [n for n in common if got[n] != want[n + offset]]
    ok = check(len(common) > 0 and not diff,
               f"{tag}: drafts equal at {len(common) - len(diff)} of {len(common)} output lengths"
               + (f"; differ at {diff[:6]}: got {[got[n] for n in diff[:3]]} want "
                  f"{[want[n + offset] for n in diff[:3]]}" if diff else ""))
    return ok


def main():
    _s.model()
    for graphs in (False, True):
        for bs in (4, 16):
            for text in TEXTS:
                prompt = tok().encode(text)
                p = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
                tag = f"graphs={graphs} bs={bs} {text[:16]!r}"
                # A: fresh, twice
                e, d = engine(bs=bs, caching=False, graphs=graphs)
                out = collect(e, {"a": (prompt, p)})["a"]["tokens"]
                collect(e, {"a2": (prompt, p)})
                want = d.by["a"]
                compare(f"{tag} A again", want, d.by["a2"])
                # B: the prompt's blocks reused
                e, d = engine(bs=bs, caching=True, graphs=graphs)
                collect(e, {"b0": (prompt, p)})
                collect(e, {"b": (prompt, p)})
                compare(f"{tag} B prompt cached", want, d.by["b"])
                # C: prompt + first m outputs cached (KV written by verify steps)
                for m in (9, 17, 24):
                    got = collect(e, {f"c{m}": (prompt + out[:m], SamplingParams(max_tokens=40 - m, temperature=0.0,
                                                                               ignore_eos=True))})[f"c{m}"]
                    check(got["tokens"] == out[m:], f"{tag} C m={m}: tokens equal")
                    hit = got["cached"]
                    compare(f"{tag} C m={m} (cached {hit} of {len(prompt) + m})", want, d.by[f"c{m}"], offset=m)
                # D: preempted and recomputed
                need = -(-(len(prompt) + 40) // bs)
                e = make_engine(k=K, bs=bs, blocks=need + 1, caching=False, graphs=graphs, policy="priority")
                d = Drafts(e)
                intruder = _s.ids(need * bs - 8, 7)
                collect(e, {"d": (prompt, p)}, schedule={6: [("vip", intruder, SamplingParams(
                    max_tokens=4, temperature=0.0, ignore_eos=True, priority=-1))]})
                check(e.stats["preemptions"] > 0, f"{tag} D: preempted ({e.stats['preemptions']})")
                compare(f"{tag} D recomputed", want, d.by["d"])
                # E: evicted to the host tier and loaded back
                e = make_engine_host(64, bs=bs, blocks=need + 1, graphs=graphs)
                d = Drafts(e)
                collect(e, {"e0": (prompt + out[:17], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))})
                collect(e, {"filler": (_s.ids(need * bs - 8, 3), SamplingParams(max_tokens=2, temperature=0.0))})
                got = collect(e, {"e": (prompt + out[:17], SamplingParams(max_tokens=23, temperature=0.0,
                                                                         ignore_eos=True))})["e"]
                loads = sum(s.host_loads for s in e.schedulers)
                compare(f"{tag} E host tier (loads {loads}, cached {got['cached']})", want, d.by["e"], offset=17)
                # F: two ranks, the request on rank 1
                e = make_engine(k=K, bs=bs, ranks=2, caching=False, graphs=graphs)
                d = Drafts(e)
                collect(e, {"f0": (_s.ids(30, 5), SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)),
                            "f": (prompt, p)})
                check(e._rank_of.get("f") is None, f"{tag} F ran")
                compare(f"{tag} F second rank", want, d.by["f"])
    _s.done()


if __name__ == "__main__":
    main()
