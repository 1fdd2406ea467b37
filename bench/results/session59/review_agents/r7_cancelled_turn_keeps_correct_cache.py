"""Check (right): an agent's user presses Esc — the turn's request is cut mid-prefill or mid-answer — and the client
sends the same history again. The blocks the cut request had computed are reused (cached_tokens > 0 where a chunk had
finished) and the answer is the one a server without them gives: greedy tokens equal, logprobs within 2e-6 of a run
under another cache_salt (which shares no blocks). Six prompts of 1100-1600 tokens (512-token prefill chunks)."""

import asyncio
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _server import MODEL, server  # noqa: E402

import httpx2 as httpx  # noqa: E402


async def run(url: str, bad: list) -> None:
    rng = random.Random(5)
    async with httpx.AsyncClient(timeout=120) as cl:
        for i, cut in enumerate((0.25, 0.6, 1.0, 0.4, 0.8, 1.3)):
            words = " ".join(rng.choice(["alpha", "beta", "gamma", "file", "code", "def", "return"]) +
                             str(rng.randint(0, 99)) for _ in range(rng.randint(300, 600)))
            msgs = [{"role": "system", "content": words}, {"role": "user", "content": "go"}]
            b = {"model": MODEL, "messages": msgs, "max_tokens": 24, "temperature": 0, "reasoning_effort": "none",
                 "logprobs": True, "return_token_ids": True}
            try:
                await asyncio.wait_for(cl.post(url + "/v1/chat/completions",
                                               json=dict(b, cache_salt=f"r7-{i}a", max_tokens=200, stream=True)), cut)
                how = "answered before the cut"
            except asyncio.TimeoutError:
                how = f"cut after {cut} s"
            await asyncio.sleep(0.3)
            again = (await cl.post(url + "/v1/chat/completions", json=dict(b, cache_salt=f"r7-{i}a"))).json()
            fresh = (await cl.post(url + "/v1/chat/completions", json=dict(b, cache_salt=f"r7-{i}b"))).json()
            ta, tb = again["choices"][0]["token_ids"], fresh["choices"][0]["token_ids"]
            la = [c["logprob"] for c in again["choices"][0]["logprobs"]["content"]]
            lb = [c["logprob"] for c in fresh["choices"][0]["logprobs"]["content"]]
            dlp = max(abs(x - y) for x, y in zip(la, lb))
            print(f"prompt {again['usage']['prompt_tokens']}: {how}; sent again: cached "
                  f"{again['usage']['prompt_tokens_details']['cached_tokens']} (fresh salt: "
                  f"{fresh['usage']['prompt_tokens_details']['cached_tokens']}); tokens equal {ta == tb}, "
                  f"max |dlogprob| {dlp:.1e}")
            if ta != tb or dlp > 2e-6 or fresh["usage"]["prompt_tokens_details"]["cached_tokens"]:
                bad.append(f"prompt {i}")


def main() -> int:
    bad: list[str] = []
    with server() as url:
        asyncio.run(run(url, bad))
    print("FAILED: " + ", ".join(bad) if bad else "ok: a cut turn's cached blocks give the uncached answer")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
