"""Bad ``speculative_tokens`` values give a clear error naming the field: negative, past 7, huge, a float, a string, a
boolean (EngineConfig directly, ``from_dict`` as a YAML's engine section arrives, the CLI's ``--speculative-tokens``),
and a checkpoint without an MTP layer (``num_nextn_predict_layers`` 0) through ``build_local_engine`` and the CLI;
k = 7 (the most) runs and equals plain decoding.

    PYTHONPATH=. .venv/bin/python bench/results/session60/review_spec/c3_config_errors.py
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import _s
from _s import ROOT, SamplingParams, check, collect, make_engine, tok
from cluster.config import DEFAULT_MODEL, EngineConfig


def error_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


def main():
    for v in (-1, 8, 10**9, 2.5, "3", True, None):
        for how, fn in (("EngineConfig", lambda v=v: EngineConfig(speculative_tokens=v)),
                        ("from_dict", lambda v=v: EngineConfig.from_dict({"speculative_tokens": v}))):
            err = error_of(fn)
            check(err is not None and "speculative_tokens" in err and "Traceback" not in err,
                  f"{how} speculative_tokens={v!r}: {err}")
    for v in (0, 1, 7):
        check(error_of(lambda v=v: EngineConfig(speculative_tokens=v)) is None, f"speculative_tokens={v} accepted")

    # a checkpoint without the MTP layer
    with tempfile.TemporaryDirectory() as d:
        ck = Path(d) / "nomtp"
        shutil.copytree(DEFAULT_MODEL, ck)
        cfg = json.loads((ck / "config.json").read_text())
        cfg["num_nextn_predict_layers"] = 0
        (ck / "config.json").write_text(json.dumps(cfg))
        from cluster.local import build_local_engine
        err = error_of(lambda: build_local_engine(EngineConfig(model=str(ck), device="cpu", kv_cache_tokens=1024,
                                                               warmup_tokens=0, speculative_tokens=2),
                                                  progress=False))
        check(err is not None and "speculative_tokens" in err and "num_nextn_predict_layers" in err,
              f"checkpoint without MTP, build_local_engine: {err}")
        r = subprocess.run([sys.executable, "-m", "cluster.cli", "generate", "hello", "--model", str(ck),
                            "--speculative-tokens", "2", "--max-tokens", "4"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
        out = (r.stdout + r.stderr).strip().splitlines()
        check(r.returncode != 0 and any("speculative_tokens" in line for line in out) and
              not any(line.startswith("Traceback") for line in out),
              f"CLI, checkpoint without MTP: rc {r.returncode}, {out[-1] if out else ''}")
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "generate", "hello", "--speculative-tokens", "9",
                        "--max-tokens", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = (r.stdout + r.stderr).strip().splitlines()
    check(r.returncode != 0 and any("speculative_tokens" in line or "speculative-tokens" in line for line in out)
          and not any(line.startswith("Traceback") for line in out),
          f"CLI --speculative-tokens 9: rc {r.returncode}, {out[-1] if out else ''}")

    # k = 7, the most, runs and equals plain decoding
    prompt = tok().encode("And it came to pass, when")
    p = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    want = collect(make_engine(k=0), {"r": (prompt, p)})["r"]["tokens"]
    e7 = make_engine(k=7)
    got = collect(e7, {"r": (prompt, p)})["r"]["tokens"]
    check(got == want and e7.stats["drafts_accepted"] > 0, f"k=7 equals plain ({e7.spec_metrics()['mean_accepted_length']:.2f} a round)")
    _s.done()


if __name__ == "__main__":
    main()
