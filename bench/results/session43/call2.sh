#!/bin/bash
# session 43, call 2: call 1's one-process test with its bound fixed; the slice at 0.9 with the FP8 cache (pool and
# free memory); the distributed GPU tests with the time they need (call 1 cut them at 180 s)
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
timeout 100 python -m pytest -q tests/gpu/test_kv_memory_gpu.py 2>&1 | tail -4 | tee $OUT/kv_memory_tests.txt
TRITON_CACHE_DIR=$(mktemp -d) timeout 150 python bench/warmup.py --gpu-memory-utilization 0.9 --kv-cache-dtype fp8 \
  --warmup-tokens 4096 --ctx 30000 --out $OUT/warmup_090_fp8.jsonl 2>&1 | grep -v '^loading' | tail -8 | tee $OUT/warmup_090_fp8.txt
timeout 330 python -m pytest -q tests/gpu/test_distributed_gpu.py 2>&1 | tail -6 | tee $OUT/distributed.txt
