"""The prefix cache's host tier: many agent sessions whose histories outgrow the device's KV, with a tier of host
memory and without, side by side in one run.

    PYTHONPATH=. python bench/host_cache.py [--out bench/results/host_cache_cpu.md]          # CPU, the tiny model
    PYTHONPATH=. python bench/host_cache.py --slice --device cuda --system 8192 --kv 24576 --chunk 8192   # the GLM-5.2-width slice

``--sessions`` conversations (each its own system prompt, then turns of ``--turn`` new tokens and ``--answer`` answer
tokens) take turns round-robin, one request at a time; the device's KV (``--kv`` slots) holds about two sessions'
histories, the host tier (``--host`` slots) all of them. After the first round every prompt starts with its session's
last prompt and answer: the time to its first token shows where that history was found — on the device, the host, or
nowhere (computed again). Engines: host tier + device, device only, no prefix cache. Token ids are synthetic.
"""

from __future__ import annotations

import argparse
import random
import tempfile

from bench.prefix_cache import until_first_token, model_path, report, warm_up
from cluster.config import EngineConfig
from cluster.local import build_local_engine
from scheduler.request import SamplingParams


def run(engine, args, vocab: int, tag: str) -> list[dict]:
    rng = random.Random(0)
    prompts = [[rng.randrange(40, vocab) for _ in range(args.system)] for _ in range(args.sessions)]
    params = SamplingParams(max_tokens=args.answer, temperature=0.0, ignore_eos=True)
    rows = []
    for turn in range(args.rounds):
        for s, prompt in enumerate(prompts):
            prompt += [rng.randrange(40, vocab) for _ in range(args.turn)]
            engine.add_request(prompt, params, f"{tag}-{turn}-{s}")
            first, out = until_first_token(engine, {f"{tag}-{turn}-{s}"})
            prompt += out[f"{tag}-{turn}-{s}"]
            rows.append({"round": turn, "session": s, "prompt": len(prompt) - args.answer,
                         "ttft_ms": 1e3 * first[f"{tag}-{turn}-{s}"]})
        print(f"{tag}: round {turn} done", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slice", action="store_true", help="the GLM-5.2-width slice, random FP8 weights (a GPU)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--system", type=int, default=1024, help="each session's system prompt, tokens")
    ap.add_argument("--turn", type=int, default=64)
    ap.add_argument("--answer", type=int, default=16)
    ap.add_argument("--kv", type=int, default=3072, help="device KV slots")
    ap.add_argument("--host", type=int, default=32768, help="host-tier KV slots")
    ap.add_argument("--chunk", type=int, default=512, help="max_num_batched_tokens")
    ap.add_argument("--out", default=None, help="a markdown file for the table (and FILE.json beside it)")
    args = ap.parse_args()
    kinds = {"none": (False, 0), "device": (True, 0), "host": (True, args.host)}
    with tempfile.TemporaryDirectory() as tmp:
        model, fmt = model_path(args.slice, tmp)
        engines = {}
        for kind, (caching, host) in kinds.items():
            print(f"building the engine ({kind}) ...", flush=True)
            cfg = EngineConfig(model=model, load_format=fmt, device=args.device, prefix_caching=caching,
                               host_kv_cache_tokens=host, kv_cache_tokens=args.kv,
                               max_num_batched_tokens=args.chunk, warmup_tokens=0)
            engines[kind], _ = build_local_engine(cfg, progress=False)
    vocab = engines["host"].scheduler.config.vocab_size
    results = {}
    for kind, engine in engines.items():
        warm_up(engine, (args.system + args.turn, args.turn + args.answer + 17, args.turn + 1), vocab, kind)
        rows = run(engine, args, vocab, kind)
        results[kind] = {"rows": rows, "prefix_cache_tokens": engine.prefix_cache_tokens(),
                         "host_loads": engine.scheduler.host_loads}
    lines = [f"Host tier of the prefix cache, {'the GLM-5.2-width slice' if args.slice else 'the embedded tiny model'} "
             f"on {args.device}: {args.sessions} sessions round-robin, system prompts of {args.system} tokens, turns "
             f"of {args.turn} + {args.answer} answer tokens; device KV {args.kv} slots, host tier {args.host}; chunks "
             f"of {args.chunk}.", "",
             "| round | mean prompt tokens | TTFT host + device (ms) | device only (ms) | no cache (ms) | "
             "device only / host | no cache / host |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in range(args.rounds):
        mean = {k: sum(x["ttft_ms"] for x in v["rows"] if x["round"] == r) / args.sessions for k, v in results.items()}
        tokens = sum(x["prompt"] for x in results["host"]["rows"] if x["round"] == r) / args.sessions
        lines.append(f"| {r} | {tokens:.0f} | {mean['host']:.1f} | {mean['device']:.1f} | {mean['none']:.1f} | "
                     f"{mean['device'] / mean['host']:.2f}× | {mean['none'] / mean['host']:.2f}× |")
    lines += ["", "Prompt tokens looked up / found cached: " + ", ".join(
        f"{k} {v['prefix_cache_tokens']}" for k, v in results.items() if k != "none")
        + f"; blocks loaded from the host: {results['host']['host_loads']}."]
    report(lines, results, args.out)


if __name__ == "__main__":
    main()
