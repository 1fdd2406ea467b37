#!/bin/bash
# Session 67, call 4 (any card): test_graphs_gpu.py's tests past the 44 that passed in call 3 before its 150 s limit.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
python -m pytest --collect-only -q tests/gpu/test_graphs_gpu.py | grep '::' > $OUT/ids.txt; wc -l < $OUT/ids.txt
( time timeout 200 python -m pytest -q -rs $(tail -n +45 $OUT/ids.txt) ) > $OUT/test_graphs_gpu_rest.log 2>&1
tail -8 $OUT/test_graphs_gpu_rest.log | cut -c1-250
