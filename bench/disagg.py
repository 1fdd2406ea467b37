"""Disaggregated prefill (``cluster/disagg.py``): what moving a prompt's KV costs, and what it buys.

    PYTHONPATH=. python bench/disagg.py transfer [--device cuda] [--tokens 1024 8192] [--out DIR]
    PYTHONPATH=. python bench/disagg.py serve [--seconds 40] [--out DIR]
    PYTHONPATH=. python bench/disagg.py turns [--conversations 4 --turns 6] [--out DIR]
    PYTHONPATH=. python bench/disagg.py stall [--slice --device cuda] [--tokens 4096 32768] [--fp8] [--out DIR]
    PYTHONPATH=. python bench/disagg.py fill [--tokens 1024 4096] [--out DIR]           (a GPU)

``transfer``: a GLM-5.2 prompt's KV at full depth (78 layers + the MTP layer, 21 + 1 indexer layers; bf16 and FP8
rows) through each leg of its way — the prefill rank's gather to host memory (``KVCache.read_blocks``), the step
channel to its engine, the ``KVDepot`` beside the prefill replica and back out to the decode replica (Ray's object
store), the decode rank's write into its blocks (``write_blocks``) — in ms and GB/s.

``serve``: the same two engines' worth of hardware (2 cores here: each engine's worker computes on one thread) split
two ways over HTTP with the embedded tiny model — two ordinary replicas, or a prefill replica and a decode replica —
under one workload: 6 streams decoding 96 tokens after short prompts, over and over, while one client sends prompts of
1500 tokens (4 tokens each) back to back. Reports the decoding streams' inter-token latency (a long prompt's chunks
stall the decodes of the replica that computes them) and tokens/s, and the long prompts' time to first token.

``turns``: the same two setups under multi-turn conversations (a coding agent's: each turn repeats the history and adds
a little): the first and later turns' time to first token, and the prompt tokens whose KV moved between replicas (a
decode replica asks only for the part of a prompt it does not hold cached).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.decode_slice import SLICE  # noqa: E402
from models.cache import ImportWriter, KVCache  # noqa: E402
from models.config import ModelConfig  # noqa: E402

# GLM-5.2 at full depth: the bench slice's widths (``bench/decode_slice.py``) with its 78 layers, IndexShare's 21
# indexer layers and the MTP layer
GLM52 = {**SLICE, "num_hidden_layers": 78, "first_k_dense_replace": 3,
         "mlp_layer_types": ["dense"] * 3 + ["sparse"] * 75,
         "indexer_types": ["full" if i < 3 or (i - 2) % 4 == 0 else "shared" for i in range(78)],
         "num_nextn_predict_layers": 1}
BLOCK = 64


def _ms(fn, device: str, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def transfer(device: str, token_counts: list[int], out: Path) -> None:
    cfg = ModelConfig.from_dict(GLM52)
    assert sum(map(cfg.has_indexer, range(cfg.num_cache_layers))) == 22
    lines = [f"# Disaggregated prefill: moving a GLM-5.2 prompt's KV ({device})", "",
             f"`PYTHONPATH=. python bench/disagg.py transfer --device {device} --tokens "
             f"{' '.join(map(str, token_counts))}` — {time.strftime('%Y-%m-%d %H:%M')}; best of 3 (Ray: of 2).", "",
             "Each leg's ms (GB/s). Gather: the prefill rank's `read_blocks` (device rows to host memory); channel: "
             "the step channel's send and receive over a local socket (rank → its engine; the decode side pays it "
             "again, engine → rank); object store: left in a `KVDepot` actor and taken back (`stage_bundle` / "
             "`fetch_bundle`: two copies); write: the decode rank's `write_blocks` (host rows into its blocks, a "
             "pageable copy); staged write: the engine's since session 53 (`ImportWriter`: the rows copied into pinned "
             "memory on a thread — the fill, beside the step — then to the device and into their blocks; here waited "
             "for whole). The total counts the staged write.", "",
             "| KV rows | tokens | MB | gather | channel | object store | write | staged write (of it the fill) "
             "| total ms | ms per 1k tokens |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ray = _ray()
    for fp8 in (False, True):
        for tokens in token_counts:
            blocks = tokens // BLOCK
            src = KVCache(cfg, blocks * BLOCK, torch.bfloat16, device, fp8=fp8)
            dst = KVCache(cfg, blocks * BLOCK, torch.bfloat16, device, fp8=fp8)
            for t in src.tensors():
                t.view(torch.uint8).random_()
            order = random.Random(0).sample(range(blocks), blocks)     # a request's blocks lie anywhere in the pool
            rows = src.read_blocks(order, BLOCK)
            nbytes = sum(r.nbytes for r in rows)
            gb = nbytes / 1e9
            gather = _ms(lambda: src.read_blocks(order, BLOCK), device)
            channel = _ms(lambda: _over_channel(rows), "cpu")
            store = _store_ms(ray, rows) if ray is not None else float("nan")
            write = _ms(lambda: dst.write_blocks(order, BLOCK, rows), device)
            assert all((a == b).all() for a, b in zip(dst.read_blocks(order, BLOCK), rows))
            for t in dst.tensors():
                t.zero_()
            writer = ImportWriter(dst, BLOCK)
            staged = _ms(lambda: _write_landed(writer, [(order, rows)]), device)
            fill = _ms(lambda: writer.stage([(order, rows)]).wait(), device)
            assert all((a == b).all() for a, b in zip(dst.read_blocks(order, BLOCK), rows))
            total = gather + channel + (store if store == store else 0.0) + staged
            lines.append(f"| {'FP8' if fp8 else 'bf16'} | {tokens} | {nbytes / 1e6:.0f} | "
                         + " | ".join(f"{v:.0f} ({gb / (v / 1e3):.1f})" if v == v else "—"
                                      for v in (gather, channel, store, write))
                         + f" | {staged:.0f} ({gb / (staged / 1e3):.1f}; {fill:.0f}) "
                         + f"| {total:.0f}{'' if store == store else ' (no Ray)'} | {total / tokens * 1e3:.1f} |")
            print(lines[-1], flush=True)
    per = KVCache.bytes_per_slot(cfg, torch.bfloat16), KVCache.bytes_per_slot(cfg, torch.bfloat16, True)
    lines += ["", f"A token's KV at full depth: {per[0]} bytes bf16, {per[1]} FP8 (a rank's, whose requests it holds "
              "whole: the KV is not split between ranks)."]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"disagg_transfer_{device}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _write_landed(writer: ImportWriter, writes) -> None:
    """``writes`` staged, sent and landed in their slots at once (the engine spreads this over two steps since session
    54: ``write(staged, land)`` sends the rows, the next step's ``write`` lands them)."""
    writer.write(writer.stage(writes), True)
    writer.write(None, True)


def fill(token_counts: list[int], out: Path) -> None:
    """The decode rank's write of a step's rows (GLM-5.2's full depth, FP8 rows, blocks anywhere in the pool) by each
    way: the pageable copy (``write_blocks``), and ``ImportWriter`` with 1-16 helper threads — its fill of the pinned
    buffer (the part beside the step) and the whole write, waited for."""
    cfg = ModelConfig.from_dict(GLM52)
    lines = ["# The decode rank's write of imported KV rows (cuda, GLM-5.2 full depth, FP8 rows)", "",
             f"`PYTHONPATH=. python bench/disagg.py fill --tokens {' '.join(map(str, token_counts))}` — "
             f"{time.strftime('%Y-%m-%d %H:%M')}; best of 3, ms (GB/s); {os.cpu_count()} host cores.", "",
             "| tokens | MB | pageable write | " + " | ".join(f"{t} threads: fill / write" for t in (1, 2, 4, 8, 16))
             + " |", "|---:|---:|---:|" + "---|" * 5]
    for tokens in token_counts:
        blocks = tokens // BLOCK
        src, dst = (KVCache(cfg, blocks * BLOCK, torch.bfloat16, "cuda", fp8=True) for _ in range(2))
        for t in src.tensors():
            t.view(torch.uint8).random_()
        order = random.Random(0).sample(range(blocks), blocks)
        rows = src.read_blocks(order, BLOCK)
        gb = sum(r.nbytes for r in rows) / 1e9
        cells = [f"{v:.1f} ({gb / (v / 1e3):.1f})" for v in [_ms(lambda: dst.write_blocks(order, BLOCK, rows), "cuda")]]
        for threads in (1, 2, 4, 8, 16):
            w = ImportWriter(dst, BLOCK, threads=threads)
            f = _ms(lambda: w.stage([(order, rows)]).wait(), "cuda")
            whole = _ms(lambda: _write_landed(w, [(order, rows)]), "cuda")
            cells.append(f"{f:.1f} ({gb / (f / 1e3):.1f}) / {whole:.1f} ({gb / (whole / 1e3):.1f})")
        assert all((a == b).all() for a, b in zip(dst.read_blocks(order, BLOCK), rows))
        lines.append(f"| {tokens} | {gb * 1e3:.0f} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "disagg_fill_cuda.md").write_text("\n".join(lines) + "\n")


def _over_channel(rows) -> None:
    """The rows through the step channel (``cluster/workers.py``'s ``_send`` / ``_recv``) over a local socket: sent
    on one end, received whole on the other by a thread."""
    import socket
    import threading
    from multiprocessing.connection import Connection

    from cluster.workers import _recv, _send

    a, b = socket.socketpair()
    ends = Connection(a.detach()), Connection(b.detach())
    got = []
    reader = threading.Thread(target=lambda: got.append(_recv(ends[1])))
    reader.start()
    _send(ends[0], rows)
    reader.join()
    for end in ends:
        end.close()
    assert len(got[0]) == len(rows)


def _ray():
    try:
        import ray
    except ImportError:              # (the GPU image has no Ray: that leg is left out)
        return None
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    return ray


def _store_ms(ray, rows) -> float:
    """A bundle of these rows left in a ``KVDepot`` (``stage_bundle``: its copy into the object store as the call's
    argument) and taken back (``fetch_bundle``: the depot's answer, a second copy), as replicas do."""
    from cluster.disagg import KVBundle, fetch_bundle, new_depot, stage_bundle

    depot = new_depot()
    bundle = KVBundle((0,) * (rows[0].shape[0] + 1), (), False, rows)

    async def move():
        return await fetch_bundle(await stage_bundle(depot, bundle))

    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        got = asyncio.run(move())
        best = min(best, time.perf_counter() - t0)
        assert len(got.rows) == len(rows)
        del got
    ray.kill(depot)
    return best * 1e3


# ---- the HTTP A/B ------------------------------------------------------------------------------------------------
WORDS = ("old man sea night bread wine stone river king house field light voice path gate city tree hand word "
         "time fire water land day heart").split()


def _long_prompt(i: int, n_words: int = 1500) -> str:
    rng = random.Random(1000 + i)
    return f"[{i}] " + " ".join(rng.choice(WORDS) for _ in range(n_words))


async def _decoder(client, model: str, i: int, until: float, gaps: list, tokens: list) -> None:
    k = 0
    while time.perf_counter() < until:
        stream = await client.completions.create(model=model, prompt=f"Story {i}.{k}: the old man said",
                                                 max_tokens=96, temperature=0, stream=True,
                                                 extra_body={"ignore_eos": True})
        last = None
        async for c in stream:
            if c.choices and c.choices[0].text:
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
                tokens.append(now)
        k += 1


async def _long(client, model: str, until: float, ttfts: list) -> None:
    i = 0
    while time.perf_counter() < until:
        t0 = time.perf_counter()
        stream = await client.completions.create(model=model, prompt=_long_prompt(i), max_tokens=4, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        first = None
        async for c in stream:
            if first is None and c.choices and c.choices[0].text:
                first = time.perf_counter() - t0
        ttfts.append(first)
        i += 1


async def _workload(url: str, seconds: float) -> dict:
    import openai

    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=600, max_retries=0) as client:
        model = (await client.models.list()).data[0].id
        await client.completions.create(model=model, prompt=_long_prompt(-1), max_tokens=2)      # warm both sides
        gaps, tokens, ttfts = [], [], []
        start = time.perf_counter()
        until = start + seconds
        await asyncio.gather(*[_decoder(client, model, i, until, gaps, tokens) for i in range(6)],
                             _long(client, model, until, ttfts))
        wall = time.perf_counter() - start
    q = statistics.quantiles(gaps, n=100)
    return {"itl_p50": q[49] * 1e3, "itl_p90": q[89] * 1e3, "itl_p99": q[98] * 1e3, "itl_max": max(gaps) * 1e3,
            "decode_tok_s": len(tokens) / wall, "long_n": len(ttfts),
            "long_ttft_p50": statistics.median(ttfts) * 1e3, "long_ttft_max": max(ttfts) * 1e3}


def _runs(workload, rounds: int, pd: dict | None = None, engine: dict | None = None) -> dict[str, list[dict]]:
    """``workload(url)`` against each setup (the same hardware split two ways; ``pd``: a third, disaggregated with
    these prefill settings; ``engine``: engine config fields for every replica), ``rounds`` times, alternating."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    from cluster.config import DEFAULT_MODEL
    from cluster.serve import build_app

    ray.init(address="local", num_cpus=16, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}})
    port = 18971
    serve.start(http_options={"host": "127.0.0.1", "port": port},
                logging_config={"enable_access_log": False, "log_level": "WARNING"})
    base = {"model": DEFAULT_MODEL, "device": "cpu", "max_num_batched_tokens": 512, **(engine or {})}
    setups = {"2 replicas (prefill + decode in each)": {**base, "num_replicas": 2},
              "1 prefill + 1 decode replica": {**base, "prefill": {"num_replicas": 1}}}
    if pd:
        setups[f"1 prefill + 1 decode replica, {json.dumps(pd)}"] = {**base, "prefill": {"num_replicas": 1, **pd}}
    results: dict[str, list[dict]] = {k: [] for k in setups}
    for r in range(rounds):
        for name, args in setups.items():
            serve.run(build_app(args), name="ab", route_prefix="/ab",
                      logging_config={"enable_access_log": False, "log_level": "WARNING"})
            res = asyncio.run(workload(f"http://127.0.0.1:{port}/ab"))
            results[name].append(res)
            print(f"round {r}: {name}: {json.dumps({k: round(v, 1) for k, v in res.items()})}", flush=True)
            serve.delete("ab")
    serve.shutdown()
    ray.shutdown()
    return results


def serve_ab(seconds: float, rounds: int, out: Path) -> None:
    results = _runs(lambda url: _workload(url, seconds), rounds)
    lines = ["# Disaggregated prefill over HTTP (CPU, tiny model)", "",
             f"`PYTHONPATH=. python bench/disagg.py serve --seconds {seconds:g} --rounds {rounds}` — "
             f"{time.strftime('%Y-%m-%d %H:%M')}; 2 cores, each replica's one worker computing on one thread; "
             f"chunks of 512 prompt tokens. 6 streams decode 96 tokens after a short prompt, again and again; one "
             f"client sends 1500-token prompts (4 tokens each) back to back. One row a run, alternating.", "",
             "| setup | decode ITL p50 / p90 / p99 / max (ms) | decode tokens/s | long prompts "
             "| their TTFT p50 / max (ms) |",
             "|---|---|---:|---:|---|"]
    for name, runs in results.items():
        for res in runs:
            lines.append(f"| {name} | {res['itl_p50']:.0f} / {res['itl_p90']:.0f} / {res['itl_p99']:.0f} / "
                         f"{res['itl_max']:.0f} | {res['decode_tok_s']:.0f} | {res['long_n']} | "
                         f"{res['long_ttft_p50']:.0f} / {res['long_ttft_max']:.0f} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "disagg_serve_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


async def _conversation(client, model: str, i: int, turns: int, ttfts: list) -> None:
    """A coding agent's session: a long first prompt, then turns that each repeat the history (prompts and answers)
    and add a short message. ``ttfts[t]``: turn t's times to first token."""
    rng = random.Random(2000 + i)
    history = _long_prompt(100 + i, 1100)
    for t in range(turns):
        t0 = time.perf_counter()
        stream = await client.completions.create(model=model, prompt=history, max_tokens=16, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        first, text = None, ""
        async for c in stream:
            if c.choices and c.choices[0].text:
                first = first or time.perf_counter() - t0
                text += c.choices[0].text
        ttfts[t].append(first)
        history += text + f" [turn {t + 1}] " + " ".join(rng.choice(WORDS) for _ in range(40))


HUB_S = 11.0    # a Coordinator replica's health-check period (10 s), and a second


async def _turns(url: str, conversations: int, turns: int) -> dict:
    import openai

    from tests.integration.test_serve import metric

    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=600, max_retries=0) as client:
        model = (await client.models.list()).data[0].id
        await client.completions.create(model=model, prompt=_long_prompt(-1), max_tokens=2)      # warm both sides
        await asyncio.sleep(HUB_S)      # (the prefill replica's metrics reach /metrics at its health checks)
        moved, computed = metric(url, "glmserve_kv_exported_tokens_total"), _computed(url)
        ttfts: list[list[float]] = [[] for _ in range(turns)]
        start = time.perf_counter()
        await asyncio.gather(*[_conversation(client, model, i, turns, ttfts) for i in range(conversations)])
        wall = time.perf_counter() - start
        await asyncio.sleep(HUB_S)
        moved, computed = metric(url, "glmserve_kv_exported_tokens_total") - moved, \
            tuple(a - b for a, b in zip(_computed(url), computed))
    later = [x for t in ttfts[1:] for x in t]
    return {"turn1_ttft_p50": statistics.median(ttfts[0]) * 1e3, "later_ttft_p50": statistics.median(later) * 1e3,
            "later_ttft_max": max(later) * 1e3, "kv_moved_tokens": moved, "wall_s": wall,
            "prompt_tokens_computed": computed[0], "decode_computed": computed[1]}


def _computed(url: str) -> tuple[float, float]:
    """Prompt tokens computed so far on every replica, and on the decode replicas alone (those that import KV; 0 with
    none): the tokens looked up in a prefix cache and not found there (a prompt computed by a prefill replica and again
    by its decode replica counts twice)."""
    from tests.integration.test_serve import metric_series

    queried, hits = (metric_series(url, f"glmserve_prefix_cache_{k}_tokens_total") for k in ("queried", "hit"))
    exports = metric_series(url, "glmserve_kv_exported_tokens_total")
    computed = {r: q - hits.get(r, 0.0) for r, q in queried.items()}
    prefill = {r for r, n in exports.items() if n > 0}
    return sum(computed.values()), sum(v for r, v in computed.items() if prefill and r not in prefill)


def turns_ab(conversations: int, turns: int, rounds: int, out: Path, engine: dict, tag: str = "") -> None:
    results = _runs(lambda url: _turns(url, conversations, turns), rounds, {"min_prompt_tokens": 256}, engine)
    lines = ["# Multi-turn conversations, disaggregated prefill over HTTP (CPU, tiny model)", "",
             f"`PYTHONPATH=. python bench/disagg.py turns --conversations {conversations} --turns {turns} --rounds "
             f"{rounds}{''.join(f' --{k.replace(chr(95), chr(45))} {v}' for k, v in engine.items())}` — "
             f"{time.strftime('%Y-%m-%d %H:%M')}; 2 cores{f', every replica {json.dumps(engine)}' if engine else ''}. "
             f"{conversations} conversations at once, each a "
             f"first prompt of ~1100 tokens, then {turns - 1} turns that repeat the history and add ~45 tokens "
             "(16-token answers). KV moved: prompt tokens whose KV the prefill replica sent. Computed: prompt tokens "
             "computed on any replica (looked up in its prefix cache, not found; a prompt that a prefill replica "
             "computes and its decode replica computes again counts twice), and of them on the decode replica.", "",
             "| setup | turn 1 TTFT p50 (ms) | later turns' TTFT p50 / max (ms) | KV moved (tokens) | computed (tokens) "
             "| of them on the decode replica | wall (s) |", "|---|---:|---|---:|---:|---:|---:|"]
    for name, runs in results.items():
        for res in runs:
            decode = f"{res['decode_computed']:.0f}" if res["kv_moved_tokens"] else "—"
            lines.append(f"| {name} | {res['turn1_ttft_p50']:.0f} | {res['later_ttft_p50']:.0f} / "
                         f"{res['later_ttft_max']:.0f} | {res['kv_moved_tokens']:.0f} | "
                         f"{res['prompt_tokens_computed']:.0f} | {decode} | {res['wall_s']:.1f} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"disagg_turns_cpu{'_kv' if engine else ''}{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# ---- a decode engine taking a bundle -----------------------------------------------------------------------------
def _decode_steps(engine, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def stall(device: str, slice_: bool, token_counts: list[int], streams: int, fp8: bool, out: Path,
          pageable: bool = False, unpaced: bool = False, reserve: bool = True, profile: bool = False) -> None:
    import numpy as np

    from bench.prefix_cache import model_path
    from cluster.config import EngineConfig
    from cluster.disagg import IMPORT_STEP_BYTES, KVBundle, _itemsize
    from cluster.local import build_local_engine
    from scheduler.request import SamplingParams

    top, answer = max(token_counts), 1024
    with tempfile.TemporaryDirectory() as tmp:
        model, fmt = model_path(slice_, tmp)
        cfg = EngineConfig(model=model, load_format=fmt, device=device, max_num_seqs=streams + 1,
                           kv_cache_tokens=2 * top + streams * (answer + 512), max_model_len=top + answer,
                           kv_cache_dtype="fp8" if fp8 else "auto", warmup_tokens=answer + 512)
        print("building the engine ...", flush=True)
        engine, _ = build_local_engine(cfg, progress=False)
    if pageable:
        runner = engine.executor.runner
        runner.imports = ImportWriter(runner.cache, runner.block_size, staged=False)
    if reserve:                                     # as a decode replica of a disaggregated app starts
        engine.executor.runner.imports.reserve()
    taken = [0]                                     # bytes written by the step under way (every rank's)

    def counted(take):
        def take_counted(*args):
            took = take(*args)
            taken[0] += sum(r.nbytes for _, rows in took.writes for r in rows)
            return took
        return take_counted

    for imports in engine._imports:
        imports.take, imports.paced = counted(imports.take), not unpaced
    vocab, bs, rng = engine.schedulers[0].config.vocab_size, engine.config.block_size, random.Random(0)
    per_token = sum(w * _itemsize(d) for w, d in engine.kv_layout)
    what = "the GLM-5.2-width slice (4 layers, FP8 random weights)" if slice_ else "the tiny model"
    lines = [f"# Disaggregated prefill: a decode engine taking a bundle ({device}, {what})", "",
             f"`PYTHONPATH=. python bench/disagg.py stall --device {device}{' --slice' if slice_ else ''}"
             f"{' --fp8' if fp8 else ''}{' --pageable' if pageable else ''}{' --unpaced' if unpaced else ''}"
             f"{'' if reserve else ' --no-reserve'} --streams {streams} --tokens "
             f"{' '.join(map(str, token_counts))}` — "
             f"{time.strftime('%Y-%m-%d %H:%M')}. {streams} streams decode (256-token prompts) while a request "
             f"arrives with its prompt's KV ({'FP8' if fp8 else 'bf16'} rows, {per_token} bytes a token on this "
             f"model); the engine writes it over its next steps, at most {IMPORT_STEP_BYTES >> 20} MB a step"
             f"{' (unpaced: session 53)' if unpaced else ', paced beside the streams (IMPORT_PACE)'}. "
             "Step times are the engine's whole step (plan, worker, outputs), medians, ms.", "",
             "Steps writing: those that carried a part of it (the worker writes it after the step's work: "
             f"{'pageable, waited for: the copy before session 53' if pageable else 'through pinned memory'}"
             "); the step after the last computes the request's tail "
             "(the prompt's last block and token) and samples its first token. A stall a step: the median writing "
             "step less the plain one. A first round at the first size warms the shapes up (not shown).", "",
             "| bundle tokens | MB | steps writing | MB a step | step: plain / writing / the first token's "
             "| stall a step "
             "| request's TTFT |", "|---:|---:|---:|---:|---|---:|---:|"]
    for n, tokens in enumerate([token_counts[0], *token_counts]):       # the first round warms the shapes up
        tokens = tokens // bs * bs
        for i in range(streams):
            prompt = [rng.randrange(40, vocab) for _ in range(256)]
            engine.add_request(prompt, SamplingParams(max_tokens=answer, ignore_eos=True), f"s{n}.{i}")
        _decode_steps(engine, 8)
        plain = _decode_steps(engine, 40)
        prompt = [rng.randrange(40, vocab) for _ in range(tokens + 8)]
        bundle = KVBundle(tuple(prompt[:tokens + 1]), engine.kv_layout, False,        # (touched pages, as received)
                          tuple(np.full((tokens, w * _itemsize(d)), 1, np.uint8) for w, d in engine.kv_layout))
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA]) \
            if profile and n == len(token_counts) else None        # (the last round)
        if prof:
            prof.__enter__()
        t0 = time.perf_counter()
        engine.add_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True), f"kv{n}", kv=bundle)
        steps, first = [], None
        while first is None:
            s0, taken[0] = time.perf_counter(), 0
            events = engine.step()
            steps.append(((time.perf_counter() - s0) * 1e3, taken[0]))
            if any(e.req_id == f"kv{n}" and e.token_ids for e in events):
                first = (time.perf_counter() - t0) * 1e3
        if prof:
            prof.__exit__(None, None, None)
            out.mkdir(parents=True, exist_ok=True)
            (out / "stall_profile.txt").write_text(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30))
            prof.export_chrome_trace(str(out / "stall_trace.json"))
        writing = [t for t, b in steps if b]
        mb = sum(b for _, b in steps) / 1e6
        base = statistics.median(plain)
        busy = f"{statistics.median(writing):.1f}" if writing else "— (nothing written: the pool had no room)"
        cost = f"{statistics.median(writing) - base:.1f}" if writing else "—"
        row = (f"| {tokens} | {mb:.0f} | {len(writing)} | {mb / max(len(writing), 1):.0f} | {base:.1f} / "
               f"{busy} / {steps[-1][0]:.1f} | {cost} | {first:.0f} |")
        if n:
            lines.append(row)
        print(row if n else f"(warm-up) {row}", "writing steps (ms):", " ".join(f"{t:.1f}" for t in writing),
              flush=True)
        for i in range(streams):
            engine.abort(f"s{n}.{i}")
        while engine.has_work():
            engine.step()
    out.mkdir(parents=True, exist_ok=True)
    name = "_".join(["disagg_stall", device, *(["slice"] if slice_ else []), *(["fp8"] if fp8 else []),
                     *(["pageable"] if pageable else []), *(["unpaced"] if unpaced else [])]) + ".md"
    (out / name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("transfer")
    t.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    t.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192])
    t.add_argument("--out", type=Path, default=Path("bench/results/session49"))
    s = sub.add_parser("serve")
    s.add_argument("--seconds", type=float, default=40.0)
    s.add_argument("--rounds", type=int, default=2)
    s.add_argument("--out", type=Path, default=Path("bench/results/session49"))
    m = sub.add_parser("turns")
    m.add_argument("--conversations", type=int, default=4)
    m.add_argument("--turns", type=int, default=6)
    m.add_argument("--rounds", type=int, default=2)
    m.add_argument("--out", type=Path, default=Path("bench/results/session50"))
    m.add_argument("--kv-cache-tokens", type=int, default=None, help="each replica's KV pool (a small one evicts)")
    m.add_argument("--host-kv-cache-tokens", type=int, default=None, help="each replica's host tier")
    m.add_argument("--tag", default="", help="appended to the results file's name")
    fi = sub.add_parser("fill")
    fi.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    fi.add_argument("--out", type=Path, default=Path("bench/results/session53"))
    st = sub.add_parser("stall")
    st.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    st.add_argument("--slice", action="store_true", help="the GLM-5.2-width slice, random FP8 weights (a GPU)")
    st.add_argument("--tokens", type=int, nargs="+", default=[4096, 32768])
    st.add_argument("--streams", type=int, default=4)
    st.add_argument("--fp8", action="store_true", help="FP8 KV rows (kv_cache_dtype: fp8)")
    st.add_argument("--pageable", action="store_true",
                    help="write the rows as before session 53: a pageable copy, waited for (the A/B's other side)")
    st.add_argument("--unpaced", action="store_true", help="64 MB a step beside the streams too (session 53)")
    st.add_argument("--no-reserve", action="store_true", help="pin the import buffers at the first import")
    st.add_argument("--profile", action="store_true", help="the last round under torch.profiler: a table, a trace")
    st.add_argument("--out", type=Path, default=Path("bench/results/session54"))
    a = ap.parse_args()
    if a.what == "fill":
        fill(a.tokens, a.out)
    elif a.what == "stall":
        stall(a.device, a.slice, a.tokens, a.streams, a.fp8, a.out, a.pageable, a.unpaced, not a.no_reserve,
              a.profile)
    elif a.what == "transfer":
        transfer(a.device, a.tokens, a.out)
    elif a.what == "turns":
        engine = {k: v for k in ("kv_cache_tokens", "host_kv_cache_tokens") if (v := getattr(a, k)) is not None}
        turns_ab(a.conversations, a.turns, a.rounds, a.out, engine, a.tag)
    else:
        serve_ab(a.seconds, a.rounds, a.out)


if __name__ == "__main__":
    main()
