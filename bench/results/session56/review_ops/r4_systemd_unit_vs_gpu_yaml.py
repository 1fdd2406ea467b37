"""r4: deploy/README.md says deploy/glmserve.service is "`glmserve serve` with the 8×H200 file's engine", but its
ExecStart gives a different engine than deploy/glm5-8xh200.yaml: no --max-waiting-tokens (the yaml's 1048576 becomes
0, no bound), and step_timeout_s 120 cannot be given at all (no flag: 60). The unit test
(tests/unit/test_group_plumbing.py:189) compares a hand-picked subset of fields, which leaves these out.

Static: parses both files with the checkout's CLI parser and EngineConfig. Exit 1 when an engine field the yaml sets
differs in the unit's engine; 0 when they agree.
"""
import os
import shlex
import sys

import yaml

REPO = os.environ.get("REPO", "/work/main")
sys.path.insert(0, REPO)
from cluster.cli import _engine_config, parser  # noqa: E402

deploy = os.path.join(REPO, "deploy")
text = open(os.path.join(deploy, "glmserve.service")).read().replace("\\\n", " ")
unit = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
argv = shlex.split(unit["ExecStart"])
cfg = _engine_config(parser().parse_args(argv[1:])).to_dict()
gpu = yaml.safe_load(open(os.path.join(deploy, "glm5-8xh200.yaml")))["applications"][0]["args"]
diff = {k: (v, cfg[k]) for k, v in gpu.items() if cfg.get(k) != v}
for k, (want, got) in diff.items():
    print(f"{k}: glm5-8xh200.yaml {want!r}, glmserve.service {got!r}")
print("ok" if not diff else "PRESENT: the systemd unit does not serve the 8xH200 file's engine")
sys.exit(1 if diff else 0)
