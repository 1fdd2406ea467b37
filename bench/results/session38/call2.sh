# Session 38, call 2: the sparse attention's launch at 2 / 4 / 8 rows with more than one program an SM (more splits
# of a row's 2048 keys, per_sm 1..4) beside the one-wave shapes swept before.
export PYTHONPATH=.
timeout -s KILL 450 python bench/tune_attention.py --mla-only --rows 8 4 2 --per-sm 1 2 3 4 --out $OUT > $OUT/sweep.log 2>&1
tail -n 6 $OUT/sweep.log
