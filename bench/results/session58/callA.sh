#!/bin/bash
# Session 58, device call A: session 57's final tree (the byte detokenizer, placement by growth, metrics)
# on the GPU: worker groups over the channel, the disaggregated-prefill tests and the engine soak.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
declare -A T=([test_distributed_gpu]=290 [test_disagg_gpu]=150 [test_engine_soak_gpu]=140)
for t in test_distributed_gpu test_disagg_gpu test_engine_soak_gpu; do
  ( time timeout ${T[$t]} python -m pytest -q -rs tests/gpu/$t.py ) > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc: $(grep -E 'passed|failed|error' $OUT/$t.log | tail -1)"
done
