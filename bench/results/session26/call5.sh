# Session 26, call 5: the GPU graph / pieces / engine-group tests with the mid-size kernel the default.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 400 python -m pytest -q --tb=short tests/gpu/test_graphs_gpu.py tests/gpu/test_distributed_gpu.py 2>&1 \
    | tail -15 | tee $OUT/gpu_tests_graphs.log
