"""Context edges at the HTTP edge (the real OpenAIIngress methods over a real engine, no Ray): /v1/completions vs
/v1/chat/completions at max_model_len-1 / = / +1, max_tokens past the context, n > 1, echo, truncate_prompt_tokens,
speculative_tokens > 0."""
from _h3 import call, check, done, engine, ingress, prompt

for spec in (0, 3):
    kw = dict(kv_cache_tokens=256, max_model_len=128, max_num_batched_tokens=64, speculative_tokens=spec)
    eng, tok = engine(**kw)
    ing = ingress(eng, kw)
    L = 128
    print(f"--- speculative_tokens {spec}")
    # completions, ids
    for n, mt, extra, want, param in [
            (L - 1, 1, {}, 200, None), (L, 1, {}, 400, "prompt"), (L + 1, 1, {}, 400, "prompt"),
            (L - 1, 2, {}, 400, "max_tokens"), (L - 1, 1, {"n": 3}, 200, None), (L - 1, 1, {"echo": True}, 200, None),
            (L - 1, 0, {"echo": True}, 200, None), (L, 0, {"echo": True}, 400, "prompt"),
            (L - 2, 2, {"n": 2, "echo": True}, 200, None),
            (L + 40, 1, {"truncate_prompt_tokens": L - 1}, 200, None),
            (L + 40, 1, {"truncate_prompt_tokens": L}, 400, "prompt")]:
        body = {"prompt": prompt(n, seed=n), "max_tokens": mt, "temperature": 0, **extra}
        status, res = call(ing, "completions", body)
        got = res.get("param") if status != 200 else None
        detail = res["message"] if status != 200 else [c["finish_reason"] for c in res["choices"]]
        check(status == want and got == param, f"completions prompt {n} max_tokens {mt} {extra}: {status} {got} {detail}")
        if status == 200:
            check(all(c["finish_reason"] == "length" for c in res["choices"]) and
                  res["usage"]["completion_tokens"] == max(mt, 0) * extra.get("n", 1),
                  f"   usage {res['usage']}")
    # chat: the template adds tokens; find the prompt length of a message and size it to the edges
    msg = lambda k: [{"role": "user", "content": "a " * k}]
    base = len(ing.tokenizer.apply_chat_template(msg(1), add_generation_prompt=True)) if hasattr(
        ing.tokenizer, "apply_chat_template") else None
    import asyncio
    from cluster.protocol import ChatCompletionRequest

    def chat_len(k):
        body = ChatCompletionRequest.model_validate({"model": ing.model_name, "messages": msg(k)})
        return len(asyncio.run(ing._chat_ids(body)))

    k = next(k for k in range(1, 400) if chat_len(k) >= L - 1)
    n = chat_len(k)
    print("chat prompt of", n, "tokens")
    for kk, mt, extra, want in [(k, None, {}, 200), (k, 1, {}, 200), (k, 2, {}, 400), (k, None, {"n": 2}, 200),
                                (k + 1, None, {}, 400), (k + 40, None, {"truncate_prompt_tokens": L - 1}, 200),
                                (k + 40, None, {"truncate_prompt_tokens": -1}, 400)]:
        body = {"messages": msg(kk), "temperature": 0, **extra, **({"max_tokens": mt} if mt else {})}
        status, res = call(ing, "chat", body)
        detail = (res["param"], res["message"]) if status != 200 else [c["finish_reason"] for c in res["choices"]]
        check(status == want, f"chat prompt {chat_len(kk)} max_tokens {mt} {extra}: {status} {detail}")
    ing.aeng.shutdown()
    check(eng.scheduler.pool.num_free == eng.scheduler.pool.num_blocks and not eng.has_unfinished(),
          "engine empty after the ingress requests")
done()
