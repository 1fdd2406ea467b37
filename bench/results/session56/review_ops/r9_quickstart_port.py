"""r9: the quick start cannot be told a port: `make serve` runs `glmserve serve` with no way to pass flags
(Makefile:16-17), and `serve run deploy/tiny.yaml` binds http_options.port 8000 from the file (Ray Serve's CLI has
no port option for a config file). On a host where 8000 is taken (here: another service's) the documented quick start
cannot run; an operator must edit the yaml or bypass make.

Static. Exit 1 when the Makefile's serve recipe passes no variable (e.g. $(ARGS) / $(PORT)) to glmserve; 0 otherwise.
"""
import os
import re
import sys

REPO = os.environ.get("REPO", "/work/main")
mk = open(os.path.join(REPO, "Makefile")).read()
recipe = re.search(r"^serve:.*\n((?:\t.*\n)+)", mk, re.M).group(1)
print("Makefile serve recipe:", recipe.strip())
tiny = open(os.path.join(REPO, "deploy", "tiny.yaml")).read()
print("deploy/tiny.yaml:", re.search(r"port: *\d+", tiny).group(0))
ok = "$(" in recipe.split("glmserve serve", 1)[1] if "glmserve serve" in recipe else False
print("ok" if ok else "PRESENT: `make serve` always serves on :8000 and takes no flags")
sys.exit(0 if ok else 1)
