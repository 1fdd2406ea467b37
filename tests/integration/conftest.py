"""One Ray (and Serve) per test session: starting a cluster costs ~20 s on 2 cores."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

def _free_port() -> int:
    """A port nothing listens on now. Not a fixed one: Serve's proxy binds with SO_REUSEPORT, so two test sessions on
    one port (CI beside a developer's run) would each get the other's requests."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVE_PORT = _free_port()
# What the session's Ray workers take a host's memory to be (free, total GiB) where an engine sizes its KV pool to
# memory (gpu_memory_utilization; workers/memory.py): 0.5 of it leaves 1.5 MiB for the KV. Other engines never read it.
RAY_DEVICE_MEMORY = (2.0015, 4.0)


@pytest.fixture(scope="session")
def ray_session():
    ray = pytest.importorskip("ray")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    ray.init(address="local", num_cpus=32, num_gpus=8, include_dashboard=False, log_to_driver=False,
             namespace="glmserve-tests",
             runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"],
                                       "GLMSERVE_DEVICE_MEMORY": ",".join(map(str, RAY_DEVICE_MEMORY))}})
    yield ray
    try:
        from ray import serve

        serve.shutdown()
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def serve_session(ray_session):
    from ray import serve

    serve.start(http_options={"host": "127.0.0.1", "port": SERVE_PORT},
                logging_config={"enable_access_log": False, "log_level": "WARNING"})
    return f"http://127.0.0.1:{SERVE_PORT}"


@pytest.fixture(scope="session")
def text_ckpt(tmp_path_factory, tiny_config):
    """A checkpoint with a real tokenizer: the embedded trained model when present, else random weights
    with the embedded tokenizer (the engine's text handling does not care which)."""
    from cluster.config import DEFAULT_MODEL
    from models.checkpoint import write_checkpoint
    from models.tokenizer import Tokenizer

    tiny = Path(DEFAULT_MODEL)
    if (tiny / "model.safetensors").exists():
        return tiny
    tok = Tokenizer.from_dir(tiny)
    out = write_checkpoint(tmp_path_factory.mktemp("text-ckpt"),
                           tiny_config.replace(vocab_size=tok.vocab_size, eos_token_id=0), dtype="float32")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / f, out / f)
    return out
