"""Unseeded sampled requests with MTP drafts (rejection sampling; their tokens cannot be compared with plain decoding's)
against what must hold whatever is drawn: every token inside ``allowed_token_ids``; no id biased -100 ever drawn; a
top_k = 2 request's token always one of its row's two most likely (``top_logprobs`` of the raw row, no penalties);
min_p 1 and top_p 1e-9 give the row's argmax; no stop id nor EOS before ``min_tokens``, and only as the last token;
max_tokens kept; a stop string ends the text (``stop_str`` set, the text holds it nowhere — or, with include, only at its
end); one logprob per token, finite; usage = tokens; the pool idle and every map empty after.

    PYTHONPATH=. .venv/bin/python bench/results/session60/review_spec/c5_unseeded_invariants.py --n 60
"""
from __future__ import annotations

import argparse
import math
import random

import _s
from _s import SamplingParams, check, collect, idle, make_engine, tok

TEXTS = ["The old man said unto the king", "In the beginning God created", "Python is a programming language that",
         "A hacker is a person who", "And it came to pass, when", "Thou shalt not", "The function returns a"]


def draw(rng, eos):
    kw = dict(max_tokens=rng.choice([3, 8, 20, 40]), temperature=rng.choice([0.6, 1.0, 1.5]), logprobs=2,
              ignore_eos=rng.random() < 0.5)
    kind = rng.choice(["plain", "allowed", "bias", "topk2", "argmax", "min", "stop", "penalties"])
    if kind == "allowed":
        kw["allowed_token_ids"] = tuple(rng.sample(range(40, 6144), 6)) + tuple(eos[:1])
    elif kind == "bias":
        kw["logit_bias"] = tuple((t, -100.0) for t in rng.sample(range(40, 400), 30))
    elif kind == "topk2":
        kw["top_k"] = 2
    elif kind == "argmax":
        kw.update(rng.choice([{"min_p": 1.0}, {"top_p": 1e-9}]))
    elif kind == "min":
        kw.update(min_tokens=rng.randrange(1, kw["max_tokens"] + 1), ignore_eos=False,
                  stop_token_ids=(rng.choice([293, 315, 46]),))
    elif kind == "stop":
        kw.update(stop=(rng.choice([" the", ",", "e", "LORD", "\n"]),), include_stop_str_in_output=rng.random() < 0.5)
    else:
        kw[rng.choice(["presence_penalty", "frequency_penalty"])] = rng.choice([-1.0, 1.0])
        kw["repetition_penalty"] = rng.choice([0.8, 1.3])
    return kind, SamplingParams(**kw)


def verify_out(tag, kind, p, o, eos):
    bad = []
    toks = o["tokens"]
    if o["error"]:
        bad.append(f"error {o['error']}")
    if len(toks) > p.max_tokens or o["n_out"] != len(toks) or len(o["lps"]) != len(toks):
        bad.append(f"counts: {len(toks)} tokens, n_out {o['n_out']}, {len(o['lps'])} logprobs, max {p.max_tokens}")
    if any(not math.isfinite(x) for x in o["lps"]):
        bad.append("non-finite logprob")
    if p.allowed_token_ids and any(t not in p.allowed_token_ids for t in toks):
        bad.append(f"token outside allowed_token_ids: {[t for t in toks if t not in p.allowed_token_ids]}")
    banned = {t for t, b in p.logit_bias if b <= -100}
    if banned & set(toks):
        bad.append(f"a -100 biased id drawn: {banned & set(toks)}")
    if kind in ("topk2", "argmax"):
        n = 2 if kind == "topk2" else 1
        for i, (t, top) in enumerate(zip(toks, o["tops"])):
            if t not in [x for x, _ in top[:n]]:
                vals = [v for _, v in top]
                if not (len(vals) > n and abs(vals[n - 1] - vals[n]) < 1e-5):
                    bad.append(f"token {i} ({t}) not among its row's top {n}: {top}")
    stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos))
    for i, t in enumerate(toks):
        if t in stops and (i < p.min_tokens or i != len(toks) - 1):
            bad.append(f"stop id {t} at {i} (min_tokens {p.min_tokens}, {len(toks)} tokens)")
    if p.stop:
        s = p.stop[0]
        text = o["text"]
        if o["stop_str"] == s:
            if p.include_stop_str_in_output and not text.endswith(s):
                bad.append(f"stop {s!r} with include, text does not end with it: {text[-30:]!r}")
            if not p.include_stop_str_in_output and s in text:
                bad.append(f"stop {s!r} in the text: {text!r}")
        elif s in text:
            bad.append(f"stop string {s!r} in the text but not matched: {text!r} ({o['reason']})")
    summary = "; ".join(bad) if bad else f"{len(toks)} tokens, {o['reason']}"
    return check(not bad, f"{tag} {kind}: {summary}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    eos = sorted(set(_s.model().config.eos_token_ids) | set(tok().eos_token_ids))
    total = {k: 0 for k in (1, 2, 3)}
    for w in range(a.n):
        k = rng.choice([1, 2, 3])
        graphs = rng.random() < 0.3
        eng = make_engine(k=k, graphs=graphs, blocks=rng.choice([16, 64]), bs=rng.choice([8, 16]))
        nreq = rng.choice([1, 1, 2])
        reqs = {}
        for i in range(nreq):
            kind, p = draw(rng, eos)
            reqs[f"w{w}r{i}"] = (tok().encode(rng.choice(TEXTS)), p, kind)
        out = collect(eng, {rid: (pr, p) for rid, (pr, p, _) in reqs.items()})
        for rid, (_, p, kind) in reqs.items():
            verify_out(f"{rid} k={k} graphs={graphs}", kind, p, out[rid], eos)
        left = idle(eng)
        if left:
            check(False, f"w{w}: not idle: {left}")
        total[k] += eng.stats["drafts_accepted"]
    check(sum(total.values()) > 0, f"drafts accepted by rejection sampling: {total}")
    _s.done()


if __name__ == "__main__":
    main()
