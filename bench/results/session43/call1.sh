#!/bin/bash
# session 43, call 1: the KV pool sized to memory (gpu_memory_utilization) on the H200 — its GPU tests, the slice
# built as serve run builds one worker at 0.9 (pool, free memory after the warm-up and after traffic), and the
# distributed GPU tests (the groups' setup reply changed: it carries the ranks' KV blocks)
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee $OUT/gpu.txt
timeout 150 python -m pytest -q tests/gpu/test_kv_memory_gpu.py 2>&1 | tail -15 | tee $OUT/kv_memory_tests.txt
TRITON_CACHE_DIR=$(mktemp -d) timeout 240 python bench/warmup.py --gpu-memory-utilization 0.9 --warmup-tokens 32768 \
  --ctx 30000 --out $OUT/warmup_090.jsonl 2>&1 | grep -v '^loading' | tail -12 | tee $OUT/warmup_090.txt
timeout 180 python -m pytest -q tests/gpu/test_distributed_gpu.py 2>&1 | tail -6 | tee $OUT/distributed.txt
