"""The real OpenAIIngress request path (its methods, without Ray; ``_open`` streams from a real in-process
Coordinator, as the Serve handle would). A prompt beyond the context and an n larger than the server admits are
refused 400 by the ingress; a 429 by the coordinator. Which of these does /metrics (the coordinator's text) count?
Also reports how an n=3 request is counted. Exit 1 if a 400 the client got is absent from every metric."""
import asyncio
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../session56/review_load"))
from _m import check, coordinator, done, sample  # noqa: E402

import _hl  # noqa: E402  (session 56's ingress-without-Ray helper)


def ingress_over(coord, cfg_kw):
    ing = _hl.ingress(coord.engine, cfg_kw, aeng=coord.aengine)

    async def _open(self, ids, params, req_id):
        async for ev in coord.generate(ids, params, req_id):
            if ev.refused is not None:
                raise ev.refused
            yield ev
    type(ing)._open = _open
    return ing


async def main():
    kw = dict(kv_cache_tokens=16 * 32, max_num_seqs=4, max_waiting=0)
    c = coordinator(**kw)
    ing = ingress_over(c, {"model": c.cfg.model, **kw})
    before = c.metrics.text()
    st, body = await _hl.acall(ing, "completions", {"prompt": "hello " * 600, "max_tokens": 4})
    print("prompt beyond the context:", st, str(body)[:120])
    st2, body2 = await _hl.acall(ing, "completions", {"prompt": "hello", "max_tokens": 4, "n": 9})
    print("n beyond what the server admits:", st2, str(body2)[:120])
    st3, body3 = await _hl.acall(ing, "completions", {"prompt": "hello there", "max_tokens": 4, "n": 3,
                                                      "temperature": 0})
    print("n=3:", st3)
    after = c.metrics.text()
    for name in ("glmserve_refused_requests_total", "glmserve_requests_total",
                 "glmserve_time_to_first_token_seconds_count", "glmserve_request_prompt_tokens_count"):
        print(f"  {name}: {sample(before, name)} -> {sample(after, name)}")
    refused = sample(after, "glmserve_refused_requests_total") - sample(before, "glmserve_refused_requests_total")
    check(refused >= 2 or st != 400, f"the two 400s the clients got are counted somewhere (refused counter +{refused})")
    c.aengine.shutdown()


asyncio.run(main())
done()
