"""Prefix caching: time to first token of prompts that start as earlier ones did, with the cache and without, side by
side in one run.

    PYTHONPATH=. python bench/prefix_cache.py [--out bench/results/prefix_cache.md]          # CPU, the tiny model
    PYTHONPATH=. python bench/prefix_cache.py --slice --system 16384 --turn 256 --device cuda  # the GLM-5.2-width slice

Two workloads on each engine (greedy, ``ignore_eos``):
- *agent*: one conversation — a system prompt, then turns whose prompt is the previous prompt, its answer and a new
  message (as a coding agent resends its history each call): each turn's TTFT;
- *burst*: ``--burst`` requests at once that share the system prompt and differ after it (users of one app): mean TTFT;
- *cold burst*: the same with a system prompt no request sent before (an app's first users at once: one computes it,
  the others wait for its blocks).
Token ids are synthetic (no tokenizer needed); the first turn of each engine also compiles nothing extra on CPU (a
warm-up request runs first on both).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from cluster.config import DEFAULT_MODEL, EngineConfig
from cluster.local import build_local_engine
from scheduler.request import SamplingParams


def until_first_token(engine, rids: set[str]) -> tuple[dict[str, float], dict[str, list[int]]]:
    """Step until every request in ``rids`` ends: each one's time to its first token, and its tokens."""
    t0, first, out = time.perf_counter(), {}, {r: [] for r in rids}
    while engine.has_unfinished():
        for ev in engine.step():
            if ev.error:
                raise RuntimeError(ev.error)
            if ev.token_ids and ev.req_id not in first:
                first[ev.req_id] = time.perf_counter() - t0
            out[ev.req_id] += ev.token_ids
    return first, out


def model_path(slice_: bool, tmp: str) -> tuple[str, str]:
    """(model, load_format): the embedded tiny model, or the GLM-5.2-width slice's config with random weights."""
    if not slice_:
        return DEFAULT_MODEL, "auto"
    from bench.cluster_slice import slice_config

    (Path(tmp) / "config.json").write_text(json.dumps(slice_config(4, False)))
    return tmp, "dummy"


def warm_up(engine, lengths: tuple[int, ...], vocab: int, tag: str) -> None:
    """Prompts of these lengths first (the step shapes the timed ones take compile), then the stats start over."""
    for i, n in enumerate(lengths):
        warm = [random.Random(9 + i).randrange(40, vocab) for _ in range(n)]
        engine.add_request(warm, SamplingParams(max_tokens=2), f"{tag}-warm{i}")
        until_first_token(engine, {f"{tag}-warm{i}"})
    engine._reset_stats()


def report(lines: list[str], results: dict, out: str | None) -> None:
    table = "\n".join(lines)
    print(table)
    if out:
        Path(out).write_text(table + "\n")
        Path(out).with_suffix(".json").write_text(json.dumps(results, indent=1))


def agent(engine, system: list[int], turns: int, turn_len: int, answer: int, vocab: int, tag: str) -> list[dict]:
    rng, prompt, rows = random.Random(1), list(system), []
    params = SamplingParams(max_tokens=answer, temperature=0.0, ignore_eos=True)
    for t in range(turns):
        prompt += [rng.randrange(40, vocab) for _ in range(turn_len)]
        engine.add_request(prompt, params, f"{tag}-agent-{t}")
        first, out = until_first_token(engine, {f"{tag}-agent-{t}"})
        _, hits = engine.prefix_cache_tokens()
        rows.append({"turn": t, "prompt": len(prompt), "ttft_ms": 1e3 * first[f"{tag}-agent-{t}"], "hits": hits})
        prompt += out[f"{tag}-agent-{t}"]
    return rows


def burst(engine, system: list[int], n: int, turn_len: int, vocab: int, tag: str) -> dict:
    rng = random.Random(2)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    rids = set()
    for i in range(n):
        engine.add_request(system + [rng.randrange(40, vocab) for _ in range(turn_len)], params, f"{tag}-burst-{i}")
        rids.add(f"{tag}-burst-{i}")
    first, _ = until_first_token(engine, rids)
    return {"requests": n, "prompt": len(system) + turn_len, "mean_ttft_ms": 1e3 * sum(first.values()) / n,
            "last_ttft_ms": 1e3 * max(first.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slice", action="store_true", help="the GLM-5.2-width slice, random FP8 weights (a GPU)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--system", type=int, default=1024, help="system prompt tokens")
    ap.add_argument("--turn", type=int, default=64, help="tokens of each new message")
    ap.add_argument("--answer", type=int, default=32, help="tokens of each answer")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--burst", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=512, help="max_num_batched_tokens")
    ap.add_argument("--out", default=None, help="a markdown file for the table (and FILE.json beside it)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, fmt = model_path(args.slice, tmp)
        need = args.system + args.turns * (args.turn + args.answer) + 1024
        engines = {}
        for caching in (True, False):
            print(f"building the engine (prefix_caching={caching}) ...", flush=True)
            cfg = EngineConfig(model=model, load_format=fmt, device=args.device, prefix_caching=caching,
                               kv_cache_tokens=max(need * 2, 4096), max_num_batched_tokens=args.chunk,
                               max_num_seqs=max(8, args.burst), warmup_tokens=0)
            engines[caching], _ = build_local_engine(cfg, progress=False)
    vocab = engines[True].scheduler.config.vocab_size
    system = [random.Random(0).randrange(40, vocab) for _ in range(args.system)]
    results = {}
    for caching, engine in engines.items():
        tag = "cached" if caching else "plain"
        # both alike: the kernels compile (a prompt as long as the first turn's, a turn's, a cached turn's tail)
        warm_up(engine, (args.system + args.turn, args.turn + args.answer + 17, args.turn + 1), vocab, tag)
        print(f"{tag}: agent ...", flush=True)
        rows = agent(engine, system, args.turns, args.turn, args.answer, vocab, tag)
        print(f"{tag}: burst ...", flush=True)
        warm = burst(engine, system, args.burst, args.turn, vocab, tag)
        print(f"{tag}: cold burst ...", flush=True)
        for seed in (4, 3):   # the first round compiles its step shapes (CPU: ~3× its time), the second is timed
            fresh = [random.Random(seed).randrange(40, vocab) for _ in range(args.system)]
            cold = burst(engine, fresh, args.burst, args.turn, vocab, f"{tag}-cold{seed}")
        results[tag] = {"agent": rows, "burst": warm, "cold_burst": cold,
                        "prefix_cache_tokens": engine.prefix_cache_tokens()}
    lines = [f"Prefix caching, {'the GLM-5.2-width slice' if args.slice else 'the embedded tiny model'} on "
             f"{args.device}: system prompt {args.system} tokens, turns of {args.turn} + {args.answer} answer tokens, "
             f"chunks of {args.chunk}.", "",
             "| agent turn | prompt tokens | TTFT cached (ms) | TTFT without (ms) | without / cached |",
             "|---:|---:|---:|---:|---:|"]
    for c, p in zip(results["cached"]["agent"], results["plain"]["agent"]):
        lines.append(f"| {c['turn']} | {c['prompt']} | {c['ttft_ms']:.1f} | {p['ttft_ms']:.1f} | "
                     f"{p['ttft_ms'] / c['ttft_ms']:.2f}× |")
    bc, bp = results["cached"]["burst"], results["plain"]["burst"]
    cc, cp = results["cached"]["cold_burst"], results["plain"]["cold_burst"]
    lines += ["", f"Burst of {bc['requests']} requests sharing the system prompt ({bc['prompt']} tokens each): mean TTFT "
              f"{bc['mean_ttft_ms']:.1f} ms cached vs {bp['mean_ttft_ms']:.1f} without "
              f"({bp['mean_ttft_ms'] / bc['mean_ttft_ms']:.2f}×); the last first token {bc['last_ttft_ms']:.1f} vs "
              f"{bp['last_ttft_ms']:.1f} ms.",
              f"The same with a system prompt sent first by the burst (cold): mean TTFT {cc['mean_ttft_ms']:.1f} ms "
              f"cached vs {cp['mean_ttft_ms']:.1f} without ({cp['mean_ttft_ms'] / cc['mean_ttft_ms']:.2f}×); the last "
              f"{cc['last_ttft_ms']:.1f} vs {cp['last_ttft_ms']:.1f} ms.",
              f"Prompt tokens looked up / found cached: {results['cached']['prefix_cache_tokens']}."]
    report(lines, results, args.out)


if __name__ == "__main__":
    main()
