"""``glmserve serve``: a local Ray and Serve in this process, the app deployed (``cluster.serve.build_app``) with progress
while the workers load, a stats line while requests come, and on Ctrl-C / SIGTERM a drain before shutting down."""

import time

from ray import serve

from cluster.config import EngineConfig
from cluster.serve import _model_name, build_app


def _failure_reason() -> str:
    """The root cause from a failed deployment's status message (its traceback's last line)."""
    try:
        app_status = serve.status().applications["glmserve"]
        for name, d in app_status.deployments.items():
            lines = [ln.strip() for ln in (d.message or "").splitlines() if ln.strip()]
            if lines:
                return f"  {name}: {lines[-1]}"
    except Exception:
        pass
    return ""


def run_server(cfg: EngineConfig, host: str = "127.0.0.1", port: int = 8000, drain_timeout_s: float = 30.0,
               stats_interval_s: float = 10.0, prefill_replicas: int = 0) -> int:
    """``glmserve serve``: start a local Ray (logical resources on CPU), deploy, print a stats line every
    ``stats_interval_s`` while requests come (0: never), wait for Ctrl-C / SIGTERM; then drain — new requests get
    503, those in flight finish, for up to ``drain_timeout_s`` — and shut down. ``prefill_replicas`` > 0:
    disaggregated prefill, that many replicas of the same engine computing the prompts (``cluster/disagg.py``)."""
    stop = _Stop()
    if (code := start_server(cfg, host, port, "; Ctrl-C to stop", prefill_replicas, stop)) != 0:
        return code
    stats = _Stats(serve.get_app_handle("glmserve"))
    while not stop.wait(stats_interval_s if stats_interval_s > 0 else None):
        stats.report()
    stop.clear()
    _drain(stop, drain_timeout_s)
    stop_server()
    return 0


def stop_server() -> None:
    import ray

    serve.shutdown()
    ray.shutdown()


def start_server(cfg: EngineConfig, host: str, port: int, ready_note: str = "", prefill_replicas: int = 0,
                 stop: "_Stop | None" = None) -> int:
    """A local Ray and Serve in this process with the app deployed on ``host:port``, progress printed while the
    workers load, then the ready line (``ready_note`` at its end): 0, or 2 (the reason printed) where the port is
    taken or the deployment failed. ``stop``: SIGINT / SIGTERM set it from the start (Ray's own SIGTERM handler left a
    crash dump and its agents running); set before the ready line, what started is shut down and 130 returned."""
    import os
    import signal

    handled, stop = stop is not None, stop or _Stop()      # (without a caller's, a flag nothing sets)

    def on_signals() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM) if handled else ():
            signal.signal(sig, lambda *_: stop.set())

    on_signals()

    if _port_taken(host, port):
        print(f"glmserve: error: {host}:{port} is in use (another server?): stop it or choose --port", flush=True)
        return 2
    # (Ray's token auth stays on unless the environment turns it off: the server's Ray listens beyond loopback,
    # whatever --host says — session 56's operator review)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import logging

    import ray

    logging.getLogger("ray.serve").setLevel(logging.WARNING)   # (its INFO lines in the driver read as failures)

    print(f"glmserve: starting Ray and loading {cfg.model} on {cfg.num_workers} worker(s) ...", flush=True)
    if cfg.resolved_warmup_tokens():
        tokens = ("the KV pool's" if cfg.gpu_memory_utilization and cfg.warmup_tokens is None and
                  not cfg.max_model_len else cfg.resolved_warmup_tokens())
        print(f"glmserve: then a warm-up (warmup_tokens {tokens}: CUDA graphs captured, kernels "
              "compiled) before the replica takes requests", flush=True)
    import ray._private.utils as ray_utils

    # ray.init puts its own SIGTERM handlers in place (they exit mid-start, leaving the node's agents running): while
    # it starts, a SIGTERM only sets our flag, and what it started is shut down whole after it
    keep = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = (lambda handler: None) if handled else keep
    try:
        ray.init(address="local", num_cpus=max(16, 2 * cfg.num_workers * (1 + prefill_replicas)),   # (a Ray of its
                 include_dashboard=False, log_to_driver=False, namespace="glmserve")    # own, not a `ray start` one)
    except (SystemExit, KeyboardInterrupt):
        return _stopped()
    finally:
        ray_utils.set_sigterm_handler = keep
    on_signals()                    # (Ray's core worker put its C++ handler, which dumps and aborts, in place of ours)
    if stop.is_set():
        return _stopped()
    serve.start(http_options={"host": host, "port": port},
                logging_config={"enable_access_log": False, "log_level": "WARNING"})
    t0 = time.time()
    try:    # not waited for here (a thread inside serve.run outlived a stop before "ready" and crashed Ray's worker)
        args = cfg.to_dict() | ({"prefill": {"num_replicas": prefill_replicas}} if prefill_replicas else {})
        serve.run_many([serve.RunTarget(build_app(args), name="glmserve", route_prefix="/",
                                        logging_config={"enable_access_log": False, "log_level": "WARNING"})],
                       wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
    except Exception as e:  # noqa: BLE001 — reported; the process exits with an error
        print(f"glmserve: error: the deployment failed: {e}", flush=True)
        stop_server()
        return 2
    last = None
    while True:                                     # progress while the workers load the checkpoint
        if stop.wait(0.5):
            return _stopped()
        try:
            app_status = serve.status().applications.get("glmserve")
        except Exception:   # noqa: BLE001 — asked again
            continue
        state = app_status and app_status.status.value
        if state == "RUNNING":
            break
        if state in ("DEPLOY_FAILED", "UNHEALTHY"):
            print(f"glmserve: error: the deployment failed: {app_status.message}\n{_failure_reason()}", flush=True)
            stop_server()
            return 2
        now = app_status and ", ".join(f"{name} {d.status.value.lower()}"
                                       for name, d in app_status.deployments.items())
        if now and now != last:
            print(f"glmserve: [{time.time() - t0:4.0f} s] {now}", flush=True)
            last = now
    print(f"glmserve: ready in {time.time() - t0:.0f} s — OpenAI API at http://{host}:{port}/v1 "
          f"(model {_model_name(cfg)!r}){ready_note}", flush=True)
    return 0


def _stopped() -> int:
    import ray

    print("glmserve: stopped before it was ready; shutting down what started", flush=True)
    if ray.is_initialized():
        stop_server()
    else:                   # (ray.init interrupted: the node's processes it started still go)
        ray.shutdown()
    return 130


def _port_taken(host: str, port: int) -> bool:
    """Whether something listens on ``host:port``. Serve's proxy binds with SO_REUSEPORT: a second server on a taken
    port started, said it was ready, and shared the port with the first (the kernel splits connections between them)."""
    import errno
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


class _Stop:
    """``glmserve serve``'s stop flag, set by its SIGINT / SIGTERM handler: an attribute, polled. A
    ``threading.Event`` takes a lock in ``set()`` that the main thread, which runs every handler, may hold — in
    ``wait()``, or in the handler itself when two signals come at once (``timeout`` signals the process and its
    group): the process hung for good."""

    POLL_S = 0.1

    def __init__(self):
        self.flag = False

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag

    def wait(self, timeout: float | None = None) -> bool:
        """Until set, for at most ``timeout`` seconds (None: no limit); whether it is set."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.flag and (end is None or time.monotonic() < end):
            time.sleep(self.POLL_S if end is None else max(0.0, min(self.POLL_S, end - time.monotonic())))
        return self.flag


class _Stats:
    """``glmserve serve``'s periodic line (as vLLM's): prompt and generated tokens a second since the last line,
    requests running and waiting, KV in use — printed only while something happens."""

    def __init__(self, ingress):
        self.ingress, self.last = ingress, None

    def report(self) -> None:
        try:
            info = self.ingress.info.remote().result(timeout_s=10)
        except Exception as e:  # noqa: BLE001 — a busy or restarting replica: the next line will tell
            print(f"glmserve: no stats ({type(e).__name__})", flush=True)
            return
        from cluster.coordinator import stats_line

        now = time.monotonic()
        line = stats_line(self.last, now, info)
        if line:
            print(f"glmserve: {line}", flush=True)
        self.last = (now, info["stats"])


def _drain(stop, timeout_s: float) -> None:
    """Stop taking requests and wait up to ``timeout_s`` for those in flight, or until ``stop`` is set again."""
    print(f"glmserve: stopping — new requests get 503; waiting up to {timeout_s:.0f} s for the requests in flight "
          "(Ctrl-C again: stop now) ...", flush=True)
    deadline = time.time() + timeout_s
    left = -1
    try:
        ingress = serve.get_app_handle("glmserve")
        while not stop.is_set():
            left = ingress.drain.remote().result(timeout_s=10)
            if left == 0 or time.time() >= deadline:
                break
            stop.wait(0.5)
    except Exception as e:  # noqa: BLE001 — the ingress is gone or stuck: shut down anyway
        print(f"glmserve: could not drain ({type(e).__name__}: {e})", flush=True)
    if left > 0:                    # each open stream's client gets an error event rather than a cut connection
        try:
            ingress = serve.get_app_handle("glmserve")
            ended = ingress.close_streams.remote().result(timeout_s=10)
            until = time.time() + 5
            while ingress.drain.remote().result(timeout_s=10) and time.time() < until and not stop.is_set():
                stop.wait(0.2)      # the error events on their way out
        except Exception as e:  # noqa: BLE001 — the ingress is gone or stuck: shut down anyway
            ended = f"? ({type(e).__name__})"
        print(f"glmserve: shutting down: {ended} output stream(s) (one a choice) still in flight ended with an error",
              flush=True)
    elif left < 0:                  # stopped again, or the ingress did not answer, before it said
        print("glmserve: shutting down without waiting (any stream in flight ends with an error)", flush=True)
