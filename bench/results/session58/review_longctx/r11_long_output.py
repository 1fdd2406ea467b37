"""A long *output*: a 16-token prompt and max_tokens 2032 (prompt + max_tokens == max_model_len 2048, pool 2048), greedy,
ignore_eos, with stop strings that never match (the detokenizer's stop matcher runs over the whole output) — k = 0 and
k = 3 (drafts cross every block boundary up to the end): tokens == the model's own greedy loop; the text equals the
tokenizer's decode of the tokens; the engine's step time at the end is not many times that at the start (no
per-step cost that grows with the output, e.g. re-detokenizing it). Exit 1 on a mismatch / a > 4x slowdown."""
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa

bad = []
eng0, tok = engine()
P = text_prompt(tok, 16, 51)
t = time.time()
ref = ref_greedy(P, 2032)
log(f"ref: {len(ref)} tokens in {time.time() - t:.1f}s")
for k in (0, 3):
    eng, _ = engine(max_model_len=2048, kv_cache_tokens=2048, speculative_tokens=k)
    eng.add_request(P, SamplingParams(max_tokens=2032, temperature=0.0, ignore_eos=True, stop=("zzqx never", "@@@@")), "L")
    out, text, times, reason = [], "", [], None
    while eng.has_work():
        t = time.perf_counter()
        evs = eng.step()
        times.append((len(out), time.perf_counter() - t))
        for e in evs:
            out += e.token_ids
            text += e.text
            if e.finished:
                reason = e.finish_reason
    first = [dt for n, dt in times if 50 <= n < 250]
    last = [dt for n, dt in times if n >= 1800]
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")
    ratio = med(last) / med(first)
    same_text = text == tok.decode(out)
    log(f"k={k}: {len(out)} tokens, reason {reason}, equal ref {out == ref} (first diff "
        f"{next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), None)}), text == decode {same_text}, "
        f"step median {med(first) * 1e3:.1f} ms at 50-250 tokens, {med(last) * 1e3:.1f} ms past 1800 ({ratio:.2f}x), "
        f"accepted {eng.stats['drafts_accepted']} free {eng.scheduler.pool.num_free}/{eng.scheduler.pool.num_blocks}")
    if out != ref or reason != "length" or not same_text or ratio > 4:
        bad.append((k, out == ref, reason, same_text, ratio))
finish(not bad, f"{bad}")
