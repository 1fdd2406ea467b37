#!/bin/bash
# session 42, call 3: the attention test with call 2's tolerance fix, then the distributed GPU tests (session 40's
# pending: engine configs with prefix caching on)
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
timeout 90 python -m pytest -q -s tests/gpu/test_kv_fp8_gpu.py -k attention 2>&1 | grep -E "differing|passed|failed" | tee $OUT/attention.txt
timeout 300 python -m pytest -q tests/gpu/test_distributed_gpu.py 2>&1 | tail -6 | tee $OUT/distributed.txt
