"""Aborting a request mid-speculation (MTP k = 3) frees everything — pool blocks, scheduler running / waiting / live,
the engine's maps, the runner's request state — and does not disturb other requests' tokens. Aborts: between steps
while drafts are pending; from another thread while the step runs (as AsyncEngine's abort on disconnect does),
also re-adding the same id during that step; aborting the second request so the first goes solo and drafts.
Exit 1 on leftover state or changed tokens."""
import sys
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import SamplingParams, collect, engine, prompts, state  # noqa: E402

bad = []
P = prompts(4, seed=11)
G = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=2)
S = SamplingParams(max_tokens=40, temperature=0.9, seed=3, ignore_eos=True, frequency_penalty=0.5)
plain, _ = engine()
want = {n: collect(plain, {n: (P[0], p)})[n]["tokens"] for n, p in (("g", G), ("s", S))}
want_b = collect(plain, {"b": (P[1], G)})["b"]["tokens"]


def check_clean(tag, eng):
    for _ in range(2):
        eng.step()
    s = state(eng)
    print(tag, s)
    if s["free"] != s["num_blocks"] or any(s[k] for k in ("running", "waiting", "live", "streams", "rank_of", "unsent",
                                                            "forget", "runner_requests")):
        bad.append(f"{tag}: leftover {s}")


for name, params in (("g", G), ("s", S)):
    # 1. abort the solo drafting request between steps, drafts pending; then another runs
    eng, _ = engine(speculative_tokens=3)
    eng.add_request(P[0], params, "x")
    for _ in range(4):
        eng.step()
    pending = eng.scheduler.get("x").draft_ids
    ev = eng.abort("x")
    print(f"{name} abort between steps: pending drafts {pending}, event {ev.finish_reason if ev else None}")
    got = collect(eng, {"b": (P[1], G)})["b"]["tokens"]
    if got != want_b:
        bad.append(f"{name} after abort: b {got} != {want_b}")
    check_clean(f"{name} between", eng)

    # 2. abort from 'another thread' while the step runs (inside execute), then re-add the same id in that step
    for readd in (False, True):
        eng, _ = engine(speculative_tokens=3)
        inner = eng.executor.execute
        calls = [0]

        def execute(steps, inner=inner, eng=eng, calls=calls, readd=readd, params=params):
            calls[0] += 1
            if calls[0] == 5:
                eng.abort("x")
                if readd:
                    eng.add_request(P[0], params, "x")
            return inner(steps)

        eng.executor.execute = execute
        out = collect(eng, {"x": (P[0], params)})["x"]
        print(f"{name} abort in step (re-add {readd}): {len(out['tokens'])} tokens, reason {out['reason']}")
        if readd and out["tokens"][-len(want[name]):] != want[name]:
            bad.append(f"{name} re-added x: {out['tokens']} does not end with its plain output {want[name]}")
        eng.executor.execute = inner
        check_clean(f"{name} in-step re-add={readd}", eng)

    # 3. two requests; abort b mid-run: x goes solo and drafts; x's tokens are plain's
    eng, _ = engine(speculative_tokens=3)
    out = collect(eng, {"x": (P[0], params), "b": (P[1], G)}, {6: [("abort", "b")]})
    if out["x"]["tokens"] != want[name]:
        bad.append(f"{name} beside aborted b: {out['x']['tokens']} != {want[name]}")
    if eng.stats["draft_rounds"] == 0:
        bad.append(f"{name}: x never drafted after b's abort")
    check_clean(f"{name} abort other", eng)
print("\n".join(bad) or "clean")
sys.exit(1 if bad else 0)
