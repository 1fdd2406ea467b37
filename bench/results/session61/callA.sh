#!/bin/bash
# Session 61, device call A (any GPU: side by side in one run): the sampler's top-k selection with ties broken by id
# (this session's fix) beside session 60's, the whole draw (bench/sampler.py), and the graph tests (drawn rows sample
# on the device in the captured steps).
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout -s KILL 120 python bench/results/session61/topk_ties.py ) > $OUT/topk_ties.txt 2>&1; tail -14 $OUT/topk_ties.txt
( time timeout -s KILL 120 python bench/sampler.py --out $OUT ) > $OUT/sampler.txt 2>&1; grep -E "rows,|real" $OUT/sampler.txt
( time timeout 240 python -m pytest -q -rs tests/gpu/test_graphs_gpu.py ) > $OUT/test_graphs_gpu.log 2>&1; rc=$?
echo "test_graphs_gpu rc=$rc: $(grep -E 'passed|failed|error' $OUT/test_graphs_gpu.log | tail -1)"
