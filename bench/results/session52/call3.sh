#!/bin/bash
# Session 52, device call 3 (the machine of calls 1-2, warm): the rest of tests/gpu on this tree.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
( time timeout 320 python -m pytest -q -rs tests/gpu/test_distributed_gpu.py ) > $OUT/test_distributed_gpu.log 2>&1; tail -n 5 $OUT/test_distributed_gpu.log
( time timeout 200 python -m pytest -q -rs tests/gpu/test_comm_gpu.py tests/gpu/test_kv_memory_gpu.py ) > $OUT/test_comm_kvmem_gpu.log 2>&1; tail -n 5 $OUT/test_comm_kvmem_gpu.log
