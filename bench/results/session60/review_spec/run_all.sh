#!/bin/bash
# Runs every script of this review from the repo root, writing NAME.log and exit_codes.txt (name, exit code, seconds).
cd "$(dirname "$0")/../../../.." || exit 1
D=bench/results/session60/review_spec
: > $D/exit_codes.txt
for s in r1_drafts_for_ending_requests c1_fuzz_spec c2_guided_spec c3_config_errors c4_group_spec c5_unseeded_invariants \
         c6_stops_inside_runs c7_drafts_after_reuse c8_disagg_drafts; do
  t0=$(date +%s)
  RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONPATH=. timeout 1200 .venv/bin/python $D/$s.py > $D/$s.log 2>&1
  rc=$?
  echo "$s.py $rc $(( $(date +%s) - t0 ))s" >> $D/exit_codes.txt
done
cat $D/exit_codes.txt
