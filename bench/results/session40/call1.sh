#!/bin/bash
# session 40, call 1: the graph GPU tests (with prefix-cached prompt tails), then bench/prefix_cache.py on the slice
set -x
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.used --format=csv
timeout 300 python -m pytest -q -x tests/gpu/test_graphs_gpu.py 2>&1 | tail -15 | tee $OUT/gpu_tests.txt
timeout 270 python bench/prefix_cache.py --slice --device cuda --system 16384 --turn 256 --answer 64 --turns 4 \
    --burst 8 --chunk 8192 --out $OUT/prefix_cache_slice16k.md 2>&1 | tail -25
