"""Follow-up to the soak: structured output and tool calls with room to finish (max_tokens 256), 8 at a time, so that
finish_reason tool_calls / stop (where the arguments and JSON must parse and follow the schema) is common."""
import asyncio, json, random, sys
import aiohttp, jsonschema
import soak
from soak import WEATHER, CALC, NOARGS, JSON_SCHEMAS, USER_MSGS, MODEL, BASE

async def one(sess, i, out):
    rnd = random.Random(i)
    kind = rnd.choice(["tools", "json"])
    stream = rnd.random() < 0.4
    body = {"model": MODEL, "max_tokens": 256, "temperature": rnd.choice([0.0, 0.8]), "seed": i,
            "messages": [{"role": "user", "content": rnd.choice(USER_MSGS)}]}
    if rnd.random() < 0.7:
        body["reasoning_effort"] = "none"
    if kind == "tools":
        tools = [json.loads(json.dumps(t)) for t in rnd.sample([WEATHER, CALC, NOARGS], rnd.randint(1, 3))]
        for t in tools:
            t["function"]["strict"] = True
        body["tools"] = tools
        ch = rnd.choice(["auto", "required", "named"])
        body["tool_choice"] = {"type": "function", "function": {"name": tools[0]["function"]["name"]}} \
            if ch == "named" else ch
    else:
        schema = rnd.choice(JSON_SCHEMAS + [None])
        body["response_format"] = {"type": "json_object"} if schema is None else \
            {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    res = await soak.call(sess, "/v1/chat/completions", "structured_" + kind, body, stream=stream)
    if res.status != 200:
        out.append(("status", res.status)); return
    if stream:
        chunks = soak.sse_json(res, "structured", "/v1/chat/completions", body)
        if chunks is None:
            return
        st, usage, problems = soak.assemble_chat_stream(chunks, 1)
        for p in problems:
            soak.anomaly("stream_structure", "structured", "/v1/chat/completions", body, 200, chunks[-2:], p)
        s = st[0]
        calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                 for _, c in sorted(s["calls"].items())]
        msg, finish = {"content": s["content"], "tool_calls": calls or None}, s["finish"]
    else:
        c0 = res.json["choices"][0]
        msg, finish = c0["message"], c0["finish_reason"]
    out.append((kind, finish))
    if kind == "tools":
        forced = None if body["tool_choice"] == "auto" else (
            "required" if body["tool_choice"] == "required" else body["tool_choice"]["function"]["name"])
        soak.check_calls(msg.get("tool_calls"), finish, body, "structured_tools", "/v1/chat/completions", msg,
                         body["tools"], True, forced)
        if finish == "tool_calls" and not msg.get("tool_calls"):
            soak.anomaly("tool_calls_finish_no_calls", "structured", "", body, 200, msg, "")
    elif finish == "stop":
        fmt = body["response_format"]
        soak.check_json_content(msg.get("content"), fmt.get("json_schema", {}).get("schema"), body,
                                "structured_json", "/v1/chat/completions", msg)

async def main(n):
    out = []
    sem = asyncio.Semaphore(8)
    async with aiohttp.ClientSession() as sess:
        async def g(i):
            async with sem:
                await one(sess, i, out)
        await asyncio.gather(*[g(i) for i in range(n)])
    from collections import Counter
    print("outcomes:", dict(Counter(out)))
    print("coverage:", {k: v for k, v in soak.soft.items()})
    print("anomalies:", len(soak.anomalies))
    for a in soak.anomalies[:20]:
        print(json.dumps(a, ensure_ascii=False)[:1500])
    json.dump({"outcomes": [list(o) for o in out], "coverage": dict(soak.soft), "anomalies": soak.anomalies},
              open("structured_probe.json", "w"), indent=0, ensure_ascii=False)

asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 400))
