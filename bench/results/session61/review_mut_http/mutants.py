"""Mutation testing of glmserve's request/response side (session 61's review): hand-picked mutants of cluster/protocol,
formatter, parsers, detok, stream, anthropic, responses, guided, batch and routing, each a one-place string replace,
run against the unit tests that cover its file (and tests/unit/test_mut61_http.py, where REPO_DIR has it).

    python mutants.py REPO_DIR [--without-new] [--only ID,ID...] [--list]

REPO_DIR is copied (without .git, .venv, bench) to a temporary folder and each mutant applied there, so REPO_DIR is
never touched. Prints one row per mutant (killed / SURVIVED / equivalent) and exits 0 when every non-equivalent mutant
is killed, 1 otherwise (2: the unmutated tests fail). ``--without-new``: leave test_mut61_http.py out (the suite as
it was). Run it with the project's interpreter (.venv/bin/python): it runs pytest with ``sys.executable``."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

NEW = "tests/unit/test_mut61_http.py"
PROTO = ["tests/unit/test_protocol.py", "tests/unit/test_completions_batch.py", "tests/unit/test_chat_messages.py",
         "tests/unit/test_generation_defaults.py"]
FMT = ["tests/unit/test_protocol.py", "tests/unit/test_completions_batch.py", "tests/unit/test_review60.py"]
DET = ["tests/unit/test_detok.py"]
STREAM = ["tests/unit/test_detok.py", "tests/unit/test_protocol.py"]      # (no unit test imports cluster/stream.py)
ANTH = ["tests/unit/test_anthropic.py", "tests/unit/test_review60.py", "tests/unit/test_generation_defaults.py"]
RESP = ["tests/unit/test_responses.py", "tests/unit/test_anthropic.py", "tests/unit/test_review60.py"]
GUID = ["tests/unit/test_guided.py"]
BATCH = ["tests/unit/test_run_batch.py"]
ROUTE = ["tests/unit/test_routing.py"]

# (id, file, old, new, tests, equivalent: None, or why no test can tell the mutant from the original)
MUTANTS: list[tuple[str, str, str, str, list[str], str | None]] = [
    # ---- cluster/detok.py: incremental detokenization, stop strings
    ("D01", "cluster/detok.py", "if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):",
     "if len(new_text) <= len(prefix_text):", DET, None),
    ("D02", "cluster/detok.py", "self._max_hold = max((len(s) for s in self._stops), default=1) - 1",
     "self._max_hold = max((len(s) for s in self._stops), default=1) - 2", DET, None),
    ("D03", "cluster/detok.py", "for n in range(min(len(buf), self._max_hold), 0, -1):",
     "for n in range(min(len(buf), self._max_hold) - 1, 0, -1):", DET, None),
    ("D04", "cluster/detok.py", "buf.find(s, max(0, quiet - len(s) + 1))", "buf.find(s, max(0, quiet - len(s)))", DET,
     None),
    ("D05", "cluster/detok.py", "self._quiet = max(0, quiet - (len(buf) - hold))", "self._quiet = 0", DET, None),
    ("D06", "cluster/detok.py", "return buf[len(buf) - len(delta):cut + len(self.matched)], True",
     "return buf[:cut + len(self.matched)], True", DET, None),
    ("D07", "cluster/detok.py", "return min(hits, key=lambda h: h[0]) if hits else None",
     "return hits[0] if hits else None", DET, None),
    ("D08", "cluster/detok.py", 'delta = self._utf8.decode(b"", final=True)', 'delta = self._utf8.decode(b"")', DET,
     None),
    ("D09", "cluster/detok.py", "quiet = self._quiet if armed else len(buf)", "quiet = self._quiet if armed else 0",
     DET, None),
    ("D10", "cluster/detok.py", 'return "" if self.stopped or self._keep else held',
     'return "" if self.stopped else held', DET, None),
    # ---- cluster/stream.py: a request's text (stop strings, min_tokens, stop tokens, tool-call spans)
    ("S01", "cluster/stream.py", "armed = self.num_output + len(ids) > self.min_tokens",
     "armed = self.num_output + len(ids) >= self.min_tokens", STREAM, None),
    ("S02", "cluster/stream.py", "list(ids[:-1] if stop_token and not self.keep_stop else ids)", "list(ids)", STREAM,
     None),
    ("S03", "cluster/stream.py", "(self.in_call and t != self.call_span[1])",
     "(self.in_call and t != self.call_span[0])", STREAM, None),
    ("S04", "cluster/stream.py", "return self.stops.flush() + text, False", "return text, False", STREAM, None),
    ("S05", "cluster/stream.py", "if last and not stopped:", "if not stopped:", STREAM, None),
    ("S06", "cluster/stream.py", "stop_ids = set(params.stop_token_ids) - (set() if params.ignore_eos else set(eos))",
     "stop_ids = set(params.stop_token_ids)", STREAM, None),
    ("S07", "cluster/stream.py", "self.prompt_lps += lps[len(self.prompt_lps) + 1 - first:]",
     "self.prompt_lps += lps[len(self.prompt_lps) - first:]", STREAM, None),
    # ---- cluster/parsers.py: reasoning split, GLM tool calls
    ("P01", "cluster/parsers.py", "ev.token_ids and ev.token_ids[0] in self.ends:",
     "ev.token_ids and ev.token_ids[-1] in self.ends:", FMT, None),
    ("P02", "cluster/parsers.py", 'return ev.finished and ev.finish_reason == "stop" and self.in_reasoning',
     "return ev.finished and self.in_reasoning", FMT + ANTH, None),
    ("P03", "cluster/parsers.py", "        json.dumps(value, allow_nan=False)\n", "", FMT, None),
    ("P04", "cluster/parsers.py", "text = whole.rstrip()", "text = whole.strip()", FMT, None),
    ("P05", "cluster/parsers.py", 'return self._args(("{" if not c.text else ", ")',
     'return self._args(("{" if not c.text else ",")', FMT, None),
    ("P06", "cluster/parsers.py", 'out += self._unmarked() + self._args("}" if c.text else "{}")',
     'out += self._unmarked() + self._args("}")', FMT, None),
    ("P07", "cluster/parsers.py", 'text += self._text([self.ids["<tool_call>"], *self.call.raw])',
     "text += self._text(self.call.raw)", FMT, None),
    ("P08", "cluster/parsers.py", "if self.calls and self.call is None and text:",
     "if self.call is None and text:", FMT, None),
    ("P09", "cluster/parsers.py", 'c.key = self.decode(c.ids).strip()\n        if marker != "<arg_value>":',
     'c.key = self.decode(c.ids)\n        if marker != "<arg_value>":', FMT, None),
    ("P10", "cluster/parsers.py", 'if c.part != "between" or c.key is None or not self.decode(c.ids).strip():',
     'if c.part != "between" or c.key is None:', FMT, None),
    # ---- cluster/formatter.py: chat / completion bodies and chunks
    ("F01", "cluster/formatter.py", 'reasons[i] = "tool_calls" if reasons[i] == "stop" else reasons[i]',
     'reasons[i] = "tool_calls"', FMT, None),
    ("F02", "cluster/formatter.py", 'if ev.finished and self.tools[i].calls and ev.finish_reason == "stop":',
     "if ev.finished and self.tools[i].calls:", FMT, None),
    ("F03", "cluster/formatter.py", '"total_tokens": self.num_prompt + completion,', '"total_tokens": completion,', FMT,
     None),
    ("F04", "cluster/formatter.py", "self._choice_usage(i, each[i]) if self.continuous_usage",
     "self._choice_usage(i, completion) if self.continuous_usage", FMT, None),
    ("F05", "cluster/formatter.py", "if calls and text:      # a tool call's chunk",
     "if False:      # a tool call's chunk", FMT, None),
    ("F06", "cluster/formatter.py", '            if ev.finished or choice["logprobs"] is not None or',
     '            if choice["logprobs"] is not None or', FMT, None),
    ("F07", "cluster/formatter.py", 'if include_usage or chunk.get("choices", True):', 'if chunk.get("choices", True):',
     FMT, None),
    ("F08", "cluster/formatter.py",
     'delta["content"] = self.reasoning[i].text\n                    self.reasoning_tokens -= self.reasoning[i].tokens',
     'delta["content"] = self.reasoning[i].text', FMT, None),
    ("F09", "cluster/formatter.py", '                choice["stop_reason"] = ev.stop_str\n', "", FMT, None),
    ("F10", "cluster/formatter.py", 'return ApiError(503 if getattr(self.ing, "closing", False) else 500,',
     "return ApiError(500,", FMT, None),
    ("F11", "cluster/formatter.py",
     "offsets.append(self.decoded[choice] if end is None else min(self.decoded[choice], end))",
     "offsets.append(self.decoded[choice])", FMT, None),
    ("F12", "cluster/formatter.py", 'role = {} if i in started else {"role": "assistant"}', "role = {}", FMT, None),
    ("F13", "cluster/formatter.py", "self.reasoning_tokens += len(ev.token_ids)\n            else:",
     "self.reasoning_tokens += len(ev.token_ids) - 1\n            else:", FMT, None),
    # ---- cluster/protocol.py: request validation (400s) and sampling params
    ("R01", "cluster/protocol.py", "n: int = Field(default=1, ge=1, le=8)",
     "n: int = Field(default=1, ge=1, le=9)", PROTO, None),
    ("R02", "cluster/protocol.py", "if isinstance(v, list) and (len(v) > 4 or any(not s for s in v)):",
     "if isinstance(v, list) and len(v) > 4:", PROTO, None),
    ("R03", "cluster/protocol.py", '        if v == "":\n            raise ValueError("stop must not be empty")\n', "",
     PROTO, None),
    ("R04", "cluster/protocol.py", "if len(pairs) > MAX_LOGIT_BIAS:", "if len(pairs) >= MAX_LOGIT_BIAS:", PROTO, None),
    ("R05", "cluster/protocol.py", "if limit is not None and self.min_tokens > max(1, limit):",
     "if limit is not None and self.min_tokens >= max(1, limit):", PROTO, None),
    ("R06", "cluster/protocol.py", "seed=None if self.seed is None else self.seed + seed_offset,",
     "seed=self.seed,", PROTO, None),
    ("R07", "cluster/protocol.py", "min_tokens=min(self.min_tokens, max_tokens),", "min_tokens=self.min_tokens,", PROTO,
     None),
    ("R08", "cluster/protocol.py", 'if v == 0:\n            raise ValueError("truncate_prompt_tokens',
     'if v == -2:\n            raise ValueError("truncate_prompt_tokens', PROTO, None),
    ("R09", "cluster/protocol.py", '            if d["role"] == "developer":\n                d["role"] = "system"\n',
     "", PROTO, None),
    ("R10", "cluster/protocol.py", '                if not isinstance(part.get("text"), str):',
     "                if False:", PROTO, None),
    ("R11", "cluster/protocol.py", "if len(asked) > 1:", "if len(asked) > 2:", PROTO + GUID, None),
    ("R12", "cluster/protocol.py", 'and not (key == "json_object" and value is False):', ":", PROTO + GUID, None),
    ("R13", "cluster/protocol.py", "top_logprobs: int | None = Field(default=None, ge=0, le=20)",
     "top_logprobs: int | None = Field(default=None, ge=0, le=21)", PROTO, None),
    ("R14", "cluster/protocol.py", "single_tool_call=bool(tool_call_span) and not getattr",
     "single_tool_call=not getattr", PROTO, None),
    ("R15", "cluster/protocol.py", "if self.continue_final_message and (self.add_generation_prompt or",
     "if self.continue_final_message and (self.add_generation_prompt and", PROTO, None),
    ("R16", "cluster/protocol.py", ('out += [("call", call) for call in delta.get("tool_calls") or ()]\n'
                                    '    return out + ([("text", delta["content"])] if delta.get("content") else [])'),
     ('out += [("text", delta["content"])] if delta.get("content") else []\n'
      '    return out + [("call", call) for call in delta.get("tool_calls") or ()]'), RESP, None),
    # ---- cluster/anthropic.py
    ("A01", "cluster/anthropic.py", "temperature: float = Field(default=1.0, ge=0.0, le=1.0)",
     "temperature: float = Field(default=1.0, ge=0.0, le=2.0)", ANTH, None),
    ("A02", "cluster/anthropic.py", 'if choice in ("any", "tool") and kind in THINKING:',
     'if choice in ("any", "tool") and kind == "enabled":', ANTH, None),
    ("A03", "cluster/anthropic.py", "isinstance(budget, bool) or budget < 1024:",
     "isinstance(budget, bool) or budget < 1000:", ANTH, None),
    ("A04", "cluster/anthropic.py", '"input_tokens": usage["prompt_tokens"] - cached,',
     '"input_tokens": usage["prompt_tokens"],', ANTH, None),
    ("A05", "cluster/anthropic.py",
     'return [self._event("content_block_stop", index=len(self.message["content"]) - 1)]',
     'return [self._event("content_block_stop", index=len(self.message["content"]))]', ANTH, None),
    ("A06", "cluster/anthropic.py", 'self.failure = ApiError(getattr(chunk, "status", 500),',
     "self.failure = ApiError(500,", ANTH, None),
    ("A07", "cluster/anthropic.py", 'turn["content"] = (turn["content"] or "") + b["text"]',
     'turn["content"] = b["text"]', ANTH, None),
    ("A08", "cluster/anthropic.py", ('"stop_sequence" if stop else "model_context_window_exceeded" \\\n'
                                     '                    if finish == "length" and self.clamped'),
     '"stop_sequence" if stop else "model_context_window_exceeded" \\\n                    if self.clamped',
     ANTH, None),
    ("A09", "cluster/anthropic.py", 'result = f"Error: {result}" if result else "Error"', 'result = f"Error: {result}"',
     ANTH, None),
    # ---- cluster/responses.py
    ("Q01", "cluster/responses.py", "len(v) > 16 or", "len(v) > 17 or", RESP, None),
    ("Q02", "cluster/responses.py", "len(k) > 64 or len(x) > 512", "len(k) > 512 or len(x) > 512", RESP, None),
    ("Q03", "cluster/responses.py", "        if self.top_logprobs:\n", "        if False:\n", RESP, None),
    ("Q04", "cluster/responses.py", 'return {"input_tokens": chat_usage["prompt_tokens"],',
     'return {"input_tokens": chat_usage["prompt_tokens"] - chat_usage["prompt_tokens_details"]["cached_tokens"],',
     RESP, None),
    ("Q05", "cluster/responses.py", 'self.failure = ApiError(getattr(chunk, "status", 500),',
     "self.failure = ApiError(500,", RESP, None),
    ("Q06", "cluster/responses.py", 'if turn is None or turn["content"] is not None or turn["tool_calls"]:',
     'if turn is None or turn["content"] is not None:', RESP, None),
    ("Q07", "cluster/responses.py", "output_index=len(self.output), delta=piece))",
     "output_index=len(self.output) - 1, delta=piece))", RESP, None),
    ("Q08", "cluster/responses.py", 'for out in self._close("incomplete"):', "for out in self._close():", RESP, None),
    # ---- cluster/guided.py
    ("G01", "cluster/guided.py", "if values > MAX_ENUM_VALUES:", "if values >= MAX_ENUM_VALUES:", GUID, None),
    ("G02", "cluster/guided.py", 'if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:',
     'if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 2:', GUID, None),
    ("G03", "cluster/guided.py", "drafts = drafts[:max(0, left - 1)]", "drafts = drafts[:max(0, left)]", GUID, None),
    ("G04", "cluster/guided.py", "len(prompt_ids) > 0 and prompt_ids[-1] == self.think_start",
     "self.think_start in prompt_ids", GUID, None),
    ("G05", "cluster/guided.py", "            words[-1] = np.uint32((1 << (vocab_size % 32)) - 1)\n", "", GUID, None),
    ("G06", "cluster/guided.py", "if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c",
     "if not isinstance(choices, list) or not all(isinstance(c, str) and c", GUID + PROTO[:1], None),
    # ---- cluster/batch.py
    ("B01", "cluster/batch.py", "if status not in (429, 503) or attempt == RETRIES:",
     "if status not in (429, 503) or attempt > RETRIES:", BATCH, None),
    ("B02", "cluster/batch.py", "return max(0.0, float(retry_after))", "return float(retry_after)", BATCH, None),
    ("B03", "cluster/batch.py", "        outage.since = None\n", "", BATCH, None),
    ("B04", "cluster/batch.py", 'failed += result["error"] is not None or result["response"]["status_code"] != 200',
     'failed += result["error"] is not None', BATCH, None),
    ("B05", "cluster/batch.py", 'if line.get("method", "POST") != "POST":', 'if line.get("method") != "POST":', BATCH,
     None),
    ("B06", "cluster/batch.py", "return self.clock() - self.since < REFUSED_S",
     "return self.clock() - self.since <= REFUSED_S", BATCH, None),
    # ---- cluster/routing.py
    ("T01", "cluster/routing.py", "for end in range(self.span, len(ids), self.span):",
     "for end in range(self.span, len(ids) + 1, self.span):", ROUTE, None),
    ("T02", "cluster/routing.py", "mine - min(q or 0 for q in queue.values()) > self.imbalance",
     "mine - min(q or 0 for q in queue.values()) >= self.imbalance", ROUTE, None),
    ("T03", "cluster/routing.py", "            self._owner.move_to_end(key)\n", "", ROUTE, None),
    ("T04", "cluster/routing.py", 'pending.metadata.call_method not in ("generate", "prefill")',
     'pending.metadata.call_method != "generate"', ROUTE, None),
    ("T05", "cluster/routing.py", "for key in reversed(self.keys(ids, salt)):",
     "for key in self.keys(ids, salt):", ROUTE, None),
]


def _run(root: str, tests: list[str], timeout: int = 300, failed: list[str] | None = None) -> tuple[int, float]:
    """pytest's exit status on ``tests`` (124: timed out) and its seconds; ``failed``: run them all (no -x) and
    collect the names of those that failed."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=root,
               PYTHONDONTWRITEBYTECODE="1")
    start = time.monotonic()
    flags = ["-q", "-rf", "-p", "no:cacheprovider"] if failed is not None else ["-x", "-q", "-p", "no:cacheprovider"]
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", *tests, *flags], check=False, cwd=root, env=env,
                             text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        rc = out.returncode
        if failed is not None:
            failed += [line.split("::", 1)[1].split(" ")[0] for line in out.stdout.splitlines()
                       if line.startswith("FAILED ") and "::" in line]
    except subprocess.TimeoutExpired:
        rc = 124
    return rc, time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--without-new", action="store_true", help=f"leave {NEW} out")
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--map", action="store_true", help=f"run {NEW} alone on each mutant and name the tests that fail")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m[0] in args.only.split(",")]
    if args.list:
        for mid, path, old, new, _, _ in chosen:
            print(f"{mid}  {path}: {old.strip()[:70]!r} -> {new.strip()[:70]!r}")
        return 0
    tmp = tempfile.mkdtemp(prefix="mut61_http_")
    root = os.path.join(tmp, "repo")
    shutil.copytree(os.path.abspath(args.repo), root, ignore=shutil.ignore_patterns(
        ".git", ".venv", "bench", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache"))
    if args.without_new and os.path.exists(os.path.join(root, NEW)):
        os.remove(os.path.join(root, NEW))
    extra = [NEW] if os.path.exists(os.path.join(root, NEW)) else []
    if args.map and not extra:
        ap.error(f"--map needs {NEW} in REPO_DIR")
    try:
        every = sorted({t for m in chosen for t in m[4]} | set(extra))
        rc, secs = _run(root, every, 900)
        print(f"baseline (unmutated): {'pass' if rc == 0 else f'FAIL rc={rc}'} ({secs:.0f} s; {len(every)} files)",
              flush=True)
        if rc != 0:
            return 2
        rows, survivors = [], []
        for mid, path, old, new, tests, equivalent in chosen:
            file = os.path.join(root, path)
            with open(file, encoding="utf-8") as f:
                original = f.read()
            assert original.count(old) == 1, f"{mid}: {old!r} occurs {original.count(old)} times in {path}"
            line = original[:original.index(old)].count("\n") + 1
            with open(file, "w", encoding="utf-8") as f:
                f.write(original.replace(old, new))
            names: list[str] | None = [] if args.map else None
            try:
                rc, secs = _run(root, extra if args.map else extra + tests, failed=names)   # (new first: -x stops)
            finally:
                with open(file, "w", encoding="utf-8") as f:
                    f.write(original)
            verdict = "killed" if rc != 0 else "equivalent" if equivalent else "SURVIVED"
            if verdict == "SURVIVED":
                survivors.append(mid)
            rows.append(verdict)
            print(f"{mid:4} {path + ':' + str(line):26} {verdict:10} rc={rc:<3} {secs:5.1f} s"
                  + (f"  {' '.join(names)}" if names else ""), flush=True)
        print(f"\n{len(rows)} mutants: {rows.count('killed')} killed, {len(survivors)} survived, "
              f"{rows.count('equivalent')} equivalent ({'with' if extra else 'without'} {NEW})")
        if survivors:
            print("survived:", " ".join(survivors))
        return 1 if survivors else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
