#!/bin/bash
# Session 63, device call 1 (session 62's call1.sh, which never got a machine) (needs_h200: HF's bf16 slice and its cache do not fit an H100 beside each other): the
# headline table on this tree with HF (a regression check of the decode step since session 48's run), then session
# 61's pending checks: the top-k selection with ties broken by id beside session 60's, the whole draw
# (bench/sampler.py), and the graph tests (drawn rows sample on the device in the captured steps).
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout -s KILL 300 python bench/decode_slice.py --out $OUT/slice ) > $OUT/slice.txt 2>&1; tail -22 $OUT/slice.txt | cut -c1-260
( time timeout -s KILL 90 python bench/results/session61/topk_ties.py ) > $OUT/topk_ties.txt 2>&1; tail -14 $OUT/topk_ties.txt
( time timeout -s KILL 60 python bench/sampler.py --out $OUT ) > $OUT/sampler.txt 2>&1; grep -E "rows,|real" $OUT/sampler.txt
( time timeout 120 python -m pytest -q -rs -x tests/gpu/test_graphs_gpu.py ) > $OUT/test_graphs_gpu.log 2>&1; rc=$?
echo "test_graphs_gpu rc=$rc: $(grep -E 'passed|failed|error' $OUT/test_graphs_gpu.log | tail -1)"
