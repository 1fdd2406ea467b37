"""Shared helpers for the session 57 streamed-output review: a tiny CPU engine, the real OpenAIIngress methods driven
without Ray (as session 56's _hl.py), SSE parsing, and the openai SDK's pydantic types for every chunk."""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../.."))
sys.path.insert(0, ROOT)
os.chdir(ROOT)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch  # noqa: E402

torch.set_num_threads(1)

from cluster.config import EngineConfig  # noqa: E402
from cluster.local import build_local_engine, load_tokenizer  # noqa: E402

FAILS: list[str] = []
T0 = time.time()
TOK = load_tokenizer(os.path.join(ROOT, "models/tiny"))
SP = TOK.special_ids_by_token()


def byte_id(b: int) -> int:
    """The token id of the single byte ``b`` (byte-level BPE: every byte is a token)."""
    ids = [i for i in range(TOK.vocab_size) if i not in TOK.special_ids and TOK.token_bytes(i) == bytes([b])]
    assert len(ids) == 1, (b, ids)
    return ids[0]


def check(cond: bool, what: str) -> bool:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


def done() -> None:
    print(f"\n{len(FAILS)} failure(s) in {time.time() - T0:.1f} s")
    for f in FAILS:
        print("  -", f)
    sys.exit(1 if FAILS else 0)


def engine(**kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("warmup_tokens", 0)
    kw.setdefault("kv_cache_tokens", 8192)
    eng, _ = build_local_engine(EngineConfig(**kw), progress=False)
    return eng


class FakeRequest:
    def __init__(self, body: dict):
        self._data = json.dumps(body).encode()

    async def body(self) -> bytes:
        return self._data


def ingress(eng, cfg_kw: dict | None = None, aeng=None):
    """The real OpenAIIngress code (its methods), without Ray: ``_open`` streams from an AsyncEngine over ``eng``."""
    from cluster.async_engine import AsyncEngine
    from cluster.serve import OpenAIIngress

    class Ing:
        pass

    for name in ("__init__", "_thinking", "_set_limits", "_limits", "completions", "chat_completions", "_truncated",
                 "_max_chars", "_check_ids", "_chat_ids", "_parse", "_tokenizer", "_respond", "_start",
                 "models", "model", "_card", "tokenize", "detokenize", "messages", "responses"):
        setattr(Ing, name, OpenAIIngress.__mro__[1].__dict__[name])
    aeng = aeng or AsyncEngine(eng)

    async def _open(self, ids, params, req_id):
        async for ev in aeng.generate(ids, params, req_id):
            yield ev

    Ing._open = _open
    ing = Ing(None, {"device": "cpu", "warmup_tokens": 0, **(cfg_kw or {})})
    ing.aeng = aeng
    ing.max_model_len = eng.config.max_model_len
    ing.max_prompt_chars = ing.max_model_len * ing.longest_token
    return ing


async def acall(ing, endpoint: str, body: dict):
    """(status, body dict | raw SSE text | error dict) of one request through the ingress's endpoint."""
    from cluster.protocol import ApiError

    fn = ing.completions if endpoint == "completions" else ing.chat_completions
    try:
        resp = await fn(FakeRequest({"model": ing.model_name, **body}))
    except ApiError as e:
        return e.status, {"error": {"param": e.param, "message": str(e)}}
    if hasattr(resp, "body_iterator"):
        chunks = [c async for c in resp.body_iterator]
        return 200, b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks).decode()
    return resp.status_code, json.loads(resp.body)


def call(ing, endpoint: str, body: dict):
    return asyncio.run(acall(ing, endpoint, body))


def parse_sse(raw: str) -> tuple[list, list[str]]:
    """(the data payloads: dicts, or the string "[DONE]"), problems with the framing."""
    problems, out = [], []
    if not raw.endswith("\n\n"):
        problems.append("stream does not end with a blank line")
    for block in raw.split("\n\n")[:-1]:
        if not block.startswith("data: ") or "\n" in block:
            problems.append(f"bad event block {block[:80]!r}")
            continue
        data = block[len("data: "):]
        if data == "[DONE]":
            out.append("[DONE]")
            continue
        try:
            out.append(json.loads(data))
        except ValueError as e:
            problems.append(f"bad JSON {e}: {data[:80]!r}")
    if out.count("[DONE]") != 1 or (out and out[-1] != "[DONE]"):
        problems.append(f"[DONE] count {out.count('[DONE]')}, last {out[-1] if out else None!r}")
    return out, problems


def validate_chunk(chunk: dict, chat: bool) -> str | None:
    """The openai SDK's own pydantic type for the chunk (strict: the shape it declares): an error string or None."""
    from openai.types import Completion
    from openai.types.chat import ChatCompletionChunk

    if "error" in chunk:
        return None
    if not chat:    # the SDK's Completion types finish_reason non-null, but streams it null too (OpenAI's own chunks)
        chunk = {**chunk, "choices": [{**c, "finish_reason": c.get("finish_reason") or "stop"} for c in chunk["choices"]]}
    try:
        (ChatCompletionChunk if chat else Completion).model_validate(chunk, strict=False)
    except Exception as e:  # noqa: BLE001
        return str(e).replace("\n", " | ")[:300]
    return None


def joined(chunks: list, chat: bool, n: int) -> dict:
    """What a client accumulates per choice index: text, finish reasons seen, logprobs parts."""
    acc = {i: {"text": "", "finish": [], "lp": [], "role": 0} for i in range(n)}
    for c in chunks:
        if c == "[DONE]" or "error" in c:
            continue
        for ch in c["choices"]:
            a = acc.setdefault(ch["index"], {"text": "", "finish": [], "lp": [], "role": 0})
            if chat:
                d = ch["delta"]
                a["text"] += d.get("content") or ""
                a["role"] += "role" in d
            else:
                a["text"] += ch["text"]
            if ch.get("finish_reason") is not None:
                a["finish"].append(ch["finish_reason"])
            if ch.get("logprobs") is not None:
                a["lp"].append(ch["logprobs"])
    return acc


class ScriptedExecutor:
    """(as session 55's _harness.py) each sampled step commits the script's next token, or with drafts the next
    1 + k tokens (all accepted): a speculative step commits several tokens at once. Each token gets a logprob of -1
    and three alternatives (ids 97-99 at -2, -3, -4) where the request asked for logprobs."""

    def __init__(self, script: list[int], alts: tuple[int, ...] = (97, 98, 99)):
        self.script, self.i, self.alts = script, 0, alts

    def execute(self, steps):
        from workers.runner import StepResult, TokenLogprobs

        res = StepResult(steps[0].step_id)
        for s in steps[0].seqs:
            if s.sample:
                toks = self.script[self.i:self.i + 1 + s.num_drafts]
                res.sampled[s.req_id] = toks
                res.logprobs[s.req_id] = [TokenLogprobs(-1.0, ((t, -1.0), *((a, -2.0 - j) for j, a in enumerate(self.alts))))
                                          for t in toks]
                self.i += 1 + s.num_drafts
                if steps[0].num_drafts:
                    res.drafts[s.req_id] = self.script[self.i:self.i + steps[0].num_drafts]
        return [res]

    def recover(self):
        pass


def scripted_ingress(script: list[int], k: int = 0, alts: tuple[int, ...] = (97, 98, 99)):
    """The real ingress over the real Engine, whose executor plays ``script`` (k drafts a step, all accepted)."""
    from cluster.engine import Engine
    from scheduler.scheduler import SchedulerConfig

    cfg = SchedulerConfig(num_blocks=256, block_size=16, max_model_len=2048, vocab_size=TOK.vocab_size,
                          eos_token_ids=TOK.eos_token_ids)
    eng = Engine(ScriptedExecutor(script, alts), cfg, lambda ids: TOK.decode(ids, skip_special_tokens=True),
                 speculative_tokens=k, special_ids=TOK.special_ids)
    return eng, ingress(eng)


# ---- session 58 additions: an independent reference (the tiny model's own forward, fp32, log-softmax) ----------
_MODEL = None


def ref_logprobs(ids: list[int]) -> "torch.Tensor":
    """[len(ids), V] log-softmax of the tiny model's logits at each position (row j predicts ids[j + 1]), from one
    fp32 forward over ``ids`` (models/loader.load_model; no engine code)."""
    global _MODEL
    from models.cache import KVCache, contiguous_batch
    from models.loader import load_model

    if _MODEL is None:
        _MODEL = load_model(os.path.join(ROOT, "models/tiny"), dtype=torch.float32, progress=False)
    t = torch.tensor(ids)
    cache = KVCache(_MODEL.config, t.numel() + 8, torch.float32)
    with torch.no_grad():
        h = _MODEL(t, contiguous_batch([(0, t.numel())], t.numel() + 8), cache)
        return torch.log_softmax(_MODEL.logits(h).float(), -1)


def name_of(tid: int) -> str:
    """A completion's logprobs name for a token (its text, or "bytes:\\x.." where it is no whole UTF-8 text)."""
    raw = TOK.token_bytes(tid)
    try:
        raw.decode("utf-8")
        return TOK.decode([tid], skip_special_tokens=False)
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
