"""The real context end of the embedded model (2048 positions), engine and ingress: prompts at max_model_len - 1 with
the rest of the context as max_tokens; speculative decoding (MTP, k=3) with the pool exactly max_model_len and with a
16-token budget (chunked prefill); look-ahead (cuda_graphs eager) with two requests ending at the context end;
prompt logprobs of a 2047-token prompt in chunks; through the ingress n=2, echo with max_tokens 0 and logprobs, and
the chat's default max_tokens. Every run must end 'length' exactly at 2048, equal greedy k=0 alone, pool whole."""
from _hl import AdmissionError, check, done, engine, greedy, leftovers, prompt, run

L = 2048
ref, _ = engine(kv_cache_tokens=4096, prefix_caching=False)
check(ref.config.max_model_len == L, f"default max_model_len {ref.config.max_model_len}")


def alone(ids, n):
    return run(ref, {"r": (ids, greedy(n))})[0]["r"]


P1 = prompt(L - 1, seed=1)
P2 = prompt(2000, seed=2)
P3 = prompt(2030, seed=3)
R1, R2, R3 = alone(P1, 1), alone(P2, 48), alone(P3, 18)

# (a) plain engine: 2047 + 1, and 2047 + 2 refused
out, ends, _ = run(ref, {"a": (P1, greedy(1))})
check(out["a"] == R1 and ends["a"][0] == "length", f"2047 + 1: {len(out['a'])} token, {ends['a']}")
try:
    ref.add_request(P1, greedy(2), "b")
    check(False, "2047 + 2 admitted")
except AdmissionError as e:
    check(e.reason == "too_long", f"2047 + 2 refused {e.reason}")
check(not leftovers(ref), f"plain: nothing left {leftovers(ref)}")

# (b) MTP k=3, pool exactly max_model_len (128 blocks)
for budget in (512, 16):
    spec, _ = engine(kv_cache_tokens=L, speculative_tokens=3, max_num_batched_tokens=budget, max_num_seqs=4,
                     prefix_caching=False)
    for name, ids, n, want in (("2000+48", P2, 48, R2), ("2030+18", P3, 18, R3), ("2047+1", P1, 1, R1)):
        try:
            out, ends, steps = run(spec, {"s": (ids, greedy(n))})
            check(out["s"] == want and ends["s"] == ("length", None),
                  f"spec k=3 budget {budget} {name}: equal alone {out['s'] == want}, {len(out['s'])} tokens, "
                  f"{ends['s']}, drafts accepted {spec.stats['drafts_accepted']}")
        except Exception as e:  # noqa: BLE001
            check(False, f"spec k=3 budget {budget} {name}: {type(e).__name__}: {e}")
        check(not leftovers(spec), f"spec budget {budget} {name}: nothing left {leftovers(spec)}")

# (c) look-ahead (eager graphs), pool exactly max_model_len: one short request beside one ending at the context end
ahead, _ = engine(kv_cache_tokens=L + 256, max_model_len=L, cuda_graphs="eager", prefix_caching=False)
short = prompt(100, seed=9)
RS = alone(short, 40)
out, ends, _ = run(ahead, {"x": (P3, greedy(18)), "y": (short, greedy(40))})
check(out["x"] == R3 and out["y"] == RS and ends["x"][0] == "length",
      f"look-ahead at the end: equal alone x {out['x'] == R3}, y {out['y'] == RS}; ahead steps "
      f"{ahead.stats['ahead_steps']}")
check(not leftovers(ahead), f"look-ahead: nothing left {leftovers(ahead)}")

# (d) prompt logprobs of 2047 tokens, in 256-token chunks, with the prefix cache on and the prompt cached already
pl, _ = engine(kv_cache_tokens=4096, max_num_batched_tokens=256)
run(pl, {"warm": (P1, greedy(1))})
got = {}
pl.add_request(P1, greedy(1, prompt_logprobs=1), "p")
while pl.has_work():
    for ev in pl.step():
        if ev.prompt_logprobs is not None:
            got["lps"] = ev.prompt_logprobs
        if ev.finished:
            got["end"] = (ev.finish_reason, ev.error)
check(len(got.get("lps") or []) == L - 2, f"prompt logprobs of 2047 tokens: {len(got.get('lps') or [])} entries "
      f"(want 2046), end {got.get('end')}")
check(not leftovers(pl), f"prompt logprobs: nothing left {leftovers(pl)}")

# (e) the ingress at the edge
import asyncio  # noqa: E402

from _hl import acall, ingress  # noqa: E402

CFG = dict(kv_cache_tokens=4096, max_num_batched_tokens=256)
eng, _ = engine(**CFG)
ing = ingress(eng, CFG)


async def edge():
    s, o = await acall(ing, "completions", {"prompt": P2, "max_tokens": 48, "n": 2, "temperature": 0,
                                             "ignore_eos": True, "return_token_ids": True})
    ok = s == 200 and all(c["finish_reason"] == "length" and c.get("token_ids") == R2 for c in o["choices"])
    check(ok, f"ingress n=2, 2000 + 48: {s} {[c['finish_reason'] for c in o['choices']] if s == 200 else o}")
    s, o = await acall(ing, "completions", {"prompt": P1, "max_tokens": 0, "echo": True, "logprobs": 1})
    n = len(o["choices"][0]["logprobs"]["tokens"]) if s == 200 else None
    check(s == 200 and n == L - 1, f"ingress echo, max_tokens 0, logprobs, 2047 tokens: {s}, {n} logprob tokens")
    s, o = await acall(ing, "completions", {"prompt": P1, "max_tokens": 1, "temperature": 0, "ignore_eos": True,
                                            "return_token_ids": True})
    check(s == 200 and o["choices"][0].get("token_ids") == R1, f"ingress 2047 + 1: {s}")
    s, o = await acall(ing, "completions", {"prompt": P1, "max_tokens": 2})
    check(s == 400, f"ingress 2047 + 2: {s} {o.get('param') if s != 200 else ''}")

asyncio.run(edge())
ing.aeng.shutdown()
check(not leftovers(eng), f"ingress engine: nothing left {leftovers(eng)}")
done()
