"""Endings placed at every position of accepted draft runs, systematically. For 8 corpus prompts (high acceptance) and
k = 1, 2, 3: the speculative run's events give the runs (several tokens committed in one step); for every output
position i that is not the last of its run — and the last ones too — the request again with
  * max_tokens = i + 1,
  * stop_token_ids = (token i,) (where it does not occur before i), with and without min_tokens = i,
  * a stop string: the last 1–3 characters of the text up to token i (where they occur nowhere before), with and
    without include_stop_str_in_output,
  * logprobs 2 on all of them,
each against the same request on the plain engine: tokens, text, finish_reason, stop_str, usage and logprobs (1e-4).

    PYTHONPATH=. .venv/bin/python bench/results/session60/review_spec/c6_stops_inside_runs.py [--full]

By default k = 1 and 3 over the first 3 prompts (a few minutes); ``--full``: k = 1, 2, 3 over all 8 (~15 min on the
2-core machine; its log is c6_stops_inside_runs_full.log).
"""
from __future__ import annotations

import sys
from dataclasses import replace

import _s
from _s import SamplingParams, check, collect, idle, make_engine, tok

TEXTS = ["The old man said unto the king", "In the beginning God created", "And it came to pass, when",
         "Thou shalt not", "He that hath ears", "The Lord is my shepherd", "And the LORD spake unto Moses, saying",
         "Python is a programming language that"]


def events_of(eng, prompt, params):
    eng.add_request(prompt, params, "x")
    evs = []
    while eng.has_unfinished():
        evs += [ev for ev in eng.step() if ev.req_id == "x"]
    return evs


def main():
    _s.model()
    plain = make_engine(k=0)
    cases = mismatches = 0
    inside = 0
    every = "--full" in sys.argv
    for k in (1, 2, 3) if every else (1, 3):
        spec = make_engine(k=k)
        for text in TEXTS if every else TEXTS[:3]:
            prompt = tok().encode(text)
            base = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=2)
            evs = events_of(spec, prompt, base)
            toks = [t for ev in evs for t in ev.token_ids]
            ends = []          # positions that end a committed run, and where each run started
            pos = 0
            for ev in evs:
                if ev.token_ids:
                    ends.append((pos, pos + len(ev.token_ids) - 1))
                    pos += len(ev.token_ids)
            full = collect(plain, {"f": (prompt, base)})["f"]
            alltext = full["text"]
            for start, end in ends:
                for i in range(start, end + 1):
                    inside += i < end
                    variants = [replace(base, max_tokens=i + 1)]
                    if toks[i] not in toks[:i]:
                        variants += [replace(base, stop_token_ids=(toks[i],)),
                                     replace(base, stop_token_ids=(toks[i],), min_tokens=i)]
                    upto = tok().decode(toks[:i + 1], skip_special_tokens=True)
                    for n in (1, 2, 3):
                        s = upto[-n:]
                        if s.strip() and s not in upto[:-1] and upto.endswith(s):
                            variants += [replace(base, stop=(s,)), replace(base, stop=(s,),
                                                                         include_stop_str_in_output=True)]
                            break
                    for p in variants:
                        want = collect(plain, {"r": (prompt, p)})["r"]
                        got = collect(spec, {"r": (prompt, p)})["r"]
                        cases += 1
                        diff = [f for f in ("tokens", "text", "reason", "stop_str", "n_out", "error")
                                if got[f] != want[f]]
                        if len(got["lps"]) != len(want["lps"]) or any(
                                abs(a - b) > 1e-4 for a, b in zip(got["lps"], want["lps"])):
                            diff.append("logprobs")
                        if diff:
                            mismatches += 1
                            check(False, f"k={k} {text!r} pos {i} (run {start}-{end}) {p.max_tokens=} "
                                         f"{p.stop_token_ids=} {p.stop=} {p.min_tokens=}: {diff}: "
                                         f"{[(f, got[f], want[f]) for f in diff if f != 'logprobs']}")
        check(not idle(spec), f"k={k}: engine idle after")
    check(not idle(plain), "plain engine idle after")
    check(mismatches == 0, f"{cases} cases ({inside} positions inside runs), {mismatches} differ from plain")
    _s.done()


if __name__ == "__main__":
    main()
