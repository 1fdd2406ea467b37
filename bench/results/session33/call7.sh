# Session 33, call 7 (on call 6's warm machine): the ep rank's sweep at more row counts, four routings each.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 100 python bench/moe_few_rows.py --held 32 --rows 4 8 16 32 64 128 --draws 4 --out $OUT 2>&1 | tail -6
