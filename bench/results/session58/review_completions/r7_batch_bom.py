"""run-batch over an input file saved with a UTF-8 byte-order mark (Windows Notepad's "UTF-8 with BOM", PowerShell 5's
Out-File -Encoding utf8, Excel's CSV-to-JSONL exports): cluster/batch.py parse_line decodes each line with "utf-8", so the
first line keeps U+FEFF and json.loads refuses it ("Unexpected UTF-8 BOM") — that request is never sent, while the
server's own body parser (serve.py _parse) takes "utf-8-sig". Exits 1 while the first line is refused."""
import sys, os, io, json
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../.."))
from cluster.batch import run_batch

sent = []


def post(path, body):
    sent.append(body)
    return 200, {"id": "cmpl-x", "object": "text_completion", "choices": []}, {}


lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                     "body": {"model": "tiny", "prompt": "x"}}) for i in range(3)]
data = b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n"
out = io.StringIO()
done, failed = run_batch(io.BytesIO(data), out, post, max_concurrency=2)
res = [json.loads(x) for x in out.getvalue().splitlines()]
for r in res:
    print(r["custom_id"], r["error"])
print(f"{done} results, {failed} failed, {len(sent)} requests sent")
ok = failed == 0 and len(sent) == 3
print("ok" if ok else "FAIL: the BOM-prefixed first line is refused as 'not JSON' and never sent")
sys.exit(0 if ok else 1)
