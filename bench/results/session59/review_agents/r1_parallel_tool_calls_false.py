"""Finding: `parallel_tool_calls: false` (chat; the Messages API's `tool_choice.disable_parallel_tool_use` and the
Responses API's `parallel_tool_calls` map to it) is not enforced unless a tool is `"strict": true` — a model that writes
two calls returns two calls.

OpenAI: parallel_tool_calls=false → at most one call per turn. vLLM (PR #26233, merged 2025-10) returns only the first
call, streamed and whole. Agent frameworks (LangGraph, the OpenAI Agents SDK's ModelSettings(parallel_tool_calls=False),
Claude Code's disable_parallel_tool_use) rely on it.

The tiny model is steered to write a second call by sampling (seeded, temperature 2) among the call markers and the
tool's one-token name (vLLM's `allowed_token_ids`, `logit_bias`): its output is
`<tool_call>list</tool_call><tool_call>list</tool_call>…`. Exits 1 while more than one call comes back."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _server import MODEL, server  # noqa: E402

import httpx2 as httpx  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "list", "description": "List the directory",
                                           "parameters": {"type": "object", "properties": {}}}}]


def body(seed: int, stream: bool) -> dict:
    # token ids (models/tiny/tokenizer.json): 23 <tool_call>, 24 </tool_call>, 3195 "list"
    return {"model": MODEL, "messages": [{"role": "user", "content": "List the directories src and tests."}],
            "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 8,
            "temperature": 2.0, "seed": seed, "reasoning_effort": "none", "return_token_ids": True,
            "allowed_token_ids": [23, 24, 3195], "logit_bias": {"23": 2, "24": 2}, "stream": stream}


def streamed_calls(url: str, b: dict) -> list[dict]:
    calls: dict[int, dict] = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=b, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data:") or "[DONE]" in line:
                continue
            for ch in json.loads(line[5:])["choices"]:
                for tc in ch["delta"].get("tool_calls") or ():
                    c = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                    c["name"] += tc.get("function", {}).get("name") or ""
                    c["arguments"] += tc.get("function", {}).get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


def main() -> int:
    bad = 0
    with server() as url:
        for seed in (33, 35):
            r = httpx.post(url + "/v1/chat/completions", json=body(seed, False), timeout=120).json()
            ch = r["choices"][0]
            calls = ch["message"].get("tool_calls") or []
            print(f"seed {seed}: output ids {ch['token_ids']}, finish {ch['finish_reason']}")
            print(f"  whole:    {len(calls)} tool_calls {[(c['function']['name'], c['function']['arguments']) for c in calls]}"
                  f" content {ch['message']['content']!r}")
            s = streamed_calls(url, body(seed, True))
            print(f"  streamed: {len(s)} tool_calls {[(c['name'], c['arguments']) for c in s]}")
            bad += len(calls) > 1 or len(s) > 1
    print("DEFECT: parallel_tool_calls false returned more than one call" if bad else "ok: at most one call")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
