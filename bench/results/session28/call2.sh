# Session 28, call 2: call 1 showed the step no faster — the fused launches side by side with what they replace
# (bench/one_row_fusions.py: router tiles and selection, the MoE's combine in or after its down launch, q_b + wq_b's
# tile), then the kernel tests that touch them and the graph tests (the model on the new launches).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 150 python bench/one_row_fusions.py --out $OUT 2>&1 | tee $OUT/one_row_fusions.txt | grep -v Warn
timeout -s KILL 120 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py -k "router or moe or group or f32" \
    2>&1 | tail -20 > $OUT/gpu_tests_kernels.log
tail -2 $OUT/gpu_tests_kernels.log
timeout -s KILL 200 python -m pytest -q --tb=short tests/gpu/test_graphs_gpu.py 2>&1 | tail -20 > $OUT/gpu_tests_graphs.log
tail -2 $OUT/gpu_tests_graphs.log
