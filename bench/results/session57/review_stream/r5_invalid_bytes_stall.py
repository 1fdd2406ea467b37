"""r5: an output whose text keeps ending in U+FFFD (a run of bytes that never make a character: here a lone UTF-8
continuation byte, 0x80, pushed by logit_bias +100) through the real ingress and the real tiny-model engine, streamed.

Observed: no text reaches the client until the request ends (every chunk's text is "" — the detokenizer holds while
its text ends in U+FFFD), and the engine's step loop decodes the whole held output twice per token (the
IncrementalDetokenizer's window never advances): the decode work per step grows with the output, for every request
on the replica (the step thread runs it). An ordinary output of the same length is shown beside it.
Exits 1 when the invalid-byte stream holds all its text to the end or its decode work per token grows with length."""
import asyncio
import json
import sys
import time

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _hs import FakeRequest, byte_id, check, done, engine, ingress  # noqa: E402

eng = engine(max_model_len=2048)
ing = ingress(eng)
N = 1200

counted = {"ids": 0, "s": 0.0}
real_decode = eng.decode


def counting_decode(ids):
    t = time.perf_counter()
    out = real_decode(ids)
    counted["s"] += time.perf_counter() - t
    counted["ids"] += len(ids)
    return out


if hasattr(real_decode, "stream"):  # (after the fix: a TextOf streams through the ids' bytes — count those instead)
    real_bytes = real_decode.token_bytes

    def counting_bytes(t):
        counted["ids"] += 1
        return real_bytes(t)

    real_decode.token_bytes = counting_bytes
else:
    eng.decode = counting_decode        # OutputStream.open takes the engine's decode at admission


async def stream(body):
    resp = await ing.completions(FakeRequest({"model": ing.model_name, **body}))
    t0, first_text, chunks, text = time.perf_counter(), None, 0, ""
    async for c in resp.body_iterator:
        c = c if isinstance(c, str) else c.decode()
        for line in c.split("\n\n"):
            if line.startswith("data: {"):
                d = json.loads(line[6:])
                if d.get("choices"):
                    chunks += 1
                    if d["choices"][0]["text"] and first_text is None:
                        first_text = (time.perf_counter() - t0, chunks)
                    text += d["choices"][0]["text"]
    return time.perf_counter() - t0, first_text, chunks, text


rows = {}
for name, bias in (("ordinary", None), ("invalid bytes", {str(byte_id(0x80)): 100})):
    counted.update(ids=0, s=0.0)
    body = {"prompt": "Hello", "max_tokens": N, "temperature": 0, "ignore_eos": True, "stream": True}
    if bias:
        body["logit_bias"] = bias
    total, first, chunks, text = asyncio.run(stream(body))
    rows[name] = (total, first, chunks, text, counted["ids"], counted["s"])
    print(f"{name:14s}: {N} tokens in {total:.1f} s, {chunks} chunks; first text after "
          f"{'never (only at the end)' if first is None or first[1] == chunks else f'{first[0]:.2f} s (chunk {first[1]})'}"
          f"; text {len(text)} chars {text[:12]!r}...; detokenizer decoded {rows[name][4]} ids "
          f"({rows[name][4] / N:.0f} per token) in {rows[name][5]:.2f} s")

inv = rows["invalid bytes"]
check(inv[1] is not None and inv[1][1] < inv[2], f"invalid-byte output: text streams before the last chunk (first "
      f"text at chunk {inv[1][1] if inv[1] else None} of {inv[2]})")
check(inv[4] / N < 20, f"invalid-byte output: ids decoded per token bounded (got {inv[4] / N:.0f} per token over {N}; "
      f"ordinary {rows['ordinary'][4] / N:.0f})")
ing.aeng.shutdown()
done()
