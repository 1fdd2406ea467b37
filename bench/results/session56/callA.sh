#!/bin/bash
# Session 56, device call A: the whole tests/gpu on the current tree, part 1 (kernels, comm, FP8 KV, memory-sized pool).
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
declare -A T=([test_kernels_gpu]=280 [test_comm_gpu]=160 [test_kv_fp8_gpu]=70 [test_kv_memory_gpu]=70)
for t in test_kernels_gpu test_comm_gpu test_kv_fp8_gpu test_kv_memory_gpu; do
  ( time timeout ${T[$t]} python -m pytest -q -rs tests/gpu/$t.py ) > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc: $(grep -E 'passed|failed|error' $OUT/$t.log | tail -1)"
done
