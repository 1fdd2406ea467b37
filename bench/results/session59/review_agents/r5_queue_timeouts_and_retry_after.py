"""Check (right), on a server of one running slot and one waiting slot (--max-num-seqs 1 --max-waiting 1):

  * a full engine answers 429 with Retry-After: 1 and an OpenAI / Anthropic error body, before any stream starts;
  * the openai SDK retries it after Retry-After's second and gets the answer once a slot frees; so does the anthropic
    SDK on /v1/messages;
  * a request waiting in the queue whose SDK timeout fires (1.5 s, 2 retries: 3 attempts, whole and streamed) leaves
    nothing queued, and no attempt runs later (the generated tokens are only the admitted requests')."""

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _server import MODEL, metrics, server  # noqa: E402

import httpx2 as httpx  # noqa: E402


def main() -> int:
    import anthropic
    import openai
    from openai import OpenAI
    bad: list[str] = []
    with server(["--max-num-seqs", "1", "--max-waiting", "1"]) as url:
        c0 = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        done = {}

        def hold(tag, n):
            r = c0.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": tag}], max_tokens=n,
                                           extra_body={"ignore_eos": True})
            done[tag] = r.usage.completion_tokens

        # 1) a full engine: A runs, B waits, C gets 429
        ths = [threading.Thread(target=hold, args=("A", 200)), threading.Thread(target=hold, args=("B", 20))]
        for th in ths:
            th.start()
            time.sleep(0.8)
        m = metrics(url)
        print(f"A running, B waiting: running {m['glmserve_running_requests']}, waiting {m['glmserve_queue_depth']}")
        for route, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "C"}], "stream": True}),
                            ("/v1/messages", {"messages": [{"role": "user", "content": "C"}], "max_tokens": 5})):
            r = httpx.post(url + route, json={"model": MODEL, "max_tokens": 5, **body}, timeout=30)
            print(f"{route}: {r.status_code} retry-after {r.headers.get('retry-after')} {r.text[:120]}")
            if r.status_code != 429 or r.headers.get("retry-after") != "1":
                bad.append(f"{route}: no 429 with Retry-After 1")
        t0 = time.time()
        out = OpenAI(base_url=url + "/v1", api_key="x", max_retries=20, timeout=60).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "C"}], max_tokens=5)
        print(f"openai SDK (max_retries 20): answered after {time.time() - t0:.1f} s, {out.usage.completion_tokens} tokens")
        for th in ths:
            th.join()
        ths = [threading.Thread(target=hold, args=("A2", 200)), threading.Thread(target=hold, args=("B2", 20))]
        for th in ths:
            th.start()
            time.sleep(0.8)
        t0 = time.time()
        msg = anthropic.Anthropic(base_url=url, api_key="x", max_retries=20).messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "C"}])
        print(f"anthropic SDK (max_retries 20): answered after {time.time() - t0:.1f} s, stop {msg.stop_reason}")
        for th in ths:
            th.join()

        # 2) queued requests whose SDK timeout fires, while D (streamed, closed afterwards) holds the slot
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=120, json={
                "model": MODEL, "messages": [{"role": "user", "content": "D"}], "max_tokens": 1800, "stream": True,
                "ignore_eos": True}) as d:
            lines = d.iter_lines()
            next(lines)
            cb = OpenAI(base_url=url + "/v1", api_key="x", max_retries=2, timeout=1.5)
            for stream in (False, True):
                t0 = time.time()
                try:
                    r = cb.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "E"}],
                                                   max_tokens=300, stream=stream, extra_body={"ignore_eos": True})
                    for _ in (r if stream else ()):
                        pass
                    bad.append(f"E (stream={stream}) was answered while D held the slot")
                except openai.APITimeoutError:
                    print(f"E (stream={stream}) timed out after {time.time() - t0:.1f} s (3 attempts) while D ran")
                time.sleep(0.3)
                m = metrics(url)
                print(f"   then: running {m['glmserve_running_requests']}, waiting {m['glmserve_queue_depth']}")
                if m["glmserve_queue_depth"] != 0:
                    bad.append(f"a timed-out attempt (stream={stream}) stayed queued")
        time.sleep(1.0)                             # D closed: its slot frees; nothing queued may start in it
        g1 = metrics(url)["glmserve_generated_tokens_total"]
        time.sleep(2.0)
        m = metrics(url)
        print(f"D closed: running {m['glmserve_running_requests']}, waiting {m['glmserve_queue_depth']}, tokens "
              f"generated in the 2 s after {m['glmserve_generated_tokens_total'] - g1:.0f}")
        if m["glmserve_running_requests"] or m["glmserve_queue_depth"] or m["glmserve_generated_tokens_total"] != g1:
            bad.append("a timed-out attempt ran later")
    print("FAILED: " + "; ".join(bad) if bad else "ok: 429s retried as told, timed-out attempts left nothing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
