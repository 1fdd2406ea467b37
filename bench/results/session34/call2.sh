# Session 34, call 2 (call 1's machine, warm): the down sweep again without 256-output blocks (one scale block a
# program: call 1's 256 shapes were wrong, 0.43 off, and the sweep stopped there).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 300 python bench/moe_few_rows.py --inter 256 --rows 64 128 256 --draws 3 --down --out $OUT 2>&1 \
  | tail -4
