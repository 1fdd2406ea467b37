"""Q1: the prompt ids glmserve's chat endpoint builds (real _parse + _chat_ids) vs transformers'
AutoTokenizer.apply_chat_template over the shipped tiny template, for multi-turn coding-agent conversations. The
reference gets the OpenAI JSON-string arguments parsed to dicts first (as vLLM does, and as GLM templates need), the
developer role as system (glmserve's documented mapping), reasoning_effort none as enable_thinking false."""
import copy
import json

import _h

ing = _h.ingress()
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
                         "required": ["path"]}}},
         {"type": "function", "function": {"name": "run", "description": "Run a shell command",
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}, "env": {"type": "object"}}}}}]


def call(cid, name, args, as_string=True):
    return {"id": cid, "type": "function", "function": {"name": name,
            "arguments": json.dumps(args) if as_string else args}}


AGENT = [
    {"role": "system", "content": "You are a coding agent. Work in /repo."},
    {"role": "user", "content": "Fix the failing test in tests/test_x.py"},
    {"role": "assistant", "content": None, "reasoning_content": "I should read the test first.",
     "tool_calls": [call("c1", "read_file", {"path": "tests/test_x.py", "lines": 40}),
                    call("c2", "run", {"cmd": "pytest -x tests/test_x.py", "env": {"CI": "1"}})]},
    {"role": "tool", "tool_call_id": "c1", "content": "def test_x():\n    assert f(2) == 4\n"},
    {"role": "tool", "tool_call_id": "c2", "content": "FAILED tests/test_x.py::test_x - assert 3 == 4"},
    {"role": "assistant", "content": "", "reasoning_content": "f is off by one; look at it.",
     "tool_calls": [call("c3", "read_file", {"path": "src/f.py"})]},
    {"role": "tool", "tool_call_id": "c3", "content": "def f(x):\n    return x + 1\n"},
]

cases = []
cases.append(("system+user+tools", {"messages": AGENT[:2], "tools": TOOLS}, AGENT[:2], {}))
cases.append(("agent loop, JSON-string args, 2 tool results in a row, reasoning kept after last user",
              {"messages": AGENT, "tools": TOOLS}, AGENT, {}))
dict_args = copy.deepcopy(AGENT)
for m in dict_args:
    for tc in m.get("tool_calls") or ():
        tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
cases.append(("agent loop, dict args", {"messages": dict_args, "tools": TOOLS}, dict_args, {}))
second = AGENT + [{"role": "assistant", "content": "Fixed: f returns x * 2.", "reasoning_content": "done"},
                  {"role": "user", "content": "Now run the whole suite"}]
cases.append(("second user turn: earlier reasoning dropped by the template", {"messages": second, "tools": TOOLS},
              second, {}))
parts = [{"role": "system", "content": [{"type": "text", "text": "sys A. "}, {"type": "text", "text": "sys B"}]},
         {"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "part two"}]},
         {"role": "assistant", "content": [{"type": "text", "text": "ok"}], "tool_calls": [call("c9", "run", {"cmd": "ls"})]},
         {"role": "tool", "tool_call_id": "c9", "content": [{"type": "text", "text": "a.py\nb.py"}]}]
cases.append(("content as lists of text parts (system, user, assistant, tool)", {"messages": parts, "tools": TOOLS},
              parts, {}))
named = [{"role": "user", "name": "alice", "content": "hi"},
         {"role": "assistant", "content": None, "tool_calls": [call("c1", "run", {"cmd": "pwd"})]},
         {"role": "tool", "tool_call_id": "c1", "name": "run", "content": "/repo"}]
cases.append(("name fields; None content with tool calls", {"messages": named, "tools": TOOLS}, named, {}))
for flag in (False, True):
    cases.append((f"chat_template_kwargs enable_thinking={flag}",
                  {"messages": AGENT, "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": flag}},
                  AGENT, {"enable_thinking": flag}))
cases.append(("reasoning_effort none -> enable_thinking false",
              {"messages": AGENT[:2], "reasoning_effort": "none"}, AGENT[:2], {"enable_thinking": False}))
cases.append(("reasoning_effort high (the tiny template takes no effort)",
              {"messages": AGENT[:2], "reasoning_effort": "high"}, AGENT[:2], {"reasoning_effort": "high"}))
dev = [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "hi"}]
cases.append(("developer role as system", {"messages": dev}, [{"role": "system", "content": "Be terse."}, dev[1]], {}))
uni = [{"role": "user", "content": "héllo 日本 \u00e9 — \"quotes\" \\ back"},
       {"role": "assistant", "content": None, "tool_calls": [call("c1", "run", {"cmd": "echo 日本 \"x\""})]},
       {"role": "tool", "tool_call_id": "c1", "content": "日本 \"x\""}]
cases.append(("unicode and quotes in args (tojson ensure_ascii False)", {"messages": uni, "tools": TOOLS}, uni, {}))
nested = [{"role": "user", "content": "go"},
          {"role": "assistant", "content": None, "tool_calls": [call("c1", "run", {"cmd": "x", "env": {"A": [1, {"b": None}]},
                                                                                   "n": 1.5, "t": True})]}]
cases.append(("non-string argument values (object, list, float, bool, null)", {"messages": nested, "tools": TOOLS},
              nested, {}))
prefill = [{"role": "user", "content": "write hello"}, {"role": "assistant", "content": "print("}]
cases.append(("continue_final_message prefill", {"messages": prefill, "add_generation_prompt": False,
                                                  "continue_final_message": True}, prefill, {"_agp": False}))

for name, body, ref_msgs, kw in cases:
    ids, err = _h.chat_ids(ing, body)
    kw = dict(kw)
    agp = kw.pop("_agp", True)
    try:
        ref, text = _h.hf_ids(_h.args_as_dicts(ref_msgs), tools=body.get("tools"), add_generation_prompt=agp, **kw)
    except Exception as e:  # noqa: BLE001
        ref, text = None, f"transformers raised {type(e).__name__}: {e}"
    same = ids == ref
    _h.check(same, f"{name}: {'same ids' if same else 'DIFFER'} ({len(ids or [])} vs {len(ref or [])} tokens)")
    if not same:
        print("    glmserve:", err if err else repr(_h.text_of(ids)))
        print("    transformers:", repr(text))
_h.done()
