# Session 36, call 1: the grouped launches' split counts (and past 64 rows the mid-size tile's rows × stages) swept
# at 2 / 8 / 64 / 128 / 192 / 256 rows; the lone mid-size launches past 128 rows (o_proj, the 1/8 dense MLP, q_b).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 380 python bench/linear_group.py --out $OUT --rows 2 8 64 128 192 256 --sweep > $OUT/linear_group.log 2>&1
tail -n 40 $OUT/linear_group.md
timeout -s KILL 170 python bench/mid_gemm.py --out $OUT --rows 128 192 256 --sweep hopper --budget-s 150 \
    --shapes o_proj "dense down 1/8" "dense gate_up 1/8" q_b > $OUT/mid_gemm.log 2>&1
tail -n 5 $OUT/mid_gemm.log
