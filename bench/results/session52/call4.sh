#!/bin/bash
# Session 52, device call 4: the engine's GPU tests on the review's fixes (34271a7 and later).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout 200 python -m pytest -q -rs tests/gpu/test_disagg_gpu.py tests/gpu/test_graphs_gpu.py ) > $OUT/test_disagg_graphs_gpu.log 2>&1; tail -n 6 $OUT/test_disagg_graphs_gpu.log
