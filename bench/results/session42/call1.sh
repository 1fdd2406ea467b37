#!/bin/bash
# session 42, call 1: the FP8 KV cache on the H200 (kernel + engine tests, the attention bench, the slice's decode step
# with bf16 and FP8 KV), then the session-41 host tier's GPU test
set -x
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.used --format=csv
timeout 150 python -m pytest -q tests/gpu/test_kv_fp8_gpu.py 2>&1 | tail -15 | tee $OUT/kv_fp8_tests.txt
timeout 90 python bench/kv_fp8.py --out $OUT/kv_fp8.md 2>&1 | tail -12
timeout 120 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "host_tier or cached" 2>&1 | tail -6 | tee $OUT/graphs_host.txt
for kv in auto fp8; do
  timeout 100 python bench/decode_slice.py --no-hf --modes auto_graph --slices full dp --kv-cache-dtype $kv \
      --out $OUT/decode_$kv 2>&1 | tail -12
done
