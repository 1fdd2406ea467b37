"""A prefill tier that refuses a request for any reason but a full queue — here the documented knob
``prefill: {max_model_len: ...}`` set below the decode replicas' (``prefill_plan`` accepts it), so every long prompt,
the very prompts disaggregation is for, is ``too_long`` there — has the decode replica compute the prompt itself with
no log line and no metric on either tier: ``glmserve_prefill_local_prompts_total`` (short / cached only),
``glmserve_kv_transfer_lost_total`` (fetch / check failures only) and the prefill replica's
``glmserve_refused_requests_total`` all stay 0, ``glmserve_kv_imported_tokens_total`` simply does not grow. The same
holds for a prefill replica whose engine answers with an error (``PrefillResult.error``) or whose worker group is down
(``unavailable``): the code path is one (``Coordinator._prefilled``: ``if res.bundle is None: return None, held``).

Driver: the real Coordinators in-process (``harness.py``). Exit 1 while such prompts are computed on the decode
replica with nothing logged or counted; 0 once a metric (or a warning) tells it."""

from __future__ import annotations

import asyncio
import logging
import sys

sys.path.insert(0, "/work/main/bench/results/session59/review_disagg")
from harness import DEFAULT_MODEL, collect, make_pair, shutdown, tokens  # noqa: E402

from cluster.local import load_tokenizer  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402

TK = load_tokenizer(DEFAULT_MODEL)
STORY = "Once upon a time, in a quiet village by the sea, there lived a fisherman and his wife. "


def samples(coord, names):
    out = {}
    for line in coord.metrics.text().splitlines():
        if any(line.startswith(n) for n in names):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


class Catch(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def main() -> int:
    catch = Catch()
    logging.getLogger("ray.serve").addHandler(catch)
    logging.getLogger("ray.serve").setLevel(logging.DEBUG)
    dec, pre, tier = make_pair(decode={"max_model_len": 1024}, prefill={"max_model_len": 128})
    names = ("glmserve_prefill_local_prompts_total", "glmserve_kv_transfer_lost_total",
             "glmserve_kv_imported_tokens_total", "glmserve_refused_requests_total", "glmserve_requests_total")

    async def run():
        outs = []
        for i in range(3):
            ids = TK.encode(f"[{i}] " + STORY * 8)
            evs = await collect(dec, ids, SamplingParams(max_tokens=6, temperature=0.0), f"long{i}")
            outs.append((len(ids), len(tokens(evs)), evs[-1].error, getattr(evs[-1], "num_cached_tokens", None)))
        return outs
    outs = asyncio.run(run())
    for n, got, err, _ in outs:
        print(f"a {n}-token prompt: {got} tokens, error {err}")
    print("prefill tier asked:", tier.calls)
    print("decode replica metrics:", samples(dec, names))
    print("prefill replica metrics:", samples(pre, names))
    print("log lines:", catch.lines)
    dm = samples(dec, names)
    pm = samples(pre, names)
    counted = any(v > 0 for k, v in dm.items() if k.startswith(("glmserve_prefill_local_prompts_total",
                                                               "glmserve_kv_transfer_lost_total"))) or \
        any(v > 0 for k, v in pm.items() if k.startswith("glmserve_refused_requests_total"))
    logged = any("prefill" in line or "KV" in line for line in catch.lines)
    computed_here = dec.engine.stats["kv_imported_tokens"] == 0 and len(tier.calls) == 3 and \
        all(got == 6 and err is None for _, got, err, _ in outs)
    shutdown(dec, pre)
    silent = computed_here and not counted and not logged
    print("RESULT:", "DEFECT: 3 long prompts refused by the prefill tier were computed on the decode replica; no "
          "metric or log line says so" if silent else f"ok (counted {counted}, logged {logged}, computed here "
          f"{computed_here})")
    return 1 if silent else 0


if __name__ == "__main__":
    sys.exit(main())
