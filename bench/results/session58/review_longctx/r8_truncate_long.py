"""truncate_prompt_tokens at long contexts through the real OpenAIIngress methods (no Ray; session 55's harness copied
as _h.py) over a real engine at max_model_len 2048 (= max_position_embeddings): a 3000-token prompt cut to its last k
tokens, with max_tokens = 2048 - k exactly and left out; the output tokens == the model's own greedy loop on ids[-k:],
usage.prompt_tokens == k; k = 2048 (no room) and -1 are 400, not a silent cut of the output. Chat too (cut after the
template). Exit 1 on a mismatch."""
import os
import sys
sys.path.insert(0, os.path.dirname(__file__))
from common import T0, finish, log, prompt_ids, ref_greedy, text_prompt  # noqa
from _h import call, engine, ingress  # noqa

bad = []
kw = dict(kv_cache_tokens=2048, max_model_len=2048, kernels="reference", max_num_batched_tokens=512)
eng, tok = engine(**kw)
ing = ingress(eng, kw)
long = text_prompt(tok, 3000, 31)
for k, mt, want in [(2047, 1, 200), (2000, 48, 200), (2016, None, 200), (2032, 16, 200), (2033, 15, 200),
                    (2048, 1, 400), (-1, None, 400), (2000, 49, 400)]:
    body = {"prompt": long, "temperature": 0, "truncate_prompt_tokens": k, "return_token_ids": True,
            "ignore_eos": True, **({"max_tokens": mt} if mt is not None else {})}
    status, res = call(ing, "completions", body)
    if status != want:
        bad.append((k, mt, status, res if status != 200 else None))
        log(f"k={k} max_tokens={mt}: status {status} want {want}: {res if status != 200 else ''}")
        continue
    if status != 200:
        log(f"k={k} max_tokens={mt}: {status} {res['param']}: {res['message'][:140]}")
        continue
    ch = res["choices"][0]
    got = ch.get("token_ids")
    kk = 2048 if k == -1 else k
    n_out = mt if mt is not None else 16
    ref = ref_greedy(long[-kk:], n_out)
    ok = got == ref and res["usage"]["prompt_tokens"] == kk
    log(f"k={k} max_tokens={mt}: usage {res['usage']} finish {ch['finish_reason']} tokens equal ref: {got == ref}")
    if not ok:
        bad.append((k, mt, "tokens/usage", got, ref))
# chat: a long conversation cut to its last tokens
msg = [{"role": "user", "content": " ".join(["the old man said to the sea"] * 600)}]
for k, mt, want in [(2040, 8, 200), (2047, None, 200), (2048, None, 400)]:
    body = {"messages": msg, "temperature": 0, "truncate_prompt_tokens": k, "ignore_eos": True,
            **({"max_tokens": mt} if mt is not None else {})}
    status, res = call(ing, "chat", body)
    log(f"chat k={k} max_tokens={mt}: {status} " + (f"usage {res['usage']} finish {res['choices'][0]['finish_reason']}"
                                                    if status == 200 else f"{res['param']} {res['message'][:140]}"))
    if status != want or (status == 200 and (res["usage"]["prompt_tokens"] != k or
                                             res["usage"]["completion_tokens"] != (mt or 2048 - k))):
        bad.append(("chat", k, mt, status))
ing.aeng.shutdown()
if eng.scheduler.pool.num_free != eng.scheduler.pool.num_blocks:
    bad.append("blocks not free")
finish(not bad, f"{bad}")
