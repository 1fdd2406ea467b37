#!/bin/bash
# Session 56, device call B: the whole tests/gpu on the current tree, part 2 (graphs, distributed groups).
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
for t in test_graphs_gpu test_distributed_gpu; do
  ( time timeout 290 python -m pytest -q -rs tests/gpu/$t.py ) > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc: $(grep -E 'passed|failed|error' $OUT/$t.log | tail -1)"
done
