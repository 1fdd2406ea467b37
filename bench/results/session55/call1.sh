#!/bin/bash
# Session 55, device call 1: session 54's review fixes and this session's reserve-at-setup on the GPU
# (test_disagg_gpu.py), the import stall on this tree (bf16 and FP8 rows), and issue 8's table as a regression check.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout 200 python -m pytest -q -rs tests/gpu/test_disagg_gpu.py ) > $OUT/test_disagg_gpu.log 2>&1
tail -5 $OUT/test_disagg_gpu.log
timeout 100 python bench/disagg.py stall --device cuda --slice --tokens 8192 32768 131072 --out $OUT/bf16 2>&1 \
  | grep "writing steps" | cut -c1-250
timeout 100 python bench/disagg.py stall --device cuda --slice --fp8 --tokens 8192 32768 131072 --out $OUT/fp8 2>&1 \
  | grep "writing steps" | cut -c1-250
( time timeout -s KILL 200 python bench/decode_slice.py --out $OUT/slice --no-hf ) 2>&1 | tail -16 | cut -c1-200
