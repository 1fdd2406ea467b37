#!/bin/bash
# Session 58, device call A: this session's tree (sessions 57's and 58's changes: the byte detokenizer, placement by
# growth, the loader's final dtypes and sliced reads, drafts that fit) on the GPU: the loader's peak on the device,
# worker groups over the channel, the disaggregated-prefill tests and the engine soak.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
timeout 60 python bench/results/session58/review_loader/r7b_gpu_load_peak.py > $OUT/r7b_gpu_load_peak.log 2>&1; echo "r7b rc=$?: $(tail -1 $OUT/r7b_gpu_load_peak.log)"
declare -A T=([test_distributed_gpu]=270 [test_disagg_gpu]=150 [test_engine_soak_gpu]=140)
for t in test_distributed_gpu test_disagg_gpu test_engine_soak_gpu; do
  ( time timeout ${T[$t]} python -m pytest -q -rs tests/gpu/$t.py ) > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc: $(grep -E 'passed|failed|error' $OUT/$t.log | tail -1)"
done
