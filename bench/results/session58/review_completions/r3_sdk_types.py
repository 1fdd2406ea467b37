"""The openai SDK (3.x) as a user drives it, over httpx.MockTransport into the real ingress methods: completions.create
whole and streamed for the request surface's variants, models.list / retrieve; each body validated with the SDK's own
pydantic types (Completion, Model) — strictly by model_validate, and as the SDK itself builds them. A variant whose
body the SDK's types refuse is listed (vLLM's own echo answer has the same null first entry: see review.md)."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _h import *  # noqa: F401,F403
import httpx2 as httpx
import openai
from openai.types import Completion, Model

eng = engine()
ing = ingress(eng)


def handler(request: httpx.Request) -> httpx.Response:
    from cluster.protocol import ApiError
    try:
        return _handle(request)
    except ApiError as e:
        return httpx.Response(e.status, json=e.body())


def _handle(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if request.method == "GET" and path == "/v1/models":
        return httpx.Response(200, json=asyncio.run(ing.models()))
    if request.method == "GET" and path.startswith("/v1/models/"):
        return httpx.Response(200, json=asyncio.run(ing.model(path[len("/v1/models/"):])))
    body = json.loads(request.content)
    body.pop("model", None)
    st, out = call(ing, "completions", body)
    if isinstance(out, str):
        return httpx.Response(st, content=out.encode(), headers={"content-type": "text/event-stream"})
    return httpx.Response(st, json=out)


client = openai.OpenAI(base_url="http://glmserve.test/v1", api_key="x",
                       http_client=httpx.Client(transport=httpx.MockTransport(handler)))
VARIANTS = {
    "plain": dict(prompt="The old man said", max_tokens=5),
    "logprobs 3": dict(prompt="The old man said", max_tokens=5, logprobs=3),
    "echo": dict(prompt="The old man said", max_tokens=5, echo=True),
    "echo + logprobs": dict(prompt="The old man said", max_tokens=5, echo=True, logprobs=2),
    "scoring (max_tokens 0)": dict(prompt=[[358, 1239, 537, 699], [358, 1239]], max_tokens=0, echo=True, logprobs=1),
    "batch × n, seed": dict(prompt=["a b", "c d"], n=2, seed=3, max_tokens=4, logprobs=1),
    "stop + suffix ''": dict(prompt="The old man said", max_tokens=20, stop=[","], suffix=""),
    "best_of == n": dict(prompt="The old man said", max_tokens=4, n=2, best_of=2, seed=1),
    "vLLM extras": dict(prompt="The old man said", max_tokens=4, extra_body={
        "return_token_ids": True, "prompt_logprobs": 2, "return_tokens_as_token_ids": True}),
}
strict_fail = []
for name, kw in VARIANTS.items():
    r = client.completions.create(model="tiny", **kw)
    check(isinstance(r, Completion) and len(r.choices) >= 1, f"{name}: the SDK returns a Completion "
          f"({len(r.choices)} choices, finish {[c.finish_reason for c in r.choices]})")
    raw = r.model_dump()
    try:
        Completion.model_validate(r.to_dict() if hasattr(r, "to_dict") else raw)
    except Exception as e:  # noqa: BLE001
        strict_fail.append(name)
        print(f"     {name}: Completion.model_validate refuses the body: {str(e).splitlines()[0:3]}")
    # streamed, joined
    if "prompt_logprobs" in kw.get("extra_body", {}):
        continue
    s = client.completions.create(model="tiny", stream=True, stream_options={"include_usage": True}, **kw)
    got = list(s)
    check(all(isinstance(c, Completion) for c in got) and got[-1].usage is not None,
          f"{name}: streamed chunks are Completions, the last with usage ({len(got)} chunks)")
print("variants whose body Completion.model_validate refuses (first echoed token's null logprob):", strict_fail)

ms = client.models.list()
check([m.id for m in ms.data] == ["tiny"] and isinstance(ms.data[0], Model), f"models.list: {[m.id for m in ms.data]}")
Model.model_validate(asyncio.run(ing.models())["data"][0])
check(client.models.retrieve("tiny").id == "tiny", "models.retrieve('tiny')")
try:
    client.models.retrieve("nope")
    check(False, "models.retrieve('nope') raises NotFoundError")
except openai.NotFoundError:
    check(True, "models.retrieve('nope') raises NotFoundError")
except Exception as e:  # noqa: BLE001
    check(False, f"models.retrieve('nope') raised {type(e).__name__}")
done()
