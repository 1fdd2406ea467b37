# Session 30, call 4: the final tree (the shared expert fused to 8 rows only; linear_f32's final picks) — the kernel
# GPU tests of the changed launches and the graph tests (the device budget left no time for more).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 80 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py -k "moe or linear_f32 or route" 2>&1 \
    | tail -6 > $OUT/test_kernels_gpu.log
timeout -s KILL 120 python -m pytest -q --tb=short tests/gpu/test_graphs_gpu.py 2>&1 | tail -8 > $OUT/test_graphs_gpu.log
tail -n 2 $OUT/*.log
