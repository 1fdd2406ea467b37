#!/bin/bash
# Runs every rN_*.py of this folder from the repo root; each one's output to rN_*.log, exit codes to exit_codes.txt.
cd /work/main
D=bench/results/session56/review_faults
: > $D/exit_codes.txt
for s in $(ls $D/r*_*.py | sort -V); do
  n=$(basename $s .py)
  RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 timeout 240 .venv/bin/python $s > $D/$n.log 2>&1
  rc=$?
  echo "$n $rc" >> $D/exit_codes.txt
done
