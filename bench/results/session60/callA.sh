#!/bin/bash
# Session 60, device call A: the GPU tests of what session 60 changed — an engine that does not draft loads no MTP
# layer and keeps no KV for it (pools, FP8 KV, graphs, disaggregated prefill's layouts), the depot's drops.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; git log --oneline -1 2>/dev/null; } > $OUT/device.txt
cat $OUT/device.txt
declare -A T=([test_kv_fp8_gpu]=90 [test_kv_memory_gpu]=60 [test_graphs_gpu]=150 [test_disagg_gpu]=120)
for t in test_disagg_gpu test_kv_memory_gpu test_kv_fp8_gpu test_graphs_gpu; do
  ( time timeout ${T[$t]} python -m pytest -q -rs tests/gpu/$t.py ) > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc: $(grep -E 'passed|failed|error' $OUT/$t.log | tail -1)"
done
