"""Shared harness for the session-55 parser review scripts (no Ray, no model: the real Engine._emit over a scripted
executor, and the real Formatter's whole() and sse()).

Run a script from the repo root:
    RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 .venv/bin/python bench/results/session55/review/rN_x.py
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
sys.path.insert(0, ROOT)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from cluster.config import DEFAULT_MODEL  # noqa: E402
from cluster.engine import Engine, TokenEvent  # noqa: E402
from cluster.formatter import Formatter  # noqa: E402
from cluster.local import load_tokenizer  # noqa: E402
from cluster.parsers import TOOL_MARKERS  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402
from scheduler.scheduler import SchedulerConfig  # noqa: E402
from workers.runner import StepResult  # noqa: E402

TOK = load_tokenizer(DEFAULT_MODEL)
SP = TOK.special_ids_by_token()
TOOL_IDS = {n: SP[n] for n in TOOL_MARKERS}
EOS = TOK.eos_token_ids[0]


def enc(text: str) -> list[int]:
    return TOK.encode(text)


def arg(k: str, v: str, open_value: bool = True) -> list[int]:
    return [SP["<arg_key>"], *enc(k), SP["</arg_key>"], *([SP["<arg_value>"]] if open_value else []), *enc(v),
            SP["</arg_value>"]]


def call(name: str, *args: tuple[str, str], close: bool = True) -> list[int]:
    ids = [SP["<tool_call>"], *enc(name)]
    for k, v in args:
        ids += arg(k, v)
    return ids + ([SP["</tool_call>"]] if close else [])


class ScriptedExecutor:
    """(as tests/integration/test_engine.py's) a token per sampled step, or with drafts the script's next tokens, all
    accepted, and one more: a speculative step commits several tokens at once."""

    def __init__(self, script: list[int]):
        self.script, self.i = script, 0

    def execute(self, steps) -> list[StepResult]:
        res = StepResult(steps[0].step_id)
        for s in steps[0].seqs:
            if s.sample:
                res.sampled[s.req_id] = self.script[self.i:self.i + 1 + s.num_drafts]
                self.i += 1 + s.num_drafts
                if steps[0].num_drafts:
                    res.drafts[s.req_id] = self.script[self.i:self.i + steps[0].num_drafts]
        return [res]

    def recover(self):
        pass


def breaks_for(thinking: bool, tools: bool) -> tuple[int, ...]:
    b = {SP["</think>"]} if thinking else set()
    return tuple(sorted(b | (set(TOOL_IDS.values()) if tools else set())))


def engine_events(script: list[int], k: int = 0, thinking: bool = True, tools: bool = True,
                  max_tokens: int | None = None, **params) -> list[TokenEvent]:
    """The events the real Engine emits for ``script`` (speculation k: k drafts a step, all accepted)."""
    cfg = SchedulerConfig(num_blocks=64, block_size=16, vocab_size=TOK.vocab_size, eos_token_ids=TOK.eos_token_ids)
    engine = Engine(ScriptedExecutor(script), cfg, lambda ids: TOK.decode(ids, skip_special_tokens=True),
                    speculative_tokens=k, special_ids=TOK.special_ids)
    span = (SP["<tool_call>"], SP["</tool_call>"]) if tools else ()     # (as serve.py sets them: session 55)
    sp = SamplingParams(max_tokens=max_tokens or len(script), text_breaks=breaks_for(thinking, tools),
                        tool_call_span=span, **params)
    rid = engine.add_request([5, 6, 7], sp)
    events = []
    while engine.scheduler.has_unfinished():
        events += [ev for ev in engine.step() if ev.req_id == rid]
    return events


def hand_events(script: list[int], per_token: bool = False, finish_reason: str = "stop") -> list[TokenEvent]:
    """Events built by hand: one event per special token, then the run of ordinary tokens after it in the same event
    (as a speculative step commits them); ``per_token``: one event per token. The text is each event's tokens' text
    (decoded with the special tokens skipped); the last event finishes with ``finish_reason``."""
    groups: list[list[int]] = []
    for t in script:
        if per_token or not groups or t in TOK.special_ids:
            groups.append([t])
        else:
            groups[-1].append(t)
    return events_of(groups, finish_reason)


def events_of(groups: list[list[int]], finish_reason: str = "stop") -> list[TokenEvent]:
    """TokenEvents of id groups, their text as the engine's detokenizer finalises it (an EOS's text left out)."""
    from cluster.detok import IncrementalDetokenizer

    detok = IncrementalDetokenizer(lambda ids: TOK.decode(ids, skip_special_tokens=True), [5, 6, 7])
    evs = []
    for j, g in enumerate(groups):
        last = j == len(groups) - 1
        ids = g[:-1] if last and finish_reason == "stop" and g and g[-1] in TOK.eos_token_ids else g
        text = detok.add(list(ids)) + (detok.flush() if last else "")
        evs.append(TokenEvent("r", list(g), text))
    evs[-1].finished, evs[-1].finish_reason = True, finish_reason
    return evs


def random_groups(script: list[int], rng, max_run: int = 4) -> list[list[int]]:
    """A random speculative-style split: each special token starts a group; ordinary runs are cut at random."""
    groups: list[list[int]] = []
    room = 0
    for t in script:
        if not groups or t in TOK.special_ids or room == 0:
            groups.append([t])
            room = rng.randint(0, max_run - 1)
        else:
            groups[-1].append(t)
            room -= 1
    return groups


class _Ingress:
    model_name, tokenizer, think_end = "m", TOK, SP["</think>"]


def formatted(events: list[TokenEvent], thinking: bool = True, tools: bool = True,
              string_args: dict[str, set[str]] | None = None, n: int = 1,
              choice_of=None) -> tuple[list[dict], list[dict]]:
    """(whole choices, streamed choices as a client joins them) of ``events`` through the real Formatter.
    ``choice_of``: event -> choice index (n > 1)."""
    tool_ids = TOOL_IDS if tools else None
    mk = lambda: Formatter(_Ingress(), "c", True, [[0] * 3], None, thinking=thinking, n=n, tool_ids=tool_ids,
                           string_args=string_args)

    async def source(evs):
        for ev in evs:
            yield (choice_of(ev) if choice_of else 0), ev

    whole = asyncio.run(mk().whole(source(copy.deepcopy(events)), n))["choices"]

    async def chunks():
        out = []
        async for c in mk().sse(_Aclose(source(copy.deepcopy(events))), False):
            if c != "data: [DONE]\n\n":
                out.append(json.loads(c[6:]))
        return out

    streamed = []
    raw = asyncio.run(chunks())
    for i in range(n):
        deltas = [ch for c in raw for ch in c["choices"] if ch["index"] == i]
        streamed.append(joined(deltas))
    return whole, streamed, raw


class _Aclose:
    def __init__(self, gen):
        self.gen = gen

    def __aiter__(self):
        return self.gen.__aiter__()

    async def aclose(self):
        await self.gen.aclose()


def joined(deltas: list[dict]) -> dict:
    """A client's join of one choice's streamed deltas (as the openai SDK's accumulator would)."""
    calls: list[dict] = []
    for c in deltas:
        for d in c["delta"].get("tool_calls", []):
            while d["index"] >= len(calls):
                calls.append({"id": None, "name": None, "arguments": ""})
            cur = calls[d["index"]]
            if d.get("id"):
                cur["id"] = d["id"]
            fn = d.get("function", {})
            if fn.get("name"):
                cur["name"] = (cur["name"] or "") + fn["name"]
            cur["arguments"] += fn.get("arguments") or ""
    return {"reasoning": "".join(c["delta"].get("reasoning_content") or "" for c in deltas),
            "content": "".join(c["delta"].get("content") or "" for c in deltas),
            "calls": [{"name": c["name"], "arguments": c["arguments"]} for c in calls],
            "finish_reason": deltas[-1]["finish_reason"] if deltas else None}


def whole_view(choice: dict) -> dict:
    m = choice["message"]
    return {"reasoning": m.get("reasoning_content") or "", "content": m.get("content") or "",
            "calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                      for c in m.get("tool_calls") or []],
            "finish_reason": choice["finish_reason"]}


def run_variants(script: list[int], thinking: bool = True, tools: bool = True, string_args=None,
                 ks=(0, 2, 3), max_tokens=None, **params) -> dict:
    """{variant: (whole view, streamed view)} for the engine at each k and the hand-built event splits."""
    out = {}
    for k in ks:
        evs = engine_events(script, k, thinking, tools, max_tokens, **params)
        w, s, _ = formatted(evs, thinking, tools, string_args)
        out[f"engine k={k}"] = (whole_view(w[0]), s[0])
    if max_tokens is None and not params:
        fr = "stop" if script and script[-1] in TOK.eos_token_ids else "length"
        body = script[:-1] if fr == "stop" else script      # the engine leaves the EOS's text out; ids stay
        for name, per in (("hand per-token", True), ("hand runs", False)):
            evs = hand_events(script, per, fr)
            w, s, _ = formatted(evs, thinking, tools, string_args)
            out[name] = (whole_view(w[0]), s[0])
    return out


def show(out: dict) -> None:
    for name, (w, s) in out.items():
        print(f"--- {name}\n  whole:    {w}\n  streamed: {s}")


def parity_failures(out: dict) -> list[str]:
    bad = []
    for name, (w, s) in out.items():
        if w != s:
            bad.append(f"{name}: whole != streamed")
    ref = next(iter(out.values()))[0]
    for name, (w, s) in out.items():
        if w != ref:
            bad.append(f"{name}: differs from the first variant's whole")
    return bad
