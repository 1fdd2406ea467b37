#!/bin/bash
# Session 57, device call B: what the worker group adds to a step on the GPU, session 56's step channel (this tree)
# against the one before it (6bb428f, carried as build/old_tree), alternating; one process rank, CUDA graphs on.
# Then the final tree's engine soak and disaggregated-prefill GPU tests (placement, detokenizer, metrics changed).
ROOT=$PWD
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
for i in 1 2; do
  for t in old new; do
    if [ $t = old ]; then cd build/old_tree; else cd "$ROOT"; fi
    echo "== $t, round $i"
    PYTHONPATH=. timeout 100 python bench/group_overhead.py --workers 1 --device cuda --groups processes --repeats 2 2>&1 \
      | grep -E "processes|identical"
    cd "$ROOT"
  done
done 2>&1 | tee $OUT/group_overhead_ab.txt
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
for t in test_engine_soak_gpu test_disagg_gpu; do
  ( time timeout 120 python -m pytest -q -rs tests/gpu/$t.py ) > $OUT/$t.log 2>&1
  echo "$t rc=$?: $(grep -E 'passed|failed|error' $OUT/$t.log | tail -1)"
done
