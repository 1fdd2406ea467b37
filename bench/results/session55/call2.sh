#!/bin/bash
# Session 55, device call 2: the engine soak on the GPU (captured graphs looking ahead, drafting graphs, FP8 rows in
# a crowded pool with a host tier; aborts at random points), then the graph and memory-sized engine tests.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout 240 python -m pytest -q -rs tests/gpu/test_engine_soak_gpu.py ) > $OUT/test_engine_soak_gpu.log 2>&1
tail -n 15 $OUT/test_engine_soak_gpu.log | cut -c1-300
( time timeout 300 python -m pytest -q -rs tests/gpu/test_graphs_gpu.py tests/gpu/test_kv_memory_gpu.py ) \
  > $OUT/test_graphs_gpu.log 2>&1
tail -n 6 $OUT/test_graphs_gpu.log | cut -c1-300
