#!/bin/bash
# session 40, call 3: the distributed GPU tests (engine configs: prefix caching on by default now) and the comm tests
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
timeout 280 python -m pytest -q tests/gpu/test_distributed_gpu.py 2>&1 | tail -6 | tee $OUT/distributed.txt
timeout 280 python -m pytest -q tests/gpu/test_comm_gpu.py 2>&1 | tail -4 | tee $OUT/comm.txt
