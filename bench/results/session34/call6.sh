# Session 34, call 6: the final tree — wide experts at 2 rows one K block a step (the default now; 'sub 2' the old
# pick), the MoE kernel tests and the graph tests, then every decode_slice case with HF (the note's headline table).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 60 python bench/moe_few_rows.py --inter 2048 --rows 2 --draws 4 --down --out $OUT 2>&1 | tail -1
timeout -s KILL 120 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "moe" > $OUT/test_kernels_moe.log 2>&1
tail -1 $OUT/test_kernels_moe.log
timeout -s KILL 150 python -m pytest -q tests/gpu/test_graphs_gpu.py > $OUT/test_graphs.log 2>&1
tail -1 $OUT/test_graphs.log
( time timeout -s KILL 230 python bench/decode_slice.py --out $OUT/slice ) 2>&1 | tail -16 | cut -c1-150
