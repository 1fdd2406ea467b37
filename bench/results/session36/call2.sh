# Session 36, call 2: the split counts to 64 rows — the grouped launches at 16 / 32 rows, the lone mid-size launches
# (o_proj, the dense down whole and 1/8) at 16 / 32 / 64 rows; o_proj and the dense down past 128 rows at 192.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 200 python bench/linear_group.py --out $OUT --rows 16 32 --sweep > $OUT/linear_group.log 2>&1
tail -n 12 $OUT/linear_group.md
timeout -s KILL 300 python bench/mid_gemm.py --out $OUT --rows 16 32 64 192 --sweep hopper --budget-s 280 \
    --shapes o_proj "dense down" "dense down 1/8" > $OUT/mid_gemm.log 2>&1
tail -n 3 $OUT/mid_gemm.log
