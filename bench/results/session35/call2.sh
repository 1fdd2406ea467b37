# Session 35, call 2: linear_group on the mid-size kernel past 8 rows (one launch for q_a / kv_a / wk, q_b / wq_b,
# a SwiGLU's gate / up) and the MLP's gate / up grouped at 2..8 rows: the kernel tests, the graph tests, the groups
# timed against their launches apart; the sparse attention's new split rule at 16 / 32 / 64 rows.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 200 python -m pytest -q tests/gpu/test_kernels_gpu.py > $OUT/test_kernels.log 2>&1
tail -n 4 $OUT/test_kernels.log
timeout -s KILL 120 python bench/linear_group.py --out $OUT > $OUT/linear_group.log 2>&1
tail -n 42 $OUT/linear_group.md
timeout -s KILL 60 python bench/tune_attention.py --mla-only --picks-only --rows 16 32 64 --out $OUT > $OUT/tune.log 2>&1
tail -n 3 $OUT/tune_attention.md | cut -c1-90
timeout -s KILL 170 python -m pytest -q tests/gpu/test_graphs_gpu.py > $OUT/test_graphs.log 2>&1
tail -n 2 $OUT/test_graphs.log
