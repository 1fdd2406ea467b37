# Session 34, call 7: narrow experts at ≤ 8 rows with one K block a step (the new pick) split over H in 2..24
# programs, 64 or 128 outputs a program; the sparse attention's shapes at 16 and 64 rows (call 1: 32 rows).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 150 python bench/moe_few_rows.py --inter 256 --rows 2 4 8 --draws 4 --out $OUT 2>&1 | tail -3
timeout -s KILL 150 python bench/tune_attention.py --mla-only --rows 16 64 --out $OUT > $OUT/tune.log 2>&1
tail -n 3 $OUT/tune_attention.md
