"""thinking_token_budget is dropped when the request has a strict tool under tool_choice auto.

serve._tool_guidance gives such a request tool_grammar + guide_after=(<tool_call>,); Engine._guide then calls
Guides.tool_guide(..., after, budget), whose `after` branch builds a Guide without the budget. So the reasoning is not
closed at the budget: it runs on to max_tokens. The same request without the strict flag (a Budget guide) or with
tool_choice required (tool_guide's other branch) closes the reasoning at the budget."""
from common import SamplingParams, check, done, engine, run

from cluster.guided import tool_grammar

TOOLS = [{"type": "function", "function": {"name": "get_weather", "strict": True,
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def main():
    eng, tok = engine()
    marks = tok.special_ids_by_token()
    ids = {m: marks[m] for m in ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")}
    prompt = tok.encode_chat([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS)
    assert prompt[-1] == marks["<think>"]
    end, budget = marks["</think>"], 4
    # what serve._tool_guidance returns for tool_choice auto (not forced) with a strict function:
    auto = dict(tool_grammar=tool_grammar(TOOLS, ids, None, parallel=True, opened=True), guide_after=(ids["<tool_call>"],))
    required = dict(tool_grammar=tool_grammar(TOOLS, ids, None, parallel=True, opened=False))
    reqs = {"no tools guidance (Budget)": (prompt, SamplingParams(max_tokens=30, temperature=0.0, thinking_budget=budget)),
            "tool_choice required, strict": (prompt, SamplingParams(max_tokens=30, temperature=0.0, thinking_budget=budget, **required)),
            "tool_choice auto, strict": (prompt, SamplingParams(max_tokens=30, temperature=0.0, thinking_budget=budget, **auto))}
    for rid, r in reqs.items():
        o = run(eng, {rid: r})[rid]
        at = o["ids"].index(end) if end in o["ids"] else None
        print(f"   {rid}: </think> at {at}, {len(o['ids'])} tokens, reason {o['reason']}, guide type "
              f"{type(eng._guide(prompt, r[1])).__name__}, budget left {eng._guide(prompt, r[1]).left}")
        check(at == budget, f"{rid}: thinking_token_budget={budget} closes the reasoning at token {budget} (got {at})")
    done()


if __name__ == "__main__":
    main()
