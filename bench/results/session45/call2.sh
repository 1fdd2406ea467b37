#!/bin/bash
# session 45, call 2 (on the machine call 1 warmed): the worker-group GPU tests after sessions 43-45's changes, then
# an out-of-memory warm-up (gpu_memory_utilization 0.995 with 16k-token prefill chunks on the slice): its error
# should name what to lower
set -x
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
timeout 300 python -m pytest -q tests/gpu/test_distributed_gpu.py 2>&1 | tail -10 | tee $OUT/distributed.txt
TRITON_CACHE_DIR=$(mktemp -d) timeout 200 python bench/warmup.py --gpu-memory-utilization 0.995 \
    --max-num-batched-tokens 16384 --warmup-tokens 16384 --ctx 1000 --tokens 8 2>&1 | grep -v '^loading' | tail -12 \
    | tee $OUT/oom_warmup.txt
