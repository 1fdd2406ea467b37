"""Small pieces of the worker group: ranks placed on GPUs, the step channel, each rank's step timing in its result,
the engine config's field checks."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import types
from multiprocessing import connection as mp_connection
from pathlib import Path

import pytest
import torch

from cluster.config import EngineConfig
from cluster.disagg import prefill_plan
from cluster.engine import Engine, GroupFailure, LocalExecutor
from cluster.local import scheduler_config
from cluster.workers import (
    _accept,
    _connect,
    _ConnGroup,
    _driver,
    _listen,
    _place_on_gpus,
    _recv,
    _send,
    _serve,
    worker_specs,
)
from models.loader import dummy_model
from scheduler.request import SamplingParams
from tests.conftest import run_engine
from workers.runner import ModelRunner


def test_process_group_puts_rank_r_on_gpu_r_mod_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    specs = worker_specs(EngineConfig(device="cuda", num_workers=4), num_blocks=8)
    assert [s.device for s in _place_on_gpus(specs)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    cpu = worker_specs(EngineConfig(device="cpu", num_workers=2), num_blocks=8)
    assert [s.device for s in _place_on_gpus(cpu)] == ["cpu", "cpu"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(GroupFailure, match="no CUDA GPU"):
        _place_on_gpus(specs)


class _EchoWorker:
    def __init__(self):
        self.closed = False

    def execute(self, step):
        if step == "boom":
            raise ValueError("bad step")
        return step * 2

    def close(self):
        self.closed = True


def _loopback(host: str) -> socket.socket:
    try:
        return _listen(host)
    except OSError as e:
        pytest.skip(f"no {host} loopback here: {e}")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_step_channel_serves_only_the_token_holder_and_reports_errors(host):
    token, worker = b"t" * 32, _EchoWorker()
    server = _loopback(host)
    address = server.getsockname()[:2]

    def rank_side():
        with server:
            conn = _accept(server, token)
        _serve(worker, conn)

    t = threading.Thread(target=rank_side, daemon=True)
    t.start()
    intruder = socket.create_connection(address, timeout=5)
    intruder.sendall(b"x" * 32)                                  # a wrong token: closed, nothing unpickled
    assert intruder.recv(1) == b""
    group = _ConnGroup()
    group.conns = [_driver(_connect(address, token, 5.0))]
    group._send_all([21], "step", 5.0)
    assert group._collect(5.0, "step") == [42]
    group._send_all(["boom"], "step", 5.0)
    with pytest.raises(GroupFailure, match="step: rank 0 failed: ValueError: bad step"):
        group._collect(5.0, "step")
    group._close_conns()                                         # None: the rank closes its worker, the loop ends
    t.join(5)
    assert worker.closed and not t.is_alive() and group.conns == []


def test_a_closed_step_channel_fails_the_step_fast():
    server = _loopback("127.0.0.1")
    group = _ConnGroup()
    accepted = []
    threading.Thread(target=lambda: accepted.append(_accept(server, b"k" * 32)), daemon=True).start()
    group.conns = [_connect(server.getsockname(), b"k" * 32, 5.0)]
    while not accepted:
        threading.Event().wait(0.01)
    accepted[0].close()                                          # the rank's process is gone
    with pytest.raises(GroupFailure, match="rank 0 died"):
        group._collect(30.0, "step")
    server.close()


def test_a_rank_that_stops_mid_message_fails_the_step_at_its_deadline():
    """Sending a step a rank does not read, and an answer that stops arriving halfway, fail at the deadline naming
    the rank — they blocked forever before (session 56's fault review); whole messages still pass, buffers and all."""
    import numpy as np

    a, b = socket.socketpair()
    group, rank = _ConnGroup(), mp_connection.Connection(b.detach())
    group.conns = [_driver(mp_connection.Connection(a.detach()))]
    payload = np.arange(1 << 22, dtype=np.int32)                 # 16 MB: more than the socket buffers hold
    with pytest.raises(GroupFailure, match=r"step: rank 0 did not take its message within 1 s"):
        group._send_all([payload], "step", 1.0)                   # the rank reads nothing
    whole = []
    writer = threading.Thread(target=lambda: _send(rank, ("ok", payload)), daemon=True)
    reader = threading.Thread(target=lambda: whole.append(_recv(group.conns[0], time.monotonic() + 10)), daemon=True)
    for t in (reader, writer):
        t.start()
    reader.join(20)
    assert whole[0][0] == "ok" and np.array_equal(whole[0][1], payload)
    pipe_r, pipe_w = os.pipe()                                    # the bytes of a whole answer, then half of them sent
    message = []
    threading.Thread(target=lambda: message.append(b"".join(iter(lambda: os.read(pipe_r, 1 << 20), b""))),
                     daemon=True).start()
    with os.fdopen(pipe_w, "wb", buffering=0) as w:
        _send(types.SimpleNamespace(fileno=w.fileno), ("ok", payload))
    while not message:
        time.sleep(0.01)
    half = memoryview(message[0])[:len(message[0]) // 2]
    threading.Thread(target=_sendall, args=(rank.fileno(), half), daemon=True).start()
    started = time.monotonic()
    with pytest.raises(GroupFailure, match=r"step: rank 0's answer did not arrive whole within 2 s"):
        group._collect(2.0, "step")
    assert time.monotonic() - started < 5


def _sendall(fd: int, view: memoryview) -> None:
    while view.nbytes:
        view = view[os.write(fd, view):]


@pytest.mark.parametrize("field,value", [("step_channel", "zmq"), ("comm", "mpi"), ("num_workers", 3),
                                         ("prefill_activations", "int8"), ("prefill_activations", "fp8"),
                                         ("warmup_tokens", -1), ("warmup_tokens", 1.5),
                                         ("max_model_len", 32769),          # past the KV slots (32768): refused
                                         ("lm_head_split", "yes"), ("max_waiting_tokens", -1),
                                         ("host_kv_cache_tokens", -16), ("kv_cache_dtype", "fp8_e5m2"),
                                         # types as a YAML file gives them: a quoted number, null, a float, a boolean
                                         ("kv_cache_tokens", "16384"), ("max_waiting", None), ("step_timeout_s", "60"),
                                         ("speculative_tokens", 2.5), ("num_workers", 8.0), ("max_num_seqs", True),
                                         ("model", 5)])
def test_bad_engine_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"field '{field}'"):
        EngineConfig(**{field: value}, **({"kernels": "reference"} if value == "fp8" else {}))
    with pytest.raises(ValueError, match="unknown engine config field"):
        EngineConfig.from_dict({"step_chanel": "ray"})


@pytest.mark.parametrize("change,rule", [({"max_num_batched_tokens": 32}, "at least max_num_seqs (64)"),
                                         ({"kv_cache_tokens": 8}, "at least block_size (16)"),
                                         ({"speculative_tokens": 9}, "0 to 7"),
                                         ({"device": "tpu"}, "one of 'auto', 'cpu', 'cuda'")])
def test_a_bad_value_is_told_the_rule_it_breaks(change, rule):
    """A value valid on its own but not beside another field's says which rule (session 56's operator review)."""
    with pytest.raises(ValueError, match=re.escape(f"has an invalid value {next(iter(change.values()))!r}: it ") +
                       r"(must be|takes) " + re.escape(rule)):
        EngineConfig(**change)


def test_a_host_tier_needs_prefix_caching():
    with pytest.raises(ValueError, match="field 'host_kv_cache_tokens'.*0 without prefix_caching"):
        EngineConfig(prefix_caching=False, host_kv_cache_tokens=4096)
    assert EngineConfig(host_kv_cache_tokens=4100).host_blocks == 256
    from cluster.workers import worker_specs

    cfg = EngineConfig(device="cpu", num_workers=2, host_kv_cache_tokens=4096)
    assert [s.host_blocks for s in worker_specs(cfg, cfg.num_blocks)] == [256, 256]     # every rank's own tier
    cfg = EngineConfig(device="cpu", num_workers=2, kv_cache_dtype="fp8")
    assert [s.kv_fp8 for s in worker_specs(cfg, cfg.num_blocks)] == [True, True]


def test_serve_flags_reach_the_engine_config():
    import argparse

    from cluster.cli import _add_engine_args, _engine_config

    p = argparse.ArgumentParser()
    _add_engine_args(p)
    assert _engine_config(p.parse_args([])).step_channel == "socket"
    assert _engine_config(p.parse_args(["--step-channel", "ray", "--num-workers", "2"])).step_channel == "ray"
    assert _engine_config(p.parse_args([])).prefill_activations == "bf16"
    assert _engine_config(p.parse_args(["--prefill-activations", "fp8"])).prefill_activations == "fp8"
    assert _engine_config(p.parse_args(["--warmup-tokens", "0"])).warmup_tokens == 0
    cfg = _engine_config(p.parse_args(["--tool-parser", "glm", "--reasoning-parser", "glm", "--served-model-name",
                                       "tiny-x", "--max-model-len", "512", "--max-waiting", "8",
                                       "--max-waiting-tokens", "65536", "--host-kv-cache-tokens", "8192",
                                       "--kv-cache-dtype", "fp8", "--scheduling-policy", "priority"]))
    assert (cfg.tool_parser, cfg.reasoning_parser, cfg.served_model_name, cfg.max_model_len, cfg.max_waiting,
            cfg.max_waiting_tokens, cfg.host_kv_cache_tokens, cfg.kv_cache_dtype, cfg.scheduling_policy) == (
        "glm", "glm", "tiny-x", 512, 8, 65536, 8192, "fp8", "priority")
    assert _engine_config(p.parse_args([])) == EngineConfig()     # every flag's default is the config's


def test_deploy_files_are_engine_configs_and_kuberay_inlines_the_gpu_one():
    """Every app's args in deploy/ build an ``EngineConfig``, and a prefill section its engine (a misspelt or invalid
    field would fail the deployment only on the cluster), and the KubeRay file's inlined Serve config is
    deploy/glm5-8xh200.yaml's."""
    import yaml

    deploy = Path(__file__).resolve().parents[2] / "deploy"
    gpu = yaml.safe_load((deploy / "glm5-8xh200.yaml").read_text())
    kuberay = yaml.safe_load(yaml.safe_load((deploy / "kuberay-rayservice.yaml").read_text())["spec"]["serveConfigV2"])
    tiny = yaml.safe_load((deploy / "tiny.yaml").read_text())
    pd = yaml.safe_load((deploy / "glm5-pd-8xh200.yaml").read_text())
    for conf in (gpu, kuberay, tiny, pd):
        for app in conf["applications"]:
            args = {k: v for k, v in app["args"].items() if k not in ("num_replicas", "autoscaling_config", "prefill")}
            cfg = EngineConfig.from_dict(args)
            if "prefill" in app["args"]:         # disaggregated prefill: the prefill replicas' engine checks too
                assert prefill_plan(cfg.to_dict(), app["args"]["prefill"]).engine["model"] == cfg.model
    assert {d["name"] for d in pd["applications"][0]["deployments"]} == {"Coordinator", "PrefillCoordinator",
                                                                          "OpenAIIngress"}
    assert kuberay["applications"] == gpu["applications"]
    head = yaml.safe_load((deploy / "kuberay-rayservice.yaml").read_text())["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"     # replicas go to the GPU pods (session 56's operator review)
    cluster = yaml.safe_load((deploy / "kuberay-rayservice.yaml").read_text())["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True   # Serve's autoscaling needs nodes the autoscaler adds (59)
    cfg = EngineConfig.from_dict(gpu["applications"][0]["args"])
    assert cfg.num_blocks == 0 and cfg.resolved_warmup_tokens(202752) == 202752   # pool sized at start; all contexts


def test_systemd_unit_serves_the_gpu_files_engine_and_drains():
    """deploy/glmserve.service: its ExecStart parses as `glmserve serve` flags into the 8×H200 file's engine, and a
    stop signals glmserve alone (KillMode=mixed, so Ray's processes outlive the drain) with time for the drain."""
    import shlex

    import yaml

    from cluster.cli import _engine_config, parser

    deploy = Path(__file__).resolve().parents[2] / "deploy"
    unit = dict(line.split("=", 1) for line in (deploy / "glmserve.service").read_text().replace("\\\n", " ")
                .splitlines() if "=" in line and not line.startswith("#"))
    argv = shlex.split(unit["ExecStart"])
    assert argv[0].endswith("/glmserve") and argv[1] == "serve"
    a = parser().parse_args(argv[1:])
    gpu = yaml.safe_load((deploy / "glm5-8xh200.yaml").read_text())["applications"][0]["args"]
    cfg = _engine_config(a).to_dict()
    assert {k: cfg[k] for k in gpu} == gpu      # every field the file sets (session 56: two were left out)
    assert unit["KillMode"] == "mixed" and int(unit["TimeoutStopSec"]) >= a.drain_timeout + 30
    # Ray's token auth stays on: its ports listen beyond loopback (session 59: the unit turned it off)
    assert "RAY_AUTH_MODE" not in (deploy / "glmserve.service").read_text() and "HOME=" in unit["Environment"]


def test_warmup_by_default_only_where_graphs_are_captured():
    """The start-up warm-up's default: every context a request can reach (max_model_len, else the KV slots) where decode
    steps are captured (CUDA, kernels auto), none on CPU or without capture; an explicit value wins."""
    assert EngineConfig(device="cpu").resolved_warmup_tokens() == 0
    assert EngineConfig(device="cuda").resolved_warmup_tokens() == EngineConfig().kv_cache_tokens
    assert EngineConfig(device="cuda", max_model_len=8192).resolved_warmup_tokens() == 8192
    assert EngineConfig(device="cuda", cuda_graphs="off").resolved_warmup_tokens() == 0
    assert EngineConfig(device="cuda", kernels="reference").resolved_warmup_tokens() == 0
    assert EngineConfig(device="cpu", cuda_graphs="eager", warmup_tokens=64).resolved_warmup_tokens() == 64


def test_fp8_prefill_activations_pick_the_w8a8_backend_on_gpu_only():
    """``prefill_activations: fp8`` becomes the ops' overrides on every rank (the W8A8 backend registered beside the
    Triton one); on CPU, or with device auto on a machine without a GPU, it is a config error naming the field."""
    assert EngineConfig().kernel_overrides() == {}
    gpu = EngineConfig(device="cuda", num_workers=2, prefill_activations="fp8")
    want = {"linear": "triton_w8a8", "moe_experts": "triton_w8a8"}
    assert gpu.kernel_overrides() == want
    assert all(dict(s.kernel_overrides) == want for s in worker_specs(gpu, num_blocks=8))
    with pytest.raises(ValueError, match="'prefill_activations'"):
        EngineConfig(device="cpu", prefill_activations="fp8")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'prefill_activations' is 'fp8', which needs a CUDA device"):
            EngineConfig(prefill_activations="fp8").kernel_overrides()


class _Recording(LocalExecutor):
    def __init__(self, runner):
        super().__init__(runner)
        self.results = []

    def execute(self, steps):
        out = super().execute(steps)
        self.results += out
        return out


@pytest.mark.parametrize("graphs", ["off", "eager"])        # eager: the static decode and drafting path
def test_step_results_carry_the_rank_time_and_its_drafting_share(tiny_config, graphs):
    model = dummy_model(tiny_config, torch.float32)
    for k in (0, 2):
        runner = ModelRunner(model, 16, 16, torch.float32, speculative=k > 0, graphs=graphs)
        executor = _Recording(runner)
        cfg = EngineConfig(device="cpu", kv_cache_tokens=256, speculative_tokens=k)
        engine = Engine(executor, scheduler_config(cfg, tiny_config, None, 16), speculative_tokens=k,
                        graphs=graphs != "off")
        run_engine(engine, {"a": ([1, 2, 3], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))})
        assert all(r.busy_ms > 0 and 0 <= r.draft_ms <= r.busy_ms for r in executor.results)
        assert any(r.draft_ms > 0 for r in executor.results) == (k > 0)
        busy = sum(r.busy_ms for r in executor.results) / 1e3                 # one rank: the busiest is it
        assert engine.stats["worker_busy_seconds"] == pytest.approx(busy)
        assert engine.stats["step_seconds"] >= engine.stats["worker_busy_seconds"] > 0


@pytest.mark.parametrize("graphs", ["off", "eager"])
def test_the_warm_up_runs_the_samplers_kernel_variants_on_every_runner(tiny_config, graphs, monkeypatch):
    """The engine's warm-up sends each rank a warm step without a graph, with CUDA graphs or without; the runner warms
    the sampler's kernel variants there on its model's vocabulary (``sampler.warm_up``; its coverage:
    tests/unit/test_sampler_warm_up.py)."""
    import workers.runner as runner_mod

    calls = []
    warm = runner_mod.sampler_warm_up
    monkeypatch.setattr(runner_mod, "sampler_warm_up", lambda vocab, device: calls.append((vocab, device)) or
                        warm(vocab, device))
    model = dummy_model(tiny_config, torch.float32)
    runner = ModelRunner(model, 16, 16, torch.float32, graphs=graphs)
    cfg = EngineConfig(device="cpu", kv_cache_tokens=256)
    engine = Engine(_Recording(runner), scheduler_config(cfg, tiny_config, None, 16), graphs=graphs != "off")
    engine.warm_up(32)
    assert calls == [(tiny_config.vocab_size, torch.device("cpu"))]


def test_stats_line_reads_rates_between_two_readings_and_stays_quiet_when_idle():
    from cluster.coordinator import stats_line

    def info(prompt, generated, running=0, waiting=0, preempted=0):
        return {"stats": {"prompt_started": prompt, "generated_tokens": generated, "preemptions": preempted},
                "running": running, "waiting": waiting, "kv_usage": 0.25}

    first = info(100, 50, running=2)
    assert stats_line(None, 0.0, first) is None                              # nothing to compare with yet
    line = stats_line((0.0, first["stats"]), 2.0, info(300, 90, running=2, waiting=1, preempted=1))
    assert line == "prompt 100.0 tokens/s, generation 20.0 tokens/s, 2 running, 1 waiting, KV 25.0 % used, 1 preempted"
    idle = info(300, 90)
    assert stats_line((2.0, idle["stats"]), 12.0, idle) is None              # no requests, nothing changed
    assert stats_line((2.0, idle["stats"]), 12.0, info(300, 95)) is not None   # the last tokens of a finished one
    cached = info(500, 95, running=1)
    cached["stats"].update(prefix_queried=400, prefix_hits=150)             # prefix caching: the interval's hit rate
    before = {**idle["stats"], "prefix_queried": 100, "prefix_hits": 0}
    assert stats_line((2.0, before), 12.0, cached).endswith(", 0 preempted, prefix cache hit 50.0 %")


def test_prompt_tokens_count_as_their_prompts_start():
    """The stats line's prompt rate and ``glmserve_prompt_tokens_total`` count a prompt at its first prefill — not at
    admission (a queue's prompts all fell in the interval they arrived, and a displaced one came off again: a
    negative rate, session 57's metrics review) — and a preempted request's prompt once."""
    from cluster.engine import Engine
    from scheduler import SchedulerConfig
    from tests.conftest import RecordingExecutor

    cfg = SchedulerConfig(num_blocks=64, block_size=4, max_model_len=64, vocab_size=64, max_num_seqs=1,
                          max_num_batched_tokens=64)
    engine = Engine(RecordingExecutor(), cfg)
    for i in range(3):
        engine.add_request([1 + i] * 10, SamplingParams(max_tokens=2), f"r{i}")
    started = []
    while engine.has_unfinished():
        engine.step()
        started.append(engine.scheduler.prompt_started)
    assert started[0] == 10 and started[-1] == 30
    assert sorted(set(started)) == [10, 20, 30]                 # one prompt at a time, as each starts


def test_the_coordinator_logs_its_stats_line_while_requests_come(caplog):
    """``serve deploy`` has no terminal: the coordinator logs the line to its replica's log every
    ``log_stats_interval_s`` while something happens."""
    import asyncio
    import itertools
    import logging

    from cluster.coordinator import Coordinator

    readings = itertools.chain([(0, 0, 1), None, (40, 10, 1), (80, 30, 0)], itertools.repeat((80, 30, 0)))  # then idle

    async def info():
        if (reading := next(readings)) is None:
            raise RuntimeError("a reading failed")        # a warning, and the loop goes on
        prompt, generated, running = reading
        return {"stats": {"prompt_started": prompt, "generated_tokens": generated, "preemptions": 0},
                "running": running, "waiting": 0, "kv_usage": 0.5}

    coord = object.__new__(Coordinator)             # its logging loop alone: no engine, no Ray
    coord._stats_log = None
    coord.info = info

    async def run():
        task = asyncio.get_running_loop().create_task(coord._log_stats(0.01))
        await asyncio.sleep(0.2)                    # ~20 readings
        assert not task.done()
        task.cancel()

    with caplog.at_level(logging.INFO, logger="ray.serve"):
        asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records if r.name == "ray.serve" and r.levelno == logging.INFO]
    assert len(lines) == 2 and all(m.startswith("glmserve: prompt ") for m in lines), lines   # the idle readings: none
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == \
        ["glmserve: no stats (RuntimeError: a reading failed)"]


def test_glmserve_serve_refuses_a_port_in_use(monkeypatch, capsys):
    """Serve's proxy binds with SO_REUSEPORT: on a port another server listens on (as Serve's proxy does), a second
    ``glmserve serve`` started its own Ray, said it was ready and shared the port with the first. Now: exit 2 first."""
    pytest.importorskip("ray")
    import ray

    from cluster.server import run_server

    def no_ray(*a, **kw):
        raise AssertionError("started Ray on a port in use")

    monkeypatch.setattr(ray, "init", no_ray)
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert run_server(EngineConfig(device="cpu"), port=port) == 2
    assert f"127.0.0.1:{port} is in use" in capsys.readouterr().out


def test_glmserve_serves_stop_flag_can_be_set_inside_itself():
    """``glmserve serve``'s SIGINT / SIGTERM handler sets its stop flag on the main thread, interrupting whatever runs
    there — the flag's own ``wait()``, or a first handler's ``set()`` when two signals come at once (``timeout``
    signals the process and its group). With a ``threading.Event`` the nested ``set()`` waited forever for the lock
    its own thread held (seen: the server never stopped). A handler run at each of its lines here must not hang."""
    import sys

    pytest.importorskip("ray")
    from cluster.server import _Stop

    stop = _Stop()
    codes = {_Stop.set.__code__, _Stop.wait.__code__}

    def handler_at_each_line(frame, event, arg):
        if event == "line" and frame.f_code in codes:
            stop.flag = False
            sys.settrace(None)
            stop.set()                              # the nested handler
            sys.settrace(tracer)
        return handler_at_each_line

    def tracer(frame, event, arg):
        return handler_at_each_line if frame.f_code in codes else None

    done = []

    def main():
        sys.settrace(tracer)
        stop.set()
        done.append(stop.wait(None))
        sys.settrace(None)

    t = threading.Thread(target=main, daemon=True)
    t.start()
    t.join(10)
    assert done == [True], "the stop flag hung when set inside its own set() / wait()"
    stop.clear()
    assert not stop.wait(0.05) and not stop.is_set()


class _NoPhases:
    """A group's comm that must not be used: ``lm_head_split: false`` keeps the lm_head whole, with no phase."""

    max_rows = 4096

    def all_gather_static(self, rows):
        raise AssertionError("the lm_head split ran a phase")


def test_lm_head_split_off_reads_the_whole_lm_head_without_phases():
    from models.glm5 import Linear
    from scheduler.shapes import StepShape
    from workers.worker import StepComm

    head = Linear(64, 300)
    torch.nn.init.normal_(head.weight)
    rows = torch.randn(2, 64)
    assert worker_specs(EngineConfig(num_workers=2, lm_head_split=False), num_blocks=8)[1].lm_head_split is False
    off = StepComm(_NoPhases(), 1, 2, torch.device("cpu"), split_head=False)
    off.stage(StepShape("dp", 2, 4, None), 2, static=True)
    assert not off.split_fits(4, torch.float32, head)
    assert torch.equal(off.bucket_logits(rows, head), head(rows).float())
    assert torch.equal(off.argmax_logits(rows, head), head(rows).argmax(dim=-1))
    on = StepComm(_NoPhases(), 1, 2, torch.device("cpu"))
    on.stage(StepShape("dp", 2, 4, None), 2, static=True)
    assert on.split_fits(4, torch.float32, head)
    with pytest.raises(AssertionError, match="ran a phase"):
        on.bucket_logits(rows, head)


def test_a_decode_replicas_ranks_reserve_their_import_buffers_at_setup(tiny_ckpt, monkeypatch):
    """``imports`` (a decode replica of a disaggregated app: ``Coordinator`` with prefill replicas) reaches every rank's
    spec, and a rank built from it makes its ``ImportWriter`` buffers during setup — a group rebuilt after a failure
    (``recover``) builds its ranks from the same specs, so its first imports pin nothing either."""
    from models.cache import ImportWriter
    from workers.comm import DictRendezvous
    from workers.worker import Worker

    cfg = EngineConfig(model=str(tiny_ckpt), device="cpu", num_workers=2, kv_cache_tokens=256)
    assert [s.imports for s in worker_specs(cfg, 16, imports=True)] == [True, True]
    assert [s.imports for s in worker_specs(cfg, 16)] == [False, False]
    reserved = []
    monkeypatch.setattr(ImportWriter, "reserve", lambda self: reserved.append(self))
    for imports in (False, True):
        spec = worker_specs(EngineConfig(model=str(tiny_ckpt), device="cpu", kv_cache_tokens=256), 16, imports)[0]
        worker = Worker(spec, DictRendezvous({}, 1))
        try:
            assert reserved == ([worker.runner.imports] if imports else [])
        finally:
            worker.close()


def test_what_the_checkpoint_bounds_is_checked_before_it_loads(tmp_path):
    """A max_model_len past the model's positions (its output would degrade silently past them) and drafts from a
    checkpoint without an MTP layer fail the start naming the field — before a worker loads a weight."""
    import json

    from cluster.config import DEFAULT_MODEL
    from cluster.local import build_local_engine
    from models.config import ModelConfig

    positions = ModelConfig.from_json(DEFAULT_MODEL).max_position_embeddings
    with pytest.raises(ValueError, match=rf"'max_model_len' \({positions + 1}\) is more than the model's positions"):
        build_local_engine(EngineConfig(max_model_len=positions + 1, kv_cache_tokens=2 * positions), progress=False)
    config = json.loads((Path(DEFAULT_MODEL) / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    with pytest.raises(ValueError, match="'speculative_tokens' \\(2\\) needs the checkpoint's MTP layer"):
        build_local_engine(EngineConfig(model=str(tmp_path), speculative_tokens=2, kv_cache_tokens=256), progress=False)


def test_serve_refuses_a_bad_checkpoint_before_starting_ray(capsys, tmp_path):
    """``glmserve serve`` reads the checkpoint's config.json before Ray and Serve start (an error in a second, not after
    a cluster's start: session 56's operator review); every engine field the deploy guide names has a flag."""
    from cluster.cli import _engine_config, main, parser

    assert main(["serve", "--model", str(tmp_path / "none")]) == 2
    assert "config.json not found" in capsys.readouterr().err
    assert main(["serve", "--max-model-len", "4096"]) == 2           # the tiny model has 2048 positions
    assert "max_position_embeddings 2048" in capsys.readouterr().err
    a = parser().parse_args(["serve", "--block-size", "32", "--step-timeout", "120", "--cuda-graphs", "eager",
                             "--no-piece-graphs", "--no-lm-head-split"])
    cfg = _engine_config(a)
    assert (cfg.block_size, cfg.step_timeout_s, cfg.cuda_graphs, cfg.piece_graphs, cfg.lm_head_split) == (
        32, 120.0, "eager", False, False)


def test_a_killed_group_unlinks_the_ipc_segment_no_peer_attached():
    """A rank dying inside the ipc setup left rank 0's shared-memory segment in /dev/shm until the driver exited
    (session 56's fault review): the group's kill unlinks the name rank 0 published, if it is still there."""
    from multiprocessing import shared_memory

    from cluster.workers import ProcessWorkerGroup

    shm = shared_memory.SharedMemory("glmserve_comm_test_" + os.urandom(4).hex(), create=True, size=4096)
    group = ProcessWorkerGroup.__new__(ProcessWorkerGroup)
    group.procs, group.conns, group._board, group._prefix = [], [], {"g3/ipc/shm": shm.name}, "g3/"
    group._kill()
    assert not os.path.exists(f"/dev/shm/{shm.name}")
    shm.close()
    group._board = {}
    group._kill()                                               # nothing published: nothing to do
