#!/bin/bash
# Session 65, call 1 (needs_h200: HF's bf16 slice and its cache do not fit an H100 beside ours): the headline table on
# this tree with HF (session 48's is the last on an H200) and the graph tests (session 64's last GPU run of them was
# before its no-rows fix).
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout -s KILL 300 python bench/decode_slice.py --out $OUT/slice ) > $OUT/slice.txt 2>&1
tail -22 $OUT/slice.txt | cut -c1-260
( time timeout 250 python -m pytest -q -rs -x tests/gpu/test_graphs_gpu.py ) > $OUT/test_graphs_gpu.log 2>&1
echo "test_graphs_gpu: $(grep -E 'passed|failed|error' $OUT/test_graphs_gpu.log | tail -1)"
