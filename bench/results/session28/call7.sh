# Session 28, call 7: the one-row GEMV reducing every K step as the default past 4096 outputs (16 × 512 tiles), and
# the MoE's one-row launches with that option: the kernel tests, the MoE launches (moe_one_row.py --each), the GEMV
# and the slice step beside the tree before (ab_old/: 10e49cd's kernels/, models/, bench/), the graph tests.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 70 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py -k "linear or moe or group or f32" \
    2>&1 | tail -20 > $OUT/gpu_tests_kernels.log
tail -2 $OUT/gpu_tests_kernels.log
timeout -s KILL 45 python bench/moe_one_row.py --each 2>&1 | grep -v Warn | tee $OUT/moe_each.txt
S="--shapes 6144x16384 12288x6144 6144x12288 16384x2048"
timeout -s KILL 40 python bench/gemv_variants.py $S 2>&1 | grep -v Warn | cut -c1-150 | tee $OUT/gemv_new.txt
timeout -s KILL 40 env PYTHONPATH=ab_old:. python ab_old/bench/gemv_variants.py $S 2>&1 | grep -v Warn | cut -c1-150 \
    | tee $OUT/gemv_old.txt
timeout -s KILL 60 python bench/decode_slice.py --out $OUT/new --no-hf --modes auto_graph --no-shard 2>&1 | grep "^| full"
timeout -s KILL 60 env PYTHONPATH=ab_old:. python ab_old/bench/decode_slice.py --out $OUT/old --no-hf \
    --modes auto_graph --no-shard 2>&1 | grep "^| full"
timeout -s KILL 100 python -m pytest -q --tb=short tests/gpu/test_graphs_gpu.py 2>&1 | tail -20 > $OUT/gpu_tests_graphs.log
tail -2 $OUT/gpu_tests_graphs.log
