#!/bin/bash
# Session 59, device call A: the GPU tier's kernel, comm, FP8-KV, memory and graph tests on this session's tree
# (session 58's loader / YaRN / RoPE changes had not met test_kernels_gpu, test_comm_gpu, test_kv_*_gpu), and the
# disaggregated-prefill tests after session 59's coordinator changes.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
declare -A T=([test_comm_gpu]=60 [test_kernels_gpu]=220 [test_kv_fp8_gpu]=90 [test_kv_memory_gpu]=60 [test_graphs_gpu]=130 [test_disagg_gpu]=120)
for t in test_disagg_gpu test_comm_gpu test_kernels_gpu test_kv_fp8_gpu test_kv_memory_gpu test_graphs_gpu; do
  ( time timeout ${T[$t]} python -m pytest -q -rs tests/gpu/$t.py ) > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc: $(grep -E 'passed|failed|error' $OUT/$t.log | tail -1)"
done
