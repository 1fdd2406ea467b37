# Session 33, call 3: the MoE launches past 8 rows at a tp rank's width (I 256: a dp step's MoE at 8 / 16 / 32 rows a
# rank), over three routings; then the graph tests and the MoE kernel tests on this tree.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 240 python bench/moe_few_rows.py --inter 256 --rows 64 128 256 --draws 3 --out $OUT 2>&1 | tail -4
timeout -s KILL 150 python -m pytest -q tests/gpu/test_graphs_gpu.py > $OUT/test_graphs.log 2>&1; tail -2 $OUT/test_graphs.log
timeout -s KILL 120 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "moe" > $OUT/test_kernels_moe.log 2>&1
tail -2 $OUT/test_kernels_moe.log
