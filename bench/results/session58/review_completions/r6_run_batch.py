"""glmserve run-batch (cluster/batch.py run_batch) over the real ingress methods (a Post that calls them in-process, one
event loop per worker thread): mixed endpoints (completions, chat, responses, messages), lines that are no requests
(bad JSON, not UTF-8, a list, no custom_id, a duplicate custom_id, GET, an unknown url, stream true, body not an
object), a line the server refuses (400), a 20 MB line, CRLF line ends, blank lines, a file opening with a UTF-8 BOM;
results in the input's order with its custom_ids, counts of failures; a connection reset on one line fails that line
only; 429 is retried."""
import sys, os, io
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _h import *  # noqa: F401,F403
from cluster.batch import run_batch
from cluster.protocol import ApiError

eng = engine()
ing = ingress(eng)
NAMES = {"/v1/completions": "completions", "/v1/chat/completions": "chat_completions", "/v1/responses": "responses",
         "/v1/messages": "messages"}
calls = []


def post(path, body):
    calls.append(body.get("_tag"))
    if body.get("_tag") == "reset":
        raise ConnectionResetError("reset by peer")
    if body.get("_tag") == "busy" and calls.count("busy") < 3:
        return 429, {"error": {"message": "busy"}}, {"retry-after": "0"}
    async def go():
        try:
            resp = await getattr(ing, NAMES[path])(FakeRequest(body))
        except ApiError as e:
            return e.status, e.body()
        return resp.status_code, json.loads(resp.body)
    st, out = asyncio.run(go())
    return st, out, {}


def line(cid, url, body, **kw):
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body, **kw})


M = {"model": "tiny", "temperature": 0}
lines = [
    line("cmpl", "/v1/completions", {**M, "prompt": "The old man said", "max_tokens": 4}),
    line("chat", "/v1/chat/completions", {**M, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    line("resp", "/v1/responses", {**M, "input": "hi", "max_output_tokens": 4}),
    line("msg", "/v1/messages", {**M, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    "{not json",
    b"\xff\xfe{}",
    "[1, 2]",
    json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),
    line("cmpl", "/v1/completions", {**M, "prompt": "dup", "max_tokens": 1}),
    line("get", "/v1/completions", {**M, "prompt": "x"}, method="GET"),
    line("emb", "/v1/embeddings", {**M, "input": "x"}),
    line("stream", "/v1/completions", {**M, "prompt": "x", "stream": True}),
    line("nobody", "/v1/completions", "a string"),
    "   ",
    line("bad400", "/v1/completions", {**M, "prompt": "x", "logprobs": 99}),
    line("huge", "/v1/completions", {**M, "prompt": "a " * 10_000_000, "max_tokens": 1}),
    line("crlf", "/v1/completions", {**M, "prompt": "x", "max_tokens": 1}) + "\r",
    line("reset", "/v1/completions", {**M, "prompt": "x", "max_tokens": 1, "_tag": "reset"}),
    line("busy", "/v1/completions", {**M, "prompt": "x", "max_tokens": 1, "_tag": "busy"}),
    line("score", "/v1/completions", {**M, "prompt": [[358, 1239], [537, 699, 3]], "max_tokens": 0, "echo": True,
                                      "logprobs": 1}),
]
data = b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines)
check(len(lines[15]) > 20_000_000, f"the huge line is {len(lines[15]) / 1e6:.0f} MB")
out = io.StringIO()
t = time.time()
done_, failed = run_batch(io.BytesIO(data), out, post, max_concurrency=4)
print(f"run_batch: {done_} results, {failed} failed, {time.time() - t:.1f} s")
res = [json.loads(x) for x in out.getvalue().splitlines()]
want = ["cmpl", "chat", "resp", "msg", None, None, None, None, "cmpl", "get", "emb", "stream", "nobody", "bad400",
        "huge", "crlf", "reset", "busy", "score"]
check([r["custom_id"] for r in res] == want, f"results in input order: {[r['custom_id'] for r in res]}")
status = {i: (r["response"] or {}).get("status_code") for i, r in enumerate(res)}
errs = {i: (r["error"] or {}).get("message", "")[:60] for i, r in enumerate(res)}
for i, r in enumerate(res):
    print(f"  {i:2d} {str(r['custom_id']):8s} status {status[i]} error {errs[i]!r}")
check([status[i] for i in (0, 1, 2, 3, 15, 17, 18)] == [200] * 7, "good lines (4 endpoints, CRLF, busy→retried, scoring) 200")
check(res[0]["response"]["body"]["object"] == "text_completion" and res[1]["response"]["body"]["object"] ==
      "chat.completion" and res[2]["response"]["body"]["object"] == "response" and
      res[3]["response"]["body"]["type"] == "message", "each endpoint's own body")
check(all(res[i]["response"] is None and "input line" in errs[i] for i in range(4, 13)),
      "lines that are no requests: an error naming the input line")
check(status[13] == 400 and status[14] == 400, f"refused lines keep the server's 400 (bad logprobs: {status[13]}, "
      f"20 MB prompt: {status[14]})")
check(res[16]["response"] is None and "ConnectionResetError" in errs[16], "a reset line fails alone")
check(calls.count("busy") == 3, f"429 retried ({calls.count('busy')} posts)")
check(failed == 12 and done_ == 19, f"counts: {done_} done, {failed} failed (want 19, 12: 9 no-request lines, 2 refused, 1 reset)")
sc = res[18]["response"]["body"]
check([c["index"] for c in sc["choices"]] == [0, 1] and sc["usage"]["prompt_tokens"] == 5, "scoring line: batch order, usage")

done()
