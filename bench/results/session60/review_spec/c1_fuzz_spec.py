"""Differential random-workload driver of speculative decoding (MTP, k = 1..3) on the real tiny model (fp32, CPU,
in-process engines, no Ray).

Each workload draws an engine (block size, a pool small enough to preempt, prefix caching, step budget, seats, static
graph-shaped steps (``cuda_graphs: eager``) with or without look-ahead, fcfs / priority, 1 or 2 ranks) and 1–4
requests arriving at random steps — prompts of corpus text or random ids, sometimes sharing a head or repeated (prefix
hits) — some aborted at a random step. Parameters: greedy or seeded sampling (temperature, top-p / top-k / min-p,
presence / frequency / repetition penalties), max_tokens 1..40, stop strings and stop_token_ids *taken from the
request's own reference output* (so they land inside accepted draft runs), include_stop_str_in_output, min_tokens,
logprobs / top_logprobs, logit_bias, allowed_token_ids, ignore_eos, priorities.

Oracles, per request: the same request run alone on a plain engine (k = 0) — tokens, text, finish_reason, stop_str,
num_output_tokens, logprob values (|diff| < 1e-4) and top-logprob ids; an aborted one's tokens a prefix of it. The same
workload on the same engine with k = 0 is run too, so a difference that is not speculation's shows as such. Near-ties:
a greedy token mismatch where the reference's top-2 raw margin is < 1e-4 is reported as a tie, not a failure.
Per workload: the pool idle and every map / runner empty after; generated_tokens == the tokens emitted; accepted ≤
proposed ≤ rounds · k; per-position acceptance non-increasing in count.

    PYTHONPATH=. .venv/bin/python bench/results/session60/review_spec/c1_fuzz_spec.py --seed 0 --n 40
"""
from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace

import _s
from _s import SamplingParams, check, collect, idle, make_engine, tok

TEXTS = ["The old man said unto the king", "In the beginning God created", "Python is a programming language that",
         "A hacker is a person who", "The perl interpreter reads", "And it came to pass, when", "The list method",
         "Thou shalt not", "To be or not to be", "The function returns a", "He that hath ears", "Perl is a",
         "A dictionary is", "The Lord is my shepherd", "When the program", "Never trust a"]

_REF: dict = {}


def reference(prompt, params):
    """The request alone on a plain engine: (out, margins) — margins: the raw top-2 gap at each output position."""
    key = (tuple(prompt), params)
    if key in _REF:
        return _REF[key]
    want = params.logprobs
    eng = make_engine(k=0, blocks=64, bs=16, caching=False, mml=256)
    p = replace(params, logprobs=max(2, want or 0), priority=0)
    o = collect(eng, {"ref": (prompt, p)})["ref"]
    margins = [(t[0][1] - t[1][1]) if len(t) > 1 else 1.0 for t in o["tops"]]
    if want is None:
        o["lps"], o["tops"] = [], []
    else:
        o["tops"] = [t[:want] for t in o["tops"]]
    _REF[key] = (o, margins)
    return _REF[key]


def draw_engine(rng):
    bs = rng.choice([4, 8, 16])
    mml = 128
    need = -(-mml // bs)
    return dict(bs=bs, mml=mml, blocks=rng.choice([need, need + 2, 2 * need, 4 * need]),
                caching=rng.random() < 0.6, budget=rng.choice([6, 13, 32, 512]), seqs=rng.choice([1, 2, 3, 4]),
                graphs=rng.random() < 0.3, lookahead=rng.random() < 0.7, policy=rng.choice(["fcfs", "priority"]),
                ranks=rng.choice([1, 1, 1, 2]))


def draw_prompt(rng, bases):
    r = rng.random()
    if r < 0.6:
        s = rng.choice(TEXTS)
        if rng.random() < 0.3:
            s = s + " " + rng.choice(TEXTS)
        return tok().encode(s)
    if r < 0.7 and bases:
        base = rng.choice(bases)
        return base[:rng.randrange(1, len(base) + 1)] + _s.ids(rng.randrange(0, 12), rng.randrange(10**6))
    return _s.ids(rng.randrange(2, 60), rng.randrange(10**6))


def draw_params(rng, prompt, cfg):
    room = cfg["mml"] - len(prompt)
    mt = min(room, rng.choice([1, 2, 3, 4, 5, 7, 9, 16, 24, 40, 40, 60]))
    if rng.random() < 0.1:
        mt = room           # ends exactly at max_model_len
    seeded = rng.random() < 0.35
    kw = dict(max_tokens=mt, temperature=0.0, ignore_eos=rng.random() < 0.5)
    if seeded:
        kw.update(temperature=rng.choice([0.5, 0.8, 1.0, 1.3]), seed=rng.randrange(2**31))
        if rng.random() < 0.4:
            kw["top_p"] = rng.choice([0.5, 0.9])
        if rng.random() < 0.4:
            kw["top_k"] = rng.choice([1, 5, 40])
        if rng.random() < 0.3:
            kw["min_p"] = rng.choice([0.05, 0.2])
    if rng.random() < 0.3:
        which = rng.choice(["presence_penalty", "frequency_penalty", "repetition_penalty"])
        kw[which] = rng.choice([0.5, 1.2, 1.5] + ([] if which == "repetition_penalty" else [-0.8, -2.0]))
    if rng.random() < 0.35:
        kw["logprobs"] = rng.choice([0, 1, 3])
    if rng.random() < 0.15:
        kw["logit_bias"] = tuple((rng.randrange(6144), rng.choice([-100.0, -5.0, 3.0])) for _ in range(3))
    if rng.random() < 0.1:
        kw["min_tokens"] = rng.randrange(1, max(2, mt))
    if cfg["policy"] == "priority" and rng.random() < 0.5:
        kw["priority"] = rng.choice([-1, 0, 1])
    params = SamplingParams(**kw)
    # stops / allowed ids from the request's own reference output (so they land inside accepted runs)
    base, _ = reference(prompt, replace(params, min_tokens=0, min_tokens_ban=(), priority=0))
    toks, text = base["tokens"], base["text"]
    if rng.random() < 0.08 and toks:
        allowed = sorted(set(toks) | {rng.randrange(6144) for _ in range(3)})
        params = replace(params, allowed_token_ids=tuple(allowed))
    if rng.random() < 0.3 and len(text) > 3:
        a = rng.randrange(len(text) - 2)
        s = text[a:a + rng.randrange(1, 6)]
        if s.strip():
            params = replace(params, stop=(s,), include_stop_str_in_output=rng.random() < 0.5)
    if rng.random() < 0.25 and len(toks) > 1:
        params = replace(params, stop_token_ids=(rng.choice(toks[1:]),))
    return params


def short(p):
    """A SamplingParams' fields that differ from the defaults."""
    d = SamplingParams()
    return "SP(" + ", ".join(f"{f}={getattr(p, f)!r}" for f in p.__dataclass_fields__
                             if getattr(p, f) != getattr(d, f)) + ")"


def compare(tag, got, ref, margins, aborted=False):
    """(status, message): status 'ok' | 'tie' | 'fail'."""
    rt, gt = ref["tokens"], got["tokens"]
    if got["error"]:
        return "fail", f"{tag}: error {got['error']}"
    if aborted:
        if gt != rt[:len(gt)]:
            i = next(i for i, (a, b) in enumerate(zip(gt, rt + [None] * len(gt))) if a != b)
            if i < len(margins) and margins[i] < 1e-4:
                return "tie", f"{tag}: aborted, tie at {i}"
            return "fail", f"{tag}: aborted output not a prefix of the reference (at {i}: {gt[i]} vs {rt[i:i+1]})"
        return "ok", ""
    if gt != rt:
        i = next((i for i, (a, b) in enumerate(zip(gt, rt)) if a != b), min(len(gt), len(rt)))
        if i < len(margins) and margins[i] < 1e-4 and i < min(len(gt), len(rt)):
            return "tie", f"{tag}: tie at {i} (margin {margins[i]:.2e})"
        return "fail", (f"{tag}: tokens differ at {i}: got {gt[max(0, i-2):i+4]} ({len(gt)}, {got['reason']}) "
                        f"want {rt[max(0, i-2):i+4]} ({len(rt)}, {ref['reason']})")
    for f in ("text", "reason", "stop_str", "n_out"):
        if got[f] != ref[f]:
            return "fail", f"{tag}: {f} {got[f]!r} != reference {ref[f]!r}"
    if len(got["lps"]) != len(ref["lps"]):
        return "fail", f"{tag}: {len(got['lps'])} logprob entries, reference {len(ref['lps'])}"
    for i, (a, b) in enumerate(zip(got["lps"], ref["lps"])):
        if abs(a - b) > 1e-4:
            return "fail", f"{tag}: logprob {i} {a} vs {b}"
    for i, (a, b) in enumerate(zip(got["tops"], ref["tops"])):
        if [t for t, _ in a] != [t for t, _ in b]:
            vals = sorted(v for _, v in b)
            close = any(abs(x - y) < 1e-4 for x, y in zip(vals, vals[1:]))
            if not close:
                return "fail", f"{tag}: top ids {i} {a} vs {b}"
        if any(abs(x[1] - y[1]) > 1e-4 for x, y in zip(a, b)):
            return "fail", f"{tag}: top values {i}"
    return "ok", ""


def run_workload(seed: int, tally: dict, verbose: bool, modes=("mixed", "mixed", "solo-long", "n")):
    rng = random.Random(seed)
    cfg = draw_engine(rng)
    k = rng.choice([1, 2, 3])
    nreq = rng.choice([1, 1, 1, 2, 2, 3, 4])
    mode = rng.choice(modes)
    if mode == "pressure":            # several long outputs in a pool that holds about one: preemptions, then solo
        nreq = rng.choice([2, 3, 4])
        cfg.update(blocks=-(-cfg["mml"] // cfg["bs"]) + rng.choice([0, 1]), seqs=4, budget=rng.choice([32, 512]))
    if mode == "solo-long":
        nreq = 1
    bases = []
    reqs = []
    for i in range(nreq):
        if mode == "n" and i > 0:         # n > 1: the same prompt, seed + i (the API's choices)
            prompt = reqs[0][1]
            p0 = reqs[0][2]
            params = replace(p0, seed=None if p0.seed is None else p0.seed + i)
        else:
            prompt = draw_prompt(rng, bases)
            params = draw_params(rng, prompt, cfg)
            if mode == "solo-long":
                params = replace(params, max_tokens=min(cfg["mml"] - len(prompt), rng.choice([40, 60, 90])),
                                 min_tokens=0)
            if mode == "pressure":        # each fills the context: the pool holds one at a time
                params = replace(params, max_tokens=cfg["mml"] - len(prompt) - rng.choice([0, 5, 20]),
                                 min_tokens=0, ignore_eos=True)
        bases.append(prompt)
        at = 0 if i == 0 or mode in ("n", "pressure") else rng.choice([0, 0, 1, 3, 6, 10, 20])
        abort = rng.choice([None] * 6 + [1, 2, 4, 8])
        reqs.append((f"r{i}", prompt, params, at, abort))
    schedule: dict = {}
    for rid, prompt, params, at, abort in reqs:
        schedule.setdefault(at, []).append((rid, prompt, params))
        if abort is not None:
            schedule.setdefault(at + abort, []).append(("abort", rid))
    desc = f"seed {seed}: k={k} {mode} {cfg} reqs={[(r, p if len(p) < 16 else len(p), short(pa), at, ab) for r, p, pa, at, ab in reqs]}"
    if verbose:
        print(desc, flush=True)
    results = {}
    for kk in (0, k):
        eng = make_engine(k=kk, **cfg)
        out = collect(eng, schedule=schedule)
        st = eng.stats
        emitted = sum(len(o["tokens"]) for o in out.values())
        bad = idle(eng)
        if bad:
            tally["fail"].append(f"seed {seed} k={kk}: not idle: {bad}")
        if st["generated_tokens"] != emitted:
            tally["fail"].append(f"seed {seed} k={kk}: generated_tokens {st['generated_tokens']} != emitted {emitted}")
        if kk:
            m = eng.spec_metrics()
            if not (m["accepted"] <= m["proposed"] <= m["rounds"] * kk):
                tally["fail"].append(f"seed {seed}: accepted {m['accepted']} proposed {m['proposed']} "
                                     f"rounds {m['rounds']} k {kk}")
            acc = eng.accepted_at[:kk]
            if any(a < b for a, b in zip(acc, acc[1:])) or sum(acc) != m["accepted"]:
                tally["fail"].append(f"seed {seed}: accepted_at {eng.accepted_at} vs accepted {m['accepted']}")
            tally["rounds"] += m["rounds"]
            tally["preemptions"] += st["preemptions"]
            tally["moves"] += st["moves"]
            tally["accepted"] += m["accepted"]
        results[kk] = out
    for rid, prompt, params, at, abort in reqs:
        full = replace(params, min_tokens_ban=(), priority=0)
        ref, margins = reference(prompt, full)
        for kk in (0, k):
            got = results[kk][rid]
            aborted = got.get("aborted_at") is not None
            status, msg = compare(f"seed {seed} {rid} k={kk}", got, ref, margins, aborted)
            if status == "fail" and kk == k and results[0][rid]["tokens"] == got["tokens"] and not aborted:
                # the same as the plain run of the same workload: not speculation's
                msg = "[also plain] " + msg
                status = "plain"
            tally["requests"] += 1
            if status != "ok":
                tally[status].append(msg + ("" if status == "tie" else f"\n      {desc}"))
                if verbose:
                    print("   ", status, msg, flush=True)
    tally["workloads"] += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--modes", default="mixed,mixed,solo-long,n",
                    help="workload kinds to draw from: mixed, solo-long, n (choices of one prompt), pressure")
    a = ap.parse_args()
    _s.model()
    tally = {"preemptions": 0, "moves": 0, "workloads": 0, "requests": 0, "rounds": 0, "accepted": 0, "fail": [], "tie": [], "plain": []}
    t0 = time.time()
    for s in range(a.seed, a.seed + a.n):
        run_workload(s, tally, a.verbose, tuple(a.modes.split(",")))
    print(f"\n{tally['workloads']} workloads, {tally['requests']} request runs, {tally['rounds']} verify rounds, "
          f"{tally['accepted']} drafts accepted, {tally['preemptions']} preemptions and {tally['moves']} rank moves "
          f"in the speculative runs, {time.time() - t0:.0f} s")
    print(f"ties (near-equal top-2, not failures): {len(tally['tie'])}")
    for m in tally["tie"]:
        print("  ", m)
    print(f"differences shared by the plain run of the workload: {len(tally['plain'])}")
    for m in tally["plain"]:
        print("  ", m)
    for m in tally["fail"]:
        check(False, m)
    check(not tally["fail"], "no speculative difference")
    _s.done()


if __name__ == "__main__":
    main()
