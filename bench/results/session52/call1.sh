#!/bin/bash
# Session 52, device call 1 (session 51's call1.sh, which no machine ran): sessions 50-51's GPU test cases (the disagg
# tests, the graph tests with `prompts_only`), then the import's stall on the slice with bf16 and FP8 rows.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout 150 python -m pytest -q -rs tests/gpu/test_disagg_gpu.py ) > $OUT/test_disagg_gpu.log 2>&1; tail -4 $OUT/test_disagg_gpu.log
( time timeout 150 python -m pytest -q -rs tests/gpu/test_graphs_gpu.py ) > $OUT/test_graphs_gpu.log 2>&1; tail -4 $OUT/test_graphs_gpu.log
timeout 120 python bench/disagg.py stall --device cuda --slice --tokens 8192 32768 131072 --out $OUT 2>&1 | tail -8 | cut -c1-220
timeout 120 python bench/disagg.py stall --device cuda --slice --fp8 --tokens 8192 32768 131072 --out $OUT 2>&1 | tail -8 | cut -c1-220
ls $OUT
