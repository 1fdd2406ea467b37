"""``glmserve``: serve, generate, run-batch, make-checkpoint.

    glmserve serve                       # the embedded default model on this machine, OpenAI API on :8000
    glmserve generate "Once upon a time" # stream a completion to the terminal (--json-schema: structured output)
    glmserve run-batch -i requests.jsonl -o results.jsonl  # an OpenAI Batch API file, offline (--base-url: a server's)
    glmserve make-checkpoint OUT --config models/configs/glm5-tiny-random.json [--fp8] [--shards 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from cluster.config import DEFAULT_MODEL


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint folder (default: the embedded tiny model)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name the API serves and expects in requests (default: the checkpoint folder's name)")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja file whose template replaces the model's chat template (default: the model folder's "
                        "chat_template.jinja, else tokenizer_config.json's)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="auto: CUDA where the workers see a GPU, else CPU (default: auto)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="activations and unquantized weights (default: auto, float32 on CPU, bfloat16 on GPU)")
    p.add_argument("--kernels", default="auto", choices=["auto", "reference"],
                   help="auto: the Triton / Gluon kernels on a GPU; reference: the PyTorch ops (default: auto)")
    p.add_argument("--prefill-activations", default="bf16", choices=["bf16", "fp8"],
                   help="fp8: prefill chunks quantize activations per 128 columns and run FP8 GEMMs (GPU; faster "
                        "time to first token, ~2.6 %% relative error per linear, ~4.4 %% per MoE, against bf16 "
                        "activations; default: bf16)")
    p.add_argument("--kv-cache-tokens", type=int, default=32768, help="KV slots per worker (default: 32768)")
    p.add_argument("--block-size", type=int, default=16, help="tokens a KV block holds (default: 16)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.0,
                   help="size the KV cache to memory instead of --kv-cache-tokens: weights, comm buffers and KV take "
                        "this fraction of each worker's device (e.g. 0.9; on CPU, of the host's memory; default: 0, "
                        "off)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
                   help="fp8: the cache's rows packed in FP8 as FlashMLA and DeepSeek-V3.2 pack them (e4m3 with a "
                        "scale a 128 values; MLA's rope key in dtype): ~1.75x the tokens in the same memory (default: "
                        "auto, the model's dtype)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="prompt + max_tokens limit (default: min(max_position_embeddings, the KV slots in whole "
                        "blocks))")
    p.add_argument("--max-num-seqs", type=int, default=64,
                   help="requests running at once, over all worker ranks (default: 64)")
    p.add_argument("--max-num-batched-tokens", type=int, default=512,
                   help="tokens one rank's step takes at most: prompt chunks and decode rows (default: 512)")
    p.add_argument("--max-waiting", type=int, default=256,
                   help="requests that may wait for a slot; beyond it the server answers 429 (default: 256)")
    p.add_argument("--max-waiting-tokens", type=int, default=0,
                   help="a queue with this many prompt tokens still to compute answers new requests 429 (0 or at "
                        "least max_model_len; default: 0, no bound)")
    p.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false",
                   help="compute every prompt whole (default: reuse the KV of an earlier request's same leading "
                        "tokens)")
    p.add_argument("--host-kv-cache-tokens", type=int, default=0,
                   help="host-memory KV slots per worker that keep cached prefixes evicted from the device, copied "
                        "back when a prompt reuses them (default: 0, none)")
    p.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
                   help="priority: requests go by their 'priority' field (lower first, then arrival; one that outranks "
                        "running requests takes the worst one's place, which is recomputed later); default: fcfs")
    p.add_argument("--num-workers", type=int, default=1, choices=[1, 2, 4, 8],
                   help="worker ranks of the replica, a GPU each on CUDA (default: 1)")
    p.add_argument("--moe", default="tp", choices=["tp", "ep"],
                   help="the experts split by width (tp) or by expert (ep) over the ranks (default: tp)")
    p.add_argument("--comm", default="torch", choices=["torch", "ipc"],
                   help="the ranks' collectives: torch.distributed (NCCL / gloo) or shared-memory ipc (default: torch)")
    p.add_argument("--speculative-tokens", type=int, default=0,
                   help="MTP drafts a round, 0 to 7; needs the checkpoint's MTP layer (default: 0, off)")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy: random weights from config.json alone (benchmarks; outputs are meaningless; default: "
                        "auto, the checkpoint's)")
    p.add_argument("--step-timeout", type=float, default=60.0,
                   help="seconds a step may take before its requests fail and the worker group is rebuilt (default: "
                        "60)")
    p.add_argument("--cuda-graphs", default="auto", choices=["auto", "off", "eager"],
                   help="auto: decode / verify steps replay CUDA graphs; eager: the same static steps run eagerly (to "
                        "debug a suspected capture problem); off (default: auto)")
    p.add_argument("--no-piece-graphs", dest="piece_graphs", action="store_false",
                   help="run the steps no decode graph holds eagerly (default: per-layer graphs)")
    p.add_argument("--no-lm-head-split", dest="lm_head_split", action="store_false",
                   help="each rank of a group reads the whole lm_head (default: split by vocabulary)")
    p.add_argument("--step-channel", default="socket", choices=["socket", "ray"],
                   help="how serve's worker group gets its steps: a TCP connection per actor, or Ray actor calls "
                        "(default: socket)")
    p.add_argument("--warmup-tokens", type=int, default=None,
                   help="at start-up, capture the decode graphs of contexts up to this many tokens and serve short "
                        "requests (default: every context, max_model_len, with CUDA graphs, else 0; 0: compile and "
                        "capture on first use)")
    p.add_argument("--reasoning-parser", default="none", choices=["none", "glm"],
                   help="glm: chat text before </think> is returned as reasoning_content (default: none)")
    p.add_argument("--tool-parser", default="none", choices=["none", "glm"],
                   help="glm: <tool_call> output of chat requests with tools becomes OpenAI tool_calls (default: none)")
    p.add_argument("--generation-config", default="auto", choices=["auto", "none"],
                   help="auto: a request's unset temperature, top_p, top_k, min_p, repetition_penalty and max_tokens "
                        "take the model's generation_config.json values, as vLLM's server does; none: the API's "
                        "neutral defaults (default: auto)")


def _engine_config(a: argparse.Namespace):
    from cluster.config import EngineConfig

    template = str(Path(a.chat_template).resolve()) if a.chat_template else None   # the replicas' cwd may differ
    return EngineConfig(model=a.model, served_model_name=a.served_model_name, chat_template=template,
                        device=a.device, dtype=a.dtype,
                        kernels=a.kernels, prefill_activations=a.prefill_activations, kv_cache_tokens=a.kv_cache_tokens,
                        block_size=a.block_size, step_timeout_s=a.step_timeout, cuda_graphs=a.cuda_graphs,
                        piece_graphs=a.piece_graphs, lm_head_split=a.lm_head_split,
                        gpu_memory_utilization=a.gpu_memory_utilization,
                        kv_cache_dtype=a.kv_cache_dtype, max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs,
                        max_num_batched_tokens=a.max_num_batched_tokens, max_waiting=a.max_waiting,
                        max_waiting_tokens=a.max_waiting_tokens,
                        prefix_caching=a.prefix_caching, host_kv_cache_tokens=a.host_kv_cache_tokens,
                        scheduling_policy=a.scheduling_policy,
                        num_workers=a.num_workers, moe=a.moe, comm=a.comm, speculative_tokens=a.speculative_tokens,
                        load_format=a.load_format, step_channel=a.step_channel, warmup_tokens=a.warmup_tokens,
                        reasoning_parser=a.reasoning_parser, tool_parser=a.tool_parser,
                        generation_config=a.generation_config)


def cmd_generate(a: argparse.Namespace) -> int:
    from cluster.local import build_local_engine
    from scheduler.request import SamplingParams
    from scheduler.scheduler import AdmissionError

    if a.num_workers != 1:
        print("glmserve: error: generate runs the model in this process (--num-workers 1); worker groups serve with "
              "`glmserve serve --num-workers N`", file=sys.stderr)
        return 2
    engine, tok = build_local_engine(_engine_config(a))
    if tok is None:
        print(f"{a.model} has no tokenizer.json; generate needs text in and out", file=sys.stderr)
        return 2
    if a.chat:
        ids = tok.encode_chat([{"role": "user", "content": a.prompt}], add_generation_prompt=True)
    else:
        ids = tok.encode(a.prompt)
    params = SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, seed=a.seed,
                            json_schema=a.json_schema)
    try:
        rid = engine.add_request(ids, params)
    except AdmissionError as e:
        print(f"refused: {e}", file=sys.stderr)
        return 2
    t0, first, n = time.perf_counter(), None, 0
    if not a.chat:
        print(a.prompt, end="", flush=True)
    done = False
    while not done:
        for ev in engine.step():
            if ev.req_id != rid:
                continue
            first = first or time.perf_counter()
            n += len(ev.token_ids)
            print(ev.text, end="", flush=True)
            done = ev.finished
    dt = time.perf_counter() - t0
    print(f"\n[{n} tokens, first after {first - t0:.2f} s, {n / dt:.1f} tok/s]", file=sys.stderr)
    return 0


def cmd_make_checkpoint(a: argparse.Namespace) -> int:
    from models.checkpoint import write_checkpoint
    from models.config import ModelConfig

    cfg = ModelConfig.from_json(a.config)
    out = write_checkpoint(a.out, cfg, seed=a.seed, dtype=a.dtype, fp8=a.fp8, num_shards=a.shards)
    print(f"wrote {out} ({'fp8' if a.fp8 else a.dtype}, {a.shards} shard(s))")
    return 0


def cmd_serve(a: argparse.Namespace) -> int:
    from cluster.server import run_server
    from models.config import ModelConfig

    if a.prefill_replicas < 0:
        print("glmserve: error: --prefill-replicas must be >= 0", file=sys.stderr)
        return 2
    from cluster.local import load_tokenizer, sampling_defaults

    cfg = _engine_config(a)
    cfg.check_model(ModelConfig.from_json(cfg.model))     # before Ray starts: an error in seconds, not minutes
    if cfg.generation_config == "auto":
        sampling_defaults(cfg.model)
    tokenizer = load_tokenizer(cfg.model, cfg.chat_template)
    if tokenizer is not None and tokenizer.chat_template is None:
        print("glmserve: warning: the model has no chat template (no chat_template.jinja, none in "
              "tokenizer_config.json): chat, Messages and Responses requests will be refused; --chat-template FILE "
              "gives one", file=sys.stderr)
    return run_server(cfg, host=a.host, port=a.port, drain_timeout_s=a.drain_timeout,
                      stats_interval_s=a.stats_interval, prefill_replicas=a.prefill_replicas)


def cmd_run_batch(a: argparse.Namespace) -> int:
    from cluster.batch import run_batch_file

    if not Path(a.input).is_file():
        raise FileNotFoundError(f"no input file {a.input}")
    if not Path(a.output).resolve().parent.is_dir():         # before a server is started for the run
        raise FileNotFoundError(f"the output's directory {Path(a.output).parent} does not exist")
    if a.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {a.max_concurrency}")
    if a.base_url:
        return run_batch_file(a.input, a.output, a.base_url, a.max_concurrency)
    import socket

    from cluster.server import start_server, stop_server

    with socket.socket() as s:              # a free port for this run's server
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if (code := start_server(_engine_config(a), "127.0.0.1", port)) != 0:
        return code
    try:
        return run_batch_file(a.input, a.output, f"http://127.0.0.1:{port}", a.max_concurrency)
    finally:
        stop_server()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="glmserve", description="Serve and run GLM-5 family models.")
    sub = p.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="stream a completion to the terminal")
    _add_engine_args(g)
    g.add_argument("prompt")
    g.add_argument("--max-tokens", type=int, default=64, help="(default: 64)")
    g.add_argument("--temperature", type=float, default=0.0, help="(default: 0, greedy)")
    g.add_argument("--top-p", type=float, default=1.0, help="(default: 1)")
    g.add_argument("--seed", type=int, default=None, help="(default: none)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--json-schema", default=None, metavar="SCHEMA",
                   help="hold the output to this JSON schema (its JSON text; '{\"type\": \"object\"}': any object)")
    g.set_defaults(fn=cmd_generate)

    s = sub.add_parser("serve", help="OpenAI-compatible server (Ray Serve)")
    _add_engine_args(s)
    s.add_argument("--host", default="127.0.0.1", help="the API's address (default: 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="the API's port (default: 8000)")
    s.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on Ctrl-C / SIGTERM, seconds to let requests in flight finish (new ones get 503) before "
                        "shutting down (default: 30)")
    s.add_argument("--stats-interval", type=float, default=10.0,
                   help="seconds between stats lines (tokens/s, requests, KV use) while requests come; 0: none "
                        "(default: 10)")
    s.add_argument("--prefill-replicas", type=int, default=0,
                   help="disaggregated prefill: replicas of the same engine that compute the prompts and hand their KV "
                        "to the serving replica, which only decodes (default: 0, off)")
    s.set_defaults(fn=cmd_serve)

    b = sub.add_parser("run-batch", help="answer an OpenAI Batch API file (JSONL requests) offline")
    _add_engine_args(b)
    b.add_argument("-i", "--input", required=True,
                   help="JSONL, a request a line: {\"custom_id\", \"method\": \"POST\", "
                        "\"url\": \"/v1/chat/completions\", \"body\"}")
    b.add_argument("-o", "--output", required=True, help="JSONL, a result a line, in the input's order")
    b.add_argument("--base-url", default=None,
                   help="a running server (http://host:port) to send them to (default: start one here with the engine "
                        "options, and stop it after)")
    b.add_argument("--max-concurrency", type=int, default=64, help="requests in flight at once (default: 64)")
    b.set_defaults(fn=cmd_run_batch)

    m = sub.add_parser("make-checkpoint", help="write a random checkpoint in Hugging Face layout")
    m.add_argument("out", type=Path)
    m.add_argument("--config", required=True, type=Path, help="a config.json (e.g. models/configs/*.json)")
    m.add_argument("--seed", type=int, default=0, help="(default: 0)")
    m.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"],
                   help="(default: bfloat16)")
    m.add_argument("--fp8", action="store_true", help="FP8 e4m3 weights with 128x128 block scales")
    m.add_argument("--shards", type=int, default=1, help="safetensors files (default: 1)")
    m.set_defaults(fn=cmd_make_checkpoint)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except (ValueError, FileNotFoundError) as e:
        print(f"glmserve: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:           # Ctrl-C in generate (serve handles its own signals): no traceback
        print("\nglmserve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
