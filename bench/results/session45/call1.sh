#!/bin/bash
# session 45, call 1: the GPU tests after sessions 43-44's changes (graphs, the memory-sized pool, the FP8 cache),
# then bench/priority.py on the GLM-5.2-width slice (FCFS vs priority under a batch flood)
set -x
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.used --format=csv
timeout 170 python -m pytest -q tests/gpu/test_graphs_gpu.py 2>&1 | tail -15 | tee $OUT/graphs.txt
timeout 80 python -m pytest -q tests/gpu/test_kv_memory_gpu.py 2>&1 | tail -8 | tee $OUT/kv_memory.txt
timeout 200 python bench/priority.py --slice --device cuda --batch 96 --batch-prompt 2048 --batch-out 256 \
    --max-num-seqs 32 --chunk 8192 --chat-prompt 512 --chat-out 64 --kv 1048576 --warmup-tokens 4096 \
    --out $OUT/priority_slice.md 2>&1 | tail -12
timeout 110 python -m pytest -q tests/gpu/test_kv_fp8_gpu.py 2>&1 | tail -8 | tee $OUT/kv_fp8.txt
