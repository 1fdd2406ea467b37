#!/bin/bash
# Runs every rN_*.py against a clean export of 0869402 (GLM_ROOT); writes rN_*.log and exit_codes.txt.
cd "$(dirname "$0")"
export GLM_ROOT=${GLM_ROOT:-/tmp/glm_0869402} RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
[ -d "$GLM_ROOT" ] || { mkdir -p "$GLM_ROOT" && git -C ../../../.. archive 0869402 | tar -x -C "$GLM_ROOT"; }
PY=${PY:-/work/main/.venv/bin/python}
: > exit_codes.txt
for s in $(ls r*_*.py | sort -V); do
  timeout 300 $PY "$s" > "${s%.py}.log" 2>&1
  echo "${s} $?" | tee -a exit_codes.txt
done
