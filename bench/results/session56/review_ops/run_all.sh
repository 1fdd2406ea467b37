#!/bin/bash
# Runs every rN_*.py of this folder against ${REPO:-/work/main} with ${PY:-/work/main/.venv/bin/python}; writes
# rN_*.log and exit_codes.txt (1: the problem is present, 0: absent, 2: the harness could not run it).
cd "$(dirname "$0")"
export REPO=${REPO:-/work/main} PY=${PY:-/work/main/.venv/bin/python} RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
: > exit_codes.txt
for s in $(ls r*_*.py | sort -V); do
    n=${s%.py}
    (cd /tmp && timeout 300 "$PY" "$OLDPWD/$s") > "$n.log" 2>&1
    rc=$?
    echo "$n $rc" >> exit_codes.txt
    echo "$n $rc"
done
