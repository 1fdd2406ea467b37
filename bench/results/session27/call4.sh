# Session 27, call 4: the GPU group tests (ipc ranks on one GPU, NCCL at one rank) after the launch fusions.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 420 python -m pytest -q --tb=short tests/gpu/test_distributed_gpu.py 2>&1 | tail -30 > $OUT/gpu_tests_distributed.log
tail -3 $OUT/gpu_tests_distributed.log
