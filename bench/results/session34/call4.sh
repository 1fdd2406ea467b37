# Session 34, call 4 (call 3's machine, warm): the down / sub sweep at ≤ 8 rows for wide experts (I 2048: the full
# slice's 8 rows), an ep rank (32 held) and again a tp rank (I 256, 4 routings), where call 3 found one K block a step
# faster at I 256.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 100 python bench/moe_few_rows.py --inter 2048 --rows 2 4 8 --draws 3 --down --out $OUT 2>&1 | tail -3
timeout -s KILL 60 python bench/moe_few_rows.py --held 32 --rows 4 8 --draws 3 --down --out $OUT 2>&1 | tail -2
timeout -s KILL 80 python bench/moe_few_rows.py --inter 256 --rows 2 3 4 6 8 --draws 4 --down --out $OUT/tp 2>&1 | tail -5
