"""Oracle over HTTP: a disaggregated app (1 prefill replica computing prompts in 64-token chunks + 1 decode replica)
answers every request of a broad matrix — completions and chat, streamed and not, n > 1, seeded draws, logprobs, stop
strings, echo, token-id prompts, batched prompts, structured output (json_schema), tool calls (required / named,
streamed), long prompts over several chunks, a conversation's next turn, concurrent requests — exactly as a plain
single-replica app does (text, finish reasons, token counts; logprobs within 1e-3). After the load drains, no KV block,
pin or request is left held on either tier, /health answers 200, and /metrics tells the two tiers apart by role.

Exit 0 when all hold; 1 otherwise (the differences printed)."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, "/work/main/bench/results/session59/review_disagg")
from serve_common import MODEL, STORY, deploy, get, metric_series, post, start_ray, stop_ray, wait_idle  # noqa: E402

from cluster.config import DEFAULT_MODEL  # noqa: E402

ENGINE = {"model": DEFAULT_MODEL, "served_model_name": MODEL, "device": "cpu", "kv_cache_tokens": 4096,
          "max_model_len": 1024, "tool_parser": "glm", "reasoning_parser": "glm"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "add", "parameters": {}}}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def stream(url, path, body):
    """A streamed answer, as (choice index -> concatenated text / tool-call names+args, finish reasons, usage)."""
    import urllib.request

    req = urllib.request.Request(url + path, data=json.dumps({**body, "stream": True, "stream_options": {
        "include_usage": True}}).encode(), headers={"content-type": "application/json"})
    texts, finish, usage, lps = {}, {}, None, {}
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = {k: ev["usage"][k] for k in ("prompt_tokens", "completion_tokens")}
            for c in ev.get("choices", []):
                i = c["index"]
                d = c.get("delta", {})
                piece = c.get("text") or d.get("content") or d.get("reasoning_content") or ""
                for tc in d.get("tool_calls") or []:
                    f = tc.get("function", {})
                    piece += f"<{f.get('name') or ''}|{f.get('arguments') or ''}>"
                texts[i] = texts.get(i, "") + piece
                if c.get("finish_reason"):
                    finish[i] = c["finish_reason"]
                lp = c.get("logprobs")
                if lp:
                    vals = lp.get("token_logprobs") or [x["logprob"] for x in lp.get("content") or []]
                    lps.setdefault(i, []).extend(vals)
    return {"texts": texts, "finish": finish, "usage": usage, "logprobs": lps}


def whole(url, path, body):
    status, out = post(url, path, body)
    if status != 200:
        return {"status": status, "error": out}
    res = {"choices": [], "usage": {k: out["usage"][k] for k in ("prompt_tokens", "completion_tokens")}}
    for c in out["choices"]:
        m = c.get("message") or {}
        item = {"text": c.get("text", m.get("content")), "reasoning": m.get("reasoning_content"),
                "finish": c["finish_reason"],
                "calls": [(t["function"]["name"], t["function"]["arguments"]) for t in m.get("tool_calls") or []]}
        lp = c.get("logprobs")
        if lp:
            item["logprobs"] = lp.get("token_logprobs") or [x["logprob"] for x in lp.get("content") or []]
        res["choices"].append(item)
    return res


def cases(url) -> dict:
    long = STORY * 3
    very_long = (STORY + "and the sea was grey, and the wind blew from the north. ") * 9     # ~700 tokens
    chat = {"model": MODEL, "max_tokens": 12, "temperature": 0}
    user = [{"role": "user", "content": long + " What happened next?"}]
    out = {}
    C, CH = "/v1/completions", "/v1/chat/completions"
    comp = {"model": MODEL, "temperature": 0}
    out["greedy_logprobs"] = whole(url, C, {**comp, "prompt": long + "[a]", "max_tokens": 16, "logprobs": 3})
    out["streamed_logprobs"] = stream(url, C, {**comp, "prompt": long + "[b]", "max_tokens": 16, "logprobs": 2})
    out["n3_greedy"] = whole(url, C, {**comp, "prompt": long + "[c]", "max_tokens": 10, "n": 3})
    out["n2_seeded"] = whole(url, C, {"model": MODEL, "prompt": long + "[d]", "max_tokens": 10, "n": 2,
                                      "temperature": 0.8, "seed": 7})
    out["n2_seeded_stream"] = stream(url, C, {"model": MODEL, "prompt": long + "[d2]", "max_tokens": 10, "n": 2,
                                              "temperature": 0.8, "seed": 11})
    out["stop_strings"] = whole(url, C, {**comp, "prompt": long + "[e]", "max_tokens": 30, "stop": ["man", ","]})
    out["echo"] = whole(url, C, {**comp, "prompt": long + "[f]", "max_tokens": 6, "echo": True})
    out["ids_prompt"] = whole(url, C, {**comp, "prompt": list(range(100, 400)), "max_tokens": 8})
    out["batched_prompts"] = whole(url, C, {**comp, "prompt": [long + "[g1]", long + "[g2]"], "max_tokens": 8})
    out["several_chunks"] = whole(url, C, {**comp, "prompt": very_long, "max_tokens": 8, "logprobs": 1})
    out["chat"] = whole(url, CH, {**chat, "messages": user, "logprobs": True, "top_logprobs": 2})
    out["chat_stream"] = stream(url, CH, {**chat, "messages": user})
    out["chat_n2_stream"] = stream(url, CH, {**chat, "messages": user, "n": 2})
    out["json_schema"] = whole(url, CH, {**chat, "max_tokens": 40, "messages": user, "response_format": {
        "type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}})
    tool_chat = {**chat, "tools": TOOLS, "reasoning_effort": "none", "max_tokens": 24,
                 "messages": [{"role": "user", "content": long + " What is the weather in Paris?"}]}
    out["tool_required"] = whole(url, CH, {**tool_chat, "tool_choice": "required"})
    out["tool_named_stream"] = stream(url, CH, {**tool_chat, "tool_choice": {"type": "function",
                                                                             "function": {"name": "add"}}})
    # a conversation's turns
    t1 = whole(url, CH, {**chat, "messages": user})
    out["turn1"] = t1
    turn2 = user + [{"role": "assistant", "content": t1["choices"][0]["text"]},
                    {"role": "user", "content": "And then? " + STORY}]
    out["turn2"] = whole(url, CH, {**chat, "messages": turn2})
    turn3 = turn2 + [{"role": "assistant", "content": out["turn2"]["choices"][0]["text"]},
                     {"role": "user", "content": "Tell me more."}]
    out["turn3_stream"] = stream(url, CH, {**chat, "messages": turn3})
    # concurrent distinct prompts and a shared head
    prompts = [f"[agent {i}] " + long if i % 2 else long + f"[shared head, agent {i}]" for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda p: whole(url, C, {**comp, "prompt": p, "max_tokens": 8}), prompts))
    for i, o in enumerate(outs):
        out[f"concurrent_{i}"] = o
    return out


def same(a, b, path="") -> list[str]:
    """Differences between two answers (floats within 1e-3)."""
    if isinstance(a, float) and isinstance(b, float):
        return [] if abs(a - b) <= 1e-3 else [f"{path}: {a} != {b}"]
    if isinstance(a, dict) and isinstance(b, dict):
        diffs = [f"{path}: keys {sorted(a)} != {sorted(b)}"] if set(a) != set(b) else []
        return diffs + [d for k in a if k in b for d in same(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}: {str(a)[:200]} vs {str(b)[:200]}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in same(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:300]!r} != {str(b)[:300]!r}"]


def main() -> int:
    from ray import serve

    url = start_ray()
    problems = []
    try:
        deploy({**ENGINE, "prefill": {"num_replicas": 1, "max_num_batched_tokens": 64}}, "disagg", "/d")
        d = url + "/d"
        t0 = time.monotonic()
        got = cases(d)
        print(f"disaggregated app: {len(got)} cases in {time.monotonic() - t0:.1f} s")
        wait_idle(d)
        time.sleep(12)          # (the prefill replica's metrics reach /metrics at its health check, every 10 s)
        free = metric_series(d, "glmserve_kv_free_blocks")
        imported = sum(metric_series(d, "glmserve_kv_imported_tokens_total").values())
        roles = metric_series(d, "glmserve_replica_role")
        role_names = {}
        status, health = get(d, "/health")
        from prometheus_client.parser import text_string_to_metric_families
        import urllib.request
        for fam in text_string_to_metric_families(urllib.request.urlopen(d + "/metrics").read().decode()):
            for s in fam.samples:
                if s.name == "glmserve_replica_role":
                    role_names[s.labels["replica"]] = s.labels["role"]
        print("free blocks by replica:", free, "imported tokens:", imported, "roles:", role_names,
              "/health:", status, health)
        if sorted(free.values()) != [256.0, 256.0]:
            problems.append(f"KV blocks left held after the load drained: {free}")
        if sorted(role_names.values()) != ["decode", "prefill"]:
            problems.append(f"/metrics roles: {role_names}")
        if status != 200:
            problems.append(f"/health {status} {health}")
        if imported <= 0:
            problems.append("no KV moved between the tiers")
        serve.delete("disagg")
        deploy(ENGINE, "plain", "/p")
        want = cases(url + "/p")
        serve.delete("plain")
        for name in want:
            diffs = same(got[name], want[name], name)
            print(f"{name}: {'equal' if not diffs else 'DIFFERENT'}")
            problems += diffs
    finally:
        stop_ray()
    for p in problems:
        print("PROBLEM:", p)
    print("RESULT:", "ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
