"""Check (right): the SDKs' own stream helpers read our streams with no error or warning, and what they accumulate is
the whole answer: openai `chat.completions.stream` (reasoning + a strict forced tool call: the call's name, arguments,
parsed_arguments), openai `responses.stream` (a function_call item), anthropic `messages.stream` (tool_use + text). The
streamed usage equals the whole answer's, and a chat stream's completion_tokens equals the ids it streamed
(return_token_ids). Note printed, not failed: a tool-call-only chat stream ends with delta {"content": ""}, so the
helper's message has content "" where the whole answer has null."""

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _server import MODEL, server  # noqa: E402

import httpx2 as httpx  # noqa: E402

TOOL = {"name": "read_file", "description": "Read a file", "strict": True,
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "enum": ["main.py", "util.py"]}},
                       "required": ["path"], "additionalProperties": False}}


def main() -> int:
    import anthropic
    from openai import OpenAI
    warnings.simplefilter("error")              # any SDK warning fails the script
    bad: list[str] = []
    with server() as url:
        c = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "Read main.py (r6)."}]
        kw = dict(model=MODEL, messages=msgs, tools=[{"type": "function", "function": TOOL}], tool_choice="required",
                  max_tokens=60, temperature=0)
        with c.chat.completions.stream(**kw, stream_options={"include_usage": True},
                                       extra_body={"thinking_token_budget": 6}) as s:
            for _ in s:
                pass
            got = s.get_final_completion()
        whole = c.chat.completions.create(**kw, extra_body={"thinking_token_budget": 6})
        g, w = got.choices[0].message, whole.choices[0].message
        same = ([(t.function.name, t.function.arguments) for t in g.tool_calls] ==
                [(t.function.name, t.function.arguments) for t in w.tool_calls]
                and g.reasoning_content == w.reasoning_content and got.usage.completion_tokens ==
                whole.usage.completion_tokens and g.tool_calls[0].function.parsed_arguments == json.loads(
                    w.tool_calls[0].function.arguments))
        print(f"chat stream helper: calls {[(t.function.name, t.function.arguments) for t in g.tool_calls]}, "
              f"reasoning {g.reasoning_content!r}, usage {got.usage.completion_tokens}/{whole.usage.completion_tokens}"
              f" -> {'same as whole' if same else 'DIFFERENT'}; content streamed {g.content!r}, whole {w.content!r}")
        bad += [] if same else ["chat stream helper"]
        ids, usage = 0, None
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=60, json={
                **{k: v for k, v in kw.items()}, "stream": True, "stream_options": {"include_usage": True},
                "thinking_token_budget": 6, "return_token_ids": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and "[DONE]" not in line:
                    d = json.loads(line[5:])
                    ids += sum(len(ch.get("token_ids") or ()) for ch in d["choices"])
                    usage = d.get("usage") or usage
        print(f"chat stream: {ids} token ids streamed, usage.completion_tokens {usage['completion_tokens']}")
        bad += [] if ids == usage["completion_tokens"] else ["streamed ids != completion_tokens"]

        rkw = dict(model=MODEL, input="Read main.py (r6).", tools=[{"type": "function", **TOOL}],
                   tool_choice="required", max_output_tokens=60, temperature=0, reasoning={"effort": "none"})
        with c.responses.stream(**rkw) as s:
            for _ in s:
                pass
            got = s.get_final_response()
        whole = c.responses.create(**rkw)
        pick = [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in got.output]
        same = pick == [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in whole.output] and \
            got.usage.output_tokens == whole.usage.output_tokens
        print(f"responses stream helper: {pick}, output_tokens {got.usage.output_tokens}/{whole.usage.output_tokens}"
              f" -> {'same as whole' if same else 'DIFFERENT'}")
        bad += [] if same else ["responses stream helper"]

        a = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
        akw = dict(model=MODEL, max_tokens=24, messages=[{"role": "user", "content": "List it (r6)."}],
                   tools=[{"name": "list_dir", "description": "List", "input_schema": {"type": "object", "properties": {}}}],
                   tool_choice={"type": "any"}, extra_body={"temperature": 0})
        with a.messages.stream(**akw) as s:
            for _ in s:
                pass
            got = s.get_final_message()
        whole = a.messages.create(**akw)
        dump = [b.model_dump(exclude={"id"}) for b in got.content]
        same = dump == [b.model_dump(exclude={"id"}) for b in whole.content] and got.stop_reason == whole.stop_reason \
            and got.usage.output_tokens == whole.usage.output_tokens
        print(f"messages stream helper: {[b['type'] for b in dump]}, stop {got.stop_reason}, output_tokens "
              f"{got.usage.output_tokens}/{whole.usage.output_tokens} -> {'same as whole' if same else 'DIFFERENT'}")
        bad += [] if same else ["messages stream helper"]
    print("FAILED: " + "; ".join(bad) if bad else "ok: the SDK helpers read every stream as the whole answer")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
