"""r6: `glmserve serve --help` (and generate / run-batch / make-checkpoint) shows no default for many options an
operator sizes a server by: --kv-cache-tokens (32768), --max-num-batched-tokens (512), --host (127.0.0.1), --port
(8000), --device, --dtype, --num-workers, --speculative-tokens, --comm, --moe, --kernels ... (cluster/cli.py:19-72,
196-197: no help text, and the parser is not built with ArgumentDefaultsHelpFormatter).

Static. Exit 1 when an option with a value of its own shows neither "default" nor its default value in its help; 0
otherwise.
"""
import os
import re
import subprocess
import sys

REPO = os.environ.get("REPO", "/work/main")
PY = os.environ.get("PY", "/work/main/.venv/bin/python")
sys.path.insert(0, REPO)
from cluster.cli import parser  # noqa: E402

env = {**os.environ, "PYTHONPATH": REPO}
bad = []
for cmd, sub in parser()._subparsers._group_actions[0].choices.items():
    text = subprocess.run([PY, "-m", "cluster.cli", cmd, "--help"], capture_output=True, text=True, env=env,
                          cwd="/tmp").stdout
    body = text.split("options:", 1)[1]
    for action in sub._actions:
        if not action.option_strings or action.nargs == 0 or action.default in (None, "==SUPPRESS=="):
            continue
        flag = action.option_strings[-1]
        m = re.search(rf"^  (?:-\w+ \S+, )?{re.escape(flag)}(?=[ \n]).*?(?=^  -)", body + "\n  -", re.M | re.S)
        entry = m.group(0) if m else ""
        if "default" not in entry:
            bad.append(f"{cmd} {flag} (default {action.default!r})")
for b in bad:
    print("no default shown:", b)
print("ok" if not bad else f"PRESENT: {len(bad)} options show no default in --help")
sys.exit(1 if bad else 0)
